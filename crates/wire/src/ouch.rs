//! NASDAQ OUCH 5.0 order entry messages, carried in SoupBinTCP unsequenced
//! (client → exchange, [`inbound`]) and sequenced (exchange → client,
//! [`outbound`]) packets.
//!
//! Layouts follow the OUCH 5.0 specification: big-endian integers, prices as
//! 8-byte signed integers with 4 implied decimals ([`OuchPrice`]), 8-byte
//! symbols, 14-byte client order ids, and on the messages that allow it a u16
//! appendage length followed by that many bytes of optional tag-value fields
//! ([`Appendage`], kept as raw bytes up to [`APPENDAGE_LEN_MAX`]).

use crate::error::Error;
use crate::macros::Tail;

pub use crate::field::OuchPrice;

/// Longest optional appendage we accept. The OUCH 5.0 optional fields
/// together stay well under this; longer input is rejected as a bad length.
pub const APPENDAGE_LEN_MAX: usize = 128;

/// Raw optional-appendage bytes (tag-value fields) of an OUCH 5.0 message.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Appendage {
    bytes: [u8; APPENDAGE_LEN_MAX],
    len: u8,
}

const _: () = assert!(APPENDAGE_LEN_MAX <= u8::MAX as usize);

impl Appendage {
    /// The empty appendage.
    pub const EMPTY: Appendage = Appendage { bytes: [0; APPENDAGE_LEN_MAX], len: 0 };
}

impl Default for Appendage {
    fn default() -> Self {
        Appendage::EMPTY
    }
}

impl core::fmt::Debug for Appendage {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Appendage({:02x?})", self.as_slice())
    }
}

impl Tail for Appendage {
    fn from_slice(b: &[u8]) -> Option<Self> {
        if b.len() > APPENDAGE_LEN_MAX {
            return None;
        }
        let mut a = Appendage::EMPTY;
        a.bytes[..b.len()].copy_from_slice(b);
        a.len = b.len() as u8;
        Some(a)
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// Tags of the OUCH 5.0 optional fields (the specification's appendix) this
/// code reads or writes. Each option in an appendage is a length byte
/// (counting the tag and the value), the tag, and the value.
pub mod tag {
    /// Minimum quantity to execute, 4-byte integer.
    pub const MIN_QTY: u8 = 3;
}

/// The options of an appendage, in order: `(tag, value)` each, or one
/// error (a zero length, or a length past the end) after which nothing
/// more is read.
pub fn options(appendage: &[u8]) -> Options<'_> {
    Options { rest: appendage }
}

/// Iterator of [`options`].
#[derive(Debug, Clone)]
pub struct Options<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Options<'a> {
    type Item = Result<(u8, &'a [u8]), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let (&len, after) = self.rest.split_first()?;
        let len = usize::from(len);
        if len == 0 || after.len() < len {
            let available = after.len();
            self.rest = &[];
            return Some(Err(Error::Overrun { needed: len.max(1), available }));
        }
        let (opt, next) = after.split_at(len);
        self.rest = next;
        Some(Ok((opt[0], &opt[1..])))
    }
}

/// Appends option `tag` with `value` to `out` (its length byte first);
/// `None` if the option would not fit in an appendage or in one length byte.
pub fn push_option(out: &mut [u8; APPENDAGE_LEN_MAX], used: &mut usize, tag: u8, value: &[u8]) -> Option<()> {
    let len = u8::try_from(value.len() + 1).ok()?;
    let end = *used + 1 + usize::from(len);
    let dst = out.get_mut(*used..end)?;
    dst[0] = len;
    dst[1] = tag;
    dst[2..].copy_from_slice(value);
    *used = end;
    Some(())
}

/// Client → exchange messages (in SoupBinTCP unsequenced data packets).
pub mod inbound {
    use super::{Appendage, Error};
    use crate::error::Protocol;
    use crate::field::{Alpha, OuchPrice, Stock};

