//! `fairfeed bench clock-sync`: the tree's node agents on loopback, each with
//! a deliberately wrong clock (a random offset and drift), synchronizing over
//! real UDP with kernel receive timestamps. All agents share the host's one
//! true clock, so each node's error is known exactly: its estimate of its
//! offset from the reference minus the offset that was injected.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use fairfeed_clock::skew::Skew;
use fairfeed_clock::{SyncConfig, SyncMode};
use fairfeed_tree::node::{DeadlineRule, NodeConfig};
use fairfeed_tree::plan::{plan, PlanRequest, Role, Topology};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use fairfeed_io::idle::IdleStrategy;
use fairfeed_io::tuning::Tuning;
use fairfeed_net::tree::agent::AgentError;
use fairfeed_net::tree::agent::{run_agent, wall_ns, AgentConfig, ClockOpts, Job, ReceiverJob, SenderJob, Threading};

/// Nodes a run may start at most (threads on this host).
pub const NODES_MAX: usize = 128;

/// What to run.
#[derive(Debug, Clone)]
pub struct ClockBenchConfig {
    pub nodes: usize,
    /// Measured seconds, after the warm-up.
    pub seconds: f64,
    pub warmup_s: f64,
    /// Injected offsets uniform in ± this, ns; drifts in ± `max_drift_ppm`.
    pub max_offset_ns: i64,
    pub max_drift_ppm: f64,
    /// The feed the sender multicasts meanwhile, messages/s.
    pub rate_per_s: f64,
    pub seed: u64,
    /// Share of the nodes other than the reference whose clocks step by
    /// `step_ns` halfway through the measured seconds, announced as a
    /// host announces its own steps (at least one node when above 0).
    pub step_share: f64,
    pub step_ns: i64,
    /// The steps are told to nobody: only the probes can find them.
    pub step_silent: bool,
}

