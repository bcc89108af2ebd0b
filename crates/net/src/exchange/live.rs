//! The exchange on real sockets: OUCH 5.0 over SoupBinTCP in, TotalView-ITCH
//! 5.0 over MoldUDP64 out on an A and a B line, with a retransmission server.
//!
//! Two pipelines, chosen by [`ExchangeConfig::pipeline`] (reported at
//! start-up; `auto` picks by the cores there are):
//!
//! Every stage is an [`fairfeed_io::agent`] agent on a runner of its own
//! (one idle strategy, [`ExchangeConfig::idle`]; parked stages woken through
//! their mailboxes' descriptors; role names `exchange`, `gateway`, `engine`,
//! `publisher`):
//!
//! - **run to completion** — one agent (`gateway::GatewayAgent`, role
//!   `exchange`) owns the listener, the sessions, the engines and the ITCH
//!   publisher: it reads a session, matches its orders at once, writes the
//!   responses and the ITCH packets, and only then looks at the next socket;
//!   an order never crosses a thread (no hand-off, no wake-up of a parked
//!   thread). The default where cores are few.
//! - **threaded** — a pipeline of agents, each on its own thread, joined by
//!   bounded single-producer/single-consumer mailboxes ([`fairfeed_io::mailbox`],
//!   the disruptor pattern seed 002 used), for hosts with a core per stage:
//!
//! ```text
//!  gateway agent ──commands──▶ engine agent(s) ──events──▶ gateway agent (OUCH out)
//!  (TCP in/out, sessions)      (symbols sharded)  └─events──▶ publisher agent (ITCH A/B, journal, retransmission)
//! ```
//!
//! Every order carries five timestamps, seed 002's points: t0 the gateway
//! hands it to the engine ("order book → ME sent"), t1 the engine takes it
//! ("ME received"), t2 the engine hands out its response ("response sent"),
//! t3 the gateway takes the response ("response received"), t4 the response
//! is written to the client's socket ("completed"); HdrHistograms of each
//! step (run to completion: t1 = t0 and t3 = t2, there is no hand-off).

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fairfeed_arb::retransmit::JOURNAL_BYTES_DEFAULT;

use crate::idle::IdleStrategy;
use fairfeed_exchange::engine::ConfigError;
use fairfeed_exchange::engine::{Command, Engine, EngineStats, Event, Limits};
use fairfeed_exchange::gateway::{GatewayConfig, GatewayStats};
use fairfeed_exchange::ordering::{OrderingStats, ORDERING_FIRMS_MAX};
use fairfeed_exchange::sequencer::SequencerStats;
use fairfeed_io::agent::{self, RunConfig};
use fairfeed_io::counters::{Board, Poster};
use fairfeed_io::mailbox::{Incoming, Outgoing};

use hdrhistogram::Histogram;
use serde::Serialize;

mod gateway;
mod stages;

pub use gateway::ACCEPT_RETRY_NS;
use stages::{start_threads, Publisher};

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

/// How the exchange's threads wait for work by default: spin 50 µs, yield
/// 50 µs, then park until woken (or 1 ms).
pub const IDLE: IdleStrategy = IdleStrategy::Backoff { spin_ns: 50_000, yield_ns: 50_000 };

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

/// The gateway's part on the exchange's counters board: `{"gateway": …,
/// "sequencer": …, "ordering": …, "cheat": …, "ring_full": n, "sessions":
/// n}` (run to completion: with `engines` and `publisher`), and the order
/// latency histogram [`ORDER_HIST`] (gateway in → response written, ns).
pub const GATEWAY_PART: &str = "gateway";
/// The publisher's part (threaded pipeline).
pub const PUBLISHER_PART: &str = "publisher";
/// Engine shard K's part is this followed by K (threaded pipeline).
pub const ENGINE_PART_PREFIX: &str = "engine.";
/// The gateway's order-latency histogram.
pub const ORDER_HIST: &str = "order";

/// What the exchange's agents last posted to `board`, in one object —
/// `{"gateway": …, "sequencer": …, "ring_full": n, "sessions": n,
/// "publisher": …, "engines": {"0": …}}` — and the order latency.
pub fn metrics(board: &Board) -> (serde_json::Value, Option<Histogram<u64>>) {
    board.read(|parts| {
        let gateway = parts.get(GATEWAY_PART);
        let mut j = gateway.map_or_else(|| serde_json::json!({}), |p| p.value.clone());
        for (name, p) in parts.iter() {
            if let Some(k) = name.strip_prefix(ENGINE_PART_PREFIX) {
                if !j["engines"].is_object() {
                    j["engines"] = serde_json::json!({});
                }
                j["engines"][k] = p.value.clone();
            } else if name == PUBLISHER_PART {
                j["publisher"] = p.value.clone();
            }
        }
        let order = gateway.and_then(|p| p.hists.iter().find(|(n, _)| *n == ORDER_HIST)).map(|(_, h)| h.clone());
        (j, order)
    })
}

const PUBLISH_NS: u64 = fairfeed_io::counters::PUBLISH_INTERVAL_NS;

/// How commands reach the engines and their events come back.
enum Matching {
    /// Engine threads behind rings (and a publisher thread behind them).
    Threaded { cmd_tx: Vec<Outgoing<Cmd>>, to_gw: Vec<Incoming<Out>> },
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

    /// [`Exchange::start`], the agents posting their counters to `metrics` ([`metrics`] reads them).
    pub fn start_published(cfg: ExchangeConfig, metrics: Option<Arc<Board>>) -> std::io::Result<Exchange> {
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
        let run = run_config(strategy, &stop);
        let matching = match pipeline {
            Pipeline::Threaded => start_threads(&cfg, (start, &run), &metrics, &mut threads)?,
            _ => Matching::Inline(Box::new(Inline {
                engines: (0..cfg.engines).map(|k| Engine::new(cfg.limits, k as u64, cfg.engines as u64)).collect(),
                publisher: Publisher::new(&cfg)?,
                events: Vec::with_capacity(64),
                done: Vec::with_capacity(256),
            })),
        };
        let (g, deadlines_addr) = gateway::agent(&cfg, listener, matching, start, metrics)?;
        let name = if pipeline == Pipeline::Threaded { "gateway" } else { "exchange" };
        threads.push(agent::spawn(name, run, move || g, |a, r| ended(name, &r, a.close()))?);
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

/// How every exchange thread's runner waits: by `idle`, parking at most
/// [`PARK_MAX_NS`] (so a stop is seen), its timers (a millisecond's tick,
/// heartbeats) met without spinning ahead of them.
fn run_config(idle: IdleStrategy, stop: &Arc<AtomicBool>) -> RunConfig {
    RunConfig { idle, spin_ahead_ns: 0, park_max_ns: PARK_MAX_NS, stop: Some(stop.clone()) }
}

/// What a stage's thread hands back, its runner's failure (an `epoll` error) said in the log.
fn ended<T>(name: &str, r: &std::io::Result<agent::RunStats>, parts: T) -> T {
    if let Err(e) = r {
        tracing::error!(stage = name, "exchange: the {name} runner failed: {e}");
    }
    parts
}

/// The longest an idle exchange thread parks before it looks at its stop flag.
pub const PARK_MAX_NS: u64 = 1_000_000;

/// Runs until `stop` (or `max_seconds`); returns the report.
pub fn run_exchange(
    cfg: ExchangeConfig,
    stop: &AtomicBool,
    max_seconds: Option<f64>,
    metrics: Option<Arc<Board>>,
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
