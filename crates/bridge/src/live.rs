//! `fairfeed bridge run` as an agent ([`BridgeAgent`], on
//! `fairfeed_io::agent`'s runner): the feed's UDP socket in, optionally
//! through a gap filler asking a retransmission server for what the feed
//! lost, into the [`Bridge`]; its timers are the filler's window, the
//! counters' publication for metrics, the periodic report and the checks
//! for failed publications and kernel drops.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

use fairfeed_io::agent::{Agent, Turn};
use fairfeed_io::batch::BatchRecv;
use fairfeed_io::counters::{Board, BoardError, Poster};
use fairfeed_net::arb::fill::{FillConfig, FillError, GapFiller};

use crate::publish::{wall_ns, Bridge, BridgeReport};

/// Receive buffer asked for on the feed's socket: bursts wait here while the
/// router and publisher catch up (the docs' replay at 20× peaks at 80,000
/// packets/s; the kernel's default 208 KiB held ~1,000 and dropped 5 bursts).
pub const BRIDGE_RECV_BUFFER: usize = 16 << 20;
/// How often failed publications and kernel drops are looked for, ns.
const CHECK_INTERVAL_NS: u64 = 1_000_000_000;
/// `recvmmsg` batches read per turn at most.
const BATCHES_PER_TURN: usize = 64;
/// How long the filler waits before asking for a gap, ns.
const FILL_GRACE_NS: u64 = 1_000_000;

/// What the live bridge listens to and how it reports.
#[derive(Debug, Clone)]
pub struct LiveConfig {
    pub listen: SocketAddr,
    /// Fill the feed's gaps from this retransmission server, holding a
    /// message behind a gap at most `hold_ms`.
    pub fill: Option<(SocketAddr, u64)>,
    /// Stop after this long (None: when the runner is stopped).
    pub max_ns: Option<u64>,
    /// Log the report this often.
    pub stats_interval_ns: Option<u64>,
    /// Post the report to this board (as [`BRIDGE_PART`]) for a metrics endpoint.
    pub publish: Option<std::sync::Arc<Board>>,
}

