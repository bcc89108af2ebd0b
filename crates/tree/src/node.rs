//! The three node state machines of a fair multicast tree: sender, proxy,
//! receiver. Sans-IO: each takes the current time (on its own, possibly
//! imperfectly synchronized, clock) and the bytes it received, and hands what
//! it sends to a [`Transmit`]. The simulator, the in-memory network and the
//! UDP shell drive the same code.
//!
//! - The **sender** numbers each market-data packet, stamps its send time and
//!   deadline = now + OWD_G + margin, and sends one copy to each child.
//!   OWD_G is the max of the p95 one-way delays reported up the tree; the
//!   margin is 0 under the paper's rule. Under the quantile rule (the
//!   default controller) the offset is instead the target quantile of each
//!   message's *last* arrival, which reports carry up the tree as tail
//!   sections ([`crate::tail`]); the previous late-share controller
//!   ([`LateShareController`]) stays selectable for comparison.
//! - A **proxy** keeps the first copy of each packet, forwards it to its
//!   children and to its hedge targets, and drops later copies. It merges its
//!   children's reports (max of delays, sum of counts, ignoring stale children;
//!   per-message largest delays by max) and reports to its parent.
//! - A **receiver** keeps the first copy, holds it until its deadline and
//!   releases it then — at once, and counted late, if the deadline has passed.
//!   It keeps a window of one-way delays and reports its p95 to its parent.
//!
//! Every node also runs a [`ClockSync`] (off unless given one with
//! `with_sync`): its probes travel as overlay [`Kind::Probe`] packets, and
//! every time argument stays the node's **raw** clock reading. The sender's
//! clock is the reference; receivers convert to the synchronized clock for
//! deadlines and one-way delays, and report their error bound, which the
//! sender's margin covers. A receiver whose bound is above its limit says so
//! in its reports and marks its releases (`Released::clock_ok`), so fairness
//! statistics can leave it out rather than be silently wrong.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use fairfeed_clock::ClockSync;
use fairfeed_wire::overlay::{self, HeaderRepr, Kind, ProbeRepr, ReportRepr};

use crate::auth::{Auth, AuthStats};
use crate::dedup::{Dedup, Seen};
use crate::owd::OwdWindow;
use crate::sharded::{ShardReceiver, ShardSender};
use crate::tail::{TailConfig, TailEstimator, TailLog, TailStats};

/// The earliest of some timers (`None`: none is set) — how every core's
/// `next_timeout` combines its parts.
pub fn earliest(timers: impl IntoIterator<Item = Option<u64>>) -> Option<u64> {
    timers.into_iter().flatten().min()
}

/// Packets a receiver holds at most; beyond it the earliest is released early
/// (counted) rather than memory growing without bound.
pub const HOLD_MAX: usize = 65_536;
/// Children whose last report is older than this many report intervals are ignored.
pub const STALE_INTERVALS: u64 = 5;

/// Where nodes send packets.
pub trait Transmit {
    /// Sends `bytes` to node `to`.
    fn send(&mut self, to: u32, bytes: &[u8]);

    /// Sends the same `bytes` to every node in `to` — one buffer, many
    /// targets, which a shell shares rather than copies per destination (the
    /// default sends to each in turn).
    fn send_all(&mut self, to: &[u32], bytes: &[u8]) {
        for &t in to {
            self.send(t, bytes);
        }
    }
}

/// What a node did with one packet: the shell learns it here rather than by
/// diffing counters or parsing the header again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A data copy seen for the first time (forwarded by a proxy, held or
    /// released by a receiver): its overlay sequence, the links it crossed,
    /// and its one-way delay on the node's synchronized clock (ns).
    New {
        /// Its overlay sequence number.
        sequence: u64,
        /// Links it crossed.
        hops: u8,
        /// Its one-way delay on the synchronized clock, ns.
        owd_ns: i64,
    },
    /// A later copy of a packet already seen.
    Duplicate {
        /// Its overlay sequence number.
        sequence: u64,
    },
    /// A report or a probe, taken in.
    Control,
    /// Dropped, and why.
    Refused(Refusal),
}

/// Why a packet was dropped (each also counted in the node's stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not an overlay packet, or a truncated one.
    Malformed,
    /// The key did not check out (or the packet is stale, or replayed).
    Unauthenticated,
    /// Older than the duplicate window: cannot tell new from duplicate.
    TooOld,
    /// A kind this role does not take (e.g. data at the sender).
    Unexpected,
}

/// Per-node settings.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeConfig {
    /// The tree it belongs to.
    pub tree: u16,
    /// How often receivers and proxies report up the tree.
    pub report_interval_ns: u64,
    /// Deadline offset the sender uses before any report arrives.
    pub initial_owd_ns: u64,
    /// The quantile receivers report (Jasper: 0.95).
    pub owd_quantile: f64,
    /// Receivers hold messages until their deadline (off: release on arrival,
    /// as a plain tree or direct unicast does).
    pub hold_and_release: bool,
    /// The order a receiver releases in.
    #[serde(default)]
    pub order: ReleaseOrder,
    /// A receiver releases this long before each deadline — a **cheat**,
    /// for testing only (`fairfeed receiver --cheat-us`): what a firm that
    /// runs its own receiver could do, and what the exchange's cheat
    /// detector (`fairfeed_exchange::cheat`) must catch. 0 for every honest
    /// node. Releases still report the deadline the sender set.
    #[serde(default)]
    pub release_lead_ns: u64,
    /// A sequence-ordered receiver that joins a running session (a late
    /// joiner: its first packet is not the session's first): its line
    /// starts with the lowest sequence held at the head's deadline, released
    /// then, as every other receiver releases it — not after a gap wait for
    /// predecessors it was never sent (which made its first gap-wait's worth
    /// of messages late, and the feed unfair for them). Off (a receiver up
    /// before the session): it waits for message 1 as for any missing one.
    #[serde(default)]
    pub joins_running: bool,
}

/// The largest release lead a (cheating, test-mode) receiver takes, ns.
pub const RELEASE_LEAD_MAX_NS: u64 = 1_000_000;

/// The order a receiver releases messages in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum ReleaseOrder {
    /// By deadline, each message on its own (the paper's model, which the
    /// simulator's experiments measure): a late copy is released on arrival,
    /// after later messages that were on time.
    #[default]
    Deadline,
    /// In overlay sequence order, as a MoldUDP64 line delivers — what an
    /// unmodified ITCH application needs: a message is released at its
    /// deadline or when its predecessor is, whichever is later. A missing
    /// message holds its successors until `gap_wait_ns` past the deadline of
    /// the first one waiting (for the hedged copy); then it is given up
    /// (counted in `gaps` / `gap_packets`: the application sees the jump in
    /// sequence numbers a MoldUDP64 line shows for a loss) and a copy that
    /// arrives later is dropped (`after_gap`), never delivered out of order.
    Sequence {
        /// How long past the first waiting message's deadline a gap is waited for, ns.
        gap_wait_ns: u64,
    },
}

/// How long a sequence-ordered receiver waits for a missing message by
/// default: far past a hedged copy's usual lag behind the first (tens to
/// hundreds of µs) and past the multi-ms stalls of a shared cloud host, so
/// that only a message truly lost on every path is given up; it holds its
/// successors that long only when one is missing.
pub const GAP_WAIT_DEFAULT_NS: u64 = 20_000_000;
/// The longest gap wait a receiver takes (a longer one stalls the feed).
pub const GAP_WAIT_MAX_NS: u64 = 10_000_000_000;

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            tree: 0,
            report_interval_ns: 10_000_000,
            initial_owd_ns: 1_000_000,
            owd_quantile: 0.95,
            hold_and_release: true,
            order: ReleaseOrder::Deadline,
            release_lead_ns: 0,
            joins_running: false,
        }
    }
}

/// A signed control packet (a report or a probe) from `origin`: the header
/// `h` (its payload length set here), then `len` payload bytes written by `emit`.
fn control_packet(
    auth: Option<&Auth>,
    h: HeaderRepr,
    len: usize,
    emit: impl FnOnce(&mut [u8]) -> Result<usize, fairfeed_wire::Error>,
) -> Vec<u8> {
    let mut b = vec![0u8; overlay::HEADER_LEN + len];
    let _ = HeaderRepr { payload_len: len as u16, ..h }.emit(&mut b);
    let _ = emit(&mut b[overlay::HEADER_LEN..]);
    if let Some(a) = auth {
        a.seal(&mut b);
    }
    b
}

