//! The node loop.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fairfeed_arb::retransmit::{Journal, RetransmitServer, ServerConfig};
use fairfeed_arb::spec::SeqSpec;
use fairfeed_arb::{Arbitrator, Config as ArbConfig, Mode, RetransmitConfig, Sink, Source, Start, Stream, Window};
use fairfeed_clock::ClockSync;
use fairfeed_io::agent::{Agent, RunConfig, Turn};
use fairfeed_model::LinkEmulator;
use fairfeed_tree::node::{Node, Outcome, Released, Transmit};
use fairfeed_tree::plan::{probe_graph, probe_strides, Node as PlanNode, Role};
use fairfeed_wire::moldudp64::RequestRepr;
use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;
use serde_json::json;

use super::egress::{egress_ring, Copy, Egress, EgressAgent, EgressHandle, TxCounters};
use super::{wall_ns, AgentConfig, AgentReport, Job, ReleaseAt, ReleaseRow, Threading, LOG_ROWS_MAX, RING_CAPACITY};
use super::{SOCKET_RECV_BUFFER, SPIN_AHEAD_NS};
use crate::arb::live::bind_udp;
use crate::batch::BatchRecv;
use crate::idle::IdleStrategy;
use crate::tuning::{report, Applied};

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

/// Copies the node handed out during one call into its state machine.
struct Pending<'a> {
    addrs: &'a [Option<SocketAddr>],
    out: &'a mut Vec<(u32, SocketAddr, Arc<[u8]>)>,
    unknown: &'a mut u64,
}

impl Pending<'_> {
    fn copy(&mut self, to: u32, shared: &Arc<[u8]>) {
        match self.addrs.get(to as usize) {
            Some(Some(addr)) => self.out.push((to, *addr, shared.clone())),
            _ => *self.unknown += 1,
        }
    }
}

impl Transmit for Pending<'_> {
    fn send(&mut self, to: u32, bytes: &[u8]) {
        self.copy(to, &Arc::from(bytes));
    }

    /// One shared buffer for all the copies (the send side's `sendmmsg` points every message at it).
    fn send_all(&mut self, to: &[u32], bytes: &[u8]) {
        let shared: Arc<[u8]> = Arc::from(bytes);
        for &t in to {
            self.copy(t, &shared);
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
/// How often a spinning node looks at its control socket (a request waits at most this long).
const CONTROL_POLL_NS: u64 = 1_000_000;
const PUBLISH_INTERVAL_NS: u64 = crate::publish::PUBLISH_INTERVAL.as_nanos() as u64;
/// A parked node wakes at least this often (to see a stop signal).
const PARK_MAX_NS: u64 = 100_000_000;
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

fn summary(h: &Histogram<u64>) -> serde_json::Value {
    json!({
        "count": h.len(),
        "p50_us": h.value_at_quantile(0.5) as f64 / 1e3,
        "p99_us": h.value_at_quantile(0.99) as f64 / 1e3,
        "p999_us": h.value_at_quantile(0.999) as f64 / 1e3,
        "max_us": h.max() as f64 / 1e3,
    })
}

/// The retransmission server a sender runs over its own journal.
struct Journaled {
    server: RetransmitServer,
    sock: UdpSocket,
    answers: u64,
    journal_errors: u64,
}

/// A sender's schedule.
struct Feed {
    job: super::SenderJob,
    t0: u64,
    gap_ns: u64,
    next: usize,
    last_sent_ns: u64,
    journal: Option<Journaled>,
}

/// Where a receiver's releases go.
struct Delivery {
    sock: UdpSocket,
    to: Option<SocketAddr>,
    fill: Option<(Arbitrator, UdpSocket, SocketAddr)>,
    counts: DeliveryCounts,
}

#[derive(Default)]
struct DeliveryCounts {
    delivered: u64,
    failed: u64,
    requests: u64,
}

struct DeliverSink<'a> {
    sock: &'a UdpSocket,
    to: Option<SocketAddr>,
    req: &'a UdpSocket,
    server: SocketAddr,
    counts: &'a mut DeliveryCounts,
}

impl Sink for DeliverSink<'_> {
    fn emit(&mut self, stream: Stream, packet: &[u8]) {
        if stream != Stream::HighReliability {
            return;
        }
        self.counts.delivered += 1;
        if let Some(to) = self.to {
            if self.sock.send_to(packet, to).is_err() {
                self.counts.failed += 1;
            }
        }
    }

    fn request(&mut self, r: RequestRepr) {
        let mut b = [0u8; fairfeed_wire::moldudp64::HEADER_LEN];
        if r.emit(&mut b).is_ok() && self.req.send_to(&b, self.server).is_ok() {
            self.counts.requests += 1;
        }
    }
}

