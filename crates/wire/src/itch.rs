//! NASDAQ TotalView-ITCH 5.0: all 23 message types, big-endian, exact lengths.
//!
//! Every message starts with the same 11 bytes: type (1), stock locate (2),
//! tracking number (2), timestamp (6, nanoseconds since midnight). Prices are
//! `Price(4)` (4 implied decimals) except the MWCB decline levels, which are
//! `Price(8)` (8 implied decimals), as the specification says.
//!
//! Decoding never panics: [`Message::parse`] checks the type byte against the
//! specification's table and the length for exact equality before any field is
//! read. Alpha fields are kept as the raw bytes received, so a code this crate
//! does not know (a new event code, say) is still delivered, not rejected.
//!
//! ```
//! use fairfeed_wire::itch::{Message, AddOrderRepr};
//! use fairfeed_wire::{Price4, Stock, Timestamp48};
//! let add = AddOrderRepr {
//!     stock_locate: 7, tracking_number: 0, timestamp: Timestamp48(34_200_000_000_000),
//!     order_ref: 42, side: b'B', shares: 100, stock: Stock::from_str_padded("AAPL"),
//!     price: Price4(1_895_000),
//! };
//! let mut buf = [0u8; 36];
//! assert_eq!(add.emit(&mut buf), Ok(36));
//! let Message::AddOrder(v) = Message::parse(&buf).unwrap() else { unreachable!() };
//! assert_eq!(v.price().to_string(), "189.5000");
//! assert_eq!(v.stock().as_str(), Some("AAPL"));
//! ```

use crate::error::{Error, Protocol};
use crate::field::{Alpha, Price4, Price8, Stock, Timestamp48};

/// Bytes of the header every ITCH message starts with.
pub const HEADER_LEN: usize = 11;
/// Longest ITCH 5.0 message (`I`, net order imbalance indicator).
pub const MESSAGE_LEN_MAX: usize = 50;
/// Shortest ITCH 5.0 message (`S` and `W`).
pub const MESSAGE_LEN_MIN: usize = 12;

