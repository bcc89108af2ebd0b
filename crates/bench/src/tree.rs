//! Benchmarks of the tree's data plane as shipped — the node process loop of
//! [`fairfeed_net::tree::agent`] running a real proxy — each beside a baseline measured in
//! the same run on the same sockets:
//! - [`proxy_hop`]: latency one proxy hop adds vs one bare loopback hop;
//! - [`proxy_ladder`]: the same under seed 003's ladder (default → pinned →
//!   busy polling);
//! - [`proxy_pps`]: copies per second one proxy replicates to `fanout`
//!   destinations vs a bare `sendmmsg` loop sending the same copies.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fairfeed_tree::node::{DeadlineRule, NodeConfig};
use fairfeed_tree::plan::{Node, Role, Topology, Tree};
use fairfeed_wire::overlay::{HeaderRepr, Kind, HEADER_LEN};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::arb::{latency, measure, Latency};
use fairfeed_io::batch::BatchSend;
use fairfeed_io::idle::IdleStrategy;
use fairfeed_io::send::Backend;
use fairfeed_io::tuning::Tuning;
use fairfeed_net::tree::agent::{run_agent, AgentConfig, AgentError, AgentReport, Job, Threading};

/// A proxy node running in a thread of this process.
struct ProxyUnderTest {
    addr: SocketAddr,
    control: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Result<AgentReport, AgentError>>,
}

impl ProxyUnderTest {
    fn finish(self) -> std::io::Result<AgentReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .join()
            .map_err(|_| std::io::Error::other("the proxy thread panicked"))?
            .map_err(std::io::Error::other)
    }
}

fn free_addr() -> std::io::Result<SocketAddr> {
    UdpSocket::bind("127.0.0.1:0")?.local_addr()
}

/// Starts the agent's proxy between `parent` and `children`: a tree of one
/// sender, one proxy and `children.len()` receivers.
fn start_proxy(
    parent: SocketAddr,
    children: &[SocketAddr],
    idle: IdleStrategy,
    tuning: Tuning,
    (threads, io): (Threading, Backend),
) -> std::io::Result<ProxyUnderTest> {
    let k = children.len() as u32;
    let (addr, control) = (free_addr()?, free_addr()?);
    let node = |id: u32, role: Role, layer: i32, parent: Option<u32>, children: Vec<u32>, a: SocketAddr| Node {
        id,
        role,
        layer,
        index: if role == Role::Receiver { id } else { 0 },
        parent,
        children,
        hedge_targets: Vec::new(),
        addr: Some(a.to_string()),
        control: None,
    };
    let (sender_id, proxy_id) = (k, k + 1);
    let mut nodes = vec![
        node(sender_id, Role::Sender, -1, None, vec![proxy_id], parent),
        node(proxy_id, Role::Proxy, 0, Some(sender_id), (0..k).collect(), addr),
    ];
    nodes.extend(children.iter().zip(0..).map(|(&a, i)| node(i, Role::Receiver, 1, Some(proxy_id), Vec::new(), a)));
    let topo = Topology {
        receivers: children.len(),
        fanout: children.len(),
        depth: 2,
        hedge: 0,
        sharding: "none".into(),
        receiver_ids: (0..k).collect(),
        trees: vec![Tree { id: 0, nodes }],
    };
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = AgentConfig {
        topology: std::sync::Arc::new(topo),
        id: proxy_id,
        node: NodeConfig::default(),
        rule: DeadlineRule::Paper { margin_ns: 0 },
        auth: None,
        keys: None,
        link: None,
        seed: 1,
        idle,
        threads,
        tuning,
        control: Some(control),
        operator: None,
        max_seconds: Some(600.0),
        resolve_wait: std::time::Duration::ZERO,
        job: Job::Proxy,
        stop: stop.clone(),
        clock: fairfeed_net::tree::agent::ClockOpts::default(),
        time: fairfeed_net::tree::agent::TimeBase::WALL,
        tap: None,
        board: None,
        extra: Vec::new(),
        shards: Default::default(),
        replicate: None,
        external: None,
        membership: None,
        io,
    };
    let handle = thread::Builder::new().name("proxy".into()).spawn(move || run_agent(&cfg, |_, _| {}))?;
    thread::sleep(Duration::from_millis(100));
    Ok(ProxyUnderTest { addr, control, stop, handle })
}

/// An overlay data packet of `len` bytes with sequence `seq`.
fn data_packet(seq: u64, len: usize) -> Vec<u8> {
    let len = len.max(HEADER_LEN);
    let mut b = vec![0x5a; len];
    let h = HeaderRepr {
        kind: Some(Kind::Data),
        sequence: seq,
        payload_len: (len - HEADER_LEN) as u16,
        ..HeaderRepr::default()
    };
    let _ = h.emit(&mut b);
    b
}

