//! The discrete-event engine: a planned tree of the real node state machines,
//! virtual time, seeded randomness. Same seed and configuration, same result,
//! bit for bit.
//!
//! Each node has an egress queue: the copies it sends go out back to back,
//! `copy_us` apart, so the last of many copies leaves late — the effect that
//! makes trees beat direct unicast. Each copy then takes a hop delay drawn from
//! the link model (and may be lost). Receivers read their own clock (offset
//! and drift from the clock model) and release on it; delivery instants are
//! recorded in true time, so fairness figures include what clock sync costs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::rc::Rc;

use fairfeed_tree::node::{DeadlineRule, NodeConfig, Proxy, Receiver, Sender, Transmit};
use fairfeed_tree::plan::{Role, Topology};
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;
use serde::Serialize;

use crate::model::{Clock, ClockModel, LinkEmulator, LinkModel, ShareLast};

/// Messages a run may simulate at most (memory: ~40 bytes each).
pub const MESSAGES_MAX: u64 = 10_000_000;
/// Events a run may process at most: a bound on any run's time.
pub const EVENTS_MAX: u64 = 2_000_000_000;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    pub messages: u64,
    pub rate_per_s: f64,
    /// Messages at the start left out of the metrics (deadlines settle first).
    pub warmup_messages: u64,
    pub link: LinkModel,
    pub clock: ClockModel,
    pub node: NodeConfig,
    pub rule: DeadlineRule,
    /// A node that stops (crashes) at a time: (node id, true time ns).
    pub crash: Option<(u32, u64)>,
    /// A node that stalls — processes nothing, as in a long GC pause or a
    /// descheduled VM — from a time for a while: (node id, start ns, length ns).
    /// What reaches it meanwhile waits and is handled when it resumes.
    pub stall: Option<(u32, u64, u64)>,
    /// Latency spikes on one node: every copy it sends in a time window takes
    /// this much longer: (node id, start ns, length ns, extra ns).
    pub slow: Option<(u32, u64, u64, u64)>,
    /// Receivers whose every release is recorded ([`RunResult::tracked`]).
    pub track: Vec<u32>,
}

/// Releases recorded for tracked receivers at most.
pub const TRACKED_MAX: usize = 10_000_000;

/// One release at a tracked receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TrackedRelease {
    pub receiver: u32,
    pub sequence: u64,
    /// True time of the release.
    pub true_ns: u64,
    /// The receiver's clock at the release (what a trader there would stamp).
    pub local_ns: u64,
    pub late: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct MsgAgg {
    send_ns: u64,
    first_ns: u64,
    last_ns: u64,
    delivered: u32,
}

/// The measures of one run (names as in docs/ARCHITECTURE.md).
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub receivers: usize,
    pub messages: u64,
    /// Messages (after warm-up) some receiver never got.
    pub incomplete_messages: u64,
    /// (message, receiver) pairs never delivered.
    pub lost_deliveries: u64,
    /// Receivers that missed at least one message (after warm-up).
    pub receivers_with_loss: usize,
    /// Deliveries beyond one per (message, receiver): must be 0.
    pub repeated_deliveries: u64,
    pub oml_p50_us: f64,
    pub oml_p99_us: f64,
    pub dws_p50_us: f64,
    pub dws_p99_us: f64,
    /// Share of messages whose delivery window rounds to 0 µs (the paper's P(F)).
    pub pf_0us: f64,
    /// Share of messages whose delivery window is at most 1 µs.
    pub pf_1us: f64,
    pub hold_mean_us: f64,
    /// Share of (message, receiver) pairs that arrived after their deadline.
    pub late_fraction: f64,
    pub events: u64,
    /// Final deadline offset the sender used (OWD_G + margin), µs.
    pub deadline_offset_us: f64,
    /// Per-message OML and delivery window samples, µs (for CDFs).
    #[serde(skip)]
    pub oml_us: Vec<f64>,
    #[serde(skip)]
    pub dws_us: Vec<f64>,
    /// OML of every counted message in sending order, µs (OML over time).
    #[serde(skip)]
    pub oml_series_us: Vec<f64>,
    /// Each receiver's p50 and p99 one-way delay to delivery, µs (figure 9).
    #[serde(skip)]
    pub receiver_owd_p50_us: Vec<f64>,
    #[serde(skip)]
    pub receiver_owd_p99_us: Vec<f64>,
    /// Every release at the receivers in [`SimConfig::track`].
    #[serde(skip)]
    pub tracked: Vec<TrackedRelease>,
}

