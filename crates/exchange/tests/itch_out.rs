//! Goal: the ITCH feed the exchange publishes is a faithful, decodable record
//! of its books. Method: random order flow through the engine; every event
//! through the ITCH writer; the packets decoded with fairfeed-wire and
//! applied to a plain order-book model (add, execute, cancel, delete,
//! replace) keyed by order reference; the model must equal the engine's books
//! at the end, sequence numbers must run without gaps, and every message must
//! be valid ITCH 5.0.

use std::collections::BTreeMap;

use fairfeed_exchange::engine::{Command, Engine, Limits, NewOrder, Side, Tif};
use fairfeed_exchange::itch_out::ItchWriter;
use fairfeed_wire::itch::Message;
use fairfeed_wire::moldudp64::{Packet, COUNT_END_OF_SESSION};
use rand::{Rng, SeedableRng};

/// 50,000 random commands through the engine and the writer.
fn flow(names: &[String]) -> (Engine, Vec<Vec<u8>>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut e = Engine::new(Limits { symbols: 3, ..Limits::default() }, 0, 1);
    let mut w = ItchWriter::new("FFTEST0001", names);
    w.open(1_000);
    let mut live: Vec<(u32, u32)> = Vec::new();
    for i in 0..50_000u32 {
        let now = 34_200_000_000_000 + u64::from(i) * 1_000;
        let cmd = match rng.gen_range(0..10) {
            0..=1 if !live.is_empty() => {
                let (c, t) = live[rng.gen_range(0..live.len())];
                Command::Cancel { client: c, token: t, leave: rng.gen_range(0..50) }
            }
            2 if !live.is_empty() => {
                let k = rng.gen_range(0..live.len());
                let (c, t) = live[k];
                live[k].1 = 1_000_000 + i;
                Command::Replace {
                    client: c,
                    token: t,
                    new_token: 1_000_000 + i,
                    price: rng.gen_range(990..=1010) * 100,
                    qty: rng.gen_range(1..=100),
                }
            }
            _ => {
                let c = rng.gen_range(1..=4);
                live.push((c, i));
                Command::New(NewOrder {
                    client: c,
                    token: i,
                    symbol: rng.gen_range(1..=3),
                    side: if rng.gen_bool(0.5) { Side::Buy } else { Side::Sell },
                    price: rng.gen_range(990..=1010) * 100,
                    qty: rng.gen_range(1..=100),
                    tif: if rng.gen_bool(0.1) { Tif::Ioc } else { Tif::Day },
                    market: rng.gen_bool(0.02),
                    hidden: rng.gen_bool(0.1),
                    min_qty: 0,
                })
            }
        };
        e.handle(cmd, &mut |ev| w.on_event(now, &ev));
        if i % 7 == 0 {
            w.flush();
        }
    }
    w.close(40_000_000_000_000);
    (e, w.take_packets())
}

/// A book keyed by order reference: (locate, side, price, shares).
type Book = BTreeMap<u64, (u16, u8, u32, u32)>;

/// The engine's displayed orders as a [`Book`], and how many hidden ones rest.
fn displayed_book(e: &Engine) -> (Book, usize) {
    let mut want = BTreeMap::new();
    let mut hidden_resting = 0;
    for sym in 1..=3u16 {
        for (side, code) in [(Side::Buy, b'B'), (Side::Sell, b'S')] {
            let all: usize = e.depth(sym, side).iter().map(|l| l.2.len()).sum();
            let shown: usize = e.displayed_depth(sym, side).iter().map(|l| l.2.len()).sum();
            hidden_resting += all - shown;
            for (price, _, orders) in e.displayed_depth(sym, side) {
                for (r, q) in orders {
                    want.insert(r, (sym, code, price, q));
                }
            }
        }
    }
    (want, hidden_resting)
}