/// A report: the fixed part `r`, then the tail section `tail`.
fn report_packet(cfg: &NodeConfig, auth: Option<&Auth>, origin: u32, now: u64, r: &ReportRepr, tail: &[u8]) -> Vec<u8> {
    let h = HeaderRepr { kind: Some(Kind::Report), tree: cfg.tree, origin, send_ns: now, ..HeaderRepr::default() };
    control_packet(auth, h, overlay::REPORT_LEN + tail.len(), |b| {
        b[overlay::REPORT_LEN..].copy_from_slice(tail);
        r.emit(b)
    })
}

/// Where a node's reports go: the full report to its parent, and — so a
/// dead parent does not hide the subtree from the sender — a copy with the
/// summed counts zeroed (max fields and the tail merge by max, so twice is
/// harmless) to each node that hedges for it. Returns the reports sent.
struct ReportTo<'a> {
    parent: u32,
    hedge_parents: &'a [u32],
}

#[allow(clippy::too_many_arguments)]
fn send_report(
    cfg: &NodeConfig,
    auth: Option<&Auth>,
    origin: u32,
    now: u64,
    r: &ReportRepr,
    tail: &mut TailLog,
    to: ReportTo,
    tx: &mut impl Transmit,
) -> u64 {
    let mut t = Vec::new();
    tail.drain_into(&mut t);
    tx.send(to.parent, &report_packet(cfg, auth, origin, now, r, &t));
    if to.hedge_parents.is_empty() {
        return 1;
    }
    let side = ReportRepr { messages: 0, late: 0, hold_sum_ns: 0, receivers: 0, clock_unsynced: 0, ..*r };
    let b = report_packet(cfg, auth, origin, now, &side, &t);
    for &h in to.hedge_parents {
        tx.send(h, &b);
    }
    1 + to.hedge_parents.len() as u64
}

/// The tail section after a report's fixed part, if any (malformed: none, counted by the caller).
fn report_tail(payload: &[u8]) -> Result<Option<overlay::TailView<'_>>, fairfeed_wire::Error> {
    overlay::TailView::parse(payload.get(overlay::REPORT_LEN..).unwrap_or(&[]))
}

/// Builds a signed probe packet from `origin`.
pub fn probe_packet(cfg: &NodeConfig, auth: Option<&Auth>, origin: u32, p: &ProbeRepr) -> Vec<u8> {
    let h = HeaderRepr {
        kind: Some(Kind::Probe),
        tree: cfg.tree,
        origin,
        sequence: p.pair,
        send_ns: p.tx_ns,
        ..HeaderRepr::default()
    };
    control_packet(auth, h, overlay::PROBE_LEN, |b| p.emit(b))
}

/// Sends what the node's clock synchronization has due.
fn sync_timeout(sync: &mut ClockSync, cfg: &NodeConfig, auth: Option<&Auth>, now: u64, tx: &mut impl Transmit) {
    if sync.next_timeout().is_none_or(|t| t > now) {
        return;
    }
    let id = sync.id;
    sync.handle_timeout(now, &mut |to, p| tx.send(to, &probe_packet(cfg, auth, id, p)));
}

/// Hands a probe (already admitted) to the node's clock synchronization.
fn sync_probe(sync: &mut ClockSync, now: u64, h: &HeaderRepr, payload: &[u8]) {
    match ProbeRepr::parse(payload) {
        Ok(p) => {
            let _ = sync.handle_probe(now, h.origin, &p);
        }
        Err(_) => sync.stats.refused.malformed += 1,
    }
}

/// Checks `bytes` against the node's key (if it has one); counts refusals.
fn admit(auth: Option<&Auth>, stats: &mut AuthStats, bytes: &[u8], now: u64) -> bool {
    match auth.map(|a| a.open(bytes, now)) {
        None | Some(Ok(_)) => true,
        Some(Err(e)) => {
            stats.count(e);
            false
        }
    }
}

/// Reports from children, merged per interval.
#[derive(Debug, Default, Clone)]
struct ChildReports {
    /// child → (report, when it arrived, counts already passed up)
    last: HashMap<u32, (ReportRepr, u64, bool)>,
    pub stale_ignored: u64,
    /// Children whose reports stopped at the last merge: a crashed or cut-off subtree.
    pub silent: u64,
}

impl ChildReports {
    fn record(&mut self, from: u32, r: ReportRepr, now: u64) {
        self.last.insert(from, (r, now, false));
    }

    /// Max of fresh delays; counts of reports not yet passed up.
    fn merge(&mut self, now: u64, stale_ns: u64) -> Option<ReportRepr> {
        let mut out: Option<ReportRepr> = None;
        self.silent = 0;
        for (r, at, used) in self.last.values_mut() {
            if now.saturating_sub(*at) > stale_ns {
                self.stale_ignored += 1;
                self.silent += 1;
                continue;
            }
            let mut part = *r;
            if *used {
                part.messages = 0;
                part.late = 0;
                part.hold_sum_ns = 0;
            }
            *used = true;
            out.get_or_insert_with(ReportRepr::default).merge(&part);
        }
        out
    }
}

/// How the sender sets the deadline offset.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum DeadlineRule {
    /// Jasper's rule: deadline = now + OWD_G (max of p95s), plus a fixed margin.
    Paper {
        /// Added to OWD_G, ns.
        margin_ns: i64,
    },
    /// The previous controller: adjust a margin on OWD_G so that the share of
    /// (message, receiver) pairs released on time meets `target_on_time`.
    LateShare {
        /// The on-time share it aims at.
        target_on_time: f64,
    },
    /// The controller (default): the offset is an upper estimate of the
    /// `target_pf`-quantile of each message's last arrival, so that a share
    /// `target_pf` of messages reach every receiver by their deadline.
    Quantile {
        /// The share of messages it aims to have everywhere on time.
        target_pf: f64,
    },
}

/// The previous deadline controller (kept for comparison). Each report interval it looks at
/// the late share the tree reported: above the allowance it raises the margin
/// by a step sized from how late the latest message was; well below it, it
/// lowers the margin slowly. The margin may go below zero — OWD_G, a max of
/// p95s, can be more than the target needs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LateShareController {
    /// The share of (message, receiver) pairs it aims to have on time.
    pub target_on_time: f64,
    /// Its margin on OWD_G now, ns.
    pub margin_ns: i64,
    /// Times it changed the margin.
    pub adjustments: u64,
}

impl LateShareController {
    /// A controller aiming at `target_on_time` (in [0, 1)), margin 0.
    pub fn new(target_on_time: f64) -> Self {
        assert!((0.0..1.0).contains(&target_on_time), "target must be in [0, 1)");
        LateShareController { target_on_time, margin_ns: 0, adjustments: 0 }
    }

    /// Folds one interval's totals in; `owd_g` bounds how far the margin may fall.
    pub fn update(&mut self, r: &ReportRepr, owd_g_ns: u64) {
        if r.messages == 0 {
            return;
        }
        let allowed = 1.0 - self.target_on_time;
        let late = f64::from(r.late) / f64::from(r.messages);
        let owd = owd_g_ns as i64;
        if late > allowed {
            // Sized from how late the latest arrival was, but never more than half
            // of OWD_G at once: one descheduled host must not throw the margin off.
            let step = (r.late_max_ns as i64 / 2).min(owd / 2).max(owd / 20).max(1_000);
            self.margin_ns = self.margin_ns.saturating_add(step);
            self.adjustments += 1;
        } else if late < allowed / 4.0 {
            let step = (owd / 100).max(100);
            self.margin_ns = (self.margin_ns - step).max(-owd / 2);
            self.adjustments += 1;
        }
    }
}

/// Sender counters.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SenderStats {
    /// Data packets sent.
    pub packets: u64,
    /// Reports taken from its children.
    pub reports: u64,
    /// OWD_G now (the max of the receivers' p95 one-way delays), ns.
    pub owd_g_ns: u64,
    /// The late-share controller's margin (0 under other rules), ns.
    pub margin_ns: i64,
    /// Children that reported before and have gone silent (at the last update).
    pub children_silent: u64,
    /// The largest clock bound receivers reported (covered by the deadline), ns.
    pub clock_bound_ns: u64,
    /// Receivers whose clock bound is above their limit (at the last update).
    pub clock_unsynced: u64,
    /// Malformed tail sections in reports (the fixed part still counts).
    pub bad_tails: u64,
    /// The quantile controller's state (zeros under other rules).
    pub tail: TailStats,
    /// The deadline follows the estimate pooled over the sharding sender's
    /// trees (its own controller has too few samples yet).
    pub tail_pooled: bool,
    /// Packets refused by the tree key.
    pub auth: AuthStats,
}

