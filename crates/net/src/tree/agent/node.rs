//! The node loop.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fairfeed_arb::retransmit::{Journal, RetransmitServer, ServerConfig};
use fairfeed_arb::spec::SeqSpec;
use fairfeed_arb::{Arbitrator, Config as ArbConfig, Mode, RetransmitConfig, Sink, Source, Start, Stream, Window};
use fairfeed_clock::ClockSync;
use fairfeed_model::LinkEmulator;
use fairfeed_tree::node::{Node, Outcome, Released, Transmit};
use fairfeed_tree::plan::{probe_graph, Node as PlanNode, Role};
use fairfeed_wire::moldudp64::RequestRepr;
use hdrhistogram::Histogram;
use nix::poll::{ppoll, PollFd, PollFlags};
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;
use serde_json::json;

use super::egress::{Copy, Egress, TxCounters};
use super::{wall_ns, AgentConfig, AgentReport, Job, ReleaseRow, Threading, LOG_ROWS_MAX, RING_CAPACITY};
use super::{SOCKET_RECV_BUFFER, SPIN_AHEAD_NS};
use crate::arb::live::bind_udp;
use crate::batch::BatchRecv;
use crate::idle::{IdleStrategy, Idler};
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
    out: &'a mut Vec<(SocketAddr, Arc<[u8]>)>,
    unknown: &'a mut u64,
}

