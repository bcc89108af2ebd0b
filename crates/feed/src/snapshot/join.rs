//! Joining a running feed: a snapshot first, then the live feed from where
//! the snapshot ends, with no gap and no duplicate.
//!
//! A [`Joiner`] sits between a receiver's releases (MoldUDP64 packets in
//! sequence order) and the application. Until it has joined it holds the live
//! packets ([`JOIN_BUFFER_PACKETS_MAX`], oldest dropped and counted) and
//! fetches a snapshot over SoupBinTCP. With the snapshot's End of Snapshot
//! (`G`, the live sequence number S it ends before) and a first live packet
//! in hand it checks the two fit — the same session, and the live feed held
//! from S or earlier (else the snapshot is *behind*: fetched again) — then
//! hands the application:
//!
//! 1. the snapshot's M messages as MoldUDP64 packets of the live session,
//!    numbered S − M … S − 1: one contiguous line, the books it builds are
//!    the feed's as of S − 1 (a snapshot never has more messages than the
//!    feed before it, so the numbers stay ≥ 1; one that does is refused);
//! 2. the held live packets from S on (a packet straddling S is cut at S);
//! 3. from then on, the live feed as it is released.
//!
//! A failed fetch (rejected, closed early, not ITCH, timed out, behind, another
//! session) is counted by kind and tried again after a backoff (100 ms
//! doubling to 2 s) — except a snapshot that is behind only because it was
//! asked for before the live line began to arrive (a joiner fetches at once,
//! and its place in the tree may come later): that one is fetched again at
//! once, since the server has followed the feed since. Behind again, the
//! server lags the live line, and the backoff applies.

use std::collections::{BTreeMap, VecDeque};

use fairfeed_wire::glimpse::{EndOfSnapshot, END_OF_SNAPSHOT};
use fairfeed_wire::itch;
use fairfeed_wire::moldudp64::{Packet, PacketBuilder, Session, PACKET_LEN_DEFAULT_MAX};
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr as Soup};
use fairfeed_wire::Alpha;

use super::push_frame;

/// Live packets held while joining, at most (the oldest is dropped).
pub const JOIN_BUFFER_PACKETS_MAX: usize = 65_536;
/// Bytes of a snapshot a joiner accepts at most.
pub const SNAPSHOT_BYTES_MAX: usize = 1 << 31;
/// Time a fetch may take before it is given up.
pub const FETCH_TIMEOUT_NS: u64 = 30_000_000_000;
/// First wait before a failed fetch is tried again (doubling).
pub const RETRY_FIRST_NS: u64 = 100_000_000;
/// Longest wait between fetches.
pub const RETRY_MAX_NS: u64 = 2_000_000_000;

/// Why a fetch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    #[error("login rejected ({0:?})")]
    Rejected(char),
    #[error("not SoupBinTCP: {0}")]
    Garbage(fairfeed_wire::Error),
    #[error("snapshot message {index} is not ITCH 5.0: {error}")]
    NotItch { index: usize, error: fairfeed_wire::Error },
    #[error("`{0}` packet from a snapshot server")]
    Unexpected(char),
    #[error("the server closed after {messages} messages, before End of Snapshot")]
    Closed { messages: usize },
    #[error("snapshot over {SNAPSHOT_BYTES_MAX} bytes")]
    Oversized,
    #[error("no End of Snapshot within {} s", FETCH_TIMEOUT_NS / 1_000_000_000)]
    Timeout,
    #[error("the snapshot is of session {snapshot:?}, the live feed of {live:?}")]
    OtherSession { snapshot: String, live: String },
    #[error("the snapshot ends before {snapshot_next}, the live feed held starts at {live_first}")]
    Behind { snapshot_next: u64, live_first: u64 },
    #[error("{messages} snapshot messages before sequence {next_sequence}: more than the feed had")]
    TooLong { messages: usize, next_sequence: u64 },
}

impl JoinError {
    pub fn kind(&self) -> &'static str {
        match self {
            JoinError::Rejected(_) => "rejected",
            JoinError::Garbage(_) => "garbage",
            JoinError::NotItch { .. } => "not_itch",
            JoinError::Unexpected(_) => "unexpected",
            JoinError::Closed { .. } => "closed",
            JoinError::Oversized => "oversized",
            JoinError::Timeout => "timeout",
            JoinError::OtherSession { .. } => "other_session",
            JoinError::Behind { .. } => "behind",
            JoinError::TooLong { .. } => "too_long",
        }
    }
}

