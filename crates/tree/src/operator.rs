//! Control commands authenticated under the operator's key.
//!
//! Every control socket (a node's `--control`, the arbitrator's) takes one
//! command per datagram. A command that changes anything — `stop`, the
//! arbitrator's `mode`/`max-hold-us`/`max-count` — is obeyed only when it
//! comes sealed under the operator key, a 32-byte secret of its own (never
//! the tree's data key: a proxy that holds the data key cannot stop its
//! peers). Read-only queries (`stat`, `releases`, `stats`) are answered to
//! loopback, or to sealed requests.
//!
//! A sealed command is one line of text, so it stays readable in a capture:
//!
//! ```text
//! ffauth1 <unix ns> <nonce: 32 hex> <to: HOST:PORT> <mac: 32 hex> <command>
//! ```
//!
//! The MAC is BLAKE3 in keyed mode, under a key derived from the operator
//! key for this use only, over the version, the time, the nonce, the
//! control address it was sent to and the command — so a command cannot be
//! moved to another time, nonce, node or verb. A socket admits only seals
//! addressed to its own port (and its own IP, unless it is bound to all).
//! The answer to a sealed command is sealed too —
//! `ffreply1 <nonce> <mac> <body>`, the MAC over the request's nonce and the body — so an operator
//! can tell a node's answer from one an attacker sent in its name
//! ([`OperatorKey::open_reply`]). Refusals are not sealed (the command was
//! not admitted) and say so.
//!
//! A [`Verifier`] refuses, and counts, commands that are unsealed where a
//! seal is needed, malformed, wrongly sealed, stale (more than
//! [`SKEW_MAX_NS`] from its clock either way) or replayed (a nonce it saw
//! within that window). It is a pure state machine: the time is an
//! argument, as everywhere in this crate.

use std::collections::{HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};

use crate::auth::KEY_LEN;

/// What starts a sealed command.
pub const PREFIX: &str = "ffauth1 ";
/// What starts a sealed answer.
pub const REPLY_PREFIX: &str = "ffreply1 ";
/// A sealed command's time may differ from the verifier's clock by this much
/// either way (the operator's host and the node's need only rough agreement).
pub const SKEW_MAX_NS: u64 = 30_000_000_000;
/// Nonces remembered at most (only sealed commands enter, so only a key
/// holder can fill it; when full, further commands are refused as busy
/// until the oldest expire).
pub const NONCES_MAX: usize = 16_384;
/// Bytes of a nonce and of a MAC.
pub const NONCE_LEN: usize = 16;
/// Bytes of a MAC.
pub const MAC_LEN: usize = 16;
/// The context the MAC key is derived under (BLAKE3 `derive_key`).
const CONTEXT: &str = "fairfeed 2026-11-28 operator control command v1";

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A command that changes something, or a query from beyond loopback, without a seal.
    #[error("not authenticated: this command needs the operator key (--key-file)")]
    Unauthenticated,
    /// Sealed, but this socket has no operator key to check it with.
    #[error("this node has no operator key (--operator-key-file): sealed commands cannot be checked")]
    NoKey,
    /// The seal's fields do not parse.
    #[error("malformed sealed command")]
    Malformed,
    /// The MAC does not match: another key, or altered on the way.
    #[error("wrong MAC: another key, or the command was altered")]
    BadMac,
    /// Sealed too long ago or too far ahead (replay, or clocks apart).
    #[error("stale: the command's time is more than 30 s from this host's clock")]
    Stale,
    /// A nonce already used within the window.
    #[error("replayed: this nonce was used already")]
    Replayed,
    /// Sealed for another control address (a command captured on its way to another node).
    #[error("sealed for another control address")]
    OtherAddress,
    /// Too many recent nonces to remember another.
    #[error("busy: too many recent commands")]
    Busy,
}

