//! The I/O back-ends side by side behind one call each: sending with
//! `sendmmsg(2)` ([`crate::batch::BatchSend`]) or io_uring
//! ([`crate::uring::UringSend`]), receiving with `recvmmsg(2)`
//! ([`crate::batch::BatchRecv`]) or io_uring receives (multishot,
//! [`crate::uring::UringMultiRecv`], else posted, [`crate::uring::UringRecv`]), or through a back-end made outside this
//! crate for an interface ([`External`]: AF_XDP, in fairfeed-xdp).

use std::net::{SocketAddr, UdpSocket};

use std::os::fd::{AsFd, BorrowedFd};

use crate::batch::{BatchRecv, BatchSend, Sent};
use crate::uring::{UringMultiRecv, UringRecv, UringSend};

/// Which back-end sends a node's datagrams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// `sendmmsg(2)`, up to 32 datagrams per call.
    #[default]
    Udp,
    /// io_uring: one `SENDMSG` submission per datagram, up to 64 per
    /// `io_uring_enter(2)`; one multishot `RECVMSG` (32 posted before Linux 6.0).
    Uring,
    /// AF_XDP: frames through a socket's rings on one interface queue. Made
    /// outside this crate (fairfeed-xdp) and handed in as an [`External`].
    AfXdp,
}

/// A back-end made outside this crate, sending (AF_XDP).
pub trait ExternalSend: Send {
    /// Sends each `(bytes, to)`; `sock` is the node's own socket, for what
    /// the back-end cannot send itself.
    fn send(&mut self, sock: &UdpSocket, items: &mut dyn Iterator<Item = (&[u8], SocketAddr)>) -> Sent;
}

/// A back-end made outside this crate, receiving (AF_XDP).
pub trait ExternalRecv: Send {
    /// Hands what has arrived to `f` (with a kernel stamp where there is
    /// one); never waits. Returns how many datagrams. `sock` is the node's
    /// own socket, for what the back-end leaves to the kernel.
    fn recv_stamped(&mut self, sock: &UdpSocket, f: &mut dyn FnMut(&mut [u8], Option<u64>)) -> usize;
    /// What a loop waits on for input.
    fn fd(&self) -> BorrowedFd<'_>;
    /// The back-end reads the node's socket too (some datagrams take the
    /// kernel's path): a loop must wait on that as well.
    fn reads_socket(&self) -> bool {
        false
    }
}

/// An external back-end's receiving and sending half.
pub type Halves = (Box<dyn ExternalRecv>, Box<dyn ExternalSend>);

/// Both halves of an external back-end, made once by the caller and taken
/// once by the node (its configuration is cloned; the back-end is not).
#[derive(Clone)]
pub struct External {
    /// The back-end's name, for logs and errors.
    pub name: &'static str,
    halves: std::sync::Arc<std::sync::Mutex<Option<Halves>>>,
}

impl std::fmt::Debug for External {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("External").field("name", &self.name).finish_non_exhaustive()
    }
}

impl External {
    /// Both halves, to be taken once ([`External::take`]).
    pub fn new(name: &'static str, recv: Box<dyn ExternalRecv>, send: Box<dyn ExternalSend>) -> External {
        External { name, halves: std::sync::Arc::new(std::sync::Mutex::new(Some((recv, send)))) }
    }

    /// The halves, the first time only.
    pub fn take(&self) -> Option<Halves> {
        self.halves.lock().ok()?.take()
    }
}

fn external_only(b: Backend) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!("the {b:?} back-end is made for an interface by the caller (fairfeed-xdp), not here"),
    )
}

/// A batched sender of either kind.
#[derive(Debug)]
pub enum SendPath {
    /// `sendmmsg(2)`.
    Mmsg(BatchSend),
    /// io_uring.
    Uring(Box<UringSend>),
    /// A back-end the caller made (AF_XDP).
    External(Box<dyn ExternalSend>),
}

impl std::fmt::Debug for dyn ExternalSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExternalSend")
    }
}

impl std::fmt::Debug for dyn ExternalRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExternalRecv")
    }
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
            Backend::AfXdp => return Err(external_only(b)),
        })
    }

    /// Sends each `(bytes, to)` pair in batches.
    pub fn send<'b>(&mut self, sock: &UdpSocket, items: impl IntoIterator<Item = (&'b [u8], SocketAddr)>) -> Sent {
        match self {
            SendPath::Mmsg(b) => b.send(sock, items),
            SendPath::Uring(u) => u.send(sock, items),
            SendPath::External(e) => e.send(sock, &mut items.into_iter()),
        }
    }
}

/// A batched receiver of either kind.
#[derive(Debug)]
pub enum RecvPath {
    /// `recvmmsg(2)`.
    Mmsg(Box<BatchRecv>),
    /// io_uring, one receive per buffer.
    Uring(Box<UringRecv>),
    /// io_uring multishot receive into a provided-buffer ring.
    UringMulti(Box<UringMultiRecv>),
    /// A back-end the caller made (AF_XDP).
    External(Box<dyn ExternalRecv>),
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
            // One multishot receive where the kernel has it (6.0), else 32 posted.
            Backend::Uring => match UringMultiRecv::new(sock) {
                Ok(m) => RecvPath::UringMulti(Box::new(m)),
                Err(_) => RecvPath::Uring(Box::new(UringRecv::new(sock)?)),
            },
            Backend::AfXdp => return Err(external_only(b)),
        })
    }

    /// Hands what has arrived on `sock` to `f`, with its kernel stamp where
    /// there is one; never waits. Returns how many datagrams.
    pub fn recv_stamped(&mut self, sock: &UdpSocket, f: impl FnMut(&mut [u8], Option<u64>)) -> usize {
        match self {
            RecvPath::Mmsg(b) => b.recv_stamped(sock, f),
            RecvPath::Uring(u) => u.recv_stamped(f),
            RecvPath::UringMulti(u) => u.recv_stamped(f),
            RecvPath::External(e) => {
                let mut f = f;
                e.recv_stamped(sock, &mut f)
            }
        }
    }

    /// The loop must also wait on the node's socket, beside [`RecvPath::fd`].
    pub fn waits_on_socket_too(&self) -> bool {
        matches!(self, RecvPath::External(e) if e.reads_socket())
    }

    /// What a loop waits on for input: the socket, or the ring that reads it.
    pub fn fd<'a>(&'a self, sock: &'a UdpSocket) -> BorrowedFd<'a> {
        match self {
            RecvPath::Mmsg(_) => sock.as_fd(),
            RecvPath::Uring(u) => u.fd(),
            RecvPath::UringMulti(u) => u.fd(),
            RecvPath::External(e) => e.fd(),
        }
    }
}
