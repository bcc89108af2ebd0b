//! Deployment files for a tree a controller builds (`plan --emit …
//! --controlled`, issue 43): no node has an address in advance. One
//! controller (a Kubernetes Deployment behind a Service, a Compose service,
//! a systemd unit), the sender, and the proxies and receivers as one
//! scalable workload each (`kubectl scale`, `docker compose up --scale`,
//! one unit per host): every node runs `fairfeed <role> --controller
//! ADDR --id any` and registers from the address it has. Pure: a shape
//! in, named file contents out.

use serde_json::json;

use crate::deploy::{capabilities, yaml, DeployError, DeployOptions, Platform, DOCKERFILE};

/// The controller's UDP port.
pub const CONTROLLER_PORT: u16 = 9700;
/// Every node's tree port (one node per host or container).
pub const NODE_PORT: u16 = 9100;

/// The tree the controller is to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub receivers: usize,
    /// Proxies the plan places, and spares beside them (first in line for a repair).
    pub proxies: usize,
    pub spares: usize,
    pub fanout: usize,
    pub hedge: usize,
    pub depth: usize,
}

const KEY_HOST: &str = "/etc/fairfeed/tree.key";
const KEY_COMPOSE: &str = "/run/secrets/tree_key";
const KEY_K8S_DIR: &str = "/etc/fairfeed/key";

fn controller_args(s: &Shape, key: &str) -> Vec<String> {
    [
        "controller",
        "--listen",
        &format!("0.0.0.0:{CONTROLLER_PORT}"),
        "--fanout",
        &s.fanout.to_string(),
        "--hedge",
        &s.hedge.to_string(),
        "--depth",
        &s.depth.to_string(),
        "--key-file",
        key,
    ]
    .iter()
    .map(ToString::to_string)
    .collect()
}

/// A node's arguments (`controller`: HOST:PORT of the controller).
fn node_args(role: &str, controller: &str, key: &str, o: &DeployOptions) -> Vec<String> {
    let mut v: Vec<String> = [
        role,
        "--controller",
        controller,
        "--id",
        "any",
        "--bind",
        &format!("0.0.0.0:{NODE_PORT}"),
        "--key-file",
        key,
        "--metrics",
        &format!("0.0.0.0:{}", o.metrics_port),
        // A node under a controller is moved at run time: the hosts' clocks (PTP, chrony) are its clock.
        "--clock",
        "system",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    // Flags for a planned tree's clock sync do not apply; the rest do.
    let mut flags = o.node_flags.iter();
    while let Some(f) = flags.next() {
        if f == "--clock" {
            flags.next();
            continue;
        }
        v.push(f.clone());
    }
    v
}

/// The files for `platform`.
pub fn emit(s: &Shape, platform: Platform, o: &DeployOptions) -> Result<Vec<(String, String)>, DeployError> {
    let mut files = Vec::new();
    match platform {
        Platform::Kubernetes => {
            files.push((
                "00-namespace.yaml".into(),
                yaml(&[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": o.namespace}})])?,
            ));
            files.push(("05-controller.yaml".into(), yaml(&k8s_controller(s, o))?));
            let controller = format!("fairfeed-controller.{}.svc.cluster.local:{CONTROLLER_PORT}", o.namespace);
            let docs = [("sender", 1), ("proxy", s.proxies + s.spares), ("receiver", s.receivers)]
                .map(|(role, n)| k8s_nodes(role, n, &controller, o));
            files.push(("10-nodes.yaml".into(), yaml(&docs)?));
            files.push(("Dockerfile".into(), DOCKERFILE.into()));
        }
        Platform::Compose => {
            files.push(("compose.yaml".into(), compose(s, o)?));
            files.push(("Dockerfile".into(), DOCKERFILE.into()));
        }
        Platform::Systemd => {
            files.push(("fairfeed-controller.service".into(), unit("controller", &controller_args(s, KEY_HOST), o)));
            for role in ["sender", "proxy", "receiver"] {
                let args = node_args(role, "${FAIRFEED_CONTROLLER}", KEY_HOST, o);
                files.push((format!("fairfeed-{role}.service"), unit(role, &args, o)));
            }
            files.push((
                "controller.env".into(),
                format!(
                    "# Where every node finds the controller: the one address to fill in (HOST:{CONTROLLER_PORT}).\n\
                     FAIRFEED_CONTROLLER=controller.example:{CONTROLLER_PORT}\n"
                ),
            ));
        }
    }
    files.push(("README.md".into(), readme(s, platform, o)));
    Ok(files)
}

fn labels(role: &str) -> serde_json::Value {
    json!({"app.kubernetes.io/name": "fairfeed", "app.kubernetes.io/instance": format!("fairfeed-{role}"), "fairfeed.io/role": role})
}

fn key_volume() -> serde_json::Value {
    json!({"name": "key", "secret": {"secretName": "fairfeed-tree-key", "defaultMode": 0o400}})
}

fn k8s_controller(s: &Shape, o: &DeployOptions) -> [serde_json::Value; 2] {
    let key = format!("{KEY_K8S_DIR}/tree.key");
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "fairfeed-controller", "namespace": o.namespace},
        "spec": {
            "selector": {"app.kubernetes.io/instance": "fairfeed-controller"},
            "ports": [{"name": "membership", "port": CONTROLLER_PORT, "targetPort": CONTROLLER_PORT, "protocol": "UDP"}],
        },
    });
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "fairfeed-controller", "namespace": o.namespace, "labels": labels("controller")},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/instance": "fairfeed-controller"}},
            "template": {
                "metadata": {"labels": labels("controller")},
                "spec": {
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{
                        "name": "fairfeed",
                        "image": o.image,
                        "args": controller_args(s, &key),
                        "ports": [{"name": "membership", "containerPort": CONTROLLER_PORT, "protocol": "UDP"}],
                        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
                        "volumeMounts": [{"name": "key", "mountPath": KEY_K8S_DIR, "readOnly": true}],
                    }],
                    "volumes": [key_volume()],
                },
            },
        },
    });
    [service, deployment]
}

