//! Goal: a tree placed at run time by `fairfeed controller` (issue 43): no
//! topology file and no address typed — nodes register from the address
//! they have; a killed proxy is replaced by a spare within the dead-after
//! time and, with sibling hedging (H = 1), no receiver misses a message; a
//! receiver that joins mid-feed is placed under a proxy with room and
//! delivers from its first message on with no gap (or from a snapshot,
//! with equal books); forged registrations are refused; a follower
//! controller takes over from the store.
//! Method: a controller (or two), a sender, proxies and receivers as
//! processes on 127.0.9.x, sealed with one tree key; victims read from the
//! controller's `--topology-out` and killed with SIGKILL mid-feed.

mod common;
use common::*;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// One test's processes, logs and files in one directory; every process is
/// killed when the test ends, however it ends.
struct Run {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    key: String,
    procs: Vec<(String, Child)>,
}

impl Drop for Run {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Run {
    /// A directory with a tree key of 32 bytes `byte`.
    fn new(byte: &str) -> Run {
        let tmp = tmp();
        let dir = tmp.path().to_path_buf();
        let key = dir.join("tree.key");
        std::fs::write(&key, byte.repeat(32)).unwrap();
        Run { key: key.to_str().unwrap().to_string(), _tmp: tmp, dir, procs: Vec::new() }
    }

    fn out(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    fn stats(&self, file: &str) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(self.out(file)).unwrap()).unwrap()
    }

    /// `fairfeed ARGS` as `name`, its stderr in `name.log`.
    fn spawn(&mut self, name: &str, args: Vec<String>) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let c = Command::new(bin()).args(&args).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        self.procs.push((name.to_string(), c));
    }

    /// A node's arguments under the controllers `ctl` (its stats in ROLEID.json).
    fn node(&self, role: &str, id: &str, ip: &str, ctl: &str, extra: &[&str]) -> Vec<String> {
        let stats = self.out(&format!("{role}{id}.json"));
        [
            s(&[role, "--controller", ctl, "--bind", &format!("{ip}:0"), "--id", id]),
            s(&["--key-file", &self.key, "--idle", "park", "--stats-out", &stats]),
            s(extra),
        ]
        .concat()
    }

    fn kill(&mut self, name: &str) {
        let (_, c) = self.procs.iter_mut().find(|(n, _)| n == name).unwrap();
        c.kill().unwrap();
        let _ = c.wait();
    }

    /// Waits for every process but those `skip` names; each must succeed.
    fn wait_all_but(&mut self, skip: impl Fn(&str) -> bool) {
        let mut failed = Vec::new();
        for (name, c) in &mut self.procs {
            if skip(name) {
                continue;
            }
            let st = c.wait().unwrap();
            if !st.success() {
                failed.push(format!("{name}: {st:?}"));
            }
        }
        let logs: Vec<String> = failed.iter().map(|f| self.log(f.split(':').next().unwrap())).collect();
        assert!(failed.is_empty(), "{failed:?}\n{}", logs.join("\n---\n"));
    }
}

fn topology(p: &std::path::Path) -> Option<toml::Value> {
    std::fs::read_to_string(p).ok()?.parse().ok()
}

/// Node `id`'s parent in the controller's current topology.
fn parent_of(t: &toml::Value, id: i64) -> Option<i64> {
    let nodes = t["trees"][0]["nodes"].as_array()?;
    nodes.iter().find(|n| n["id"].as_integer() == Some(id))?.get("parent")?.as_integer()
}

fn placed_receivers(t: &toml::Value) -> usize {
    t["receiver_ids"].as_array().map_or(0, Vec::len)
}

