//! Fixed-width big-endian field types shared by the ITCH and OUCH codecs.
//!
//! A [`Field`] knows its width, reads itself from exactly that many bytes and
//! writes itself into exactly that many. Message views slice a fixed-size array
//! at constant offsets, so every read below is bounds-checked at compile time.

use core::fmt;

/// A fixed-width field of a binary message.
pub trait Field: Copy {
    /// Width on the wire in bytes.
    const LEN: usize;
    /// Reads the field from `b`, which is exactly `LEN` bytes long.
    fn read(b: &[u8]) -> Self;
    /// Writes the field into `b`, which is exactly `LEN` bytes long.
    fn write(self, b: &mut [u8]);
    /// The field as a generic value, for printing and JSON.
    fn value(self) -> FieldValue;
}

/// A field value of any type, for generic printing (`fairfeed decode`) and
/// comparison against independent decoders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValue {
    /// An unsigned integer (counts, shares, references, times).
    Uint(u64),
    /// A signed integer.
    Int(i64),
    /// A one-byte alphanumeric code (side, event code, flags).
    Char(u8),
    /// A fixed-point price: `raw / 10^decimals`.
    Price {
        /// The integer as written.
        raw: i64,
        /// Digits after the point (4 for ITCH `Price(4)`, 8 for `Price(8)`).
        decimals: u8,
    },
    /// Space-padded text (stock symbol, MPID, reason), up to 20 bytes.
    Text {
        /// The bytes, padding included.
        bytes: [u8; TEXT_MAX],
        /// How many of `bytes` are the field's.
        len: u8,
    },
}

/// Longest text field in any codec here (SoupBinTCP's 20-byte sequence field).
pub const TEXT_MAX: usize = 20;

macro_rules! uint_field {
    ($t:ty, $n:literal) => {
        impl Field for $t {
            const LEN: usize = $n;
            #[inline(always)]
            fn read(b: &[u8]) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(&b[..$n]);
                <$t>::from_be_bytes(a)
            }
            #[inline(always)]
            fn write(self, b: &mut [u8]) {
                b[..$n].copy_from_slice(&self.to_be_bytes());
            }
            fn value(self) -> FieldValue {
                FieldValue::Uint(self as u64)
            }
        }
    };
}
uint_field!(u16, 2);
uint_field!(u32, 4);
uint_field!(u64, 8);

/// A one-byte alphanumeric code.
impl Field for u8 {
    const LEN: usize = 1;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        b[0]
    }
    #[inline(always)]
    fn write(self, b: &mut [u8]) {
        b[0] = self;
    }
    fn value(self) -> FieldValue {
        FieldValue::Char(self)
    }
}

/// The 6-byte nanoseconds-since-midnight timestamp of ITCH 5.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp48(pub u64);

impl Timestamp48 {
    /// Largest value 6 bytes hold.
    pub const MAX: u64 = (1 << 48) - 1;
}

impl Field for Timestamp48 {
    const LEN: usize = 6;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        let mut a = [0u8; 8];
        a[2..].copy_from_slice(&b[..6]);
        Timestamp48(u64::from_be_bytes(a))
    }
    #[inline(always)]
    fn write(self, b: &mut [u8]) {
        b[..6].copy_from_slice(&self.0.to_be_bytes()[2..]);
    }
    fn value(self) -> FieldValue {
        FieldValue::Uint(self.0)
    }
}

/// A 4-byte price with 4 implied decimals (ITCH `Price(4)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Price4(pub u32);

/// An 8-byte price with 8 implied decimals (ITCH `Price(8)`, MWCB levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Price8(pub u64);

/// An 8-byte signed price with 4 implied decimals (OUCH 5.0 `Price`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct OuchPrice(pub i64);

macro_rules! price_field {
    ($t:ident, $inner:ty, $n:literal, $dec:literal) => {
        impl $t {
            /// Implied decimal places.
            pub const DECIMALS: u8 = $dec;
            /// The price as a float (for display and statistics only).
            pub fn as_f64(self) -> f64 {
                self.0 as f64 / (10u64.pow($dec) as f64)
            }
        }
        impl Field for $t {
            const LEN: usize = $n;
            #[inline(always)]
            fn read(b: &[u8]) -> Self {
                $t(<$inner as FromBe>::from_be(b))
            }
            #[inline(always)]
            fn write(self, b: &mut [u8]) {
                b[..$n].copy_from_slice(&self.0.to_be_bytes());
            }
            fn value(self) -> FieldValue {
                FieldValue::Price { raw: self.0 as i64, decimals: $dec }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt_fixed(f, self.0 as i64, $dec)
            }
        }
    };
}