messages! {
    protocol = Protocol::Itch50;
    header {
        /// Locate code identifying the security (0 for market-wide messages).
        stock_locate: u16,
        /// NASDAQ internal tracking number.
        tracking_number: u16,
        /// Nanoseconds since midnight.
        timestamp: Timestamp48,
    }

    /// `S` System Event.
    SystemEvent / SystemEventRepr = b'S', 12 {
        /// `O` start of messages, `S` start of system hours, `Q` start of market hours,
        /// `M` end of market hours, `E` end of system hours, `C` end of messages.
        event_code: u8,
    }
    /// `R` Stock Directory.
    StockDirectory / StockDirectoryRepr = b'R', 39 {
        stock: Stock,
        market_category: u8,
        financial_status_indicator: u8,
        round_lot_size: u32,
        round_lots_only: u8,
        issue_classification: u8,
        issue_sub_type: Alpha<2>,
        authenticity: u8,
        short_sale_threshold_indicator: u8,
        ipo_flag: u8,
        luld_reference_price_tier: u8,
        etp_flag: u8,
        etp_leverage_factor: u32,
        inverse_indicator: u8,
    }
    /// `H` Stock Trading Action.
    StockTradingAction / StockTradingActionRepr = b'H', 25 {
        stock: Stock,
        trading_state: u8,
        reserved: u8,
        reason: Alpha<4>,
    }
    /// `Y` Reg SHO Short Sale Price Test Restricted Indicator.
    RegShoRestriction / RegShoRestrictionRepr = b'Y', 20 {
        stock: Stock,
        reg_sho_action: u8,
    }
    /// `L` Market Participant Position.
    MarketParticipantPosition / MarketParticipantPositionRepr = b'L', 26 {
        mpid: Alpha<4>,
        stock: Stock,
        primary_market_maker: u8,
        market_maker_mode: u8,
        market_participant_state: u8,
    }
    /// `V` MWCB Decline Level (prices with 8 decimals).
    MwcbDeclineLevel / MwcbDeclineLevelRepr = b'V', 35 {
        level1: Price8,
        level2: Price8,
        level3: Price8,
    }
    /// `W` MWCB Status.
    MwcbStatus / MwcbStatusRepr = b'W', 12 {
        breached_level: u8,
    }
    /// `K` IPO Quoting Period Update.
    IpoQuotingPeriodUpdate / IpoQuotingPeriodUpdateRepr = b'K', 28 {
        stock: Stock,
        /// Seconds since midnight.
        ipo_quotation_release_time: u32,
        ipo_quotation_release_qualifier: u8,
        ipo_price: Price4,
    }
    /// `J` LULD Auction Collar.
    LuldAuctionCollar / LuldAuctionCollarRepr = b'J', 35 {
        stock: Stock,
        auction_collar_reference_price: Price4,
        upper_auction_collar_price: Price4,
        lower_auction_collar_price: Price4,
        auction_collar_extension: u32,
    }
    /// `h` Operational Halt.
    OperationalHalt / OperationalHaltRepr = b'h', 21 {
        stock: Stock,
        market_code: u8,
        operational_halt_action: u8,
    }
    /// `A` Add Order, no MPID attribution.
    AddOrder / AddOrderRepr = b'A', 36 {
        order_ref: u64,
        /// `B` buy, `S` sell.
        side: u8,
        shares: u32,
        stock: Stock,
        price: Price4,
    }
    /// `F` Add Order with MPID attribution.
    AddOrderMpid / AddOrderMpidRepr = b'F', 40 {
        order_ref: u64,
        side: u8,
        shares: u32,
        stock: Stock,
        price: Price4,
        attribution: Alpha<4>,
    }
    /// `E` Order Executed.
    OrderExecuted / OrderExecutedRepr = b'E', 31 {
        order_ref: u64,
        executed_shares: u32,
        match_number: u64,
    }
    /// `C` Order Executed With Price.
    OrderExecutedWithPrice / OrderExecutedWithPriceRepr = b'C', 36 {
        order_ref: u64,
        executed_shares: u32,
        match_number: u64,
        printable: u8,
        execution_price: Price4,
    }
    /// `X` Order Cancel (partial).
    OrderCancel / OrderCancelRepr = b'X', 23 {
        order_ref: u64,
        cancelled_shares: u32,
    }
    /// `D` Order Delete.
    OrderDelete / OrderDeleteRepr = b'D', 19 {
        order_ref: u64,
    }
    /// `U` Order Replace.
    OrderReplace / OrderReplaceRepr = b'U', 35 {
        original_order_ref: u64,
        new_order_ref: u64,
        shares: u32,
        price: Price4,
    }
    /// `P` Trade (non-cross, against a non-displayed order).
    Trade / TradeRepr = b'P', 44 {
        order_ref: u64,
        side: u8,
        shares: u32,
        stock: Stock,
        price: Price4,
        match_number: u64,
    }
    /// `Q` Cross Trade.
    CrossTrade / CrossTradeRepr = b'Q', 40 {
        shares: u64,
        stock: Stock,
        cross_price: Price4,
        match_number: u64,
        cross_type: u8,
    }
    /// `B` Broken Trade.
    BrokenTrade / BrokenTradeRepr = b'B', 19 {
        match_number: u64,
    }
    /// `I` Net Order Imbalance Indicator (NOII).
    Noii / NoiiRepr = b'I', 50 {
        paired_shares: u64,
        imbalance_shares: u64,
        imbalance_direction: u8,
        stock: Stock,
        far_price: Price4,
        near_price: Price4,
        current_reference_price: Price4,
        cross_type: u8,
        price_variation_indicator: u8,
    }
    /// `N` Retail Price Improvement Indicator.
    RetailPriceImprovement / RetailPriceImprovementRepr = b'N', 20 {
        stock: Stock,
        interest_flag: u8,
    }
    /// `O` Direct Listing with Capital Raise Price Discovery.
    DirectListingPriceDiscovery / DirectListingPriceDiscoveryRepr = b'O', 48 {
        stock: Stock,
        open_eligibility_status: u8,
        minimum_allowable_price: Price4,
        maximum_allowable_price: Price4,
        near_execution_price: Price4,
        near_execution_time: u64,
        lower_price_range_collar: Price4,
        upper_price_range_collar: Price4,
    }
}

