//! Frequent batch auctions in the engine (exchange config `ordering =
//! "batch"`): the commands of one batch are applied together and each
//! symbol's new orders are crossed with the book in one uniform-price call
//! auction ([`crate::auction::clear`]) instead of one after another.
//!
//! - **New orders** are validated and accepted as in continuous trading, then
//!   wait for the auction (they never trade on arrival). A minimum quantity
//!   is refused (`BadMinQty`): a call auction fills pro rata at the marginal
//!   price and cannot promise one.
//! - **Cancels** apply in arrival order before the auction, to a resting
//!   order or to one of the batch's own (so a firm can still withdraw an
//!   order it sent earlier in the batch).
//! - **Replaces** take the old order out (a resting one is deleted from the
//!   feed's book) and enter the replacement into the auction: a replacement
//!   loses its time priority, as in continuous trading.
//! - **The auction**, per symbol with new orders: the batch's orders and the
//!   resting orders they can reach — buys at or above the lowest new sell,
//!   sells at or below the highest new buy (the book is never crossed, so no
//!   other resting order can trade) — clear at one price, resting orders
//!   first at the marginal price, the batch pro rata. Each fill pairs a
//!   buy with a sell as an [`Event::Executed`] with `auction` set; one
//!   [`Event::Cross`] closes the symbol's auction.
//! - **After it**, what is left of the batch's day orders rests (it crosses
//!   nothing: the auction leaves no crossed pair), immediate-or-cancel and
//!   market remainders are canceled.

use super::{side_ix, CancelReason, Command, Engine, Event, NewOrder, Price, Qty, Reject, Side, Taker, Tif, NIL};
use crate::auction::{clear, AuctionOrder};

/// One of the batch's orders while it waits for its auction.
#[derive(Debug, Clone, Copy)]
struct Pending {
    t: Taker,
    tif: Tif,
}

/// The batch's orders in arrival order, and where each client's token is.
#[derive(Debug, Default)]
struct Batch {
    items: Vec<Pending>,
    at: std::collections::HashMap<(u32, u32), usize>,
}

impl Batch {
    fn add(&mut self, p: Pending) {
        self.at.insert((p.t.client, p.t.token), self.items.len());
        self.items.push(p);
    }

    /// The batch's open order `(client, token)`, if there is one.
    fn open(&self, client: u32, token: u32) -> Option<usize> {
        self.at.get(&(client, token)).copied().filter(|&i| self.items[i].t.qty > 0)
    }
}

impl std::ops::Deref for Batch {
    type Target = Vec<Pending>;
    fn deref(&self) -> &Vec<Pending> {
        &self.items
    }
}

impl std::ops::DerefMut for Batch {
    fn deref_mut(&mut self) -> &mut Vec<Pending> {
        &mut self.items
    }
}

/// One order in a symbol's auction: a resting order's slot, a pending
/// order's index, or the stand-in for the rest of a resting level (which
/// never fills: see [`Engine::reachable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Resting(u32),
    Pending(usize),
    StandIn,
}

impl Engine {
    /// Runs one batch: `cmds` in arrival order, then one call auction per
    /// symbol that received new orders (see the module docs).
    pub fn handle_batch(&mut self, cmds: &[Command], out: &mut impl FnMut(Event)) {
        self.stats.batches += 1;
        let mut pending = Batch { items: Vec::with_capacity(cmds.len()), at: Default::default() };
        for &c in cmds {
            self.stats.commands += 1;
            match c {
                Command::New(o) => self.batch_new(o, &mut pending, out),
                Command::Cancel { client, token, leave } => self.batch_cancel(client, token, leave, &mut pending, out),
                Command::Replace { client, token, new_token, price, qty } => {
                    self.batch_replace(client, (token, new_token), price, qty, &mut pending, out)
                }
            }
        }
        let mut symbols: Vec<u16> = pending.iter().filter(|p| p.t.qty > 0).map(|p| p.t.symbol).collect();
        symbols.sort_unstable();
        symbols.dedup();
        for s in symbols {
            self.auction(s, &mut pending, out);
        }
        for p in pending.iter().filter(|p| p.t.qty > 0) {
            if p.tif == Tif::Ioc {
                self.cancel_rest(&p.t, out);
            } else {
                self.rest(&p.t, out);
            }
        }
    }

    fn batch_new(&mut self, o: NewOrder, pending: &mut Batch, out: &mut impl FnMut(Event)) {
        if let Err(r) = self.check(o.symbol, o.price, o.qty, o.market) {
            return self.reject(o.client, o.token, r, out);
        }
        if o.min_qty > 0 {
            return self.reject(o.client, o.token, Reject::BadMinQty, out);
        }
        if self.token_taken(o.client, o.token, pending) {
            return self.reject(o.client, o.token, Reject::DuplicateToken, out);
        }
        let t = self.accept(&o, out);
        pending.add(Pending { t, tif: if o.market { Tif::Ioc } else { o.tif } });
    }

