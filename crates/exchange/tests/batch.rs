//! Goal: the engine's frequent batch auctions (`Engine::handle_batch`,
//! exchange config `ordering = "batch"`) keep the promises of a call
//! auction under any flow — one clearing price per symbol per batch, every
//! fill within its order's limit, no crossed book after a batch, shares
//! conserved for every order — and the ITCH feed stays a faithful record of
//! the books. Method: proptest drives random batches of new orders, cancels
//! and replaces (a narrow price band and few tokens, so crossing, partial
//! fills, cancels of the batch's own orders and duplicate tokens are
//! common); every batch's events are checked against the book before and
//! after, and through the ITCH writer into `fairfeed_feed::book::Books`,
//! which must equal the engine's displayed queues at the end.

use std::collections::HashMap;

use fairfeed_exchange::auction::{clear, AuctionOrder};
use fairfeed_exchange::engine::{Command, Engine, Event, Limits, NewOrder, Reject, Side, Tif};
use fairfeed_exchange::itch_out::ItchWriter;
use fairfeed_wire::moldudp64::{Packet, COUNT_END_OF_SESSION};
use proptest::prelude::*;

fn new(client: u32, token: u32, side: Side, price: u32, qty: u32) -> Command {
    Command::New(NewOrder {
        client,
        token,
        symbol: 1,
        side,
        price,
        qty,
        tif: Tif::Day,
        market: false,
        hidden: false,
        min_qty: 0,
    })
}

fn run(e: &mut Engine, cmds: &[Command]) -> Vec<Event> {
    let mut v = Vec::new();
    e.handle_batch(cmds, &mut |ev| v.push(ev));
    v
}

#[test]
fn a_stale_quote_is_shared_by_everyone_in_the_batch() {
    let mut e = Engine::new(Limits { symbols: 2, ..Limits::default() }, 0, 1);
    // A quote of 100 at 10.00 rests; four firms lift it in one batch.
    run(&mut e, &[new(9, 1, Side::Sell, 100_000, 100)]);
    let ev = run(&mut e, &(1..=4).map(|c| new(c, 1, Side::Buy, 100_000, 100)).collect::<Vec<_>>());
    let mut filled: HashMap<u32, u32> = HashMap::new();
    for x in &ev {
        if let Event::Executed { taker_client, qty, price, auction, maker_client, .. } = *x {
            assert!(auction);
            assert_eq!((price, maker_client), (100_000, 9));
            *filled.entry(taker_client).or_default() += qty;
        }
    }
    assert_eq!(filled, (1..=4).map(|c| (c, 25)).collect(), "each firm 25 %, whoever came first");
    let crosses: Vec<_> = ev.iter().filter(|x| matches!(x, Event::Cross { .. })).collect();
    assert_eq!(crosses, [&Event::Cross { symbol: 1, match_num: crosses_match(&ev), price: 100_000, qty: 100 }]);
    // What is left of each bid rests at its limit.
    assert_eq!(e.top(1), (Some((100_000, 300)), None));
    assert_eq!((e.stats.batches, e.stats.auctions), (2, 1));
}

fn crosses_match(ev: &[Event]) -> u64 {
    ev.iter()
        .find_map(|x| match x {
            Event::Cross { match_num, .. } => Some(*match_num),
            _ => None,
        })
        .unwrap_or(0)
}

#[test]
fn a_minimum_quantity_is_refused_and_a_batch_order_can_be_withdrawn() {
    let mut e = Engine::new(Limits { symbols: 2, ..Limits::default() }, 0, 1);
    let Command::New(o) = new(1, 1, Side::Buy, 100, 10) else { unreachable!() };
    let ev = run(
        &mut e,
        &[
            Command::New(NewOrder { min_qty: 5, ..o }),
            new(1, 2, Side::Buy, 100, 10),
            Command::Cancel { client: 1, token: 2, leave: 0 },
            new(2, 1, Side::Sell, 100, 10),
        ],
    );
    assert!(ev.contains(&Event::Rejected { client: 1, token: 1, reason: Reject::BadMinQty }));
    assert!(!ev.iter().any(|x| matches!(x, Event::Executed { .. })), "the withdrawn bid never traded: {ev:?}");
    assert_eq!(e.top(1), (None, Some((100, 10))));
}

#[test]
fn neither_side_resting_trades_at_one_price_and_only_the_cross_prints() {
    let mut e = Engine::new(Limits { symbols: 2, ..Limits::default() }, 0, 1);
    let ev = run(&mut e, &[new(1, 1, Side::Buy, 105, 10), new(2, 1, Side::Sell, 95, 4), new(3, 1, Side::Sell, 100, 4)]);
    let prices: Vec<u32> = ev
        .iter()
        .filter_map(|x| match x {
            Event::Executed { price, .. } | Event::Cross { price, .. } => Some(*price),
            _ => None,
        })
        .collect();
    assert_eq!(prices.len(), 3, "two fills and the cross: {ev:?}");
    assert!(prices.iter().all(|&p| p == prices[0]));
    let mut w = ItchWriter::new("FFTEST0001", &["AAA".to_string(), "BBB".to_string()]);
    w.open(1_000);
    for x in &ev {
        w.on_event(2_000, x);
    }
    w.flush();
    let types: Vec<u8> = w
        .take_packets()
        .iter()
        .flat_map(|p| Packet::new_checked(&p[..]).unwrap().messages().map(|m| m.unwrap()[0]).collect::<Vec<_>>())
        .collect();
    assert!(types.contains(&b'Q') && !types.contains(&b'C') && !types.contains(&b'P'), "{types:?}");
    // The bid's rest (2 shares) is on the feed's book.
    assert_eq!(e.top(1), (Some((105, 2)), None));
}

