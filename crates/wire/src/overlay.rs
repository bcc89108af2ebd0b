//! The fair-multicast overlay header: a small fixed header in front of an
//! unmodified MoldUDP64 packet (data), or of an OWD report travelling up the
//! tree.
//!
//! ```text
//!  0      2  3  4      6  7  8              16             24             32         36     38     40
//!  magic  ver kind tree hop flags  sequence      send time ns   deadline ns    origin   len    rsvd
//! ```
//!
//! All integers big-endian. `sequence` is the sender's overlay sequence number
//! per tree, `send time` and `deadline` are nanoseconds on the synchronized
//! clock, `origin` is the node that built the packet (the sender for data, the
//! reporting node for reports), `len` the payload length after the header.
//! Receivers strip the header and hand applications the MoldUDP64 packet.

use crate::error::{check_len, Error, Protocol};
use crate::field::Field;

/// First two bytes of every overlay packet.
pub const MAGIC: u16 = 0xFA1F;
/// The version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes of the header.
pub const HEADER_LEN: usize = 40;
/// Bytes of an OWD report payload.
pub const REPORT_LEN: usize = 36;

/// What an overlay packet carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A market-data packet travelling down the tree.
    Data = 1,
    /// An OWD report travelling up the tree.
    Report = 2,
    /// A liveness beacon (no payload).
    Heartbeat = 3,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::Data),
            2 => Some(Kind::Report),
            3 => Some(Kind::Heartbeat),
            _ => None,
        }
    }
}

/// Flag: an authentication tag follows the payload.
pub const FLAG_AUTH: u8 = 0x01;

/// The header as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeaderRepr {
    pub kind: Option<Kind>,
    pub tree: u16,
    /// Hops travelled so far (0 as sent by the sender).
    pub hop: u8,
    pub flags: u8,
    pub sequence: u64,
    pub send_ns: u64,
    pub deadline_ns: u64,
    pub origin: u32,
    pub payload_len: u16,
}

impl HeaderRepr {
    /// Parses a header and returns it with the payload that follows.
    pub fn parse(b: &[u8]) -> Result<(HeaderRepr, &[u8]), Error> {
        check_len(b, HEADER_LEN)?;
        if u16::read(&b[0..2]) != MAGIC {
            return Err(Error::Malformed { protocol: Protocol::Overlay, reason: "bad magic" });
        }
        if b[2] != VERSION {
            return Err(Error::Malformed { protocol: Protocol::Overlay, reason: "unknown version" });
        }
        let Some(kind) = Kind::from_u8(b[3]) else {
            return Err(Error::UnknownType { protocol: Protocol::Overlay, msg_type: b[3] });
        };
        let h = HeaderRepr {
            kind: Some(kind),
            tree: u16::read(&b[4..6]),
            hop: b[6],
            flags: b[7],
            sequence: u64::read(&b[8..16]),
            send_ns: u64::read(&b[16..24]),
            deadline_ns: u64::read(&b[24..32]),
            origin: u32::read(&b[32..36]),
            payload_len: u16::read(&b[36..38]),
        };
        let end = HEADER_LEN + usize::from(h.payload_len);
        let Some(payload) = b.get(HEADER_LEN..end) else {
            return Err(Error::Overrun { needed: end, available: b.len() });
        };
        Ok((h, payload))
    }

    /// Writes the 40-byte header.
    pub fn emit(&self, b: &mut [u8]) -> Result<usize, Error> {
        check_len(b, HEADER_LEN)?;
        MAGIC.write(&mut b[0..2]);
        b[2] = VERSION;
        b[3] = self.kind.map_or(0, |k| k as u8);
        self.tree.write(&mut b[4..6]);
        b[6] = self.hop;
        b[7] = self.flags;
        self.sequence.write(&mut b[8..16]);
        self.send_ns.write(&mut b[16..24]);
        self.deadline_ns.write(&mut b[24..32]);
        self.origin.write(&mut b[32..36]);
        self.payload_len.write(&mut b[36..38]);
        b[38..40].fill(0);
        Ok(HEADER_LEN)
    }
}

