//! `fairfeed exchange bench`: seed 002's latency matrix on this machine —
//! OUCH orders over real loopback TCP into the exchange at a fixed rate across
//! P products from an open-loop load generator (one busy-polling thread, N
//! connections), each order timed from the moment it was *due* to the moment
//! its Order Accepted (or Rejected) is read back — beside a bare loopback TCP
//! ping-pong measured in the same run; optionally with a hostile client
//! beside it ([`crate::exchange_attack`]). And the matching core's
//! throughput on one thread, in process.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fairfeed_exchange::client;
use fairfeed_exchange::engine::{Command, Engine, Limits, NewOrder, Side, Tif};
use fairfeed_exchange::gateway::{GatewayConfig, GatewayStats};

use crate::exchange_attack::{self, Attack, AttackStats};
use fairfeed_wire::ouch::outbound;
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use fairfeed_io::cpu::{this_thread_ns, threads_cpu_where, ThreadsCpu};
use fairfeed_net::exchange::live::{Exchange, ExchangeConfig, Idle, Pipeline, Step};

/// One row of the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct ExchangeBenchReport {
    /// The exchange's pipeline (`run-to-completion` or `threaded`).
    pub pipeline: Pipeline,
    /// How the exchange's threads waited.
    pub idle: String,
    pub rate: f64,
    pub products: usize,
    pub seconds: f64,
    pub clients: usize,
    pub engines: usize,
    /// Inbound sequencing window (0: off), µs.
    pub sequencing_window_us: f64,
    pub orders: u64,
    pub responses: u64,
    pub achieved_rate: f64,
    pub avg_us: f64,
    pub stddev_us: f64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub baseline_tcp_rtt_p50_us: f64,
    pub baseline_tcp_rtt_p99_us: f64,
    pub executions: u64,
    pub itch_messages: u64,
    pub steps: Vec<Step>,
    /// The hostile client beside the load, and what it managed.
    pub attack: Option<Attack>,
    pub attack_stats: Option<AttackStats>,
    /// With `attack_phase_ms`: the attacker ran in alternate phases of this
    /// length, and the orders due in each half (each phase's first fifth
    /// left out) give the load's latency with and without it, measured side
    /// by side under the same conditions.
    pub attack_phase_ms: Option<u64>,
    pub attack_on: Option<Quantiles>,
    pub attack_off: Option<Quantiles>,
    /// p99 with the attacker ÷ p99 without it (the target: ≤ 1.5).
    pub attack_p99_ratio: Option<f64>,
    /// The process's resident memory when the exchange had started and when the load was over.
    pub rss_start_kib: u64,
    pub rss_end_kib: u64,
    /// The gateway's counters (refusals, closes, rate limits).
    pub gateway: GatewayStats,
    /// CPU time during the load: the exchange's threads and the load generator's.
    pub cpu: ExchangeCpu,
}

/// Latency quantiles of a share of the orders, µs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Quantiles {
    pub orders: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Quantiles {
    fn of(h: &Histogram<u64>) -> Quantiles {
        let us = |v: u64| v as f64 / 1e3;
        Quantiles {
            orders: h.len(),
            p50_us: us(h.value_at_quantile(0.5)),
            p99_us: us(h.value_at_quantile(0.99)),
            max_us: us(h.max()),
        }
    }
}

/// Where the CPU went during the load (from `/proc/self/task`, see
/// [`fairfeed_io::cpu`]): per order sent, and as a share of the load's wall
/// time (1.0 = one core busy all the time). The kernel's TCP work is in the
/// side whose call did it — on loopback a send does the receiver's protocol
/// work too.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ExchangeCpu {
    /// The exchange's threads (`exchange`; threaded: `gateway`, `engine-N`, `publisher`).
    pub exchange_ns_per_order: f64,
    /// Of which in the kernel.
    pub exchange_system_ns_per_order: f64,
    pub exchange_busy: f64,
    /// The load generator (one thread: it sends, reads and times every order).
    pub generator_ns_per_order: f64,
    pub generator_busy: f64,
    /// The hostile client's thread, if any: its own work on the same host
    /// (connects, writes, the kernel's loopback delivery done on its behalf).
    pub attacker_busy: f64,
}

/// CPU times at the start of the load (this thread is the generator).
struct CpuMark {
    exchange: Option<ThreadsCpu>,
    generator_ns: u64,
    attacker: Option<ThreadsCpu>,
    at: Instant,
}