// The lengths the specification prints, pinned independently of the field tables.
const _: () = {
    let expected: [(u8, usize); 23] = [
        (b'S', 12),
        (b'R', 39),
        (b'H', 25),
        (b'Y', 20),
        (b'L', 26),
        (b'V', 35),
        (b'W', 12),
        (b'K', 28),
        (b'J', 35),
        (b'h', 21),
        (b'A', 36),
        (b'F', 40),
        (b'E', 31),
        (b'C', 36),
        (b'X', 23),
        (b'D', 19),
        (b'U', 35),
        (b'P', 44),
        (b'Q', 40),
        (b'B', 19),
        (b'I', 50),
        (b'N', 20),
        (b'O', 48),
    ];
    assert!(TYPES.len() == expected.len());
    let mut i = 0;
    while i < expected.len() {
        match spec_len(expected[i].0) {
            Some(n) => assert!(n == expected[i].1),
            None => panic!("type missing"),
        }
        assert!(expected[i].1 >= MESSAGE_LEN_MIN && expected[i].1 <= MESSAGE_LEN_MAX);
        i += 1;
    }
};

/// Checks a message's type and exact length without decoding it — one table
/// lookup, no branch on the type — for hops that forward packets unread
/// (arbitrators, proxies) but must not forward garbage. Returns the type byte.
#[inline]
pub fn validate(b: &[u8]) -> Result<u8, Error> {
    let Some(&t) = b.first() else {
        return Err(Error::Truncated { needed: 1, available: 0 });
    };
    let expected = usize::from(LENGTHS[usize::from(t)]);
    if expected == b.len() {
        Ok(t)
    } else if expected == 0 {
        Err(Error::UnknownType { protocol: Protocol::Itch50, msg_type: t })
    } else {
        Err(Error::BadLength { protocol: Protocol::Itch50, msg_type: t, expected, actual: b.len() })
    }
}

impl<'a> Message<'a> {
    /// Stock locate code (header field shared by every type).
    #[inline]
    pub fn stock_locate(&self) -> u16 {
        let b = self.as_bytes();
        u16::from_be_bytes([b[1], b[2]])
    }

    /// Tracking number (header field shared by every type).
    #[inline]
    pub fn tracking_number(&self) -> u16 {
        let b = self.as_bytes();
        u16::from_be_bytes([b[3], b[4]])
    }

    /// Nanoseconds since midnight (header field shared by every type).
    #[inline]
    pub fn timestamp(&self) -> u64 {
        let b = self.as_bytes();
        u64::from_be_bytes([0, 0, b[5], b[6], b[7], b[8], b[9], b[10]])
    }

