//! Goal: the OUCH gateway's SoupBinTCP session logic follows the protocol and
//! isolates bad clients. Method: the sans-IO gateway and engine driven with
//! byte streams built by fairfeed-wire's encoders; what comes back is parsed
//! the same way.

use fairfeed_exchange::client;
use fairfeed_exchange::engine::{Engine, Limits, Side};
use fairfeed_exchange::gateway::{Close, Conn, Gateway, GatewayConfig};
use fairfeed_wire::ouch::outbound;
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr};

fn cfg() -> GatewayConfig {
    GatewayConfig {
        session: "S1".into(),
        users: vec![("ALICE".into(), "pw1".into()), ("BOB".into(), "pw2".into())],
        symbols: vec!["AAPL".into(), "MSFT".into()],
        ..GatewayConfig::default()
    }
}

fn packet(p: PacketRepr<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    client::packet(p, &mut b);
    b
}

fn login(user: &str, pw: &str, seq: u64) -> Vec<u8> {
    let mut b = Vec::new();
    client::login(user, pw, seq, &mut b);
    b
}

fn enter(token: u32, side: u8, qty: u32, symbol: &str, price: i64) -> Vec<u8> {
    let mut b = Vec::new();
    client::enter_order(&client::Order { token, side, qty, symbol, price, ..Default::default() }, &mut b);
    b
}

/// Every packet in `b`, as (type byte, payload).
fn packets(mut b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut v = Vec::new();
    while let Some((p, n)) = split_packet(b).unwrap() {
        let payload = match p {
            PacketRepr::SequencedData(d) => d.to_vec(),
            _ => Vec::new(),
        };
        v.push((p.packet_type(), payload));
        b = &b[n..];
    }
    assert!(b.is_empty());
    v
}

struct Rig {
    g: Gateway,
    e: Engine,
    /// Bytes delivered to each client by engine events.
    inbox: Vec<Vec<u8>>,
    /// The ITCH feed of the same events.
    itch: fairfeed_exchange::itch_out::ItchWriter,
}

impl Rig {
    fn new() -> Self {
        Rig {
            g: Gateway::new(cfg()),
            e: Engine::new(Limits { symbols: 2, ..Limits::default() }, 0, 1),
            inbox: vec![Vec::new(); 2],
            itch: fairfeed_exchange::itch_out::ItchWriter::new("FFTEST0001", &["AAPL".into(), "MSFT".into()]),
        }
    }

    /// A rig with ALICE (`a`) and BOB (`b`) logged in.
    fn alice_and_bob() -> (Rig, Conn, Conn) {
        let mut r = Rig::new();
        let (mut a, mut b) = (Conn::new(0), Conn::new(0));
        assert_eq!(r.feed(&mut a, 1, &login("ALICE", "pw1", 0)).0, Ok(()));
        assert_eq!(r.feed(&mut b, 1, &login("BOB", "pw2", 0)).0, Ok(()));
        (r, a, b)
    }

    /// The ITCH messages published since the last call, as (type, order reference, shares).
    fn itch(&mut self) -> Vec<(u8, u64, u32)> {
        use fairfeed_wire::itch::Message;
        self.itch.flush();
        let mut v = Vec::new();
        for p in self.itch.take_packets() {
            let p = fairfeed_wire::moldudp64::Packet::new_checked(&p[..]).unwrap();
            for m in p.messages() {
                v.push(match Message::parse(m.unwrap()).unwrap() {
                    Message::AddOrder(a) => (b'A', a.order_ref(), a.shares()),
                    Message::OrderExecuted(x) => (b'E', x.order_ref(), x.executed_shares()),
                    Message::Trade(t) => (b'P', t.order_ref(), t.shares()),
                    Message::OrderDelete(d) => (b'D', d.order_ref(), 0),
                    other => (other.msg_type(), 0, 0),
                });
            }
        }
        v
    }

    fn feed(&mut self, c: &mut Conn, now: u64, bytes: &[u8]) -> (Result<(), Close>, Vec<u8>) {
        let mut cmds = Vec::new();
        let mut out = Vec::new();
        let r = self.g.on_bytes(c, now, bytes, &mut |cmd, _| cmds.push(cmd), &mut out);
        for cmd in cmds {
            let mut evs = Vec::new();
            self.e.handle(cmd, &mut |ev| evs.push(ev));
            for ev in evs {
                self.itch.on_event(now, &ev);
                let inbox = &mut self.inbox;
                self.g.on_event(now, &ev, &mut |client, b| inbox[client as usize].extend_from_slice(b));
            }
        }
        (r, out)
    }
}

