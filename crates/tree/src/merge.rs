//! One feed out of K trees: a receiver that takes several sharded trees
//! ([`crate::shard`]) hands its application one MoldUDP64 session, in one
//! order that is the same at every receiver.
//!
//! Each tree's receiver releases its own packets in its own sequence order
//! ([`crate::node::ReleaseOrder::Sequence`]: at the deadline, or after its
//! predecessor, with its own gap wait). The merge takes those releases and
//! interleaves the trees by **(due, deadline, send stamp, tree, sequence)**
//! — a k-way merge of the trees' queues, so each tree's (each symbol's) order
//! is kept whatever the keys. A message on time is due at its deadline,
//! which the sender stamped, and the sender stamps every packet it sends a
//! distinct send time ([`crate::sharded::ShardSender`]): so every receiver at
//! which the messages were on time delivers them in the same order, byte for
//! byte. A late message (or one held behind a late one) is due when it came,
//! so it is delivered then — as under one tree, the receiver where it was late
//! saw it late, and there its position differs (counted by the tree's
//! receiver as `late` / `held_by_gap`).
//!
//! A market-wide message comes on every tree ([`crate::shard::Dest::Every`],
//! flagged [`overlay::FLAG_EVERY_TREE`], one send stamp for all copies). It is
//! a **barrier**: delivered once, when every tree has reached its copy (or
//! shown, by releasing something stamped after it, that its copy was lost) —
//! so it comes after everything sent before it on every tree and before
//! everything sent after it. A tree that neither reaches nor passes its copy
//! within `barrier_wait_ns` of the first copy's release is not waited for
//! longer (`barrier_timeouts`).
//!
//! The session delivered is [`merged_session`]; messages are numbered from 1
//! in delivery order. A run of messages a tree lost (given up by its gap
//! wait) advances the numbering by as many, so the application sees the
//! gap it would see on one MoldUDP64 line (one larger where the run held a
//! market-wide copy that another tree delivered — never smaller).

use std::collections::{HashSet, VecDeque};

use fairfeed_wire::moldudp64::{Packet, PacketBuilder, Session};
use fairfeed_wire::overlay;

use crate::node::Released;

/// Releases a merge queues at most behind a pending barrier; beyond it the
/// barrier is given up (counted) rather than memory growing.
pub const MERGE_QUEUE_MAX: usize = 65_536;
/// A market-wide copy stamped further than this ahead of the receiver's
/// clock is no barrier (a broken or forged stamp would otherwise make every
/// later market-wide message look old): it is delivered as it is, counted.
pub const EVERY_AHEAD_MAX_NS: u64 = 1_000_000_000;
/// How long a barrier waits by default for a tree's copy after the first
/// copy's release (as long as a tree waits for a missing message).
pub const BARRIER_WAIT_DEFAULT_NS: u64 = crate::node::GAP_WAIT_DEFAULT_NS;

/// The session a merged feed is delivered as: the feed's first seven
/// characters and `MRG` (`NASDAQ0T03` → `NASDAQ0MRG`).
pub fn merged_session(tree: Session) -> Session {
    let mut s = tree;
    s.0[7..10].copy_from_slice(b"MRG");
    s
}

/// Merge counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MergeStats {
    /// Packets delivered (a market-wide message once).
    pub delivered: u64,
    /// Messages in them.
    pub messages: u64,
    /// Market-wide messages delivered, and the other trees' copies dropped.
    pub barriers: u64,
    /// ... and the other trees' copies of them dropped.
    pub every_copies: u64,
    /// Barriers delivered without some tree's copy after the wait, or to bound the queues.
    pub barrier_timeouts: u64,
    /// Messages the trees lost (the numbering skips them).
    pub lost_messages: u64,
    /// Releases that were not MoldUDP64 packets (delivered as they are, unnumbered).
    pub unframed: u64,
    /// Market-wide copies stamped beyond [`EVERY_AHEAD_MAX_NS`] ahead (delivered, no barrier).
    pub bad_stamps: u64,
    /// With a symbol filter: messages of other symbols left out, and
    /// packets left with none (not delivered).
    pub filtered_messages: u64,
    /// ... and packets left with none (not delivered).
    pub filtered_packets: u64,
}