trait FromBe {
    fn from_be(b: &[u8]) -> Self;
}
impl FromBe for u32 {
    #[inline(always)]
    fn from_be(b: &[u8]) -> Self {
        <u32 as Field>::read(b)
    }
}
impl FromBe for u64 {
    #[inline(always)]
    fn from_be(b: &[u8]) -> Self {
        <u64 as Field>::read(b)
    }
}
impl FromBe for i64 {
    #[inline(always)]
    fn from_be(b: &[u8]) -> Self {
        <u64 as Field>::read(b) as i64
    }
}

price_field!(Price4, u32, 4, 4);
price_field!(Price8, u64, 8, 8);
price_field!(OuchPrice, i64, 8, 4);

/// Writes `raw / 10^decimals` exactly, without floating point.
pub fn fmt_fixed(f: &mut fmt::Formatter<'_>, raw: i64, decimals: u8) -> fmt::Result {
    let scale = 10u64.pow(u32::from(decimals));
    let sign = if raw < 0 { "-" } else { "" };
    let abs = raw.unsigned_abs();
    write!(f, "{sign}{}.{:0width$}", abs / scale, abs % scale, width = decimals as usize)
}

/// Space-padded alphanumeric text of a fixed width (stock symbols, MPIDs).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Alpha<const N: usize>(pub [u8; N]);

/// An 8-byte stock symbol, left-justified and space-padded.
pub type Stock = Alpha<8>;

impl<const N: usize> Alpha<N> {
    /// Left-justifies `s` and pads with spaces; longer input is cut at `N` bytes.
    pub fn from_str_padded(s: &str) -> Self {
        let mut a = [b' '; N];
        let n = s.len().min(N);
        a[..n].copy_from_slice(&s.as_bytes()[..n]);
        Alpha(a)
    }

    /// Right-justifies `s` and pads on the left with spaces (SoupBinTCP numbers and sessions).
    pub fn from_str_left_padded(s: &str) -> Self {
        let mut a = [b' '; N];
        let n = s.len().min(N);
        a[N - n..].copy_from_slice(&s.as_bytes()[..n]);
        Alpha(a)
    }

    /// The bytes without surrounding padding.
    pub fn trimmed(&self) -> &[u8] {
        self.0.trim_ascii()
    }

    /// The text without padding, or `None` if it is not UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        core::str::from_utf8(self.trimmed()).ok()
    }
}

impl<const N: usize> Default for Alpha<N> {
    fn default() -> Self {
        Alpha([b' '; N])
    }
}

impl<const N: usize> Field for Alpha<N> {
    const LEN: usize = N;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        let mut a = [0u8; N];
        a.copy_from_slice(&b[..N]);
        Alpha(a)
    }
    #[inline(always)]
    fn write(self, b: &mut [u8]) {
        b[..N].copy_from_slice(&self.0);
    }
    fn value(self) -> FieldValue {
        let mut bytes = [0u8; TEXT_MAX];
        let t = self.trimmed();
        let len = t.len().min(TEXT_MAX);
        bytes[..len].copy_from_slice(&t[..len]);
        FieldValue::Text { bytes, len: len as u8 }
    }
}

impl<const N: usize> fmt::Debug for Alpha<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self)
    }
}

impl<const N: usize> fmt::Display for Alpha<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &c in self.trimmed() {
            if c.is_ascii_graphic() || c == b' ' {
                write!(f, "{}", c as char)?;
            } else {
                write!(f, "\\x{c:02x}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for FieldValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FieldValue::Uint(v) => write!(f, "{v}"),
            FieldValue::Int(v) => write!(f, "{v}"),
            FieldValue::Char(c) if c.is_ascii_graphic() || c == b' ' => write!(f, "{}", c as char),
            FieldValue::Char(c) => write!(f, "\\x{c:02x}"),
            FieldValue::Price { raw, decimals } => fmt_fixed(f, raw, decimals),
            FieldValue::Text { bytes, len } => {
                for &c in &bytes[..len as usize] {
                    if c.is_ascii_graphic() || c == b' ' {
                        write!(f, "{}", c as char)?;
                    } else {
                        write!(f, "\\x{c:02x}")?;
                    }
                }
                Ok(())
            }
        }
    }
}
