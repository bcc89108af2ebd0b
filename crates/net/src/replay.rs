//! Replays captured UDP payloads to a socket address with the capture's own
//! pacing (scaled by a speed factor), at a fixed packet rate, or as fast as
//! possible; measures how close each send came to its schedule. A replay is
//! an agent ([`ReplayAgent`]) on `fairfeed_io::agent`'s runner.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::BorrowedFd;

use fairfeed_feed::capture::Datagram;
use hdrhistogram::Histogram;
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};

use crate::idle::IdleStrategy;
use crate::pace::SPIN_NS_DEFAULT;
use fairfeed_io::agent::{Agent, RunConfig, Turn};

/// Send buffer we ask the kernel for, so bursts of a fast feed are not dropped
/// at the sender.
pub const SEND_BUFFER_BYTES: usize = 4 << 20;

/// How to schedule the sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pacing {
    /// The capture's inter-packet times divided by `speed` (1.0 = real time).
    Capture { speed: f64 },
    /// A fixed rate in packets per second.
    Rate { pps: f64 },
    /// No waiting at all.
    Max,
}

/// What a replay did.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub packets: u64,
    pub bytes: u64,
    pub send_errors: u64,
    /// Of those, refused (ICMP port unreachable: nothing listening at the address).
    pub refused: u64,
    /// The first send error, if any.
    pub first_error: Option<String>,
    pub elapsed_s: f64,
    pub achieved_pps: f64,
    /// Send time minus scheduled time, nanoseconds.
    pub lateness_p50_ns: u64,
    pub lateness_p99_ns: u64,
    pub lateness_max_ns: u64,
}

/// A UDP socket bound to an ephemeral port of the right family, with a large send buffer.
pub fn sender_socket(to: SocketAddr) -> std::io::Result<UdpSocket> {
    let domain = if to.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    let _ = s.set_send_buffer_size(SEND_BUFFER_BYTES);
    let any: SocketAddr =
        if to.is_ipv4() { "0.0.0.0:0".parse().expect("valid") } else { "[::]:0".parse().expect("valid") };
    s.bind(&any.into())?;
    s.connect(&to.into())?;
    Ok(s.into())
}

/// Sends `datagrams` to `to`; `progress` is called after each send with the count so far.
pub fn replay(
    datagrams: &[Datagram],
    to: SocketAddr,
    pacing: Pacing,
    progress: impl FnMut(u64),
) -> std::io::Result<ReplayReport> {
    replay_lines(&[Line { datagrams, to }], pacing, progress)
}

/// One capture of a replay and where its datagrams go.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    pub datagrams: &'a [Datagram],
    pub to: SocketAddr,
}

/// A replay as an agent (`fairfeed_io::agent`): its timer is the next
/// datagram's send time; the runner parks until [`SPIN_NS_DEFAULT`] before
/// it and spins the rest (as tcpreplay does), and sends whatever is due.
pub struct ReplayAgent<'a, F: FnMut(u64)> {
    lines: &'a [Line<'a>],
    socks: Vec<UdpSocket>,
    /// (capture time, line, index) in send order.
    order: Vec<(u64, usize, usize)>,
    next: usize,
    pacing: Pacing,
    first_ts: u64,
    start_wall: u64,
    lateness: Histogram<u64>,
    packets: u64,
    bytes: u64,
    errors: u64,
    refused: u64,
    first_error: Option<String>,
    progress: F,
}