/// Why the live bridge could not start.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("binding {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error(transparent)]
    Fill(#[from] FillError),
    #[error(transparent)]
    Board(#[from] BoardError),
}

/// The bridge's part on its counters board.
pub const BRIDGE_PART: &str = "bridge";

/// Datagrams the kernel dropped on the feed's socket since the bridge
/// started (its buffer full: the bridge fell behind), warned as they grow.
struct KernelDrops {
    at_start: u64,
    seen: u64,
}

impl KernelDrops {
    /// Reads the count, warns when it grew; returns it.
    fn check(&mut self, sock: &UdpSocket, listen: SocketAddr) -> u64 {
        let now = fairfeed_io::socket::udp_drops(sock).map_or(self.seen, |d| d.saturating_sub(self.at_start));
        if now > self.seen {
            tracing::warn!(
                kernel_drops = now,
                "bridge: the kernel dropped {now} datagrams on {listen} so far: its receive buffer was full (the feed \
                 came faster than the bridge published); they reach subscribers as feed gaps"
            );
            self.seen = now;
        }
        self.seen
    }
}

/// The feed's socket, bound non-blocking with a large buffer (warned if the kernel gives less).
fn bind_feed(listen: SocketAddr) -> Result<UdpSocket, LiveError> {
    let sock = fairfeed_io::socket::bind_udp(listen, BRIDGE_RECV_BUFFER).map_err(|e| LiveError::Bind(listen, e))?;
    let granted = fairfeed_io::socket::recv_buffer_size(&sock).unwrap_or(0);
    if granted < BRIDGE_RECV_BUFFER {
        tracing::warn!(
            granted,
            "bridge: the kernel gave {} a {} KiB receive buffer of the {} KiB asked (net.core.rmem_max); \
             bursts faster than the bridge publishes will be dropped by the kernel and counted as kernel_drops \
             (sysctl -w net.core.rmem_max=16777216, or run with CAP_NET_ADMIN)",
            listen,
            granted >> 10,
            BRIDGE_RECV_BUFFER >> 10
        );
    }
    Ok(sock)
}

/// See the module docs.
pub struct BridgeAgent {
    cfg: LiveConfig,
    sock: UdpSocket,
    batch: BatchRecv,
    bridge: Bridge,
    filler: Option<GapFiller>,
    drops: KernelDrops,
    started_ns: u64,
    poster: Option<Poster>,
    next_stats: u64,
    next_check: u64,
    reported_errors: u64,
}

impl BridgeAgent {
    /// Binds the feed's socket (and the filler's) in front of `bridge`.
    pub fn new(cfg: LiveConfig, bridge: Bridge) -> Result<BridgeAgent, LiveError> {
        let sock = bind_feed(cfg.listen)?;
        let filler = match cfg.fill {
            None => None,
            Some((server, hold_ms)) => Some(GapFiller::new(FillConfig {
                server,
                hold_ns: hold_ms * 1_000_000,
                grace_ns: FILL_GRACE_NS,
                start: fairfeed_arb::Start::First,
            })?),
        };
        let drops = KernelDrops { at_start: fairfeed_io::socket::udp_drops(&sock).unwrap_or(0), seen: 0 };
        let now = wall_ns();
        let poster = cfg.publish.as_ref().map(|b| b.poster(BRIDGE_PART)).transpose()?;
        Ok(BridgeAgent {
            next_stats: cfg.stats_interval_ns.map_or(u64::MAX, |i| now + i),
            cfg,
            sock,
            batch: BatchRecv::default(),
            bridge,
            filler,
            drops,
            started_ns: now,
            poster,
            next_check: now + CHECK_INTERVAL_NS,
            reported_errors: 0,
        })
    }

    /// The bridge's report now.
    pub fn report(&self) -> BridgeReport {
        self.bridge.report()
    }

    /// Gives up what the filler still holds, drains the publisher (at most
    /// `limit`), and returns the report as JSON with the kernel drops and
    /// the filler's counters.
    pub fn finish(mut self, limit: std::time::Duration) -> (BridgeReport, serde_json::Value) {
        let fill = self.filler.as_mut().map(|f| {
            let bridge = &mut self.bridge;
            f.give_up(&mut |q| bridge.handle_packet(q, wall_ns()));
            f.counters()
        });
        let drops = self.drops.check(&self.sock, self.cfg.listen);
        let r = self.bridge.finish(limit);
        let mut v = serde_json::to_value(&r).unwrap_or_default();
        v["kernel_drops"] = drops.into();
        if let Some(f) = fill {
            v["fill"] = f;
        }
        (r, v)
    }

    /// The periodic work due at `now`: publication, the report in the log, the checks.
    fn timers(&mut self, now: u64) {
        if let Some(p) = self.poster.as_mut().and_then(|p| p.due(now).then_some(p)) {
            p.post(serde_json::to_value(self.bridge.report()).unwrap_or_default(), Vec::new());
        }
        if now >= self.next_stats {
            let r = serde_json::to_string(&self.bridge.report()).unwrap_or_default();
            tracing::info!(report = %r, "bridge: {r}");
            self.next_stats = self.cfg.stats_interval_ns.map_or(u64::MAX, |i| now + i);
        }
        if now >= self.next_check {
            self.drops.check(&self.sock, self.cfg.listen);
            let errors = self.bridge.report().publish_errors;
            if errors > self.reported_errors {
                tracing::warn!(
                    publish_errors = errors,
                    "bridge: {errors} publications failed so far (is the broker up, are the subjects valid?)"
                );
                self.reported_errors = errors;
            }
            self.next_check = now + CHECK_INTERVAL_NS;
        }
    }
}

impl Agent for BridgeAgent {
    fn role(&self) -> &'static str {
        "bridge"
    }

    fn do_work(&mut self, now: u64, turn: Turn) -> usize {
        let mut work = 0;
        let (bridge, filler) = (&mut self.bridge, &mut self.filler);
        if turn == Turn::All {
            // A batch per call, until the socket is empty or a turn's share
            // is read (a flood must not starve the filler and the timers).
            for _ in 0..BATCHES_PER_TURN {
                let got = self.batch.recv(&self.sock, |p| match filler {
                    Some(f) => f.packet(wall_ns(), p, &mut |q| bridge.handle_packet(q, wall_ns())),
                    None => bridge.handle_packet(p, wall_ns()),
                });
                if got == 0 {
                    break;
                }
                work += got;
            }
        }
        if let Some(f) = filler {
            work += f.service(wall_ns(), &mut |q| bridge.handle_packet(q, wall_ns()));
        }
        self.timers(now);
        work
    }

    fn next_due(&self) -> u64 {
        let fill = self.filler.as_ref().and_then(GapFiller::next_timeout).unwrap_or(u64::MAX);
        let publish = self.poster.as_ref().map_or(u64::MAX, Poster::next_ns);
        let end = self.cfg.max_ns.map_or(u64::MAX, |m| self.started_ns + m);
        fill.min(publish).min(self.next_stats).min(self.next_check).min(end)
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut v = vec![self.sock.as_fd()];
        v.extend(self.filler.as_ref().map(GapFiller::fd));
        v
    }

    fn is_done(&self) -> bool {
        self.cfg.max_ns.is_some_and(|m| wall_ns() >= self.started_ns + m)
    }
}
