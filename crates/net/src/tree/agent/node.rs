//! The node loop.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fairfeed_clock::ClockSync;
use fairfeed_io::agent::{Agent, RunConfig, Turn};
use fairfeed_model::LinkEmulator;
use fairfeed_tree::node::{Node, Outcome, Released, Transmit};
use fairfeed_tree::plan::{probe_plan, Node as PlanNode, Role};
use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;
use serde_json::json;

use super::control::{summary, Life, NodePoster as Poster, TreePart};
use super::delivery::Delivered;
use super::egress::{Copy, Egress, EgressAgent, EgressHandle, TxCounters};
use super::membership::{Membership, IDS_MAX};
use super::releases::{Release, ReleaseLog};
use super::{
    wall_ns, AgentConfig, AgentReport, Job, ReleaseAt, ReleaseRow, SenderJob, Threading, LOG_ROWS_MAX, RING_CAPACITY,
};
use super::{SOCKET_RECV_BUFFER, SPIN_AHEAD_NS};
use crate::idle::IdleStrategy;
use crate::tuning::{report, Applied};
use fairfeed_io::mailbox::{mailbox, Incoming, Outgoing};
use fairfeed_io::resolve::Resolver;
use fairfeed_io::send::{RecvPath, SendPath};
use fairfeed_io::socket::bind_udp;

/// Why a node could not start.
#[derive(Debug)]
pub enum AgentError {
    Config(String),
    Io(String, std::io::Error),
}

impl std::fmt::Display for AgentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentError::Config(s) => f.write_str(s),
            AgentError::Io(what, e) => write!(f, "{what}: {e}"),
        }
    }
}

impl std::error::Error for AgentError {}

/// The overlay header's kind byte of a membership datagram.
const MEMBERSHIP_KIND: u8 = fairfeed_wire::overlay::Kind::Membership as u8;

/// One copy the state machine handed out: to whom (id, address), what, and
/// whether it goes from the replication socket (the kernel makes the rest).
type Out = (u32, SocketAddr, Arc<Vec<u8>>, bool);

/// Packet buffers a node's pool keeps at most for reuse (≈ 1.5 MB of
/// 1,500-byte packets; beyond it, buffers are freed once sent).
pub const BUFFER_POOL_MAX: usize = 1_024;

/// What the state machine handed out and is not yet with the send side,
/// the buffers it is copied into, and the copies to nodes without an address.
#[derive(Default)]
struct Handed {
    out: Vec<Out>,
    pool: BufferPool,
    unknown: u64,
}

/// Packet buffers reused once every copy of one has been sent (the send
/// side drops its references), so forwarding allocates nothing per packet
/// once the pool has grown to the copies in flight.
#[derive(Default)]
struct BufferPool {
    /// Oldest handed out first: copies leave in order, so it is the likeliest free.
    ring: std::collections::VecDeque<Arc<Vec<u8>>>,
    /// Buffers allocated because none was free.
    allocated: u64,
}

impl BufferPool {
    /// A buffer holding `bytes`: a free one of the pool's, else a new one.
    fn take(&mut self, bytes: &[u8]) -> Arc<Vec<u8>> {
        // The oldest, then (should it still be in flight, a copy held by an
        // emulated link) the next: at most two looks.
        for _ in 0..2 {
            let Some(mut b) = self.ring.pop_front() else { break };
            if let Some(v) = Arc::get_mut(&mut b) {
                v.clear();
                v.extend_from_slice(bytes);
                self.ring.push_back(b.clone());
                return b;
            }
            self.ring.push_back(b);
        }
        self.allocated += 1;
        let b = Arc::new(bytes.to_vec());
        if self.ring.len() < BUFFER_POOL_MAX {
            self.ring.push_back(b.clone());
        }
        b
    }
}

/// The node's fan-out when the kernel replicates it: the targets sorted (to
/// recognise a fan-out to exactly them) and the one user space sends to.
struct KernelFanout {
    sorted: Vec<u32>,
    first: u32,
    /// Copies the kernel was left to make.
    copies: u64,
}

impl KernelFanout {
    fn covers(&self, to: &[u32]) -> bool {
        to.len() == self.sorted.len() && to.iter().all(|t| self.sorted.binary_search(t).is_ok())
    }
}

/// Copies the node handed out during one call into its state machine.
struct Pending<'a> {
    addrs: &'a [Option<SocketAddr>],
    handed: &'a mut Handed,
    kernel: Option<&'a mut KernelFanout>,
}

impl Pending<'_> {
    fn copy(&mut self, to: u32, shared: &Arc<Vec<u8>>, fanout: bool) {
        match self.addrs.get(to as usize) {
            Some(Some(addr)) => self.handed.out.push((to, *addr, shared.clone(), fanout)),
            _ => self.handed.unknown += 1,
        }
    }
}

impl Transmit for Pending<'_> {
    fn send(&mut self, to: u32, bytes: &[u8]) {
        let shared = self.handed.pool.take(bytes);
        self.copy(to, &shared, false);
    }

    /// One shared buffer for all the copies (the send side's `sendmmsg`
    /// points every message at it); one datagram in all when the kernel
    /// replicates a fan-out to exactly the node's targets.
    fn send_all(&mut self, to: &[u32], bytes: &[u8]) {
        let shared = self.handed.pool.take(bytes);
        if let Some(k) = self.kernel.as_deref_mut().filter(|k| k.covers(to)) {
            k.copies += to.len() as u64 - 1;
            let first = k.first;
            self.copy(first, &shared, true);
            return;
        }
        for &t in to {
            self.copy(t, &shared, false);
        }
    }
}

enum Outbox {
    Inline(Egress),
    Ring(EgressHandle),
}

/// Histograms of a receiver, ns.
struct Hists {
    owd: Histogram<u64>,
    hold: Histogram<u64>,
    release_error: Histogram<u64>,
}

const HIST_MAX_NS: u64 = 10_000_000_000;
/// A parked node wakes at least this often (to see a stop signal).
pub(super) const PARK_MAX_NS: u64 = 100_000_000;
/// Copies still waiting for their emulated delay at exit are sent for at most this long.
const DRAIN_NS: u64 = 1_000_000_000;

/// Significant digits of a node's latency histograms (0.1 %: ≈ 190 KiB each).
const HIST_DIGITS: u8 = 3;
/// The same where a harness runs a hundred nodes on one thread (the demo's
/// dashboard): 1 % resolution in ≈ 28 KiB, so that the nodes' histograms
/// stay in cache and their published copies come from the heap rather than
/// from fresh pages.
const HIST_DIGITS_TAPPED: u8 = 2;

fn hist(digits: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, digits).expect("valid histogram bounds")
}

fn record(h: &mut Histogram<u64>, v: u64) {
    let _ = h.record(v.clamp(1, HIST_MAX_NS));
}

