//! The fair multicast tree on real UDP sockets, every node in one process
//! and one thread (the "everything on one thread" threading mode), each node on
//! its own loopback address (127.1.x.y) — the engine behind `fairfeed demo`.
//!
//! The node state machines are the ones the simulator drives. What is real
//! here: sockets, the kernel's loopback path, the host clock, and release at
//! the deadline by spinning on that clock. What is emulated: the cloud. The
//! kernel here has no netem, so each copy a node sends waits in a user-space
//! delay queue for a hop delay drawn from a link model (and for the node's
//! per-copy serialization cost) before it is handed to the kernel.
//!
//! The loop spins (busy polling): it owns one core for the run's duration.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::rc::Rc;
use std::time::Instant;

use fairfeed_sim::model::{LinkEmulator, LinkModel, ShareLast};
use fairfeed_tree::node::{DeadlineRule, NodeConfig, Proxy, Receiver, Sender, Transmit};
use fairfeed_tree::plan::{Role, Topology};
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;
use serde::Serialize;

use std::os::fd::AsFd;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::arb_live::bind_udp;

/// Nodes a loopback cluster may have (each one a socket).
pub const NODES_MAX: usize = 4_096;
/// Datagrams read from one socket per loop turn at most.
const RECV_BATCH_MAX: usize = 32;
/// A release this close is waited for by spinning rather than by another loop turn.
const SPIN_AHEAD_NS: u64 = 50_000;

/// What to run.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub seconds: f64,
    pub rate_per_s: f64,
    pub link: LinkModel,
    pub node: NodeConfig,
    pub rule: DeadlineRule,
    pub seed: u64,
    /// Messages at the start left out of the measures.
    pub warmup_messages: u64,
    /// Receivers whose every release is recorded (`ClusterResult::tracked`).
    pub track: Vec<u32>,
}

/// The measures of one run on the real data plane.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterResult {
    pub receivers: usize,
    pub messages: u64,
    /// (message, receiver) deliveries that never happened.
    pub lost: u64,
    pub oml_p50_us: f64,
    pub oml_p99_us: f64,
    pub dws_p50_us: f64,
    pub dws_p99_us: f64,
    pub pf_1us: f64,
    pub late_fraction: f64,
    pub hold_mean_us: f64,
    /// Release instant minus deadline, over all on-time releases, ns.
    pub release_error_p50_ns: u64,
    pub release_error_p99_ns: u64,
    pub packets_sent: u64,
    pub send_errors: u64,
    /// The sender's final deadline offset (OWD_G + margin), µs.
    pub deadline_offset_us: f64,
    /// Copies arriving at receivers by the links they crossed (proxies + 1):
    /// one-way latency p50/p99 and the p50 per link.
    pub paths: Vec<PathLatency>,
    #[serde(skip)]
    pub hold_us: Vec<f64>,
    /// (receiver, overlay sequence, release ns) at the tracked receivers.
    #[serde(skip)]
    pub tracked: Vec<(u32, u64, u64)>,
    #[serde(skip)]
    pub oml_us: Vec<f64>,
    #[serde(skip)]
    pub dws_us: Vec<f64>,
}

/// Latency of copies that crossed `links` links.
#[derive(Debug, Clone, Serialize)]
pub struct PathLatency {
    pub links: u8,
    pub copies: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub per_link_p50_us: f64,
}

/// Path lengths tracked (longer paths are counted with the longest).
const PATH_LINKS_MAX: usize = 8;

enum Live {
    Sender(Box<Sender>),
    Proxy(Box<Proxy>),
    Receiver(Box<Receiver>),
}

/// Copies waiting for their emulated hop delay: (due ns, order, from, to, bytes).
type Delayed = Reverse<(u64, u64, u32, u32, Rc<[u8]>)>;

struct Egress {
    now: u64,
    queue: BinaryHeap<Delayed>,
    order: u64,
    links: LinkEmulator,
}

struct Tx<'a> {
    e: &'a mut Egress,
    from: u32,
    last: ShareLast,
}

impl Transmit for Tx<'_> {
    fn send(&mut self, to: u32, bytes: &[u8]) {
        let rc = self.last.share(bytes);
        let e = &mut *self.e;
        for due in e.links.arrivals(e.now, self.from, to).into_iter().flatten() {
            e.order += 1;
            e.queue.push(Reverse((due, e.order, self.from, to, rc.clone())));
        }
    }
}

/// The loopback address of node `id`: 127.1.(id / 250).(id % 250 + 1).
pub fn node_addr(id: u32) -> Ipv4Addr {
    Ipv4Addr::new(127, 1, (id / 250) as u8, (id % 250 + 1) as u8)
}

