//! Goal: the matching engine keeps its invariants under any sequence of
//! orders, cancels and replaces — no crossed book at rest among orders
//! without a minimum, shares conserved for every order, price-time priority
//! (passing by only resting orders whose minimum quantity the incoming order
//! does not meet), minimums met on entry or nothing traded, executions at the
//! resting price and never through the incoming order's limit, levels that
//! add up. Method: proptest drives random commands (a narrow price band, few
//! tokens, so duplicates, unknown orders, partial fills, crossing replaces
//! and minimums are common) and checks each against the book before and
//! after: every incoming order's executions must be exactly those a walk of
//! the queue it met predicts.

use std::collections::HashMap;

use fairfeed_exchange::engine::{Command, Engine, Event, Limits, NewOrder, Side, Tif};
use proptest::prelude::*;

fn command() -> impl Strategy<Value = Command> {
    let side = prop_oneof![Just(Side::Buy), Just(Side::Sell)];
    let new = (1u32..=3, 0u32..12, 1u16..=2, side, 95u32..=105, 1u32..=30, any::<bool>(), 0u8..10, 0u32..=45).prop_map(
        |(client, token, symbol, side, price, qty, ioc, kind, min)| {
            // A minimum (at most the quantity, as the gateway allows) a third of the time.
            let min_qty = if min % 3 == 0 { (min / 3 + 1).min(qty) } else { 0 };
            Command::New(NewOrder {
                client,
                token,
                symbol,
                side,
                price,
                qty,
                tif: if ioc { Tif::Ioc } else { Tif::Day },
                market: kind == 0,
                hidden: kind == 1,
                min_qty,
            })
        },
    );
    let cancel =
        (1u32..=3, 0u32..12, 0u32..10).prop_map(|(client, token, leave)| Command::Cancel { client, token, leave });
    let replace = (1u32..=3, 0u32..12, 0u32..12, 95u32..=105, 1u32..=30)
        .prop_map(|(client, token, new_token, price, qty)| Command::Replace { client, token, new_token, price, qty });
    prop_oneof![6 => new, 2 => cancel, 2 => replace]
}

/// Resting orders in the order an incoming order meets them: (reference, shares, price).
type Queue = Vec<(u64, u32, u32)>;

/// Per order reference: shares entered, executed, canceled.
#[derive(Default, Debug, Clone, Copy)]
struct Ledger {
    entered: u64,
    executed: u64,
    canceled: u64,
}

fn resting(e: &Engine) -> HashMap<u64, u64> {
    let mut m = HashMap::new();
    for sym in 1..=2u16 {
        for side in [Side::Buy, Side::Sell] {
            for (_, total, orders) in e.depth(sym, side) {
                let sum: u64 = orders.iter().map(|o| u64::from(o.1)).sum();
                assert_eq!(sum, total, "a level's shares are the sum of its orders");
                assert!(!orders.is_empty(), "no empty levels");
                for (r, q) in orders {
                    assert!(q > 0);
                    m.insert(r, u64::from(q));
                }
            }
        }
    }
    m
}

/// The executions (maker, shares) an incoming order of `qty` shares at
/// `limit` must make against `queue` (the opposite side, best price first,
/// then time): every maker in turn whose minimum its remaining shares meet —
/// unless the incoming order's own minimum cannot be met that way, when
/// nothing trades.
fn walk(
    queue: &Queue,
    mins: &HashMap<u64, u32>,
    side: Side,
    limit: Option<u32>,
    qty: u32,
    min: u32,
) -> Vec<(u64, u32)> {
    let crosses = |p: u32| limit.is_none_or(|l| if side == Side::Buy { p <= l } else { p >= l });
    let (mut left, mut fills) = (qty, Vec::new());
    for &(r, q, p) in queue {
        if left == 0 || !crosses(p) {
            break;
        }
        if mins.get(&r).copied().unwrap_or(0) <= left {
            let take = q.min(left);
            fills.push((r, take));
            left -= take;
        }
    }
    let traded: u32 = fills.iter().map(|f| f.1).sum();
    if traded < min {
        fills.clear();
    }
    fills
}

/// Not crossed at rest among orders without a minimum (one with a minimum
/// may rest across orders too small to trade with it).
fn check_uncrossed(e: &Engine, mins: &HashMap<u64, u32>) -> Result<(), TestCaseError> {
    for sym in 1..=2u16 {
        let best = |side: Side| {
            e.depth(sym, side)
                .into_iter()
                .find(|(_, _, os)| os.iter().any(|(r, _)| mins.get(r).copied().unwrap_or(0) == 0))
                .map(|l| l.0)
        };
        if let (Some(b), Some(a)) = (best(Side::Buy), best(Side::Sell)) {
            prop_assert!(b < a, "crossed book: bid {} ask {}", b, a);
        }
        // The engine's own view agrees.
        prop_assert_eq!(e.best_without_minimum(sym, Side::Buy), best(Side::Buy));
        prop_assert_eq!(e.best_without_minimum(sym, Side::Sell), best(Side::Sell));
    }
    Ok(())
}