    /// A token live in the book or among the batch's orders still open.
    fn token_taken(&self, client: u32, token: u32, pending: &Batch) -> bool {
        self.by_token.contains(client, token) || pending.open(client, token).is_some()
    }

    fn batch_cancel(&mut self, client: u32, token: u32, leave: Qty, pending: &mut Batch, out: &mut impl FnMut(Event)) {
        let Some(i) = pending.open(client, token) else {
            return self.cancel(client, token, leave, out);
        };
        let t = &mut pending[i].t;
        if leave >= t.qty {
            return;
        }
        let qty = t.qty - leave;
        t.qty = leave;
        self.stats.canceled_qty += u64::from(qty);
        out(Event::Canceled {
            client,
            token,
            ref_num: t.ref_num,
            symbol: t.symbol,
            qty,
            left: leave,
            booked: false,
            reason: CancelReason::User,
            hidden: t.hidden,
        });
    }

    fn batch_replace(
        &mut self,
        client: u32,
        (token, new_token): (u32, u32),
        price: Price,
        qty: Qty,
        pending: &mut Batch,
        out: &mut impl FnMut(Event),
    ) {
        // The order replaced: one of the batch's, or a resting one.
        let old = match pending.open(client, token) {
            Some(i) => Some((pending[i].t, None)),
            None => self.by_token.get(client, token).map(|&slot| {
                let o = self.orders[slot as usize];
                let t = Taker {
                    ref_num: o.ref_num,
                    client,
                    token,
                    symbol: o.symbol,
                    side: o.side,
                    limit: o.price,
                    qty: o.qty,
                    min_qty: o.min_qty,
                    hidden: o.hidden,
                };
                (t, Some(slot))
            }),
        };
        let Some((o, slot)) = old else {
            return self.reject(client, new_token, Reject::UnknownOrder, out);
        };
        if let Err(r) = self.check(o.symbol, price, qty, false) {
            return self.reject(client, new_token, r, out);
        }
        if new_token != token && self.token_taken(client, new_token, pending) {
            return self.reject(client, new_token, Reject::DuplicateToken, out);
        }
        match slot {
            Some(s) => self.unlink(s),
            None => {
                if let Some(i) = pending.open(client, token) {
                    pending[i].t.qty = 0;
                }
            }
        }
        self.stats.canceled_qty += u64::from(o.qty);
        out(Event::Canceled {
            client,
            token,
            ref_num: o.ref_num,
            symbol: o.symbol,
            qty: o.qty,
            left: 0,
            booked: slot.is_some(),
            reason: CancelReason::Replaced,
            hidden: o.hidden,
        });
        let ref_num = self.take_ref();
        self.stats.accepted += 1;
        out(Event::Accepted { client, token: new_token, ref_num, symbol: o.symbol, side: o.side, price, qty });
        let t = Taker { ref_num, token: new_token, limit: price, qty, min_qty: 0, ..o };
        pending.add(Pending { t, tif: Tif::Day });
    }

    /// The resting orders of `symbol`'s `side` the batch's orders could
    /// trade with: from the best price while `reach(price)`, in time order,
    /// those without a minimum (an order with one trades only with an
    /// incoming order at least that large, which a call auction cannot
    /// promise) — one by one until they hold `need` shares (the batch's
    /// opposite side: resting orders trade only with the batch, so no more
    /// can fill), then the rest of each level as one stand-in, which keeps
    /// demand and supply at every price exact (the clearing price is the
    /// same) but never fills: every order ahead of it fills first.
    fn reachable(&self, symbol: u16, side: Side, reach: impl Fn(Price) -> bool, need: u64) -> Vec<(Who, AuctionOrder)> {
        let (mut v, mut have) = (Vec::new(), 0u64);
        for l in self.books[usize::from(symbol)][side_ix(side)].levels.iter().rev() {
            if !reach(l.price) {
                break;
            }
            // Shares of this level taken one by one, and the rest (plain orders only).
            let (mut i, mut here, mut rest) = (l.head, 0u64, 0u64);
            while i != NIL {
                let o = &self.orders[i as usize];
                let plain = o.min_qty == 0;
                if plain && have < need {
                    v.push((
                        Who::Resting(i),
                        AuctionOrder { side, limit: o.price, qty: u64::from(o.qty), resting: true },
                    ));
                    have += u64::from(o.qty);
                    here += u64::from(o.qty);
                } else if plain && l.min_orders == 0 {
                    // Every order from here on is plain: the level's total says how many shares.
                    rest = l.qty - here;
                    break;
                } else if plain {
                    rest += u64::from(o.qty);
                }
                i = o.next;
            }
            if rest > 0 {
                v.push((Who::StandIn, AuctionOrder { side, limit: l.price, qty: rest, resting: true }));
            }
        }
        v
    }

