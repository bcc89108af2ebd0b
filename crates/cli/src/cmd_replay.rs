//! `fairfeed replay`: send a capture's UDP payloads like tcpreplay.

use std::net::SocketAddr;
use std::path::PathBuf;

use fairfeed_net::replay::{replay_lines, Line, Pacing};

#[derive(clap::Args)]
pub struct Args {
    /// A pcap or pcapng capture.
    file: PathBuf,
    /// Where to send, e.g. 127.0.0.1:26477.
    #[arg(long, value_parser = crate::fmt::dest_addr)]
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
    /// Also replay this capture (the B line of an A/B pair) on the same clock:
    /// both captures start together and interleave by capture timestamp.
    #[arg(long, requires = "and_to")]
    and: Option<PathBuf>,
    /// Where the --and capture goes, e.g. 127.0.0.1:26479.
    #[arg(long, requires = "and", value_parser = crate::fmt::dest_addr)]
    and_to: Option<SocketAddr>,
    /// Send at most this many packets (of each capture).
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
    let mut second = match &a.and {
        Some(f) => crate::fmt::read_capture(f, a.port)?,
        None => Vec::new(),
    };
    if let Some(l) = a.limit {
        datagrams.truncate(l);
        second.truncate(l);
    }
    let pacing = match (a.max, a.rate) {
        (true, _) => Pacing::Max,
        (false, Some(pps)) => Pacing::Rate { pps },
        (false, None) => Pacing::Capture { speed: a.speed },
    };
    let mut lines = vec![Line { datagrams: &datagrams, to: a.to }];
    if let Some(to) = a.and_to {
        lines.push(Line { datagrams: &second, to });
    }
    let total = lines.iter().map(|l| l.datagrams.len() as u64).sum();
    let pb = crate::fmt::progress(total, "replaying packets");
    let report = replay_lines(&lines, pacing, |n| {
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
        let to = match a.and_to {
            Some(b) => format!("{} and {b}", a.to),
            None => a.to.to_string(),
        };
        let hint = if report.refused > 0 { format!(" — is anything listening at {to}?") } else { String::new() };
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