fn check(cmds: &[Command]) -> Result<(), TestCaseError> {
    let mut e = Engine::new(Limits { symbols: 2, orders: 64, levels: 8, ..Limits::default() }, 0, 1);
    let mut ledger: HashMap<u64, Ledger> = HashMap::new();
    // What the test knows of live orders: (client, token) → reference, reference → minimum.
    let mut refs: HashMap<(u32, u32), u64> = HashMap::new();
    let mut mins: HashMap<u64, u32> = HashMap::new();
    for &c in cmds {
        let before = queues(&e);
        let mut events = Vec::new();
        e.handle(c, &mut |ev| events.push(ev));
        // The minimum an accepted order of this command carries.
        let min_of = match c {
            Command::New(o) => o.min_qty,
            Command::Replace { client, token, qty, .. } => {
                refs.get(&(client, token)).and_then(|r| mins.get(r)).copied().unwrap_or(0).min(qty)
            }
            Command::Cancel { .. } => 0,
        };
        let mut fills: Vec<(u64, u32)> = Vec::new();
        let mut limit_of: HashMap<u64, (Side, u32)> = HashMap::new();
        let mut entered: Option<(u16, Side, u32, u32)> = None;
        for ev in &events {
            match *ev {
                Event::Accepted { client, token, ref_num, symbol, qty, side, price } => {
                    ledger.entry(ref_num).or_default().entered += u64::from(qty);
                    limit_of.insert(ref_num, (side, price));
                    refs.insert((client, token), ref_num);
                    mins.insert(ref_num, min_of);
                    entered = Some((symbol, side, price, qty));
                }
                Event::Executed { symbol, price, qty, maker_ref, taker_ref, taker_side, .. } => {
                    ledger.entry(maker_ref).or_default().executed += u64::from(qty);
                    ledger.entry(taker_ref).or_default().executed += u64::from(qty);
                    let (side, limit) = limit_of[&taker_ref];
                    prop_assert_eq!(side, taker_side);
                    match side {
                        Side::Buy => prop_assert!(price <= limit, "bought through the limit"),
                        Side::Sell => prop_assert!(price >= limit, "sold through the limit"),
                    }
                    // At the maker's price, and in the queue's order.
                    let q = &before[&(symbol, taker_side)];
                    let pos = q.iter().position(|o| o.0 == maker_ref).expect("maker was resting before");
                    prop_assert_eq!(q[pos].2, price, "executed at the resting price");
                    fills.push((maker_ref, qty));
                }
                Event::Canceled { ref_num, qty, .. } => ledger.entry(ref_num).or_default().canceled += u64::from(qty),
                Event::Replaced { client, new_token, old_ref, new_ref, qty, symbol, price, .. } => {
                    let old = ledger.entry(old_ref).or_default();
                    old.canceled = old.entered - old.executed;
                    ledger.entry(new_ref).or_default().entered += u64::from(qty);
                    refs.insert((client, new_token), new_ref);
                    mins.insert(new_ref, min_of);
                    // It traded nothing: the walk must say so too.
                    let side =
                        before.iter().find_map(|(k, q)| q.iter().any(|o| o.0 == old_ref).then_some(k.1.opposite()));
                    entered = side.map(|s| (symbol, s, price, qty));
                }
                Event::Booked { .. } | Event::Rejected { .. } => {}
                Event::Cross { .. } => prop_assert!(false, "continuous trading never runs an auction"),
            }
        }
        // Exactly the executions the walk predicts (none for a rejected command).
        prop_assert_eq!(&fills, &expected(c, entered, &before, &mins, min_of), "executions of {:?}", c);
        check_uncrossed(&e, &mins)?;
        // Conservation: entered = executed + canceled + resting, for every order.
        let rest = resting(&e);
        for (r, l) in &ledger {
            let left = rest.get(r).copied().unwrap_or(0);
            prop_assert_eq!(l.entered, l.executed + l.canceled + left, "shares not conserved for order {}: {:?}", r, l);
        }
    }
    Ok(())
}

/// What `c` must trade, given what of it was entered (symbol, side, limit,
/// shares; none if rejected) with minimum `min`.
fn expected(
    c: Command,
    entered: Option<(u16, Side, u32, u32)>,
    before: &HashMap<(u16, Side), Queue>,
    mins: &HashMap<u64, u32>,
    min: u32,
) -> Vec<(u64, u32)> {
    match (c, entered) {
        (Command::New(o), Some(_)) => {
            walk(&before[&(o.symbol, o.side)], mins, o.side, (!o.market).then_some(o.price), o.qty, o.min_qty)
        }
        (Command::Replace { .. }, Some((symbol, side, price, qty))) => {
            walk(&before[&(symbol, side)], mins, side, Some(price), qty, min)
        }
        _ => Vec::new(),
    }
}

/// Per (symbol, side of an incoming order): the priority queue it meets —
/// the opposite side, best price first, then time.
fn queues(e: &Engine) -> HashMap<(u16, Side), Queue> {
    let queue = |sym: u16, side: Side| -> Queue {
        e.depth(sym, side.opposite())
            .into_iter()
            .flat_map(|(p, _, os)| os.into_iter().map(move |(r, q)| (r, q, p)))
            .collect()
    };
    [1u16, 2].iter().flat_map(|&s| [Side::Buy, Side::Sell].map(|side| ((s, side), queue(s, side)))).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn invariants_hold_for_any_command_sequence(cmds in proptest::collection::vec(command(), 1..200)) {
        check(&cmds)?;
    }
}