/// The multicast sender of one tree.
pub struct Sender {
    /// Its node id.
    pub id: u32,
    cfg: NodeConfig,
    children: Vec<u32>,
    seq: u64,
    reports: ChildReports,
    rule: DeadlineRule,
    controller: Option<LateShareController>,
    tail: Option<TailEstimator>,
    /// The quantile controller's offset, once it has enough samples.
    tail_offset_ns: Option<u64>,
    /// Until then, under a sharding sender: the estimate over every tree's
    /// settled samples ([`crate::sharded::ShardSender`]).
    pooled_tail_ns: Option<u64>,
    owd_g_ns: Option<u64>,
    next_update_ns: u64,
    buf: Vec<u8>,
    pub(crate) auth: Option<Auth>,
    clock_bound_ns: u64,
    /// The deadline the last message was sent with.
    last_deadline_ns: u64,
    /// The tree's clock reference.
    pub sync: ClockSync,
    /// Its counters.
    pub stats: SenderStats,
}

impl Sender {
    /// The sender `id` of a tree whose first layer is `children`, setting deadlines by `rule`.
    pub fn new(id: u32, children: Vec<u32>, cfg: NodeConfig, rule: DeadlineRule) -> Self {
        let controller = match rule {
            DeadlineRule::LateShare { target_on_time } => Some(LateShareController::new(target_on_time)),
            _ => None,
        };
        let tail = match rule {
            DeadlineRule::Quantile { target_pf } => {
                Some(TailEstimator::new(TailConfig::new(target_pf, cfg.report_interval_ns)))
            }
            _ => None,
        };
        Sender {
            id,
            cfg,
            children,
            seq: 0,
            reports: ChildReports::default(),
            rule,
            controller,
            tail,
            tail_offset_ns: None,
            pooled_tail_ns: None,
            owd_g_ns: None,
            next_update_ns: 0,
            buf: Vec::with_capacity(2048),
            auth: None,
            clock_bound_ns: 0,
            last_deadline_ns: 0,
            sync: ClockSync::off(id),
            stats: SenderStats::default(),
        }
    }

    /// Runs `sync` (the reference of the tree's clock synchronization).
    pub fn with_sync(mut self, sync: ClockSync) -> Self {
        self.sync = sync;
        self
    }

    /// Signs what it sends and checks what it receives with `auth`.
    pub fn with_auth(mut self, auth: Option<Auth>) -> Self {
        self.auth = auth;
        self
    }

    /// The deadline offset in force: OWD_G plus the margin (or the quantile
    /// controller's estimate, once it has one), plus the receivers' largest
    /// clock bound (a release may be that early or late). The quantile
    /// controller holds at least the initial offset until its estimate: on a
    /// deep tree the first maxima take a report interval per level to climb,
    /// and OWD_G (a p95 per receiver) is far below the last arrival.
    pub fn deadline_offset_ns(&self) -> u64 {
        if let Some(q) = self.tail_offset_ns.or(self.pooled_tail_ns) {
            return q + self.clock_bound_ns;
        }
        let owd = self.owd_g_ns.unwrap_or(self.cfg.initial_owd_ns) as i64;
        let owd = if self.tail.is_some() { owd.max(self.cfg.initial_owd_ns as i64) } else { owd };
        let margin = match (self.rule, &self.controller) {
            (DeadlineRule::Paper { margin_ns }, _) => margin_ns,
            (_, Some(c)) => c.margin_ns,
            _ => 0,
        };
        (owd + margin).max(0) as u64 + self.clock_bound_ns
    }

    /// The quantile controller (under `DeadlineRule::Quantile`).
    pub fn tail(&self) -> Option<&TailEstimator> {
        self.tail.as_ref()
    }

    /// True once the quantile controller has an estimate of its own.
    pub fn tail_ready(&self) -> bool {
        self.tail_offset_ns.is_some()
    }

    /// The estimate to use until its own controller has one (`None`: the
    /// initial offset); a sharding sender pools its trees' samples.
    pub fn set_pooled_tail(&mut self, ns: Option<u64>) {
        self.pooled_tail_ns = ns;
        self.stats.tail_pooled = ns.is_some() && self.tail_offset_ns.is_none();
    }

    /// The deadline the last message sent carries (0 before the first).
    pub fn last_deadline_ns(&self) -> u64 {
        self.last_deadline_ns
    }

    /// Sends one market-data payload (a MoldUDP64 packet) down the tree;
    /// returns its overlay sequence number.
    pub fn handle_message(&mut self, now: u64, payload: &[u8], tx: &mut impl Transmit) -> u64 {
        self.handle_message_flagged(now, payload, 0, tx)
    }

    /// [`Sender::handle_message`] with header flags `flags` (a sharding
    /// sender marks its market-wide copies [`overlay::FLAG_EVERY_TREE`]).
    pub fn handle_message_flagged(&mut self, now: u64, payload: &[u8], flags: u8, tx: &mut impl Transmit) -> u64 {
        self.seq += 1;
        let h = HeaderRepr {
            kind: Some(Kind::Data),
            tree: self.cfg.tree,
            flags: flags & overlay::FLAG_EVERY_TREE,
            sequence: self.seq,
            send_ns: now,
            deadline_ns: now + self.deadline_offset_ns(),
            origin: self.id,
            payload_len: payload.len().min(usize::from(u16::MAX)) as u16,
            ..HeaderRepr::default()
        };
        self.last_deadline_ns = h.deadline_ns;
        self.buf.clear();
        self.buf.resize(overlay::HEADER_LEN, 0);
        let _ = h.emit(&mut self.buf);
        self.buf.extend_from_slice(&payload[..usize::from(h.payload_len)]);
        if let Some(a) = &self.auth {
            a.seal(&mut self.buf);
        }
        tx.send_all(&self.children, &self.buf);
        if let Some(t) = &mut self.tail {
            t.sent(self.seq, now);
        }
        self.stats.packets += 1;
        self.seq
    }

    /// A packet from below: a report from a layer-0 child, or a probe.
    pub fn handle_packet(&mut self, now: u64, bytes: &[u8]) -> Outcome {
        if !admit(self.auth.as_ref(), &mut self.stats.auth, bytes, now) {
            return Outcome::Refused(Refusal::Unauthenticated);
        }
        let Ok((h, p)) = HeaderRepr::parse(bytes) else { return Outcome::Refused(Refusal::Malformed) };
        let outcome = match h.kind {
            Some(Kind::Report) => {
                let Ok(r) = ReportRepr::parse(p) else { return Outcome::Refused(Refusal::Malformed) };
                self.reports.record(h.origin, r, now);
                self.stats.reports += 1;
                match (report_tail(p), &mut self.tail) {
                    (Ok(Some(t)), Some(est)) => est.merge(&t),
                    (Err(_), _) => self.stats.bad_tails += 1,
                    _ => {}
                }
                Outcome::Control
            }
            Some(Kind::Probe) => {
                sync_probe(&mut self.sync, now, &h, p);
                Outcome::Control
            }
            _ => Outcome::Refused(Refusal::Unexpected),
        };
        if now >= self.next_update_ns {
            self.update(now);
        }
        outcome
    }

    /// When the sender's probes are next due (its reports are handled as they come).
    pub fn next_timeout(&self) -> Option<u64> {
        self.sync.next_timeout()
    }

    /// Sends the probes that are due.
    pub fn handle_timeout(&mut self, now: u64, tx: &mut impl Transmit) {
        sync_timeout(&mut self.sync, &self.cfg, self.auth.as_ref(), now, tx);
    }

    /// Recomputes OWD_G (and the controller) from fresh reports; called each interval.
    pub fn update(&mut self, now: u64) {
        self.next_update_ns = now + self.cfg.report_interval_ns;
        let stale = self.cfg.report_interval_ns * STALE_INTERVALS;
        if let Some(r) = self.reports.merge(now, stale) {
            if r.owd_p95_ns > 0 {
                self.owd_g_ns = Some(r.owd_p95_ns);
            }
            self.clock_bound_ns = r.clock_bound_ns;
            self.stats.clock_unsynced = u64::from(r.clock_unsynced);
            if let Some(c) = &mut self.controller {
                c.update(&r, self.owd_g_ns.unwrap_or(0));
            }
        }
        if let Some(t) = &mut self.tail {
            self.tail_offset_ns = t.update(now);
            self.stats.tail = t.stats;
        }
        self.stats.owd_g_ns = self.owd_g_ns.unwrap_or(0);
        self.stats.clock_bound_ns = self.clock_bound_ns;
        self.stats.children_silent = self.reports.silent;
        self.stats.margin_ns = self.controller.map_or(0, |c| c.margin_ns);
    }
}

