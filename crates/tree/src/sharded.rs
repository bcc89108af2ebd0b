//! The sender and the receivers of a feed sharded over K trees (Jasper §3):
//! one node, one socket, one clock, K trees' state machines.
//!
//! - [`ShardSender`]: one feed in (MoldUDP64 packets), split by symbol with a
//!   [`Sharder`], each tree's packets sent by that tree's [`Sender`] — its
//!   own sequence numbers, its own reports and deadline controller. It stamps
//!   every packet it sends a distinct send time (a nanosecond later than the
//!   last if the clock has not moved), except the copies of a market-wide
//!   packet, which share one: the stamp is the feed order receivers merge by.
//! - [`ShardReceiver`]: the trees it takes, each a [`Receiver`] releasing in
//!   its own sequence order, and a [`Merge`] that makes one MoldUDP64 session
//!   of them, in the same order at every receiver where the messages were on
//!   time.
//!
//! The node's clock synchronization is one [`ClockSync`] for all its trees
//! (a host has one clock): it is lent to each tree's state machine for the
//! call that needs it, and its probes travel on the first tree's edges.

use std::collections::BTreeMap;

use fairfeed_clock::ClockSync;
use fairfeed_wire::overlay::{self, HeaderRepr, Kind};

use crate::merge::{Merge, MergeStats, SymbolFilter};
use crate::node::{earliest, DeadlineRule, Node, NodeConfig};
use crate::node::{Outcome, Receiver, ReceiverStats, Refusal, Released, Sender, SenderStats, Transmit};
use crate::plan::{Role, Topology};
use crate::shard::{Dest, ShardError, ShardMap, ShardStats, Sharder};
use crate::tail::{quantile_upper, TailEstimator, RECENT, SAMPLES_MIN};

/// A sender of one feed over several trees.
pub struct ShardSender {
    /// Its node id.
    pub id: u32,
    /// The trees' senders, by tree id (0..K).
    pub trees: Vec<Sender>,
    sharder: Sharder,
    /// The last send stamp given.
    last_stamp: u64,
    /// The node's clock reference (lent to the trees' senders).
    pub sync: ClockSync,
    /// The trees' settled samples, pooled (see [`ShardSender::pool_tails`]).
    pool: Vec<u64>,
    /// Samples settled over the trees when the pool was last taken.
    pool_count: usize,
    /// Every tree has an estimate of its own (or there is no quantile rule).
    pooled_done: bool,
}

impl ShardSender {
    /// `trees[k]` sends tree k (its config's tree id must be k); `sharder`
    /// splits the feed over as many.
    pub fn new(id: u32, trees: Vec<Sender>, sharder: Sharder, sync: ClockSync) -> ShardSender {
        assert_eq!(trees.len(), sharder.trees(), "one sender per tree");
        ShardSender { id, trees, sharder, last_stamp: 0, sync, pool: Vec::new(), pool_count: 0, pooled_done: false }
    }

    /// Sends one feed packet down the trees its messages belong to; returns
    /// the per-tree packets sent.
    pub fn handle_feed(&mut self, now: u64, packet: &[u8], tx: &mut impl Transmit) -> Result<usize, ShardError> {
        let (trees, last) = (&mut self.trees, &mut self.last_stamp);
        self.sharder.split(packet, |dest, p| {
            let (stamp, flags) = match dest {
                // Every copy of a market-wide packet carries the first copy's stamp.
                Dest::Every(t) if t > 0 => (*last, overlay::FLAG_EVERY_TREE),
                Dest::Every(_) => (now.max(last.saturating_add(1)), overlay::FLAG_EVERY_TREE),
                Dest::Tree(_) => (now.max(last.saturating_add(1)), 0),
            };
            *last = stamp;
            if let Some(s) = trees.get_mut(usize::from(dest.tree())) {
                s.handle_message_flagged(stamp, p, flags, tx);
            }
        })
    }

    /// Sends one payload down tree `tree` as it is (no splitting: a feed
    /// already sharded, or the simulator's opaque messages); returns its
    /// overlay sequence number on that tree.
    pub fn handle_message(&mut self, tree: usize, now: u64, payload: &[u8], tx: &mut impl Transmit) -> u64 {
        let stamp = now.max(self.last_stamp.saturating_add(1));
        self.last_stamp = stamp;
        self.trees[tree].handle_message_flagged(stamp, payload, 0, tx)
    }