fn quantile(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((q * v.len() as f64) as usize).min(v.len() - 1)]
}

/// Per-message release bookkeeping.
struct Tally {
    sent_at: Vec<u64>,
    first: Vec<u64>,
    last: Vec<u64>,
    count: Vec<u32>,
    release_err: Vec<u64>,
    hold: Vec<u64>,
    track: Vec<bool>,
    tracked: Vec<(u32, u64, u64)>,
}

/// All nodes of one tree, their sockets and the emulated links.
struct Cluster {
    socks: Vec<Option<UdpSocket>>,
    addrs: Vec<SocketAddr>,
    nodes: Vec<Option<Live>>,
    sender_id: u32,
    receiver_ids: Vec<u32>,
    egress: Egress,
    start: Instant,
    packets_sent: u64,
    send_errors: u64,
    buf: Vec<u8>,
    turn: u64,
    /// One-way latency of each copy reaching a receiver, by links crossed.
    path_ns: Vec<Vec<u64>>,
}

impl Cluster {
    fn new(topo: &Topology, cfg: &ClusterConfig) -> std::io::Result<Self> {
        let tree = &topo.trees[0];
        let n_ids = tree.nodes.iter().map(|n| n.id).max().unwrap_or(0) as usize + 1;
        assert!(n_ids <= NODES_MAX, "at most {NODES_MAX} nodes on loopback");
        let mut socks: Vec<Option<UdpSocket>> = (0..n_ids).map(|_| None).collect();
        let mut addrs: Vec<SocketAddr> = vec![SocketAddr::from(([127, 0, 0, 1], 0)); n_ids];
        let mut nodes: Vec<Option<Live>> = (0..n_ids).map(|_| None).collect();
        let sender_id = tree.nodes.iter().find(|n| n.role == Role::Sender).map_or(0, |n| n.id);
        let mut hp = fairfeed_tree::plan::hedge_parents(topo, 0);
        for n in &tree.nodes {
            let hedge_parents = hp.remove(&n.id).unwrap_or_default();
            let s = bind_udp(SocketAddr::V4(SocketAddrV4::new(node_addr(n.id), 0)), 4 << 20)?;
            addrs[n.id as usize] = s.local_addr()?;
            socks[n.id as usize] = Some(s);
            let parent = n.parent.unwrap_or(sender_id);
            nodes[n.id as usize] = Some(match n.role {
                Role::Sender => Live::Sender(Box::new(Sender::new(n.id, n.children.clone(), cfg.node, cfg.rule))),
                Role::Proxy => Live::Proxy(Box::new(
                    Proxy::new(n.id, parent, &n.children, &n.hedge_targets, cfg.node).with_hedge_parents(hedge_parents),
                )),
                Role::Receiver => {
                    Live::Receiver(Box::new(Receiver::new(n.id, parent, cfg.node).with_hedge_parents(hedge_parents)))
                }
            });
        }
        Ok(Cluster {
            socks,
            addrs,
            nodes,
            sender_id,
            receiver_ids: topo.receiver_ids.clone(),
            egress: Egress {
                now: 0,
                queue: BinaryHeap::new(),
                order: 0,
                links: LinkEmulator::new(cfg.link, ChaCha12Rng::seed_from_u64(cfg.seed), n_ids),
            },
            start: Instant::now(),
            packets_sent: 0,
            send_errors: 0,
            buf: vec![0u8; 65_536],
            turn: 0,
            path_ns: vec![Vec::new(); PATH_LINKS_MAX + 1],
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The sender multicasts one payload; returns its overlay sequence number.
    fn send(&mut self, payload: &[u8]) -> u64 {
        let t = self.now();
        self.egress.now = t;
        let from = self.sender_id;
        let Some(Live::Sender(s)) = &mut self.nodes[from as usize] else { return 0 };
        let seq = s.handle_message(t, payload, &mut Tx { e: &mut self.egress, from, last: ShareLast::default() });
        s.update(t);
        seq
    }

    /// Hands the copies whose emulated delay is over to the kernel.
    fn flush(&mut self) {
        let t = self.now();
        while self.egress.queue.peek().is_some_and(|Reverse((due, ..))| *due <= t) {
            let Some(Reverse((_, _, from, to, bytes))) = self.egress.queue.pop() else { break };
            if let Some(s) = &self.socks[from as usize] {
                match s.send_to(&bytes, self.addrs[to as usize]) {
                    Ok(_) => self.packets_sent += 1,
                    Err(_) => self.send_errors += 1,
                }
            }
        }
    }

    /// Reads the sockets that have something (one poll(2) for all of them).
    fn receive(&mut self) {
        let ready: Vec<usize> = {
            let mut fds: Vec<PollFd> =
                self.socks.iter().flatten().map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN)).collect();
            let _ = poll(&mut fds, PollTimeout::ZERO);
            let ids = self.socks.iter().enumerate().filter(|(_, s)| s.is_some()).map(|(i, _)| i);
            ids.zip(fds.iter())
                .filter(|(_, f)| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
                .map(|(i, _)| i)
                .collect()
        };
        for id in ready {
            for _ in 0..RECV_BATCH_MAX {
                let Some(sock) = &self.socks[id] else { break };
                let Ok(n) = sock.recv(&mut self.buf) else { break };
                let t = self.now();
                self.egress.now = t;
                let mut tx = Tx { e: &mut self.egress, from: id as u32, last: ShareLast::default() };
                match &mut self.nodes[id] {
                    Some(Live::Sender(s)) => s.handle_packet(t, &self.buf[..n]),
                    Some(Live::Proxy(p)) => p.handle_packet(t, &mut self.buf[..n], &mut tx),
                    Some(Live::Receiver(r)) => {
                        if let Ok((h, _)) = fairfeed_wire::overlay::HeaderRepr::parse(&self.buf[..n]) {
                            let links = (usize::from(h.hop) + 1).min(PATH_LINKS_MAX);
                            self.path_ns[links].push(t.saturating_sub(h.send_ns));
                        }
                        r.handle_packet(t, &self.buf[..n]);
                    }
                    None => {}
                }
            }
        }
    }

    /// Runs due timers and releases. When the earliest release is about to
    /// fall due, spins to it, so every receiver's release runs back to back.
    fn timers(&mut self, tally: &mut Tally, hold: bool) {
        let next = self
            .receiver_ids
            .iter()
            .filter_map(|&id| match &self.nodes[id as usize] {
                Some(Live::Receiver(r)) => Some(r.next_timeout()),
                _ => None,
            })
            .min();
        if let Some(d) = next {
            let t = self.now();
            if d > t && d - t < SPIN_AHEAD_NS {
                while self.now() < d {
                    std::hint::spin_loop();
                }
            }
        }
        let start = self.start;
        // One core cannot release every receiver at once: visit them from a
        // rotating first node, so no receiver is systematically released first
        // (separate hosts would have no such order; the window is still measured).
        let n = self.nodes.len();
        self.turn = self.turn.wrapping_add(1);
        let first = (self.turn as usize).wrapping_mul(7919) % n.max(1);
        for k in 0..n {
            let id = (first + k) % n;
            let node = &mut self.nodes[id];
            let t = start.elapsed().as_nanos() as u64;
            self.egress.now = t;
            let mut tx = Tx { e: &mut self.egress, from: id as u32, last: ShareLast::default() };
            match node {
                Some(Live::Proxy(p)) if p.next_timeout() <= t => p.handle_timeout(t, &mut tx),
                Some(Live::Receiver(r)) => {
                    if r.next_timeout() <= t {
                        r.handle_timeout(t, &mut tx);
                    }
                    while let Some(m) = r.poll_release() {
                        if tally.track.get(id).copied().unwrap_or(false) {
                            tally.tracked.push((id as u32, m.sequence, t));
                        }
                        let i = m.sequence as usize;
                        if i < tally.first.len() {
                            tally.first[i] = tally.first[i].min(t);
                            tally.last[i] = tally.last[i].max(t);
                            tally.count[i] += 1;
                        }
                        if !m.late && hold {
                            tally.release_err.push(t.saturating_sub(m.deadline_ns));
                            tally.hold.push(m.deadline_ns.saturating_sub(m.arrival_ns));
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// Runs tree 0 of `topo` on loopback for `cfg.seconds`, sending `payloads`
/// (MoldUDP64 packets, cycled) at `cfg.rate_per_s`. `progress` is told the
/// elapsed fraction now and then.
pub fn run_cluster(
    topo: &Topology,
    cfg: &ClusterConfig,
    payloads: &[Vec<u8>],
    mut progress: impl FnMut(f64),
) -> std::io::Result<ClusterResult> {
    assert!(!payloads.is_empty(), "something to send");
    let mut c = Cluster::new(topo, cfg)?;
    let total = (cfg.seconds * cfg.rate_per_s).max(1.0) as u64;
    let gap_ns = (1e9 / cfg.rate_per_s) as u64;
    let slots = total as usize + 1;
    let mut tally = Tally {
        sent_at: vec![0; slots],
        first: vec![u64::MAX; slots],
        last: vec![0; slots],
        count: vec![0; slots],
        release_err: Vec::new(),
        hold: Vec::new(),
        track: {
            let mut v = vec![false; NODES_MAX];
            for &id in &cfg.track {
                if let Some(x) = v.get_mut(id as usize) {
                    *x = true;
                }
            }
            v
        },
        tracked: Vec::new(),
    };
    let end_ns = (cfg.seconds * 1e9) as u64;
    // After the last message: long enough for its deadline and the slowest copy.
    let drain_ns = cfg.node.initial_owd_ns.max(5_000_000) * 4;
    let (mut sent, mut next_progress) = (0u64, 0u64);
    c.start = Instant::now();
    loop {
        let t = c.now();
        if sent < total && t >= sent * gap_ns {
            let p = &payloads[(sent % payloads.len() as u64) as usize];
            let seq = c.send(p);
            if let Some(x) = tally.sent_at.get_mut(seq as usize) {
                *x = t;
            }
            sent += 1;
        }
        c.flush();
        c.receive();
        c.timers(&mut tally, cfg.node.hold_and_release);
        if t * 10 / end_ns.max(1) >= next_progress {
            progress((t as f64 / end_ns as f64).min(1.0));
            next_progress += 1;
        }
        if sent >= total && t > end_ns + drain_ns && c.egress.queue.is_empty() {
            break;
        }
        std::hint::spin_loop();
    }
    Ok(summarize(&mut c, cfg, &mut tally, total))
}

fn paths(c: &mut Cluster) -> Vec<PathLatency> {
    let mut out = Vec::new();
    for (links, v) in c.path_ns.iter_mut().enumerate() {
        if v.is_empty() {
            continue;
        }
        let p50 = quantile(v, 0.5) as f64 / 1e3;
        out.push(PathLatency {
            links: links as u8,
            copies: v.len() as u64,
            p50_us: p50,
            p99_us: quantile(v, 0.99) as f64 / 1e3,
            per_link_p50_us: p50 / links.max(1) as f64,
        });
    }
    out
}

fn summarize(c: &mut Cluster, cfg: &ClusterConfig, tally: &mut Tally, total: u64) -> ClusterResult {
    let n = c.receiver_ids.len() as u32;
    let counted = (cfg.warmup_messages as usize + 1)..=(total as usize);
    let (mut oml, mut dws, mut lost) = (Vec::new(), Vec::new(), 0u64);
    for i in counted.clone() {
        lost += u64::from(n.saturating_sub(tally.count[i]));
        if tally.count[i] >= n {
            oml.push(tally.last[i] - tally.sent_at[i]);
            dws.push(tally.last[i] - tally.first[i]);
        }
    }
    let (mut late, mut released, mut hold) = (0u64, 0u64, 0u64);
    let mut deadline_offset_us = 0.0;
    for node in c.nodes.iter().flatten() {
        match node {
            Live::Receiver(r) => {
                late += r.stats.late;
                released += r.stats.released;
                hold += r.stats.hold_sum_ns;
            }
            Live::Sender(s) => deadline_offset_us = s.deadline_offset_ns() as f64 / 1e3,
            Live::Proxy(_) => {}
        }
    }
    let fair = dws.iter().filter(|&&d| d <= 1_000).count();
    let oml_us: Vec<f64> = oml.iter().map(|&x| x as f64 / 1e3).collect();
    let dws_us: Vec<f64> = dws.iter().map(|&x| x as f64 / 1e3).collect();
    ClusterResult {
        receivers: n as usize,
        messages: counted.count() as u64,
        lost,
        oml_p50_us: quantile(&mut oml, 0.5) as f64 / 1e3,
        oml_p99_us: quantile(&mut oml, 0.99) as f64 / 1e3,
        dws_p50_us: quantile(&mut dws, 0.5) as f64 / 1e3,
        dws_p99_us: quantile(&mut dws, 0.99) as f64 / 1e3,
        pf_1us: if dws.is_empty() { 0.0 } else { fair as f64 / dws.len() as f64 },
        late_fraction: if released > 0 && cfg.node.hold_and_release { late as f64 / released as f64 } else { 0.0 },
        hold_mean_us: if released > late { hold as f64 / (released - late) as f64 / 1e3 } else { 0.0 },
        release_error_p50_ns: quantile(&mut tally.release_err, 0.5),
        release_error_p99_ns: quantile(&mut tally.release_err, 0.99),
        packets_sent: c.packets_sent,
        send_errors: c.send_errors,
        deadline_offset_us,
        paths: paths(c),
        hold_us: tally.hold.iter().map(|&x| x as f64 / 1e3).collect(),
        tracked: std::mem::take(&mut tally.tracked),
        oml_us,
        dws_us,
    }
}
