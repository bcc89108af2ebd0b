//! The exchange on real sockets: OUCH 5.0 over SoupBinTCP in, TotalView-ITCH
//! 5.0 over MoldUDP64 out on an A and a B line, with a retransmission server.
//!
//! A pipeline of threads joined by bounded single-producer/single-consumer
//! rings (the disruptor pattern seed 002 used):
//!
//! ```text
//!  gateway thread ──commands──▶ engine thread(s) ──events──▶ gateway thread (OUCH out)
//!  (TCP in/out, sessions)        (symbols sharded)  └─events──▶ publisher thread (ITCH A/B, journal, retransmission)
//! ```
//!
//! Every order carries five timestamps, seed 002's points: t0 the gateway
//! hands it to the engine ("order book → ME sent"), t1 the engine takes it
//! ("ME received"), t2 the engine hands out its response ("response sent"),
//! t3 the gateway takes the response ("response received"), t4 the response
//! is written to the client's socket ("completed"); HdrHistograms of each
//! step.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fairfeed_arb::retransmit::{Journal, RetransmitServer, ServerConfig, JOURNAL_BYTES_DEFAULT};

use crate::idle::{IdleStrategy, Idler};
use fairfeed_exchange::engine::{Command, Engine, EngineStats, Event, Limits};
use fairfeed_exchange::gateway::{Close, Conn, Gateway, GatewayConfig, GatewayStats};
use fairfeed_exchange::itch_out::ItchWriter;
use fairfeed_exchange::sequencer::{Sequencer, SequencerStats};
use fairfeed_io::clock::wall_ns;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Slots of each ring.
pub const RING_SLOTS: usize = 65_536;
/// Client connections at most.
pub const CONNECTIONS_MAX: usize = 256;
/// Connections not yet logged in from one address at most (more are refused at accept).
pub const PRELOGIN_PER_ADDRESS_MAX: usize = 4;
/// Bytes queued for one client by default before it counts as not reading and is closed.
pub const OUT_BUFFER_DEFAULT_MAX: usize = 4 << 20;
/// How long a closing session may take to drain what it was sent before it is dropped anyway.
pub const CLOSE_DRAIN_NS: u64 = 200_000_000;
/// Failed logins from one address per second at most; beyond, its new
/// connections are refused until the second is over (password guessing).
pub const LOGIN_FAILURES_PER_S_MAX: u32 = 5;
/// Addresses whose failed logins are tracked at most (stale ones are dropped first).
const LOGIN_FAILURE_ADDRESSES_MAX: usize = 4_096;

/// Everything the exchange is configured with.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ExchangeConfig {
    /// OUCH over SoupBinTCP.
    pub listen: SocketAddr,
    pub gateway: GatewayConfig,
    pub limits: Limits,
    /// Engine threads; symbols are sharded by locate modulo this.
    pub engines: usize,
    /// The ITCH lines (MoldUDP64 over UDP).
    pub itch_a: Option<SocketAddr>,
    pub itch_b: Option<SocketAddr>,
    /// Serve MoldUDP64 retransmission requests from the ITCH journal here.
    pub retransmit_listen: Option<SocketAddr>,
    pub itch_session: String,
    /// Inbound fairness: hold orders this long and hand them to the engines in
    /// client-timestamp order (OUCH appendage tag 0xF0); 0 = arrival order (off).
    #[serde(default)]
    pub sequencing_window_ns: u64,
    /// Bytes queued for one client at most: a client that does not read what
    /// it is sent is closed at this limit (counted `slow_reader_closes`).
    #[serde(default = "out_buffer_default_max")]
    pub out_buffer_max_bytes: usize,
    /// A MoldUDP64 heartbeat on each ITCH line after this long without a packet.
    #[serde(default = "itch_heartbeat_default_ns")]
    pub itch_heartbeat_ns: u64,
    /// Bytes of ITCH messages the retransmission journal keeps; beyond it the
    /// oldest are dropped (counted `itch_journal_evicted`) and requests for
    /// them go unanswered.
    #[serde(default = "itch_journal_default_max")]
    pub itch_journal_max_bytes: usize,
}

fn itch_journal_default_max() -> usize {
    JOURNAL_BYTES_DEFAULT
}

/// 1 s between ITCH heartbeats on a quiet line.
pub const ITCH_HEARTBEAT_DEFAULT_NS: u64 = 1_000_000_000;

