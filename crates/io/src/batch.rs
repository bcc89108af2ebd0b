//! Batched UDP: `recvmmsg(2)` reads up to [`BATCH_MAX`] datagrams in one
//! system call, and `sendmmsg(2)` sends one buffer to many destinations in
//! one call, each message pointing at the same bytes (a proxy replicates a
//! packet to its children and hedge targets without copying it per
//! destination).

use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::sys::socket::{
    recvmmsg, sendmmsg, ControlMessage, ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrIn, SockaddrStorage,
};

/// Datagrams per system call at most.
pub const BATCH_MAX: usize = 32;
/// Largest datagram received.
pub const DATAGRAM_MAX: usize = 65_536;

/// Reusable buffers for `recvmmsg`.
pub struct BatchRecv {
    headers: MultiHeaders<SockaddrStorage>,
    bufs: Vec<Vec<u8>>,
    lens: [usize; BATCH_MAX],
    /// The kernel's receive time of each datagram (CLOCK_REALTIME ns), when asked for.
    stamps: [Option<u64>; BATCH_MAX],
}

impl Default for BatchRecv {
    fn default() -> Self {
        BatchRecv::new(false)
    }
}

impl BatchRecv {
    /// Buffers for a batch; `timestamps` makes room for each datagram's
    /// kernel receive time (the socket must have [`enable_rx_timestamps`]).
    pub fn new(timestamps: bool) -> Self {
        let cmsg = timestamps.then(|| nix::cmsg_space!(nix::sys::time::TimeSpec));
        BatchRecv {
            headers: MultiHeaders::preallocate(BATCH_MAX, cmsg),
            bufs: (0..BATCH_MAX).map(|_| vec![0u8; DATAGRAM_MAX]).collect(),
            lens: [0; BATCH_MAX],
            stamps: [None; BATCH_MAX],
        }
    }

    /// Reads what is waiting on non-blocking `sock` (up to [`BATCH_MAX`]) and
    /// hands each datagram to `f`; returns how many there were.
    pub fn recv(&mut self, sock: &UdpSocket, mut f: impl FnMut(&mut [u8])) -> usize {
        self.recv_stamped(sock, |b, _| f(b))
    }

    /// As [`BatchRecv::recv`], with each datagram's kernel receive time
    /// (CLOCK_REALTIME ns) when the socket and buffers were set up for it.
    pub fn recv_stamped(&mut self, sock: &UdpSocket, mut f: impl FnMut(&mut [u8], Option<u64>)) -> usize {
        let n = {
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> =
                self.bufs.iter_mut().map(|b| [IoSliceMut::new(&mut b[..])]).collect();
            match recvmmsg(sock.as_raw_fd(), &mut self.headers, iovs.iter_mut(), MsgFlags::MSG_DONTWAIT, None) {
                Ok(res) => {
                    let mut n = 0;
                    for (i, m) in res.enumerate() {
                        self.lens[i] = m.bytes;
                        self.stamps[i] = m.cmsgs().ok().and_then(|mut c| {
                            c.find_map(|c| match c {
                                ControlMessageOwned::ScmTimestampns(t) => {
                                    Some(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
                                }
                                _ => None,
                            })
                        });
                        n = i + 1;
                    }
                    n
                }
                Err(_) => 0,
            }
        };
        for i in 0..n {
            let len = self.lens[i].min(DATAGRAM_MAX);
            f(&mut self.bufs[i][..len], self.stamps[i]);
        }
        n
    }
}

/// Asks the kernel to stamp every datagram `sock` receives (SO_TIMESTAMPNS):
/// the time it arrived, not when a busy or parked thread got to it.
pub fn enable_rx_timestamps(sock: &UdpSocket) -> std::io::Result<()> {
    nix::sys::socket::setsockopt(sock, nix::sys::socket::sockopt::ReceiveTimestampns, &true)
        .map_err(std::io::Error::from)
}

/// Reusable headers for `sendmmsg`.
pub struct BatchSend {
    headers: MultiHeaders<SockaddrIn>,
}

impl Default for BatchSend {
    fn default() -> Self {
        BatchSend { headers: MultiHeaders::preallocate(BATCH_MAX, None) }
    }
}

/// What a batched send did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    /// Datagrams the kernel took.
    pub sent: u64,
    /// Datagrams it refused (counted, never retried here).
    pub failed: u64,
    /// System calls made.
    pub calls: u64,
}