/// How a join went.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct JoinStats {
    pub attempts: u64,
    /// Failed fetches by kind.
    pub failures: BTreeMap<&'static str, u64>,
    /// The last failure, in words.
    pub last_failure: Option<String>,
    pub joined: bool,
    /// The live sequence number the join started at (the snapshot's S).
    pub joined_at_sequence: u64,
    /// Snapshot messages handed to the application.
    pub snapshot_messages: u64,
    /// Live packets held while joining, most at once.
    pub held_max: usize,
    /// Held live packets dropped for room (oldest first).
    pub held_dropped: u64,
    /// Live messages not delivered because the snapshot already held them.
    pub live_trimmed: u64,
    /// Nanoseconds from the first fetch to the join.
    pub join_ns: u64,
}

/// Whether the snapshot connection is still wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Open,
    /// Close it: the snapshot is in, or the fetch failed.
    Finished,
}

#[derive(Debug)]
enum State {
    /// Not fetching: the next fetch may start at `retry_at`.
    Waiting {
        retry_at: u64,
    },
    Fetching {
        started: u64,
        inbuf: Vec<u8>,
        session: Option<Session>,
        got: Got,
    },
    /// The snapshot is in; waiting for a live packet to join at.
    Ready {
        session: Session,
        next: u64,
        got: Got,
        /// When the snapshot was asked for.
        asked: u64,
    },
    Joined {
        next: u64,
    },
}

/// Snapshot messages received: each as a length byte and its bytes.
#[derive(Debug, Default)]
struct Got {
    bytes: Vec<u8>,
    count: usize,
}

/// Fetches a snapshot and joins the live feed after it.
#[derive(Debug)]
pub struct Joiner {
    state: State,
    user: Alpha<6>,
    password: Alpha<10>,
    held: VecDeque<Vec<u8>>,
    /// When the first of the live packets held now arrived.
    held_since: Option<u64>,
    retry_ns: u64,
    first_fetch_ns: Option<u64>,
    stats: JoinStats,
}

impl Joiner {
    /// A joiner that may fetch at once, logging in as `user`/`password`
    /// (blank: a server that asks for none).
    pub fn new(now: u64, user: &str, password: &str) -> Self {
        Self {
            state: State::Waiting { retry_at: now },
            user: Alpha::from_str_padded(user),
            password: Alpha::from_str_padded(password),
            held: VecDeque::new(),
            held_since: None,
            retry_ns: RETRY_FIRST_NS,
            first_fetch_ns: None,
            stats: JoinStats::default(),
        }
    }

    pub fn stats(&self) -> &JoinStats {
        &self.stats
    }

    pub fn joined(&self) -> bool {
        matches!(self.state, State::Joined { .. })
    }

    /// Live packets held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// True when a fetch should start (connect, then send [`Self::login`]).
    pub fn want_fetch(&self, now: u64) -> bool {
        matches!(self.state, State::Waiting { retry_at } if now >= retry_at)
    }

    /// Starts a fetch: the bytes to send on the new connection.
    pub fn login(&mut self, now: u64) -> Vec<u8> {
        self.stats.attempts += 1;
        self.first_fetch_ns.get_or_insert(now);
        self.state = State::Fetching { started: now, inbuf: Vec::new(), session: None, got: Got::default() };
        let mut out = Vec::new();
        let p = Soup::LoginRequest {
            username: self.user,
            password: self.password,
            session: Alpha([b' '; 10]),
            sequence: 1,
        };
        push_frame(&mut out, p);
        out
    }

    /// A connection could not be made.
    pub fn connect_failed(&mut self, now: u64, why: &str) {
        self.stats.attempts += 1;
        self.first_fetch_ns.get_or_insert(now);
        *self.stats.failures.entry("connect").or_default() += 1;
        self.stats.last_failure = Some(format!("connect: {why}"));
        self.retry(now);
    }

    fn fail(&mut self, now: u64, e: JoinError) {
        self.count_failure(&e);
        self.retry(now);
    }

    fn count_failure(&mut self, e: &JoinError) {
        *self.stats.failures.entry(e.kind()).or_default() += 1;
        self.stats.last_failure = Some(e.to_string());
    }