impl Delivery {
    fn new(job: &super::ReceiverJob) -> Result<Self, AgentError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |e| AgentError::Io(what, e)
        };
        let sock = UdpSocket::bind("0.0.0.0:0").map_err(io("binding the delivery socket"))?;
        let fill = match job.retransmit {
            None => None,
            Some(server) => {
                let cfg = ArbConfig {
                    lines: 1,
                    window: Window { mode: Mode::Time, max_hold_ns: 200_000_000, max_count_msgs: 1_000_000 },
                    start: Start::First,
                    retransmit: Some(RetransmitConfig {
                        grace_ns: 1_000_000,
                        adaptive_grace: false,
                        ..Default::default()
                    }),
                    ..ArbConfig::default()
                };
                let arb = Arbitrator::new(cfg, SeqSpec::moldudp64()).map_err(AgentError::Config)?;
                let any = SocketAddr::from(([0, 0, 0, 0], 0));
                let s = bind_udp(any, 4 << 20).map_err(io("binding the retransmission socket"))?;
                Some((arb, s, server))
            }
        };
        Ok(Delivery { sock, to: job.deliver, fill, counts: DeliveryCounts::default() })
    }

    fn release(&mut self, now: u64, payload: &[u8]) {
        match &mut self.fill {
            Some((arb, req, server)) => {
                let mut sink =
                    DeliverSink { sock: &self.sock, to: self.to, req, server: *server, counts: &mut self.counts };
                arb.handle_packet(now, Source::Line(0), payload, &mut sink);
            }
            None => {
                self.counts.delivered += 1;
                if let Some(to) = self.to {
                    if self.sock.send_to(payload, to).is_err() {
                        self.counts.failed += 1;
                    }
                }
            }
        }
    }

    /// Answers from the retransmission server, and the arbitrator's timers.
    fn service(&mut self, now: u64, buf: &mut [u8]) {
        let Some((arb, req, server)) = &mut self.fill else { return };
        let mut sink = DeliverSink { sock: &self.sock, to: self.to, req, server: *server, counts: &mut self.counts };
        while let Ok(n) = sink.req.recv(buf) {
            arb.handle_packet(now, Source::Retransmit, &buf[..n], &mut sink);
        }
        if arb.next_timeout().is_some_and(|t| t <= now) {
            arb.handle_timeout(now, &mut sink);
        }
    }
}

/// One tree node as an agent: its socket, its state machine, its feed (a
/// sender) or delivery (a receiver), its control socket and, inline or on a
/// thread of its own, its send side. [`run_agent`] runs one per process;
/// the demo runs a tree of them on one thread.
pub struct NodeAgent<'c> {
    cfg: &'c AgentConfig,
    who: String,
    role: Role,
    addr: SocketAddr,
    sock: UdpSocket,
    addrs: Vec<Option<SocketAddr>>,
    live: Node,
    emu: Option<LinkEmulator>,
    pending: Vec<(u32, SocketAddr, Arc<[u8]>)>,
    outbox: Outbox,
    tx: Arc<TxCounters>,
    recv: BatchRecv,
    packets_in: u64,
    recv_calls: u64,
    unknown_destination: u64,
    /// None when a harness taps the agent (it keeps its own measures, and
    /// a hundred agents' histograms on one thread cost cache misses per release).
    hists: Option<Box<Hists>>,
    rows: Vec<ReleaseRow>,
    max_released_seq: u64,
    feed: Option<Feed>,
    delivery: Option<Delivery>,
    ctl: Option<UdpSocket>,
    next_control_ns: u64,
    next_publish_ns: u64,
    /// Asked to stop on the control socket.
    stopped: bool,
    started_ns: u64,
    tuning: Vec<Applied>,
    scratch: Vec<u8>,
    /// The clock was over its bound limit at the last look (said once per change).
    clock_over_limit: bool,
    on_release: OnRelease<'c>,
}