/// One tree node's data path as an agent: its socket, its state machine and,
/// inline or as an `EgressAgent` on a thread of its own, its send side. A
/// sender's packets come from its [`super::FeedAgent`] and a receiver's
/// releases go to its [`super::DeliveryAgent`], each behind a mailbox; its
/// counters go to the [`super::ControlAgent`] through the board.
/// [`super::NodeAgents`] composes them; the demo runs a tree of them on one thread.
pub struct NodeAgent<'c> {
    cfg: &'c AgentConfig,
    who: String,
    role: Role,
    addr: SocketAddr,
    live: Node,
    /// Its sockets and the copies on their way out.
    io: NodeIo,
    /// What it does with a receiver's releases.
    rel: ReleaseSide<'c>,
    /// A sender's packets, from its feed.
    feed: Option<Incoming<Vec<u8>>>,
    poster: Option<Poster>,
    life: Arc<Life>,
    started_ns: u64,
    tuning: Vec<Applied>,
    /// The generation of the keyring last put in force (`cfg.keys`).
    key_generation: u64,
    /// Under a controller: registration, heartbeats, new views.
    membership: Option<Membership>,
    /// Steps of this node's clock, found and told to the clock sync.
    steps: ClockSteps,
}

/// A node agent's network side: its socket, the addresses it sends to, and
/// the copies on their way out.
struct NodeIo {
    sock: UdpSocket,
    addrs: Vec<Option<SocketAddr>>,
    /// Keeps the topology's names resolved (none when every address is an IP).
    resolver: Option<Resolved>,
    emu: Option<LinkEmulator>,
    handed: Handed,
    kernel: Option<KernelFanout>,
    outbox: Outbox,
    tx: Arc<TxCounters>,
    recv: RecvPath,
    packets_in: u64,
    recv_calls: u64,
    /// A sender's deadline records to the exchange.
    deadlines: Option<DeadlineTap>,
}

/// What a receiver's node agent does with its releases: measure them, log
/// them, hand them to its delivery and to the fleet view.
struct ReleaseSide<'c> {
    /// None when a harness taps the agent (it keeps its own measures, and
    /// a hundred agents' histograms on one thread cost cache misses per release).
    hists: Option<Box<Hists>>,
    rows: Vec<ReleaseRow>,
    max_released_seq: u64,
    /// A receiver's releases, to its delivery.
    delivery: Option<Outgoing<Delivered>>,
    /// Releases the delivery's mailbox had no room for.
    delivery_full: u64,
    on_release: OnRelease<'c>,
    /// Where a receiver's releases are kept for the fleet view, and a turn's batch of them.
    releases: Option<Arc<ReleaseLog>>,
    release_batch: Vec<Release>,
    /// A last hop's largest lead (shared with the delivery), and the one the core has.
    last_hop: Option<Arc<std::sync::atomic::AtomicU64>>,
    last_hop_ns: u64,
}

impl<'c> ReleaseSide<'c> {
    fn new(
        cfg: &AgentConfig,
        delivery: Option<Outgoing<Delivered>>,
        releases: Option<Arc<ReleaseLog>>,
        last_hop: Option<Arc<std::sync::atomic::AtomicU64>>,
        on_release: OnRelease<'c>,
    ) -> Self {
        ReleaseSide {
            hists: (cfg.tap.is_none() || cfg.board.is_some()).then(|| {
                let d = if cfg.tap.is_some() { HIST_DIGITS_TAPPED } else { HIST_DIGITS };
                Box::new(Hists { owd: hist(d), hold: hist(d), release_error: hist(d) })
            }),
            rows: Vec::new(),
            max_released_seq: 0,
            delivery,
            delivery_full: 0,
            on_release,
            releases,
            release_batch: Vec::new(),
            last_hop,
            last_hop_ns: 0,
        }
    }
}

/// How often a node with its own clock sync looks for a step of the host's
/// clock (two vDSO reads of CLOCK_MONOTONIC and one of CLOCK_REALTIME).
pub const STEP_CHECK_NS: u64 = 1_000_000;

/// Finds steps of a node's clock — the host's (CLOCK_REALTIME against
/// CLOCK_MONOTONIC, every [`STEP_CHECK_NS`]) or one injected for a test
/// (`Skew::step_ns`) — and tells the clock sync their size at once
/// (`ClockSync::clock_stepped_by`), so it keeps its estimate.
#[derive(Debug, Default)]
struct ClockSteps {
    watch: fairfeed_io::clock::HostStepWatch,
    next_check_wall: u64,
    injected_told: bool,
    /// A kernel receive stamp that reads below this (local) may be from
    /// before the last step (read after it): its packet takes the time it is
    /// read at instead — later than its arrival, so at worst a queued-looking
    /// sample, never one below the floor.
    stale_below: u64,
    told: u64,
    /// The clock was over its bound limit at the last look (said once per change).
    over_limit: bool,
}

/// A sender's deadline records on their way to the exchange (`SenderJob::deadlines_to`).
struct DeadlineTap {
    writer: fairfeed_tree::deadlines::RecordWriter,
    to: SocketAddr,
    records: u64,
    datagrams: u64,
    send_errors: u64,
}

impl DeadlineTap {
    /// The deadline of the MoldUDP64 packet `p` (heartbeats and other bytes carry none).
    fn note(&mut self, sock: &UdpSocket, p: &[u8], deadline_ns: u64) {
        let Ok(pk) = fairfeed_wire::moldudp64::Packet::new_checked(p) else { return };
        let messages = pk.message_count();
        if messages == 0 || messages == fairfeed_wire::moldudp64::COUNT_END_OF_SESSION {
            return;
        }
        self.records += 1;
        let r = fairfeed_tree::deadlines::Record { first: pk.sequence(), messages, deadline_ns };
        if let Some(d) = self.writer.push(r) {
            self.send(sock, &d);
        }
    }

    fn flush(&mut self, sock: &UdpSocket) {
        if let Some(d) = self.writer.flush() {
            self.send(sock, &d);
        }
    }

    fn send(&mut self, sock: &UdpSocket, d: &[u8]) {
        self.datagrams += 1;
        self.send_errors += u64::from(sock.send_to(d, self.to).is_err());
    }
}

/// The deadline tap a sender's job asks for: the operator key seals it, and
/// it speaks for one tree's MoldUDP64 numbering.
fn deadline_tap(cfg: &AgentConfig, live: &Node) -> Result<Option<DeadlineTap>, AgentError> {
    let Job::Sender(SenderJob { deadlines_to: Some(to), .. }) = &cfg.job else { return Ok(None) };
    let Some(key) = cfg.operator.clone() else {
        return Err(AgentError::Config("deadline records are sealed under the operator key: give one".into()));
    };
    if !matches!(live, Node::Sender(_)) {
        return Err(AgentError::Config(
            "deadline records speak for one tree's sequence numbers: a sharded sender has several".into(),
        ));
    }
    Ok(Some(DeadlineTap {
        writer: fairfeed_tree::deadlines::RecordWriter::new(key),
        to: *to,
        records: 0,
        datagrams: 0,
        send_errors: 0,
    }))
}

