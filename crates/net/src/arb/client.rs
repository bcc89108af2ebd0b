//! A MoldUDP64 retransmission client's socket: requests out, answers in,
//! and the server's return-routability challenge answered on the way
//! ([`fairfeed_arb::retransmit::Requester`]) — so every fairfeed shell that
//! fills gaps (the live arbitrator, a receiver's delivery, the bridge)
//! speaks to a server that bounds reflection.
//!
//! The socket is connected to the server: datagrams from anywhere else are
//! dropped by the kernel, so nobody else can answer in the server's name.

use std::cell::Cell;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

use fairfeed_arb::retransmit::{Requester, REQUEST_WITH_COOKIE_LEN};
use fairfeed_wire::moldudp64::RequestRepr;

/// Receive buffer asked for on the client's socket (answers come in bursts after a gap).
pub const CLIENT_RECV_BUFFER_BYTES: usize = 4 << 20;

/// One server's client. `&self` throughout (the cookie state is a `Cell`),
/// so an arbitrator's sink can request while the shell reads answers.
#[derive(Debug)]
pub struct RetransmitClient {
    sock: UdpSocket,
    requester: Cell<Requester>,
    sent: Cell<u64>,
    send_errors: Cell<u64>,
}

impl RetransmitClient {
    /// A client of `server`, on a fresh socket of the server's address family.
    pub fn new(server: SocketAddr) -> std::io::Result<Self> {
        let any: SocketAddr = if server.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
        let sock = fairfeed_io::socket::bind_udp(any, CLIENT_RECV_BUFFER_BYTES)?;
        sock.connect(server)?;
        Ok(RetransmitClient {
            sock,
            requester: Cell::new(Requester::default()),
            sent: Cell::new(0),
            send_errors: Cell::new(0),
        })
    }

    /// Asks for `r` (with the server's cookie once known).
    pub fn request(&self, r: RequestRepr) -> bool {
        let mut q = self.requester.get();
        let mut b = [0u8; REQUEST_WITH_COOKIE_LEN];
        let len = q.request(r, &mut b);
        self.requester.set(q);
        self.send(&b[..len])
    }

    fn send(&self, b: &[u8]) -> bool {
        let ok = !b.is_empty() && self.sock.send(b).is_ok();
        if ok {
            self.sent.set(self.sent.get() + 1);
        } else {
            self.send_errors.set(self.send_errors.get() + 1);
        }
        ok
    }

    /// The next answer in `buf` (its length), or `None` when none is
    /// waiting; a challenge on the way is answered by asking again.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        loop {
            let n = self.sock.recv(buf).ok()?;
            let mut q = self.requester.get();
            let mut b = [0u8; REQUEST_WITH_COOKIE_LEN];
            match q.on_challenge(&buf[..n], &mut b) {
                None => return Some(n),
                Some(len) => {
                    self.requester.set(q);
                    self.send(&b[..len]);
                }
            }
        }
    }

    /// Requests sent, failed sends, and challenges answered.
    pub fn counts(&self) -> (u64, u64, u64) {
        (self.sent.get(), self.send_errors.get(), self.requester.get().challenges)
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}
