//! Jasper's receiver fast path measured: the XDP de-duplicator
//! ([`fairfeed_xdp`]) on a veth link between two network namespaces, beside
//! the same receiver without it, in the same run.
//!
//! A sender thread (in one namespace) sends every authenticated overlay data
//! packet `hedge + 1` times, the later copies [`COPY_SPREAD`] messages behind
//! the first (as hedged copies over slower paths arrive); a receiver thread
//! (in the other) reads with `recvmmsg`, checks each tag and de-duplicates
//! with the window every receiver node uses, draining what a millisecond
//! gathered in full batches ([`READ_EVERY`]). Each round runs once without XDP
//! and once with the program attached to the receiver's veth; the receiver
//! thread's CPU time per delivered message (`CLOCK_THREAD_CPUTIME_ID`) is
//! compared. The kernel's own receive work on veth runs in the sender's
//! softirq, so it is reported apart as the sender thread's CPU time.

use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use fairfeed_io::batch::{BatchRecv, BatchSend};
use fairfeed_io::clock::wall_ns;
use fairfeed_tree::auth::Auth;
use fairfeed_tree::dedup::{Dedup, Seen};
use fairfeed_wire::overlay::{HeaderRepr, Kind, HEADER_LEN};
use fairfeed_xdp::netns::{self, Link, VethPair};
use fairfeed_xdp::{DedupCounters, Mode, XdpDedup};
use serde::Serialize;

/// Messages the later hedged copies trail the first by.
pub const COPY_SPREAD: u64 = 4;
/// The receiver's UDP port.
const PORT: u16 = 47_000;
/// Quiet time after the sender ends before the receiver stops reading.
const DRAIN: Duration = Duration::from_millis(300);
/// How long the receiver lets datagrams gather after a wake-up before it
/// drains them (as a NIC's interrupt moderation does), so the CPU time per
/// message is the work per copy, not the cost of waking per datagram.
pub const READ_EVERY: Duration = Duration::from_millis(1);
/// Messages per round at most.
pub const MESSAGES_MAX: u64 = 10_000_000;

/// What one receiver run saw.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Round {
    pub copies_sent: u64,
    /// Datagrams the receiver's socket read.
    pub datagrams_read: u64,
    pub delivered: u64,
    pub lost: u64,
    /// Copies user space recognised as duplicates (and dropped).
    pub user_duplicates: u64,
    /// Packets refused by the tag check.
    pub refused: u64,
    pub receiver_cpu_ns: u64,
    pub receiver_cpu_ns_per_delivered: f64,
    /// The receiver thread's user and system time per delivered message, ns.
    pub receiver_user_ns_per_delivered: f64,
    pub receiver_sys_ns_per_delivered: f64,
    pub sender_cpu_ns_per_message: f64,
    pub seconds: f64,
    /// The XDP program's counters (zero without it).
    pub xdp: DedupCounters,
}

/// The benchmark's answer.
#[derive(Debug, Clone, Serialize)]
pub struct XdpDedupReport {
    pub hedge: usize,
    pub messages: u64,
    pub rate: u64,
    pub payload_bytes: usize,
    pub rounds: usize,
    /// How the program was attached (native: in veth's driver).
    pub mode: Mode,
    /// Totals over the XDP rounds.
    pub copies: u64,
    pub dropped_in_kernel: u64,
    pub delivered: u64,
    pub lost: u64,
    /// dropped_in_kernel ÷ the extra copies sent (copies − messages).
    pub dropped_share: f64,
    /// Median receiver CPU per delivered message, ns, without and with XDP.
    pub baseline_cpu_ns_per_delivered: f64,
    pub xdp_cpu_ns_per_delivered: f64,
    /// xdp ÷ baseline (lower is better).
    pub cpu_ratio: f64,
    /// Median sender-thread CPU per message (includes veth's receive softirq), ns.
    pub baseline_sender_cpu_ns_per_message: f64,
    pub xdp_sender_cpu_ns_per_message: f64,
    pub baseline: Vec<Round>,
    pub xdp: Vec<Round>,
}

/// The calling thread's (user, system) CPU time, ns.
fn thread_rusage_ns() -> (u64, u64) {
    match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD) {
        Ok(u) => {
            let ns = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000_000 + t.tv_usec() as u64 * 1_000;
            (ns(u.user_time()), ns(u.system_time()))
        }
        Err(_) => (0, 0),
    }
}

fn thread_cpu_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID) {
        Ok(t) => t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64,
        Err(_) => 0,
    }
}

