//! MoldUDP64 1.0: downstream packets and retransmission request packets.
//!
//! A downstream packet is a 20-byte header — session (10 bytes, alphanumeric),
//! sequence number of the first message (u64), message count (u16) — followed
//! by `count` message blocks, each a u16 length and that many bytes. A count of
//! 0 is a heartbeat and 0xFFFF marks the end of the session; both carry no
//! blocks, and their sequence number is the next one expected. A request packet
//! is the same 20 bytes with the count of messages wanted.
//!
//! [`Packet::new_checked`] validates the header; [`Packet::messages`] walks the
//! blocks and yields each one or a typed error. A block that overruns the packet
//! ends the walk after the good blocks before it were yielded.
//!
//! ```
//! use fairfeed_wire::moldudp64::{Packet, PacketBuilder, Session};
//! let mut buf = [0u8; 1400];
//! let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("TEST000001"), 41).unwrap();
//! b.push(b"hello").unwrap();
//! b.push(b"world!").unwrap();
//! let n = b.finish();
//! let p = Packet::new_checked(&buf[..n]).unwrap();
//! assert_eq!((p.sequence(), p.count(), p.next_sequence()), (41, 2, 43));
//! let blocks: Vec<_> = p.messages().map(|m| m.unwrap()).collect();
//! assert_eq!(blocks, [&b"hello"[..], &b"world!"[..]]);
//! ```

use crate::error::{check_len, Error, Protocol};
use crate::field::{Alpha, Field};

/// The 10-byte session name.
pub type Session = Alpha<10>;

mod field {
    use core::ops::Range;
    pub const SESSION: Range<usize> = 0..10;
    pub const SEQUENCE: Range<usize> = 10..18;
    pub const COUNT: Range<usize> = 18..20;
}

/// Bytes of the downstream and request headers.
pub const HEADER_LEN: usize = 20;
/// Bytes of a message block's length prefix.
pub const BLOCK_HEADER_LEN: usize = 2;
/// Message count of a heartbeat packet.
pub const COUNT_HEARTBEAT: u16 = 0;
/// Message count of an end-of-session packet.
pub const COUNT_END_OF_SESSION: u16 = 0xFFFF;
/// Largest packet our builders produce by default: fits a 1500-byte Ethernet
/// MTU with IPv4 and UDP headers, and matches the ≤ 1400-byte packets of the
/// feeds characterized in seed 001.
pub const PACKET_LEN_DEFAULT_MAX: usize = 1400;
/// Largest UDP payload over IPv4; no MoldUDP64 packet can exceed it.
pub const PACKET_LEN_MAX: usize = 65_507;

/// A zero-copy view of a MoldUDP64 downstream packet.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it; getters may then panic on a short one.
    pub fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps a buffer after checking the header is complete and consistent.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let p = Packet { buffer };
        p.check()?;
        Ok(p)
    }

    fn check(&self) -> Result<(), Error> {
        let b = self.buffer.as_ref();
        check_len(b, HEADER_LEN)?;
        if (self.is_heartbeat() || self.is_end_of_session()) && b.len() > HEADER_LEN {
            return Err(Error::Malformed {
                protocol: Protocol::MoldUdp64,
                reason: "heartbeat or end-of-session packet with a payload",
            });
        }
        Ok(())
    }

    /// The session name.
    pub fn session(&self) -> Session {
        Session::read(&self.buffer.as_ref()[field::SESSION])
    }

    /// Sequence number of the first message (or, in a heartbeat, of the next).
    pub fn sequence(&self) -> u64 {
        u64::read(&self.buffer.as_ref()[field::SEQUENCE])
    }

    /// Message count field (0 = heartbeat, 0xFFFF = end of session).
    pub fn count(&self) -> u16 {
        u16::read(&self.buffer.as_ref()[field::COUNT])
    }

    /// True for a heartbeat.
    pub fn is_heartbeat(&self) -> bool {
        self.count() == COUNT_HEARTBEAT
    }

    /// True for an end-of-session packet.
    pub fn is_end_of_session(&self) -> bool {
        self.count() == COUNT_END_OF_SESSION
    }

    /// Messages this packet carries (0 for heartbeats and end of session).
    pub fn message_count(&self) -> u16 {
        if self.is_end_of_session() {
            0
        } else {
            self.count()
        }
    }

    /// The sequence number expected after this packet.
    pub fn next_sequence(&self) -> u64 {
        self.sequence().wrapping_add(u64::from(self.message_count()))
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// The whole packet.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Walks the message blocks.
    pub fn messages(&self) -> Messages<'_> {
        Messages { rest: self.payload(), remaining: self.message_count(), done: false }
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<'a> Packet<&'a [u8]> {
    /// Walks the message blocks, borrowing the underlying buffer rather than the view.
    pub fn into_messages(self) -> Messages<'a> {
        let remaining = self.message_count();
        Messages { rest: &self.buffer[HEADER_LEN..], remaining, done: false }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the session name.
    pub fn set_session(&mut self, s: Session) {
        s.write(&mut self.buffer.as_mut()[field::SESSION]);
    }

    /// Sets the sequence number.
    pub fn set_sequence(&mut self, seq: u64) {
        seq.write(&mut self.buffer.as_mut()[field::SEQUENCE]);
    }

    /// Sets the message count.
    pub fn set_count(&mut self, count: u16) {
        count.write(&mut self.buffer.as_mut()[field::COUNT]);
    }
}

/// Iterator over a packet's message blocks; see [`Packet::messages`].
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    rest: &'a [u8],
    remaining: u16,
    done: bool,
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<&'a [u8], Error>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.remaining == 0 {
            self.done = true;
            if self.rest.is_empty() {
                return None;
            }
            return Some(Err(Error::TrailingBytes { protocol: Protocol::MoldUdp64, extra: self.rest.len() }));
        }
        let Some((len, after)) = self.rest.split_first_chunk::<BLOCK_HEADER_LEN>() else {
            self.done = true;
            return Some(Err(Error::Overrun { needed: BLOCK_HEADER_LEN, available: self.rest.len() }));
        };
        let len = usize::from(u16::from_be_bytes(*len));
        let Some((msg, rest)) = after.split_at_checked(len) else {
            self.done = true;
            return Some(Err(Error::Overrun { needed: len, available: after.len() }));
        };
        self.rest = rest;
        self.remaining -= 1;
        Some(Ok(msg))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(usize::from(self.remaining) + 1))
    }
}