/// A receiver's subscription: the symbols it delivers (with the
/// market-wide messages, stock locate 0). A symbol is known by its stock
/// locate once its Stock Directory (`R`) message has come by on its tree;
/// before that its messages cannot be told from others' and are left out
/// (a receiver that starts after the directory needs a snapshot).
#[derive(Debug, Clone, Default)]
pub struct SymbolFilter {
    wanted: HashSet<[u8; 8]>,
    locates: HashSet<u16>,
}

impl SymbolFilter {
    /// Delivers `symbols` (each space-padded to 8 bytes, as ITCH carries them).
    pub fn new(symbols: impl IntoIterator<Item = [u8; 8]>) -> SymbolFilter {
        SymbolFilter { wanted: symbols.into_iter().collect(), locates: HashSet::new() }
    }

    /// Whether message `m` is delivered (learning its locate if it names a wanted symbol).
    fn keep(&mut self, m: &[u8]) -> bool {
        let Some(locate) = m.get(1..3).map(|b| u16::from_be_bytes([b[0], b[1]])) else { return false };
        if m[0] == b'R' {
            if let Some(sym) = m.get(11..19).and_then(|s| <[u8; 8]>::try_from(s).ok()) {
                if self.wanted.contains(&sym) {
                    self.locates.insert(locate);
                }
            }
        }
        locate == 0 || self.locates.contains(&locate)
    }
}

struct Entry {
    tree: usize,
    every: bool,
    r: Released,
}

impl Entry {
    fn key(&self) -> (u64, u64, u64, usize, u64) {
        (self.r.due_ns, self.r.deadline_ns, self.r.send_ns, self.tree, self.r.sequence)
    }
}

struct Barrier {
    first: Entry,
    /// Trees that reached their copy or released something after it.
    done: Vec<bool>,
    /// When the first copy fell due.
    since_ns: u64,
    /// The latest copy's due time.
    due_ns: u64,
}

/// The merge of K trees' releases at one receiver (see the module docs).
pub struct Merge {
    queues: Vec<VecDeque<Entry>>,
    /// Each tree's next MoldUDP64 sequence number (`None` before its first packet).
    next_mold: Vec<Option<u64>>,
    /// The delivered session's next sequence number.
    next_out: u64,
    /// The send stamp of the last market-wide message delivered.
    last_every_ns: Option<u64>,
    barrier: Option<Barrier>,
    barrier_wait_ns: u64,
    out: VecDeque<Released>,
    filter: Option<SymbolFilter>,
    /// Its counters.
    pub stats: MergeStats,
}

impl Merge {
    /// A merge of `trees` trees (indices 0..trees, the receiver's own
    /// numbering of the trees it takes).
    pub fn new(trees: usize, barrier_wait_ns: u64) -> Merge {
        assert!((1..=crate::plan::TREES_MAX).contains(&trees), "1..={} trees", crate::plan::TREES_MAX);
        Merge {
            queues: (0..trees).map(|_| VecDeque::new()).collect(),
            next_mold: vec![None; trees],
            next_out: 1,
            last_every_ns: None,
            barrier: None,
            barrier_wait_ns,
            out: VecDeque::new(),
            filter: None,
            stats: MergeStats::default(),
        }
    }

    /// Delivers only the subscription's symbols (and market-wide messages).
    pub fn with_filter(mut self, f: SymbolFilter) -> Merge {
        self.filter = Some(f);
        self
    }

