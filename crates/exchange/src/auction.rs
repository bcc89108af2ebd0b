//! One batch of a frequent batch auction (Budish, Cramton and Shim; seed
//! 000's reference \[5\]): a uniform-price call auction over the orders
//! resting in the book and the orders of the batch.
//!
//! - **One price.** The clearing price maximises the volume that can trade,
//!   `min(demand(p), supply(p))`; among prices with that volume, the one
//!   with the smallest imbalance `|demand − supply|`; then the one nearest
//!   the reference price (the last trade, if the caller has one); then the
//!   lowest. Every fill is at that price.
//! - **Price priority, then time, then pro rata.** Orders better than the
//!   price fill in full. At the price itself (the marginal level) resting
//!   orders keep their time priority, and the batch's orders share what is
//!   left in proportion to their size — within a batch, being first does
//!   not matter (that is the point), so equal orders get equal fills (± 1
//!   share, the largest-remainder rounding).
//! - **Nothing crossed is left.** After clearing, the best unfilled buy is
//!   below the best unfilled sell.
//!
//! Pure function: a few sorts (O(n log n)) and its answer.

use crate::engine::{Price, Side};

/// One order in the auction. Market orders are a buy at `Price::MAX` or a
/// sell at 0 (they never set the price).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuctionOrder {
    /// Buy or sell.
    pub side: Side,
    /// Its limit (a market buy: `Price::MAX`; a market sell: 0).
    pub limit: Price,
    /// Shares.
    pub qty: u64,
    /// In the book before the batch (time priority at the marginal price);
    /// otherwise one of the batch's orders (pro rata there).
    pub resting: bool,
}

/// The auction's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clearing {
    /// The clearing price (None: nothing crosses).
    pub price: Option<Price>,
    /// Shares traded (bought = sold).
    pub volume: u64,
    /// Shares filled per order, in the input's order.
    pub fills: Vec<u64>,
}

fn is_market(o: &AuctionOrder) -> bool {
    matches!((o.side, o.limit), (Side::Buy, Price::MAX) | (Side::Sell, 0))
}

#[cfg(test)]
fn demand(orders: &[AuctionOrder], p: Price) -> u64 {
    orders.iter().filter(|o| o.side == Side::Buy && o.limit >= p).map(|o| o.qty).sum()
}

#[cfg(test)]
fn supply(orders: &[AuctionOrder], p: Price) -> u64 {
    orders.iter().filter(|o| o.side == Side::Sell && o.limit <= p).map(|o| o.qty).sum()
}

/// The clearing price and volume: candidates are the limit orders' prices.
/// One sort and a sweep: demand at `p` is every buy at or above it, supply
/// every sell at or below it.
pub fn clearing_price(orders: &[AuctionOrder], reference: Option<Price>) -> Option<(Price, u64)> {
    let mut prices: Vec<Price> = orders.iter().filter(|o| !is_market(o)).map(|o| o.limit).collect();
    prices.sort_unstable();
    prices.dedup();
    let mut buys: Vec<(Price, u64)> = orders.iter().filter(|o| o.side == Side::Buy).map(|o| (o.limit, o.qty)).collect();
    let mut sells: Vec<(Price, u64)> =
        orders.iter().filter(|o| o.side == Side::Sell).map(|o| (o.limit, o.qty)).collect();
    buys.sort_unstable();
    sells.sort_unstable();
    // Sweeping prices upwards: demand loses the buys below p, supply gains the sells at or below p.
    let (mut d, mut s): (u64, u64) = (buys.iter().map(|b| b.1).sum(), 0);
    let (mut bi, mut si) = (0, 0);
    let mut best: Option<(Price, u64, u64, u64)> = None; // price, volume, imbalance, distance
    for p in prices {
        while bi < buys.len() && buys[bi].0 < p {
            d -= buys[bi].1;
            bi += 1;
        }
        while si < sells.len() && sells[si].0 <= p {
            s += sells[si].1;
            si += 1;
        }
        let v = d.min(s);
        if v == 0 {
            continue;
        }
        let imb = d.abs_diff(s);
        let dist = reference.map_or(0, |r| u64::from(r.abs_diff(p)));
        let better = match best {
            None => true,
            Some((_, bv, bi, bd)) => {
                (v, std::cmp::Reverse(imb), std::cmp::Reverse(dist))
                    > (bv, std::cmp::Reverse(bi), std::cmp::Reverse(bd))
            }
        };
        if better {
            best = Some((p, v, imb, dist));
        }
    }
    best.map(|(p, v, _, _)| (p, v))
}