#[test]
fn login_orders_execution_and_replay_on_relogin() {
    let mut r = Rig::new();
    let mut a = Conn::new(0);
    let (res, out) = r.feed(&mut a, 1, &login("ALICE", "pw1", 0));
    assert_eq!(res, Ok(()));
    assert_eq!(packets(&out)[0].0, b'A', "login accepted");
    let mut b = Conn::new(0);
    assert_eq!(r.feed(&mut b, 2, &login("BOB", "pw2", 1)).0, Ok(()));
    // Alice rests a sell, Bob lifts it: both get executions; Alice gets her accept first.
    assert_eq!(r.feed(&mut a, 3, &enter(1, b'S', 100, "AAPL", 1_000_000)).0, Ok(()));
    assert_eq!(r.feed(&mut b, 4, &enter(7, b'B', 60, "AAPL", 1_010_000)).0, Ok(()));
    let alice: Vec<u8> = packets(&r.inbox[0]).iter().map(|p| p.1[0]).collect();
    let bob: Vec<u8> = packets(&r.inbox[1]).iter().map(|p| p.1[0]).collect();
    assert_eq!(alice, b"AE", "accepted, executed");
    assert_eq!(bob, b"AE");
    let exec = packets(&r.inbox[1]).pop().unwrap().1;
    let outbound::Message::OrderExecuted(x) = outbound::Message::parse(&exec).unwrap() else { panic!() };
    assert_eq!((x.user_ref_num(), x.quantity(), x.price().0), (7, 60, 1_000_000), "at the resting price");
    // Alice drops and logs in again asking for message 2: the execution is replayed.
    r.g.closed(&mut a, Close::Logout);
    let mut a2 = Conn::new(10);
    let (res, out) = r.feed(&mut a2, 11, &login("ALICE", "pw1", 2));
    assert_eq!(res, Ok(()));
    let p = packets(&out);
    assert_eq!(p[0].0, b'A');
    assert_eq!(p.len(), 2, "login accepted + one replayed message");
    assert_eq!(p[1].1[0], b'E');
    assert_eq!(p[1].1, packets(&r.inbox[0])[1].1, "the very bytes first sent");
    assert_eq!(r.g.stats.replayed, 1);
}

#[test]
fn bad_logins_and_bad_bytes_close_only_their_connection() {
    let mut r = Rig::new();
    let mut good = Conn::new(0);
    assert_eq!(r.feed(&mut good, 1, &login("ALICE", "pw1", 0)).0, Ok(()));
    let mut c = Conn::new(0);
    let (res, out) = r.feed(&mut c, 1, &login("ALICE", "wrong", 0));
    assert_eq!(res, Err(Close::LoginRejected));
    assert_eq!(packets(&out)[0].0, b'J');
    let mut dup = Conn::new(0);
    assert_eq!(r.feed(&mut dup, 1, &login("ALICE", "pw1", 0)).0, Err(Close::LoginRejected), "already logged in");
    let mut early = Conn::new(0);
    assert!(matches!(r.feed(&mut early, 1, &enter(1, b'B', 1, "AAPL", 1)).0, Err(Close::Protocol(_))));
    let mut junk = Conn::new(0);
    assert_eq!(r.feed(&mut junk, 1, &login("BOB", "pw2", 0)).0, Ok(()));
    assert!(matches!(r.feed(&mut junk, 2, &[0, 3, b'?', 1, 2]).0, Err(Close::Protocol(_))), "unknown packet type");
    // The good connection is untouched and still trades.
    assert_eq!(r.feed(&mut good, 3, &enter(1, b'B', 10, "AAPL", 1_000_000)).0, Ok(()));
    assert_eq!(packets(&r.inbox[0]).last().unwrap().1[0], b'A');
    // Bad content in a valid message: an OUCH reject, connection stays.
    let (res, out) = r.feed(&mut good, 4, &enter(2, b'B', 10, "NOPE", 1_000_000));
    assert_eq!(res, Ok(()));
    assert_eq!(packets(&out).last().unwrap().1[0], b'J');
    // Bytes split anywhere are reassembled.
    let bytes = enter(3, b'S', 5, "MSFT", 2_000_000);
    for chunk in bytes.chunks(3) {
        assert_eq!(r.feed(&mut good, 5, chunk).0, Ok(()));
    }
    assert_eq!(r.e.stats.accepted, 2);
}

#[test]
fn heartbeats_and_idle_timeout() {
    let mut r = Rig::new();
    let mut c = Conn::new(0);
    assert_eq!(r.feed(&mut c, 0, &login("ALICE", "pw1", 0)).0, Ok(()));
    let mut out = Vec::new();
    assert_eq!(r.g.on_tick(&mut c, 500_000_000, &mut out), Ok(()));
    assert!(out.is_empty(), "no heartbeat before a second of silence");
    assert_eq!(r.g.on_tick(&mut c, 1_000_000_001, &mut out), Ok(()));
    assert_eq!(packets(&out), vec![(b'H', vec![])]);
    let hb = packet(PacketRepr::ClientHeartbeat);
    assert_eq!(r.feed(&mut c, 10_000_000_000, &hb).0, Ok(()));
    assert_eq!(r.g.on_tick(&mut c, 20_000_000_000, &mut Vec::new()), Ok(()));
    assert_eq!(r.g.on_tick(&mut c, 26_000_000_000, &mut Vec::new()), Err(Close::IdleTimeout));
    // The user may log in again.
    let mut c2 = Conn::new(0);
    assert_eq!(r.feed(&mut c2, 27_000_000_000, &login("ALICE", "pw1", 0)).0, Ok(()));
}

