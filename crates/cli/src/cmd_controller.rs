//! `fairfeed controller`: places nodes started with `--controller` at run
//! time, repairs around the dead and holds flapping nodes down (the core:
//! `fairfeed_tree::controller`; the shell: `fairfeed_net::tree::controller`).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use fairfeed_io::agent::{run, RunConfig};
use fairfeed_io::idle::IdleStrategy;
use fairfeed_net::tree::controller::{ControllerAgent, CONTROLLER_PART};
use fairfeed_net::tree::store::{Keeper, KvStore, MemStore};
use fairfeed_tree::auth::Auth;
use fairfeed_tree::controller::{Controller, ControllerConfig};

#[derive(clap::Args)]
pub struct Args {
    /// Where nodes register and beat (UDP).
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    listen: SocketAddr,
    /// Children per proxy (and the sender) unless a node registers a capacity of its own, 1..=128.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=128))]
    fanout: u16,
    /// Siblings each proxy hedges for (sibling hedging, H), 0..=8.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=8))]
    hedge: u8,
    /// Layers below the sender, receivers' included (2: one layer of proxies), 1..=8.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=8))]
    depth: u8,
    /// A node silent this long (ms) is declared dead and repaired around, 1..=60,000.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    dead_after_ms: u64,
    /// A node declared dead is refused this long (ms), so flapping does not churn the tree, 1..=3,600,000.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    hold_down_ms: u64,
    /// Members one IP address may hold, 1..=100,000.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    members_per_ip: u32,
    /// The tree's key (as the nodes'): registrations and heartbeats are
    /// refused unless sealed with it, and views are sealed with it.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Write the current topology here (TOML, as `fairfeed plan` writes it, with addresses) at each new version.
    #[arg(long)]
    topology_out: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (the counters of --stats-out, twice a second).
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    metrics: Option<SocketAddr>,
    /// Write the controller's counters here (JSON) at exit.
    #[arg(long)]
    stats_out: Option<PathBuf>,
    /// Where the membership is kept and the lead is decided: `mem` (in
    /// this process: one controller) or NATS JetStream KV at `nats://HOST:PORT`
    /// (comma-separated for a cluster): several controllers share it, one
    /// leads by compare-and-set on a lease, and a follower takes over when
    /// the lease lapses.
    #[arg(long, default_value = "mem")]
    store: String,
    /// The KV bucket (with a NATS store).
    #[arg(long, default_value = "fairfeed-tree")]
    bucket: String,
    /// Copies of the bucket a NATS cluster keeps, 1..=5.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    replicas: u8,
    /// The lease (ms): a follower takes over at most this long after the leader stops renewing, 50..=60,000.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    lease_ms: u64,
    /// This controller's name in the lease (default: its listen address).
    #[arg(long)]
    name: Option<String>,
    /// Stop after this many seconds (default: until signalled).
    #[arg(long, value_parser = crate::fmt::seconds)]
    seconds: Option<f64>,
}

/// `--key-file`: registrations must be sealed with the tree key (without: anyone may join, warned).
fn controller_auth(a: &Args) -> anyhow::Result<Option<Auth>> {
    let Some(p) = &a.key_file else {
        tracing::warn!("controller: no --key-file: anyone who reaches {} can join the tree", a.listen);
        return Ok(None);
    };
    let text = crate::fmt::key_text(p)?;
    Ok(Some(Auth::from_text(&text).map_err(|e| anyhow::anyhow!("bad key in {}: {e}", p.display()))?))
}

/// `--store`: the embedded store, or NATS JetStream KV.
fn open_store(a: &Args) -> anyhow::Result<Box<dyn KvStore>> {
    Ok(match a.store.as_str() {
        "mem" => Box::new(MemStore::default()),
        url if url.starts_with("nats://") || url.starts_with("tls://") => Box::new(
            fairfeed_bridge::kv::JetStreamKv::open(
                url,
                &fairfeed_bridge::security::Security::default(),
                &a.bucket,
                usize::from(a.replicas),
            )
            .map_err(|e| anyhow::anyhow!("--store {url}: {e}"))?,
        ),
        other => anyhow::bail!("--store {other}: give `mem` or nats://HOST:PORT"),
    })
}

pub fn run_controller(a: Args) -> anyhow::Result<()> {
    let outs: Vec<&std::path::Path> = a.topology_out.iter().chain(&a.stats_out).map(PathBuf::as_path).collect();
    let ins: Vec<&std::path::Path> = a.key_file.iter().map(PathBuf::as_path).collect();
    crate::fmt::check_outputs(&outs, &ins)?;
    let cfg = ControllerConfig {
        fanout: usize::from(a.fanout),
        hedge: usize::from(a.hedge),
        proxy_layers: usize::from(a.depth) - 1,
        dead_after_ns: a.dead_after_ms * 1_000_000,
        hold_down_ns: a.hold_down_ms * 1_000_000,
        members_per_ip_max: a.members_per_ip as usize,
        ..ControllerConfig::default()
    };
    let core = Controller::new(cfg, controller_auth(&a)?).map_err(|e| anyhow::anyhow!("{e}"))?;
    let stop = crate::fmt::stop_on_signals()?;
    let end_ns = a.seconds.map_or(u64::MAX, |s| fairfeed_io::clock::wall_ns() + (s * 1e9) as u64);
    let store = open_store(&a)?;
    let agent = ControllerAgent::new(a.listen, core, a.topology_out.clone(), end_ns)
        .with_context(|| format!("binding {}", a.listen))?;
    let name = a.name.clone().unwrap_or_else(|| agent.addr().to_string());
    tracing::info!("controller {name}: membership in {}; leading once it holds the lease", store.describe());
    let keeper = Keeper::spawn(store, name, std::time::Duration::from_millis(a.lease_ms))
        .context("starting the store keeper")?;
    let mut agent = agent.with_keeper(keeper);
    let _metrics = match a.metrics {
        Some(addr) => {
            let board = fairfeed_io::counters::Board::new();
            agent = agent.with_publish(&board)?;
            let help = "the tree controller (docs/FILES.md)";
            Some(crate::fmt::serve_json_metrics(addr, board, CONTROLLER_PART, "fairfeed_controller", help)?)
        }
        None => None,
    };
    tracing::info!(
        addr = %agent.addr(),
        "controller: listening at {} (fan-out {}, hedge {}, depth {}, dead after {} ms, hold-down {} ms)",
        agent.addr(),
        a.fanout,
        a.hedge,
        a.depth,
        a.dead_after_ms,
        a.hold_down_ms
    );
    let rc = RunConfig { idle: IdleStrategy::Park, stop: Some(stop), ..RunConfig::default() };
    run(&mut [&mut agent], &rc).context("running the controller")?;
    let mut report = agent.report();
    report.keeper = agent.finish();
    tracing::info!(
        version = report.version,
        members = report.members,
        "controller: stopped at topology version {} with {} members ({} deaths, {} repairs)",
        report.version,
        report.members,
        report.core.deaths,
        report.core.repairs
    );
    let text = serde_json::to_string_pretty(&report)?;
    match &a.stats_out {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?,
        None => println!("{text}"),
    }
    Ok(())
}