/// A node's resolver and what the node last took from it.
struct Resolved {
    resolver: Resolver,
    generation: u64,
    /// Failed sends seen so far (each new one asks for names to be looked up again).
    send_failed: u64,
}

/// What a node agent calls with each release.
type OnRelease<'c> = Box<dyn FnMut(&Released, ReleaseAt) + 'c>;

fn parse_addr(n: &PlanNode) -> Result<Option<(String, u16)>, AgentError> {
    match &n.addr {
        None => Ok(None),
        Some(a) => fairfeed_tree::addr::HostPort::parse(a, false)
            .map(|hp| Some((hp.host, hp.port)))
            .map_err(|e| AgentError::Config(format!("node {}: {e}", n.id))),
    }
}

/// Addresses by node id (names resolved, and kept current by the returned
/// resolver), and this node's entry; errors name what is missing.
fn addresses(cfg: &AgentConfig) -> Result<(Vec<Option<SocketAddr>>, PlanNode, Resolver), AgentError> {
    let topo = &cfg.topology;
    if topo.trees.is_empty() {
        return Err(AgentError::Config("the topology has no tree".into()));
    }
    // Every tree's nodes: receivers and the sender are in all of them, a proxy in one.
    let all = || topo.trees.iter().flat_map(|t| t.nodes.iter());
    let n_ids = all().map(|n| n.id as usize + 1).max().unwrap_or(0);
    let mut names = vec![None; n_ids];
    for n in all() {
        names[n.id as usize] = parse_addr(n)?;
    }
    let lookup: fairfeed_io::resolve::Lookup = std::sync::Arc::new(fairfeed_io::resolve::resolve);
    let what = format!("node {}", cfg.id);
    let resolver = Resolver::start_waiting(names, &what, lookup, cfg.resolve_wait, Some(&cfg.stop))
        .map_err(|e| AgentError::Io("resolving the topology's addresses".into(), e))?;
    let addrs = resolver.table();
    let mine = fairfeed_tree::plan::node_in_trees(topo, cfg.id);
    let me = mine.first().map(|(_, n)| (*n).clone()).ok_or_else(|| {
        AgentError::Config(format!("no node {} in the topology (ids 0..{})", cfg.id, n_ids.saturating_sub(1)))
    })?;
    let sender = fairfeed_tree::plan::sender_id(topo).unwrap_or(0);
    let mut needed: Vec<u32> = vec![me.id];
    for (_, n) in &mine {
        needed.extend(&n.children);
        needed.extend(&n.hedge_targets);
        match n.parent {
            Some(p) => needed.push(p),
            // A planned node always has one; a node the controller has not placed yet has none.
            None if n.role != Role::Sender && cfg.membership.is_none() => needed.push(sender),
            None => {}
        }
    }
    for id in needed {
        if addrs.get(id as usize).and_then(|a| a.as_ref()).is_none() {
            return Err(AgentError::Config(format!(
                "node {id} has no address in the topology (plan it with --loopback-port or --address ID=HOST:PORT)"
            )));
        }
    }
    Ok((addrs, me, resolver))
}

fn start_outbox(
    cfg: &AgentConfig,
    sock: &UdpSocket,
    tx: &Arc<TxCounters>,
    external: Option<Box<dyn fairfeed_io::send::ExternalSend>>,
) -> Result<Outbox, AgentError> {
    let send_sock = sock.try_clone().map_err(|e| AgentError::Io("cloning the socket".into(), e))?;
    let fanout_sock = match &cfg.replicate {
        Some(r) => Some(r.sock.try_clone().map_err(|e| AgentError::Io("cloning the replication socket".into(), e))?),
        None => None,
    };
    let path = match external {
        // Made by the caller: moved to whichever thread sends.
        Some(ext) => SendPath::External(ext),
        // Made here: the inline sender's, and a check for a send thread (which makes its own).
        None => {
            SendPath::new(cfg.io).map_err(|e| AgentError::Io(format!("starting the {:?} send back-end", cfg.io), e))?
        }
    };
    if cfg.threads == Threading::One {
        return Ok(Outbox::Inline(Egress::new(send_sock, fanout_sock, path, tx.clone(), cfg.tap.clone())));
    }
    if let SendPath::External(ext) = path {
        return spawn_egress(cfg, send_sock, fanout_sock, tx, move |_| SendPath::External(ext));
    }
    drop(path);
    spawn_egress(cfg, send_sock, fanout_sock, tx, |backend| {
        SendPath::new(backend).unwrap_or_else(|e| {
            tracing::warn!("the {backend:?} send back-end failed on the send thread ({e}); sending with sendmmsg");
            SendPath::new(fairfeed_io::send::Backend::Udp).expect("sendmmsg needs no set-up")
        })
    })
}

/// The send thread, its path made there by `path`.
fn spawn_egress(
    cfg: &AgentConfig,
    send_sock: UdpSocket,
    fanout_sock: Option<UdpSocket>,
    tx: &Arc<TxCounters>,
    path: impl FnOnce(fairfeed_io::send::Backend) -> SendPath + Send + 'static,
) -> Result<Outbox, AgentError> {
    let backend = cfg.io;
    let (ring, incoming) = mailbox(RING_CAPACITY).map_err(|e| AgentError::Io("making the send ring".into(), e))?;
    let (tuning, counters, tap, time, idle) = (cfg.tuning.clone(), tx.clone(), cfg.tap.clone(), cfg.time, cfg.idle);
    // Built on its thread: the batch headers hold raw pointers and stay there.
    let make = move || {
        let applied = tuning.apply_thread(1);
        if idle != IdleStrategy::Spin {
            let _ = nix::sys::prctl::set_timerslack(1_000);
        }
        let path = path(backend);
        EgressAgent::new(incoming, Egress::new(send_sock, fanout_sock, path, counters, tap), time, applied)
    };
    let rc = RunConfig { idle, spin_ahead_ns: SPIN_AHEAD_NS, park_max_ns: PARK_MAX_NS, stop: None };
    let thread = fairfeed_io::agent::spawn("fairfeed-tx", rc, make, |a, _| a.applied)
        .map_err(|e| AgentError::Io("starting the send thread".into(), e))?;
    Ok(Outbox::Ring(EgressHandle { ring, thread: Some(thread) }))
}

