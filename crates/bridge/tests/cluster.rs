//! Goal: on a NATS cluster — the distributed broker a bank runs when one is
//! not enough — the bridge survives the node it publishes through dying
//! mid-feed: JetStream (3 replicas) keeps every publication exactly once,
//! and core-NATS subscribers on the surviving nodes report exactly what the
//! outage lost.
//!
//! Method: three Debian nats-server processes on loopback joined by routes
//! (`--cluster`, `--routes`, one cluster name, JetStream on each with its own
//! store). The bridge is given node 1's URL only: it learns the other nodes
//! from node 1 and must fail over to them. Node 1 is killed a third of the
//! way through the feed and restarted later. Without nats-server the tests
//! say SKIPPED (and fail with FAIRFEED_REQUIRE_TOOLS=1).

mod common;
use common::have_server;

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use fairfeed_bridge::publish::{servers, wall_ns, Bridge, PublishConfig};
use fairfeed_bridge::route::{Granularity, RouteConfig};
use fairfeed_bridge::server::LocalServer;
use fairfeed_bridge::subscribe::{subscribe, StopWhen, SubscribeConfig, SubscribeReport};
use fairfeed_feed::gen::{GenConfig, Generator};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Three nodes joined by routes, JetStream on each (stores under `root`).
fn cluster(root: &Path) -> Vec<LocalServer> {
    let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let all = routes.iter().map(|p| format!("nats://127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    (0..3)
        .map(|k| {
            let store = root.join(format!("n{k}"));
            let (name, route) = (format!("ff-n{k}"), format!("nats://127.0.0.1:{}", routes[k]));
            let args = ["-n", &name, "--cluster_name", "ffcluster", "--cluster", &route, "--routes", &all];
            LocalServer::start_with(0, Some(&store), &args).unwrap()
        })
        .collect()
}

fn feed(messages: u64) -> Vec<Vec<u8>> {
    Generator::new(GenConfig { seed: 12, messages, symbols: 20, ..GenConfig::default() })
        .unwrap()
        .map(|p| p.payload)
        .collect()
}

/// A subscription to everything at `url` (from a stream's start, if given)
/// that ends 3 s after the last publication.
fn everything(url: &str, jetstream: Option<&str>) -> SubscribeConfig {
    SubscribeConfig {
        url: url.to_string(),
        subject: "ff.itch.>".into(),
        jetstream: jetstream.map(str::to_string),
        stop: StopWhen {
            idle: Some(Duration::from_secs(3)),
            after: Some(Duration::from_secs(90)),
            ..StopWhen::default()
        },
        gaps: None,
        security: Default::default(),
    }
}

/// Starts the bridge through `url`, retrying while the cluster forms (its
/// JetStream needs a meta leader before a stream can be created).
fn bridge(url: &str, jetstream: Option<&str>) -> Bridge {
    let t0 = Instant::now();
    loop {
        let mut cfg = PublishConfig::new(url);
        cfg.jetstream = jetstream.map(str::to_string);
        cfg.replicas = if jetstream.is_some() { 3 } else { 1 };
        cfg.overflow = fairfeed_bridge::publish::Overflow::Block;
        let route = RouteConfig { granularity: Granularity::Message, ..RouteConfig::default() };
        match Bridge::start(route, cfg) {
            Ok(b) => return b,
            Err(e) if t0.elapsed() < Duration::from_secs(30) => {
                eprintln!("cluster not ready: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("the cluster never took the bridge: {e}"),
        }
    }
}

/// Publishes `f` paced (≈ 5,000 packets/s), killing `victim` a third of the way in.
fn run_through_a_kill(b: &mut Bridge, f: &[Vec<u8>], victim: &mut LocalServer) {
    for (i, p) in f.iter().enumerate() {
        if i == f.len() / 3 {
            victim.kill();
        }
        b.handle_packet(p, wall_ns());
        if i % 10 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

#[test]
fn core_subscribers_on_surviving_nodes_count_exactly_what_a_dead_node_lost() {
    if !have_server() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mut nodes = cluster(root.path());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // One subscriber on each surviving node, connected to that node only.
    let mut subs = Vec::new();
    for n in &nodes[1..] {
        let cfg = everything(&n.url, None);
        let (tx, rx) = tokio::sync::oneshot::channel();
        subs.push(rt.spawn(async move { subscribe(&cfg, Some(tx), |_, _| {}).await }));
        rt.block_on(rx).unwrap();
    }
    let mut b = bridge(&nodes[0].url, None);
    std::thread::sleep(Duration::from_millis(500)); // the routes carry the subscriptions' interest
    let f = feed(20_000);
    run_through_a_kill(&mut b, &f, &mut nodes[0]);
    let report = b.finish(Duration::from_secs(30));
    assert!(report.disconnects >= 1, "the bridge saw its node die: {report:?}");
    let got: Vec<SubscribeReport> = subs.into_iter().map(|h| rt.block_on(h).unwrap().unwrap().0).collect();
    eprintln!("bridge {report:?}\nsubscribers {got:?}");
    for s in &got {
        // Every publication is either received or counted missing.
        assert_eq!(s.distinct + s.missing, report.published, "subscriber {s:?} vs bridge {report:?}");
        assert_eq!((s.duplicates, s.reordered), (0, 0), "{s:?}");
        assert!(s.distinct > report.published / 2, "the feed went on after the failover: {s:?}");
    }
    // (The two may differ by a publication or two: node 1 forwarded to each
    // over its own route, and died with either in flight.)
    nodes[0].revive().unwrap();
}

#[test]
fn jetstream_with_three_replicas_keeps_everything_through_a_node_death() {
    if !have_server() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mut nodes = cluster(root.path());
    let mut b = bridge(&nodes[0].url, Some("FFCLUSTER"));
    let f = feed(20_000);
    run_through_a_kill(&mut b, &f, &mut nodes[0]);
    let report = b.finish(Duration::from_secs(60));
    assert_eq!((report.given_up, report.dropped_overflow), (0, 0), "{report:?}");
    nodes[0].revive().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    // The revived node rejoins and the stream's replicas may re-elect their
    // leader: requests can time out meanwhile; try again.
    let t0 = Instant::now();
    let stored = loop {
        let r = rt.block_on(stream_messages(&nodes[2].url, "FFCLUSTER"));
        match r {
            Ok(n) => break n,
            Err(e) if t0.elapsed() < Duration::from_secs(40) => {
                eprintln!("stream info not yet: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("the stream never answered: {e}"),
        }
    };
    assert_eq!(stored, report.published, "the stream stores every acknowledged publication: {report:?}");
    // A late joiner on a node that never died reads the stream from its start,
    // until it has every publication: a pause while the consumer recreates
    // itself on a new leader is not the end of the stream.
    let mut cfg = everything(&nodes[2].url, Some("FFCLUSTER"));
    cfg.stop =
        StopWhen { publications: Some(report.published), after: Some(Duration::from_secs(60)), ..StopWhen::default() };
    let t0 = Instant::now();
    let (s, pubs) = loop {
        let mut pubs = Vec::new();
        let r = rt.block_on(subscribe(&cfg, None, |m, _| {
            pubs.push(fairfeed_bridge::tag::split(&m.payload).expect("tagged").1.pub_seq);
        }));
        match r {
            Ok((s, _)) => break (s, pubs),
            Err(e) if t0.elapsed() < Duration::from_secs(40) => {
                eprintln!("late joiner not yet: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("the stream never served a late joiner: {e}"),
        }
    };
    let distinct: HashSet<u64> = pubs.iter().copied().collect();
    eprintln!("bridge {report:?}\nlate joiner {s:?}");
    assert_eq!(distinct.len(), pubs.len(), "nothing stored twice: {s:?}");
    assert_eq!(distinct, (1..=report.published).collect::<HashSet<u64>>(), "nothing lost: {s:?} {report:?}");
    assert_eq!(s.missing, 0, "{s:?}");
}

/// How many messages the stream `name` holds, asked through `url`.
async fn stream_messages(url: &str, name: &str) -> Result<u64, String> {
    let c = async_nats::connect(url).await.map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(c);
    let mut s = js.get_stream(name).await.map_err(|e| e.to_string())?;
    Ok(s.info().await.map_err(|e| e.to_string())?.state.messages)
}

#[test]
fn a_url_list_names_a_clusters_nodes() {
    let s = servers("nats://127.0.0.1:4222, nats://127.0.0.1:4223,tls://10.0.0.3:4222").unwrap();
    assert_eq!(s.len(), 3);
    assert!(servers("nats://a:1,::not a url").is_err());
}
