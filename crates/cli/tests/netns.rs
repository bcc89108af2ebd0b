//! Goal: the tree works across real network interfaces, not just loopback.
//! Method: the test builds a switch namespace with a Linux bridge and one
//! namespace per node joined to it by a veth pair (10.231.0.0/24, reachable
//! only inside these namespaces), runs `fairfeed sender|proxy|receiver` in
//! them with the planner's topology, and checks that every receiver releases
//! every message once and never before its deadline (all namespaces share the
//! kernel's clock), then removes everything it created. Needs root and
//! iproute2: skipped loudly without them, a failure when
//! FAIRFEED_REQUIRE_NETNS=1 (scripts/test.sh sets it when run as root).

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

fn available() -> bool {
    let tag = format!("ff-probe-{}", std::process::id());
    let ok = ip(&["netns", "add", &tag]) && ip(&["netns", "del", &tag]);
    if !ok {
        let msg = "network namespaces are not available (needs root and iproute2)";
        if std::env::var("FAIRFEED_REQUIRE_NETNS").as_deref() == Ok("1") {
            panic!("{msg} and FAIRFEED_REQUIRE_NETNS=1");
        }
        eprintln!("SKIPPED: {msg}");
    }
    ok
}

/// A bridge in its own namespace and one namespace per node id, node i at 10.231.0.(i+1).
fn build(ids: &[u32]) -> (Namespaces, HashMap<u32, String>) {
    let tag = std::process::id() % 100_000;
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
        let (a, b) = (format!("ffa{i}x{tag}"), format!("ffb{i}x{tag}"));
        let (a, b) = (&a[..a.len().min(15)], &b[..b.len().min(15)]);
        must(&["link", "add", a, "type", "veth", "peer", "name", b]);
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
    let (_guard, map) = build(&ids);
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