fn start_sync(cfg: &AgentConfig, me: &PlanNode) -> ClockSync {
    if cfg.clock.sync.mode == fairfeed_clock::SyncMode::Off {
        // No probes; the limit still judges a host daemon's bound (--host-clock).
        return ClockSync::new(me.id, &[], true, cfg.clock.sync);
    }
    // One clock per host, whatever its trees (plan::probe_plan).
    // The sender's clock is the reference (under a controller a node's view
    // may not name the sender at all: it is no one's id by default).
    let mut sync = ClockSync::new(me.id, &[], me.role == Role::Sender, cfg.clock.sync);
    probe_as_planned(&mut sync, cfg, &cfg.topology, me.id, 0);
    sync
}

/// Node `id` probes the peers, at the strides and rates, that `probe_plan`
/// gives it in `topo` (its planned topology, or a controller's view of it);
/// `now` is raw (see `ClockSync::set_peers`).
fn probe_as_planned(sync: &mut ClockSync, cfg: &AgentConfig, topo: &fairfeed_tree::plan::Topology, id: u32, now: u64) {
    let s = cfg.clock.sync;
    let plan = probe_plan(topo, cfg.clock.random_peers, cfg.seed, s.peer_budget, s.rate_max);
    sync.set_peers(now, plan.peers.get(&id).map_or(&[][..], |v| &v[..]));
    sync.set_strides(plan.strides.get(&id).map_or(&[][..], |v| &v[..]));
    sync.set_rates(plan.rates.get(&id).map_or(&[][..], |v| &v[..]));
}

/// What joins a node agent to the other agents of its node.
pub struct Links {
    pub feed: Option<Incoming<Vec<u8>>>,
    pub delivery: Option<Outgoing<Delivered>>,
    pub poster: Option<Poster>,
    pub life: Arc<Life>,
    /// A receiver's recent releases, for the control agent's `releases` answers.
    pub releases: Option<Arc<ReleaseLog>>,
    /// A last hop's largest lead, ns, kept by the delivery (models 2 and 3).
    pub last_hop: Option<Arc<std::sync::atomic::AtomicU64>>,
}

/// The node's socket: `sock`, or bound to its address in the topology.
fn node_socket(cfg: &AgentConfig, me: u32, addr: SocketAddr, sock: Option<UdpSocket>) -> Result<UdpSocket, AgentError> {
    let sock = match sock {
        Some(s) => s,
        None => bind_udp(addr, SOCKET_RECV_BUFFER).map_err(|e| {
            AgentError::Io(format!("node {me}: binding {addr} (in use, or not an address of this host?)"), e)
        })?,
    };
    if cfg.clock.sync.mode != fairfeed_clock::SyncMode::Off {
        // Probes need each datagram's own arrival time (two probes read in one
        // batch would otherwise share one reading).
        crate::batch::enable_rx_timestamps(&sock)
            .map_err(|e| AgentError::Io(format!("node {me}: SO_TIMESTAMPNS"), e))?;
    }
    Ok(sock)
}

/// The state machine of node `me`, checked against the job it is started with.
fn state_machine(cfg: &AgentConfig, me: &PlanNode) -> Result<Node, AgentError> {
    let topo = &cfg.topology;
    match (&me.role, &cfg.job) {
        (Role::Sender, Job::Sender(_)) | (Role::Proxy, Job::Proxy) | (Role::Receiver, Job::Receiver(_)) => {
            let hedge_parents: Vec<_> =
                (0..topo.trees.len()).map(|k| fairfeed_tree::plan::hedge_parents(topo, k)).collect();
            let sync = start_sync(cfg, me);
            let node =
                fairfeed_tree::sharded::node_of(topo, me.id, cfg.node, cfg.rule, sync, &hedge_parents, &cfg.shards)
                    .map_err(|e| AgentError::Config(e.to_string()))?;
            Ok(node.with_auth(cfg.auth.clone()))
        }
        (role, _) => Err(AgentError::Config(format!(
            "node {} is a {role:?} in the topology; start it with `fairfeed {}`",
            me.id,
            format!("{role:?}").to_lowercase()
        ))),
    }
}

/// The node's receive path and send thread: on its socket (UDP or
/// io_uring), or on the AF_XDP back-end made for its interface.
fn io_paths(cfg: &AgentConfig, sock: &UdpSocket, tx: &Arc<TxCounters>) -> Result<(RecvPath, Outbox), AgentError> {
    let external = match (cfg.io, &cfg.external) {
        (fairfeed_io::send::Backend::AfXdp, Some(e)) => Some(
            e.take()
                .ok_or_else(|| AgentError::Config(format!("the {} back-end was handed to a node already", e.name)))?,
        ),
        (fairfeed_io::send::Backend::AfXdp, None) => {
            return Err(AgentError::Config("AF_XDP needs its back-end made for the node's interface".into()))
        }
        _ => None,
    };
    let (ext_recv, ext_send) = external.unzip();
    let outbox = start_outbox(cfg, sock, tx, ext_send)?;
    let stamps = cfg.clock.sync.mode != fairfeed_clock::SyncMode::Off;
    let recv = match ext_recv {
        Some(r) => RecvPath::External(r),
        None => RecvPath::new(cfg.io, sock, stamps)
            .map_err(|e| AgentError::Io(format!("starting the {:?} receive back-end", cfg.io), e))?,
    };
    Ok((recv, outbox))
}

/// The tree core's own statistics, by kind of node.
fn node_stats(live: &Node) -> serde_json::Value {
    match live {
        Node::Sender(s) => serde_json::to_value(&s.stats),
        Node::Proxy(p) => serde_json::to_value(&p.stats),
        Node::Receiver(r) => serde_json::to_value(&r.stats),
        Node::ShardSender(s) => Ok(json!({
            "trees": s.stats(),
            "shard": s.shard_stats(),
            "deadline_offsets_ns": s.deadline_offsets_ns(),
        })),
        Node::ShardReceiver(r) => serde_json::to_value(r.stats()).map(|mut v| {
            v["merge"] = serde_json::to_value(r.merge_stats()).unwrap_or_default();
            v["trees"] = r.trees().iter().map(|(t, _)| *t).collect::<Vec<_>>().into();
            v
        }),
    }
    .unwrap_or_default()
}

