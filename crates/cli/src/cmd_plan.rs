//! `fairfeed plan`: the multicast tree a deployment (or the simulator) uses.

use std::path::PathBuf;

use anyhow::Context;
use fairfeed_tree::plan::{plan, to_dot, CostModel, PlanRequest, Role};

#[derive(clap::Args)]
pub struct Args {
    /// Number of receivers (1..=100,000).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    receivers: usize,
    /// Hedging factor H (0..=64): each proxy also serves the children of H siblings.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=64))]
    hedge: usize,
    /// Fan-out F (1..=100,000; default: Jasper's heuristic F = 10, D = ⌈log10 N⌉).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    fanout: Option<usize>,
    /// Depth D, counting the receivers' layer (1..=8).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=8))]
    depth: Option<usize>,
    /// Choose D and F with the linear cost model (per-hop + per-copy cost).
    #[arg(long)]
    cost_model: bool,
    /// Cost model: latency of one hop, µs (0..=1,000,000; Jasper measured ≈ 30).
    #[arg(long, default_value_t = 30.0, value_parser = |s: &str| crate::fmt::f64_in(s, 0.0, 1e6, "µs"))]
    hop_us: f64,
    /// Cost model: cost of one more copy a proxy sends, µs (0..=1,000,000; Jasper: ≈ 2.7).
    #[arg(long, default_value_t = 2.7, value_parser = |s: &str| crate::fmt::f64_in(s, 0.0, 1e6, "µs"))]
    copy_us: f64,
    /// Size the trees for this many messages per second in all (1..=10,000,000):
    /// the fewest trees that keep the busiest proxy's send queue at --load-max
    /// (with --copy-us per copy); says what the sender's queue then carries.
    #[arg(long, conflicts_with = "trees", value_parser = |s: &str| crate::fmt::f64_in(s, 1.0, 1e7, "msg/s"))]
    rate: Option<f64>,
    /// With --rate: the largest share of a send queue a proxy may spend copying (0.05..=1).
    #[arg(long, default_value_t = 0.5, requires = "rate", value_parser = |s: &str| crate::fmt::f64_in(s, 0.05, 1.0, ""))]
    load_max: f64,
    /// Trees sharing the receivers, symbols sharded by stock locate (1..=64).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    trees: usize,
    /// Write the topology here (.toml, or .json); with --emit, a directory for the deployment files.
    #[arg(long)]
    out: PathBuf,
    /// Also write deployment files into --out (a directory): one systemd unit, Compose service or
    /// Kubernetes Deployment per node, the topology, a Dockerfile and a README (systemd and Compose:
    /// every node needs an address; Kubernetes names the nodes without one, a headless Service each).
    #[arg(long, value_enum)]
    emit: Option<EmitArg>,
    /// With --emit: nodes join a controller instead of reading a topology —
    /// no address anywhere but the controller's: a controller, the sender,
    /// and the proxies (with --spares) and receivers as one scalable workload
    /// each (a Deployment, a Compose service with replicas, a unit per role).
    #[arg(long, requires = "emit")]
    controlled: bool,
    /// With --controlled: spare proxies beside the planned ones, first in line to replace a dead one (0..=1,000).
    #[arg(long, default_value_t = 1, requires = "controlled", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=1_000))]
    spares: usize,
    /// With --emit: each node serves Prometheus metrics on its own IP at this port.
    #[arg(long, default_value_t = 9400, value_parser = clap::value_parser!(u16).range(1..))]
    metrics_port: u16,
    /// With --emit: the container image (compose, k8s).
    #[arg(long, default_value = "fairfeed:latest")]
    image: String,
    /// With --emit: the kernel fast path on this interface of every host (TC
    /// replication at the sender and proxies, XDP de-duplication at
    /// receivers, CAP_BPF granted).
    #[arg(long, value_name = "IFACE", value_parser = crate::cmd_node::iface_name, requires = "emit")]
    kernel_path: Option<String>,
    /// With --emit systemd: where the fairfeed binary is on each host.
    #[arg(long, default_value = "/usr/local/bin/fairfeed")]
    binary: String,
    /// Give every node a loopback address for one-process-per-node runs:
    /// node ID gets 127.1.(ID / 250).(ID % 250 + 1):PORT.
    #[arg(long)]
    loopback_port: Option<u16>,
    /// Set node ID's address (repeatable; after --loopback-port): an IP or a
    /// host name the nodes resolve (and resolve again while they run), e.g.
    /// `--address 0=10.0.0.1:9000` or `--address 0=node-0.tree.svc:9000`.
    #[arg(long, value_parser = parse_address)]
    address: Vec<(u32, fairfeed_tree::addr::HostPort)>,
    /// Give every node with an address a control address on the same host at
    /// this port: the node answers `fairfeed stat` there unless its command
    /// line says otherwise, and `fairfeed stat --topology` asks every node
    /// there (a fleet view of the running tree).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    control_port: Option<u16>,
    /// Also write each tree as Graphviz DOT (tree 0 here, tree k beside it as NAME-treeK.dot; an SVG beside each when `dot` is installed).
    #[arg(long)]
    dot: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum EmitArg {
    /// One unit file per node.
    Systemd,
    /// A Compose file with one service per node (host networking).
    Compose,
    /// Kubernetes manifests: a namespace, the topology's ConfigMap, a Deployment per node.
    K8s,
}

/// Writes the deployment files for `topo` into `dir`.
fn emit(a: &Args, which: EmitArg, topo: &fairfeed_tree::plan::Topology) -> anyhow::Result<()> {
    use fairfeed_ops::deploy::{DeployOptions, Platform};
    let platform = match which {
        EmitArg::Systemd => Platform::Systemd,
        EmitArg::Compose => Platform::Compose,
        EmitArg::K8s => Platform::Kubernetes,
    };
    let o = DeployOptions {
        binary: a.binary.clone(),
        image: a.image.clone(),
        metrics_port: a.metrics_port,
        kernel_iface: a.kernel_path.clone(),
        ..DeployOptions::default()
    };
    let files = if a.controlled {
        let shape = fairfeed_ops::controlled::Shape {
            receivers: topo.receivers,
            proxies: topo.trees[0].nodes.iter().filter(|n| n.role == Role::Proxy).count(),
            spares: a.spares,
            fanout: topo.fanout,
            hedge: topo.hedge,
            depth: topo.depth,
        };
        anyhow::ensure!(topo.trees.len() == 1, "--controlled: a controller builds one tree (plan with --trees 1)");
        fairfeed_ops::controlled::emit(&shape, platform, &o).map_err(|e| anyhow::anyhow!("--emit: {e}"))?
    } else {
        let text = toml::to_string(topo).context("serializing the topology as TOML")?;
        fairfeed_ops::deploy::emit(topo, &text, platform, &o).map_err(|e| anyhow::anyhow!("--emit: {e}"))?
    };
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    for (name, body) in &files {
        let p = a.out.join(name);
        std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))?;
    }
    eprintln!("plan: wrote {} files into {} (start with its README.md)", files.len(), a.out.display());
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.emit.is_none() {
        let outs: Vec<&std::path::Path> = std::iter::once(a.out.as_path()).chain(a.dot.as_deref()).collect();
        crate::fmt::check_outputs(&outs, &[])?;
    }
    let mut req = PlanRequest {
        receivers: a.receivers,
        fanout: a.fanout,
        depth: a.depth,
        hedge: a.hedge,
        cost_model: a.cost_model.then_some(CostModel { hop_ns: a.hop_us * 1e3, copy_ns: a.copy_us * 1e3 }),
        trees: a.trees,
    };
    if let Some(rate) = a.rate {
        req.trees = fairfeed_tree::plan::trees_for_rate(&req, rate, a.copy_us * 1e3, a.load_max)
            .map_err(|e| anyhow::anyhow!("--rate: {e}"))?;
    }
    let mut topo = plan(&req).map_err(|e| anyhow::anyhow!("invalid plan: {e}"))?;
    if let Some(rate) = a.rate {
        say_loads(&a, &topo, rate);
    }
    address_nodes(&a, &mut topo)?;
    if let Some(which) = a.emit {
        return emit(&a, which, &topo);
    }
    let text = if a.out.extension().is_some_and(|e| e == "json") {
        serde_json::to_string_pretty(&topo)?
    } else {
        toml::to_string(&topo).context("serializing the topology as TOML")?
    };
    std::fs::write(&a.out, text).with_context(|| format!("writing {}", a.out.display()))?;
    let proxies = topo.trees.iter().flat_map(|t| &t.nodes).filter(|n| n.role == Role::Proxy).count();
    eprintln!(
        "plan: {} receivers, fan-out {}, depth {}, hedge {}, {} tree(s), {} proxies -> {}",
        topo.receivers,
        topo.fanout,
        topo.depth,
        topo.hedge,
        topo.trees.len(),
        proxies,
        a.out.display()
    );
    if let Some(first) = &a.dot {
        write_dots(&topo, first)?;
    }
    Ok(())
}

