//! Deployment files from a plan: one systemd unit, Compose service or
//! Kubernetes Deployment per tree node, each running `fairfeed
//! sender|proxy|receiver --id N` on the planned address with the topology
//! and the tree's key mounted from a file (systemd), a Compose secret or a
//! Kubernetes ConfigMap and Secret, its metrics port declared, host
//! networking, and CPU pinning hints where the platform has them. Pure:
//! a topology in, named file contents out (the caller writes them).

use fairfeed_tree::addr::HostPort;

use fairfeed_tree::plan::{Node, Role, Topology};
use serde_json::json;

/// Why deployment files cannot be written for a plan.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error(
        "nodes {0:?} have no HOST:PORT address; give every node one (--address ID=HOST:PORT, or --loopback-port PORT for one host)"
    )]
    NoAddress(Vec<u32>),
    #[error(
        "the topology is {toml} bytes of TOML, {compressed} gzipped and base64-encoded: over Kubernetes' \
         {CONFIGMAP_MAX_BYTES} byte ConfigMap limit even compressed; plan fewer nodes per tree"
    )]
    TooLarge { toml: usize, compressed: usize },
    #[error("gzipping the topology: {0}")]
    Gzip(std::io::Error),
    #[error("{0}")]
    Yaml(String),
}

/// The platforms files can be emitted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Systemd,
    Compose,
    Kubernetes,
}

/// How the emitted files run fairfeed.
#[derive(Debug, Clone)]
pub struct DeployOptions {
    /// The `fairfeed` binary on each host (systemd).
    pub binary: String,
    /// The container image (Compose, Kubernetes).
    pub image: String,
    /// Each node serves its metrics on its own IP at this port.
    pub metrics_port: u16,
    /// The Kubernetes namespace.
    pub namespace: String,
    /// Extra flags for every node (e.g. `--clock sync`).
    pub node_flags: Vec<String>,
    /// The kernel fast path on this interface of every host: TC replication
    /// at the sender and proxies (`--tc-replicate`, where a node has 2 to 64
    /// targets), XDP de-duplication at receivers (`--xdp-dedup`), and the
    /// capability to load eBPF programs (CAP_BPF).
    pub kernel_iface: Option<String>,
}

impl Default for DeployOptions {
    fn default() -> Self {
        DeployOptions {
            binary: "/usr/local/bin/fairfeed".into(),
            image: "fairfeed:latest".into(),
            metrics_port: 9400,
            namespace: "fairfeed".into(),
            node_flags: vec!["--clock".into(), "sync".into()],
            kernel_iface: None,
        }
    }
}

/// Where the topology and the key are inside a host or container.
const TOPOLOGY_PATH: &str = "/etc/fairfeed/topology.toml";
const KEY_PATH_HOST: &str = "/etc/fairfeed/tree.key";
const KEY_PATH_COMPOSE: &str = "/run/secrets/tree_key";
const KEY_DIR_K8S: &str = "/etc/fairfeed/key";

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Sender => "sender",
        Role::Proxy => "proxy",
        Role::Receiver => "receiver",
    }
}

/// The nodes to deploy, each once with its address: over several trees the
/// sender and each receiver are one process for all of them, a proxy one
/// process in its tree.
fn nodes(t: &Topology) -> Result<Vec<(&Node, HostPort)>, DeployError> {
    let mut out = Vec::new();
    let mut missing = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for n in t.trees.iter().flat_map(|tr| &tr.nodes).filter(|n| seen.insert(n.id)) {
        match n.addr.as_deref().map(|a| HostPort::parse(a, false)) {
            Some(Ok(a)) => out.push((n, a)),
            _ => missing.push(n.id),
        }
    }
    if !missing.is_empty() {
        return Err(DeployError::NoAddress(missing));
    }
    Ok(out)
}

/// The same host at another port.
fn at_port(addr: &HostPort, port: u16) -> String {
    HostPort { host: addr.host.clone(), port }.to_string()
}