#[test]
fn a_reused_token_is_refused_and_the_original_order_keeps_its_routing() {
    let mut r = Rig::new();
    let mut a = Conn::new(0);
    assert_eq!(r.feed(&mut a, 1, &login("ALICE", "pw1", 0)).0, Ok(()));
    assert_eq!(r.feed(&mut a, 2, &enter(1, b'S', 100, "AAPL", 1_000_000)).0, Ok(()));
    assert_eq!(r.g.symbol_of(0, 1), Some(1), "token 1 routes to AAPL's engine");
    // The same token again, on another symbol and side: refused at the gateway.
    let (res, out) = r.feed(&mut a, 3, &enter(1, b'B', 10, "MSFT", 2_000_000));
    assert_eq!(res, Ok(()), "a bad order is not a bad connection");
    let reply = packets(&out).pop().unwrap().1;
    let outbound::Message::Rejected(j) = outbound::Message::parse(&reply).unwrap() else { panic!("{reply:?}") };
    assert_eq!((j.user_ref_num(), j.reason()), (1, 4), "duplicate token");
    assert_eq!(r.e.stats.accepted, 1, "no engine saw the duplicate");
    assert_eq!(r.g.stats.duplicate_tokens, 1);
    // The original is untouched: same routing, and it can still be canceled.
    assert_eq!(r.g.symbol_of(0, 1), Some(1));
    let mut cancel = Vec::new();
    client::cancel_order(1, 0, &mut cancel);
    assert_eq!(r.feed(&mut a, 4, &cancel).0, Ok(()));
    assert_eq!(packets(&r.inbox[0]).last().unwrap().1[0], b'C', "canceled, not rejected as unknown");
}

/// OUCH 5.0: a UserRefNum is day-unique and strictly increasing. The token
/// of an order that has ended, and one below the highest sent, are refused
/// like a live one; the next token above the highest is taken.
#[test]
fn tokens_are_day_unique_and_strictly_increasing() {
    let mut r = Rig::new();
    let mut a = Conn::new(0);
    assert_eq!(r.feed(&mut a, 1, &login("ALICE", "pw1", 0)).0, Ok(()));
    assert_eq!(r.feed(&mut a, 2, &enter(5, b'S', 100, "AAPL", 1_000_000)).0, Ok(()));
    let mut cancel = Vec::new();
    client::cancel_order(5, 0, &mut cancel);
    assert_eq!(r.feed(&mut a, 3, &cancel).0, Ok(()));
    assert_eq!(r.g.live_orders(), 0, "order 5 has ended");
    let rejected = |out: &[u8]| {
        let reply = packets(out).pop().unwrap().1;
        let outbound::Message::Rejected(j) = outbound::Message::parse(&reply).unwrap() else { panic!("{reply:?}") };
        (j.user_ref_num(), j.reason())
    };
    // The ended order's token again, then one below it that was never used.
    let (res, out) = r.feed(&mut a, 4, &enter(5, b'B', 10, "MSFT", 2_000_000));
    assert_eq!((res, rejected(&out)), (Ok(()), (5, 4)), "the token of an ended order");
    let (res, out) = r.feed(&mut a, 5, &enter(3, b'B', 10, "MSFT", 2_000_000));
    assert_eq!((res, rejected(&out)), (Ok(()), (3, 4)), "a token below the highest");
    assert_eq!(r.g.stats.duplicate_tokens, 2);
    assert_eq!(r.e.stats.accepted, 1, "no engine saw either");
    // The next one up is an order; a Replace must move up as well.
    assert_eq!(r.feed(&mut a, 6, &enter(6, b'B', 10, "MSFT", 2_000_000)).0, Ok(()));
    assert_eq!(r.e.stats.accepted, 2);
    let mut replace = Vec::new();
    client::replace_order(6, 4, 20, 2_000_100, &mut replace);
    let (res, out) = r.feed(&mut a, 7, &replace);
    assert_eq!((res, rejected(&out)), (Ok(()), (4, 4)), "a replacement token below the highest");
    assert_eq!(r.g.symbol_of(0, 6), Some(2), "order 6 keeps its routing");
}

#[test]
fn a_connection_that_never_logs_in_is_closed_however_it_trickles() {
    let mut r = Rig::new();
    let mut lurker = Conn::new(0);
    let mut good = Conn::new(0);
    assert_eq!(r.feed(&mut good, 1, &login("ALICE", "pw1", 0)).0, Ok(()));
    // One byte of a login packet a second: never a whole packet, never idle.
    let bytes = login("BOB", "pw2", 0);
    for (i, b) in bytes.iter().take(5).enumerate() {
        let now = (i as u64 + 1) * 900_000_000;
        assert_eq!(r.feed(&mut lurker, now, &[*b]).0, Ok(()));
        assert_eq!(r.g.on_tick(&mut lurker, now, &mut Vec::new()), Ok(()), "within 5 s of opening");
        assert_eq!(r.g.on_tick(&mut good, now, &mut Vec::new()), Ok(()));
    }
    assert_eq!(r.g.on_tick(&mut lurker, 5_000_000_001, &mut Vec::new()), Err(Close::LoginTimeout));
    assert_eq!(r.g.stats.login_timeouts, 1);
    // A logged-in session is not subject to it.
    let hb = packet(PacketRepr::ClientHeartbeat);
    assert_eq!(r.feed(&mut good, 5_000_000_001, &hb).0, Ok(()));
    assert_eq!(r.g.on_tick(&mut good, 5_000_000_002, &mut Vec::new()), Ok(()));
}