/// `--rate`: how loaded the busiest proxy and the sender are.
fn say_loads(a: &Args, topo: &fairfeed_tree::plan::Topology, rate: f64) {
    let l = fairfeed_tree::plan::loads(topo, rate, a.copy_us * 1e3);
    eprintln!(
        "plan: {rate} msg/s over {} tree(s): the busiest proxy's send queue at {:.2}; the sender's at {:.2} on one \
         queue, {:.2} with a queue per tree{}",
        topo.trees.len(),
        l.proxy,
        l.sender,
        l.sender_per_tree,
        if l.sender > a.load_max {
            " — one queue cannot carry it: give the sender a Tx queue per tree, or fewer first-layer proxies"
        } else {
            ""
        }
    );
}

/// The nodes' addresses (`--loopback-port`, `--address`, Kubernetes names)
/// and control addresses (`--control-port`), checked.
fn address_nodes(a: &Args, topo: &mut fairfeed_tree::plan::Topology) -> anyhow::Result<()> {
    for n in topo.trees.iter_mut().flat_map(|t| &mut t.nodes) {
        if let Some(port) = a.loopback_port {
            n.addr = Some(format!("{}:{port}", fairfeed_net::tree::demo::node_addr(n.id)));
        }
        if let Some((_, addr)) = a.address.iter().rev().find(|(id, _)| *id == n.id) {
            n.addr = Some(addr.to_string());
        }
    }
    if matches!(a.emit, Some(EmitArg::K8s)) {
        // Kubernetes places the nodes given no address, by name.
        fairfeed_ops::deploy::name_nodes(topo, &fairfeed_ops::deploy::DeployOptions::default().namespace);
    }
    if let Some(port) = a.control_port {
        for n in topo.trees.iter_mut().flat_map(|t| &mut t.nodes) {
            let host = n.addr.as_deref().and_then(|s| fairfeed_tree::addr::HostPort::parse(s, false).ok());
            n.control = host.map(|h| fairfeed_tree::addr::HostPort { host: h.host, port }.to_string());
        }
    }
    let ids: std::collections::HashSet<u32> = topo.trees.iter().flat_map(|t| &t.nodes).map(|n| n.id).collect();
    if let Some((id, _)) = a.address.iter().find(|(id, _)| !ids.contains(id)) {
        anyhow::bail!("--address {id}=…: no node {id} in this plan");
    }
    fairfeed_tree::plan::validate(topo).map_err(|e| anyhow::anyhow!("--address: {e}"))?;
    Ok(())
}

