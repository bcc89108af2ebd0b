//! One node of a fair multicast tree per process — `fairfeed sender`,
//! `fairfeed proxy`, `fairfeed receiver` — so a deployment is one process per
//! VM, each reading the planner's topology file (with addresses) and its own id.
//!
//! The node is the sans-IO state machine the simulator drives; this shell
//! owns the sockets, the clock (CLOCK_REALTIME, the clock PTP or chrony
//! synchronizes across hosts), the threads and the timers. A node is a
//! composition of agents (`fairfeed_io::agent`, Aeron's model;
//! [`NodeAgents`]): the data path ([`NodeAgent`]: receive, the state
//! machine, timers, releases, and the send side inline or as an
//! `egress::EgressAgent`), a sender's [`FeedAgent`], a receiver's
//! [`DeliveryAgent`], and a [`ControlAgent`] for `stat`, `stop` and metrics —
//! joined only by bounded mailboxes, a board for their counters and when to
//! stop ([`Life`]), so where they run is configuration ([`Threading`]):
//! - receive in `recvmmsg` batches, send in `sendmmsg` batches (one buffer,
//!   many destinations, no copy per destination);
//! - threading as placement: data path, feed and delivery on one thread; the
//!   send side on its own ([`Threading::Split`], as Jasper decouples Rx and
//!   Tx); every agent on its own ([`Threading::Dedicated`]); the control
//!   agent always on its own, parked; `fairfeed demo` runs every agent of a
//!   whole tree on one thread, on dilated time;
//! - idle strategy: spin (busy polling) or park in `poll(2)`; releases are
//!   always approached by spinning on the clock for the last
//!   [`SPIN_AHEAD_NS`];
//! - optional link emulation (the simulator's latency models) on what the
//!   node sends, for laptops and CI without netem;
//! - receivers hand released messages to a callback and, for unmodified ITCH
//!   applications, send each as a plain MoldUDP64 datagram to a local port at
//!   the release instant — optionally through a one-line arbitrator that asks
//!   the sender's retransmission server for whatever the tree lost;
//! - named counters and latency histograms, readable from outside through a
//!   control socket (`fairfeed stat`) and written as JSON at exit.

mod compose;
mod control;
mod delivery;
mod egress;
mod feed;
pub mod keys;
pub mod membership;
mod node;
mod releases;
mod snapshots;

pub use compose::{run_agent, NodeAgents, MAILBOX_CAPACITY};
pub use control::{
    report, ControlAgent, ControlStats, Life, NodeBoard, NodePoster, TreePart, ANSWER_WAIT_NS, PENDING_MAX,
};
pub use delivery::{Delivered, DeliveryAgent};
pub use egress::{Copy, Tap, TxCounters, DELAY_QUEUE_MAX, TAP_PATH_LINKS_MAX};
pub use fairfeed_io::mailbox::{mailbox, Incoming, Outgoing};
pub use feed::FeedAgent;
pub use node::{AgentError, Links, NodeAgent};
pub use releases::{parse_page, Release, ReleaseLog, RELEASES_PER_ANSWER, RELEASE_LOG_MAX};
pub use snapshots::{SnapshotAgent, SNAPSHOT_MAILBOX_CAPACITY};

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use fairfeed_model::LinkModel;
use fairfeed_tree::auth::Auth;
use fairfeed_tree::node::{DeadlineRule, NodeConfig};
use fairfeed_tree::plan::Topology;
use serde::Serialize;

use crate::tuning::Tuning;
use fairfeed_io::idle::IdleStrategy;

/// A release this close is waited for by spinning on the clock.
pub const SPIN_AHEAD_NS: u64 = 50_000;
/// Copies the node may queue for its send thread (split threading).
pub const RING_CAPACITY: usize = 16_384;
/// Release rows a receiver keeps for its log at most.
pub const LOG_ROWS_MAX: usize = 10_000_000;
/// Receive buffer of a node's socket.
pub const SOCKET_RECV_BUFFER: usize = 8 << 20;

