//! Goal: the tree works across real network interfaces, not just loopback.
//! Method: the test builds a switch namespace with a Linux bridge and one
//! namespace per node joined to it by a veth pair (10.231.0.0/24, reachable
//! only inside these namespaces), runs `fairfeed sender|proxy|receiver` in
//! them with the planner's topology, and checks that every receiver releases
//! every message once and never before its deadline (all namespaces share the
//! kernel's clock), then removes everything it created. Needs root and
//! iproute2: skipped loudly without them, a failure when
//! FAIRFEED_REQUIRE_NETNS=1 (scripts/test.sh sets it when run as root).
//! The same with Jasper's XDP de-duplicator attached to every receiver's
//! veth, and `fairfeed bench xdp-dedup`, which makes its own namespaces.

#![allow(clippy::too_many_lines)] // scenario tests: one story, read top to bottom
mod common;
use common::cluster::Cluster;
use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::time::Duration;

fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().is_ok_and(|s| s.success())
}

fn must(args: &[&str]) {
    assert!(ip(args), "ip {} failed", args.join(" "));
}

/// Namespaces this test made; removed on drop (their veths go with them).
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Whether namespaces can be made here (probed once per process: the tests
/// run side by side and would race on one probe's name).
fn available() -> bool {
    static PROBED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *PROBED.get_or_init(|| {
        let tag = format!("ff-probe-{}", std::process::id());
        ip(&["netns", "add", &tag]) && ip(&["netns", "del", &tag])
    });
    if !ok {
        let msg = "network namespaces are not available (needs root and iproute2)";
        if std::env::var("FAIRFEED_REQUIRE_NETNS").as_deref() == Ok("1") {
            panic!("{msg} and FAIRFEED_REQUIRE_NETNS=1");
        }
        eprintln!("SKIPPED: {msg}");
    }
    ok
}

/// Node `i`'s interface in its namespace (built with `salt`).
fn iface(i: u32, salt: u32) -> String {
    let a = format!("ffa{i}x{}", tag(salt));
    a[..a.len().min(15)].to_string()
}

/// Names of one test's namespaces: the process and the test (`salt`).
fn tag(salt: u32) -> u32 {
    (std::process::id() % 40_000) * 2 + salt
}

/// A bridge in its own namespace and one namespace per node id, node i at
/// 10.231.0.(i+1); each veth with `queues` receive and transmit queues.
fn build(ids: &[u32], salt: u32, queues: u32) -> (Namespaces, HashMap<u32, String>) {
    let tag = tag(salt);
    let sw = format!("ffsw{tag}");
    let mut made = Namespaces(Vec::new());
    must(&["netns", "add", &sw]);
    made.0.push(sw.clone());
    must(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
    must(&["-n", &sw, "link", "set", "br0", "up"]);
    let mut map = HashMap::new();
    for &i in ids {
        let ns = format!("ffn{tag}-{i}");
        must(&["netns", "add", &ns]);
        made.0.push(ns.clone());
        let (a, b) = (iface(i, salt), format!("ffb{i}x{tag}"));
        let (a, b) = (&a[..], &b[..b.len().min(15)]);
        let q = queues.to_string();
        let multi = ["numtxqueues", &q, "numrxqueues", &q];
        let multi: &[&str] = if queues > 1 { &multi } else { &[] };
        must(&[&["link", "add", a][..], multi, &["type", "veth", "peer", "name", b], multi].concat());
        must(&["link", "set", a, "netns", &ns]);
        must(&["link", "set", b, "netns", &sw]);
        must(&["-n", &sw, "link", "set", b, "master", "br0", "up"]);
        must(&["-n", &ns, "addr", "add", &format!("10.231.0.{}/24", i + 1), "dev", a]);
        must(&["-n", &ns, "link", "set", a, "up"]);
        must(&["-n", &ns, "link", "set", "lo", "up"]);
        map.insert(i, ns);
    }
    (made, map)
}

#[test]
fn tree_delivers_fairly_across_namespaces_and_veth() {
    if !available() {
        return;
    }
    // Plan once to learn the ids, then again with every node's address.
    let probe = Cluster::plan(4, 2, 1, &[]);
    let ids: Vec<u32> = probe.nodes.iter().map(|n| n.id).collect();
    let addrs: Vec<String> =
        ids.iter().flat_map(|i| ["--address".to_string(), format!("{i}=10.231.0.{}:9400", i + 1)]).collect();
    let mut c = Cluster::plan(4, 2, 1, &addrs);
    let (_guard, map) = build(&ids, 0, 1);
    c.netns = Some(map);
    let common: Vec<String> = ["--seconds", "30"].iter().map(|s| s.to_string()).collect();
    for id in c.ids("receiver").into_iter().chain(c.ids("proxy")) {
        c.start(id, &common);
    }
    let sender = c.ids("sender")[0];
    let feed: Vec<String> = ["--rate", "1000", "--feed-seconds", "2", "--start-delay-ms", "700", "--linger-ms", "800"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    c.start(sender, &feed);
    c.wait(sender, Duration::from_secs(20));
    c.stop_all();
    for id in c.ids("receiver") {
        let s = c.stats(id);
        assert_eq!(s["node"]["released"].as_u64(), Some(2_000), "receiver {id}: {}", s["node"]);
        assert!(s["addr"].as_str().unwrap().starts_with("10.231.0."), "a real interface address");
        let seqs: BTreeSet<u64> = c.releases(id).iter().map(|r| r.0).collect();
        assert_eq!(seqs.len(), 2_000, "each message once at receiver {id}");
        assert_eq!(c.early_releases(id), 0, "receiver {id} released before a deadline");
    }
    let w = c.windows();
    assert_eq!(w.len(), 2_000);
    eprintln!("across namespaces: delivery window p50 {} ns, p99 {} ns", w[w.len() / 2], w[w.len() * 99 / 100]);
}

/// `GET /metrics` from inside namespace `ns` (the tree's addresses exist only there).
fn scrape_in(ns: &str, addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let ns = ns.to_string();
    std::thread::spawn(move || {
        fairfeed_xdp::netns::enter(&ns).unwrap();
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\nHost: fairfeed\r\n\r\n").unwrap();
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
    })
    .join()
    .unwrap()
}

/// `promtool check metrics` accepts `body` without a lint finding (where promtool is installed).
fn promtool_ok(body: &str) {
    use std::io::Write;
    use std::process::Stdio;
    if !common::have_tool("promtool", &["--version"]) {
        return;
    }
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
    assert!(o.status.success() && said.trim().is_empty(), "promtool: {said}");
}

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The kernel fast path in a tree across namespaces: XDP de-duplication at
/// every receiver and, with `tc`, TC replication at the sender and every
/// proxy; a layer-0 proxy killed mid-feed. Every receiver must release every
/// message once and never early; returns the receivers' and the
/// replicating nodes' stats.
/// Receive queues of each veth in the AF_XDP tree.
const AFXDP_QUEUES: u32 = 4;

fn kernel_path_tree(salt: u32, tc: bool, io: &str) -> (Cluster, Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let probe = Cluster::plan(6, 2, 1, &[]);
    let ids: Vec<u32> = probe.nodes.iter().map(|n| n.id).collect();
    let addrs: Vec<String> =
        ids.iter().flat_map(|i| ["--address".to_string(), format!("{i}=10.231.0.{}:9400", i + 1)]).collect();
    let mut c = Cluster::plan(6, 2, 1, &addrs);
    // AF_XDP on interfaces with several receive queues: its socket is on
    // queue 0, and what lands on the others must still arrive (the kernel's path).
    let (guard, map) = build(&ids, salt, if io == "afxdp" { AFXDP_QUEUES } else { 1 });
    c.netns = Some(map);
    let victim = c.nodes.iter().find(|n| n.role == "proxy" && n.layer == 0).unwrap().id;
    let args = |id: u32, flag: &str| -> Vec<String> {
        let mut a = vec!["--seconds".to_string(), "30".to_string(), "--io".to_string(), io.to_string()];
        a.extend(["--metrics".to_string(), format!("10.231.0.{}:9500", id + 1)]);
        if !flag.is_empty() {
            a.extend([flag.to_string(), iface(id, salt)]);
        }
        a
    };
    let rep = if tc { "--tc-replicate" } else { "" };
    // AF_XDP's steering program owns the XDP hook: de-duplication stays in user space.
    // `xdp-socket` picks its programs itself; `auto` picks AF_XDP here.
    let picks = matches!(io, "afxdp" | "xdp-socket" | "auto");
    let dedup = if picks { "" } else { "--xdp-dedup" };
    for id in c.ids("receiver") {
        c.start(id, &args(id, dedup));
    }
    for id in c.ids("proxy") {
        c.start(id, &args(id, rep));
    }
    let sender = c.ids("sender")[0];
    // The sender stops by itself when its feed is sent (no --seconds).
    let mut feed: Vec<String> = vec!["--io".to_string(), io.to_string()];
    if tc {
        feed.extend([rep.to_string(), iface(sender, salt)]);
    }
    feed.extend(
        ["--rate", "1000", "--feed-seconds", "3", "--start-delay-ms", "700", "--linger-ms", "800"].map(String::from),
    );
    c.start(sender, &feed);
    std::thread::sleep(Duration::from_millis(700 + 1_200));
    c.crash(victim);
    // Mid-feed, every node's kernel-path counters are on its /metrics, in a form promtool accepts.
    std::thread::sleep(Duration::from_millis(500));
    let ns = c.netns.clone().unwrap();
    for id in c.ids("receiver").into_iter().take(1).chain(c.ids("proxy").into_iter().filter(|&p| p != victim).take(1)) {
        let body = scrape_in(&ns[&id], format!("10.231.0.{}:9500", id + 1).parse().unwrap());
        let want = if io == "xdp-socket" {
            if c.node(id).role == "receiver" {
                "fairfeed_agent_xdp_duplicate_total"
            } else {
                "fairfeed_agent_tc_copies_total"
            }
        } else if matches!(io, "afxdp" | "auto") {
            "fairfeed_agent_afxdp_rx_frames_total"
        } else if c.node(id).role == "receiver" {
            "fairfeed_agent_xdp_duplicate_total"
        } else if tc {
            "fairfeed_agent_tc_copies_total"
        } else {
            "fairfeed_agent_packets_out_total"
        };
        assert!(body.contains(want), "node {id}: no {want} in\n{body}");
        promtool_ok(&body);
    }
    c.wait(sender, Duration::from_secs(20));
    c.stop_all();
    drop(guard);
    let mut rx = Vec::new();
    for id in c.ids("receiver") {
        let s = c.stats(id);
        assert_eq!(n(&s["node"]["released"]), 3_000, "receiver {id}: {}", s["node"]);
        let seqs: BTreeSet<u64> = c.releases(id).iter().map(|r| r.0).collect();
        assert_eq!(seqs.len(), 3_000, "each message once at receiver {id}");
        assert_eq!(c.early_releases(id), 0, "receiver {id} released before a deadline");
        rx.push(s);
    }
    let reps: Vec<serde_json::Value> = if tc {
        c.ids("proxy").into_iter().filter(|&p| p != victim).chain([sender]).map(|id| c.stats(id)).collect()
    } else {
        Vec::new()
    };
    (c, rx, reps)
}

/// Goal: with Jasper's XDP de-duplicator in front of every receiver, hedged
/// copies are dropped in the veth driver, and the tree still delivers every
/// message once and never early — also when a proxy dies and the hedges are
/// all that is left. Needs the eBPF program (clang at build time) as well.
#[test]
fn hedged_copies_are_dropped_in_the_kernel_and_a_proxy_crash_loses_nothing() {
    if !xdp_ready() {
        return;
    }
    let (_c, rx, _) = kernel_path_tree(1, false, "udp");
    let (mut dropped, mut user_dups) = (0, 0);
    for s in &rx {
        let x = &s["counters"]["xdp"];
        assert_eq!(n(&x["first"]) + n(&x["duplicate"]) + n(&x["tag_differs"]), n(&x["data"]), "{x}");
        assert_eq!(n(&x["tag_differs"]), 0, "{x}");
        assert!(n(&x["first"]) >= 3_000, "{x}");
        dropped += n(&x["duplicate"]);
        user_dups += n(&s["node"]["duplicates"]);
    }
    // Six receivers with a parent and a hedge parent each: a second copy of
    // every message at least while both live (the crash is a layer above).
    assert!(dropped >= 6 * 3_000 / 2, "hedged copies dropped in the driver: {dropped}");
    assert!(user_dups * 100 <= dropped, "user space still saw {user_dups} duplicates beside {dropped} in XDP");
    eprintln!("XDP dropped {dropped} hedged copies; user space saw {user_dups} duplicates");
}

/// Goal: the sender and every proxy send each data packet once and their
/// TC egress replicators make the other copies (on a bridge, each to its
/// own MAC), with XDP de-duplication at the receivers and a proxy crash:
/// nothing lost, nothing early, every copy the nodes left to the kernel made.
#[test]
fn the_kernel_replicates_and_deduplicates_and_a_proxy_crash_loses_nothing() {
    if !xdp_ready() {
        return;
    }
    let (_c, rx, reps) = kernel_path_tree(2, true, "udp");
    assert!(!reps.is_empty());
    for s in &reps {
        let t = &s["counters"]["tc"];
        assert_eq!(n(&t["failed"]), 0, "{t}");
        assert!(n(&t["copies"]) > 0, "{t}");
        assert_eq!(n(&t["copies"]), n(&s["counters"]["replicated_in_kernel"]), "node {}: {t}", s["id"]);
    }
    let dropped: u64 = rx.iter().map(|s| n(&s["counters"]["xdp"]["duplicate"])).sum();
    assert!(dropped >= 6 * 3_000 / 2, "the replicated hedge copies reached the receivers: {dropped}");
    eprintln!(
        "TC made {} copies at {} nodes; XDP dropped {dropped}",
        reps.iter().map(|s| n(&s["counters"]["tc"]["copies"])).sum::<u64>(),
        reps.len()
    );
}

fn xdp_ready() -> bool {
    if !available() {
        return false;
    }
    match fairfeed_xdp::built() {
        Ok(()) => true,
        Err(e) => {
            if std::env::var("FAIRFEED_REQUIRE_TOOLS").as_deref() == Ok("1") {
                panic!("{e} and FAIRFEED_REQUIRE_TOOLS=1");
            }
            eprintln!("SKIPPED: {e}");
            false
        }
    }
}

#[test]
fn bench_xdp_dedup_drops_the_extra_copies_and_loses_nothing() {
    if !xdp_ready() {
        return;
    }
    let out =
        common::fairfeed(&["bench", "xdp-dedup", "--hedge", "2", "--messages", "20000", "--rounds", "1", "--json"]);
    let r = common::json(&out);
    for k in ["copies", "dropped_in_kernel", "delivered", "lost", "cpu_ratio", "baseline_cpu_ns_per_delivered"] {
        assert!(r.get(k).is_some(), "{k} missing: {r}");
    }
    assert_eq!(n(&r["copies"]), 60_000, "{r}");
    assert_eq!(n(&r["delivered"]), 20_000, "{r}");
    assert_eq!(n(&r["lost"]), 0, "{r}");
    assert!(n(&r["dropped_in_kernel"]) * 100 >= 40_000 * 99, "{r}");
    assert_eq!(r["mode"], "native", "veth supports native XDP");
    assert_eq!(n(&r["baseline"][0]["user_duplicates"]), 40_000, "without XDP user space sees every copy: {r}");
}

#[test]
fn a_missing_xdp_interface_is_named_in_one_line() {
    if !xdp_ready() {
        return;
    }
    let c = Cluster::plan(2, 2, 0, &["--loopback-port".into(), "9560".into()]);
    let id = c.ids("receiver")[0].to_string();
    let topo = c.topo.display().to_string();
    let out = Command::new(common::bin())
        .args(["receiver", "--topology", &topo, "--id", &id, "--seconds", "1", "--xdp-dedup", "ffnosuch0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--xdp-dedup ffnosuch0") && err.contains("no network interface"), "{err}");
    let out = Command::new(common::bin())
        .args(["receiver", "--topology", &topo, "--id", &id, "--xdp-dedup", "an-interface-name-far-too-long"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "refused at parse time");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an interface name"));
    // A loopback node has no interface for AF_XDP or the eBPF programs:
    // refused in one line (never bound to the host's default route's NIC).
    for io in ["afxdp", "xdp-socket"] {
        let out = Command::new(common::bin())
            .args(["receiver", "--topology", &topo, "--id", &id, "--seconds", "1", "--io", io])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{io}: {err}");
        assert!(err.contains(&format!("--io {io}")) && err.contains("not loopback"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    // `auto` falls back, saying why, and runs.
    let out = Command::new(common::bin())
        .args(["receiver", "--topology", &topo, "--id", &id, "--seconds", "1", "--io", "auto"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("--io auto: node") && err.contains("not AF_XDP"), "{err}");
}

/// One short round of `bench proxy-pps --io IO` at F = 8, its JSON.
fn proxy_pps_json(io: &str) -> serde_json::Value {
    let args = ["bench", "proxy-pps", "--io", io, "--fanout", "8", "--rounds", "1", "--round-seconds", "0.5", "--json"];
    common::json(&common::fairfeed(&args))
}

#[test]
fn bench_proxy_pps_with_tc_replication_reports_beside_its_baseline() {
    if !xdp_ready() {
        return;
    }
    let r = proxy_pps_json("tc");
    for k in ["proxy_pps", "baseline_pps", "ratio", "packets_pps"] {
        assert!(r[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {r}");
    }
    assert_eq!(r["io"], "tc");
    // Seven clones per packet at F = 8; a clone the veth refuses (its queue
    // full: the far end's poll is behind) is counted, not lost silently.
    assert_eq!(n(&r["tc"]["copies"]) + n(&r["tc"]["failed"]), 7 * n(&r["tc"]["packets"]), "{r}");
    let bad = Command::new(common::bin()).args(["bench", "proxy-pps", "--io", "dpdk"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2), "no such path: refused at parse time");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("dpdk"));
}

/// Goal: every node sending and receiving through io_uring (the middle
/// rung, where eBPF is not allowed) runs the same tree, through the same
/// proxy crash.
#[test]
fn the_tree_on_io_uring_loses_nothing_when_a_proxy_crashes() {
    if !xdp_ready() {
        return;
    }
    let (c, rx, _) = kernel_path_tree(3, false, "uring");
    for s in &rx {
        assert_eq!(n(&s["counters"]["send_failed"]), 0, "{}", s["counters"]);
    }
    let s = c.stats(c.ids("sender")[0]);
    assert_eq!(n(&s["counters"]["feed_sent"]), 3_000);
    assert!(n(&s["counters"]["packets_out"]) >= 6_000, "{}", s["counters"]);
}

/// Goal: every node — sender, proxies, receivers — sending and receiving
/// through an AF_XDP socket on its veth (frames built and parsed in user
/// space, the kernel's IP/UDP stack skipped) runs the same tree through the
/// same proxy crash: every message once, never early, no frame malformed,
/// none dropped for want of ring room.
#[test]
fn the_tree_on_af_xdp_loses_nothing_when_a_proxy_crashes() {
    if !xdp_ready() {
        return;
    }
    let (c, rx, _) = kernel_path_tree(4, false, "afxdp");
    let mut via_kernel = 0;
    for s in &rx {
        let a = &s["counters"]["afxdp"];
        // Each receiver's two parents' flows land on any of the veth's queues.
        assert!(n(&a["rx_frames"]) + n(&a["rx_via_kernel"]) >= 3_000, "{a}");
        via_kernel += n(&a["rx_via_kernel"]);
        assert_eq!(n(&a["rx_malformed"]), 0, "{a}");
        assert_eq!(n(&a["tx_dropped"]), 0, "{a}");
        assert_eq!(n(&s["counters"]["send_failed"]), 0, "{}", s["counters"]);
    }
    // 12 flows into receivers over 4 queues each: all on queue 0 has odds 4^-12.
    assert!(via_kernel > 0, "datagrams on queues 1..{AFXDP_QUEUES} took the kernel's path and arrived");
    let s = c.stats(c.ids("sender")[0]);
    assert_eq!(n(&s["counters"]["feed_sent"]), 3_000);
    let a = &s["counters"]["afxdp"];
    // Two copies a message; the first few to a next hop the kernel had not
    // resolved yet went through its socket (which resolves it).
    assert!(n(&a["tx_frames"]) + n(&a["tx_via_kernel"]) >= 6_000, "{a}");
    assert!(n(&a["tx_frames"]) >= 5_900, "the sender's copies left as AF_XDP frames: {a}");
    for id in c.ids("proxy") {
        if let Some(a) = c.try_stats(id).map(|s| s["counters"]["afxdp"].clone()) {
            assert!(n(&a["tx_frames"]) > 0 && n(&a["rx_frames"]) + n(&a["rx_via_kernel"]) > 0, "proxy {id}: {a}");
        }
    }
}

/// Goal: the AF_XDP replication path of `bench proxy-pps` reports beside
/// its same-run baseline, with the socket's counters.
#[test]
fn bench_proxy_pps_with_af_xdp_reports_beside_its_baseline() {
    if !xdp_ready() {
        return;
    }
    let r = proxy_pps_json("afxdp");
    for k in ["proxy_pps", "baseline_pps", "ratio"] {
        assert!(r[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {r}");
    }
    assert_eq!(r["io"], "afxdp");
    assert_eq!(r["afxdp_mode"], "copy", "veth has no zero-copy: {r}");
    assert!(n(&r["afxdp"]["tx_frames"]) > 0, "{r}");
}

/// Goal: `--io xdp-socket` — Jasper's eBPF socket interface picked by role,
/// on the interface each node's address is on: the XDP de-duplicator at
/// every receiver, the TC replicator at the sender and every proxy, with no
/// interface named on the command line; and `--io auto` picks AF_XDP where
/// it can (root, clang, an interface). Both through a proxy crash.
#[test]
fn io_xdp_socket_and_auto_pick_the_kernel_paths_themselves() {
    if !xdp_ready() {
        return;
    }
    let (c, rx, _) = kernel_path_tree(5, false, "xdp-socket");
    let dropped: u64 = rx.iter().map(|s| n(&s["counters"]["xdp"]["duplicate"])).sum();
    assert!(dropped >= 6 * 3_000 / 2, "hedged copies dropped in the driver: {dropped}");
    let s = c.stats(c.ids("sender")[0]);
    assert!(n(&s["counters"]["tc"]["copies"]) >= 3_000, "the sender's TC replicator: {}", s["counters"]);
    let (c, rx, _) = kernel_path_tree(6, false, "auto");
    for s in rx.iter().chain([&c.stats(c.ids("sender")[0])]) {
        assert_eq!(s["counters"]["afxdp"]["mode"], "copy", "auto picked AF_XDP: {}", s["counters"]);
    }
}

/// Goal: the latency ladder over veth runs every back-end — sendmmsg,
/// io_uring, AF_XDP — in one run and reports each beside the udp row.
#[test]
fn bench_hop_latency_runs_every_back_end_over_veth() {
    if !xdp_ready() {
        return;
    }
    let out = common::fairfeed(&["bench", "hop-latency", "--samples", "300", "--rounds", "1", "--json"]);
    let r = common::json(&out);
    let rows = r["rows"].as_array().unwrap();
    let ios: Vec<&str> = rows.iter().map(|w| w["io"].as_str().unwrap()).collect();
    assert_eq!(ios, ["udp", "uring", "afxdp"]);
    for w in rows {
        assert_eq!(n(&w["samples"]) + n(&w["lost"]), 300, "{w}");
        assert!(n(&w["lost"]) <= 3, "{w}");
        assert!(w["rtt_p50_us"].as_f64().unwrap() > 0.0, "{w}");
    }
    assert_eq!(rows[0]["ratio_to_udp"].as_f64(), Some(1.0));
    let bad = Command::new(common::bin()).args(["bench", "hop-latency", "--io", "udp,udp"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("named twice"));
}
