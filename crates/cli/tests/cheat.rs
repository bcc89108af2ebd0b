//! Goal (issue 44): a firm that runs its own receiver and acts before the
//! deadlines — `fairfeed receiver --cheat-us X`, the test mode that releases
//! X µs early — is caught by the exchange's cheat detector
//! (`fairfeed_exchange::cheat::CheatDetector`) from real release timing,
//! while the honest receivers of the same tree, releasing late by their
//! hosts' timer precision, are never flagged.
//!
//! Method: a tree of four receivers as `fairfeed` processes on loopback
//! (emulated cloud links, authenticated packets); receiver 1 of the four
//! cheats by 200 µs, receiver 2 by 5 µs. Each receiver's release log gives, per message, the
//! sender's deadline (which a firm cannot change: the sender stamps it under
//! the tree key) and its release instant. Each release becomes the firm's
//! order: sent 2 µs after the release, arriving after a drawn order path
//! (20 µs + lognormal queueing, median 2 µs), which the exchange has probed
//! 1,000 times per firm. The detector judges every order with the DBO stamp
//! (the response time) and without it (arrival times only).
//!
//! What is emulated: the order path and the firms' 2-µs response (no OUCH
//! session carries these orders); the releases, deadlines and the cheat are
//! the node processes' own.
//!
//! The second test is the live chain: the same tree, the sender's sealed
//! deadline records to a live exchange, firms answering their receivers'
//! deliveries over OUCH sessions, and the exchange's own cheat watch.

#![allow(clippy::too_many_lines)] // scenario tests: one story, read top to bottom
mod common;
use common::cluster::Cluster;
use fairfeed_exchange::cheat::{CheatDetector, CheatParams};
use rand::{Rng, SeedableRng};
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The two cheats: by far more than the hold (it releases on arrival), and
/// by the 5 µs.
const CHEAT_US: [u64; 2] = [200, 5];
const RESPONSE_NS: u64 = 2_000;

fn ready_addr(id: u32) -> String {
    format!("127.0.4.{}:9817", id + 1)
}

/// One order path's one-way delay, ns: a 20-µs floor plus queueing.
fn path_ns(rng: &mut impl Rng) -> u64 {
    let z: f64 = (0..12).map(|_| rng.gen::<f64>()).sum::<f64>() - 6.0; // ~N(0, 1)
    20_000 + (2_000.0 * (0.5 * z).exp()) as u64
}

/// Runs the detector over every firm's orders; returns each firm's
/// `flagged_after` (orders judged when flagged).
fn judge(releases: &[Vec<(u64, u64, u64)>], stamped: bool) -> Vec<Option<u64>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(44);
    let mut d = CheatDetector::new(CheatParams::default(), releases.len());
    for firm in 0..releases.len() {
        for _ in 0..1_000 {
            d.handle_path_sample(firm, path_ns(&mut rng));
        }
    }
    // Orders in arrival order across firms, as the exchange sees them.
    let mut orders: Vec<(u64, usize, u64)> = Vec::new();
    for (firm, rows) in releases.iter().enumerate() {
        for &(_, deadline, release) in rows {
            orders.push((release + RESPONSE_NS + path_ns(&mut rng), firm, deadline));
        }
    }
    orders.sort_unstable();
    for (arrival, firm, deadline) in orders {
        d.handle_order(firm, deadline, arrival, stamped.then_some(RESPONSE_NS as i64));
    }
    (0..releases.len()).map(|f| d.firm(f).and_then(|w| w.flagged_after)).collect()
}

