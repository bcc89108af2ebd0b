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
    /// Tagged with a key id this node does not hold (a rollover out of
    /// order, a retired key — or a forgery).
    UnknownKey,
}

impl core::fmt::Display for AuthError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            AuthError::Truncated => "truncated packet",
            AuthError::BadTag => "missing or wrong authentication tag",
            AuthError::Replayed => "replayed packet",
            AuthError::UnknownKey => "tagged with a key id this node does not hold",
        })
    }
}

impl std::error::Error for AuthError {}

/// Counters of refused packets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuthStats {
    /// Packets too short for a tag.
    pub truncated: u64,
    /// Packets whose tag does not verify.
    pub bad_tag: u64,
    /// Packets already seen (a replay).
    pub replayed: u64,
    /// Packets sealed with a key id the keyring does not hold.
    pub unknown_key: u64,
}

impl AuthStats {
    /// Adds `o`'s counts (a node of several trees sums its trees').
    pub fn add(&mut self, o: &AuthStats) {
        self.truncated += o.truncated;
        self.bad_tag += o.bad_tag;
        self.replayed += o.replayed;
        self.unknown_key += o.unknown_key;
    }

    /// Counts one refusal.
    pub fn count(&mut self, e: AuthError) {
        match e {
            AuthError::Truncated => self.truncated += 1,
            AuthError::BadTag => self.bad_tag += 1,
            AuthError::Replayed => self.replayed += 1,
            AuthError::UnknownKey => self.unknown_key += 1,
        }
    }
}

/// Why a key or a key file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A key that is not 64 hex digits.
    #[error("a key is 64 hex digits")]
    NotHex,
    /// An empty key.
    #[error("no key: a key is 64 hex digits")]
    Empty,
    /// A key file line that is neither `ID HEX` nor `ID HEX send`.
    #[error("line {0}: expected `ID HEX` or `ID HEX send`")]
    BadLine(usize),
    /// A key id that is not 0..=255.
    #[error("line {0}: key id {1:?} is not 0..=255")]
    BadId(usize, String),
    /// A key file line whose key is not 64 hex digits.
    #[error("line {0}: a key is 64 hex digits")]
    BadKeyAt(usize),
    /// A keyring of no keys or more than KEYS_MAX.
    #[error("a keyring holds 1 to {KEYS_MAX} keys, not {0}")]
    Count(usize),
    /// A key id given twice.
    #[error("key id {0} given twice")]
    Twice(u8),
    /// Two ids with the same key.
    #[error("key id {0} holds the same key as another id")]
    SameKey(u8),
    /// The key to seal with is not in the keyring.
    #[error("no key {0} to seal with")]
    NoSendKey(u8),
    /// Several keys and none marked to seal with.
    #[error("several keys: mark the one to seal with (`ID HEX send`)")]
    Unmarked,
    /// More than one key marked to seal with.
    #[error("more than one key marked send")]
    MarkedTwice,
}

/// A key's bytes from its text form: 64 hex digits (surrounding white space ignored).
pub fn key_from_hex(text: &str) -> Result<[u8; KEY_LEN], KeyError> {
    let t = text.trim();
    if t.len() != KEY_LEN * 2 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(KeyError::NotHex);
    }
    let mut key = [0u8; KEY_LEN];
    for (i, k) in key.iter_mut().enumerate() {
        *k = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).map_err(|_| KeyError::NotHex)?;
    }
    Ok(key)
}

/// Keys a keyring holds at most (a rollover needs two: the current and the next).
pub const KEYS_MAX: usize = 4;

/// A tree's keys — each under a one-byte id, one of them the key this node
/// seals with — and the freshness rule.
///
/// A packet names the key its tag was made with (header byte
/// [`overlay::KEY_ID_OFFSET`]); a node accepts every key it holds. So a
/// key is rolled over without stopping the feed: give every node the next
/// key beside the current one, then seal with the next, then drop the old
/// (docs/SECURITY.md, "Rotating the tree key").
#[derive(Clone)]
pub struct Auth {
    keys: Vec<(u8, [u8; KEY_LEN])>,
    send: u8,
    /// A packet older than this (its sender's time against ours) is refused, ns.
    pub max_age_ns: u64,
}