/// Pins the calling thread to `cpu` where the machine has it; says whether it did.
fn pin(cpu: usize) -> bool {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 || cpu >= cpus {
        return false;
    }
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).is_ok() && nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).is_ok()
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// An authenticated overlay data packet with sequence `seq`.
pub fn sealed_packet(auth: &Auth, seq: u64, payload: usize) -> Vec<u8> {
    let mut b = vec![0x5a; HEADER_LEN + payload];
    let h = HeaderRepr {
        kind: Some(Kind::Data),
        sequence: seq,
        send_ns: wall_ns(),
        payload_len: payload as u16,
        ..HeaderRepr::default()
    };
    let _ = h.emit(&mut b);
    auth.seal(&mut b);
    b
}

/// The receiver's user-space path: tag check, then the duplicate window.
#[derive(Debug, Default)]
pub struct UserPath {
    pub dedup: Dedup,
    pub delivered: u64,
    pub refused: u64,
    pub read: u64,
}

impl UserPath {
    pub fn take(&mut self, auth: &Auth, b: &[u8]) -> Option<u64> {
        self.read += 1;
        let Ok(_) = auth.open(b, wall_ns()) else {
            self.refused += 1;
            return None;
        };
        let (h, _) = HeaderRepr::parse(b).ok()?;
        match self.dedup.check(h.sequence) {
            Seen::New => {
                self.delivered += 1;
                Some(h.sequence)
            }
            _ => None,
        }
    }
}

struct Receiver {
    path: UserPath,
    cpu_ns: u64,
    user_ns: u64,
    sys_ns: u64,
    xdp: DedupCounters,
}

fn receive(
    veth: &Link,
    auth: Auth,
    xdp: bool,
    ready: mpsc::Sender<std::io::Result<Mode>>,
    done: Arc<AtomicBool>,
) -> Receiver {
    let fail = |e: String| {
        let _ = ready.send(Err(std::io::Error::other(e)));
        Receiver { path: UserPath::default(), cpu_ns: 0, user_ns: 0, sys_ns: 0, xdp: DedupCounters::default() }
    };
    if let Err(e) = netns::enter(&veth.ns[1]) {
        return fail(format!("entering {}: {e}", veth.ns[1]));
    }
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    pin(cpus - 1);
    let prog = if xdp {
        match XdpDedup::attach(&veth.ifaces[1], PORT, None) {
            Ok(p) => Some(p),
            Err(e) => return fail(e.to_string()),
        }
    } else {
        None
    };
    let sock = match UdpSocket::bind(SocketAddrV4::new(veth.addrs[1], PORT)) {
        Ok(s) => s,
        Err(e) => return fail(format!("binding {}:{PORT}: {e}", veth.addrs[1])),
    };
    let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(16 << 20);
    let _ = sock.set_nonblocking(true);
    let _ = ready.send(Ok(prog.as_ref().map_or(Mode::Generic, XdpDedup::mode)));
    let (mut path, mut batch) = (UserPath::default(), BatchRecv::new(false));
    let cpu0 = thread_cpu_ns();
    let ru0 = thread_rusage_ns();
    let mut quiet_since: Option<Instant> = None;
    loop {
        let fd = sock.as_fd();
        let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(50u16)).unwrap_or(0) > 0 {
            // Let a millisecond's datagrams gather, then drain them in full
            // batches: what is timed is the work per copy, not per wake-up.
            thread::sleep(READ_EVERY);
        }
        let mut n = 0;
        loop {
            let got = batch.recv(&sock, |b| {
                path.take(&auth, b);
            });
            n += got;
            if got == 0 {
                break;
            }
        }
        if n > 0 {
            quiet_since = None;
        } else if done.load(Ordering::Acquire) {
            let q = *quiet_since.get_or_insert_with(Instant::now);
            if q.elapsed() >= DRAIN {
                break;
            }
        }
    }
    let cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
    let ru1 = thread_rusage_ns();
    let (user_ns, sys_ns) = (ru1.0.saturating_sub(ru0.0), ru1.1.saturating_sub(ru0.1));
    let xdp = prog.as_ref().and_then(|p| p.counters().ok()).unwrap_or_default();
    Receiver { path, cpu_ns, user_ns, sys_ns, xdp }
}

