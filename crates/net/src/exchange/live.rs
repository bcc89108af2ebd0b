//! The exchange on real sockets: OUCH 5.0 over SoupBinTCP in, TotalView-ITCH
//! 5.0 over MoldUDP64 out on an A and a B line, with a retransmission server.
//!
//! Two pipelines, chosen by [`ExchangeConfig::pipeline`] (reported at
//! start-up; `auto` picks by the cores there are):
//!
//! - **run to completion** — one thread owns the listener, the sessions, the
//!   engines and the ITCH publisher: it reads a session, matches its orders
//!   at once, writes the responses and the ITCH packets, and only then looks
//!   at the next socket; an order never crosses a thread (no hand-off, no
//!   wake-up of a parked thread). The default where cores are few.
//! - **threaded** — a pipeline of threads joined by bounded
//!   single-producer/single-consumer rings (the disruptor pattern seed 002
//!   used), for hosts with a core per stage:
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
//! step (run to completion: t1 = t0 and t3 = t2, there is no hand-off).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fairfeed_arb::retransmit::{Journal, RetransmitServer, ServerConfig, JOURNAL_BYTES_DEFAULT};

use crate::idle::{IdleStrategy, Idler};
use fairfeed_exchange::engine::ConfigError;
use fairfeed_exchange::engine::{Command, Engine, EngineStats, Event, Limits};
use fairfeed_exchange::gateway::{Close, Conn, Gateway, GatewayConfig, GatewayStats};
use fairfeed_exchange::itch_out::ItchWriter;
use fairfeed_exchange::ordering::{OrderingBuffer, OrderingMode, OrderingStats, ORDERING_FIRMS_MAX};
use fairfeed_exchange::sequencer::{OrderStamps, Sequencer, SequencerStats};
use fairfeed_io::clock::wall_ns;

use super::watch::{tcp_min_rtt_ns, CheatWatch};
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
/// Bytes read at a time from a connection that has not logged in (a login
/// request is 49 bytes).
pub const PRELOGIN_READ_MAX: usize = 1_024;
/// Failed logins (a refused login, or a protocol error before any login)
/// from one address per second at most; beyond, its new connections are
/// refused until the second is over (password guessing, garbage floods).
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
    /// How orders are ordered before matching: `fifo` (arrival; with
    /// `sequencing_window_ns`, client-timestamp order within the window),
    /// `dbo` (by the delivery clock each order carries, OUCH appendage tag
    /// 0xF1, each held at most `dbo_bound_ns`) or `batch` (a frequent batch
    /// auction every `batch_us`: one uniform-price call auction per symbol,
    /// `fairfeed_exchange::engine::Engine::handle_batch`).
    #[serde(default)]
    pub ordering: OrderingKind,
    /// DBO's hold bound: the spread of the firms' order-path delays (see
    /// `fairfeed_exchange::ordering::hold_bound_ns`), 1 µs..=1 s.
    #[serde(default)]
    pub dbo_bound_ns: u64,
    /// Batch ordering's interval, µs (1..=1,000,000): batches end at the
    /// multiples of it on the exchange's wall clock.
    #[serde(default)]
    pub batch_us: u64,
    /// The cheat watch (`super::watch`): take the sender's sealed deadline
    /// records here (`fairfeed sender --deadlines-to`) and judge every order
    /// that carries a delivery clock against them. Needs `operator_key_file`.
    #[serde(default)]
    pub deadlines_listen: Option<SocketAddr>,
    /// The operator key (64 hex digits) deadline records are sealed under.
    #[serde(default)]
    pub operator_key_file: Option<std::path::PathBuf>,
    /// The key read from `operator_key_file` (by whoever starts the exchange).
    #[serde(skip)]
    pub operator_key: Option<fairfeed_tree::operator::OperatorKey>,
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
    /// `run-to-completion` (one thread does everything), `threaded` (gateway,
    /// engines and publisher on threads of their own) or `auto` (threaded
    /// when there is a core for every thread and one to spare).
    #[serde(default)]
    pub pipeline: Pipeline,
    /// How the exchange's threads wait for work: `spin` (busy polling, a core
    /// each), `backoff` (spin, then yield, then sleep in poll(2)) or `park`.
    #[serde(default)]
    pub idle: Idle,
}

/// The exchange config's `ordering`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderingKind {
    #[default]
    Fifo,
    Dbo,
    Batch,
}

/// How the exchange's threads wait for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Idle {
    /// `spin` where the host has two cores to spare beside the exchange's
    /// threads, `park` otherwise (measured on 2 vCPUs: a spinning exchange
    /// beside a spinning client left no core for anything else, and its
    /// p99 was 3–4× that of one that sleeps in poll(2)).
    #[default]
    Auto,
    /// Never sleep: a core per thread, no wake-up latency.
    Spin,
    /// Spin 50 µs, yield 50 µs, then sleep until input (or 1 ms).
    Backoff,
    /// Sleep in poll(2) until input at once.
    Park,
}

impl Idle {
    /// The strategy for `threads` exchange threads on this host.
    pub fn strategy(self, threads: usize) -> IdleStrategy {
        match self {
            Idle::Auto => {
                let cores = thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
                if cores >= threads + 2 {
                    IdleStrategy::Spin
                } else {
                    IdleStrategy::Park
                }
            }
            Idle::Spin => IdleStrategy::Spin,
            Idle::Backoff => IDLE,
            Idle::Park => IdleStrategy::Park,
        }
    }
}

/// How the exchange's work is spread over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pipeline {
    #[default]
    Auto,
    RunToCompletion,
    Threaded,
}