    /// A report (to the tree it names) or a probe.
    pub fn handle_packet(&mut self, now: u64, bytes: &[u8]) -> Outcome {
        let Ok((h, _)) = HeaderRepr::parse(bytes) else { return Outcome::Refused(Refusal::Malformed) };
        let k = if h.kind == Some(Kind::Probe) { 0 } else { usize::from(h.tree) };
        let Some(s) = self.trees.get_mut(k) else { return Outcome::Refused(Refusal::Unexpected) };
        std::mem::swap(&mut self.sync, &mut s.sync);
        let o = s.handle_packet(now, bytes);
        std::mem::swap(&mut self.sync, &mut s.sync);
        o
    }

    /// When it next wants a turn (`None`: never).
    pub fn next_timeout(&self) -> Option<u64> {
        self.sync.next_timeout()
    }

    /// Sends the probes that are due.
    pub fn handle_timeout(&mut self, now: u64, tx: &mut impl Transmit) {
        let s = &mut self.trees[0];
        std::mem::swap(&mut self.sync, &mut s.sync);
        s.handle_timeout(now, tx);
        std::mem::swap(&mut self.sync, &mut s.sync);
    }

    /// Recomputes every tree's deadline from fresh reports.
    pub fn update(&mut self, now: u64) {
        self.trees.iter_mut().for_each(|s| s.update(now));
        self.pool_tails();
    }

    /// Under the quantile rule, a tree whose own controller has too few
    /// samples yet takes the estimate over every tree's settled samples: the
    /// trees end on the same receivers over like paths, and with 1/K of the
    /// messages each a tree's own controller settles K× later in the feed,
    /// its messages held to the initial offset meanwhile (OML p99 was the
    /// initial offset, 1 ms, at K ≥ 8). Done once every tree has its own.
    fn pool_tails(&mut self) {
        if self.pooled_done {
            return;
        }
        if self.trees.iter().all(Sender::tail_ready) {
            self.trees.iter_mut().for_each(|s| s.set_pooled_tail(None));
            self.pooled_done = true;
            return;
        }
        let Some(cfg) = self.trees.first().and_then(Sender::tail).map(TailEstimator::config) else {
            self.pooled_done = true;
            return;
        };
        // Recomputed when samples settled since (each tree's newest RECENT).
        let count: usize = self.trees.iter().filter_map(Sender::tail).map(TailEstimator::sample_count).sum();
        if count == self.pool_count {
            return;
        }
        self.pool_count = count;
        self.pool.clear();
        for t in self.trees.iter().filter_map(Sender::tail) {
            self.pool.extend(t.newest_samples().take(RECENT));
        }
        let pooled = (self.pool.len() >= SAMPLES_MIN).then(|| quantile_upper(&mut self.pool, cfg.target, cfg.z));
        self.trees.iter_mut().for_each(|s| s.set_pooled_tail(pooled));
    }

    /// The trees' deadline offsets.
    pub fn deadline_offsets_ns(&self) -> Vec<u64> {
        self.trees.iter().map(Sender::deadline_offset_ns).collect()
    }

    /// The sharder's counters.
    pub fn shard_stats(&self) -> ShardStats {
        self.sharder.stats
    }

    /// Per-tree counters.
    pub fn stats(&self) -> Vec<&SenderStats> {
        self.trees.iter().map(|s| &s.stats).collect()
    }
}

/// In [`ShardReceiver`]'s tree index: a tree it does not take.
const NO_TREE: u8 = u8::MAX;
const _: () = assert!(crate::plan::TREES_MAX < NO_TREE as usize);

/// What a [`ShardReceiver`] keeps of one tree's receiver between calls.
#[derive(Debug, Clone, Copy)]
struct TreeDue {
    /// [`Receiver::next_due_sync`].
    next: u64,
    /// [`Receiver::quiet_until_sync`].
    quiet: u64,
    /// Whether it has released messages not yet merged.
    released: bool,
}