impl<'c> NodeAgent<'c> {
    /// Node `cfg.id` on `sock` (bound to its address in the topology when
    /// `None`), joined to its other agents by `links`; each release at a
    /// receiver is handed to `on_release`.
    pub fn new(
        cfg: &'c AgentConfig,
        sock: Option<UdpSocket>,
        links: Links,
        on_release: impl FnMut(&Released, ReleaseAt) + 'c,
    ) -> Result<Self, AgentError> {
        let (addrs, me, resolver) = addresses(cfg)?;
        let addr = addrs[me.id as usize].expect("checked by addresses()");
        // Under a controller the node's socket is the one it registered from.
        let (membership, sock) = match cfg.membership.as_deref().and_then(Membership::take) {
            Some((m, s)) => (Some(m), sock.or(s)),
            None => (None, sock),
        };
        let sock = node_socket(cfg, me.id, addr, sock)?;
        let addr = sock.local_addr().ok().filter(|a| !a.ip().is_unspecified()).unwrap_or(addr);
        let mut tuning = cfg.tuning.apply_process();
        tuning.extend(cfg.tuning.apply_thread(0));
        tuning.extend(cfg.tuning.apply_socket(&sock));
        let mut live = state_machine(cfg, &me)?;
        if let Some(j) = &cfg.membership {
            live.set_links(&fairfeed_tree::controller::view_links(&j.view))
                .map_err(|e| AgentError::Config(e.to_string()))?;
        }
        let deadlines = deadline_tap(cfg, &live)?;
        let tx = Arc::new(TxCounters::default());
        let (recv, outbox) = io_paths(cfg, &sock, &tx)?;
        let emu = cfg
            .link
            .map(|l| LinkEmulator::new(l, ChaCha12Rng::seed_from_u64(cfg.seed ^ u64::from(me.id)), addrs.len()));
        let Links { feed, delivery, poster, life, releases, last_hop } = links;
        let io = NodeIo {
            recv,
            sock,
            addrs,
            resolver: resolver.watches_names().then_some(Resolved { resolver, generation: 0, send_failed: 0 }),
            emu,
            handed: Handed { out: Vec::with_capacity(256), ..Handed::default() },
            kernel: cfg.replicate.as_ref().and_then(|r| {
                let mut sorted = r.fanout.clone();
                sorted.sort_unstable();
                Some(KernelFanout { first: *r.fanout.first()?, sorted, copies: 0 })
            }),
            outbox,
            tx,
            packets_in: 0,
            recv_calls: 0,
            deadlines,
        };
        let rel = ReleaseSide::new(cfg, delivery, releases, last_hop, Box::new(on_release));
        Ok(NodeAgent {
            cfg,
            who: format!("{} {}", format!("{:?}", me.role).to_lowercase(), me.id),
            role: me.role,
            addr,
            live,
            io,
            rel,
            feed,
            key_generation: cfg.keys.as_ref().map_or(0, |k| k.generation()),
            poster,
            life,
            started_ns: wall_ns(),
            tuning,
            // Unsynchronized at start is expected, not an alarm.
            steps: ClockSteps { over_limit: true, ..ClockSteps::default() },
            membership,
        })
    }

    /// Who it is, for log lines ("receiver 12").
    pub fn who(&self) -> &str {
        &self.who
    }

    /// The address it receives on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The tuning applied where it was built (and, after [`Self::finish`], on its send thread).
    pub fn tuning(&self) -> &[Applied] {
        &self.tuning
    }
}

