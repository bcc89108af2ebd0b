//! A node under a controller (`--controller ADDR`): it registers before it
//! starts ([`join`]: the first view is its topology), then keeps its
//! membership from the node's own loop (`Membership`): a heartbeat every
//! interval, and each newer view put in force at once (the node's links and
//! the addresses of the nodes they name). The logic is
//! [`fairfeed_tree::controller::MemberClient`]; this is its shell.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use fairfeed_tree::auth::Auth;
use fairfeed_tree::controller::{MemberClient, MemberConfig, Told};
use fairfeed_tree::membership::{Assign, RefuseReason};

use super::{wall_ns, SOCKET_RECV_BUFFER};
use fairfeed_io::socket::bind_udp;

/// Membership datagrams a node keeps from one turn's reads at most (the
/// controller sends a handful; the rest are counted and dropped).
pub const INBOX_MAX: usize = 16;
/// Node ids a view may name at most (the node's address table is indexed
/// by id): the controller's any-ids and their room above.
pub const IDS_MAX: usize = fairfeed_tree::controller::ANY_ID_BASE as usize + 2 * fairfeed_tree::controller::MEMBERS_MAX;

/// Why a node could not join.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("binding {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error(
        "no controller at {} gave a view within {waited:?} (is one running, with the same tree key?{refused})",
        list(controllers)
    )]
    NoAnswer { controllers: Vec<SocketAddr>, waited: Duration, refused: String },
    #[error("the controller at {0} already has a sender")]
    SenderTaken(SocketAddr),
    #[error("no controller address given")]
    NoController,
    #[error("stopped while joining")]
    Stopped,
    #[error("sending to the controller at {0}: {1}")]
    Send(SocketAddr, std::io::Error),
}

/// What joining left for the node to start from.
pub struct Joined {
    /// Every controller (one leads; the others answer once they do).
    pub controllers: Vec<SocketAddr>,
    /// The first view: the node's topology at start.
    pub view: Assign,
    pub(crate) client: Mutex<Option<MemberClient>>,
    pub(crate) sock: Mutex<Option<UdpSocket>>,
}

impl std::fmt::Debug for Joined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joined").field("controllers", &self.controllers).field("view", &self.view).finish()
    }
}