/// What a node agent calls with each release.
type OnRelease<'c> = Box<dyn FnMut(&Released, ReleaseAt) + 'c>;

fn parse_addr(n: &PlanNode) -> Result<Option<SocketAddr>, AgentError> {
    match &n.addr {
        None => Ok(None),
        Some(a) => a
            .parse()
            .map(Some)
            .map_err(|e| AgentError::Config(format!("node {}: address {a:?} is not IP:PORT ({e})", n.id))),
    }
}

/// Addresses by node id, and this node's entry; errors name what is missing.
fn addresses(cfg: &AgentConfig) -> Result<(Vec<Option<SocketAddr>>, PlanNode), AgentError> {
    let tree = cfg.topology.trees.first().ok_or_else(|| AgentError::Config("the topology has no tree".into()))?;
    let n_ids = tree.nodes.iter().map(|n| n.id as usize + 1).max().unwrap_or(0);
    let mut addrs = vec![None; n_ids];
    for n in &tree.nodes {
        addrs[n.id as usize] = parse_addr(n)?;
    }
    let me = tree.nodes.iter().find(|n| n.id == cfg.id).cloned().ok_or_else(|| {
        AgentError::Config(format!("no node {} in the topology (ids 0..{})", cfg.id, n_ids.saturating_sub(1)))
    })?;
    let sender = tree.nodes.iter().find(|n| n.role == Role::Sender).map_or(0, |n| n.id);
    let mut needed: Vec<u32> = vec![me.id];
    needed.extend(&me.children);
    needed.extend(&me.hedge_targets);
    if me.role != Role::Sender {
        needed.push(me.parent.unwrap_or(sender));
    }
    for id in needed {
        if addrs.get(id as usize).and_then(|a| a.as_ref()).is_none() {
            return Err(AgentError::Config(format!(
                "node {id} has no address in the topology (plan it with --loopback-port or --address ID=IP:PORT)"
            )));
        }
    }
    Ok((addrs, me))
}

fn start_feed(job: &super::SenderJob, now: u64) -> Result<Feed, AgentError> {
    if job.rate_per_s.is_nan() || job.rate_per_s <= 0.0 {
        return Err(AgentError::Config("the sender's rate must be positive".into()));
    }
    let journal = match job.retransmit_listen {
        None => None,
        Some(a) => Some(Journaled {
            server: RetransmitServer::new(Journal::new(), ServerConfig::default()),
            sock: bind_udp(a, 1 << 20)
                .map_err(|e| AgentError::Io(format!("binding the retransmission server to {a}"), e))?,
            answers: 0,
            journal_errors: 0,
        }),
    };
    Ok(Feed {
        job: job.clone(),
        t0: now + job.start_delay_ns,
        gap_ns: (1e9 / job.rate_per_s) as u64,
        next: 0,
        last_sent_ns: now,
        journal,
    })
}

fn start_outbox(cfg: &AgentConfig, sock: &UdpSocket, tx: &Arc<TxCounters>) -> Result<Outbox, AgentError> {
    let send_sock = sock.try_clone().map_err(|e| AgentError::Io("cloning the socket".into(), e))?;
    Ok(match cfg.threads {
        Threading::One => Outbox::Inline(Egress::new(send_sock, tx.clone(), cfg.tap.clone())),
        Threading::Split => {
            let (mut handle, parts) =
                egress_ring(RING_CAPACITY).map_err(|e| AgentError::Io("making the send ring".into(), e))?;
            let (tuning, counters, tap, time, idle) =
                (cfg.tuning.clone(), tx.clone(), cfg.tap.clone(), cfg.time, cfg.idle);
            // Built on its thread: the batch headers hold raw pointers and stay there.
            let make = move || {
                let applied = tuning.apply_thread(1);
                if idle != IdleStrategy::Spin {
                    let _ = nix::sys::prctl::set_timerslack(1_000);
                }
                EgressAgent::new(parts, Egress::new(send_sock, counters, tap), time, applied)
            };
            let rc = RunConfig { idle, spin_ahead_ns: SPIN_AHEAD_NS, park_max_ns: PARK_MAX_NS, stop: None };
            let thread = fairfeed_io::agent::spawn("fairfeed-tx", rc, make, |a, _| a.applied)
                .map_err(|e| AgentError::Io("starting the send thread".into(), e))?;
            handle.thread = Some(thread);
            Outbox::Ring(handle)
        }
    })
}

