//! A limit order book matching engine with price-time priority — sans-IO.
//!
//! [`Engine::handle`] takes one [`Command`] and reports what happened as
//! [`Event`]s to a callback, in the order a market-data feed must show them.
//! Orders: limit (day or immediate-or-cancel) and market (immediate or
//! cancel, any price); cancel in full or down to a remaining quantity; replace
//! (new token, price and quantity; the order loses its time priority).
//! An order may carry a minimum quantity: all of it trades on entry or none
//! does, and resting it is hidden and trades only with an incoming order at
//! least that large (which then skips nothing else: smaller incoming orders
//! pass it by, keeping time priority among the orders they can trade with).
//! Executions are at the resting order's price, best price first, and at one
//! price in arrival order.
//!
//! Storage is preallocated: a slab of [`Limits::orders`] order slots with
//! intrusive FIFO links per price level, and per book side a vector of at
//! most [`Limits::levels`] levels kept sorted so the best price is last (the
//! level a match consumes is popped, the level a new best order opens is
//! pushed). Nothing is allocated per order; a limit reached is a clear reject.

use crate::tokens::TokenIndex;

mod batch;

/// Price in ITCH's 4 implied decimals ($1.00 = 10,000).
pub type Price = u32;
/// Shares.
pub type Qty = u32;

/// No link.
const NIL: u32 = u32::MAX;

/// A side's best level: price and total shares.
pub type Top = (Price, u64);
/// One level of depth: price, total shares, and its orders in time order as (reference, shares).
pub type DepthLevel = (Price, u64, Vec<(u64, Qty)>);

/// Bounds every engine is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Symbols (stock locates 1..=symbols).
    pub symbols: usize,
    /// Live (resting) orders across all books.
    pub orders: usize,
    /// Price levels per side of one book.
    pub levels: usize,
    /// Largest quantity of one order.
    pub qty_max: Qty,
    /// Highest price (ITCH 4 decimals).
    pub price_max: Price,
}

/// A configuration value an exchange cannot run with: the key and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    /// The configuration key at fault (e.g. `limits.orders`).
    pub key: &'static str,
    /// What is wrong with it, in words (what the CLI prints).
    pub message: String,
}

impl Limits {
    /// Levels per side at most.
    pub const LEVELS_MAX: usize = 1 << 20;
    /// Symbols at most (stock locates are 16-bit).
    pub const SYMBOLS_MAX: usize = 65_535;

    /// Checks every bound is one an engine can be built with.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let orders_max = NIL as usize - 1;
        let bad = |key, message| Err(ConfigError { key, message });
        if !(1..=orders_max).contains(&self.orders) {
            return bad("limits.orders", format!("limits.orders must be 1..={orders_max}, got {}", self.orders));
        }
        if !(1..=Self::LEVELS_MAX).contains(&self.levels) {
            return bad(
                "limits.levels",
                format!("limits.levels must be 1..={}, got {}", Self::LEVELS_MAX, self.levels),
            );
        }
        if !(1..=Self::SYMBOLS_MAX).contains(&self.symbols) {
            return bad(
                "limits.symbols",
                format!("limits.symbols must be 1..={}, got {}", Self::SYMBOLS_MAX, self.symbols),
            );
        }
        if self.qty_max == 0 || self.price_max == 0 {
            return bad("limits.qty_max", "limits.qty_max and limits.price_max must be at least 1".into());
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits { symbols: 1_024, orders: 1 << 20, levels: 4_096, qty_max: 1_000_000, price_max: 2_000_000_000 }
    }
}

/// Buy or sell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Side {
    /// Bids.
    Buy,
    /// Offers.
    Sell,
}

impl Side {
    /// The other side.
    pub fn opposite(self) -> Side {
        match self {
            Side::Buy => Side::Sell,
            Side::Sell => Side::Buy,
        }
    }
}

/// How long an order may rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Tif {
    /// Rests until filled or canceled.
    Day,
    /// Immediate or cancel: what does not execute at once is canceled.
    Ioc,
}

