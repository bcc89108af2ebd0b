//! `fairfeed stats`: workload characterization of a capture.

use std::path::PathBuf;

use fairfeed_feed::capture::{udp_of, CaptureReader, SkipCounts};
use fairfeed_feed::stats::{Stats, StatsBuilder};

#[derive(clap::Args)]
pub struct Args {
    /// A pcap or pcapng capture of a MoldUDP64 feed.
    file: PathBuf,
    /// Only UDP datagrams to this destination port.
    #[arg(long)]
    port: Option<u16>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut b = StatsBuilder::new();
    let mut skipped = SkipCounts::default();
    let mut capture_error = None;
    for frame in CaptureReader::open(&a.file)? {
        match frame {
            Ok(f) => {
                if let Some(d) = udp_of(&f, a.port, &mut skipped) {
                    b.add(d.ts_ns, &d.payload);
                }
            }
            Err(e) => {
                capture_error = Some(e);
                break;
            }
        }
    }
    let s = b.finish();
    if a.json {
        let mut v = serde_json::to_value(&s)?;
        v["skipped_frames"] = serde_json::to_value(&skipped)?;
        if let Some(e) = &capture_error {
            v["capture_error"] = e.to_string().into();
        }
        println!("{v}");
    } else {
        print_text(&s);
    }
    match capture_error {
        Some(e) => Err(anyhow::Error::new(e)
            .context("capture ends in a damaged record; the statistics above cover what came before it")),
        None => Ok(()),
    }
}

fn print_text(s: &Stats) {
    println!("packets           {} ({} with messages)", s.packets, s.data_packets);
    println!("messages          {} ({} undecodable)", s.messages, s.undecodable_messages);
    println!("bytes             {} (UDP payload)", s.bytes);
    println!("duration          {:.3} s", s.duration_s);
    println!("mean rate         {:.0} packets/s, {:.0} messages/s", s.mean_packets_per_s, s.mean_messages_per_s);
    let d = &s.msgs_per_packet;
    println!("msgs per packet   mean {:.2}  p50 {}  p90 {}  p99 {}  max {}", d.mean, d.p50, d.p90, d.p99, d.max);
    let d = &s.packet_bytes;
    println!("packet bytes      mean {:.1}  p50 {}  p99 {}  max {}", d.mean, d.p50, d.p99, d.max);
    println!("message bytes     mean {:.2}", s.msg_bytes_mean);
    for (name, p) in [("packets", &s.peak_packets), ("messages", &s.peak_messages), ("bytes", &s.peak_bytes)] {
        println!(
            "peak second ({name:8}) {}: {} packets, {} messages, {} bytes",
            p.second, p.packets, p.messages, p.bytes
        );
    }
    let d = &s.same_symbol_interarrival_ns;
    println!("same-symbol gap   mean {:.0} ns  p50 {} ns  p90 {} ns  p99 {} ns", d.mean, d.p50, d.p90, d.p99);
    let cdf: Vec<String> =
        s.same_symbol_cdf.iter().map(|(b, f)| format!("≤{}: {:.1}%", human_ns(*b), f * 100.0)).collect();
    println!("same-symbol CDF   {}", cdf.join("  "));
    println!("types (count, mean bytes):");
    for (t, (c, m)) in &s.types {
        println!("  {t}  {c:>10}  {m:.0}");
    }
}

fn human_ns(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 => format!("{}s", n / 1_000_000_000),
        n if n >= 1_000_000 => format!("{}ms", n / 1_000_000),
        n if n >= 1_000 => format!("{}µs", n / 1_000),
        n => format!("{n}ns"),
    }
}