enum SimNode {
    Sender(Box<Sender>),
    Proxy(Box<Proxy>),
    Receiver(Box<Receiver>, Clock),
    Absent,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A packet reaches a node (index into the packet arena).
    Deliver { to: u32, packet: usize },
    /// The sender's next message.
    Send,
    /// A node's timer (stale when the node's timer moved meanwhile).
    Timer { node: u32 },
}

struct Net {
    now: u64,
    queue: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    order: u64,
    links: LinkEmulator,
    arena: Vec<Option<Rc<[u8]>>>,
    free: Vec<usize>,
    /// Deliveries on the queue.
    in_flight: u64,
}

impl Net {
    fn push_delivery(&mut self, at: u64, to: u32, rc: Rc<[u8]>) {
        let slot = match self.free.pop() {
            Some(i) => {
                self.arena[i] = Some(rc);
                i
            }
            None => {
                self.arena.push(Some(rc));
                self.arena.len() - 1
            }
        };
        self.order += 1;
        self.in_flight += 1;
        self.queue.push(Reverse((at, self.order, Ev::Deliver { to, packet: slot })));
    }
}

struct Tx<'a> {
    net: &'a mut Net,
    from: u32,
    last: ShareLast,
}

impl Transmit for Tx<'_> {
    fn send(&mut self, to: u32, bytes: &[u8]) {
        let rc = self.last.share(bytes);
        let n = &mut *self.net;
        for at in n.links.arrivals(n.now, self.from).into_iter().flatten() {
            n.push_delivery(at, to, rc.clone());
        }
    }
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let k = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[k] as f64 / 1e3
}