/// How a node uses threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
pub enum Threading {
    /// Receive, decide and send on one thread.
    #[default]
    One,
    /// Receive and decide on one thread, send on another; a bounded SPSC ring between.
    Split,
    /// Every agent of the node on a thread of its own: receive and decide,
    /// send, a sender's feed, a receiver's delivery (and control, which is
    /// on its own thread in every mode).
    Dedicated,
}

/// The time a node runs on: the wall clock (CLOCK_REALTIME), or emulated
/// time `dilation` × slower than it (the demo's time dilation): true time
/// `origin_ns` at wall time `origin_wall_ns`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeBase {
    pub origin_wall_ns: u64,
    pub origin_ns: u64,
    pub dilation: f64,
}

impl TimeBase {
    /// Wall-clock time itself.
    pub const WALL: TimeBase = TimeBase { origin_wall_ns: 0, origin_ns: 0, dilation: 1.0 };

    fn is_wall(&self) -> bool {
        *self == TimeBase::WALL
    }

    /// True (emulated) time at wall time `wall`.
    pub fn at(&self, wall: u64) -> u64 {
        if self.is_wall() {
            return wall;
        }
        self.origin_ns + (wall.saturating_sub(self.origin_wall_ns) as f64 / self.dilation) as u64
    }

    /// Wall time at true (emulated) time `t` (the first ns at or after it).
    pub fn wall_at(&self, t: u64) -> u64 {
        if self.is_wall() || t == u64::MAX {
            return t;
        }
        self.origin_wall_ns + (t.saturating_sub(self.origin_ns) as f64 * self.dilation).ceil() as u64
    }
}

/// Wall time at which a clock skewed by `skew` on time base `time` reads
/// `local` (the first from now on: after a backward step readings repeat,
/// and a timer must wait for the clock to get there again).
pub fn wall_at_local(skew: &fairfeed_clock::skew::Skew, time: &TimeBase, local: u64) -> u64 {
    let t = if skew.step_ns == 0 { skew.true_at(local) } else { skew.true_at_from(local, time.at(wall_ns())) };
    time.wall_at(t)
}

/// When a receiver released a message: wall clock, true time (the time
/// base's; the wall clock unless dilated) and the receiver's own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseAt {
    pub wall_ns: u64,
    pub true_ns: u64,
    pub local_ns: u64,
    /// The message's deadline as a wall time (after `wall_ns` when the
    /// node releases ahead of it for a last hop).
    pub deadline_wall_ns: u64,
}

/// What the sender sends.
#[derive(Debug, Clone, Default)]
pub struct SenderJob {
    /// MoldUDP64 packets, sent once each, in order.
    pub payloads: Vec<Vec<u8>>,
    pub rate_per_s: f64,
    /// Wait this long after start-up before the first packet (let the tree come up).
    pub start_delay_ns: u64,
    /// Keep serving reports and retransmissions this long after the last packet.
    pub linger_ns: u64,
    /// Serve MoldUDP64 retransmission requests from a journal of what was sent.
    pub retransmit_listen: Option<SocketAddr>,
    /// A live feed instead of `payloads`: MoldUDP64 packets arriving here
    /// (an arbitrator's output, an exchange's line) go down the tree as they
    /// come, until the node is stopped.
    pub listen: Option<SocketAddr>,
    /// Serve GLIMPSE-style snapshots of the books of what it sends, for
    /// receivers that join late (`--snapshot` at the receiver).
    pub snapshot: Option<crate::snapshot::ServiceConfig>,
    /// Tell the exchange each packet's deadline here (sealed deadline
    /// records, `fairfeed_tree::deadlines`, under the operator key), for its
    /// cheat detector.
    pub deadlines_to: Option<SocketAddr>,
}