/// Commands accepted and refused, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuthCounters {
    /// Sealed commands accepted.
    pub sealed: u64,
    /// Unsealed queries answered (from loopback).
    pub loopback: u64,
    /// Refused: not authenticated.
    pub unauthenticated: u64,
    /// Refused: sealed, and no operator key here.
    pub no_key: u64,
    /// Refused: malformed seal.
    pub malformed: u64,
    /// Refused: wrong MAC.
    pub bad_mac: u64,
    /// Refused: stale.
    pub stale: u64,
    /// Refused: replayed nonce.
    pub replayed: u64,
    /// Refused: sealed for another control address.
    pub other_address: u64,
    /// Refused: too many recent nonces to remember another.
    pub busy: u64,
}

impl AuthCounters {
    /// Commands refused, all reasons together.
    pub fn refused(&self) -> u64 {
        self.unauthenticated
            + self.no_key
            + self.malformed
            + self.bad_mac
            + self.stale
            + self.replayed
            + self.other_address
            + self.busy
    }

    fn count(&mut self, r: Refusal) {
        *match r {
            Refusal::Unauthenticated => &mut self.unauthenticated,
            Refusal::NoKey => &mut self.no_key,
            Refusal::Malformed => &mut self.malformed,
            Refusal::BadMac => &mut self.bad_mac,
            Refusal::Stale => &mut self.stale,
            Refusal::Replayed => &mut self.replayed,
            Refusal::OtherAddress => &mut self.other_address,
            Refusal::Busy => &mut self.busy,
        } += 1;
    }
}

/// The operator's key (the MAC key derived from it; never shown).
#[derive(Clone)]
pub struct OperatorKey([u8; 32]);

impl core::fmt::Debug for OperatorKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("OperatorKey(<secret>)")
    }
}

impl OperatorKey {
    /// The key derived from `key`'s 32 bytes.
    pub fn new(key: [u8; KEY_LEN]) -> Self {
        OperatorKey(blake3::derive_key(CONTEXT, &key))
    }

    /// A key from its text form: 64 hex digits (as the tree key).
    pub fn from_hex(text: &str) -> Result<Self, crate::auth::KeyError> {
        crate::auth::key_from_hex(text).map(OperatorKey::new)
    }

    fn mac(&self, ts_ns: u64, nonce: &[u8; NONCE_LEN], to: SocketAddr, command: &str) -> [u8; MAC_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(PREFIX.as_bytes());
        h.update(&ts_ns.to_le_bytes());
        h.update(nonce);
        let to = to.to_string();
        h.update(&(to.len() as u64).to_le_bytes());
        h.update(to.as_bytes());
        h.update(command.as_bytes());
        let mut m = [0u8; MAC_LEN];
        m.copy_from_slice(&h.finalize().as_bytes()[..MAC_LEN]);
        m
    }

    /// A tag over `body` in `domain` (a message type of its own, e.g. the
    /// sender's deadline records).
    pub fn tag(&self, domain: &[u8], body: &[u8]) -> [u8; MAC_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(&(domain.len() as u64).to_le_bytes());
        h.update(domain);
        h.update(body);
        let mut m = [0u8; MAC_LEN];
        m.copy_from_slice(&h.finalize().as_bytes()[..MAC_LEN]);
        m
    }

    fn reply_mac(&self, nonce: &[u8; NONCE_LEN], body: &[u8]) -> [u8; MAC_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(REPLY_PREFIX.as_bytes());
        h.update(nonce);
        h.update(body);
        let mut m = [0u8; MAC_LEN];
        m.copy_from_slice(&h.finalize().as_bytes()[..MAC_LEN]);
        m
    }

    /// The answer `body` to the sealed command that carried `nonce`.
    pub fn seal_reply(&self, nonce: &[u8; NONCE_LEN], body: &[u8]) -> Vec<u8> {
        let mut out = format!("{REPLY_PREFIX}{} {} ", hex(nonce), hex(&self.reply_mac(nonce, body))).into_bytes();
        out.extend_from_slice(body);
        out
    }