/// Sends `messages` messages at `rate`, each `hedge + 1` times; returns
/// (copies sent, sender thread CPU ns).
fn send(
    veth: &Link,
    auth: &Auth,
    (messages, rate, hedge, payload): (u64, u64, usize, usize),
    first: u64,
) -> std::io::Result<(u64, u64)> {
    netns::enter(&veth.ns[0])?;
    // The sender (and with it veth's receive softirq) on CPU 0, the receiver on the last.
    pin(0);
    let sock = UdpSocket::bind(SocketAddrV4::new(veth.addrs[0], 0))?;
    let to = SocketAddr::V4(SocketAddrV4::new(veth.addrs[1], PORT));
    let mut bs = BatchSend::default();
    let cpu0 = thread_cpu_ns();
    let t0 = Instant::now();
    let spread = COPY_SPREAD * hedge as u64;
    let steps = messages + spread;
    let (mut step, mut copies) = (0u64, 0u64);
    // The packets of messages lo.. (the last `spread + 1`).
    let (mut ring, mut lo) = (std::collections::VecDeque::<Vec<u8>>::new(), 0u64);
    while step < steps {
        let due = ((t0.elapsed().as_secs_f64() * rate as f64) as u64 + 1).min(steps);
        while step < due {
            if step < messages {
                ring.push_back(sealed_packet(auth, first + step, payload));
            }
            // Copy k of message (step − k·spread): the first now, hedges later.
            let out = (0..=hedge as u64).filter_map(|k| {
                let m = step.checked_sub(k * COPY_SPREAD)?;
                (m < messages && m >= lo).then(|| (&ring[(m - lo) as usize][..], to))
            });
            copies += bs.send(&sock, out).sent;
            while ring.len() as u64 > spread + 1 {
                ring.pop_front();
                lo += 1;
            }
            step += 1;
        }
        thread::sleep(Duration::from_micros(200));
    }
    Ok((copies, thread_cpu_ns().saturating_sub(cpu0)))
}

fn round(veth: &Link, params: (u64, u64, usize, usize), xdp: bool, first: u64) -> std::io::Result<(Round, Mode)> {
    let auth = Auth::new([0x3f; 32]);
    let done = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let r = {
        let (link, auth, done) = (veth.clone(), auth.clone(), done.clone());
        thread::spawn(move || receive(&link, auth, xdp, tx, done))
    };
    let mode =
        rx.recv_timeout(Duration::from_secs(10)).map_err(|_| std::io::Error::other("the receiver did not start"))??;
    let t0 = Instant::now();
    let sent = thread::scope(|s| s.spawn(|| send(veth, &auth, params, first)).join());
    done.store(true, Ordering::Release);
    let rec = r.join().map_err(|_| std::io::Error::other("the receiver panicked"))?;
    let (copies, sender_cpu) = sent.map_err(|_| std::io::Error::other("the sender panicked"))??;
    let messages = params.0;
    let p = &rec.path;
    let round = Round {
        copies_sent: copies,
        datagrams_read: p.read,
        delivered: p.delivered,
        lost: messages.saturating_sub(p.delivered),
        user_duplicates: p.read - p.delivered - p.refused,
        refused: p.refused,
        receiver_cpu_ns: rec.cpu_ns,
        receiver_cpu_ns_per_delivered: rec.cpu_ns as f64 / p.delivered.max(1) as f64,
        receiver_user_ns_per_delivered: rec.user_ns as f64 / p.delivered.max(1) as f64,
        receiver_sys_ns_per_delivered: rec.sys_ns as f64 / p.delivered.max(1) as f64,
        sender_cpu_ns_per_message: sender_cpu as f64 / messages.max(1) as f64,
        seconds: t0.elapsed().as_secs_f64(),
        xdp: rec.xdp,
    };
    Ok((round, mode))
}

