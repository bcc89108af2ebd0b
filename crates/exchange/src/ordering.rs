//! The order of orders: which order reaches matching first when several
//! firms race for the same market-data event.
//!
//! Three definitions of fair, side by side (seed 000 §8 and its references):
//!
//! - **FIFO** — arrival order at the exchange. Fair only if every firm sees
//!   the data at the same instant (Jasper's hold-and-release) *and* every
//!   order path is equally fast.
//! - **DBO** (Haseeb et al., SIGCOMM '23, seed 000's reference \[17\]) —
//!   *delivery-based ordering*. The release point (the receiver, gateway or
//!   enclave channel: wherever the exchange controls the last hop) keeps a
//!   **delivery clock**: the sequence number of the last data message it
//!   delivered to the firm and the time since (the firm's *response time*).
//!   Each order carries it, and the exchange ranks orders by
//!   `(data sequence, response time)` instead of by arrival, so a firm on a
//!   slower order path is not penalised. The buffer holds an order until no
//!   order that ranks ahead of it can still arrive: every firm's clock has
//!   moved past it (orders and heartbeats show progress), or it has waited
//!   `bound_ns`, which the operator derives from the measured spread of the
//!   order-path delays ([`hold_bound_ns`]). An order that arrives after an
//!   order ranked behind it was released is released at once and counted
//!   (`late`): the bound was too short, and the counter says so.
//! - **Batch** (Budish et al., frequent batch auctions, seed 000's reference
//!   \[5\]) — orders are collected for `interval_ns` and released together
//!   as one batch, which the matching engine clears at one price
//!   ([`crate::auction`]); within a batch, arrival time does not matter.
//!
//! Guarantees every mode keeps (property-tested): every order comes out
//! exactly once; two orders of one firm come out in the order that firm sent
//! them (a firm whose clock runs backwards is clamped to its last key and
//! counted, so a lying firm cannot overtake itself either); nothing is held
//! longer than the bound (DBO) or the batch interval (batch).
//!
//! Sans-IO (the contract of `docs/ARCHITECTURE.md`): inputs
//! `handle_*(now, …)`, output pulled with [`OrderingBuffer::poll_release`],
//! timers from [`OrderingBuffer::next_timeout`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Orders held at most; beyond it the best-ranked one is released at once (counted).
pub const ORDERING_HELD_MAX: usize = 1 << 18;
/// Firms one buffer tracks at most.
pub const ORDERING_FIRMS_MAX: usize = 4_096;

/// How orders are ordered before matching (exchange config key `ordering`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase", tag = "ordering")]
pub enum OrderingMode {
    /// Arrival order.
    Fifo,
    /// By delivery clock, each order held at most `bound_ns`.
    Dbo {
        /// Longest an order is held, ns.
        bound_ns: u64,
    },
    /// Frequent batch auctions every `interval_ns`.
    Batch {
        /// The batch interval, ns.
        interval_ns: u64,
    },
}

impl OrderingMode {
    /// The mode's name as the config and the command line spell it.
    pub fn name(&self) -> &'static str {
        match self {
            OrderingMode::Fifo => "fifo",
            OrderingMode::Dbo { .. } => "dbo",
            OrderingMode::Batch { .. } => "batch",
        }
    }
}

/// What the release point stamps on an order: the last data message it
/// delivered to the firm and how long after that delivery the order came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct DeliveryClock {
    /// Sequence number of the last data message delivered before the order.
    pub data_seq: u64,
    /// Time from that delivery to the order, ns. Signed: a release point
    /// that forwards early to cover a last hop (Jasper's models 2 and 3)
    /// measures from the delivery it aimed for, and a firm whose hop was
    /// quicker than that answers "before" it.
    pub response_ns: i64,
}

/// Why an order came out when it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ReleaseCause {
    /// FIFO, or an order without a delivery clock under DBO: at arrival.
    Arrival,
    /// DBO: every firm's clock had passed it.
    Progress,
    /// DBO: it (or an order ranked behind it) waited the whole bound.
    Bound,
    /// DBO: it arrived after an order ranked behind it had been released.
    Late,
    /// Batch: the end of its batch.
    Batch,
    /// The buffer was full.
    Overflow,
}

