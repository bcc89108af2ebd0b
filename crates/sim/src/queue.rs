//! The simulator's event queue: a calendar queue that pops events in exactly
//! the order a binary heap keyed by (time, insertion order, event) would.
//!
//! Nearly every event of a run lands within a millisecond of the present (a
//! hop, a release deadline), and hundreds fall in each microsecond at scale.
//! A heap pays a cache miss per level for each of them; here a push appends
//! to the bucket of its microsecond (a ring of [`BUCKETS`] buckets of
//! 2^[`BUCKET_SHIFT`] ns), and a bucket is sorted once, when the present
//! reaches it. Events further out than the ring wait in a heap and move into
//! the ring as it comes near; events pushed into the bucket being drained go
//! to a small heap beside it. The sorted bucket also lets the engine look a
//! few events ahead ([`CalendarQueue::ahead`]) to prefetch their state.

use std::cmp::Reverse;

use dary_heap::QuaternaryHeap;

/// Width of one bucket: 2^10 ns ≈ 1 µs.
pub const BUCKET_SHIFT: u32 = 10;
/// Buckets in the ring (≈ 1 ms ahead of the present; a power of two).
pub const BUCKETS: u64 = 1_024;
const _: () = assert!(BUCKETS.is_power_of_two());
/// Events a drained bucket keeps room for.
pub const BUCKET_KEEP: usize = 512;

type Item<E> = (u64, u64, E);

/// Events keyed by (time ns, insertion order); pops the least first.
pub struct CalendarQueue<E> {
    ring: Vec<Vec<Item<E>>>,
    /// Events in `ring` (not counting `sorted`).
    in_ring: usize,
    /// The bucket being drained (absolute number: time >> BUCKET_SHIFT).
    current: u64,
    /// The current bucket, sorted greatest first (pops from the end).
    sorted: Vec<Item<E>>,
    /// Pushed into the current bucket after it was sorted.
    late: QuaternaryHeap<Reverse<Item<E>>>,
    /// Further out than the ring.
    far: QuaternaryHeap<Reverse<Item<E>>>,
}

impl<E: Ord> Default for CalendarQueue<E> {
    fn default() -> Self {
        CalendarQueue {
            ring: (0..BUCKETS).map(|_| Vec::new()).collect(),
            in_ring: 0,
            current: 0,
            sorted: Vec::new(),
            late: QuaternaryHeap::new(),
            far: QuaternaryHeap::new(),
        }
    }
}

