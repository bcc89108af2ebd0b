//! Where a protocol keeps its sequence number: the only protocol knowledge the
//! arbitrator needs (seed 004: "the location and bit-width of the sequence
//! number"), plus, optionally, the message count, heartbeat and end-of-session
//! markers, the session field, and message framing (needed to trim packets
//! that partly overlap what was already output).

use core::ops::Range;

/// Byte order of an integer field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Endian {
    /// Most significant byte first (network order).
    Big,
    /// Least significant byte first.
    Little,
}

/// An unsigned integer field of 1 to 8 bytes at a fixed offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IntField {
    /// Its first byte's offset in the packet.
    pub offset: usize,
    /// Its width, 1..=8 bytes.
    pub width: usize,
    /// Its byte order.
    pub endian: Endian,
}

impl IntField {
    /// A big-endian field.
    pub const fn be(offset: usize, width: usize) -> Self {
        IntField { offset, width, endian: Endian::Big }
    }

    /// A little-endian field.
    pub const fn le(offset: usize, width: usize) -> Self {
        IntField { offset, width, endian: Endian::Little }
    }

    /// Reads the field, or `None` if `b` is too short.
    #[inline]
    pub fn read(&self, b: &[u8]) -> Option<u64> {
        let s = b.get(self.offset..self.offset + self.width)?;
        let mut v = 0u64;
        match self.endian {
            Endian::Big => s.iter().for_each(|&x| v = v << 8 | u64::from(x)),
            Endian::Little => s.iter().rev().for_each(|&x| v = v << 8 | u64::from(x)),
        }
        Some(v)
    }

    /// Writes the low `width` bytes of `v`; `b` must hold the field.
    pub fn write(&self, b: &mut [u8], v: u64) {
        let s = &mut b[self.offset..self.offset + self.width];
        for (i, x) in s.iter_mut().enumerate() {
            let shift = match self.endian {
                Endian::Big => 8 * (self.width - 1 - i),
                Endian::Little => 8 * i,
            };
            *x = (v >> shift) as u8;
        }
    }

    fn end(&self) -> usize {
        self.offset + self.width
    }
}

/// How many messages a packet carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Count {
    /// Every packet is one message (or the protocol counts packets).
    Fixed(u64),
    /// A header field holds the count.
    Field(IntField),
}

/// How messages are laid out after the header, when they can be walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Framing {
    /// The length field at the start of each block.
    pub len: IntField,
    /// Added to the length field's value to get the block's size (2 for
    /// MoldUDP64, whose length excludes itself; 0 when it includes itself).
    pub extra: usize,
}

/// What the arbitrator needs to know of a protocol.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SeqSpec {
    /// The protocol's name (`moldudp64`, a custom one's).
    pub name: String,
    /// Bytes before the first message.
    pub header_len: usize,
    /// The first message's sequence number.
    pub seq: IntField,
    /// How many messages a packet carries.
    pub count: Count,
    /// Count value that marks a heartbeat (no messages; seq = next expected).
    pub heartbeat_count: Option<u64>,
    /// Count value that marks the end of the session.
    pub end_count: Option<u64>,
    /// How to walk the messages (`None`: they cannot be, so packets are
    /// never trimmed).
    pub framing: Option<Framing>,
    /// Session field (MoldUDP64's 10 bytes), needed for retransmission requests.
    pub session: Option<Range<usize>>,
    /// A header field holding the whole packet's length, rewritten when a
    /// packet is trimmed (XDP's PacketSize).
    pub packet_len: Option<IntField>,
}

/// What kind of packet the header says this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Carries messages.
    Data,
    /// No messages; its sequence number is the next expected.
    Heartbeat,
    /// The session is over.
    EndOfSession,
}

/// A packet's place in the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketInfo {
    /// Its first message's sequence number.
    pub seq: u64,
    /// Messages carried (0 for heartbeats and end of session).
    pub count: u64,
    /// What the header says it is.
    pub kind: Kind,
}

impl PacketInfo {
    /// Sequence number after this packet.
    pub fn end(&self) -> u64 {
        self.seq.saturating_add(self.count)
    }
}

