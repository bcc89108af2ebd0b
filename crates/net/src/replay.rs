//! Replays captured UDP payloads to a socket address with the capture's own
//! pacing (scaled by a speed factor), at a fixed packet rate, or as fast as
//! possible; measures how close each send came to its schedule.

use std::net::{SocketAddr, UdpSocket};

use fairfeed_feed::capture::Datagram;
use hdrhistogram::Histogram;
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};

use crate::pace::{Pacer, SPIN_NS_DEFAULT};

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

/// Replays several captures at once on one clock — the A and B lines of a
/// feed, as they arrive in production: their datagrams interleaved by
/// capture timestamp (ties: in line order), each to its line's address.
/// Under [`Pacing::Rate`] the rate counts the datagrams of all lines.
pub fn replay_lines(
    lines: &[Line<'_>],
    pacing: Pacing,
    mut progress: impl FnMut(u64),
) -> std::io::Result<ReplayReport> {
    let socks = lines
        .iter()
        .map(|l| {
            sender_socket(l.to).map_err(|e| {
                let why = match l.to.ip() {
                    std::net::IpAddr::V4(ip) if ip.is_broadcast() => " (a broadcast address: replay sends to one host)",
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
    let mut lateness = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let first_ts = order.first().map_or(0, |o| o.0);
    let pacer = Pacer::new(SPIN_NS_DEFAULT);
    let (mut packets, mut bytes, mut errors, mut refused) = (0u64, 0u64, 0u64, 0u64);
    let mut first_error = None;
    for (i, &(ts, k, j)) in order.iter().enumerate() {
        let deadline = match pacing {
            Pacing::Capture { speed } => (ts.saturating_sub(first_ts) as f64 / speed) as u64,
            Pacing::Rate { pps } => (i as f64 * 1e9 / pps) as u64,
            Pacing::Max => 0,
        };
        let late = pacer.wait_until(deadline);
        if pacing != Pacing::Max {
            lateness.saturating_record(late);
        }
        match socks[k].send(&lines[k].datagrams[j].payload) {
            Ok(n) => {
                packets += 1;
                bytes += n as u64;
            }
            Err(e) => {
                errors += 1;
                refused += u64::from(e.kind() == std::io::ErrorKind::ConnectionRefused);
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
        progress(packets + errors);
    }
    let elapsed_s = pacer.now_ns() as f64 / 1e9;
    Ok(ReplayReport {
        packets,
        bytes,
        send_errors: errors,
        refused,
        first_error,
        elapsed_s,
        achieved_pps: if elapsed_s > 0.0 { packets as f64 / elapsed_s } else { 0.0 },
        lateness_p50_ns: lateness.value_at_quantile(0.5),
        lateness_p99_ns: lateness.value_at_quantile(0.99),
        lateness_max_ns: lateness.max(),
    })
}