/// The header of a downstream packet as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PacketRepr {
    /// The session it belongs to.
    pub session: Session,
    /// Its first message's sequence number (a heartbeat's: the next expected).
    pub sequence: u64,
    /// Messages it carries (0: heartbeat; `0xFFFF`: end of session).
    pub count: u16,
}

impl PacketRepr {
    /// Reads the header of a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Self {
        PacketRepr { session: p.session(), sequence: p.sequence(), count: p.count() }
    }

    /// Bytes `emit` writes (the header only; blocks follow it).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 20-byte header.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        check_len(buf, HEADER_LEN)?;
        let mut p = Packet::new_unchecked(&mut buf[..HEADER_LEN]);
        p.set_session(self.session);
        p.set_sequence(self.sequence);
        p.set_count(self.count);
        Ok(HEADER_LEN)
    }
}

/// Why a message did not fit the packet being built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// The packet has no room for the block; finish it and start another.
    Full,
    /// The message can never fit a block (longer than u16 or than the buffer).
    TooLong,
}

/// Packs messages into a downstream packet in a caller-owned buffer.
#[derive(Debug)]
pub struct PacketBuilder<'a> {
    buf: &'a mut [u8],
    len: usize,
    count: u16,
}

impl<'a> PacketBuilder<'a> {
    /// Starts a packet whose first message has sequence number `sequence`.
    /// The packet may use all of `buf`; slice it to cap the packet size.
    pub fn new(buf: &'a mut [u8], session: Session, sequence: u64) -> Result<Self, Error> {
        PacketRepr { session, sequence, count: 0 }.emit(buf)?;
        Ok(PacketBuilder { buf, len: HEADER_LEN, count: 0 })
    }

    /// Appends one message block.
    pub fn push(&mut self, msg: &[u8]) -> Result<(), PushError> {
        if msg.len() > usize::from(u16::MAX) || HEADER_LEN + BLOCK_HEADER_LEN + msg.len() > self.buf.len() {
            return Err(PushError::TooLong);
        }
        // 0xFFFF is reserved for end of session, so a packet holds at most 0xFFFE.
        if self.count == COUNT_END_OF_SESSION - 1 || !self.fits(msg.len()) {
            return Err(PushError::Full);
        }
        let at = self.len;
        self.buf[at..at + 2].copy_from_slice(&(msg.len() as u16).to_be_bytes());
        self.buf[at + 2..at + 2 + msg.len()].copy_from_slice(msg);
        self.len += BLOCK_HEADER_LEN + msg.len();
        self.count += 1;
        Ok(())
    }

    /// Appends one block whose content `emit` writes in place (no staging copy).
    pub fn push_with(&mut self, len: usize, emit: impl FnOnce(&mut [u8])) -> Result<(), PushError> {
        if len > usize::from(u16::MAX) || HEADER_LEN + BLOCK_HEADER_LEN + len > self.buf.len() {
            return Err(PushError::TooLong);
        }
        if self.count == COUNT_END_OF_SESSION - 1 || !self.fits(len) {
            return Err(PushError::Full);
        }
        let at = self.len;
        self.buf[at..at + 2].copy_from_slice(&(len as u16).to_be_bytes());
        emit(&mut self.buf[at + 2..at + 2 + len]);
        self.len += BLOCK_HEADER_LEN + len;
        self.count += 1;
        Ok(())
    }

    /// True if a message of `len` bytes still fits.
    pub fn fits(&self, len: usize) -> bool {
        self.len + BLOCK_HEADER_LEN + len <= self.buf.len()
    }

    /// Messages so far.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// Bytes so far, header included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no message was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Writes the count and returns the packet's length.
    pub fn finish(self) -> usize {
        Packet::new_unchecked(&mut self.buf[..HEADER_LEN]).set_count(self.count);
        self.len
    }
}