impl Pipeline {
    /// `Auto` resolved for `engines` engine threads on this host.
    pub fn resolve(self, engines: usize) -> Pipeline {
        match self {
            Pipeline::Auto => {
                let cores = thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
                // Gateway, publisher and the engines, plus a core for everything else.
                if cores > engines + 2 {
                    Pipeline::Threaded
                } else {
                    Pipeline::RunToCompletion
                }
            }
            p => p,
        }
    }
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
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &'static str, message: String| Err(ConfigError { key, message });
        self.limits.validate()?;
        if !(1..=Self::ENGINES_MAX).contains(&self.engines) {
            return bad("engines", format!("engines must be 1..={}, got {}", Self::ENGINES_MAX, self.engines));
        }
        self.validate_gateway()?;
        let g = &self.gateway;
        for (what, s) in [("gateway.session", &g.session), ("itch_session", &self.itch_session)] {
            if s.is_empty() || s.len() > 10 || !s.is_ascii() {
                return bad(what, format!("{what}: {s:?} is not 1–10 ASCII characters"));
            }
        }
        if self.sequencing_window_ns > 1_000_000_000 {
            return bad(
                "sequencing_window_ns",
                format!("sequencing_window_ns must be at most 1 s, got {}", self.sequencing_window_ns),
            );
        }
        self.validate_ordering()?;
        if self.deadlines_listen.is_some() && self.operator_key_file.is_none() && self.operator_key.is_none() {
            return bad(
                "deadlines_listen",
                "deadlines_listen takes records sealed under the operator key: set operator_key_file".into(),
            );
        }
        if !(4_096..=1 << 30).contains(&self.out_buffer_max_bytes) {
            return bad(
                "out_buffer_max_bytes",
                format!("out_buffer_max_bytes must be 4096..=1073741824, got {}", self.out_buffer_max_bytes),
            );
        }
        if !(1_000_000..=60_000_000_000).contains(&self.itch_heartbeat_ns) {
            return bad(
                "itch_heartbeat_ns",
                format!("itch_heartbeat_ns must be 1 ms..=60 s, got {}", self.itch_heartbeat_ns),
            );
        }
        if !(1 << 16..=1 << 36).contains(&self.itch_journal_max_bytes) {
            return bad(
                "itch_journal_max_bytes",
                format!(
                    "itch_journal_max_bytes must be 65536..=68719476736 (64 KiB..=64 GiB), got {}",
                    self.itch_journal_max_bytes
                ),
            );
        }
        if g.login_timeout_ns == 0 || g.login_timeout_ns > 600_000_000_000 {
            return bad(
                "gateway.login_timeout_ns",
                format!("gateway.login_timeout_ns must be in (0, 600 s], got {}", g.login_timeout_ns),
            );
        }
        Ok(())
    }

    /// The gateway's symbols and users.
    fn validate_gateway(&self) -> Result<(), ConfigError> {
        let bad = |key: &'static str, message: String| Err(ConfigError { key, message });
        let g = &self.gateway;
        if g.symbols.is_empty() || g.symbols.len() > self.limits.symbols {
            return bad(
                "gateway.symbols",
                format!(
                    "gateway.symbols: 1..={} symbols (limits.symbols), got {}",
                    self.limits.symbols,
                    g.symbols.len()
                ),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for s in &g.symbols {
            if s.is_empty() || s.len() > 8 || !s.bytes().all(|b| b.is_ascii_graphic()) {
                return bad(
                    "gateway.symbols",
                    format!("gateway.symbols: {s:?} is not 1–8 printable ASCII characters (ITCH stock)"),
                );
            }
            if !seen.insert(s) {
                return bad("gateway.symbols", format!("gateway.symbols: {s:?} appears twice"));
            }
        }
        for (u, p) in &g.users {
            if u.is_empty() || u.len() > 6 || p.len() > 10 || !u.is_ascii() || !p.is_ascii() {
                return bad(
                    "gateway.users",
                    format!("gateway.users: {u:?} — usernames are 1–6 ASCII characters, passwords up to 10"),
                );
            }
        }
        Ok(())
    }

    /// `ordering` with the keys it needs.
    fn validate_ordering(&self) -> Result<(), ConfigError> {
        let bad = |key: &'static str, message: String| Err(ConfigError { key, message });
        let name = match self.ordering {
            OrderingKind::Fifo => "fifo",
            OrderingKind::Dbo => "dbo",
            OrderingKind::Batch => "batch",
        };
        if self.dbo_bound_ns != 0 && self.ordering != OrderingKind::Dbo {
            return bad("dbo_bound_ns", format!("dbo_bound_ns is set but ordering is \"{name}\", not \"dbo\""));
        }
        if self.batch_us != 0 && self.ordering != OrderingKind::Batch {
            return bad("batch_us", format!("batch_us is set but ordering is \"{name}\", not \"batch\""));
        }
        if self.ordering == OrderingKind::Fifo {
            return Ok(());
        }
        if self.sequencing_window_ns != 0 {
            return bad(
                "sequencing_window_ns",
                format!("sequencing_window_ns (client-timestamp order) and ordering = \"{name}\" exclude each other"),
            );
        }
        if self.gateway.users.len() > ORDERING_FIRMS_MAX {
            return bad("ordering", format!("ordering = \"{name}\" tracks at most {ORDERING_FIRMS_MAX} users"));
        }
        match self.ordering {
            OrderingKind::Dbo if !(1_000..=1_000_000_000).contains(&self.dbo_bound_ns) => bad(
                "dbo_bound_ns",
                format!("ordering = \"dbo\" needs dbo_bound_ns in 1 µs..=1 s, got {}", self.dbo_bound_ns),
            ),
            OrderingKind::Batch if !(1..=BATCH_US_MAX).contains(&self.batch_us) => bad(
                "batch_us",
                format!("ordering = \"batch\" needs batch_us in 1..={BATCH_US_MAX} (µs), got {}", self.batch_us),
            ),
            _ => Ok(()),
        }
    }
}

/// The longest batch interval the live exchange takes, µs (1 s).
pub const BATCH_US_MAX: u64 = 1_000_000;

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
            ordering: OrderingKind::Fifo,
            dbo_bound_ns: 0,
            batch_us: 0,
            deadlines_listen: None,
            operator_key_file: None,
            operator_key: None,
            out_buffer_max_bytes: OUT_BUFFER_DEFAULT_MAX,
            itch_heartbeat_ns: ITCH_HEARTBEAT_DEFAULT_NS,
            itch_journal_max_bytes: JOURNAL_BYTES_DEFAULT,
            pipeline: Pipeline::Auto,
            idle: Idle::Auto,
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
    /// The pipeline it ran (never `auto`).
    pub pipeline: Pipeline,
    /// How its threads waited (`idle` resolved).
    pub idle: String,
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
    /// DBO's ordering buffer (zeros under fifo).
    pub ordering: OrderingStats,
    /// The cheat watch (with `deadlines_listen`): its counters, the deadline
    /// book and each user's watch (`flagged_after`: its orders when flagged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cheat: Option<serde_json::Value>,
    pub steps: Vec<Step>,
}

struct Cmd {
    cmd: Command,
    t0: u64,
    batch: InBatch,
}

/// Where a command stands in a batch (ordering `batch`): an engine gathers
/// the parts and clears them in one call auction at the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InBatch {
    No,
    Part,
    Last,
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

/// How the exchange's threads wait for work by default: spin 50 µs, yield
/// 50 µs, then park until woken (or 1 ms).
pub const IDLE: IdleStrategy = IdleStrategy::Backoff { spin_ns: 50_000, yield_ns: 50_000 };

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
    threads: Vec<thread::JoinHandle<Vec<Part>>>,
    pub addr: SocketAddr,
    /// Where the cheat watch takes deadline records (`deadlines_listen`, bound).
    pub deadlines_addr: Option<SocketAddr>,
    /// The pipeline it runs (never `auto`).
    pub pipeline: Pipeline,
    /// How its threads wait (`idle` resolved).
    pub idle: IdleStrategy,
}

/// What the gateway thread reports at exit.
struct GatewayPart {
    stats: GatewayStats,
    hists: [Histogram<u64>; 5],
    ring_full: u64,
    sequencer: SequencerStats,
    ordering: OrderingStats,
    cheat: Option<serde_json::Value>,
}