    fn retry(&mut self, now: u64) {
        self.state = State::Waiting { retry_at: now + self.retry_ns };
        self.retry_ns = (self.retry_ns * 2).min(RETRY_MAX_NS);
    }

    /// Bytes from the snapshot connection; application packets go to `out`
    /// if they complete the join.
    pub fn on_stream(&mut self, now: u64, b: &[u8], out: &mut impl FnMut(&[u8])) -> Stream {
        let State::Fetching { inbuf, .. } = &mut self.state else {
            return Stream::Finished;
        };
        if inbuf.len() + b.len() > SNAPSHOT_BYTES_MAX {
            self.fail(now, JoinError::Oversized);
            return Stream::Finished;
        }
        inbuf.extend_from_slice(b);
        match self.take_packets() {
            Ok(false) => Stream::Open,
            Ok(true) => {
                self.try_join(now, out);
                Stream::Finished
            }
            Err(e) => {
                self.fail(now, e);
                Stream::Finished
            }
        }
    }

    /// Parses whole packets from the fetch's buffer; true at End of Snapshot.
    fn take_packets(&mut self) -> Result<bool, JoinError> {
        let State::Fetching { inbuf, session, got, started } = &mut self.state else { return Ok(false) };
        let asked = *started;
        let mut used_all = 0;
        let mut end = None;
        while end.is_none() {
            let (p, used) = match split_packet(&inbuf[used_all..]) {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(e) => return Err(JoinError::Garbage(e)),
            };
            used_all += used;
            match p {
                Soup::LoginAccepted { session: s, .. } => *session = Some(s),
                Soup::LoginRejected { reason } => return Err(JoinError::Rejected(char::from(reason))),
                Soup::ServerHeartbeat | Soup::Debug(_) => {}
                Soup::SequencedData(m) if m.first() == Some(&END_OF_SNAPSHOT) => {
                    end = Some(EndOfSnapshot::parse(m).map_err(JoinError::Garbage)?.next_sequence);
                }
                Soup::SequencedData(m) => {
                    itch::validate(m).map_err(|error| JoinError::NotItch { index: got.count, error })?;
                    got.bytes.push(m.len() as u8);
                    got.bytes.extend_from_slice(m);
                    got.count += 1;
                }
                Soup::EndOfSession => return Err(JoinError::Closed { messages: got.count }),
                Soup::LoginRequest { .. } => return Err(JoinError::Unexpected('L')),
                Soup::UnsequencedData(_) => return Err(JoinError::Unexpected('U')),
                Soup::ClientHeartbeat => return Err(JoinError::Unexpected('R')),
                Soup::LogoutRequest => return Err(JoinError::Unexpected('O')),
            }
        }
        inbuf.drain(..used_all);
        let Some(next) = end else { return Ok(false) };
        let Some(session) = *session else { return Err(JoinError::Unexpected('S')) };
        let got = std::mem::take(got);
        if got.count as u64 > next.saturating_sub(1) {
            return Err(JoinError::TooLong { messages: got.count, next_sequence: next });
        }
        self.state = State::Ready { session, next, got, asked };
        Ok(true)
    }

    /// The snapshot connection closed (or failed) from the other side.
    pub fn stream_closed(&mut self, now: u64) {
        if let State::Fetching { got, .. } = &self.state {
            let messages = got.count;
            self.fail(now, JoinError::Closed { messages });
        }
    }

    /// A fetch that takes too long is given up; true if the shell must close it.
    pub fn on_tick(&mut self, now: u64) -> bool {
        if let State::Fetching { started, .. } = self.state {
            if now >= started + FETCH_TIMEOUT_NS {
                self.fail(now, JoinError::Timeout);
                return true;
            }
        }
        false
    }

    /// When [`Self::on_tick`] or a retry is next due (`u64::MAX`: never).
    pub fn next_due(&self) -> u64 {
        match self.state {
            State::Waiting { retry_at } => retry_at,
            State::Fetching { started, .. } => started + FETCH_TIMEOUT_NS,
            _ => u64::MAX,
        }
    }