/// Runs `rounds` pairs of rounds (without XDP, then with it) of `messages`
/// messages at `rate` per second, each sent `hedge + 1` times.
pub fn xdp_dedup(
    hedge: usize,
    messages: u64,
    rate: u64,
    payload_bytes: usize,
    rounds: usize,
) -> std::io::Result<XdpDedupReport> {
    assert!((1..=8).contains(&hedge), "hedge 1..=8");
    assert!((1..=MESSAGES_MAX).contains(&messages), "messages 1..={MESSAGES_MAX}");
    assert!((1..=4_096).contains(&payload_bytes), "payload 1..=4096 bytes (the XDP program's bound)");
    fairfeed_xdp::built().map_err(std::io::Error::other)?;
    let veth = VethPair::create()?;
    let params = (messages, rate, hedge, payload_bytes);
    let (mut base, mut with, mut mode) = (Vec::new(), Vec::new(), Mode::Generic);
    let mut first = 1u64;
    for _ in 0..rounds {
        base.push(round(veth.link(), params, false, first)?.0);
        first += messages + 1_000_000;
        let (r, m) = round(veth.link(), params, true, first)?;
        first += messages + 1_000_000;
        with.push(r);
        mode = m;
    }
    let sum = |f: fn(&Round) -> u64| with.iter().map(f).sum::<u64>();
    let (copies, dropped) = (sum(|r| r.copies_sent), sum(|r| r.xdp.duplicate));
    let total_messages = messages * rounds as u64;
    let b = median(&base.iter().map(|r| r.receiver_cpu_ns_per_delivered).collect::<Vec<_>>());
    let x = median(&with.iter().map(|r| r.receiver_cpu_ns_per_delivered).collect::<Vec<_>>());
    Ok(XdpDedupReport {
        hedge,
        messages,
        rate,
        payload_bytes,
        rounds,
        mode,
        copies,
        dropped_in_kernel: dropped,
        delivered: sum(|r| r.delivered),
        lost: sum(|r| r.lost),
        dropped_share: dropped as f64 / copies.saturating_sub(total_messages).max(1) as f64,
        baseline_cpu_ns_per_delivered: b,
        xdp_cpu_ns_per_delivered: x,
        cpu_ratio: if b > 0.0 { x / b } else { 0.0 },
        baseline_sender_cpu_ns_per_message: median(
            &base.iter().map(|r| r.sender_cpu_ns_per_message).collect::<Vec<_>>(),
        ),
        xdp_sender_cpu_ns_per_message: median(&with.iter().map(|r| r.sender_cpu_ns_per_message).collect::<Vec<_>>()),
        baseline: base,
        xdp: with,
    })
}

/// UDP ports of the replication benchmark's targets (the far end's sink).
const REPLICA_PORT: u16 = 47_100;

/// Replication through Jasper's TC egress hook beside a bare `sendmmsg`
/// loop sending every copy itself, on one veth link, same run.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicationReport {
    /// The I/O path measured against the baseline: "tc" or "afxdp".
    pub io: &'static str,
    /// Copies per second that reached the far end with TC replication (median over rounds).
    pub proxy_pps: f64,
    /// Copies per second that reached the far end from a bare `sendmmsg` loop sending each copy (median).
    pub baseline_pps: f64,
    /// proxy_pps / baseline_pps.
    pub ratio: f64,
    /// Datagrams per second user space sent in the TC rounds (one per packet; median).
    pub packets_pps: f64,
    pub fanout: usize,
    pub packet_bytes: usize,
    pub rounds: usize,
    pub round_seconds: f64,
    pub proxy_rounds_pps: Vec<f64>,
    pub baseline_rounds_pps: Vec<f64>,
    /// The replicator's counters over all TC rounds (zero for AF_XDP).
    pub tc: fairfeed_xdp::ReplicateCounters,
    /// The AF_XDP socket's counters over all its rounds, and its mode (AF_XDP only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub afxdp: Option<fairfeed_xdp::afxdp::XskCounters>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub afxdp_mode: Option<fairfeed_xdp::afxdp::XskMode>,
    /// Whether the far end's veth polled in a kernel thread of its own (off the sending core).
    pub threaded_napi: bool,
    /// What is timed.
    pub what: &'static str,
}

/// How a replication round's sending core makes its copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// The kernel's TC egress hook clones one datagram per packet.
    Tc,
    /// Every copy is a frame written to an AF_XDP socket's TX ring.
    AfXdp,
}

/// What a round's sender counted besides its datagrams.
#[derive(Debug, Clone, Copy, Default)]
struct RoundCounters {
    tc: fairfeed_xdp::ReplicateCounters,
    xsk: Option<(fairfeed_xdp::afxdp::XskCounters, fairfeed_xdp::afxdp::XskMode)>,
}

fn sink_count(sink: &fairfeed_xdp::sink::XdpSink) -> std::io::Result<u64> {
    sink.datagrams().map_err(std::io::Error::other)
}

