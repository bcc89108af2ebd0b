//! The fair-multicast overlay header: a small fixed header in front of an
//! unmodified MoldUDP64 packet (data), or of an OWD report travelling up the
//! tree.
//!
//! ```text
//!  0      2  3  4      6  7  8              16             24             32         36     38  39  40
//!  magic  ver kind tree hop flags  sequence      send time ns   deadline ns    origin   len    key rsvd
//! ```
//!
//! All integers big-endian. `sequence` is the sender's overlay sequence number
//! per tree, `send time` and `deadline` are nanoseconds on the synchronized
//! clock, `origin` is the node that built the packet (the sender for data, the
//! reporting node for reports), `len` the payload length after the header,
//! `key` the id of the tree key the packet's tag is made with (0 for a tree
//! with one key; a key rollover runs two ids side by side).
//! Receivers strip the header and hand applications the MoldUDP64 packet.
//!
//! A report may carry a [`TailView`] after its fixed part: per-message
//! largest one-way delays of the subtree (older readers ignore it).
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
    /// A membership message between a node and the controller
    /// (`fairfeed_tree::membership`): registration, heartbeats, views.
    Membership = 5,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        match v {
            1 => Some(Kind::Data),
            2 => Some(Kind::Report),
            3 => Some(Kind::Heartbeat),
            4 => Some(Kind::Probe),
            5 => Some(Kind::Membership),
            _ => None,
        }
    }
}

/// Flag: an authentication tag follows the payload.
pub const FLAG_AUTH: u8 = 0x01;
/// Flag: the packet is one tree's copy of a packet the sender sent on every
/// tree it shards a feed over (a market-wide message); all copies carry the
/// same send time, and a receiver of several trees delivers one.
pub const FLAG_EVERY_TREE: u8 = 0x04;
/// Where the key id sits in the header.
pub const KEY_ID_OFFSET: usize = 38;

/// The header as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeaderRepr {
    /// What it carries (`None` in a default value: set it before emitting).
    pub kind: Option<Kind>,
    /// The tree it travels on.
    pub tree: u16,
    /// Hops travelled so far (0 as sent by the sender).
    pub hop: u8,
    /// [`FLAG_AUTH`], [`FLAG_EVERY_TREE`].
    pub flags: u8,
    /// The sender's overlay sequence number on the tree (a probe's pair number).
    pub sequence: u64,
    /// Send time on the synchronized clock, ns (a probe's: the prober's raw clock).
    pub send_ns: u64,
    /// Release deadline on the synchronized clock, ns.
    pub deadline_ns: u64,
    /// The node that built the packet.
    pub origin: u32,
    /// Bytes of payload after the header.
    pub payload_len: u16,
    /// The tree key the tag is made with (set by the sealing key).
    pub key_id: u8,
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
            key_id: b[KEY_ID_OFFSET],
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
        b[KEY_ID_OFFSET] = self.key_id;
        b[39] = 0;
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
    /// Reads a report's fixed part.
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

    /// Writes its fixed part; returns [`REPORT_LEN`].
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

/// Bytes of a tail section's fixed part (after the fixed report).
pub const TAIL_HEADER_LEN: usize = 12;
/// Entries a tail section carries at most (a node coarsens beyond it).
pub const TAIL_MAX: usize = 512;
/// The largest one-way delay a tail entry can say, ns (≈ 134 ms; larger saturates).
pub const TAIL_OWD_MAX_NS: u64 = 8191 << 14;

/// The optional tail section of a report: the largest one-way delay the
/// subtree saw for each message of a sequence range, max-aggregated up the
/// tree, so the sender sees the distribution of the *last* arrival.
///
/// ```text
///  0            8       10      12
///  first seq    count   stride  count × u16 delay codes
/// ```
///
/// Entry `i` covers sequences `first + i·stride .. first + (i+1)·stride`
/// (the max over them: a node coarsens when its range exceeds [`TAIL_MAX`]).
/// A code is a 16-bit float of nanoseconds ([`owd_code`]), rounded up; 0
/// means "no message of the group arrived".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailView<'a> {
    /// The first sequence number covered.
    pub first_seq: u64,
    /// Sequence numbers per entry.
    pub stride: u16,
    codes: &'a [u8],
}

