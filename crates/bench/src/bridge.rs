//! Seed 001's experiment, redone with NATS: a generated feed (seed 001's
//! characterization: ~5 messages per packet, same-symbol bursts) replayed at a
//! fixed packet rate through the bridge into a local `nats-server`, with K
//! subscribers each subscribed to everything (as seed 001's clients were),
//! timing every publication from the bridge's ingress tag to its arrival.

use fairfeed_bridge::BridgeError;
use std::time::{Duration, Instant};

use fairfeed_feed::gen::{GenConfig, Generator};
use hdrhistogram::Histogram;
use serde::Serialize;

use fairfeed_bridge::publish::{wall_ns, Bridge, PublishConfig};
use fairfeed_bridge::route::{By, Granularity, RouteConfig};
use fairfeed_bridge::server::LocalServer;
use fairfeed_bridge::subscribe::{subscribe, LatencyMs, StopWhen, SubscribeConfig, SubscribeReport};

/// Subscribers at most in one run.
pub const SUBSCRIBERS_MAX: usize = 64;
/// Packets one run generates at most (they are held in memory: ~0.5 GB here).
pub const PACKETS_MAX: u64 = 2_000_000;

/// One row of the experiment.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub subscribers: usize,
    pub granularity: Granularity,
    pub by: By,
    pub rate_pps: f64,
    pub seconds: f64,
    /// Use this server instead of starting one.
    pub nats: Option<String>,
    pub seed: u64,
    /// The peer baseline: `tools/natsbase` (NATS's Go client), run after the
    /// bridge against the same server with the load the bridge published.
    pub baseline: Option<std::path::PathBuf>,
}

/// Its result: latency over all subscribers, and what was lost or repeated.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// `mean_ms`, `min_ms`, `p50_ms`, `p90_ms`, `p99_ms`, `max_ms` (top-level in JSON).
    #[serde(flatten)]
    pub latency: LatencyMs,
    /// Publications some subscriber never got (summed over subscribers).
    pub lost: u64,
    pub duplicates: u64,
    pub subscribers: usize,
    pub granularity: Granularity,
    pub by: By,
    pub rate_pps: f64,
    pub achieved_pps: f64,
    pub seconds: f64,
    pub packets: u64,
    pub messages: u64,
    /// Publications the bridge made (each subscriber should get all of them).
    pub publications: u64,
    pub publications_per_s: f64,
    pub dropped_overflow: u64,
    pub subjects: usize,
    pub per_subscriber: Vec<SubscribeReport>,
    /// The baseline's report (`p50_ms`, `p99_ms`, `lost`, … and its client), when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<serde_json::Value>,
    /// The bridge's p50 ÷ the baseline's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_vs_baseline: Option<f64>,
    /// Each side's CPU time per message (`None` where `/proc` cannot be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuReport>,
}

/// Where the CPU went, per message, over the feed (connection set-up left out).
///
/// The bridge's cost is its router (the caller's thread: MoldUDP64 parsing,
/// splitting, subjects, the tag) plus its publisher runtime (the NATS
/// client's encoding and the kernel's TCP sends); the subscribers' is their
/// runtime's (the kernel's TCP receives, the client's parsing, the tally).
/// User and system times have the kernel's tick resolution (10 ms here), so
/// they mean something over runs of seconds; `*_ns` totals are exact.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuReport {
    /// Router CPU per message routed, ns (thread CPU clock around each packet).
    pub route_ns_per_message: f64,
    /// … per publication made.
    pub route_ns_per_publication: f64,
    /// Publisher runtime CPU per publication, ns.
    pub publisher_ns_per_publication: f64,
    pub publisher_user_ns_per_publication: f64,
    pub publisher_system_ns_per_publication: f64,
    /// Router + publisher per publication: the bridge's whole cost.
    pub bridge_ns_per_publication: f64,
    /// Subscriber runtime CPU per publication delivered (summed over subscribers), ns.
    pub subscriber_ns_per_delivery: f64,
    pub subscriber_user_ns_per_delivery: f64,
    pub subscriber_system_ns_per_delivery: f64,
    /// The raw totals.
    pub route_ns: u64,
    pub publisher: fairfeed_bridge::cpu::ThreadsCpu,
    pub subscribers: fairfeed_bridge::cpu::ThreadsCpu,
    pub deliveries: u64,
}