/// `--dot`: tree 0 in the file named; over several trees each further tree
/// beside it (NAME-tree1.dot, …), each drawn as SVG where graphviz is installed.
fn write_dots(topo: &fairfeed_tree::plan::Topology, first: &std::path::Path) -> anyhow::Result<()> {
    for k in 0..topo.trees.len() {
        let dot = if k == 0 {
            first.to_path_buf()
        } else {
            let stem = first.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
            first.with_file_name(format!("{stem}-tree{k}.dot"))
        };
        std::fs::write(&dot, to_dot(topo, k)).with_context(|| format!("writing {}", dot.display()))?;
        let svg = dot.with_extension("svg");
        match std::process::Command::new("dot").arg("-Tsvg").arg(&dot).arg("-o").arg(&svg).status() {
            Ok(s) if s.success() => eprintln!("plan: drew {}", svg.display()),
            _ => eprintln!("plan: wrote {} (install graphviz's `dot` to draw it)", dot.display()),
        }
    }
    Ok(())
}

fn parse_address(s: &str) -> Result<(u32, fairfeed_tree::addr::HostPort), String> {
    let (id, addr) = s.split_once('=').ok_or("expected ID=HOST:PORT")?;
    let id = id.trim().parse().map_err(|e| format!("node id {id:?}: {e}"))?;
    Ok((id, fairfeed_tree::addr::HostPort::parse(addr, false).map_err(|e| e.to_string())?))
}