/// One timed round: a thread in the link's first namespace sends until
/// told to stop (`tc`: one datagram per packet through the replicator;
/// otherwise one per copy); returns copies/s counted by the far end's sink,
/// datagrams/s sent, and the replicator's counters.
fn replication_round(
    link: &Link,
    sink: &fairfeed_xdp::sink::XdpSink,
    (fanout, packet_bytes, seconds): (usize, usize, f64),
    path: Option<Replication>,
) -> std::io::Result<(f64, f64, RoundCounters)> {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let (l, st) = (link.clone(), stop.clone());
    let h = thread::spawn(move || -> std::io::Result<(u64, RoundCounters)> {
        netns::enter(&l.ns[0])?;
        pin(0);
        let targets: Vec<SocketAddrV4> =
            (0..fanout as u16).map(|i| SocketAddrV4::new(l.addrs[1], REPLICA_PORT + i)).collect();
        let port = match path {
            Some(Replication::Tc) => PORT,
            Some(Replication::AfXdp) => PORT + 2,
            None => PORT + 1,
        };
        let rep = if path == Some(Replication::Tc) {
            Some(
                fairfeed_xdp::TcReplicator::attach(&l.ifaces[0], port, &targets, None)
                    .map_err(std::io::Error::other)?,
            )
        } else {
            None
        };
        let sock = UdpSocket::bind(SocketAddrV4::new(l.addrs[0], port))?;
        let _ = socket2::SockRef::from(&sock).set_send_buffer_size(4 << 20);
        let mut packet = vec![0x5a; packet_bytes.max(HEADER_LEN)];
        let h = HeaderRepr {
            kind: Some(Kind::Data),
            sequence: 1,
            payload_len: (packet.len() - HEADER_LEN) as u16,
            ..HeaderRepr::default()
        };
        h.emit(&mut packet).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        let first = SocketAddr::V4(targets[0]);
        let all: Vec<SocketAddr> = targets.iter().map(|&t| SocketAddr::V4(t)).collect();
        if path == Some(Replication::AfXdp) {
            return afxdp_round(&l, port, &targets, packet, &st, &tx);
        }
        let _ = tx.send(());
        let (mut bs, mut sent) = (BatchSend::default(), 0u64);
        while !st.load(Ordering::Relaxed) {
            sent += if rep.is_some() {
                bs.send(&sock, (0..fairfeed_io::batch::BATCH_MAX).map(|_| (&packet[..], first))).sent
            } else {
                bs.send(&sock, all.iter().map(|&d| (&packet[..], d))).sent
            };
        }
        let c = rep.map(|r| r.counters()).transpose().map_err(std::io::Error::other)?.unwrap_or_default();
        Ok((sent, RoundCounters { tc: c, xsk: None }))
    });
    rx.recv_timeout(Duration::from_secs(10)).map_err(|_| std::io::Error::other("the sending thread did not start"))?;
    thread::sleep(Duration::from_millis(100));
    let (c0, t0) = (sink_count(sink)?, Instant::now());
    thread::sleep(Duration::from_secs_f64(seconds));
    let (c1, t1) = (sink_count(sink)?, Instant::now());
    stop.store(true, Ordering::Relaxed);
    let (sent, counters) = h.join().map_err(|_| std::io::Error::other("the sending thread panicked"))??;
    let dt = (t1 - t0).as_secs_f64();
    // Datagrams/s user space sent: over its whole run, an estimate.
    let sent_pps = sent as f64 / (dt + 0.1);
    Ok(((c1 - c0) as f64 / dt, sent_pps, counters))
}

/// The AF_XDP sender of [`replication_round`]: one packet in (a new payload
/// each), a frame per target out, until `stop`; `ready` is told once it sends.
fn afxdp_round(
    l: &Link,
    port: u16,
    targets: &[SocketAddrV4],
    mut packet: Vec<u8>,
    stop: &AtomicBool,
    ready: &mpsc::Sender<()>,
) -> std::io::Result<(u64, RoundCounters)> {
    use fairfeed_xdp::afxdp::{mac_of, sum, UdpHeaders, Xsk};
    let mut xsk = Xsk::open(&l.ifaces[0], 0, None).map_err(std::io::Error::other)?;
    let macs = fairfeed_xdp::neigh::next_hop_macs(&l.ifaces[0], targets).map_err(std::io::Error::other)?;
    let hdr = UdpHeaders {
        src_mac: mac_of(&l.ifaces[0]).map_err(std::io::Error::other)?,
        src: SocketAddrV4::new(l.addrs[0], port),
    };
    let _ = ready.send(());
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..fairfeed_io::batch::BATCH_MAX {
            sent += 1;
            // A new payload each packet (the header stays as emitted).
            let n = packet.len();
            if n >= HEADER_LEN + 8 {
                packet[n - 8..].copy_from_slice(&sent.to_be_bytes());
            }
            let s = sum(&packet);
            for (t, mac) in targets.iter().zip(&macs) {
                xsk.send(|f| hdr.write(f, *mac, *t, &packet, s));
            }
        }
        xsk.flush();
    }
    xsk.flush();
    let c = xsk.counters();
    Ok((c.tx_frames - c.tx_full, RoundCounters { xsk: Some((c, xsk.mode())), ..RoundCounters::default() }))
}

