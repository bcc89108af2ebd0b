//! The client side of the order-entry protocol, as bytes: SoupBinTCP packets
//! carrying OUCH 5.0 — for load generators, tests and tools.

use fairfeed_wire::macros::Tail;
use fairfeed_wire::ouch::{inbound, Appendage, OuchPrice};
use fairfeed_wire::soupbintcp::PacketRepr;
use fairfeed_wire::{Alpha, Stock};

/// Appends one SoupBinTCP packet to `out`.
pub fn packet(p: PacketRepr<'_>, out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(at + p.buffer_len(), 0);
    let _ = p.emit(&mut out[at..]);
}

/// A Login Request for `user`/`password`, asking for sequenced messages from `sequence` (0: from now).
pub fn login(user: &str, password: &str, sequence: u64, out: &mut Vec<u8>) {
    packet(
        PacketRepr::LoginRequest {
            username: Alpha::from_str_padded(user),
            password: Alpha::from_str_padded(password),
            session: Alpha::from_str_padded(""),
            sequence,
        },
        out,
    );
}

/// What an Enter Order says.
#[derive(Debug, Clone, Copy, Default)]
pub struct Order<'a> {
    /// The order token.
    pub token: u32,
    /// `B` or `S`.
    pub side: u8,
    /// Shares.
    pub qty: u32,
    /// The stock symbol.
    pub symbol: &'a str,
    /// 4 implied decimals.
    pub price: i64,
    /// Immediate or cancel (else a day order).
    pub ioc: bool,
    /// Display `N`: rests and trades, never shown on the ITCH feed.
    pub hidden: bool,
    /// The sender's timestamp for inbound sequencing (appendage tag 0xF0).
    pub stamp: Option<u64>,
    /// The release point's delivery clock for DBO ordering (appendage tag 0xF1).
    pub clock: Option<crate::ordering::DeliveryClock>,
    /// Minimum quantity (OUCH option 3; 0: none; IOC orders only).
    pub min_qty: u32,
}

fn unsequenced(m: inbound::MessageRepr, out: &mut Vec<u8>) {
    let mut b = [0u8; 256];
    if let Ok(n) = m.emit(&mut b) {
        packet(PacketRepr::UnsequencedData(&b[..n]), out);
    }
}

/// An OUCH 5.0 Enter Order in a SoupBinTCP unsequenced packet.
pub fn enter_order(o: &Order<'_>, out: &mut Vec<u8>) {
    let mut app = [0u8; fairfeed_wire::ouch::APPENDAGE_LEN_MAX];
    let mut n = 0;
    if let Some(ts) = o.stamp {
        let t = crate::sequencer::timestamp_appendage(ts);
        let _ = fairfeed_wire::ouch::push_option(&mut app, &mut n, t[1], &t[2..]);
    }
    if let Some(c) = o.clock {
        let t = crate::sequencer::delivery_clock_appendage(c);
        let _ = fairfeed_wire::ouch::push_option(&mut app, &mut n, t[1], &t[2..]);
    }
    if o.min_qty > 0 {
        let _ = fairfeed_wire::ouch::push_option(
            &mut app,
            &mut n,
            fairfeed_wire::ouch::tag::MIN_QTY,
            &o.min_qty.to_be_bytes(),
        );
    }
    let appendage = Appendage::from_slice(&app[..n]).unwrap_or(Appendage::EMPTY);
    unsequenced(
        inbound::MessageRepr::EnterOrder(inbound::EnterOrderRepr {
            user_ref_num: o.token,
            side: o.side,
            quantity: o.qty,
            symbol: Stock::from_str_padded(o.symbol),
            price: OuchPrice(o.price),
            time_in_force: if o.ioc { b'3' } else { b'0' },
            display: if o.hidden { b'N' } else { b'Y' },
            capacity: b'A',
            intermarket_sweep_eligibility: b'N',
            cross_type: b'N',
            cl_ord_id: Alpha::default(),
            appendage_length: appendage.as_slice().len() as u16,
            appendage,
        }),
        out,
    );
}

/// An OUCH 5.0 Cancel Order down to `leave` shares (0: all).
pub fn cancel_order(token: u32, leave: u32, out: &mut Vec<u8>) {
    unsequenced(
        inbound::MessageRepr::CancelOrder(inbound::CancelOrderRepr { user_ref_num: token, quantity: leave }),
        out,
    );
}

/// An OUCH 5.0 Replace Order: order `orig` becomes `token` with `qty` shares at `price` (4 implied decimals).
pub fn replace_order(orig: u32, token: u32, qty: u32, price: i64, out: &mut Vec<u8>) {
    unsequenced(
        inbound::MessageRepr::ReplaceOrder(inbound::ReplaceOrderRepr {
            orig_user_ref_num: orig,
            user_ref_num: token,
            quantity: qty,
            price: OuchPrice(price),
            time_in_force: b'0',
            display: b'Y',
            intermarket_sweep_eligibility: b'N',
            cl_ord_id: Alpha::default(),
            appendage_length: 0,
            appendage: Appendage::EMPTY,
        }),
        out,
    );
}

/// An OUCH 5.0 Account Query (the answer carries the next free UserRefNum).
pub fn account_query(out: &mut Vec<u8>) {
    unsequenced(inbound::MessageRepr::AccountQuery(inbound::AccountQueryRepr {}), out);
}

/// A SoupBinTCP Logout Request.
pub fn logout(out: &mut Vec<u8>) {
    packet(PacketRepr::LogoutRequest, out);
}

/// One order of a seeded flow (its symbol an index into the flow's symbols).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowOrder {
    /// Index into the flow's symbols.
    pub symbol: usize,
    /// `B` or `S`.
    pub side: u8,
    /// Shares.
    pub qty: u32,
    /// 4 implied decimals.
    pub price: i64,
}

/// Price steps a flow's orders stray from the mid at most (each a cent).
pub const FLOW_SPREAD_TICKS: i64 = 10;

/// A seeded order flow over `symbols` symbols around `mid` (4 implied
/// decimals): buys and sells of 100–500 shares, priced up to
/// [`FLOW_SPREAD_TICKS`] cents either side of the mid, so that some rest and
/// some cross. The same seed gives the same orders.
pub fn flow(seed: u64, orders: usize, symbols: usize, mid: i64) -> Vec<FlowOrder> {
    use rand::{Rng, SeedableRng};
    assert!(symbols > 0, "a flow needs a symbol");
    assert!(mid > FLOW_SPREAD_TICKS * 100, "a mid price above the spread");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..orders)
        .map(|_| FlowOrder {
            symbol: rng.gen_range(0..symbols),
            side: if rng.gen_bool(0.5) { b'B' } else { b'S' },
            qty: 100 * rng.gen_range(1..=5),
            price: mid + 100 * rng.gen_range(-FLOW_SPREAD_TICKS..=FLOW_SPREAD_TICKS),
        })
        .collect()
}

#[cfg(test)]
mod flow_tests {
    #[test]
    fn a_flow_is_seeded_and_stays_near_its_mid() {
        let a = super::flow(7, 500, 3, 1_850_000);
        assert_eq!(a, super::flow(7, 500, 3, 1_850_000));
        assert_ne!(a, super::flow(8, 500, 3, 1_850_000));
        assert!(a.iter().all(|o| (o.price - 1_850_000).abs() <= 1_000 && o.symbol < 3 && o.qty % 100 == 0));
        assert!(a.iter().any(|o| o.side == b'B') && a.iter().any(|o| o.side == b'S'));
    }
}
