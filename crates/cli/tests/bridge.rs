//! Goal: `fairfeed bridge` and `fairfeed subscribe` work end to end against a
//! real nats-server, and `fairfeed bridge bench --json` keeps its interface.
//! Method: a generated capture replayed over UDP into `fairfeed bridge run`,
//! a `fairfeed subscribe` process counting everything; Debian's nats-server
//! started by the test (SKIPPED without it, a failure with FAIRFEED_REQUIRE_TOOLS=1).

mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

fn have_server() -> bool {
    if fairfeed_bridge::server::find_server().is_some() {
        return true;
    }
    have_tool("nats-server", &["--version"])
}

#[test]
fn bridge_bench_prints_the_documented_fields() {
    if !have_server() {
        return;
    }
    let out = fairfeed(&[
        "bridge",
        "bench",
        "--subscribers",
        "2",
        "--granularity",
        "message",
        "--by",
        "symbol",
        "--rate",
        "500",
        "--seconds",
        "1",
        "--json",
    ]);
    let v = json(&out);
    for k in ["p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "lost", "duplicates"] {
        assert!(v.get(k).is_some(), "missing {k}: {v}");
    }
    assert_eq!(v["lost"], 0, "{v}");
    assert_eq!(v["duplicates"], 0);
    assert!(v["publications"].as_u64().unwrap() > 500, "message granularity publishes per message: {v}");
    assert!(v["p50_ms"].as_f64().unwrap() > 0.0);
    // Each side's CPU per message: the threads were found, and their time was counted.
    let cpu = &v["cpu"];
    assert_eq!(cpu["publisher"]["threads"], 1, "{cpu}");
    assert_eq!(cpu["subscribers"]["threads"], 2, "{cpu}");
    assert_eq!(cpu["deliveries"].as_u64(), v["publications"].as_u64().map(|p| p * 2), "{cpu}");
    for k in [
        "route_ns_per_message",
        "publisher_ns_per_publication",
        "bridge_ns_per_publication",
        "subscriber_ns_per_delivery",
    ] {
        let x = cpu[k].as_f64().unwrap_or(0.0);
        assert!(x > 0.0 && x < 1e7, "{k} = {x}: {cpu}");
    }
}