fn itch_heartbeat_default_ns() -> u64 {
    ITCH_HEARTBEAT_DEFAULT_NS
}

fn out_buffer_default_max() -> usize {
    OUT_BUFFER_DEFAULT_MAX
}

impl ExchangeConfig {
    /// Engine threads at most.
    pub const ENGINES_MAX: usize = 16;

    /// Checks the configuration before anything starts (a bad one used to
    /// panic an engine thread while the gateway went on accepting orders).
    pub fn validate(&self) -> Result<(), String> {
        self.limits.validate()?;
        if !(1..=Self::ENGINES_MAX).contains(&self.engines) {
            return Err(format!("engines must be 1..={}, got {}", Self::ENGINES_MAX, self.engines));
        }
        let g = &self.gateway;
        if g.symbols.is_empty() || g.symbols.len() > self.limits.symbols {
            return Err(format!(
                "gateway.symbols: 1..={} symbols (limits.symbols), got {}",
                self.limits.symbols,
                g.symbols.len()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for s in &g.symbols {
            if s.is_empty() || s.len() > 8 || !s.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!("gateway.symbols: {s:?} is not 1–8 printable ASCII characters (ITCH stock)"));
            }
            if !seen.insert(s) {
                return Err(format!("gateway.symbols: {s:?} appears twice"));
            }
        }
        for (u, p) in &g.users {
            if u.is_empty() || u.len() > 6 || p.len() > 10 || !u.is_ascii() || !p.is_ascii() {
                return Err(format!("gateway.users: {u:?} — usernames are 1–6 ASCII characters, passwords up to 10"));
            }
        }
        for (what, s) in [("gateway.session", &g.session), ("itch_session", &self.itch_session)] {
            if s.is_empty() || s.len() > 10 || !s.is_ascii() {
                return Err(format!("{what}: {s:?} is not 1–10 ASCII characters"));
            }
        }
        if self.sequencing_window_ns > 1_000_000_000 {
            return Err(format!("sequencing_window_ns must be at most 1 s, got {}", self.sequencing_window_ns));
        }
        if !(4_096..=1 << 30).contains(&self.out_buffer_max_bytes) {
            return Err(format!("out_buffer_max_bytes must be 4096..=1073741824, got {}", self.out_buffer_max_bytes));
        }
        if !(1_000_000..=60_000_000_000).contains(&self.itch_heartbeat_ns) {
            return Err(format!("itch_heartbeat_ns must be 1 ms..=60 s, got {}", self.itch_heartbeat_ns));
        }
        if !(1 << 16..=1 << 36).contains(&self.itch_journal_max_bytes) {
            return Err(format!(
                "itch_journal_max_bytes must be 65536..=68719476736 (64 KiB..=64 GiB), got {}",
                self.itch_journal_max_bytes
            ));
        }
        if g.login_timeout_ns == 0 || g.login_timeout_ns > 600_000_000_000 {
            return Err(format!("gateway.login_timeout_ns must be in (0, 600 s], got {}", g.login_timeout_ns));
        }
        Ok(())
    }
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        ExchangeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 15000)),
            gateway: GatewayConfig::default(),
            limits: Limits::default(),
            engines: 1,
            itch_a: None,
            itch_b: None,
            retransmit_listen: None,
            itch_session: "FFEXCH0001".into(),
            sequencing_window_ns: 0,
            out_buffer_max_bytes: OUT_BUFFER_DEFAULT_MAX,
            itch_heartbeat_ns: ITCH_HEARTBEAT_DEFAULT_NS,
            itch_journal_max_bytes: JOURNAL_BYTES_DEFAULT,
        }
    }
}

/// Latency of one pipeline step, µs.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub name: &'static str,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub count: u64,
}

/// What the exchange did.
#[derive(Debug, Clone, Serialize)]
pub struct ExchangeReport {
    pub gateway: GatewayStats,
    pub engines: Vec<EngineStats>,
    pub itch_packets: u64,
    pub itch_messages: u64,
    /// MoldUDP64 heartbeats sent on the (quiet) ITCH lines.
    pub itch_heartbeats: u64,
    /// ITCH messages dropped from the retransmission journal to stay within its limit.
    pub itch_journal_evicted: u64,
    pub retransmit_answers: u64,
    pub ring_full: u64,
    pub sequencer: SequencerStats,
    pub steps: Vec<Step>,
}

struct Cmd {
    cmd: Command,
    t0: u64,
}

