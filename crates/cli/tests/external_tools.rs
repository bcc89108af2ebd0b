//! Goal: tools nobody here wrote agree with our wire formats.
//! - Debian's tshark dissects a 1,000,000-message generated feed as MoldUDP64
//!   with zero malformed packets and no expert warnings or errors, and its
//!   packet, message and per-message sequence numbers equal `fairfeed decode`'s.
//! - PyPI's itchfeed decodes every ITCH message — all 23 types from the
//!   generator and every genuine NASDAQ capture — to the same field values as
//!   ours (tests/py/itch_compare.py does the field-by-field comparison).
//!
//! Missing tools fail the test when FAIRFEED_REQUIRE_TOOLS=1 (scripts/test.sh
//! installs them and sets it) and are reported as skipped otherwise.

mod common;
use common::*;
use std::process::Command;

/// Expert-info severities Wireshark encodes (PI_WARN and above fail the test).
const PI_WARN: u64 = 0x0060_0000;

#[test]
fn tshark_agrees_on_a_million_message_feed() {
    if !have_tool("tshark", &["--version"]) {
        return;
    }
    let dir = tmp();
    let feed = dir.path().join("feed.pcap");
    let port = "26477";
    fairfeed(&[
        "gen",
        "--seed",
        "42",
        "--messages",
        "1000000",
        "--symbols",
        "500",
        "--port",
        port,
        "--out",
        feed.to_str().unwrap(),
    ]);
    let ours = json(&fairfeed(&["decode", feed.to_str().unwrap(), "--summary-json"]));
    assert_eq!(ours["messages"], 1_000_000);
    assert_eq!(ours["errors"], 0);

    let out = Command::new("tshark")
        .args(["-r", feed.to_str().unwrap(), "-d", &format!("udp.port=={port},moldudp64"), "-T", "fields"])
        .args(["-e", "moldudp64.sequence", "-e", "moldudp64.count", "-e", "moldudp64.msgseq"])
        .args(["-e", "_ws.malformed", "-e", "_ws.expert.severity", "-E", "occurrence=a", "-E", "aggregator=,"])
        .output()
        .expect("run tshark");
    assert!(out.status.success(), "tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    let t = TsharkCounts::parse(&String::from_utf8(out.stdout).unwrap());
    let TsharkCounts { packets, messages, malformed, warnings, first_seq, next_seq: expect_seq } = t;
    assert_eq!(malformed, 0, "tshark found malformed packets");
    assert_eq!(warnings, 0, "tshark raised expert warnings or errors");
    assert_eq!(packets, ours["packets"].as_u64().unwrap());
    assert_eq!(messages, ours["messages"].as_u64().unwrap());
    assert_eq!(first_seq, ours["first_seq"].as_u64());
    assert_eq!(expect_seq, ours["next_seq"].as_u64().unwrap());
    eprintln!("tshark agrees: {packets} packets, {messages} messages, sequence {:?}..{expect_seq}", first_seq);
}

/// What tshark's field output says about a MoldUDP64 capture.
struct TsharkCounts {
    packets: u64,
    messages: u64,
    malformed: u64,
    warnings: u64,
    first_seq: Option<u64>,
    next_seq: u64,
}

impl TsharkCounts {
    /// Parses `sequence, count, msgseq list, malformed, severities` lines,
    /// checking that per-message sequence numbers run without a break.
    fn parse(text: &str) -> Self {
        let mut t = TsharkCounts { packets: 0, messages: 0, malformed: 0, warnings: 0, first_seq: None, next_seq: 1 };
        for line in text.lines() {
            let cols: Vec<&str> = line.split('\t').collect();
            assert_eq!(cols.len(), 5, "unexpected tshark line: {line}");
            t.packets += 1;
            let seq: u64 = cols[0].parse().expect("sequence");
            t.first_seq.get_or_insert(seq);
            let count: u64 = cols[1].parse().expect("count");
            t.malformed += u64::from(!cols[3].is_empty());
            t.warnings +=
                cols[4].split(',').filter(|s| !s.is_empty() && s.parse::<u64>().unwrap() >= PI_WARN).count() as u64;
            assert_eq!(seq, t.next_seq, "packet sequence");
            if count == 0 || count == 0xFFFF {
                continue; // heartbeat or end of session: no blocks
            }
            let per_msg: Vec<u64> = cols[2].split(',').map(|s| s.parse().expect("msgseq")).collect();
            assert_eq!(per_msg.len() as u64, count, "tshark's message blocks vs count at seq {seq}");
            assert!(per_msg.iter().enumerate().all(|(i, s)| *s == seq + i as u64), "message sequence at {seq}");
            t.messages += count;
            t.next_seq = seq + count;
        }
        t
    }
}

fn itchfeed_compare(capture: &std::path::Path) -> String {
    let ndjson = capture.with_extension("ndjson");
    let ours = fairfeed(&["decode", capture.to_str().unwrap(), "--json"]);
    std::fs::write(&ndjson, &ours.stdout).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/itch_compare.py");
    let out =
        Command::new("python3").args([script, capture.to_str().unwrap(), ndjson.to_str().unwrap()]).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "itchfeed disagrees on {}:\n{report}{}",
        capture.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

#[test]
fn itchfeed_agrees_on_every_message_type() {
    if !have_tool("python3", &["-c", "import itch.messages"]) {
        return;
    }
    let dir = tmp();
    let feed = dir.path().join("all.pcap");
    fairfeed(&[
        "gen",
        "--seed",
        "5",
        "--messages",
        "30000",
        "--symbols",
        "50",
        "--all-types",
        "--out",
        feed.to_str().unwrap(),
    ]);
    let report = itchfeed_compare(&feed);
    assert!(report.contains("23 types"), "{report}");
    assert!(report.contains(", 0 mismatches"), "{report}");
}

#[test]
fn itchfeed_agrees_on_real_captures() {
    if !have_tool("python3", &["-c", "import itch.messages"]) {
        return;
    }
    let dir = tmp();
    let mut compared = 0;
    for (i, path) in real_captures().into_iter().enumerate() {
        // Copy to a temp dir: the comparison writes a sidecar file next to the capture.
        let local = dir.path().join(format!("real{i}.pcap"));
        std::fs::copy(&path, &local).unwrap();
        let report = itchfeed_compare(&local);
        assert!(report.contains(", 0 mismatches"), "{}: {report}", path.display());
        compared += 1;
    }
    assert!(compared >= 40);
}