#[test]
fn replayed_capture_reaches_a_subscriber_through_the_bridge() {
    if !have_server() {
        return;
    }
    let d = tmp();
    let server = fairfeed_bridge::server::LocalServer::start(0, None).unwrap();
    let pcap = d.path().join("feed.pcap");
    fairfeed(&["gen", "--seed", "3", "--messages", "20000", "--symbols", "50", "--out", pcap.to_str().unwrap()]);
    let port = free_port(false);
    let listen = format!("127.0.0.1:{port}");
    let stats = d.path().join("bridge.json");
    let bridge = Command::new(bin())
        .args(["bridge", "run", "--listen", &listen, "--nats", &server.url, "--granularity", "batched"])
        .args(["--seconds", "8", "--stats-out", stats.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sub = Command::new(bin())
        .args([
            "subscribe",
            "--nats",
            &server.url,
            "--subject",
            "ff.itch.>",
            "--idle-s",
            "2",
            "--seconds",
            "20",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1_000));
    fairfeed(&["replay", pcap.to_str().unwrap(), "--to", &listen, "--rate", "4000"]);
    let sub = sub.wait_with_output().unwrap();
    let b = bridge.wait_with_output().unwrap();
    assert!(b.status.success());
    let s: serde_json::Value = serde_json::from_slice(&sub.stdout).unwrap();
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(r["route"]["messages"], 20_000, "{r}");
    assert_eq!(s["publications"], r["published"], "subscriber {s} vs bridge {r}");
    assert_eq!(s["messages"], 20_000, "every message");
    assert_eq!(s["duplicates"], 0);
    assert_eq!(s["missing"], 0);
}

/// A feed of 20,000 messages over 50 symbols and its A line with 2 % of
/// packets lost: (clean capture, lossy line, `decode --summary-json` of the line).
fn lossy_line(d: &tempfile::TempDir) -> (std::path::PathBuf, std::path::PathBuf, serde_json::Value) {
    let (x, a) = (d.path().join("x.pcap"), d.path().join("a.pcap"));
    let (xs, as_) = (x.to_str().unwrap(), a.to_str().unwrap());
    fairfeed(&[
        "gen",
        "--seed",
        "3",
        "--messages",
        "20000",
        "--symbols",
        "50",
        "--out",
        xs,
        "--a-out",
        as_,
        "--loss-a",
        "0.02",
    ]);
    let dec = json(&fairfeed(&["decode", as_, "--summary-json"]));
    assert!(dec["gaps"].as_u64() > Some(10), "{dec}");
    (x, a, dec)
}

/// A free loopback UDP address.
fn free_udp() -> String {
    free_addr(false).to_string()
}

/// `bridge run` at message granularity for 8 s, its report to `stats`.
fn bridge_run(listen: &str, url: &str, stats: &std::path::Path, extra: &[&str]) -> std::process::Child {
    Command::new(bin())
        .args(["bridge", "run", "--listen", listen, "--nats", url, "--granularity", "message"])
        .args(["--seconds", "8", "--stats-out", stats.to_str().unwrap()])
        .args(extra)
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Goal: packets lost before the bridge are visible, and told apart from
/// the broker's gaps. Method: a line A that lost 2 % of its packets
/// (`gen --loss-a`), replayed into the bridge; `decode --summary-json` of the
/// same capture counts its gaps independently; a subscriber to Add Orders
/// only (`ff.itch.*.*.A`, which does not cover the markers: it listens for
/// them on `--gaps` as well) must see every gap marker and no broker gap.
#[test]
fn feed_gaps_before_the_bridge_reach_subscribers_as_markers() {
    if !have_server() {
        return;
    }
    let d = tmp();
    let server = fairfeed_bridge::server::LocalServer::start(0, None).unwrap();
    let (_, a, dec) = lossy_line(&d);
    let listen = free_udp();
    let stats = d.path().join("bridge.json");
    let bridge = bridge_run(&listen, &server.url, &stats, &[]);
    let sub = Command::new(bin())
        .args(["subscribe", "--nats", &server.url, "--subject", "ff.itch.*.*.A", "--idle-s", "2", "--seconds", "20"])
        .arg("--json")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The same through the decoding library: one line per Add Order, one per feed gap.
    let decoded = Command::new(bin())
        .args(["subscribe", "--nats", &server.url, "--subject", "ff.itch.*.*.A", "--idle-s", "2", "--seconds", "20"])
        .arg("--decode")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1_000));
    fairfeed(&["replay", a.to_str().unwrap(), "--to", &listen, "--rate", "4000"]);
    let sub = sub.wait_with_output().unwrap();
    let decoded = String::from_utf8(decoded.wait_with_output().unwrap().stdout).unwrap();
    assert!(bridge.wait_with_output().unwrap().status.success());
    let s: serde_json::Value = serde_json::from_slice(&sub.stdout).unwrap();
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let adds = decoded.lines().filter(|l| l.contains(" type A locate ")).count();
    let gaps = decoded.lines().filter(|l| l.starts_with("FEED GAP: ")).count();
    assert_eq!((adds as u64, gaps as u64), (dec["types"]["A"].as_u64().unwrap(), dec["gaps"].as_u64().unwrap()));
    assert!(!decoded.contains("BROKER GAP"), "no broker gap");
    assert_eq!(r["route"]["feed_gaps"], dec["gaps"], "bridge {r} vs decode {dec}");
    assert_eq!(r["route"]["feed_gap_messages"], dec["missing_messages"], "{r}");
    assert_eq!(s["feed_gaps"], dec["gaps"], "the subscriber got every marker: {s}");
    assert_eq!(s["feed_gap_messages"], dec["missing_messages"], "{s}");
    assert_eq!((s["missing"].as_u64(), s["duplicates"].as_u64()), (Some(0), Some(0)), "no broker gap: {s}");
    assert_eq!(s["messages"], dec["types"]["A"], "every Add Order that reached the bridge: {s}");
}

/// Goal: with `--retransmit`, the bridge fills the gaps of a line that lost
/// 2 % of its packets from a MoldUDP64 retransmission server before
/// publishing, so a subscriber sees every message and no feed gap. Method:
/// the lossy line of `gen --loss-a` replayed into `bridge run --retransmit`,
/// `retransmit-server` serving the clean capture; counts against `decode` of
/// the clean capture.
#[test]
fn the_bridge_fills_feed_gaps_from_a_retransmission_server() {
    if !have_server() {
        return;
    }
    let d = tmp();
    let server = fairfeed_bridge::server::LocalServer::start(0, None).unwrap();
    let (x, a, lossy) = lossy_line(&d);
    let clean = json(&fairfeed(&["decode", x.to_str().unwrap(), "--summary-json"]));
    let (listen, retrans) = (free_udp(), free_udp());
    let mut rs = Command::new(bin())
        .args(["retransmit-server", "--journal", x.to_str().unwrap(), "--listen", &retrans, "--max-seconds", "30"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stats = d.path().join("bridge.json");
    let bridge = bridge_run(&listen, &server.url, &stats, &["--retransmit", &retrans]);
    let sub = Command::new(bin())
        .args(["subscribe", "--nats", &server.url, "--subject", "ff.itch.*.*.A"])
        .args(["--idle-s", "2", "--seconds", "20", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1_000));
    fairfeed(&["replay", a.to_str().unwrap(), "--to", &listen, "--rate", "4000"]);
    let sub = sub.wait_with_output().unwrap();
    assert!(bridge.wait_with_output().unwrap().status.success());
    let _ = rs.kill();
    let _ = rs.wait();
    let s: serde_json::Value = serde_json::from_slice(&sub.stdout).unwrap();
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert!(r["fill"]["requests"].as_u64() > Some(0), "the bridge asked for the gaps: {r}");
    assert_eq!(r["route"]["feed_gaps"], 0, "every gap filled before publishing: {r}");
    assert_eq!(s["feed_gaps"], 0, "{s}");
    assert_eq!(s["messages"], clean["types"]["A"], "every Add Order of the clean feed: {s}");
    assert_eq!((s["missing"].as_u64(), s["duplicates"].as_u64()), (Some(0), Some(0)), "{s}");
    eprintln!("line gaps {}, fill {}, subscriber {s}", lossy["gaps"], r["fill"]);
}

/// Goal: `bridge run` and `subscribe` log in to a broker that requires it,
/// with the secret from a file, and a wrong one is refused in one line naming
/// the reason. Method: nats-server with a configuration that requires a
/// user and password (TLS and nkeys: `crates/bridge/tests/secure.rs`).
#[test]
fn bridge_and_subscriber_log_in_and_a_wrong_password_is_refused() {
    if !have_server() {
        return;
    }
    let d = tmp();
    let conf = d.path().join("auth.conf");
    std::fs::write(&conf, "authorization {\n  user: \"feed\"\n  password: \"s3cret-pw\"\n}\n").unwrap();
    let server = fairfeed_bridge::server::LocalServer::start_with(0, None, &["-c", conf.to_str().unwrap()]).unwrap();
    let (pw, bad) = (d.path().join("pw"), d.path().join("bad"));
    std::fs::write(&pw, "s3cret-pw\n").unwrap();
    std::fs::write(&bad, "guess\n").unwrap();
    let login = |file: &std::path::Path| {
        ["--nats-user".to_string(), "feed".into(), "--nats-password-file".into(), file.display().to_string()]
    };
    let pcap = d.path().join("feed.pcap");
    fairfeed(&["gen", "--seed", "2", "--messages", "3000", "--symbols", "10", "--out", pcap.to_str().unwrap()]);
    let listen = format!("127.0.0.1:{}", free_port(false));
    let stats = d.path().join("bridge.json");
    let bridge = Command::new(bin())
        .args(["bridge", "run", "--listen", &listen, "--nats", &server.url, "--seconds", "5"])
        .args(["--stats-out", stats.to_str().unwrap()])
        .args(login(&pw))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sub = Command::new(bin())
        .args(["subscribe", "--nats", &server.url, "--idle-s", "2", "--seconds", "15", "--json"])
        .args(login(&pw))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1_000));
    fairfeed(&["replay", pcap.to_str().unwrap(), "--to", &listen, "--rate", "3000"]);
    let sub = sub.wait_with_output().unwrap();
    assert!(bridge.wait_with_output().unwrap().status.success());
    let s: serde_json::Value = serde_json::from_slice(&sub.stdout).unwrap();
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert!(r["published"].as_u64() > Some(0) && s["publications"] == r["published"], "{s} {r}");

    let wrong = Command::new(bin())
        .args(["subscribe", "--nats", &server.url, "--seconds", "1"])
        .args(login(&bad))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(1), "{err}");
    assert!(err.contains("authorization violation") && err.trim().lines().count() == 1, "{err}");
    // A user without a password file is refused at parse time.
    let o = Command::new(bin()).args(["subscribe", "--nats", &server.url, "--nats-user", "feed"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Goal: the bench measures NATS's own Go client beside the bridge, same
/// load, same server, same run (the peer baseline). Method: build
/// tools/natsbase with scripts/natsbase.sh (skipped without Go), one short
/// bench row with `--baseline`.
#[test]
fn bridge_bench_runs_the_go_client_baseline_beside_it() {
    if !have_server() || !have_tool("go", &["version"]) {
        return;
    }
    let d = tmp();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/natsbase.sh");
    let o = Command::new("bash").arg(&script).env("CARGO_TARGET_DIR", d.path()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bin = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let out = fairfeed(&[
        "bridge",
        "bench",
        "--subscribers",
        "2",
        "--granularity",
        "message",
        "--rate",
        "500",
        "--seconds",
        "2",
        "--baseline",
        &bin,
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json(&out);
    let b = &v["baseline"];
    assert!(b["client"].as_str().is_some_and(|c| c.starts_with("nats.go")), "{v}");
    assert_eq!((b["subscribers"].as_u64(), b["lost"].as_u64(), v["lost"].as_u64()), (Some(2), Some(0), Some(0)), "{v}");
    let (bp, p) = (b["publications"].as_f64().unwrap(), v["publications"].as_f64().unwrap());
    assert!((bp - p).abs() <= p * 0.01 + 2.0, "the same load: {bp} vs {p}");
    assert!(v["p50_vs_baseline"].as_f64().is_some_and(|r| r > 0.0), "{v}");
}

/// The nats-server processes whose parent is `pid`.
fn servers_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        // pid (comm) state ppid ...
        let Some(close) = stat.rfind(')') else { continue };
        let comm = stat[stat.find('(').map_or(0, |i| i + 1)..close].to_string();
        let ppid = stat[close + 2..].split_whitespace().nth(1).and_then(|x| x.parse::<u32>().ok());
        if comm == "nats-server" && ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

fn gone(pid: u32, within: Duration) -> bool {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < within {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rfind(')').is_some_and(|c| !s[c + 2..].starts_with('Z')));
        if !alive {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn a_stopped_bench_leaves_no_broker_behind() {
    // SIGTERM once left the bench's nats-server running, and a Ctrl-C killed
    // the server while the bench ran on for minutes (issue 17).
    if !have_server() {
        return;
    }
    // A job started in the background by a non-interactive shell inherits
    // SIGINT ignored (and passes that on): then only TERM and KILL can be tried.
    let sigint_ignored = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|st| st.lines().find_map(|l| l.strip_prefix("SigIgn:").map(|v| v.trim().to_string())))
        .and_then(|hex| u64::from_str_radix(&hex, 16).ok())
        .is_some_and(|mask| mask & (1 << (2 - 1)) != 0);
    let sigs: Vec<&str> = [libc_sig::TERM, libc_sig::INT, libc_sig::KILL]
        .into_iter()
        .filter(|s| !(sigint_ignored && *s == libc_sig::INT))
        .collect();
    for sig in sigs {
        let mut bench = Command::new(bin())
            .args(["bridge", "bench", "--seconds", "60", "--rate", "1000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let mut servers = Vec::new();
        while servers.is_empty() && t0.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(100));
            servers = servers_of(bench.id());
        }
        assert_eq!(servers.len(), 1, "the bench's server");
        Command::new("kill").args([sig, &bench.id().to_string()]).status().unwrap();
        let status = bench.wait().unwrap();
        assert!(!status.success(), "{sig}: {status}");
        assert!(gone(servers[0], Duration::from_secs(5)), "{sig}: nats-server {} still running", servers[0]);
    }
}

mod libc_sig {
    pub const TERM: &str = "-TERM";
    pub const INT: &str = "-INT";
    pub const KILL: &str = "-KILL";
}