#[test]
fn a_book_rebuilt_from_the_itch_feed_equals_the_engines() {
    let names: Vec<String> = ["AAPL", "MSFT", "BRK B"].iter().map(|s| s.to_string()).collect();
    let (e, packets) = flow(&names);
    // Replay the feed into a model book: ref → (locate, side, price, shares).
    let mut book: Book = BTreeMap::new();
    let (mut next, mut types) = (1u64, BTreeMap::<u8, u64>::new());
    for p in &packets {
        let pk = Packet::new_checked(&p[..]).expect("valid MoldUDP64");
        assert!(p.len() <= 1_400);
        assert_eq!(pk.sequence(), next, "no gap in sequence numbers");
        if pk.message_count() == COUNT_END_OF_SESSION {
            continue;
        }
        for m in pk.messages() {
            let m = m.expect("well-framed block");
            fairfeed_wire::itch::validate(m).expect("valid ITCH 5.0 type and length");
            *types.entry(m[0]).or_default() += 1;
            match Message::parse(m).unwrap() {
                Message::AddOrder(a) => {
                    assert!(book
                        .insert(a.order_ref(), (a.stock_locate(), a.side(), a.price().0, a.shares()))
                        .is_none());
                    assert_eq!(
                        a.stock().as_str().map(str::trim_end),
                        Some(names[usize::from(a.stock_locate()) - 1].as_str())
                    );
                }
                Message::OrderExecuted(x) => {
                    let o = book.get_mut(&x.order_ref()).expect("executed order is on the book");
                    o.3 -= x.executed_shares();
                    if o.3 == 0 {
                        book.remove(&x.order_ref());
                    }
                }
                Message::OrderCancel(x) => {
                    let o = book.get_mut(&x.order_ref()).expect("canceled order is on the book");
                    o.3 -= x.cancelled_shares();
                    assert!(o.3 > 0, "a cancel leaving nothing is a delete");
                }
                Message::OrderDelete(d) => {
                    book.remove(&d.order_ref()).expect("deleted order is on the book");
                }
                Message::OrderReplace(u) => {
                    let o = book.remove(&u.original_order_ref()).expect("replaced order is on the book");
                    book.insert(u.new_order_ref(), (o.0, o.1, u.price().0, u.shares()));
                }
                Message::Trade(t) => {
                    // A hidden order traded: anonymous, nothing on the book changes.
                    assert_eq!(t.order_ref(), 0);
                    assert!(t.shares() > 0);
                }
                Message::SystemEvent(_) | Message::StockDirectory(_) => {}
                other => panic!("unexpected message {other:?}"),
            }
        }
        next = pk.sequence() + u64::from(pk.message_count());
    }
    // The engine's displayed books, as the same map: no hidden order ever
    // reached the feed, and every displayed one did.
    let (want, hidden_resting) = displayed_book(&e);
    assert_eq!(book, want, "the feed's book equals the engine's displayed book");
    assert!(hidden_resting > 0, "the flow leaves hidden orders resting");
    for t in [b'A', b'E', b'X', b'D', b'U', b'S', b'R', b'P'] {
        assert!(types.get(&t).copied().unwrap_or(0) > 0, "the feed has {} messages: {types:?}", t as char);
    }
}

/// Goal (issue 43): a late joiner's books — a snapshot of the feed taken at
/// any point, then the rest of the feed — are the engine's own displayed
/// books at the end, order by order and in each price level's queue order.
/// Method: the same flow's packets through the snapshot service's follower;
/// snapshots at five points, each replayed into empty books followed by the
/// rest of the feed; every level compared with `Engine::displayed_depth`.
#[test]
fn books_rebuilt_from_a_snapshot_and_the_rest_equal_the_engines_queues() {
    use fairfeed_feed::book::Books;
    use fairfeed_feed::snapshot::Follower;
    let names: Vec<String> = ["AAPL", "MSFT", "BRK B"].iter().map(|s| s.to_string()).collect();
    let (e, packets) = flow(&names);
    for cut in [1, packets.len() / 5, packets.len() / 2, packets.len() * 4 / 5, packets.len() - 1] {
        let mut f = Follower::new(fairfeed_feed::snapshot::GAP_WAIT_DEFAULT_NS, 1 << 20);
        for p in &packets[..cut] {
            f.on_packet(0, p);
        }
        let s = f.snapshot().expect("a feed followed from its start is served");
        let mut books = Books::new();
        let mut rest = &s.frames[..];
        while let Some((p, used)) = fairfeed_wire::soupbintcp::split_packet(rest).unwrap() {
            if let fairfeed_wire::soupbintcp::PacketRepr::SequencedData(m) = p {
                if m[0] != b'G' {
                    books.apply(m).expect("a snapshot message applies to empty books");
                }
            }
            rest = &rest[used..];
        }
        for p in &packets[cut..] {
            let pk = Packet::new_checked(&p[..]).unwrap();
            if pk.message_count() == COUNT_END_OF_SESSION {
                continue;
            }
            for m in pk.messages() {
                books.apply(m.unwrap()).expect("the live feed applies after the snapshot");
            }
        }
        for sym in 1..=3u16 {
            for (side, code) in [(Side::Buy, b'B'), (Side::Sell, b'S')] {
                let want: Vec<(u32, Vec<(u64, u32)>)> =
                    e.displayed_depth(sym, side).into_iter().map(|(price, _, orders)| (price, orders)).collect();
                assert_eq!(books.queues(sym, code), want, "cut at packet {cut}, symbol {sym} side {}", code as char);
            }
        }
    }
}