fn args(n: &Node, addr: &HostPort, key: &str, o: &DeployOptions) -> Vec<String> {
    // A node placed by name serves metrics on every interface of its pod (its
    // name may not resolve yet when it starts); one placed by IP on that IP.
    let metrics = if by_name(addr) { format!("0.0.0.0:{}", o.metrics_port) } else { at_port(addr, o.metrics_port) };
    let mut v: Vec<String> = vec![
        role_name(n.role).into(),
        "--topology".into(),
        TOPOLOGY_PATH.into(),
        "--id".into(),
        n.id.to_string(),
        "--key-file".into(),
        key.into(),
        "--metrics".into(),
        metrics,
    ];
    // A control address the topology gives stays inside the host or pod
    // (loopback, same port): beyond it a node needs an operator key
    // (docs/SECURITY.md), which these files do not distribute.
    let own = o.node_flags.iter().any(|f| f == "--control" || f.starts_with("--control="));
    if let Some(port) =
        n.control.as_deref().and_then(|c| HostPort::parse(c, false).ok()).map(|c| c.port).filter(|_| !own)
    {
        v.extend(["--control".into(), format!("127.0.0.1:{port}")]);
    }
    if by_name(addr) {
        // Its peers' names resolve once their pods have IPs: wait for them.
        v.extend(["--resolve-wait-s".into(), K8S_RESOLVE_WAIT_S.to_string()]);
    }
    v.extend(o.node_flags.iter().cloned());
    if let Some(iface) = &o.kernel_iface {
        let targets = n.children.len() + n.hedge_targets.len();
        match n.role {
            Role::Receiver => v.extend(["--xdp-dedup".into(), iface.clone()]),
            _ if (2..=TC_TARGETS_MAX).contains(&targets) => v.extend(["--tc-replicate".into(), iface.clone()]),
            // One target: nothing for the kernel to copy.
            _ => {}
        }
    }
    v
}

/// Targets the TC replicator takes (fairfeed_xdp::replicate::TARGETS_MAX).
const TC_TARGETS_MAX: usize = 64;

/// The capabilities a node needs, as Linux names them without `CAP_`.
pub(crate) fn capabilities(o: &DeployOptions) -> Vec<&'static str> {
    let mut c = vec!["SYS_NICE", "NET_ADMIN"];
    if o.kernel_iface.is_some() {
        c.push("BPF");
    }
    c
}

fn name(n: &Node) -> String {
    format!("{}-{}", role_name(n.role), n.id)
}

/// The tree port of every node named by [`name_nodes`] (one node per host,
/// so one port does for all).
pub const K8S_TREE_PORT: u16 = 9100;

/// Gives every node without an address a Kubernetes name: its own headless
/// Service (`fairfeed-<role>-<id>.<namespace>.svc.cluster.local`, emitted
/// beside its Deployment) at [`K8S_TREE_PORT`]. The Service's DNS record is
/// the pod's IP — its host's, with host networking — wherever the pod is
/// scheduled, and nodes resolve the topology's names again while they run,
/// so a rescheduled pod is followed without a new plan. Returns how many
/// nodes were named.
pub fn name_nodes(t: &mut Topology, namespace: &str) -> usize {
    let mut named = 0;
    for n in t.trees.iter_mut().flat_map(|tr| &mut tr.nodes) {
        if n.addr.is_none() {
            n.addr = Some(format!("fairfeed-{}.{namespace}.svc.cluster.local:{K8S_TREE_PORT}", name(n)));
            named += 1;
        }
    }
    named
}

/// How long a node placed by name waits at start-up for its peers' names, s.
pub const K8S_RESOLVE_WAIT_S: u32 = 600;

/// Whether the node's address is a name (placed by Kubernetes) rather than an IP (placed by hand).
fn by_name(addr: &HostPort) -> bool {
    addr.host.parse::<std::net::IpAddr>().is_err()
}