/// Clears one batch: `orders` are the book's resting orders (in time
/// priority) and the batch's, in any mix.
pub fn clear(orders: &[AuctionOrder], reference: Option<Price>) -> Clearing {
    let mut fills = vec![0u64; orders.len()];
    let Some((price, volume)) = clearing_price(orders, reference) else {
        return Clearing { price: None, volume: 0, fills };
    };
    for side in [Side::Buy, Side::Sell] {
        allocate(orders, side, price, volume, &mut fills);
    }
    Clearing { price: Some(price), volume, fills }
}

/// Gives `volume` shares to `side`'s orders that accept `price`: best limit first.
fn allocate(orders: &[AuctionOrder], side: Side, price: Price, volume: u64, fills: &mut [u64]) {
    let accepts =
        |o: &AuctionOrder| o.side == side && if side == Side::Buy { o.limit >= price } else { o.limit <= price };
    let mut idx: Vec<usize> = (0..orders.len()).filter(|&i| accepts(&orders[i])).collect();
    // Best price first; at one price resting orders (in their order) before the batch's.
    idx.sort_by_key(|&i| {
        let o = &orders[i];
        let rank = if side == Side::Buy { u64::from(Price::MAX - o.limit) } else { u64::from(o.limit) };
        (rank, !o.resting, i)
    });
    let mut left = volume;
    let mut at = 0;
    while at < idx.len() && left > 0 {
        let limit = orders[idx[at]].limit;
        let end = at + idx[at..].iter().take_while(|&&i| orders[i].limit == limit).count();
        let level = &idx[at..end];
        let level_qty: u64 = level.iter().map(|&i| orders[i].qty).sum();
        if level_qty <= left {
            for &i in level {
                fills[i] = orders[i].qty;
            }
            left -= level_qty;
        } else {
            // The marginal level: resting orders by time, then the batch pro rata.
            for &i in level.iter().filter(|&&i| orders[i].resting) {
                let q = orders[i].qty.min(left);
                fills[i] = q;
                left -= q;
            }
            let batch: Vec<usize> = level.iter().copied().filter(|&i| !orders[i].resting).collect();
            pro_rata(orders, &batch, left, fills);
            left = 0;
        }
        at = end;
    }
}