/// Encodes a delay in ns as a 16-bit float, rounded up: exact below
/// 4,096 ns, then 12 bits of mantissa (≤ 0.025 % high); 0 stays for
/// "none", so a delay of 0 encodes as 1 ns.
pub fn owd_code(ns: u64) -> u16 {
    let v = ns.clamp(1, TAIL_OWD_MAX_NS);
    if v < 4096 {
        return v as u16;
    }
    let mut e = 1u32;
    while v > 8191u64 << (e - 1) {
        e += 1;
    }
    let q = (v + (1u64 << (e - 1)) - 1) >> (e - 1);
    (e << 12) as u16 | (q - 4096) as u16
}

/// The delay a code stands for, ns (`None`: no message).
pub fn owd_decode(code: u16) -> Option<u64> {
    let (e, m) = (u64::from(code >> 12), u64::from(code & 0x0FFF));
    match (e, m) {
        (0, 0) => None,
        (0, m) => Some(m),
        (e, m) => Some((4096 + m) << (e - 1)),
    }
}

impl<'a> TailView<'a> {
    /// Parses the bytes after the fixed report: `Ok(None)` when there is no tail.
    pub fn parse(b: &'a [u8]) -> Result<Option<TailView<'a>>, Error> {
        if b.is_empty() {
            return Ok(None);
        }
        check_len(b, TAIL_HEADER_LEN)?;
        let first_seq = u64::read(&b[0..8]);
        let count = usize::from(u16::read(&b[8..10]));
        let stride = u16::read(&b[10..12]);
        let bad = |reason| Err(Error::Malformed { protocol: Protocol::Overlay, reason });
        if count > TAIL_MAX {
            return bad("tail longer than TAIL_MAX");
        }
        if stride == 0 {
            return bad("tail stride 0");
        }
        if first_seq.checked_add(count as u64 * u64::from(stride)).is_none() {
            return bad("tail sequence range overflows");
        }
        let end = TAIL_HEADER_LEN + 2 * count;
        check_len(b, end)?;
        Ok(Some(TailView { first_seq, stride, codes: &b[TAIL_HEADER_LEN..end] }))
    }

    /// Entries it carries.
    pub fn len(&self) -> usize {
        self.codes.len() / 2
    }

    /// Whether it carries none.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// Every entry's delay, ns (0: none), in order.
    pub fn delays(&self) -> impl Iterator<Item = u64> + 'a {
        self.codes.chunks_exact(2).map(|c| owd_decode(u16::read(c)).unwrap_or(0))
    }

    /// (first sequence of the group, largest delay ns) for each group with a message.
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64)> + 'a {
        let (first, stride) = (self.first_seq, u64::from(self.stride));
        self.codes
            .chunks_exact(2)
            .enumerate()
            .filter_map(move |(i, c)| owd_decode(u16::read(c)).map(|v| (first + i as u64 * stride, v)))
    }

    /// Writes a tail of `delays_ns` (0: none) for groups of `stride` from
    /// `first_seq`; returns the bytes written.
    pub fn emit(first_seq: u64, stride: u16, delays_ns: &[u64], b: &mut [u8]) -> Result<usize, Error> {
        assert!(delays_ns.len() <= TAIL_MAX && stride > 0, "tail of {} entries, stride {stride}", delays_ns.len());
        let end = TAIL_HEADER_LEN + 2 * delays_ns.len();
        check_len(b, end)?;
        first_seq.write(&mut b[0..8]);
        (delays_ns.len() as u16).write(&mut b[8..10]);
        stride.write(&mut b[10..12]);
        for (c, &v) in b[TAIL_HEADER_LEN..end].chunks_exact_mut(2).zip(delays_ns) {
            (if v == 0 { 0 } else { owd_code(v) }).write(c);
        }
        Ok(end)
    }
}