/// The files for `platform`: (relative path, contents), a README among them.
pub fn emit(
    t: &Topology,
    topology_toml: &str,
    platform: Platform,
    o: &DeployOptions,
) -> Result<Vec<(String, String)>, DeployError> {
    let nodes = nodes(t)?;
    let mut files = vec![("topology.toml".to_string(), topology_toml.to_string())];
    match platform {
        Platform::Systemd => {
            for (n, addr) in &nodes {
                files.push((format!("fairfeed-{}.service", name(n)), unit(n, addr, o)));
            }
        }
        Platform::Compose => {
            files.push(("compose.yaml".into(), compose(&nodes, o)?));
            files.push(("Dockerfile".into(), DOCKERFILE.into()));
        }
        Platform::Kubernetes => {
            files.push(("00-namespace.yaml".into(), yaml(&[namespace(o)])?));
            let (map, key) = config_map(topology_toml, o)?;
            files.push(("01-topology.yaml".into(), yaml(&[map])?));
            let services: Vec<serde_json::Value> =
                nodes.iter().filter(|(_, a)| by_name(a)).map(|(n, a)| service(n, a, o)).collect();
            if !services.is_empty() {
                files.push(("05-services.yaml".into(), yaml(&services)?));
            }
            let docs: Vec<serde_json::Value> = nodes.iter().map(|(n, a)| deployment(n, a, key, o)).collect();
            files.push(("10-nodes.yaml".into(), yaml(&docs)?));
            files.push(("Dockerfile".into(), DOCKERFILE.into()));
        }
    }
    files.push(("README.md".into(), readme(t, &nodes, platform, o)));
    Ok(files)
}

fn unit(n: &Node, addr: &HostPort, o: &DeployOptions) -> String {
    let cmd = std::iter::once(o.binary.clone()).chain(args(n, addr, KEY_PATH_HOST, o)).collect::<Vec<_>>().join(" ");
    format!(
        "# fairfeed {role} {id}: run on the host that owns {host} (see README.md).\n\
         [Unit]\n\
         Description=fairfeed {role} {id} of a fair multicast tree ({addr})\n\
         Documentation=https://github.com/fairfeed/fairfeed\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={cmd}\n\
         Restart=on-failure\n\
         RestartSec=1\n\
         # SIGTERM: the node stops, flushes its counters and exits.\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec=10\n\
         # Metrics for Prometheus: http://{metrics}/metrics\n\
         # Latency hints: a core of its own (isolate it with isolcpus= and nohz_full= on the kernel\n\
         # command line), locked memory for --mlock, and the capabilities --fifo and --busy-poll-us need.\n\
         CPUAffinity=1\n\
         LimitMEMLOCK=infinity\n\
         AmbientCapabilities={caps}\n\
         NoNewPrivileges=yes\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        role = role_name(n.role),
        id = n.id,
        host = addr.host,
        metrics = at_port(addr, o.metrics_port),
        caps = capabilities(o).iter().map(|c| format!("CAP_{c}")).collect::<Vec<_>>().join(" "),
    )
}