impl BatchSend {
    /// Sends each `(bytes, to)` pair, [`BATCH_MAX`] per call. IPv4 only (the
    /// overlay's addresses); others are counted failed.
    pub fn send<'b>(&mut self, sock: &UdpSocket, items: impl IntoIterator<Item = (&'b [u8], SocketAddr)>) -> Sent {
        let mut out = Sent::default();
        let mut slices: Vec<[IoSlice<'b>; 1]> = Vec::with_capacity(BATCH_MAX);
        let mut addrs: Vec<Option<SockaddrIn>> = Vec::with_capacity(BATCH_MAX);
        for (bytes, to) in items {
            let SocketAddr::V4(v4) = to else {
                out.failed += 1;
                continue;
            };
            slices.push([IoSlice::new(bytes)]);
            addrs.push(Some(SockaddrIn::from(v4)));
            if slices.len() == BATCH_MAX {
                self.flush(sock, &slices, &addrs, &mut out);
                slices.clear();
                addrs.clear();
            }
        }
        if !slices.is_empty() {
            self.flush(sock, &slices, &addrs, &mut out);
        }
        out
    }

    fn flush(&mut self, sock: &UdpSocket, slices: &[[IoSlice<'_>; 1]], addrs: &[Option<SockaddrIn>], out: &mut Sent) {
        let mut done = 0;
        let mut retries = 0;
        while done < slices.len() {
            out.calls += 1;
            let none: [ControlMessage<'_>; 0] = [];
            match sendmmsg(
                sock.as_raw_fd(),
                &mut self.headers,
                &slices[done..],
                &addrs[done..],
                none,
                MsgFlags::empty(),
            ) {
                Ok(r) => {
                    let k = r.count();
                    if k == 0 {
                        break;
                    }
                    done += k;
                    out.sent += k as u64;
                }
                Err(Errno::EINTR) if retries < 3 => retries += 1,
                Err(_) => {
                    // The first message of the rest failed (e.g. no route): skip it, keep the others.
                    done += 1;
                    out.failed += 1;
                }
            }
        }
    }
}

/// An IPv4 socket address, or an error naming what it was.
pub fn v4(addr: SocketAddr) -> std::io::Result<SocketAddrV4> {
    match addr {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(_) => Err(std::io::Error::other(format!("{addr}: the overlay runs on IPv4"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_buffer_to_many_sockets_and_back_in_batches() {
        let rx: Vec<UdpSocket> = (0..40).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let payload = b"fan-out".to_vec();
        let dests: Vec<SocketAddr> = rx.iter().map(|s| s.local_addr().unwrap()).collect();
        let mut bs = BatchSend::default();
        let r = bs.send(&tx, dests.iter().map(|&d| (&payload[..], d)));
        assert_eq!(r.sent, 40);
        assert_eq!(r.calls, 2, "40 copies in two calls of at most {BATCH_MAX}");
        for s in &rx {
            let mut b = [0u8; 16];
            let n = s.recv(&mut b).unwrap();
            assert_eq!(&b[..n], b"fan-out");
        }
        // Many datagrams to one socket, read in one call.
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        sink.set_nonblocking(true).unwrap();
        let msgs: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; usize::from(i) + 1]).collect();
        bs.send(&tx, msgs.iter().map(|m| (&m[..], sink.local_addr().unwrap())));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut br = BatchRecv::default();
        let mut got = Vec::new();
        assert_eq!(br.recv(&sink, |b| got.push(b.to_vec())), 10);
        assert_eq!(got, msgs);
        assert_eq!(br.recv(&sink, |_| {}), 0, "nothing left, no blocking");
    }
}

#[cfg(test)]
mod stamp_tests {
    use super::*;

    #[test]
    fn kernel_receive_stamps_come_per_datagram() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        enable_rx_timestamps(&rx).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let before = crate::clock::wall_ns();
        tx.send_to(b"a", to).unwrap();
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_micros(300) {}
        tx.send_to(b"b", to).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let read = crate::clock::wall_ns();
        let mut b = BatchRecv::new(true);
        let mut stamps = Vec::new();
        let n = b.recv_stamped(&rx, |_, s| stamps.push(s));
        assert_eq!(n, 2);
        let (a, c) = (stamps[0].expect("a stamp"), stamps[1].expect("a stamp"));
        // Each datagram has its own stamp. When they were taken, and even
        // their order, is not asserted: on loopback the kernel stamps in
        // softirq processing, which a loaded host defers — seen during the
        // full test suite: 3 µs apart for datagrams sent 300 µs apart, once
        // both stamped after the reader woke (the pending softirq ran inside
        // the receive call), and once the second stamped 5.4 ms before the
        // first (the first's processing deferred into the receive call).
        assert!(a >= before && c >= before && a != c, "{stamps:?} read at {read}");
    }
}
