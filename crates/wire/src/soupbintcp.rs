//! SoupBinTCP 4.x framing: the session layer NASDAQ runs OUCH over.
//!
//! Each packet is a u16 big-endian length (counting the type byte and payload,
//! not itself), a type byte, and the payload. [`split_packet`] finds one packet
//! at the front of a TCP receive buffer — or says more bytes are needed — and
//! [`PacketRepr`] is the typed form of every packet type of the specification:
//! server to client `+ A J S H Z`, client to server `+ L U R O`.
//!
//! Numeric fields (sequence numbers) are ASCII digits, left-padded with spaces
//! to 20 bytes; usernames and passwords are right-padded with spaces; sessions
//! are left-padded with spaces.
//!
//! ```
//! use fairfeed_wire::soupbintcp::{split_packet, PacketRepr};
//! let mut buf = [0u8; 64];
//! let n = PacketRepr::SequencedData(b"hi").emit(&mut buf).unwrap();
//! let (p, used) = split_packet(&buf[..n]).unwrap().unwrap();
//! assert_eq!((p, used), (PacketRepr::SequencedData(b"hi"), 5));
//! ```

use crate::error::{check_len, Error, Protocol};
use crate::field::{Alpha, Field};

/// Bytes of the length prefix.
pub const LENGTH_PREFIX_LEN: usize = 2;
/// Largest payload: the u16 length also counts the type byte.
pub const PAYLOAD_LEN_MAX: usize = u16::MAX as usize - 1;
/// Width of a numeric (sequence number) field.
pub const NUMERIC_LEN: usize = 20;
/// Payload length of a login request.
pub const LOGIN_REQUEST_LEN: usize = 6 + 10 + 10 + NUMERIC_LEN;
/// Payload length of a login accepted.
pub const LOGIN_ACCEPTED_LEN: usize = 10 + NUMERIC_LEN;

const _: () = assert!(LOGIN_REQUEST_LEN == 46);
const _: () = assert!(LOGIN_ACCEPTED_LEN == 30);

/// Packet type bytes.
pub mod packet_type {
    /// `+` Debug (either direction).
    pub const DEBUG: u8 = b'+';
    /// `A` Login Accepted (server).
    pub const LOGIN_ACCEPTED: u8 = b'A';
    /// `J` Login Rejected (server).
    pub const LOGIN_REJECTED: u8 = b'J';
    /// `S` Sequenced Data (server).
    pub const SEQUENCED_DATA: u8 = b'S';
    /// `H` Server Heartbeat.
    pub const SERVER_HEARTBEAT: u8 = b'H';
    /// `Z` End of Session (server).
    pub const END_OF_SESSION: u8 = b'Z';
    /// `L` Login Request (client).
    pub const LOGIN_REQUEST: u8 = b'L';
    /// `U` Unsequenced Data (client).
    pub const UNSEQUENCED_DATA: u8 = b'U';
    /// `R` Client Heartbeat.
    pub const CLIENT_HEARTBEAT: u8 = b'R';
    /// `O` Logout Request (client).
    pub const LOGOUT_REQUEST: u8 = b'O';
}

/// Login rejected reason: not authorized (bad username or password).
pub const REJECT_NOT_AUTHORIZED: u8 = b'A';
/// Login rejected reason: the requested session is not available.
pub const REJECT_SESSION_NOT_AVAILABLE: u8 = b'S';

