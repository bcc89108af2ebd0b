//! Goal: the matching engine keeps its invariants under any sequence of
//! orders, cancels and replaces — no crossed book at rest, shares conserved
//! for every order, price-time priority, executions at the resting price and
//! never through the incoming order's limit, levels that add up. Method:
//! proptest drives random commands (a narrow price band, few tokens, so
//! duplicates, unknown orders, partial fills and crossing replaces are common)
//! and checks each against the book before and after.

use std::collections::HashMap;

use fairfeed_exchange::engine::{Command, Engine, Event, Limits, NewOrder, Side, Tif};
use proptest::prelude::*;

fn command() -> impl Strategy<Value = Command> {
    let side = prop_oneof![Just(Side::Buy), Just(Side::Sell)];
    let new = (1u32..=3, 0u32..12, 1u16..=2, side, 95u32..=105, 1u32..=30, any::<bool>(), 0u8..10, 0u32..=45).prop_map(
        |(client, token, symbol, side, price, qty, ioc, kind, min)| {
            // A minimum (on orders that do not rest, as the gateway allows) a third of the time.
            let min_qty = if (ioc || kind == 0) && min % 3 == 0 { (min / 3 + 1).min(qty) } else { 0 };
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

/// Price-time priority: the makers one order hit are a prefix of the queue it
/// met (`before`), each fully taken except possibly the last.
fn check_priority(
    makers: &[u64],
    before: &HashMap<(u16, Side), Queue>,
    taken: &HashMap<u64, u32>,
) -> Result<(), TestCaseError> {
    if let Some(&first) = makers.first() {
        let q = before.values().find(|q| q.iter().any(|o| o.0 == first)).unwrap();
        for (k, r) in makers.iter().enumerate() {
            prop_assert_eq!(q[k].0, *r, "priority violated");
            if k + 1 < makers.len() {
                prop_assert_eq!(taken[r], q[k].1, "an earlier maker was not taken in full");
            }
        }
    }
    Ok(())
}

/// A minimum quantity: all of it trades at once, or nothing does — and
/// nothing is canceled that could have traded it.
fn check_min_qty(c: &Command, before: &HashMap<(u16, Side), Queue>, events: &[Event]) -> Result<(), TestCaseError> {
    let Command::New(o) = *c else { return Ok(()) };
    if o.min_qty == 0 {
        return Ok(());
    }
    let crosses = |p: u32| o.market || if o.side == Side::Buy { p <= o.price } else { p >= o.price };
    let avail: u64 = before[&(o.symbol, o.side)].iter().filter(|m| crosses(m.2)).map(|m| u64::from(m.1)).sum();
    let traded: u64 = events
        .iter()
        .map(|ev| match *ev {
            Event::Executed { taker_client, taker_token, qty, .. }
                if (taker_client, taker_token) == (o.client, o.token) =>
            {
                u64::from(qty)
            }
            _ => 0,
        })
        .sum();
    let accepted = events.iter().any(|ev| matches!(ev, Event::Accepted { .. }));
    if accepted && avail >= u64::from(o.min_qty) {
        prop_assert!(traded >= u64::from(o.min_qty), "{} available, minimum {}, traded {}", avail, o.min_qty, traded);
    } else {
        prop_assert_eq!(traded, 0, "below its minimum {}: {} available", o.min_qty, avail);
    }
    Ok(())
}

fn check(cmds: &[Command]) -> Result<(), TestCaseError> {
    let mut e = Engine::new(Limits { symbols: 2, orders: 64, levels: 8, ..Limits::default() }, 0, 1);
    let mut ledger: HashMap<u64, Ledger> = HashMap::new();
    for &c in cmds {
        // The priority queue an incoming order meets: opposite side, best price first, then time.
        let queue = |e: &Engine, sym: u16, side: Side| -> Queue {
            e.depth(sym, side.opposite())
                .into_iter()
                .flat_map(|(p, _, os)| os.into_iter().map(move |(r, q)| (r, q, p)))
                .collect()
        };
        let before: HashMap<(u16, Side), Queue> = [1u16, 2]
            .iter()
            .flat_map(|&s| [Side::Buy, Side::Sell].map(|side| ((s, side), queue(&e, s, side))))
            .collect();
        let mut events = Vec::new();
        e.handle(c, &mut |ev| events.push(ev));
        let mut taken: HashMap<u64, u32> = HashMap::new();
        let mut order_of_makers: Vec<u64> = Vec::new();
        let mut limit_of: HashMap<u64, (Side, u32)> = HashMap::new();
        for ev in &events {
            match *ev {
                Event::Accepted { ref_num, qty, side, price, .. } => {
                    ledger.entry(ref_num).or_default().entered += u64::from(qty);
                    limit_of.insert(ref_num, (side, price));
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
                    if order_of_makers.last() != Some(&maker_ref) {
                        order_of_makers.push(maker_ref);
                    }
                    *taken.entry(maker_ref).or_default() += qty;
                }
                Event::Canceled { ref_num, qty, .. } => ledger.entry(ref_num).or_default().canceled += u64::from(qty),
                Event::Replaced { old_ref, new_ref, qty, .. } => {
                    let old = ledger.entry(old_ref).or_default();
                    old.canceled = old.entered - old.executed;
                    ledger.entry(new_ref).or_default().entered += u64::from(qty);
                }
                Event::Booked { .. } | Event::Rejected { .. } => {}
            }
        }
        check_priority(&order_of_makers, &before, &taken)?;
        check_min_qty(&c, &before, &events)?;
        // Not crossed at rest.
        for sym in 1..=2 {
            if let (Some(b), Some(a)) = e.top(sym) {
                prop_assert!(b.0 < a.0, "crossed book: bid {} ask {}", b.0, a.0);
            }
        }
        // Conservation: entered = executed + canceled + resting, for every order.
        let rest = resting(&e);
        for (r, l) in &ledger {
            let left = rest.get(r).copied().unwrap_or(0);
            prop_assert_eq!(l.entered, l.executed + l.canceled + left, "shares not conserved for order {}: {:?}", r, l);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn invariants_hold_for_any_command_sequence(cmds in proptest::collection::vec(command(), 1..200)) {
        check(&cmds)?;
    }
}