/// The far end of the link: an XDP sink counting (and dropping) what
/// arrives, and its receive work (veth's NAPI poll, which exists once XDP is
/// attached, and the sink) in a kernel thread of its own, off the sending
/// core, as on another host — `true` where the kernel allowed that.
fn far_end(link: &Link) -> std::io::Result<(fairfeed_xdp::sink::XdpSink, bool)> {
    let l = link.clone();
    let sink = thread::spawn(move || -> std::io::Result<fairfeed_xdp::sink::XdpSink> {
        netns::enter(&l.ns[1])?;
        fairfeed_xdp::sink::XdpSink::attach(&l.ifaces[1], REPLICA_PORT..=REPLICA_PORT + 63)
            .map_err(std::io::Error::other)
    })
    .join()
    .map_err(|_| std::io::Error::other("attaching the sink panicked"))??;
    let threaded = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &link.ns[1],
            "sh",
            "-c",
            &format!("echo 1 > /sys/class/net/{}/threaded", link.ifaces[1]),
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    Ok((sink, threaded))
}

/// Copies/s one sending core makes to `fanout` targets over a veth link:
/// through the TC egress replicator (one datagram per packet from user
/// space) beside a bare `sendmmsg` loop sending every copy; counted where
/// they arrive, by an XDP sink that drops them; alternating rounds.
pub fn replication_pps(
    fanout: usize,
    packet_bytes: usize,
    (rounds, round_seconds): (usize, f64),
    path: Replication,
) -> std::io::Result<ReplicationReport> {
    assert!((2..=fairfeed_xdp::replicate::TARGETS_MAX).contains(&fanout), "fan-out 2..=64 with TC replication");
    fairfeed_xdp::built().map_err(std::io::Error::other)?;
    let veth = VethPair::create()?;
    let link = veth.link().clone();
    let (sink, threaded) = far_end(&link)?;
    let (mut ours, mut base, mut sent, mut tc) =
        (Vec::new(), Vec::new(), Vec::new(), fairfeed_xdp::ReplicateCounters::default());
    let (mut xsk, mut xsk_mode) = (None::<fairfeed_xdp::afxdp::XskCounters>, None);
    for _ in 0..rounds {
        base.push(replication_round(&link, &sink, (fanout, packet_bytes, round_seconds), None)?.0);
        let (pps, s, c) = replication_round(&link, &sink, (fanout, packet_bytes, round_seconds), Some(path))?;
        ours.push(pps);
        sent.push(s);
        tc.packets += c.tc.packets;
        tc.copies += c.tc.copies;
        tc.failed += c.tc.failed;
        tc.passed += c.tc.passed;
        if let Some((x, m)) = c.xsk {
            let t = xsk.get_or_insert_with(Default::default);
            t.tx_frames += x.tx_frames;
            t.tx_full += x.tx_full;
            t.kicks += x.kicks;
            xsk_mode = Some(m);
        }
    }
    drop(sink);
    let (o, b) = (median(&ours), median(&base));
    Ok(ReplicationReport {
        threaded_napi: threaded,
        io: match path {
            Replication::Tc => "tc",
            Replication::AfXdp => "afxdp",
        },
        afxdp: xsk,
        afxdp_mode: xsk_mode,
        proxy_pps: o,
        baseline_pps: b,
        ratio: if b > 0.0 { o / b } else { 0.0 },
        packets_pps: median(&sent),
        fanout,
        packet_bytes,
        rounds,
        round_seconds,
        proxy_rounds_pps: ours,
        baseline_rounds_pps: base,
        tc,
        what: match path {
            Replication::Tc => {
                "copies/s from one sending core over veth, counted at the far end by an XDP sink; \
                 TC: one datagram per packet from user space, copies made by bpf_clone_redirect() on egress"
            }
            Replication::AfXdp => {
                "copies/s from one sending core over veth, counted at the far end by an XDP sink; \
                 AF_XDP: one Ethernet/IPv4/UDP frame per copy written to the socket's TX ring, the kernel told every 32"
            }
        },
    })
}