/// An Enter Order with every echo field chosen by the test.
fn enter_full(token: u32, side: u8, qty: u32, price: i64, tif: u8, flags: (u8, u8, u8)) -> Vec<u8> {
    enter_any(token, side, qty, price, tif, flags, "CLIENT-ID-0042", &[])
}

/// An Enter Order for AAPL, every field given; `appendage` raw (its options).
#[allow(clippy::too_many_arguments)]
fn enter_any(
    token: u32,
    side: u8,
    qty: u32,
    price: i64,
    tif: u8,
    (display, capacity, iso): (u8, u8, u8),
    cl_ord_id: &str,
    appendage: &[u8],
) -> Vec<u8> {
    use fairfeed_wire::macros::Tail;
    use fairfeed_wire::ouch::{inbound, Appendage, OuchPrice};
    use fairfeed_wire::{Alpha, Stock};
    let m = inbound::MessageRepr::EnterOrder(inbound::EnterOrderRepr {
        user_ref_num: token,
        side,
        quantity: qty,
        symbol: Stock::from_str_padded("AAPL"),
        price: OuchPrice(price),
        time_in_force: tif,
        display,
        capacity,
        intermarket_sweep_eligibility: iso,
        cross_type: b'N',
        cl_ord_id: Alpha::from_str_padded(cl_ord_id),
        appendage_length: appendage.len() as u16,
        appendage: Appendage::from_slice(appendage).unwrap(),
    });
    let mut b = [0u8; 256];
    let n = m.emit(&mut b).unwrap();
    packet(PacketRepr::UnsequencedData(&b[..n]))
}

#[test]
fn echoes_repeat_what_the_client_entered_and_stamps_are_since_midnight() {
    let mut r = Rig::new();
    let mut a = Conn::new(0);
    // A wall clock of 3 days, 1 h and 5 ns since the epoch: OUCH stamps 1 h 5 ns.
    let now = 3 * 86_400_000_000_000 + 3_600_000_000_005;
    assert_eq!(r.feed(&mut a, now, &login("ALICE", "pw1", 0)).0, Ok(()));
    // Short sale, hidden, principal, intermarket sweep: echoed as entered.
    assert_eq!(r.feed(&mut a, now, &enter_full(1, b'T', 100, 1_000_000, b'0', (b'N', b'P', b'Y'))).0, Ok(()));
    let acc = packets(&r.inbox[0]).pop().unwrap().1;
    let outbound::Message::OrderAccepted(x) = outbound::Message::parse(&acc).unwrap() else { panic!("{acc:?}") };
    assert_eq!(x.timestamp(), 3_600_000_000_005, "nanoseconds since midnight");
    assert_eq!((x.side(), x.display(), x.capacity(), x.intermarket_sweep_eligibility()), (b'T', b'N', b'P', b'Y'));
    assert_eq!(x.cl_ord_id(), fairfeed_wire::Alpha::from_str_padded("CLIENT-ID-0042"));
    // An IOC that trades in full: echoed with time in force 3, and gone from the gateway's map.
    assert_eq!(r.feed(&mut a, now, &enter_full(2, b'B', 100, 1_000_000, b'3', (b'Y', b'A', b'N'))).0, Ok(()));
    let acc = packets(&r.inbox[0]).iter().rev().find(|p| p.1[0] == b'A').unwrap().1.clone();
    let outbound::Message::OrderAccepted(x) = outbound::Message::parse(&acc).unwrap() else { panic!() };
    assert_eq!((x.user_ref_num(), x.time_in_force()), (2, b'3'));
    assert_eq!(r.g.live_orders(), 0, "both orders traded in full: nothing left to route");
    // Cancelling an order that is not live: OUCH's Cancel Reject, from the gateway.
    let mut cancel = Vec::new();
    client::cancel_order(1, 0, &mut cancel);
    let (res, out) = r.feed(&mut a, now, &cancel);
    assert_eq!(res, Ok(()));
    assert_eq!(packets(&out).pop().unwrap().1[0], b'I', "Cancel Reject");
    assert_eq!(r.g.stats.cancel_rejects, 1);
}

/// A SoupBinTCP Login Request written by hand: fields exactly as given.
fn raw_login(user: &str, pw: &str, session: &str, seq: &str) -> Vec<u8> {
    let field = |s: &str, n: usize, left: bool| {
        if left {
            format!("{s:<n$}")
        } else {
            format!("{s:>n$}")
        }
    };
    let body = format!(
        "L{}{}{}{}",
        field(user, 6, true),
        field(pw, 10, true),
        field(session, 10, true),
        field(seq, 20, false)
    );
    let mut b = (body.len() as u16).to_be_bytes().to_vec();
    b.extend_from_slice(body.as_bytes());
    b
}