/// A new order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewOrder {
    /// The client (the gateway's user index).
    pub client: u32,
    /// The client's order token (unique per client for the day).
    pub token: u32,
    /// Stock locate, 1..=symbols.
    pub symbol: u16,
    /// Buy or sell.
    pub side: Side,
    /// Limit price; ignored for market orders.
    pub price: Price,
    /// Shares.
    pub qty: Qty,
    /// How long it may rest.
    pub tif: Tif,
    /// Execute at any price, immediate or cancel.
    pub market: bool,
    /// Not displayed (OUCH Display `N`): it rests and trades like any order,
    /// but the ITCH feed never shows it — its executions appear as anonymous
    /// Trade messages.
    pub hidden: bool,
    /// Minimum quantity (OUCH option 3; 0: none; at most `qty`). On entry
    /// the order trades only if at least this many shares can trade at once
    /// at its limit; otherwise nothing trades, and an IOC (or market) order
    /// is canceled in full while a day order rests. Resting, it is not
    /// displayed (its book entry is hidden, as Nasdaq's Minimum Quantity
    /// orders are) and trades only with an incoming order of at least this
    /// many shares — smaller ones pass it by for the orders behind it.
    pub min_qty: Qty,
}

/// What the engine is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Enter an order.
    New(NewOrder),
    /// Cancel the client's resting order `token` down to `leave` shares (0: entirely).
    Cancel {
        /// The client (the gateway's user index).
        client: u32,
        /// The client's order token.
        token: u32,
        /// Shares to leave resting (0: cancel entirely).
        leave: Qty,
    },
    /// Replace the client's resting order `token` with `new_token` at `price` for `qty`.
    Replace {
        /// The client (the gateway's user index).
        client: u32,
        /// The client's order token.
        token: u32,
        /// The replacement's token.
        new_token: u32,
        /// Price (4 implied decimals).
        price: Price,
        /// Shares.
        qty: Qty,
    },
}

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Reject {
    /// A stock locate outside 1..=symbols.
    UnknownSymbol,
    /// 0 shares, or more than `Limits::qty_max`.
    BadQuantity,
    /// A limit price of 0 or above `Limits::price_max`.
    BadPrice,
    /// The client used the token before.
    DuplicateToken,
    /// No resting order of the client's has that token.
    UnknownOrder,
    /// Every order slot is taken (`Limits::orders`).
    TooManyOrders,
    /// The side of the book has no room for another level (`Limits::levels`).
    TooManyLevels,
    /// A minimum quantity (OUCH option 3) that is malformed, given twice,
    /// above the order's quantity, or on a Replace (a replacement keeps the
    /// original's minimum).
    BadMinQty,
}

/// Why shares were canceled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CancelReason {
    /// The client asked.
    User,
    /// Immediate-or-cancel (or market) remainder.
    ImmediateOrCancel,
    /// Replaced by a new order.
    Replaced,
}