#[test]
fn a_receiver_that_releases_early_is_flagged_and_honest_ones_are_not() {
    let mut c = Cluster::plan(4, 4, 0, &["--loopback-port".into(), "9810".into()]);
    let rx = c.ids("receiver");
    for (k, &id) in rx.iter().enumerate() {
        let mut a: Vec<String> = ["--link", "cloud", "--seconds", "30", "--control", &ready_addr(id)]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if let Some(us) = CHEAT_US.get(k) {
            a.extend(["--cheat-us".into(), us.to_string()]);
        }
        c.start(id, &a);
    }
    for &id in &rx {
        common::fairfeed(&["stat", &ready_addr(id), "--timeout-ms", "20000"]);
    }
    let sender = c.ids("sender")[0];
    let args: Vec<String> = ["--rate", "1000", "--feed-seconds", "3", "--start-delay-ms", "500", "--linger-ms", "1000"]
        .iter()
        .map(|s| s.to_string())
        .chain(["--link".into(), "cloud".into()])
        .collect();
    c.start(sender, &args);
    c.wait(sender, Duration::from_secs(30));
    c.stop_all();
    for &id in &rx[..2] {
        assert!(c.stderr(id).contains("TEST MODE"), "a cheat says so: {}", c.stderr(id));
    }
    let releases: Vec<Vec<(u64, u64, u64)>> = rx.iter().map(|&id| c.release_rows(id)).collect();
    for (k, rows) in releases.iter().enumerate() {
        assert!(rows.len() > 2_000, "receiver {} released {} of 3,000", rx[k], rows.len());
    }
    // A cheat's log keeps the sender's deadlines: the same as an honest receiver's.
    let honest: std::collections::HashMap<u64, u64> = releases[2].iter().map(|r| (r.0, r.1)).collect();
    for rows in &releases[..2] {
        let same = rows.iter().filter(|r| honest.get(&r.0) == Some(&r.1)).count();
        assert!(same * 10 >= rows.len() * 9, "{same} of {} deadlines match", rows.len());
    }
    // The big cheat releases early almost always (the rest arrived within 200 µs of the deadline or after).
    let early = c.early_releases(rx[0]);
    assert!(early * 10 >= releases[0].len() * 9, "the cheat released {early} of {} early", releases[0].len());
    for &id in &rx[2..] {
        assert_eq!(c.early_releases(id), 0, "honest receiver {id} released before a deadline");
    }
    // Release − deadline at each receiver (the cheat's negative), µs: what the detector has to see through.
    let mut median = Vec::new();
    for (k, rows) in releases.iter().enumerate() {
        let mut v: Vec<i64> = rows.iter().map(|r| r.2 as i64 - r.1 as i64).collect();
        v.sort_unstable();
        let q = |p: usize| v[(v.len() - 1) * p / 100] as f64 / 1e3;
        eprintln!(
            "receiver {}: release − deadline p1 {} p10 {} p50 {} p90 {} p99 {} µs",
            rx[k],
            q(1),
            q(10),
            q(50),
            q(90),
            q(99)
        );
        median.push(q(50));
    }
    // Whether the 5-µs cheat took effect: on a host whose timers run late by
    // more than 5 µs at the median, the cheat releases no earlier than an
    // honest receiver does, gains nothing, and has nothing to show.
    let small_cheat_acted = median[1] < 0.0;
    for stamped in [true, false] {
        let flagged = judge(&releases, stamped);
        eprintln!("stamped {stamped}: flagged after {flagged:?} orders");
        assert!(flagged[0].is_some_and(|n| n <= 1_000), "the 200-µs cheat flagged within 1,000 orders: {flagged:?}");
        // Without the DBO stamp the lead is the cheat less the response time
        // (2 µs) and queueing: a 3-µs-early release does not show.
        if stamped && small_cheat_acted {
            assert!(flagged[1].is_some_and(|n| n <= 1_000), "the 5-µs cheat flagged within 1,000 orders: {flagged:?}");
        }
        assert!(flagged[2..].iter().all(Option::is_none), "no honest firm is flagged: {flagged:?}");
    }
    if !small_cheat_acted {
        eprintln!(
            "this host's release timers ran {} µs late at the median: the 5-µs cheat had no effect",
            median[1] + 5.0
        );
    }
}