fn list(a: &[SocketAddr]) -> String {
    a.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Binds `bind`, registers with the controllers at `controllers` (all of
/// them: whichever leads answers), and waits up to `wait` for the first
/// view (refusals that say "later" are waited out and logged).
pub fn join(
    controllers: &[SocketAddr],
    bind: SocketAddr,
    cfg: MemberConfig,
    auth: Option<Auth>,
    wait: Duration,
    stop: &AtomicBool,
) -> Result<Joined, JoinError> {
    if controllers.is_empty() {
        return Err(JoinError::NoController);
    }
    let sock = bind_udp(bind, SOCKET_RECV_BUFFER).map_err(|e| JoinError::Bind(bind, e))?;
    sock.set_nonblocking(false).map_err(|e| JoinError::Bind(bind, e))?;
    sock.set_read_timeout(Some(Duration::from_millis(5))).map_err(|e| JoinError::Bind(bind, e))?;
    let mut client = MemberClient::new(cfg, auth);
    let start = std::time::Instant::now();
    let mut buf = vec![0u8; 65_536];
    let mut refused = String::new();
    while start.elapsed() < wait {
        if stop.load(Ordering::Relaxed) {
            return Err(JoinError::Stopped);
        }
        let now = wall_ns();
        client.handle_timeout(now);
        while let Some(b) = client.poll_transmit() {
            for &c in controllers {
                sock.send_to(&b, c).map_err(|e| JoinError::Send(c, e))?;
            }
        }
        let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
        if !controllers.contains(&from) {
            continue;
        }
        match client.handle_packet(wall_ns(), &buf[..n]) {
            Some(Told::View(view)) => {
                sock.set_read_timeout(None).map_err(|e| JoinError::Bind(bind, e))?;
                sock.set_nonblocking(true).map_err(|e| JoinError::Bind(bind, e))?;
                return Ok(Joined {
                    controllers: controllers.to_vec(),
                    view,
                    client: Mutex::new(Some(client)),
                    sock: Mutex::new(Some(sock)),
                });
            }
            Some(Told::Refused { reason: RefuseReason::SenderTaken, .. }) => return Err(JoinError::SenderTaken(from)),
            Some(Told::Refused { reason, retry_after_ns }) => {
                let said = format!("; refused: {}, retry in {} ms", reason.name(), retry_after_ns / 1_000_000);
                if said != refused {
                    tracing::warn!(reason = reason.name(), "the controller at {from} refused{said}");
                    refused = said;
                }
            }
            None => {}
        }
    }
    Err(JoinError::NoAnswer { controllers: controllers.to_vec(), waited: wait, refused })
}

/// The membership a running node keeps.
pub(crate) struct Membership {
    client: MemberClient,
    controllers: Vec<SocketAddr>,
    /// Membership datagrams read this turn.
    pub inbox: Vec<Vec<u8>>,
    pub inbox_full: u64,
    pub views: u64,
    pub send_errors: u64,
    /// The refusal last logged, and when (a burst of answers to queued
    /// heartbeats — after a partition heals — is logged once, not per answer).
    warned: Option<(RefuseReason, u64)>,
}

/// A repeated refusal is logged again after this long at most.
const REFUSAL_LOG_EVERY_NS: u64 = 1_000_000_000;

impl Membership {
    /// The client `joined` left (a node takes it once).
    pub fn take(joined: &Joined) -> Option<(Membership, Option<UdpSocket>)> {
        let client = joined.client.lock().ok()?.take()?;
        let sock = joined.sock.lock().ok()?.take();
        let m = Membership {
            client,
            controllers: joined.controllers.clone(),
            inbox: Vec::new(),
            inbox_full: 0,
            views: 0,
            send_errors: 0,
            warned: None,
        };
        Some((m, sock))
    }

    /// Its counters, as they go into the node's report.
    pub fn counters(&self) -> serde_json::Value {
        serde_json::json!({
            "version": self.client.version(),
            "views": self.views,
            "inbox_full": self.inbox_full,
            "send_errors": self.send_errors,
            "client": self.client.stats,
        })
    }

    /// Keeps a membership datagram for this turn.
    pub fn keep(&mut self, b: &[u8]) {
        if self.inbox.len() < INBOX_MAX {
            self.inbox.push(b.to_vec());
        } else {
            self.inbox_full += 1;
        }
    }

    /// Handles what came in and what is due at wall time `now`; returns the newest view, if any.
    pub fn turn(&mut self, now: u64, sock: &UdpSocket) -> Option<Assign> {
        let mut newest = None;
        for b in std::mem::take(&mut self.inbox) {
            match self.client.handle_packet(now, &b) {
                Some(Told::View(v)) => {
                    self.views += 1;
                    newest = Some(v);
                }
                Some(Told::Refused { reason, retry_after_ns }) => {
                    if self.warned.is_some_and(|(r, at)| r == reason && now < at + REFUSAL_LOG_EVERY_NS) {
                        continue;
                    }
                    self.warned = Some((reason, now));
                    tracing::warn!(
                        reason = reason.name(),
                        "the controller ({}) refused this node ({}); asking again in {} ms",
                        list(&self.controllers),
                        reason.name(),
                        retry_after_ns / 1_000_000
                    );
                }
                None => {}
            }
        }
        if self.client.next_timeout().is_some_and(|t| t <= now) {
            self.client.handle_timeout(now);
        }
        self.flush(sock);
        newest
    }

    /// Says goodbye to the controller.
    pub fn leave(&mut self, sock: &UdpSocket) {
        self.client.leave(wall_ns());
        self.flush(sock);
    }

    fn flush(&mut self, sock: &UdpSocket) {
        while let Some(b) = self.client.poll_transmit() {
            for &c in &self.controllers {
                self.send_errors += u64::from(sock.send_to(&b, c).is_err());
            }
        }
    }

    pub fn next_due(&self) -> u64 {
        self.client.next_timeout().unwrap_or(u64::MAX)
    }
}