fn k8s_nodes(role: &str, replicas: usize, controller: &str, o: &DeployOptions) -> serde_json::Value {
    let key = format!("{KEY_K8S_DIR}/tree.key");
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": format!("fairfeed-{role}"), "namespace": o.namespace, "labels": labels(role)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/instance": format!("fairfeed-{role}")}},
            "template": {
                "metadata": {
                    "labels": labels(role),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": o.metrics_port.to_string(),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    // The host's network: the address a node registers from is its host's.
                    "hostNetwork": true,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "terminationGracePeriodSeconds": 10,
                    // One fairfeed node per host, as the plan assumes (and as the fixed port needs).
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                        "labelSelector": {"matchExpressions": [{"key": "fairfeed.io/role", "operator": "In", "values": ["sender", "proxy", "receiver"]}]},
                        "topologyKey": "kubernetes.io/hostname",
                    }]}},
                    "containers": [{
                        "name": "fairfeed",
                        "image": o.image,
                        "args": node_args(role, controller, &key, o),
                        "ports": [
                            {"name": "metrics", "containerPort": o.metrics_port, "protocol": "TCP"},
                            {"name": "tree", "containerPort": NODE_PORT, "protocol": "UDP"},
                        ],
                        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
                        "securityContext": {"capabilities": {"add": capabilities(o).into_iter().chain(["IPC_LOCK"]).collect::<Vec<_>>()}},
                        "volumeMounts": [{"name": "key", "mountPath": KEY_K8S_DIR, "readOnly": true}],
                    }],
                    "volumes": [key_volume()],
                },
            },
        },
    })
}

fn compose(s: &Shape, o: &DeployOptions) -> Result<String, DeployError> {
    let controller = format!("controller:{CONTROLLER_PORT}");
    let mut services = serde_json::Map::new();
    services.insert(
        "controller".into(),
        json!({
            "image": o.image,
            "build": ".",
            "command": controller_args(s, KEY_COMPOSE),
            "secrets": ["tree_key"],
            "restart": "on-failure",
            "stop_signal": "SIGTERM",
        }),
    );
    for (role, n) in [("sender", 1), ("proxy", s.proxies + s.spares), ("receiver", s.receivers)] {
        services.insert(
            role.into(),
            json!({
                "image": o.image,
                "build": ".",
                "command": node_args(role, &controller, KEY_COMPOSE, o),
                "depends_on": ["controller"],
                "deploy": {"replicas": n},
                "secrets": ["tree_key"],
                "expose": [o.metrics_port.to_string()],
                "restart": "on-failure",
                "stop_signal": "SIGTERM",
                "stop_grace_period": "10s",
                "ulimits": {"memlock": -1},
                "cap_add": capabilities(o),
                "labels": {"io.fairfeed.role": role},
            }),
        );
    }
    let doc = json!({
        "name": "fairfeed",
        "services": services,
        "secrets": {"tree_key": {"file": "./tree.key"}},
    });
    yaml(&[doc])
}