/// Proxy counters.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ProxyStats {
    /// Data packets received (every copy).
    pub received: u64,
    /// Packets forwarded (first copies).
    pub forwarded: u64,
    /// Copies sent (to children and hedge targets).
    pub copies_sent: u64,
    /// Later copies of packets already forwarded.
    pub duplicates: u64,
    /// Copies older than the duplicate window (dropped).
    pub too_old: u64,
    /// Packets that are not overlay packets, or not for a proxy.
    pub bad_packets: u64,
    /// Reports taken from its children.
    pub reports_in: u64,
    /// Reports sent to its parent.
    pub reports_out: u64,
    /// Children that reported before and have gone silent (at the last report).
    pub children_silent: u64,
    /// Malformed tail sections in children's reports.
    pub bad_tails: u64,
    /// Packets refused by the tree key.
    pub auth: AuthStats,
}

/// A proxy: first copy wins, forwarded to children and hedge targets.
pub struct Proxy {
    /// Its node id.
    pub id: u32,
    cfg: NodeConfig,
    parent: u32,
    hedge_parents: Vec<u32>,
    targets: Vec<u32>,
    dedup: Dedup,
    reports: ChildReports,
    tail: TailLog,
    next_report_ns: u64,
    pub(crate) auth: Option<Auth>,
    /// Its clock.
    pub sync: ClockSync,
    /// Its counters.
    pub stats: ProxyStats,
}

impl Proxy {
    /// `targets` = own children followed by hedge targets.
    pub fn new(id: u32, parent: u32, children: &[u32], hedge_targets: &[u32], cfg: NodeConfig) -> Self {
        let targets = children.iter().chain(hedge_targets).copied().collect();
        Proxy {
            id,
            cfg,
            parent,
            hedge_parents: Vec::new(),
            targets,
            dedup: Dedup::default(),
            reports: ChildReports::default(),
            tail: TailLog::default(),
            next_report_ns: cfg.report_interval_ns,
            auth: None,
            sync: ClockSync::off(id),
            stats: ProxyStats::default(),
        }
    }

    /// Checks what it receives, and signs the reports it builds, with `auth`.
    pub fn with_auth(mut self, auth: Option<Auth>) -> Self {
        self.auth = auth;
        self
    }

    /// Synchronizes its clock with `sync`.
    pub fn with_sync(mut self, sync: ClockSync) -> Self {
        self.sync = sync;
        self
    }

    /// Also reports (max fields and tail only) to these nodes, which hedge for it.
    pub fn with_hedge_parents(mut self, hedge_parents: Vec<u32>) -> Self {
        self.hedge_parents = hedge_parents;
        self
    }

    /// A packet arrived (data from above or a report from below).
    pub fn handle_packet(&mut self, raw: u64, bytes: &mut [u8], tx: &mut impl Transmit) -> Outcome {
        let Ok((h, payload)) = HeaderRepr::parse(bytes) else {
            self.stats.bad_packets += 1;
            return Outcome::Refused(Refusal::Malformed);
        };
        // Probes carry raw clocks; everything else the synchronized one.
        let now = if h.kind == Some(Kind::Probe) { raw } else { self.sync.now_sync(raw) };
        if !admit(self.auth.as_ref(), &mut self.stats.auth, bytes, now) {
            return Outcome::Refused(Refusal::Unauthenticated);
        }
        match h.kind {
            Some(Kind::Data) => {
                self.stats.received += 1;
                match self.dedup.check(h.sequence) {
                    Seen::New => {
                        overlay::bump_hop(bytes);
                        tx.send_all(&self.targets, bytes);
                        self.stats.forwarded += 1;
                        self.stats.copies_sent += self.targets.len() as u64;
                        let owd_ns = now as i64 - h.send_ns as i64;
                        Outcome::New { sequence: h.sequence, hops: h.hop.saturating_add(1), owd_ns }
                    }
                    Seen::Duplicate => {
                        self.stats.duplicates += 1;
                        Outcome::Duplicate { sequence: h.sequence }
                    }
                    Seen::TooOld => {
                        self.stats.too_old += 1;
                        Outcome::Refused(Refusal::TooOld)
                    }
                }
            }
            Some(Kind::Report) => {
                let Ok(r) = ReportRepr::parse(payload) else { return Outcome::Refused(Refusal::Malformed) };
                self.reports.record(h.origin, r, now);
                self.stats.reports_in += 1;
                match report_tail(payload) {
                    Ok(Some(t)) => self.tail.merge(&t),
                    Ok(None) => {}
                    Err(_) => self.stats.bad_tails += 1,
                }
                Outcome::Control
            }
            Some(Kind::Probe) => {
                sync_probe(&mut self.sync, now, &h, payload);
                Outcome::Control
            }
            _ => Outcome::Refused(Refusal::Unexpected),
        }
    }

    /// When the next report or probe is due (raw local time).
    pub fn next_timeout(&self) -> Option<u64> {
        earliest([Some(self.sync.to_local(self.next_report_ns)), self.sync.next_timeout()])
    }

    /// Sends the merged report up if it is due, and the probes that are (`raw`: the raw local clock).
    pub fn handle_timeout(&mut self, raw: u64, tx: &mut impl Transmit) {
        sync_timeout(&mut self.sync, &self.cfg, self.auth.as_ref(), raw, tx);
        let now = self.sync.now_sync(raw);
        if now < self.next_report_ns {
            return;
        }
        self.next_report_ns = now + self.cfg.report_interval_ns;
        let stale = self.cfg.report_interval_ns * STALE_INTERVALS;
        let merged = self.reports.merge(now, stale);
        self.stats.children_silent = self.reports.silent;
        if let Some(r) = merged {
            let to = ReportTo { parent: self.parent, hedge_parents: &self.hedge_parents };
            self.stats.reports_out +=
                send_report(&self.cfg, self.auth.as_ref(), self.id, now, &r, &mut self.tail, to, tx);
        }
    }
}

/// A message a receiver released to its application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The tree it came on (the header's).
    pub tree: u16,
    /// The overlay header's flags ([`overlay::FLAG_EVERY_TREE`]: a copy of a
    /// packet every tree carries).
    pub flags: u8,
    /// Its overlay sequence number.
    pub sequence: u64,
    /// The MoldUDP64 packet, header stripped.
    pub payload: Payload,
    /// Its deadline on the synchronized clock, ns.
    pub deadline_ns: u64,
    /// When it arrived (synchronized clock), ns.
    pub arrival_ns: u64,
    /// When the sender sent it (its header's), ns.
    pub send_ns: u64,
    /// It arrived after its deadline, so it was released on arrival.
    pub late: bool,
    /// When it fell due on the receiver's synchronized clock: its deadline,
    /// its arrival if that was later, in sequence order its predecessor's
    /// release if later still (or the end of the gap wait). A receiver on a
    /// host of its own releases then, to its timer's precision; a shell that
    /// runs many receivers on one thread releases later, and this is the
    /// instant it stood for.
    pub due_ns: u64,
    /// The receiver's clock was within its bound limit at the release (off:
    /// leave this release out of fairness statistics).
    pub clock_ok: bool,
}

/// Payload bytes a held message keeps inline, without an allocation (the
/// simulator's 8-byte payloads, a heartbeat); longer ones go to the heap.
pub const PAYLOAD_INLINE: usize = 24;

/// A held or released message's payload.
pub type Payload = smallvec::SmallVec<[u8; PAYLOAD_INLINE]>;

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Hold {
    /// What the held set is ordered by: the deadline, or (in sequence
    /// order) the sequence.
    key: u64,
    /// When it falls due: the deadline (less a cheat's lead), or its arrival when not holding.
    deadline_ns: u64,
    sequence: u64,
    arrival_ns: u64,
    /// The deadline the sender set (what the release reports).
    stated_deadline_ns: u64,
    send_ns: u64,
    flags: u8,
    payload: Payload,
}