impl TreeDue {
    fn of(r: &Receiver) -> TreeDue {
        TreeDue { next: r.next_due_sync(), quiet: r.quiet_until_sync(), released: r.has_released() }
    }
}

/// A receiver of several trees, delivering one feed.
pub struct ShardReceiver {
    /// Its node id.
    pub id: u32,
    /// The trees it takes: (tree id, its receiver).
    pub(crate) trees: Vec<(u16, Receiver)>,
    /// Per tree, as of its last call. A tree changes only when lent the
    /// clock ([`ShardReceiver::lend`]), which refreshes its entry; so a
    /// timeout or an arrival looks at one array, not at every tree's state
    /// (at scale, a cache miss each).
    due: Vec<TreeDue>,
    /// Tree id → index into `trees` ([`NO_TREE`]: not taken); inline, so
    /// a prefetch of the node's state brings it too.
    index: [u8; crate::plan::TREES_MAX],
    merge: Merge,
    /// The node's clock (lent to the trees' receivers).
    pub sync: ClockSync,
    /// Packets too short for a header, or for a tree it does not take.
    pub refused: u64,
}

impl ShardReceiver {
    /// `trees`: the trees it takes with their receivers (each configured
    /// for its tree, releasing in sequence order).
    /// `filter`: a subscription's symbols (`None`: every message).
    pub fn new(
        id: u32,
        trees: Vec<(u16, Receiver)>,
        sync: ClockSync,
        barrier_wait_ns: u64,
        filter: Option<SymbolFilter>,
    ) -> ShardReceiver {
        assert!(!trees.is_empty(), "a receiver takes at least one tree");
        let mut index = [NO_TREE; crate::plan::TREES_MAX];
        for (i, (t, _)) in trees.iter().enumerate() {
            index[usize::from(*t)] = u8::try_from(i).expect("at most TREES_MAX trees");
        }
        let merge = Merge::new(trees.len(), barrier_wait_ns);
        let merge = match filter {
            Some(f) => merge.with_filter(f),
            None => merge,
        };
        let due = trees.iter().map(|(_, r)| TreeDue::of(r)).collect();
        ShardReceiver { id, trees, due, index, merge, sync, refused: 0 }
    }

    /// The trees it takes: (tree id, its receiver).
    pub fn trees(&self) -> &[(u16, Receiver)] {
        &self.trees
    }

    /// Where tree `tree` is in `trees`, if it takes it.
    fn tree_index(&self, tree: u16) -> Option<usize> {
        self.index.get(usize::from(tree)).filter(|&&i| i != NO_TREE).map(|&i| usize::from(i))
    }

    /// The receiver of `tree`, if it takes it: its state's address and size
    /// (a prefetch hint, like [`crate::node::Node::state_span`]).
    #[cfg(feature = "prefetch")]
    pub fn tree_span(&self, tree: u16) -> Option<(*const u8, usize)> {
        let r = &self.trees[self.tree_index(tree)?].1;
        Some((std::ptr::from_ref::<Receiver>(r).cast(), std::mem::size_of::<Receiver>()))
    }

    /// The memory a data packet of `tree` with `sequence` will touch in that
    /// tree's receiver (prefetch hints; nothing is read there).
    #[cfg(feature = "prefetch")]
    pub fn hot_lines(&self, tree: u16, sequence: u64) -> [*const u8; 4] {
        self.tree_index(tree).map_or([std::ptr::null(); 4], |i| self.trees[i].1.hot_lines(sequence))
    }

    /// A last hop of `ns` after this node: on every tree ([`Receiver::set_last_hop_ns`]).
    pub fn set_last_hop_ns(&mut self, ns: u64) {
        for (_, r) in &mut self.trees {
            r.set_last_hop_ns(ns);
        }
    }

    /// Runs `f` on tree `i`'s receiver with the node's clock lent to it.
    fn lend<T>(&mut self, i: usize, f: impl FnOnce(&mut Receiver) -> T) -> T {
        let r = &mut self.trees[i].1;
        std::mem::swap(&mut self.sync, &mut r.sync);
        let out = f(r);
        std::mem::swap(&mut self.sync, &mut r.sync);
        self.due[i] = TreeDue::of(r);
        out
    }