/// Why an arbitrator's configuration or protocol description is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A header field is not 1..=8 bytes inside the header.
    #[error("{name} field must be 1..=8 bytes inside the {header_len}-byte header")]
    FieldOutside {
        /// Which field.
        name: &'static str,
        /// The header's length.
        header_len: usize,
    },
    /// The session field reaches past the header.
    #[error("session field must lie inside the header")]
    SessionOutside,
    /// Too few or too many lines.
    #[error("lines must be 1..={max}, got {got}")]
    Lines {
        /// The most allowed.
        max: usize,
        /// What was asked for.
        got: usize,
    },
    /// Retransmission asked for on a protocol without a session field (named).
    #[error("retransmission needs a protocol with a session field; {0} has none")]
    NoSession(String),
    /// A buffer limit of 0.
    #[error("buffer limits must be positive")]
    Buffers,
    /// A request rate or burst of 0.
    #[error("retransmission requests per second and their burst must be positive")]
    RequestRate,
}

impl SeqSpec {
    /// MoldUDP64 (NASDAQ ITCH 5.0): session 0..10, u64 sequence at 10, u16 count at 18.
    pub fn moldudp64() -> Self {
        SeqSpec {
            name: "moldudp64".into(),
            header_len: 20,
            seq: IntField::be(10, 8),
            count: Count::Field(IntField::be(18, 2)),
            heartbeat_count: Some(0),
            end_count: Some(0xFFFF),
            framing: Some(Framing { len: IntField::be(0, 2), extra: 2 }),
            session: Some(0..10),
            packet_len: None,
        }
    }

    /// The XDP-style header of seed 001: 16 bytes, PacketSeqNum (4) at offset
    /// 4, NumberMsgEntries (1) at offset 15, each message starting with its
    /// 2-byte size (counting itself). NYSE XDP is little-endian; pass another
    /// spec for a big-endian variant.
    pub fn xdp() -> Self {
        SeqSpec {
            name: "xdp".into(),
            header_len: 16,
            seq: IntField::le(4, 4),
            count: Count::Field(IntField::le(15, 1)),
            heartbeat_count: Some(0),
            end_count: None,
            framing: Some(Framing { len: IntField::le(0, 2), extra: 0 }),
            session: None,
            packet_len: Some(IntField::le(0, 2)),
        }
    }