/// Waits (10 s at most) until the topology in `file` places four receivers.
fn four_placed(file: &std::path::Path, t0: Instant) -> toml::Value {
    loop {
        if let Some(t) = topology(file).filter(|t| placed_receivers(t) == 4) {
            return t;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "four receivers placed within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The sender (id 100, capacity 2: two proxies placed) with a 3-s feed of
/// 6,000 messages after `delay_ms`, then proxies `proxies` and receivers
/// 0–3, each on its own 127.0.9.x.
fn start_tree(r: &mut Run, ctl: &str, delay_ms: &str, proxies: &[u32]) {
    let feed = ["--rate", "2000", "--feed-seconds", "3", "--start-delay-ms", delay_ms, "--linger-ms", "1500"];
    let args = r.node("sender", "100", "127.0.9.2", ctl, &[&["--capacity", "2"][..], &feed[..]].concat());
    r.spawn("sender", args);
    std::thread::sleep(Duration::from_millis(200));
    for &p in proxies {
        let args = r.node("proxy", &p.to_string(), &format!("127.0.9.{p}"), ctl, &["--seconds", "12"]);
        r.spawn(&format!("proxy{p}"), args);
    }
    for i in 0..4 {
        let args = r.node("receiver", &i.to_string(), &format!("127.0.9.{}", 20 + i), ctl, &["--seconds", "12"]);
        r.spawn(&format!("receiver{i}"), args);
    }
}

/// A controller on `ip` (fan-out `fanout`, hedging 1, two layers; a node
/// silent 60 ms is dead, held down 3 s), its topology and stats in the
/// run's directory; its address.
fn start_controller(r: &mut Run, ip: &str, fanout: &str) -> String {
    let port = std::net::UdpSocket::bind(format!("{ip}:0")).unwrap().local_addr().unwrap().port();
    let ctl = format!("{ip}:{port}");
    let args = [
        s(&["controller", "--listen", &ctl, "--fanout", fanout, "--hedge", "1", "--depth", "2"]),
        s(&["--dead-after-ms", "60", "--hold-down-ms", "3000", "--key-file", &r.key, "--seconds", "30"]),
        s(&["--topology-out", &r.out("topology.toml"), "--stats-out", &r.out("controller.json")]),
    ];
    r.spawn("controller", args.concat());
    ctl
}

#[test]
fn nodes_join_a_controller_a_dead_proxy_is_replaced_and_a_late_receiver_starts_mid_feed() {
    let mut r = Run::new("5a");
    let ctl = start_controller(&mut r, "127.0.9.1", "3");
    std::thread::sleep(Duration::from_millis(300));
    // The sender first: its capacity of 2 places two proxies, the third is a spare.
    start_tree(&mut r, &ctl, "2500", &[10, 11, 12]);
    let t0 = Instant::now();
    let t = four_placed(&r.dir.join("topology.toml"), t0);
    let victim = parent_of(&t, 0).expect("receiver 0 has a parent");
    assert!([10, 11, 12].contains(&victim), "{t}");
    // A second into the feed: kill receiver 0's parent, and start a late receiver.
    std::thread::sleep(Duration::from_millis(3_500).saturating_sub(t0.elapsed().min(Duration::from_millis(3_400))));
    r.kill(&format!("proxy{victim}"));
    let args = r.node("receiver", "4", "127.0.9.24", &ctl, &["--seconds", "8"]);
    r.spawn("receiver4", args);
    // A forged registration (another key) changes nothing.
    let forged = r.dir.join("forged.key");
    std::fs::write(&forged, "77".repeat(32)).unwrap();
    let o = Command::new(bin())
        .args(["receiver", "--controller", &ctl, "--bind", "127.0.9.30:0", "--id", "30", "--join-wait-s", "1"])
        .args(["--key-file", forged.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("gave a view within"), "{err}");
    // Everything ends by itself.
    let dead = format!("proxy{victim}");
    r.wait_all_but(|n| n == "controller" || n == dead);
    r.kill("controller");
    let log = r.log("controller");
    assert!(log.contains(&format!("takes the place of {victim}")), "{log}");
    let sent = r.stats("sender100.json")["node"]["packets"].as_u64().unwrap();
    assert_eq!(sent, 6_000);
    for i in 0..4 {
        let st = r.stats(&format!("receiver{i}.json"));
        assert_eq!(st["node"]["released"].as_u64(), Some(sent), "receiver {i}: H = 1 loses nothing: {}", st["node"]);
        assert!(st["counters"]["membership"]["version"].as_u64() > Some(1), "receiver {i} followed new versions");
    }
    let late = r.stats("receiver4.json");
    let got = late["node"]["released"].as_u64().unwrap();
    assert!(got > 500 && got < sent, "the late receiver delivers from when it joined: {got}");
    assert_eq!(late["node"]["gaps"].as_u64().unwrap_or(0), 0, "and has no gap: {}", late["node"]);
}

/// Goal: two controllers share the membership through NATS JetStream KV;
/// one leads by the store's compare-and-set on a lease. Killed, the leader
/// is replaced by the follower (a newer term, the stored members), the feed
/// never stops, and the new leader places a joiner and repairs around a
/// proxy killed after it took over — with H = 1, nobody misses a message.
#[test]
fn a_follower_controller_takes_over_from_the_store_and_the_feed_never_stops() {
    if fairfeed_bridge::server::find_server().is_none() {
        assert!(std::env::var("FAIRFEED_REQUIRE_TOOLS").as_deref() != Ok("1"), "nats-server is not installed");
        eprintln!("SKIPPED: nats-server is not installed");
        return;
    }
    let mut r = Run::new("6b");
    let nats = fairfeed_bridge::server::LocalServer::start(0, Some(&r.dir.join("js"))).unwrap();
    let free = |ip: &str| std::net::UdpSocket::bind((ip, 0)).unwrap().local_addr().unwrap().to_string();
    let (ca, cb) = (free("127.0.9.41"), free("127.0.9.42"));
    for (name, addr) in [("a", &ca), ("b", &cb)] {
        let args = [
            s(&["controller", "--listen", addr, "--fanout", "3", "--hedge", "1", "--depth", "2", "--name", name]),
            s(&["--store", &nats.url, "--lease-ms", "300", "--dead-after-ms", "60", "--key-file", &r.key]),
            s(&["--seconds", "30", "--topology-out", &r.out(&format!("topology-{name}.toml"))]),
        ];
        r.spawn(&format!("controller-{name}"), args.concat());
        if name == "a" {
            // a first: b starts once a holds the lease.
            let t0 = Instant::now();
            while !r.log("controller-a").contains("controller: leading") {
                assert!(t0.elapsed() < Duration::from_secs(10), "a leads within 10 s:\n{}", r.log("controller-a"));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let both = format!("{ca},{cb}");
    start_tree(&mut r, &both, "3000", &[10, 11]);
    let t0 = Instant::now();
    four_placed(&r.dir.join("topology-a.toml"), t0);
    // A second into the feed the leader dies; later a receiver joins and a proxy dies.
    std::thread::sleep(Duration::from_millis(3_200 + 1_000).saturating_sub(t0.elapsed()));
    r.kill("controller-a");
    std::thread::sleep(Duration::from_millis(700));
    let args = r.node("receiver", "4", "127.0.9.24", &both, &["--seconds", "8"]);
    r.spawn("receiver4", args);
    r.kill("proxy11");
    r.wait_all_but(|n| n.starts_with("controller") || n == "proxy11");
    let blog = r.log("controller-b");
    assert!(blog.contains("leading (term 2, 7 members)"), "b took over with the stored members:\n{blog}");
    assert!(blog.contains("Receiver 4 joined"), "the new leader placed the joiner:\n{blog}");
    assert!(blog.contains("11's 2 children moved"), "and repaired around the dead proxy:\n{blog}");
    for i in 0..4 {
        let st = r.stats(&format!("receiver{i}.json"));
        assert_eq!(st["node"]["released"].as_u64(), Some(6_000), "receiver {i}: {}", st["node"]);
    }
    let late = r.stats("receiver4.json");
    assert!(late["node"]["released"].as_u64() > Some(100), "{}", late["node"]);
}

/// `fairfeed bench churn` (issue 43's interface): the campaign in reduced
/// form — a few seeds of kills, restarts, joins and leaves simulated with
/// the controller's, members' and nodes' own cores — prints what was lost,
/// repeated and repaired; with H = 1 a single proxy's death loses nothing.
/// And `bench controller` places a tree from registrations.
#[test]
fn bench_churn_and_bench_controller_report_their_figures() {
    let o = fairfeed(&["bench", "churn", "--nodes", "16", "--seeds", "3", "--feed-seconds", "2", "--json"]);
    let c = json(&o);
    let keys = ["lost", "duplicated", "repairs", "repair_p99_ms", "joins", "join_first_message_p99_ms"];
    for k in keys.iter().chain(&["books_equal", "pf_1us"]) {
        assert!(c.get(k).is_some(), "{k} missing: {c}");
    }
    assert_eq!(c["seeds"], 3);
    assert_eq!(c["per_seed"].as_array().unwrap().len(), 3);
    assert_eq!(c["lost_in_single_kills"], 0, "{c}");
    assert_eq!(c["duplicated"], 0);
    assert!(c["repairs"].as_u64() > Some(0) && c["kills"].as_u64() > Some(0), "{c}");
    // Joiners fetched the sender's snapshot: their books are the whole feed's.
    assert!(c["books_checked"].as_u64() > Some(0), "{c}");
    assert_eq!(c["books_equal"], true, "{c}");
    assert_eq!(c["books_differ"], 0, "{c}");
    assert!(c["pf_1us"].as_f64().is_some_and(|p| p > 0.5 && p <= 1.0), "{c}");
    // On a link model nobody tuned the controller for (Pareto spikes), every
    // kill of one proxy: still nothing lost.
    let spikes = format!("{}/../../docs/models/pareto-spikes.toml", env!("CARGO_MANIFEST_DIR"));
    let args = ["bench", "churn", "--nodes", "16", "--seeds", "2", "--feed-seconds", "2", "--no-double-kills"];
    let o = fairfeed(&[&args[..], &["--latency-model", &spikes, "--json"]].concat());
    let c = json(&o);
    assert_eq!(c["double_kills"], 0, "{c}");
    assert_eq!(c["lost"], 0, "{c}");
    assert!(c["kills"].as_u64() > Some(0), "{c}");
    let o = fairfeed(&["bench", "controller", "--receivers", "1000", "--joins", "100", "--json"]);
    let c = json(&o);
    assert_eq!(c["receivers"], 1000);
    assert!(c["views_sent"].as_u64() > Some(1000) && c["joins_per_s"].as_f64() > Some(0.0), "{c}");
    // Bad values are refused at parse time, in one line.
    let o = Command::new(bin()).args(["bench", "churn", "--nodes", "3"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// Goal (issue 43, join): under a controller, a receiver that starts while
/// the market is open is placed, takes a snapshot from the sender's own
/// snapshot service, and hands its application the books of a receiver
/// that saw the whole feed — snapshot then live, one line, no gap, no repeat.
#[test]
fn a_receiver_joining_a_controller_mid_feed_starts_from_a_snapshot_with_equal_books() {
    let mut r = Run::new("3c");
    let ctl = std::net::UdpSocket::bind("127.0.9.51:0").unwrap().local_addr().unwrap().to_string();
    let snap = std::net::TcpListener::bind("127.0.9.52:0").unwrap().local_addr().unwrap().to_string();
    let args = s(&["controller", "--listen", &ctl, "--fanout", "2", "--key-file", &r.key, "--seconds", "30"]);
    r.spawn("controller", args);
    std::thread::sleep(Duration::from_millis(300));
    let feed = ["--rate", "1500", "--feed-seconds", "6", "--start-delay-ms", "1500", "--linger-ms", "1500"];
    let args = r.node(
        "sender",
        "50",
        "127.0.9.52",
        &ctl,
        &[&feed[..], &["--link", "cloud", "--snapshot-listen", &snap]].concat(),
    );
    r.spawn("sender", args);
    for (i, ip) in ["127.0.9.53", "127.0.9.54"].iter().enumerate() {
        let args = r.node("proxy", "any", ip, &ctl, &["--link", "cloud", "--seconds", "14"]);
        r.spawn(&format!("proxy{i}"), args);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (sock, to) = delivery_socket();
    let early_got = collect_datagrams(sock, stop.clone());
    let args = r.node("receiver", "1", "127.0.9.55", &ctl, &["--link", "cloud", "--deliver", &to, "--seconds", "14"]);
    r.spawn("early", args);
    std::thread::sleep(Duration::from_millis(1_500 + 3_000));
    let (sock, to) = delivery_socket();
    let late_got = collect_datagrams(sock, stop.clone());
    let extra = ["--link", "cloud", "--deliver", &to, "--snapshot", &snap, "--seconds", "10"];
    let args = r.node("receiver", "2", "127.0.9.56", &ctl, &extra);
    r.spawn("late", args);
    r.wait_all_but(|n| n == "controller");
    stop.store(true, Ordering::Relaxed);
    let (want, first, end) = app_books(&early_got.join().unwrap());
    assert_eq!(first, 1);
    let (got, first, late_end) = app_books(&late_got.join().unwrap());
    let st = r.stats("receiver2.json");
    let join = &st["counters"]["join"];
    assert_eq!(join["joined"], true, "{join}\n{}\n{}", r.log("sender"), r.log("late"));
    assert!(join["joined_at_sequence"].as_u64().unwrap() > 1_000 && first > 1_000, "{join}, line from {first}");
    assert_eq!(late_end, end, "both lines end at the feed's end");
    assert_eq!(got.diff(&want), None, "the late receiver's books are the early one's");
}

/// Goal: fairfeed's own clock sync under a controller. Every node of a
/// controller-placed tree runs `--clock sync`, three receivers on clocks
/// milliseconds off and drifting; receiver 0's parent is killed mid-feed
/// and it moves. Each node probes the neighbours its view names, follows
/// new views, and ends synchronized: its estimate of the injected offset
/// within its bound, and every message released.
#[test]
fn clock_sync_runs_under_a_controller_and_follows_a_moved_receiver() {
    let mut r = Run::new("6b");
    let ctl = start_controller(&mut r, "127.0.13.1", "2");
    std::thread::sleep(Duration::from_millis(300));
    let sync = ["--clock", "sync"];
    let feed = ["--rate", "1000", "--feed-seconds", "6", "--start-delay-ms", "2500", "--linger-ms", "1500"];
    let args = r.node("sender", "100", "127.0.13.2", &ctl, &[&["--capacity", "2"][..], &sync[..], &feed[..]].concat());
    r.spawn("sender", args);
    std::thread::sleep(Duration::from_millis(200));
    for p in [10, 11, 12] {
        let args = r.node(
            "proxy",
            &p.to_string(),
            &format!("127.0.13.{p}"),
            &ctl,
            &[&sync[..], &["--seconds", "12"]].concat(),
        );
        r.spawn(&format!("proxy{p}"), args);
    }
    let skews = [("3000000", "20"), ("-2000000", "-35"), ("500000", "5"), ("0", "0")];
    for (i, (offset, drift)) in skews.iter().enumerate() {
        let wrong = ["--clock-offset-ns", offset, "--clock-drift-ppm", drift, "--seconds", "12"];
        let args = r.node(
            "receiver",
            &i.to_string(),
            &format!("127.0.13.{}", 20 + i),
            &ctl,
            &[&sync[..], &wrong[..]].concat(),
        );
        r.spawn(&format!("receiver{i}"), args);
    }
    let t0 = Instant::now();
    let t = four_placed(&r.dir.join("topology.toml"), t0);
    let victim = parent_of(&t, 0).expect("receiver 0 has a parent");
    // Two seconds into the feed.
    std::thread::sleep(Duration::from_millis(4_500).saturating_sub(t0.elapsed().min(Duration::from_millis(4_400))));
    r.kill(&format!("proxy{victim}"));
    let dead = format!("proxy{victim}");
    r.wait_all_but(|n| n == "controller" || n == dead);
    r.kill("controller");
    let sent = r.stats("sender100.json")["node"]["packets"].as_u64().unwrap();
    assert_eq!(sent, 6_000);
    let mut bounded = 0;
    for i in 0..4 {
        let st = r.stats(&format!("receiver{i}.json"));
        let c = &st["node"]["clock"];
        assert_eq!(c["stats"]["synced"], true, "receiver {i}: {c}");
        let err = (c["offset_now_ns"].as_f64().unwrap() - c["injected_offset_ns"].as_f64().unwrap()).abs();
        let bound = c["bound_now_ns"].as_f64().unwrap();
        // Honest always; unknown (u64::MAX) only in the instant after a
        // pair of probes came late (a process held off the CPU on a busy
        // host: ABOVE_PAIRS), until the next pair says which clock moved.
        assert!(err <= bound && err < 20_000.0, "receiver {i}: {err:.0} ns off under a {bound}-ns bound: {c}");
        if bound < 1e6 {
            bounded += 1;
        } else {
            eprintln!("receiver {i}: bound unknown at its end (a late pair of probes): {c}");
        }
        assert!(c["stats"]["peers_used"].as_u64() >= Some(1), "receiver {i}: {c}");
        eprintln!("receiver {i}: {err:.0} ns off, bound {bound} ns, {} pairs", c["stats"]["pairs"]);
        assert_eq!(st["node"]["released"].as_u64(), Some(sent), "receiver {i}: {}", st["node"]);
    }
    assert!(bounded >= 2, "{bounded} of 4 receivers ended with a known bound");
    // Receiver 0 moved and probes its new parent.
    let moved = r.stats("receiver0.json");
    assert!(moved["counters"]["membership"]["version"].as_u64() > Some(1), "{}", moved["counters"]);
}