/// One firm: takes its receiver's deliveries and answers every fifth packet
/// with an order — stamped with its own delivery clock (the packet's last
/// message, the time since it arrived) if `stamps` — until `stop`. Returns
/// orders sent.
fn firm(
    deliveries: UdpSocket,
    mut session: TcpStream,
    stop: Arc<AtomicBool>,
    stamps: bool,
) -> std::thread::JoinHandle<u64> {
    use fairfeed_exchange::client;
    use fairfeed_exchange::ordering::DeliveryClock;
    std::thread::spawn(move || {
        deliveries.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        session.set_nonblocking(true).unwrap();
        let (mut buf, mut sink, mut sent, mut packets) = ([0u8; 2048], [0u8; 65_536], 0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let Ok(n) = deliveries.recv(&mut buf) else { continue };
            let at = Instant::now();
            let Ok(p) = fairfeed_wire::moldudp64::Packet::new_checked(&buf[..n]) else { continue };
            let count = p.message_count();
            if count == 0 || count == fairfeed_wire::moldudp64::COUNT_END_OF_SESSION {
                continue;
            }
            packets += 1;
            if packets % 5 != 0 {
                continue;
            }
            let clock = DeliveryClock {
                data_seq: p.sequence() + u64::from(count) - 1,
                response_ns: at.elapsed().as_nanos() as i64,
            };
            let o = client::Order {
                token: sent as u32 + 1,
                side: b'B',
                qty: 1,
                symbol: "AAPL",
                price: 10_000,
                clock: stamps.then_some(clock),
                ..Default::default()
            };
            let mut b = Vec::new();
            client::enter_order(&o, &mut b);
            session.write_all(&b).unwrap();
            sent += 1;
            // What the exchange answers is read and dropped (its buffer must not fill).
            while session.read(&mut sink).is_ok_and(|n| n > 0) {}
        }
        sent
    })
}

/// An exchange with the cheat watch on for `firms` users FIRM1.. (password
/// pw1..), its operator key `key` repeated (also written to the cluster's
/// directory for the sender): the config, the users and the key file.
fn watched_exchange(
    c: &Cluster,
    firms: usize,
    key: u8,
) -> (fairfeed_net::exchange::live::ExchangeConfig, Vec<(String, String)>, std::path::PathBuf) {
    let op_key = c.path("operator.hex");
    std::fs::write(&op_key, format!("{key:02x}").repeat(32)).unwrap();
    let users: Vec<(String, String)> = (1..=firms).map(|k| (format!("FIRM{k}"), format!("pw{k}"))).collect();
    let cfg = fairfeed_net::exchange::live::ExchangeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        gateway: fairfeed_exchange::gateway::GatewayConfig {
            users: users.clone(),
            symbols: vec!["AAPL".into()],
            ..Default::default()
        },
        limits: fairfeed_exchange::engine::Limits { symbols: 1, orders: 100_000, ..Default::default() },
        deadlines_listen: Some("127.0.0.1:0".parse().unwrap()),
        operator_key: Some(fairfeed_tree::operator::OperatorKey::new([key; 32])),
        ..Default::default()
    };
    (cfg, users, op_key)
}

