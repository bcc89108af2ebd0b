//! The I/O back-ends side by side behind one call each: sending with
//! `sendmmsg(2)` ([`crate::batch::BatchSend`]) or io_uring
//! ([`crate::uring::UringSend`]), receiving with `recvmmsg(2)`
//! ([`crate::batch::BatchRecv`]) or posted io_uring receives
//! ([`crate::uring::UringRecv`]).

use std::net::{SocketAddr, UdpSocket};

use std::os::fd::{AsFd, BorrowedFd};

use crate::batch::{BatchRecv, BatchSend, Sent};
use crate::uring::{UringRecv, UringSend};

/// Which back-end sends a node's datagrams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// `sendmmsg(2)`, up to 32 datagrams per call.
    #[default]
    Udp,
    /// io_uring: one `SENDMSG` submission per datagram, up to 64 per
    /// `io_uring_enter(2)`; 32 `RECVMSG` operations kept posted.
    Uring,
}

/// A batched sender of either kind.
#[derive(Debug)]
pub enum SendPath {
    Mmsg(BatchSend),
    Uring(Box<UringSend>),
}

impl std::fmt::Debug for BatchSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchSend").finish_non_exhaustive()
    }
}

impl SendPath {
    /// The back-end's sender; io_uring fails where the kernel has none.
    pub fn new(b: Backend) -> std::io::Result<SendPath> {
        Ok(match b {
            Backend::Udp => SendPath::Mmsg(BatchSend::default()),
            Backend::Uring => SendPath::Uring(Box::new(UringSend::new()?)),
        })
    }

    /// Sends each `(bytes, to)` pair in batches.
    pub fn send<'b>(&mut self, sock: &UdpSocket, items: impl IntoIterator<Item = (&'b [u8], SocketAddr)>) -> Sent {
        match self {
            SendPath::Mmsg(b) => b.send(sock, items),
            SendPath::Uring(u) => u.send(sock, items),
        }
    }
}

/// A batched receiver of either kind.
#[derive(Debug)]
pub enum RecvPath {
    Mmsg(Box<BatchRecv>),
    Uring(Box<UringRecv>),
}

impl std::fmt::Debug for BatchRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchRecv").finish_non_exhaustive()
    }
}

impl RecvPath {
    /// The back-end's receiver for `sock`; `timestamps`: room for the
    /// kernel's receive stamps (the socket must have them enabled).
    pub fn new(b: Backend, sock: &UdpSocket, timestamps: bool) -> std::io::Result<RecvPath> {
        Ok(match b {
            Backend::Udp => RecvPath::Mmsg(Box::new(BatchRecv::new(timestamps))),
            Backend::Uring => RecvPath::Uring(Box::new(UringRecv::new(sock)?)),
        })
    }

    /// Hands what has arrived on `sock` to `f`, with its kernel stamp where
    /// there is one; never waits. Returns how many datagrams.
    pub fn recv_stamped(&mut self, sock: &UdpSocket, f: impl FnMut(&mut [u8], Option<u64>)) -> usize {
        match self {
            RecvPath::Mmsg(b) => b.recv_stamped(sock, f),
            RecvPath::Uring(u) => u.recv_stamped(f),
        }
    }

    /// What a loop waits on for input: the socket, or the ring that reads it.
    pub fn fd<'a>(&'a self, sock: &'a UdpSocket) -> BorrowedFd<'a> {
        match self {
            RecvPath::Mmsg(_) => sock.as_fd(),
            RecvPath::Uring(u) => u.fd(),
        }
    }
}