/// Probe flag: the prober considers its own clock synchronized.
pub const PROBE_SYNCED: u8 = 0x01;
/// Probe flag: the prober's estimate derives from the probe's target (it is
/// one of the prober's sources), so the target must not count the prober as
/// an independent witness of its own edges.
pub const PROBE_ANCHORED: u8 = 0x02;
/// Probe flag: the prober's estimate is contested — one of its anchors (a
/// peer nearer the reference) disagrees with its other peers — so its word
/// must not set aside another node's anchor (it may itself be the side that
/// is wrong).
pub const PROBE_CONTESTED: u8 = 0x04;
/// Every probe flag defined.
pub const PROBE_FLAGS: u8 = PROBE_SYNCED | PROBE_ANCHORED | PROBE_CONTESTED;

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
    /// The peer it is for.
    pub target: u32,
    /// 0 or 1: its place in its pair.
    pub index: u8,
    /// `PROBE_SYNCED`, `PROBE_ANCHORED`, `PROBE_CONTESTED`.
    pub flags: u8,
    /// The prober's distance in probe hops from the reference (`u16::MAX`: none).
    pub level: u16,
    /// The pair's number.
    pub pair: u64,
    /// Its send time on the prober's raw clock, ns.
    pub tx_ns: u64,
    /// The echoed sample: the target's send time (its raw clock), ns (0: none) ...
    pub echo_tx_ns: u64,
    /// ... and the prober's receive time (its raw clock), ns.
    pub echo_rx_ns: u64,
    /// The prober's clock minus the reference's, picoseconds.
    pub offset_ps: i64,
    /// The prober's drift against the reference, in units of 1e-15.
    pub drift_e15: i64,
    /// The prober's error bound, ns.
    pub bound_ns: u64,
    /// Its bound without the symmetry assumption, ns.
    pub hard_bound_ns: u64,
}

impl ProbeRepr {
    /// Reads a probe payload.
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

    /// Writes the probe payload; returns [`PROBE_LEN`].
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
    fn owd_codes_round_up_and_stay_monotone() {
        let mut last = 0;
        for v in (1..20_000u64).chain((20_000..TAIL_OWD_MAX_NS).step_by(997)) {
            let c = owd_code(v);
            let d = owd_decode(c).unwrap();
            assert!(d >= v && (d - v) as f64 <= v as f64 / 4096.0 + 1.0, "{v} -> {d}");
            assert!(c >= last, "{v}");
            last = c;
        }
        assert_eq!(owd_decode(owd_code(0)), Some(1));
        assert_eq!(owd_decode(owd_code(u64::MAX)), Some(TAIL_OWD_MAX_NS));
        assert_eq!(owd_decode(0), None);
    }

    #[test]
    fn tail_round_trip_and_errors() {
        let delays = [0, 5, 4_096, 123_456, 0, 9_999_999];
        let mut b = vec![0u8; TAIL_HEADER_LEN + 2 * delays.len()];
        assert_eq!(TailView::emit(100, 2, &delays, &mut b), Ok(b.len()));
        let t = TailView::parse(&b).unwrap().unwrap();
        assert_eq!((t.first_seq, t.stride, t.len()), (100, 2, 6));
        let e: Vec<(u64, u64)> = t.entries().collect();
        assert_eq!(e.iter().map(|x| x.0).collect::<Vec<_>>(), vec![102, 104, 106, 110]);
        assert_eq!(e[1].1, 4_096);
        assert!(e[2].1 >= 123_456 && e[3].1 >= 9_999_999);
        assert_eq!(TailView::parse(&[]), Ok(None));
        assert!(matches!(TailView::parse(&b[..b.len() - 1]), Err(Error::Truncated { .. })));
        let mut bad = b.clone();
        bad[10..12].copy_from_slice(&0u16.to_be_bytes());
        assert!(TailView::parse(&bad).is_err(), "stride 0");
        bad = b.clone();
        bad[8..10].copy_from_slice(&(TAIL_MAX as u16 + 1).to_be_bytes());
        assert!(TailView::parse(&bad).is_err(), "too long");
        bad = b.clone();
        bad[0..8].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(TailView::parse(&bad).is_err(), "overflowing range");
    }

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
            key_id: 9,
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
