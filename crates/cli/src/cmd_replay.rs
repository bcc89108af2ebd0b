//! `fairfeed replay`: send a capture's UDP payloads like tcpreplay.

use std::net::SocketAddr;
use std::path::PathBuf;

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
    #[arg(long, default_value_t = 1.0, conflicts_with_all = ["rate", "max"], value_parser = crate::fmt::speed)]
    speed: f64,
    /// Replay at a fixed rate, packets per second.
    #[arg(long, conflicts_with = "max", value_parser = crate::fmt::rate)]
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
    /// Failed sends (e.g. the receiver exited before the capture ended) are
    /// reported as a warning; the exit status is 0 if at least one send went out.
    #[arg(long)]
    keep_going: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut datagrams = crate::fmt::read_capture(&a.file, a.port)?;
    if let Some(l) = a.limit {
        datagrams.truncate(l);
    }
    let pacing = match (a.max, a.rate) {
        (true, _) => Pacing::Max,
        (false, Some(pps)) => Pacing::Rate { pps },
        (false, None) => Pacing::Capture { speed: a.speed },
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
    if report.send_errors > 0 {
        let hint = if report.refused > 0 { format!(" — is anything listening at {}?", a.to) } else { String::new() };
        let what = format!(
            "{} of {} sends failed (first: {}){hint}",
            report.send_errors,
            report.packets + report.send_errors,
            report.first_error.as_deref().unwrap_or("?")
        );
        if !a.keep_going || report.packets == 0 {
            anyhow::bail!(what);
        }
        eprintln!("fairfeed: warning: {what}");
    }
    Ok(())
}
