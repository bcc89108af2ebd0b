//! Goal: a tree placed at run time by `fairfeed controller` (issue 43): no
//! topology file and no address typed — nodes register from the address
//! they have; a killed proxy is replaced by a spare within the dead-after
//! time and, with sibling hedging (H = 1), no receiver misses a message; a
//! receiver that joins mid-feed is placed under a proxy with room and
//! delivers from its first message on with no gap; a restarted proxy is
//! held down; forged registrations are refused.
//! Method: controller, sender, three proxies (two placed, one spare) and
//! four receivers as processes on 127.0.9.x, sealed with one tree key;
//! receiver 0's parent (read from the controller's `--topology-out`) is
//! killed with SIGKILL a second into the feed, and receiver 4 starts then.

mod common;
use common::*;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Procs(Vec<(String, Child)>);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
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

#[test]
fn nodes_join_a_controller_a_dead_proxy_is_replaced_and_a_late_receiver_starts_mid_feed() {
    let d = tmp();
    let dir = d.path();
    let key = dir.join("tree.key");
    std::fs::write(&key, "5a".repeat(32)).unwrap();
    let key = key.to_str().unwrap().to_string();
    let port = std::net::UdpSocket::bind("127.0.9.1:0").unwrap().local_addr().unwrap().port();
    let ctl = format!("127.0.9.1:{port}");
    let topo = dir.join("topology.toml");
    let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let mut procs = Procs(Vec::new());
    let spawn = |procs: &mut Procs, name: &str, args: Vec<String>| {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let c = Command::new(bin()).args(&args).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        procs.0.push((name.to_string(), c));
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    spawn(
        &mut procs,
        "controller",
        [
            s(&["controller", "--listen", &ctl, "--fanout", "3", "--hedge", "1", "--depth", "2"]),
            s(&["--dead-after-ms", "60", "--hold-down-ms", "3000", "--key-file", &key, "--seconds", "30"]),
            s(&["--topology-out", &out("topology.toml"), "--stats-out", &out("controller.json")]),
        ]
        .concat(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let node = |role: &str, id: u32, ip: &str, extra: &[&str]| -> Vec<String> {
        [
            s(&[role, "--controller", &ctl, "--bind", &format!("{ip}:0"), "--id", &id.to_string()]),
            s(&["--key-file", &key, "--idle", "park", "--stats-out", &out(&format!("{role}{id}.json"))]),
            s(extra),
        ]
        .concat()
    };
    // The sender first: its capacity of 2 places two proxies, the third is a spare.
    let feed = ["--rate", "2000", "--feed-seconds", "3", "--start-delay-ms", "2500", "--linger-ms", "1500"];
    spawn(&mut procs, "sender", node("sender", 100, "127.0.9.2", &[&["--capacity", "2"][..], &feed[..]].concat()));
    std::thread::sleep(Duration::from_millis(200));
    for p in [10, 11, 12] {
        spawn(&mut procs, &format!("proxy{p}"), node("proxy", p, &format!("127.0.9.{p}"), &["--seconds", "12"]));
    }
    for r in 0..4 {
        spawn(
            &mut procs,
            &format!("receiver{r}"),
            node("receiver", r, &format!("127.0.9.{}", 20 + r), &["--seconds", "12"]),
        );
    }
    let t0 = Instant::now();
    let t = loop {
        if let Some(t) = topology(&topo).filter(|t| placed_receivers(t) == 4) {
            break t;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "four receivers placed within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let victim = parent_of(&t, 0).expect("receiver 0 has a parent");
    assert!([10, 11, 12].contains(&victim), "{t}");
    // A second into the feed: kill receiver 0's parent, and start a late receiver.
    std::thread::sleep(
        Duration::from_millis(2_500 + 1_000).saturating_sub(t0.elapsed().min(Duration::from_millis(3_400))),
    );
    let (_, v) = procs.0.iter_mut().find(|(n, _)| *n == format!("proxy{victim}")).unwrap();
    v.kill().unwrap();
    let _ = v.wait();
    spawn(&mut procs, "receiver4", node("receiver", 4, "127.0.9.24", &["--seconds", "8"]));
    // A forged registration (another key) changes nothing.
    let forged = dir.join("forged.key");
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
    for (name, c) in &mut procs.0 {
        if name == "controller" || name == &format!("proxy{victim}") {
            continue;
        }
        let st = c.wait().unwrap();
        assert!(
            st.success(),
            "{name}: {st:?}: {}",
            std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
        );
    }
    let (_, c) = procs.0.iter_mut().find(|(n, _)| n == "controller").unwrap();
    let _ = c.kill();
    let _ = c.wait();
    let log = std::fs::read_to_string(dir.join("controller.log")).unwrap();
    assert!(log.contains(&format!("takes the place of {victim}")), "{log}");
    check_deliveries(dir);
}

/// Every receiver that was there got every message; the late one from when it joined, with no gap.
fn check_deliveries(dir: &std::path::Path) {
    let out = |name: &str| dir.join(name);
    let sent = {
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out("sender100.json")).unwrap()).unwrap();
        s["node"]["packets"].as_u64().unwrap()
    };
    assert_eq!(sent, 6_000);
    let stats = |r: u32| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(out(&format!("receiver{r}.json"))).unwrap()).unwrap()
    };
    for r in 0..4 {
        let s = stats(r);
        assert_eq!(s["node"]["released"].as_u64(), Some(sent), "receiver {r}: H = 1 loses nothing: {}", s["node"]);
        assert!(s["counters"]["membership"]["version"].as_u64() > Some(1), "receiver {r} followed new versions");
    }
    let late = stats(4);
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
    let d = tmp();
    let dir = d.path();
    let js = dir.join("js");
    let nats = fairfeed_bridge::server::LocalServer::start(0, Some(&js)).unwrap();
    let key = dir.join("tree.key");
    std::fs::write(&key, "6b".repeat(32)).unwrap();
    let key = key.to_str().unwrap().to_string();
    let free = |ip: &str| std::net::UdpSocket::bind((ip, 0)).unwrap().local_addr().unwrap().to_string();
    let (ca, cb) = (free("127.0.9.41"), free("127.0.9.42"));
    let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let mut procs = Procs(Vec::new());
    let spawn = |procs: &mut Procs, name: &str, args: Vec<String>| {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let c = Command::new(bin()).args(&args).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        procs.0.push((name.to_string(), c));
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    for (name, addr) in [("a", &ca), ("b", &cb)] {
        let args = [
            s(&["controller", "--listen", addr, "--fanout", "3", "--hedge", "1", "--depth", "2", "--name", name]),
            s(&["--store", &nats.url, "--lease-ms", "300", "--dead-after-ms", "60", "--key-file", &key]),
            s(&["--seconds", "30", "--topology-out", &out(&format!("topology-{name}.toml"))]),
            s(&["--stats-out", &out(&format!("controller-{name}.json"))]),
        ];
        spawn(&mut procs, &format!("controller-{name}"), args.concat());
        // a first: it takes the lease.
        std::thread::sleep(Duration::from_millis(700));
    }
    let both = format!("{ca},{cb}");
    let node = |role: &str, id: u32, ip: &str, extra: &[&str]| -> Vec<String> {
        [
            s(&[role, "--controller", &both, "--bind", &format!("{ip}:0"), "--id", &id.to_string()]),
            s(&["--key-file", &key, "--idle", "park", "--stats-out", &out(&format!("{role}{id}.json"))]),
            s(extra),
        ]
        .concat()
    };
    let feed = ["--rate", "2000", "--feed-seconds", "3", "--start-delay-ms", "3000", "--linger-ms", "1500"];
    spawn(&mut procs, "sender", node("sender", 100, "127.0.9.2", &[&["--capacity", "2"][..], &feed[..]].concat()));
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    for p in [10, 11] {
        spawn(&mut procs, &format!("proxy{p}"), node("proxy", p, &format!("127.0.9.{p}"), &["--seconds", "12"]));
    }
    for r in 0..4 {
        spawn(
            &mut procs,
            &format!("receiver{r}"),
            node("receiver", r, &format!("127.0.9.{}", 20 + r), &["--seconds", "12"]),
        );
    }
    while topology(&dir.join("topology-a.toml")).is_none_or(|t| placed_receivers(&t) < 4) {
        assert!(t0.elapsed() < Duration::from_secs(10), "controller a placed four receivers within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A second into the feed the leader dies; later a receiver joins and a proxy dies.
    std::thread::sleep(Duration::from_millis(3_200 + 1_000).saturating_sub(t0.elapsed()));
    let kill = |procs: &mut Procs, name: &str| {
        let (_, c) = procs.0.iter_mut().find(|(n, _)| n == name).unwrap();
        c.kill().unwrap();
        let _ = c.wait();
    };
    kill(&mut procs, "controller-a");
    std::thread::sleep(Duration::from_millis(700));
    spawn(&mut procs, "receiver4", node("receiver", 4, "127.0.9.24", &["--seconds", "8"]));
    kill(&mut procs, "proxy11");
    for (name, c) in &mut procs.0 {
        if name.starts_with("controller") || name == "proxy11" {
            continue;
        }
        let st = c.wait().unwrap();
        assert!(
            st.success(),
            "{name}: {st:?}: {}",
            std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
        );
    }
    let blog = std::fs::read_to_string(dir.join("controller-b.log")).unwrap();
    assert!(blog.contains("leading (term 2, 7 members)"), "b took over with the stored members:\n{blog}");
    assert!(blog.contains("Receiver 4 joined"), "the new leader placed the joiner:\n{blog}");
    assert!(blog.contains("11's 2 children moved"), "and repaired around the dead proxy:\n{blog}");
    let sent = 6_000;
    for r in 0..4 {
        let st: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out(&format!("receiver{r}.json"))).unwrap()).unwrap();
        assert_eq!(st["node"]["released"].as_u64(), Some(sent), "receiver {r}: {}", st["node"]);
    }
    let late: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out("receiver4.json")).unwrap()).unwrap();
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
    let s = json(&o);
    for k in [
        "lost",
        "duplicated",
        "repairs",
        "repair_p99_ms",
        "joins",
        "join_first_message_p99_ms",
        "books_equal",
        "pf_1us",
    ] {
        assert!(s.get(k).is_some(), "{k} missing: {s}");
    }
    assert_eq!(s["seeds"], 3);
    assert_eq!(s["per_seed"].as_array().unwrap().len(), 3);
    assert_eq!(s["lost_in_single_kills"], 0, "{s}");
    assert_eq!(s["duplicated"], 0);
    assert!(s["repairs"].as_u64() > Some(0) && s["kills"].as_u64() > Some(0), "{s}");
    assert!(s["pf_1us"].as_f64().is_some_and(|p| p > 0.5 && p <= 1.0), "{s}");
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
    use std::sync::atomic::{AtomicBool, Ordering};
    let d = tmp();
    let dir = d.path();
    let key = dir.join("tree.key");
    std::fs::write(&key, "3c".repeat(32)).unwrap();
    let key = key.to_str().unwrap().to_string();
    let ctl = std::net::UdpSocket::bind("127.0.9.51:0").unwrap().local_addr().unwrap().to_string();
    let snap = std::net::TcpListener::bind("127.0.9.52:0").unwrap().local_addr().unwrap().to_string();
    let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let mut procs = Procs(Vec::new());
    let spawn = |procs: &mut Procs, name: &str, args: Vec<String>| {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let c = Command::new(bin()).args(&args).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        procs.0.push((name.to_string(), c));
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    spawn(
        &mut procs,
        "controller",
        s(&["controller", "--listen", &ctl, "--fanout", "2", "--key-file", &key, "--seconds", "30"]),
    );
    std::thread::sleep(Duration::from_millis(300));
    let node = |role: &str, id: &str, ip: &str, extra: &[&str]| -> Vec<String> {
        [
            s(&[role, "--controller", &ctl, "--bind", &format!("{ip}:0"), "--id", id, "--key-file", &key]),
            s(&["--idle", "park", "--link", "cloud", "--stats-out", &out(&format!("{role}{id}.json"))]),
            s(extra),
        ]
        .concat()
    };
    let feed = ["--rate", "1500", "--feed-seconds", "6", "--start-delay-ms", "1500", "--linger-ms", "1500"];
    spawn(
        &mut procs,
        "sender",
        node("sender", "50", "127.0.9.52", &[&feed[..], &["--snapshot-listen", &snap]].concat()),
    );
    for (i, ip) in ["127.0.9.53", "127.0.9.54"].iter().enumerate() {
        spawn(&mut procs, &format!("proxy{i}"), node("proxy", "any", ip, &["--seconds", "14"]));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (sock, to) = delivery_socket();
    let early_got = collect_datagrams(sock, stop.clone());
    spawn(&mut procs, "early", node("receiver", "1", "127.0.9.55", &["--deliver", &to, "--seconds", "14"]));
    std::thread::sleep(Duration::from_millis(1_500 + 3_000));
    let (sock, to) = delivery_socket();
    let late_got = collect_datagrams(sock, stop.clone());
    spawn(
        &mut procs,
        "late",
        node("receiver", "2", "127.0.9.56", &["--deliver", &to, "--snapshot", &snap, "--seconds", "10"]),
    );
    for (name, c) in &mut procs.0 {
        if name == "controller" {
            continue;
        }
        let st = c.wait().unwrap();
        assert!(
            st.success(),
            "{name}: {st:?}: {}",
            std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let (want, first, end) = app_books(&early_got.join().unwrap());
    assert_eq!(first, 1);
    let (got, first, late_end) = app_books(&late_got.join().unwrap());
    let st: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out("receiver2.json")).unwrap()).unwrap();
    let join = &st["counters"]["join"];
    let log = |n: &str| std::fs::read_to_string(dir.join(format!("{n}.log"))).unwrap_or_default();
    assert_eq!(join["joined"], true, "{join}\n{}\n{}", log("sender"), log("late"));
    assert!(join["joined_at_sequence"].as_u64().unwrap() > 1_000 && first > 1_000, "{join}, line from {first}");
    assert_eq!(late_end, end, "both lines end at the feed's end");
    assert_eq!(got.diff(&want), None, "the late receiver's books are the early one's");
}