    /// A sealed answer's nonce (which request it answers) and body.
    pub fn open_reply<'a>(&self, datagram: &'a [u8]) -> Result<([u8; NONCE_LEN], &'a [u8]), Refusal> {
        let rest = datagram.strip_prefix(REPLY_PREFIX.as_bytes()).ok_or(Refusal::Unauthenticated)?;
        let field = |b: &'a [u8], n: usize| b.get(..n).and_then(|f| std::str::from_utf8(f).ok());
        let nonce = field(rest, 2 * NONCE_LEN).and_then(unhex::<NONCE_LEN>).ok_or(Refusal::Malformed)?;
        let rest = rest.get(2 * NONCE_LEN + 1..).ok_or(Refusal::Malformed)?;
        let mac = field(rest, 2 * MAC_LEN).and_then(unhex::<MAC_LEN>).ok_or(Refusal::Malformed)?;
        let body = rest.get(2 * MAC_LEN + 1..).ok_or(Refusal::Malformed)?;
        let want = self.reply_mac(&nonce, body);
        if want.iter().zip(&mac).fold(0u8, |d, (x, y)| d | (x ^ y)) != 0 {
            return Err(Refusal::BadMac);
        }
        Ok((nonce, body))
    }

    /// `command` for the control socket at `to`, sealed at wall time
    /// `now_ns` with `nonce` (fresh random bytes per command).
    pub fn seal(&self, now_ns: u64, nonce: [u8; NONCE_LEN], to: SocketAddr, command: &str) -> String {
        let command = command.trim();
        let mac = hex(&self.mac(now_ns, &nonce, to, command));
        format!("{PREFIX}{now_ns} {} {to} {mac} {command}", hex(&nonce))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A sealed command's fields, borrowed from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed<'a> {
    /// When it was sealed (wall ns).
    pub ts_ns: u64,
    /// Its nonce.
    pub nonce: [u8; NONCE_LEN],
    /// The control address it was sealed for.
    pub to: SocketAddr,
    /// Its MAC.
    pub mac: [u8; MAC_LEN],
    /// The command itself.
    pub command: &'a str,
}

impl<'a> Sealed<'a> {
    /// The fields of `text` (which starts with [`PREFIX`]).
    pub fn parse(text: &'a str) -> Result<Self, Refusal> {
        let rest = text.strip_prefix(PREFIX).ok_or(Refusal::Malformed)?;
        let mut it = rest.splitn(5, ' ');
        let ts_ns = it.next().and_then(|t| t.parse::<u64>().ok()).ok_or(Refusal::Malformed)?;
        let nonce = it.next().and_then(unhex::<NONCE_LEN>).ok_or(Refusal::Malformed)?;
        let to = it.next().and_then(|t| t.parse::<SocketAddr>().ok()).ok_or(Refusal::Malformed)?;
        let mac = it.next().and_then(unhex::<MAC_LEN>).ok_or(Refusal::Malformed)?;
        let command = it.next().map(str::trim).filter(|c| !c.is_empty()).ok_or(Refusal::Malformed)?;
        Ok(Sealed { ts_ns, nonce, to, mac, command })
    }
}

/// Whether a command only reads or changes something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// It only reads.
    Read,
    /// It changes something.
    Change,
}

/// A command admitted, and the nonce it was sealed with (`None`: an unsealed query from loopback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted<'a> {
    /// The command.
    pub command: &'a str,
    /// The nonce it was sealed with (`None`: an unsealed query from loopback).
    pub sealed: Option<[u8; NONCE_LEN]>,
}

/// Checks control commands for one socket.
#[derive(Debug)]
pub struct Verifier {
    key: Option<OperatorKey>,
    /// The socket's own address: seals must be addressed to it.
    local: Option<SocketAddr>,
    /// Nonces of sealed commands accepted, and the order to forget them in.
    seen: HashSet<[u8; NONCE_LEN]>,
    order: VecDeque<(u64, [u8; NONCE_LEN])>,
    /// Commands accepted and refused.
    pub counters: AuthCounters,
}

impl Verifier {
    /// Checks commands for the socket at `local` (`None`: any address; tests).
    pub fn new(key: Option<OperatorKey>, local: Option<SocketAddr>) -> Self {
        Verifier { key, local, seen: HashSet::new(), order: VecDeque::new(), counters: AuthCounters::default() }
    }