fn compose(nodes: &[(&Node, HostPort)], o: &DeployOptions) -> Result<String, DeployError> {
    let mut services = serde_json::Map::new();
    for (n, addr) in nodes {
        services.insert(
            name(n),
            json!({
                "image": o.image,
                "build": ".",
                "network_mode": "host",
                "command": args(n, addr, KEY_PATH_COMPOSE, o),
                "volumes": [{"type": "bind", "source": "./topology.toml", "target": TOPOLOGY_PATH, "read_only": true}],
                "secrets": ["tree_key"],
                "expose": [o.metrics_port.to_string()],
                "restart": "on-failure",
                "stop_signal": "SIGTERM",
                "stop_grace_period": "10s",
                // Latency hints: one core per node; locked memory for --mlock.
                "cpuset": "1",
                "ulimits": {"memlock": -1},
                "cap_add": capabilities(o),
                "labels": {
                    "io.fairfeed.node": n.id.to_string(),
                    "io.fairfeed.role": role_name(n.role),
                    "io.fairfeed.metrics": format!("http://{}/metrics", at_port(addr, o.metrics_port)),
                },
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

fn namespace(o: &DeployOptions) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": o.namespace}})
}

/// Kubernetes refuses a ConfigMap over 1 MiB (etcd's object limit).
pub const CONFIGMAP_MAX_BYTES: usize = 1 << 20;
/// Room left in a ConfigMap for its metadata and YAML framing.
const CONFIGMAP_SLACK_BYTES: usize = 16 << 10;

/// The topology as a ConfigMap, and the key it is under: as text while it
/// fits, gzipped (`binaryData`, base64) when the text would not — a
/// 10,000-receiver topology is ≈ 2 MB of TOML, ≈ 10 % of that gzipped;
/// nodes read either. Too large even gzipped: an error that says so.
fn config_map(topology_toml: &str, o: &DeployOptions) -> Result<(serde_json::Value, &'static str), DeployError> {
    use base64::Engine;
    use std::io::Write;
    let meta = json!({"name": "fairfeed-topology", "namespace": o.namespace});
    let room = CONFIGMAP_MAX_BYTES - CONFIGMAP_SLACK_BYTES;
    if topology_toml.len() <= room {
        let m = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"topology.toml": topology_toml}});
        return Ok((m, "topology.toml"));
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(topology_toml.as_bytes()).map_err(DeployError::Gzip)?;
    let gz = gz.finish().map_err(DeployError::Gzip)?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&gz);
    if b64.len() > room {
        return Err(DeployError::TooLarge { toml: topology_toml.len(), compressed: b64.len() });
    }
    let m = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "binaryData": {"topology.toml.gz": b64}});
    Ok((m, "topology.toml.gz"))
}

/// The headless Service that gives a node placed by name its DNS record
/// (the pod's IP, published before the pod is ready: peers need it to start).
fn service(n: &Node, addr: &HostPort, o: &DeployOptions) -> serde_json::Value {
    let app = format!("fairfeed-{}", name(n));
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": app, "namespace": o.namespace, "labels": {"app.kubernetes.io/name": "fairfeed"}},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": true,
            "selector": {"app.kubernetes.io/instance": app},
            "ports": [{"name": "tree", "port": addr.port, "protocol": "UDP"}],
        },
    })
}

/// Where a node's pod may run: on the Kubernetes node labelled for it
/// (placed by IP), or on any host that runs no other fairfeed node (placed
/// by name: one node per host, as the plan assumes).
fn placement(n: &Node, addr: &HostPort) -> (&'static str, serde_json::Value) {
    if !by_name(addr) {
        return ("nodeSelector", json!({"fairfeed.io/node": n.id.to_string()}));
    }
    (
        "affinity",
        json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "fairfeed"}},
            "topologyKey": "kubernetes.io/hostname",
        }]}}),
    )
}

fn deployment(n: &Node, addr: &HostPort, key: &str, o: &DeployOptions) -> serde_json::Value {
    let topology = format!("/etc/fairfeed/{key}");
    let mut args = args(n, addr, &format!("{KEY_DIR_K8S}/tree.key"), o);
    if let Some(p) = args.iter().position(|a| a == "--topology") {
        args[p + 1].clone_from(&topology);
    }
    let app = format!("fairfeed-{}", name(n));
    let labels = json!({"app.kubernetes.io/name": "fairfeed", "app.kubernetes.io/instance": app, "fairfeed.io/role": role_name(n.role)});
    let mut d = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "namespace": o.namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            // Never two copies of one node: the old one stops before the new one starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/instance": app}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": o.metrics_port.to_string(),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    // The node's address is its host's: the pod uses the host's network,
                    // on the Kubernetes node labelled for it (see README.md).
                    "hostNetwork": true,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{
                        "name": "fairfeed",
                        "image": o.image,
                        "args": args,
                        "ports": [
                            {"name": "metrics", "containerPort": o.metrics_port, "protocol": "TCP"},
                            {"name": "tree", "containerPort": addr.port, "protocol": "UDP"},
                        ],
                        // Requests equal to limits in whole CPUs: the Guaranteed QoS class, which
                        // the kubelet's static CPU manager pins to dedicated cores.
                        "resources": {
                            "requests": {"cpu": "1", "memory": "512Mi"},
                            "limits": {"cpu": "1", "memory": "512Mi"},
                        },
                        "securityContext": {"capabilities": {"add": capabilities(o).into_iter().chain(["IPC_LOCK"]).collect::<Vec<_>>()}},
                        "volumeMounts": [
                            {"name": "topology", "mountPath": topology, "subPath": key, "readOnly": true},
                            {"name": "key", "mountPath": KEY_DIR_K8S, "readOnly": true},
                        ],
                    }],
                    "volumes": [
                        {"name": "topology", "configMap": {"name": "fairfeed-topology"}},
                        {"name": "key", "secret": {"secretName": "fairfeed-tree-key", "defaultMode": 0o400}},
                    ],
                },
            },
        },
    });
    let (k, v) = placement(n, addr);
    d["spec"]["template"]["spec"][k] = v;
    d
}

