//! `fairfeed dashboard`: a live web page of a running tree, from its nodes' metrics.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args)]
pub struct Args {
    /// The tree's topology (with every node's address; `fairfeed plan`).
    #[arg(long)]
    topology: PathBuf,
    /// Serve the page here: http://ADDR/ (and its data at /api/state).
    #[arg(long, default_value = "127.0.0.1:9600")]
    listen: SocketAddr,
    /// Each node's metrics port (its `--metrics IP:PORT`, on the node's own IP; `plan --emit` uses 9400).
    #[arg(long, default_value_t = 9400, value_parser = clap::value_parser!(u16).range(1..))]
    metrics_port: u16,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.topology).with_context(|| format!("reading {}", a.topology.display()))?;
    let topology: fairfeed_tree::plan::Topology = if a.topology.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).with_context(|| format!("{}: not a topology", a.topology.display()))?
    } else {
        toml::from_str(&text).map_err(|e| {
            let line = fairfeed_sim::model::toml_error_line(&text, &e);
            anyhow::anyhow!("{}: not a topology: {line}", a.topology.display())
        })?
    };
    anyhow::ensure!(!topology.trees.is_empty(), "{}: the topology has no tree", a.topology.display());
    let stop = crate::cmd_arb::stop_on_signals()?;
    fairfeed_ops::dashboard::run(topology, a.listen, a.metrics_port, &stop)
        .with_context(|| format!("serving the dashboard on {}", a.listen))?;
    Ok(())
}