impl core::fmt::Debug for Auth {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Auth")
            .field("ids", &self.ids())
            .field("send", &self.send)
            .field("keys", &"<secret>")
            .field("max_age_ns", &self.max_age_ns)
            .finish()
    }
}

/// The same keys under the same ids, sealing with the same one.
impl PartialEq for Auth {
    fn eq(&self, o: &Self) -> bool {
        self.send == o.send && self.keys == o.keys && self.max_age_ns == o.max_age_ns
    }
}

impl Auth {
    /// One key, id 0.
    pub fn new(key: [u8; KEY_LEN]) -> Self {
        Auth { keys: vec![(0, key)], send: 0, max_age_ns: MAX_AGE_NS_DEFAULT }
    }

    /// Keys by id, sealing with `send` (one of them); at most [`KEYS_MAX`], ids distinct.
    pub fn keyring(keys: Vec<(u8, [u8; KEY_LEN])>, send: u8) -> Result<Self, KeyError> {
        if keys.is_empty() || keys.len() > KEYS_MAX {
            return Err(KeyError::Count(keys.len()));
        }
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].iter().any(|j| j.0 == k.0) {
                return Err(KeyError::Twice(k.0));
            }
            if keys[..i].iter().any(|j| j.1 == k.1) {
                return Err(KeyError::SameKey(k.0));
            }
        }
        if !keys.iter().any(|k| k.0 == send) {
            return Err(KeyError::NoSendKey(send));
        }
        Ok(Auth { keys, send, max_age_ns: MAX_AGE_NS_DEFAULT })
    }

    /// A key from its text form: 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        key_from_hex(text).map(Auth::new)
    }

    /// A key file's text: one key as 64 hex digits (id 0), or a keyring —
    /// one `ID HEX` per line (ID 0..=255), the key to seal with marked
    /// `ID HEX send` (needed when there are several), `#` comments and
    /// blank lines ignored. Errors name the line.
    pub fn from_text(text: &str) -> Result<Self, KeyError> {
        let lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.split('#').next().unwrap_or("").trim()))
            .filter(|(_, l)| !l.is_empty())
            .collect();
        if lines.is_empty() {
            return Err(KeyError::Empty);
        }
        if let [(_, one)] = lines[..] {
            if !one.contains(char::is_whitespace) {
                return Self::from_hex(one);
            }
        }
        let mut keys = Vec::new();
        let mut send = Vec::new();
        for (n, l) in lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (id, hex, mark) = match f[..] {
                [id, hex] => (id, hex, false),
                [id, hex, "send"] => (id, hex, true),
                _ => return Err(KeyError::BadLine(n)),
            };
            let id: u8 = id.parse().map_err(|_| KeyError::BadId(n, id.to_string()))?;
            keys.push((id, key_from_hex(hex).map_err(|_| KeyError::BadKeyAt(n))?));
            if mark {
                send.push(id);
            }
        }
        let send = match (&send[..], &keys[..]) {
            ([s], _) => *s,
            ([], [(only, _)]) => *only,
            ([], _) => return Err(KeyError::Unmarked),
            _ => return Err(KeyError::MarkedTwice),
        };
        Self::keyring(keys, send)
    }

    /// Whether one of its keys is `key` (to keep other secrets apart from it).
    pub fn holds(&self, key: &[u8; KEY_LEN]) -> bool {
        self.keys.iter().any(|k| &k.1 == key)
    }

    /// The ids held, in the file's order.
    pub fn ids(&self) -> Vec<u8> {
        self.keys.iter().map(|k| k.0).collect()
    }

    /// The id sealed with.
    pub fn send_id(&self) -> u8 {
        self.send
    }

    /// Another keyring in force, keeping this one's freshness rule.
    pub fn replace_keys(&mut self, other: &Auth) {
        self.keys.clone_from(&other.keys);
        self.send = other.send;
    }

    /// Some key is all zeros: a placeholder, not a secret.
    pub fn is_all_zero(&self) -> bool {
        self.keys.iter().any(|k| k.1.iter().all(|&b| b == 0))
    }

    fn key(&self, id: u8) -> Option<&[u8; KEY_LEN]> {
        self.keys.iter().find(|k| k.0 == id).map(|k| &k.1)
    }

    fn tag(key: &[u8; KEY_LEN], b: &[u8]) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(&b[..6]);
        h.update(&[0]);
        h.update(&b[7..]);
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        t
    }

    /// Sets the auth flag and the key id on the packet in `buf` (header +
    /// payload) and appends its tag.
    pub fn seal(&self, buf: &mut Vec<u8>) {
        assert!(buf.len() >= HEADER_LEN, "a packet has a header");
        buf[7] |= FLAG_AUTH;
        buf[overlay::KEY_ID_OFFSET] = self.send;
        let key = self.key(self.send).expect("the sealing key is held (checked in keyring)");
        let t = Self::tag(key, buf);
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
        let Some(key) = self.key(h.key_id) else { return Err(AuthError::UnknownKey) };
        let want = Self::tag(key, &b[..len]);
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

    #[test]
    fn a_keyring_accepts_every_key_it_holds_and_seals_with_the_marked_one() {
        let (old, new) = ([1u8; KEY_LEN], [2u8; KEY_LEN]);
        let before = Auth::new(old);
        let both_old = Auth::keyring(vec![(0, old), (1, new)], 0).unwrap();
        let both_new = Auth::keyring(vec![(0, old), (1, new)], 1).unwrap();
        let after = Auth::keyring(vec![(1, new)], 1).unwrap();
        let mut p = packet(1, 100);
        both_new.seal(&mut p);
        assert_eq!(overlay::HeaderRepr::parse(&p).unwrap().0.key_id, 1);
        assert!(both_old.open(&p, 200).is_ok() && after.open(&p, 200).is_ok());
        assert_eq!(before.open(&p, 200), Err(AuthError::UnknownKey), "a node that missed the rollover");
        let mut q = packet(2, 100);
        before.seal(&mut q);
        assert!(both_new.open(&q, 200).is_ok(), "old packets in flight still open during the window");
        assert_eq!(after.open(&q, 200), Err(AuthError::UnknownKey), "after it, the old key is gone");
        // The key id is covered by the tag: relabelling a packet breaks it.
        let mut r = p.clone();
        r[overlay::KEY_ID_OFFSET] = 0;
        assert_eq!(both_old.open(&r, 200), Err(AuthError::BadTag));
    }

    #[test]
    fn key_files_parse_as_one_key_or_a_keyring_and_bad_ones_name_the_line() {
        let (a, b) = ("ab".repeat(32), "cd".repeat(32));
        assert_eq!(Auth::from_text(&format!("{a}\n")).unwrap().ids(), vec![0]);
        let r = Auth::from_text(&format!("# rollover\n3 {a}\n4 {b} send  # the next\n\n")).unwrap();
        assert_eq!((r.ids(), r.send_id()), (vec![3, 4], 4));
        assert_eq!(Auth::from_text(&format!("7 {a}")).unwrap().send_id(), 7);
        for (text, want) in [
            (format!("1 {a}\n2 {b}"), "mark the one"),
            (format!("1 {a} send\n2 {b} send"), "more than one"),
            (format!("1 {a}\n1 {b} send"), "given twice"),
            (format!("1 {a}\n2 {a} send"), "same key"),
            (format!("300 {a}"), "line 1: key id"),
            (format!("1 {a}\n2 xyz send"), "line 2: a key is 64 hex"),
            (format!("1 {a} now"), "line 1: expected"),
            (String::new(), "no key"),
            ((0..5).map(|i| format!("{i} {:02x}{}\n", i, "0".repeat(62))).collect::<String>() + "", "mark"),
        ] {
            let e = Auth::from_text(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let five: String = (0..5)
            .map(|i| format!("{i} {:02x}{}{}\n", i + 1, "0".repeat(62), if i == 0 { " send" } else { "" }))
            .collect();
        assert_eq!(Auth::from_text(&five), Err(KeyError::Count(5)));
    }
}