/// An order out of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released<T> {
    /// The firm that sent it.
    pub firm: u16,
    /// The order.
    pub item: T,
    /// When it arrived, ns.
    pub arrival_ns: u64,
    /// When it was released, ns.
    pub release_ns: u64,
    /// The key it was ranked by (DBO; after clamping), if it had one.
    pub clock: Option<DeliveryClock>,
    /// The batch it belongs to (batch mode): batches are numbered from 0 at
    /// time 0, every `interval_ns`.
    pub batch: Option<u64>,
    /// Why it came out then.
    pub cause: ReleaseCause,
}

/// Why an order was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OrderingError {
    /// The firm's number is not below the buffer's firm count.
    #[error("firm {0} is outside the buffer's firms")]
    UnknownFirm(u16),
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct OrderingStats {
    /// Orders offered.
    pub received: u64,
    /// Orders released.
    pub released: u64,
    /// Orders refused (an unknown firm).
    pub refused: u64,
    /// DBO: released because every firm's clock had passed them.
    pub released_on_progress: u64,
    /// DBO: released because the bound expired (the exchange could not be
    /// sure no better-ranked order was still on its way).
    pub released_on_bound: u64,
    /// DBO: arrived after the buffer had released an order ranked behind it.
    pub late: u64,
    /// DBO: a firm's clock went backwards (behind its last order or
    /// heartbeat); its key was raised to its last one.
    pub clamped: u64,
    /// DBO: orders without a delivery clock (ranked at their firm's last
    /// clock, or at arrival if the firm has shown none).
    pub no_clock: u64,
    /// Orders released early because the buffer was full.
    pub overflow: u64,
    /// Batch: batches released.
    pub batches: u64,
    /// Longest time an order was held, ns.
    pub hold_max_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    clock: DeliveryClock,
    /// Arrival number: ties on the clock go to the earlier arrival.
    arrival: u64,
}

struct Held<T> {
    key: Key,
    firm: u16,
    arrival_ns: u64,
    item: T,
}

impl<T> PartialEq for Held<T> {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl<T> Eq for Held<T> {}
impl<T> PartialOrd for Held<T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Held<T> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}

/// The ordering buffer between the order gateway and matching.
pub struct OrderingBuffer<T> {
    mode: OrderingMode,
    /// Per firm: the latest clock it has shown (orders and heartbeats). Its
    /// next order ranks no earlier (clamped).
    progress: Vec<Option<DeliveryClock>>,
    /// The least progress over all firms (None: some firm has shown none)
    /// and the firm holding it: recomputed only when that firm moves.
    everyone: Option<(DeliveryClock, usize)>,
    heap: BinaryHeap<Reverse<Held<T>>>,
    /// DBO: (arrival time, key) in arrival order, to find expired orders.
    arrivals: VecDeque<(u64, Key)>,
    /// DBO: every held order ranked at or before this may go (an order ranked
    /// at or behind it has waited its bound).
    expired_upto: Option<Key>,
    /// DBO: the last key released.
    released_upto: Option<Key>,
    /// Batch: the open batch's number and orders.
    batch: Option<u64>,
    batch_items: Vec<(u16, u64, T)>,
    out: VecDeque<Released<T>>,
    arrival_count: u64,
    /// Its counters.
    pub stats: OrderingStats,
}

impl<T> OrderingBuffer<T> {
    /// A buffer for firms `0..firms`.
    pub fn new(mode: OrderingMode, firms: usize) -> Self {
        assert!(firms <= ORDERING_FIRMS_MAX, "at most {ORDERING_FIRMS_MAX} firms");
        if let OrderingMode::Batch { interval_ns } = mode {
            assert!(interval_ns > 0, "a batch interval of 0");
        }
        OrderingBuffer {
            mode,
            progress: vec![None; firms],
            everyone: None,
            heap: BinaryHeap::new(),
            arrivals: VecDeque::new(),
            expired_upto: None,
            released_upto: None,
            batch: None,
            batch_items: Vec::new(),
            out: VecDeque::new(),
            arrival_count: 0,
            stats: OrderingStats::default(),
        }
    }