/// A SoupBinTCP packet of any type; payload-carrying variants borrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketRepr<'a> {
    /// `+` Debug text (either direction).
    Debug(&'a [u8]),
    /// `A` Login Accepted.
    LoginAccepted {
        /// The session the client is logged in to.
        session: Alpha<10>,
        /// The sequence number of the next Sequenced Data packet.
        sequence: u64,
    },
    /// `J` Login Rejected.
    LoginRejected {
        /// [`REJECT_NOT_AUTHORIZED`] or [`REJECT_SESSION_NOT_AVAILABLE`].
        reason: u8,
    },
    /// `S` Sequenced Data (an application message, e.g. OUCH outbound).
    SequencedData(&'a [u8]),
    /// `H` Server Heartbeat.
    ServerHeartbeat,
    /// `Z` End of Session.
    EndOfSession,
    /// `L` Login Request.
    LoginRequest {
        /// The user name.
        username: Alpha<6>,
        /// The password.
        password: Alpha<10>,
        /// The session asked for (blank: the current one).
        session: Alpha<10>,
        /// The sequence number wanted next (0: the most recent).
        sequence: u64,
    },
    /// `U` Unsequenced Data (an application message, e.g. OUCH inbound).
    UnsequencedData(&'a [u8]),
    /// `R` Client Heartbeat.
    ClientHeartbeat,
    /// `O` Logout Request.
    LogoutRequest,
}

/// Finds the first packet in `buf`. `Ok(None)` means more bytes are needed;
/// `Ok(Some((packet, used)))` consumed `used` bytes.
pub fn split_packet(buf: &[u8]) -> Result<Option<(PacketRepr<'_>, usize)>, Error> {
    let Some((len, rest)) = buf.split_first_chunk::<LENGTH_PREFIX_LEN>() else {
        return Ok(None);
    };
    let len = usize::from(u16::from_be_bytes(*len));
    if len == 0 {
        return Err(Error::Malformed { protocol: Protocol::SoupBinTcp, reason: "zero-length packet" });
    }
    let Some(body) = rest.get(..len) else {
        return Ok(None);
    };
    Ok(Some((PacketRepr::parse(body)?, LENGTH_PREFIX_LEN + len)))
}

impl<'a> PacketRepr<'a> {
    /// Parses a packet body (type byte + payload, without the length prefix).
    pub fn parse(body: &'a [u8]) -> Result<Self, Error> {
        use packet_type::*;
        let Some((&t, p)) = body.split_first() else {
            return Err(Error::Truncated { needed: 1, available: 0 });
        };
        let exact = |n: usize| -> Result<(), Error> {
            if p.len() == n {
                Ok(())
            } else {
                Err(Error::BadLength {
                    protocol: Protocol::SoupBinTcp,
                    msg_type: t,
                    expected: n + 1,
                    actual: body.len(),
                })
            }
        };
        Ok(match t {
            DEBUG => PacketRepr::Debug(p),
            SEQUENCED_DATA => PacketRepr::SequencedData(p),
            UNSEQUENCED_DATA => PacketRepr::UnsequencedData(p),
            LOGIN_ACCEPTED => {
                exact(LOGIN_ACCEPTED_LEN)?;
                PacketRepr::LoginAccepted { session: Alpha::read(&p[..10]), sequence: parse_numeric(&p[10..30])? }
            }
            LOGIN_REJECTED => {
                exact(1)?;
                PacketRepr::LoginRejected { reason: p[0] }
            }
            LOGIN_REQUEST => {
                exact(LOGIN_REQUEST_LEN)?;
                PacketRepr::LoginRequest {
                    username: Alpha::read(&p[..6]),
                    password: Alpha::read(&p[6..16]),
                    session: Alpha::read(&p[16..26]),
                    sequence: parse_numeric(&p[26..46])?,
                }
            }
            SERVER_HEARTBEAT | END_OF_SESSION | CLIENT_HEARTBEAT | LOGOUT_REQUEST => {
                exact(0)?;
                match t {
                    SERVER_HEARTBEAT => PacketRepr::ServerHeartbeat,
                    END_OF_SESSION => PacketRepr::EndOfSession,
                    CLIENT_HEARTBEAT => PacketRepr::ClientHeartbeat,
                    _ => PacketRepr::LogoutRequest,
                }
            }
            _ => return Err(Error::UnknownType { protocol: Protocol::SoupBinTcp, msg_type: t }),
        })
    }

    /// The type byte.
    pub fn packet_type(&self) -> u8 {
        use packet_type::*;
        match self {
            PacketRepr::Debug(_) => DEBUG,
            PacketRepr::LoginAccepted { .. } => LOGIN_ACCEPTED,
            PacketRepr::LoginRejected { .. } => LOGIN_REJECTED,
            PacketRepr::SequencedData(_) => SEQUENCED_DATA,
            PacketRepr::ServerHeartbeat => SERVER_HEARTBEAT,
            PacketRepr::EndOfSession => END_OF_SESSION,
            PacketRepr::LoginRequest { .. } => LOGIN_REQUEST,
            PacketRepr::UnsequencedData(_) => UNSEQUENCED_DATA,
            PacketRepr::ClientHeartbeat => CLIENT_HEARTBEAT,
            PacketRepr::LogoutRequest => LOGOUT_REQUEST,
        }
    }

    fn payload_len(&self) -> usize {
        match self {
            PacketRepr::Debug(p) | PacketRepr::SequencedData(p) | PacketRepr::UnsequencedData(p) => p.len(),
            PacketRepr::LoginAccepted { .. } => LOGIN_ACCEPTED_LEN,
            PacketRepr::LoginRejected { .. } => 1,
            PacketRepr::LoginRequest { .. } => LOGIN_REQUEST_LEN,
            _ => 0,
        }
    }

    /// Bytes `emit` writes, length prefix included.
    pub fn buffer_len(&self) -> usize {
        LENGTH_PREFIX_LEN + 1 + self.payload_len()
    }

    /// Writes the whole packet, length prefix included.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let plen = self.payload_len();
        if plen > PAYLOAD_LEN_MAX {
            return Err(Error::Malformed { protocol: Protocol::SoupBinTcp, reason: "payload longer than 65534 bytes" });
        }
        let n = self.buffer_len();
        check_len(buf, n)?;
        buf[..2].copy_from_slice(&((plen + 1) as u16).to_be_bytes());
        buf[2] = self.packet_type();
        let p = &mut buf[3..n];
        match *self {
            PacketRepr::Debug(d) | PacketRepr::SequencedData(d) | PacketRepr::UnsequencedData(d) => {
                p.copy_from_slice(d)
            }
            PacketRepr::LoginAccepted { session, sequence } => {
                session.write(&mut p[..10]);
                emit_numeric(sequence, &mut p[10..30]);
            }
            PacketRepr::LoginRejected { reason } => p[0] = reason,
            PacketRepr::LoginRequest { username, password, session, sequence } => {
                username.write(&mut p[..6]);
                password.write(&mut p[6..16]);
                session.write(&mut p[16..26]);
                emit_numeric(sequence, &mut p[26..46]);
            }
            _ => {}
        }
        Ok(n)
    }
}

/// Parses a space-padded ASCII decimal; all blanks read as 0.
pub fn parse_numeric(b: &[u8]) -> Result<u64, Error> {
    let digits = b.trim_ascii();
    let mut v: u64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return Err(Error::Malformed { protocol: Protocol::SoupBinTcp, reason: "non-digit in numeric field" });
        }
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(c - b'0')))
            .ok_or(Error::Malformed { protocol: Protocol::SoupBinTcp, reason: "numeric field overflows u64" })?;
    }
    Ok(v)
}