/// What happened, in feed order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A new order (or a replacement) was accepted with this reference number.
    Accepted {
        /// The client (the gateway's user index).
        client: u32,
        /// The client's order token.
        token: u32,
        /// The order's reference number (ITCH).
        ref_num: u64,
        /// Stock locate.
        symbol: u16,
        /// Buy or sell.
        side: Side,
        /// Price (4 implied decimals).
        price: Price,
        /// Shares.
        qty: Qty,
    },
    /// A command was refused.
    Rejected {
        /// The client (the gateway's user index).
        client: u32,
        /// The client's order token.
        token: u32,
        /// Why.
        reason: Reject,
    },
    /// Shares joined the book (ITCH Add Order, unless hidden).
    Booked {
        /// The order's reference number (ITCH).
        ref_num: u64,
        /// Stock locate.
        symbol: u16,
        /// Buy or sell.
        side: Side,
        /// Price (4 implied decimals).
        price: Price,
        /// Shares.
        qty: Qty,
        /// Not displayed: off the ITCH feed.
        hidden: bool,
    },
    /// A resting order (maker) traded with an incoming one (taker) at the maker's price.
    Executed {
        /// Stock locate.
        symbol: u16,
        /// The match number (ITCH).
        match_num: u64,
        /// Price (4 implied decimals).
        price: Price,
        /// Shares.
        qty: Qty,
        /// The resting order's reference number.
        maker_ref: u64,
        /// The resting order's client.
        maker_client: u32,
        /// The resting order's token.
        maker_token: u32,
        /// Shares of the maker still resting after this execution.
        maker_left: Qty,
        /// The incoming order's reference number.
        taker_ref: u64,
        /// The incoming order's client.
        taker_client: u32,
        /// The incoming order's token.
        taker_token: u32,
        /// The incoming order's side.
        taker_side: Side,
        /// The resting order is not displayed (ITCH Trade instead of Order Executed).
        maker_hidden: bool,
        /// Part of a batch's call auction ([`Engine::handle_batch`]): at the
        /// batch's one clearing `price`, which may differ from the resting
        /// order's own (ITCH Order Executed With Price, non-printable: the
        /// volume prints once in the [`Event::Cross`] that follows). When
        /// neither side rested, the "maker" is the batch's sell order and
        /// `maker_hidden` is set (nothing of it is on the feed's book).
        auction: bool,
    },
    /// A batch's call auction cleared `qty` shares of `symbol` at `price`
    /// (ITCH Cross Trade, type `I`); its executions came just before it.
    Cross {
        /// Stock locate.
        symbol: u16,
        /// The match number (ITCH).
        match_num: u64,
        /// Price (4 implied decimals).
        price: Price,
        /// Shares cleared.
        qty: u64,
    },
    /// Shares of an order left the book or were never booked (ITCH Cancel
    /// when `left > 0`, Delete when `left == 0` and the order was booked).
    Canceled {
        /// The client (the gateway's user index).
        client: u32,
        /// The client's order token.
        token: u32,
        /// The order's reference number (ITCH).
        ref_num: u64,
        /// Stock locate.
        symbol: u16,
        /// Shares.
        qty: Qty,
        /// Shares still resting after this (0: the order is gone).
        left: Qty,
        /// The order was on the book (so the feed shows it leave).
        booked: bool,
        /// Why.
        reason: CancelReason,
        /// Not displayed: off the ITCH feed.
        hidden: bool,
    },
    /// A resting order was replaced in place without trading (ITCH Replace).
    Replaced {
        /// The client (the gateway's user index).
        client: u32,
        /// The replaced order's token.
        old_token: u32,
        /// The replacement's token.
        new_token: u32,
        /// The replaced order's reference number.
        old_ref: u64,
        /// The replacement's reference number.
        new_ref: u64,
        /// Stock locate.
        symbol: u16,
        /// Price (4 implied decimals).
        price: Price,
        /// Shares.
        qty: Qty,
        /// Not displayed: off the ITCH feed.
        hidden: bool,
    },
}

#[derive(Debug, Clone, Copy)]
struct Order {
    ref_num: u64,
    client: u32,
    token: u32,
    symbol: u16,
    side: Side,
    price: Price,
    qty: Qty,
    /// Trades only with an incoming order of at least this many shares (0: any).
    min_qty: Qty,
    hidden: bool,
    prev: u32,
    next: u32,
}

#[derive(Debug, Clone, Copy)]
struct Level {
    price: Price,
    head: u32,
    tail: u32,
    qty: u64,
    /// Orders here with a minimum quantity (0: every order trades with any
    /// incoming one, and matching takes the head without looking further).
    min_orders: u32,
}

/// One side of one book; the best level is last.
#[derive(Debug, Clone)]
struct Ladder {
    side: Side,
    levels: Vec<Level>,
}

impl Ladder {
    fn new(side: Side, cap: usize) -> Self {
        Ladder { side, levels: Vec::with_capacity(cap) }
    }

    /// Sort key: ascending towards the best price.
    fn key(&self, p: Price) -> i64 {
        match self.side {
            Side::Buy => i64::from(p),
            Side::Sell => -i64::from(p),
        }
    }

    /// Index of the level at `p`, or where it would be inserted.
    fn find(&self, p: Price) -> Result<usize, usize> {
        let k = self.key(p);
        self.levels.binary_search_by(|l| self.key(l.price).cmp(&k))
    }