    /// Whether a seal addressed to `to` is for this socket: its port, and
    /// its IP unless it is bound to all of the host's.
    fn for_me(&self, to: SocketAddr) -> bool {
        self.local.is_none_or(|l| l.port() == to.port() && (l.ip().is_unspecified() || l.ip() == to.ip()))
    }

    /// Whether it has an operator key (to check seals with).
    pub fn has_key(&self) -> bool {
        self.key.is_some()
    }

    /// The datagram that answers `body` to an admitted command: sealed when it was.
    pub fn answer(&self, admitted_nonce: Option<[u8; NONCE_LEN]>, body: &[u8]) -> Vec<u8> {
        match (admitted_nonce, &self.key) {
            (Some(n), Some(k)) => k.seal_reply(&n, body),
            _ => body.to_vec(),
        }
    }

    /// Admits the datagram `text` from `from` at wall time `now_ns`, where
    /// `access` tells what its command does: a change needs a seal; a query
    /// needs a seal unless it comes from loopback. Counts every outcome.
    pub fn admit<'a>(
        &mut self,
        now_ns: u64,
        text: &'a str,
        from: IpAddr,
        access: impl Fn(&str) -> Access,
    ) -> Result<Admitted<'a>, Refusal> {
        let r = self.check(now_ns, text.trim(), from, access);
        match r {
            Ok(a) if a.sealed.is_some() => self.counters.sealed += 1,
            Ok(_) => self.counters.loopback += 1,
            Err(e) => self.counters.count(e),
        }
        r
    }

    fn check<'a>(
        &mut self,
        now_ns: u64,
        text: &'a str,
        from: IpAddr,
        access: impl Fn(&str) -> Access,
    ) -> Result<Admitted<'a>, Refusal> {
        if !text.starts_with(PREFIX) {
            return match (access(text), from.is_loopback()) {
                (Access::Read, true) => Ok(Admitted { command: text, sealed: None }),
                _ => Err(Refusal::Unauthenticated),
            };
        }
        let s = Sealed::parse(text)?;
        let key = self.key.as_ref().ok_or(Refusal::NoKey)?;
        let want = key.mac(s.ts_ns, &s.nonce, s.to, s.command);
        // Constant time: every byte compared whatever the first difference.
        if want.iter().zip(&s.mac).fold(0u8, |d, (x, y)| d | (x ^ y)) != 0 {
            return Err(Refusal::BadMac);
        }
        if now_ns.abs_diff(s.ts_ns) > SKEW_MAX_NS {
            return Err(Refusal::Stale);
        }
        if !self.for_me(s.to) {
            return Err(Refusal::OtherAddress);
        }
        self.forget_before(now_ns.saturating_sub(SKEW_MAX_NS));
        if self.seen.contains(&s.nonce) {
            return Err(Refusal::Replayed);
        }
        if self.seen.len() >= NONCES_MAX {
            return Err(Refusal::Busy);
        }
        self.seen.insert(s.nonce);
        self.order.push_back((s.ts_ns, s.nonce));
        Ok(Admitted { command: s.command, sealed: Some(s.nonce) })
    }

    /// Forgets nonces of commands sealed before `t` (a replay of them is stale).
    fn forget_before(&mut self, t: u64) {
        // `order` is by arrival; a command sealed earlier than one before it
        // stays until that one goes — kept a little long, never too short.
        while let Some(&(ts, n)) = self.order.front() {
            if ts >= t {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&n);
        }
        debug_assert!(self.seen.len() <= NONCES_MAX);
    }
}

/// A control address beyond loopback without an operator key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "control address {0} is reachable beyond this host: give --operator-key-file FILE (else anyone who can send \
     it a datagram could query it), or bind it to 127.0.0.1"
)]
pub struct ExposedControl(pub SocketAddr);

