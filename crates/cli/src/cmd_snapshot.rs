//! `fairfeed snapshot-server`: follow a MoldUDP64 ITCH feed and serve
//! GLIMPSE-style snapshots of its books over SoupBinTCP.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use fairfeed_feed::snapshot::serve::{
    Credentials, CONNECTIONS_DEFAULT_MAX, CONNECTS_PER_S_DEFAULT_MAX, PER_ADDRESS_DEFAULT_MAX,
};
use fairfeed_feed::snapshot::{GAP_WAIT_DEFAULT_NS, GAP_WAIT_MAX_NS};
use fairfeed_io::counters::Board;
use fairfeed_net::snapshot::{run_server, ServerConfig, ServiceConfig, FEEDS_MAX, SERVER_PART};

#[derive(clap::Args)]
pub struct Args {
    /// Where logins arrive (SoupBinTCP), e.g. 127.0.0.1:26500.
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    listen: SocketAddr,
    /// Where the feed arrives (MoldUDP64 over UDP): an arbitrator's --out-hr,
    /// an exchange's line; give it twice for an A and a B line (each message
    /// is applied once, in sequence order). The books are served only if the
    /// feed was followed from sequence 1 without a loss.
    #[arg(long, required = true, num_args = 1, value_parser = crate::fmt::listen_addr)]
    feed: Vec<SocketAddr>,
    /// The username clients must log in with (default: any login is accepted).
    #[arg(long, requires = "password_file", value_parser = crate::fmt::soup_user)]
    user: Option<String>,
    /// A file whose first line is the password (with --user).
    #[arg(long, value_name = "FILE", requires = "user")]
    password_file: Option<PathBuf>,
    /// How long a gap in the feed is waited for (its other line, a late packet)
    /// before the books are declared stale and no longer served, ms (0..=10,000).
    #[arg(long, default_value_t = GAP_WAIT_DEFAULT_NS / 1_000_000,
          value_parser = clap::value_parser!(u64).range(0..=GAP_WAIT_MAX_NS / 1_000_000))]
    gap_wait_ms: u64,
    /// Open orders the books hold at most (1..=100,000,000); past it the books are stale.
    #[arg(long, default_value_t = fairfeed_feed::book::ORDERS_DEFAULT_MAX as u64,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    orders_max: u64,
    /// Connections open at once (1..=65,536).
    #[arg(long, default_value_t = CONNECTIONS_DEFAULT_MAX as u64, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    connections_max: u64,
    /// Connections open at once from one address (1..=1,024).
    #[arg(long, default_value_t = PER_ADDRESS_DEFAULT_MAX as u64, value_parser = clap::value_parser!(u64).range(1..=1_024))]
    per_address_max: u64,
    /// New connections per second from one address (1..=10,000).
    #[arg(long, default_value_t = CONNECTS_PER_S_DEFAULT_MAX as u64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    connects_per_s: u64,
    /// Exit after this many seconds (default: at SIGINT/SIGTERM).
    #[arg(long, value_parser = crate::fmt::seconds)]
    max_seconds: Option<f64>,
    /// Serve Prometheus metrics at http://ADDR/metrics (feed, books, connections, snapshots).
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    metrics: Option<SocketAddr>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.feed.len() <= FEEDS_MAX, "at most {FEEDS_MAX} --feed addresses, got {}", a.feed.len());
    let credentials = match (&a.user, &a.password_file) {
        (Some(u), Some(p)) => Credentials { user_pass: Some((u.clone(), crate::fmt::soup_password_file(p)?)) },
        _ => Credentials::default(),
    };
    let cfg = ServerConfig {
        feeds: a.feed.clone(),
        service: ServiceConfig {
            listen: a.listen,
            credentials,
            gap_wait_ns: a.gap_wait_ms * 1_000_000,
            orders_max: a.orders_max as usize,
            connections_max: a.connections_max as usize,
            per_address_max: a.per_address_max as usize,
            connects_per_s_max: a.connects_per_s as u32,
        },
    };
    let board = a.metrics.map(|_| Board::new());
    let _metrics = match (a.metrics, board.clone()) {
        (Some(addr), Some(board)) => {
            let help = "the snapshot server";
            Some(crate::fmt::serve_json_metrics(addr, board, SERVER_PART, "fairfeed_snapshot", help)?)
        }
        _ => None,
    };
    let stop = crate::fmt::stop_on_signals()?;
    let until = a.max_seconds.map_or(u64::MAX, |s| fairfeed_io::clock::wall_ns() + (s * 1e9) as u64);
    tracing::info!(
        listen = %a.listen,
        feeds = ?a.feed,
        "snapshot-server: following the feed on {:?}, serving snapshots on {}",
        a.feed,
        a.listen
    );
    let report = run_server(&cfg, board.as_ref(), until, stop).with_context(|| format!("serving on {}", a.listen))?;
    crate::log::final_report("snapshot-server", &report);
    Ok(())
}
