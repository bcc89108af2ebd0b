//! Goal: `fairfeed arb` merges impaired A/B lines back into the original feed,
//! on captures and on live UDP, with the retransmission server filling what
//! both lines lost. Method: `fairfeed gen` A/B lines with 1% independent loss
//! each plus reordering and duplication; arbitrate; compare the
//! high-reliability output's payloads with the clean feed's, packet by packet.

#![allow(clippy::too_many_lines)] // scenario tests: one story, read top to bottom
mod common;
use common::*;
use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn payloads(p: &std::path::Path) -> Vec<Vec<u8>> {
    fairfeed_feed::capture::read_datagrams(p, None).unwrap().0.into_iter().map(|d| d.payload).collect()
}

fn lines(dir: &std::path::Path, messages: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let (c, a, b) = (dir.join("clean.pcap"), dir.join("a.pcap"), dir.join("b.pcap"));
    fairfeed(&[
        "gen",
        "--seed",
        "11",
        "--messages",
        messages,
        "--symbols",
        "100",
        "--out",
        c.to_str().unwrap(),
        "--a-out",
        a.to_str().unwrap(),
        "--b-out",
        b.to_str().unwrap(),
        "--loss-a",
        "0.01",
        "--loss-b",
        "0.01",
        "--reorder-a",
        "0.005",
        "--reorder-b",
        "0.005",
        "--dup-b",
        "0.01",
        "--delay-b-us",
        "300",
    ]);
    (c, a, b)
}

#[test]
fn offline_with_journal_recovers_the_original_feed() {
    let d = tmp();
    let (clean, a, b) = lines(d.path(), "300000");
    let (merged, stats) = (d.path().join("m.pcap"), d.path().join("s.json"));
    for mode in ["time", "count", "time-count"] {
        fairfeed(&[
            "arb",
            "--a-pcap",
            a.to_str().unwrap(),
            "--b-pcap",
            b.to_str().unwrap(),
            "--out",
            merged.to_str().unwrap(),
            "--stats-json",
            stats.to_str().unwrap(),
            "--mode",
            mode,
            "--retransmit-journal",
            clean.to_str().unwrap(),
        ]);
        assert!(payloads(&merged) == payloads(&clean), "mode {mode}: merged feed differs from the original");
        let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        for k in ["lost_messages", "duplicates", "gaps_opened", "gaps_filled_by_line", "gaps_filled_by_retransmit"] {
            assert!(s.get(k).is_some(), "stats lack {k}");
        }
        assert_eq!(s["lost_messages"], 0, "mode {mode}");
        assert!(
            s["gaps_filled_by_retransmit"].as_u64().unwrap() > 0,
            "mode {mode}: B lags 300 µs, so A's losses are gaps"
        );
        assert!(s["duplicates"].as_u64().unwrap() > 50_000);
    }
}

#[test]
fn offline_without_journal_loses_exactly_what_both_lines_lost() {
    let d = tmp();
    let (clean, a, b) = lines(d.path(), "300000");
    let (merged, stats) = (d.path().join("m.pcap"), d.path().join("s.json"));
    fairfeed(&[
        "arb",
        "--a-pcap",
        a.to_str().unwrap(),
        "--b-pcap",
        b.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
        "--stats-json",
        stats.to_str().unwrap(),
        "--max-hold-us",
        "100000",
        "--max-count",
        "100000",
    ]);
    let (pa, pb, pc) = (payloads(&a), payloads(&b), payloads(&clean));
    let both_lost: Vec<&Vec<u8>> = pc.iter().filter(|p| !pa.contains(p) && !pb.contains(p)).collect();
    let want: Vec<Vec<u8>> = pc.iter().filter(|p| !both_lost.contains(p)).cloned().collect();
    assert_eq!(payloads(&merged), want);
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let lost: u64 = both_lost
        .iter()
        .map(|p| u64::from(fairfeed_wire::moldudp64::Packet::new_checked(&p[..]).unwrap().message_count()))
        .sum();
    assert_eq!(s["lost_messages"].as_u64().unwrap(), lost);
}