impl CpuMark {
    fn now() -> CpuMark {
        CpuMark {
            exchange: threads_cpu_where(exchange_thread),
            generator_ns: this_thread_ns(),
            attacker: fairfeed_io::cpu::threads_cpu(exchange_attack::ATTACKER_THREAD),
            at: Instant::now(),
        }
    }

    /// What each side used since the mark, over `orders`.
    fn until_now(&self, orders: u64) -> ExchangeCpu {
        let since = |a: Option<ThreadsCpu>, b: Option<ThreadsCpu>| match (a, b) {
            (Some(a), Some(b)) => b.since(&a),
            _ => ThreadsCpu::default(),
        };
        let ex = since(self.exchange, threads_cpu_where(exchange_thread));
        let att = since(self.attacker, fairfeed_io::cpu::threads_cpu(exchange_attack::ATTACKER_THREAD));
        let gen_ns = this_thread_ns().saturating_sub(self.generator_ns);
        let wall = self.at.elapsed().as_secs_f64().max(1e-9);
        let per = |ns: u64| ns as f64 / orders.max(1) as f64;
        let busy = |ns: u64| ns as f64 / 1e9 / wall;
        ExchangeCpu {
            exchange_ns_per_order: per(ex.ns),
            exchange_system_ns_per_order: per(ex.system_ns),
            exchange_busy: busy(ex.ns),
            generator_ns_per_order: per(gen_ns),
            generator_busy: busy(gen_ns),
            attacker_busy: busy(att.ns),
        }
    }
}

/// The names the exchange gives its threads.
fn exchange_thread(name: &str) -> bool {
    matches!(name, "exchange" | "gateway" | "publisher") || name.starts_with("engine-")
}

/// Bare loopback TCP ping-pong (64 bytes each way, Nagle off): round trips, ns.
pub fn tcp_ping_pong(samples: usize) -> std::io::Result<Histogram<u64>> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let echo = thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 64];
        while s.read_exact(&mut b).is_ok() {
            s.write_all(&b)?;
        }
        Ok(())
    });
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let mut h = Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds");
    let mut b = [7u8; 64];
    for _ in 0..samples {
        let t = Instant::now();
        c.write_all(&b)?;
        c.read_exact(&mut b)?;
        let _ = h.record((t.elapsed().as_nanos() as u64).max(1));
    }
    drop(c);
    let _ = echo.join();
    Ok(h)
}

/// Orders one write carries at most (late orders go together, up to this).
const WRITE_BATCH_MAX: usize = 256;
/// After the last order, how long the generator waits for the last answers.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// One client connection of the load generator.
struct Conn {
    sock: TcpStream,
    out: Vec<u8>,
    /// Bytes of `out` already written.
    written: usize,
    inbuf: Vec<u8>,
    have: usize,
}

impl Conn {
    fn open(addr: SocketAddr, user: &(String, String)) -> std::io::Result<Conn> {
        let sock = TcpStream::connect(addr)?;
        sock.set_nodelay(true)?;
        let mut out = Vec::new();
        client::login(&user.0, &user.1, 0, &mut out);
        sock.set_nonblocking(true)?;
        Ok(Conn { sock, out, written: 0, inbuf: vec![0u8; 1 << 20], have: 0 })
    }