#[test]
fn logins_follow_soupbintcp_case_padding_and_bad_numbers() {
    let mut r = Rig::new();
    // Username and password are case-insensitive; the session may come left-justified.
    let mut a = Conn::new(0);
    let (res, out) = r.feed(&mut a, 1, &raw_login("alice", "PW1", "S1", "0"));
    assert_eq!(res, Ok(()), "{:?}", packets(&out));
    assert_eq!(packets(&out)[0].0, b'A');
    // A wrong session is still refused.
    let mut b = Conn::new(0);
    assert_eq!(r.feed(&mut b, 1, &raw_login("BOB", "pw2", "OTHER", "0")).0, Err(Close::LoginRejected));
    // A sequence number that does not fit: a Login Rejected, not a silent close.
    let mut c = Conn::new(0);
    let (res, out) = r.feed(&mut c, 1, &raw_login("BOB", "pw2", "", "99999999999999999999"));
    assert_eq!(res, Err(Close::LoginRejected));
    assert_eq!(packets(&out), vec![(b'J', vec![])]);
}

#[test]
fn an_order_entered_with_display_n_rests_and_trades_but_never_shows_on_itch() {
    use fairfeed_exchange::itch_out::ItchWriter;
    use fairfeed_wire::itch::Message;
    let mut g = Gateway::new(cfg());
    let mut e = Engine::new(Limits { symbols: 2, ..Limits::default() }, 0, 1);
    let mut w = ItchWriter::new("FFTEST0001", &["AAPL".to_string(), "MSFT".to_string()]);
    let mut a = Conn::new(0);
    let mut feed = |g: &mut Gateway, e: &mut Engine, w: &mut ItchWriter, bytes: &[u8]| {
        let (mut cmds, mut out) = (Vec::new(), Vec::new());
        assert_eq!(g.on_bytes(&mut a, 1, bytes, &mut |cmd, _| cmds.push(cmd), &mut out), Ok(()));
        for cmd in cmds {
            e.handle(cmd, &mut |ev| w.on_event(1, &ev));
        }
    };
    feed(&mut g, &mut e, &mut w, &login("ALICE", "pw1", 0));
    // A hidden sell of 100 at 100.00, then a displayed buy of 40 that trades with it.
    feed(&mut g, &mut e, &mut w, &enter_full(1, b'S', 100, 1_000_000, b'0', (b'N', b'A', b'N')));
    assert_eq!(e.depth(1, Side::Sell).len(), 1, "the hidden order rests");
    assert!(e.displayed_depth(1, Side::Sell).is_empty(), "... and is not displayed");
    feed(&mut g, &mut e, &mut w, &enter_full(2, b'B', 40, 1_000_000, b'0', (b'Y', b'A', b'N')));
    w.flush();
    let mut kinds = Vec::new();
    for p in w.take_packets() {
        let p = fairfeed_wire::moldudp64::Packet::new_checked(&p[..]).unwrap();
        for m in p.messages() {
            match Message::parse(m.unwrap()).unwrap() {
                Message::Trade(t) => {
                    assert_eq!((t.order_ref(), t.shares(), t.side(), t.price().0), (0, 40, b'S', 1_000_000));
                    kinds.push('P');
                }
                Message::AddOrder(_) | Message::OrderExecuted(_) => panic!("the hidden order appeared on ITCH"),
                _ => {}
            }
        }
    }
    assert_eq!(kinds, ['P'], "one anonymous Trade message");
    assert_eq!(e.depth(1, Side::Sell)[0].1, 60, "60 hidden shares still rest");
}

/// An Enter Order for AAPL with `tif` and the raw `appendage` (options).
fn enter_with(token: u32, side: u8, qty: u32, price: i64, tif: u8, appendage: &[u8]) -> Vec<u8> {
    enter_any(token, side, qty, price, tif, (b'Y', b'A', b'N'), "", appendage)
}

/// OUCH option 3, minimum quantity.
fn min_qty_option(q: u32) -> Vec<u8> {
    let mut v = vec![5, fairfeed_wire::ouch::tag::MIN_QTY];
    v.extend_from_slice(&q.to_be_bytes());
    v
}