/// Runs one simulation of tree 0 of `topo`.
pub fn run(topo: &Topology, cfg: &SimConfig) -> RunResult {
    assert!(cfg.messages > 0 && cfg.messages <= MESSAGES_MAX, "messages must be 1..={MESSAGES_MAX}");
    assert!(cfg.rate_per_s > 0.0, "rate must be positive");
    let mut rng = ChaCha12Rng::seed_from_u64(cfg.seed);
    let (mut nodes, sender_id) = build_nodes(topo, cfg, &mut rng);
    let n_ids = nodes.len();
    let mut net = Net {
        now: 0,
        queue: BinaryHeap::new(),
        order: 0,
        links: LinkEmulator::new(cfg.link, rng, n_ids).with_slow(cfg.slow),
        arena: Vec::new(),
        free: Vec::new(),
        in_flight: 0,
    };
    let mut timer_at = vec![u64::MAX; n_ids];
    let mut msgs = vec![MsgAgg::default(); cfg.messages as usize + 1];
    // Per receiver (receiver ids are 0..N): delivery delays in ns, after warm-up.
    let mut tracked = vec![false; n_ids];
    for &id in &cfg.track {
        if let Some(t) = tracked.get_mut(id as usize) {
            *t = true;
        }
    }
    let mut owd = Logs { owd: vec![Vec::new(); topo.receivers], tracked, releases: Vec::new() };
    let gap_ns = (1e9 / cfg.rate_per_s) as u64;
    let mut sent = 0u64;
    net.queue.push(Reverse((0, 0, Ev::Send)));
    // Proxies and receivers start their report timers.
    for id in 0..n_ids as u32 {
        schedule(&nodes, &mut net, &mut timer_at, id);
    }
    let mut events = 0u64;
    let mut crashed = false;
    while let Some(Reverse((t, _, ev))) = net.queue.pop() {
        events += 1;
        assert!(events < EVENTS_MAX, "simulation exceeded {EVENTS_MAX} events");
        net.now = t;
        if let Some((victim, at)) = cfg.crash {
            if !crashed && t >= at {
                nodes[victim as usize] = SimNode::Absent;
                crashed = true;
            }
        }
        match ev {
            Ev::Send => {
                if let SimNode::Sender(s) = &mut nodes[sender_id as usize] {
                    let payload = sent.to_be_bytes();
                    let mut tx = Tx { net: &mut net, from: sender_id, last: ShareLast::default() };
                    let seq = s.handle_message(t, &payload, &mut tx);
                    if let Some(m) = msgs.get_mut(seq as usize) {
                        m.send_ns = t;
                        m.first_ns = u64::MAX;
                    }
                    s.update(t);
                }
                sent += 1;
                if sent < cfg.messages {
                    net.order += 1;
                    net.queue.push(Reverse((t + gap_ns, net.order, Ev::Send)));
                }
            }
            Ev::Deliver { to, packet } => {
                if let Some(resume) = stalled_until(cfg, to, t) {
                    // The node is paused: the packet waits in its socket buffer.
                    net.order += 1;
                    net.queue.push(Reverse((resume, net.order, Ev::Deliver { to, packet })));
                    continue;
                }
                let bytes = net.arena[packet].take().expect("live packet");
                net.free.push(packet);
                net.in_flight -= 1;
                let mut buf = bytes.to_vec();
                deliver(&mut nodes, &mut net, to, &mut buf, &mut msgs, &mut owd, cfg.warmup_messages);
                schedule(&nodes, &mut net, &mut timer_at, to);
            }
            Ev::Timer { node } => {
                if timer_at[node as usize] != t {
                    continue; // moved since
                }
                if let Some(resume) = stalled_until(cfg, node, t) {
                    timer_at[node as usize] = resume;
                    net.order += 1;
                    net.queue.push(Reverse((resume, net.order, Ev::Timer { node })));
                    continue;
                }
                timer_at[node as usize] = u64::MAX;
                fire(&mut nodes, &mut net, node, &mut msgs, &mut owd, cfg.warmup_messages);
                schedule(&nodes, &mut net, &mut timer_at, node);
            }
        }
        // Stop once everything sent has settled: no sends or deliveries left, only report timers.
        if sent >= cfg.messages && net.in_flight == 0 && !holding(&nodes) {
            break;
        }
    }
    let mut r = summarize(topo, cfg, &nodes, &msgs, events);
    (r.receiver_owd_p50_us, r.receiver_owd_p99_us) = receiver_quantiles(&mut owd.owd);
    r.tracked = owd.releases;
    r
}

/// Each receiver's p50 and p99 delivery delay, µs.
fn receiver_quantiles(owd: &mut [Vec<u32>]) -> (Vec<f64>, Vec<f64>) {
    let (mut p50, mut p99) = (Vec::with_capacity(owd.len()), Vec::with_capacity(owd.len()));
    for v in owd.iter_mut() {
        v.sort_unstable();
        let q = |p: f64| match v.len() {
            0 => 0.0,
            n => f64::from(v[((p * n as f64) as usize).min(n - 1)]) / 1e3,
        };
        p50.push(q(0.5));
        p99.push(q(0.99));
    }
    (p50, p99)
}

/// True while some receiver still holds a message.
fn holding(nodes: &[SimNode]) -> bool {
    nodes.iter().any(|n| matches!(n, SimNode::Receiver(r, _) if r.held() > 0))
}

/// Per-receiver delivery delays being collected, and the releases of tracked receivers.
struct Logs {
    owd: Vec<Vec<u32>>,
    tracked: Vec<bool>,
    releases: Vec<TrackedRelease>,
}

type OwdLog<'a> = &'a mut Logs;

