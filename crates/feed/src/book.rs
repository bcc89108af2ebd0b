//! Order books kept from a TotalView-ITCH 5.0 stream — every open order and
//! the market's standing state — and the snapshot that rebuilds them.
//!
//! [`Books`] is a pure state machine fed one ITCH message at a time, in feed
//! order. It keeps what a late joiner cannot rebuild from the live feed alone:
//!
//! - **open orders** (`A`, `F`; reduced by `E`, `C`, `X`; removed by `D`;
//!   `U` removes the original and adds the replacement at the back of the
//!   queue), each with its remaining shares and its queue priority;
//! - **standing state**: the latest system event (`S`), MWCB decline levels
//!   (`V`) and status per level (`W`), and per stock its directory entry
//!   (`R`), trading action (`H`), Reg SHO state (`Y`), operational halt (`h`),
//!   IPO quoting period (`K`), LULD collar (`J`) and each market maker's
//!   position (`L`).
//!
//! Trades, crosses, broken trades and imbalance messages change no book and
//! are only counted.
//!
//! [`Books::snapshot`] writes the messages that rebuild the same books in an
//! empty [`Books`] — the state messages as they were received, then every open
//! order as an `A` (or `F` with its attribution) with its remaining shares, in
//! priority order — as NASDAQ GLIMPSE does. Each snapshot message stands for
//! one distinct message the books applied, so a snapshot never has more
//! messages than the feed that built it ([`Books::snapshot_len`] ≤
//! [`BookStats::messages`]).
//!
//! Anything the books cannot apply (an execution of an order they do not
//! hold, more shares than the order has, an order reference added twice, a
//! malformed message, an order past [`Books::limit`]) is a typed
//! [`BookError`] and a counter; the books then no longer claim to be
//! [`Books::exact`] — a snapshot server must not serve them.

use std::collections::{BTreeMap, HashMap};

use fairfeed_wire::itch::{AddOrderRepr, Message};
use fairfeed_wire::{Alpha, Price4, Stock, Timestamp48};

/// Entries of the priority log below which it is never compacted.
const QUEUE_COMPACT_MIN: usize = 1_024;

/// Open orders the books hold by default (a busy NASDAQ day peaks at a few
/// million; each costs about 80 bytes).
pub const ORDERS_DEFAULT_MAX: usize = 20_000_000;

/// Why one message could not be applied (it was counted and skipped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookError {
    #[error("not an ITCH 5.0 message: {0}")]
    Wire(#[from] fairfeed_wire::Error),
    #[error("`{kind}` names order {order_ref}, which the books do not hold")]
    UnknownOrder { kind: char, order_ref: u64 },
    #[error("`{kind}` takes {shares} shares from order {order_ref}, which has {remaining}")]
    TooManyShares { kind: char, order_ref: u64, shares: u32, remaining: u32 },
    #[error("order {order_ref} added while already open")]
    DuplicateOrder { order_ref: u64 },
    #[error("order {order_ref} refused: the books hold their limit of {limit} orders")]
    Full { order_ref: u64, limit: usize },
}

/// What the books applied and refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BookStats {
    /// Messages applied (every type, refused ones excepted).
    pub messages: u64,
    pub adds: u64,
    pub executions: u64,
    pub cancels: u64,
    pub deletes: u64,
    pub replaces: u64,
    /// State messages kept (S, R, H, Y, L, V, W, K, J, h).
    pub state: u64,
    /// Messages that change no book (P, Q, B, I, N, O).
    pub other: u64,
    pub unknown_order: u64,
    pub too_many_shares: u64,
    pub duplicate_order: u64,
    pub full: u64,
    pub malformed: u64,
}

impl BookStats {
    /// Messages refused, all reasons.
    pub fn refused(&self) -> u64 {
        self.unknown_order + self.too_many_shares + self.duplicate_order + self.full + self.malformed
    }
}

/// One open order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Order {
    locate: u16,
    tracking: u16,
    timestamp: u64,
    side: u8,
    shares: u32,
    stock: [u8; 8],
    price: u32,
    attribution: Option<[u8; 4]>,
}