/// Wakes a parked consumer thread after a push (the thread parks only after
/// announcing it, then re-checks its ring, so no push is missed).
#[derive(Clone)]
struct Waker {
    sleeping: Arc<AtomicBool>,
    thread: Option<thread::Thread>,
}

impl Waker {
    fn wake(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            if let Some(t) = &self.thread {
                t.unpark();
            }
        }
    }
}

/// Wakes the gateway thread, which sleeps in poll(2) on its sockets and this eventfd.
#[derive(Clone)]
struct GatewayWaker {
    sleeping: Arc<AtomicBool>,
    fd: Arc<nix::sys::eventfd::EventFd>,
}

impl GatewayWaker {
    fn wake(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            let _ = self.fd.write(1);
        }
    }
}

/// How the exchange's threads wait for work: spin 50 µs, then park until
/// woken (or 1 ms).
const IDLE: IdleStrategy = IdleStrategy::Backoff { spin_ns: 50_000, yield_ns: 50_000 };

/// One idle turn at `now`: spins, or parks until woken (or 1 ms) once idle long enough.
fn idle(idler: &mut Idler, now: u64, sleeping: &AtomicBool, empty: impl Fn() -> bool) {
    idler.idle(now, || {
        sleeping.store(true, Ordering::SeqCst);
        if empty() {
            thread::park_timeout(Duration::from_millis(1));
        }
        sleeping.store(false, Ordering::SeqCst);
    });
}

#[derive(Clone, Copy)]
struct Out {
    ev: Event,
    t0: u64,
    t1: u64,
    t2: u64,
    /// The last event of its command.
    last: bool,
}