/// Shares `amount` (less than their total) among `batch` in proportion to
/// their sizes; the shares rounding leaves go one each to the largest
/// remainders (ties: the earlier order).
fn pro_rata(orders: &[AuctionOrder], batch: &[usize], amount: u64, fills: &mut [u64]) {
    let total: u128 = batch.iter().map(|&i| u128::from(orders[i].qty)).sum();
    if total == 0 || amount == 0 {
        return;
    }
    let mut given = 0u64;
    let mut rema: Vec<(u128, usize)> = Vec::with_capacity(batch.len());
    for &i in batch {
        let exact = u128::from(orders[i].qty) * u128::from(amount);
        let q = (exact / total) as u64;
        fills[i] = q;
        given += q;
        rema.push((exact % total, i));
    }
    rema.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in rema.iter().take((amount - given) as usize) {
        fills[i] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn o(side: Side, limit: Price, qty: u64, resting: bool) -> AuctionOrder {
        AuctionOrder { side, limit, qty, resting }
    }

    #[test]
    fn a_stale_quote_is_shared_by_everyone_in_the_batch() {
        // 100 shares offered at 10; four firms bid 100 at 10 in one batch.
        let mut orders = vec![o(Side::Sell, 10, 100, true)];
        orders.extend((0..4).map(|_| o(Side::Buy, 10, 100, false)));
        let c = clear(&orders, None);
        assert_eq!((c.price, c.volume), (Some(10), 100));
        assert_eq!(&c.fills[1..], &[25, 25, 25, 25]);
    }

    #[test]
    fn one_price_for_everyone_and_the_book_left_uncrossed() {
        let orders = [
            o(Side::Buy, 12, 50, false),
            o(Side::Buy, 11, 50, false),
            o(Side::Buy, 9, 50, true),
            o(Side::Sell, 10, 60, false),
            o(Side::Sell, 11, 30, true),
            o(Side::Sell, 13, 80, true),
        ];
        let c = clear(&orders, Some(10));
        // demand(11) = 100, supply(11) = 90: volume 90 (at 10: 100 vs 60).
        assert_eq!((c.price, c.volume), (Some(11), 90));
        assert_eq!(c.fills, vec![50, 40, 0, 60, 30, 0]);
        assert_eq!(clear(&[o(Side::Buy, 9, 5, false), o(Side::Sell, 10, 5, false)], None).price, None);
    }

    fn side_strategy() -> impl Strategy<Value = Side> {
        prop_oneof![Just(Side::Buy), Just(Side::Sell)]
    }

    proptest! {
        #[test]
        fn clearing_is_one_price_at_the_most_volume_with_priority_kept(
            raw in proptest::collection::vec((side_strategy(), 1u32..20, 1u64..500, any::<bool>(), 0u8..20), 0..40),
            reference in proptest::option::of(1u32..20),
        ) {
            // One in twenty orders is a market order.
            let orders: Vec<AuctionOrder> = raw.iter().map(|&(s, p, q, r, m)| {
                let limit = if m == 0 { if s == Side::Buy { Price::MAX } else { 0 } } else { p };
                o(s, limit, q, r)
            }).collect();
            let c = clear(&orders, reference);
            let bought: u64 = orders.iter().zip(&c.fills).filter(|(o, _)| o.side == Side::Buy).map(|(_, f)| f).sum();
            let sold: u64 = orders.iter().zip(&c.fills).filter(|(o, _)| o.side == Side::Sell).map(|(_, f)| f).sum();
            prop_assert_eq!(bought, c.volume);
            prop_assert_eq!(sold, c.volume);
            // The most volume any limit price allows.
            let best = (1u32..20).map(|p| demand(&orders, p).min(supply(&orders, p))).max().unwrap_or(0);
            let limits_exist = orders.iter().any(|o| !is_market(o));
            if limits_exist { prop_assert_eq!(c.volume, best); }
            let Some(p) = c.price else { return Ok(()) };
            for (o, &f) in orders.iter().zip(&c.fills) {
                prop_assert!(f <= o.qty);
                if f > 0 {
                    prop_assert!(if o.side == Side::Buy { o.limit >= p } else { o.limit <= p }, "filled beyond its limit");
                }
            }
            // Nothing crossed left: best unfilled buy < best unfilled sell.
            let rest_buy = orders.iter().zip(&c.fills).filter(|(o, f)| o.side == Side::Buy && **f < o.qty).map(|(o, _)| o.limit).max();
            let rest_sell = orders.iter().zip(&c.fills).filter(|(o, f)| o.side == Side::Sell && **f < o.qty).map(|(o, _)| o.limit).min();
            if let (Some(b), Some(s)) = (rest_buy, rest_sell) {
                prop_assert!(b < s, "crossed after clearing: bid {} ask {}", b, s);
            }
            // Price priority: an order that got shares means every better one filled in full.
            for (i, (a, fa)) in orders.iter().zip(&c.fills).enumerate() {
                if *fa == 0 { continue; }
                for (j, (b, fb)) in orders.iter().zip(&c.fills).enumerate() {
                    let better = a.side == b.side && if a.side == Side::Buy { b.limit > a.limit } else { b.limit < a.limit };
                    prop_assert!(!better || *fb == b.qty, "order {} filled while a better one, {}, was not", i, j);
                }
            }
            // Equal batch orders at one price get fills within one share.
            for (a, fa) in orders.iter().zip(&c.fills) {
                for (b, fb) in orders.iter().zip(&c.fills) {
                    if !a.resting && !b.resting && a.side == b.side && a.limit == b.limit && a.qty == b.qty {
                        prop_assert!(fa.abs_diff(*fb) <= 1);
                    }
                }
            }
        }
    }
}