impl<'a, F: FnMut(u64)> ReplayAgent<'a, F> {
    pub fn new(lines: &'a [Line<'a>], pacing: Pacing, progress: F) -> std::io::Result<Self> {
        let socks = lines
            .iter()
            .map(|l| {
                sender_socket(l.to).map_err(|e| {
                    let why = match l.to.ip() {
                        std::net::IpAddr::V4(ip) if ip.is_broadcast() => {
                            " (a broadcast address: replay sends to one host)"
                        }
                        ip if ip.is_multicast() => " (a multicast group: is there a route for it?)",
                        _ => "",
                    };
                    std::io::Error::new(e.kind(), format!("sending to {}: {e}{why}", l.to))
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut order: Vec<(u64, usize, usize)> = lines
            .iter()
            .enumerate()
            .flat_map(|(k, l)| l.datagrams.iter().enumerate().map(move |(i, d)| (d.ts_ns, k, i)))
            .collect();
        order.sort_unstable();
        Ok(ReplayAgent {
            lines,
            socks,
            first_ts: order.first().map_or(0, |o| o.0),
            order,
            next: 0,
            pacing,
            start_wall: fairfeed_io::clock::wall_ns(),
            lateness: Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
            packets: 0,
            bytes: 0,
            errors: 0,
            refused: 0,
            first_error: None,
            progress,
        })
    }

    /// When datagram `i` (in send order) is due, ns since the start.
    fn due_ns(&self, i: usize) -> u64 {
        match self.pacing {
            Pacing::Capture { speed } => (self.order[i].0.saturating_sub(self.first_ts) as f64 / speed) as u64,
            Pacing::Rate { pps } => (i as f64 * 1e9 / pps) as u64,
            Pacing::Max => 0,
        }
    }

    /// What the replay did.
    pub fn report(&self) -> ReplayReport {
        let elapsed_s = fairfeed_io::clock::wall_ns().saturating_sub(self.start_wall) as f64 / 1e9;
        ReplayReport {
            packets: self.packets,
            bytes: self.bytes,
            send_errors: self.errors,
            refused: self.refused,
            first_error: self.first_error.clone(),
            elapsed_s,
            achieved_pps: if elapsed_s > 0.0 { self.packets as f64 / elapsed_s } else { 0.0 },
            lateness_p50_ns: self.lateness.value_at_quantile(0.5),
            lateness_p99_ns: self.lateness.value_at_quantile(0.99),
            lateness_max_ns: self.lateness.max(),
        }
    }
}

/// Datagrams sent per turn at most (the runner's other agents get their turns).
const SENDS_PER_TURN: usize = 4_096;

impl<F: FnMut(u64)> Agent for ReplayAgent<'_, F> {
    fn role(&self) -> &'static str {
        "replay"
    }

    fn do_work(&mut self, _wall: u64, _turn: Turn) -> usize {
        let mut sent = 0;
        while self.next < self.order.len() && sent < SENDS_PER_TURN {
            let due = self.due_ns(self.next);
            // The runner's clock (the wall clock), not a monotonic one: a
            // slewed wall clock would otherwise make every send late.
            let now = fairfeed_io::clock::wall_ns().saturating_sub(self.start_wall);
            if now < due {
                break;
            }
            if self.pacing != Pacing::Max {
                self.lateness.saturating_record(now - due);
            }
            let (_, k, j) = self.order[self.next];
            match self.socks[k].send(&self.lines[k].datagrams[j].payload) {
                Ok(n) => {
                    self.packets += 1;
                    self.bytes += n as u64;
                }
                Err(e) => {
                    self.errors += 1;
                    self.refused += u64::from(e.kind() == std::io::ErrorKind::ConnectionRefused);
                    self.first_error.get_or_insert_with(|| e.to_string());
                }
            }
            (self.progress)(self.packets + self.errors);
            self.next += 1;
            sent += 1;
        }
        sent
    }

    fn next_due(&self) -> u64 {
        if self.next >= self.order.len() {
            return u64::MAX;
        }
        self.start_wall.saturating_add(self.due_ns(self.next))
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        Vec::new()
    }

    fn is_done(&self) -> bool {
        self.next >= self.order.len()
    }
}

/// Replays several captures at once on one clock — the A and B lines of a
/// feed, as they arrive in production: their datagrams interleaved by
/// capture timestamp (ties: in line order), each to its line's address.
/// Under [`Pacing::Rate`] the rate counts the datagrams of all lines.
pub fn replay_lines(lines: &[Line<'_>], pacing: Pacing, progress: impl FnMut(u64)) -> std::io::Result<ReplayReport> {
    let mut a = ReplayAgent::new(lines, pacing, progress)?;
    let run = RunConfig { idle: IdleStrategy::Park, spin_ahead_ns: SPIN_NS_DEFAULT, ..RunConfig::default() };
    fairfeed_io::agent::run(&mut [&mut a], &run)?;
    Ok(a.report())
}