    /// `r`'s packet with the messages the filter leaves out removed
    /// (`None`: none left). Unframed payloads pass as they are.
    fn filtered(&mut self, mut r: Released) -> Option<Released> {
        let Some(f) = &mut self.filter else { return Some(r) };
        let Ok(p) = Packet::new_checked(&r.payload[..]) else { return Some(r) };
        if p.is_heartbeat() || p.is_end_of_session() {
            return Some(r);
        }
        let keep: Vec<bool> = p.messages().map_while(Result::ok).map(|m| f.keep(m)).collect();
        let kept = keep.iter().filter(|&&k| k).count();
        self.stats.filtered_messages += (keep.len() - kept) as u64;
        if kept == keep.len() {
            return Some(r);
        }
        if kept == 0 {
            self.stats.filtered_packets += 1;
            return None;
        }
        let mut buf = vec![0u8; r.payload.len()];
        let mut b = PacketBuilder::new(&mut buf, p.session(), p.sequence()).ok()?;
        for (m, _) in p.messages().map_while(Result::ok).zip(&keep).filter(|(_, &k)| k) {
            b.push(m).ok()?;
        }
        let n = b.finish();
        r.payload = crate::node::Payload::from_slice(&buf[..n]);
        Some(r)
    }

    /// Tree `tree` released `r` (in its own sequence order); `flags` are the
    /// overlay header's.
    pub fn push(&mut self, tree: usize, r: Released) {
        let every = r.flags & overlay::FLAG_EVERY_TREE != 0;
        self.queues[tree].push_back(Entry { tree, every, r });
    }

    /// Delivers what can go at `now` (the receiver's synchronized clock),
    /// in merged order; take it with [`Merge::poll`].
    pub fn flush(&mut self, now: u64) {
        loop {
            self.absorb_copies();
            if self.barrier_ready(now) {
                self.deliver_barrier();
                continue;
            }
            let blocked_after = self.barrier.as_ref().map(|b| b.first.r.send_ns);
            let pick = (0..self.queues.len())
                .filter_map(|t| self.queues[t].front().map(|e| (e.key(), t)))
                .filter(|&((_, _, send, _, _), _)| blocked_after.is_none_or(|b| send < b))
                .min();
            let Some((_, t)) = pick else { break };
            let Some(e) = self.queues[t].pop_front() else { break };
            self.account(e.tree, &e.r);
            if e.every && e.r.send_ns > now.saturating_add(EVERY_AHEAD_MAX_NS) {
                self.stats.bad_stamps += 1;
                self.deliver(e.r);
            } else if e.every {
                // The first copy of a market-wide message: wait for the other trees.
                let mut done = vec![false; self.queues.len()];
                done[t] = true;
                let since = e.r.due_ns;
                self.barrier = Some(Barrier { first: e, done, since_ns: since, due_ns: since });
            } else {
                self.deliver(e.r);
            }
        }
    }

    /// Drops copies of the pending barrier (and of market-wide messages
    /// already delivered) at the queues' heads, and marks trees that passed it.
    fn absorb_copies(&mut self) {
        for t in 0..self.queues.len() {
            while let Some(e) = self.queues[t].front() {
                let send = e.r.send_ns;
                let old = e.every && self.last_every_ns.is_some_and(|l| send <= l);
                let copy = e.every && self.barrier.as_ref().is_some_and(|b| b.first.r.send_ns == send);
                if !(old || copy) {
                    if let Some(b) = &mut self.barrier {
                        // A release stamped after the barrier: this tree's copy was lost.
                        b.done[t] |= send > b.first.r.send_ns;
                    }
                    break;
                }
                let Some(e) = self.queues[t].pop_front() else { break };
                self.account(t, &e.r);
                self.stats.every_copies += 1;
                if let Some(b) = self.barrier.as_mut().filter(|_| copy) {
                    b.done[t] = true;
                    b.due_ns = b.due_ns.max(e.r.due_ns);
                }
            }
        }
    }