fn command() -> impl Strategy<Value = Command> {
    let side = prop_oneof![Just(Side::Buy), Just(Side::Sell)];
    let new = (1u32..=3, 0u32..12, 1u16..=2, side, 95u32..=105, 1u32..=30, any::<bool>(), 0u8..12).prop_map(
        |(client, token, symbol, side, price, qty, ioc, kind)| {
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
                min_qty: u32::from(kind == 2),
            })
        },
    );
    let cancel =
        (1u32..=3, 0u32..12, 0u32..10).prop_map(|(client, token, leave)| Command::Cancel { client, token, leave });
    let replace = (1u32..=3, 0u32..12, 0u32..12, 95u32..=105, 1u32..=30)
        .prop_map(|(client, token, new_token, price, qty)| Command::Replace { client, token, new_token, price, qty });
    prop_oneof![6 => new, 2 => cancel, 2 => replace]
}

/// Per order reference: its side and limit, shares entered, executed, canceled.
#[derive(Debug, Clone, Copy)]
struct Ledger {
    side: Side,
    limit: u32,
    entered: u64,
    executed: u64,
    canceled: u64,
}

fn resting(e: &Engine) -> HashMap<u64, u64> {
    let mut m = HashMap::new();
    for sym in 1..=2u16 {
        for side in [Side::Buy, Side::Sell] {
            for (_, total, orders) in e.depth(sym, side) {
                assert_eq!(orders.iter().map(|o| u64::from(o.1)).sum::<u64>(), total);
                m.extend(orders.into_iter().map(|(r, q)| (r, u64::from(q))));
            }
        }
    }
    m
}

/// One batch's events against the promises; `ledger` follows every order.
fn check_batch(e: &Engine, ev: &[Event], ledger: &mut HashMap<u64, Ledger>) -> Result<(), TestCaseError> {
    let mut cross: HashMap<u16, (u32, u64)> = HashMap::new();
    let mut traded: HashMap<u16, (Vec<u32>, u64)> = HashMap::new();
    for x in ev {
        match *x {
            Event::Accepted { ref_num, side, price, qty, .. } => {
                let l = Ledger { side, limit: price, entered: u64::from(qty), executed: 0, canceled: 0 };
                prop_assert!(ledger.insert(ref_num, l).is_none(), "a reference used twice");
            }
            Event::Executed { symbol, price, qty, maker_ref, taker_ref, auction, .. } => {
                prop_assert!(auction, "a batch trades only in its auction");
                let t = traded.entry(symbol).or_default();
                t.0.push(price);
                t.1 += u64::from(qty);
                for r in [maker_ref, taker_ref] {
                    let l = ledger.get_mut(&r).expect("an execution of a known order");
                    let within = if l.side == Side::Buy { price <= l.limit } else { price >= l.limit };
                    prop_assert!(within, "filled at {} beyond its limit {}", price, l.limit);
                    l.executed += u64::from(qty);
                }
            }
            Event::Canceled { ref_num, qty, .. } => {
                ledger.get_mut(&ref_num).expect("a cancel of a known order").canceled += u64::from(qty);
            }
            Event::Cross { symbol, price, qty, .. } => {
                prop_assert!(cross.insert(symbol, (price, qty)).is_none(), "one auction per symbol per batch");
            }
            Event::Rejected { .. } | Event::Booked { .. } => {}
            Event::Replaced { .. } => prop_assert!(false, "a batch replaces by cancel and re-entry"),
        }
    }
    for (sym, (prices, qty)) in &traded {
        let &(p, v) = cross.get(sym).expect("fills end in a cross");
        prop_assert!(prices.iter().all(|&x| x == p), "one price: {:?} vs {}", prices, p);
        prop_assert_eq!(*qty, v, "the cross's volume is its fills'");
    }
    // Nothing crossed after the batch (no order here has a minimum).
    for sym in 1..=2u16 {
        if let (Some(b), Some(a)) = e.top(sym) {
            prop_assert!(b.0 < a.0, "crossed after the batch: bid {} ask {}", b.0, a.0);
        }
    }
    let rest = resting(e);
    for (r, l) in ledger.iter() {
        let left = rest.get(r).copied().unwrap_or(0);
        prop_assert_eq!(l.entered, l.executed + l.canceled + left, "shares of order {} conserved", r);
    }
    Ok(())
}

