//! `fairfeed capture`: records the UDP datagrams arriving at one address
//! into a pcap, as `tcpdump -i lo udp port P` would, without privileges —
//! what a feed handler at the end of the chain receives (a receiver's
//! `--deliver`, an arbitrator's output), for `decode`, `tshark` or a test.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fairfeed_feed::capture::{CaptureError, CaptureWriter};

/// Receive buffer of the capture socket: a burst of a fast feed fits.
pub const CAPTURE_RECV_BUFFER: usize = 8 << 20;
/// How often the loop looks at its stop conditions.
const POLL: Duration = Duration::from_millis(50);

/// When a capture ends.
#[derive(Debug, Clone, Copy, Default)]
pub struct Until {
    /// This long after the first datagram without another.
    pub idle: Option<Duration>,
    /// This long after the start, whatever comes.
    pub max: Option<Duration>,
    /// This many datagrams.
    pub datagrams: Option<u64>,
}

/// What a capture recorded.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Captured {
    pub datagrams: u64,
    pub bytes: u64,
    /// Datagrams from IPv6 senders (not written: the pcap is IPv4).
    pub skipped_ipv6: u64,
    pub seconds: f64,
}

/// Why a capture failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureFail {
    #[error("binding {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("{0} is not an IPv4 address (the capture is written as IPv4)")]
    NotIpv4(SocketAddr),
    #[error(transparent)]
    Write(#[from] CaptureError),
    #[error("reading from {0}: {1}")]
    Read(SocketAddr, std::io::Error),
}

/// Binds `listen` (before anything is sent to it: call this first, then start the sender).
pub fn bind(listen: SocketAddr) -> Result<UdpSocket, CaptureFail> {
    let SocketAddr::V4(_) = listen else { return Err(CaptureFail::NotIpv4(listen)) };
    let s = fairfeed_io::socket::bind_udp(listen, CAPTURE_RECV_BUFFER).map_err(|e| CaptureFail::Bind(listen, e))?;
    s.set_nonblocking(false).map_err(|e| CaptureFail::Bind(listen, e))?;
    s.set_read_timeout(Some(POLL)).map_err(|e| CaptureFail::Bind(listen, e))?;
    Ok(s)
}

/// Records what `sock` receives into `out` until `until` or `stop`;
/// `progress` hears the count now and then.
pub fn capture(
    sock: &UdpSocket,
    out: &Path,
    until: Until,
    stop: &AtomicBool,
    mut progress: impl FnMut(u64),
) -> Result<Captured, CaptureFail> {
    let local = sock.local_addr().map_err(|e| CaptureFail::Read(SocketAddr::from(([0, 0, 0, 0], 0)), e))?;
    let SocketAddr::V4(dst) = local else { return Err(CaptureFail::NotIpv4(local)) };
    let mut w = CaptureWriter::create(out)?;
    let mut c = Captured::default();
    let start = Instant::now();
    let mut last = None::<Instant>;
    let mut buf = vec![0u8; 65_536];
    loop {
        if stop.load(Ordering::Relaxed)
            || until.max.is_some_and(|m| start.elapsed() >= m)
            || until.datagrams.is_some_and(|n| c.datagrams >= n)
            || matches!((until.idle, last), (Some(i), Some(l)) if l.elapsed() >= i)
        {
            break;
        }
        match sock.recv_from(&mut buf) {
            Ok((n, SocketAddr::V4(src))) => {
                let ts = fairfeed_io::clock::wall_ns();
                w.write(ts, src, dst, &buf[..n])?;
                c.datagrams += 1;
                c.bytes += n as u64;
                last = Some(Instant::now());
                if c.datagrams % 1_000 == 0 {
                    progress(c.datagrams);
                }
            }
            Ok((_, SocketAddr::V6(_))) => c.skipped_ipv6 += 1,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(CaptureFail::Read(local, e)),
        }
    }
    w.finish()?;
    c.seconds = start.elapsed().as_secs_f64();
    progress(c.datagrams);
    Ok(c)
}