/// Goal: an IOC with a minimum quantity trades only if that many shares can
/// trade at once — otherwise it is canceled with nothing executed — and its
/// Order Accepted echoes the option; a minimum above the quantity,
/// malformed, given twice, or on a Replace is refused (reason 8).
#[test]
fn a_minimum_quantity_trades_all_or_nothing_on_entry_and_is_echoed() {
    use fairfeed_exchange::gateway::min_qty;
    let (mut r, mut a, mut b) = Rig::alice_and_bob();
    // Bob rests 100 at 100.0000 and 100 at 100.0100: 200 shares up to 100.0100.
    assert_eq!(r.feed(&mut b, 2, &enter_with(1, b'S', 100, 1_000_000, b'0', &[])).0, Ok(()));
    assert_eq!(r.feed(&mut b, 2, &enter_with(2, b'S', 100, 1_000_100, b'0', &[])).0, Ok(()));
    let msgs = |v: &[u8]| -> Vec<Vec<u8>> { packets(v).into_iter().filter(|p| p.0 == b'S').map(|p| p.1).collect() };
    // Minimum 250 of 300: only 200 can trade → nothing trades, all 300 canceled.
    r.inbox[0].clear();
    assert_eq!(r.feed(&mut a, 3, &enter_with(10, b'B', 300, 1_000_100, b'3', &min_qty_option(250))).0, Ok(()));
    let got = msgs(&r.inbox[0]);
    assert_eq!(got.iter().map(|m| m[0]).collect::<Vec<_>>(), [b'A', b'C'], "accepted, then canceled whole");
    let outbound::Message::OrderAccepted(acc) = outbound::Message::parse(&got[0]).unwrap() else { panic!() };
    assert_eq!(acc.tail(), &min_qty_option(250)[..], "the minimum echoed in the appendage");
    assert_eq!(min_qty(acc.tail()), Ok(250));
    let outbound::Message::OrderCanceled(c) = outbound::Message::parse(&got[1]).unwrap() else { panic!() };
    assert_eq!(c.quantity(), 300);
    assert_eq!(r.e.stats.min_qty_unmet, 1);
    assert_eq!(r.e.stats.executions, 0, "Bob's orders untouched");
    // Minimum 150: 200 can trade → both of Bob's orders, the other 100 canceled.
    r.inbox[0].clear();
    assert_eq!(r.feed(&mut a, 4, &enter_with(11, b'B', 300, 1_000_100, b'3', &min_qty_option(150))).0, Ok(()));
    let kinds: Vec<u8> = msgs(&r.inbox[0]).iter().map(|m| m[0]).collect();
    assert_eq!(kinds, [b'A', b'E', b'E', b'C'], "{kinds:?}");
    assert_eq!(r.e.stats.executed_qty, 200);
    // Refused at the gateway, reason 8, nothing reaching the engine: a
    // minimum above the quantity (IOC or day), a malformed option, the
    // option twice.
    let refused = |r: &mut Rig, c: &mut Conn, bytes: &[u8]| {
        let commands = r.e.stats.commands;
        let (res, out) = r.feed(c, 5, bytes);
        assert_eq!(res, Ok(()));
        let m = msgs(&out);
        let outbound::Message::Rejected(j) = outbound::Message::parse(&m[0]).unwrap() else { panic!("{m:?}") };
        assert_eq!(j.reason(), 8);
        assert_eq!(r.e.stats.commands, commands);
    };
    refused(&mut r, &mut a, &enter_with(12, b'B', 300, 1_000_100, b'0', &min_qty_option(301)));
    refused(&mut r, &mut a, &enter_with(13, b'B', 300, 1_000_100, b'3', &min_qty_option(301)));
    refused(&mut r, &mut a, &enter_with(14, b'B', 300, 1_000_100, b'3', &[3, 3, 0, 1]));
    let twice = [min_qty_option(10), min_qty_option(10)].concat();
    refused(&mut r, &mut a, &enter_with(15, b'B', 300, 1_000_100, b'3', &twice));
    assert_eq!(r.g.stats.bad_min_qty, 4);
    // A Replace carrying a minimum: refused, the order keeps resting.
    assert_eq!(r.feed(&mut b, 6, &enter_with(3, b'S', 100, 1_000_500, b'0', &[])).0, Ok(()));
    let replace = {
        use fairfeed_wire::macros::Tail;
        use fairfeed_wire::ouch::{inbound, Appendage, OuchPrice};
        let o = min_qty_option(10);
        let m = inbound::MessageRepr::ReplaceOrder(inbound::ReplaceOrderRepr {
            orig_user_ref_num: 3,
            user_ref_num: 4,
            quantity: 100,
            price: OuchPrice(1_000_600),
            time_in_force: b'0',
            display: b'Y',
            intermarket_sweep_eligibility: b'N',
            cl_ord_id: fairfeed_wire::Alpha::default(),
            appendage_length: o.len() as u16,
            appendage: Appendage::from_slice(&o).unwrap(),
        });
        let mut buf = [0u8; 256];
        let n = m.emit(&mut buf).unwrap();
        packet(PacketRepr::UnsequencedData(&buf[..n]))
    };
    refused(&mut r, &mut b, &replace);
    assert_eq!(r.g.stats.bad_min_qty, 5);
    // No minimum, no appendage: echoed empty, as before.
    r.inbox[0].clear();
    assert_eq!(r.feed(&mut a, 7, &enter_with(16, b'B', 10, 900_000, b'0', &[])).0, Ok(()));
    let got = msgs(&r.inbox[0]);
    let outbound::Message::OrderAccepted(acc) = outbound::Message::parse(&got[0]).unwrap() else { panic!() };
    assert!(acc.tail().is_empty());
}

