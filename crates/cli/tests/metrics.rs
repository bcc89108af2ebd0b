//! Goal: every tree node serves Prometheus metrics that Prometheus's own
//! checker accepts, that move while the tree runs, and that a hostile client
//! cannot take away from others (issue 19).
//!
//! Method: a 4-receiver tree (two proxies, hedging 1) as seven processes on
//! loopback, each with `--metrics`; each endpoint scraped twice, a second
//! apart, over plain HTTP; every body through `promtool check metrics`
//! (Debian's `prometheus` package: exit 0 and no lint findings); then eight
//! silent connections from one address fill that address's share while a
//! scrape from another loopback address still gets its answer.

#![allow(clippy::too_many_lines)] // scenario tests: one story, read top to bottom
mod common;
use common::*;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_tcp() -> SocketAddr {
    free_addr(true)
}

/// `GET /metrics` from `from` (a loopback source address); (status line, body).
fn scrape(addr: SocketAddr, from: [u8; 4]) -> (String, String) {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    sock.connect_timeout(&addr.into(), Duration::from_secs(2)).unwrap();
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: fairfeed\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.lines().next().unwrap_or("").to_string(), body.to_string())
}

fn promtool(body: &str) -> (bool, String) {
    let mut c = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.success() && said.trim().is_empty(), said)
}

/// The Grafana dashboard in the repository.
fn dashboard() -> serde_json::Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/grafana/fairfeed.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Every PromQL expression of the dashboard's panels.
fn dashboard_exprs() -> Vec<String> {
    let d = dashboard();
    let panels = d["panels"].as_array().unwrap();
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_string()))
        .collect()
}

/// The metric names the dashboard queries that start with one of `prefixes`.
fn dashboard_metrics(prefixes: &[&str]) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for e in dashboard_exprs() {
        for (i, _) in e.match_indices("fairfeed_") {
            let name: String = e[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if prefixes.iter().any(|p| name.starts_with(p)) {
                out.insert(name);
            }
        }
    }
    out
}

/// Asserts that every dashboard metric with one of `prefixes` is in one of `bodies`.
fn dashboard_finds_its_metrics(prefixes: &[&str], bodies: &[String]) {
    let wanted = dashboard_metrics(prefixes);
    assert!(!wanted.is_empty(), "the dashboard queries {prefixes:?}");
    for m in wanted {
        let found = bodies.iter().any(|b| b.lines().any(|l| l.split(['{', ' ']).next() == Some(m.as_str())));
        assert!(found, "docs/grafana/fairfeed.json queries {m}, which no scrape serves");
    }
}

