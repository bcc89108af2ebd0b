//! Goal: an attacker who can send datagrams to every port of a running
//! tree — control sockets, overlay data, the sender's retransmission server —
//! stops nothing, reconfigures nothing and costs no message, and every
//! attempt is counted (docs/SECURITY.md).
//! Method: a hedged tree as processes (authenticated overlay, control sockets
//! with an operator key), a feed of 3,000 messages, and while it flows, for
//! about two seconds: unsealed `stop`s, `stop`s sealed under a wrong key, a
//! sealed `stop` captured a minute ago and replayed, a sealed `stat` replayed,
//! garbage, empty and oversize datagrams on every control and data port, and
//! bare 20-byte retransmission requests (a reflection attempt, measured from
//! the attacker's own socket). Counters come from `fairfeed stat --key-file`
//! during the run and each node's JSON at exit.

mod common;
use common::cluster::Cluster;
use fairfeed_tree::operator::OperatorKey;
use fairfeed_wire::moldudp64::{RequestRepr, Session};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

const RATE: u64 = 1_000;
const FEED_S: u64 = 3;
const OPERATOR_HEX: &str = "c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4";

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// What the attacker sent and drew.
#[derive(Debug, Default)]
struct Campaign {
    control_datagrams: u64,
    data_datagrams: u64,
    retransmit_bytes_in: u64,
    retransmit_bytes_back: u64,
}

/// One round of every attack, against `controls`, `data` and the retransmission server `rs`.
fn round(a: &[UdpSocket; 2], controls: &[String], data: &[String], rs: &str, replays: &[Vec<u8>], c: &mut Campaign) {
    let (a, r) = (&a[0], &a[1]);
    let wrong = OperatorKey::new([0x11; 32]);
    let mut to_control: Vec<Vec<u8>> = vec![
        b"stop".to_vec(),
        wrong.seal(wall_ns(), rand::random(), "stop").into_bytes(),
        b"ffauth1 1 00 00 stop".to_vec(),
        vec![0xff; 1_400],
        Vec::new(),
        b"stop \0\0\0 please".to_vec(),
    ];
    to_control.extend(replays.iter().cloned());
    for ctl in controls {
        for d in &to_control {
            if a.send_to(d, ctl.as_str()).is_ok() {
                c.control_datagrams += 1;
            }
        }
    }
    // Overlay-shaped garbage: the magic and version, then junk; short, long, empty.
    let mut shaped = vec![0xFA, 0x1F, 2, 1];
    shaped.extend((0..60).map(|_| rand::random::<u8>()));
    for to in data {
        for d in [shaped.clone(), vec![0u8; 0], vec![0xFA], vec![0x5a; 1_400], shaped[..30].to_vec()] {
            if a.send_to(&d, to.as_str()).is_ok() {
                c.data_datagrams += 1;
            }
        }
    }
    // Reflection: bare requests for what the journal holds; count what comes back.
    for seq in 1..=20u64 {
        let mut req = [0u8; 20];
        RequestRepr { session: Session::from_str_padded("FAIRFEED01"), sequence: seq * 50, count: 500 }
            .emit(&mut req)
            .unwrap();
        if r.send_to(&req, rs).is_ok() {
            c.retransmit_bytes_in += 20;
        }
    }
    let mut buf = [0u8; 65_536];
    while let Ok(k) = r.recv(&mut buf) {
        c.retransmit_bytes_back += k as u64;
    }
    // (Answers to the control socket's refusals come back to `a`: drain them.)
    while a.recv(&mut buf).is_ok() {}
}