    /// One symbol's call auction over its pending orders and the resting
    /// orders they reach.
    fn auction(&mut self, symbol: u16, pending: &mut [Pending], out: &mut impl FnMut(Event)) {
        let mine = |p: &Pending, side: Side| p.t.symbol == symbol && p.t.side == side && p.t.qty > 0;
        let lowest_sell = pending.iter().filter(|p| mine(p, Side::Sell)).map(|p| p.t.limit).min();
        let highest_buy = pending.iter().filter(|p| mine(p, Side::Buy)).map(|p| p.t.limit).max();
        let shares = |side: Side| pending.iter().filter(|p| mine(p, side)).map(|p| u64::from(p.t.qty)).sum::<u64>();
        let mut book: Vec<(Who, AuctionOrder)> = Vec::new();
        if let Some(lo) = lowest_sell {
            book.extend(self.reachable(symbol, Side::Buy, |p| p >= lo, shares(Side::Sell)));
        }
        if let Some(hi) = highest_buy {
            book.extend(self.reachable(symbol, Side::Sell, |p| p <= hi, shares(Side::Buy)));
        }
        book.extend((0..pending.len()).filter(|&i| pending[i].t.symbol == symbol && pending[i].t.qty > 0).map(|i| {
            let t = &pending[i].t;
            (Who::Pending(i), AuctionOrder { side: t.side, limit: t.limit, qty: u64::from(t.qty), resting: false })
        }));
        let (who, orders): (Vec<Who>, Vec<AuctionOrder>) = book.into_iter().unzip();
        let reference = Some(self.auction_ref[usize::from(symbol)]).filter(|&p| p > 0);
        let c = clear(&orders, reference);
        let Some(price) = c.price else { return };
        self.stats.auctions += 1;
        self.auction_ref[usize::from(symbol)] = price;
        // Buys and sells with shares, resting first (the auction's priority
        // within a side does not matter to who trades with whom).
        let side_fills = |side: Side| -> Vec<(Who, u64)> {
            (0..who.len()).filter(|&i| orders[i].side == side && c.fills[i] > 0).map(|i| (who[i], c.fills[i])).collect()
        };
        let (mut buys, mut sells) = (side_fills(Side::Buy), side_fills(Side::Sell));
        let (mut b, mut s) = (0, 0);
        while b < buys.len() && s < sells.len() {
            let q = buys[b].1.min(sells[s].1);
            self.auction_fill((buys[b].0, sells[s].0), price, q as Qty, pending, out);
            buys[b].1 -= q;
            sells[s].1 -= q;
            b += usize::from(buys[b].1 == 0);
            s += usize::from(sells[s].1 == 0);
        }
        let match_num = self.take_match();
        out(Event::Cross { symbol, match_num, price, qty: c.volume });
    }

    /// `q` shares trade between the buy and the sell of `pair` at `price`.
    fn auction_fill(
        &mut self,
        pair: (Who, Who),
        price: Price,
        q: Qty,
        pending: &mut [Pending],
        out: &mut impl FnMut(Event),
    ) {
        // The maker is the side that rested (at most one does: the book is
        // never crossed); when neither did, the sell stands in for it.
        let (maker, taker) = match pair {
            (b @ Who::Resting(_), s) => (b, s),
            (b, s) => (s, b),
        };
        debug_assert!(maker != Who::StandIn && taker != Who::StandIn, "a stand-in filled");
        let Who::Pending(ti) = taker else { return }; // two resting orders never cross
        pending[ti].t.qty -= q;
        let tk = pending[ti].t;
        let (ref_num, client, token, left, hidden) = match maker {
            Who::Resting(slot) => {
                let o = self.orders[slot as usize];
                let left = o.qty - q;
                self.orders[slot as usize].qty = left;
                if let Ok(at) = self.books[usize::from(o.symbol)][side_ix(o.side)].find(o.price) {
                    self.books[usize::from(o.symbol)][side_ix(o.side)].levels[at].qty -= u64::from(q);
                }
                if left == 0 {
                    self.unlink(slot);
                }
                (o.ref_num, o.client, o.token, left, o.hidden)
            }
            Who::Pending(mi) => {
                pending[mi].t.qty -= q;
                let m = pending[mi].t;
                (m.ref_num, m.client, m.token, m.qty, true)
            }
            Who::StandIn => return,
        };
        let match_num = self.take_match();
        self.stats.executions += 1;
        self.stats.executed_qty += u64::from(q);
        out(Event::Executed {
            symbol: tk.symbol,
            match_num,
            price,
            qty: q,
            maker_ref: ref_num,
            maker_client: client,
            maker_token: token,
            maker_left: left,
            taker_ref: tk.ref_num,
            taker_client: tk.client,
            taker_token: tk.token,
            taker_side: tk.side,
            maker_hidden: hidden,
            auction: true,
        });
    }
}