enum Part {
    Gateway(Box<GatewayPart>),
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
        let pipeline = cfg.pipeline.resolve(cfg.engines);
        let strategy = cfg.idle.strategy(if pipeline == Pipeline::Threaded { cfg.engines + 2 } else { 1 });
        // One origin for every thread's timestamps (the steps subtract them).
        let start = Instant::now();
        let mut threads = Vec::new();
        let me = GatewayWaker {
            sleeping: Arc::new(AtomicBool::new(false)),
            fd: Arc::new(
                nix::sys::eventfd::EventFd::from_value_and_flags(0, nix::sys::eventfd::EfdFlags::EFD_NONBLOCK)
                    .map_err(std::io::Error::from)?,
            ),
        };
        let matching = match pipeline {
            Pipeline::Threaded => start_threads(&cfg, (start, &stop, strategy), &metrics, &me, &mut threads)?,
            _ => Matching::Inline(Box::new(Inline {
                engines: (0..cfg.engines).map(|k| Engine::new(cfg.limits, k as u64, cfg.engines as u64)).collect(),
                publisher: Publisher::new(&cfg)?,
                events: Vec::with_capacity(64),
                done: Vec::with_capacity(256),
            })),
        };
        let rd = Readiness::new()?;
        rd.watch(&listener, EP_LISTENER)?;
        rd.watch(me.fd.as_fd(), EP_WAKE)?;
        if let Matching::Inline(m) = &matching {
            if let Some(r) = &m.publisher.retrans {
                rd.watch(r, EP_RETRANS)?;
            }
        }
        let watch = Watch::start(&cfg, &rd)?;
        let deadlines_addr = watch.as_ref().map(|w| w.sock.local_addr()).transpose()?;
        let g = GatewayLoop {
            watch,
            listener,
            rd,
            gw: Gateway::new(cfg.gateway.clone()),
            matching,
            me,
            order: Orderer::new(&cfg),
            engines: cfg.engines,
            out_max: cfg.out_buffer_max_bytes,
            idle: strategy,
            login_failures: std::collections::HashMap::new(),
            start,
            stop: stop.clone(),
            metrics,
            by_user: Vec::new(),
            listener_resume_ns: 0,
            due: Vec::new(),
            batch: Vec::new(),
        };
        let name = if pipeline == Pipeline::Threaded { "gateway" } else { "exchange" };
        threads.push(thread::Builder::new().name(name.into()).spawn(move || gateway_loop(g))?);
        Ok(Exchange { stop, threads, addr, deadlines_addr, pipeline, idle: strategy })
    }

    /// Stops every thread and reports.
    pub fn finish(self) -> ExchangeReport {
        self.stop.store(true, Ordering::Relaxed);
        let mut r = ExchangeReport {
            pipeline: self.pipeline,
            idle: format!("{:?}", self.idle),
            gateway: GatewayStats::default(),
            engines: Vec::new(),
            itch_packets: 0,
            itch_messages: 0,
            itch_heartbeats: 0,
            itch_journal_evicted: 0,
            retransmit_answers: 0,
            ring_full: 0,
            sequencer: SequencerStats::default(),
            ordering: OrderingStats::default(),
            cheat: None,
            steps: Vec::new(),
        };
        for part in self.threads.into_iter().filter_map(|t| t.join().ok()).flatten() {
            match part {
                Part::Gateway(p) => {
                    let GatewayPart { stats, hists: h, ring_full, sequencer, ordering, cheat } = *p;
                    r.gateway = stats;
                    r.sequencer = sequencer;
                    r.ordering = ordering;
                    r.cheat = cheat;
                    r.ring_full = ring_full;
                    let names = [
                        "t0→t1 gateway → engine",
                        "t1→t2 matching",
                        "t2→t3 engine → gateway",
                        "t3→t4 response written",
                        "t0→t4 total",
                    ];
                    r.steps = names.iter().zip(h.iter()).map(|(n, h)| step(n, h)).collect();
                }
                Part::Engine(s) => r.engines.push(s),
                Part::Publisher(p, m, a, h, e) => {
                    r.itch_packets = p;
                    r.itch_messages = m;
                    r.retransmit_answers = a;
                    r.itch_heartbeats = h;
                    r.itch_journal_evicted = e;
                }
            }
        }
        r
    }
}

/// The threaded pipeline's engine and publisher threads, and the gateway's ends of their rings.
fn start_threads(
    cfg: &ExchangeConfig,
    (start, stop, strategy): (Instant, &Arc<AtomicBool>, IdleStrategy),
    metrics: &Option<Arc<ExchangeMetrics>>,
    gw_waker: &GatewayWaker,
    threads: &mut Vec<thread::JoinHandle<Vec<Part>>>,
) -> std::io::Result<Matching> {
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
    let pub_sleeping = Arc::new(AtomicBool::new(false));
    let publisher = spawn_publisher(cfg, (pub_rx, strategy), stop.clone(), pub_sleeping.clone(), metrics.clone())?;
    let pub_waker = Waker { sleeping: pub_sleeping, thread: Some(publisher.thread().clone()) };
    threads.push(publisher);
    let mut wakers = Vec::new();
    for (shard, ((crx, gtx), ptx)) in cmd_rx.into_iter().zip(to_gw).zip(to_pub).enumerate() {
        let (limits, n, stop) = (cfg.limits, cfg.engines as u64, stop.clone());
        let sleeping = Arc::new(AtomicBool::new(false));
        let (asleep, pw, gwk) = (sleeping.clone(), pub_waker.clone(), gw_waker.clone());
        let (metrics, idle) = (metrics.clone(), strategy);
        let lp = EngineLoop { limits, shard, n, stop, start, asleep, pw, gwk, metrics, idle };
        let h = thread::Builder::new()
            .name(format!("engine-{shard}"))
            .spawn(move || vec![engine_loop(lp, crx, gtx, ptx)])?;
        wakers.push(Waker { sleeping, thread: Some(h.thread().clone()) });
        threads.push(h);
    }
    Ok(Matching::Threaded { cmd_tx, to_gw: gw_rx, wakers })
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
    idle: IdleStrategy,
}