    messages! {
        protocol = Protocol::Ouch50;
        header {}

        /// `O` Enter Order.
        EnterOrder / EnterOrderRepr = b'O', 47, tail = Appendage {
            user_ref_num: u32,
            /// `B` buy, `S` sell, `T` sell short, `U` sell short exempt.
            side: u8,
            quantity: u32,
            symbol: Stock,
            price: OuchPrice,
            /// `0` day, `3` immediate or cancel, ...
            time_in_force: u8,
            display: u8,
            capacity: u8,
            intermarket_sweep_eligibility: u8,
            cross_type: u8,
            cl_ord_id: Alpha<14>,
            appendage_length: u16,
        }
        /// `U` Replace Order.
        ReplaceOrder / ReplaceOrderRepr = b'U', 40, tail = Appendage {
            orig_user_ref_num: u32,
            user_ref_num: u32,
            quantity: u32,
            price: OuchPrice,
            time_in_force: u8,
            display: u8,
            intermarket_sweep_eligibility: u8,
            cl_ord_id: Alpha<14>,
            appendage_length: u16,
        }
        /// `X` Cancel Order (quantity = the new total quantity; 0 cancels all).
        CancelOrder / CancelOrderRepr = b'X', 9 {
            user_ref_num: u32,
            quantity: u32,
        }
        /// `M` Modify Order.
        ModifyOrder / ModifyOrderRepr = b'M', 10 {
            user_ref_num: u32,
            side: u8,
            quantity: u32,
        }
        /// `Q` Account Query Request.
        AccountQuery / AccountQueryRepr = b'Q', 1 {}
    }
}

/// Exchange → client messages (in SoupBinTCP sequenced data packets).
pub mod outbound {
    use super::{Appendage, Error};
    use crate::error::Protocol;
    use crate::field::{Alpha, OuchPrice, Stock};