/// Goal: a day order with a minimum quantity that cannot trade it on entry
/// rests, hidden from the ITCH feed; incoming orders smaller than its minimum
/// pass it by (trading with the orders behind it, or resting across it), and
/// the first incoming order that meets it trades with it, shown on ITCH as an
/// anonymous Trade; a Replace keeps the minimum.
#[test]
fn a_day_order_with_a_minimum_rests_hidden_and_trades_only_with_orders_that_meet_it() {
    let (mut r, mut a, mut b) = Rig::alice_and_bob();
    let msgs = |v: &[u8]| -> Vec<u8> { packets(v).into_iter().filter(|p| p.0 == b'S').map(|p| p.1[0]).collect() };
    // Bob offers 100 at 100.0000 (displayed: an Add Order).
    assert_eq!(r.feed(&mut b, 2, &enter_with(1, b'S', 100, 1_000_000, b'0', &[])).0, Ok(()));
    let bob_ref = r.e.depth(1, Side::Sell)[0].2[0].0;
    assert_eq!(r.itch(), [(b'A', bob_ref, 100)]);
    // Alice bids for 500 at 100.0100, at least 300 at once: only 100 are
    // offered, so nothing trades and the order rests, hidden.
    r.inbox = vec![Vec::new(); 2];
    assert_eq!(r.feed(&mut a, 3, &enter_with(10, b'B', 500, 1_000_100, b'0', &min_qty_option(300))).0, Ok(()));
    assert_eq!(msgs(&r.inbox[0]), [b'A'], "accepted, nothing executed, nothing canceled");
    assert_eq!(r.e.stats.min_qty_unmet, 1);
    assert_eq!(r.e.depth(1, Side::Buy)[0].1, 500, "it rests");
    assert!(r.e.displayed_depth(1, Side::Buy).is_empty(), "... not displayed");
    assert_eq!(r.itch(), [], "no Add Order for it");
    assert_eq!(r.e.depth(1, Side::Sell)[0].1, 100, "Bob's offer untouched");
    // Bob sells 200 at 100.0000: below Alice's minimum, it passes her by and
    // rests beside his first offer (the book is crossed only by her hidden bid).
    r.inbox = vec![Vec::new(); 2];
    assert_eq!(r.feed(&mut b, 4, &enter_with(2, b'S', 200, 1_000_000, b'0', &[])).0, Ok(()));
    assert_eq!(msgs(&r.inbox[1]), [b'A']);
    assert_eq!(r.e.stats.executions, 0);
    assert_eq!(r.e.stats.min_qty_passed, 1);
    assert_eq!(r.e.depth(1, Side::Sell)[0].1, 300);
    assert_eq!(r.itch().iter().map(|m| (m.0, m.2)).collect::<Vec<_>>(), [(b'A', 200)]);
    // Bob sells 300 IOC at 100.0100: that meets her minimum — 300 trade at her price.
    r.inbox = vec![Vec::new(); 2];
    assert_eq!(r.feed(&mut b, 6, &enter_with(3, b'S', 300, 1_000_100, b'3', &[])).0, Ok(()));
    assert_eq!(msgs(&r.inbox[0]), [b'E'], "Alice executed");
    assert_eq!(msgs(&r.inbox[1]), [b'A', b'E']);
    assert_eq!((r.e.stats.executions, r.e.stats.executed_qty), (1, 300));
    assert_eq!(r.itch().iter().map(|m| (m.0, m.2)).collect::<Vec<_>>(), [(b'P', 300)], "an anonymous Trade");
    assert_eq!(r.e.depth(1, Side::Buy)[0].1, 200, "200 still rest");
    // Replaced at 100.0200 for 400 shares: it keeps its minimum (300), so a
    // 299-share sell passes it by and a 300-share one trades.
    let replace = replace_of(10, 12, 400, 1_000_200);
    // The replacement re-enters as a new order: 400 at 100.0200, minimum
    // still 300 — Bob's two offers at 100.0000 (300 shares) meet it, so
    // they trade (displayed makers: Order Executed on ITCH) and 100 rest, hidden.
    assert_eq!(r.feed(&mut a, 7, &replace).0, Ok(()));
    assert_eq!((r.e.stats.executions, r.e.stats.executed_qty), (3, 600));
    let feed = r.itch();
    assert_eq!(feed.iter().filter(|m| m.0 == b'E').map(|m| m.2).collect::<Vec<_>>(), [100, 200]);
    assert_eq!(feed.iter().filter(|m| m.0 == b'A').count(), 0, "the rest is still hidden");
    assert_eq!(r.e.depth(1, Side::Buy)[0], (1_000_200, 100, r.e.depth(1, Side::Buy)[0].2.clone()));
    // Its 100 shares still need an incoming order of 300: 299 pass it by.
    assert_eq!(r.feed(&mut b, 8, &enter_with(4, b'S', 299, 1_000_200, b'3', &[])).0, Ok(()));
    assert_eq!(r.e.stats.executions, 3, "299 < 300: passed by");
    assert_eq!(r.feed(&mut b, 9, &enter_with(5, b'S', 300, 1_000_200, b'3', &[])).0, Ok(()));
    assert_eq!((r.e.stats.executions, r.e.stats.executed_qty), (4, 700));
    assert!(r.e.depth(1, Side::Buy).is_empty());
    // Replaced in place (nothing to trade with): Order Replaced echoes the
    // minimum the replacement kept, capped at its new quantity.
    assert_eq!(r.feed(&mut a, 10, &enter_with(20, b'B', 100, 990_000, b'0', &min_qty_option(90))).0, Ok(()));
    r.inbox = vec![Vec::new(); 2];
    assert_eq!(r.feed(&mut a, 11, &replace_of(20, 21, 80, 991_000)).0, Ok(()));
    let got: Vec<Vec<u8>> = packets(&r.inbox[0]).into_iter().filter(|p| p.0 == b'S').map(|p| p.1).collect();
    let outbound::Message::OrderReplaced(u) = outbound::Message::parse(&got[0]).unwrap() else { panic!("{got:?}") };
    assert_eq!(u.tail(), &min_qty_option(80)[..]);
    assert_eq!(r.e.depth(1, Side::Buy)[0].1, 80);
}

