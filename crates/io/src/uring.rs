//! io_uring as a send back-end: a batch of `(bytes, address)` pairs becomes
//! one `IORING_OP_SENDMSG` submission per datagram, submitted together with
//! one `io_uring_enter(2)` that also waits for their completions — the same
//! contract as [`crate::batch::BatchSend`], so a shell can take either
//! ([`crate::send::SendPath`]).
//!
//! The kernel reads each message header, its iovec and its address from
//! memory this type owns, and the payload from the caller's buffer, after
//! `push` and before the completion: [`UringSend::send`] waits for every
//! completion of a batch before it returns, and nothing here moves while a
//! batch is in flight. That is the whole of the `unsafe` argument.
#![allow(unsafe_code)]

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use io_uring::{opcode, types, IoUring};

use crate::batch::Sent;

/// Datagrams per submission at most (and the ring's size).
pub const URING_BATCH_MAX: usize = 64;

/// A ring and the per-datagram headers it sends from.
pub struct UringSend {
    ring: IoUring,
    addrs: Box<[libc::sockaddr_in; URING_BATCH_MAX]>,
    iovs: Box<[libc::iovec; URING_BATCH_MAX]>,
    hdrs: Box<[libc::msghdr; URING_BATCH_MAX]>,
}

impl std::fmt::Debug for UringSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringSend").finish_non_exhaustive()
    }
}

fn sockaddr(a: std::net::SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
        sin_zero: [0; 8],
    }
}

impl UringSend {
    /// A ring of [`URING_BATCH_MAX`] entries; fails where the kernel has no
    /// io_uring (or it is disabled: `kernel.io_uring_disabled`).
    pub fn new() -> std::io::Result<UringSend> {
        let ring = IoUring::new(URING_BATCH_MAX as u32)?;
        // SAFETY: all-zero is a valid value of these plain C structs.
        let zero_hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        Ok(UringSend {
            ring,
            addrs: Box::new(
                [sockaddr(std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0)); URING_BATCH_MAX],
            ),
            iovs: Box::new([libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; URING_BATCH_MAX]),
            hdrs: Box::new([zero_hdr; URING_BATCH_MAX]),
        })
    }

    /// Sends each `(bytes, to)` pair, [`URING_BATCH_MAX`] per submission; IPv4
    /// only (others are counted failed). A datagram the socket refuses
    /// (`EAGAIN`: its buffer full) is counted failed, as with `sendmmsg`.
    pub fn send<'b>(&mut self, sock: &UdpSocket, items: impl IntoIterator<Item = (&'b [u8], SocketAddr)>) -> Sent {
        let mut out = Sent::default();
        let mut n = 0;
        for (bytes, to) in items {
            let SocketAddr::V4(v4) = to else {
                out.failed += 1;
                continue;
            };
            self.addrs[n] = sockaddr(v4);
            self.iovs[n] = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
            let h = &mut self.hdrs[n];
            h.msg_name = (&raw mut self.addrs[n]).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_iov = &raw mut self.iovs[n];
            h.msg_iovlen = 1;
            n += 1;
            if n == URING_BATCH_MAX {
                self.flush(sock, n, &mut out);
                n = 0;
            }
        }
        if n > 0 {
            self.flush(sock, n, &mut out);
        }
        out
    }

    fn flush(&mut self, sock: &UdpSocket, n: usize, out: &mut Sent) {
        let fd = types::Fd(sock.as_raw_fd());
        let mut pushed = 0;
        {
            let mut sq = self.ring.submission();
            for i in 0..n {
                let e = opcode::SendMsg::new(fd, &raw const self.hdrs[i]).build().user_data(i as u64);
                // SAFETY: the header, its iovec, its address and the payload
                // stay where they are until the completions are reaped below.
                if unsafe { sq.push(&e) }.is_err() {
                    break;
                }
                pushed += 1;
            }
        }
        out.failed += (n - pushed) as u64;
        if pushed == 0 {
            return;
        }
        out.calls += 1;
        let mut done = 0;
        while done < pushed {
            if let Err(e) = self.ring.submit_and_wait(pushed - done) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // The ring is broken: wait for nothing more, count the rest failed.
                out.failed += (pushed - done) as u64;
                return;
            }
            for c in self.ring.completion() {
                done += 1;
                if c.result() >= 0 {
                    out.sent += 1;
                } else {
                    out.failed += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_reaches_every_socket_once_and_refusals_are_counted() {
        let Ok(mut u) = UringSend::new() else {
            eprintln!("SKIPPED: no io_uring on this kernel");
            return;
        };
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let rx: Vec<UdpSocket> = (0..3).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        let to: Vec<SocketAddr> = rx.iter().map(|s| s.local_addr().unwrap()).collect();
        let payloads: Vec<Vec<u8>> = (0..150u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        let items = payloads.iter().enumerate().map(|(i, p)| (&p[..], to[i % 3]));
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        let s = u.send(&tx, items.chain([(&payloads[0][..], v6)]));
        assert_eq!((s.sent, s.failed), (150, 1));
        assert_eq!(s.calls, 3, "64 + 64 + 22 datagrams");
        for (k, r) in rx.iter().enumerate() {
            r.set_read_timeout(Some(std::time::Duration::from_secs(1))).unwrap();
            let mut buf = [0u8; 512];
            for i in (k..150).step_by(3) {
                let n = r.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], &payloads[i][..], "socket {k}, datagram {i}, in order");
            }
        }
    }
}
