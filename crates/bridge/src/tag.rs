//! The tag every publication carries: a fixed 36-byte trailer at the end of
//! its payload (seed 001's gateway stamped a 7-byte tag the same way), in
//! place of NATS headers — parsing five text headers per message into a hash
//! map was most of a subscriber's cost. Big-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | MoldUDP64 sequence number of its first message |
//! | 8..10 | messages it carries |
//! | 10..18 | the bridge's publication number (from 1, consecutive) |
//! | 18..26 | its number on its subject (from 1, consecutive per subject; 0: not tracked) |
//! | 26..34 | when the bridge received its packet, CLOCK_REALTIME ns (the latency tag) |
//! | 34..36 | `F1` (format 1) |
//!
//! [`split`] returns the payload without the trailer, and the tag.

/// Trailer length.
pub const TAG_LEN: usize = 36;
/// Its last two bytes.
pub const MAGIC: [u8; 2] = *b"F1";

/// What a publication's trailer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    pub seq: u64,
    pub count: u16,
    pub pub_seq: u64,
    pub subject_seq: u64,
    pub ingress_ns: u64,
}

impl Tag {
    /// Appends the trailer to `payload`.
    pub fn append(&self, payload: &mut Vec<u8>) {
        payload.reserve(TAG_LEN);
        self.write(payload);
    }

    /// Writes the trailer at the end of `b`.
    pub fn write(&self, b: &mut impl bytes::BufMut) {
        b.put_u64(self.seq);
        b.put_u16(self.count);
        b.put_u64(self.pub_seq);
        b.put_u64(self.subject_seq);
        b.put_u64(self.ingress_ns);
        b.put_slice(&MAGIC);
    }
}

/// A tagged payload's body and tag; `None` when it carries no trailer.
pub fn split(payload: &[u8]) -> Option<(&[u8], Tag)> {
    let at = payload.len().checked_sub(TAG_LEN)?;
    let (body, t) = payload.split_at(at);
    if t[34..36] != MAGIC {
        return None;
    }
    let u64_at = |i: usize| u64::from_be_bytes(t[i..i + 8].try_into().unwrap_or([0; 8]));
    let tag = Tag {
        seq: u64_at(0),
        count: u16::from_be_bytes([t[8], t[9]]),
        pub_seq: u64_at(10),
        subject_seq: u64_at(18),
        ingress_ns: u64_at(26),
    };
    Some((body, tag))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_tag_round_trips_after_any_body(body in proptest::collection::vec(any::<u8>(), 0..200),
                                            seq: u64, count: u16, pub_seq: u64, subject_seq: u64, ingress_ns: u64) {
            let tag = Tag { seq, count, pub_seq, subject_seq, ingress_ns };
            let mut p = body.clone();
            tag.append(&mut p);
            prop_assert_eq!(p.len(), body.len() + TAG_LEN);
            let (b, t) = split(&p).unwrap();
            prop_assert_eq!((b, t), (&body[..], tag));
        }

        #[test]
        fn anything_shorter_or_unmarked_is_no_tag(p in proptest::collection::vec(any::<u8>(), 0..100)) {
            if p.len() < TAG_LEN || p[p.len() - 2..] != MAGIC {
                prop_assert!(split(&p).is_none());
            }
        }
    }
}