/// Runs the sender for `seconds` of feed at 1,000 packets/s after
/// `delay_ms`, its deadline records to `deadlines` sealed under the key in
/// `op_key`; then stops the firms, the nodes and the exchange: each firm's
/// orders sent and the exchange's report.
fn feed_and_finish(
    c: &mut Cluster,
    seconds: u64,
    delay_ms: u64,
    (deadlines, op_key): (std::net::SocketAddr, &std::path::Path),
    (firms, stop): (Vec<std::thread::JoinHandle<u64>>, &AtomicBool),
    x: fairfeed_net::exchange::live::Exchange,
) -> (Vec<u64>, fairfeed_net::exchange::live::ExchangeReport) {
    let sender = c.ids("sender")[0];
    let args: Vec<String> = ["--rate", "1000", "--link", "cloud", "--linger-ms", "500"]
        .iter()
        .map(|s| s.to_string())
        .chain(["--feed-seconds".into(), seconds.to_string(), "--start-delay-ms".into(), delay_ms.to_string()])
        .chain(["--deadlines-to".into(), deadlines.to_string()])
        .chain(["--operator-key-file".into(), op_key.display().to_string()])
        .collect();
    c.start(sender, &args);
    c.wait(sender, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let sent: Vec<u64> = firms.into_iter().map(|f| f.join().unwrap()).collect();
    c.stop_all();
    (sent, x.finish())
}

/// Goal (issue 44): the live exchange's cheat watch flags a firm whose own
/// receiver releases early, from orders over real OUCH sessions, and no
/// honest firm. Method: the sender sends its deadline records to the
/// exchange (`--deadlines-to`, sealed under the operator key); four
/// receivers deliver to four firms (threads of this test), receiver 1
/// cheating by 200 µs; each firm answers every fifth packet with an order
/// stamped with its delivery clock over its own OUCH session; the exchange
/// (`deadlines_listen`) measures each session's path from TCP's minimum
/// round trip; a stranger sends garbage and records sealed under another
/// key. Its report's `cheat` section must name the cheat only and count the
/// stranger's datagrams refused.
#[test]
fn the_live_exchange_flags_the_firm_whose_receiver_releases_early() {
    use fairfeed_net::exchange::live::Exchange;
    let mut c = Cluster::plan(4, 4, 0, &["--loopback-port".into(), "9820".into()]);
    let (cfg, users, op_key) = watched_exchange(&c, 4, 0x5a);
    cfg.validate().unwrap();
    let x = Exchange::start(cfg).unwrap();
    let deadlines = x.deadlines_addr.expect("the watch's socket");
    let stop = Arc::new(AtomicBool::new(false));
    let mut firms = Vec::new();
    let rx = c.ids("receiver");
    for (k, &id) in rx.iter().enumerate() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut s = TcpStream::connect(x.addr).unwrap();
        let mut b = Vec::new();
        fairfeed_exchange::client::login(&users[k].0, &users[k].1, 0, &mut b);
        s.write_all(&b).unwrap();
        let mut a: Vec<String> = ["--link", "cloud", "--seconds", "30", "--control", &ready_addr(id + 10)]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--deliver".into(), sock.local_addr().unwrap().to_string()]);
        if k == 0 {
            a.extend(["--cheat-us".into(), "200".into()]);
        }
        c.start(id, &a);
        firms.push(firm(sock, s, stop.clone(), true));
    }
    for &id in &rx {
        common::fairfeed(&["stat", &ready_addr(id + 10), "--timeout-ms", "20000"]);
    }
    // A stranger's datagrams: garbage, and records sealed under another key
    // that would move every deadline of the feed far into the past.
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    stranger.send_to(b"not deadline records", deadlines).unwrap();
    let mut w = fairfeed_tree::deadlines::RecordWriter::new(fairfeed_tree::operator::OperatorKey::new([1; 32]));
    w.push(fairfeed_tree::deadlines::Record { first: 1, messages: 60_000, deadline_ns: 0 });
    stranger.send_to(&w.flush().unwrap(), deadlines).unwrap();
    let (sent, r) = feed_and_finish(&mut c, 3, 500, (deadlines, &op_key), (firms, &stop), x);
    let cheat = r.cheat.expect("the report has the cheat watch");
    eprintln!("orders sent {sent:?}; cheat watch {cheat:#}");
    let st = &cheat["stats"];
    assert!(st["datagrams"].as_u64().unwrap() > 10, "deadline records arrived: {st}");
    assert_eq!((st["refused_bad_tag"].as_u64(), st["refused_not_records"].as_u64()), (Some(1), Some(1)), "{st}");
    assert!(st["orders_judged"].as_u64().unwrap() * 10 >= sent.iter().sum::<u64>() * 9, "{st} of {sent:?}");
    assert_eq!(cheat["flagged"], serde_json::json!(["FIRM1"]), "only the cheat is flagged: {cheat}");
    let after = cheat["users"][0]["flagged_after"].as_u64().unwrap();
    assert!(after <= 1_000, "flagged after {after} orders");
    let s = c.stats(c.ids("sender")[0]);
    assert_eq!(s["counters"]["deadline_records"]["send_errors"], 0, "{}", s["counters"]);
}