/// One engine thread: commands in, events to the gateway and the publisher.
fn engine_loop(
    lp: EngineLoop,
    mut crx: rtrb::Consumer<Cmd>,
    mut gtx: rtrb::Producer<Out>,
    mut ptx: rtrb::Producer<Event>,
) -> Part {
    let EngineLoop { limits, shard, n, stop, start, asleep, pw, gwk, metrics, idle: strategy } = lp;
    let mut e = Engine::new(limits, shard as u64, n);
    let mut batch: Vec<Event> = Vec::with_capacity(64);
    // The parts of the batch being gathered (ordering `batch`).
    let mut in_batch: Vec<Command> = Vec::new();
    let mut idler = Idler::new(strategy);
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
        match c.batch {
            InBatch::No => e.handle(c.cmd, &mut |ev| batch.push(ev)),
            InBatch::Part => {
                in_batch.push(c.cmd);
                continue;
            }
            InBatch::Last => {
                in_batch.push(c.cmd);
                e.handle_batch(&in_batch, &mut |ev| batch.push(ev));
                in_batch.clear();
            }
        }
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

/// The ITCH side: events in, MoldUDP64 packets out on the A and B lines, the
/// journal of what was sent, retransmission answers, heartbeats on a quiet
/// line. Driven by the publisher thread (threaded pipeline) or inline by
/// the one thread of the run-to-completion pipeline.
struct Publisher {
    w: ItchWriter,
    sock: UdpSocket,
    lines: [Option<SocketAddr>; 2],
    server: RetransmitServer,
    retrans: Option<UdpSocket>,
    heartbeat_ns: u64,
    last_sent: u64,
    packets: u64,
    answers: u64,
    heartbeats: u64,
    start: Instant,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl Publisher {
    fn new(cfg: &ExchangeConfig) -> std::io::Result<Self> {
        let sock = UdpSocket::bind("0.0.0.0:0")?;
        let retrans = match cfg.retransmit_listen {
            Some(a) => {
                let s = UdpSocket::bind(a)?;
                s.set_nonblocking(true)?;
                Some(s)
            }
            None => None,
        };
        let mut p = Publisher {
            w: ItchWriter::new(&cfg.itch_session, &cfg.gateway.symbols),
            sock,
            lines: [cfg.itch_a, cfg.itch_b],
            server: RetransmitServer::new(Journal::with_limit(cfg.itch_journal_max_bytes), ServerConfig::default()),
            retrans,
            heartbeat_ns: cfg.itch_heartbeat_ns,
            last_sent: wall_ns(),
            packets: 0,
            answers: 0,
            heartbeats: 0,
            start: Instant::now(),
            buf: vec![0u8; 2048],
            out: vec![0u8; 1400],
        };
        p.w.open(wall_ns());
        p.send(wall_ns());
        Ok(p)
    }

    fn send(&mut self, now: u64) {
        let packets = self.w.take_packets();
        for pk in &packets {
            for to in self.lines.into_iter().flatten() {
                let _ = self.sock.send_to(pk, to);
            }
            let _ = self.server.journal_mut().append_packet(pk);
            self.packets += 1;
            self.last_sent = now;
        }
        self.w.recycle(packets);
    }

    fn on_event(&mut self, now: u64, ev: &Event) {
        self.w.on_event(now, ev);
    }

    /// Sends what the events made.
    fn flush(&mut self, now: u64) {
        self.w.flush();
        self.send(now);
    }

    /// Heartbeats on a quiet line and retransmission answers; true if it did anything.
    fn tick(&mut self, now: u64) -> bool {
        let mut any = false;
        if now.saturating_sub(self.last_sent) >= self.heartbeat_ns {
            let hb = self.w.heartbeat();
            for to in self.lines.into_iter().flatten() {
                let _ = self.sock.send_to(&hb, to);
            }
            self.heartbeats += 1;
            self.last_sent = now;
            any = true;
        }
        if let Some(s) = &self.retrans {
            while let Ok((n, from)) = s.recv_from(&mut self.buf) {
                any = true;
                if let Some(len) = self.server.handle_request(ns(self.start), from, &self.buf[..n], &mut self.out) {
                    if s.send_to(&self.out[..len], from).is_ok() {
                        self.answers += 1;
                    }
                }
            }
        }
        any
    }

    fn counters(&self) -> serde_json::Value {
        serde_json::json!({
            "itch_packets": self.packets,
            "itch_messages": self.w.messages,
            "itch_heartbeats": self.heartbeats,
            "retransmit_answers": self.answers,
            "itch_journal_evicted": self.server.journal().evicted(),
        })
    }

    /// Ends the session (End of Session on both lines) and reports.
    fn close(mut self) -> Part {
        self.w.close(wall_ns());
        self.send(wall_ns());
        Part::Publisher(self.packets, self.w.messages, self.answers, self.heartbeats, self.server.journal().evicted())
    }
}

fn spawn_publisher(
    cfg: &ExchangeConfig,
    (mut rx, strategy): (Vec<rtrb::Consumer<Event>>, IdleStrategy),
    stop: Arc<AtomicBool>,
    sleeping: Arc<AtomicBool>,
    metrics: Option<Arc<ExchangeMetrics>>,
) -> std::io::Result<thread::JoinHandle<Vec<Part>>> {
    let mut p = Publisher::new(cfg)?;
    thread::Builder::new().name("publisher".into()).spawn(move || {
        let mut idler = Idler::new(strategy);
        let mut next_publish = 0;
        while !stop.load(Ordering::Relaxed) {
            let now = wall_ns();
            if let Some(m) = metrics.as_ref().filter(|_| now >= next_publish) {
                next_publish = now + PUBLISH_NS;
                m.put(None, "publisher", p.counters());
            }
            let mut any = false;
            for r in &mut rx {
                while let Ok(ev) = r.pop() {
                    p.on_event(now, &ev);
                    any = true;
                }
            }
            if any {
                p.flush(now);
                idler.busy();
            }
            if !p.tick(now) && !any {
                idle(&mut idler, now, &sleeping, || rx.iter().all(|r| r.is_empty()));
            }
        }
        vec![p.close()]
    })
}

struct Session {
    sock: TcpStream,
    peer: std::net::IpAddr,
    conn: Conn,
    /// Bytes for the client; `out[out_at..]` not yet written.
    out: Vec<u8>,
    out_at: usize,
    /// Its socket was full: not written again before this (ns since start),
    /// after a wait that doubles while it stays full.
    write_blocked_until: u64,
    write_backoff_ns: u64,
    /// Since when it is closing (it drains what it was sent, for at most `CLOSE_DRAIN_NS`).
    closing: Option<u64>,
}

impl Session {
    fn unsent(&self) -> usize {
        self.out.len() - self.out_at
    }

    fn close(&mut self, now: u64) {
        self.closing.get_or_insert(now);
    }
}

/// How commands reach the engines and their events come back.
enum Matching {
    /// Engine threads behind rings (and a publisher thread behind them).
    Threaded { cmd_tx: Vec<rtrb::Producer<Cmd>>, to_gw: Vec<rtrb::Consumer<Out>>, wakers: Vec<Waker> },
    /// Run to completion: the engines and the publisher on the gateway's thread.
    Inline(Box<Inline>),
}

struct Inline {
    engines: Vec<Engine>,
    publisher: Publisher,
    /// One command's events (kept for its allocation).
    events: Vec<Event>,
    /// Responses matched this pass, for the clients.
    done: Vec<Out>,
}

/// `epoll` data of the listener, the wake-up eventfd and the retransmission
/// socket (sessions are their slot index).
const EP_LISTENER: u64 = u64::MAX;
const EP_WAKE: u64 = u64::MAX - 1;
const EP_RETRANS: u64 = u64::MAX - 2;
const EP_DEADLINES: u64 = u64::MAX - 3;
/// Readiness events taken per look.
const EP_EVENTS: usize = 512;

/// Which sockets have input: one `epoll` set over the listener, every
/// session, the wake-up and (run to completion) the retransmission socket,
/// so a pass reads only the sessions that sent something — 300 idle
/// connections used to cost 300 `read` calls a pass.
struct Readiness {
    epoll: nix::sys::epoll::Epoll,
    events: Vec<nix::sys::epoll::EpollEvent>,
    /// Slots with input (set by a look, cleared by the read).
    ready: Vec<bool>,
    listener: bool,
    /// The deadline-records socket has input.
    deadlines: bool,
}

impl Readiness {
    fn new() -> std::io::Result<Self> {
        let epoll = nix::sys::epoll::Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC)?;
        Ok(Readiness {
            epoll,
            events: vec![nix::sys::epoll::EpollEvent::empty(); EP_EVENTS],
            ready: Vec::new(),
            listener: true,
            deadlines: false,
        })
    }

    fn watch(&self, fd: impl std::os::fd::AsFd, data: u64) -> std::io::Result<()> {
        use nix::sys::epoll::{EpollEvent, EpollFlags};
        Ok(self.epoll.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, data))?)
    }

    /// Watches the listener for connections again, or stops (`on` false):
    /// a connection it cannot accept keeps it ready, which would wake every look.
    fn watch_listener(&mut self, listener: &TcpListener, on: bool) {
        use nix::sys::epoll::{EpollEvent, EpollFlags};
        let flags = if on { EpollFlags::EPOLLIN } else { EpollFlags::empty() };
        let _ = self.epoll.modify(listener, &mut EpollEvent::new(flags, EP_LISTENER));
        self.listener = on;
    }

    /// Notes what has input, waiting up to `timeout_ms` for something.
    fn look(&mut self, timeout_ms: u16) {
        let t = nix::sys::epoll::EpollTimeout::from(timeout_ms);
        let Ok(n) = self.epoll.wait(&mut self.events, t) else { return };
        for e in &self.events[..n] {
            match e.data() {
                EP_LISTENER => self.listener = true,
                EP_DEADLINES => self.deadlines = true,
                EP_WAKE | EP_RETRANS => {}
                i => {
                    let i = i as usize;
                    if i >= self.ready.len() {
                        self.ready.resize(i + 1, false);
                    }
                    self.ready[i] = true;
                }
            }
        }
    }
}