/// Writes `v` right-justified in `b`, padded on the left with spaces.
/// `b` must hold at least 20 bytes (every u64 fits).
pub fn emit_numeric(mut v: u64, b: &mut [u8]) {
    debug_assert!(b.len() >= 20);
    b.fill(b' ');
    let mut i = b.len();
    loop {
        i -= 1;
        b[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_request_bytes() {
        let p = PacketRepr::LoginRequest {
            username: Alpha::from_str_padded("trader"),
            password: Alpha::from_str_padded("secret"),
            session: Alpha([b' '; 10]),
            sequence: 1,
        };
        let mut buf = [0xa5u8; 50];
        assert_eq!(p.emit(&mut buf), Ok(49));
        assert_eq!(&buf[..3], &[0, 47, b'L']);
        assert_eq!(&buf[3..9], b"trader");
        assert_eq!(&buf[9..19], b"secret    ");
        assert_eq!(&buf[29..49], b"                   1");
        assert_eq!(buf[49], 0xa5);
        assert_eq!(split_packet(&buf[..49]), Ok(Some((p, 49))));
        assert_eq!(split_packet(&buf[..48]), Ok(None));
    }

    #[test]
    fn bad_frames_are_typed_errors() {
        assert!(matches!(split_packet(&[0, 0]), Err(Error::Malformed { .. })));
        assert!(matches!(split_packet(&[0, 1, b'?']), Err(Error::UnknownType { .. })));
        assert!(matches!(split_packet(&[0, 2, b'H', 0]), Err(Error::BadLength { .. })));
        assert_eq!(split_packet(&[0]), Ok(None));
        let mut acc = [0u8; 33];
        PacketRepr::LoginAccepted { session: Alpha::from_str_left_padded("S1"), sequence: 9 }.emit(&mut acc).unwrap();
        acc[20] = b'x';
        assert!(matches!(split_packet(&acc), Err(Error::Malformed { .. })));
    }

    #[test]
    fn numeric_round_trip_extremes() {
        let mut b = [0u8; 20];
        for v in [0, 1, 10, 99_999, u64::MAX] {
            emit_numeric(v, &mut b);
            assert_eq!(parse_numeric(&b), Ok(v));
        }
        assert_eq!(parse_numeric(b"                    "), Ok(0));
        assert!(parse_numeric(b"99999999999999999999").is_err());
    }
}