impl CpuReport {
    fn new(
        route_ns: u64,
        publisher: fairfeed_bridge::cpu::ThreadsCpu,
        subscribers: fairfeed_bridge::cpu::ThreadsCpu,
        messages: u64,
        publications: u64,
        deliveries: u64,
    ) -> Self {
        let per = |ns: u64, n: u64| ns as f64 / n.max(1) as f64;
        CpuReport {
            route_ns_per_message: per(route_ns, messages),
            route_ns_per_publication: per(route_ns, publications),
            publisher_ns_per_publication: per(publisher.ns, publications),
            publisher_user_ns_per_publication: per(publisher.user_ns, publications),
            publisher_system_ns_per_publication: per(publisher.system_ns, publications),
            bridge_ns_per_publication: per(route_ns + publisher.ns, publications),
            subscriber_ns_per_delivery: per(subscribers.ns, deliveries),
            subscriber_user_ns_per_delivery: per(subscribers.user_ns, deliveries),
            subscriber_system_ns_per_delivery: per(subscribers.system_ns, deliveries),
            route_ns,
            publisher,
            subscribers,
            deliveries,
        }
    }
}

/// Runs the baseline `bin` against `url`: `subscribers` connections, the
/// bridge's publication rate, subjects and mean payload (tag included).
fn baseline(
    bin: &std::path::Path,
    url: &str,
    cfg: &BenchConfig,
    pubs_per_s: f64,
    subjects: usize,
    payload: usize,
) -> Result<serde_json::Value, BridgeError> {
    let mut child = std::process::Command::new(bin)
        .args(["-url", url, "-subscribers", &cfg.subscribers.to_string()])
        .args(["-rate", &format!("{pubs_per_s:.3}"), "-seconds", &cfg.seconds.to_string()])
        .args(["-subjects", &subjects.max(1).to_string(), "-payload", &payload.clamp(16, 65_536).to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| BridgeError::Bench(format!("starting the baseline {}: {e}", bin.display())))?;
    let limit = Duration::from_secs_f64(cfg.seconds * 3.0 + 60.0);
    let t0 = Instant::now();
    while child.try_wait().map_err(|e| BridgeError::Bench(e.to_string()))?.is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            return Err(BridgeError::Bench(format!("the baseline did not finish within {:.0} s", limit.as_secs_f64())));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().map_err(|e| BridgeError::Bench(e.to_string()))?;
    if !out.status.success() {
        return Err(BridgeError::Bench(format!(
            "the baseline failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| BridgeError::Bench(format!("the baseline's report: {e}")))?;
    if !v["p50_ms"].is_number() {
        return Err(BridgeError::Bench(format!("the baseline's report has no p50_ms: {v}")));
    }
    Ok(v)
}

fn feed(rate_pps: f64, seconds: f64, seed: u64) -> Result<Vec<Vec<u8>>, BridgeError> {
    let packets = (rate_pps * seconds).ceil() as usize;
    let g = Generator::new(GenConfig {
        seed,
        messages: (packets as u64 * 8).max(100),
        symbols: 500,
        ..GenConfig::default()
    })
    .map_err(|e| BridgeError::Bench(e.to_string()))?;
    Ok(g.map(|p| p.payload).filter(|p| p.len() > 20).take(packets).collect())
}

/// Sends `packets` into the bridge at `rate_pps`; returns the achieved rate
/// and the CPU time the bridge's router took (the pacing left out), ns.
fn replay(bridge: &mut Bridge, packets: &[Vec<u8>], rate_pps: f64, mut progress: impl FnMut(f64)) -> (f64, u64) {
    let gap = Duration::from_secs_f64(1.0 / rate_pps);
    let mut route_ns = 0;
    let t0 = Instant::now();
    for (i, p) in packets.iter().enumerate() {
        let due = gap * i as u32;
        loop {
            let el = t0.elapsed();
            if el >= due {
                break;
            }
            if due - el > Duration::from_micros(200) {
                std::thread::sleep(due - el - Duration::from_micros(100));
            } else {
                // Yield rather than spin: on a small machine the bridge's
                // runtime, the subscribers and the broker need the cores.
                std::thread::yield_now();
            }
        }
        let c0 = fairfeed_bridge::cpu::this_thread_ns();
        bridge.handle_packet(p, wall_ns());
        route_ns += fairfeed_bridge::cpu::this_thread_ns() - c0;
        if i % 1_000 == 0 {
            progress(i as f64 / packets.len() as f64);
        }
    }
    (packets.len() as f64 / t0.elapsed().as_secs_f64().max(1e-9), route_ns)
}

/// Latency quantiles of a histogram of µs, in ms (zeros when empty).
fn summary(all: &Histogram<u64>) -> LatencyMs {
    if all.is_empty() {
        return LatencyMs::default();
    }
    let ms = |us: u64| us as f64 / 1e3;
    LatencyMs {
        mean_ms: all.mean() / 1e3,
        min_ms: ms(all.min()),
        p50_ms: ms(all.value_at_quantile(0.5)),
        p90_ms: ms(all.value_at_quantile(0.9)),
        p99_ms: ms(all.value_at_quantile(0.99)),
        max_ms: ms(all.max()),
    }
}

/// A subscriber's task: its report and latency histogram.
type SubscriberTask = tokio::task::JoinHandle<Result<(SubscribeReport, Histogram<u64>), BridgeError>>;

/// Subscriber tasks, each subscribed to everything under `prefix` and ready,
/// on a runtime of their own (threads named [`fairfeed_bridge::cpu::SUBSCRIBER_THREAD`]).
fn subscribers(
    url: &str,
    prefix: &str,
    cfg: &BenchConfig,
) -> Result<(tokio::runtime::Runtime, Vec<SubscriberTask>), BridgeError> {
    let rt = fairfeed_bridge::cpu::named_runtime(2, fairfeed_bridge::cpu::SUBSCRIBER_THREAD)?;
    let sub_cfg = SubscribeConfig {
        url: url.to_string(),
        subject: format!("{prefix}.>"),
        jetstream: None,
        stop: StopWhen {
            idle: Some(Duration::from_secs(2)),
            after: Some(Duration::from_secs_f64(cfg.seconds + 120.0)),
            publications: None,
            flag: None,
        },
        gaps: None,
        security: Default::default(),
    };
    let mut tasks = Vec::new();
    let mut readies = Vec::new();
    for _ in 0..cfg.subscribers {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let c = sub_cfg.clone();
        tasks.push(rt.spawn(async move { subscribe(&c, Some(tx), |_, _| {}).await }));
        readies.push(rx);
    }
    rt.block_on(async {
        for r in readies {
            let _ = tokio::time::timeout(Duration::from_secs(10), r).await;
        }
    });
    Ok((rt, tasks))
}

/// A row's configuration, checked before anything starts (a wrong
/// baseline path costs no run).
fn check(cfg: &BenchConfig) -> Result<(), BridgeError> {
    if cfg.subscribers == 0 || cfg.subscribers > SUBSCRIBERS_MAX {
        return Err(BridgeError::Bench(format!("subscribers must be 1..={SUBSCRIBERS_MAX}")));
    }
    if !(cfg.rate_pps > 0.0 && cfg.seconds > 0.0) {
        return Err(BridgeError::Bench("rate and seconds must be positive".into()));
    }
    if let Some(b) = cfg.baseline.as_ref().filter(|b| !b.is_file()) {
        return Err(BridgeError::Bench(format!(
            "the baseline {} is not a file (build it with scripts/natsbase.sh)",
            b.display()
        )));
    }
    if cfg.rate_pps * cfg.seconds > PACKETS_MAX as f64 {
        return Err(BridgeError::Bench(format!(
            "--rate × --seconds is {:.0} packets; the bench holds its feed in memory and takes at most {PACKETS_MAX}",
            cfg.rate_pps * cfg.seconds
        )));
    }
    Ok(())
}

/// Runs one row.
pub fn run(cfg: &BenchConfig, progress: impl FnMut(f64)) -> Result<BenchReport, BridgeError> {
    check(cfg)?;
    let _server;
    let url = match &cfg.nats {
        Some(u) => u.clone(),
        None => {
            let s = LocalServer::start(0, None).map_err(|e| BridgeError::Bench(e.to_string()))?;
            let u = s.url.clone();
            _server = s;
            u
        }
    };
    let packets = feed(cfg.rate_pps, cfg.seconds, cfg.seed)?;
    let route = RouteConfig { granularity: cfg.granularity, by: cfg.by, ..RouteConfig::default() };
    let (rt, tasks) = subscribers(&url, &route.prefix, cfg)?;
    let mut bridge = Bridge::start(route, PublishConfig::new(&url))?;
    // Connections are up: what the threads used so far is set-up, not feed.
    let cpu0 = fairfeed_bridge::cpu::threads_cpu(fairfeed_bridge::cpu::PUBLISHER_THREAD)
        .zip(fairfeed_bridge::cpu::threads_cpu(fairfeed_bridge::cpu::SUBSCRIBER_THREAD));
    let (achieved, route_ns) = replay(&mut bridge, &packets, cfg.rate_pps, progress);
    let b = bridge.finish(Duration::from_secs(60));
    let mut per = Vec::new();
    let mut all = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
    for t in tasks {
        let (r, h) = rt.block_on(t).map_err(|e| BridgeError::Bench(e.to_string()))??;
        let _ = all.add(&h);
        per.push(r);
    }
    let subs_cpu = fairfeed_bridge::cpu::threads_cpu(fairfeed_bridge::cpu::SUBSCRIBER_THREAD);
    let publications = b.route.publications;
    let deliveries = per.iter().map(|r| r.publications).sum();
    let cpu = match (cpu0, b.publisher_cpu, subs_cpu) {
        (Some((p0, s0)), Some(p1), Some(s1)) => {
            Some(CpuReport::new(route_ns, p1.since(&p0), s1.since(&s0), b.route.messages, publications, deliveries))
        }
        _ => None,
    };
    let base = match &cfg.baseline {
        Some(bin) => {
            let payload = (b.route.payload_bytes / publications.max(1)) as usize + fairfeed_bridge::tag::TAG_LEN;
            Some(baseline(bin, &url, cfg, publications as f64 / cfg.seconds, b.route.subjects, payload)?)
        }
        None => None,
    };
    let lost = per.iter().map(|r| publications.saturating_sub(r.distinct)).sum();
    let duplicates = per.iter().map(|r| r.duplicates).sum();
    let latency = summary(&all);
    let p50 = latency.p50_ms;
    Ok(BenchReport {
        latency,
        lost,
        duplicates,
        subscribers: cfg.subscribers,
        granularity: cfg.granularity,
        by: cfg.by,
        rate_pps: cfg.rate_pps,
        achieved_pps: achieved,
        seconds: cfg.seconds,
        packets: b.route.packets,
        messages: b.route.messages,
        publications,
        publications_per_s: publications as f64 / cfg.seconds,
        dropped_overflow: b.dropped_overflow,
        subjects: b.route.subjects,
        per_subscriber: per,
        p50_vs_baseline: base.as_ref().and_then(|v| v["p50_ms"].as_f64()).filter(|&x| x > 0.0).map(|x| p50 / x),
        baseline: base,
        cpu,
    })
}