/// Latency a fair-multicast proxy hop adds, beside one bare loopback hop.
#[derive(Debug, Clone, Serialize)]
pub struct ProxyHopReport {
    /// Median latency the proxy hop adds: (sender → proxy → receiver) − (sender → receiver), µs.
    pub proxy_hop_p50_us: f64,
    /// Median one-way latency of a bare loopback hop (sender → receiver), same run, µs.
    pub baseline_oneway_p50_us: f64,
    /// proxy_hop_p50_us / baseline_oneway_p50_us.
    pub ratio: f64,
    pub via_proxy: Latency,
    pub direct: Latency,
    pub busy_poll: bool,
    pub pinned: bool,
}

/// Times one packet at a time straight to the receiver and through the
/// agent's proxy, in alternating rounds (drift on a shared host hits both).
fn hop_rounds(samples: usize, idle: IdleStrategy, tuning: Tuning, spin: bool) -> std::io::Result<ProxyHopReport> {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("valid");
    let tx = UdpSocket::bind(any)?;
    let rx = UdpSocket::bind(any)?;
    rx.set_read_timeout(Some(Duration::from_secs(1)))?;
    let pinned = !tuning.pin.is_empty();
    let p = start_proxy(tx.local_addr()?, &[rx.local_addr()?], idle, tuning, (Threading::One, Backend::Udp))?;
    const ROUNDS: usize = 10;
    let per = (samples / ROUNDS).max(1);
    let mut via = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).expect("valid bounds");
    let (mut direct, mut scratch) = (via.clone(), via.clone());
    let mut seq = 1u64;
    let make = |s: u64| data_packet(s, 74);
    for round in 0..=ROUNDS {
        let (hv, hd) = if round == 0 { (&mut scratch, None) } else { (&mut via, Some(&mut direct)) };
        measure(hv, &tx, p.addr, &rx, (seq, per), make, spin);
        seq += per as u64;
        let hd = hd.unwrap_or(&mut scratch);
        measure(hd, &tx, rx.local_addr()?, &rx, (seq, per), make, spin);
        seq += per as u64;
    }
    p.finish()?;
    let (v, d) = (latency(&via), latency(&direct));
    let added = v.p50_us - d.p50_us;
    Ok(ProxyHopReport {
        proxy_hop_p50_us: added,
        baseline_oneway_p50_us: d.p50_us,
        ratio: if d.p50_us > 0.0 { added / d.p50_us } else { 0.0 },
        via_proxy: v,
        direct: d,
        busy_poll: spin,
        pinned,
    })
}

/// Latency one proxy hop adds (the agent's proxy spinning when `busy_poll`,
/// parked in ppoll otherwise), beside a bare loopback hop.
pub fn proxy_hop(samples: usize, busy_poll: bool) -> std::io::Result<ProxyHopReport> {
    let idle = if busy_poll { IdleStrategy::Spin } else { IdleStrategy::Park };
    hop_rounds(samples, idle, Tuning::default(), busy_poll)
}

/// One rung of the latency ladder.
#[derive(Debug, Clone, Serialize)]
pub struct Rung {
    pub name: String,
    pub report: ProxyHopReport,
}

/// Seed 003's ladder for our proxy hop: default (parked, not pinned) →
/// pinned (proxy on the last CPU, the timing thread on CPU 0) → busy
/// polling (proxy and timing thread spin).
pub fn proxy_ladder(samples: usize) -> std::io::Result<Vec<Rung>> {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let last = cpus.saturating_sub(1);
    let pin_me = |cpu: Option<usize>| {
        let mut set = nix::sched::CpuSet::new();
        match cpu {
            Some(c) => {
                let _ = set.set(c);
            }
            None => (0..cpus).for_each(|c| {
                let _ = set.set(c);
            }),
        }
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    };
    let pinned = Tuning { pin: vec![last], ..Tuning::default() };
    let mut out = Vec::new();
    pin_me(None);
    out.push(Rung {
        name: "default (parked, not pinned)".into(),
        report: hop_rounds(samples, IdleStrategy::Park, Tuning::default(), false)?,
    });
    pin_me(Some(0));
    out.push(Rung { name: "pinned".into(), report: hop_rounds(samples, IdleStrategy::Park, pinned.clone(), false)? });
    out.push(Rung {
        name: "pinned + busy polling".into(),
        report: hop_rounds(samples, IdleStrategy::Spin, pinned, true)?,
    });
    pin_me(None);
    Ok(out)
}

/// Replication throughput of one proxy beside a bare `sendmmsg` loop.
#[derive(Debug, Clone, Serialize)]
pub struct ProxyPpsReport {
    /// Copies per second the proxy sent (median over rounds).
    pub proxy_pps: f64,
    /// Copies per second a bare `sendmmsg` loop sent to the same sockets (median over rounds).
    pub baseline_pps: f64,
    /// proxy_pps / baseline_pps.
    pub ratio: f64,
    pub fanout: usize,
    pub packet_bytes: usize,
    /// Packets per second into the proxy (median over rounds).
    pub proxy_input_pps: f64,
    pub rounds: usize,
    pub round_seconds: f64,
    pub threads: Threading,
    /// The proxy's send back-end (the baseline is always a bare `sendmmsg` loop).
    pub io: Backend,
    pub proxy_rounds_pps: Vec<f64>,
    pub baseline_rounds_pps: Vec<f64>,
}