fn start_sync(cfg: &AgentConfig, me: &PlanNode, sender: u32) -> ClockSync {
    if cfg.clock.sync.mode == fairfeed_clock::SyncMode::Off {
        return ClockSync::off(me.id);
    }
    let graph = probe_graph(&cfg.topology, 0, cfg.clock.random_peers, cfg.seed);
    let peers = graph.get(&me.id).cloned().unwrap_or_default();
    let mut sync = ClockSync::new(me.id, &peers, me.id == sender, cfg.clock.sync);
    let strides = probe_strides(&cfg.topology, 0, &graph, cfg.clock.sync.peer_budget);
    sync.set_strides(strides.get(&me.id).map_or(&[][..], |v| &v[..]));
    sync
}

impl<'c> NodeAgent<'c> {
    /// Node `cfg.id` on `sock` (bound to its address in the topology when
    /// `None`); each release at a receiver is handed to `on_release`.
    pub fn new(
        cfg: &'c AgentConfig,
        sock: Option<UdpSocket>,
        on_release: impl FnMut(&Released, ReleaseAt) + 'c,
    ) -> Result<Self, AgentError> {
        let (addrs, me) = addresses(cfg)?;
        let addr = addrs[me.id as usize].expect("checked by addresses()");
        let sock = match sock {
            Some(s) => s,
            None => bind_udp(addr, SOCKET_RECV_BUFFER).map_err(|e| {
                AgentError::Io(format!("node {}: binding {addr} (in use, or not an address of this host?)", me.id), e)
            })?,
        };
        let stamped = cfg.clock.sync.mode != fairfeed_clock::SyncMode::Off;
        if stamped {
            // Probes need each datagram's own arrival time (two probes read in one
            // batch would otherwise share one reading).
            crate::batch::enable_rx_timestamps(&sock)
                .map_err(|e| AgentError::Io(format!("node {}: SO_TIMESTAMPNS", me.id), e))?;
        }
        let mut tuning = cfg.tuning.apply_process();
        tuning.extend(cfg.tuning.apply_thread(0));
        tuning.extend(cfg.tuning.apply_socket(&sock));
        let sender = cfg.topology.trees[0].nodes.iter().find(|n| n.role == Role::Sender).map_or(0, |n| n.id);
        let hedge_parents = fairfeed_tree::plan::hedge_parents(&cfg.topology, 0).remove(&me.id).unwrap_or_default();
        let live = match (&me.role, &cfg.job) {
            (Role::Sender, Job::Sender(_)) | (Role::Proxy, Job::Proxy) | (Role::Receiver, Job::Receiver(_)) => {
                Node::from_plan(&me, sender, hedge_parents, cfg.node, cfg.rule, start_sync(cfg, &me, sender))
                    .with_auth(cfg.auth.clone())
            }
            (role, _) => {
                return Err(AgentError::Config(format!(
                    "node {} is a {role:?} in the topology; start it with `fairfeed {}`",
                    me.id,
                    format!("{role:?}").to_lowercase()
                )))
            }
        };
        let now = wall_ns();
        let feed = match &cfg.job {
            Job::Sender(j) => Some(start_feed(j, cfg.clock.skew.local(cfg.time.at(now)))?),
            _ => None,
        };
        let delivery = match &cfg.job {
            Job::Receiver(j) if j.deliver.is_some() || j.retransmit.is_some() => Some(Delivery::new(j)?),
            _ => None,
        };
        let ctl = match cfg.control {
            Some(c) => {
                Some(bind_udp(c, 1 << 16).map_err(|e| AgentError::Io(format!("binding the control socket {c}"), e))?)
            }
            None => None,
        };
        let tx = Arc::new(TxCounters::default());
        let outbox = start_outbox(cfg, &sock, &tx)?;
        let emu = cfg
            .link
            .map(|l| LinkEmulator::new(l, ChaCha12Rng::seed_from_u64(cfg.seed ^ u64::from(me.id)), addrs.len()));
        Ok(NodeAgent {
            cfg,
            who: format!("{} {}", format!("{:?}", me.role).to_lowercase(), me.id),
            role: me.role,
            addr,
            sock,
            addrs,
            live,
            emu,
            pending: Vec::with_capacity(256),
            outbox,
            tx,
            recv: BatchRecv::new(stamped),
            packets_in: 0,
            recv_calls: 0,
            unknown_destination: 0,
            hists: (cfg.tap.is_none() || cfg.publish.is_some()).then(|| {
                let d = if cfg.tap.is_some() { HIST_DIGITS_TAPPED } else { HIST_DIGITS };
                Box::new(Hists { owd: hist(d), hold: hist(d), release_error: hist(d) })
            }),
            rows: Vec::new(),
            max_released_seq: 0,
            feed,
            delivery,
            ctl,
            next_control_ns: 0,
            // Nodes on one thread (the demo) publish at staggered instants,
            // so that no turn copies every node's histograms at once.
            next_publish_ns: wall_ns() + PUBLISH_INTERVAL_NS / 16 * u64::from(cfg.id % 16),
            stopped: false,
            started_ns: now,
            tuning,
            scratch: vec![0u8; 2048],
            // Unsynchronized at start is expected, not an alarm.
            clock_over_limit: true,
            on_release: Box::new(on_release),
        })
    }
}