    /// The mode it runs.
    pub fn mode(&self) -> OrderingMode {
        self.mode
    }

    /// Orders held now.
    pub fn held(&self) -> usize {
        self.heap.len() + self.batch_items.len()
    }

    /// An order from `firm` arrived at `now`, stamped `clock` by its release
    /// point (None: it carries none). Refused (and returned) if the firm is unknown.
    pub fn handle_order(
        &mut self,
        now: u64,
        firm: u16,
        clock: Option<DeliveryClock>,
        item: T,
    ) -> Result<(), (T, OrderingError)> {
        if usize::from(firm) >= self.progress.len() {
            self.stats.refused += 1;
            return Err((item, OrderingError::UnknownFirm(firm)));
        }
        self.stats.received += 1;
        self.arrival_count += 1;
        match self.mode {
            OrderingMode::Fifo => self.emit(now, firm, now, item, None, None, ReleaseCause::Arrival),
            OrderingMode::Batch { interval_ns } => {
                self.close_batch(now);
                let b = now / interval_ns;
                self.batch = Some(b);
                self.batch_items.push((firm, now, item));
            }
            OrderingMode::Dbo { .. } => self.dbo_order(now, firm, clock, item),
        }
        self.handle_timeout(now);
        Ok(())
    }

    /// The release point of `firm` reports its clock without an order (DBO's
    /// heartbeat): the firm has seen data up to `clock` and sent nothing
    /// ranked before it. Unknown firms are ignored.
    pub fn handle_heartbeat(&mut self, now: u64, firm: u16, clock: DeliveryClock) {
        if let Some(p) = self.progress.get_mut(usize::from(firm)) {
            *p = Some(p.map_or(clock, |q| q.max(clock)));
            self.moved(usize::from(firm));
            self.handle_timeout(now);
        }
    }