    /// Moves what tree `i` released into the merge.
    fn collect(&mut self, i: usize) {
        if !self.due[i].released {
            return;
        }
        while let Some(r) = self.trees[i].1.poll_release() {
            self.merge.push(i, r);
        }
        self.due[i].released = false;
    }

    /// A packet arrived at raw local time `raw`: data of one of its trees, or a probe.
    pub fn handle_packet(&mut self, raw: u64, bytes: &[u8]) -> Outcome {
        let Ok((h, _)) = HeaderRepr::parse(bytes) else {
            self.refused += 1;
            return Outcome::Refused(Refusal::Malformed);
        };
        let i = if h.kind == Some(Kind::Probe) { Some(0) } else { self.tree_index(h.tree) };
        let Some(i) = i else {
            self.refused += 1;
            return Outcome::Refused(Refusal::Unexpected);
        };
        let o = self.lend(i, |r| r.handle_packet(raw, bytes));
        if matches!(o, Outcome::New { .. }) && self.trees[i].1.has_released() {
            // What the arrival made due merges with what every tree has due
            // now (their timers may not have fired yet): the order must not
            // depend on which came first.
            // A tree with no deadline come and no gap in its line has nothing due.
            let now = self.sync.now_sync(raw);
            for j in 0..self.trees.len() {
                if j != i && self.due[j].quiet <= now {
                    self.lend(j, |r| r.release_due(raw));
                }
                self.collect(j);
            }
            self.merge.flush(self.sync.now_sync(raw));
        }
        o
    }

    /// The earliest raw local time something is due.
    pub fn next_timeout(&self) -> Option<u64> {
        let trees = self.due.iter().map(|d| Some(d.next).filter(|&n| n != u64::MAX));
        let due = earliest(trees.chain([self.merge.next_timeout()]));
        earliest([due.map(|d| self.sync.to_local(d)), self.sync.next_timeout()])
    }

    /// Releases what is due (in merged order), sends reports and probes.
    /// A tree that is quiet ([`Receiver::quiet_until_sync`]) while the
    /// clock has nothing due is passed over: its timeout would do nothing.
    pub fn handle_timeout(&mut self, raw: u64, tx: &mut impl Transmit) {
        for i in 0..self.trees.len() {
            let quiet = self.sync.next_timeout().is_none_or(|t| t > raw) && self.due[i].quiet > self.sync.now_sync(raw);
            if !quiet {
                self.lend(i, |r| r.handle_timeout(raw, tx));
            }
            self.collect(i);
        }
        self.merge.flush(self.sync.now_sync(raw));
    }

    /// The next packet of the merged feed.
    pub fn poll_release(&mut self) -> Option<Released> {
        self.merge.poll()
    }

    /// Messages held by the trees and queued in the merge.
    pub fn held(&self) -> usize {
        self.trees.iter().map(|(_, r)| r.held()).sum::<usize>() + self.merge.queued()
    }

    /// The merge's counters.
    pub fn merge_stats(&self) -> MergeStats {
        self.merge.stats
    }

    /// The trees' counters summed (the auth counters too).
    pub fn stats(&self) -> ReceiverStats {
        let mut s = ReceiverStats::default();
        for (_, r) in &self.trees {
            let t = &r.stats;
            s.received += t.received;
            s.released += t.released;
            s.late += t.late;
            s.duplicates += t.duplicates;
            s.too_old += t.too_old;
            s.bad_packets += t.bad_packets;
            s.hold_overflow += t.hold_overflow;
            s.hold_sum_ns += t.hold_sum_ns;
            s.reports_out += t.reports_out;
            s.clock_unsynced_releases += t.clock_unsynced_releases;
            s.gaps += t.gaps;
            s.gap_packets += t.gap_packets;
            s.after_gap += t.after_gap;
            s.held_by_gap += t.held_by_gap;
            s.auth.add(&t.auth);
        }
        s.bad_packets += self.refused;
        s
    }
}