    /// One released live packet: delivered through `out` once joined, held before.
    pub fn on_live(&mut self, now: u64, p: &[u8], out: &mut impl FnMut(&[u8])) {
        if let State::Joined { next } = &mut self.state {
            self.stats.live_trimmed += deliver_from(p, next, out);
            return;
        }
        if self.held.len() >= JOIN_BUFFER_PACKETS_MAX {
            self.held.pop_front();
            self.stats.held_dropped += 1;
        }
        self.held_since.get_or_insert(now);
        self.held.push_back(p.to_vec());
        self.stats.held_max = self.stats.held_max.max(self.held.len());
        self.try_join(now, out);
    }

    /// Joins if the snapshot is in and a live packet fits it.
    fn try_join(&mut self, now: u64, out: &mut impl FnMut(&[u8])) {
        let State::Ready { session, next, asked, .. } = &self.state else { return };
        let (session, next, asked) = (*session, *next, *asked);
        // Any packet of the line places it: a data packet by its first message,
        // a heartbeat or the end of the session by the number it announces next.
        let Some(first) = self.held.iter().find_map(|p| Packet::new_checked(&p[..]).ok()) else {
            return;
        };
        if first.session() != session {
            let (snapshot, live) = (lossy(session), lossy(first.session()));
            self.fail(now, JoinError::OtherSession { snapshot, live });
            return;
        }
        if first.sequence() > next {
            let e = JoinError::Behind { snapshot_next: next, live_first: first.sequence() };
            if self.held_since.is_some_and(|t| t > asked) {
                // Asked for before the live line came: a fresh one fits it.
                self.count_failure(&e);
                self.state = State::Waiting { retry_at: now };
            } else {
                self.fail(now, e);
            }
            return;
        }
        let State::Ready { got, .. } = std::mem::replace(&mut self.state, State::Joined { next }) else {
            unreachable!("matched above")
        };
        deliver_snapshot(session, next, &got, out);
        self.stats.snapshot_messages = got.count as u64;
        let State::Joined { next: at } = &mut self.state else { unreachable!() };
        for p in self.held.drain(..) {
            self.stats.live_trimmed += deliver_from(&p, at, out);
        }
        self.held_since = None;
        self.stats.joined = true;
        self.stats.joined_at_sequence = next;
        self.stats.join_ns = now - self.first_fetch_ns.unwrap_or(now);
    }
}

fn lossy(s: Session) -> String {
    String::from_utf8_lossy(&s.0).into_owned()
}

/// The snapshot as MoldUDP64 packets of `session` numbered up to `next` − 1.
fn deliver_snapshot(session: Session, next: u64, got: &Got, out: &mut impl FnMut(&[u8])) {
    let mut buf = [0u8; PACKET_LEN_DEFAULT_MAX];
    let mut seq = next - got.count as u64;
    let mut rest = &got.bytes[..];
    while !rest.is_empty() {
        let mut b = PacketBuilder::new(&mut buf, session, seq).expect("room for a header");
        while let Some((&len, after)) = rest.split_first() {
            let m = &after[..usize::from(len)];
            if b.push(m).is_err() {
                break;
            }
            rest = &after[usize::from(len)..];
        }
        seq += u64::from(b.count());
        let n = b.finish();
        out(&buf[..n]);
    }
    debug_assert_eq!(seq, next);
}

/// Delivers the part of live packet `p` from `*next` on and moves `*next`
/// past it; returns the messages cut off (already in the snapshot).
pub(super) fn deliver_from(p: &[u8], next: &mut u64, out: &mut impl FnMut(&[u8])) -> u64 {
    let Ok(pkt) = Packet::new_checked(p) else {
        out(p);
        return 0;
    };
    let (seq, end) = (pkt.sequence(), pkt.next_sequence());
    if pkt.message_count() == 0 {
        if seq >= *next {
            out(p);
        }
        return 0;
    }
    if end <= *next {
        return u64::from(pkt.message_count());
    }
    if seq >= *next {
        *next = end;
        out(p);
        return 0;
    }
    let skip = *next - seq;
    let mut buf = vec![0u8; p.len()];
    let mut b = PacketBuilder::new(&mut buf, pkt.session(), *next).expect("room for a header");
    for m in pkt.messages().skip(skip as usize).flatten() {
        b.push(m).expect("a part of a packet fits where the packet did");
    }
    let n = b.finish();
    out(&buf[..n]);
    *next = end;
    skip
}
