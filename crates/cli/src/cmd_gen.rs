//! `fairfeed gen`: the synthetic feed generator's shell.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;

use anyhow::Context;
use fairfeed_feed::capture::CaptureWriter;
use fairfeed_feed::gen::{GenConfig, GenPacket, Generator};
use fairfeed_feed::lines::{impair, Impairment, LineReport};
use fairfeed_wire::moldudp64::Session;

/// Unix time of 2024-01-02 00:00:00 UTC: the default capture date.
const DEFAULT_DAY_UNIX_S: u64 = 1_704_153_600;
/// Source address of the generated feed (documentation range, never sent to).
const SRC: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40_000);
/// Multicast groups of the clean/A line and the B line.
const GROUP_A: Ipv4Addr = Ipv4Addr::new(233, 54, 12, 111);
const GROUP_B: Ipv4Addr = Ipv4Addr::new(233, 54, 12, 112);

#[derive(clap::Args)]
pub struct Args {
    /// RNG seed: the same seed and options give the same bytes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Total ITCH messages (session events and stock directory included; 1..=1,000,000,000,
    /// and at least what the session events and the directory of --symbols take).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    messages: u64,
    /// Number of symbols.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    symbols: u32,
    /// UDP destination port of the feed.
    #[arg(long, default_value_t = 26_477)]
    port: u16,
    /// Output pcap of the clean feed.
    #[arg(long, default_value = "feed.pcap")]
    out: PathBuf,
    /// Mean message rate over the session, messages/s (seed 001: ~6,700).
    #[arg(long, default_value_t = 6_700.0, value_parser = crate::fmt::rate)]
    rate: f64,
    /// Mean messages per MoldUDP64 packet (seed 001: 5.05).
    #[arg(long, default_value_t = 5.05, value_parser = crate::fmt::msgs_per_packet)]
    msgs_per_packet: f64,
    /// Largest MoldUDP64 packet in bytes.
    #[arg(long, default_value_t = 1400, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(72..=65_507))]
    packet_max: usize,
    /// MoldUDP64 session name (up to 10 characters).
    #[arg(long, default_value = "FAIRFEED01")]
    session: String,
    /// Emit at least one message of every ITCH 5.0 type.
    #[arg(long)]
    all_types: bool,
    /// Capture date as Unix seconds of its midnight.
    #[arg(long, default_value_t = DEFAULT_DAY_UNIX_S)]
    day_unix_s: u64,
    /// Also write the A line here.
    #[arg(long)]
    a_out: Option<PathBuf>,
    /// Also write the B line here.
    #[arg(long)]
    b_out: Option<PathBuf>,
    #[arg(long, default_value_t = 0.0, help = "A line: fraction of packets lost", value_parser = crate::fmt::share)]
    loss_a: f64,
    #[arg(long, default_value_t = 0.0, help = "B line: fraction of packets lost", value_parser = crate::fmt::share)]
    loss_b: f64,
    #[arg(long, default_value_t = 0.0, help = "A line: fraction of packets duplicated", value_parser = crate::fmt::share)]
    dup_a: f64,
    #[arg(long, default_value_t = 0.0, help = "B line: fraction of packets duplicated", value_parser = crate::fmt::share)]
    dup_b: f64,
    #[arg(long, default_value_t = 0.0, help = "A line: fraction of packets reordered", value_parser = crate::fmt::share)]
    reorder_a: f64,
    #[arg(long, default_value_t = 0.0, help = "B line: fraction of packets reordered", value_parser = crate::fmt::share)]
    reorder_b: f64,
    #[arg(long, default_value_t = 0.0, help = "A line: fixed delay, µs", value_parser = crate::fmt::us)]
    delay_a_us: f64,
    #[arg(long, default_value_t = 5.0, help = "B line: fixed delay, µs", value_parser = crate::fmt::us)]
    delay_b_us: f64,
    #[arg(long, default_value_t = 2.0, help = "A line: uniform jitter, µs", value_parser = crate::fmt::us)]
    jitter_a_us: f64,
    #[arg(long, default_value_t = 2.0, help = "B line: uniform jitter, µs", value_parser = crate::fmt::us)]
    jitter_b_us: f64,
    /// Print a JSON summary of what was written.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.session.len() <= 10 && a.session.is_ascii(), "--session must be at most 10 ASCII characters");
    let outs: Vec<&std::path::Path> =
        std::iter::once(a.out.as_path()).chain(a.a_out.as_deref()).chain(a.b_out.as_deref()).collect();
    crate::fmt::check_outputs(&outs, &[])?;
    let cfg = GenConfig {
        seed: a.seed,
        messages: a.messages,
        symbols: a.symbols,
        session: Session::from_str_padded(&a.session),
        rate_msgs_per_s: a.rate,
        msgs_per_packet_mean: a.msgs_per_packet,
        packet_len_max: a.packet_max,
        all_types: a.all_types,
        ..GenConfig::default()
    };
    let gen = Generator::new(cfg)?;
    let imp_a = line(a.loss_a, a.dup_a, a.reorder_a, a.delay_a_us, a.jitter_a_us).context("A line")?;
    let imp_b = line(a.loss_b, a.dup_b, a.reorder_b, a.delay_b_us, a.jitter_b_us).context("B line")?;
    let day_ns = a.day_unix_s * 1_000_000_000;
    let dst_a = SocketAddrV4::new(GROUP_A, a.port);
    let pb = crate::fmt::progress(a.messages, "generating messages");
    let mut w = CaptureWriter::create(&a.out)?;
    let keep = a.a_out.is_some() || a.b_out.is_some();
    let mut clean: Vec<GenPacket> = Vec::new();
    let (mut packets, mut bytes) = (0u64, 0u64);
    for p in gen {
        w.write(day_ns + p.ts_ns, SRC, dst_a, &p.payload)?;
        packets += 1;
        bytes += p.payload.len() as u64;
        if let Ok(pk) = fairfeed_wire::moldudp64::Packet::new_checked(&p.payload[..]) {
            pb.inc(u64::from(pk.message_count()));
        }
        if keep {
            clean.push(p);
        }
    }
    w.finish()?;
    pb.finish_and_clear();
    let mut lines = serde_json::Map::new();
    for (path, imp, seed_salt, group) in [(&a.a_out, imp_a, 0xA, GROUP_A), (&a.b_out, imp_b, 0xB, GROUP_B)] {
        if let Some(path) = path {
            let report =
                write_line(&clean, &imp, a.seed ^ (seed_salt << 56), path, day_ns, SocketAddrV4::new(group, a.port))?;
            lines.insert(path.display().to_string(), serde_json::to_value(report)?);
        }
    }
    let summary = serde_json::json!({
        "out": a.out.display().to_string(), "messages": a.messages, "packets": packets, "bytes": bytes,
        "seed": a.seed, "symbols": a.symbols, "port": a.port, "lines": lines,
    });
    if a.json {
        println!("{summary}");
    } else {
        eprintln!("wrote {} ({} messages in {} packets, {} bytes)", a.out.display(), a.messages, packets, bytes);
        for (k, v) in &lines {
            eprintln!("wrote {k}: {v}");
        }
    }
    Ok(())
}

fn line(loss: f64, dup: f64, reorder: f64, delay_us: f64, jitter_us: f64) -> anyhow::Result<Impairment> {
    anyhow::ensure!(delay_us >= 0.0 && jitter_us >= 0.0, "delays must not be negative");
    let imp = Impairment { loss, dup, reorder, delay_ns: (delay_us * 1e3) as u64, jitter_ns: (jitter_us * 1e3) as u64 };
    imp.validate().map_err(anyhow::Error::msg)?;
    Ok(imp)
}

fn write_line(
    clean: &[GenPacket],
    imp: &Impairment,
    seed: u64,
    path: &std::path::Path,
    day_ns: u64,
    dst: SocketAddrV4,
) -> anyhow::Result<LineReport> {
    let (packets, report) = impair(clean, imp, seed);
    let mut w = CaptureWriter::create(path)?;
    for p in &packets {
        w.write(day_ns + p.ts_ns, SRC, dst, &p.payload)?;
    }
    w.finish()?;
    Ok(report)
}