#[test]
fn live_udp_with_retransmission_server_loses_nothing() {
    let d = tmp();
    let (clean, a, b) = lines(d.path(), "60000");
    let (pa, pb, pr, pc) = (free_port(false), free_port(false), free_port(false), free_port(false));
    let hr = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket2::SockRef::from(&hr).set_recv_buffer_size(16 << 20).unwrap();
    hr.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let hr_addr = hr.local_addr().unwrap().to_string();
    let mut server = Command::new(bin())
        .args(["retransmit-server", "--journal", clean.to_str().unwrap(), "--listen", &format!("127.0.0.1:{pr}")])
        .args(["--max-seconds", "60"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stats = d.path().join("live.json");
    let key = d.path().join("operator.key");
    std::fs::write(&key, "5a".repeat(32)).unwrap();
    let key = key.to_str().unwrap();
    let mut arb = Command::new(bin())
        .args(["arb", "--a", &format!("127.0.0.1:{pa}"), "--b", &format!("127.0.0.1:{pb}"), "--out-hr", &hr_addr])
        .args(["--retransmit", &format!("127.0.0.1:{pr}"), "--control", &format!("127.0.0.1:{pc}")])
        .args(["--operator-key-file", key])
        .args(["--exit-on-end", "--max-seconds", "60", "--start-seq", "1", "--stats-json", stats.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The control socket takes a new window while the feed flows — sealed
    // under the operator key only; unsealed, or under another key, it is refused.
    let ctl = format!("127.0.0.1:{pc}");
    let unsealed = Command::new(bin()).args(["control", &ctl, "max-hold-us", "0"]).output().unwrap();
    assert!(!unsealed.status.success());
    assert!(String::from_utf8_lossy(&unsealed.stdout).contains("not authenticated"), "{unsealed:?}");
    let other = d.path().join("other.key");
    std::fs::write(&other, "a5".repeat(32)).unwrap();
    let forged =
        Command::new(bin()).args(["control", &ctl, "--key-file", other.to_str().unwrap(), "mode", "count"]).output();
    assert!(String::from_utf8_lossy(&forged.unwrap().stdout).contains("wrong MAC"));
    let reply = fairfeed(&["control", &ctl, "--key-file", key, "max-hold-us", "2000"]);
    assert!(reply.stdout.starts_with(b"ok"), "{}", String::from_utf8_lossy(&reply.stdout));
    let bad = Command::new(bin()).args(["control", &ctl, "frobnicate"]).output().unwrap();
    assert!(!bad.status.success());
    let s: serde_json::Value = serde_json::from_slice(&fairfeed(&["control", &ctl, "stats"]).stdout).unwrap();
    assert_eq!(s["control_auth"]["sealed"], 1, "{s}");
    assert_eq!(
        (s["control_auth"]["unauthenticated"].as_u64(), s["control_auth"]["bad_mac"].as_u64()),
        (Some(1), Some(1))
    );
    let mut buf = vec![0u8; 65536];
    let replay = |file: &std::path::Path, port: u16| {
        Command::new(bin())
            .args(["replay", file.to_str().unwrap(), "--to", &format!("127.0.0.1:{port}"), "--rate", "8000"])
            // The arbiter exits at the end of the session; the other line's tail is then refused.
            .arg("--keep-going")
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut ra, mut rb) = (replay(&a, pa), replay(&b, pb));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    let want = payloads(&clean);
    while got.len() < want.len() && Instant::now() < deadline {
        if let Ok(n) = hr.recv(&mut buf) {
            got.push(buf[..n].to_vec());
        } else if arb.try_wait().unwrap().is_some() {
            break;
        }
    }
    assert!(ra.wait().unwrap().success() && rb.wait().unwrap().success());
    let status = arb.wait().unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(status.success(), "arb exited with {status}");
    assert_eq!(got.len(), want.len(), "high-reliability packets received");
    assert!(got == want, "live merged feed differs from the original");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(s["lost_messages"], 0);
    assert_eq!(s["window"]["max_hold_ns"], 2_000_000, "the control command took effect");
}
