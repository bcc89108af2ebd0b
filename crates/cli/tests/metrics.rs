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

mod common;
use common::*;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_tcp() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
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

/// The value of the first sample of `metric` whose labels contain `label`.
fn value(body: &str, metric: &str, label: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{') && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn every_node_serves_metrics_promtool_accepts_and_a_hostile_client_cannot_starve_it() {
    if !have_tool("promtool", &["--version"]) {
        return;
    }
    let d = tmp();
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let topo = d.path().join("tree.toml");
    fairfeed(&[
        "plan",
        "--receivers",
        "4",
        "--fanout",
        "2",
        "--hedge",
        "1",
        "--loopback-port",
        &port.to_string(),
        "--out",
        topo.to_str().unwrap(),
    ]);
    let key = d.path().join("tree.key");
    std::fs::write(&key, "11".repeat(32)).unwrap();
    let spawn = |role: &str, id: u32, metrics: SocketAddr, extra: &[&str]| -> Child {
        Command::new(bin())
            .args([role, "--topology", topo.to_str().unwrap(), "--id", &id.to_string()])
            .args(["--key-file", key.to_str().unwrap(), "--idle", "park", "--metrics", &metrics.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut nodes: Vec<(u32, SocketAddr, Child)> = Vec::new();
    for id in 0..4 {
        let m = free_tcp();
        nodes.push((id, m, spawn("receiver", id, m, &["--seconds", "7"])));
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
    for (k, (id, m, _)) in nodes.iter().enumerate() {
        let (status, body) = scrape(*m, [127, 0, 0, 1]);
        assert!(status.contains("200"), "node {id}: {status}");
        let (ok, said) = promtool(&body);
        assert!(ok, "node {id}: promtool check metrics: {said}\n{body}");
        let label = format!("node=\"{id}\"");
        assert!(value(&body, "fairfeed_node_uptime_seconds", &label).is_some(), "node {id}: {body}");
        let moved = |metric: &str| {
            let (a, b) = (value(&first[k], metric, &label), value(&body, metric, &label));
            assert!(a.is_some() && b > a, "node {id}: {metric} {a:?} → {b:?}");
        };
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

    // A hostile client fills 127.0.0.1's share of receiver 0's endpoint; another address still scrapes.
    let target = nodes[0].1;
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