#[test]
fn an_attack_campaign_on_a_running_tree_stops_nothing_changes_nothing_and_loses_nothing() {
    let mut c = Cluster::plan(4, 2, 1, &["--loopback-port".into(), "9460".into()]);
    let op = c.path("operator.key");
    std::fs::write(&op, OPERATOR_HEX).unwrap();
    let op_arg = op.display().to_string();
    let control = |id: u32| format!("127.0.0.1:{}", 9470 + id);
    let rs = "127.0.0.1:9469";
    let all: Vec<u32> = c.nodes.iter().map(|n| n.id).collect();
    let flags = |id: u32| -> Vec<String> {
        ["--link", "cloud", "--seconds", "30", "--control", &control(id), "--operator-key-file", &op_arg]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    for id in c.ids("receiver").into_iter().chain(c.ids("proxy")) {
        c.start(id, &flags(id));
    }
    let sender = c.ids("sender")[0];
    let mut s = flags(sender);
    s.retain(|a| a != "--seconds" && a != "30");
    let (rate, secs) = (RATE.to_string(), FEED_S.to_string());
    s.extend(
        ["--rate", &rate, "--feed-seconds", &secs, "--start-delay-ms", "700", "--linger-ms", "1500"]
            .iter()
            .map(|x| x.to_string()),
    );
    s.extend(["--retransmit-listen".into(), rs.into()]);
    c.start(sender, &s);
    std::thread::sleep(Duration::from_millis(900));

    // Captured on the wire: a sealed `stat` (its replays are refused) and a
    // `stop` the operator sealed a minute ago (stale).
    let key = OperatorKey::new([0xc4; 32]);
    let controls: Vec<String> = all.iter().map(|&id| control(id)).collect();
    let replays: Vec<Vec<u8>> = vec![
        key.seal(wall_ns() - 60_000_000_000, rand::random(), "stop").into_bytes(),
        key.seal(wall_ns(), [0x42; 16], "stat").into_bytes(),
    ];
    let data: Vec<String> = c.nodes.iter().map(|n| n.addr.clone()).collect();
    let a = [UdpSocket::bind("127.0.0.1:0").unwrap(), UdpSocket::bind("127.0.0.1:0").unwrap()];
    a[0].set_nonblocking(true).unwrap();
    a[1].set_read_timeout(Some(Duration::from_millis(5))).unwrap();
    let mut camp = Campaign::default();
    let t0 = Instant::now();
    for _ in 0..200 {
        if t0.elapsed() > Duration::from_secs(2) {
            break;
        }
        round(&a, &controls, &data, rs, &replays, &mut camp);
    }
    eprintln!("campaign: {camp:?}");
    assert!(camp.control_datagrams > 1_000 && camp.data_datagrams > 500, "{camp:?}");
    // Reflection: the attacker drew no more bytes than it sent.
    assert!(camp.retransmit_bytes_back <= camp.retransmit_bytes_in, "{camp:?}");

    // Mid-run, sealed `stat`s from the operator still work; nobody stopped.
    let mut auth = serde_json::Map::new();
    for &id in &all {
        let out = common::fairfeed(&["stat", &control(id), "--key-file", &op_arg, "--timeout-ms", "3000"]);
        let v = common::json(&out);
        let a = &v["counters"]["control"]["auth"];
        assert!(n(&a["unauthenticated"]) >= 50, "node {id}: {a}");
        assert!(n(&a["bad_mac"]) >= 50 && n(&a["malformed"]) >= 50, "node {id}: {a}");
        assert!(n(&a["stale"]) >= 50 && n(&a["replayed"]) >= 50, "node {id}: {a}");
        assert!(n(&a["sealed"]) >= 2, "the captured stat once and the operator's: node {id}: {a}");
        auth.insert(id.to_string(), a.clone());
    }
    let sv = common::json(&common::fairfeed(&["stat", &control(sender), "--key-file", &op_arg]));
    let rsv = &sv["counters"]["retransmit_server"];
    assert!(n(&rsv["challenges"]) > 0 && n(&rsv["bytes_out_unverified"]) <= n(&rsv["bytes_in"]), "{rsv}");
    for &id in &all {
        assert!(c.procs.get_mut(&id).unwrap().try_wait().unwrap().is_none(), "node {id} stopped: {}", c.stderr(id));
    }
    c.wait(sender, Duration::from_secs(20));
    c.stop_all();
    let total = RATE * FEED_S;
    for id in c.ids("receiver") {
        let st = c.stats(id);
        assert_eq!(n(&st["node"]["released"]), total, "receiver {id} lost messages under attack");
        assert_eq!(c.early_releases(id), 0, "receiver {id}");
    }
    let refused: u64 = all
        .iter()
        .map(|id| {
            let a = &c.stats(*id)["node"]["auth"];
            a["bad_tag"].as_u64().unwrap_or(0) + a["truncated"].as_u64().unwrap_or(0)
        })
        .sum();
    let bad: u64 = all.iter().map(|id| c.stats(*id)["node"]["bad_packets"].as_u64().unwrap_or(0)).sum();
    assert!(refused + bad > 0, "the forged data was counted");
    eprintln!("control refusals by node: {}", serde_json::Value::Object(auth));
    eprintln!("forged data refused: {refused} by tag, {bad} unparsable; retransmit: {rsv}");
}