/// When a stalled node resumes, if `id` is stalled at `t`.
fn stalled_until(cfg: &SimConfig, id: u32, t: u64) -> Option<u64> {
    match cfg.stall {
        Some((node, start, len)) if node == id && t >= start && t < start + len => Some(start + len),
        _ => None,
    }
}

/// The state machines of tree 0, indexed by node id; returns them and the sender's id.
fn build_nodes(topo: &Topology, cfg: &SimConfig, rng: &mut ChaCha12Rng) -> (Vec<SimNode>, u32) {
    let tree = &topo.trees[0];
    let n_ids = tree.nodes.iter().map(|n| n.id).max().unwrap_or(0) as usize + 1;
    let mut nodes: Vec<SimNode> = (0..n_ids).map(|_| SimNode::Absent).collect();
    let mut sender_id = 0;
    for n in &tree.nodes {
        nodes[n.id as usize] = match n.role {
            Role::Sender => {
                sender_id = n.id;
                SimNode::Sender(Box::new(Sender::new(n.id, n.children.clone(), cfg.node, cfg.rule)))
            }
            Role::Proxy => SimNode::Proxy(Box::new(Proxy::new(
                n.id,
                n.parent.unwrap_or(sender_id),
                &n.children,
                &n.hedge_targets,
                cfg.node,
            ))),
            Role::Receiver => SimNode::Receiver(
                Box::new(Receiver::new(n.id, n.parent.unwrap_or(sender_id), cfg.node)),
                Clock::draw(&cfg.clock, rng),
            ),
        };
    }
    (nodes, sender_id)
}

fn deliver(
    nodes: &mut [SimNode],
    net: &mut Net,
    to: u32,
    buf: &mut [u8],
    msgs: &mut [MsgAgg],
    owd: OwdLog,
    warmup: u64,
) {
    let t = net.now;
    match &mut nodes[to as usize] {
        SimNode::Sender(s) => s.handle_report(t, buf),
        SimNode::Proxy(p) => {
            let mut tx = Tx { net, from: to, last: ShareLast::default() };
            p.handle_packet(t, buf, &mut tx);
        }
        SimNode::Receiver(r, clock) => {
            r.handle_packet(clock.local(t), buf);
            drain(r, (t, clock.local(t)), msgs, owd, warmup);
        }
        SimNode::Absent => {}
    }
}

fn fire(nodes: &mut [SimNode], net: &mut Net, id: u32, msgs: &mut [MsgAgg], owd: OwdLog, warmup: u64) {
    let t = net.now;
    match &mut nodes[id as usize] {
        SimNode::Proxy(p) => {
            let mut tx = Tx { net, from: id, last: ShareLast::default() };
            p.handle_timeout(t, &mut tx);
        }
        SimNode::Receiver(r, clock) => {
            let local = clock.local(t);
            let mut tx = Tx { net, from: id, last: ShareLast::default() };
            r.handle_timeout(local, &mut tx);
            drain(r, (t, local), msgs, owd, warmup);
        }
        _ => {}
    }
}

/// Records what a receiver released at true time `t` (`local` on its clock).
fn drain(r: &mut Receiver, (t, local): (u64, u64), msgs: &mut [MsgAgg], owd: OwdLog, warmup: u64) {
    while let Some(m) = r.poll_release() {
        if owd.tracked.get(r.id as usize).copied().unwrap_or(false) && owd.releases.len() < TRACKED_MAX {
            owd.releases.push(TrackedRelease {
                receiver: r.id,
                sequence: m.sequence,
                true_ns: t,
                local_ns: local,
                late: m.late,
            });
        }
        if let Some(a) = msgs.get_mut(m.sequence as usize) {
            a.first_ns = a.first_ns.min(t);
            a.last_ns = a.last_ns.max(t);
            a.delivered += 1;
            if m.sequence > warmup {
                if let Some(v) = owd.owd.get_mut(r.id as usize) {
                    v.push(t.saturating_sub(a.send_ns).min(u64::from(u32::MAX)) as u32);
                }
            }
        }
    }
}