    /// Writes what it can; true if it wrote anything.
    fn flush(&mut self) -> std::io::Result<bool> {
        let mut any = false;
        while self.written < self.out.len() {
            match self.sock.write(&self.out[self.written..]) {
                Ok(0) => return Err(std::io::Error::other("the exchange closed the connection")),
                Ok(n) => {
                    self.written += n;
                    any = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if self.written == self.out.len() {
            self.out.clear();
            self.written = 0;
        }
        Ok(any)
    }

    /// Reads what arrived; each acknowledged token (Order Accepted or
    /// Rejected) is handed to `ack`. True if anything arrived.
    fn read(&mut self, mut ack: impl FnMut(u32)) -> std::io::Result<bool> {
        let n = match self.sock.read(&mut self.inbuf[self.have..]) {
            Ok(0) => return Err(std::io::Error::other("the exchange closed the connection")),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        };
        self.have += n;
        let mut used = 0;
        while let Ok(Some((p, k))) = split_packet(&self.inbuf[used..self.have]) {
            used += k;
            let PacketRepr::SequencedData(m) = p else { continue };
            match outbound::Message::parse(m) {
                Ok(outbound::Message::OrderAccepted(a)) => ack(a.user_ref_num()),
                Ok(outbound::Message::Rejected(j)) => ack(j.user_ref_num()),
                _ => {}
            }
        }
        self.inbuf.copy_within(used..self.have, 0);
        self.have -= used;
        Ok(true)
    }
}

/// What the load generator measured.
struct Load {
    latency: Histogram<u64>,
    /// With attack phases: orders due while the attacker ran, and while it
    /// did not (each phase's first [`PHASE_GUARD`] left out of both).
    on: Option<Histogram<u64>>,
    off: Option<Histogram<u64>>,
    sent: u64,
    answered: u64,
    send_secs: f64,
}

/// Attack phases: the start of each phase is in neither half (what one
/// phase left queued drains into the next).
const PHASE_GUARD: f64 = 0.2;

/// The attacker on and off in turns of `ns` each, starting on.
struct Phases<'a> {
    ns: u64,
    active: &'a AtomicBool,
}

/// Order `token`, drawn from `rng`: mostly resting orders a few ticks off
/// the mid; one in five crosses and is immediate-or-cancel.
fn random_order(rng: &mut impl Rng, token: u32, symbols: &[String], stamped: bool, out: &mut Vec<u8>) {
    let sym = symbols[rng.gen_range(0..symbols.len())].as_str();
    let buy = rng.gen_bool(0.5);
    let off: i64 = rng.gen_range(1..=20) * 100;
    let cross = rng.gen_bool(0.2);
    let price = 1_000_000 + if buy == cross { off } else { -off };
    let order = client::Order {
        token,
        side: if buy { b'B' } else { b'S' },
        qty: 100,
        symbol: sym,
        price,
        ioc: cross,
        hidden: false,
        stamp: stamped.then(fairfeed_net::tree::agent::wall_ns),
        clock: None,
        min_qty: 0,
    };
    client::enter_order(&order, out);
}

/// The load generator: one thread, `users.len()` connections, busy-polling
/// (it owns a core; no wake-up latency of its own in the figures). Sends
/// `orders` at `rate` open-loop, round-robin over the connections — each
/// order at its time whatever the answers, late ones together in one write
/// — and times each acknowledgement from the time its order was *due*, so a
/// generator or exchange that falls behind shows as latency, not as fewer
/// samples (no coordinated omission).
fn load(
    addr: SocketAddr,
    users: &[(String, String)],
    symbols: &[String],
    (rate, orders, seed, stamped): (f64, usize, u64, bool),
    phases: Option<Phases<'_>>,
) -> std::io::Result<Load> {
    let mut conns = users.iter().map(|u| Conn::open(addr, u)).collect::<std::io::Result<Vec<_>>>()?;
    // Intended send time + 1 per token (0: answered or never sent).
    let mut due_at = vec![0u64; orders + 1];
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let (mut on, mut off) = (latency.clone(), latency.clone());
    // Which half an order due at `d` (ns from the start) counts in, if any.
    let half = |d: u64| {
        let p = phases.as_ref()?;
        let (k, into) = (d / p.ns, d % p.ns);
        (into as f64 >= p.ns as f64 * PHASE_GUARD).then_some(k % 2 == 0)
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let gap = 1e9 / rate;
    let (mut sent, mut answered) = (0usize, 0u64);
    let start = Instant::now();
    let mut send_secs = 0.0;
    let mut last_answer = Instant::now();
    loop {
        let elapsed = start.elapsed().as_nanos() as u64;
        if let Some(p) = &phases {
            p.active.store((elapsed / p.ns) % 2 == 0, Ordering::Relaxed);
        }
        let due = ((elapsed as f64 / gap) as usize + 1).min(orders).min(sent + WRITE_BATCH_MAX * conns.len());
        for (token, due_slot) in due_at.iter_mut().enumerate().take(due + 1).skip(sent + 1) {
            let k = token % conns.len();
            random_order(&mut rng, token as u32, symbols, stamped, &mut conns[k].out);
            // Order `token` was due at (token − 1) × gap.
            *due_slot = ((token - 1) as f64 * gap) as u64 + 1;
        }
        if due > sent {
            sent = due;
            if sent == orders {
                send_secs = start.elapsed().as_secs_f64();
            }
        }
        for c in &mut conns {
            c.flush()?;
        }
        let now = start.elapsed().as_nanos() as u64;
        for c in &mut conns {
            let got = c.read(|token| {
                if let Some(t) = due_at.get_mut(token as usize).filter(|t| **t > 0) {
                    let v = now.saturating_sub(*t - 1).max(1);
                    let _ = latency.record(v);
                    if let Some(during) = half(*t - 1) {
                        let _ = if during { on.record(v) } else { off.record(v) };
                    }
                    *t = 0;
                    answered += 1;
                }
            })?;
            if got {
                last_answer = Instant::now();
            }
        }
        if sent == orders && (answered == orders as u64 || last_answer.elapsed() > ANSWER_WAIT) {
            break;
        }
        std::hint::spin_loop();
    }
    for c in &mut conns {
        c.out.clear();
        c.written = 0;
        client::packet(PacketRepr::LogoutRequest, &mut c.out);
        let _ = c.flush();
    }
    let (on, off) = if phases.is_some() { (Some(on), Some(off)) } else { (None, None) };
    Ok(Load { latency, on, off, sent: sent as u64, answered, send_secs })
}

/// How a row runs besides its rate, products and length.
#[derive(Debug, Clone, Copy)]
pub struct BenchOpts {
    /// Engine threads (threaded) or engines (run to completion).
    pub engines: usize,
    /// Inbound sequencing window, ns (0: off).
    pub window_ns: u64,
    /// Client connections, each with a sending and a reading thread.
    pub clients: usize,
    pub pipeline: Pipeline,
    pub idle: Idle,
    /// A hostile client beside the load.
    pub attack: Option<Attack>,
    /// Turn the attacker on and off in phases of this many ms (0: on
    /// throughout), and report the load's latency in each half.
    pub attack_phase_ms: u64,
}

impl Default for BenchOpts {
    fn default() -> Self {
        BenchOpts {
            engines: 1,
            window_ns: 0,
            clients: 2,
            pipeline: Pipeline::Auto,
            idle: Idle::Auto,
            attack: None,
            attack_phase_ms: 0,
        }
    }
}

/// The process's resident memory, KiB (the exchange runs in it).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        })
        .flatten()
        .unwrap_or(0)
}

/// How long an attack runs before the load starts (its connections are up).
const ATTACK_LEAD: Duration = Duration::from_millis(500);

/// Runs one row: `rate` orders/s for `seconds` across `products` symbols.
/// p99 while the attack is on over p99 while it is off (both measured).
fn p99_ratio(on: Option<&Quantiles>, off: Option<&Quantiles>) -> Option<f64> {
    match (on, off) {
        (Some(a), Some(b)) if b.p99_us > 0.0 && a.orders > 0 && b.orders > 0 => Some(a.p99_us / b.p99_us),
        _ => None,
    }
}

/// The exchange under test: `accounts` may log in, `symbols` trade.
fn bench_exchange(o: &BenchOpts, accounts: Vec<(String, String)>, symbols: &[String]) -> ExchangeConfig {
    ExchangeConfig {
        listen: "127.0.0.1:0".parse().expect("valid"),
        gateway: GatewayConfig { users: accounts, symbols: symbols.to_vec(), ..GatewayConfig::default() },
        limits: Limits { symbols: symbols.len(), orders: 4 << 20, ..Limits::default() },
        engines: o.engines,
        sequencing_window_ns: o.window_ns,
        pipeline: o.pipeline,
        idle: o.idle,
        ..ExchangeConfig::default()
    }
}

pub fn exchange_bench(rate: f64, products: usize, seconds: f64, o: BenchOpts) -> std::io::Result<ExchangeBenchReport> {
    assert!(rate > 0.0 && seconds > 0.0 && (1..=1_000).contains(&products), "bad bench parameters");
    assert!((1..=64).contains(&o.clients), "1..=64 clients");
    let (engines, window_ns, clients) = (o.engines, o.window_ns, o.clients);
    let base = tcp_ping_pong(20_000)?;
    let symbols: Vec<String> = (1..=products).map(|i| format!("SYM{i:04}")).collect();
    let users: Vec<(String, String)> = (0..clients).map(|i| (format!("BENCH{i}"), "pw".to_string())).collect();
    let evil = ("EVIL".to_string(), "pw".to_string());
    let mut accounts = users.clone();
    accounts.extend(o.attack.map(|_| evil.clone()));
    let x = Exchange::start(bench_exchange(&o, accounts, &symbols))?;
    let rss_start_kib = rss_kib();
    let stop = Arc::new(AtomicBool::new(false));
    let active = Arc::new(AtomicBool::new(true));
    let sw = exchange_attack::Switch { stop: stop.clone(), active: active.clone() };
    let attacker = o.attack.map(|a| exchange_attack::spawn(a, x.addr, evil.clone(), symbols[0].clone(), sw));
    let phases = (o.attack.is_some() && o.attack_phase_ms > 0)
        .then(|| Phases { ns: o.attack_phase_ms.saturating_mul(1_000_000), active: &active });
    if attacker.is_some() {
        thread::sleep(ATTACK_LEAD);
    }
    let total = ((rate * seconds) as usize).max(1);
    let mark = CpuMark::now();
    let l = load(x.addr, &users, &symbols, (rate, total, 1, window_ns > 0), phases);
    let cpu = mark.until_now(l.as_ref().map_or(0, |l| l.sent));
    stop.store(true, Ordering::Relaxed);
    let attack_stats = attacker.and_then(|t| t.join().ok());
    let rss_end_kib = rss_kib();
    let r = x.finish();
    let l = l?;
    let (attack_on, attack_off) = (l.on.as_ref().map(Quantiles::of), l.off.as_ref().map(Quantiles::of));
    let attack_p99_ratio = p99_ratio(attack_on.as_ref(), attack_off.as_ref());
    let (h, orders, send_secs) = (l.latency, l.sent, l.send_secs);
    let us = |v: u64| v as f64 / 1e3;
    let executions = r.engines.iter().map(|e| e.executions).sum();
    Ok(ExchangeBenchReport {
        pipeline: r.pipeline,
        idle: r.idle.clone(),
        rate,
        products,
        seconds,
        clients,
        engines,
        sequencing_window_us: window_ns as f64 / 1e3,
        orders,
        responses: l.answered,
        achieved_rate: orders as f64 / send_secs.max(1e-9),
        avg_us: h.mean() / 1e3,
        stddev_us: h.stdev() / 1e3,
        min_us: us(h.min()),
        p50_us: us(h.value_at_quantile(0.5)),
        p95_us: us(h.value_at_quantile(0.95)),
        p99_us: us(h.value_at_quantile(0.99)),
        max_us: us(h.max()),
        baseline_tcp_rtt_p50_us: us(base.value_at_quantile(0.5)),
        baseline_tcp_rtt_p99_us: us(base.value_at_quantile(0.99)),
        executions,
        itch_messages: r.itch_messages,
        steps: r.steps,
        attack: o.attack,
        attack_stats,
        attack_phase_ms: l.on.is_some().then_some(o.attack_phase_ms),
        attack_on,
        attack_off,
        attack_p99_ratio,
        rss_start_kib,
        rss_end_kib,
        gateway: r.gateway,
        cpu,
    })
}

/// The matching core on one thread: a mixed flow (limit orders near the mid,
/// cancels, immediate-or-cancel crossers) over `products` symbols; commands/s,
/// median of `runs`.
pub fn in_process(commands: usize, products: usize, runs: usize) -> (f64, u64) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let mut live: Vec<(u32, u32)> = Vec::new();
    let mut flow = Vec::with_capacity(commands);
    for i in 0..commands as u32 {
        if rng.gen_bool(0.3) && !live.is_empty() {
            let (c, t) = live.swap_remove(rng.gen_range(0..live.len()));
            flow.push(Command::Cancel { client: c, token: t, leave: 0 });
            continue;
        }
        let buy = rng.gen_bool(0.5);
        let cross = rng.gen_bool(0.2);
        let off = rng.gen_range(1..=20) * 100;
        let client = rng.gen_range(1..=8);
        flow.push(Command::New(NewOrder {
            client,
            token: i,
            symbol: rng.gen_range(1..=products as u16),
            side: if buy { Side::Buy } else { Side::Sell },
            price: if buy == cross { 1_000_000 + off } else { 1_000_000 - off },
            qty: 100,
            tif: if cross { Tif::Ioc } else { Tif::Day },
            market: false,
            hidden: false,
            min_qty: 0,
        }));
        if !cross {
            live.push((client, i));
        }
    }
    let mut rates = Vec::new();
    let mut events = 0u64;
    for _ in 0..runs.max(1) {
        let mut e = Engine::new(Limits { symbols: products, orders: commands.max(1), ..Limits::default() }, 0, 1);
        let mut n = 0u64;
        let t = Instant::now();
        for c in &flow {
            e.handle(*c, &mut |_| n += 1);
        }
        rates.push(flow.len() as f64 / t.elapsed().as_secs_f64());
        events = n;
    }
    rates.sort_by(f64::total_cmp);
    (rates[rates.len() / 2], events)
}
