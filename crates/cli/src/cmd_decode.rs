//! `fairfeed decode`: readable or JSON dumps of a capture, and its summary.

use std::io::Write;
use std::path::PathBuf;

use fairfeed_feed::capture::{udp_of, CaptureReader, SkipCounts};
use fairfeed_feed::decode::{FeedDecoder, PacketEvent};
use fairfeed_wire::itch::Message;

use crate::fmt::{field_json, print_json_line, time_of_day};

#[derive(clap::Args)]
pub struct Args {
    /// A pcap or pcapng capture of a MoldUDP64 feed.
    file: PathBuf,
    /// Only UDP datagrams to this destination port.
    #[arg(long)]
    port: Option<u16>,
    /// One JSON object per message (NDJSON) instead of text.
    #[arg(long, conflicts_with = "summary_json")]
    json: bool,
    /// Print only the summary, as one JSON object.
    #[arg(long)]
    summary_json: bool,
    /// Print only the summary, as text.
    #[arg(long, short, conflicts_with_all = ["json", "summary_json"])]
    quiet: bool,
    /// Stop printing packets after this many (the summary still covers the whole file).
    #[arg(long)]
    limit: Option<u64>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut dec = FeedDecoder::new();
    let mut skipped = SkipCounts::default();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let print = !(a.summary_json || a.quiet);
    let mut printing = print;
    let mut n = 0u64;
    let mut capture_error = None;
    for frame in CaptureReader::open(&a.file)? {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                // A torn capture: report what came before it, then the error.
                capture_error = Some(e);
                break;
            }
        };
        let Some(d) = udp_of(&frame, a.port, &mut skipped) else {
            continue;
        };
        n += 1;
        let ev = dec.handle(&d.payload);
        if printing && a.limit.is_some_and(|l| n > l) {
            printing = false;
        }
        if !printing {
            continue;
        }
        let ok = if a.json { json_packet(&mut out, n, d.ts_ns, &ev)? } else { text_packet(&mut out, n, &d, &ev)? };
        if !ok {
            printing = false; // reader went away; keep counting for the exit status
        }
    }
    let mut summary = serde_json::to_value(dec.summary())?;
    summary["skipped_frames"] = serde_json::to_value(&skipped)?;
    if let Some(e) = &capture_error {
        summary["capture_error"] = e.to_string().into();
    }
    if a.summary_json {
        writeln!(out, "{summary}")?;
    } else if !a.json {
        text_summary(&mut out, &dec);
    }
    let _ = out.flush();
    if let Some(e) = capture_error {
        return Err(anyhow::Error::new(e)
            .context("capture ends in a damaged record; the output above covers what came before it"));
    }
    if n == 0 {
        // A capture with nothing to decode is not a feed with zero packets.
        let skip = &skipped;
        let frames = skip.not_udp + skip.other_port + skip.bad_frame + skip.unknown_link;
        let ports = a.port.map_or_else(|| "any port".to_string(), |p| format!("port {p}"));
        anyhow::bail!(
            "{}: no UDP datagrams on {ports} to decode ({frames} frames: {} not UDP, {} to other ports, {} malformed, {} of an unknown link type)",
            a.file.display(),
            skip.not_udp,
            skip.other_port,
            skip.bad_frame,
            skip.unknown_link
        );
    }
    Ok(())
}

/// The summary in words (a reader gone away is not an error here).
fn text_summary(out: &mut impl Write, dec: &FeedDecoder) {
    let s = dec.summary();
    let _ = writeln!(
        out,
        "\n{} packets ({} data, {} heartbeats, {} end-of-session), {} messages, {} bytes\n\
         sequence {}..{}  gaps {} ({} messages still missing)  reordered packets {}  duplicate packets {}  errors {}",
        s.packets,
        s.data_packets,
        s.heartbeats,
        s.end_of_session,
        s.messages,
        s.bytes,
        s.first_seq,
        s.next_seq,
        s.gaps,
        s.missing_messages,
        s.reordered_packets,
        s.duplicate_packets,
        s.errors
    );
    let types: Vec<String> = s.types.iter().map(|(t, c)| format!("{t}:{c}")).collect();
    let _ = writeln!(out, "types {}", types.join(" "));
    if s.errors > 0 {
        let _ = writeln!(out, "error kinds {:?}", s.error_kinds);
    }
}

fn text_packet(
    out: &mut impl Write,
    n: u64,
    d: &fairfeed_feed::capture::Datagram,
    ev: &PacketEvent<'_>,
) -> anyhow::Result<bool> {
    let head = format!("#{n} {}.{:09} {} -> {}", d.ts_ns / 1_000_000_000, d.ts_ns % 1_000_000_000, d.src, d.dst);
    let r = match ev {
        PacketEvent::Bad(e) => writeln!(out, "{head} not MoldUDP64: {e}"),
        PacketEvent::Heartbeat { session, next_sequence } => {
            writeln!(out, "{head} session {session} heartbeat next {next_sequence}")
        }
        PacketEvent::EndOfSession { session, next_sequence } => {
            writeln!(out, "{head} session {session} END OF SESSION next {next_sequence}")
        }
        PacketEvent::Data { session, sequence, messages } => {
            let mut r = writeln!(out, "{head} session {session} seq {sequence} count {}", messages.len());
            for (i, m) in messages.iter().enumerate() {
                if r.is_err() {
                    break;
                }
                r = match m {
                    Ok(m) => writeln!(out, "  {} {}", sequence + i as u64, message_text(m)),
                    Err(e) => writeln!(out, "  {} ERROR {e}", sequence + i as u64),
                };
            }
            r
        }
    };
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `A AddOrder 09:30:00.000001234 locate=7 order_ref=... price=12.3400`
pub fn message_text(m: &Message<'_>) -> String {
    let mut s = format!("{} {} {}", m.msg_type() as char, m.name(), time_of_day(m.timestamp()));
    m.visit(&mut |name, v| {
        if name != "timestamp" {
            s.push_str(&format!(" {name}={v}"));
        }
    });
    s
}

fn json_packet(out: &mut impl Write, n: u64, ts_ns: u64, ev: &PacketEvent<'_>) -> anyhow::Result<bool> {
    let PacketEvent::Data { session, sequence, messages } = ev else {
        return Ok(true);
    };
    for (i, m) in messages.iter().enumerate() {
        let mut o = serde_json::Map::new();
        o.insert("packet".into(), n.into());
        o.insert("capture_ns".into(), ts_ns.into());
        o.insert("session".into(), session.clone().into());
        o.insert("seq".into(), (sequence + i as u64).into());
        match m {
            Ok(m) => {
                o.insert("type".into(), (m.msg_type() as char).to_string().into());
                o.insert("name".into(), m.name().into());
                m.visit(&mut |name, v| {
                    o.insert(name.into(), field_json(v));
                });
            }
            Err(e) => {
                o.insert("error".into(), e.to_string().into());
                o.insert("error_kind".into(), e.kind().into());
            }
        }
        if !print_json_line(out, &serde_json::Value::Object(o))? {
            return Ok(false);
        }
    }
    Ok(true)
}
