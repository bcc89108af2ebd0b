//! Goal: the fair multicast tree as one process per node — what a deployment
//! runs — delivers every message once at every receiver, and survives a proxy
//! crash: with sibling hedging (H = 1) nothing is lost; without it (H = 0) the
//! loss is detected (the parent sees the child go silent, the receivers see
//! the overlay gap) and filled from the sender's retransmission server.
//! Method: `fairfeed plan --loopback-port`, then `fairfeed sender|proxy|receiver`
//! processes on 127.1.x.y with authenticated packets and emulated cloud links;
//! a proxy is SIGKILLed mid-stream; counters come from each node's JSON at exit.

#![allow(clippy::too_many_lines)] // scenario tests: one story, read top to bottom
mod common;
use common::cluster::Cluster;
use std::collections::BTreeSet;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const RATE: u64 = 1_000;
const FEED_S: u64 = 3;

fn sender_args(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "--rate",
        &RATE.to_string(),
        "--feed-seconds",
        &FEED_S.to_string(),
        "--start-delay-ms",
        "700",
        "--linger-ms",
        "1000",
        "--link",
        "cloud",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn common_args() -> Vec<String> {
    ["--link", "cloud", "--seconds", "30"].iter().map(|s| s.to_string()).collect()
}

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn hedged_tree_loses_nothing_when_a_proxy_crashes() {
    let mut c = Cluster::plan(6, 2, 1, &["--loopback-port".into(), "9310".into()]);
    let victim = c.nodes.iter().find(|n| n.role == "proxy" && n.layer == 0).unwrap().id;
    for id in c.ids("receiver") {
        let mut a = common_args();
        a.extend(["--control".into(), ready_addr(id, 9317)]);
        c.start(id, &a);
    }
    // The proxies that survive send on a second thread (the split threading mode).
    for id in c.ids("proxy") {
        let mut a = common_args();
        a.extend(["--threads".into(), "split".into(), "--control".into(), ready_addr(id, 9317)]);
        c.start(id, &a);
    }
    wait_up(c.ids("receiver").into_iter().chain(c.ids("proxy")), 9317);
    let sender = c.ids("sender")[0];
    c.start(sender, &sender_args(&[]));
    std::thread::sleep(Duration::from_millis(700 + 1_200));
    c.crash(victim);
    c.wait(sender, Duration::from_secs(20));
    c.stop_all();
    let total = RATE * FEED_S;
    for id in c.ids("receiver") {
        let s = c.stats(id);
        assert_eq!(n(&s["node"]["released"]), total, "receiver {id} released {}: {}", s["node"]["released"], s["node"]);
        assert_eq!(n(&s["counters"]["overlay_missing"]), 0, "receiver {id}");
        assert_eq!(n(&s["node"]["auth"]["bad_tag"]), 0);
        let seqs: BTreeSet<u64> = c.releases(id).iter().map(|r| r.0).collect();
        assert_eq!(seqs.len() as u64, total, "each message once at receiver {id}");
        assert_eq!(c.early_releases(id), 0, "receiver {id} released before a deadline");
    }
    let s = c.stats(sender);
    assert_eq!(n(&s["counters"]["feed_sent"]), total);
    let w = c.windows();
    assert_eq!(w.len() as u64, total, "every message released by every receiver");
    eprintln!("delivery window p50 {} ns, p99 {} ns", w[w.len() / 2], w[w.len() * 99 / 100]);
}

/// MoldUDP64 sequence numbers a delivery socket received, until `stop`.
fn collect(sock: UdpSocket, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(Vec<u64>, u64)> {
    std::thread::spawn(move || {
        sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut buf = [0u8; 2048];
        let (mut seqs, mut packets) = (Vec::new(), 0u64);
        while !stop.load(Ordering::Relaxed) {
            let Ok(len) = sock.recv(&mut buf) else { continue };
            let p = fairfeed_wire::moldudp64::Packet::new_checked(&buf[..len]).expect("a MoldUDP64 packet");
            packets += 1;
            let count = p.message_count();
            if count != 0 && count != fairfeed_wire::moldudp64::COUNT_END_OF_SESSION {
                seqs.extend(p.sequence()..p.sequence() + u64::from(count));
            }
        }
        (seqs, packets)
    })
}

/// Starts every receiver delivering to a socket of its own (what each
/// received collected until `stop`) with `extra(id)` flags, and every proxy,
/// each with a control address on `port`; returns when all answer `stat`.
fn start_delivering(
    c: &mut Cluster,
    port: u16,
    stop: &Arc<AtomicBool>,
    extra: impl Fn(u32) -> Vec<String>,
) -> Vec<(u32, std::thread::JoinHandle<Vec<Vec<u8>>>)> {
    let mut collectors = Vec::new();
    for id in c.ids("receiver") {
        let sock = fairfeed_io::socket::bind_udp("127.0.0.1:0".parse().unwrap(), 8 << 20).unwrap();
        sock.set_nonblocking(false).unwrap();
        let deliver = sock.local_addr().unwrap().to_string();
        collectors.push((id, common::collect_datagrams(sock, stop.clone())));
        let mut a = common_args();
        a.extend(["--deliver".into(), deliver, "--control".into(), ready_addr(id, port)]);
        a.extend(extra(id));
        c.start(id, &a);
    }
    for id in c.ids("proxy") {
        let mut a = common_args();
        a.extend(["--control".into(), ready_addr(id, port)]);
        c.start(id, &a);
    }
    wait_up(c.ids("receiver").into_iter().chain(c.ids("proxy")), port);
    collectors
}

/// Goal (issue 39): what a receiver hands an unmodified ITCH application is
/// what a MoldUDP64 line would hand it — strictly increasing sequence
/// numbers, no gap, no duplicate — and the same bytes at every receiver,
/// over 10 s at 2,000 packets/s through a hedged tree on emulated cloud
/// links (whose delay spread reorders copies, and whose controller moves
/// deadlines both ways). Before receivers released in sequence order, each
/// stream had 45–65 inversions in 20,000 packets and the four streams differed.
#[test]
fn receivers_deliver_one_in_order_moldudp64_line_identical_everywhere() {
    let mut c = Cluster::plan(4, 2, 1, &["--loopback-port".into(), "9360".into()]);
    let stop = Arc::new(AtomicBool::new(false));
    // As the README's tree runs: the receivers' own order, no filling arbitrator behind them.
    let collectors = start_delivering(&mut c, 9367, &stop, |_| Vec::new());
    let sender = c.ids("sender")[0];
    let (rate, seconds) = (2_000u64, 10u64);
    let args: Vec<String> = [
        "--rate",
        "2000",
        "--feed-seconds",
        "10",
        "--start-delay-ms",
        "700",
        "--linger-ms",
        "1500",
        "--link",
        "cloud",
        "--target-pf",
        "0.99",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    c.start(sender, &args);
    c.wait(sender, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    c.stop_all();
    stop.store(true, Ordering::Relaxed);
    let total = rate * seconds;
    let mut streams = Vec::new();
    for (id, h) in collectors {
        let got = h.join().unwrap();
        let s = c.stats(id);
        let mut seqs = Vec::new();
        for b in &got {
            let p = fairfeed_wire::moldudp64::Packet::new_checked(&b[..]).expect("a MoldUDP64 packet");
            let count = p.message_count();
            if count != 0 && count != fairfeed_wire::moldudp64::COUNT_END_OF_SESSION {
                seqs.push((p.sequence(), u64::from(count)));
            }
        }
        let inversions = seqs.windows(2).filter(|w| w[1].0 <= w[0].0).count();
        let gaps = seqs.windows(2).filter(|w| w[1].0 > w[0].0 + w[0].1).count();
        eprintln!("receiver {id}: {} packets, {inversions} inversions, {gaps} gaps; node {}", got.len(), s["node"]);
        assert_eq!(inversions, 0, "receiver {id} delivered out of sequence order");
        assert_eq!(gaps, 0, "receiver {id} delivered a stream with gaps");
        assert_eq!(seqs.first().map(|s| s.0), Some(1), "receiver {id} starts the session at its first message");
        assert_eq!(got.len() as u64, total, "receiver {id}: every packet once");
        streams.push((id, got));
    }
    for w in streams.windows(2) {
        assert!(w[0].1 == w[1].1, "receivers {} and {} delivered different bytes", w[0].0, w[1].0);
    }
}

/// Goal (issue 42): a feed sharded over three trees, run as one process per
/// node, reaches every receiver's application as one MoldUDP64 line — the
/// merged session, numbered from 1 with no gap and no repeat, every message
/// of every tree once, each symbol's messages in the same order everywhere.
#[test]
fn a_feed_sharded_over_trees_reaches_every_application_as_one_line() {
    let mut c = Cluster::plan(4, 2, 1, &["--loopback-port".into(), "9380".into(), "--trees".into(), "3".into()]);
    assert_eq!(c.ids("sender").len(), 1, "one sender for every tree");
    assert_eq!(c.ids("proxy").len(), 3 * 2, "each tree its own proxies");
    let stop = Arc::new(AtomicBool::new(false));
    let collectors = start_delivering(&mut c, 9387, &stop, |_| Vec::new());
    let sender = c.ids("sender")[0];
    c.start(sender, &sender_args(&[]));
    c.wait(sender, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    c.stop_all();
    stop.store(true, Ordering::Relaxed);
    let s = c.stats(sender);
    assert_eq!(n(&s["counters"]["feed_sent"]), RATE * FEED_S);
    assert!(n(&s["node"]["shard"]["packets_out"]) >= RATE * FEED_S, "{}", s["node"]);
    let mut by_symbol: Vec<std::collections::BTreeMap<u16, Vec<Vec<u8>>>> = Vec::new();
    for (id, h) in collectors {
        let got = h.join().unwrap();
        let mut next = 1;
        let mut symbols: std::collections::BTreeMap<u16, Vec<Vec<u8>>> = Default::default();
        for b in &got {
            let p = fairfeed_wire::moldudp64::Packet::new_checked(&b[..]).expect("a MoldUDP64 packet");
            assert!(p.session().as_str().unwrap().ends_with("MRG"), "receiver {id}: session {:?}", p.session());
            if p.is_end_of_session() {
                continue;
            }
            assert_eq!(p.sequence(), next, "receiver {id}: the line jumps from {next} to {}", p.sequence());
            next = p.next_sequence();
            for m in p.messages() {
                let m = m.unwrap();
                symbols.entry(u16::from_be_bytes([m[1], m[2]])).or_default().push(m.to_vec());
            }
        }
        let st = c.stats(id);
        eprintln!("receiver {id}: {} packets, {} messages; merge {}", got.len(), next - 1, st["node"]["merge"]);
        assert_eq!(n(&st["node"]["gaps"]), 0, "receiver {id} lost nothing: {}", st["node"]);
        assert_eq!(n(&st["node"]["merge"]["barrier_timeouts"]), 0);
        by_symbol.push(symbols);
    }
    assert!(by_symbol[0].len() > 10, "the feed's symbols came through");
    for w in by_symbol.windows(2) {
        assert!(w[0] == w[1], "two receivers delivered a symbol's messages differently");
    }
}

/// Goal (issue 42, subscriptions): a receiver given `--symbols` (and the
/// sender's `--shard-map`) takes only the trees that carry its symbols and
/// delivers exactly their messages — directory included — and the
/// market-wide ones, in feed order; a receiver without one delivers all.
/// Method: a generated feed as a capture (its symbols read back with
/// `fairfeed decode`), two of its symbols mapped to trees 1 and 2 of three.
#[test]
fn a_subscriber_takes_its_symbols_trees_and_delivers_only_them() {
    let mut c = Cluster::plan(4, 2, 1, &["--loopback-port".into(), "9390".into(), "--trees".into(), "3".into()]);
    let pcap = c.dir.path().join("feed.pcap");
    common::fairfeed(&["gen", "--seed", "5", "--messages", "4000", "--symbols", "20", "--out", pcap.to_str().unwrap()]);
    let decoded = common::fairfeed(&["decode", pcap.to_str().unwrap(), "--json"]);
    let msgs: Vec<serde_json::Value> =
        String::from_utf8(decoded.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let dir: Vec<(String, u64)> = msgs
        .iter()
        .filter(|m| m["type"] == "R")
        .map(|m| (m["stock"].as_str().unwrap().to_string(), m["stock_locate"].as_u64().unwrap()))
        .collect();
    let (a, b) = (dir[0].clone(), dir[1].clone());
    let map = c.dir.path().join("shards.txt");
    std::fs::write(&map, format!("# hot symbols\n{} 1\n{} 2\n", a.0, b.0)).unwrap();
    let subs = c.dir.path().join("symbols.txt");
    std::fs::write(&subs, format!("{}\n{}\n", a.0, b.0)).unwrap();
    let want: Vec<u64> = msgs
        .iter()
        .filter(|m| [0, a.1, b.1].contains(&m["stock_locate"].as_u64().unwrap()))
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let (map_s, subs_s) = (map.to_str().unwrap().to_string(), subs.to_str().unwrap().to_string());
    let collectors = start_delivering(&mut c, 9397, &stop, |id| {
        let mut a = vec!["--shard-map".to_string(), map_s.clone()];
        if id == 0 {
            a.extend(["--symbols".to_string(), subs_s.clone()]);
        }
        a
    });
    let sender = c.ids("sender")[0];
    let p = pcap.to_str().unwrap().to_string();
    let map_arg = map.to_str().unwrap().to_string();
    c.start(sender, &sender_args(&["--pcap", &p, "--shard-map", &map_arg]));
    c.wait(sender, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    c.stop_all();
    stop.store(true, Ordering::Relaxed);
    let s = c.stats(sender);
    assert_eq!(n(&s["node"]["shard"]["mapped_symbols"]), 2, "{}", s["node"]);
    for (id, h) in collectors {
        let got = h.join().unwrap();
        let mut locates = Vec::new();
        for b in &got {
            let p = fairfeed_wire::moldudp64::Packet::new_checked(&b[..]).unwrap();
            locates.extend(p.messages().map(|m| u64::from(u16::from_be_bytes([m.unwrap()[1], m.unwrap()[2]]))));
        }
        let st = c.stats(id);
        if id == 0 {
            assert_eq!(st["node"]["trees"], serde_json::json!([1, 2]), "the subscriber's trees");
            assert!(locates.iter().all(|l| [0, a.1, b.1].contains(l)), "receiver 0 delivered another symbol");
            assert_eq!(locates.len(), want.len(), "receiver 0 delivered its symbols' and the market's messages");
            assert!(n(&st["node"]["merge"]["filtered_messages"]) > 0, "{}", st["node"]);
        } else {
            assert_eq!(locates.len(), msgs.len(), "receiver {id} delivered the whole feed");
        }
    }
}

/// A node's control address in a crash test (one port per test), to ask whether it is up.
fn ready_addr(id: u32, port: u16) -> String {
    format!("127.0.4.{}:{port}", id + 1)
}

/// Waits until every node in `ids` answers `stat` at its [`ready_addr`].
fn wait_up(ids: impl IntoIterator<Item = u32>, port: u16) {
    // On a loaded machine a process can take longer to come up than the
    // sender's start delay, and a receiver that joins late rightly starts
    // its stream where it joined.
    for id in ids {
        common::fairfeed(&["stat", &ready_addr(id, port), "--timeout-ms", "20000"]);
    }
}

#[test]
fn unhedged_tree_detects_a_crashed_proxy_and_fills_from_retransmission() {
    let mut c = Cluster::plan(4, 2, 0, &["--loopback-port".into(), "9320".into()]);
    let victim = c.nodes.iter().find(|n| n.role == "proxy" && n.layer == 0).unwrap().id;
    let orphans: Vec<u32> = c.nodes.iter().filter(|n| n.parent == Some(victim)).map(|n| n.id).collect();
    assert!(!orphans.is_empty());
    let server = "127.0.0.1:9329";
    let stop = Arc::new(AtomicBool::new(false));
    let mut collectors = Vec::new();
    for id in c.ids("receiver") {
        // A filled gap arrives as one burst of held packets: give the
        // application's socket room for it (as a real feed handler would).
        let sock = fairfeed_io::socket::bind_udp("127.0.0.1:0".parse().unwrap(), 4 << 20).unwrap();
        sock.set_nonblocking(false).unwrap();
        let deliver = sock.local_addr().unwrap().to_string();
        collectors.push((id, collect(sock, stop.clone())));
        let mut a = common_args();
        // Delivery and the arbitrator that fills gaps on a thread of their own.
        // The receivers are up before the session starts: they deliver it from sequence 1.
        a.extend([
            "--deliver".into(),
            deliver,
            "--retransmit".into(),
            server.into(),
            "--retransmit-from".into(),
            "1".into(),
        ]);
        a.extend(["--threads".into(), "dedicated".into()]);
        a.extend(["--control".into(), ready_addr(id, 9327)]);
        c.start(id, &a);
    }
    for id in c.ids("proxy") {
        let mut a = common_args();
        a.extend(["--control".into(), ready_addr(id, 9327)]);
        c.start(id, &a);
    }
    wait_up(c.ids("receiver").into_iter().chain(c.ids("proxy")), 9327);
    let sender = c.ids("sender")[0];
    let control = "127.0.0.1:9328";
    // Feed, data path, send side and control each on a thread of their own.
    let dedicated = ["--threads", "dedicated"];
    c.start(
        sender,
        &sender_args(&[&["--retransmit-listen", server, "--control", control][..], &dedicated[..]].concat()),
    );
    std::thread::sleep(Duration::from_millis(700 + 1_000));
    c.crash(victim);
    std::thread::sleep(Duration::from_millis(300));
    // The sender sees its child go silent.
    let out = common::fairfeed(&["stat", control]);
    let live = common::json(&out);
    assert!(n(&live["node"]["children_silent"]) >= 1, "silence not detected: {live}");
    // A supervisor restarts the proxy; the orphans' next packets reveal the gap.
    c.start(victim, &common_args());
    c.wait(sender, Duration::from_secs(20));
    c.stop_all();
    stop.store(true, Ordering::Relaxed);
    let total = RATE * FEED_S;
    // The sender's heartbeats after the feed (to show where the line ends)
    // are released like any packet: counted beside the messages.
    let beats = n(&c.stats(sender)["counters"]["heartbeats"]);
    let mut coverage = Vec::new();
    for (id, h) in collectors {
        let (seqs, _) = h.join().unwrap();
        let s = c.stats(id);
        let unique: BTreeSet<u64> = seqs.iter().copied().collect();
        assert_eq!(unique.len(), seqs.len(), "receiver {id} delivered a message twice");
        let (first, last) = (*unique.first().unwrap(), *unique.last().unwrap());
        eprintln!(
            "DEBUG receiver {id} orphan {} first {first} last {last} n {} counters {} node {}",
            orphans.contains(&id),
            seqs.len(),
            s["counters"],
            s["node"]
        );
        assert_eq!(
            unique.len() as u64,
            last - first + 1,
            "receiver {id} (orphan: {}) delivered a stream with holes: {}",
            orphans.contains(&id),
            s["counters"]
        );
        if orphans.contains(&id) {
            assert!(n(&s["counters"]["overlay_missing"]) > 0, "receiver {id}: the tree's loss was not seen");
            assert!(n(&s["counters"]["fill"]["gaps_filled_by_retransmit"]) > 0, "receiver {id}: {}", s["counters"]);
            assert!(n(&s["node"]["released"]) < total + beats);
        } else {
            assert_eq!(n(&s["node"]["released"]), total + beats, "receiver {id}");
        }
        assert_eq!(n(&s["counters"]["fill"]["lost_messages"]), 0, "receiver {id}");
        coverage.push((first, last));
    }
    assert!(coverage.windows(2).all(|w| w[0] == w[1]), "every receiver delivered the same messages: {coverage:?}");
}

/// Goal: a client that floods a node's control socket (thousands of `stat`
/// requests it never reads the answers to, and garbage) neither stalls the
/// node's data path nor keeps a well-behaved `fairfeed stat` from its answer.
#[test]
fn a_control_socket_flood_neither_stalls_the_node_nor_starves_stat() {
    let mut c = Cluster::plan(2, 2, 0, &["--loopback-port".into(), "9350".into()]);
    let victim = c.ids("receiver")[0];
    let control = "127.0.0.1:9358";
    for id in c.ids("receiver") {
        let mut a = common_args();
        if id == victim {
            a.extend(["--control".into(), control.into()]);
        }
        c.start(id, &a);
    }
    for id in c.ids("proxy") {
        c.start(id, &common_args());
    }
    let sender = c.ids("sender")[0];
    c.start(sender, &sender_args(&[]));
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) && sent < 2_000_000 {
                let msg: &[u8] = match sent % 4 {
                    0 => b"stat",
                    1 => &[0xff; 300],
                    2 => b"stat",
                    _ => b"\0\0\0",
                };
                if s.send_to(msg, control).is_ok() {
                    sent += 1;
                }
            }
            sent
        })
    };
    std::thread::sleep(Duration::from_millis(1_500));
    let t = std::time::Instant::now();
    let live = common::json(&common::fairfeed(&["stat", control, "--timeout-ms", "2000"]));
    let took = t.elapsed();
    assert!(took < Duration::from_secs(2), "stat took {took:?} under the flood");
    assert!(n(&live["counters"]["control"]["requests"]) > 100, "the flood did not arrive: {live}");
    c.wait(sender, Duration::from_secs(20));
    stop.store(true, Ordering::Relaxed);
    let sent = flood.join().unwrap();
    c.stop_all();
    let total = RATE * FEED_S;
    for id in c.ids("receiver") {
        let s = c.stats(id);
        assert_eq!(n(&s["node"]["released"]), total, "receiver {id} (flooded: {}) lost messages", id == victim);
        assert_eq!(c.early_releases(id), 0, "receiver {id}");
    }
    eprintln!(
        "flood: {sent} datagrams at the control socket; stat answered in {took:?}; {}",
        live["counters"]["control"]
    );
}

fn fails_with(args: &[&str], needle: &str) {
    let out = std::process::Command::new(common::bin()).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(err.contains(needle), "{args:?}: expected {needle:?} in: {err}");
}

#[test]
fn node_processes_explain_bad_configurations() {
    let c = Cluster::plan(4, 2, 1, &["--loopback-port".into(), "9340".into()]);
    let topo = c.topo.to_str().unwrap();
    fails_with(&["proxy", "--topology", "/nonexistent.toml", "--id", "1"], "reading topology");
    let garbage = c.path("garbage.toml");
    std::fs::write(&garbage, "receivers = 'many'").unwrap();
    fails_with(&["proxy", "--topology", garbage.to_str().unwrap(), "--id", "1"], "not a topology");
    fails_with(&["proxy", "--topology", topo, "--id", "99"], "no node 99");
    let receiver = c.ids("receiver")[0].to_string();
    fails_with(&["proxy", "--topology", topo, "--id", &receiver], "start it with `fairfeed receiver`");
    // A host clock source that is named but cannot be read: refused at start, in words.
    let junk = c.path("junk.shm");
    std::fs::write(&junk, [0x5a_u8; 80]).unwrap();
    for (shm, why) in [("/nonexistent/shm0", "No such file"), (junk.to_str().unwrap(), "no ClockBound magic")] {
        let cb = ["--clock", "system", "--host-clock", "clockbound", "--clockbound-shm", shm, "--seconds", "1"];
        fails_with(&[&["receiver", "--topology", topo, "--id", &receiver][..], &cb[..]].concat(), why);
    }
    // Its address is taken.
    let addr = c.node(c.ids("receiver")[0]).addr.clone();
    let _squatter = UdpSocket::bind(&addr).unwrap();
    fails_with(&["receiver", "--topology", topo, "--id", &receiver, "--seconds", "1"], "binding");
    // A peer's name that does not resolve: an error at once, or after the wait asked for.
    let text = std::fs::read_to_string(&c.topo).unwrap();
    let parent = c.node(c.ids("receiver")[0]).parent.expect("a receiver has a parent");
    let named = text.replacen(&c.node(parent).addr, "nosuchhost.invalid:9000", 1);
    let named_path = c.path("named.toml");
    std::fs::write(&named_path, named).unwrap();
    let np = named_path.to_str().unwrap();
    let t0 = std::time::Instant::now();
    fails_with(
        &["receiver", "--topology", np, "--id", &receiver, "--seconds", "1"],
        "cannot resolve nosuchhost.invalid",
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "no wait asked for: {:?}", t0.elapsed());
    let t0 = std::time::Instant::now();
    let wait = ["receiver", "--topology", np, "--id", &receiver, "--resolve-wait-s", "1.5"];
    fails_with(&wait, "cannot resolve nosuchhost.invalid");
    assert!(t0.elapsed() >= Duration::from_millis(1_000), "it waited: {:?}", t0.elapsed());
    fails_with(&["receiver", "--topology", np, "--id", &receiver, "--resolve-wait-s", "7200"], "3600");
    // A topology without addresses.
    let bare = Cluster::plan(4, 2, 1, &[]);
    fails_with(&["receiver", "--topology", bare.topo.to_str().unwrap(), "--id", "0"], "has no address");
    let bad_key = c.path("bad.key");
    std::fs::write(&bad_key, "xyz").unwrap();
    fails_with(&["receiver", "--topology", topo, "--id", "1", "--key-file", bad_key.to_str().unwrap()], "bad key");
    fails_with(&["stat", "127.0.0.1:9", "--timeout-ms", "200"], "no answer");
    // Sharding: a subscription needs the shard map, which must name its symbols
    // (and only trees that exist); retransmission is one session, one tree.
    let sharded = Cluster::plan(4, 2, 1, &["--loopback-port".into(), "9350".into(), "--trees".into(), "2".into()]);
    let st = sharded.topo.to_str().unwrap();
    let (map, subs) = (c.path("map.txt"), c.path("subs.txt"));
    std::fs::write(&map, "AAPL 1\nMSFT 5\n").unwrap();
    std::fs::write(&subs, "AAPL\n").unwrap();
    let (m, s) = (map.to_str().unwrap(), subs.to_str().unwrap());
    fails_with(&["receiver", "--topology", st, "--id", "0", "--symbols", s], "--shard-map");
    fails_with(
        &["receiver", "--topology", st, "--id", "0", "--symbols", s, "--shard-map", m],
        "line 2: tree 5 out of range",
    );
    std::fs::write(&map, "MSFT 1\n").unwrap();
    fails_with(
        &["receiver", "--topology", st, "--id", "0", "--symbols", s, "--shard-map", m],
        "AAPL is not in the shard map",
    );
    fails_with(&["receiver", "--topology", st, "--id", "0", "--retransmit", "127.0.0.1:9"], "retransmission");
    // A snapshot ends at the feed's sequence numbers, which one tree keeps and several do not.
    fails_with(
        &["receiver", "--topology", st, "--id", "0", "--snapshot", "127.0.0.1:9"],
        "need a topology of one tree",
    );
    let sender = sharded.ids("sender")[0].to_string();
    fails_with(
        &["sender", "--topology", st, "--id", &sender, "--snapshot-listen", "127.0.0.1:0"],
        "need a topology of one tree",
    );
    fails_with(
        &[
            "receiver",
            "--topology",
            topo,
            "--id",
            "0",
            "--snapshot",
            "127.0.0.1:9",
            "--retransmit",
            "127.0.0.1:9",
            "--retransmit-from",
            "1",
        ],
        "cannot be used with",
    );
}