    /// A preset by name.
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "moldudp64" | "itch" | "itch50" => Some(Self::moldudp64()),
            "xdp" => Some(Self::xdp()),
            _ => None,
        }
    }

    /// Checks the fields lie inside the header and have sane widths.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut fields = vec![("seq", self.seq)];
        if let Count::Field(c) = self.count {
            fields.push(("count", c));
        }
        for (name, f) in fields {
            if !(1..=8).contains(&f.width) || f.end() > self.header_len {
                return Err(ConfigError::FieldOutside { name, header_len: self.header_len });
            }
        }
        if let Some(s) = &self.session {
            if s.end > self.header_len || s.is_empty() {
                return Err(ConfigError::SessionOutside);
            }
        }
        Ok(())
    }

    /// Reads a packet's header; `None` for a packet that is not a market-data
    /// packet of this protocol (too short, or a count of 0 with no heartbeat marker).
    #[inline]
    pub fn parse(&self, b: &[u8]) -> Option<PacketInfo> {
        if b.len() < self.header_len {
            return None;
        }
        let seq = self.seq.read(b)?;
        let raw = match self.count {
            Count::Fixed(n) => n,
            Count::Field(f) => f.read(b)?,
        };
        let kind = if Some(raw) == self.end_count {
            Kind::EndOfSession
        } else if Some(raw) == self.heartbeat_count {
            Kind::Heartbeat
        } else if raw == 0 {
            return None;
        } else {
            Kind::Data
        };
        let count = if kind == Kind::Data { raw } else { 0 };
        Some(PacketInfo { seq, count, kind })
    }

    /// True when `b` is, as far as its structure tells, a packet of this
    /// protocol: the header parses, a packet-length field (if any) equals the
    /// payload's length, and a data packet's blocks walk exactly to its end.
    /// (A capture of another protocol "parses" too — any 16 bytes have a
    /// sequence number at offset 4 — but does not walk.)
    pub fn plausible(&self, b: &[u8]) -> bool {
        let Some(info) = self.parse(b) else { return false };
        if let Some(pl) = self.packet_len {
            if pl.read(b) != Some(b.len() as u64) {
                return false;
            }
        }
        let Some(fr) = self.framing else { return true };
        if info.kind != Kind::Data {
            return true;
        }
        let mut at = self.header_len;
        for _ in 0..info.count {
            let Some(len) = b.get(at..).and_then(|blk| fr.len.read(blk)) else { return false };
            at += len as usize + fr.extra;
            if at > b.len() {
                return false;
            }
        }
        at == b.len()
    }

    /// The session bytes, when the protocol has them.
    pub fn session<'a>(&self, b: &'a [u8]) -> Option<&'a [u8]> {
        self.session.as_ref().and_then(|r| b.get(r.clone()))
    }

    /// Writes into `out` the packet `b` without its first `skip` messages
    /// (sequence and count rewritten). `false` when the protocol has no
    /// framing, or the blocks do not walk.
    pub fn trim(&self, b: &[u8], info: &PacketInfo, skip: u64, out: &mut Vec<u8>) -> bool {
        let (Some(fr), Count::Field(cf)) = (self.framing, self.count) else { return false };
        if skip == 0 || skip >= info.count {
            return false;
        }
        let mut at = self.header_len;
        for _ in 0..skip {
            let Some(len) = b.get(at..).and_then(|blk| fr.len.read(blk)) else { return false };
            at += len as usize + fr.extra;
            if at > b.len() {
                return false;
            }
        }
        out.clear();
        out.extend_from_slice(&b[..self.header_len]);
        out.extend_from_slice(&b[at..]);
        self.seq.write(out, info.seq + skip);
        cf.write(out, info.count - skip);
        if let Some(pl) = self.packet_len {
            let len = out.len() as u64;
            pl.write(out, len);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_wire::moldudp64::{Packet, PacketBuilder, Session};

    #[test]
    fn plausible_tells_one_protocol_from_another() {
        let mut buf = [0u8; 100];
        let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("FFSESSION1"), 7).unwrap();
        for m in [&b"abc"[..], b"de"] {
            b.push(m).unwrap();
        }
        let n = b.finish();
        assert!(SeqSpec::moldudp64().plausible(&buf[..n]));
        assert!(SeqSpec::xdp().parse(&buf[..n]).is_some(), "any 16 bytes parse");
        assert!(!SeqSpec::xdp().plausible(&buf[..n]), "but a MoldUDP64 packet is not XDP");
        assert!(!SeqSpec::moldudp64().plausible(&buf[..n - 1]), "blocks must walk to the end");
    }

    #[test]
    fn moldudp64_header_and_trim() {
        let spec = SeqSpec::moldudp64();
        let mut buf = [0u8; 100];
        let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("S"), 41).unwrap();
        for m in [&b"abc"[..], b"de", b"fghi"] {
            b.push(m).unwrap();
        }
        let n = b.finish();
        let info = spec.parse(&buf[..n]).unwrap();
        assert_eq!(info, PacketInfo { seq: 41, count: 3, kind: Kind::Data });
        let mut out = Vec::new();
        assert!(spec.trim(&buf[..n], &info, 2, &mut out));
        let p = Packet::new_checked(&out[..]).unwrap();
        assert_eq!((p.sequence(), p.count()), (43, 1));
        assert_eq!(p.messages().next().unwrap().unwrap(), b"fghi");
        assert!(!spec.trim(&buf[..n], &info, 3, &mut out));
    }

    #[test]
    fn xdp_little_endian_fields() {
        let spec = SeqSpec::xdp();
        spec.validate().unwrap();
        let mut h = [0u8; 16];
        h[4..8].copy_from_slice(&1234u32.to_le_bytes());
        h[15] = 5;
        assert_eq!(spec.parse(&h), Some(PacketInfo { seq: 1234, count: 5, kind: Kind::Data }));
        h[15] = 0;
        assert_eq!(spec.parse(&h).unwrap().kind, Kind::Heartbeat);
        assert_eq!(spec.parse(&h[..10]), None);
    }

    #[test]
    fn int_field_round_trips() {
        for f in [IntField::be(1, 3), IntField::le(0, 8), IntField::le(2, 1)] {
            let mut b = [0u8; 10];
            let v = 0x0123_4567_89ab_cdef & (u64::MAX >> (64 - 8 * f.width));
            f.write(&mut b, v);
            assert_eq!(f.read(&b), Some(v));
        }
    }
}
