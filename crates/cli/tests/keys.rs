//! Goal: the tree key is rolled over while a 5,000 msg/s feed runs, without
//! a restart: nothing is lost, and no packet is refused — not during the
//! rollover window, not after it (issue 45, item 3; docs/SECURITY.md).
//! Method: a hedged tree as processes sharing one key file (as hosts share a
//! mounted Secret); mid-feed the operator's three edits, each an atomic
//! rename 0.8 s after the last: accept key 1 beside key 0, seal with key 1,
//! retire key 0. Counters come from each node's JSON at exit.

mod common;
use common::cluster::Cluster;
use std::time::Duration;

const RATE: u64 = 5_000;
const FEED_S: u64 = 4;

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn a_key_rollover_under_a_running_feed_loses_nothing_and_refuses_nothing() {
    let mut c = Cluster::plan(4, 2, 1, &["--loopback-port".into(), "9480".into()]);
    let old = std::fs::read_to_string(&c.key).unwrap();
    let new = "7e".repeat(32);
    for id in c.ids("receiver").into_iter().chain(c.ids("proxy")) {
        c.start(id, &["--link".into(), "cloud".into(), "--seconds".into(), "30".into()]);
    }
    let sender = c.ids("sender")[0];
    let (rate, secs) = (RATE.to_string(), FEED_S.to_string());
    let args: Vec<String> =
        ["--link", "cloud", "--rate", &rate, "--feed-seconds", &secs, "--start-delay-ms", "700", "--linger-ms", "1000"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    c.start(sender, &args);
    // Each step replaces the file at once (write, then rename), as a mounted Secret changes.
    let write = |text: String| {
        let tmp = c.key.with_extension("next");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &c.key).unwrap();
    };
    std::thread::sleep(Duration::from_millis(1_500));
    write(format!("# rollover, step 1: accept the next key\n0 {old} send\n1 {new}\n"));
    std::thread::sleep(Duration::from_millis(800));
    write(format!("# step 2: seal with it\n0 {old}\n1 {new} send\n"));
    std::thread::sleep(Duration::from_millis(800));
    write(format!("# step 3: retire the old key\n1 {new} send\n"));
    c.wait(sender, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    c.stop_all();
    let total = RATE * FEED_S;
    for node in &c.nodes {
        let s = c.stats(node.id);
        let a = &s["node"]["auth"];
        assert_eq!((n(&a["bad_tag"]), n(&a["unknown_key"]), n(&a["replayed"])), (0, 0, 0), "node {}: {a}", node.id);
        let k = &s["counters"]["keys"];
        assert_eq!((n(&k["send_id"]), k["ids"].clone()), (1, serde_json::json!([1])), "node {}: {k}", node.id);
        assert_eq!((n(&k["reloads"]), n(&k["reload_errors"])), (3, 0), "node {}: {k}", node.id);
        if node.role == "receiver" {
            assert_eq!(n(&s["node"]["released"]), total, "receiver {} lost messages in the rollover", node.id);
            assert_eq!(c.early_releases(node.id), 0, "receiver {}", node.id);
        }
    }
}