struct GatewayLoop {
    listener: TcpListener,
    rd: Readiness,
    gw: Gateway,
    matching: Matching,
    me: GatewayWaker,
    order: Orderer,
    engines: usize,
    /// Bytes queued for one client at most.
    out_max: usize,
    idle: IdleStrategy,
    /// Per address: (start of its current one-second window, failed logins in it).
    login_failures: std::collections::HashMap<std::net::IpAddr, (u64, u32)>,
    start: Instant,
    stop: Arc<AtomicBool>,
    metrics: Option<Arc<ExchangeMetrics>>,
    /// Session slot of each logged-in user, rebuilt per batch of responses.
    by_user: Vec<usize>,
    /// After a failed `accept`, when the listener is watched again (ns since
    /// `start`; 0: it is watched).
    listener_resume_ns: u64,
    /// The cheat watch and its deadline-records socket (`deadlines_listen`).
    watch: Option<Watch>,
    /// Commands the orderer released (with their batch), reused.
    due: Vec<(Command, Option<u64>)>,
    /// One batch's commands for one engine, reused.
    batch: Vec<Command>,
}

/// The live side of the cheat watch.
struct Watch {
    watch: Box<CheatWatch>,
    sock: UdpSocket,
    /// When the sessions' round trips were last read (ns since start).
    last_rtt_ns: u64,
}

/// How often each session's TCP minimum round trip is read for the cheat watch.
const WATCH_RTT_EVERY_NS: u64 = 100_000_000;
/// Deadline datagrams read per pass at most (the rest wait for the next).
const WATCH_READS_PER_PASS: usize = 256;

impl Watch {
    fn start(cfg: &ExchangeConfig, rd: &Readiness) -> std::io::Result<Option<Watch>> {
        let Some(addr) = cfg.deadlines_listen else { return Ok(None) };
        let key = cfg.operator_key.clone().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "deadlines_listen needs the operator key")
        })?;
        let sock = fairfeed_io::socket::bind_udp(addr, 4 << 20)?;
        rd.watch(&sock, EP_DEADLINES)?;
        let users = cfg.gateway.users.iter().map(|u| u.0.clone()).collect();
        Ok(Some(Watch { watch: Box::new(CheatWatch::new(key, users)), sock, last_rtt_ns: 0 }))
    }

    /// Takes the deadline records waiting (when the socket said so).
    fn read(&mut self, ready: &mut bool, buf: &mut [u8]) -> bool {
        if !std::mem::take(ready) {
            return false;
        }
        for _ in 0..WATCH_READS_PER_PASS {
            match self.sock.recv(buf) {
                Ok(n) => self.watch.on_datagram(&buf[..n]),
                Err(_) => return true,
            }
        }
        // More may wait: look again next pass.
        *ready = true;
        true
    }

    /// Every logged-in session's TCP minimum round trip, now and then.
    fn sample_paths(&mut self, sessions: &[Option<Session>], now: u64) {
        if now < self.last_rtt_ns + WATCH_RTT_EVERY_NS {
            return;
        }
        self.last_rtt_ns = now;
        for s in sessions.iter().flatten().filter(|s| s.closing.is_none()) {
            if let (Some(u), Some(rtt)) = (s.conn.user, tcp_min_rtt_ns(s.sock.as_fd())) {
                self.watch.on_rtt(u as usize, rtt);
            }
        }
    }
}

/// The order commands reach matching in (config `ordering`).
enum Orderer {
    /// FIFO; with a window, client-timestamp order within it (CloudEx).
    Window(Sequencer),
    /// DBO (by delivery clock, each order held at most the bound) or batch
    /// (every order of one interval together, cleared in one call auction).
    Buffer(Box<OrderingBuffer<Command>>),
}

impl Orderer {
    fn new(cfg: &ExchangeConfig) -> Self {
        let firms = cfg.gateway.users.len();
        match cfg.ordering {
            OrderingKind::Dbo => {
                Orderer::Buffer(Box::new(OrderingBuffer::new(OrderingMode::Dbo { bound_ns: cfg.dbo_bound_ns }, firms)))
            }
            OrderingKind::Batch => Orderer::Buffer(Box::new(OrderingBuffer::new(
                OrderingMode::Batch { interval_ns: cfg.batch_us * 1_000 },
                firms,
            ))),
            OrderingKind::Fifo => Orderer::Window(Sequencer::new(cfg.sequencing_window_ns)),
        }
    }

    /// A command arrived at `now`: returned if it goes to matching at once.
    fn take(&mut self, c: Command, st: OrderStamps, now: u64) -> Option<Command> {
        match self {
            Orderer::Window(s) if s.window_ns() == 0 => Some(c),
            Orderer::Window(s) => {
                s.push(c, st.client_ns, now);
                None
            }
            Orderer::Buffer(b) => {
                let firm = match c {
                    Command::New(o) => o.client,
                    Command::Cancel { client, .. } | Command::Replace { client, .. } => client,
                };
                // The gateway's clients are its users, fewer than the buffer's firms (checked in the config).
                let firm = u16::try_from(firm).unwrap_or(u16::MAX);
                b.handle_order(now, firm, st.clock, c).err().map(|(c, _)| c)
            }
        }
    }