/// Goal (issue 44): DBO end to end without the firms stamping anything —
/// the release point does. Method: two honest receivers, each with
/// `--order-proxy` toward a live exchange ordering by DBO with the cheat
/// watch on; each firm logs in and sends unstamped orders through its
/// receiver's proxy. Every order must reach the exchange with a delivery
/// clock (the ordering buffer counts none without), be judged by the watch
/// against the sender's deadlines, and flag no one.
#[test]
fn the_release_point_stamps_the_orders_for_dbo() {
    use fairfeed_net::exchange::live::{Exchange, ExchangeConfig, OrderingKind};
    let mut c = Cluster::plan(2, 2, 0, &["--loopback-port".into(), "9830".into()]);
    let (cfg, users, op_key) = watched_exchange(&c, 2, 0x6b);
    let cfg = ExchangeConfig { ordering: OrderingKind::Dbo, dbo_bound_ns: 1_000_000, ..cfg };
    cfg.validate().unwrap();
    let x = Exchange::start(cfg).unwrap();
    let deadlines = x.deadlines_addr.unwrap();
    let rx = c.ids("receiver");
    let mut socks = Vec::new();
    for (k, &id) in rx.iter().enumerate() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let a: Vec<String> = ["--link", "cloud", "--seconds", "30", "--control", &ready_addr(id + 20)]
            .iter()
            .map(|s| s.to_string())
            .chain(["--deliver".into(), sock.local_addr().unwrap().to_string()])
            .chain(["--order-proxy".into(), format!("127.0.5.{}:9839", k + 1), "--exchange".into(), x.addr.to_string()])
            .collect();
        c.start(id, &a);
        socks.push(sock);
    }
    for &id in &rx {
        common::fairfeed(&["stat", &ready_addr(id + 20), "--timeout-ms", "20000"]);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut firms = Vec::new();
    for (k, sock) in socks.into_iter().enumerate() {
        let mut s = TcpStream::connect(format!("127.0.5.{}:9839", k + 1)).unwrap();
        let mut b = Vec::new();
        fairfeed_exchange::client::login(&users[k].0, &users[k].1, 0, &mut b);
        s.write_all(&b).unwrap();
        firms.push(firm(sock, s, stop.clone(), false));
    }
    let (sent, r) = feed_and_finish(&mut c, 2, 300, (deadlines, &op_key), (firms, &stop), x);
    let total: u64 = sent.iter().sum();
    assert!(total >= 600, "orders sent {sent:?}");
    assert_eq!(r.ordering.received, total, "every order reached the DBO buffer: {:?}", r.ordering);
    assert_eq!(r.ordering.no_clock, 0, "every order carried the release point's clock: {:?}", r.ordering);
    let cheat = r.cheat.unwrap();
    assert_eq!(cheat["stats"]["orders_unstamped"], 0, "{cheat}");
    assert!(cheat["stats"]["orders_judged"].as_u64().unwrap() * 10 >= total * 9, "{cheat}");
    assert_eq!(cheat["flagged"], serde_json::json!([]), "{cheat}");
    for (k, &id) in rx.iter().enumerate() {
        let p = &c.stats(id)["counters"]["order_proxy"];
        assert_eq!(p["stamped"].as_u64(), Some(sent[k]), "receiver {id}'s proxy stamped its firm's orders: {p}");
    }
}