/// Where a receiver's released messages go.
#[derive(Debug, Clone, Default)]
pub struct ReceiverJob {
    /// Send each released MoldUDP64 packet here (an unmodified ITCH application listens on it).
    pub deliver: Option<SocketAddr>,
    /// Fill what the tree lost from this MoldUDP64 retransmission server.
    pub retransmit: Option<SocketAddr>,
    /// The MoldUDP64 sequence number the filled stream starts at (1: the
    /// session from its beginning); `None`: wherever the first release is
    /// (joining a running feed — an earlier packet released after it is then
    /// before the stream's start, and not delivered).
    pub fill_from: Option<u64>,
    /// Keep one row per release for the log.
    pub keep_log: bool,
    /// Join from a snapshot: the application gets the books first.
    pub snapshot: Option<SnapshotJoin>,
    /// Forward each release over one more hop (models 2 and 3): to firms'
    /// hosts or an enclave's channel, each early by its measured delay.
    pub last_hop: Option<LastHopJob>,
}

/// A release point's last hop (see [`crate::lasthop`]).
#[derive(Debug, Clone)]
pub struct LastHopJob {
    pub hosts: Vec<crate::lasthop::HostAddr>,
    /// Its settings (`hosts` and `secret` are filled in by the shell).
    pub cfg: fairfeed_tree::lasthop::LastHopConfig,
    /// Each packet goes with its deadline in front, for hosts that hold to it.
    pub framed: bool,
}

/// Where a joining receiver fetches its snapshot, and as whom.
#[derive(Debug, Clone)]
pub struct SnapshotJoin {
    pub server: SocketAddr,
    pub user: String,
    pub password: String,
}

/// The node's job, by its role in the topology.
#[derive(Debug, Clone)]
pub enum Job {
    Sender(SenderJob),
    Proxy,
    Receiver(ReceiverJob),
}

/// Everything a node process is configured with.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Shared: the demo gives every node of a tree the same one.
    pub topology: Arc<Topology>,
    pub id: u32,
    pub node: NodeConfig,
    pub rule: DeadlineRule,
    pub auth: Option<Auth>,
    /// The keyring in force at run time (a watched key file): a new one is
    /// put in force at the next turn. `None`: `auth` for the node's life.
    pub keys: Option<Arc<keys::KeyCell>>,
    /// Emulate these links on what this node sends (off in real deployments).
    pub link: Option<LinkModel>,
    pub seed: u64,
    pub idle: IdleStrategy,
    pub threads: Threading,
    pub tuning: Tuning,
    /// Answer `stat` (and `stop`) here.
    pub control: Option<SocketAddr>,
    /// The operator key control commands are sealed under (`stop` needs
    /// one; a control address beyond loopback is refused without one).
    pub operator: Option<fairfeed_tree::operator::OperatorKey>,
    pub max_seconds: Option<f64>,
    /// At start-up, wait this long for the topology's names that do not
    /// resolve yet (peers' pods not scheduled yet); zero: an error at once.
    pub resolve_wait: std::time::Duration,
    pub job: Job,
    /// Set from outside (a signal handler) to stop the node.
    pub stop: Arc<AtomicBool>,
    /// Clock synchronization and (for tests) a deliberately wrong clock.
    pub clock: ClockOpts,
    /// The clock the node runs on ([`TimeBase::WALL`] but in the demo).
    pub time: TimeBase,
    /// Per-copy measures for a harness (the demo); `None` in deployments.
    pub tap: Option<Arc<Tap>>,
    /// The board the node's agents post their counters and histograms to,
    /// for a metrics endpoint or a dashboard to read ([`report`]); `None`:
    /// one of its own where the node answers a control socket, else none.
    pub board: Option<Arc<NodeBoard>>,
    /// Counters kept beside the node (its eBPF programs'), shown with its own.
    pub extra: Vec<ExtraCounters>,
    /// On a topology of several trees: the sender's symbol map, the trees a
    /// receiver takes, the market-wide messages' wait.
    pub shards: fairfeed_tree::sharded::ShardOptions,
    /// The kernel makes the node's fan-out copies; `None`: user space sends each.
    pub replicate: Option<Replicate>,
    /// What sends and receives the node's datagrams: `sendmmsg`/`recvmmsg`,
    /// io_uring, or (with `external`) AF_XDP.
    pub io: fairfeed_io::send::Backend,
    /// The back-end made by the caller for `io` = AF_XDP (on the node's
    /// interface, in fairfeed-xdp); `None` otherwise.
    pub external: Option<fairfeed_io::send::External>,
    /// A node under a controller: what joining left (its first view is
    /// `topology`); the node keeps the membership while it runs.
    pub membership: Option<Arc<membership::Joined>>,
}