fn stat(sock: &UdpSocket, control: SocketAddr) -> std::io::Result<(u64, u64, Instant)> {
    sock.send_to(b"stat", control)?;
    let mut buf = vec![0u8; 65_536];
    let n = sock.recv(&mut buf)?;
    let at = Instant::now();
    let v: serde_json::Value = serde_json::from_slice(&buf[..n]).map_err(std::io::Error::other)?;
    let c = &v["counters"];
    Ok((c["packets_in"].as_u64().unwrap_or(0), c["packets_out"].as_u64().unwrap_or(0), at))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// Sends data packets with fresh sequence numbers to `to` as fast as it can until `stop`.
fn feeder(sock: UdpSocket, to: SocketAddr, len: usize, stop: Arc<AtomicBool>, first: u64) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut bs = BatchSend::default();
        let mut bufs: Vec<Vec<u8>> =
            (0..fairfeed_io::batch::BATCH_MAX as u64).map(|i| data_packet(first + i, len)).collect();
        let mut seq = first;
        while !stop.load(Ordering::Relaxed) {
            for b in &mut bufs {
                b[8..16].copy_from_slice(&seq.to_be_bytes());
                seq += 1;
            }
            bs.send(&sock, bufs.iter().map(|b| (&b[..], to)));
        }
        seq
    })
}

/// Copies/s the agent's spinning proxy replicates to `fanout` sockets, fed
/// as fast as a feeder thread can, beside a bare `sendmmsg` loop sending the
/// same-sized packet to the same sockets; `rounds` alternating rounds.
pub fn proxy_pps(
    fanout: usize,
    packet_bytes: usize,
    (rounds, round_seconds): (usize, f64),
    (threads, io): (Threading, Backend),
) -> std::io::Result<ProxyPpsReport> {
    assert!((1..=1_000).contains(&fanout), "fan-out 1..=1000");
    let sinks: Vec<UdpSocket> = (0..fanout).map(|_| UdpSocket::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    let dests: Vec<SocketAddr> = sinks.iter().map(UdpSocket::local_addr).collect::<Result<_, _>>()?;
    let feed_sock = UdpSocket::bind("127.0.0.1:0")?;
    let p = start_proxy(feed_sock.local_addr()?, &dests, IdleStrategy::Spin, Tuning::default(), (threads, io))?;
    let ctl = UdpSocket::bind("127.0.0.1:0")?;
    ctl.set_read_timeout(Some(Duration::from_secs(2)))?;
    let base_sock = UdpSocket::bind("127.0.0.1:0")?;
    let packet = data_packet(1, packet_bytes);
    let (mut ours, mut base, mut input) = (Vec::new(), Vec::new(), Vec::new());
    let mut seq = 1u64;
    for _ in 0..rounds {
        // Baseline: the same copies from a bare sendmmsg loop.
        let mut bs = BatchSend::default();
        let (t0, mut sent) = (Instant::now(), 0u64);
        while t0.elapsed().as_secs_f64() < round_seconds {
            sent += bs.send(&base_sock, dests.iter().map(|&d| (&packet[..], d))).sent;
        }
        base.push(sent as f64 / t0.elapsed().as_secs_f64());
        // Ours: the proxy, fed by another thread.
        let stop = Arc::new(AtomicBool::new(false));
        let f = feeder(feed_sock.try_clone()?, p.addr, packet_bytes, stop.clone(), seq);
        thread::sleep(Duration::from_millis(50));
        let (in0, out0, a) = stat(&ctl, p.control)?;
        thread::sleep(Duration::from_secs_f64(round_seconds));
        let (in1, out1, b) = stat(&ctl, p.control)?;
        stop.store(true, Ordering::Relaxed);
        seq = f.join().map_err(|_| std::io::Error::other("feeder panicked"))? + 1;
        let dt = (b - a).as_secs_f64();
        ours.push((out1 - out0) as f64 / dt);
        input.push((in1 - in0) as f64 / dt);
        thread::sleep(Duration::from_millis(50));
    }
    p.finish()?;
    let (o, bl) = (median(&ours), median(&base));
    Ok(ProxyPpsReport {
        proxy_pps: o,
        baseline_pps: bl,
        ratio: if bl > 0.0 { o / bl } else { 0.0 },
        fanout,
        packet_bytes,
        proxy_input_pps: median(&input),
        rounds,
        round_seconds,
        threads,
        io,
        proxy_rounds_pps: ours,
        baseline_rounds_pps: base,
    })
}
