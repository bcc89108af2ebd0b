//! Deadline records: the sender tells the exchange when each message of the
//! feed falls due at the receivers, so that the exchange's cheat detector
//! (`fairfeed_exchange::cheat`) can judge an order against the deadline of
//! the data it answers (issue 44). The sender and the exchange are both the
//! operator's: records are sealed under the operator key, and a forged or
//! damaged datagram is refused whole.
//!
//! One UDP datagram:
//!
//! ```text
//! "FFDL" | version (1) | count (1, 1..=RECORDS_MAX)
//!   | count × { first: u64 | messages: u16 | deadline_ns: u64 }   (big-endian)
//!   | tag (16): BLAKE3 keyed by the operator key, over all bytes before it
//! ```
//!
//! A record says: MoldUDP64 messages `first .. first + messages` of the feed
//! are due at `deadline_ns` (the sender's synchronized clock). Records are
//! idempotent — a replayed datagram re-states the same deadlines — so no
//! nonce is needed; a record for a sequence the book already holds keeps the
//! first deadline (a forged one could not pass the tag anyway).
//!
//! Sans-IO: [`RecordWriter`] packs records (the sender's shell sends what
//! it returns), [`parse`] checks and unpacks a datagram, [`DeadlineBook`]
//! keeps the most recent [`BOOK_MAX`] messages' deadlines for lookups.

use crate::operator::OperatorKey;

const MAGIC: &[u8; 4] = b"FFDL";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 6;
const RECORD_LEN: usize = 18;
/// Tag bytes at the end of a datagram.
pub const TAG_LEN: usize = 16;
/// Records in one datagram at most (≈ 1 KiB).
pub const RECORDS_MAX: usize = 56;
/// The domain the tag is computed under (no other sealed message shares it).
const DOMAIN: &[u8] = b"fairfeed deadline records v1";
/// Messages whose deadlines a [`DeadlineBook`] keeps (the most recent).
pub const BOOK_MAX: usize = 1 << 20;

/// One record: messages `first..first + messages` are due at `deadline_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The first message's sequence number.
    pub first: u64,
    /// Messages it covers.
    pub messages: u16,
    /// Their deadline on the synchronized clock, ns.
    pub deadline_ns: u64,
}

/// Why a datagram was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not this kind of datagram (magic or version).
    #[error("not a deadline-record datagram (magic or version)")]
    NotRecords,
    /// The length does not match the record count.
    #[error("length does not match its record count")]
    Malformed,
    /// The tag does not verify under the operator key (a forgery, or another key).
    #[error("tag does not verify under the operator key")]
    BadTag,
}

fn tag(key: &OperatorKey, body: &[u8]) -> [u8; TAG_LEN] {
    key.tag(DOMAIN, body)
}

/// Packs records into sealed datagrams.
pub struct RecordWriter {
    key: OperatorKey,
    buf: Vec<u8>,
    count: usize,
}

impl RecordWriter {
    /// A writer sealing with `key`.
    pub fn new(key: OperatorKey) -> Self {
        RecordWriter { key, buf: Vec::with_capacity(HEADER_LEN + RECORDS_MAX * RECORD_LEN + TAG_LEN), count: 0 }
    }

    /// Adds a record; returns a sealed datagram when this one filled it.
    pub fn push(&mut self, r: Record) -> Option<Vec<u8>> {
        if self.count == 0 {
            self.buf.clear();
            self.buf.extend_from_slice(MAGIC);
            self.buf.extend_from_slice(&[VERSION, 0]);
        }
        self.buf.extend_from_slice(&r.first.to_be_bytes());
        self.buf.extend_from_slice(&r.messages.to_be_bytes());
        self.buf.extend_from_slice(&r.deadline_ns.to_be_bytes());
        self.count += 1;
        (self.count == RECORDS_MAX).then(|| self.flush()).flatten()
    }

    /// Records not yet sent.
    pub fn pending(&self) -> usize {
        self.count
    }

    /// Seals what is pending into a datagram (None: nothing pending).
    pub fn flush(&mut self) -> Option<Vec<u8>> {
        if self.count == 0 {
            return None;
        }
        self.buf[5] = self.count as u8;
        let t = tag(&self.key, &self.buf);
        self.count = 0;
        let mut out = std::mem::take(&mut self.buf);
        out.extend_from_slice(&t);
        Some(out)
    }
}