/// How a node of a sharded topology is built beyond its tree's settings.
#[derive(Debug, Clone, Default)]
pub struct ShardOptions {
    /// The sender's symbol → tree map (empty: stock locate % K alone).
    pub map: ShardMap,
    /// The trees a receiver takes (`None`: every tree, or its symbols' trees).
    pub trees: Option<Vec<u16>>,
    /// A receiver's subscription: only these symbols (space-padded to 8
    /// bytes) and the market-wide messages; it takes only their trees, which
    /// `map` must name (a symbol's stock locate, and so its default tree, is
    /// not known before its directory message).
    pub symbols: Option<Vec<[u8; 8]>>,
    /// How long a market-wide message waits for a tree's copy
    /// (0: [`crate::merge::BARRIER_WAIT_DEFAULT_NS`]).
    pub barrier_wait_ns: u64,
}

/// Node `id` of `topo`, whatever its trees: on a one-tree topology the
/// tree's node as [`Node::from_plan`] builds it; on a sharded one the sender
/// of every tree ([`ShardSender`]), a proxy of its tree, or a receiver of
/// the trees it takes ([`ShardReceiver`]). Each tree's receiver releases in
/// `cfg.order`: sequence order (what node processes and the demo run) keeps
/// each symbol's order in the merged feed; deadline order (the paper's, which
/// the simulator's fairness experiments measure) releases each message on its
/// own, a late one after later ones, as on one tree. `hedge_parents[k]` is
/// [`crate::plan::hedge_parents`] of tree k; `sync` the node's clock
/// synchronization. `None` if `id` is in no tree.
pub fn node_of(
    topo: &Topology,
    id: u32,
    cfg: NodeConfig,
    rule: DeadlineRule,
    sync: ClockSync,
    hedge_parents: &[BTreeMap<u32, Vec<u32>>],
    opts: &ShardOptions,
) -> Result<Node, ShardError> {
    let sender = crate::plan::sender_id(topo).unwrap_or(0);
    let hp = |k: usize| hedge_parents.get(k).and_then(|m| m.get(&id)).cloned().unwrap_or_default();
    let mine = crate::plan::node_in_trees(topo, id);
    let Some(&(first, n)) = mine.first() else { return Err(ShardError::NotInTopology(id)) };
    let tree_cfg = |k: u16| NodeConfig { tree: k, ..cfg };
    if topo.trees.len() == 1 || n.role == Role::Proxy {
        return Ok(Node::from_plan(n, sender, hp(usize::from(first)), tree_cfg(first), rule, sync));
    }
    if n.role == Role::Sender {
        let trees: Vec<Sender> =
            mine.iter().map(|&(k, n)| Sender::new(id, n.children.clone(), tree_cfg(k), rule)).collect();
        let sharder = Sharder::new(trees.len(), opts.map.clone())?;
        return Ok(Node::ShardSender(Box::new(ShardSender::new(id, trees, sharder, sync))));
    }
    let mut want = opts.trees.clone();
    if let Some(symbols) = &opts.symbols {
        let mut t: Vec<u16> = Vec::new();
        for sym in symbols {
            let Some(&k) = opts.map.symbols.get(sym) else {
                return Err(ShardError::Unmapped(String::from_utf8_lossy(sym).trim_end().to_string()));
            };
            t.push(k);
        }
        t.sort_unstable();
        t.dedup();
        want = Some(t);
    }
    let mut trees = Vec::new();
    for &(k, n) in &mine {
        if want.as_ref().is_some_and(|want| !want.contains(&k)) {
            continue;
        }
        let c = tree_cfg(k);
        let r = Receiver::new(id, n.parent.unwrap_or(sender), c).with_hedge_parents(hp(usize::from(k)));
        trees.push((k, r));
    }
    if trees.is_empty() {
        return Err(ShardError::NoTrees(id));
    }
    let wait = if opts.barrier_wait_ns == 0 { crate::merge::BARRIER_WAIT_DEFAULT_NS } else { opts.barrier_wait_ns };
    let filter = opts.symbols.as_ref().map(|s| SymbolFilter::new(s.iter().copied()));
    Ok(Node::ShardReceiver(Box::new(ShardReceiver::new(id, trees, sync, wait, filter))))
}
