//! Goal: `fairfeed exchange` speaks protocols real tools understand, survives
//! bad clients, and its bench keeps its interface. Method: the exchange as a
//! process from a TOML configuration; a client session driven from the test
//! with fairfeed-wire's encoders (login, crossing orders, a cancel, a replace,
//! logout) while tshark captures loopback; a second connection sending
//! garbage; tshark must dissect the SoupBinTCP session with zero malformed
//! frames; the ITCH the exchange published on its A line must decode and
//! rebuild a consistent book.

#![allow(clippy::too_many_lines)] // scenario tests: one story, read top to bottom
mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fairfeed_exchange::client;
use fairfeed_wire::ouch::outbound;
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr};

#[test]
fn bench_prints_the_documented_fields() {
    let v = json(&fairfeed(&["exchange", "bench", "--rate", "2000", "--products", "2", "--seconds", "1", "--json"]));
    for k in [
        "avg_us",
        "stddev_us",
        "min_us",
        "p50_us",
        "p95_us",
        "p99_us",
        "max_us",
        "achieved_rate",
        "baseline_tcp_rtt_p99_us",
    ] {
        assert!(v[k].as_f64().is_some(), "missing {k}: {v}");
    }
    assert_eq!(v["orders"], v["responses"], "every order acknowledged: {v}");
    assert!(v["achieved_rate"].as_f64().unwrap() > 1_500.0);
    assert_eq!(v["steps"].as_array().unwrap().len(), 5, "seed 002's five points");
    assert!(["run-to-completion", "threaded"].contains(&v["pipeline"].as_str().unwrap()), "{v}");
    // Where the CPU went: the exchange's threads were found and ran, the
    // generator (a busy-polling thread) ran, per order and as a share of a core.
    let c = &v["cpu"];
    assert!(c["exchange_ns_per_order"].as_f64().unwrap() > 0.0, "{v}");
    assert!(c["exchange_busy"].as_f64().unwrap() > 0.0, "{v}");
    assert!(c["generator_ns_per_order"].as_f64().unwrap() > 0.0, "{v}");
    let busy = c["generator_busy"].as_f64().unwrap();
    assert!(busy > 0.0 && busy < 1.5, "one thread cannot use more than a core: {v}");
    // Both pipelines, and a hostile client beside the load.
    let args = ["exchange", "bench", "--rate", "2000", "--seconds", "1", "--json", "--pipeline", "threaded"];
    let t = json(&fairfeed(&[&args[..], &["--attack", "login-guessing", "--attack-phases-ms", "200"]].concat()));
    // The attacker in alternate phases: both halves measured, side by side.
    assert_eq!(t["attack_phase_ms"], 200, "{t}");
    let (on, off) = (&t["attack_on"], &t["attack_off"]);
    assert!(on["orders"].as_u64().unwrap() > 100 && off["orders"].as_u64().unwrap() > 100, "{t}");
    let sum = on["orders"].as_u64().unwrap() + off["orders"].as_u64().unwrap();
    assert!(sum < t["orders"].as_u64().unwrap(), "each phase's start is in neither half: {t}");
    assert!(t["attack_p99_ratio"].as_f64().unwrap() > 0.0, "{t}");
    assert!(v["attack_on"].is_null() && v["attack_p99_ratio"].is_null(), "no attack, no halves: {v}");
    assert_eq!(t["pipeline"], "threaded", "{t}");
    assert_eq!(t["orders"], t["responses"], "every order acknowledged under the attack: {t}");
    assert!(t["attack_stats"]["connections"].as_u64().unwrap() > 10, "{t}");
    assert!(t["gateway"]["login_rate_limited"].as_u64().unwrap() > 0, "the guesser was slowed: {t}");
    assert!(t["rss_end_kib"].as_u64().unwrap() > 0);
    let p = json(&fairfeed(&["exchange", "bench", "--in-process", "--json"]));
    assert!(p["orders_per_s"].as_f64().unwrap() > 100_000.0, "{p}");
}

fn soup(p: PacketRepr<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    client::packet(p, &mut b);
    b
}

fn enter(token: u32, side: u8, qty: u32, price: i64) -> Vec<u8> {
    let mut b = Vec::new();
    client::enter_order(&client::Order { token, side, qty, symbol: "AAPL", price, ..Default::default() }, &mut b);
    b
}

/// Reads sequenced OUCH messages until `n` have arrived (or 5 s).
fn read_messages(s: &mut TcpStream, n: usize) -> Vec<Vec<u8>> {
    read_messages_for(s, n, Duration::from_secs(5))
}

/// Reads sequenced OUCH messages until `n` have arrived or `limit` passed.
fn read_messages_for(s: &mut TcpStream, n: usize, limit: Duration) -> Vec<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let (mut buf, mut have, mut got) = (vec![0u8; 1 << 16], 0, Vec::new());
    let t0 = Instant::now();
    while got.len() < n && t0.elapsed() < limit {
        if let Ok(k) = s.read(&mut buf[have..]) {
            have += k;
        }
        let mut used = 0;
        while let Ok(Some((p, k))) = split_packet(&buf[used..have]) {
            used += k;
            if let PacketRepr::SequencedData(m) = p {
                got.push(m.to_vec());
            }
        }
        buf.copy_within(used..have, 0);
        have -= used;
    }
    got
}

#[test]
fn a_session_decodes_in_tshark_and_the_itch_line_is_consistent() {
    session_in_tshark("run-to-completion");
}