fn unit(role: &str, args: &[String], o: &DeployOptions) -> String {
    let cmd = std::iter::once(o.binary.clone()).chain(args.iter().cloned()).collect::<Vec<_>>().join(" ");
    let env =
        if role == "controller" { String::new() } else { "EnvironmentFile=/etc/fairfeed/controller.env\n".into() };
    format!(
        "# fairfeed {role} under a controller (see README.md).\n\
         [Unit]\n\
         Description=fairfeed {role} (placed by the tree's controller)\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         {env}ExecStart={cmd}\n\
         Restart=on-failure\n\
         RestartSec=1\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec=10\n\
         LimitMEMLOCK=infinity\n\
         AmbientCapabilities={caps}\n\
         NoNewPrivileges=yes\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        caps = capabilities(o).iter().map(|c| format!("CAP_{c}")).collect::<Vec<_>>().join(" "),
    )
}

fn readme(s: &Shape, platform: Platform, o: &DeployOptions) -> String {
    let key = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > tree.key";
    let how = match platform {
        Platform::Kubernetes => format!(
            "```sh\nkubectl apply -f 00-namespace.yaml\n\
             kubectl -n {ns} create secret generic fairfeed-tree-key --from-file=tree.key\n\
             kubectl apply -f 05-controller.yaml -f 10-nodes.yaml\n\
             kubectl -n {ns} scale deployment fairfeed-receiver --replicas=<N>   # firms join and leave\n```\n\n\
             Every node finds the controller through its Service \
             (`fairfeed-controller.{ns}.svc.cluster.local:{CONTROLLER_PORT}`) and registers from its host's \
             address (host networking; one fairfeed node per host). A rescheduled pod is a new member: the \
             controller repairs around the old one and places the new one.",
            ns = o.namespace
        ),
        Platform::Compose => format!(
            "```sh\ndocker compose up -d\n\
             docker compose up -d --scale receiver=<N>   # firms join and leave\n```\n\n\
             Every node finds the controller as `controller:{CONTROLLER_PORT}` on the project's network and \
             registers from its container's address."
        ),
        Platform::Systemd => format!(
            "Put the controller's address in `controller.env` (the one address to type), then:\n\n```sh\n\
             install -d /etc/fairfeed && install -m 600 tree.key /etc/fairfeed/ && install -m 644 controller.env /etc/fairfeed/\n\
             # on the controller's host\n\
             cp fairfeed-controller.service /etc/systemd/system/ && systemctl enable --now fairfeed-controller\n\
             # on each node's host: the unit of its role\n\
             cp fairfeed-<role>.service /etc/systemd/system/ && systemctl enable --now fairfeed-<role>\n```\n\n\
             Each node registers from the host's address (binary `{bin}`).",
            bin = o.binary
        ),
    };
    format!(
        "# fairfeed under a controller: {r} receivers, {p} proxies (+{sp} spares), fan-out {f}, depth {d}, hedging {h}\n\n\
         Generated by `fairfeed plan … --emit … --controlled`. No node needs an address: each runs \
         `fairfeed <role> --controller ADDR --id any`, registers (sealed with the tree key) from the address \
         it has, and runs the view the controller gives it. The controller places joiners under a proxy with \
         room, repairs around a proxy that stops beating (a spare takes its place, or its children move to \
         its layer's other proxies), and holds a node that died down for 5 s. Make the key once: `{key}`.\n\n\
         {how}\n\n\
         Two controllers can share the membership through NATS JetStream KV — add `--store \
         nats://HOST:4222 --name <a|b>` to each controller's arguments and give the nodes both addresses \
         (`--controller A,B`): one leads through the store's lease, and the other takes over when it lapses.\n\n\
         Clock: nodes under a controller run on their hosts' clocks (`--clock system`, PTP or chrony).\n",
        r = s.receivers,
        p = s.proxies,
        sp = s.spares,
        f = s.fanout,
        d = s.depth,
        h = s.hedge,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape { receivers: 1000, proxies: 100, spares: 2, fanout: 10, hedge: 1, depth: 3 }
    }

    #[test]
    fn no_node_has_an_address_and_every_node_finds_the_controller() {
        for p in [Platform::Kubernetes, Platform::Compose, Platform::Systemd] {
            let files = emit(&shape(), p, &DeployOptions::default()).unwrap();
            let all: String = files.iter().map(|(_, b)| b.as_str()).collect();
            assert!(!all.contains("--topology"), "{p:?}");
            assert!(all.contains("--id any") || all.contains("- any"), "{p:?}");
            assert!(!all.contains("sync"), "{p:?}: clock sync is not offered under a controller");
        }
        let k8s = emit(&shape(), Platform::Kubernetes, &DeployOptions::default()).unwrap();
        let nodes = &k8s.iter().find(|(n, _)| n == "10-nodes.yaml").unwrap().1;
        assert!(nodes.contains("replicas: 1000") && nodes.contains("replicas: 102"), "{nodes}");
    }
}