    /// Whether anything is held.
    fn holds(&self) -> bool {
        match self {
            Orderer::Window(s) => !s.is_empty(),
            Orderer::Buffer(b) => b.held() > 0,
        }
    }

    /// What is due at `now`, into `out`, each with its batch (batch ordering).
    fn due(&mut self, now: u64, out: &mut Vec<(Command, Option<u64>)>) {
        match self {
            Orderer::Window(s) => out.extend(std::iter::from_fn(|| s.pop_due(now)).map(|c| (c, None))),
            Orderer::Buffer(b) => {
                b.handle_timeout(now);
                out.extend(std::iter::from_fn(|| b.poll_release()).map(|r| (r.item, r.batch)));
            }
        }
    }

    fn stats(&self) -> (SequencerStats, OrderingStats) {
        match self {
            Orderer::Window(s) => (s.stats, OrderingStats::default()),
            Orderer::Buffer(b) => (SequencerStats::default(), b.stats),
        }
    }
}

/// How long the listener is left alone after a failed `accept` (out of file
/// descriptors, say): its pending connection keeps it ready, and accepting
/// again at once would spin the thread that serves every session.
pub const ACCEPT_RETRY_NS: u64 = 50_000_000;

/// Takes the connections waiting on the listener: each into a free slot —
/// with every slot taken, the oldest connection not logged in is closed to
/// make room (counted `prelogin_evicted`) — unless its address already holds
/// `PRELOGIN_PER_ADDRESS_MAX` connections that have not logged in, or every
/// slot holds a logged-in session (refused, counted). Returns whether any came.
fn accept(g: &mut GatewayLoop, sessions: &mut Vec<Option<Session>>) -> bool {
    if g.listener_resume_ns != 0 && ns(g.start) >= g.listener_resume_ns {
        g.listener_resume_ns = 0;
        g.rd.watch_listener(&g.listener, true);
    }
    if !std::mem::take(&mut g.rd.listener) {
        return false;
    }
    let mut any = false;
    loop {
        let (sock, from) = match g.listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // This connection went away before it was taken, or a signal: the next may do.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted) => {
                continue
            }
            Err(_) => {
                g.gw.stats.accept_errors += 1;
                g.rd.watch_listener(&g.listener, false);
                g.listener_resume_ns = ns(g.start) + ACCEPT_RETRY_NS;
                break;
            }
        };
        any = true;
        let peer = from.ip();
        // Refused: dropped, the client sees the connection closed.
        let Some(slot) = admit(g, sessions, peer) else { continue };
        let _ = sock.set_nodelay(true);
        let _ = sock.set_nonblocking(true);
        // The gateway's clock is the wall clock (OUCH stamps nanoseconds since midnight).
        let i = slot.unwrap_or(sessions.len());
        if g.rd.watch(&sock, i as u64).is_err() {
            g.gw.stats.refused_connections += 1;
            continue;
        }
        let s = Session {
            sock,
            peer,
            conn: Conn::new(wall_ns()),
            out: Vec::new(),
            out_at: 0,
            write_blocked_until: 0,
            write_backoff_ns: 0,
            closing: None,
        };
        match slot {
            Some(i) => sessions[i] = Some(s),
            None => sessions.push(Some(s)),
        }
        // A new socket may have bytes already.
        g.rd.look(0);
        if let Some(r) = g.rd.ready.get_mut(i) {
            *r = true;
        }
    }
    any
}

/// Whether a connection from `peer` is taken, and where: `Some(Some(i))` in
/// slot `i`, `Some(None)` at the end; `None`: refused (counted). A peer
/// guessing passwords, or holding too many connections that have not
/// logged in, is refused; with every slot taken the oldest connection that
/// has not logged in makes room (a real client logs in within a round trip;
/// one that holds a slot without logging in is the cheapest to lose).
fn admit(g: &mut GatewayLoop, sessions: &mut [Option<Session>], peer: std::net::IpAddr) -> Option<Option<usize>> {
    let now = ns(g.start);
    let guessing = g
        .login_failures
        .get(&peer)
        .is_some_and(|&(since, n)| now - since < 1_000_000_000 && n >= LOGIN_FAILURES_PER_S_MAX);
    if guessing {
        g.gw.stats.login_rate_limited += 1;
        return None;
    }
    let waiting = sessions.iter().flatten().filter(|s| s.peer == peer && s.conn.user.is_none()).count();
    if waiting >= PRELOGIN_PER_ADDRESS_MAX {
        g.gw.stats.refused_connections += 1;
        return None;
    }
    match sessions.iter().position(Option::is_none) {
        Some(i) => Some(Some(i)),
        None if sessions.len() < CONNECTIONS_MAX => Some(None),
        None => match oldest_prelogin(sessions) {
            Some(i) => {
                g.gw.stats.prelogin_evicted += 1;
                sessions[i] = None;
                Some(Some(i))
            }
            None => {
                g.gw.stats.refused_connections += 1;
                None
            }
        },
    }
}

/// The slot of the oldest open connection that has not logged in.
fn oldest_prelogin(sessions: &[Option<Session>]) -> Option<usize> {
    sessions
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            s.as_ref().filter(|s| s.conn.user.is_none() && s.closing.is_none()).map(|s| (s.conn.opened_ns(), i))
        })
        .min()
        .map(|(_, i)| i)
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
        if s.closing.is_none() && s.unsent() > g.out_max {
            s.out.clear();
            s.out_at = 0;
            g.gw.stats.slow_reader_closes += 1;
            g.gw.closed(&mut s.conn, Close::Logout);
            s.close(now);
        }
    }
}

/// Drops the closing sessions that have drained, or have had `CLOSE_DRAIN_NS` to.
fn drop_closed(sessions: &mut [Option<Session>], now: u64) {
    for slot in sessions.iter_mut() {
        if slot.as_ref().and_then(|s| s.closing.map(|t| s.unsent() == 0 || now - t > CLOSE_DRAIN_NS)) == Some(true) {
            *slot = None;
        }
    }
}

/// Puts the gateway's counters and the order latency where the metrics endpoint reads them.
fn publish_gateway(g: &GatewayLoop, latency: &Histogram<u64>, ring_full: u64, sessions: &[Option<Session>]) {
    let Some(m) = &g.metrics else { return };
    m.put(None, "gateway", serde_json::to_value(g.gw.stats).unwrap_or_default());
    let (q, o) = g.order.stats();
    m.put(None, "sequencer", serde_json::to_value(q).unwrap_or_default());
    m.put(None, "ordering", serde_json::to_value(o).unwrap_or_default());
    if let Some(w) = &g.watch {
        m.put(None, "cheat", w.watch.report());
    }
    m.put(None, "ring_full", ring_full.into());
    m.put(None, "sessions", sessions.iter().flatten().count().into());
    if let Matching::Inline(x) = &g.matching {
        for (k, e) in x.engines.iter().enumerate() {
            m.put(Some(k), "", serde_json::to_value(e.stats).unwrap_or_default());
        }
        m.put(None, "publisher", x.publisher.counters());
    }
    *m.order_latency.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(latency.clone());
}