/// Increments the hop count of a packet in place (proxies forward the same bytes).
pub fn bump_hop(b: &mut [u8]) {
    if let Some(h) = b.get_mut(6) {
        *h = h.saturating_add(1);
    }
}

/// An OWD report: what a subtree saw during the last interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReportRepr {
    /// The largest p95 one-way delay in the subtree (max-aggregated), ns.
    pub owd_p95_ns: u64,
    /// Messages released in the subtree this interval (summed).
    pub messages: u32,
    /// Of those, messages that arrived after their deadline (summed).
    pub late: u32,
    /// Total hold time of those messages, ns (summed).
    pub hold_sum_ns: u64,
    /// Receivers the report covers (summed).
    pub receivers: u32,
    /// Lateness beyond the deadline, largest in the subtree, ns (max-aggregated).
    pub late_max_ns: u64,
}

impl ReportRepr {
    pub fn parse(b: &[u8]) -> Result<ReportRepr, Error> {
        check_len(b, REPORT_LEN)?;
        Ok(ReportRepr {
            owd_p95_ns: u64::read(&b[0..8]),
            messages: u32::read(&b[8..12]),
            late: u32::read(&b[12..16]),
            hold_sum_ns: u64::read(&b[16..24]),
            receivers: u32::read(&b[24..28]),
            late_max_ns: u64::read(&b[28..36]),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, Error> {
        check_len(b, REPORT_LEN)?;
        self.owd_p95_ns.write(&mut b[0..8]);
        self.messages.write(&mut b[8..12]);
        self.late.write(&mut b[12..16]);
        self.hold_sum_ns.write(&mut b[16..24]);
        self.receivers.write(&mut b[24..28]);
        self.late_max_ns.write(&mut b[28..36]);
        Ok(REPORT_LEN)
    }

    /// Folds a child's report into this one: maxima for delays, sums for counts.
    pub fn merge(&mut self, o: &ReportRepr) {
        self.owd_p95_ns = self.owd_p95_ns.max(o.owd_p95_ns);
        self.late_max_ns = self.late_max_ns.max(o.late_max_ns);
        self.messages = self.messages.saturating_add(o.messages);
        self.late = self.late.saturating_add(o.late);
        self.hold_sum_ns = self.hold_sum_ns.saturating_add(o.hold_sum_ns);
        self.receivers = self.receivers.saturating_add(o.receivers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_errors() {
        let h = HeaderRepr {
            kind: Some(Kind::Data),
            tree: 3,
            hop: 1,
            flags: 0,
            sequence: 42,
            send_ns: 1_000,
            deadline_ns: 2_000,
            origin: 7,
            payload_len: 5,
        };
        let mut b = [0xa5u8; 46];
        assert_eq!(h.emit(&mut b), Ok(40));
        b[40..45].copy_from_slice(b"hello");
        let (g, p) = HeaderRepr::parse(&b).unwrap();
        assert_eq!((g, p), (h, &b"hello"[..]));
        assert!(matches!(HeaderRepr::parse(&b[..44]), Err(Error::Overrun { .. })));
        let mut bad = b;
        bad[0] = 0;
        assert!(HeaderRepr::parse(&bad).is_err());
        bad = b;
        bad[3] = 9;
        assert!(matches!(HeaderRepr::parse(&bad), Err(Error::UnknownType { .. })));
        bump_hop(&mut b);
        assert_eq!(HeaderRepr::parse(&b).unwrap().0.hop, 2);
    }

    #[test]
    fn reports_merge_max_and_sum() {
        let mut a = ReportRepr { owd_p95_ns: 10, messages: 5, late: 1, hold_sum_ns: 100, receivers: 1, late_max_ns: 3 };
        let b = ReportRepr { owd_p95_ns: 20, messages: 7, late: 0, hold_sum_ns: 50, receivers: 2, late_max_ns: 1 };
        a.merge(&b);
        assert_eq!(
            a,
            ReportRepr { owd_p95_ns: 20, messages: 12, late: 1, hold_sum_ns: 150, receivers: 3, late_max_ns: 3 }
        );
        let mut buf = [0u8; REPORT_LEN];
        a.emit(&mut buf).unwrap();
        assert_eq!(ReportRepr::parse(&buf), Ok(a));
    }
}