    messages! {
        protocol = Protocol::Ouch50;
        header {
            /// Nanoseconds since midnight.
            timestamp: u64,
        }

        /// `S` System Event.
        SystemEvent / SystemEventRepr = b'S', 10 {
            /// `S` start of day, `E` end of day.
            event_code: u8,
        }
        /// `A` Order Accepted.
        OrderAccepted / OrderAcceptedRepr = b'A', 64, tail = Appendage {
            user_ref_num: u32,
            side: u8,
            quantity: u32,
            symbol: Stock,
            price: OuchPrice,
            time_in_force: u8,
            display: u8,
            order_reference_number: u64,
            capacity: u8,
            intermarket_sweep_eligibility: u8,
            cross_type: u8,
            /// `L` live, `D` dead.
            order_state: u8,
            cl_ord_id: Alpha<14>,
            appendage_length: u16,
        }
        /// `U` Order Replaced.
        OrderReplaced / OrderReplacedRepr = b'U', 68, tail = Appendage {
            orig_user_ref_num: u32,
            user_ref_num: u32,
            side: u8,
            quantity: u32,
            symbol: Stock,
            price: OuchPrice,
            time_in_force: u8,
            display: u8,
            order_reference_number: u64,
            capacity: u8,
            intermarket_sweep_eligibility: u8,
            cross_type: u8,
            order_state: u8,
            cl_ord_id: Alpha<14>,
            appendage_length: u16,
        }
        /// `C` Order Canceled.
        OrderCanceled / OrderCanceledRepr = b'C', 18 {
            user_ref_num: u32,
            quantity: u32,
            reason: u8,
        }
        /// `D` AIQ Canceled.
        AiqCanceled / AiqCanceledRepr = b'D', 32 {
            user_ref_num: u32,
            decrement_shares: u32,
            reason: u8,
            quantity_prevented_from_trading: u32,
            execution_price: OuchPrice,
            liquidity_flag: u8,
            aiq_strategy: u8,
        }
        /// `E` Order Executed.
        OrderExecuted / OrderExecutedRepr = b'E', 36, tail = Appendage {
            user_ref_num: u32,
            quantity: u32,
            price: OuchPrice,
            liquidity_flag: u8,
            match_number: u64,
            appendage_length: u16,
        }
        /// `B` Broken Trade.
        BrokenTrade / BrokenTradeRepr = b'B', 36 {
            user_ref_num: u32,
            match_number: u64,
            reason: u8,
            cl_ord_id: Alpha<14>,
        }
        /// `J` Rejected.
        Rejected / RejectedRepr = b'J', 29 {
            user_ref_num: u32,
            reason: u16,
            cl_ord_id: Alpha<14>,
        }
        /// `P` Cancel Pending.
        CancelPending / CancelPendingRepr = b'P', 13 {
            user_ref_num: u32,
        }
        /// `I` Cancel Reject.
        CancelReject / CancelRejectRepr = b'I', 13 {
            user_ref_num: u32,
        }
        /// `T` Order Priority Update.
        PriorityUpdate / PriorityUpdateRepr = b'T', 30 {
            user_ref_num: u32,
            price: OuchPrice,
            display: u8,
            order_reference_number: u64,
        }
        /// `M` Order Modified.
        OrderModified / OrderModifiedRepr = b'M', 18 {
            user_ref_num: u32,
            side: u8,
            quantity: u32,
        }
        /// `R` Order Restated.
        OrderRestated / OrderRestatedRepr = b'R', 16, tail = Appendage {
            user_ref_num: u32,
            reason: u8,
            appendage_length: u16,
        }
        /// `Q` Account Query Response.
        AccountQueryResponse / AccountQueryResponseRepr = b'Q', 13 {
            next_user_ref_num: u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appendage_options_are_read_in_order_and_a_bad_length_stops_them() {
        let mut a = [0u8; APPENDAGE_LEN_MAX];
        let mut n = 0;
        push_option(&mut a, &mut n, tag::MIN_QTY, &300u32.to_be_bytes()).unwrap();
        push_option(&mut a, &mut n, 0xF0, &7u64.to_be_bytes()).unwrap();
        let got: Vec<_> = options(&a[..n]).collect();
        assert_eq!(got, [Ok((3, &300u32.to_be_bytes()[..])), Ok((0xF0, &7u64.to_be_bytes()[..]))]);
        // A zero length or one past the end: one error, then nothing.
        assert!(matches!(options(&[0, 3, 1]).collect::<Vec<_>>()[..], [Err(_)]));
        let cut: Vec<_> = options(&a[..n - 1]).collect();
        assert!(cut[0].is_ok() && cut[1].is_err() && cut.len() == 2);
        assert_eq!(options(&[]).count(), 0);
        // An option that does not fit is refused, and nothing is written.
        let mut full = n;
        assert!(push_option(&mut a, &mut full, 1, &[0u8; 200]).is_none());
        assert_eq!(full, n);
    }
    use crate::field::{Alpha, Stock};

    #[test]
    fn enter_order_with_appendage_round_trips() {
        let r = inbound::EnterOrderRepr {
            user_ref_num: 1,
            side: b'B',
            quantity: 100,
            symbol: Stock::from_str_padded("AAPL"),
            price: OuchPrice(1_895_000),
            time_in_force: b'0',
            display: b'Y',
            capacity: b'A',
            intermarket_sweep_eligibility: b'N',
            cross_type: b'N',
            cl_ord_id: Alpha::from_str_padded("ORD1"),
            appendage_length: 0,
            appendage: Appendage::from_slice(&[1, 4, 0, 0, 0, 7]).unwrap(),
        };
        let mut buf = [0xa5u8; 60];
        assert_eq!(r.emit(&mut buf), Ok(53));
        assert_eq!(&buf[45..47], &[0, 6], "emit writes the appendage length");
        let inbound::Message::EnterOrder(v) = inbound::Message::parse(&buf[..53]).unwrap() else { panic!() };
        assert_eq!(v.appendage_length(), 6);
        assert_eq!(v.tail(), &[1, 4, 0, 0, 0, 7]);
        assert_eq!(v.to_repr().appendage, r.appendage);
        // A declared length that disagrees with the bytes present is an error.
        assert!(inbound::Message::parse(&buf[..52]).is_err());
        assert!(inbound::Message::parse(&buf[..54]).is_err());
    }

    #[test]
    fn fixed_lengths_match_the_spec() {
        for (t, n) in [(b'O', 47), (b'U', 40), (b'X', 9), (b'M', 10), (b'Q', 1)] {
            assert_eq!(inbound::spec_len(t), Some(n));
        }
        for (t, n) in [(b'S', 10), (b'A', 64), (b'U', 68), (b'C', 18), (b'E', 36), (b'J', 29), (b'B', 36)] {
            assert_eq!(outbound::spec_len(t), Some(n));
        }
    }
}
