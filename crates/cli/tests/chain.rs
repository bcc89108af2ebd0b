//! Goal (issue 39): the whole chain as a user runs it — the exchange's ITCH
//! on A/B lines, the arbitrator merging them, the fair tree taking the
//! arbitrated line live (`fairfeed sender --listen`), receivers delivering to
//! applications — hands every application the exchange's own ITCH output,
//! message for message and in order.
//!
//! Method: every piece a `fairfeed` process on loopback: `exchange` (its ITCH
//! lines to the arbitrator), `arb` (`--out-hr` into the sender), a planned
//! tree of 4 receivers with hedging on emulated cloud links, each receiver
//! `--deliver`ing to a socket this test reads as an unmodified application
//! would; `order flow` sends seeded orders. The reference is the exchange's
//! journal, read back through its MoldUDP64 retransmission server (the
//! exchange's output by definition, by a path that bypasses the chain).

#![allow(clippy::too_many_lines)] // scenario tests: one story, read top to bottom
mod common;
use common::cluster::Cluster;

use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairfeed_wire::moldudp64::{Packet, RequestRepr, Session, COUNT_END_OF_SESSION};

const HOST: &str = "127.0.7.1";
const SESSION: &str = "FFCHAIN001";

fn spawn(args: &[&str], err: std::path::PathBuf) -> Child {
    Command::new(common::bin())
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(err).unwrap())
        .spawn()
        .expect("spawn fairfeed")
}