/// A zero-copy view of a MoldUDP64 request packet (exactly 20 bytes).
#[derive(Debug, Clone, Copy)]
pub struct Request<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Request<T> {
    /// Wraps a buffer after checking it is exactly one request.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let n = buffer.as_ref().len();
        check_len(buffer.as_ref(), HEADER_LEN)?;
        if n != HEADER_LEN {
            return Err(Error::TrailingBytes { protocol: Protocol::MoldUdp64, extra: n - HEADER_LEN });
        }
        Ok(Request { buffer })
    }

    /// Session name.
    pub fn session(&self) -> Session {
        Session::read(&self.buffer.as_ref()[field::SESSION])
    }

    /// First sequence number wanted.
    pub fn sequence(&self) -> u64 {
        u64::read(&self.buffer.as_ref()[field::SEQUENCE])
    }

    /// Messages wanted.
    pub fn count(&self) -> u16 {
        u16::read(&self.buffer.as_ref()[field::COUNT])
    }
}

/// A request packet as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestRepr {
    /// The session asked about.
    pub session: Session,
    /// The first message wanted.
    pub sequence: u64,
    /// Messages wanted from it.
    pub count: u16,
}

impl RequestRepr {
    /// Reads a checked request.
    pub fn parse<T: AsRef<[u8]>>(r: &Request<T>) -> Self {
        RequestRepr { session: r.session(), sequence: r.sequence(), count: r.count() }
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 20-byte request.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        PacketRepr { session: self.session, sequence: self.sequence, count: self.count }.emit(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A heartbeat: session "SESSION001", next sequence 0x0102030405060708, count 0.
    const HEARTBEAT: [u8; 20] =
        [b'S', b'E', b'S', b'S', b'I', b'O', b'N', b'0', b'0', b'1', 1, 2, 3, 4, 5, 6, 7, 8, 0, 0];

    #[test]
    fn deconstruct_heartbeat() {
        let p = Packet::new_checked(&HEARTBEAT[..]).unwrap();
        assert_eq!(p.session().as_str(), Some("SESSION001"));
        assert_eq!(p.sequence(), 0x0102_0304_0506_0708);
        assert!(p.is_heartbeat());
        assert_eq!(p.next_sequence(), p.sequence());
        assert_eq!(p.messages().count(), 0);
    }

    #[test]
    fn end_of_session_carries_no_messages() {
        let mut b = HEARTBEAT;
        b[18] = 0xff;
        b[19] = 0xff;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.is_end_of_session());
        assert_eq!(p.message_count(), 0);
        assert_eq!(p.next_sequence(), p.sequence());
    }

    #[test]
    fn heartbeat_with_payload_is_malformed() {
        let mut b = [0u8; 24];
        b[..20].copy_from_slice(&HEARTBEAT);
        assert!(matches!(Packet::new_checked(&b[..]), Err(Error::Malformed { .. })));
    }

    #[test]
    fn construct_request_writes_every_byte() {
        let r =
            RequestRepr { session: Session::from_str_padded("SESSION001"), sequence: 0x0102_0304_0506_0708, count: 0 };
        let mut buf = [0xa5u8; 21];
        assert_eq!(r.emit(&mut buf), Ok(20));
        assert_eq!(&buf[..20], &HEARTBEAT);
        assert_eq!(buf[20], 0xa5);
        let parsed = RequestRepr::parse(&Request::new_checked(&buf[..20]).unwrap());
        assert_eq!(parsed, r);
        assert!(Request::new_checked(&buf[..]).is_err());
    }

    #[test]
    fn overrun_keeps_earlier_blocks() {
        let mut buf = [0u8; 64];
        let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("S"), 1).unwrap();
        b.push(b"abc").unwrap();
        b.push(b"defg").unwrap();
        let n = b.finish();
        // Claim 3 messages: the third block is missing.
        let mut bad = buf[..n].to_vec();
        bad[19] = 3;
        let p = Packet::new_checked(&bad[..]).unwrap();
        let got: Vec<_> = p.messages().collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], Ok(&b"abc"[..]));
        assert_eq!(got[1], Ok(&b"defg"[..]));
        assert!(matches!(got[2], Err(Error::Overrun { .. })));
        // Claim 1: the second block is trailing garbage, reported after the first.
        bad[19] = 1;
        let got: Vec<_> = Packet::new_checked(&bad[..]).unwrap().into_messages().collect();
        assert_eq!(got[0], Ok(&b"abc"[..]));
        assert!(matches!(got[1], Err(Error::TrailingBytes { extra: 6, .. })));
    }

    #[test]
    fn builder_respects_capacity() {
        let mut buf = [0u8; 30];
        let mut b = PacketBuilder::new(&mut buf, Session::default(), 1).unwrap();
        assert_eq!(b.push(&[1; 9]), Err(PushError::TooLong));
        b.push(&[1; 4]).unwrap();
        assert_eq!(b.push(&[1; 3]), Err(PushError::Full));
        b.push(&[1; 2]).unwrap();
        assert_eq!(b.finish(), 30);
    }
}