/// Receiver counters.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReceiverStats {
    /// Data packets received (every copy).
    pub received: u64,
    /// Messages released.
    pub released: u64,
    /// Released after their deadline (they came late).
    pub late: u64,
    /// Later copies of packets already held or released.
    pub duplicates: u64,
    /// Copies older than the duplicate window (dropped).
    pub too_old: u64,
    /// Packets that are not overlay packets, or not for a receiver.
    pub bad_packets: u64,
    /// Releases made early because HOLD_MAX were held.
    pub hold_overflow: u64,
    /// Time held, summed over the releases, ns.
    pub hold_sum_ns: u64,
    /// Reports sent to its parent.
    pub reports_out: u64,
    /// Releases made while the clock bound was above its limit.
    pub clock_unsynced_releases: u64,
    /// Sequence order: missing runs given up after the gap wait, and the
    /// messages in them (the application sees these as MoldUDP64 gaps).
    pub gaps: u64,
    /// ... and the packets in them.
    pub gap_packets: u64,
    /// Sequence order: copies that came after their gap was given up (dropped).
    pub after_gap: u64,
    /// Sequence order: releases held past their own deadline by a missing predecessor.
    pub held_by_gap: u64,
    /// Packets refused by the tree key.
    pub auth: AuthStats,
}

/// A receiver: first copy wins, held until its deadline.
pub struct Receiver {
    /// Its node id.
    pub id: u32,
    cfg: NodeConfig,
    parent: u32,
    hedge_parents: Vec<u32>,
    dedup: Dedup,
    held: BinaryHeap<Reverse<Hold>>,
    owd: OwdWindow,
    tail: TailLog,
    interval: ReportRepr,
    next_report_ns: u64,
    /// Released messages not yet taken by the application.
    ready: std::collections::VecDeque<Released>,
    pub(crate) auth: Option<Auth>,
    /// Its clock.
    pub sync: ClockSync,
    /// Raw clock reading of the last event (for the clock's state at a release).
    last_local: u64,
    /// Sequence order: the next sequence to release (`None` before the first release).
    next_seq: Option<u64>,
    /// Sequence order: a missing message held back a due one at the last look.
    gap_blocking: bool,
    /// Sequence order: when the last release fell due (the next is never due before it).
    last_due_ns: u64,
    /// The last hop after this release point (a gateway's hosts, an
    /// enclave's channel): released this much before each deadline, and
    /// counted in every delay it reports ([`Receiver::set_last_hop_ns`]).
    last_hop_ns: u64,
    /// Its counters.
    pub stats: ReceiverStats,
}

impl Receiver {
    /// The receiver `id` under `parent`.
    pub fn new(id: u32, parent: u32, cfg: NodeConfig) -> Self {
        Receiver {
            id,
            cfg,
            parent,
            hedge_parents: Vec::new(),
            dedup: Dedup::default(),
            held: BinaryHeap::new(),
            owd: OwdWindow::default(),
            tail: TailLog::default(),
            interval: ReportRepr { receivers: 1, ..ReportRepr::default() },
            next_report_ns: cfg.report_interval_ns,
            ready: Default::default(),
            last_hop_ns: 0,
            auth: None,
            sync: ClockSync::off(id),
            last_local: 0,
            next_seq: None,
            gap_blocking: false,
            last_due_ns: 0,
            stats: ReceiverStats::default(),
        }
    }

    /// Checks what it receives, and signs its reports, with `auth`.
    pub fn with_auth(mut self, auth: Option<Auth>) -> Self {
        self.auth = auth;
        self
    }

    /// Synchronizes its clock with `sync`; deadlines are then met on the synchronized clock.
    pub fn with_sync(mut self, sync: ClockSync) -> Self {
        self.sync = sync;
        self
    }

    /// Also reports (max fields and tail only) to these nodes, which hedge for it.
    pub fn with_hedge_parents(mut self, hedge_parents: Vec<u32>) -> Self {
        self.hedge_parents = hedge_parents;
        self
    }

    /// A packet arrived at raw local time `raw`: data, or a probe.
    pub fn handle_packet(&mut self, raw: u64, bytes: &[u8]) -> Outcome {
        self.last_local = raw;
        let Ok((h, payload)) = HeaderRepr::parse(bytes) else {
            self.stats.bad_packets += 1;
            return Outcome::Refused(Refusal::Malformed);
        };
        if h.kind == Some(Kind::Probe) {
            if !admit(self.auth.as_ref(), &mut self.stats.auth, bytes, raw) {
                return Outcome::Refused(Refusal::Unauthenticated);
            }
            sync_probe(&mut self.sync, raw, &h, payload);
            return Outcome::Control;
        }
        // Data carries times on the synchronized clock.
        let now = self.sync.now_sync(raw);
        if !admit(self.auth.as_ref(), &mut self.stats.auth, bytes, now) {
            return Outcome::Refused(Refusal::Unauthenticated);
        }
        if h.kind != Some(Kind::Data) {
            return Outcome::Refused(Refusal::Unexpected);
        }
        self.stats.received += 1;
        match self.dedup.check(h.sequence) {
            Seen::New => {}
            Seen::Duplicate => {
                self.stats.duplicates += 1;
                return Outcome::Duplicate { sequence: h.sequence };
            }
            Seen::TooOld => {
                self.stats.too_old += 1;
                return Outcome::Refused(Refusal::TooOld);
            }
        }
        let owd = now as i64 - h.send_ns as i64;
        let outcome = Outcome::New { sequence: h.sequence, hops: h.hop.saturating_add(1), owd_ns: owd };
        // Reported delays run to where the data is due: past the last hop.
        let owd = owd.saturating_add(self.last_hop_ns as i64);
        self.owd.record(owd);
        // Any clock with a known bound measures delays within it (the
        // sender's margin covers the bounds reported); one over the fairness
        // limit is still counted here, so a cloud where no clock can be held
        // within 1 µs gets a deadline that covers what it can, not none.
        if self.sync.usable(raw) {
            self.tail.record(h.sequence, owd.max(0) as u64);
        }
        let deadline_ns = if self.cfg.hold_and_release {
            h.deadline_ns.saturating_sub(self.cfg.release_lead_ns).saturating_sub(self.last_hop_ns)
        } else {
            now
        };
        let hold = Hold {
            key: deadline_ns,
            deadline_ns,
            sequence: h.sequence,
            arrival_ns: now,
            stated_deadline_ns: if self.cfg.hold_and_release { h.deadline_ns } else { now },
            send_ns: h.send_ns,
            flags: h.flags,
            payload: Payload::from_slice(payload),
        };
        if let ReleaseOrder::Sequence { .. } = self.cfg.order {
            self.hold_in_order(now, hold);
            return outcome;
        }
        if now >= deadline_ns {
            self.release(hold, 0);
            return outcome;
        }
        if self.held.len() >= HOLD_MAX {
            if let Some(Reverse(early)) = self.held.pop() {
                self.stats.hold_overflow += 1;
                self.release(early, now);
            }
        }
        self.held.push(Reverse(hold));
        outcome
    }

    /// Sequence order: holds `hold` among the others by sequence, then
    /// releases whatever is due at `now` (a late arrival at the head goes at once).
    fn hold_in_order(&mut self, now: u64, hold: Hold) {
        if self.next_seq.is_some_and(|n| hold.sequence < n) {
            // Its gap was given up (or it was released: the duplicate check
            // caught that); delivering it now would put it out of order.
            self.stats.after_gap += 1;
            return;
        }
        if self.held.len() >= HOLD_MAX {
            self.stats.hold_overflow += 1;
            self.release_head(now, true);
        }
        self.held.push(Reverse(Hold { key: hold.sequence, ..hold }));
        // What this arrival made due goes now (a late arrival at the head:
        // at once); gaps are given up only at a timeout, so that a batch of
        // packets read together is all taken in before any gap is judged.
        while self.held.peek().is_some_and(|Reverse(h)| h.sequence <= self.line_start())
            && self.release_head(now, false)
        {}
    }

    /// The next sequence the line expects: after the last released; before
    /// the first release, 1 — or, for a receiver that joins a running
    /// session, whatever is at the head (nothing before it is waited for).
    fn line_start(&self) -> u64 {
        match self.next_seq {
            Some(n) => n,
            None if self.cfg.joins_running => self.held.peek().map_or(1, |Reverse(h)| h.sequence),
            None => 1,
        }
    }

