//! Hedged copies the receiving node is certain to drop, known when they are sent.
//!
//! With sibling hedging every node gets each message H + 1 times, and all
//! but the first are dropped by its duplicate window: at N = 10,000 and
//! H = 2 that is 20,000 of the ≈ 54,000 events per message, each a cache miss
//! on a node's state for nothing but two counters. A hop's arrival time is
//! drawn when the copy is sent, so the engine knows then whether a copy of
//! the same message is already on its way to the same node and arrives no
//! later: such a copy is **elided** (never queued). And when the new copy
//! arrives strictly earlier than the one on its way, that one is
//! **cancelled** (its arena slot emptied; the event stays on the queue and is
//! popped without touching the node).
//!
//! Exactness: the node would have found either copy a duplicate — the same
//! sequence number from the same tree, after an earlier copy — and a
//! duplicate changes nothing but `received` and `duplicates` (not part of
//! any result) and the engine's packet counts (kept: an elided copy is
//! counted when it is elided, a cancelled one when it is popped). The run's
//! end is kept too: it lasts at least until the last elided copy's
//! (time, order) key ([`DupFilter::last`]). Two conditions make it exact and
//! are checked by the engine before using the filter: receive timestamps
//! draw no noise (a draw per delivery would shift the random stream) and no
//! node stalls (a stalled node requeues what reaches it). A copy that might
//! arrive after the duplicate window has moved past its message (it would be
//! refused as too old, not counted a duplicate) is left alone: see
//! [`DupFilter::new`]'s `span_ns`. Runs with and without the filter give the
//! same results, event counts aside (tests in `engine.rs`).

/// What to do with a data copy about to be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Queue it.
    Push,
    /// Do not queue it: an earlier-or-equal copy is on its way.
    Elide,
    /// Queue it, and cancel the copy on its way in this arena slot (it arrives later).
    PushAndCancel(usize),
}

/// The copy of a node's newest sequence number that arrives first, among those queued.
#[derive(Debug, Clone, Copy)]
struct First {
    seq: u64,
    at: u64,
    slot: usize,
}

const NONE: First = First { seq: 0, at: 0, slot: usize::MAX };

/// Per node, the earliest queued copy of its newest message.
#[derive(Debug)]
pub struct DupFilter {
    first: Vec<First>,
    /// True send time of each sequence number (when its first copy left), `u64::MAX`: not yet.
    sent_at: Vec<u64>,
    span_ns: u64,
    /// Greatest (time, order) key of a copy elided: the run goes on until then.
    pub last: (u64, u64),
}

impl DupFilter {
    /// A filter for `nodes` nodes that leaves alone any copy arriving
    /// `span_ns` or more after its message was sent.
    pub fn new(nodes: usize, span_ns: u64) -> Self {
        DupFilter { first: vec![NONE; nodes], sent_at: Vec::new(), span_ns, last: (0, 0) }
    }

    /// The filter's `span_ns` for a feed of one message every `gap_ns`:
    /// within half the duplicate window's worth of messages, no message
    /// `window` newer can have been sent, so the window still holds this one.
    pub fn span_for(window: u64, gap_ns: u64) -> u64 {
        (window / 2).saturating_mul(gap_ns)
    }

    /// A data copy of message `seq` for node `to`, sent at `now`, arriving at `at`.
    pub fn judge(&mut self, to: u32, seq: u64, now: u64, at: u64) -> Verdict {
        let i = seq as usize;
        if i >= self.sent_at.len() {
            // The first copy of a message is the sender's, sent when the message is.
            self.sent_at.resize(i + 1, u64::MAX);
        }
        if self.sent_at[i] == u64::MAX {
            self.sent_at[i] = now;
        }
        let sent = self.sent_at[i];
        let Some(f) = self.first.get(to as usize).copied() else { return Verdict::Push };
        if f.slot == usize::MAX || f.seq != seq {
            return Verdict::Push;
        }
        let within = |t: u64| t.saturating_sub(sent) < self.span_ns;
        if f.at <= at && within(at) {
            Verdict::Elide
        } else if at < f.at && within(f.at) {
            Verdict::PushAndCancel(f.slot)
        } else {
            Verdict::Push
        }
    }

    /// A copy of `seq` for `to` arriving at `at` was queued in arena slot `slot`.
    pub fn queued(&mut self, to: u32, seq: u64, at: u64, slot: usize) {
        if let Some(f) = self.first.get_mut(to as usize) {
            let newer = f.slot == usize::MAX || seq > f.seq;
            if newer || (seq == f.seq && at < f.at) {
                *f = First { seq, at, slot };
            }
        }
    }

    /// A copy was elided; it would have been queued with key (`at`, `order`).
    pub fn elided_at(&mut self, at: u64, order: u64) {
        self.last = self.last.max((at, order));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_copies_are_elided_and_earlier_ones_cancel() {
        let mut d = DupFilter::new(4, DupFilter::span_for(1 << 16, 1_000));
        assert_eq!(d.judge(2, 7, 100, 500), Verdict::Push);
        d.queued(2, 7, 500, 11);
        assert_eq!(d.judge(2, 7, 150, 500), Verdict::Elide, "equal time, queued later: popped later");
        assert_eq!(d.judge(2, 7, 150, 900), Verdict::Elide);
        assert_eq!(d.judge(2, 7, 160, 300), Verdict::PushAndCancel(11));
        d.queued(2, 7, 300, 12);
        assert_eq!(d.judge(2, 7, 170, 400), Verdict::Elide);
        assert_eq!(d.judge(3, 7, 170, 400), Verdict::Push, "another node");
        assert_eq!(d.judge(2, 8, 170, 400), Verdict::Push, "another message");
        d.queued(2, 8, 400, 13);
        assert_eq!(d.judge(2, 7, 180, 200), Verdict::Push, "an older message is left alone");
    }

    #[test]
    fn a_first_copy_that_already_arrived_still_makes_the_next_a_duplicate() {
        let mut d = DupFilter::new(2, u64::MAX);
        assert_eq!(d.judge(1, 3, 0, 50), Verdict::Push);
        d.queued(1, 3, 50, 4);
        // At 60 the first copy was handled (slot 4 may hold another packet by now):
        // a copy sent now arrives later, so it is a duplicate, and never cancels slot 4.
        assert_eq!(d.judge(1, 3, 60, 90), Verdict::Elide);
        assert_eq!(d.judge(1, 3, 60, 60), Verdict::Elide);
    }

    #[test]
    fn copies_beyond_the_span_are_left_alone() {
        // One message every µs and a window of 64: the span is 32 µs.
        let mut d = DupFilter::new(2, DupFilter::span_for(64, 1_000));
        assert_eq!(d.judge(0, 1, 0, 10_000), Verdict::Push);
        d.queued(0, 1, 10_000, 0);
        assert_eq!(d.judge(0, 1, 5_000, 31_999), Verdict::Elide);
        assert_eq!(d.judge(0, 1, 5_000, 32_000), Verdict::Push, "might be too old by then");
        d.queued(0, 2, 40_000, 1);
        d.queued(0, 2, 39_000, 2);
        assert_eq!(d.judge(0, 2, 6_000, 39_500), Verdict::Push, "first seen at 6 µs: 39.5 µs is beyond the span");
    }
}