impl Order {
    /// An order as an add message `m` gives it: (side, shares, stock, price), attribution.
    fn new(
        m: &Message<'_>,
        (side, shares, stock, price): (u8, u32, Stock, Price4),
        attribution: Option<[u8; 4]>,
    ) -> Self {
        Order {
            locate: m.stock_locate(),
            tracking: m.tracking_number(),
            timestamp: m.timestamp(),
            side,
            shares,
            stock: stock.0,
            price: price.0,
            attribution,
        }
    }
}

/// Where a state message sits in a snapshot: market-wide state first, then
/// each stock's in locate order, its directory entry first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct StateKey {
    /// 0: market-wide; 1: one stock's.
    group: u8,
    locate: u16,
    /// The type's place in [`STATE_ORDER`].
    kind: u8,
    /// What tells several of one type apart (the MPID of `L`, the level of `W`).
    sub: [u8; 4],
}

/// State message types in the order a snapshot gives them.
const STATE_ORDER: [u8; 10] = [b'S', b'V', b'W', b'R', b'H', b'Y', b'h', b'K', b'J', b'L'];

/// A state message as it was received (ITCH messages are at most 50 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Raw {
    len: u8,
    bytes: [u8; fairfeed_wire::itch::MESSAGE_LEN_MAX],
}

