//! The send back-ends side by side behind one call: `sendmmsg(2)`
//! ([`crate::batch::BatchSend`]) or io_uring ([`crate::uring::UringSend`]).

use std::net::{SocketAddr, UdpSocket};

use crate::batch::{BatchSend, Sent};
use crate::uring::UringSend;

/// Which back-end sends a node's datagrams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// `sendmmsg(2)`, up to 32 datagrams per call.
    #[default]
    Udp,
    /// io_uring: one `SENDMSG` submission per datagram, up to 64 per `io_uring_enter(2)`.
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
