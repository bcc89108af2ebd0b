//! The one error type of every decoder in this crate.
//!
//! Each variant names what was wrong precisely enough to count it (see
//! [`Error::kind`]) and to show a user where the bytes went bad. Decoders never
//! panic and never read out of bounds: every check happens before any field is
//! read.

use core::fmt;

/// Why a buffer could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer ends before a fixed-size header or field does.
    Truncated {
        /// Bytes the header or field needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// A message type byte this protocol does not define.
    UnknownType {
        /// Whose message.
        protocol: Protocol,
        /// The type byte.
        msg_type: u8,
    },
    /// A known message type whose length differs from the specification.
    BadLength {
        /// Whose message.
        protocol: Protocol,
        /// The type byte.
        msg_type: u8,
        /// The specification's length.
        expected: usize,
        /// The message's.
        actual: usize,
    },
    /// A length prefix or count claims more bytes than the packet holds.
    Overrun {
        /// Bytes claimed.
        needed: usize,
        /// Bytes there.
        available: usize,
    },
    /// A packet header is self-inconsistent (for example a MoldUDP64 heartbeat
    /// or end-of-session packet with a payload).
    Malformed {
        /// Whose header.
        protocol: Protocol,
        /// What is inconsistent.
        reason: &'static str,
    },
    /// Bytes left over after the last message a header announced.
    TrailingBytes {
        /// Whose packet.
        protocol: Protocol,
        /// How many bytes are left over.
        extra: usize,
    },
    /// The frame is valid but not what we decode (not IPv4, not UDP, an IP fragment...).
    Unsupported {
        /// What it is instead.
        reason: &'static str,
    },
}

/// The protocol a decoder error belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// MoldUDP64 packets.
    MoldUdp64,
    /// NASDAQ TotalView-ITCH 5.0 messages.
    Itch50,
    /// SoupBinTCP packets.
    SoupBinTcp,
    /// OUCH 5.0 messages.
    Ouch50,
    /// Ethernet / IPv4 / UDP frames.
    Frame,
    /// fairfeed's overlay header.
    Overlay,
}

impl Error {
    /// A short stable name for counters and JSON reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Truncated { .. } => "truncated",
            Error::UnknownType { .. } => "unknown_type",
            Error::BadLength { .. } => "bad_length",
            Error::Overrun { .. } => "overrun",
            Error::Malformed { .. } => "malformed",
            Error::TrailingBytes { .. } => "trailing_bytes",
            Error::Unsupported { .. } => "unsupported",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::MoldUdp64 => "MoldUDP64",
            Protocol::Itch50 => "ITCH 5.0",
            Protocol::SoupBinTcp => "SoupBinTCP",
            Protocol::Ouch50 => "OUCH 5.0",
            Protocol::Frame => "Ethernet/IPv4/UDP",
            Protocol::Overlay => "fairfeed overlay",
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated { needed, available } => {
                write!(f, "truncated: need {needed} bytes, have {available}")
            }
            Error::UnknownType { protocol, msg_type } => {
                write!(f, "{protocol}: unknown message type {}", Printable(msg_type))
            }
            Error::BadLength { protocol, msg_type, expected, actual } => {
                write!(f, "{protocol}: message type {} must be {expected} bytes, got {actual}", Printable(msg_type))
            }
            Error::Overrun { needed, available } => {
                write!(f, "length overruns packet: need {needed} bytes, have {available}")
            }
            Error::Malformed { protocol, reason } => write!(f, "{protocol}: {reason}"),
            Error::TrailingBytes { protocol, extra } => {
                write!(f, "{protocol}: {extra} trailing bytes after the last message")
            }
            Error::Unsupported { reason } => write!(f, "unsupported frame: {reason}"),
        }
    }
}

impl core::error::Error for Error {}

/// Shows a type byte as `'A'` when printable, else as `0x1f`.
struct Printable(u8);

impl fmt::Display for Printable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_ascii_graphic() {
            write!(f, "'{}'", self.0 as char)
        } else {
            write!(f, "0x{:02x}", self.0)
        }
    }
}

/// Checks that `buf` holds at least `needed` bytes.
#[inline]
pub(crate) fn check_len(buf: &[u8], needed: usize) -> Result<(), Error> {
    if buf.len() < needed {
        Err(Error::Truncated { needed, available: buf.len() })
    } else {
        Ok(())
    }
}