/// The feed's books, rebuilt from the writer's packets.
fn feed_books(packets: &[Vec<u8>]) -> fairfeed_feed::book::Books {
    let mut books = fairfeed_feed::book::Books::new();
    for p in packets {
        let pk = Packet::new_checked(&p[..]).unwrap();
        if pk.message_count() == COUNT_END_OF_SESSION {
            continue;
        }
        for m in pk.messages() {
            let m = m.unwrap();
            fairfeed_wire::itch::validate(m).expect("valid ITCH 5.0");
            books.apply(m).expect("every message applies to the feed's books");
        }
    }
    books
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn every_batch_clears_at_one_price_and_the_feed_follows(
        batches in proptest::collection::vec(proptest::collection::vec(command(), 0..12), 1..12),
    ) {
        let mut e = Engine::new(Limits { symbols: 2, orders: 64, levels: 8, ..Limits::default() }, 0, 1);
        let mut w = ItchWriter::new("FFTEST0001", &["AAA".to_string(), "BBB".to_string()]);
        w.open(1_000);
        let mut ledger = HashMap::new();
        for (i, b) in batches.iter().enumerate() {
            let ev = run(&mut e, b);
            for x in &ev {
                w.on_event(2_000 + i as u64, x);
            }
            check_batch(&e, &ev, &mut ledger)?;
        }
        w.flush();
        let books = feed_books(&w.take_packets());
        for sym in 1..=2u16 {
            for (side, code) in [(Side::Buy, b'B'), (Side::Sell, b'S')] {
                let want: Vec<(u32, Vec<(u64, u32)>)> =
                    e.displayed_depth(sym, side).into_iter().map(|(p, _, o)| (p, o)).collect();
                prop_assert_eq!(books.queues(sym, code), want);
            }
        }
    }
}

/// The book's resting orders of `symbol` as the auction sees them: each side
/// best price first, in time order at a price.
fn book_orders(e: &Engine, symbol: u16) -> Vec<(u64, AuctionOrder)> {
    let mut v = Vec::new();
    for side in [Side::Buy, Side::Sell] {
        for (price, _, orders) in e.depth(symbol, side) {
            v.extend(
                orders
                    .into_iter()
                    .map(|(r, q)| (r, AuctionOrder { side, limit: price, qty: u64::from(q), resting: true })),
            );
        }
    }
    v
}

fn plain_new() -> impl Strategy<Value = Command> {
    let side = prop_oneof![Just(Side::Buy), Just(Side::Sell)];
    (1u32..=4, side, 95u32..=105, 1u32..=30, 0u8..15).prop_map(|(client, side, price, qty, kind)| {
        Command::New(NewOrder {
            client,
            token: 0, // numbered below
            symbol: 1,
            side,
            price,
            qty,
            tif: if kind == 1 { Tif::Ioc } else { Tif::Day },
            market: kind == 0,
            hidden: kind == 2,
            min_qty: 0,
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    /// The engine's auction, which looks at only the part of the book the
    /// batch can reach (and stands in for the rest of each level), fills
    /// every order exactly as `auction::clear` over the whole book and the
    /// batch does — same price, same volume, same shares for each order.
    #[test]
    fn the_auction_over_part_of_the_book_is_the_auction_over_all_of_it(
        batches in proptest::collection::vec(proptest::collection::vec(plain_new(), 1..10), 1..10),
    ) {
        let mut e = Engine::new(Limits { symbols: 1, ..Limits::default() }, 0, 1);
        let (mut token, mut reference) = (0u32, None);
        for b in &batches {
            let cmds: Vec<Command> = b.iter().map(|c| {
                token += 1;
                let Command::New(o) = *c else { unreachable!() };
                Command::New(NewOrder { token, ..o })
            }).collect();
            let mut all = book_orders(&e, 1);
            let ev = run(&mut e, &cmds);
            // The batch's orders, accepted in order, after the book's.
            for x in &ev {
                if let Event::Accepted { ref_num, side, price, qty, .. } = *x {
                    all.push((ref_num, AuctionOrder { side, limit: price, qty: u64::from(qty), resting: false }));
                }
            }
            let want = clear(&all.iter().map(|a| a.1).collect::<Vec<_>>(), reference);
            let cross = ev.iter().find_map(|x| match *x {
                Event::Cross { price, qty, .. } => Some((price, qty)),
                _ => None,
            });
            prop_assert_eq!(cross, want.price.map(|p| (p, want.volume)));
            let mut got: HashMap<u64, u64> = HashMap::new();
            for x in &ev {
                if let Event::Executed { maker_ref, taker_ref, qty, .. } = *x {
                    *got.entry(maker_ref).or_default() += u64::from(qty);
                    *got.entry(taker_ref).or_default() += u64::from(qty);
                }
            }
            for ((r, _), f) in all.iter().zip(&want.fills) {
                prop_assert_eq!(got.get(r).copied().unwrap_or(0), *f, "order {}", r);
            }
            reference = want.price.or(reference);
        }
    }
}
