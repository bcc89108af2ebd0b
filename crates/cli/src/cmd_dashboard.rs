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
    #[arg(long, default_value = "127.0.0.1:9600", value_parser = crate::fmt::listen_addr)]
    listen: SocketAddr,
    /// Each node's metrics port (its `--metrics IP:PORT`, on the node's own IP; `plan --emit` uses 9400).
    #[arg(long, default_value_t = 9400, value_parser = clap::value_parser!(u16).range(1..))]
    metrics_port: u16,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let topology = crate::cmd_node::load_topology(&a.topology)?;
    let stop = crate::fmt::stop_on_signals()?;
    let title = format!("{}", a.topology.display());
    fairfeed_ops::dashboard::run(topology, &title, a.listen, a.metrics_port, &stop)
        .with_context(|| format!("serving the dashboard on {}", a.listen))?;
    Ok(())
}