/// Puts a node's next timer on the queue (in true time) if it moved earlier.
fn schedule(nodes: &[SimNode], net: &mut Net, timer_at: &mut [u64], id: u32) {
    let due = match &nodes[id as usize] {
        SimNode::Proxy(p) => p.next_timeout(),
        SimNode::Receiver(r, clock) => clock.true_at(r.next_timeout()),
        _ => return,
    }
    .max(net.now);
    if due < timer_at[id as usize] {
        timer_at[id as usize] = due;
        net.order += 1;
        net.queue.push(Reverse((due, net.order, Ev::Timer { node: id })));
    }
}

fn summarize(topo: &Topology, cfg: &SimConfig, nodes: &[SimNode], msgs: &[MsgAgg], events: u64) -> RunResult {
    let n = topo.receivers as u32;
    let counted: Vec<&MsgAgg> = msgs.iter().skip(1 + cfg.warmup_messages as usize).collect();
    let complete: Vec<&&MsgAgg> = counted.iter().filter(|m| m.delivered >= n).collect();
    let oml_series_us: Vec<f64> = complete.iter().map(|m| (m.last_ns - m.send_ns) as f64 / 1e3).collect();
    let mut oml: Vec<u64> = complete.iter().map(|m| m.last_ns - m.send_ns).collect();
    let mut dws: Vec<u64> = complete.iter().map(|m| m.last_ns - m.first_ns).collect();
    oml.sort_unstable();
    dws.sort_unstable();
    let share = |f: &dyn Fn(u64) -> bool| {
        if dws.is_empty() {
            0.0
        } else {
            dws.iter().filter(|&&d| f(d)).count() as f64 / dws.len() as f64
        }
    };
    let expected = counted.len() as u64;
    let (mut late, mut released, mut hold_sum) = (0u64, 0u64, 0u64);
    let mut receivers_with_loss = 0;
    let mut offset = 0.0;
    for node in nodes {
        match node {
            SimNode::Receiver(r, _) => {
                if r.stats.released.saturating_sub(cfg.warmup_messages) < expected {
                    receivers_with_loss += 1;
                }
                late += r.stats.late;
                released += r.stats.released;
                hold_sum += r.stats.hold_sum_ns;
            }
            SimNode::Sender(s) => offset = s.deadline_offset_ns() as f64 / 1e3,
            _ => {}
        }
    }
    let on_time = released.saturating_sub(late);
    RunResult {
        receivers: topo.receivers,
        messages: counted.len() as u64,
        incomplete_messages: (counted.len() - complete.len()) as u64,
        lost_deliveries: counted.iter().map(|m| u64::from(n.saturating_sub(m.delivered))).sum(),
        receivers_with_loss,
        repeated_deliveries: counted.iter().map(|m| u64::from(m.delivered.saturating_sub(n))).sum(),
        oml_p50_us: percentile(&oml, 0.5),
        oml_p99_us: percentile(&oml, 0.99),
        dws_p50_us: percentile(&dws, 0.5),
        dws_p99_us: percentile(&dws, 0.99),
        pf_0us: share(&|d| d < 500),
        pf_1us: share(&|d| d <= 1_000),
        hold_mean_us: if on_time > 0 { hold_sum as f64 / on_time as f64 / 1e3 } else { 0.0 },
        late_fraction: if released > 0 && cfg.node.hold_and_release { late as f64 / released as f64 } else { 0.0 },
        events,
        deadline_offset_us: offset,
        oml_us: oml.iter().map(|&x| x as f64 / 1e3).collect(),
        dws_us: dws.iter().map(|&x| x as f64 / 1e3).collect(),
        oml_series_us,
        receiver_owd_p50_us: Vec::new(),
        receiver_owd_p99_us: Vec::new(),
        tracked: Vec::new(),
    }
}