fn ns(start: Instant) -> u64 {
    start.elapsed().as_nanos() as u64
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

fn step(name: &'static str, h: &Histogram<u64>) -> Step {
    Step {
        name,
        p50_us: h.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
        max_us: h.max() as f64 / 1e3,
        count: h.len(),
    }
}

/// What the exchange's threads publish for a metrics endpoint, every
/// [`crate::publish::PUBLISH_INTERVAL`]: `{"gateway": …, "sequencer": …,
/// "ring_full": n, "sessions": n, "publisher": …, "engines": {"0": …}}`, and
/// the order latency (gateway in → response written, ns).
#[derive(Debug, Default)]
pub struct ExchangeMetrics {
    pub json: std::sync::Mutex<serde_json::Value>,
    pub order_latency: std::sync::Mutex<Option<Histogram<u64>>>,
}

impl ExchangeMetrics {
    /// Sets `key` (in `engines` when `engine` is given) to `v`.
    fn put(&self, engine: Option<usize>, key: &str, v: serde_json::Value) {
        let mut j = self.json.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !j.is_object() {
            *j = serde_json::json!({});
        }
        match engine {
            Some(e) => {
                if !j["engines"].is_object() {
                    j["engines"] = serde_json::json!({});
                }
                j["engines"][e.to_string()] = v;
            }
            None => j[key] = v,
        }
    }
}

const PUBLISH_NS: u64 = crate::publish::PUBLISH_INTERVAL.as_nanos() as u64;

/// A running exchange.
pub struct Exchange {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<Part>>,
    pub addr: SocketAddr,
}

enum Part {
    Gateway(GatewayStats, Box<[Histogram<u64>; 5]>, u64, SequencerStats),
    Engine(EngineStats),
    /// ITCH packets, messages, retransmission answers, heartbeats, journal evictions.
    Publisher(u64, u64, u64, u64, u64),
}

impl Exchange {
    /// Binds and starts every thread.
    pub fn start(cfg: ExchangeConfig) -> std::io::Result<Exchange> {
        Self::start_published(cfg, None)
    }

    /// [`Exchange::start`], the threads publishing their counters into `metrics`.
    pub fn start_published(cfg: ExchangeConfig, metrics: Option<Arc<ExchangeMetrics>>) -> std::io::Result<Exchange> {
        assert!((1..=16).contains(&cfg.engines), "1..=16 engine threads");
        let listener = TcpListener::bind(cfg.listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let (mut cmd_tx, mut cmd_rx, mut to_gw, mut gw_rx, mut to_pub, mut pub_rx) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..cfg.engines {
            let (a, b) = rtrb::RingBuffer::<Cmd>::new(RING_SLOTS);
            let (c, d) = rtrb::RingBuffer::<Out>::new(RING_SLOTS);
            let (e, f) = rtrb::RingBuffer::<Event>::new(RING_SLOTS);
            cmd_tx.push(a);
            cmd_rx.push(b);
            to_gw.push(c);
            gw_rx.push(d);
            to_pub.push(e);
            pub_rx.push(f);
        }
        let mut threads = Vec::new();
        let pub_sleeping = Arc::new(AtomicBool::new(false));
        let publisher = spawn_publisher(&cfg, pub_rx, stop.clone(), pub_sleeping.clone(), metrics.clone())?;
        let pub_waker = Waker { sleeping: pub_sleeping, thread: Some(publisher.thread().clone()) };
        threads.push(publisher);
        let mut engine_wakers = Vec::new();
        let gw_waker = GatewayWaker {
            sleeping: Arc::new(AtomicBool::new(false)),
            fd: Arc::new(
                nix::sys::eventfd::EventFd::from_value_and_flags(0, nix::sys::eventfd::EfdFlags::EFD_NONBLOCK)
                    .map_err(std::io::Error::from)?,
            ),
        };
        for (shard, ((crx, gtx), ptx)) in cmd_rx.into_iter().zip(to_gw).zip(to_pub).enumerate() {
            let (limits, n, stop) = (cfg.limits, cfg.engines as u64, stop.clone());
            let sleeping = Arc::new(AtomicBool::new(false));
            let (asleep, pw, gwk) = (sleeping.clone(), pub_waker.clone(), gw_waker.clone());
            let metrics = metrics.clone();
            let lp = EngineLoop { limits, shard, n, stop, start, asleep, pw, gwk, metrics };
            let h =
                thread::Builder::new().name(format!("engine-{shard}")).spawn(move || engine_loop(lp, crx, gtx, ptx))?;
            engine_wakers.push(Waker { sleeping, thread: Some(h.thread().clone()) });
            threads.push(h);
        }
        let gw = Gateway::new(cfg.gateway.clone());
        let engines = cfg.engines;
        let window = cfg.sequencing_window_ns;
        let out_max = cfg.out_buffer_max_bytes;
        let stop2 = stop.clone();
        threads.push(thread::Builder::new().name("gateway".into()).spawn(move || {
            gateway_loop(GatewayLoop {
                listener,
                gw,
                cmd_tx,
                to_gw: gw_rx,
                wakers: engine_wakers,
                me: gw_waker,
                seq: Sequencer::new(window),
                engines,
                out_max,
                login_failures: std::collections::HashMap::new(),
                start,
                stop: stop2,
                metrics,
            })
        })?);
        Ok(Exchange { stop, threads, addr })
    }

    /// Stops every thread and reports.
    pub fn finish(self) -> ExchangeReport {
        self.stop.store(true, Ordering::Relaxed);
        let mut r = ExchangeReport {
            gateway: GatewayStats::default(),
            engines: Vec::new(),
            itch_packets: 0,
            itch_messages: 0,
            itch_heartbeats: 0,
            itch_journal_evicted: 0,
            retransmit_answers: 0,
            ring_full: 0,
            sequencer: SequencerStats::default(),
            steps: Vec::new(),
        };
        for t in self.threads {
            match t.join() {
                Ok(Part::Gateway(s, h, full, q)) => {
                    r.gateway = s;
                    r.sequencer = q;
                    r.ring_full = full;
                    let names = [
                        "t0→t1 gateway → engine",
                        "t1→t2 matching",
                        "t2→t3 engine → gateway",
                        "t3→t4 response written",
                        "t0→t4 total",
                    ];
                    r.steps = names.iter().zip(h.iter()).map(|(n, h)| step(n, h)).collect();
                }
                Ok(Part::Engine(s)) => r.engines.push(s),
                Ok(Part::Publisher(p, m, a, h, e)) => {
                    r.itch_packets = p;
                    r.itch_messages = m;
                    r.retransmit_answers = a;
                    r.itch_heartbeats = h;
                    r.itch_journal_evicted = e;
                }
                Err(_) => {}
            }
        }
        r
    }
}

/// What one engine thread runs with.
struct EngineLoop {
    limits: Limits,
    shard: usize,
    n: u64,
    stop: Arc<AtomicBool>,
    start: Instant,
    asleep: Arc<AtomicBool>,
    pw: Waker,
    gwk: GatewayWaker,
    metrics: Option<Arc<ExchangeMetrics>>,
}

/// One engine thread: commands in, events to the gateway and the publisher.
fn engine_loop(
    lp: EngineLoop,
    mut crx: rtrb::Consumer<Cmd>,
    mut gtx: rtrb::Producer<Out>,
    mut ptx: rtrb::Producer<Event>,
) -> Part {
    let EngineLoop { limits, shard, n, stop, start, asleep, pw, gwk, metrics } = lp;
    let mut e = Engine::new(limits, shard as u64, n);
    let mut batch: Vec<Event> = Vec::with_capacity(64);
    let mut idler = Idler::new(IDLE);
    // Published at most every PUBLISH_NS while busy, and before parking
    // (a parked engine's counters do not change).
    let (mut next_publish, mut dirty) = (0, true);
    while !stop.load(Ordering::Relaxed) {
        let Ok(c) = crx.pop() else {
            if let Some(m) = metrics.as_ref().filter(|_| dirty) {
                dirty = false;
                next_publish = ns(start) + PUBLISH_NS;
                m.put(Some(shard), "", serde_json::to_value(e.stats).unwrap_or_default());
            }
            idle(&mut idler, ns(start), &asleep, || crx.is_empty());
            continue;
        };
        dirty = true;
        if let Some(m) = metrics.as_ref().filter(|_| ns(start) >= next_publish) {
            next_publish = ns(start) + PUBLISH_NS;
            m.put(Some(shard), "", serde_json::to_value(e.stats).unwrap_or_default());
        }
        idler.busy();
        let t1 = ns(start);
        batch.clear();
        e.handle(c.cmd, &mut |ev| batch.push(ev));
        let t2 = ns(start);
        let k = batch.len();
        for (i, ev) in batch.iter().enumerate() {
            while gtx.push(Out { ev: *ev, t0: c.t0, t1, t2, last: i + 1 == k }).is_err() {
                thread::yield_now();
            }
            while ptx.push(*ev).is_err() {
                pw.wake();
                thread::yield_now();
            }
        }
        pw.wake();
        gwk.wake();
    }
    Part::Engine(e.stats)
}

fn spawn_publisher(
    cfg: &ExchangeConfig,
    mut rx: Vec<rtrb::Consumer<Event>>,
    stop: Arc<AtomicBool>,
    sleeping: Arc<AtomicBool>,
    metrics: Option<Arc<ExchangeMetrics>>,
) -> std::io::Result<thread::JoinHandle<Part>> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    let retrans = match cfg.retransmit_listen {
        Some(a) => {
            let s = UdpSocket::bind(a)?;
            s.set_nonblocking(true)?;
            Some(s)
        }
        None => None,
    };
    let (a, b) = (cfg.itch_a, cfg.itch_b);
    let heartbeat_ns = cfg.itch_heartbeat_ns;
    let journal_max = cfg.itch_journal_max_bytes;
    let mut w = ItchWriter::new(&cfg.itch_session, &cfg.gateway.symbols);
    let start = Instant::now();
    thread::Builder::new().name("publisher".into()).spawn(move || {
        let mut server = RetransmitServer::new(Journal::with_limit(journal_max), ServerConfig::default());
        // A cell: the send closure counts, the metrics read the count between sends.
        let packets = std::cell::Cell::new(0u64);
        let (mut answers, mut heartbeats) = (0u64, 0u64);
        let send = |w: &mut ItchWriter, server: &mut RetransmitServer| {
            for p in w.take_packets() {
                for to in [a, b].into_iter().flatten() {
                    let _ = sock.send_to(&p, to);
                }
                let _ = server.journal_mut().append_packet(&p);
                packets.set(packets.get() + 1);
            }
        };
        w.open(wall_ns());
        send(&mut w, &mut server);
        let (mut buf, mut out) = ([0u8; 2048], vec![0u8; 1400]);
        let mut idler = Idler::new(IDLE);
        let mut last_sent = wall_ns();
        let mut next_publish = 0;
        while !stop.load(Ordering::Relaxed) {
            let mut any = false;
            let now = wall_ns();
            if let Some(m) = metrics.as_ref().filter(|_| now >= next_publish) {
                next_publish = now + PUBLISH_NS;
                let v = serde_json::json!({
                    "itch_packets": packets.get(),
                    "itch_messages": w.messages,
                    "itch_heartbeats": heartbeats,
                    "retransmit_answers": answers,
                    "itch_journal_evicted": server.journal().evicted(),
                });
                m.put(None, "publisher", v);
            }
            for r in &mut rx {
                while let Ok(ev) = r.pop() {
                    w.on_event(now, &ev);
                    any = true;
                }
            }
            if any {
                w.flush();
                send(&mut w, &mut server);
                last_sent = now;
                idler.busy();
            } else if now.saturating_sub(last_sent) >= heartbeat_ns {
                let hb = w.heartbeat();
                for to in [a, b].into_iter().flatten() {
                    let _ = sock.send_to(&hb, to);
                }
                heartbeats += 1;
                last_sent = now;
            } else {
                idle(&mut idler, now, &sleeping, || rx.iter().all(|r| r.is_empty()));
            }
            if let Some(s) = &retrans {
                while let Ok((n, from)) = s.recv_from(&mut buf) {
                    if let Some(len) = server.handle_request(ns(start), from, &buf[..n], &mut out) {
                        if s.send_to(&out[..len], from).is_ok() {
                            answers += 1;
                        }
                    }
                }
            }
        }
        w.close(wall_ns());
        send(&mut w, &mut server);
        Part::Publisher(packets.get(), w.messages, answers, heartbeats, server.journal().evicted())
    })
}

struct Session {
    sock: TcpStream,
    peer: std::net::IpAddr,
    conn: Conn,
    out: Vec<u8>,
    /// Since when it is closing (it drains what it was sent, for at most `CLOSE_DRAIN_NS`).
    closing: Option<u64>,
}

impl Session {
    fn close(&mut self, now: u64) {
        self.closing.get_or_insert(now);
    }
}

struct GatewayLoop {
    listener: TcpListener,
    gw: Gateway,
    cmd_tx: Vec<rtrb::Producer<Cmd>>,
    to_gw: Vec<rtrb::Consumer<Out>>,
    wakers: Vec<Waker>,
    me: GatewayWaker,
    seq: Sequencer,
    engines: usize,
    /// Bytes queued for one client at most.
    out_max: usize,
    /// Per address: (start of its current one-second window, failed logins in it).
    login_failures: std::collections::HashMap<std::net::IpAddr, (u64, u32)>,
    start: Instant,
    stop: Arc<AtomicBool>,
    metrics: Option<Arc<ExchangeMetrics>>,
}

/// Takes the connections waiting on the listener: each into a free slot,
/// unless there is none or its address already holds
/// `PRELOGIN_PER_ADDRESS_MAX` connections that have not logged in (refused,
/// counted). Returns whether any came.
fn accept(g: &mut GatewayLoop, sessions: &mut Vec<Option<Session>>) -> bool {
    let mut any = false;
    while let Ok((sock, from)) = g.listener.accept() {
        any = true;
        let peer = from.ip();
        let waiting = sessions.iter().flatten().filter(|s| s.peer == peer && s.conn.user.is_none()).count();
        let slot = sessions.iter().position(Option::is_none);
        let now = ns(g.start);
        let guessing = g
            .login_failures
            .get(&peer)
            .is_some_and(|&(since, n)| now - since < 1_000_000_000 && n >= LOGIN_FAILURES_PER_S_MAX);
        if guessing {
            g.gw.stats.login_rate_limited += 1;
            continue;
        }
        if waiting >= PRELOGIN_PER_ADDRESS_MAX || (slot.is_none() && sessions.len() >= CONNECTIONS_MAX) {
            g.gw.stats.refused_connections += 1;
            continue; // dropped: the client sees the connection closed
        }
        let _ = sock.set_nodelay(true);
        let _ = sock.set_nonblocking(true);
        // The gateway's clock is the wall clock (OUCH stamps nanoseconds since midnight).
        let s = Session { sock, peer, conn: Conn::new(wall_ns()), out: Vec::new(), closing: None };
        match slot {
            Some(i) => sessions[i] = Some(s),
            None => sessions.push(Some(s)),
        }
    }
    any
}

/// Counts a failed login from `peer` in its current one-second window,
/// keeping the table bounded (stale windows go first, then everything).
fn note_login_failure(
    t: &mut std::collections::HashMap<std::net::IpAddr, (u64, u32)>,
    peer: std::net::IpAddr,
    now: u64,
) {
    if t.len() >= LOGIN_FAILURE_ADDRESSES_MAX && !t.contains_key(&peer) {
        t.retain(|_, (since, _)| now - *since < 1_000_000_000);
        if t.len() >= LOGIN_FAILURE_ADDRESSES_MAX {
            t.clear();
        }
    }
    let e = t.entry(peer).or_insert((now, 0));
    if now - e.0 >= 1_000_000_000 {
        *e = (now, 0);
    }
    e.1 += 1;
}

/// Closes (counted) every session holding more than `out_max` unsent bytes:
/// a client that does not read must not make the exchange hold its output.
fn shed_slow_readers(g: &mut GatewayLoop, sessions: &mut [Option<Session>], now: u64) {
    for s in sessions.iter_mut().flatten() {
        if s.closing.is_none() && s.out.len() > g.out_max {
            s.out.clear();
            g.gw.stats.slow_reader_closes += 1;
            g.gw.closed(&mut s.conn, Close::Logout);
            s.close(now);
        }
    }
}

/// Drops the closing sessions that have drained, or have had `CLOSE_DRAIN_NS` to.
fn drop_closed(sessions: &mut [Option<Session>], now: u64) {
    for slot in sessions.iter_mut() {
        if slot.as_ref().and_then(|s| s.closing.map(|t| s.out.is_empty() || now - t > CLOSE_DRAIN_NS)) == Some(true) {
            *slot = None;
        }
    }
}

/// Puts the gateway's counters and the order latency where the metrics endpoint reads them.
fn publish_gateway(g: &GatewayLoop, latency: &Histogram<u64>, ring_full: u64, sessions: &[Option<Session>]) {
    let Some(m) = &g.metrics else { return };
    m.put(None, "gateway", serde_json::to_value(g.gw.stats).unwrap_or_default());
    m.put(None, "sequencer", serde_json::to_value(g.seq.stats).unwrap_or_default());
    m.put(None, "ring_full", ring_full.into());
    m.put(None, "sessions", sessions.iter().flatten().count().into());
    *m.order_latency.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(latency.clone());
}

fn gateway_loop(mut g: GatewayLoop) -> Part {
    let mut sessions: Vec<Option<Session>> = Vec::new();
    let mut hists: [Histogram<u64>; 5] = [hist(), hist(), hist(), hist(), hist()];
    let mut buf = vec![0u8; 65_536];
    let (mut ring_full, mut last_tick, mut next_publish, mut dirty) = (0u64, 0u64, 0u64, true);
    let mut cmds: Vec<(Command, Option<u64>)> = Vec::new();
    let mut idler = Idler::new(IDLE);
    while !g.stop.load(Ordering::Relaxed) {
        let mut busy = accept(&mut g, &mut sessions);
        busy |= read_sessions(&mut g, &mut sessions, &mut buf, &mut cmds, &mut ring_full);
        if !g.seq.is_empty() {
            busy = true;
            while let Some(c) = g.seq.pop_due(wall_ns()) {
                route(&mut g, c, &mut ring_full);
            }
        }
        // Responses from the engines: OUCH to their clients.
        for r in &mut g.to_gw {
            while let Ok(o) = r.pop() {
                busy = true;
                let t3 = ns(g.start);
                let sess = &mut sessions;
                g.gw.on_event(wall_ns(), &o.ev, &mut |client, bytes| {
                    if let Some(s) = sess.iter_mut().flatten().find(|s| s.conn.user == Some(client)) {
                        s.out.extend_from_slice(bytes);
                    }
                });
                if o.last {
                    flush_all(&mut sessions, t3);
                    let t4 = ns(g.start);
                    for (h, v) in hists.iter_mut().zip([o.t1 - o.t0, o.t2 - o.t1, t3 - o.t2, t4 - t3, t4 - o.t0]) {
                        let _ = h.record(v.max(1));
                    }
                }
            }
        }
        let now = ns(g.start);
        if now - last_tick > 1_000_000 {
            last_tick = now;
            if dirty && now >= next_publish {
                next_publish = now + PUBLISH_NS;
                dirty = false;
                publish_gateway(&g, &hists[4], ring_full, &sessions);
            }
            // Closing sessions are past their timers (and counted once).
            let wall = wall_ns();
            for s in sessions.iter_mut().flatten().filter(|s| s.closing.is_none()) {
                if g.gw.on_tick(&mut s.conn, wall, &mut s.out).is_err() {
                    s.close(now);
                }
            }
        }
        shed_slow_readers(&mut g, &mut sessions, now);
        flush_all(&mut sessions, now);
        drop_closed(&mut sessions, now);
        dirty |= busy;
        if busy {
            idler.busy();
        } else {
            if dirty {
                // About to sleep: what changed since the last publish is published now.
                dirty = false;
                next_publish = now + PUBLISH_NS;
                publish_gateway(&g, &hists[4], ring_full, &sessions);
            }
            idler.idle(now, || gateway_sleep(&g, &sessions));
        }
    }
    Part::Gateway(g.gw.stats, Box::new(hists), ring_full, g.seq.stats)
}

/// Reads every session that has bytes; routes the commands to their engine
/// shard. Returns whether anything arrived.
fn read_sessions(
    g: &mut GatewayLoop,
    sessions: &mut [Option<Session>],
    buf: &mut [u8],
    cmds: &mut Vec<(Command, Option<u64>)>,
    ring_full: &mut u64,
) -> bool {
    let mut busy = false;
    for slot in sessions.iter_mut() {
        let Some(s) = slot else { continue };
        if s.closing.is_some() {
            continue; // nothing more is taken from a session being closed
        }
        match s.sock.read(buf) {
            Ok(0) => {
                g.gw.closed(&mut s.conn, Close::Logout);
                *slot = None;
                continue;
            }
            Ok(n) => {
                busy = true;
                cmds.clear();
                let r = g.gw.on_bytes(&mut s.conn, wall_ns(), &buf[..n], &mut |c, ts| cmds.push((c, ts)), &mut s.out);
                for &(c, ts) in cmds.iter() {
                    if g.seq.window_ns() == 0 {
                        route(g, c, ring_full);
                    } else {
                        g.seq.push(c, ts, wall_ns());
                    }
                }
                if r.is_err() {
                    let now = ns(g.start);
                    if r == Err(Close::LoginRejected) {
                        note_login_failure(&mut g.login_failures, s.peer, now);
                    }
                    s.close(now);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => {
                g.gw.closed(&mut s.conn, Close::Logout);
                *slot = None;
            }
        }
    }
    busy
}

/// Hands a command to the engine shard of its symbol (waiting while the ring is full).
fn route(g: &mut GatewayLoop, c: Command, ring_full: &mut u64) {
    let sym = match c {
        Command::New(o) => Some(o.symbol),
        Command::Cancel { client, token, .. } | Command::Replace { client, token, .. } => g.gw.symbol_of(client, token),
    };
    let shard = sym.map_or(0, |s| usize::from(s.max(1) - 1) % g.engines);
    let mut item = Cmd { cmd: c, t0: ns(g.start) };
    loop {
        match g.cmd_tx[shard].push(item) {
            Ok(()) => break,
            Err(rtrb::PushError::Full(back)) => {
                *ring_full += 1;
                item = back;
                g.wakers[shard].wake();
                thread::yield_now();
            }
        }
    }
    g.wakers[shard].wake();
}

/// Sleeps in poll(2) until a client sends, connects, or an engine responds (1 ms at most).
fn gateway_sleep(g: &GatewayLoop, sessions: &[Option<Session>]) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    g.me.sleeping.store(true, Ordering::SeqCst);
    if g.to_gw.iter().all(|r| r.is_empty()) {
        let mut fds =
            vec![PollFd::new(g.me.fd.as_fd(), PollFlags::POLLIN), PollFd::new(g.listener.as_fd(), PollFlags::POLLIN)];
        for s in sessions.iter().flatten() {
            fds.push(PollFd::new(s.sock.as_fd(), PollFlags::POLLIN));
        }
        let _ = poll(&mut fds, PollTimeout::from(1u8));
    }
    g.me.sleeping.store(false, Ordering::SeqCst);
    let _ = g.me.fd.read();
}

fn flush_all(sessions: &mut [Option<Session>], now: u64) {
    for s in sessions.iter_mut().flatten() {
        while !s.out.is_empty() {
            match s.sock.write(&s.out) {
                Ok(0) => break,
                Ok(n) => {
                    s.out.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    s.out.clear();
                    s.close(now);
                }
            }
        }
    }
}

/// Runs until `stop` (or `max_seconds`); returns the report.
pub fn run_exchange(
    cfg: ExchangeConfig,
    stop: &AtomicBool,
    max_seconds: Option<f64>,
    metrics: Option<Arc<ExchangeMetrics>>,
) -> std::io::Result<ExchangeReport> {
    cfg.validate().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let x = Exchange::start_published(cfg, metrics)?;
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) && max_seconds.is_none_or(|s| t0.elapsed().as_secs_f64() < s) {
        thread::sleep(Duration::from_millis(20));
    }
    Ok(x.finish())
}
