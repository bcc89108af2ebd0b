//! NASDAQ GLIMPSE 5.0's own message: the end of a snapshot.
//!
//! A GLIMPSE session is SoupBinTCP carrying ITCH 5.0 messages as sequenced
//! data — the standing state and every open order — ending with one message
//! ITCH does not have: `G`, End of Snapshot, whose 20-byte ASCII numeric field
//! (right-justified, space-padded, as SoupBinTCP's numbers) is the MoldUDP64
//! sequence number at which the live feed continues: the snapshot holds every
//! message before it and none from it on.
//!
//! ```
//! use fairfeed_wire::glimpse::{EndOfSnapshot, END_OF_SNAPSHOT_LEN};
//! let mut b = [0u8; END_OF_SNAPSHOT_LEN];
//! EndOfSnapshot { next_sequence: 1_234 }.emit(&mut b);
//! assert_eq!(&b[..2], b"G ");
//! assert_eq!(EndOfSnapshot::parse(&b), Ok(EndOfSnapshot { next_sequence: 1_234 }));
//! ```

use crate::error::{Error, Protocol};
use crate::soupbintcp::{emit_numeric, parse_numeric, NUMERIC_LEN};

/// Type byte of End of Snapshot.
pub const END_OF_SNAPSHOT: u8 = b'G';
/// Its length: the type byte and one numeric field.
pub const END_OF_SNAPSHOT_LEN: usize = 1 + NUMERIC_LEN;

/// `G` End of Snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndOfSnapshot {
    /// The live feed's sequence number of the first message not in the snapshot.
    pub next_sequence: u64,
}

impl EndOfSnapshot {
    /// Parses the message (exact length, `G`, digits).
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        match b.first() {
            Some(&END_OF_SNAPSHOT) if b.len() == END_OF_SNAPSHOT_LEN => {
                Ok(Self { next_sequence: parse_numeric(&b[1..])? })
            }
            Some(&END_OF_SNAPSHOT) => Err(Error::BadLength {
                protocol: Protocol::SoupBinTcp,
                msg_type: END_OF_SNAPSHOT,
                expected: END_OF_SNAPSHOT_LEN,
                actual: b.len(),
            }),
            Some(&t) => Err(Error::UnknownType { protocol: Protocol::SoupBinTcp, msg_type: t }),
            None => Err(Error::Truncated { needed: 1, available: 0 }),
        }
    }

    /// Writes the message into the first [`END_OF_SNAPSHOT_LEN`] bytes of `b`.
    pub fn emit(&self, b: &mut [u8; END_OF_SNAPSHOT_LEN]) {
        b[0] = END_OF_SNAPSHOT;
        emit_numeric(self.next_sequence, &mut b[1..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(seq in any::<u64>()) {
            let mut b = [0u8; END_OF_SNAPSHOT_LEN];
            EndOfSnapshot { next_sequence: seq }.emit(&mut b);
            prop_assert_eq!(EndOfSnapshot::parse(&b), Ok(EndOfSnapshot { next_sequence: seq }));
        }

        #[test]
        fn any_bytes_parse_or_fail_without_panic(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = EndOfSnapshot::parse(&b);
        }
    }

    #[test]
    fn wrong_length_type_and_digits_are_typed_errors() {
        assert!(matches!(EndOfSnapshot::parse(b"G12"), Err(Error::BadLength { actual: 3, .. })));
        assert!(matches!(EndOfSnapshot::parse(&[b'S'; 21]), Err(Error::UnknownType { msg_type: b'S', .. })));
        let mut b = [b' '; END_OF_SNAPSHOT_LEN];
        b[0] = b'G';
        b[5] = b'x';
        assert!(matches!(EndOfSnapshot::parse(&b), Err(Error::Malformed { .. })));
        assert!(matches!(EndOfSnapshot::parse(&[]), Err(Error::Truncated { .. })));
    }
}
