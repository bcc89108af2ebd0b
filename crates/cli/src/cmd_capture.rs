//! `fairfeed capture --listen ADDR --out FILE`: record the UDP datagrams
//! arriving at one address as a pcap (no privileges needed) — e.g. what a
//! receiver's `--deliver` hands an application.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fairfeed_net::capture::{bind, capture, Until};

#[derive(clap::Args)]
pub struct Args {
    /// The UDP address to listen on (IPv4), e.g. 127.0.0.1:27100.
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    listen: SocketAddr,
    /// The pcap to write (nanosecond timestamps, Ethernet/IPv4/UDP frames to the listen address).
    #[arg(long)]
    out: PathBuf,
    /// Stop this many seconds after the last datagram (once one came), 0.001..=10,000,000.
    #[arg(long, value_parser = crate::fmt::seconds)]
    idle_s: Option<f64>,
    /// Stop this many seconds after starting, 0.001..=10,000,000.
    #[arg(long, value_parser = crate::fmt::seconds)]
    seconds: Option<f64>,
    /// Stop after this many datagrams, 1..=1,000,000,000.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    count: Option<u64>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    crate::fmt::check_outputs(&[&a.out], &[])?;
    let stop = crate::fmt::stop_on_signals()?;
    let sock = bind(a.listen)?;
    tracing::info!(addr = %a.listen, "capture: listening on {}, writing {}", a.listen, a.out.display());
    let until = Until {
        idle: a.idle_s.map(Duration::from_secs_f64),
        max: a.seconds.map(Duration::from_secs_f64),
        datagrams: a.count,
    };
    let c = capture(&sock, &a.out, until, &stop, |_| {}).with_context(|| format!("capturing on {}", a.listen))?;
    if a.json {
        println!("{}", serde_json::to_string(&c)?);
    } else {
        println!(
            "captured {} datagrams ({} bytes) on {} in {:.1} s into {}",
            c.datagrams,
            c.bytes,
            a.listen,
            c.seconds,
            a.out.display()
        );
    }
    Ok(())
}