fn term(mut c: Child) {
    let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
    let t = Instant::now();
    while c.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(10), "a process did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every message of the session from the exchange's journal, through its retransmission server.
fn journal(server: SocketAddr, upto: u64) -> Vec<Vec<u8>> {
    let s = UdpSocket::bind(format!("{HOST}:0")).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut buf = [0u8; 2048];
    let mut tries = 0;
    while (out.len() as u64) < upto {
        let seq = out.len() as u64 + 1;
        // Padded as a client without the cookie exchange must: the server
        // answers an unverified source with no more bytes than it sent.
        let mut req = [0u8; 1400];
        let r = RequestRepr { session: Session::from_str_padded(SESSION), sequence: seq, count: 100 };
        r.emit(&mut req[..20]).unwrap();
        s.send_to(&req, server).unwrap();
        let Ok(n) = s.recv(&mut buf) else {
            tries += 1;
            assert!(tries < 20, "the exchange's retransmission server stopped answering at {seq}");
            continue;
        };
        let p = Packet::new_checked(&buf[..n]).unwrap();
        assert_eq!(p.sequence(), seq, "answers come in order");
        assert!(p.message_count() > 0, "the journal holds message {seq}");
        out.extend(p.messages().map(|m| m.unwrap().to_vec()));
    }
    out.truncate(upto as usize);
    out
}

fn wait_tcp(addr: &str) {
    let t = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "the exchange did not listen at {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_exchange_reaches_every_application_through_arbitrator_and_tree_message_for_message() {
    let mut c = Cluster::plan(4, 2, 1, &["--loopback-port".into(), "9610".into()]);
    let (line_a, line_b, retrans, ouch, hr) = (
        format!("{HOST}:26500"),
        format!("{HOST}:26501"),
        format!("{HOST}:26502"),
        format!("{HOST}:15100"),
        format!("{HOST}:27110"),
    );
    // The tree first (applications, receivers, proxies, the sender listening), then the arbitrator, then the exchange.
    let stop = Arc::new(AtomicBool::new(false));
    let mut apps = Vec::new();
    for id in c.ids("receiver") {
        let sock = fairfeed_io::socket::bind_udp("127.0.7.2:0".parse().unwrap(), 8 << 20).unwrap();
        sock.set_nonblocking(false).unwrap();
        let deliver = sock.local_addr().unwrap().to_string();
        apps.push((id, common::collect_datagrams(sock, stop.clone())));
        let control = format!("127.0.7.3:{}", 9620 + id);
        let a: Vec<String> =
            ["--link", "cloud", "--deliver", &deliver, "--control", &control].iter().map(|s| s.to_string()).collect();
        c.start(id, &a);
    }
    for id in c.ids("proxy") {
        let control = format!("127.0.7.3:{}", 9620 + id);
        c.start(id, &["--link".into(), "cloud".into(), "--control".into(), control]);
    }
    let sender = c.ids("sender")[0];
    let sender_control = format!("127.0.7.3:{}", 9620 + sender);
    let a: Vec<String> = ["--link", "cloud", "--listen", &hr, "--control", &sender_control, "--target-pf", "0.99"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    c.start(sender, &a);
    for id in c.ids("receiver").into_iter().chain(c.ids("proxy")).chain([sender]) {
        common::fairfeed(&["stat", &format!("127.0.7.3:{}", 9620 + id), "--timeout-ms", "20000"]);
    }
    let arb = spawn(
        &["arb", "--a", &line_a, "--b", &line_b, "--out-hr", &hr, "--retransmit", &retrans, "--idle", "park"],
        c.path("arb.err"),
    );
    let cfg = c.path("exchange.toml");
    let example = String::from_utf8(common::fairfeed(&["exchange", "--example-config"]).stdout).unwrap();
    let cfg_text = example
        .replace("127.0.0.1:15000", &ouch)
        .replace("127.0.0.1:26400", &line_a)
        .replace("127.0.0.1:26401", &line_b)
        .replace("127.0.0.1:26402", &retrans)
        .replace("FFEXCH0001", SESSION);
    std::fs::write(&cfg, cfg_text).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let exchange = spawn(&["exchange", "--config", cfg.to_str().unwrap()], c.path("exchange.err"));
    wait_tcp(&ouch);
    let flow = common::json(&common::fairfeed(&[
        "order", "flow", "--server", &ouch, "--orders", "1500", "--rate", "1000", "--seed", "11", "--json",
    ]));
    assert_eq!(flow["accepted"], 1500, "{flow}");
    assert!(flow["executions"].as_u64().unwrap() > 100, "the flow trades: {flow}");
    // Let the last packets cross the tree (deadlines of a few ms, the gap wait).
    std::thread::sleep(Duration::from_millis(1_500));
    let live = common::json(&common::fairfeed(&["stat", &sender_control]));
    let next = live["counters"]["live"]["position"]["next_sequence"].as_u64().expect("the sender saw the session");
    let reference = journal(retrans.parse().unwrap(), next - 1);
    term(exchange);
    term(arb);
    std::thread::sleep(Duration::from_millis(500));
    c.stop_all();
    stop.store(true, Ordering::Relaxed);
    assert!(reference.len() > 1_500, "the exchange published adds and executions: {}", reference.len());
    let s = c.stats(sender);
    let ingress = &s["counters"]["live"]["ingress"];
    assert_eq!(ingress["malformed"], 0, "{ingress}");
    assert_eq!(ingress["upstream_gaps"], 0, "the arbitrator's line had no holes: {ingress}");
    for (id, h) in apps {
        let got = h.join().unwrap();
        let mut messages: Vec<Vec<u8>> = Vec::new();
        let mut next_seq = 1;
        for b in &got {
            let p = Packet::new_checked(&b[..]).expect("the application reads MoldUDP64");
            assert_eq!(p.session(), Session::from_str_padded(SESSION), "the exchange's session, carried through");
            if p.message_count() == 0 || p.count() == COUNT_END_OF_SESSION {
                continue;
            }
            assert_eq!(p.sequence(), next_seq, "receiver {id}: in order, no gap, no duplicate");
            next_seq = p.next_sequence();
            messages.extend(p.messages().map(|m| m.unwrap().to_vec()));
        }
        // Everything the exchange published while it ran, and what it said as it stopped (system events).
        assert_eq!(messages.len() as u64, ingress["messages"].as_u64().unwrap(), "receiver {id}: every message");
        assert!(messages[..reference.len()] == reference[..], "receiver {id}: the exchange's messages, byte for byte");
        let closing = &messages[reference.len()..];
        assert!(closing.iter().all(|m| m[0] == b'S'), "receiver {id}: after the journal read, system events only");
        eprintln!("receiver {id}: {} packets, {} messages equal to the exchange's journal", got.len(), messages.len());
    }
}

/// Goal: a live sender's input is a listening socket anyone can reach; what
/// is not MoldUDP64, and packets it already sent (the other line of an A/B
/// pair aimed at the same port), never go down the tree — each is counted —
/// and good packets around them still do.
#[test]
fn a_live_sender_drops_and_counts_what_would_break_the_line() {
    let mut c = Cluster::plan(2, 2, 0, &["--loopback-port".into(), "9640".into()]);
    let sender = c.ids("sender")[0];
    let (listen, control) = (format!("{HOST}:27140"), format!("127.0.7.3:{}", 9650));
    c.start(sender, &["--listen".into(), listen.clone(), "--control".into(), control.clone()]);
    common::fairfeed(&["stat", &control, "--timeout-ms", "20000"]);
    let s = UdpSocket::bind(format!("{HOST}:0")).unwrap();
    let packet = |seq: u64, count: u16| {
        let mut b = vec![0u8; 1_500];
        let mut p =
            fairfeed_wire::moldudp64::PacketBuilder::new(&mut b, Session::from_str_padded(SESSION), seq).unwrap();
        for _ in 0..count {
            p.push(b"S\0\0\0\0\0\0\0\0\0\0O").unwrap();
        }
        let n = p.finish();
        b.truncate(n);
        b
    };
    for d in [packet(1, 2), packet(1, 2), vec![0xff; 7], vec![0u8; 3_000], packet(3, 1), packet(10, 1), packet(11, 0)] {
        s.send_to(&d, &listen).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let st = common::json(&common::fairfeed(&["stat", &control]));
    let i = &st["counters"]["live"]["ingress"];
    assert_eq!((i["datagrams"].as_u64(), i["forwarded"].as_u64()), (Some(7), Some(4)), "{i}");
    assert_eq!((i["duplicates"].as_u64(), i["malformed"].as_u64()), (Some(1), Some(2)), "{i}");
    assert_eq!((i["upstream_gaps"].as_u64(), i["upstream_gap_messages"].as_u64()), (Some(1), Some(6)), "{i}");
    assert_eq!(st["node"]["packets"], 4, "four packets went down the tree: {}", st["node"]);
    c.stop_all();
}
