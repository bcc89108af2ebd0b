//! Seed 003's latency ladder extended to the I/O back-ends: the round trip
//! over a real link (a veth pair between two namespaces the bench makes)
//! when one end sends and receives through `sendmmsg`/`recvmmsg`, io_uring
//! or AF_XDP — the node's own back-ends (`fairfeed-io`'s `SendPath` and
//! `RecvPath`; AF_XDP through `fairfeed-xdp`'s `NodeIo`), spinning — and the
//! other end is the same kernel UDP echo every time. Alternating rounds of
//! one run; the differences between rows are the back-ends', the echo's
//! cost is in every row.

use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use fairfeed_io::send::{Backend, External, RecvPath, SendPath};
use fairfeed_xdp::netns::{self, Link, VethPair};
use serde::Serialize;

const ECHO_PORT: u16 = 47_300;
const CLIENT_PORT: u16 = 47_301;
/// Bytes per probe datagram.
pub const PROBE_BYTES: usize = 64;
/// A probe not back in this long is lost.
const PROBE_TIMEOUT: Duration = Duration::from_millis(20);

/// A back-end of the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HopIo {
    Udp,
    Uring,
    Afxdp,
}

/// Round trips through one back-end.
#[derive(Debug, Clone, Serialize)]
pub struct HopRow {
    pub io: HopIo,
    pub samples: usize,
    pub lost: u64,
    pub rtt_p50_us: f64,
    pub rtt_p90_us: f64,
    pub rtt_p99_us: f64,
    pub rtt_p999_us: f64,
    /// Half the median round trip.
    pub oneway_p50_us: f64,
    /// This row's median round trip over the `udp` row's.
    pub ratio_to_udp: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct HopReport {
    pub rows: Vec<HopRow>,
    pub rounds: usize,
    pub what: &'static str,
}

fn quantile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)] as f64 / 1e3
}

/// The echo at the link's far end: every datagram straight back, spinning,
/// until told to stop.
fn echo(link: Link, stop: Arc<AtomicBool>, ready: mpsc::Sender<std::io::Result<()>>) {
    let run = || -> std::io::Result<UdpSocket> {
        netns::enter(&link.ns[1])?;
        let s = UdpSocket::bind(SocketAddrV4::new(link.addrs[1], ECHO_PORT))?;
        s.set_nonblocking(true)?;
        Ok(s)
    };
    let s = match run() {
        Ok(s) => {
            let _ = ready.send(Ok(()));
            s
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((n, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(&buf[..n], from);
        } else {
            std::hint::spin_loop();
        }
    }
}

/// One round of `samples` round trips through `io`, in the link's first namespace.
fn round(link: &Link, io: HopIo, samples: usize) -> std::io::Result<(Vec<u64>, u64)> {
    let l = link.clone();
    thread::spawn(move || -> std::io::Result<(Vec<u64>, u64)> {
        netns::enter(&l.ns[0])?;
        let me = SocketAddrV4::new(l.addrs[0], CLIENT_PORT);
        let sock = UdpSocket::bind(me)?;
        sock.set_nonblocking(true)?;
        let (mut send, mut recv) = match io {
            HopIo::Udp | HopIo::Uring => {
                let b = if io == HopIo::Udp { Backend::Udp } else { Backend::Uring };
                (SendPath::new(b)?, RecvPath::new(b, &sock, false)?)
            }
            HopIo::Afxdp => {
                let n = fairfeed_xdp::afxdp::NodeIo::open(&l.ifaces[0], me, fairfeed_xdp::Mode::Native)
                    .map_err(std::io::Error::other)?;
                let ext = External::new("AF_XDP", Box::new(n.recv), Box::new(n.send));
                let (r, s) = ext.take().expect("just made");
                (SendPath::External(s), RecvPath::External(r))
            }
        };
        let to = SocketAddr::V4(SocketAddrV4::new(l.addrs[1], ECHO_PORT));
        let mut probe = [0u8; PROBE_BYTES];
        let (mut rtts, mut lost) = (Vec::with_capacity(samples), 0u64);
        // A few untimed round trips first (ARP, caches).
        for i in 0..samples + 100 {
            probe[..8].copy_from_slice(&(i as u64).to_be_bytes());
            let t0 = Instant::now();
            send.send(&sock, [(&probe[..], to)]);
            let mut back = false;
            while !back && t0.elapsed() < PROBE_TIMEOUT {
                recv.recv_stamped(&sock, |b, _| back |= b.len() >= 8 && b[..8] == probe[..8]);
            }
            let dt = t0.elapsed().as_nanos() as u64;
            if i < 100 {
                continue;
            }
            if back {
                rtts.push(dt);
            } else {
                lost += 1;
            }
        }
        Ok((rtts, lost))
    })
    .join()
    .map_err(|_| std::io::Error::other("the client thread panicked"))?
}

/// The ladder: `samples` round trips per back-end per round, `rounds`
/// rounds alternating the back-ends, over a fresh veth pair.
pub fn hop_latency(ios: &[HopIo], samples: usize, rounds: usize) -> std::io::Result<HopReport> {
    fairfeed_xdp::built().map_err(std::io::Error::other)?;
    let veth = VethPair::create()?;
    let link = veth.link().clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let (l, st) = (link.clone(), stop.clone());
    let echo_thread = thread::spawn(move || echo(l, st, tx));
    rx.recv_timeout(Duration::from_secs(10)).map_err(|_| std::io::Error::other("the echo did not start"))??;
    let mut all: Vec<(Vec<u64>, u64)> = vec![(Vec::new(), 0); ios.len()];
    let res = (|| -> std::io::Result<()> {
        for _ in 0..rounds {
            for (k, &io) in ios.iter().enumerate() {
                let (r, lost) = round(&link, io, samples)?;
                all[k].0.extend(r);
                all[k].1 += lost;
            }
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    let _ = echo_thread.join();
    res?;
    let mut rows: Vec<HopRow> = ios
        .iter()
        .zip(all.iter_mut())
        .map(|(&io, (v, lost))| {
            v.sort_unstable();
            HopRow {
                io,
                samples: v.len(),
                lost: *lost,
                rtt_p50_us: quantile(v, 0.5),
                rtt_p90_us: quantile(v, 0.9),
                rtt_p99_us: quantile(v, 0.99),
                rtt_p999_us: quantile(v, 0.999),
                oneway_p50_us: quantile(v, 0.5) / 2.0,
                ratio_to_udp: 0.0,
            }
        })
        .collect();
    let base = rows.iter().find(|r| r.io == HopIo::Udp).map(|r| r.rtt_p50_us);
    for r in &mut rows {
        r.ratio_to_udp = base.filter(|b| *b > 0.0).map_or(0.0, |b| r.rtt_p50_us / b);
    }
    Ok(HopReport {
        rows,
        rounds,
        what: "round trip over veth between two namespaces: one end sends and receives through the back-end, \
               spinning; the other is a kernel UDP echo, spinning; alternating rounds of one run",
    })
}
