//! `fairfeed replay`: send a capture's UDP payloads like tcpreplay.

use std::net::SocketAddr;
use std::path::PathBuf;

use fairfeed_feed::capture::read_datagrams;
use fairfeed_net::replay::{replay, Pacing};

#[derive(clap::Args)]
pub struct Args {
    /// A pcap or pcapng capture.
    file: PathBuf,
    /// Where to send, e.g. 127.0.0.1:26477.
    #[arg(long)]
    to: SocketAddr,
    /// Only datagrams to this destination port in the capture.
    #[arg(long)]
    port: Option<u16>,
    /// Replay with the capture's pacing, sped up by this factor.
    #[arg(long, default_value_t = 1.0, conflicts_with_all = ["rate", "max"])]
    speed: f64,
    /// Replay at a fixed rate, packets per second.
    #[arg(long, conflicts_with = "max")]
    rate: Option<f64>,
    /// Replay as fast as possible.
    #[arg(long)]
    max: bool,
    /// Send at most this many packets.
    #[arg(long)]
    limit: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let (mut datagrams, _) = read_datagrams(&a.file, a.port)?;
    if let Some(l) = a.limit {
        datagrams.truncate(l);
    }
    let pacing = match (a.max, a.rate) {
        (true, _) => Pacing::Max,
        (false, Some(pps)) => {
            anyhow::ensure!(pps > 0.0 && pps.is_finite(), "--rate must be positive");
            Pacing::Rate { pps }
        }
        (false, None) => {
            anyhow::ensure!(a.speed > 0.0 && a.speed.is_finite(), "--speed must be positive");
            Pacing::Capture { speed: a.speed }
        }
    };
    let pb = crate::fmt::progress(datagrams.len() as u64, "replaying packets");
    let report = replay(&datagrams, a.to, pacing, |n| {
        if n % 1024 == 0 {
            pb.set_position(n);
        }
    })?;
    pb.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "sent {} packets ({} bytes) in {:.3} s = {:.0} packets/s; lateness p50 {} ns, p99 {} ns, max {} ns; {} send errors",
            report.packets,
            report.bytes,
            report.elapsed_s,
            report.achieved_pps,
            report.lateness_p50_ns,
            report.lateness_p99_ns,
            report.lateness_max_ns,
            report.send_errors
        );
    }
    Ok(())
}