/// Responses matched or received since the last look.
fn take_responses(g: &mut GatewayLoop, outs: &mut Vec<Out>) {
    match &mut g.matching {
        Matching::Threaded { to_gw, .. } => {
            for r in to_gw.iter_mut() {
                while let Ok(o) = r.pop() {
                    outs.push(o);
                }
            }
        }
        Matching::Inline(m) => {
            outs.append(&mut m.done);
            // The ITCH packets of what was matched, before anything else is read.
            m.publisher.flush(wall_ns());
        }
    }
}

/// The responses to their clients (OUCH), written once for the whole batch
/// (a write per command cost a system call each, and loopback TCP does the
/// receiver's work inside it: 60 % of the thread at 250,000 orders/s), each
/// command's steps timed.
fn respond(g: &mut GatewayLoop, outs: &[Out], sessions: &mut [Option<Session>], hists: &mut [Histogram<u64>; 5]) {
    if outs.is_empty() {
        return;
    }
    let (t3, wall) = (ns(g.start), wall_ns());
    // Each user's session, found once per batch rather than per message (a
    // scan of every connection per message cost the most under the
    // idle-connections attack).
    let by_user = &mut g.by_user;
    by_user.clear();
    for (i, s) in sessions.iter().enumerate() {
        let Some((u, closing)) = s.as_ref().and_then(|s| s.conn.user.map(|u| (u as usize, s.closing.is_some()))) else {
            continue;
        };
        if by_user.len() <= u {
            by_user.resize(u + 1, usize::MAX);
        }
        // A user's live session before one still draining on its way out.
        let held = sessions.get(by_user[u]).and_then(Option::as_ref);
        if held.is_none_or(|h| h.closing.is_some() && !closing) {
            by_user[u] = i;
        }
    }
    for o in outs {
        g.gw.on_event(wall, &o.ev, &mut |client, bytes| {
            let at = by_user.get(client as usize).copied().unwrap_or(usize::MAX);
            if let Some(Some(s)) = sessions.get_mut(at) {
                s.out.extend_from_slice(bytes);
            }
        });
    }
    flush_all(sessions, t3);
    let t4 = ns(g.start);
    for o in outs.iter().filter(|o| o.last) {
        let t3 = t3.max(o.t2);
        for (h, v) in hists.iter_mut().zip([o.t1 - o.t0, o.t2 - o.t1, t3 - o.t2, t4 - t3, t4 - o.t0]) {
            let _ = h.record(v.max(1));
        }
    }
}

/// Once a millisecond: counters published, sessions' timers, the publisher's
/// heartbeats and retransmissions when it runs here.
fn tick(g: &mut GatewayLoop, sessions: &mut [Option<Session>], now: u64) {
    let wall = wall_ns();
    // Closing sessions are past their timers (and counted once).
    for s in sessions.iter_mut().flatten().filter(|s| s.closing.is_none()) {
        if g.gw.on_tick(&mut s.conn, wall, &mut s.out).is_err() {
            s.close(now);
        }
    }
    if let Matching::Inline(m) = &mut g.matching {
        m.publisher.tick(wall);
    }
}