    /// The stock symbol, for the types that carry one.
    pub fn stock(&self) -> Option<Stock> {
        Some(match self {
            Message::StockDirectory(m) => m.stock(),
            Message::StockTradingAction(m) => m.stock(),
            Message::RegShoRestriction(m) => m.stock(),
            Message::MarketParticipantPosition(m) => m.stock(),
            Message::IpoQuotingPeriodUpdate(m) => m.stock(),
            Message::LuldAuctionCollar(m) => m.stock(),
            Message::OperationalHalt(m) => m.stock(),
            Message::AddOrder(m) => m.stock(),
            Message::AddOrderMpid(m) => m.stock(),
            Message::Trade(m) => m.stock(),
            Message::CrossTrade(m) => m.stock(),
            Message::Noii(m) => m.stock(),
            Message::RetailPriceImprovement(m) => m.stock(),
            Message::DirectListingPriceDiscovery(m) => m.stock(),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::FieldValue;

    /// An Add Order as printed in the specification's layout, byte by byte.
    const ADD_ORDER: [u8; 36] = [
        b'A', 0x00, 0x07, 0x00, 0x02, 0x1f, 0x1a, 0x2b, 0x3c, 0x4d, 0x5e, // header
        0, 0, 0, 0, 0, 0, 0x30, 0x39, // order ref 12345
        b'S', 0, 0, 0x01, 0xf4, // sell 500
        b'M', b'S', b'F', b'T', b' ', b' ', b' ', b' ', // MSFT
        0x00, 0x33, 0xe1, 0x68, // 340.0040 = 3400040
    ];

    #[test]
    fn deconstruct_add_order() {
        let Message::AddOrder(m) = Message::parse(&ADD_ORDER).unwrap() else { panic!() };
        assert_eq!(m.stock_locate(), 7);
        assert_eq!(m.tracking_number(), 2);
        assert_eq!(m.timestamp(), Timestamp48(0x1f1a_2b3c_4d5e));
        assert_eq!(m.order_ref(), 12345);
        assert_eq!(m.side(), b'S');
        assert_eq!(m.shares(), 500);
        assert_eq!(m.stock().as_str(), Some("MSFT"));
        assert_eq!(m.price(), Price4(3_400_040));
        assert_eq!(m.price().to_string(), "340.0040");
    }

    #[test]
    fn construct_add_order_writes_every_byte() {
        let Message::AddOrder(m) = Message::parse(&ADD_ORDER).unwrap() else { panic!() };
        let mut buf = [0xa5u8; 40];
        assert_eq!(m.to_repr().emit(&mut buf), Ok(36));
        assert_eq!(&buf[..36], &ADD_ORDER[..]);
        assert_eq!(&buf[36..], &[0xa5; 4]);
    }

    #[test]
    fn emit_into_short_buffer_is_an_error() {
        let r = MessageRepr::from(SystemEventRepr::default());
        let mut buf = [0u8; 11];
        assert_eq!(r.emit(&mut buf), Err(Error::Truncated { needed: 12, available: 11 }));
    }

    #[test]
    fn wrong_length_and_unknown_type_are_typed_errors() {
        assert!(matches!(
            Message::parse(&ADD_ORDER[..35]),
            Err(Error::BadLength { msg_type: b'A', expected: 36, actual: 35, .. })
        ));
        let mut long = [0u8; 37];
        long[..36].copy_from_slice(&ADD_ORDER);
        assert!(matches!(Message::parse(&long), Err(Error::BadLength { actual: 37, .. })));
        assert!(matches!(Message::parse(b"Z123"), Err(Error::UnknownType { msg_type: b'Z', .. })));
        assert!(matches!(Message::parse(&[]), Err(Error::Truncated { .. })));
    }

    #[test]
    fn mwcb_levels_have_eight_decimals() {
        let r = MwcbDeclineLevelRepr { level1: Price8(123_456_789_012), ..Default::default() };
        let mut buf = [0u8; 35];
        r.emit(&mut buf).unwrap();
        let Message::MwcbDeclineLevel(v) = Message::parse(&buf).unwrap() else { panic!() };
        assert_eq!(v.level1().to_string(), "1234.56789012");
    }

    #[test]
    fn visit_names_every_field() {
        let m = Message::parse(&ADD_ORDER).unwrap();
        let mut names = Vec::new();
        m.visit(&mut |n, v| names.push((n, v)));
        let n: Vec<_> = names.iter().map(|x| x.0).collect();
        assert_eq!(
            n,
            ["stock_locate", "tracking_number", "timestamp", "order_ref", "side", "shares", "stock", "price"]
        );
        assert_eq!(names[7].1, FieldValue::Price { raw: 3_400_040, decimals: 4 });
    }

    #[test]
    fn every_type_has_a_name_and_length() {
        for &t in TYPES {
            assert!(type_name(t).is_some());
            assert!(spec_len(t).is_some());
        }
        assert_eq!(TYPES.len(), 23);
    }
}