    /// Sequence order: releases the head of the held set, giving up the gap
    /// before it if there is one (`force`: whether or not it is due).
    /// Returns whether it released one.
    fn release_head(&mut self, now: u64, force: bool) -> bool {
        let ReleaseOrder::Sequence { gap_wait_ns } = self.cfg.order else { return false };
        let Some(Reverse(head)) = self.held.peek() else { return false };
        // Before the first release the line starts at 1 (a sender numbers its
        // session from 1): a receiver up before the session waits for message 1
        // as for any other; one that joins a running session starts where it
        // joined (not counted as a gap) — after one gap wait, or, told it joins
        // a running session (`joins_running`), at the head's deadline.
        let gap = head.sequence.saturating_sub(self.line_start());
        let due = if gap == 0 { head.deadline_ns } else { head.deadline_ns.saturating_add(gap_wait_ns) };
        if !force && due > now {
            return false;
        }
        let Some(Reverse(head)) = self.held.pop() else { return false };
        let waited = gap > 0;
        let gap = if self.next_seq.is_some() { gap } else { 0 };
        if gap > 0 {
            self.stats.gaps += 1;
            self.stats.gap_packets += gap;
            self.gap_blocking = true;
        }
        if self.gap_blocking && now > head.deadline_ns && head.arrival_ns <= head.deadline_ns {
            self.stats.held_by_gap += 1;
        }
        self.next_seq = Some(head.sequence + 1);
        // Due when the line reached it: its predecessor's release, or the gap wait's end, or now if forced.
        let floor = if force {
            now
        } else if waited {
            due
        } else {
            self.last_due_ns
        };
        let floor = floor.max(self.last_due_ns);
        self.release(head, floor);
        self.last_due_ns = self.ready.back().map_or(self.last_due_ns, |r| r.due_ns);
        true
    }

    /// Sequence order: releases every message due at `now`, in sequence.
    fn release_in_order(&mut self, now: u64) {
        while self.release_head(now, false) {}
        // Whether a missing message now holds back one that is past its deadline.
        self.gap_blocking =
            self.held.peek().is_some_and(|Reverse(h)| h.sequence > self.line_start() && h.deadline_ns <= now);
    }

    /// Releases `h`, due at its deadline or arrival, or at `floor` if later.
    fn release(&mut self, h: Hold, floor: u64) {
        // Late means it *arrived* after its deadline; a timer that fires a
        // little after the deadline is the shell's release precision, measured apart.
        let late = h.arrival_ns > h.deadline_ns;
        let due_ns = h.deadline_ns.max(h.arrival_ns).max(floor);
        let hold_ns = h.deadline_ns.saturating_sub(h.arrival_ns);
        let clock_ok = self.sync.within_limit(self.last_local);
        self.stats.clock_unsynced_releases += u64::from(!clock_ok);
        self.stats.released += 1;
        self.interval.messages = self.interval.messages.saturating_add(1);
        if late {
            self.stats.late += 1;
            self.interval.late = self.interval.late.saturating_add(1);
            self.interval.late_max_ns = self.interval.late_max_ns.max(h.arrival_ns - h.deadline_ns);
        } else {
            self.stats.hold_sum_ns += hold_ns;
            self.interval.hold_sum_ns = self.interval.hold_sum_ns.saturating_add(hold_ns);
        }
        self.ready.push_back(Released {
            tree: self.cfg.tree,
            flags: h.flags,
            sequence: h.sequence,
            payload: h.payload,
            deadline_ns: h.stated_deadline_ns,
            arrival_ns: h.arrival_ns,
            send_ns: h.send_ns,
            late,
            due_ns,
            clock_ok,
        });
    }

    /// The earliest raw local time something is due: a held deadline, a report, a probe.
    pub fn next_timeout(&self) -> Option<u64> {
        let deadline = self.held.peek().map(|Reverse(h)| self.sync.to_local(self.due_ns(h)));
        earliest([deadline, Some(self.sync.to_local(self.next_report_ns)), self.sync.next_timeout()])
    }

    /// The earliest synchronized time a release or a report is due (what
    /// [`Receiver::next_timeout`] gives before its probes and the conversion
    /// to the raw clock) — for a node that runs the clock for several trees.
    pub fn next_due_sync(&self) -> u64 {
        self.held.peek().map_or(u64::MAX, |Reverse(h)| self.due_ns(h)).min(self.next_report_ns)
    }

    /// Before this synchronized time, [`Receiver::handle_timeout`] has
    /// nothing to do but the clock's probes (no held message's deadline has
    /// come, no report is due, no gap holds the line): a node of several
    /// trees passes over the trees that are quiet.
    pub fn quiet_until_sync(&self) -> u64 {
        if self.gap_blocking {
            return 0;
        }
        self.held.peek().map_or(u64::MAX, |Reverse(h)| h.deadline_ns).min(self.next_report_ns)
    }

    /// When a held message is next looked at: its deadline, or — at the
    /// head of a sequence-ordered receiver, behind a gap — the gap wait's end.
    fn due_ns(&self, h: &Hold) -> u64 {
        match self.cfg.order {
            ReleaseOrder::Sequence { gap_wait_ns } if h.sequence > self.line_start() => {
                h.deadline_ns.saturating_add(gap_wait_ns)
            }
            _ => h.deadline_ns,
        }
    }

    /// Releases what is due, sends the report and the probes when due (`raw`: the raw local clock).
    pub fn handle_timeout(&mut self, raw: u64, tx: &mut impl Transmit) {
        sync_timeout(&mut self.sync, &self.cfg, self.auth.as_ref(), raw, tx);
        self.release_due(raw);
        let now = self.sync.now_sync(raw);
        if now >= self.next_report_ns {
            self.next_report_ns = now + self.cfg.report_interval_ns;
            if let Some(p) = self.owd.quantile(self.cfg.owd_quantile) {
                self.interval.owd_p95_ns = p;
                if self.sync.usable(raw) {
                    self.interval.clock_bound_ns = self.sync.bound_ns(raw);
                }
                if !self.sync.within_limit(raw) {
                    self.interval.clock_unsynced = 1;
                }
                let to = ReportTo { parent: self.parent, hedge_parents: &self.hedge_parents };
                self.stats.reports_out +=
                    send_report(&self.cfg, self.auth.as_ref(), self.id, now, &self.interval, &mut self.tail, to, tx);
            }
            self.interval = ReportRepr { receivers: 1, ..ReportRepr::default() };
        }
    }

    /// Releases what is due at raw local time `raw` (what
    /// [`Receiver::handle_timeout`] does before its report): a node of
    /// several trees has each release what is due before it merges them.
    pub fn release_due(&mut self, raw: u64) {
        self.last_local = raw;
        let now = self.sync.now_sync(raw);
        if let ReleaseOrder::Sequence { .. } = self.cfg.order {
            self.release_in_order(now);
        }
        while self.cfg.order == ReleaseOrder::Deadline
            && self.held.peek().is_some_and(|Reverse(h)| h.deadline_ns <= now)
        {
            if let Some(Reverse(h)) = self.held.pop() {
                self.release(h, 0);
            }
        }
    }

    /// The next released message, in release order.
    pub fn poll_release(&mut self) -> Option<Released> {
        self.ready.pop_front()
    }

    /// A last hop of `ns` follows this release point (models 2 and 3,
    /// [`crate::lasthop`]): messages arriving from now on are released that
    /// much before their deadlines, and the delays it reports grow by it, so
    /// the sender's deadline covers the hop. Capped at
    /// [`crate::lasthop::LEAD_LIMIT_NS`].
    pub fn set_last_hop_ns(&mut self, ns: u64) {
        self.last_hop_ns = ns.min(crate::lasthop::LEAD_LIMIT_NS);
    }

    /// The last hop's lead now, ns.
    pub fn last_hop_ns(&self) -> u64 {
        self.last_hop_ns
    }

    /// Messages held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Whether released messages wait to be polled.
    pub fn has_released(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The memory a data packet with `sequence` will touch beyond the
    /// receiver's own struct (prefetch hints: nothing is read).
    #[cfg(feature = "prefetch")]
    pub(crate) fn hot_lines(&self, sequence: u64) -> [*const u8; 4] {
        let held = self.held.as_slice();
        [
            self.dedup.line(sequence).cast(),
            self.owd.next_slot().cast(),
            held.as_ptr().wrapping_add(held.len()).cast(),
            self.tail.back().cast(),
        ]
    }
}

/// Where a node's reports go when it has no parent (a node the controller
/// has not placed yet, a proxy whose sender is gone): nowhere — the shell
/// finds no address for it and counts the copy.
pub const NO_LINK: u32 = u32::MAX;

/// A node's links in one topology version ([`Node::set_links`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeLinks {
    /// Its parent (`None`: the sender).
    pub parent: Option<u32>,
    /// Its children.
    pub children: Vec<u32>,
    /// The children of the siblings it hedges for.
    pub hedge_targets: Vec<u32>,
    /// The nodes that send it hedged copies beside its parent.
    pub hedge_parents: Vec<u32>,
}

