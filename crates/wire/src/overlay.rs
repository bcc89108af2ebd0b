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
//!
//! Clock-synchronization probes ([`Kind::Probe`], payload [`ProbeRepr`]) travel
//! between peers over the same sockets; their header's `send time` is the
//! prober's raw clock, and `sequence` is the probe's pair number.

use crate::error::{check_len, Error, Protocol};
use crate::field::Field;

/// First two bytes of every overlay packet.
pub const MAGIC: u16 = 0xFA1F;
/// The version this code writes and reads.
pub const VERSION: u8 = 2;
/// Bytes of the header.
pub const HEADER_LEN: usize = 40;
/// Bytes of an OWD report payload.
pub const REPORT_LEN: usize = 48;
/// Bytes of a clock-synchronization probe payload.
pub const PROBE_LEN: usize = 72;

/// What an overlay packet carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A market-data packet travelling down the tree.
    Data = 1,
    /// An OWD report travelling up the tree.
    Report = 2,
    /// A liveness beacon (no payload).
    Heartbeat = 3,
    /// A clock-synchronization probe between peers.
    Probe = 4,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::Data),
            2 => Some(Kind::Report),
            3 => Some(Kind::Heartbeat),
            4 => Some(Kind::Probe),
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
    /// The largest clock error bound among the subtree's synchronized
    /// receivers, ns (max-aggregated); the sender's margin covers it.
    pub clock_bound_ns: u64,
    /// Receivers whose clock bound is above the limit, left out of
    /// `clock_bound_ns` and of the fairness counts (summed).
    pub clock_unsynced: u32,
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
            clock_bound_ns: u64::read(&b[36..44]),
            clock_unsynced: u32::read(&b[44..48]),
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
        self.clock_bound_ns.write(&mut b[36..44]);
        self.clock_unsynced.write(&mut b[44..48]);
        Ok(REPORT_LEN)
    }

    /// Folds a child's report into this one: maxima for delays, sums for counts.
    pub fn merge(&mut self, o: &ReportRepr) {
        self.owd_p95_ns = self.owd_p95_ns.max(o.owd_p95_ns);
        self.late_max_ns = self.late_max_ns.max(o.late_max_ns);
        self.clock_bound_ns = self.clock_bound_ns.max(o.clock_bound_ns);
        self.clock_unsynced = self.clock_unsynced.saturating_add(o.clock_unsynced);
        self.messages = self.messages.saturating_add(o.messages);
        self.late = self.late.saturating_add(o.late);
        self.hold_sum_ns = self.hold_sum_ns.saturating_add(o.hold_sum_ns);
        self.receivers = self.receivers.saturating_add(o.receivers);
    }
}

/// Probe flag: the prober considers its own clock synchronized.
pub const PROBE_SYNCED: u8 = 0x01;

/// A clock-synchronization probe (payload of a [`Kind::Probe`] packet).
///
/// ```text
///  0       4     5     6      8         16        24          32          40          48          56        64           72
///  target  index flags level  pair      tx ns     echo tx ns  echo rx ns  offset ps   drift e-15  bound ns  hard bound ns
/// ```
///
/// Probes go in pairs (`index` 0 then 1, a known spacing apart) so the
/// receiver can discard pairs that met queueing. `echo` returns the newest
/// pure sample the prober received from `target` (the target's send time
/// and the prober's receive time, each on its own raw clock), so both ends
/// see both directions. `offset`, `drift` and the bounds advertise the
/// prober's current estimate of its clock against the reference, and
/// `level` its distance in probe hops from the reference (`u16::MAX`: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProbeRepr {
    pub target: u32,
    pub index: u8,
    pub flags: u8,
    pub level: u16,
    pub pair: u64,
    pub tx_ns: u64,
    pub echo_tx_ns: u64,
    pub echo_rx_ns: u64,
    /// The prober's clock minus the reference's, picoseconds.
    pub offset_ps: i64,
    /// The prober's drift against the reference, in units of 1e-15.
    pub drift_e15: i64,
    pub bound_ns: u64,
    pub hard_bound_ns: u64,
}

impl ProbeRepr {
    pub fn parse(b: &[u8]) -> Result<ProbeRepr, Error> {
        check_len(b, PROBE_LEN)?;
        Ok(ProbeRepr {
            target: u32::read(&b[0..4]),
            index: b[4],
            flags: b[5],
            level: u16::read(&b[6..8]),
            pair: u64::read(&b[8..16]),
            tx_ns: u64::read(&b[16..24]),
            echo_tx_ns: u64::read(&b[24..32]),
            echo_rx_ns: u64::read(&b[32..40]),
            offset_ps: u64::read(&b[40..48]) as i64,
            drift_e15: u64::read(&b[48..56]) as i64,
            bound_ns: u64::read(&b[56..64]),
            hard_bound_ns: u64::read(&b[64..72]),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<usize, Error> {
        check_len(b, PROBE_LEN)?;
        self.target.write(&mut b[0..4]);
        b[4] = self.index;
        b[5] = self.flags;
        self.level.write(&mut b[6..8]);
        self.pair.write(&mut b[8..16]);
        self.tx_ns.write(&mut b[16..24]);
        self.echo_tx_ns.write(&mut b[24..32]);
        self.echo_rx_ns.write(&mut b[32..40]);
        (self.offset_ps as u64).write(&mut b[40..48]);
        (self.drift_e15 as u64).write(&mut b[48..56]);
        self.bound_ns.write(&mut b[56..64]);
        self.hard_bound_ns.write(&mut b[64..72]);
        Ok(PROBE_LEN)
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
        let mut a = ReportRepr {
            owd_p95_ns: 10,
            messages: 5,
            late: 1,
            hold_sum_ns: 100,
            receivers: 1,
            late_max_ns: 3,
            clock_bound_ns: 40,
            clock_unsynced: 0,
        };
        let b = ReportRepr {
            owd_p95_ns: 20,
            messages: 7,
            late: 0,
            hold_sum_ns: 50,
            receivers: 2,
            late_max_ns: 1,
            clock_bound_ns: 30,
            clock_unsynced: 1,
        };
        a.merge(&b);
        assert_eq!(
            a,
            ReportRepr {
                owd_p95_ns: 20,
                messages: 12,
                late: 1,
                hold_sum_ns: 150,
                receivers: 3,
                late_max_ns: 3,
                clock_bound_ns: 40,
                clock_unsynced: 1,
            }
        );
        let mut buf = [0u8; REPORT_LEN];
        a.emit(&mut buf).unwrap();
        assert_eq!(ReportRepr::parse(&buf), Ok(a));
    }

    #[test]
    fn probes_round_trip() {
        let p = ProbeRepr {
            target: 9,
            index: 1,
            flags: PROBE_SYNCED,
            level: 3,
            pair: 77,
            tx_ns: 123_456_789,
            echo_tx_ns: 5,
            echo_rx_ns: 6,
            offset_ps: -42_000_123,
            drift_e15: -3_000_000_000,
            bound_ns: 80,
            hard_bound_ns: 12_000,
        };
        let mut b = [0u8; PROBE_LEN];
        assert_eq!(p.emit(&mut b), Ok(PROBE_LEN));
        assert_eq!(ProbeRepr::parse(&b), Ok(p));
        assert!(ProbeRepr::parse(&b[..PROBE_LEN - 1]).is_err());
    }
}