    fn best(&self) -> Option<&Level> {
        self.levels.last()
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineStats {
    /// Commands handled.
    pub commands: u64,
    /// Orders (and replacements) accepted.
    pub accepted: u64,
    /// Commands refused.
    pub rejected: u64,
    /// Executions.
    pub executions: u64,
    /// Shares executed.
    pub executed_qty: u64,
    /// Shares canceled.
    pub canceled_qty: u64,
    /// Orders resting now.
    pub live_orders: u64,
    /// Orders whose unexecuted rest found no room (orders or levels limit) and was canceled.
    pub no_room: u64,
    /// Orders with a minimum quantity that could not trade it on entry (IOC:
    /// canceled unexecuted; day: rested unexecuted).
    pub min_qty_unmet: u64,
    /// Price levels at which an incoming order passed by resting orders whose
    /// minimum its remaining shares did not meet.
    pub min_qty_passed: u64,
    /// Batches cleared ([`Engine::handle_batch`]) and the call auctions in
    /// them that traded (one per symbol with a clearing price).
    pub batches: u64,
    /// ... and the call auctions in them that traded.
    pub auctions: u64,
}

/// The books of one engine (one shard of the symbols).
pub struct Engine {
    limits: Limits,
    books: Vec<[Ladder; 2]>,
    orders: Vec<Order>,
    free: Vec<u32>,
    by_token: TokenIndex<u32>,
    next_ref: u64,
    ref_stride: u64,
    next_match: u64,
    /// Per symbol: the last call auction's price (0: none yet), the next
    /// auction's reference among equally good prices.
    auction_ref: Vec<Price>,
    /// Its counters.
    pub stats: EngineStats,
}

fn side_ix(s: Side) -> usize {
    match s {
        Side::Buy => 0,
        Side::Sell => 1,
    }
}

/// Would an order on `side` at `limit` trade with a resting order at `resting`?
fn crosses(side: Side, limit: Price, resting: Price) -> bool {
    match side {
        Side::Buy => limit >= resting,
        Side::Sell => limit <= resting,
    }
}

/// An incoming order while it matches.
#[derive(Debug, Clone, Copy)]
struct Taker {
    ref_num: u64,
    client: u32,
    token: u32,
    symbol: u16,
    side: Side,
    limit: Price,
    qty: Qty,
    /// Its minimum on entry, and while it rests (0: none).
    min_qty: Qty,
    hidden: bool,
}

impl Engine {
    /// An engine for shard `shard` of `shards`: its order reference numbers
    /// are `shard + 1`, `shard + 1 + shards`, … and its match numbers likewise,
    /// so shards never collide.
    pub fn new(limits: Limits, shard: u64, shards: u64) -> Self {
        assert!(limits.symbols >= 1 && limits.symbols < usize::from(u16::MAX), "symbols 1..65535");
        assert!(limits.orders >= 1 && limits.orders < NIL as usize, "orders 1..u32::MAX");
        assert!(limits.levels >= 1, "at least one level per side");
        assert!(shards >= 1 && shard < shards, "shard within shards");
        let books = (0..=limits.symbols)
            .map(|_| [Ladder::new(Side::Buy, limits.levels), Ladder::new(Side::Sell, limits.levels)])
            .collect();
        Engine {
            limits,
            books,
            orders: Vec::with_capacity(limits.orders),
            free: Vec::with_capacity(limits.orders),
            // Grows a chunk at a time as orders come (crate::tokens): no
            // rehash pauses, and increasing tokens land side by side.
            by_token: TokenIndex::default(),
            next_ref: shard + 1,
            ref_stride: shards,
            next_match: shard + 1,
            auction_ref: vec![0; limits.symbols + 1],
            stats: EngineStats::default(),
        }
    }

    /// The bounds it was built with.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn take_ref(&mut self) -> u64 {
        let r = self.next_ref;
        self.next_ref += self.ref_stride;
        r
    }

    fn take_match(&mut self) -> u64 {
        let m = self.next_match;
        self.next_match += self.ref_stride;
        m
    }

    /// Best bid and best ask of `symbol` (price, total shares).
    pub fn top(&self, symbol: u16) -> (Option<Top>, Option<Top>) {
        let Some(b) = self.books.get(usize::from(symbol)) else { return (None, None) };
        let f = |l: &Level| (l.price, l.qty);
        (b[0].best().map(f), b[1].best().map(f))
    }

    /// The best price of one side among orders without a minimum quantity
    /// (those never rest crossed: an order with a minimum may rest across
    /// orders too small to trade with it).
    pub fn best_without_minimum(&self, symbol: u16, side: Side) -> Option<Price> {
        let b = self.books.get(usize::from(symbol))?;
        // An order without a minimum is one that trades with an incoming order of 0 shares.
        let plain = |l: &&Level| l.min_orders == 0 || self.first_eligible(l.head, 0) != NIL;
        b[side_ix(side)].levels.iter().rev().find(plain).map(|l| l.price)
    }

    /// Every level of one side, best first: (price, shares, orders in time order as (ref, qty)).
    pub fn depth(&self, symbol: u16, side: Side) -> Vec<DepthLevel> {
        self.depth_where(symbol, side, |_| true)
    }

    /// The same, displayed orders only (what the ITCH feed shows): levels
    /// holding only hidden orders are left out.
    pub fn displayed_depth(&self, symbol: u16, side: Side) -> Vec<DepthLevel> {
        self.depth_where(symbol, side, |o| !o.hidden)
    }

    fn depth_where(&self, symbol: u16, side: Side, keep: impl Fn(&Order) -> bool) -> Vec<DepthLevel> {
        let Some(b) = self.books.get(usize::from(symbol)) else { return Vec::new() };
        let mut out = Vec::new();
        for l in b[side_ix(side)].levels.iter().rev() {
            let (mut v, mut shares) = (Vec::new(), 0u64);
            let mut i = l.head;
            while i != NIL {
                let o = &self.orders[i as usize];
                if keep(o) {
                    v.push((o.ref_num, o.qty));
                    shares += u64::from(o.qty);
                }
                i = o.next;
            }
            if !v.is_empty() {
                out.push((l.price, shares, v));
            }
        }
        out
    }

    /// Runs one command.
    pub fn handle(&mut self, cmd: Command, out: &mut impl FnMut(Event)) {
        self.stats.commands += 1;
        match cmd {
            Command::New(o) => self.new_order(o, out),
            Command::Cancel { client, token, leave } => self.cancel(client, token, leave, out),
            Command::Replace { client, token, new_token, price, qty } => {
                self.replace(client, token, new_token, price, qty, out)
            }
        }
    }

    fn reject(&mut self, client: u32, token: u32, reason: Reject, out: &mut impl FnMut(Event)) {
        self.stats.rejected += 1;
        out(Event::Rejected { client, token, reason });
    }

    fn check(&self, symbol: u16, price: Price, qty: Qty, market: bool) -> Result<(), Reject> {
        if symbol == 0 || usize::from(symbol) > self.limits.symbols {
            return Err(Reject::UnknownSymbol);
        }
        if qty == 0 || qty > self.limits.qty_max {
            return Err(Reject::BadQuantity);
        }
        if !market && (price == 0 || price > self.limits.price_max) {
            return Err(Reject::BadPrice);
        }
        Ok(())
    }

    fn new_order(&mut self, o: NewOrder, out: &mut impl FnMut(Event)) {
        if let Err(r) = self.check(o.symbol, o.price, o.qty, o.market) {
            return self.reject(o.client, o.token, r, out);
        }
        if self.by_token.contains(o.client, o.token) {
            return self.reject(o.client, o.token, Reject::DuplicateToken, out);
        }
        let t = self.accept(&o, out);
        let tif = if o.market { Tif::Ioc } else { o.tif };
        // (`t` goes on by value alone and `fillable` gets its fields: a
        // reference to it here kept it in memory and the copy into `execute`
        // stalled on store forwarding — 15 % of the engine bench's throughput.)
        let unmet = t.min_qty > 0 && self.fillable(t.symbol, t.side, t.limit, t.qty, t.min_qty) < u64::from(t.min_qty);
        self.stats.min_qty_unmet += u64::from(unmet);
        self.execute(t, tif, !unmet, out);
    }

    /// Accepts a checked new order: its reference number, the Accepted
    /// event, and the order as it enters matching.
    #[inline(always)]
    fn accept(&mut self, o: &NewOrder, out: &mut impl FnMut(Event)) -> Taker {
        let limit = match (o.market, o.side) {
            (true, Side::Buy) => Price::MAX,
            (true, Side::Sell) => 0,
            (false, _) => o.price,
        };
        let ref_num = self.take_ref();
        self.stats.accepted += 1;
        out(Event::Accepted {
            client: o.client,
            token: o.token,
            ref_num,
            symbol: o.symbol,
            side: o.side,
            price: limit,
            qty: o.qty,
        });
        Taker {
            ref_num,
            client: o.client,
            token: o.token,
            symbol: o.symbol,
            side: o.side,
            limit,
            qty: o.qty,
            min_qty: o.min_qty.min(o.qty),
            // A resting order with a minimum is never displayed: the feed's
            // book would show it crossed by orders too small to reach it.
            hidden: o.hidden || o.min_qty > 0,
        }
    }

    /// Shares `t` would trade at once (counted up to `enough`): the walk
    /// [`Self::match_taker`] makes, without trading.
    #[inline(never)]
    fn fillable(&self, symbol: u16, side: Side, limit: Price, qty: Qty, enough: Qty) -> u64 {
        let (mut left, mut sum) = (qty, 0u64);
        for l in self.books[usize::from(symbol)][side_ix(side.opposite())].levels.iter().rev() {
            if !crosses(side, limit, l.price) || sum >= u64::from(enough) || left == 0 {
                break;
            }
            if l.min_orders == 0 {
                let q = l.qty.min(u64::from(left));
                sum += q;
                left -= q as Qty;
                continue;
            }
            let mut i = l.head;
            while i != NIL && left > 0 {
                let m = &self.orders[i as usize];
                if m.min_qty <= left {
                    let q = m.qty.min(left);
                    sum += u64::from(q);
                    left -= q;
                }
                i = m.next;
            }
        }
        sum
    }

    /// The first order from `i` on in its level that trades with an
    /// incoming order of `qty` shares (NIL: none does).
    fn first_eligible(&self, mut i: u32, qty: Qty) -> u32 {
        while i != NIL {
            let m = &self.orders[i as usize];
            if m.min_qty <= qty {
                return i;
            }
            i = m.next;
        }
        NIL
    }

    /// Matches `t` against the book (if `trade`), then books or cancels what is left.
    fn execute(&mut self, mut t: Taker, tif: Tif, trade: bool, out: &mut impl FnMut(Event)) {
        if trade {
            self.match_taker(&mut t, out);
        }
        if t.qty == 0 {
            return;
        }
        if tif == Tif::Ioc {
            return self.cancel_rest(&t, out);
        }
        self.rest(&t, out);
    }

    /// Books what is left of `t`, or cancels it if there is no room.
    fn rest(&mut self, t: &Taker, out: &mut impl FnMut(Event)) {
        match self.book(t) {
            Ok(()) => out(Event::Booked {
                ref_num: t.ref_num,
                symbol: t.symbol,
                side: t.side,
                price: t.limit,
                qty: t.qty,
                hidden: t.hidden,
            }),
            Err(_) => {
                // Accepted and maybe partly executed, but no room to rest
                // (a limit reached): the rest is canceled, and counted.
                self.stats.no_room += 1;
                self.cancel_rest(t, out);
            }
        }
    }

    /// Cancels what is left of an incoming order that did not rest.
    fn cancel_rest(&mut self, t: &Taker, out: &mut impl FnMut(Event)) {
        self.stats.canceled_qty += u64::from(t.qty);
        out(Event::Canceled {
            client: t.client,
            token: t.token,
            ref_num: t.ref_num,
            symbol: t.symbol,
            qty: t.qty,
            left: 0,
            booked: false,
            reason: CancelReason::ImmediateOrCancel,
            hidden: t.hidden,
        });
    }

    /// Trades `t` with the resting orders it crosses, best price first and
    /// in time order at one price, passing by those whose minimum its
    /// remaining shares do not meet.
    fn match_taker(&mut self, t: &mut Taker, out: &mut impl FnMut(Event)) {
        let opp = side_ix(t.side.opposite());
        let sym = usize::from(t.symbol);
        // The common case: the best level's orders have no minimum, so its
        // head trades.
        while t.qty > 0 {
            let Some(best) = self.books[sym][opp].best() else { return };
            if !crosses(t.side, t.limit, best.price) {
                return;
            }
            if best.min_orders > 0 {
                return self.match_passing(t, out);
            }
            let at = self.books[sym][opp].levels.len() - 1;
            self.trade(t, at, best.head, out);
        }
    }

    /// [`Self::match_taker`] from a level holding orders with a minimum on.
    #[cold]
    fn match_passing(&mut self, t: &mut Taker, out: &mut impl FnMut(Event)) {
        let opp = side_ix(t.side.opposite());
        let sym = usize::from(t.symbol);
        // The level looked at is `at - 1`; levels after it (better prices)
        // hold only orders `t` passed by.
        let mut at = self.books[sym][opp].levels.len();
        while t.qty > 0 && at > 0 {
            let lvl = self.books[sym][opp].levels[at - 1];
            if !crosses(t.side, t.limit, lvl.price) {
                break;
            }
            let head = if lvl.min_orders == 0 { lvl.head } else { self.first_eligible(lvl.head, t.qty) };
            if head != lvl.head {
                self.stats.min_qty_passed += 1;
            }
            if head == NIL {
                at -= 1;
                continue;
            }
            if self.trade(t, at - 1, head, out) {
                at -= 1; // its level went; the next worse one is now at `at - 1`
            }
        }
    }

    /// `t` trades with the resting order in `slot`, at level `at` of the
    /// opposite side. Returns whether that level went (its last order filled).
    #[inline(always)]
    fn trade(&mut self, t: &mut Taker, at: usize, slot: u32, out: &mut impl FnMut(Event)) -> bool {
        let (sym, opp) = (usize::from(t.symbol), side_ix(t.side.opposite()));
        let m = self.orders[slot as usize];
        let q = m.qty.min(t.qty);
        t.qty -= q;
        let left = m.qty - q;
        self.orders[slot as usize].qty = left;
        let lvl = &mut self.books[sym][opp].levels[at];
        lvl.qty -= u64::from(q);
        let price = lvl.price;
        let match_num = self.take_match();
        self.stats.executions += 1;
        self.stats.executed_qty += u64::from(q);
        out(Event::Executed {
            symbol: t.symbol,
            match_num,
            price,
            qty: q,
            maker_ref: m.ref_num,
            maker_client: m.client,
            maker_token: m.token,
            maker_left: left,
            taker_ref: t.ref_num,
            taker_client: t.client,
            taker_token: t.token,
            taker_side: t.side,
            maker_hidden: m.hidden,
            auction: false,
        });
        if left > 0 {
            return false;
        }
        let levels = self.books[sym][opp].levels.len();
        self.unlink(slot);
        self.books[sym][opp].levels.len() < levels
    }

    /// Rests `t` at the back of its price level.
    fn book(&mut self, t: &Taker) -> Result<(), Reject> {
        if self.orders.len() - self.free.len() >= self.limits.orders {
            return Err(Reject::TooManyOrders);
        }
        let sym = usize::from(t.symbol);
        let s = side_ix(t.side);
        let at = match self.books[sym][s].find(t.limit) {
            Ok(i) => i,
            Err(i) => {
                if self.books[sym][s].levels.len() >= self.limits.levels {
                    return Err(Reject::TooManyLevels);
                }
                let l = Level { price: t.limit, head: NIL, tail: NIL, qty: 0, min_orders: 0 };
                self.books[sym][s].levels.insert(i, l);
                i
            }
        };
        let o = Order {
            ref_num: t.ref_num,
            client: t.client,
            token: t.token,
            symbol: t.symbol,
            side: t.side,
            price: t.limit,
            qty: t.qty,
            min_qty: t.min_qty,
            hidden: t.hidden,
            prev: self.books[sym][s].levels[at].tail,
            next: NIL,
        };
        let slot = match self.free.pop() {
            Some(i) => {
                self.orders[i as usize] = o;
                i
            }
            None => {
                self.orders.push(o);
                (self.orders.len() - 1) as u32
            }
        };
        let lvl = &mut self.books[sym][s].levels[at];
        if lvl.tail == NIL {
            lvl.head = slot;
        } else {
            self.orders[lvl.tail as usize].next = slot;
        }
        lvl.tail = slot;
        lvl.qty += u64::from(t.qty);
        lvl.min_orders += u32::from(t.min_qty > 0);
        self.by_token.insert(t.client, t.token, slot);
        self.stats.live_orders += 1;
        Ok(())
    }

    /// Takes a resting order out of its level (removing the level if empty) and frees its slot.
    fn unlink(&mut self, slot: u32) {
        let o = self.orders[slot as usize];
        let sym = usize::from(o.symbol);
        let s = side_ix(o.side);
        let Ok(at) = self.books[sym][s].find(o.price) else { return };
        if o.prev == NIL {
            self.books[sym][s].levels[at].head = o.next;
        } else {
            self.orders[o.prev as usize].next = o.next;
        }
        if o.next == NIL {
            self.books[sym][s].levels[at].tail = o.prev;
        } else {
            self.orders[o.next as usize].prev = o.prev;
        }
        let lvl = &mut self.books[sym][s].levels[at];
        lvl.qty -= u64::from(o.qty);
        lvl.min_orders -= u32::from(o.min_qty > 0);
        if lvl.head == NIL {
            self.books[sym][s].levels.remove(at);
        }
        self.by_token.remove(o.client, o.token);
        self.free.push(slot);
        self.stats.live_orders -= 1;
    }

    fn cancel(&mut self, client: u32, token: u32, leave: Qty, out: &mut impl FnMut(Event)) {
        let Some(&slot) = self.by_token.get(client, token) else {
            return self.reject(client, token, Reject::UnknownOrder, out);
        };
        let o = self.orders[slot as usize];
        if leave >= o.qty {
            return; // nothing to cancel: already at or below `leave`
        }
        let qty = o.qty - leave;
        self.stats.canceled_qty += u64::from(qty);
        if leave == 0 {
            self.unlink(slot);
        } else {
            self.orders[slot as usize].qty = leave;
            let (sym, s) = (usize::from(o.symbol), side_ix(o.side));
            if let Ok(at) = self.books[sym][s].find(o.price) {
                self.books[sym][s].levels[at].qty -= u64::from(qty);
            }
        }
        out(Event::Canceled {
            client,
            token,
            ref_num: o.ref_num,
            symbol: o.symbol,
            qty,
            left: leave,
            booked: true,
            reason: CancelReason::User,
            hidden: o.hidden,
        });
    }

    fn replace(
        &mut self,
        client: u32,
        token: u32,
        new_token: u32,
        price: Price,
        qty: Qty,
        out: &mut impl FnMut(Event),
    ) {
        let Some(&slot) = self.by_token.get(client, token) else {
            return self.reject(client, new_token, Reject::UnknownOrder, out);
        };
        let o = self.orders[slot as usize];
        if let Err(r) = self.check(o.symbol, price, qty, false) {
            return self.reject(client, new_token, r, out);
        }
        if new_token != token && self.by_token.contains(client, new_token) {
            return self.reject(client, new_token, Reject::DuplicateToken, out);
        }
        self.unlink(slot);
        self.stats.canceled_qty += u64::from(o.qty);
        let new_ref = self.take_ref();
        self.stats.accepted += 1;
        let t = Taker {
            ref_num: new_ref,
            client,
            token: new_token,
            symbol: o.symbol,
            side: o.side,
            limit: price,
            qty,
            // The replacement keeps the original's minimum (and so stays hidden).
            min_qty: o.min_qty.min(qty),
            hidden: o.hidden,
        };
        let need = t.min_qty.max(1);
        let trades = self.fillable(t.symbol, t.side, t.limit, t.qty, need) >= u64::from(need);
        if !trades && self.book(&t).is_ok() {
            out(Event::Replaced {
                client,
                old_token: token,
                new_token,
                old_ref: o.ref_num,
                new_ref,
                symbol: o.symbol,
                price,
                qty,
                hidden: o.hidden,
            });
            return;
        }
        // It trades (or cannot rest): the old order is deleted and the new one enters as an order would.
        out(Event::Canceled {
            client,
            token,
            ref_num: o.ref_num,
            symbol: o.symbol,
            qty: o.qty,
            left: 0,
            booked: true,
            reason: CancelReason::Replaced,
            hidden: o.hidden,
        });
        out(Event::Accepted { client, token: new_token, ref_num: new_ref, symbol: o.symbol, side: o.side, price, qty });
        self.execute(t, Tif::Day, true, out);
    }
}