#[test]
fn the_threaded_pipeline_trades_the_same_session() {
    session_in_tshark("threaded");
}

/// One trading session against an exchange running `pipeline`, captured
/// and dissected by tshark; the ITCH lines, retransmissions and report checked.
fn session_in_tshark(pipeline: &str) {
    if !have_tool("tshark", &["--version"]) {
        return;
    }
    let d = tmp();
    let port = free_port(true);
    let line = UdpSocket::bind("127.0.0.1:0").unwrap();
    line.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let line_b = UdpSocket::bind("127.0.0.1:0").unwrap();
    line_b.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let retrans = free_addr(false);
    let cfg = format!(
        "listen = \"127.0.0.1:{port}\"\nengines = 1\nitch_a = \"{}\"\nitch_b = \"{}\"\nretransmit_listen = \"{retrans}\"\n\
         itch_session = \"FFTEST0001\"\npipeline = \"{pipeline}\"\n\n\
         [gateway]\nsession = \"S1\"\nusers = [[\"ALICE\", \"pw1\"], [\"BOB\", \"pw2\"]]\nsymbols = [\"AAPL\", \"MSFT\"]\n\
         heartbeat_ns = 1000000000\nidle_timeout_ns = 15000000000\n\n\
         [limits]\nsymbols = 2\norders = 10000\nlevels = 100\nqty_max = 1000000\nprice_max = 2000000000\n",
        line.local_addr().unwrap(),
        line_b.local_addr().unwrap()
    );
    let cfg_path = d.path().join("exchange.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let cap = d.path().join("session.pcapng");
    let itch_port = line.local_addr().unwrap().port();
    let mut tshark = Command::new("tshark")
        .args(["-i", "lo", "-f", &format!("tcp port {port} or udp port {itch_port}"), "-w", cap.to_str().unwrap()])
        .args(["-a", "duration:8"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    let x = Command::new(bin())
        .args(["exchange", "--config", cfg_path.to_str().unwrap(), "--seconds", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    trade_and_misbehave(port);
    let answer = retransmission(retrans);
    let itch = collect_itch(&line);
    assert_eq!(collect_itch(&line_b), itch, "the B line carries the same packets as the A line");
    // The retransmission server answers from the journal what the A line sent.
    let sent: Vec<Vec<u8>> = itch
        .iter()
        .filter_map(|p| fairfeed_wire::moldudp64::Packet::new_checked(&p[..]).ok())
        .filter(|p| p.message_count() != fairfeed_wire::moldudp64::COUNT_END_OF_SESSION)
        .flat_map(|p| p.messages().map(|m| m.unwrap().to_vec()).collect::<Vec<_>>())
        .collect();
    assert!(!answer.is_empty() && answer[..] == sent[..answer.len()], "retransmitted messages equal the line's");
    let out = x.wait_with_output().unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pipeline"], pipeline, "{report}");
    assert_eq!(report["gateway"]["protocol_closes"], 1, "the garbage connection was closed: {report}");
    let mut dec = fairfeed_feed::decode::FeedDecoder::default();
    for p in &itch {
        dec.handle(p);
    }
    let s = dec.summary();
    assert_eq!(s.errors, 0, "ITCH decodes cleanly: {s:?}");
    assert_eq!(s.gaps, 0, "no sequence gaps on the A line");
    assert_eq!(s.end_of_session, 1);
    for t in ["S", "R", "A", "E", "D"] {
        assert!(s.types.get(t).copied().unwrap_or(0) > 0, "ITCH has {t} messages: {:?}", s.types);
    }
    let _ = tshark.wait();
    tshark_checks(&cap, port, itch_port, itch.len());
}

/// Asks the exchange's retransmission server for messages 1..=10; returns them.
fn retransmission(server: std::net::SocketAddr) -> Vec<Vec<u8>> {
    use fairfeed_wire::moldudp64::{Packet, RequestRepr, Session};
    // A bare 20-byte request draws only a 20-byte challenge (no reflection) ...
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let r = RequestRepr { session: Session::from_str_padded("FFTEST0001"), sequence: 1, count: 10 };
    let mut req = [0u8; 20];
    r.emit(&mut req).unwrap();
    s.send_to(&req, server).unwrap();
    let mut buf = [0u8; 2048];
    let n = s.recv(&mut buf).expect("a challenge from the retransmission server");
    assert!(fairfeed_arb::retransmit::Requester::is_challenge(&buf[..n]), "{n} bytes");
    // ... and fairfeed's client answers it and gets the messages.
    let c = fairfeed_net::arb::client::RetransmitClient::new(server).unwrap();
    assert!(c.request(r));
    let until = std::time::Instant::now() + Duration::from_secs(2);
    let n = loop {
        if let Some(n) = c.recv(&mut buf) {
            break n;
        }
        assert!(std::time::Instant::now() < until, "no answer from the retransmission server");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(c.counts().2, 1, "one challenge answered");
    let p = Packet::new_checked(&buf[..n]).unwrap();
    assert_eq!(p.sequence(), 1);
    p.messages().map(|m| m.unwrap().to_vec()).collect()
}

/// Alice trades against herself through the book and cancels; Bob sends garbage and is cut off.
fn trade_and_misbehave(port: u16) {
    let mut a = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let login = |u: &str, p: &str| {
        let mut b = Vec::new();
        client::login(u, p, 1, &mut b);
        b
    };
    a.write_all(&login("ALICE", "pw1")).unwrap();
    // A second client sends garbage after logging in: only it is disconnected.
    let mut junk = TcpStream::connect(("127.0.0.1", port)).unwrap();
    junk.write_all(&login("BOB", "pw2")).unwrap();
    junk.write_all(&[0, 5, b'?', 1, 2, 3, 4]).unwrap();
    for i in 0..20u32 {
        a.write_all(&enter(i, b'S', 100, 1_000_000 + i64::from(i) * 100)).unwrap();
    }
    a.write_all(&enter(100, b'B', 450, 1_001_000)).unwrap();
    let mut cancel = Vec::new();
    client::cancel_order(19, 0, &mut cancel);
    a.write_all(&cancel).unwrap();
    let msgs = read_messages(&mut a, 20 + 1 + 5 + 5 + 1);
    let kinds: Vec<u8> = msgs.iter().map(|m| m[0]).collect();
    assert_eq!(
        kinds.iter().filter(|&&k| k == b'A').count(),
        21,
        "every order accepted: {:?}",
        String::from_utf8_lossy(&kinds)
    );
    let executed: u32 = msgs
        .iter()
        .filter_map(|m| match outbound::Message::parse(m) {
            Ok(outbound::Message::OrderExecuted(e)) if e.user_ref_num() == 100 => Some(e.quantity()),
            _ => None,
        })
        .sum();
    assert_eq!(executed, 450, "the buy took 4.5 of the resting sells at or under its limit");
    assert!(kinds.contains(&b'C'), "the cancel confirmed");
    a.write_all(&soup(PacketRepr::LogoutRequest)).unwrap();
    let mut rest = Vec::new();
    let _ = junk.read_to_end(&mut rest);
}

/// The A line's packets up to the end of session (6 s at most), heartbeats included.
fn collect_itch(line: &UdpSocket) -> Vec<Vec<u8>> {
    let mut itch = Vec::new();
    let mut buf = [0u8; 2048];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        if let Ok(n) = line.recv(&mut buf) {
            itch.push(buf[..n].to_vec());
            if n == 20 && buf[18..20] == [0xFF, 0xFF] {
                break; // end of session (a 20-byte packet with count 0 is a heartbeat)
            }
        }
    }
    itch
}

/// tshark on the capture: the SoupBinTCP session and the ITCH line, nothing malformed.
fn tshark_checks(cap: &std::path::Path, port: u16, itch_port: u16, itch_packets: usize) {
    let check = Command::new("tshark")
        .args([
            "-r",
            cap.to_str().unwrap(),
            "-d",
            &format!("tcp.port=={port},soupbintcp"),
            "--disable-protocol",
            "ouch",
        ])
        .args(["-T", "fields", "-e", "soupbintcp.packet_type", "-e", "_ws.malformed"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        !text.contains("Malformed") && !text.lines().any(|l| l.split('\t').nth(1).is_some_and(|m| !m.is_empty())),
        "{text}"
    );
    let types: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.split('\t').next())
        .flat_map(|f| f.split(','))
        .map(|x| x.trim_matches('\'').to_string())
        .filter(|x| !x.is_empty())
        .collect();
    for t in ["L", "A", "U", "S", "O"] {
        assert!(types.contains(t), "tshark saw no SoupBinTCP {t} packet; it saw {types:?}");
    }
    // The ITCH line as tshark sees it: MoldUDP64 with ITCH inside, nothing malformed.
    let m = Command::new("tshark")
        .args(["-r", cap.to_str().unwrap(), "-d", &format!("udp.port=={itch_port},moldudp64")])
        .args([
            "-Y",
            "moldudp64",
            "-T",
            "fields",
            "-e",
            "moldudp64.sequence",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
            "-e",
            "_ws.expert.message",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&m.stdout);
    assert_eq!(text.lines().count(), itch_packets, "tshark saw every ITCH packet: {text}");
    // Only a Comment-level expert item is allowed: tshark reads the 20-byte
    // end-of-session packet as a request (see external_tools.rs).
    let comment = (1u32 << 20).to_string();
    for l in text.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        assert!(f[1].is_empty(), "malformed: {l}");
        // The item's message (fourth field) says what tshark objected to.
        assert!(
            f[2].is_empty() || f[2] == comment,
            "expert item above Comment: {l}\nevery ITCH packet as tshark saw it:\n{text}"
        );
    }
}

/// A session to the exchange at `addr`, its login sent.
fn logged_in(addr: std::net::SocketAddr, user: &str, password: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut b = Vec::new();
    client::login(user, password, 0, &mut b);
    s.write_all(&b).unwrap();
    s
}

/// Which of two clients gets the one fill when the farther client's order is
/// stamped 10 ms earlier (and answered data 5 after 2 µs against the near
/// client's 3 µs) but arrives 50 ms later, under a sequencing window or DBO.
fn race(window_ns: u64, dbo_bound_ns: u64) -> (u32, u32) {
    use fairfeed_exchange::ordering::DeliveryClock;
    use fairfeed_net::exchange::live::{Exchange, ExchangeConfig, OrderingKind};
    let cfg = ExchangeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        gateway: fairfeed_exchange::gateway::GatewayConfig {
            users: vec![("MM".into(), "m".into()), ("NEAR".into(), "n".into()), ("FAR".into(), "f".into())],
            symbols: vec!["AAPL".into()],
            ..Default::default()
        },
        limits: fairfeed_exchange::engine::Limits { symbols: 1, orders: 1_000, ..Default::default() },
        sequencing_window_ns: window_ns,
        ordering: if dbo_bound_ns > 0 { OrderingKind::Dbo } else { OrderingKind::Fifo },
        dbo_bound_ns,
        ..ExchangeConfig::default()
    };
    cfg.validate().unwrap();
    let x = Exchange::start(cfg).unwrap();
    let connect = |u: &str, p: &str| logged_in(x.addr, u, p);
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let order = |token, side, stamp, response_ns| {
        let mut b = Vec::new();
        client::enter_order(
            &client::Order {
                token,
                side,
                qty: 100,
                symbol: "AAPL",
                price: 1_000_000,
                ioc: false,
                hidden: false,
                stamp: Some(stamp),
                clock: Some(DeliveryClock { data_seq: 5, response_ns }),
                min_qty: 0,
            },
            &mut b,
        );
        b
    };
    let mut mm = connect("MM", "m");
    mm.write_all(&order(1, b'S', now(), 0)).unwrap();
    assert_eq!(read_messages(&mut mm, 1).len(), 1, "the resting offer is accepted");
    let (mut near, mut far) = (connect("NEAR", "n"), connect("FAR", "f"));
    std::thread::sleep(Duration::from_millis(100));
    let t = now();
    near.write_all(&order(7, b'B', t, 3_000)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    far.write_all(&order(9, b'B', t - 10_000_000, 2_000)).unwrap();
    let filled = |s: &mut TcpStream| -> u32 {
        read_messages_for(s, 2, Duration::from_secs(1))
            .iter()
            .filter_map(|m| match outbound::Message::parse(m) {
                Ok(outbound::Message::OrderExecuted(e)) => Some(e.quantity()),
                _ => None,
            })
            .sum()
    };
    let r = (filled(&mut near), filled(&mut far));
    let _ = x.finish();
    r
}

#[test]
fn a_sequencing_window_lets_an_earlier_stamp_from_farther_away_win() {
    assert_eq!(race(0, 0), (100, 0), "off: arrival order, the near client fills");
    let on = race(300_000_000, 0);
    assert_eq!(on, (0, 100), "a 300 ms window: the earlier stamp fills although it arrived 50 ms later");
}

#[test]
fn the_ordering_settings_are_checked() {
    use fairfeed_net::exchange::live::{ExchangeConfig, OrderingKind};
    let dbo = |bound| ExchangeConfig { ordering: OrderingKind::Dbo, dbo_bound_ns: bound, ..ExchangeConfig::default() };
    assert!(dbo(1_000).validate().is_ok());
    assert!(dbo(1_000_000_000).validate().is_ok());
    for bad in [0, 999, 1_000_000_001] {
        assert!(dbo(bad).validate().unwrap_err().to_string().contains("dbo_bound_ns"), "{bad}");
    }
    let both = ExchangeConfig { sequencing_window_ns: 10, ..dbo(5_000) };
    assert!(both.validate().unwrap_err().to_string().contains("exclude each other"));
    let batch = |us| ExchangeConfig { ordering: OrderingKind::Batch, batch_us: us, ..ExchangeConfig::default() };
    assert!(batch(1).validate().is_ok() && batch(1_000_000).validate().is_ok());
    for bad in [0, 1_000_001] {
        assert!(batch(bad).validate().unwrap_err().to_string().contains("batch_us"), "{bad}");
    }
    let stray = ExchangeConfig { batch_us: 100, ..ExchangeConfig::default() };
    assert!(stray.validate().unwrap_err().to_string().contains("batch_us is set but ordering is \"fifo\""));
}

#[test]
fn dbo_lets_the_faster_response_win_although_it_arrived_later() {
    // The market maker's offer (data 5, response 0) goes first; then the far
    // client's 2-µs response beats the near client's 3-µs one.
    assert_eq!(race(0, 300_000_000), (0, 100), "dbo: ranked by (data 5, response)");
    // A bound shorter than the far client's extra 50 ms: arrival order again.
    assert_eq!(race(0, 1_000_000), (100, 0), "dbo with a 1-ms bound: the near order had gone");
}

/// Goal (issue 44): the live exchange runs frequent batch auctions — two
/// firms that lift one resting offer in the same batch share it equally,
/// whichever arrived first, at one price; the ITCH line shows the auction
/// (the resting order's fill as `C`, then one `Q` Cross Trade). Method: a
/// market maker rests 100 shares on each of two symbols; just after a
/// batch boundary two firms each bid 100 on both, 20 ms apart; each firm's
/// fills and the ITCH line are read. Run on both pipelines, with two
/// engines (the symbols on different shards).
fn batch_race(pipeline: fairfeed_net::exchange::live::Pipeline) {
    use fairfeed_net::exchange::live::{Exchange, ExchangeConfig, OrderingKind};
    use fairfeed_wire::itch::Message;
    use fairfeed_wire::moldudp64::Packet;
    const BATCH_US: u64 = 200_000;
    let itch = UdpSocket::bind("127.0.0.1:0").unwrap();
    itch.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let cfg = ExchangeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        gateway: fairfeed_exchange::gateway::GatewayConfig {
            users: vec![("MM".into(), "m".into()), ("NEAR".into(), "n".into()), ("FAR".into(), "f".into())],
            symbols: vec!["AAPL".into(), "MSFT".into()],
            ..Default::default()
        },
        limits: fairfeed_exchange::engine::Limits { symbols: 2, orders: 1_000, ..Default::default() },
        engines: 2,
        itch_a: Some(itch.local_addr().unwrap()),
        ordering: OrderingKind::Batch,
        batch_us: BATCH_US,
        pipeline,
        ..ExchangeConfig::default()
    };
    cfg.validate().unwrap();
    let x = Exchange::start(cfg).unwrap();
    let connect = |u: &str, p: &str| logged_in(x.addr, u, p);
    let orders = |first: u32, side| {
        let mut b = Vec::new();
        for (k, symbol) in ["AAPL", "MSFT"].into_iter().enumerate() {
            let o = client::Order {
                token: first + k as u32,
                side,
                qty: 100,
                symbol,
                price: 1_000_000,
                ..Default::default()
            };
            client::enter_order(&o, &mut b);
        }
        b
    };
    let mut mm = connect("MM", "m");
    mm.write_all(&orders(1, b'S')).unwrap();
    assert_eq!(read_messages(&mut mm, 2).len(), 2, "the two offers accepted at their batch's end");
    let (mut near, mut far) = (connect("NEAR", "n"), connect("FAR", "f"));
    // Just after a batch boundary, so that both bids fall in one batch.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let interval = BATCH_US * 1_000;
    std::thread::sleep(Duration::from_nanos(interval - now % interval + 20_000_000));
    near.write_all(&orders(7, b'B')).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    far.write_all(&orders(9, b'B')).unwrap();
    let fills = |s: &mut TcpStream| -> Vec<(u32, i64)> {
        read_messages_for(s, 4, Duration::from_secs(3))
            .iter()
            .filter_map(|m| match outbound::Message::parse(m) {
                Ok(outbound::Message::OrderExecuted(e)) => Some((e.quantity(), e.price().0)),
                _ => None,
            })
            .collect()
    };
    let (n, f) = (fills(&mut near), fills(&mut far));
    let _ = x.finish();
    assert_eq!(n, vec![(50, 1_000_000), (50, 1_000_000)], "near: half of each offer, at the one price");
    assert_eq!(f, n, "far, 20 ms later in the same batch: the same");
    let (mut crosses, mut with_price) = (Vec::new(), 0);
    let mut buf = [0u8; 2048];
    while let Ok(len) = itch.recv(&mut buf) {
        let Ok(p) = Packet::new_checked(&buf[..len]) else { continue };
        for m in p.messages().flatten() {
            match Message::parse(m) {
                Ok(Message::CrossTrade(q)) => crosses.push((q.stock_locate(), q.shares(), q.cross_type())),
                Ok(Message::OrderExecutedWithPrice(c)) => with_price += u64::from(c.executed_shares()),
                _ => {}
            }
        }
    }
    crosses.sort_unstable();
    assert_eq!(crosses, vec![(1, 100, b'I'), (2, 100, b'I')], "one intraday cross per symbol on the feed");
    assert_eq!(with_price, 200, "the offers' fills, at the clearing price");
}

#[test]
fn a_batch_auction_shares_a_stale_offer_between_the_firms_in_it() {
    use fairfeed_net::exchange::live::Pipeline;
    batch_race(Pipeline::RunToCompletion);
    batch_race(Pipeline::Threaded);
}

/// A TCP connection to `port` from loopback address `from` (another client,
/// as far as the exchange can tell), with a receive buffer of `rcvbuf` bytes.
fn connect_from(from: [u8; 4], port: u16, rcvbuf: Option<usize>) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    if let Some(n) = rcvbuf {
        s.set_recv_buffer_size(n).unwrap();
    }
    s.bind(&std::net::SocketAddr::from((from, 0)).into()).unwrap();
    s.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into()).unwrap();
    s.into()
}

/// True when the server closed `s` (EOF or reset) within `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 4096];
    while t0.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn hostile_clients_neither_lock_others_out_nor_make_the_exchange_hold_their_output() {
    let d = tmp();
    let port = free_port(true);
    let cfg = format!(
        "listen = \"127.0.0.1:{port}\"\nengines = 1\nitch_session = \"FFTEST0001\"\nout_buffer_max_bytes = 65536\n\n\
         [gateway]\nsession = \"S1\"\nusers = [[\"ALICE\", \"pw1\"], [\"BOB\", \"pw2\"]]\nsymbols = [\"AAPL\"]\n\
         heartbeat_ns = 1000000000\nidle_timeout_ns = 15000000000\nlogin_timeout_ns = 2000000000\n\n\
         [limits]\nsymbols = 1\norders = 100000\nlevels = 100\nqty_max = 1000000\nprice_max = 2000000000\n"
    );
    let x = start_exchange(&d, &cfg, "7");
    // Ten connections from one address that never log in: four are kept, six refused at once.
    let mut lurkers: Vec<TcpStream> = (0..10).map(|_| connect_from([127, 0, 0, 9], port, None)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let refused = lurkers.iter_mut().map(|s| closed_within(s, Duration::from_millis(100))).filter(|&c| c).count();
    assert_eq!(refused, 6, "pre-login connections per address are bounded");
    // Another client logs in and trades meanwhile.
    let mut alice = connect_from([127, 0, 0, 2], port, None);
    let mut b = Vec::new();
    client::login("ALICE", "pw1", 1, &mut b);
    alice.write_all(&b).unwrap();
    alice.write_all(&enter(1, b'S', 100, 1_000_000)).unwrap();
    assert_eq!(read_messages(&mut alice, 1)[0][0], b'A', "the honest client is served");
    // The lurkers are cut at the login deadline (2 s).
    for s in &mut lurkers {
        assert!(closed_within(s, Duration::from_millis(3_000)), "a connection that never logs in is closed");
    }
    // Bob floods orders and never reads: closed at the output limit, not held.
    let mut bob = connect_from([127, 0, 0, 3], port, Some(4_096));
    let mut b = Vec::new();
    client::login("BOB", "pw2", 1, &mut b);
    bob.write_all(&b).unwrap();
    bob.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    for i in 0..200_000u32 {
        let side = if i % 2 == 0 { b'B' } else { b'S' };
        if bob.write_all(&enter(10 + i, side, 1, 1_000_000)).is_err() {
            break;
        }
    }
    // Alice is still served.
    alice.write_all(&enter(2, b'S', 100, 1_000_100)).unwrap();
    let later = read_messages(&mut alice, 1);
    assert!(!later.is_empty(), "the honest client is still served after the flood");
    let out = x.wait_with_output().unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let g = &report["gateway"];
    assert_eq!(g["refused_connections"], 6, "{g}");
    assert_eq!(g["login_timeouts"], 4, "{g}");
    assert_eq!(g["slow_reader_closes"], 1, "{g}");
}

/// Starts `fairfeed exchange` on `cfg` (TOML) for `seconds`; its report comes on stdout.
fn start_exchange(d: &tempfile::TempDir, cfg: &str, seconds: &str) -> std::process::Child {
    let cfg_path = d.path().join("exchange.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let x = Command::new(bin())
        .args(["exchange", "--config", cfg_path.to_str().unwrap(), "--seconds", seconds])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    x
}

/// Goal: connections from many addresses that never log in cannot take every
/// slot from a real client: with all 256 slots held, a new connection takes
/// the place of the oldest that has not logged in.
#[test]
fn lurkers_from_many_addresses_cannot_take_every_slot() {
    let d = tmp();
    let port = free_port(true);
    let cfg = format!(
        "listen = \"127.0.0.1:{port}\"\nengines = 1\nitch_session = \"FFTEST0001\"\n\n\
         [gateway]\nsession = \"S1\"\nusers = [[\"ALICE\", \"pw1\"]]\nsymbols = [\"AAPL\"]\n\
         heartbeat_ns = 1000000000\nidle_timeout_ns = 15000000000\nlogin_timeout_ns = 30000000000\n\n\
         [limits]\nsymbols = 1\norders = 1000\nlevels = 100\nqty_max = 1000000\nprice_max = 2000000000\n"
    );
    let x = start_exchange(&d, &cfg, "4");
    // 300 connections, four from each of 75 addresses (the per-address limit), none logging in.
    let lurkers: Vec<TcpStream> = (0..300).map(|k| connect_from([127, 0, 5, (k / 4 + 1) as u8], port, None)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut alice = connect_from([127, 0, 0, 2], port, None);
    let mut b = Vec::new();
    client::login("ALICE", "pw1", 1, &mut b);
    alice.write_all(&b).unwrap();
    alice.write_all(&enter(1, b'S', 100, 1_000_000)).unwrap();
    assert_eq!(read_messages(&mut alice, 1)[0][0], b'A', "the real client got in and was served");
    drop(lurkers);
    let out = x.wait_with_output().unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let g = &report["gateway"];
    assert_eq!(g["prelogin_evicted"], 300 + 1 - 256, "the oldest lurkers made room: {g}");
    assert_eq!(g["logins"], 1, "{g}");
}

#[test]
fn a_quiet_itch_line_carries_heartbeats_with_the_next_sequence_number() {
    let d = tmp();
    let port = free_port(true);
    let line = UdpSocket::bind("127.0.0.1:0").unwrap();
    line.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let cfg = format!(
        "listen = \"127.0.0.1:{port}\"\nengines = 1\nitch_a = \"{}\"\nitch_session = \"FFTEST0001\"\n\
         itch_heartbeat_ns = 100000000\n\n\
         [gateway]\nsession = \"S1\"\nusers = [[\"ALICE\", \"pw1\"]]\nsymbols = [\"AAPL\"]\n\
         heartbeat_ns = 1000000000\nidle_timeout_ns = 15000000000\n\n\
         [limits]\nsymbols = 1\norders = 1000\nlevels = 100\nqty_max = 1000000\nprice_max = 2000000000\n",
        line.local_addr().unwrap()
    );
    let cfg_path = d.path().join("exchange.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let out = Command::new(bin())
        .args(["exchange", "--config", cfg_path.to_str().unwrap(), "--seconds", "1.5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let packets = collect_itch(&line);
    let out = out.wait_with_output().unwrap();
    assert!(out.status.success());
    let parsed: Vec<(u64, u16)> = packets
        .iter()
        .map(|p| {
            let p = fairfeed_wire::moldudp64::Packet::new_checked(&p[..]).unwrap();
            (p.sequence(), p.count())
        })
        .collect();
    assert_eq!(parsed.last().map(|p| p.1), Some(0xFFFF), "ends with the end of session: {parsed:?}");
    // The opening messages, then heartbeats at the next sequence number, then the end of session.
    let opening: u64 = parsed.iter().take_while(|p| p.1 > 0 && p.1 != 0xFFFF).map(|p| u64::from(p.1)).sum();
    let heartbeats: Vec<&(u64, u16)> = parsed.iter().filter(|p| p.1 == 0).collect();
    assert!(heartbeats.len() >= 8, "about one per 100 ms over 1.5 s: {parsed:?}");
    assert!(heartbeats.iter().all(|p| p.0 == 1 + opening), "each names the next sequence number: {parsed:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["itch_heartbeats"].as_u64().unwrap(), heartbeats.len() as u64, "{report}");
}

#[test]
fn password_guessing_from_one_address_is_slowed_to_five_tries_a_second() {
    let d = tmp();
    let port = free_port(true);
    let cfg = format!(
        "listen = \"127.0.0.1:{port}\"\nengines = 1\nitch_session = \"FFTEST0001\"\n\n\
         [gateway]\nsession = \"S1\"\nusers = [[\"ALICE\", \"pw1\"], [\"BOB\", \"pw2\"]]\nsymbols = [\"AAPL\"]\n\
         heartbeat_ns = 1000000000\nidle_timeout_ns = 15000000000\n\n\
         [limits]\nsymbols = 1\norders = 1000\nlevels = 100\nqty_max = 1000000\nprice_max = 2000000000\n"
    );
    let cfg_path = d.path().join("exchange.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let x = Command::new(bin())
        .args(["exchange", "--config", cfg_path.to_str().unwrap(), "--seconds", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // Twenty guesses in a row from one address: five answered, the rest cut off unanswered.
    let mut answered = 0;
    for i in 0..20 {
        let mut s = connect_from([127, 0, 0, 5], port, None);
        let mut b = Vec::new();
        client::login("ALICE", &format!("guess{i}"), 1, &mut b);
        let _ = s.write_all(&b);
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        if reply.get(2) == Some(&b'J') {
            answered += 1;
        }
    }
    assert_eq!(answered, 5, "five wrong passwords a second from one address are answered");
    // Another address logs in meanwhile.
    let mut bob = connect_from([127, 0, 0, 6], port, None);
    let mut b = Vec::new();
    client::login("BOB", "pw2", 1, &mut b);
    bob.write_all(&b).unwrap();
    let mut head = [0u8; 3];
    bob.read_exact(&mut head).unwrap();
    assert_eq!(head[2], b'A', "login accepted");
    let out = x.wait_with_output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["gateway"]["login_rate_limited"], 15, "{report}");
}

#[test]
fn the_itch_journal_keeps_its_limit_and_answers_only_what_it_still_holds() {
    use fairfeed_net::exchange::live::{Exchange, ExchangeConfig};
    use fairfeed_wire::moldudp64::{Packet, RequestRepr, Session};
    let free = UdpSocket::bind("127.0.0.1:0").unwrap();
    let server = free.local_addr().unwrap();
    drop(free);
    let cfg = ExchangeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        gateway: fairfeed_exchange::gateway::GatewayConfig {
            users: vec![("ALICE".into(), "pw1".into())],
            symbols: vec!["AAPL".into()],
            ..Default::default()
        },
        limits: fairfeed_exchange::engine::Limits { symbols: 1, orders: 10_000, ..Default::default() },
        retransmit_listen: Some(server),
        itch_session: "FFTEST0001".into(),
        itch_journal_max_bytes: 1 << 16,
        ..ExchangeConfig::default()
    };
    let x = Exchange::start(cfg).unwrap();
    let mut s = TcpStream::connect(x.addr).unwrap();
    let mut b = Vec::new();
    client::login("ALICE", "pw1", 0, &mut b);
    s.write_all(&b).unwrap();
    // 3,000 resting orders: 3,000 ITCH Add Orders of 36 bytes, 108 KB against a 64 KiB journal.
    for token in 1..=3_000u32 {
        s.write_all(&enter(token, b'B', 100, 1_000_000)).unwrap();
    }
    assert_eq!(read_messages_for(&mut s, 3_000, Duration::from_secs(10)).len(), 3_000, "every order accepted");
    std::thread::sleep(Duration::from_millis(200));
    let ask = |sequence: u64| -> Option<u64> {
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut req = [0u8; 1400]; // padded: an unverified source gets at most what it sent
        RequestRepr { session: Session::from_str_padded("FFTEST0001"), sequence, count: 5 }
            .emit(&mut req[..20])
            .unwrap();
        c.send_to(&req, server).unwrap();
        let mut buf = [0u8; 2048];
        let n = c.recv(&mut buf).ok()?;
        Some(Packet::new_checked(&buf[..n]).unwrap().sequence())
    };
    assert_eq!(ask(1), None, "the oldest messages were dropped: no answer");
    assert_eq!(ask(2_990), Some(2_990), "recent ones are still answered");
    let r = x.finish();
    let evicted = r.itch_journal_evicted;
    assert!(evicted >= 1_000, "108 KB into 64 KiB drops over a thousand 36-byte messages: {evicted}");
    assert!(r.itch_messages >= 3_000 && evicted < r.itch_messages, "{evicted} of {}", r.itch_messages);
}

/// `fairfeed order …` against `exchange`; (exit code, stdout, stderr).
fn order(port: u16, args: &[&str]) -> (Option<i32>, String, String) {
    order_as(port, "pw1", args)
}

fn order_as(port: u16, password: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let server = format!("127.0.0.1:{port}");
    let o = Command::new(bin())
        .args(["order", "--server", &server, "--user", "ALICE", "--password", password, "--wait-ms", "100"])
        .args(args)
        .output()
        .unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn orders_by_hand_trade_cancel_replace_and_say_why_when_refused() {
    let d = tmp();
    let port = free_port(true);
    let cfg = format!(
        "listen = \"127.0.0.1:{port}\"\nengines = 1\nitch_session = \"FFTEST0001\"\n\n\
         [gateway]\nsession = \"S1\"\nusers = [[\"ALICE\", \"pw1\"]]\nsymbols = [\"AAPL\", \"MSFT\"]\n\
         heartbeat_ns = 1000000000\nidle_timeout_ns = 15000000000\n\n\
         [limits]\nsymbols = 2\norders = 1000\nlevels = 100\nqty_max = 1000000\nprice_max = 2000000000\n"
    );
    let cfg_path = d.path().join("exchange.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let mut ex = Command::new(bin())
        .args(["exchange", "--config", cfg_path.to_str().unwrap(), "--seconds", "15"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Tokens come from the exchange (OUCH Account Query) when not given.
    let (rc, out, err) = order(port, &["buy", "AAPL", "100", "@", "185.00"]);
    assert_eq!(rc, Some(0), "{out}{err}");
    assert!(out.contains("accepted   token 1 BUY 100 AAPL @ 185.0000") && out.contains("live"), "{out}");
    let (rc, out, _) = order(port, &["sell", "AAPL", "40", "185", "--ioc", "--json"]);
    assert_eq!(rc, Some(0), "{out}");
    let msgs: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let fills: Vec<_> = msgs.iter().filter(|m| m["type"] == "executed").collect();
    assert_eq!(fills.len(), 2, "both sides of the trade are this user's: {out}");
    assert!(fills.iter().all(|f| f["qty"] == 40 && f["price"] == "185.0000"), "{out}");
    let (rc, out, _) = order(port, &["replace", "1", "50", "@", "184.50"]);
    assert_eq!(rc, Some(0), "{out}");
    assert!(out.contains("replaced   token 1 → 3 50 @ 184.5000"), "{out}");
    let (rc, out, _) = order(port, &["cancel", "3"]);
    assert_eq!(rc, Some(0), "{out}");
    assert!(out.contains("canceled   token 3 50 shares"), "{out}");
    // Refusals: a non-zero exit, the exchange's reason, one error line.
    let (rc, out, err) = order(port, &["cancel", "3"]);
    assert_eq!(rc, Some(1), "{out}{err}");
    assert!(out.contains("no live order"), "{out}");
    let (rc, out, err) = order(port, &["buy", "TSLA", "1", "@", "1"]);
    assert_eq!(rc, Some(1));
    assert!(out.contains("unknown symbol") && err.lines().count() == 1, "{out}{err}");
    let (rc, _, err) = order_as(port, "nope", &["buy", "AAPL", "1", "@", "1"]);
    assert_eq!(rc, Some(1));
    assert!(err.contains("not authorized") && err.lines().count() == 1, "{err}");
    let (rc, _, err) = order(port, &["buy", "AAPL", "1", "@", "1.00001"]);
    assert_eq!(rc, Some(1));
    assert!(err.contains("\"@1.00001\"") && err.lines().count() == 1, "names the value: {err}");
    // A minimum quantity: nothing rests to sell, so an IOC wanting at least
    // 10 trades nothing and is canceled whole, its minimum echoed; one above
    // its own quantity is refused.
    let (rc, out, _) = order(port, &["buy", "AAPL", "20", "@", "1", "--ioc", "--min-qty", "10"]);
    assert_eq!(rc, Some(0), "{out}");
    assert!(out.contains("min 10") && out.contains("canceled   token 5 20 shares"), "{out}");
    let (rc, out, err) = order(port, &["buy", "AAPL", "20", "@", "1", "--ioc", "--min-qty", "30"]);
    assert_eq!(rc, Some(1), "{out}{err}");
    assert!(out.contains("bad minimum quantity") && err.lines().count() == 1, "{out}{err}");
    // A day order with a minimum: it cannot trade it, so it rests (hidden), live.
    let (rc, out, _) = order(port, &["buy", "AAPL", "20", "@", "1", "--min-qty", "10"]);
    assert_eq!(rc, Some(0), "{out}");
    assert!(out.contains("min 10") && out.contains("live") && !out.contains("canceled"), "{out}");
    let (rc, out, _) = order(port, &["next-token"]);
    assert_eq!(rc, Some(0));
    assert!(out.contains("next token 8"), "tokens 1–7 were used: {out}");
    // The whole session, from its first message.
    let (rc, out, _) = order(port, &["history", "--json"]);
    assert_eq!(rc, Some(0));
    let kinds: Vec<String> =
        out.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["type"].to_string()).collect();
    assert!(kinds.iter().filter(|k| k.contains("accepted")).count() == 4, "{kinds:?}");
    // A DBO delivery clock rides in the appendage (a fifo exchange accepts and ignores it).
    let (rc, out, _) = order(port, &["buy", "MSFT", "10", "@", "100", "--ioc", "--delivery-clock", "7:-250"]);
    assert_eq!(rc, Some(0), "{out}");
    for bad in ["7", "x:1", "7:1.5", "-1:0"] {
        let (rc, _, err) = order(port, &["buy", "MSFT", "10", "@", "100", "--delivery-clock", bad]);
        assert_eq!(rc, Some(2), "{bad}: {err}");
        assert!(err.contains("SEQ:NS"), "{err}");
    }
    let _ = ex.kill();
    let _ = ex.wait();
    let (rc, _, err) = order(port, &["buy", "AAPL", "1", "@", "1"]);
    assert_eq!(rc, Some(1));
    assert!(err.contains(&format!("127.0.0.1:{port}")) && err.lines().count() == 1, "{err}");
}
