//! Keyed authentication of overlay packets.
//!
//! Every packet a node builds (data at the sender, reports at receivers and
//! proxies) carries a 16-byte tag after its payload: BLAKE3 in keyed mode over
//! the header and payload, with the hop byte — the one field proxies change
//! as they forward — counted as zero. A proxy therefore forwards the sender's
//! bytes unchanged and unsigned again; every node checks every packet.
//!
//! The key is one 32-byte secret per tree shared by its nodes (the exchange
//! operates the proxies; seed 000 §5). A node drops, and counts, packets
//! whose tag is missing or wrong (forged or corrupted), that are cut short,
//! or that are replays: authentic but sent longer ago than `max_age_ns`, or
//! older than the duplicate window. A replay of a packet still inside the
//! window is a duplicate like a hedged copy and is dropped as one.

use fairfeed_wire::overlay::{self, FLAG_AUTH, HEADER_LEN};

/// Bytes of the tag appended to each packet.
pub const TAG_LEN: usize = 16;
/// Bytes of a key.
pub const KEY_LEN: usize = 32;
/// Authentic packets sent longer ago than this are replays by default.
pub const MAX_AGE_NS_DEFAULT: u64 = 2_000_000_000;

/// Why a packet was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// Shorter than its header says, or no room for the tag.
    Truncated,
    /// No tag, or a tag that does not match: forged or corrupted.
    BadTag,
    /// Authentic but too old to be live.
    Replayed,
}

impl core::fmt::Display for AuthError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            AuthError::Truncated => "truncated packet",
            AuthError::BadTag => "missing or wrong authentication tag",
            AuthError::Replayed => "replayed packet",
        })
    }
}

impl std::error::Error for AuthError {}

/// Counters of refused packets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuthStats {
    pub truncated: u64,
    pub bad_tag: u64,
    pub replayed: u64,
}

impl AuthStats {
    pub fn count(&mut self, e: AuthError) {
        match e {
            AuthError::Truncated => self.truncated += 1,
            AuthError::BadTag => self.bad_tag += 1,
            AuthError::Replayed => self.replayed += 1,
        }
    }
}

/// A key's bytes from its text form: 64 hex digits (surrounding white space ignored).
pub fn key_from_hex(text: &str) -> Result<[u8; KEY_LEN], String> {
    let t = text.trim();
    if t.len() != KEY_LEN * 2 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("a key is {} hex digits", KEY_LEN * 2));
    }
    let mut key = [0u8; KEY_LEN];
    for (i, k) in key.iter_mut().enumerate() {
        *k = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(key)
}

/// A tree's key and the freshness rule.
#[derive(Clone)]
pub struct Auth {
    key: [u8; KEY_LEN],
    pub max_age_ns: u64,
}

impl core::fmt::Debug for Auth {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Auth").field("key", &"<secret>").field("max_age_ns", &self.max_age_ns).finish()
    }
}

impl Auth {
    pub fn new(key: [u8; KEY_LEN]) -> Self {
        Auth { key, max_age_ns: MAX_AGE_NS_DEFAULT }
    }

    /// A key from its text form: 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, String> {
        key_from_hex(text).map(Auth::new)
    }

    /// A key of zeros only: a placeholder, not a secret.
    pub fn is_all_zero(&self) -> bool {
        self.key.iter().all(|&b| b == 0)
    }

    fn tag(&self, b: &[u8]) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&b[..6]);
        h.update(&[0]);
        h.update(&b[7..]);
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        t
    }

    /// Sets the auth flag on the packet in `buf` (header + payload) and appends its tag.
    pub fn seal(&self, buf: &mut Vec<u8>) {
        assert!(buf.len() >= HEADER_LEN, "a packet has a header");
        buf[7] |= FLAG_AUTH;
        let t = self.tag(buf);
        buf.extend_from_slice(&t);
    }

    /// Checks the packet `b` received at `now` (on the receiver's clock);
    /// returns the length of the packet without its tag.
    pub fn open(&self, b: &[u8], now: u64) -> Result<usize, AuthError> {
        let (h, _) = overlay::HeaderRepr::parse(b).map_err(|_| AuthError::Truncated)?;
        let len = HEADER_LEN + usize::from(h.payload_len);
        if h.flags & FLAG_AUTH == 0 {
            return Err(AuthError::BadTag);
        }
        if b.len() != len + TAG_LEN {
            return Err(if b.len() < len + TAG_LEN { AuthError::Truncated } else { AuthError::BadTag });
        }
        let want = self.tag(&b[..len]);
        // Constant time: every byte compared whatever the first difference.
        let diff = want.iter().zip(&b[len..]).fold(0u8, |d, (x, y)| d | (x ^ y));
        if diff != 0 {
            return Err(AuthError::BadTag);
        }
        if now.saturating_sub(h.send_ns) > self.max_age_ns {
            return Err(AuthError::Replayed);
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_wire::overlay::{HeaderRepr, Kind};

    fn packet(seq: u64, send_ns: u64) -> Vec<u8> {
        let h = HeaderRepr {
            kind: Some(Kind::Data),
            sequence: seq,
            send_ns,
            deadline_ns: send_ns + 1000,
            payload_len: 5,
            ..HeaderRepr::default()
        };
        let mut b = vec![0u8; HEADER_LEN];
        h.emit(&mut b).unwrap();
        b.extend_from_slice(b"hello");
        b
    }

    #[test]
    fn sealed_packets_open_and_survive_hop_bumps() {
        let a = Auth::new([7; KEY_LEN]);
        let mut p = packet(1, 100);
        a.seal(&mut p);
        assert_eq!(a.open(&p, 200), Ok(HEADER_LEN + 5));
        overlay::bump_hop(&mut p);
        overlay::bump_hop(&mut p);
        assert_eq!(a.open(&p, 200), Ok(HEADER_LEN + 5));
    }

    #[test]
    fn every_single_bit_flip_and_cut_is_refused() {
        let a = Auth::new([7; KEY_LEN]);
        let mut p = packet(1, 100);
        a.seal(&mut p);
        for i in 0..p.len() {
            if i == 6 {
                continue; // the hop byte is not covered, by design
            }
            for bit in 0..8 {
                let mut q = p.clone();
                q[i] ^= 1 << bit;
                assert!(a.open(&q, 200).is_err(), "flip of byte {i} bit {bit} accepted");
            }
        }
        for n in 0..p.len() {
            assert!(a.open(&p[..n], 200).is_err(), "cut to {n} accepted");
        }
        let mut longer = p.clone();
        longer.push(0);
        assert_eq!(a.open(&longer, 200), Err(AuthError::BadTag));
    }

    #[test]
    fn wrong_key_unsigned_and_stale_packets_are_refused() {
        let a = Auth::new([7; KEY_LEN]);
        let mut p = packet(1, 100);
        Auth::new([8; KEY_LEN]).seal(&mut p);
        assert_eq!(a.open(&p, 200), Err(AuthError::BadTag));
        let plain = packet(1, 100);
        assert_eq!(a.open(&plain, 200), Err(AuthError::BadTag));
        let mut old = packet(2, 100);
        a.seal(&mut old);
        assert_eq!(a.open(&old, 100 + MAX_AGE_NS_DEFAULT + 1), Err(AuthError::Replayed));
    }

    #[test]
    fn keys_parse_from_hex() {
        let k = "00".repeat(31) + "ff";
        assert!(Auth::from_hex(&k).is_ok());
        assert!(Auth::from_hex("abc").is_err());
        assert!(Auth::from_hex(&"zz".repeat(32)).is_err());
    }
}