impl NodeAgent<'_> {
    /// Hands what the state machine sent to the send side, each copy at the
    /// time its emulated link delivers it (now, without emulation); true
    /// time `now`. Returns the copies sent now.
    fn dispatch(&mut self, now: u64) -> usize {
        let id = self.cfg.id;
        let handed = self.pending.len();
        for (to_id, to, bytes) in self.pending.drain(..) {
            let dues = match &mut self.emu {
                Some(e) => e.arrivals(now, id, to_id),
                None => [Some(now), None],
            };
            for due_ns in dues.into_iter().flatten() {
                let c = Copy { due_ns, to, bytes: bytes.clone(), handed_ns: now, model_ns: due_ns - now };
                match &mut self.outbox {
                    Outbox::Inline(e) => e.push(c),
                    Outbox::Ring(h) => {
                        if h.ring.push(c).is_err() {
                            self.tx.queue_full.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        match &mut self.outbox {
            Outbox::Inline(e) => e.flush(now) as usize,
            Outbox::Ring(h) => {
                if handed > 0 {
                    h.nudge();
                }
                0
            }
        }
    }

    /// The sender's packets that are due; true if it sent any.
    fn send_feed(&mut self, now: u64) -> bool {
        let (Some(f), Node::Sender(s)) = (&mut self.feed, &mut self.live) else { return false };
        let mut sent = false;
        let mut budget = 64;
        while f.next < f.job.payloads.len() && now >= f.t0 + f.next as u64 * f.gap_ns && budget > 0 {
            let p = &f.job.payloads[f.next];
            let mut tx = Pending { addrs: &self.addrs, out: &mut self.pending, unknown: &mut self.unknown_destination };
            s.handle_message(now, p, &mut tx);
            // As the simulator does: the deadline rule sees fresh reports at once.
            s.update(now);
            if let Some(j) = &mut f.journal {
                if j.server.journal_mut().append_packet(p).is_err() {
                    j.journal_errors += 1;
                }
            }
            f.next += 1;
            f.last_sent_ns = now;
            budget -= 1;
            sent = true;
        }
        if let Some(j) = &mut f.journal {
            let mut out = [0u8; fairfeed_wire::moldudp64::PACKET_LEN_DEFAULT_MAX];
            while let Ok((n, from)) = j.sock.recv_from(&mut self.scratch) {
                if let Some(len) = j.server.handle_request(now, from, &self.scratch[..n], &mut out) {
                    if j.sock.send_to(&out[..len], from).is_ok() {
                        j.answers += 1;
                    }
                }
            }
        }
        sent
    }

    /// Reads what is waiting; returns the number of datagrams.
    fn receive(&mut self, now: u64) -> usize {
        let live = &mut self.live;
        let mut tx = Pending { addrs: &self.addrs, out: &mut self.pending, unknown: &mut self.unknown_destination };
        let hists = &mut self.hists;
        let (skew, time, tap, me) = (self.cfg.clock.skew, self.cfg.time, self.cfg.tap.as_deref(), self.addr);
        let n = self.recv.recv_stamped(&self.sock, |b, stamp| {
            if let Some(t) = tap {
                t.read(me, time.at(wall_ns()));
            }
            // The kernel's arrival time where it gave one (clock sync asks for it).
            let now = stamp.map_or(now, |w| skew.local(time.at(w)));
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
            self.recv_calls += 1;
            self.packets_in += n as u64;
        }
        n
    }

    fn sync(&self) -> &ClockSync {
        self.live.sync()
    }

    /// Says so, once per change, when the clock's bound goes above its limit or comes back.
    fn clock_alarm(&mut self) {
        let (over, bound) = (self.sync().stats.over_limit, self.sync().stats.bound_ns);
        if over != self.clock_over_limit && self.cfg.clock.sync.mode != fairfeed_clock::SyncMode::Off {
            self.clock_over_limit = over;
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
        let mut tx = Pending { addrs: &self.addrs, out: &mut self.pending, unknown: &mut self.unknown_destination };
        if self.live.next_timeout() <= now {
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
            if let (false, Some(h)) = (m.late, self.hists.as_deref_mut()) {
                record(&mut h.release_error, t_sync.saturating_sub(m.deadline_ns));
                record(&mut h.hold, m.deadline_ns.saturating_sub(m.arrival_ns));
            }
            self.max_released_seq = self.max_released_seq.max(m.sequence);
            if let Some(d) = &mut self.delivery {
                d.release(t, &m.payload);
            }
            (self.on_release)(&m, ReleaseAt { wall_ns: wall, true_ns: t, local_ns: local });
            if self.cfg.job_keeps_log() && self.rows.len() < LOG_ROWS_MAX {
                self.rows.push(ReleaseRow {
                    sequence: m.sequence,
                    send_ns: m.send_ns,
                    deadline_ns: m.deadline_ns,
                    arrival_ns: m.arrival_ns,
                    release_ns: t,
                    late: m.late,
                });
            }
            work += 1;
        }
        if let Some(d) = &mut self.delivery {
            d.service(now, &mut self.scratch);
        }
        work
    }

    /// Answers control requests; true if asked to stop.
    fn control(&mut self) -> bool {
        let Some(ctl) = &self.ctl else { return false };
        let mut buf = [0u8; 256];
        let mut stop = false;
        while let Ok((n, from)) = ctl.recv_from(&mut buf) {
            let reply = match String::from_utf8_lossy(&buf[..n]).trim() {
                "stat" => serde_json::to_string(&self.snapshot(true)).unwrap_or_default(),
                "stop" => {
                    stop = true;
                    "stopping".to_string()
                }
                other => format!("unknown command {other:?}; try stat or stop"),
            };
            let _ = ctl.send_to(reply.as_bytes(), from);
        }
        stop
    }

    /// This node's clock at wall time `wall`.
    fn local_at(&self, wall: u64) -> u64 {
        self.cfg.clock.skew.local(self.cfg.time.at(wall))
    }

    /// Wall time at which this node's clock reads `local`.
    fn wall_at_local(&self, local: u64) -> u64 {
        self.cfg.time.wall_at(self.cfg.clock.skew.true_at(local))
    }

    fn feed_done(&self, local: u64) -> bool {
        self.feed
            .as_ref()
            .is_some_and(|f| f.next >= f.job.payloads.len() && local.saturating_sub(f.last_sent_ns) >= f.job.linger_ns)
    }

    /// Sends what is still waiting, stops the send thread, and reports.
    pub fn finish(mut self) -> AgentReport {
        let deadline = wall_ns() + DRAIN_NS;
        match &mut self.outbox {
            Outbox::Inline(e) => {
                while !e.is_empty() && wall_ns() < deadline {
                    e.flush(self.cfg.time.at(wall_ns()));
                }
            }
            Outbox::Ring(h) => {
                h.done.store(true, Ordering::Release);
                let _ = h.wake.write(1);
                if let Some(t) = h.thread.take() {
                    if let Ok(applied) = t.join() {
                        report(&self.who, &applied);
                        self.tuning.extend(applied);
                    }
                }
            }
        }
        let mut r = self.snapshot(true);
        r.rows = std::mem::take(&mut self.rows);
        r
    }

    /// The node's state machine.
    pub fn node(&self) -> &Node {
        &self.live
    }

    /// Copies sent and send calls that failed so far.
    pub fn sent(&self) -> (u64, u64) {
        (self.tx.packets_out.load(Ordering::Relaxed), self.tx.send_failed.load(Ordering::Relaxed))
    }
}

impl Agent for NodeAgent<'_> {
    fn do_work(&mut self, now: u64, turn: Turn) -> usize {
        // The control socket costs a system call per look: a spinning node
        // looks once per CONTROL_POLL_NS, a parked one whenever it wakes.
        if turn == Turn::All && (self.cfg.idle == IdleStrategy::Park || now >= self.next_control_ns) {
            self.next_control_ns = now + CONTROL_POLL_NS;
            self.stopped |= self.control();
            if self.cfg.publish.is_some() && now >= self.next_publish_ns {
                self.next_publish_ns = now + PUBLISH_INTERVAL_NS;
                self.publish();
            }
        }
        let local = self.local_at(now);
        let mut work = usize::from(self.send_feed(local));
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
        self.clock_alarm();
        // Emulated links and the send side run on true time: an emulated
        // link starts from the moment the copy is handed over.
        let t = if self.pending.is_empty() || self.emu.is_none() { now } else { wall_ns() };
        work + self.dispatch(self.cfg.time.at(t))
    }

    fn next_due(&self) -> u64 {
        let mut due = self.wall_at_local(self.live.next_timeout());
        if let Some(f) = &self.feed {
            let l = if f.next < f.job.payloads.len() {
                f.t0 + f.next as u64 * f.gap_ns
            } else {
                f.last_sent_ns.saturating_add(f.job.linger_ns)
            };
            due = due.min(self.wall_at_local(l));
        }
        if let Outbox::Inline(e) = &self.outbox {
            due = due.min(e.next_due().map_or(u64::MAX, |d| self.cfg.time.wall_at(d)));
        }
        if let Some(arb) = self.delivery.as_ref().and_then(|d| d.fill.as_ref()).and_then(|f| f.0.next_timeout()) {
            due = due.min(self.wall_at_local(arb));
        }
        if let Some(s) = self.cfg.max_seconds {
            due = due.min(self.started_ns.saturating_add((s * 1e9) as u64));
        }
        due
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds = vec![self.sock.as_fd()];
        if let Some(c) = &self.ctl {
            fds.push(c.as_fd());
        }
        if let Some(j) = self.feed.as_ref().and_then(|f| f.journal.as_ref()) {
            fds.push(j.sock.as_fd());
        }
        if let Some((_, s, _)) = self.delivery.as_ref().and_then(|d| d.fill.as_ref()) {
            fds.push(s.as_fd());
        }
        fds
    }

    fn is_done(&self) -> bool {
        if self.stopped || self.cfg.stop.load(Ordering::Relaxed) {
            return true;
        }
        if self.cfg.max_seconds.is_none() && self.feed.is_none() {
            return false;
        }
        let now = wall_ns();
        self.cfg.max_seconds.is_some_and(|s| now.saturating_sub(self.started_ns) as f64 / 1e9 >= s)
            || self.feed_done(self.local_at(now))
    }
}

impl AgentConfig {
    fn job_keeps_log(&self) -> bool {
        matches!(&self.job, Job::Receiver(r) if r.keep_log)
    }
}

impl NodeAgent<'_> {
    /// Puts the current counters and histograms where the metrics endpoint
    /// reads them (the agent does so every [`crate::publish::PUBLISH_INTERVAL`]).
    pub fn publish(&self) {
        let Some(slot) = &self.cfg.publish else { return };
        // Never wait for a reader: a slot being read is skipped this time
        // (the reader has the previous snapshot), so a scrape cannot stall the node.
        let mut p = match slot.try_lock() {
            Ok(p) => p,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        // The histograms go out whole; their quantiles are the reader's to compute.
        p.report = Some(self.snapshot(false));
        p.hists = self.hists.as_deref().map_or_else(Vec::new, |h| {
            vec![("owd", h.owd.clone()), ("hold", h.hold.clone()), ("release_error", h.release_error.clone())]
        });
    }

    /// The node's report; `with_latency`: with the histograms' quantiles.
    fn snapshot(&self, with_latency: bool) -> AgentReport {
        let now = wall_ns();
        let tx = &self.tx;
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let mut counters = json!({
            "packets_in": self.packets_in,
            "recv_calls": self.recv_calls,
            "packets_out": l(&tx.packets_out),
            "send_calls": l(&tx.send_calls),
            "send_failed": l(&tx.send_failed),
            "queue_full": l(&tx.queue_full),
            "unknown_destination": self.unknown_destination,
        });
        let mut node = match &self.live {
            Node::Sender(s) => serde_json::to_value(&s.stats),
            Node::Proxy(p) => serde_json::to_value(&p.stats),
            Node::Receiver(r) => serde_json::to_value(&r.stats),
        }
        .unwrap_or_default();
        let sync = self.live.sync();
        if self.cfg.clock.sync.mode != fairfeed_clock::SyncMode::Off {
            let skew = self.cfg.clock.skew;
            let t = self.cfg.time.at(wall_ns());
            let local = skew.local(t);
            node["clock"] = json!({
                "true_ns": t,
                "mode": self.cfg.clock.sync.mode,
                "stats": sync.stats,
                "offset_now_ns": sync.offset_at(local),
                "bound_now_ns": sync.bound_ns(local),
                "injected_offset_ns": skew.error_at(t),
            });
        }
        if let Some(f) = &self.feed {
            counters["feed_sent"] = f.next.into();
            counters["feed_total"] = f.job.payloads.len().into();
            if let Some(j) = &f.journal {
                counters["retransmit_answers"] = j.answers.into();
                counters["journal_errors"] = j.journal_errors.into();
                counters["journal_evicted"] = j.server.journal().evicted().into();
                counters["retransmit_server"] = serde_json::to_value(j.server.stats()).unwrap_or_default();
            }
        }
        let mut latency = json!({});
        if let Node::Receiver(r) = &self.live {
            // Sequences never released: the tree lost them (and, when filling
            // is on, the arbitrator below asked for their MoldUDP64 messages).
            counters["overlay_missing"] = self.max_released_seq.saturating_sub(r.stats.released).into();
            if let Some(h) = self.hists.as_ref().filter(|_| with_latency) {
                latency = json!({
                    "owd": summary(&h.owd),
                    "hold": summary(&h.hold),
                    "release_error": summary(&h.release_error),
                });
            }
        }
        if let Some(d) = &self.delivery {
            counters["delivered"] = d.counts.delivered.into();
            counters["deliver_failed"] = d.counts.failed.into();
            if let Some((arb, ..)) = &d.fill {
                counters["retransmit_requests"] = d.counts.requests.into();
                counters["fill"] = serde_json::to_value(arb.stats()).unwrap_or_default();
            }
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

/// Runs node `cfg.id` until it is told to stop, its time is up, or (a
/// sender) its feed is sent and the linger is over: the node's agent on this
/// thread and, split, its send side on a thread of its own. Each release at
/// a receiver is also handed to `on_release`.
pub fn run_agent(cfg: &AgentConfig, on_release: impl FnMut(&Released, ReleaseAt)) -> Result<AgentReport, AgentError> {
    let mut a = NodeAgent::new(cfg, None, on_release)?;
    if cfg.idle != IdleStrategy::Spin {
        // Wake from ppoll(2) when asked, not up to the default 50 µs later.
        let _ = nix::sys::prctl::set_timerslack(1_000);
    }
    report(&a.who, &a.tuning);
    tracing::info!(node = cfg.id, addr = %a.addr, "{}: running on {}", a.who, a.addr);
    let rc = RunConfig {
        idle: cfg.idle,
        spin_ahead_ns: SPIN_AHEAD_NS,
        park_max_ns: PARK_MAX_NS,
        stop: Some(cfg.stop.clone()),
    };
    fairfeed_io::agent::run(&mut [&mut a], &rc).map_err(|e| AgentError::Io(format!("{}: the node loop", a.who), e))?;
    let why = if cfg.stop.load(Ordering::Relaxed) { "stopped by a signal" } else { "finished" };
    tracing::info!(node = cfg.id, "{}: {why}", a.who);
    Ok(a.finish())
}