fn gateway_loop(mut g: GatewayLoop) -> Vec<Part> {
    let mut sessions: Vec<Option<Session>> = Vec::new();
    let mut hists: [Histogram<u64>; 5] = [hist(), hist(), hist(), hist(), hist()];
    let mut buf = vec![0u8; 65_536];
    let (mut ring_full, mut last_tick, mut next_publish, mut dirty) = (0u64, 0u64, 0u64, true);
    let mut cmds: Vec<(Command, OrderStamps)> = Vec::new();
    let mut outs: Vec<Out> = Vec::with_capacity(256);
    let mut idler = Idler::new(g.idle);
    while !g.stop.load(Ordering::Relaxed) {
        let mut busy = accept(&mut g, &mut sessions);
        busy |= read_sessions(&mut g, &mut sessions, &mut buf, &mut cmds, &mut ring_full);
        if g.order.holds() {
            busy = true;
            route_due(&mut g, &mut ring_full);
        }
        outs.clear();
        take_responses(&mut g, &mut outs);
        busy |= !outs.is_empty();
        respond(&mut g, &outs, &mut sessions, &mut hists);
        let now = ns(g.start);
        if now - last_tick > 1_000_000 {
            last_tick = now;
            if dirty && now >= next_publish {
                next_publish = now + PUBLISH_NS;
                dirty = false;
                publish_gateway(&g, &hists[4], ring_full, &sessions);
            }
            tick(&mut g, &mut sessions, now);
            if let Some(w) = &mut g.watch {
                w.sample_paths(&sessions, now);
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
            idler.idle(now, || gateway_sleep(&mut g));
        }
    }
    close_gateway(g, hists, ring_full)
}

/// Routes the orders the ordering releases now (a batch's as one).
fn route_due(g: &mut GatewayLoop, ring_full: &mut u64) {
    let mut due = std::mem::take(&mut g.due);
    g.order.due(wall_ns(), &mut due);
    let mut at = 0;
    while at < due.len() {
        match due[at].1 {
            None => {
                route(g, due[at].0, InBatch::No, ring_full);
                at += 1;
            }
            Some(b) => {
                let end = at + due[at..].iter().take_while(|d| d.1 == Some(b)).count();
                route_batch(g, &due[at..end], ring_full);
                at = end;
            }
        }
    }
    due.clear();
    g.due = due;
}

/// The gateway's parts of the report (and the inline engines' and publisher's).
fn close_gateway(g: GatewayLoop, hists: [Histogram<u64>; 5], ring_full: u64) -> Vec<Part> {
    let (q, o) = g.order.stats();
    let cheat = g.watch.as_ref().map(|w| w.watch.report());
    let mut parts = vec![Part::Gateway(Box::new(GatewayPart {
        stats: g.gw.stats,
        hists,
        ring_full,
        sequencer: q,
        ordering: o,
        cheat,
    }))];
    if let Matching::Inline(m) = g.matching {
        let Inline { engines, publisher, .. } = *m;
        parts.extend(engines.into_iter().map(|e| Part::Engine(e.stats)));
        parts.push(publisher.close());
    }
    parts
}

/// Reads every session that has bytes; routes the commands to their engine
/// shard. Returns whether anything arrived.
fn read_sessions(
    g: &mut GatewayLoop,
    sessions: &mut [Option<Session>],
    buf: &mut [u8],
    cmds: &mut Vec<(Command, OrderStamps)>,
    ring_full: &mut u64,
) -> bool {
    let mut busy = false;
    g.rd.look(0);
    // Deadline records before orders: an order and the record of the data it
    // answers that came in the same pass are judged with the record.
    if let Some(w) = &mut g.watch {
        busy |= w.read(&mut g.rd.deadlines, buf);
    }
    for (i, slot) in sessions.iter_mut().enumerate() {
        if !g.rd.ready.get_mut(i).is_some_and(std::mem::take) {
            continue;
        }
        let Some(s) = slot else { continue };
        if s.closing.is_some() {
            continue; // nothing more is taken from a session being closed
        }
        // Before login a client has one small packet to send: a connection
        // that sends more before logging in is read in small pieces (garbage
        // is refused after its first bytes, not after 64 KiB of them).
        let limit = if s.conn.user.is_none() { PRELOGIN_READ_MAX.min(buf.len()) } else { buf.len() };
        match s.sock.read(&mut buf[..limit]) {
            Ok(0) => {
                g.gw.closed(&mut s.conn, Close::Logout);
                *slot = None;
                continue;
            }
            Ok(n) => {
                busy = true;
                cmds.clear();
                let r = g.gw.on_bytes(&mut s.conn, wall_ns(), &buf[..n], &mut |c, ts| cmds.push((c, ts)), &mut s.out);
                for &(c, st) in cmds.iter() {
                    if let (Some(w), Command::New(o)) = (&mut g.watch, c) {
                        w.watch.on_order(o.client as usize, st.clock, wall_ns());
                    }
                    if let Some(c) = g.order.take(c, st, wall_ns()) {
                        route(g, c, InBatch::No, ring_full);
                    }
                }
                if r.is_err() {
                    let now = ns(g.start);
                    // A refused login, or garbage before any login: the address
                    // counts towards its failures per second.
                    let garbage = matches!(r, Err(Close::Protocol(_))) && s.conn.user.is_none();
                    if r == Err(Close::LoginRejected) || garbage {
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

/// Hands a command to the engine shard of its symbol: over its ring
/// (waiting while it is full), or, run to completion, to the engine itself.
fn route(g: &mut GatewayLoop, c: Command, batch: InBatch, ring_full: &mut u64) {
    let shard = shard_of(g, &c);
    let t0 = ns(g.start);
    match &mut g.matching {
        Matching::Threaded { cmd_tx, wakers, .. } => {
            let mut item = Cmd { cmd: c, t0, batch };
            loop {
                match cmd_tx[shard].push(item) {
                    Ok(()) => break,
                    Err(rtrb::PushError::Full(back)) => {
                        *ring_full += 1;
                        item = back;
                        wakers[shard].wake();
                        thread::yield_now();
                    }
                }
            }
            wakers[shard].wake();
        }
        Matching::Inline(m) => {
            let Inline { engines, publisher, events, done } = &mut **m;
            events.clear();
            match batch {
                InBatch::No => engines[shard].handle(c, &mut |ev| events.push(ev)),
                InBatch::Part => return g.batch.push(c),
                InBatch::Last => {
                    g.batch.push(c);
                    engines[shard].handle_batch(&g.batch, &mut |ev| events.push(ev));
                    g.batch.clear();
                }
            }
            let t2 = ns(g.start);
            let (now, k) = (wall_ns(), events.len());
            for (i, ev) in events.iter().enumerate() {
                publisher.on_event(now, ev);
                done.push(Out { ev: *ev, t0, t1: t0, t2, last: i + 1 == k });
            }
        }
    }
}

/// The engine shard of a command's symbol (a cancel or replace: of the order it names).
fn shard_of(g: &GatewayLoop, c: &Command) -> usize {
    let sym = match *c {
        Command::New(o) => Some(o.symbol),
        Command::Cancel { client, token, .. } | Command::Replace { client, token, .. } => g.gw.symbol_of(client, token),
    };
    sym.map_or(0, |s| usize::from(s.max(1) - 1) % g.engines)
}

/// Hands one batch to matching: each engine shard gets its part, the last
/// command marked, and clears it in one call auction per symbol.
fn route_batch(g: &mut GatewayLoop, batch: &[(Command, Option<u64>)], ring_full: &mut u64) {
    // One shard's commands after another (run to completion gathers a
    // shard's parts in one buffer), each shard in arrival order; the shard
    // of each command found once.
    let mut by_shard: Vec<(usize, Command)> = batch.iter().map(|b| (shard_of(g, &b.0), b.0)).collect();
    by_shard.sort_by_key(|x| x.0);
    for (i, &(shard, c)) in by_shard.iter().enumerate() {
        let last = by_shard.get(i + 1).is_none_or(|n| n.0 != shard);
        route(g, c, if last { InBatch::Last } else { InBatch::Part }, ring_full);
    }
}

/// Sleeps in poll(2) until a client sends, connects, an engine responds or
/// (run to completion) a retransmission request comes (1 ms at most).
fn gateway_sleep(g: &mut GatewayLoop) {
    g.me.sleeping.store(true, Ordering::SeqCst);
    let quiet = match &g.matching {
        Matching::Threaded { to_gw, .. } => to_gw.iter().all(|r| r.is_empty()),
        Matching::Inline(_) => true,
    };
    if quiet {
        g.rd.look(1);
    }
    g.me.sleeping.store(false, Ordering::SeqCst);
    let _ = g.me.fd.read();
}

/// How long a session whose socket was full is left alone before the next
/// write: from this, doubling while it stays full, up to [`WRITE_RETRY_MAX_NS`].
const WRITE_RETRY_NS: u64 = 50_000;
const WRITE_RETRY_MAX_NS: u64 = 1_000_000;

/// Writes what each session has to send. A session whose socket is full is
/// tried again after [`WRITE_RETRY_NS`], doubling while it stays full (a
/// client that does not read cost a failed `write` per pass), and what it was sent is consumed from an offset
/// (a partial write of a large backlog used to move the rest down each time).
fn flush_all(sessions: &mut [Option<Session>], now: u64) {
    for s in sessions.iter_mut().flatten() {
        if now < s.write_blocked_until {
            continue;
        }
        while s.unsent() > 0 {
            match s.sock.write(&s.out[s.out_at..]) {
                Ok(0) => break,
                Ok(n) => {
                    s.out_at += n;
                    s.write_backoff_ns = 0;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    s.write_backoff_ns = (s.write_backoff_ns * 2).clamp(WRITE_RETRY_NS, WRITE_RETRY_MAX_NS);
                    s.write_blocked_until = now + s.write_backoff_ns;
                    break;
                }
                Err(_) => {
                    s.out.clear();
                    s.out_at = 0;
                    s.close(now);
                }
            }
        }
        if s.out_at == s.out.len() {
            s.out.clear();
            s.out_at = 0;
        } else if s.out_at > s.out.len() / 2 {
            s.out.drain(..s.out_at);
            s.out_at = 0;
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
    let engines = cfg.engines;
    let x = Exchange::start_published(cfg, metrics)?;
    let idle = x.idle;
    let cores = thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let how = match x.pipeline {
        Pipeline::Threaded => format!("threaded (gateway, {engines} engine thread(s), publisher)"),
        _ => format!("run to completion (one thread: sessions, {engines} engine(s), publisher)"),
    };
    tracing::info!(pipeline = ?x.pipeline, cores, idle = ?idle, "exchange: {how} on {cores} core(s), idle {idle:?}");
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) && max_seconds.is_none_or(|s| t0.elapsed().as_secs_f64() < s) {
        thread::sleep(Duration::from_millis(20));
    }
    Ok(x.finish())
}
