//! `fairfeed exchange bench`: seed 002's latency matrix on this machine —
//! OUCH orders over real loopback TCP into the exchange at a fixed rate across
//! P products, each order timed from the moment it is written to the moment
//! its Order Accepted (or Rejected) is read back — beside a bare loopback TCP
//! ping-pong measured in the same run. And the matching core's throughput on
//! one thread, in process.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fairfeed_exchange::client;
use fairfeed_exchange::engine::{Command, Engine, Limits, NewOrder, Side, Tif};
use fairfeed_exchange::gateway::GatewayConfig;
use fairfeed_wire::ouch::outbound;
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use fairfeed_net::exchange::live::{Exchange, ExchangeConfig, Step};

/// One row of the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct ExchangeBenchReport {
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

/// One client: logs in, sends `orders` at `rate`, times each order's acknowledgement.
fn client(
    addr: SocketAddr,
    user: (String, String),
    symbols: Vec<String>,
    (rate, orders, seed, stamped): (f64, usize, u64, bool),
    responses: Arc<AtomicU64>,
) -> std::io::Result<(Histogram<u64>, u64, f64)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut out = Vec::new();
    client::login(&user.0, &user.1, 0, &mut out);
    s.write_all(&out)?;
    let mut r = s.try_clone()?;
    let sent_at: Arc<Vec<AtomicU64>> = Arc::new((0..orders + 1).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let (sa, d2, resp) = (sent_at.clone(), done.clone(), responses.clone());
    let reader = thread::spawn(move || {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
        let (mut buf, mut have) = (vec![0u8; 1 << 20], 0usize);
        r.set_read_timeout(Some(Duration::from_millis(50))).ok();
        let mut idle_since: Option<Instant> = None;
        loop {
            match r.read(&mut buf[have..]) {
                Ok(0) => break,
                Ok(n) => {
                    have += n;
                    idle_since = None;
                }
                Err(_) => {
                    if d2.load(Ordering::Relaxed) {
                        let t = *idle_since.get_or_insert_with(Instant::now);
                        if t.elapsed() > Duration::from_secs(2) {
                            break;
                        }
                    }
                    continue;
                }
            }
            let now = start.elapsed().as_nanos() as u64;
            let mut used = 0;
            while let Ok(Some((p, n))) = split_packet(&buf[used..have]) {
                used += n;
                let PacketRepr::SequencedData(m) = p else { continue };
                let token = match outbound::Message::parse(m) {
                    Ok(outbound::Message::OrderAccepted(a)) => a.user_ref_num(),
                    Ok(outbound::Message::Rejected(j)) => j.user_ref_num(),
                    _ => continue,
                };
                if let Some(t) = sa.get(token as usize) {
                    let t0 = t.swap(0, Ordering::Relaxed);
                    if t0 > 0 {
                        let _ = h.record(now.saturating_sub(t0 - 1).max(1));
                        resp.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            buf.copy_within(used..have, 0);
            have -= used;
        }
        h
    });
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let gap = 1e9 / rate;
    let mut sent = 0usize;
    while sent < orders {
        let due = ((start.elapsed().as_nanos() as f64 / gap) as usize + 1).min(orders);
        if due <= sent {
            // Sleep to the next order's time (the kernel wakes us a little late; the orders then go together).
            let next = (sent as f64 + 1.0) * gap;
            let wait = next - start.elapsed().as_nanos() as f64;
            if wait > 20_000.0 {
                thread::sleep(Duration::from_nanos(wait as u64 - 10_000));
            }
            continue;
        }
        out.clear();
        let now = start.elapsed().as_nanos() as u64;
        for token in sent + 1..=due {
            let sym = symbols[rng.gen_range(0..symbols.len())].as_str();
            let buy = rng.gen_bool(0.5);
            let off: i64 = rng.gen_range(1..=20) * 100;
            // Mostly resting orders a few ticks off the mid; one in five crosses and is immediate-or-cancel.
            let cross = rng.gen_bool(0.2);
            let price = 1_000_000 + if buy == cross { off } else { -off };
            let stamp = stamped.then(fairfeed_net::tree::agent::wall_ns);
            let side = if buy { b'B' } else { b'S' };
            let (token32, qty, hidden) = (token as u32, 100, false);
            let order = client::Order { token: token32, side, qty, symbol: sym, price, ioc: cross, hidden, stamp };
            client::enter_order(&order, &mut out);
            sent_at[token].store(now + 1, Ordering::Relaxed);
        }
        s.write_all(&out)?;
        sent = due;
    }
    let send_secs = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let h = reader.join().map_err(|_| std::io::Error::other("reader panicked"))?;
    out.clear();
    client::packet(PacketRepr::LogoutRequest, &mut out);
    let _ = s.write_all(&out);
    Ok((h, sent as u64, send_secs))
}

/// Runs one row: `rate` orders/s for `seconds` across `products` symbols.
pub fn exchange_bench(
    rate: f64,
    products: usize,
    seconds: f64,
    (engines, window_ns): (usize, u64),
) -> std::io::Result<ExchangeBenchReport> {
    assert!(rate > 0.0 && seconds > 0.0 && (1..=1_000).contains(&products), "bad bench parameters");
    let base = tcp_ping_pong(20_000)?;
    let clients = 2usize;
    let symbols: Vec<String> = (1..=products).map(|i| format!("SYM{i:04}")).collect();
    let users: Vec<(String, String)> = (0..clients).map(|i| (format!("BENCH{i}"), "pw".to_string())).collect();
    let cfg = ExchangeConfig {
        listen: "127.0.0.1:0".parse().expect("valid"),
        gateway: GatewayConfig { users: users.clone(), symbols: symbols.clone(), ..GatewayConfig::default() },
        limits: Limits { symbols: products, orders: 4 << 20, ..Limits::default() },
        engines,
        sequencing_window_ns: window_ns,
        ..ExchangeConfig::default()
    };
    let x = Exchange::start(cfg)?;
    let stocks = symbols.clone();
    let per = ((rate * seconds) as usize / clients).max(1);
    let responses = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let handles: Vec<_> = users
        .into_iter()
        .enumerate()
        .map(|(i, u)| {
            let (addr, st, resp) = (x.addr, stocks.clone(), responses.clone());
            thread::spawn(move || client(addr, u, st, (rate / clients as f64, per, i as u64 + 1, window_ns > 0), resp))
        })
        .collect();
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let (mut orders, mut send_secs) = (0, 0.0f64);
    for j in handles {
        let (hc, n, secs) = j.join().map_err(|_| std::io::Error::other("client panicked"))??;
        let _ = h.add(&hc);
        orders += n;
        send_secs = send_secs.max(secs);
    }
    let _ = t0;
    let r = x.finish();
    let us = |v: u64| v as f64 / 1e3;
    Ok(ExchangeBenchReport {
        rate,
        products,
        seconds,
        clients,
        engines,
        sequencing_window_us: window_ns as f64 / 1e3,
        orders,
        responses: responses.load(Ordering::Relaxed),
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
        executions: r.engines.iter().map(|e| e.executions).sum(),
        itch_messages: r.itch_messages,
        steps: r.steps,
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