pub(crate) fn yaml(docs: &[serde_json::Value]) -> Result<String, DeployError> {
    let mut out = String::new();
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_yaml_ng::to_string(d).map_err(|e| DeployError::Yaml(e.to_string()))?);
    }
    Ok(out)
}

pub(crate) const DOCKERFILE: &str =
    "# The image the Compose services and Kubernetes pods run: the fairfeed binary on Debian.\n\
# Build: copy the binary of `cargo build --release -p fairfeed` next to this file (built where\n\
# clang is installed, so that it carries the eBPF programs of the kernel fast path), then\n\
#   docker build -t fairfeed:latest .\n\
FROM debian:bookworm-slim\n\
COPY fairfeed /usr/local/bin/fairfeed\n\
ENTRYPOINT [\"/usr/local/bin/fairfeed\"]\n";

fn readme(t: &Topology, nodes: &[(&Node, HostPort)], platform: Platform, o: &DeployOptions) -> String {
    let mut table = String::from("| node | role | address | metrics |\n|---|---|---|---|\n");
    for (n, a) in nodes {
        table.push_str(&format!(
            "| {} | {} | {a} | http://{}/metrics |\n",
            n.id,
            role_name(n.role),
            at_port(a, o.metrics_port)
        ));
    }
    let key = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > tree.key";
    let how = match platform {
        Platform::Systemd => format!(
            "On every host: install the binary as `{bin}`, then\n\n```sh\n\
             install -d /etc/fairfeed && install -m 644 topology.toml /etc/fairfeed/\n\
             install -m 600 tree.key /etc/fairfeed/           # the same key on every host\n\
             cp fairfeed-<role>-<id>.service /etc/systemd/system/   # the unit of this host's node\n\
             systemctl daemon-reload && systemctl enable --now fairfeed-<role>-<id>\n```\n\n\
             Start the receivers and proxies first and the sender last. `CPUAffinity=1` pins each node to \
             core 1; change it to a core you isolated.",
            bin = o.binary
        ),
        Platform::Compose => "Build the image (see `Dockerfile`), put `tree.key` here, then on each host start \
             its node's service — `docker compose up -d receiver-0` — or, with every address on one \
             host (a `--loopback-port` plan), all of them: `docker compose up -d`. The services use the \
             host's network, so each node listens on its planned address. `cpuset` pins each to core 1; \
             change it per host."
            .to_string(),
        Platform::Kubernetes if nodes.iter().all(|(_, a)| by_name(a)) => format!(
            "Build and push the image (see `Dockerfile`; `image:` is `{image}`). No node needs an address: \
             each has a headless Service (`05-services.yaml`) whose DNS name is in the topology, and its \
             pod may run on any host that runs no other fairfeed node (one node per host):\n\n```sh\n\
             kubectl apply -f 00-namespace.yaml -f 01-topology.yaml\n\
             kubectl -n {ns} create secret generic fairfeed-tree-key --from-file=tree.key\n\
             kubectl apply -f 05-services.yaml -f 10-nodes.yaml\n```\n\n\
             A node waits at start-up (`--resolve-wait-s`, up to 10 min) until its peers' pods have IPs and \
             their names resolve, then resolves them again every 10 s and after failed sends, so a \
             rescheduled pod is found at its new host. \
             Pods use the host network; requests equal to limits in whole CPUs put them in the Guaranteed \
             QoS class, which the kubelet's static CPU manager pins to dedicated cores. Prometheus finds \
             the metrics through the `prometheus.io/*` annotations.",
            image = o.image,
            ns = o.namespace
        ),
        Platform::Kubernetes => format!(
            "Build and push the image (see `Dockerfile`; `image:` is `{image}`). Label each Kubernetes node with \
             the fairfeed node it runs — its IP must be the planned address:\n\n```sh\n\
             kubectl label node <host> fairfeed.io/node=<id>\n\
             kubectl apply -f 00-namespace.yaml -f 01-topology.yaml\n\
             kubectl -n {ns} create secret generic fairfeed-tree-key --from-file=tree.key\n\
             kubectl apply -f 10-nodes.yaml\n```\n\n\
             Pods use the host network; requests equal to limits in whole CPUs put them in the Guaranteed \
             QoS class, which the kubelet's static CPU manager pins to dedicated cores. Prometheus finds \
             the metrics through the `prometheus.io/*` annotations.",
            image = o.image,
            ns = o.namespace
        ),
    };
    format!(
        "# fairfeed deployment: {n} receivers, fan-out {f}, depth {d}, hedging {h}\n\n\
         Generated by `fairfeed plan … --emit`. One node per host; each runs `fairfeed <role> --id N` \
         with `topology.toml` and the tree's key (make it once and copy it to every host: `{key}`).\n\n\
         {table}\n{how}\n\n\
         Each node answers SIGTERM by stopping and writing its counters; `fairfeed stat` needs a \
         `--control` address (plan with `--control-port`: each node then answers on 127.0.0.1 at that \
         port, inside its host or pod; to reach it from elsewhere give it `--control HOST:PORT \
         --operator-key-file FILE` — docs/SECURITY.md).\n\n\
         ## Rotating the tree key\n\n\
         Nodes watch their key file and put a changed keyring in force without a restart. Roll over in \
         three steps, each on every host before the next (a node logs `tree keys from …: accepting ids \
         …, sealing with …`, and `fairfeed stat` shows `counters.keys`):\n\n\
         1. accept the next key: `0 <old hex> send` and `1 <new hex>`, one per line;\n\
         2. seal with it: `0 <old hex>` and `1 <new hex> send`;\n\
         3. retire the old key: `1 <new hex> send`.\n\n{rotate}\n{kernel}",
        rotate = match platform {
            Platform::Systemd => "Edit `/etc/fairfeed/tree.key` on each host (`systemctl reload` is not needed).",
            Platform::Compose =>
                "The secret is a bind-mounted file: rewrite `./tree.key` in place (`cat next > tree.key`); \
                 a rename would leave the containers reading the old file.",
            Platform::Kubernetes =>
                "Replace the Secret for each step (`kubectl -n <ns> create secret generic \
                 fairfeed-tree-key --from-file=tree.key --dry-run=client -o yaml | kubectl apply -f -`); the \
                 kubelet updates the mounted file within about a minute.",
        },
        kernel = match &o.kernel_iface {
            Some(i) => format!(
                "\nThe kernel fast path is on: the sender and proxies replicate with TC on `{i}` \
                 (`--tc-replicate`), receivers drop hedged duplicates with XDP on `{i}` (`--xdp-dedup`). \
                 Every host needs `{i}` (its packets' interface), a kernel with BPF (5.10 or later), the \
                 capabilities BPF and NET_ADMIN (granted here), and a fairfeed built where clang was \
                 installed.\n"
            ),
            None => String::new(),
        },
        n = t.receivers,
        f = t.fanout,
        d = t.depth,
        h = t.hedge,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_tree::plan::{plan, PlanRequest};

    fn topo(addresses: bool) -> Topology {
        let req = PlanRequest { receivers: 4, fanout: Some(2), depth: None, hedge: 1, cost_model: None, trees: 1 };
        let mut t = plan(&req).unwrap();
        if addresses {
            for n in &mut t.trees[0].nodes {
                n.addr = Some(format!("10.0.0.{}:9100", n.id + 1));
            }
        }
        t
    }

    #[test]
    fn one_file_or_document_per_node_with_its_id_and_metrics_port() {
        let t = topo(true);
        let o = DeployOptions::default();
        let units = emit(&t, "x", Platform::Systemd, &o).unwrap();
        let services: Vec<_> = units.iter().filter(|(n, _)| n.ends_with(".service")).collect();
        assert_eq!(services.len(), 7, "4 receivers, 2 proxies, 1 sender");
        let r3 = &units.iter().find(|(n, _)| n == "fairfeed-receiver-3.service").unwrap().1;
        assert!(r3.contains("receiver --topology /etc/fairfeed/topology.toml --id 3 --key-file"), "{r3}");
        assert!(r3.contains("--metrics 10.0.0.4:9400"), "{r3}");
        let k8s = emit(&t, "x", Platform::Kubernetes, &o).unwrap();
        let nodes = &k8s.iter().find(|(n, _)| n == "10-nodes.yaml").unwrap().1;
        assert_eq!(nodes.matches("kind: Deployment").count(), 7);
        assert!(nodes.contains("hostNetwork: true") && nodes.contains("containerPort: 9400"));
        let compose = &emit(&t, "x", Platform::Compose, &o).unwrap()[1].1;
        assert!(compose.contains("network_mode: host") && compose.contains("sender-"), "{compose}");
    }

    #[test]
    fn control_sockets_stay_inside_the_host_unless_the_flags_say_otherwise() {
        let mut t = topo(true);
        for n in &mut t.trees[0].nodes {
            n.control = Some(format!("10.0.0.{}:9200", n.id + 1));
        }
        let units = emit(&t, "x", Platform::Systemd, &DeployOptions::default()).unwrap();
        let r3 = &units.iter().find(|(n, _)| n == "fairfeed-receiver-3.service").unwrap().1;
        assert!(r3.contains("--control 127.0.0.1:9200") && !r3.contains("10.0.0.4:9200"), "{r3}");
        let o = DeployOptions { node_flags: vec!["--control=0.0.0.0:9300".into()], ..DeployOptions::default() };
        let units = emit(&t, "x", Platform::Systemd, &o).unwrap();
        let r3 = &units.iter().find(|(n, _)| n == "fairfeed-receiver-3.service").unwrap().1;
        assert!(!r3.contains("127.0.0.1:9200") && r3.contains("--control=0.0.0.0:9300"), "{r3}");
    }

    #[test]
    fn nodes_without_addresses_are_refused() {
        let e = emit(&topo(false), "x", Platform::Kubernetes, &DeployOptions::default()).unwrap_err();
        assert!(matches!(&e, DeployError::NoAddress(ids) if !ids.is_empty()), "{e}");
        assert!(e.to_string().contains("no HOST:PORT address"), "{e}");
    }

    #[test]
    fn several_trees_deploy_each_node_once() {
        let req = PlanRequest { receivers: 4, fanout: Some(2), depth: None, hedge: 1, cost_model: None, trees: 3 };
        let mut t = plan(&req).unwrap();
        for n in t.trees.iter_mut().flat_map(|tr| &mut tr.nodes) {
            n.addr = Some(format!("10.0.0.{}:9100", n.id + 1));
        }
        let units = emit(&t, "x", Platform::Systemd, &DeployOptions::default()).unwrap();
        let services = units.iter().filter(|(n, _)| n.ends_with(".service")).count();
        assert_eq!(services, 4 + 1 + 3 * 2, "4 receivers and 1 sender for all trees, 2 proxies per tree");
    }
}