#[test]
fn the_grafana_dashboard_is_valid_promql() {
    // Prometheus's own parser: each panel's query as a recording rule, through `promtool check rules`.
    if !have_tool("promtool", &["--version"]) {
        return;
    }
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 12, "{} panels", exprs.len());
    let rules: Vec<serde_json::Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| serde_json::json!({"record": format!("fairfeed:panel_{i}"), "expr": e}))
        .collect();
    let d = tmp();
    let f = d.path().join("rules.yml");
    std::fs::write(&f, serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string()).unwrap();
    let o = Command::new("promtool").args(["check", "rules", f.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
}

/// The value of the first sample of `metric` whose labels contain `label`.
fn value(body: &str, metric: &str, label: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{') && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Eight silent connections from 127.0.0.1 fill its share of `target`: a
/// ninth is closed at once, and a scrape from 127.0.0.2 still gets its answer.
fn a_hostile_client_cannot_starve_others(target: SocketAddr) {
    let hogs: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(target).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(target).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 8];
    assert_eq!(extra.read(&mut b).unwrap_or(0), 0, "a ninth connection from one address is closed");
    let t0 = Instant::now();
    let (status, body) = scrape(target, [127, 0, 0, 2]);
    assert!(status.contains("200") && t0.elapsed() < Duration::from_secs(2), "{status}");
    let refused =
        body.lines().find_map(|l| l.strip_prefix("fairfeed_metrics_http_refused_total ")?.parse::<f64>().ok());
    assert!(refused >= Some(1.0), "the endpoint counts what it refused: {refused:?}");
    drop(hogs);
}

#[test]
fn every_node_serves_metrics_promtool_accepts_and_a_hostile_client_cannot_starve_it() {
    if !have_tool("promtool", &["--version"]) {
        return;
    }
    let d = tmp();
    let port = free_port(false);
    let topo = small_tree(d.path(), port);
    let key = d.path().join("tree.key");
    std::fs::write(&key, "11".repeat(32)).unwrap();
    let spawn = |role: &str, id: u32, metrics: SocketAddr, extra: &[&str]| -> Child {
        Command::new(bin())
            .args([role, "--topology", topo.to_str().unwrap(), "--id", &id.to_string()])
            .args(["--key-file", key.to_str().unwrap(), "--idle", "park", "--metrics", &metrics.to_string()])
            .args(["--clock", "sync"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut nodes: Vec<(u32, SocketAddr, Child)> = Vec::new();
    for id in 0..4 {
        let m = free_tcp();
        // Receiver 3's clock steps 1 ms forward a second in, the size known
        // (as a host's own steps are told): it keeps its estimate.
        let step: &[&str] =
            if id == 3 { &["--clock-step-ns", "1000000", "--clock-step-after-ms", "1000"] } else { &[] };
        nodes.push((id, m, spawn("receiver", id, m, &[&["--seconds", "7"][..], step].concat())));
    }
    for id in [5, 6] {
        let m = free_tcp();
        nodes.push((id, m, spawn("proxy", id, m, &["--seconds", "7"])));
    }
    std::thread::sleep(Duration::from_millis(300));
    let m = free_tcp();
    let sender = ["--rate", "500", "--feed-seconds", "4", "--target-pf", "0.99"];
    nodes.push((4, m, spawn("sender", 4, m, &sender)));
    std::thread::sleep(Duration::from_millis(1_500));

    let first: Vec<String> = nodes.iter().map(|(_, m, _)| scrape(*m, [127, 0, 0, 1]).1).collect();
    std::thread::sleep(Duration::from_millis(1_200));
    let mut bodies = Vec::new();
    for (k, (id, m, _)) in nodes.iter().enumerate() {
        let (status, body) = scrape(*m, [127, 0, 0, 1]);
        bodies.push(body.clone());
        assert!(status.contains("200"), "node {id}: {status}");
        let (ok, said) = promtool(&body);
        assert!(ok, "node {id}: promtool check metrics: {said}\n{body}");
        let label = format!("node=\"{id}\"");
        assert!(value(&body, "fairfeed_node_uptime_seconds", &label).is_some(), "node {id}: {body}");
        let moved = |metric: &str| {
            let (a, b) = (value(&first[k], metric, &label), value(&body, metric, &label));
            assert!(a.is_some() && b > a, "node {id}: {metric} {a:?} → {b:?}");
        };
        // Steps: receiver 3's, told and kept; no node saw a jump on its edges.
        let steps = value(&body, "fairfeed_agent_clock_steps_total", &label);
        let kept = value(&body, "fairfeed_node_clock_stats_own_steps_kept_total", &label);
        let want = if *id == 3 { 1.0 } else { 0.0 };
        assert_eq!((steps, kept), (Some(want), Some(want)), "node {id}: clock steps told and kept");
        assert_eq!(value(&body, "fairfeed_node_clock_stats_steps_total", &label), Some(0.0), "node {id}: jumps seen");
        match id {
            0..=3 => {
                moved("fairfeed_node_released_total");
                assert!(body.contains("# TYPE fairfeed_node_owd_seconds histogram"), "node {id}");
                assert!(value(&body, "fairfeed_node_owd_seconds_count", &label).unwrap_or(0.0) > 100.0);
            }
            4 => {
                moved("fairfeed_agent_feed_sent_total");
                let owd_g = value(&body, "fairfeed_node_owd_g_seconds", &label).unwrap();
                assert!(owd_g > 0.0 && owd_g < 0.1, "OWD_G in seconds: {owd_g}");
            }
            _ => moved("fairfeed_node_copies_sent_total"),
        }
    }

    dashboard_finds_its_metrics(&["fairfeed_node_", "fairfeed_agent_"], &bodies);

    a_hostile_client_cannot_starve_others(nodes[0].1);

    for (id, _, mut c) in nodes {
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break Some(s);
            }
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = c.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.is_some_and(|s| s.success()), "node {id} exits cleanly: {status:?}");
    }
}

/// Waits for `child` (killing it after `limit`); its exit status.
fn wait_for(c: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t0 = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return Some(s);
        }
        if t0.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Scrapes `m` until `metric` shows up (the command publishes twice a second); the body.
fn scrape_until(m: SocketAddr, metric: &str) -> String {
    let t0 = Instant::now();
    loop {
        let (status, body) = scrape(m, [127, 0, 0, 1]);
        if status.contains("200") && body.contains(metric) || t0.elapsed() > Duration::from_secs(5) {
            return body;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An exchange on `port` with two symbols and two engines, its A line to
/// `itch`, its cheat watch on (deadline records at `deadlines`, the operator
/// key in `operator.hex` beside the configuration).
fn exchange_config(port: u16, itch: SocketAddr, deadlines: SocketAddr) -> String {
    format!(
        "listen = \"127.0.0.1:{port}\"\nengines = 2\nitch_session = \"FFTEST0001\"\nitch_a = \"{}\"\n\
         deadlines_listen = \"{deadlines}\"\noperator_key_file = \"operator.hex\"\n\n\
         [gateway]\nsession = \"S1\"\nusers = [[\"ALICE\", \"pw1\"]]\nsymbols = [\"AAPL\", \"MSFT\"]\n\
         heartbeat_ns = 1000000000\nidle_timeout_ns = 15000000000\n\n\
         [limits]\nsymbols = 2\norders = 1000\nlevels = 100\nqty_max = 1000000\nprice_max = 2000000000\n",
        itch
    )
}

#[test]
fn exchange_arb_retransmit_server_and_bridge_serve_metrics_promtool_accepts() {
    if !have_tool("promtool", &["--version"]) {
        return;
    }
    let d = tmp();
    let pcap = d.path().join("feed.pcap");
    let (a_pcap, b_pcap) = (d.path().join("a.pcap"), d.path().join("b.pcap"));
    fairfeed(&["gen", "--seed", "4", "--messages", "20000", "--symbols", "20", "--out", pcap.to_str().unwrap()]);
    fairfeed(&[
        "gen",
        "--seed",
        "4",
        "--messages",
        "20000",
        "--symbols",
        "20",
        "--out",
        d.path().join("x.pcap").to_str().unwrap(),
        "--a-out",
        a_pcap.to_str().unwrap(),
        "--b-out",
        b_pcap.to_str().unwrap(),
        "--loss-a",
        "0.05",
    ]);
    let free_udp = || free_addr(false);
    let (mut checked, mut bodies) = (Vec::new(), Vec::new());
    let mut check = |what: &str, m: SocketAddr, metric: &str, c: &mut Child| {
        let body = scrape_until(m, metric);
        bodies.push(body.clone());
        assert!(body.contains(metric), "{what}: no {metric} in\n{body}");
        let (ok, said) = promtool(&body);
        assert!(ok, "{what}: promtool check metrics: {said}\n{body}");
        // SIGTERM: the command stops and still reports (exit 0).
        let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
        let status = wait_for(c, Duration::from_secs(40));
        assert!(status.is_some_and(|s| s.success()), "{what} exits cleanly on SIGTERM: {status:?}");
        checked.push(what.to_string());
    };

    // The retransmission server and the live arbitrator asking it for what line A lost.
    let (rs, rm) = (free_udp(), free_tcp());
    let mut server = Command::new(bin())
        .args(["retransmit-server", "--journal", pcap.to_str().unwrap(), "--listen", &rs.to_string()])
        .args(["--metrics", &rm.to_string()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (la, lb, am) = (free_udp(), free_udp(), free_tcp());
    let mut arb = Command::new(bin())
        .args(["arb", "--a", &la.to_string(), "--b", &lb.to_string(), "--out-hr", &free_udp().to_string()])
        .args(["--retransmit", &rs.to_string(), "--idle", "park", "--metrics", &am.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    fairfeed(&["replay", a_pcap.to_str().unwrap(), "--to", &la.to_string(), "--rate", "20000"]);
    check("arb", am, "fairfeed_arb_gaps_opened_total", &mut arb);
    check("retransmit-server", rm, "fairfeed_retransmit_requests_total", &mut server);

    // The exchange, with one order through it.
    let port = free_tcp().port();
    let cfg = exchange_config(port, free_udp(), free_udp());
    let cfg_path = d.path().join("exchange.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    std::fs::write(d.path().join("operator.hex"), "5a".repeat(32)).unwrap();
    let em = free_tcp();
    let mut ex = Command::new(bin())
        .args(["exchange", "--config", cfg_path.to_str().unwrap(), "--metrics", &em.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let server = format!("127.0.0.1:{port}");
    let creds = ["--server", server.as_str(), "--user", "ALICE", "--password", "pw1"];
    fairfeed(&[&["order"][..], &creds, &["buy", "AAPL", "100", "@", "10"]].concat());
    fairfeed(&[&["order"][..], &creds, &["sell", "AAPL", "40", "@", "10"]].concat());
    let body = scrape_until(em, "fairfeed_exchange_engine_executions_total");
    assert!(body.contains("fairfeed_exchange_order_latency_seconds_count 2"), "{body}");
    assert!(body.contains("fairfeed_exchange_cheat_flagged{user=\"ALICE\"} 0"), "the cheat watch's metrics: {body}");
    check("exchange", em, "fairfeed_exchange_gateway_logins_total", &mut ex);

    // The bridge, on a broker of its own.
    if have_tool("nats-server", &["--version"]) {
        let nats = fairfeed_bridge::server::LocalServer::start(0, None).unwrap();
        let (listen, bm) = (free_udp(), free_tcp());
        let mut bridge = Command::new(bin())
            .args(["bridge", "run", "--listen", &listen.to_string(), "--nats", &nats.url])
            .args(["--metrics", &bm.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(800));
        fairfeed(&["replay", pcap.to_str().unwrap(), "--to", &listen.to_string(), "--rate", "20000"]);
        check("bridge run", bm, "fairfeed_bridge_published_total", &mut bridge);
    }
    assert!(checked.len() >= 3, "{checked:?}");
    let mut prefixes = vec!["fairfeed_exchange_", "fairfeed_arb_", "fairfeed_retransmit_"];
    if checked.iter().any(|c| c == "bridge run") {
        prefixes.push("fairfeed_bridge_");
    }
    dashboard_finds_its_metrics(&prefixes, &bodies);
}

#[test]
fn the_snapshot_server_serves_metrics_promtool_accepts() {
    if !have_tool("promtool", &["--version"]) {
        return;
    }
    let d = tmp();
    let pcap = d.path().join("feed.pcap");
    fairfeed(&["gen", "--seed", "5", "--messages", "20000", "--symbols", "20", "--out", pcap.to_str().unwrap()]);
    let sf = free_addr(false);
    let (sl, sm) = (free_tcp(), free_tcp());
    let mut snap = Command::new(bin())
        .args(["snapshot-server", "--listen", &sl.to_string(), "--feed", &sf.to_string()])
        .args(["--metrics", &sm.to_string()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    fairfeed(&["replay", pcap.to_str().unwrap(), "--to", &sf.to_string(), "--rate", "20000"]);
    let body = scrape_until(sm, "fairfeed_snapshot_feed_messages_total 20000");
    assert!(body.contains("fairfeed_snapshot_feed_messages_total 20000"), "{body}");
    assert!(body.contains("fairfeed_snapshot_serving 1"), "{body}");
    assert!(body.contains("# TYPE fairfeed_snapshot_open_orders gauge"), "{body}");
    let (ok, said) = promtool(&body);
    assert!(ok, "promtool check metrics: {said}\n{body}");
    let _ = Command::new("kill").args(["-TERM", &snap.id().to_string()]).status();
    let status = wait_for(&mut snap, Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "the snapshot server exits cleanly on SIGTERM: {status:?}");
}

/// The tree controller's `--metrics`: its counters and levels (members,
/// version, whether it leads) as Prometheus metrics that promtool accepts.
#[test]
fn the_controller_serves_its_metrics() {
    let ctl = std::net::UdpSocket::bind("127.0.9.61:0").unwrap().local_addr().unwrap();
    let m = std::net::TcpListener::bind("127.0.9.61:0").unwrap().local_addr().unwrap();
    let mut c = Command::new(bin())
        .args(["controller", "--listen", &ctl.to_string(), "--metrics", &m.to_string(), "--seconds", "6"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut r = Command::new(bin())
        .args(["receiver", "--controller", &ctl.to_string(), "--bind", "127.0.9.62:0", "--id", "any", "--idle", "park"])
        .args(["--seconds", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The endpoint comes up once the controller has started.
    let t0 = Instant::now();
    while TcpStream::connect(m).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the controller's metrics at {m} within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = scrape_until(m, "fairfeed_controller_members 1");
    assert!(body.contains("fairfeed_controller_members 1"), "{body}");
    assert!(body.contains("fairfeed_controller_core_registrations_total"), "{body}");
    assert!(body.contains("# TYPE fairfeed_controller_leading gauge"), "{body}");
    if have_tool("promtool", &["--version"]) {
        let (ok, said) = promtool(&body);
        assert!(ok, "{said}");
    }
    assert!(r.wait().unwrap().success());
    let _ = c.kill();
    let _ = c.wait();
}