impl Raw {
    fn new(b: &[u8]) -> Self {
        let mut bytes = [0; fairfeed_wire::itch::MESSAGE_LEN_MAX];
        bytes[..b.len()].copy_from_slice(b);
        Self { len: b.len() as u8, bytes }
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// Every open order and the market's standing state, from one ITCH stream.
#[derive(Debug, Clone)]
pub struct Books {
    /// Open orders in the order they joined the books (queue priority), each
    /// with its reference; `None` where one left. A snapshot reads it
    /// straight through — no sort, no lookup; the holes are compacted away
    /// once they outnumber the orders.
    slots: Vec<Option<(u64, Order)>>,
    /// Order reference → its slot.
    index: HashMap<u64, usize>,
    state: BTreeMap<StateKey, Raw>,
    limit: usize,
    stats: BookStats,
}

impl Default for Books {
    fn default() -> Self {
        Self::new()
    }
}

impl Books {
    /// Empty books holding up to [`ORDERS_DEFAULT_MAX`] open orders.
    pub fn new() -> Self {
        Self::with_limit(ORDERS_DEFAULT_MAX)
    }

    /// Empty books holding up to `limit` open orders.
    pub fn with_limit(limit: usize) -> Self {
        assert!(limit > 0, "a book limit of 0 orders holds nothing");
        Self { slots: Vec::new(), index: HashMap::new(), state: BTreeMap::new(), limit, stats: BookStats::default() }
    }

    /// Open orders the books hold at most.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// What was applied and refused so far.
    pub fn stats(&self) -> &BookStats {
        &self.stats
    }

    /// Open orders now.
    pub fn orders(&self) -> usize {
        self.index.len()
    }

    /// True while every message was applied: the books are the feed's.
    pub fn exact(&self) -> bool {
        self.stats.refused() == 0
    }

    /// Messages a snapshot of these books carries.
    pub fn snapshot_len(&self) -> usize {
        self.index.len() + self.state.len()
    }

    /// Applies one ITCH message; one it cannot apply is counted and refused
    /// (the books are unchanged by it).
    pub fn apply(&mut self, b: &[u8]) -> Result<(), BookError> {
        let r = self.apply_inner(b);
        match &r {
            Ok(()) => self.stats.messages += 1,
            Err(e) => self.count(e),
        }
        r
    }

    fn count(&mut self, e: &BookError) {
        let s = &mut self.stats;
        match e {
            BookError::Wire(_) => s.malformed += 1,
            BookError::UnknownOrder { .. } => s.unknown_order += 1,
            BookError::TooManyShares { .. } => s.too_many_shares += 1,
            BookError::DuplicateOrder { .. } => s.duplicate_order += 1,
            BookError::Full { .. } => s.full += 1,
        }
    }

    fn apply_inner(&mut self, b: &[u8]) -> Result<(), BookError> {
        let m = Message::parse(b)?;
        match m {
            Message::AddOrder(a) => {
                self.add(a.order_ref(), Order::new(&m, (a.side(), a.shares(), a.stock(), a.price()), None))
            }
            Message::AddOrderMpid(a) => {
                let o = Order::new(&m, (a.side(), a.shares(), a.stock(), a.price()), Some(a.attribution().0));
                self.add(a.order_ref(), o)
            }
            Message::OrderExecuted(e) => {
                self.take('E', e.order_ref(), e.executed_shares())?;
                self.stats.executions += 1;
                Ok(())
            }
            Message::OrderExecutedWithPrice(e) => {
                self.take('C', e.order_ref(), e.executed_shares())?;
                self.stats.executions += 1;
                Ok(())
            }
            Message::OrderCancel(c) => {
                self.take('X', c.order_ref(), c.cancelled_shares())?;
                self.stats.cancels += 1;
                Ok(())
            }
            Message::OrderDelete(d) => {
                self.remove(d.order_ref()).ok_or(BookError::UnknownOrder { kind: 'D', order_ref: d.order_ref() })?;
                self.stats.deletes += 1;
                Ok(())
            }
            Message::OrderReplace(u) => {
                self.replace(&m, u.original_order_ref(), u.new_order_ref(), u.shares(), u.price())
            }
            Message::Trade(_)
            | Message::CrossTrade(_)
            | Message::BrokenTrade(_)
            | Message::Noii(_)
            | Message::RetailPriceImprovement(_)
            | Message::DirectListingPriceDiscovery(_) => {
                self.stats.other += 1;
                Ok(())
            }
            _ => {
                self.keep_state(&m, b);
                Ok(())
            }
        }
    }

    fn add(&mut self, order_ref: u64, o: Order) -> Result<(), BookError> {
        if self.index.contains_key(&order_ref) {
            return Err(BookError::DuplicateOrder { order_ref });
        }
        if self.index.len() >= self.limit {
            return Err(BookError::Full { order_ref, limit: self.limit });
        }
        self.push(order_ref, o);
        self.stats.adds += 1;
        Ok(())
    }

    /// Puts an order at the back of the queue.
    fn push(&mut self, order_ref: u64, o: Order) {
        self.index.insert(order_ref, self.slots.len());
        self.slots.push(Some((order_ref, o)));
    }

    fn get_mut(&mut self, order_ref: u64) -> Option<&mut Order> {
        let i = *self.index.get(&order_ref)?;
        self.slots[i].as_mut().map(|(_, o)| o)
    }

    /// Removes an open order (its slot becomes a hole).
    fn remove(&mut self, order_ref: u64) -> Option<Order> {
        let i = self.index.remove(&order_ref)?;
        let o = self.slots[i].take().map(|(_, o)| o);
        if self.slots.len() > QUEUE_COMPACT_MIN && self.slots.len() > 2 * self.index.len() {
            self.compact();
        }
        o
    }

    /// Closes the holes, keeping the queue's order.
    fn compact(&mut self) {
        self.slots.retain(Option::is_some);
        for (i, (r, _)) in self.slots.iter().flatten().enumerate() {
            self.index.insert(*r, i);
        }
    }

    /// Takes `shares` from an open order (executions and cancels); an order
    /// left with none leaves the books.
    fn take(&mut self, kind: char, order_ref: u64, shares: u32) -> Result<(), BookError> {
        let o = self.get_mut(order_ref).ok_or(BookError::UnknownOrder { kind, order_ref })?;
        if shares > o.shares {
            return Err(BookError::TooManyShares { kind, order_ref, shares, remaining: o.shares });
        }
        o.shares -= shares;
        if o.shares == 0 {
            self.remove(order_ref);
        }
        Ok(())
    }

    fn replace(&mut self, m: &Message<'_>, orig: u64, new: u64, shares: u32, price: Price4) -> Result<(), BookError> {
        let Some(old) = self.get_mut(orig).map(|o| *o) else {
            return Err(BookError::UnknownOrder { kind: 'U', order_ref: orig });
        };
        if new != orig && self.index.contains_key(&new) {
            return Err(BookError::DuplicateOrder { order_ref: new });
        }
        self.remove(orig);
        let o = Order { tracking: m.tracking_number(), timestamp: m.timestamp(), shares, price: price.0, ..old };
        self.push(new, o);
        self.stats.replaces += 1;
        Ok(())
    }

    fn keep_state(&mut self, m: &Message<'_>, b: &[u8]) {
        let t = b[0];
        let kind = STATE_ORDER.iter().position(|&k| k == t).expect("every other ITCH type is matched above") as u8;
        let (group, locate, sub) = match m {
            Message::SystemEvent(_) | Message::MwcbDeclineLevel(_) => (0, 0, [0; 4]),
            Message::MwcbStatus(w) => (0, 0, [w.breached_level(), 0, 0, 0]),
            Message::MarketParticipantPosition(l) => (1, m.stock_locate(), l.mpid().0),
            _ => (1, m.stock_locate(), [0; 4]),
        };
        self.state.insert(StateKey { group, locate, kind, sub }, Raw::new(b));
        self.stats.state += 1;
    }

    /// Calls `out` with each message of a snapshot: the state messages, then
    /// every open order in priority order. Returns how many.
    pub fn snapshot(&self, out: &mut impl FnMut(&[u8])) -> usize {
        for raw in self.state.values() {
            out(raw.as_slice());
        }
        let mut buf = [0u8; fairfeed_wire::itch::MESSAGE_LEN_MAX];
        for (order_ref, o) in self.by_priority() {
            let n = emit_add(order_ref, o, &mut buf);
            out(&buf[..n]);
        }
        self.snapshot_len()
    }

    /// Open orders in queue priority.
    fn by_priority(&self) -> impl Iterator<Item = (u64, &Order)> {
        self.slots.iter().flatten().map(|(r, o)| (*r, o))
    }

    /// Displayed depth of one stock's side (`B` or `S`), best price first:
    /// (price, shares, orders) per level.
    pub fn depth(&self, locate: u16, side: u8) -> Vec<(u32, u64, usize)> {
        let mut levels: BTreeMap<u32, (u64, usize)> = BTreeMap::new();
        for (_, o) in self.by_priority().filter(|(_, o)| o.locate == locate && o.side == side) {
            let l = levels.entry(o.price).or_default();
            l.0 += u64::from(o.shares);
            l.1 += 1;
        }
        let it = levels.into_iter().map(|(p, (s, n))| (p, s, n));
        if side == b'B' {
            it.rev().collect()
        } else {
            it.collect()
        }
    }

    /// One stock's side (`B` or `S`) order by order: each price level, best
    /// first, with its orders (reference, shares) in queue priority.
    pub fn queues(&self, locate: u16, side: u8) -> Vec<(u32, Vec<(u64, u32)>)> {
        let mut levels: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
        for (r, o) in self.by_priority().filter(|(_, o)| o.locate == locate && o.side == side) {
            levels.entry(o.price).or_default().push((r, o.shares));
        }
        if side == b'B' {
            levels.into_iter().rev().collect()
        } else {
            levels.into_iter().collect()
        }
    }

    /// The first difference between these books and `other` (open orders
    /// with their fields and relative priority, and the standing state), or
    /// `None` when they are the same books.
    pub fn diff(&self, other: &Books) -> Option<String> {
        if self.state.len() != other.state.len() {
            return Some(format!("{} state messages vs {}", self.state.len(), other.state.len()));
        }
        for ((k, a), (k2, b)) in self.state.iter().zip(&other.state) {
            if k != k2 || a != b {
                return Some(format!("state differs at {k:?} vs {k2:?}"));
            }
        }
        if self.orders() != other.orders() {
            return Some(format!("{} open orders vs {}", self.orders(), other.orders()));
        }
        for (i, ((ra, a), (rb, b))) in self.by_priority().zip(other.by_priority()).enumerate() {
            if ra != rb || a != b {
                return Some(format!("order #{i} in priority: {ra} {a:?} vs {rb} {b:?}"));
            }
        }
        None
    }
}

/// Writes an open order as the `A` (or `F`) message that adds it now. An
/// `F` is an `A` with its type byte changed and the attribution appended
/// (ITCH 5.0 lays the two out alike up to the price).
fn emit_add(order_ref: u64, o: &Order, buf: &mut [u8]) -> usize {
    let add = AddOrderRepr {
        stock_locate: o.locate,
        tracking_number: o.tracking,
        timestamp: Timestamp48(o.timestamp),
        order_ref,
        side: o.side,
        shares: o.shares,
        stock: Alpha(o.stock),
        price: Price4(o.price),
    };
    let n = add.emit(buf).expect("an add order fits the longest ITCH message");
    let Some(attribution) = o.attribution else { return n };
    buf[0] = b'F';
    buf[n..n + 4].copy_from_slice(&attribution);
    debug_assert!(matches!(Message::parse(&buf[..n + 4]), Ok(Message::AddOrderMpid(_))));
    n + 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_wire::itch::{
        MessageRepr, OrderCancelRepr, OrderDeleteRepr, OrderExecutedRepr, OrderReplaceRepr, StockDirectoryRepr,
        SystemEventRepr,
    };
    use fairfeed_wire::Stock;

    fn bytes(r: impl Into<MessageRepr>) -> Vec<u8> {
        let r: MessageRepr = r.into();
        let mut b = vec![0; r.buffer_len()];
        r.emit(&mut b).unwrap();
        b
    }

    fn add(order_ref: u64, side: u8, shares: u32, price: u32) -> Vec<u8> {
        bytes(AddOrderRepr {
            stock_locate: 1,
            tracking_number: 0,
            timestamp: Timestamp48(1),
            order_ref,
            side,
            shares,
            stock: Stock::from_str_padded("AAPL"),
            price: Price4(price),
        })
    }

    fn rebuilt(b: &Books) -> Books {
        let mut r = Books::new();
        let n = b.snapshot(&mut |m| r.apply(m).unwrap());
        assert_eq!(n, b.snapshot_len());
        r
    }

    #[test]
    fn executions_cancels_deletes_and_replaces_change_the_book() {
        let mut b = Books::new();
        b.apply(&bytes(SystemEventRepr { event_code: b'Q', ..Default::default() })).unwrap();
        b.apply(&bytes(StockDirectoryRepr {
            stock_locate: 1,
            stock: Stock::from_str_padded("AAPL"),
            ..Default::default()
        }))
        .unwrap();
        for (r, side, sh, p) in [(1, b'B', 100, 10_000), (2, b'B', 200, 10_100), (3, b'S', 50, 10_300)] {
            b.apply(&add(r, side, sh, p)).unwrap();
        }
        b.apply(&bytes(OrderExecutedRepr { order_ref: 1, executed_shares: 40, ..Default::default() })).unwrap();
        b.apply(&bytes(OrderCancelRepr { order_ref: 3, cancelled_shares: 50, ..Default::default() })).unwrap();
        b.apply(&bytes(OrderReplaceRepr {
            original_order_ref: 2,
            new_order_ref: 9,
            shares: 300,
            price: Price4(10_050),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(b.depth(1, b'B'), vec![(10_050, 300, 1), (10_000, 60, 1)]);
        assert!(b.depth(1, b'S').is_empty(), "a fully cancelled order leaves the book");
        assert_eq!(b.orders(), 2);
        assert_eq!(b.snapshot_len(), 4);
        assert!(b.exact());
        let r = rebuilt(&b);
        assert_eq!(b.diff(&r), None);
        b.apply(&bytes(OrderDeleteRepr { order_ref: 9, ..Default::default() })).unwrap();
        assert_eq!(b.orders(), 1);
        assert!(b.diff(&r).is_some(), "a deleted order is a difference");
    }

    #[test]
    fn what_cannot_be_applied_is_refused_counted_and_changes_nothing() {
        let mut b = Books::with_limit(1);
        b.apply(&add(1, b'B', 100, 1)).unwrap();
        let before = b.clone();
        assert_eq!(b.apply(&add(1, b'B', 5, 1)), Err(BookError::DuplicateOrder { order_ref: 1 }));
        assert_eq!(b.apply(&add(2, b'B', 5, 1)), Err(BookError::Full { order_ref: 2, limit: 1 }));
        assert_eq!(
            b.apply(&bytes(OrderExecutedRepr { order_ref: 7, executed_shares: 1, ..Default::default() })),
            Err(BookError::UnknownOrder { kind: 'E', order_ref: 7 })
        );
        assert_eq!(
            b.apply(&bytes(OrderCancelRepr { order_ref: 1, cancelled_shares: 101, ..Default::default() })),
            Err(BookError::TooManyShares { kind: 'X', order_ref: 1, shares: 101, remaining: 100 })
        );
        assert!(matches!(b.apply(b"A\0\0"), Err(BookError::Wire(_))));
        assert!(matches!(b.apply(b""), Err(BookError::Wire(_))));
        assert_eq!(b.diff(&before), None);
        assert_eq!(b.stats().refused(), 6);
        assert_eq!(b.stats().messages, 1);
        assert!(!b.exact());
    }

    #[test]
    fn a_replacement_goes_to_the_back_of_the_queue() {
        let mut b = Books::new();
        b.apply(&add(1, b'B', 100, 5)).unwrap();
        b.apply(&add(2, b'B', 100, 5)).unwrap();
        b.apply(&bytes(OrderReplaceRepr {
            original_order_ref: 1,
            new_order_ref: 3,
            shares: 100,
            price: Price4(5),
            ..Default::default()
        }))
        .unwrap();
        let mut refs = Vec::new();
        b.snapshot(&mut |m| {
            let Message::AddOrder(a) = Message::parse(m).unwrap() else { panic!() };
            refs.push(a.order_ref());
        });
        assert_eq!(refs, [2, 3]);
    }

    #[test]
    fn the_priority_log_compacts_without_changing_the_queue() {
        let mut b = Books::new();
        for r in 1..=5_000u64 {
            b.apply(&add(r, b'B', 10, 5)).unwrap();
        }
        // Every order but each seventh leaves; every eleventh survivor is replaced (to the back).
        for r in (1..=5_000u64).filter(|r| r % 7 != 0) {
            b.apply(&bytes(OrderDeleteRepr { order_ref: r, ..Default::default() })).unwrap();
        }
        assert!(b.slots.len() < 2 * 5_000 / 7 + QUEUE_COMPACT_MIN, "compacted: {} slots", b.slots.len());
        let mut want: Vec<u64> = (1..=5_000u64).filter(|r| r % 7 == 0 && r % 11 != 0).collect();
        for r in (1..=5_000u64).filter(|r| r % 77 == 0) {
            b.apply(&bytes(OrderReplaceRepr {
                original_order_ref: r,
                new_order_ref: r + 100_000,
                shares: 10,
                price: Price4(5),
                ..Default::default()
            }))
            .unwrap();
            want.push(r + 100_000);
        }
        let got: Vec<u64> = b.queues(1, b'B')[0].1.iter().map(|o| o.0).collect();
        assert_eq!(got, want);
        assert_eq!(rebuilt(&b).diff(&b), None);
    }

    #[test]
    fn an_attributed_order_comes_back_as_an_f_with_its_mpid() {
        use fairfeed_wire::itch::AddOrderMpidRepr;
        let mut b = Books::new();
        b.apply(&bytes(AddOrderMpidRepr {
            stock_locate: 3,
            order_ref: 77,
            side: b'S',
            shares: 250,
            stock: Stock::from_str_padded("MSFT"),
            price: Price4(3_400_000),
            attribution: Alpha(*b"GSCO"),
            ..Default::default()
        }))
        .unwrap();
        let mut got = Vec::new();
        b.snapshot(&mut |m| got.push(m.to_vec()));
        let Message::AddOrderMpid(f) = Message::parse(&got[0]).unwrap() else { panic!("{:?}", got[0]) };
        assert_eq!((f.order_ref(), f.shares(), f.attribution().0), (77, 250, *b"GSCO"));
        assert_eq!(rebuilt(&b).diff(&b), None);
    }
}