/// The kernel makes this node's fan-out copies (Jasper's TC egress
/// replicator, set up by the caller on the interface the node's packets
/// leave by, watching `sock`'s port): a data packet for exactly the node's
/// `fanout` targets leaves as one datagram to `fanout[0]` from `sock`, and
/// the replicator clones it to the others. Anything else the node sends
/// (reports, probes, a copy for some of the targets) goes from its own socket
/// as before, so the replicator never sees it.
#[derive(Debug, Clone)]
pub struct Replicate {
    pub sock: Arc<std::net::UdpSocket>,
    pub fanout: Vec<u32>,
}

/// Counters kept beside a node, outside its agents (the kernel's XDP
/// de-duplicator in front of its socket), read whenever the node answers
/// `stat` or publishes metrics: they appear as `counters.<name>`.
#[derive(Clone)]
pub struct ExtraCounters {
    pub name: &'static str,
    pub read: Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
}

impl std::fmt::Debug for ExtraCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtraCounters").field("name", &self.name).finish_non_exhaustive()
    }
}

/// How a node treats its clock.
#[derive(Debug, Clone)]
pub struct ClockOpts {
    /// `Off`: trust CLOCK_REALTIME (PTP/chrony-disciplined hosts); `Sync`:
    /// fairfeed's synchronization; `MeasureOnly`: probe and report, no correction.
    pub sync: fairfeed_clock::SyncConfig,
    /// Random probe peers per node beside parents and hedge parents.
    pub random_peers: usize,
    /// Added to this node's clock readings (tests and benchmarks on one host).
    pub skew: fairfeed_clock::skew::Skew,
    /// With `sync.mode` Off: the host clock daemon's error bound, ns, as a
    /// `fairfeed_io::hostclock::HostClockWatch` publishes it (`u64::MAX`: none).
    pub host_bound: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl Default for ClockOpts {
    fn default() -> Self {
        ClockOpts {
            sync: fairfeed_clock::SyncConfig { mode: fairfeed_clock::SyncMode::Off, ..Default::default() },
            random_peers: 2,
            skew: fairfeed_clock::skew::Skew::NONE,
            host_bound: None,
        }
    }
}

/// One release at a receiver, all times CLOCK_REALTIME ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReleaseRow {
    pub sequence: u64,
    pub send_ns: u64,
    pub deadline_ns: u64,
    pub arrival_ns: u64,
    pub release_ns: u64,
    pub late: bool,
}

/// What a node did, at exit (and, as JSON, from `fairfeed stat` at any time).
#[derive(Debug, Clone, Serialize)]
pub struct AgentReport {
    pub id: u32,
    pub role: String,
    pub addr: String,
    pub uptime_s: f64,
    pub counters: serde_json::Value,
    pub node: serde_json::Value,
    pub latency: serde_json::Value,
    pub tuning: Vec<crate::tuning::Applied>,
    #[serde(skip)]
    pub rows: Vec<ReleaseRow>,
}

pub use fairfeed_io::clock::wall_ns;

/// Writes a receiver's release rows as CSV.
pub fn write_rows(path: &std::path::Path, rows: &[ReleaseRow]) -> std::io::Result<()> {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(w, "sequence,send_ns,deadline_ns,arrival_ns,release_ns,late")?;
    for r in rows {
        writeln!(
            w,
            "{},{},{},{},{},{}",
            r.sequence,
            r.send_ns,
            r.deadline_ns,
            r.arrival_ns,
            r.release_ns,
            u8::from(r.late)
        )?;
    }
    w.flush()
}