/// Checks `datagram`'s tag under `key` and returns its records.
pub fn parse(key: &OperatorKey, datagram: &[u8]) -> Result<Vec<Record>, RecordError> {
    if datagram.len() < HEADER_LEN || &datagram[..4] != MAGIC || datagram[4] != VERSION {
        return Err(RecordError::NotRecords);
    }
    let count = usize::from(datagram[5]);
    if count == 0 || count > RECORDS_MAX || datagram.len() != HEADER_LEN + count * RECORD_LEN + TAG_LEN {
        return Err(RecordError::Malformed);
    }
    let (body, got) = datagram.split_at(datagram.len() - TAG_LEN);
    let want = tag(key, body);
    if want.iter().zip(got).fold(0u8, |d, (x, y)| d | (x ^ y)) != 0 {
        return Err(RecordError::BadTag);
    }
    Ok(body[HEADER_LEN..]
        .chunks_exact(RECORD_LEN)
        .map(|c| Record {
            first: u64::from_be_bytes(c[..8].try_into().unwrap_or_default()),
            messages: u16::from_be_bytes([c[8], c[9]]),
            deadline_ns: u64::from_be_bytes(c[10..18].try_into().unwrap_or_default()),
        })
        .collect())
}

/// The deadlines of the most recent [`BOOK_MAX`] messages, by MoldUDP64
/// sequence number: a ring indexed by `sequence % BOOK_MAX`, each slot
/// remembering whose deadline it holds.
pub struct DeadlineBook {
    slots: Vec<(u64, u64)>,
    /// Records taken and messages they covered; records for sequences
    /// already held (replays), and messages too far behind the newest to keep.
    pub records: u64,
    /// ... messages they covered ...
    pub messages: u64,
    /// ... records for sequences already held (replays) ...
    pub repeated: u64,
    /// ... and messages too far behind the newest to keep.
    pub too_old: u64,
    newest: u64,
}

impl Default for DeadlineBook {
    fn default() -> Self {
        DeadlineBook { slots: vec![(0, 0); BOOK_MAX], records: 0, messages: 0, repeated: 0, too_old: 0, newest: 0 }
    }
}

impl DeadlineBook {
    /// Keeps a record's deadline for each of its messages.
    pub fn insert(&mut self, r: Record) {
        self.records += 1;
        for k in 0..u64::from(r.messages) {
            let seq = r.first.saturating_add(k);
            if seq == 0 || seq.saturating_add(BOOK_MAX as u64) <= self.newest {
                self.too_old += 1;
                continue;
            }
            let slot = &mut self.slots[(seq % BOOK_MAX as u64) as usize];
            if slot.0 == seq {
                self.repeated += 1;
                continue;
            }
            *slot = (seq, r.deadline_ns);
            self.messages += 1;
            self.newest = self.newest.max(seq);
        }
    }

    /// The deadline of message `seq`, if the book holds it.
    pub fn get(&self, seq: u64) -> Option<u64> {
        let s = self.slots[(seq % BOOK_MAX as u64) as usize];
        (s.0 == seq && seq != 0).then_some(s.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(b: u8) -> OperatorKey {
        OperatorKey::new([b; 32])
    }

    proptest! {
        #[test]
        fn records_round_trip_and_any_change_is_refused(
            rs in proptest::collection::vec((1u64..1 << 40, 1u16..100, any::<u64>()), 1..200),
            flip in any::<(usize, u8)>(),
        ) {
            let mut w = RecordWriter::new(key(1));
            let mut datagrams = Vec::new();
            for &(first, messages, deadline_ns) in &rs {
                datagrams.extend(w.push(Record { first, messages, deadline_ns }));
            }
            datagrams.extend(w.flush());
            let got: Vec<Record> = datagrams.iter().flat_map(|d| parse(&key(1), d).unwrap()).collect();
            let want: Vec<Record> = rs.iter().map(|&(first, messages, deadline_ns)| Record { first, messages, deadline_ns }).collect();
            prop_assert_eq!(got, want);
            let d = &datagrams[0];
            prop_assert_eq!(parse(&key(2), d), Err(RecordError::BadTag));
            let mut bad = d.clone();
            let at = flip.0 % bad.len();
            bad[at] ^= flip.1.max(1);
            prop_assert!(parse(&key(1), &bad).is_err(), "a changed byte at {} passed", at);
            prop_assert!(parse(&key(1), &d[..d.len() - 1]).is_err());
        }

        #[test]
        fn garbage_is_refused_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..2_000)) {
            prop_assert!(parse(&key(1), &bytes).is_err());
        }
    }

    #[test]
    fn the_book_keeps_the_recent_deadlines_and_the_first_word() {
        let mut b = DeadlineBook::default();
        b.insert(Record { first: 10, messages: 3, deadline_ns: 500 });
        assert_eq!((b.get(9), b.get(10), b.get(12), b.get(13)), (None, Some(500), Some(500), None));
        b.insert(Record { first: 12, messages: 1, deadline_ns: 999 });
        assert_eq!((b.get(12), b.repeated), (Some(500), 1));
        b.insert(Record { first: 10 + BOOK_MAX as u64, messages: 1, deadline_ns: 7 });
        assert_eq!(b.get(10), None, "overwritten by one BOOK_MAX later");
        assert_eq!(b.get(10 + BOOK_MAX as u64), Some(7));
        b.insert(Record { first: 10, messages: 1, deadline_ns: 1 });
        assert_eq!((b.too_old, b.get(10)), (1, None), "too far behind the newest to keep");
        assert_eq!(b.get(0), None);
    }
}