impl Default for ClockBenchConfig {
    fn default() -> Self {
        ClockBenchConfig {
            nodes: 8,
            seconds: 10.0,
            warmup_s: 10.0,
            max_offset_ns: 10_000_000,
            max_drift_ppm: 100.0,
            rate_per_s: 1_000.0,
            seed: 1,
            step_share: 0.0,
            step_ns: 0,
            step_silent: false,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ClockBenchReport {
    pub nodes: usize,
    /// |estimated − injected offset against the reference| over every
    /// non-reference node and sample after the warm-up, ns.
    pub error_p50_ns: f64,
    pub error_p99_ns: f64,
    pub error_max_ns: f64,
    pub samples: usize,
    /// Samples whose node reported itself synchronized ...
    pub synced_share: f64,
    /// ... and whose |error| was within the bound the node reported.
    pub within_bound_share: f64,
    /// Probe packets (sent + received) as a share of all packets, over all
    /// nodes, during the measured seconds (after the warm-up, whose first
    /// seconds probe fast).
    pub probe_share: f64,
    /// The same for the node where it is largest.
    pub probe_share_max: f64,
    pub pure_fraction: f64,
    pub warmup_s: f64,
    pub seconds: f64,
    pub max_offset_ns: i64,
    pub max_drift_ppm: f64,
    pub feed_rate_per_s: f64,
    /// Per node: id, role, median and largest |error| (ns), level, pure pairs.
    pub per_node: Vec<NodeError>,
    /// The first [`OUTSIDE_MAX`] samples whose |error| was beyond the bound
    /// the node reported.
    pub outside_bound: Vec<Outside>,
    /// The nodes whose clocks stepped (by `step_ns`, at `step_at_s` from
    /// the start; told to nobody when `step_silent`).
    pub stepped: Vec<u32>,
    pub step_ns: i64,
    pub step_silent: bool,
    pub step_at_s: f64,
    /// Over the stepped nodes' samples from the step on: the largest
    /// |error| (ns), the share in which the node said it was synchronized,
    /// and the share in which |error| was within the bound it reported.
    pub stepped_error_max_ns: f64,
    pub stepped_synced_share: f64,
    pub stepped_within_bound_share: f64,
}

/// Samples outside their bound a report lists at most.
pub const OUTSIDE_MAX: usize = 20;

/// A sample whose |error| was beyond the bound its node reported.
#[derive(Debug, Clone, Serialize)]
pub struct Outside {
    pub id: u32,
    /// Seconds from the start.
    pub at_s: f64,
    pub error_ns: f64,
    pub bound_ns: f64,
    pub synced: bool,
}

/// One node's errors in a run.
#[derive(Debug, Clone, Serialize)]
pub struct NodeError {
    pub id: u32,
    pub role: String,
    pub stepped: bool,
    pub error_p50_ns: f64,
    pub error_max_ns: f64,
    pub peers_used: u64,
    pub pure_pairs: u64,
    pub pairs: u64,
    pub probes_received: u64,
}

fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let socks: Vec<UdpSocket> = (0..n).map(|_| UdpSocket::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    socks.iter().map(|s| s.local_addr().map(|a| a.port())).collect()
}

/// A tree of about `nodes` nodes (fan-out 4, one proxy layer, hedging 1), with loopback addresses.
fn topology(nodes: usize) -> Result<Topology, ClockBenchError> {
    let mut receivers = nodes.saturating_sub(2).max(1);
    loop {
        let t = plan(&PlanRequest { receivers, fanout: Some(4), depth: Some(2), hedge: 1, cost_model: None, trees: 1 })
            .map_err(|e| ClockBenchError::Plan(e.to_string()))?;
        if t.trees[0].nodes.len() <= nodes || receivers == 1 {
            return Ok(t);
        }
        receivers -= 1;
    }
}

/// Runs the benchmark; `progress` is told the seconds elapsed.
pub fn clock_sync(c: &ClockBenchConfig, mut progress: impl FnMut(f64)) -> Result<ClockBenchReport, ClockBenchError> {
    if !(3..=NODES_MAX).contains(&c.nodes) {
        return Err(ClockBenchError::Nodes(c.nodes));
    }
    let mut topo = topology(c.nodes)?;
    let n = topo.trees[0].nodes.len();
    let ports = free_ports(2 * n)?;
    let mut max_id = 0;
    for (i, node) in topo.trees[0].nodes.iter_mut().enumerate() {
        node.addr = Some(format!("127.0.0.1:{}", ports[i]));
        max_id = max_id.max(node.id as usize);
    }
    let reference = topo.trees[0].nodes.iter().find(|n| n.role == Role::Sender).map_or(0, |n| n.id);
    let total_s = c.warmup_s + c.seconds;
    let step_at_s = c.warmup_s + c.seconds / 2.0;
    let (skews, stepped) = draw_clocks(c, &topo, max_id, reference, step_at_s);
    let stop = Arc::new(AtomicBool::new(false));
    let (handles, controls) = spawn_nodes(c, &topo, &ports, &skews, total_s, &stop)?;
    let asker = UdpSocket::bind("127.0.0.1:0")?;
    asker.set_read_timeout(Some(Duration::from_millis(200)))?;
    let start = wall_ns();
    let mut t = Samples::default();
    let mut last: Vec<serde_json::Value> = Vec::new();
    // Each node's first snapshot after the warm-up: counters are measured from it.
    let mut first: std::collections::BTreeMap<u32, serde_json::Value> = Default::default();
    while (wall_ns() - start) as f64 / 1e9 < total_s {
        thread::sleep(Duration::from_millis(200));
        let elapsed = (wall_ns() - start) as f64 / 1e9;
        progress(elapsed);
        let measuring = elapsed >= c.warmup_s;
        last.clear();
        for &(id, ctl) in &controls {
            let Some(v) = ask(&asker, ctl) else { continue };
            if measuring {
                first.entry(id).or_insert_with(|| v.clone());
            }
            let clock = &v["node"]["clock"];
            if measuring && id != reference {
                if let (Some(est), Some(at)) = (clock["offset_now_ns"].as_f64(), clock["true_ns"].as_u64()) {
                    let truth = skews[id as usize].error_at(at) - skews[reference as usize].error_at(at);
                    let after_step = stepped.contains(&id) && skews[id as usize].step_by(at).is_some();
                    t.take(id, elapsed, (est - truth).abs(), clock, after_step);
                }
            }
            last.push(v);
        }
    }
    stop.store(true, Ordering::Release);
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(ClockBenchError::Node(e)),
            Err(_) => return Err(ClockBenchError::Panicked),
        }
    }
    let Samples { errors, synced, within, asked, outside, by_node, after_step, after_synced, after_within, after_max } =
        t;
    let mut r = summarize(c, n, errors, (synced, within, asked), (&first, &last));
    let share = |k: usize| if after_step > 0 { k as f64 / after_step as f64 } else { 0.0 };
    (r.stepped_error_max_ns, r.stepped_synced_share, r.stepped_within_bound_share) =
        (after_max, share(after_synced), share(after_within));
    (r.step_ns, r.step_silent, r.step_at_s) =
        (c.step_ns, c.step_silent, if stepped.is_empty() { 0.0 } else { step_at_s });
    r.per_node = per_node(by_node, &last, &stepped);
    r.stepped = stepped;
    r.outside_bound = outside;
    Ok(r)
}

/// What the samples of the nodes' errors add up to.
#[derive(Default)]
struct Samples {
    errors: Vec<f64>,
    synced: usize,
    within: usize,
    asked: usize,
    outside: Vec<Outside>,
    by_node: std::collections::BTreeMap<u32, Vec<f64>>,
    /// Of them, on stepped nodes after their step.
    after_step: usize,
    after_synced: usize,
    after_within: usize,
    after_max: f64,
}

impl Samples {
    /// Node `id`'s error `e` at `at_s` s, against what its `clock` report says.
    fn take(&mut self, id: u32, at_s: f64, e: f64, clock: &serde_json::Value, after_step: bool) {
        self.errors.push(e);
        self.by_node.entry(id).or_default().push(e);
        self.asked += 1;
        let is_synced = clock["stats"]["synced"].as_bool() == Some(true);
        self.synced += usize::from(is_synced);
        let bound = clock["bound_now_ns"].as_f64().unwrap_or(f64::INFINITY);
        self.within += usize::from(e <= bound);
        if e > bound && self.outside.len() < OUTSIDE_MAX {
            self.outside.push(Outside { id, at_s, error_ns: e, bound_ns: bound, synced: is_synced });
        }
        if after_step {
            self.after_step += 1;
            self.after_synced += usize::from(is_synced);
            self.after_within += usize::from(e <= bound);
            self.after_max = self.after_max.max(e);
        }
    }
}

/// Each node's error figures, with its last report's counters.
fn per_node(
    by_node: std::collections::BTreeMap<u32, Vec<f64>>,
    last: &[serde_json::Value],
    stepped: &[u32],
) -> Vec<NodeError> {
    let mut out = Vec::new();
    for (id, mut e) in by_node {
        e.sort_by(f64::total_cmp);
        let snap = last.iter().find(|v| v["id"].as_u64() == Some(u64::from(id)));
        let st = snap.map(|v| v["node"]["clock"]["stats"].clone()).unwrap_or_default();
        out.push(NodeError {
            id,
            role: snap.and_then(|v| v["role"].as_str()).unwrap_or("?").to_string(),
            stepped: stepped.contains(&id),
            error_p50_ns: e[e.len() / 2],
            error_max_ns: e[e.len() - 1],
            peers_used: st["peers_used"].as_u64().unwrap_or(0),
            pure_pairs: st["pure_pairs"].as_u64().unwrap_or(0),
            pairs: st["pairs"].as_u64().unwrap_or(0),
            probes_received: st["probes_received"].as_u64().unwrap_or(0),
        });
    }
    out
}

/// Every node's injected clock (by id), and the nodes whose clocks step:
/// at `step_at_s`, a random share of the nodes other than the reference.
fn draw_clocks(
    c: &ClockBenchConfig,
    topo: &Topology,
    max_id: usize,
    reference: u32,
    step_at_s: f64,
) -> (Vec<Skew>, Vec<u32>) {
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(c.seed);
    let epoch = wall_ns();
    let mut skews = vec![Skew::NONE; max_id + 1];
    for s in skews.iter_mut() {
        *s = Skew::new(
            rng.gen_range(-c.max_offset_ns..=c.max_offset_ns),
            rng.gen_range(-c.max_drift_ppm..=c.max_drift_ppm),
            epoch,
        );
    }
    let mut stepped: Vec<u32> = Vec::new();
    if c.step_share > 0.0 && c.step_ns != 0 {
        let mut others: Vec<u32> = topo.trees[0].nodes.iter().map(|n| n.id).filter(|&i| i != reference).collect();
        let k = ((others.len() as f64 * c.step_share).ceil() as usize).clamp(1, others.len());
        for _ in 0..k {
            stepped.push(others.swap_remove(rng.gen_range(0..others.len())));
        }
        stepped.sort_unstable();
        for &id in &stepped {
            let s = &mut skews[id as usize];
            (s.step_ns, s.step_at_ns, s.step_silent) = (c.step_ns, epoch + (step_at_s * 1e9) as u64, c.step_silent);
        }
    }
    (skews, stepped)
}

type Spawned = (Vec<thread::JoinHandle<Result<(), AgentError>>>, Vec<(u32, SocketAddr)>);

/// Why the clock benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum ClockBenchError {
    #[error("nodes must be 3..={NODES_MAX}")]
    Nodes(usize),
    #[error("{0}")]
    Plan(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A node agent failed (its own error, as the node reports it).
    #[error("{0}")]
    Node(AgentError),
    #[error("a node thread panicked")]
    Panicked,
}

/// Starts one agent thread per node of `topo`; returns them and their control addresses.
fn spawn_nodes(
    c: &ClockBenchConfig,
    topo: &Topology,
    ports: &[u16],
    skews: &[Skew],
    total_s: f64,
    stop: &Arc<AtomicBool>,
) -> Result<Spawned, ClockBenchError> {
    let n = topo.trees[0].nodes.len();
    let mut handles = Vec::new();
    let mut controls: Vec<(u32, SocketAddr)> = Vec::new();
    for (i, node) in topo.trees[0].nodes.clone().into_iter().enumerate() {
        let control = SocketAddr::from(([127, 0, 0, 1], ports[n + i]));
        controls.push((node.id, control));
        let job = match node.role {
            Role::Sender => Job::Sender(SenderJob {
                payloads: (0..(c.rate_per_s * total_s) as usize).map(|k| (k as u64).to_be_bytes().to_vec()).collect(),
                rate_per_s: c.rate_per_s,
                start_delay_ns: 0,
                linger_ns: 0,
                retransmit_listen: None,
                listen: None,
                snapshot: None,
                deadlines_to: None,
            }),
            Role::Proxy => Job::Proxy,
            Role::Receiver => Job::Receiver(ReceiverJob::default()),
        };
        let cfg = AgentConfig {
            topology: Arc::new(topo.clone()),
            id: node.id,
            node: NodeConfig::default(),
            rule: DeadlineRule::Paper { margin_ns: 0 },
            auth: None,
            keys: None,
            link: None,
            seed: c.seed,
            // Many agents share two cores: they sleep between events; the
            // kernel's receive stamps keep the probes' arrival times exact.
            idle: IdleStrategy::Park,
            threads: Threading::One,
            tuning: Tuning::default(),
            control: Some(control),
            operator: None,
            max_seconds: Some(total_s + 1.0),
            resolve_wait: std::time::Duration::ZERO,
            job,
            stop: Arc::clone(stop),
            clock: ClockOpts {
                sync: SyncConfig { mode: SyncMode::Sync, ..SyncConfig::default() },
                random_peers: 2,
                skew: skews[node.id as usize],
                host_bound: None,
            },
            time: fairfeed_net::tree::agent::TimeBase::WALL,
            tap: None,
            board: None,
            extra: Vec::new(),
            shards: Default::default(),
            replicate: None,
            external: None,
            membership: None,
            io: fairfeed_io::send::Backend::Udp,
        };
        let h = thread::Builder::new()
            .name(format!("node-{}", node.id))
            .spawn(move || run_agent(&cfg, |_, _| {}).map(|_| ()))?;
        handles.push(h);
    }
    Ok((handles, controls))
}

/// The report from the sorted errors and the nodes' last snapshots.
fn summarize(
    c: &ClockBenchConfig,
    n: usize,
    mut errors: Vec<f64>,
    (synced, within, asked): (usize, usize, usize),
    (first, last): (&std::collections::BTreeMap<u32, serde_json::Value>, &[serde_json::Value]),
) -> ClockBenchReport {
    errors.sort_by(f64::total_cmp);
    let q = |p: f64| {
        if errors.is_empty() {
            f64::NAN
        } else {
            errors[((errors.len() as f64 * p).ceil() as usize).clamp(1, errors.len()) - 1]
        }
    };
    let (mut probes, mut packets, mut pairs, mut pure, mut worst) = (0u64, 0u64, 0u64, 0u64, 0.0f64);
    let g = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    let counts = |v: &serde_json::Value| {
        let st = &v["node"]["clock"]["stats"];
        [
            g(&st["probes_sent"]) + g(&st["probes_received"]),
            g(&v["counters"]["packets_in"]) + g(&v["counters"]["packets_out"]),
            g(&st["pairs"]),
            g(&st["pure_pairs"]),
        ]
    };
    for v in last {
        let now = counts(v);
        let id = v["id"].as_u64().and_then(|i| u32::try_from(i).ok());
        let then = id.and_then(|i| first.get(&i)).map_or([0; 4], counts);
        let d: Vec<u64> = now.iter().zip(then).map(|(a, b)| a.saturating_sub(b)).collect();
        probes += d[0];
        packets += d[1];
        pairs += d[2];
        pure += d[3];
        if d[1] > 0 {
            worst = worst.max(d[0] as f64 / d[1] as f64);
        }
    }
    ClockBenchReport {
        nodes: n,
        error_p50_ns: q(0.5),
        error_p99_ns: q(0.99),
        error_max_ns: errors.last().copied().unwrap_or(f64::NAN),
        samples: errors.len(),
        synced_share: if asked > 0 { synced as f64 / asked as f64 } else { 0.0 },
        within_bound_share: if asked > 0 { within as f64 / asked as f64 } else { 0.0 },
        probe_share: if packets > 0 { probes as f64 / packets as f64 } else { 0.0 },
        probe_share_max: worst,
        pure_fraction: if pairs > 0 { pure as f64 / pairs as f64 } else { 0.0 },
        warmup_s: c.warmup_s,
        seconds: c.seconds,
        max_offset_ns: c.max_offset_ns,
        max_drift_ppm: c.max_drift_ppm,
        feed_rate_per_s: c.rate_per_s,
        per_node: Vec::new(),
        outside_bound: Vec::new(),
        stepped: Vec::new(),
        step_ns: 0,
        step_silent: false,
        step_at_s: 0.0,
        stepped_error_max_ns: 0.0,
        stepped_synced_share: 0.0,
        stepped_within_bound_share: 0.0,
    }
}

/// Asks one node's control socket for its `stat` snapshot.
fn ask(sock: &UdpSocket, to: SocketAddr) -> Option<serde_json::Value> {
    sock.send_to(b"stat", to).ok()?;
    let mut buf = vec![0u8; 1 << 16];
    let (n, _) = sock.recv_from(&mut buf).ok()?;
    serde_json::from_slice(&buf[..n]).ok()
}

/// The run in a few lines, as `fairfeed bench clock-sync` prints it.
impl std::fmt::Display for ClockBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self;
        writeln!(
            f,
            "clock-sync, {} nodes on loopback (offsets ±{} ns, drifts ±{} ppm, {} s warm-up, {} s measured):\n  \
             |error| p50 {:.0} ns, p99 {:.0} ns, max {:.0} ns over {} samples ({:.1} % synced); \
             probes {:.2} % of packets; pure pairs {:.1} %",
            r.nodes,
            r.max_offset_ns,
            r.max_drift_ppm,
            r.warmup_s,
            r.seconds,
            r.error_p50_ns,
            r.error_p99_ns,
            r.error_max_ns,
            r.samples,
            r.synced_share * 100.0,
            r.probe_share * 100.0,
            r.pure_fraction * 100.0
        )?;
        if !r.stepped.is_empty() {
            writeln!(
                f,
                "  nodes {:?} stepped{} by {} ns at {:.1} s: from then on |error| max {:.0} ns, synchronized in {:.1} %, \
                 within their bound in {:.1} % of samples",
                r.stepped,
                if r.step_silent { " silently" } else { "" },
                r.step_ns,
                r.step_at_s,
                r.stepped_error_max_ns,
                r.stepped_synced_share * 100.0,
                r.stepped_within_bound_share * 100.0
            )?;
        }
        Ok(())
    }
}