/// Why a node cannot be moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    /// A node of several trees.
    #[error("a node of several trees is placed by its plan, not moved by a controller")]
    Sharded,
}

/// One node of a planned tree, whatever its role: the one type the
/// simulator, the demo and the node processes drive.
pub enum Node {
    /// The sender of one tree.
    Sender(Box<Sender>),
    /// A proxy.
    Proxy(Box<Proxy>),
    /// A receiver of one tree.
    Receiver(Box<Receiver>),
    /// The sender of a feed sharded over several trees.
    ShardSender(Box<ShardSender>),
    /// A receiver of several trees, delivering one merged feed.
    ShardReceiver(Box<ShardReceiver>),
}

impl Node {
    /// Node `n` of a planned tree whose sender is `sender`, hedged for by
    /// `hedge_parents` (from [`crate::plan::hedge_parents`]), with clock sync `sync`.
    pub fn from_plan(
        n: &crate::plan::Node,
        sender: u32,
        hedge_parents: Vec<u32>,
        cfg: NodeConfig,
        rule: DeadlineRule,
        sync: ClockSync,
    ) -> Node {
        let parent = n.parent.unwrap_or(sender);
        match n.role {
            crate::plan::Role::Sender => {
                Node::Sender(Box::new(Sender::new(n.id, n.children.clone(), cfg, rule).with_sync(sync)))
            }
            crate::plan::Role::Proxy => Node::Proxy(Box::new(
                Proxy::new(n.id, parent, &n.children, &n.hedge_targets, cfg)
                    .with_sync(sync)
                    .with_hedge_parents(hedge_parents),
            )),
            crate::plan::Role::Receiver => Node::Receiver(Box::new(
                Receiver::new(n.id, parent, cfg).with_sync(sync).with_hedge_parents(hedge_parents),
            )),
        }
    }

    /// Checks every packet against `auth` (none: accept all).
    pub fn with_auth(self, auth: Option<Auth>) -> Node {
        match self {
            Node::Sender(s) => Node::Sender(Box::new(s.with_auth(auth))),
            Node::Proxy(p) => Node::Proxy(Box::new(p.with_auth(auth))),
            Node::Receiver(r) => Node::Receiver(Box::new(r.with_auth(auth))),
            Node::ShardSender(mut s) => {
                s.trees = s.trees.into_iter().map(|t| t.with_auth(auth.clone())).collect();
                Node::ShardSender(s)
            }
            Node::ShardReceiver(mut r) => {
                r.trees = r.trees.into_iter().map(|(k, t)| (k, t.with_auth(auth.clone()))).collect();
                Node::ShardReceiver(r)
            }
        }
    }

    /// Moves the node to the links of a new topology version (the
    /// controller's): where it reports, whom it sends copies to, and whose
    /// reports it takes. Reports of former children are forgotten. A node
    /// of several trees is planned, never moved: `Err`.
    pub fn set_links(&mut self, l: &TreeLinks) -> Result<(), MoveError> {
        match self {
            Node::Sender(s) => {
                s.children.clone_from(&l.children);
                s.reports.last.retain(|c, _| l.children.contains(c));
            }
            Node::Proxy(p) => {
                p.parent = l.parent.unwrap_or(NO_LINK);
                p.targets = l.children.iter().chain(&l.hedge_targets).copied().collect();
                p.hedge_parents.clone_from(&l.hedge_parents);
                p.reports.last.retain(|c, _| l.children.contains(c));
            }
            Node::Receiver(r) => {
                r.parent = l.parent.unwrap_or(NO_LINK);
                r.hedge_parents.clone_from(&l.hedge_parents);
            }
            Node::ShardSender(_) | Node::ShardReceiver(_) => return Err(MoveError::Sharded),
        }
        Ok(())
    }

    /// A last hop of `ns` after this receiver ([`Receiver::set_last_hop_ns`]); nothing on other roles.
    pub fn set_last_hop_ns(&mut self, ns: u64) {
        match self {
            Node::Receiver(r) => r.set_last_hop_ns(ns),
            Node::ShardReceiver(r) => r.set_last_hop_ns(ns),
            _ => {}
        }
    }

    /// Its node id.
    pub fn id(&self) -> u32 {
        match self {
            Node::Sender(s) => s.id,
            Node::Proxy(p) => p.id,
            Node::Receiver(r) => r.id,
            Node::ShardSender(s) => s.id,
            Node::ShardReceiver(r) => r.id,
        }
    }

    /// A packet arrived at raw local time `raw`. A proxy forwards `bytes`
    /// themselves (its hop count bumped in place) to all its targets.
    pub fn handle_packet(&mut self, raw: u64, bytes: &mut [u8], tx: &mut impl Transmit) -> Outcome {
        match self {
            Node::Sender(s) => s.handle_packet(raw, bytes),
            Node::Proxy(p) => p.handle_packet(raw, bytes, tx),
            Node::Receiver(r) => r.handle_packet(raw, bytes),
            Node::ShardSender(s) => s.handle_packet(raw, bytes),
            Node::ShardReceiver(r) => r.handle_packet(raw, bytes),
        }
    }

    /// The earliest raw local time something is due (`None`: nothing).
    pub fn next_timeout(&self) -> Option<u64> {
        match self {
            Node::Sender(s) => s.next_timeout(),
            Node::Proxy(p) => p.next_timeout(),
            Node::Receiver(r) => r.next_timeout(),
            Node::ShardSender(s) => s.next_timeout(),
            Node::ShardReceiver(r) => r.next_timeout(),
        }
    }

    /// Does what is due at raw local time `raw`.
    pub fn handle_timeout(&mut self, raw: u64, tx: &mut impl Transmit) {
        match self {
            Node::Sender(s) => s.handle_timeout(raw, tx),
            Node::Proxy(p) => p.handle_timeout(raw, tx),
            Node::Receiver(r) => r.handle_timeout(raw, tx),
            Node::ShardSender(s) => s.handle_timeout(raw, tx),
            Node::ShardReceiver(r) => r.handle_timeout(raw, tx),
        }
    }

    /// The next released message (receivers only), in release order.
    pub fn poll_release(&mut self) -> Option<Released> {
        match self {
            Node::Receiver(r) => r.poll_release(),
            Node::ShardReceiver(r) => r.poll_release(),
            _ => None,
        }
    }

    /// Messages held now (receivers only).
    pub fn held(&self) -> usize {
        match self {
            Node::Receiver(r) => r.held(),
            Node::ShardReceiver(r) => r.held(),
            _ => 0,
        }
    }

    /// The memory beyond [`Node::state_span`] a data packet with `sequence`
    /// will touch (receivers and proxies: the duplicate window's word, the
    /// delay logs' next slots) — prefetch hints; nothing is read.
    #[cfg(feature = "prefetch")]
    pub fn hot_lines(&self, tree: u16, sequence: u64) -> [*const u8; 4] {
        match self {
            Node::Receiver(r) => r.hot_lines(sequence),
            Node::Proxy(p) => [p.dedup.line(sequence).cast(), p.tail.back().cast(), std::ptr::null(), std::ptr::null()],
            Node::ShardReceiver(r) => r.hot_lines(tree, sequence),
            Node::Sender(_) | Node::ShardSender(_) => [std::ptr::null(); 4],
        }
    }

    /// A receiver of several trees: the state of its receiver of `tree`,
    /// beyond [`Node::state_span`] (a prefetch hint; `None` for other nodes).
    #[cfg(feature = "prefetch")]
    pub fn tree_span(&self, tree: u16) -> Option<(*const u8, usize)> {
        match self {
            Node::ShardReceiver(r) => r.tree_span(tree),
            _ => None,
        }
    }

    /// Where the node's state lives and how many bytes it spans — for a
    /// driver that prefetches the state of nodes it will soon hand events
    /// to (the simulator, where at scale every event is a cache miss).
    #[cfg(feature = "prefetch")]
    pub fn state_span(&self) -> (*const u8, usize) {
        match self {
            Node::Sender(s) => (std::ptr::from_ref::<Sender>(s).cast(), std::mem::size_of::<Sender>()),
            Node::Proxy(p) => (std::ptr::from_ref::<Proxy>(p).cast(), std::mem::size_of::<Proxy>()),
            Node::Receiver(r) => (std::ptr::from_ref::<Receiver>(r).cast(), std::mem::size_of::<Receiver>()),
            Node::ShardSender(s) => (std::ptr::from_ref::<ShardSender>(s).cast(), std::mem::size_of::<ShardSender>()),
            Node::ShardReceiver(r) => {
                (std::ptr::from_ref::<ShardReceiver>(r).cast(), std::mem::size_of::<ShardReceiver>())
            }
        }
    }

