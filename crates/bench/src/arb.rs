//! End-to-end benchmarks on loopback, each against a baseline measured in the
//! same run (the machines are shared and noisy; only same-run ratios mean much).
//!
//! `arb_latency`: one packet at a time goes sender → middlebox → receiver over
//! loopback UDP, where the middlebox is either a bare forwarder (`recv` then
//! `send`, the baseline) or the live arbitrator's loop (two lines configured,
//! the packet sent on line A; the cost of B's duplicate copies is measured by
//! the criterion bench, because sending it from the timing thread would put a
//! second loopback `send` inside every sample). Sender and receiver share one
//! clock, so each sample is a one-way latency through the middlebox. Rounds
//! alternate between the two paths so drift on a shared host hits both.

use std::net::{SocketAddr, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

use fairfeed_arb::spec::SeqSpec;
use fairfeed_arb::{Arbitrator, Config, Start};
use fairfeed_wire::moldudp64::{PacketBuilder, PacketRepr, Session, COUNT_END_OF_SESSION};
use hdrhistogram::Histogram;
use serde::Serialize;

use fairfeed_io::idle::IdleStrategy;
use fairfeed_io::socket::bind_udp;
use fairfeed_net::arb::live::{run_live, LiveConfig};

/// Latency percentiles of one path, µs.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
    pub samples: u64,
}

/// The arbitrator's latency beside a bare forwarder's.
#[derive(Debug, Clone, Serialize)]
pub struct ArbLatencyReport {
    pub baseline_forwarder: Latency,
    pub arbitrator: Latency,
    /// arbitrator p50 − forwarder p50, µs.
    pub added_p50_us: f64,
    /// arbitrator p50 / forwarder p50.
    pub ratio_p50: f64,
    /// Both ends and both middleboxes spin instead of sleeping.
    pub busy_poll: bool,
    /// The arbitrator's idle strategy.
    pub idle: String,
}

pub(crate) fn latency(h: &Histogram<u64>) -> Latency {
    let us = |ns: u64| ns as f64 / 1e3;
    Latency {
        p50_us: us(h.value_at_quantile(0.5)),
        p90_us: us(h.value_at_quantile(0.9)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        mean_us: h.mean() / 1e3,
        samples: h.len(),
    }
}

fn packet(seq: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 128];
    let Ok(mut b) = PacketBuilder::new(&mut buf, Session::from_str_padded("BENCH"), seq) else { return buf };
    let _ = b.push(&[b'S'; 12]);
    let n = b.finish();
    buf.truncate(n);
    buf
}

/// Sends `samples` packets one at a time to `to`,
/// timing each until it arrives on `rx`. With `spin`, waits by spinning on a
/// non-blocking socket (both ends then poll, as latency-critical hosts do).
pub(crate) fn measure(
    h: &mut Histogram<u64>,
    tx: &UdpSocket,
    to: SocketAddr,
    rx: &UdpSocket,
    (first_seq, samples): (u64, usize),
    make: impl Fn(u64) -> Vec<u8>,
    spin: bool,
) {
    let mut buf = [0u8; 2048];
    let _ = rx.set_nonblocking(spin);
    for i in 0..samples {
        let p = make(first_seq + i as u64);
        let t0 = Instant::now();
        if tx.send_to(&p, to).is_err() {
            continue;
        }
        let deadline = t0 + Duration::from_secs(1);
        loop {
            match rx.recv(&mut buf) {
                Ok(_) => {
                    h.saturating_record(t0.elapsed().as_nanos() as u64);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::hint::spin_loop()
                }
                Err(_) => break,
            }
        }
    }
}

/// A loopback address with a port free at the time of asking.
fn free_addr() -> std::io::Result<SocketAddr> {
    UdpSocket::bind("127.0.0.1:0")?.local_addr()
}

/// Measured rounds of `arb_latency` (alternating forwarder and arbitrator).
pub const ARB_LATENCY_ROUNDS: usize = 10;

/// Runs the arbitrator-vs-forwarder latency comparison; `progress` is told
/// each round done (of [`ARB_LATENCY_ROUNDS`] + 1, the first a warm-up).
pub fn arb_latency(
    samples: usize,
    busy_poll: bool,
    idle: IdleStrategy,
    mut progress: impl FnMut(usize),
) -> std::io::Result<ArbLatencyReport> {
    let idle = if busy_poll { IdleStrategy::Spin } else { idle };
    let any: SocketAddr = "127.0.0.1:0".parse().expect("valid");
    let tx = UdpSocket::bind(any)?;
    let rx = UdpSocket::bind(any)?;
    rx.set_read_timeout(Some(Duration::from_secs(1)))?;
    let rx_addr = rx.local_addr()?;

    // Baseline: a bare forwarder thread.
    let fwd = bind_udp(any, 1 << 20)?;
    fwd.set_nonblocking(busy_poll)?;
    fwd.set_read_timeout(Some(Duration::from_millis(20)))?;
    let fwd_addr = fwd.local_addr()?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let forwarder = thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            match fwd.recv(&mut buf) {
                Ok(n) => {
                    let _ = fwd.send_to(&buf[..n], rx_addr);
                }
                Err(_) => std::hint::spin_loop(),
            }
        }
    });
    // The arbitrator: lines A and B, high-reliability output to the receiver.
    let (a, b) = (free_addr()?, free_addr()?);
    let cfg = LiveConfig {
        lines: vec![a, b],
        out_hr: Some(rx_addr),
        exit_on_end: true,
        max_seconds: Some(300.0),
        idle,
        ..LiveConfig::default()
    };
    let arb = Arbitrator::new(Config { start: Start::Seq(1), ..Config::default() }, SeqSpec::moldudp64())
        .map_err(std::io::Error::other)?;
    let live = thread::spawn(move || run_live(arb, &cfg, |_| {}));
    thread::sleep(Duration::from_millis(100));

    // Alternate rounds so drift on a shared host hits both paths alike; the
    // first round of each is warm-up and not recorded.
    const ROUNDS: usize = ARB_LATENCY_ROUNDS;
    let per = (samples / ROUNDS).max(1);
    let mut base = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).expect("valid bounds");
    let mut h = base.clone();
    let mut scratch = base.clone();
    let mut seq = 1u64;
    for round in 0..=ROUNDS {
        let (hb, ha) = if round == 0 { (&mut scratch, None) } else { (&mut base, Some(&mut h)) };
        measure(hb, &tx, fwd_addr, &rx, (0, per), packet, busy_poll);
        let ha = ha.unwrap_or(&mut scratch);
        measure(ha, &tx, a, &rx, (seq, per), packet, busy_poll);
        seq += per as u64;
        // Drain the arbitrator's duplicate-free output of anything late.
        let _ = rx.set_nonblocking(true);
        let mut buf = [0u8; 2048];
        while rx.recv(&mut buf).is_ok() {}
        progress(round + 1);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = forwarder.join();
    let mut end = vec![0u8; 20];
    let _ = PacketRepr { session: Session::from_str_padded("BENCH"), sequence: seq, count: COUNT_END_OF_SESSION }
        .emit(&mut end);
    let _ = tx.send_to(&end, a);
    let _ = live.join();
    let (bl, al) = (latency(&base), latency(&h));
    Ok(ArbLatencyReport {
        added_p50_us: al.p50_us - bl.p50_us,
        ratio_p50: if bl.p50_us > 0.0 { al.p50_us / bl.p50_us } else { 0.0 },
        baseline_forwarder: bl,
        arbitrator: al,
        busy_poll,
        idle: format!("{idle:?}"),
    })
}