    fn barrier_ready(&mut self, now: u64) -> bool {
        let Some(b) = &self.barrier else { return false };
        if b.done.iter().all(|&d| d) {
            return true;
        }
        let queued: usize = self.queues.iter().map(VecDeque::len).sum();
        let timed_out = now >= b.since_ns.saturating_add(self.barrier_wait_ns) || queued >= MERGE_QUEUE_MAX;
        self.stats.barrier_timeouts += u64::from(timed_out);
        timed_out
    }

    fn deliver_barrier(&mut self) {
        let Some(b) = self.barrier.take() else { return };
        self.last_every_ns = Some(b.first.r.send_ns);
        self.stats.barriers += 1;
        let mut r = b.first.r;
        r.due_ns = b.due_ns;
        self.deliver(r);
    }

    /// Counts what tree `tree` lost before `r` and moves its line on.
    fn account(&mut self, tree: usize, r: &Released) {
        let Ok(p) = Packet::new_checked(&r.payload[..]) else { return };
        let seq = p.sequence();
        if let Some(want) = self.next_mold[tree] {
            let lost = seq.saturating_sub(want);
            self.stats.lost_messages += lost;
            self.next_out += lost;
        }
        let next = if p.is_end_of_session() || p.is_heartbeat() { seq } else { p.next_sequence() };
        self.next_mold[tree] = Some(next.max(self.next_mold[tree].unwrap_or(0)));
    }

    /// Renumbers `r` into the merged session and queues it for the application.
    fn deliver(&mut self, r: Released) {
        let Some(mut r) = self.filtered(r) else { return };
        self.stats.delivered += 1;
        match Packet::new_checked(&mut r.payload[..]) {
            Ok(mut p) => {
                let count = if p.is_end_of_session() || p.is_heartbeat() { 0 } else { u64::from(p.count()) };
                p.set_session(merged_session(p.session()));
                p.set_sequence(self.next_out);
                self.next_out += count;
                self.stats.messages += count;
            }
            Err(_) => self.stats.unframed += 1,
        }
        self.out.push_back(r);
    }

    /// The next packet for the application, in merged order.
    pub fn poll(&mut self) -> Option<Released> {
        self.out.pop_front()
    }

    /// When a pending barrier stops waiting (`None`: none pending).
    pub fn next_timeout(&self) -> Option<u64> {
        self.barrier.as_ref().map(|b| b.since_ns.saturating_add(self.barrier_wait_ns))
    }

    /// Releases queued behind a barrier.
    pub fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// The delivered session's next sequence number.
    pub fn next_sequence(&self) -> u64 {
        self.next_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{Payload, Released};
    use fairfeed_wire::moldudp64::PacketBuilder;

    fn release(tree: u16, seq: u64, mold: u64, send_ns: u64, every: bool) -> Released {
        let mut buf = [0u8; 64];
        let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("NASDAQ0T00"), mold).unwrap();
        b.push(&[b'A', 0, 1]).unwrap();
        let n = b.finish();
        Released {
            tree,
            flags: if every { overlay::FLAG_EVERY_TREE } else { 0 },
            sequence: seq,
            payload: Payload::from_slice(&buf[..n]),
            deadline_ns: send_ns + 100,
            arrival_ns: send_ns + 50,
            send_ns,
            late: false,
            due_ns: send_ns + 100,
            clock_ok: true,
        }
    }

    #[test]
    fn a_market_wide_message_waits_for_every_tree_and_goes_once() {
        let mut m = Merge::new(2, 1_000);
        m.push(0, release(0, 1, 1, 10, true));
        m.push(0, release(0, 2, 2, 30, false));
        m.flush(200);
        assert!(m.poll().is_none(), "tree 1 has not reached its copy");
        m.push(1, release(1, 1, 1, 5, false));
        m.push(1, release(1, 2, 2, 10, true));
        m.flush(200);
        let order: Vec<(u16, u64)> = std::iter::from_fn(|| m.poll()).map(|r| (r.tree, r.send_ns)).collect();
        assert_eq!(order, [(1, 5), (0, 10), (0, 30)], "before it, it once, after it");
        assert_eq!((m.stats.barriers, m.stats.every_copies), (1, 1));
        assert_eq!(m.next_sequence(), 4, "three messages numbered 1..=3");
    }