/// Whether a control socket at `addr` may be bound: beyond loopback only
/// with an operator key (anyone who can reach it could otherwise stop the
/// node).
pub fn check_bind(addr: SocketAddr, has_key: bool) -> Result<(), ExposedControl> {
    if addr.ip().is_loopback() || has_key {
        return Ok(());
    }
    Err(ExposedControl(addr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: u64 = 1_800_000_000_000_000_000;

    fn key(b: u8) -> OperatorKey {
        OperatorKey::new([b; KEY_LEN])
    }

    fn access(c: &str) -> Access {
        if c == "stat" {
            Access::Read
        } else {
            Access::Change
        }
    }

    fn to() -> SocketAddr {
        "10.0.0.9:7000".parse().unwrap()
    }

    fn lo() -> IpAddr {
        "127.0.0.1".parse().unwrap()
    }

    fn far() -> IpAddr {
        "10.1.2.3".parse().unwrap()
    }

    #[test]
    fn sealed_commands_are_admitted_once_and_refused_when_replayed_stale_or_altered() {
        let mut v = Verifier::new(Some(key(1)), None);
        let s = key(1).seal(T, [9; NONCE_LEN], to(), "stop");
        assert_eq!(v.admit(T + 5, &s, far(), access), Ok(Admitted { command: "stop", sealed: Some([9; NONCE_LEN]) }));
        assert_eq!(v.admit(T + 6, &s, far(), access), Err(Refusal::Replayed));
        let old = key(1).seal(T - SKEW_MAX_NS - 1, [1; NONCE_LEN], to(), "stop");
        assert_eq!(v.admit(T, &old, far(), access), Err(Refusal::Stale));
        let ahead = key(1).seal(T + SKEW_MAX_NS + 1, [2; NONCE_LEN], to(), "stop");
        assert_eq!(v.admit(T, &ahead, far(), access), Err(Refusal::Stale));
        let other = key(2).seal(T, [3; NONCE_LEN], to(), "stop");
        assert_eq!(v.admit(T, &other, far(), access), Err(Refusal::BadMac));
        let moved = key(1).seal(T, [4; NONCE_LEN], to(), "mode time").replace("mode time", "mode count");
        assert_eq!(v.admit(T, &moved, far(), access), Err(Refusal::BadMac), "the verb is covered");
        let retimed = key(1).seal(T, [5; NONCE_LEN], to(), "stop").replacen(&T.to_string(), &(T + 1).to_string(), 1);
        assert_eq!(v.admit(T, &retimed, far(), access), Err(Refusal::BadMac), "the time is covered");
        assert_eq!(v.admit(T, "ffauth1 12 zz", far(), access), Err(Refusal::Malformed));
        let c = v.counters;
        assert_eq!((c.sealed, c.replayed, c.stale, c.bad_mac, c.malformed), (1, 1, 2, 3, 1));
        assert_eq!(c.refused(), 7);
    }

    #[test]
    fn unsealed_queries_only_from_loopback_and_unsealed_changes_never() {
        let mut v = Verifier::new(Some(key(1)), None);
        assert_eq!(v.admit(T, "stat\n", lo(), access), Ok(Admitted { command: "stat", sealed: None }));
        assert_eq!(v.admit(T, "stat", far(), access), Err(Refusal::Unauthenticated));
        assert_eq!(v.admit(T, "stop", lo(), access), Err(Refusal::Unauthenticated));
        let sealed_query = key(1).seal(T, [7; NONCE_LEN], to(), "stat");
        assert!(v.admit(T, &sealed_query, far(), access).is_ok());
        // Without a key: loopback queries still work; nothing sealed can be checked.
        let mut none = Verifier::new(None, None);
        assert!(none.admit(T, "stat", lo(), access).is_ok());
        assert_eq!(none.admit(T, &key(1).seal(T, [8; NONCE_LEN], to(), "stop"), lo(), access), Err(Refusal::NoKey));
        assert_eq!(none.admit(T, "stop", lo(), access), Err(Refusal::Unauthenticated));
    }

    #[test]
    fn nonces_are_forgotten_once_their_commands_are_stale_and_the_table_is_bounded() {
        let mut v = Verifier::new(Some(key(1)), None);
        for i in 0..NONCES_MAX as u64 {
            let mut n = [0u8; NONCE_LEN];
            n[..8].copy_from_slice(&i.to_le_bytes());
            assert!(v.admit(T, &key(1).seal(T, n, to(), "stop"), far(), access).is_ok());
        }
        let next = key(1).seal(T, [0xee; NONCE_LEN], to(), "stop");
        assert_eq!(v.admit(T, &next, far(), access), Err(Refusal::Busy));
        // Once those are stale they go, and the table takes new ones.
        let later = T + SKEW_MAX_NS + 1;
        let fresh = key(1).seal(later, [0xee; NONCE_LEN], to(), "stop");
        assert!(v.admit(later, &fresh, far(), access).is_ok());
        assert_eq!(v.seen.len(), 1);
    }

    #[test]
    fn a_seal_for_one_control_address_is_refused_at_another() {
        let at = |a: &str| Verifier::new(Some(key(1)), Some(a.parse().unwrap()));
        let s = key(1).seal(T, [1; NONCE_LEN], to(), "stop");
        assert!(at("10.0.0.9:7000").admit(T, &s, far(), access).is_ok());
        assert!(at("0.0.0.0:7000").admit(T, &s, far(), access).is_ok(), "bound to all: the port decides");
        assert_eq!(at("10.0.0.8:7000").admit(T, &s, far(), access), Err(Refusal::OtherAddress));
        assert_eq!(at("10.0.0.9:7001").admit(T, &s, far(), access), Err(Refusal::OtherAddress));
        let moved = s.replace("10.0.0.9:7000", "10.0.0.8:7000");
        assert_eq!(at("10.0.0.8:7000").admit(T, &moved, far(), access), Err(Refusal::BadMac), "the address is covered");
    }

    #[test]
    fn answers_are_sealed_to_the_request_and_altered_or_unsealed_ones_are_refused() {
        let (k, n) = (key(1), [6; NONCE_LEN]);
        let r = k.seal_reply(&n, b"stopping");
        assert_eq!(k.open_reply(&r), Ok((n, &b"stopping"[..])));
        let mut altered = r.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(k.open_reply(&altered), Err(Refusal::BadMac));
        assert_eq!(k.open_reply(b"stopping"), Err(Refusal::Unauthenticated));
        assert_eq!(k.open_reply(b"ffreply1 zz"), Err(Refusal::Malformed));
        for cut in 0..r.len() - 8 {
            assert!(k.open_reply(&r[..cut]).is_err(), "cut to {cut}");
        }
    }

    #[test]
    fn binding_beyond_loopback_needs_a_key() {
        assert!(check_bind("127.0.0.1:1".parse().unwrap(), false).is_ok());
        assert!(check_bind("[::1]:1".parse().unwrap(), false).is_ok());
        assert!(check_bind("0.0.0.0:1".parse().unwrap(), false)
            .unwrap_err()
            .to_string()
            .contains("--operator-key-file"));
        assert!(check_bind("10.0.0.1:1".parse().unwrap(), true).is_ok());
    }

    proptest! {
        #[test]
        fn any_datagram_gets_an_answer_and_no_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut v = Verifier::new(Some(key(1)), None);
            let text = String::from_utf8_lossy(&b);
            let r = v.admit(T, &text, far(), access);
            prop_assert!(r.is_err() || text.trim().starts_with(PREFIX));
            let mut with_prefix = String::from(PREFIX);
            with_prefix.push_str(&text);
            prop_assert!(v.admit(T, &with_prefix, far(), access).is_err());
        }

        #[test]
        fn seal_and_admit_round_trip(ts in 0u64..u64::MAX / 2, nonce in any::<[u8; 16]>(),
                                     cmd in "[a-z][a-z0-9 -]{0,40}") {
            let mut v = Verifier::new(Some(key(3)), None);
            let s = key(3).seal(ts, nonce, to(), &cmd);
            let a = v.admit(ts, &s, far(), access).unwrap();
            prop_assert_eq!(a.command, cmd.trim());
            prop_assert_eq!(a.sealed, Some(nonce));
            // The answer is sealed to that nonce, and only the key opens it.
            let r = v.answer(a.sealed, b"{\"x\":1}");
            prop_assert_eq!(key(3).open_reply(&r), Ok((nonce, &b"{\"x\":1}"[..])));
            prop_assert!(key(4).open_reply(&r).is_err());
        }
    }
}