impl<E: Ord> CalendarQueue<E> {
    /// Events queued.
    pub fn len(&self) -> usize {
        self.in_ring + self.sorted.len() + self.late.len() + self.far.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues `ev` at time `at` (ns); `order` breaks ties (first in, first out).
    pub fn push(&mut self, at: u64, order: u64, ev: E) {
        let bucket = at >> BUCKET_SHIFT;
        if bucket <= self.current {
            // The bucket being drained (or, if a caller went back in time, still popped in order).
            self.late.push(Reverse((at, order, ev)));
        } else if bucket < self.current + BUCKETS {
            self.ring[(bucket % BUCKETS) as usize].push((at, order, ev));
            self.in_ring += 1;
        } else {
            self.far.push(Reverse((at, order, ev)));
        }
    }

    /// The least event: (time, event).
    pub fn pop(&mut self) -> Option<(u64, E)> {
        self.pop_keyed().map(|(t, _, ev)| (t, ev))
    }

    /// The least event with its key: (time, insertion order, event).
    pub fn pop_keyed(&mut self) -> Option<(u64, u64, E)> {
        loop {
            let from_late = match (self.sorted.last(), self.late.peek()) {
                (Some(s), Some(Reverse(l))) => l < s,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (None, None) => {
                    if self.advance() {
                        continue;
                    }
                    return None;
                }
            };
            return if from_late { self.late.pop().map(|Reverse(x)| x) } else { self.sorted.pop() };
        }
    }

    /// The event `k` places after the next one (0: the next) if it is in
    /// the current bucket — a hint for prefetching: an event pushed
    /// meanwhile may come before it.
    pub fn ahead(&self, k: usize) -> Option<&E> {
        let n = self.sorted.len();
        n.checked_sub(k + 1).map(|i| &self.sorted[i].2)
    }

    /// Moves on to the next bucket with events; false when none is left.
    fn advance(&mut self) -> bool {
        debug_assert!(self.sorted.is_empty() && self.late.is_empty());
        if self.in_ring == 0 {
            let Some(Reverse((t, _, _))) = self.far.peek() else { return false };
            self.current = t >> BUCKET_SHIFT;
        } else {
            self.current += 1;
        }
        while self.far.peek().is_some_and(|Reverse((t, _, _))| (t >> BUCKET_SHIFT) < self.current + BUCKETS) {
            if let Some(Reverse(x)) = self.far.pop() {
                let b = x.0 >> BUCKET_SHIFT;
                if b == self.current {
                    self.sorted.push(x);
                } else {
                    self.ring[(b % BUCKETS) as usize].push(x);
                    self.in_ring += 1;
                }
            }
        }
        let slot = &mut self.ring[(self.current % BUCKETS) as usize];
        self.in_ring -= slot.len();
        self.sorted.append(slot);
        // A burst (every receiver's release at one deadline) must not leave
        // every bucket of the ring holding its size.
        if slot.capacity() > BUCKET_KEEP {
            slot.shrink_to(BUCKET_KEEP);
        }
        self.sorted.sort_unstable_by(|a, b| b.cmp(a));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BinaryHeap;

    /// Replays pushes and pops against a binary heap; both must pop the same.
    fn check(ops: &[(bool, u64, u8)]) {
        let mut q = CalendarQueue::default();
        let mut h = BinaryHeap::new();
        let (mut now, mut order) = (0u64, 0u64);
        for &(pop, delta, ev) in ops {
            if pop {
                let a = q.pop();
                let b = h.pop().map(|Reverse((t, _, e))| (t, e));
                assert_eq!(a, b);
                if let Some((t, _)) = a {
                    now = t;
                }
            } else {
                order += 1;
                q.push(now + delta, order, ev);
                h.push(Reverse((now + delta, order, ev)));
            }
            assert_eq!(q.len(), h.len());
        }
        while let Some(b) = h.pop() {
            assert_eq!(q.pop(), Some((b.0 .0, b.0 .2)));
        }
        assert_eq!(q.pop(), None);
        assert!(q.is_empty());
    }

    fn delta() -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..2_000,                   // within a bucket or two
            0u64..2_000_000,               // within and beyond the ring
            Just(0u64),                    // now
            10_000_000u64..20_000_000_000, // far out
        ]
    }

    proptest! {
        #[test]
        fn pops_as_a_heap_does(ops in proptest::collection::vec((any::<bool>(), delta(), 0u8..4), 0..600)) {
            check(&ops);
        }
    }

    #[test]
    fn equal_times_pop_first_in_first_out() {
        let mut q = CalendarQueue::default();
        for i in 0..5u64 {
            q.push(5_000, i, ());
        }
        q.push(4_000, 9, ());
        assert_eq!(q.pop(), Some((4_000, ())));
        assert_eq!(q.pop(), Some((5_000, ())));
        let mut ahead = 0;
        while q.ahead(ahead).is_some() {
            ahead += 1;
        }
        assert_eq!(ahead, 4, "four left in the bucket");
        for _ in 0..4 {
            assert_eq!(q.pop(), Some((5_000, ())));
        }
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn far_events_come_back_in_order() {
        let mut q = CalendarQueue::default();
        q.push(50_000_000_000, 1, 'c');
        q.push(2_000_000, 2, 'b');
        q.push(7, 3, 'a');
        assert_eq!(q.pop(), Some((7, 'a')));
        q.push(2_000_000, 4, 'd');
        assert_eq!(q.pop(), Some((2_000_000, 'b')));
        assert_eq!(q.pop(), Some((2_000_000, 'd')));
        assert_eq!(q.pop(), Some((50_000_000_000, 'c')));
        assert_eq!(q.pop(), None);
    }
}