    #[test]
    fn a_tree_that_never_reaches_the_barrier_is_not_waited_for_past_the_wait() {
        let mut m = Merge::new(2, 1_000);
        m.push(0, release(0, 1, 1, 10, true));
        m.flush(200);
        assert_eq!(m.next_timeout(), Some(110 + 1_000));
        m.flush(1_109);
        assert!(m.poll().is_none());
        m.flush(1_110);
        assert!(m.poll().is_some());
        assert_eq!(m.stats.barrier_timeouts, 1);
    }

    #[test]
    fn a_copy_stamped_far_ahead_is_no_barrier() {
        let mut m = Merge::new(2, 1_000);
        m.push(0, release(0, 1, 1, 5_000_000_000, true));
        m.flush(1_000);
        assert!(m.poll().is_some(), "delivered at once");
        assert_eq!((m.stats.bad_stamps, m.stats.barriers), (1, 0));
        // A genuine market-wide message later still waits for both trees.
        m.push(0, release(0, 2, 2, 2_000, true));
        m.flush(3_000);
        assert!(m.poll().is_none());
    }

    #[test]
    fn a_subscription_delivers_its_symbols_and_the_market_wide_messages() {
        let pkt = |mold: u64, msgs: &[Vec<u8>]| {
            let mut buf = [0u8; 512];
            let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("NASDAQ0T00"), mold).unwrap();
            for m in msgs {
                b.push(m).unwrap();
            }
            let n = b.finish();
            Released { payload: Payload::from_slice(&buf[..n]), ..release(0, mold, mold, mold * 10, false) }
        };
        let msg = |kind: u8, locate: u16| {
            let mut m = vec![0u8; 20];
            m[0] = kind;
            m[1..3].copy_from_slice(&locate.to_be_bytes());
            m
        };
        let mut dir = msg(b'R', 7);
        dir[11..19].copy_from_slice(b"AAPL    ");
        let mut m = Merge::new(1, 1_000).with_filter(SymbolFilter::new([*b"AAPL    "]));
        m.push(0, pkt(1, &[msg(b'A', 7)])); // before its directory: not known yet
        m.push(0, pkt(2, &[dir.clone(), msg(b'A', 8)]));
        m.push(0, pkt(4, &[msg(b'A', 8)])); // only another symbol: not delivered
        m.push(0, pkt(5, &[msg(b'S', 0), msg(b'E', 7), msg(b'A', 9)]));
        m.flush(10_000);
        let got: Vec<Vec<u8>> = std::iter::from_fn(|| m.poll())
            .flat_map(|r| {
                Packet::new_checked(&r.payload[..])
                    .unwrap()
                    .messages()
                    .map(|x| x.unwrap()[..3].to_vec())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(got, [dir[..3].to_vec(), msg(b'S', 0)[..3].to_vec(), msg(b'E', 7)[..3].to_vec()]);
        assert_eq!((m.stats.filtered_messages, m.stats.filtered_packets), (4, 2));
        assert_eq!(m.next_sequence(), 4, "three messages numbered 1..=3: left out is not lost");
    }

    #[test]
    fn lost_messages_leave_a_gap_of_their_count_in_the_numbering() {
        let mut m = Merge::new(1, 1_000);
        m.push(0, release(0, 1, 1, 10, false));
        m.push(0, release(0, 2, 5, 20, false));
        m.flush(500);
        let seqs: Vec<u64> =
            std::iter::from_fn(|| m.poll()).map(|r| Packet::new_checked(&r.payload[..]).unwrap().sequence()).collect();
        assert_eq!(seqs, [1, 5]);
        assert_eq!(m.stats.lost_messages, 3);
    }
}