impl Pending<'_> {
    fn copy(&mut self, to: u32, shared: &Arc<[u8]>) {
        match self.addrs.get(to as usize) {
            Some(Some(addr)) => self.out.push((*addr, shared.clone())),
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
    Ring {
        tx: rtrb::Producer<Copy>,
        done: Arc<AtomicBool>,
        /// The send thread is parked (or about to): wake it after pushing.
        sleeping: Arc<AtomicBool>,
        waker: std::thread::Thread,
        thread: Option<std::thread::JoinHandle<Vec<Applied>>>,
    },
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

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds")
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

/// The node, its socket and everything around it.
struct Agent<'c> {
    cfg: &'c AgentConfig,
    role: Role,
    addr: SocketAddr,
    sock: UdpSocket,
    addrs: Vec<Option<SocketAddr>>,
    live: Node,
    emu: Option<LinkEmulator>,
    pending: Vec<(SocketAddr, Arc<[u8]>)>,
    outbox: Outbox,
    tx: Arc<TxCounters>,
    recv: BatchRecv,
    packets_in: u64,
    recv_calls: u64,
    unknown_destination: u64,
    hists: Hists,
    rows: Vec<ReleaseRow>,
    max_released_seq: u64,
    feed: Option<Feed>,
    delivery: Option<Delivery>,
    ctl: Option<UdpSocket>,
    started_ns: u64,
    tuning: Vec<Applied>,
    scratch: Vec<u8>,
    /// The clock was over its bound limit at the last look (said once per change).
    clock_over_limit: bool,
}

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

/// The send thread's wait when it found nothing to do: its park is a thread
/// park until the node thread pushes (it unparks a sleeping send thread) or the
/// next copy is due.
fn idle_tx(idler: &mut Idler, asleep: &AtomicBool, ring: &rtrb::Consumer<Copy>, next_due: Option<u64>, now: u64) {
    idler.idle(now, || {
        asleep.store(true, Ordering::SeqCst);
        // Re-check after announcing the sleep: a push in between is not missed.
        if ring.is_empty() {
            let wait = next_due.map_or(100_000_000, |d| d.saturating_sub(now)).min(100_000_000);
            std::thread::park_timeout(std::time::Duration::from_nanos(wait));
        }
        asleep.store(false, Ordering::SeqCst);
    });
}

fn start_outbox(cfg: &AgentConfig, sock: &UdpSocket, tx: &Arc<TxCounters>) -> Result<Outbox, AgentError> {
    let send_sock = sock.try_clone().map_err(|e| AgentError::Io("cloning the socket".into(), e))?;
    Ok(match cfg.threads {
        Threading::One => Outbox::Inline(Egress::new(send_sock, tx.clone())),
        Threading::Split => {
            let (ptx, mut crx) = rtrb::RingBuffer::<Copy>::new(RING_CAPACITY);
            let done = Arc::new(AtomicBool::new(false));
            let sleeping = Arc::new(AtomicBool::new(false));
            let (d, tuning, counters) = (done.clone(), cfg.tuning.clone(), tx.clone());
            let (asleep, idle) = (sleeping.clone(), cfg.idle);
            let thread = std::thread::Builder::new()
                .name("fairfeed-tx".into())
                .spawn(move || {
                    // Built here: the batch headers hold raw pointers and stay on this thread.
                    let mut egress = Egress::new(send_sock, counters);
                    let applied = tuning.apply_thread(1);
                    if idle != IdleStrategy::Spin {
                        let _ = nix::sys::prctl::set_timerslack(1_000);
                    }
                    let mut idler = Idler::new(idle);
                    loop {
                        let finished = d.load(Ordering::Acquire);
                        let mut got = false;
                        while let Ok(c) = crx.pop() {
                            egress.push(c);
                            got = true;
                        }
                        let now = wall_ns();
                        egress.flush(now);
                        if finished && crx.is_empty() && egress.is_empty() {
                            break;
                        }
                        if got {
                            idler.busy();
                        } else {
                            idle_tx(&mut idler, &asleep, &crx, egress.next_due(), now);
                        }
                    }
                    applied
                })
                .map_err(|e| AgentError::Io("starting the send thread".into(), e))?;
            let waker = thread.thread().clone();
            Outbox::Ring { tx: ptx, done, sleeping, waker, thread: Some(thread) }
        }
    })
}

impl<'c> Agent<'c> {
    fn new(cfg: &'c AgentConfig) -> Result<Self, AgentError> {
        let (addrs, me) = addresses(cfg)?;
        let addr = addrs[me.id as usize].expect("checked by addresses()");
        let sock = bind_udp(addr, SOCKET_RECV_BUFFER).map_err(|e| {
            AgentError::Io(format!("node {}: binding {addr} (in use, or not an address of this host?)", me.id), e)
        })?;
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
        let a = cfg.auth.clone();
        let sync = if cfg.clock.sync.mode == fairfeed_clock::SyncMode::Off {
            ClockSync::off(me.id)
        } else {
            let graph = probe_graph(&cfg.topology, 0, cfg.clock.random_peers, cfg.seed);
            let peers = graph.get(&me.id).cloned().unwrap_or_default();
            ClockSync::new(me.id, &peers, me.id == sender, cfg.clock.sync)
        };
        let hedge_parents = fairfeed_tree::plan::hedge_parents(&cfg.topology, 0).remove(&me.id).unwrap_or_default();
        let live = match (&me.role, &cfg.job) {
            (Role::Sender, Job::Sender(_)) | (Role::Proxy, Job::Proxy) | (Role::Receiver, Job::Receiver(_)) => {
                Node::from_plan(&me, sender, hedge_parents, cfg.node, cfg.rule, sync).with_auth(a)
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
            Job::Sender(j) => Some(start_feed(j, cfg.clock.skew.local(now))?),
            _ => None,
        };
        let delivery = match &cfg.job {
            Job::Receiver(j) => Some(Delivery::new(j)?),
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
        Ok(Agent {
            cfg,
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
            hists: Hists { owd: hist(), hold: hist(), release_error: hist() },
            rows: Vec::new(),
            max_released_seq: 0,
            feed,
            delivery,
            ctl,
            started_ns: now,
            tuning,
            scratch: vec![0u8; 2048],
            // Unsynchronized at start is expected, not an alarm.
            clock_over_limit: true,
        })
    }
}

impl Agent<'_> {
    /// Hands what the state machine sent to the send side, each copy at the
    /// time its emulated link delivers it (now, without emulation).
    fn dispatch(&mut self, now: u64) {
        let id = self.cfg.id;
        for (to, bytes) in self.pending.drain(..) {
            let dues = match &mut self.emu {
                // The destination id is not kept here: asymmetry, if modelled, is per sending node.
                Some(e) => e.arrivals(now, id, 0),
                None => [Some(now), None],
            };
            for due_ns in dues.into_iter().flatten() {
                let c = Copy { due_ns, to, bytes: bytes.clone() };
                match &mut self.outbox {
                    Outbox::Inline(e) => e.push(c),
                    Outbox::Ring { tx, .. } => {
                        if tx.push(c).is_err() {
                            self.tx.queue_full.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        match &mut self.outbox {
            Outbox::Inline(e) => {
                e.flush(now);
            }
            Outbox::Ring { sleeping, waker, .. } => {
                if sleeping.load(Ordering::SeqCst) {
                    waker.unpark();
                }
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
        let skew = self.cfg.clock.skew;
        let n = self.recv.recv_stamped(&self.sock, |b, stamp| {
            // The kernel's arrival time where it gave one (clock sync asks for it).
            let now = stamp.map_or(now, |t| skew.local(t));
            if let (true, Outcome::New { owd_ns, .. }) = (live.is_receiver(), live.handle_packet(now, b, &mut tx)) {
                record(&mut hists.owd, owd_ns.max(0) as u64);
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
    fn clock_alarm(&mut self, who: &str) {
        let (over, bound) = (self.sync().stats.over_limit, self.sync().stats.bound_ns);
        if over != self.clock_over_limit && self.cfg.clock.sync.mode != fairfeed_clock::SyncMode::Off {
            self.clock_over_limit = over;
            if over {
                let b = if bound == u64::MAX { "unknown".to_string() } else { format!("{bound} ns") };
                eprintln!(
                    "{who}: clock error bound {b} is above the limit of {} ns; this node's releases are left out \
                     of fairness figures until it is back (counter over_limit_events)",
                    self.cfg.clock.sync.bound_limit_ns
                );
            } else {
                eprintln!(
                    "{who}: clock error bound back within {} ns ({bound} ns)",
                    self.cfg.clock.sync.bound_limit_ns
                );
            }
        }
    }

    /// This node's clock (CLOCK_REALTIME, skewed in tests).
    fn local(&self) -> u64 {
        self.cfg.clock.skew.local(wall_ns())
    }

    fn next_timeout(&self) -> u64 {
        self.live.next_timeout()
    }

    /// Timers and releases. A release about to fall due is spun to.
    fn timers(&mut self, on_release: &mut dyn FnMut(&Released, u64)) {
        let mut now = self.local();
        let due = self.next_timeout();
        if due > now && due - now < SPIN_AHEAD_NS && self.live.is_receiver() {
            while now < due {
                std::hint::spin_loop();
                now = self.local();
            }
        }
        let skew = self.cfg.clock.skew;
        let mut tx = Pending { addrs: &self.addrs, out: &mut self.pending, unknown: &mut self.unknown_destination };
        if self.live.next_timeout() <= now {
            self.live.handle_timeout(now, &mut tx);
        }
        while let Some(m) = self.live.poll_release() {
            // True time for the application and the log; the
            // synchronized clock for how precisely the deadline was met.
            let t = wall_ns();
            let t_sync = self.live.sync().now_sync(skew.local(t));
            if !m.late {
                record(&mut self.hists.release_error, t_sync.saturating_sub(m.deadline_ns));
                record(&mut self.hists.hold, m.deadline_ns.saturating_sub(m.arrival_ns));
            }
            self.max_released_seq = self.max_released_seq.max(m.sequence);
            if let Some(d) = &mut self.delivery {
                d.release(t, &m.payload);
            }
            on_release(&m, t);
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
        }
        if let Some(d) = &mut self.delivery {
            d.service(now, &mut self.scratch);
        }
    }

    /// Answers control requests; true if asked to stop.
    fn control(&mut self) -> bool {
        let Some(ctl) = &self.ctl else { return false };
        let mut buf = [0u8; 256];
        let mut stop = false;
        while let Ok((n, from)) = ctl.recv_from(&mut buf) {
            let reply = match String::from_utf8_lossy(&buf[..n]).trim() {
                "stat" => serde_json::to_string(&self.snapshot()).unwrap_or_default(),
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

    fn finished(&self, now: u64) -> bool {
        if self.cfg.stop.load(Ordering::Relaxed) {
            return true;
        }
        if self.cfg.max_seconds.is_some_and(|s| now.saturating_sub(self.started_ns) as f64 / 1e9 >= s) {
            return true;
        }
        self.feed
            .as_ref()
            .is_some_and(|f| f.next >= f.job.payloads.len() && now.saturating_sub(f.last_sent_ns) >= f.job.linger_ns)
    }

    /// Sleeps in poll(2) until a packet or shortly before the next timer.
    fn park(&self, now: u64) {
        let mut wake = self.next_timeout();
        if let Some(f) = &self.feed {
            if f.next < f.job.payloads.len() {
                wake = wake.min(f.t0 + f.next as u64 * f.gap_ns);
            }
        }
        if let Outbox::Inline(e) = &self.outbox {
            wake = wake.min(e.next_due().unwrap_or(u64::MAX));
        }
        let wait_ns = wake.saturating_sub(now).saturating_sub(SPIN_AHEAD_NS).min(100_000_000);
        if wait_ns < 10_000 {
            return;
        }
        let mut fds = vec![PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
        if let Some(c) = &self.ctl {
            fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
        }
        if let Some(j) = self.feed.as_ref().and_then(|f| f.journal.as_ref()) {
            fds.push(PollFd::new(j.sock.as_fd(), PollFlags::POLLIN));
        }
        if let Some((_, s, _)) = self.delivery.as_ref().and_then(|d| d.fill.as_ref()) {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
        }
        let ts = nix::sys::time::TimeSpec::from_duration(std::time::Duration::from_nanos(wait_ns));
        let _ = ppoll(&mut fds, Some(ts), None);
    }
}

impl AgentConfig {
    fn job_keeps_log(&self) -> bool {
        matches!(&self.job, Job::Receiver(r) if r.keep_log)
    }
}

impl Agent<'_> {
    fn snapshot(&self) -> AgentReport {
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
            let t = wall_ns();
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
                counters["retransmit_server"] = serde_json::to_value(j.server.stats()).unwrap_or_default();
            }
        }
        let mut latency = json!({});
        if let Node::Receiver(r) = &self.live {
            // Sequences never released: the tree lost them (and, when filling
            // is on, the arbitrator below asked for their MoldUDP64 messages).
            counters["overlay_missing"] = self.max_released_seq.saturating_sub(r.stats.released).into();
            latency = json!({
                "owd": summary(&self.hists.owd),
                "hold": summary(&self.hists.hold),
                "release_error": summary(&self.hists.release_error),
            });
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
/// sender) its feed is sent and the linger is over. Each release at a
/// receiver is also handed to `on_release` with its release instant.
pub fn run_agent(cfg: &AgentConfig, mut on_release: impl FnMut(&Released, u64)) -> Result<AgentReport, AgentError> {
    let mut a = Agent::new(cfg)?;
    let who = format!("{} {}", format!("{:?}", a.role).to_lowercase(), cfg.id);
    if cfg.idle != IdleStrategy::Spin {
        // Wake from ppoll(2) when asked, not up to the default 50 µs later.
        let _ = nix::sys::prctl::set_timerslack(1_000);
    }
    report(&who, &a.tuning);
    let mut next_control_ns = 0;
    let mut idler = Idler::new(cfg.idle);
    loop {
        let true_now = wall_ns();
        if a.finished(true_now) {
            break;
        }
        // The control socket costs a system call per look: a spinning node
        // looks once per CONTROL_POLL_NS, a parked one whenever it wakes.
        if cfg.idle == IdleStrategy::Park || true_now >= next_control_ns {
            next_control_ns = true_now + CONTROL_POLL_NS;
            if a.control() {
                break;
            }
        }
        let now = cfg.clock.skew.local(true_now);
        let mut busy = a.send_feed(now);
        busy |= a.receive(now) > 0;
        a.timers(&mut on_release);
        a.clock_alarm(&who);
        // Emulated links and the egress run on true time.
        a.dispatch(wall_ns());
        if busy {
            idler.busy();
        } else {
            idler.idle(true_now, || a.park(a.local()));
        }
    }
    // Send what is still waiting for its emulated delay, then stop the send thread.
    let deadline = wall_ns() + 1_000_000_000;
    match &mut a.outbox {
        Outbox::Inline(e) => {
            while !e.is_empty() && wall_ns() < deadline {
                e.flush(wall_ns());
            }
        }
        Outbox::Ring { done, thread, waker, .. } => {
            done.store(true, Ordering::Release);
            waker.unpark();
            if let Some(t) = thread.take() {
                if let Ok(applied) = t.join() {
                    report(&who, &applied);
                    a.tuning.extend(applied);
                }
            }
        }
    }
    let mut r = a.snapshot();
    r.rows = std::mem::take(&mut a.rows);
    Ok(r)
}