impl NodeAgent<'_> {
    /// Hands what the state machine sent to the send side, each copy at the
    /// time its emulated link delivers it (now, without emulation); true
    /// time `now`. Returns the copies sent now.
    fn dispatch(&mut self, now: u64) -> usize {
        let id = self.cfg.id;
        let handed = self.io.handed.out.len();
        for (to_id, to, bytes, fanout) in self.io.handed.out.drain(..) {
            let dues = match &mut self.io.emu {
                Some(e) => {
                    let tree = bytes.get(4..6).map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
                    e.arrivals_on(now, id, tree, to_id)
                }
                None => [Some(now), None],
            };
            for due_ns in dues.into_iter().flatten() {
                let c = Copy { due_ns, to, bytes: bytes.clone(), handed_ns: now, model_ns: due_ns - now, fanout };
                match &mut self.io.outbox {
                    Outbox::Inline(e) => e.push(c),
                    Outbox::Ring(h) => {
                        if h.ring.push(c).is_err() {
                            self.io.tx.queue_full.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        match &mut self.io.outbox {
            Outbox::Inline(e) => e.flush(now) as usize,
            Outbox::Ring(h) => {
                if handed > 0 {
                    h.ring.wake();
                }
                0
            }
        }
    }

    /// A sender's packets from its feed; returns how many.
    fn take_feed(&mut self, now: u64) -> usize {
        let Some(feed) = &mut self.feed else { return 0 };
        let mut tx = Pending { addrs: &self.io.addrs, handed: &mut self.io.handed, kernel: self.io.kernel.as_mut() };
        let (deadlines, sock) = (&mut self.io.deadlines, &self.io.sock);
        let n = match &mut self.live {
            Node::Sender(s) => feed.drain(|p| {
                s.handle_message(now, &p, &mut tx);
                if let Some(d) = deadlines.as_mut() {
                    d.note(sock, &p, s.last_deadline_ns());
                }
                // As the simulator does: the deadline rule sees fresh reports at once.
                s.update(now);
            }),
            Node::ShardSender(s) => feed.drain(|p| {
                // A packet that is not MoldUDP64 is counted by the sharder and dropped.
                let _ = s.handle_feed(now, &p, &mut tx);
                s.update(now);
            }),
            _ => return 0,
        };
        if let Some(d) = deadlines.as_mut() {
            d.flush(sock);
        }
        if !feed.arm() {
            // One came in meanwhile: next turn.
            return n + 1;
        }
        n
    }

    /// Reads what is waiting; returns the number of datagrams.
    fn receive(&mut self, now: u64) -> usize {
        let live = &mut self.live;
        let mut tx = Pending { addrs: &self.io.addrs, handed: &mut self.io.handed, kernel: self.io.kernel.as_mut() };
        let hists = &mut self.rel.hists;
        let (skew, time, tap, me) = (self.cfg.clock.skew, self.cfg.time, self.cfg.tap.as_deref(), self.addr);
        let membership = &mut self.membership;
        let stale_below = self.steps.stale_below;
        let n = self.io.recv.recv_stamped(&self.io.sock, |b, stamp| {
            if let Some(m) = membership.as_mut().filter(|_| b.get(3) == Some(&MEMBERSHIP_KIND)) {
                m.keep(b);
                return;
            }
            if let Some(t) = tap {
                t.read(me, time.at(wall_ns()));
            }
            // The kernel's arrival time where it gave one (clock sync asks
            // for it), unless it may be from before a step of the clock.
            let now = match stamp.map(|w| skew.local(time.at(w))) {
                Some(s) if s >= stale_below => s,
                Some(_) => skew.local(time.at(wall_ns())),
                None => now,
            };
            if let (true, Outcome::New { owd_ns, hops, .. }) = (live.is_receiver(), live.handle_packet(now, b, &mut tx))
            {
                if let Some(h) = hists.as_deref_mut() {
                    record(&mut h.owd, owd_ns.max(0) as u64);
                }
                if let Some(t) = tap {
                    t.arrival(hops, owd_ns.max(0) as u64);
                }
            }
        });
        if n > 0 {
            self.io.recv_calls += 1;
            self.io.packets_in += n as u64;
        }
        n
    }

    fn sync(&self) -> &ClockSync {
        self.live.sync()
    }

    /// Tells the clock sync of a step of this node's clock the moment one is
    /// seen (see [`ClockSteps`]); `now` is wall time.
    fn watch_steps(&mut self, now: u64) {
        if self.cfg.clock.sync.mode == fairfeed_clock::SyncMode::Off {
            return;
        }
        let skew = self.cfg.clock.skew;
        let mut step: Option<(i64, u64, &str)> = None;
        if !self.steps.injected_told && !skew.step_silent {
            if let Some((_, d)) = skew.step_by(self.cfg.time.at(now)) {
                self.steps.injected_told = true;
                step = Some((d, 0, "injected (--clock-step-ns)"));
            }
        }
        if now >= self.steps.next_check_wall {
            self.steps.next_check_wall = now.saturating_add(STEP_CHECK_NS);
            if let Some(s) = self.steps.watch.observe(fairfeed_io::clock::realtime_minus_monotonic()) {
                // Wall ns to this node's clock: through the time base's dilation and the skew's drift.
                let scale = (1.0 + skew.drift_ppm * 1e-6) / self.cfg.time.dilation;
                let d = (s.delta_ns as f64 * scale).round() as i64;
                step = Some((d, (s.uncertainty_ns as f64 * scale).ceil() as u64 + 1, "the host's"));
            }
        }
        let Some((d, u, whose)) = step else { return };
        let local = self.local_at(wall_ns());
        self.live.sync_mut().clock_stepped_by(local, d, u);
        self.steps.stale_below = local.saturating_add(d.min(0).unsigned_abs());
        self.steps.told += 1;
        tracing::warn!(
            node = self.cfg.id,
            step_ns = d,
            uncertainty_ns = u,
            "{}: {whose} clock stepped by {d} ns (± {u} ns); the clock estimate moves with it (counter clock_steps)",
            self.who
        );
    }

    /// Says so, once per change, when the clock's bound goes above its limit or comes back.
    fn clock_alarm(&mut self) {
        let (over, bound) = (self.sync().stats.over_limit, self.sync().stats.bound_ns);
        let watched = self.cfg.clock.sync.mode != fairfeed_clock::SyncMode::Off || self.cfg.clock.host_bound.is_some();
        if over != self.steps.over_limit && watched {
            self.steps.over_limit = over;
            let who = &self.who;
            if over {
                let b = if bound == u64::MAX { "unknown".to_string() } else { format!("{bound} ns") };
                tracing::warn!(
                    node = self.cfg.id,
                    bound_ns = bound,
                    limit_ns = self.cfg.clock.sync.bound_limit_ns,
                    "{who}: clock error bound {b} is above the limit of {} ns; this node's releases are left out \
                     of fairness figures until it is back (counter over_limit_events)",
                    self.cfg.clock.sync.bound_limit_ns
                );
            } else {
                tracing::info!(
                    node = self.cfg.id,
                    bound_ns = bound,
                    limit_ns = self.cfg.clock.sync.bound_limit_ns,
                    "{who}: clock error bound back within {} ns ({bound} ns)",
                    self.cfg.clock.sync.bound_limit_ns
                );
            }
        }
    }

    /// Timers and releases at `now` on this node's clock; returns what it did.
    fn timers(&mut self, now: u64) -> usize {
        let (skew, time) = (self.cfg.clock.skew, self.cfg.time);
        let mut work = 0;
        let mut tx = Pending { addrs: &self.io.addrs, handed: &mut self.io.handed, kernel: self.io.kernel.as_mut() };
        if self.live.next_timeout().is_some_and(|t| t <= now) {
            // A fresh reading: probes sent now carry it as their send stamp.
            let fresh = skew.local(time.at(wall_ns()));
            self.live.handle_timeout(fresh, &mut tx);
            work += 1;
        }
        while let Some(m) = self.live.poll_release() {
            // True time for the application and the log; the
            // synchronized clock for how precisely the deadline was met.
            let wall = wall_ns();
            let t = time.at(wall);
            let local = skew.local(t);
            let t_sync = self.live.sync().now_sync(local);
            if let (false, Some(h)) = (m.late, self.rel.hists.as_deref_mut()) {
                record(&mut h.release_error, t_sync.saturating_sub(m.deadline_ns));
                record(&mut h.hold, m.deadline_ns.saturating_sub(m.arrival_ns));
            }
            self.rel.max_released_seq = self.rel.max_released_seq.max(m.sequence);
            // The fleet view lines receivers up by sequence: over several
            // trees, tree 0's (each tree numbers its own; all receivers take tree 0).
            if self.rel.releases.is_some() && m.tree == 0 {
                self.rel.release_batch.push(Release {
                    sequence: m.sequence,
                    at_ns: t_sync,
                    late: m.late,
                    clock_ok: m.clock_ok,
                });
            }
            // The deadline as a wall time: this release's, moved by how far off the deadline is.
            let deadline_wall_ns = wall.saturating_add_signed(m.deadline_ns as i64 - t_sync as i64);
            (self.rel.on_release)(&m, ReleaseAt { wall_ns: wall, true_ns: t, local_ns: local, deadline_wall_ns });
            if self.cfg.job_keeps_log() && self.rel.rows.len() < LOG_ROWS_MAX {
                self.rel.rows.push(ReleaseRow {
                    sequence: m.sequence,
                    send_ns: m.send_ns,
                    deadline_ns: m.deadline_ns,
                    arrival_ns: m.arrival_ns,
                    release_ns: t,
                    late: m.late,
                });
            }
            if let Some(d) = &mut self.rel.delivery {
                if d.push(Delivered { true_ns: t, deadline_wall_ns, payload: m.payload.into_vec() }).is_err() {
                    self.rel.delivery_full += 1;
                }
            }
            work += 1;
        }
        if work > 0 {
            if let Some(d) = &self.rel.delivery {
                d.wake();
            }
        }
        if let Some(log) = &self.rel.releases {
            log.push_all(&self.rel.release_batch);
            self.rel.release_batch.clear();
        }
        work
    }

    /// Membership at wall time `now`: heartbeats, and a newer view put in
    /// force — the addresses it names, then the links. Returns what it did.
    fn membership_turn(&mut self, now: u64) -> usize {
        let Some(m) = &mut self.membership else { return 0 };
        let Some(v) = m.turn(now, &self.io.sock) else { return 0 };
        for p in &v.peers {
            let i = p.id as usize;
            if i >= IDS_MAX {
                continue;
            }
            if self.io.addrs.len() <= i {
                self.io.addrs.resize(i + 1, None);
            }
            self.io.addrs[i] = Some(p.addr);
        }
        match self.live.set_links(&fairfeed_tree::controller::view_links(&v)) {
            Ok(()) => tracing::info!(
                node = self.cfg.id,
                version = v.version,
                "{}: topology version {}: parent {}, {} children, {} hedge targets, {} hedge parents",
                self.who,
                v.version,
                if v.parent == fairfeed_tree::membership::NO_PARENT {
                    "none".to_string()
                } else {
                    v.parent.to_string()
                },
                v.children.len(),
                v.hedge_targets.len(),
                v.hedge_parents.len()
            ),
            Err(e) => {
                tracing::warn!(node = self.cfg.id, "{}: topology version {} not applied: {e}", self.who, v.version)
            }
        }
        self.follow_probe_peers(&v);
        1
    }

    /// Clock sync under a controller: the node probes the neighbours its
    /// view names (parent, children, hedge parents and targets — each end
    /// of an edge names the other), as it would those of a planned topology.
    fn follow_probe_peers(&mut self, v: &fairfeed_tree::membership::Assign) {
        // A node out of the tree (a spare, or one leaving) keeps probing
        // its last neighbours: they may still be its neighbours next.
        if self.cfg.clock.sync.mode == fairfeed_clock::SyncMode::Off || v.layer == fairfeed_tree::membership::UNPLACED {
            return;
        }
        let topo = fairfeed_tree::controller::view_topology(v);
        let local = self.local_at(wall_ns());
        probe_as_planned(self.live.sync_mut(), self.cfg, &topo, v.id, local);
    }

    /// This node's clock at wall time `wall`.
    fn local_at(&self, wall: u64) -> u64 {
        self.cfg.clock.skew.local(self.cfg.time.at(wall))
    }

    /// Wall time at which this node's clock reads `local`.
    fn wall_at_local(&self, local: u64) -> u64 {
        super::wall_at_local(&self.cfg.clock.skew, &self.cfg.time, local)
    }

    /// Sends what is still waiting, stops the send thread, and reports
    /// (its own part: [`super::NodeAgents::finish`] adds the others').
    pub fn finish(mut self) -> AgentReport {
        let deadline = wall_ns() + DRAIN_NS;
        match &mut self.io.outbox {
            Outbox::Inline(e) => {
                while !e.is_empty() && wall_ns() < deadline {
                    e.flush(self.cfg.time.at(wall_ns()));
                }
            }
            Outbox::Ring(h) => {
                h.ring.close();
                if let Some(t) = h.thread.take() {
                    if let Ok(applied) = t.join() {
                        report(&self.who, &applied);
                        self.tuning.extend(applied);
                    }
                }
            }
        }
        if let Some(d) = &self.rel.delivery {
            d.close();
        }
        if let Some(m) = &mut self.membership {
            m.leave(&self.io.sock);
        }
        let mut r = self.snapshot(true);
        r.rows = std::mem::take(&mut self.rel.rows);
        r
    }

    /// The node's state machine.
    pub fn node(&self) -> &Node {
        &self.live
    }

    /// Copies sent and send calls that failed so far.
    pub fn sent(&self) -> (u64, u64) {
        (self.io.tx.packets_out.load(Ordering::Relaxed), self.io.tx.send_failed.load(Ordering::Relaxed))
    }
}

impl NodeAgent<'_> {
    /// Takes the resolver's new addresses, if any, and tells it of failed sends.
    fn follow_names(&mut self) {
        let Some(r) = &mut self.io.resolver else { return };
        let g = r.resolver.generation();
        if g != r.generation {
            r.generation = g;
            self.io.addrs = r.resolver.table();
        }
        let failed = self.io.tx.send_failed.load(Ordering::Relaxed);
        if failed != r.send_failed {
            r.send_failed = failed;
            r.resolver.send_failed();
        }
    }
}

impl Agent for NodeAgent<'_> {
    fn role(&self) -> &'static str {
        self.live.role_name()
    }

    /// Its last counters stand where readers look (`stat`, metrics, a dashboard).
    fn on_close(&mut self, _now: u64) {
        if let Some(p) = &self.poster {
            p.post_final(TreePart::Report(Box::new(self.snapshot(false))), self.hist_copies());
        }
    }

    fn do_work(&mut self, now: u64, turn: Turn) -> usize {
        self.watch_steps(now);
        self.post(now);
        self.follow_names();
        let local = self.local_at(now);
        let mut work = self.take_feed(local);
        let mut now = now;
        if turn == Turn::All {
            let got = self.receive(local);
            work += got;
            // A receiver's releases are timed on the clock after the read.
            if got > 0 && self.live.is_receiver() {
                now = wall_ns();
            }
        }
        work += self.timers(self.local_at(now));
        work += self.membership_turn(now);
        if let Some(k) = &self.cfg.keys {
            let g = k.generation();
            if g != self.key_generation {
                self.key_generation = g;
                self.live.set_keys(&k.keys());
            }
        }
        if let Some(l) = &self.rel.last_hop {
            let ns = l.load(std::sync::atomic::Ordering::Relaxed);
            if ns != self.rel.last_hop_ns {
                self.rel.last_hop_ns = ns;
                self.live.set_last_hop_ns(ns);
            }
        }
        if let Some(b) = &self.cfg.clock.host_bound {
            let b = b.load(std::sync::atomic::Ordering::Relaxed);
            if self.live.sync().host_bound() != Some(b) {
                self.live.sync_mut().set_host_bound(b);
            }
        }
        self.clock_alarm();
        // Emulated links and the send side run on true time: an emulated
        // link starts from the moment the copy is handed over.
        let t = if self.io.handed.out.is_empty() || self.io.emu.is_none() { now } else { wall_ns() };
        work + self.dispatch(self.cfg.time.at(t))
    }

    fn next_due(&self) -> u64 {
        if self.feed.as_ref().is_some_and(|f| !f.is_empty()) {
            return 0;
        }
        let mut due = self.live.next_timeout().map_or(u64::MAX, |t| self.wall_at_local(t));
        if let Outbox::Inline(e) = &self.io.outbox {
            due = due.min(e.next_due().map_or(u64::MAX, |d| self.cfg.time.wall_at(d)));
        }
        if let Some(p) = &self.poster {
            due = due.min(p.next_ns());
        }
        if let Some(m) = &self.membership {
            due = due.min(m.next_due());
        }
        due.min(self.life.end_wall_ns())
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds = vec![self.io.recv.fd(&self.io.sock)];
        if self.io.recv.waits_on_socket_too() {
            fds.push(self.io.sock.as_fd());
        }
        fds.extend(self.feed.iter().map(Incoming::fd));
        fds.extend(self.poster.iter().map(Poster::fd));
        fds
    }

    fn is_done(&self) -> bool {
        // A sender is done once its feed is (sent, and lingered).
        self.feed.as_ref().is_some_and(Incoming::is_finished) || self.life.over(wall_ns())
    }
}

impl AgentConfig {
    fn job_keeps_log(&self) -> bool {
        matches!(&self.job, Job::Receiver(r) if r.keep_log)
    }
}

impl NodeAgent<'_> {
    /// Posts its part of the report when it is time or the control agent
    /// asked (one atomic load per turn otherwise).
    fn post(&mut self, now: u64) {
        if self.poster.as_mut().is_some_and(|p| p.due(now)) {
            self.post_now();
        }
    }

    /// Posts its report and histograms (generation `gen`).
    pub fn post_now(&self) {
        let Some(p) = &self.poster else { return };
        p.post(TreePart::Report(Box::new(self.snapshot(false))), self.hist_copies());
    }

    /// Its histograms, whole: their quantiles are the reader's to compute.
    fn hist_copies(&self) -> fairfeed_io::counters::Hists {
        self.rel.hists.as_deref().map_or_else(Vec::new, |h| {
            vec![("owd", h.owd.clone()), ("hold", h.hold.clone()), ("release_error", h.release_error.clone())]
        })
    }

    /// The node's clock in its report: the host's bound, or the
    /// synchronization's estimate against what was injected.
    fn clock_json(&self) -> Option<serde_json::Value> {
        let sync = self.live.sync();
        let mut clock = None;
        if let Some(b) = sync.host_bound() {
            clock = Some(json!({
                "mode": "system",
                "host_bound_ns": (b != u64::MAX).then_some(b),
                "stats": sync.stats,
            }));
        }
        if self.cfg.clock.sync.mode != fairfeed_clock::SyncMode::Off {
            let skew = self.cfg.clock.skew;
            let mut t = self.cfg.time.at(wall_ns());
            // An injected step this agent has not yet told its clock of (it
            // does, first thing, next turn): as of just before the step.
            if let (false, false, Some((at, _))) = (self.steps.injected_told, skew.step_silent, skew.step_by(t)) {
                t = at.saturating_sub(1);
            }
            let local = skew.local(t);
            clock = Some(json!({
                "true_ns": t,
                "mode": self.cfg.clock.sync.mode,
                "stats": sync.stats,
                "offset_now_ns": sync.offset_at(local),
                "bound_now_ns": sync.bound_ns(local),
                "injected_offset_ns": skew.error_at(t),
            }));
        }
        clock
    }

    /// The node's report; `with_latency`: with the histograms' quantiles.
    fn snapshot(&self, with_latency: bool) -> AgentReport {
        let now = wall_ns();
        let tx = &self.io.tx;
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let mut counters = json!({
            "packets_in": self.io.packets_in,
            "recv_calls": self.io.recv_calls,
            "packets_out": l(&tx.packets_out),
            "replicated_in_kernel": self.io.kernel.as_ref().map_or(0, |k| k.copies),
            "send_calls": l(&tx.send_calls),
            "send_failed": l(&tx.send_failed),
            "queue_full": l(&tx.queue_full),
            "unknown_destination": self.io.handed.unknown,
            "buffers_allocated": self.io.handed.pool.allocated,
            "clock_steps": self.steps.told,
        });
        if let Some(r) = &self.io.resolver {
            counters["resolve"] = serde_json::to_value(r.resolver.stats()).unwrap_or_default();
        }
        if let Some(k) = &self.cfg.keys {
            counters["keys"] = serde_json::to_value(k.stats()).unwrap_or_default();
        }
        if let Some(d) = &self.io.deadlines {
            counters["deadline_records"] =
                json!({ "records": d.records, "datagrams": d.datagrams, "send_errors": d.send_errors });
        }
        if let Some(m) = &self.membership {
            counters["membership"] = m.counters();
        }
        let mut node = node_stats(&self.live);
        if let Some(c) = self.clock_json() {
            node["clock"] = c;
        }
        let mut latency = json!({});
        if self.live.is_receiver() {
            if let Node::Receiver(r) = &self.live {
                // Sequences never released: the tree lost them (and, when filling
                // is on, the arbitrator below asked for their MoldUDP64 messages).
                counters["overlay_missing"] = self.rel.max_released_seq.saturating_sub(r.stats.released).into();
            }
            if let Some(h) = self.rel.hists.as_ref().filter(|_| with_latency) {
                latency = json!({
                    "owd": summary(&h.owd),
                    "hold": summary(&h.hold),
                    "release_error": summary(&h.release_error),
                });
            }
        }
        if self.rel.delivery.is_some() {
            counters["delivery_queue_full"] = self.rel.delivery_full.into();
        }
        if let Some((first, last)) = self.rel.releases.as_ref().and_then(|l| l.range()) {
            counters["release_log"] = json!({"first": first, "last": last});
        }
        AgentReport {
            id: self.cfg.id,
            role: format!("{:?}", self.role).to_lowercase(),
            addr: self.addr.to_string(),
            uptime_s: now.saturating_sub(self.started_ns) as f64 / 1e9,
            counters,
            node,
            latency,
            tuning: self.tuning.clone(),
            rows: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_pool_reuses_a_buffer_once_every_copy_is_sent_and_allocates_only_for_copies_in_flight() {
        let mut pool = BufferPool::default();
        // Steady forwarding: each packet's copies are sent (dropped) before the next.
        for k in 0..10_000u32 {
            let b = pool.take(&k.to_be_bytes());
            let copies: Vec<_> = (0..20).map(|_| b.clone()).collect();
            assert_eq!(&b[..], &k.to_be_bytes());
            drop((b, copies));
        }
        assert_eq!(pool.allocated, 1, "one buffer for 10,000 packets");
        // Copies held by a link (in flight): new buffers, up to what is held.
        let held: Vec<_> = (0..100u32).map(|k| pool.take(&k.to_be_bytes())).collect();
        assert_eq!(pool.allocated, 100, "the free one reused, 99 more for the copies in flight");
        assert!(held.iter().enumerate().all(|(k, b)| b[..] == (k as u32).to_be_bytes()), "no buffer handed out twice");
        drop(held);
        for k in 0..1_000u32 {
            drop(pool.take(&k.to_be_bytes()));
        }
        assert_eq!(pool.allocated, 100, "once sent, every buffer is reused");
        // The pool keeps at most BUFFER_POOL_MAX.
        let many: Vec<_> = (0..BUFFER_POOL_MAX as u32 + 10).map(|k| pool.take(&k.to_be_bytes())).collect();
        assert!(pool.ring.len() <= BUFFER_POOL_MAX);
        drop(many);
    }
}