/// A Replace Order for AAPL (no appendage).
fn replace_of(orig: u32, token: u32, qty: u32, price: i64) -> Vec<u8> {
    let mut b = Vec::new();
    client::replace_order(orig, token, qty, price, &mut b);
    b
}

#[derive(Debug, Clone)]
enum Flow {
    /// A token `delta` above the client's highest (≤ 0: a reuse, refused).
    Enter {
        client: usize,
        delta: i64,
        buy: bool,
        tick: i64,
        qty: u32,
        ioc: bool,
    },
    Cancel {
        client: usize,
        back: u32,
    },
    Replace {
        client: usize,
        back: u32,
        delta: i64,
        tick: i64,
        qty: u32,
    },
}

fn flow_op() -> impl proptest::strategy::Strategy<Value = Flow> {
    use proptest::prelude::*;
    let delta = prop_oneof![8 => 1i64..3, 1 => 3i64..50, 1 => -5i64..=0];
    prop_oneof![
        6 => (0usize..2, delta.clone(), any::<bool>(), -3i64..=3, 1u32..5, any::<bool>())
            .prop_map(|(client, delta, buy, tick, qty, ioc)| Flow::Enter { client, delta, buy, tick, qty, ioc }),
        2 => (0usize..2, 0u32..20).prop_map(|(client, back)| Flow::Cancel { client, back }),
        2 => (0usize..2, 0u32..20, delta, -3i64..=3, 1u32..5)
            .prop_map(|(client, back, delta, tick, qty)| Flow::Replace { client, back, delta, tick, qty }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Two clients entering, canceling and replacing orders — tokens mostly
    /// increasing, some reused — through the gateway and the engine: the
    /// gateway keeps echo fields for as many orders as the engine holds in
    /// its books (none left behind, none missing) after every message.
    #[test]
    fn the_gateway_and_the_engine_agree_on_live_orders(ops in proptest::collection::vec(flow_op(), 1..300)) {
        let (mut r, a, b) = Rig::alice_and_bob();
        let mut conns = [a, b];
        let mut high = [0i64; 2];
        for (i, op) in ops.iter().enumerate() {
            let now = 10 + i as u64;
            let mut bytes = Vec::new();
            match *op {
                Flow::Enter { client, delta, buy, tick, qty, ioc } => {
                    let token = u32::try_from((high[client] + delta).max(0)).unwrap();
                    high[client] = high[client].max(i64::from(token));
                    let symbol = if token % 2 == 0 { "AAPL" } else { "MSFT" };
                    let o = client::Order {
                        token, side: if buy { b'B' } else { b'S' }, qty: qty * 100, symbol,
                        price: 1_000_000 + tick * 100, ioc, hidden: false, stamp: None, clock: None, min_qty: 0,
                    };
                    client::enter_order(&o, &mut bytes);
                }
                Flow::Cancel { client, back } => {
                    let token = u32::try_from((high[client] - i64::from(back)).max(0)).unwrap();
                    client::cancel_order(token, 0, &mut bytes);
                }
                Flow::Replace { client, back, delta, tick, qty } => {
                    let orig = u32::try_from((high[client] - i64::from(back)).max(0)).unwrap();
                    let token = u32::try_from((high[client] + delta).max(0)).unwrap();
                    high[client] = high[client].max(i64::from(token));
                    client::replace_order(orig, token, qty * 100, 1_000_000 + tick * 100, &mut bytes);
                }
            }
            let client = match *op { Flow::Enter { client, .. } | Flow::Cancel { client, .. } | Flow::Replace { client, .. } => client };
            let (res, _) = r.feed(&mut conns[client], now, &bytes);
            proptest::prop_assert_eq!(res, Ok(()));
            proptest::prop_assert_eq!(r.g.live_orders() as u64, r.e.stats.live_orders, "after op {}: {:?}", i, op);
            let in_books: usize = [Side::Buy, Side::Sell]
                .into_iter()
                .flat_map(|side| (1..=2u16).map(move |symbol| (symbol, side)))
                .map(|(symbol, side)| r.e.depth(symbol, side).iter().map(|l| l.2.len()).sum::<usize>())
                .sum();
            proptest::prop_assert_eq!(r.e.stats.live_orders, in_books as u64, "after op {}", i);
        }
    }
}