    /// Time passed: releases what is due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        match self.mode {
            OrderingMode::Fifo => {}
            OrderingMode::Batch { .. } => self.close_batch(now),
            OrderingMode::Dbo { bound_ns } => self.dbo_release(now, bound_ns),
        }
    }

    /// The next order out, if any is due.
    pub fn poll_release(&mut self) -> Option<Released<T>> {
        self.out.pop_front()
    }

    /// When something falls due next (None: nothing held).
    pub fn next_timeout(&self) -> Option<u64> {
        match self.mode {
            OrderingMode::Fifo => None,
            OrderingMode::Batch { interval_ns } => self.batch.map(|b| (b + 1).saturating_mul(interval_ns)),
            OrderingMode::Dbo { bound_ns } => self.arrivals.front().map(|&(t, _)| t.saturating_add(bound_ns)),
        }
    }

    fn dbo_order(&mut self, now: u64, firm: u16, clock: Option<DeliveryClock>, item: T) {
        let f = usize::from(firm);
        let last = self.progress[f];
        if clock.is_none() {
            self.stats.no_clock += 1;
        }
        // Without a clock, an order ranks at its firm's last point (behind
        // its earlier orders); a firm never seen is served at arrival.
        let Some(mut c) = clock.or(last) else {
            return self.emit(now, firm, now, item, None, None, ReleaseCause::Arrival);
        };
        if let Some(last) = last.filter(|&l| c < l) {
            if clock.is_some() {
                self.stats.clamped += 1;
            }
            c = last;
        }
        self.progress[f] = Some(c);
        self.moved(f);
        let key = Key { clock: c, arrival: self.arrival_count };
        if self.released_upto.is_some_and(|r| key < r) {
            self.stats.late += 1;
            return self.emit(now, firm, now, item, Some(c), None, ReleaseCause::Late);
        }
        if self.heap.len() >= ORDERING_HELD_MAX {
            if let Some(Reverse(h)) = self.heap.pop() {
                self.stats.overflow += 1;
                self.released_upto = Some(self.released_upto.map_or(h.key, |r| r.max(h.key)));
                self.emit(now, h.firm, h.arrival_ns, h.item, Some(h.key.clock), None, ReleaseCause::Overflow);
            }
        }
        self.arrivals.push_back((now, key));
        self.heap.push(Reverse(Held { key, firm, arrival_ns: now, item }));
    }

    fn dbo_release(&mut self, now: u64, bound_ns: u64) {
        while let Some(&(t, k)) = self.arrivals.front() {
            if t.saturating_add(bound_ns) > now {
                break;
            }
            self.arrivals.pop_front();
            self.expired_upto = Some(self.expired_upto.map_or(k, |e| e.max(k)));
        }
        // Every firm has shown a clock at or past this: nothing ranked
        // earlier can still come from any of them.
        let everyone = self.everyone.map(|e| e.0);
        while let Some(Reverse(top)) = self.heap.peek() {
            let cause = if self.expired_upto.is_some_and(|e| top.key <= e) {
                ReleaseCause::Bound
            } else if everyone.is_some_and(|p| top.key.clock < p) {
                ReleaseCause::Progress
            } else {
                break;
            };
            let Some(Reverse(h)) = self.heap.pop() else { break };
            match cause {
                ReleaseCause::Bound => self.stats.released_on_bound += 1,
                _ => self.stats.released_on_progress += 1,
            }
            self.released_upto = Some(self.released_upto.map_or(h.key, |r| r.max(h.key)));
            self.emit(now, h.firm, h.arrival_ns, h.item, Some(h.key.clock), None, cause);
        }
        // Arrival records of orders already released are dropped lazily:
        // bound them by the heap (every held order has one).
        if self.heap.is_empty() {
            self.arrivals.clear();
        }
    }

    /// Firm `f`'s progress moved: the least over all firms is found again
    /// if it was `f`'s (or not known yet).
    fn moved(&mut self, f: usize) {
        if self.everyone.is_some_and(|(_, at)| at != f) {
            return;
        }
        self.everyone = None;
        let mut least: Option<(DeliveryClock, usize)> = None;
        for (i, p) in self.progress.iter().enumerate() {
            let Some(p) = *p else { return };
            if least.is_none_or(|(l, _)| p < l) {
                least = Some((p, i));
            }
        }
        self.everyone = least;
    }

    fn close_batch(&mut self, now: u64) {
        let OrderingMode::Batch { interval_ns } = self.mode else { return };
        let Some(b) = self.batch else { return };
        if now < (b + 1).saturating_mul(interval_ns) {
            return;
        }
        self.batch = None;
        self.stats.batches += 1;
        for (firm, arrival_ns, item) in std::mem::take(&mut self.batch_items) {
            self.emit(now, firm, arrival_ns, item, None, Some(b), ReleaseCause::Batch);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn emit(
        &mut self,
        now: u64,
        firm: u16,
        arrival_ns: u64,
        item: T,
        clock: Option<DeliveryClock>,
        batch: Option<u64>,
        cause: ReleaseCause,
    ) {
        self.stats.released += 1;
        self.stats.hold_max_ns = self.stats.hold_max_ns.max(now - arrival_ns);
        self.out.push_back(Released { firm, item, arrival_ns, release_ns: now, clock, batch, cause });
    }
}

/// A DBO hold bound from measured order-path one-way delays, one sample
/// list per firm: the spread between the slowest firm's `q` quantile and the
/// fastest firm's minimum, plus `margin_ns` (clock error, the response-time
/// stamp's own noise). An order ranked ahead of one that arrived at `t` was
/// sent no later than it, so it arrives by `t` plus that spread — unless its
/// path was slower than measured, which the buffer counts as `late`.
pub fn hold_bound_ns(delays: &[Vec<u64>], q: f64, margin_ns: u64) -> u64 {
    let fastest = delays.iter().filter_map(|d| d.iter().min().copied()).min().unwrap_or(0);
    let slowest = delays
        .iter()
        .filter(|d| !d.is_empty())
        .map(|d| {
            let mut s = d.clone();
            s.sort_unstable();
            s[((s.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize]
        })
        .max()
        .unwrap_or(0);
    slowest.saturating_sub(fastest).saturating_add(margin_ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn clock(data_seq: u64, response_ns: i64) -> Option<DeliveryClock> {
        Some(DeliveryClock { data_seq, response_ns })
    }

    fn drain<T>(b: &mut OrderingBuffer<T>) -> Vec<Released<T>> {
        std::iter::from_fn(|| b.poll_release()).collect()
    }

    #[test]
    fn dbo_puts_the_faster_response_first_even_from_a_slower_path() {
        let mut b = OrderingBuffer::new(OrderingMode::Dbo { bound_ns: 60_000 }, 2);
        // Firm 0 is near: it answered data 7 after 3 µs and its order
        // arrives at 25 µs. Firm 1 answered after 2 µs but its path is 50 µs
        // slower.
        b.handle_order(25_000, 0, clock(7, 3_000), "near").unwrap();
        assert!(drain(&mut b).is_empty(), "held: firm 1 has not shown progress");
        b.handle_order(72_000, 1, clock(7, 2_000), "far").unwrap();
        assert!(drain(&mut b).is_empty());
        assert_eq!(b.next_timeout(), Some(85_000));
        b.handle_timeout(85_000);
        let out = drain(&mut b);
        assert_eq!(out.iter().map(|r| r.item).collect::<Vec<_>>(), ["far", "near"]);
        assert_eq!(out[0].cause, ReleaseCause::Bound);
        assert_eq!(b.stats.released_on_bound, 2);
        assert!(b.stats.hold_max_ns <= 60_000);
    }

    #[test]
    fn dbo_releases_early_once_every_firm_is_past_and_clamps_clocks_that_go_back() {
        let mut b = OrderingBuffer::new(OrderingMode::Dbo { bound_ns: 1_000_000 }, 2);
        b.handle_order(10, 0, clock(1, 500), 'a').unwrap();
        b.handle_heartbeat(20, 1, DeliveryClock { data_seq: 2, response_ns: 0 });
        assert!(drain(&mut b).is_empty(), "firm 0's own progress is its order: not past it");
        b.handle_heartbeat(30, 0, DeliveryClock { data_seq: 2, response_ns: 0 });
        let out = drain(&mut b);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].cause, ReleaseCause::Progress);
        // Firm 1's heartbeat said data 2 and nothing before it: an order for
        // data 1 now is raised to data 2 (and held, not late).
        b.handle_order(40, 1, clock(1, 100), 'b').unwrap();
        assert_eq!(b.stats.clamped, 1);
        assert!(drain(&mut b).is_empty());
        assert_eq!(b.stats.late, 0);
    }

    #[test]
    fn dbo_counts_an_order_that_comes_after_its_bound() {
        let mut b = OrderingBuffer::new(OrderingMode::Dbo { bound_ns: 10 }, 2);
        b.handle_order(0, 0, clock(5, 0), 'a').unwrap();
        b.handle_timeout(10);
        assert_eq!(drain(&mut b)[0].cause, ReleaseCause::Bound);
        b.handle_order(20, 1, clock(3, 0), 'b').unwrap();
        let out = drain(&mut b);
        assert_eq!((out[0].item, out[0].cause), ('b', ReleaseCause::Late));
        assert_eq!(b.stats.late, 1);
    }

    #[test]
    fn batches_release_together_at_their_end() {
        let mut b = OrderingBuffer::new(OrderingMode::Batch { interval_ns: 100 }, 3);
        b.handle_order(10, 0, None, 1).unwrap();
        b.handle_order(99, 2, None, 2).unwrap();
        assert!(drain(&mut b).is_empty());
        assert_eq!(b.next_timeout(), Some(100));
        b.handle_order(150, 1, None, 3).unwrap();
        let out = drain(&mut b);
        assert_eq!(out.iter().map(|r| (r.item, r.batch)).collect::<Vec<_>>(), [(1, Some(0)), (2, Some(0))]);
        b.handle_timeout(200);
        assert_eq!(drain(&mut b).iter().map(|r| (r.item, r.batch)).collect::<Vec<_>>(), [(3, Some(1))]);
        assert_eq!(b.stats.batches, 2);
        assert!(b.handle_order(0, 3, None, 9).is_err());
    }

    #[test]
    fn hold_bound_is_the_spread_of_the_paths() {
        let d = vec![vec![20_000, 21_000, 22_000], vec![70_000, 75_000, 90_000]];
        assert_eq!(hold_bound_ns(&d, 1.0, 500), 70_500);
        assert_eq!(hold_bound_ns(&d, 0.5, 0), 55_000);
        assert_eq!(hold_bound_ns(&[], 0.99, 7), 7);
    }

    /// One random run: (arrival gap, firm, data seq step, response) per order.
    fn run(mode: OrderingMode, orders: &[(u64, u16, u64, i64)], firms: usize) -> (Vec<Released<usize>>, OrderingStats) {
        let mut b = OrderingBuffer::new(mode, firms);
        let (mut now, mut out) = (0u64, Vec::new());
        let mut seq = vec![0u64; firms];
        for (i, &(gap, firm, step, resp)) in orders.iter().enumerate() {
            now += gap;
            while let Some(t) = b.next_timeout().filter(|&t| t <= now) {
                b.handle_timeout(t);
                out.extend(drain(&mut b));
            }
            let f = usize::from(firm);
            seq[f] += step;
            // Some orders carry no clock.
            let c = if resp % 11 == 0 { None } else { clock(seq[f], resp) };
            b.handle_order(now, firm, c, i).unwrap();
            out.extend(drain(&mut b));
        }
        while let Some(t) = b.next_timeout() {
            b.handle_timeout(t);
            out.extend(drain(&mut b));
        }
        (out, b.stats)
    }

    proptest! {
        #[test]
        fn every_mode_releases_each_order_once_and_keeps_each_firms_order(
            orders in proptest::collection::vec((0u64..5_000, 0u16..4, 0u64..3, -5_000i64..10_000), 1..300),
            bound in 0u64..20_000,
            which in 0usize..3,
        ) {
            let mode = [OrderingMode::Fifo, OrderingMode::Dbo { bound_ns: bound }, OrderingMode::Batch { interval_ns: bound + 1 }][which];
            let (out, stats) = run(mode, &orders, 4);
            let mut seen: Vec<usize> = out.iter().map(|r| r.item).collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..orders.len()).collect::<Vec<_>>());
            for f in 0..4u16 {
                let mine: Vec<usize> = out.iter().filter(|r| r.firm == f).map(|r| r.item).collect();
                prop_assert!(mine.windows(2).all(|w| w[0] < w[1]), "firm {} reordered: {:?}", f, mine);
            }
            for r in &out {
                let limit = match mode { OrderingMode::Dbo { bound_ns } => bound_ns, OrderingMode::Batch { interval_ns } => interval_ns, OrderingMode::Fifo => 0 };
                prop_assert!(r.release_ns - r.arrival_ns <= limit, "held {} > {}", r.release_ns - r.arrival_ns, limit);
            }
            prop_assert_eq!(stats.released, orders.len() as u64);
        }

        #[test]
        fn dbo_releases_in_key_order_when_no_order_is_late(
            orders in proptest::collection::vec((0u64..5_000, 0u16..4, 0u64..3, -5_000i64..10_000), 1..300),
        ) {
            let (out, stats) = run(OrderingMode::Dbo { bound_ns: 1 << 40 }, &orders, 4);
            prop_assert_eq!(stats.late, 0);
            let keys: Vec<DeliveryClock> = out.iter().filter_map(|r| r.clock).collect();
            prop_assert!(keys.windows(2).all(|w| w[0] <= w[1]), "out of key order: {:?}", keys);
        }

        #[test]
        fn a_batch_holds_exactly_the_orders_that_arrived_in_its_interval(
            orders in proptest::collection::vec((0u64..5_000, 0u16..4, 0u64..3, -5_000i64..10_000), 1..300),
            interval in 1u64..20_000,
        ) {
            let (out, _) = run(OrderingMode::Batch { interval_ns: interval }, &orders, 4);
            for r in &out {
                prop_assert_eq!(r.batch, Some(r.arrival_ns / interval));
                prop_assert!(r.release_ns >= (r.arrival_ns / interval + 1) * interval);
            }
        }
    }
}