    /// Its clock.
    pub fn sync(&self) -> &ClockSync {
        match self {
            Node::Sender(s) => &s.sync,
            Node::Proxy(p) => &p.sync,
            Node::Receiver(r) => &r.sync,
            Node::ShardSender(s) => &s.sync,
            Node::ShardReceiver(r) => &r.sync,
        }
    }

    /// The clock state, to hand it what the shell reads outside the node (a
    /// host daemon's error bound: [`ClockSync::set_host_bound`]).
    pub fn sync_mut(&mut self) -> &mut ClockSync {
        match self {
            Node::Sender(s) => &mut s.sync,
            Node::Proxy(p) => &mut p.sync,
            Node::Receiver(r) => &mut r.sync,
            Node::ShardSender(s) => &mut s.sync,
            Node::ShardReceiver(r) => &mut r.sync,
        }
    }

    /// Whether it releases messages (a receiver of one tree or several).
    pub fn is_receiver(&self) -> bool {
        matches!(self, Node::Receiver(_) | Node::ShardReceiver(_))
    }

    /// Its role in the tree, in a word.
    pub fn role_name(&self) -> &'static str {
        match self {
            Node::Sender(_) | Node::ShardSender(_) => "sender",
            Node::Proxy(_) => "proxy",
            Node::Receiver(_) | Node::ShardReceiver(_) => "receiver",
        }
    }

    /// The keys it seals and checks with, if any.
    pub fn auth(&self) -> Option<&Auth> {
        match self {
            Node::Sender(s) => s.auth.as_ref(),
            Node::Proxy(p) => p.auth.as_ref(),
            Node::Receiver(r) => r.auth.as_ref(),
            Node::ShardSender(s) => s.trees[0].auth.as_ref(),
            Node::ShardReceiver(r) => r.trees[0].1.auth.as_ref(),
        }
    }

    /// Puts the keys of `keys` in force (a key rollover), keeping the
    /// freshness rule. A node started without authentication stays without.
    pub fn set_keys(&mut self, keys: &Auth) {
        let auths: Vec<&mut Option<Auth>> = match self {
            Node::Sender(s) => vec![&mut s.auth],
            Node::Proxy(p) => vec![&mut p.auth],
            Node::Receiver(r) => vec![&mut r.auth],
            Node::ShardSender(s) => s.trees.iter_mut().map(|t| &mut t.auth).collect(),
            Node::ShardReceiver(r) => r.trees.iter_mut().map(|(_, t)| &mut t.auth).collect(),
        };
        for a in auths.into_iter().flatten() {
            a.replace_keys(keys);
        }
    }

    /// Packets refused by the key check, by reason.
    pub fn auth_stats(&self) -> AuthStats {
        match self {
            Node::Sender(s) => s.stats.auth,
            Node::Proxy(p) => p.stats.auth,
            Node::Receiver(r) => r.stats.auth,
            Node::ShardSender(s) => s.trees.iter().fold(AuthStats::default(), |mut a, t| {
                a.add(&t.stats.auth);
                a
            }),
            Node::ShardReceiver(r) => r.stats().auth,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Sent(Vec<(u32, Vec<u8>)>);

    impl Transmit for Sent {
        fn send(&mut self, to: u32, bytes: &[u8]) {
            self.0.push((to, bytes.to_vec()));
        }
    }

    #[test]
    fn every_packet_says_what_became_of_it() {
        let cfg = NodeConfig::default();
        let mut sender = Sender::new(9, vec![5], cfg, DeadlineRule::Paper { margin_ns: 0 });
        let mut out = Sent::default();
        let seq = sender.handle_message(1_000, b"hello", &mut out);
        let (_, mut copy) = out.0.pop().unwrap();
        // Through a proxy: new (forwarded to both targets), then a duplicate.
        let mut proxy = Node::Proxy(Box::new(Proxy::new(5, 9, &[1], &[2], cfg)));
        let mut fwd = Sent::default();
        assert_eq!(
            proxy.handle_packet(1_500, &mut copy, &mut fwd),
            Outcome::New { sequence: seq, hops: 1, owd_ns: 500 }
        );
        assert_eq!(fwd.0.iter().map(|(to, _)| *to).collect::<Vec<_>>(), vec![1, 2]);
        let mut again = fwd.0[0].1.clone();
        assert_eq!(proxy.handle_packet(1_600, &mut again, &mut fwd), Outcome::Duplicate { sequence: seq });
        // At a receiver: two links crossed; later copies and garbage say so.
        let mut rx = Node::Receiver(Box::new(Receiver::new(1, 5, cfg)));
        let mut b = fwd.0[0].1.clone();
        assert_eq!(rx.handle_packet(2_000, &mut b, &mut fwd), Outcome::New { sequence: seq, hops: 2, owd_ns: 1_000 });
        assert_eq!(rx.handle_packet(2_100, &mut b, &mut fwd), Outcome::Duplicate { sequence: seq });
        assert_eq!(rx.handle_packet(2_200, &mut [1, 2, 3], &mut fwd), Outcome::Refused(Refusal::Malformed));
        assert_eq!(rx.held(), 1, "held until its deadline");
        // Data at the sender is not its kind.
        let mut s = Node::Sender(Box::new(sender));
        assert_eq!(s.handle_packet(2_300, &mut b, &mut fwd), Outcome::Refused(Refusal::Unexpected));
        assert_eq!((s.id(), proxy.id(), rx.id()), (9, 5, 1));
    }

    /// A cheating receiver (test mode) releases its lead before the
    /// deadline and still reports the deadline the sender set; an honest one
    /// holds to it.
    #[test]
    fn a_cheating_receiver_releases_its_lead_early() {
        let cfg = NodeConfig { initial_owd_ns: 100_000, ..NodeConfig::default() };
        let mut sender = Sender::new(9, vec![1, 2], cfg, DeadlineRule::Paper { margin_ns: 0 });
        let mut out = Sent::default();
        sender.handle_message(1_000_000, b"hello", &mut out);
        let deadline = 1_000_000 + sender.deadline_offset_ns();
        let mut honest = Receiver::new(1, 9, cfg);
        let mut cheat = Receiver::new(2, 9, NodeConfig { release_lead_ns: 5_000, ..cfg });
        for (rx, copy) in [(&mut honest, &out.0[0].1), (&mut cheat, &out.0[1].1)] {
            rx.handle_packet(1_010_000, copy);
        }
        assert_eq!(cheat.next_timeout(), Some(deadline - 5_000));
        assert_eq!(honest.next_timeout(), Some(deadline));
        cheat.release_due(deadline - 5_000);
        honest.release_due(deadline - 5_000);
        assert!(honest.poll_release().is_none(), "the honest receiver holds to the deadline");
        let r = cheat.poll_release().expect("the cheat has released");
        assert_eq!((r.deadline_ns, r.due_ns, r.late), (deadline, deadline - 5_000, false));
    }

    /// A gateway's last hop: released that much early, stating the
    /// deadline, and its reported delays (so the sender's OWD_G) include it.
    #[test]
    fn a_last_hop_moves_the_release_and_the_reported_delay() {
        let cfg = NodeConfig { initial_owd_ns: 100_000, report_interval_ns: 5_000_000, ..NodeConfig::default() };
        let mut sender = Sender::new(9, vec![1], cfg, DeadlineRule::Paper { margin_ns: 0 });
        let mut out = Sent::default();
        sender.handle_message(1_000_000, b"hello", &mut out);
        let deadline = 1_000_000 + sender.deadline_offset_ns();
        let mut gw = Receiver::new(1, 9, cfg);
        gw.set_last_hop_ns(30_000);
        gw.handle_packet(1_010_000, &out.0[0].1);
        assert_eq!(gw.next_timeout(), Some(deadline - 30_000));
        gw.release_due(deadline - 30_000);
        let r = gw.poll_release().expect("released ahead of the hop");
        assert_eq!((r.deadline_ns, r.due_ns, r.late), (deadline, deadline - 30_000, false));
        // Its report: the tree's 10 µs plus the hop's 30 µs.
        let mut rep = Sent::default();
        gw.handle_timeout(6_000_000, &mut rep);
        let (_, bytes) = rep.0.iter().find(|(to, _)| *to == 9).expect("a report to the sender");
        sender.handle_packet(6_000_100, bytes);
        assert_eq!(sender.deadline_offset_ns(), 40_000);
    }
}
