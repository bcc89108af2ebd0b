//! A snapshot service modelled on NASDAQ GLIMPSE 5.0, and the joining side
//! of it: how a receiver that starts mid-day gets its books.
//!
//! ITCH is incremental: a receiver that starts late (or restarts) cannot build
//! its order books from the live feed alone. NASDAQ serves that need with
//! GLIMPSE — over SoupBinTCP, every open order as ITCH Add Order messages and
//! the standing state (system event, stock directory, trading actions …),
//! ending with an End of Snapshot message that carries the MoldUDP64 sequence
//! number at which the live feed continues. This module is the same, built on
//! [`crate::book::Books`] so it works for any ITCH 5.0 feed, not only ours:
//!
//! - [`Follower`] keeps the books from a MoldUDP64 feed, strictly in sequence
//!   order (duplicates dropped, a short gap waited for — an A and a B line may
//!   both feed it — a gap that outlives the wait or a message the books refuse
//!   makes it *stale*: it then refuses to serve rather than serve wrong books).
//! - [`Snapshot`] is what one login gets: the SoupBinTCP bytes of a whole
//!   session, built once per feed position and shared by every client that
//!   asks at that position.
//! - [`serve`]: the server's side of one connection and the admission rules
//!   (connections per address, logins per second, timeouts).
//! - [`join`]: the receiver's side — fetch a snapshot, hold the live feed
//!   meanwhile, and hand the application snapshot-then-live with no gap and no
//!   duplicate.
//!
//! All of it is sans-IO: bytes and a clock in, bytes and decisions out.

pub mod join;
pub mod serve;

use std::collections::BTreeMap;
use std::sync::Arc;

use fairfeed_wire::glimpse::{EndOfSnapshot, END_OF_SNAPSHOT_LEN};
use fairfeed_wire::moldudp64::{Packet, Session};
use fairfeed_wire::soupbintcp::PacketRepr as Soup;

use crate::book::{BookError, BookStats, Books};

/// Packets held behind a gap at most; one more makes the follower stale.
pub const PENDING_PACKETS_MAX: usize = 4_096;
/// How long a gap is waited for by default (its other line, a late packet).
pub const GAP_WAIT_DEFAULT_NS: u64 = 100_000_000;
/// Longest gap wait accepted.
pub const GAP_WAIT_MAX_NS: u64 = 10_000_000_000;

/// Why a follower's books cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotServing {
    #[error("no feed yet")]
    NoFeed,
    #[error("joined session {session} at sequence {first}, not at 1: the books lack what came before")]
    JoinedLate { session: String, first: u64 },
    #[error("messages {from}..{to} never arrived (waited {waited_ms} ms)")]
    Gap { from: u64, to: u64, waited_ms: u64 },
    #[error("more than {max} packets waited behind the gap at {from}")]
    Overflow { from: u64, max: usize },
    #[error("the books refused message {sequence}: {error}")]
    Refused { sequence: u64, error: BookError },
}

impl NotServing {
    /// A short stable name for counters.
    pub fn kind(&self) -> &'static str {
        match self {
            NotServing::NoFeed => "no_feed",
            NotServing::JoinedLate { .. } => "joined_late",
            NotServing::Gap { .. } => "gap",
            NotServing::Overflow { .. } => "overflow",
            NotServing::Refused { .. } => "refused",
        }
    }
}

/// What a follower took and dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FollowStats {
    pub packets: u64,
    /// Messages applied to the books, in sequence order.
    pub messages: u64,
    /// Packets whose every message was applied already (the other line's copy).
    pub duplicates: u64,
    /// Packets held behind a gap until it filled.
    pub reordered: u64,
    pub heartbeats: u64,
    /// Datagrams that are not MoldUDP64 (or whose blocks do not parse).
    pub malformed: u64,
    /// Packets of a session other than the one followed.
    pub other_session: u64,
    /// Sessions followed (a new one starts after the last ends).
    pub sessions: u64,
    /// Snapshots built (one per feed position asked for).
    pub snapshots_built: u64,
}

/// One login's snapshot: the whole SoupBinTCP session a client is sent.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The live feed's session (the SoupBinTCP session named at login).
    pub session: Session,
    /// The live sequence number the snapshot ends before.
    pub next_sequence: u64,
    /// ITCH messages in it (End of Snapshot not counted).
    pub messages: usize,
    /// Login Accepted, a Sequenced Data packet per message, End of Snapshot
    /// as Sequenced Data, End of Session.
    pub frames: Arc<[u8]>,
}

impl Snapshot {
    fn build(books: &Books, session: Session, next_sequence: u64) -> Self {
        let mut frames = Vec::with_capacity(64 + books.snapshot_len() * 40);
        push_frame(&mut frames, Soup::LoginAccepted { session, sequence: 1 });
        let messages = books.snapshot(&mut |m| push_frame(&mut frames, Soup::SequencedData(m)));
        assert!(
            messages as u64 <= next_sequence.saturating_sub(1),
            "{messages} snapshot messages for a feed of {} — each stands for one message applied",
            next_sequence.saturating_sub(1)
        );
        let mut end = [0u8; END_OF_SNAPSHOT_LEN];
        EndOfSnapshot { next_sequence }.emit(&mut end);
        push_frame(&mut frames, Soup::SequencedData(&end));
        push_frame(&mut frames, Soup::EndOfSession);
        Self { session, next_sequence, messages, frames: frames.into() }
    }
}

/// Appends one SoupBinTCP packet (length prefix included) to `out`.
pub fn push_frame(out: &mut Vec<u8>, p: Soup<'_>) {
    let at = out.len();
    out.resize(at + p.buffer_len(), 0);
    let n = p.emit(&mut out[at..]).expect("sized by buffer_len");
    out.truncate(at + n);
}

/// Books kept from one MoldUDP64 feed, in sequence order.
#[derive(Debug)]
pub struct Follower {
    books: Books,
    orders_max: usize,
    session: Option<Session>,
    /// The next sequence number to apply.
    next: u64,
    /// Packets ahead of `next`, by first sequence number.
    pending: BTreeMap<u64, Vec<u8>>,
    /// When the oldest unfilled gap was first seen.
    gap_since: Option<u64>,
    gap_wait_ns: u64,
    /// Sequence number of the session's end, once announced.
    end_at: Option<u64>,
    stale: Option<NotServing>,
    stats: FollowStats,
    cache: Option<Snapshot>,
}

impl Follower {
    /// A follower that waits `gap_wait_ns` for a gap and holds at most
    /// `orders_max` open orders.
    pub fn new(gap_wait_ns: u64, orders_max: usize) -> Self {
        assert!(gap_wait_ns <= GAP_WAIT_MAX_NS, "gap wait {gap_wait_ns} ns over {GAP_WAIT_MAX_NS}");
        Self {
            books: Books::with_limit(orders_max),
            orders_max,
            session: None,
            next: 1,
            pending: BTreeMap::new(),
            gap_since: None,
            gap_wait_ns,
            end_at: None,
            stale: None,
            stats: FollowStats::default(),
            cache: None,
        }
    }

    pub fn books(&self) -> &Books {
        &self.books
    }

    pub fn book_stats(&self) -> &BookStats {
        self.books.stats()
    }

    pub fn stats(&self) -> &FollowStats {
        &self.stats
    }

    /// The session followed, if any.
    pub fn session(&self) -> Option<Session> {
        self.session
    }

    /// The next sequence number the books wait for.
    pub fn next_sequence(&self) -> u64 {
        self.next
    }

    /// Packets held behind a gap now.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Why the books cannot be served now, if they cannot.
    pub fn standing(&self) -> Result<(), NotServing> {
        match (&self.stale, self.session) {
            (Some(s), _) => Err(s.clone()),
            (None, None) => Err(NotServing::NoFeed),
            (None, Some(_)) => Ok(()),
        }
    }

    /// When a gap's wait runs out (`u64::MAX`: no gap).
    pub fn next_due(&self) -> u64 {
        match self.gap_since {
            Some(t) if self.stale.is_none() => t.saturating_add(self.gap_wait_ns),
            _ => u64::MAX,
        }
    }

    /// A gap waited for past its time makes the books stale.
    pub fn on_tick(&mut self, now: u64) {
        if now >= self.next_due() {
            let to = self.pending.keys().next().copied().unwrap_or(self.next);
            let waited_ms = (now - self.gap_since.unwrap_or(now)) / 1_000_000;
            self.go_stale(NotServing::Gap { from: self.next, to, waited_ms });
        }
    }

    fn go_stale(&mut self, why: NotServing) {
        self.stale = Some(why);
        self.pending.clear();
        self.gap_since = None;
        self.cache = None;
    }

    /// Takes one datagram of the feed at `now`.
    pub fn on_packet(&mut self, now: u64, p: &[u8]) {
        let Ok(pkt) = Packet::new_checked(p) else {
            self.stats.malformed += 1;
            return;
        };
        if pkt.messages().any(|m| m.is_err()) {
            self.stats.malformed += 1;
            return;
        }
        self.stats.packets += 1;
        if !self.adopt(&pkt) {
            return;
        }
        if pkt.is_end_of_session() {
            self.end_at = Some(pkt.sequence());
            self.note_gap(now, pkt.sequence());
            return;
        }
        if pkt.is_heartbeat() {
            self.stats.heartbeats += 1;
            self.note_gap(now, pkt.sequence());
            return;
        }
        let (seq, end) = (pkt.sequence(), pkt.next_sequence());
        if end <= self.next {
            self.stats.duplicates += 1;
            return;
        }
        if seq > self.next {
            if self.pending.len() >= PENDING_PACKETS_MAX {
                self.go_stale(NotServing::Overflow { from: self.next, max: PENDING_PACKETS_MAX });
                return;
            }
            self.pending.entry(seq).or_insert_with(|| p.to_vec());
            self.gap_since.get_or_insert(now);
            return;
        }
        self.apply_from(p);
        self.drain(now);
    }

    /// Whether the packet's session is the one followed (adopting a first one,
    /// or a new one starting at 1 once the last ended or went stale).
    fn adopt(&mut self, pkt: &Packet<&[u8]>) -> bool {
        let s = pkt.session();
        match self.session {
            Some(cur) if cur == s => self.stale.is_none(),
            Some(_) if (self.end_at.is_some_and(|e| e <= self.next) || self.stale.is_some()) && pkt.sequence() == 1 => {
                self.start_session(s);
                true
            }
            Some(_) => {
                self.stats.other_session += 1;
                false
            }
            None => {
                self.start_session(s);
                if pkt.sequence() != 1 {
                    let session = String::from_utf8_lossy(&s.0).into_owned();
                    self.go_stale(NotServing::JoinedLate { session, first: pkt.sequence() });
                    return false;
                }
                true
            }
        }
    }

    fn start_session(&mut self, s: Session) {
        self.books = Books::with_limit(self.orders_max);
        self.session = Some(s);
        self.next = 1;
        self.pending.clear();
        self.gap_since = None;
        self.end_at = None;
        self.stale = None;
        self.cache = None;
        self.stats.sessions += 1;
    }

    /// A heartbeat or end of session announcing `seq` as next: a gap if ahead.
    fn note_gap(&mut self, now: u64, seq: u64) {
        if seq > self.next {
            self.gap_since.get_or_insert(now);
        }
    }

    /// Applies the messages of a packet (whose blocks parse) from `self.next` on.
    fn apply_from(&mut self, p: &[u8]) {
        let pkt = Packet::new_unchecked(p);
        let skip = (self.next - pkt.sequence()) as usize;
        for m in pkt.messages().skip(skip).flatten() {
            if let Err(error) = self.books.apply(m) {
                self.go_stale(NotServing::Refused { sequence: self.next, error });
                return;
            }
            self.next += 1;
            self.stats.messages += 1;
        }
    }

    /// Applies held packets the feed has now reached; a gap still open after
    /// that is timed from now.
    fn drain(&mut self, now: u64) {
        while self.stale.is_none() {
            let Some(entry) = self.pending.first_entry() else { break };
            if *entry.key() > self.next {
                break;
            }
            let p = entry.remove();
            self.stats.reordered += 1;
            if Packet::new_unchecked(&p[..]).next_sequence() > self.next {
                self.apply_from(&p);
            }
        }
        let ahead = self.pending.keys().next().copied().or(self.end_at).is_some_and(|s| s > self.next);
        self.gap_since = if ahead && self.stale.is_none() { Some(now) } else { None };
    }

    /// The snapshot of the books as they stand, or why they cannot be served.
    /// Built once per feed position; every login at that position shares it.
    pub fn snapshot(&mut self) -> Result<Snapshot, NotServing> {
        self.standing()?;
        let session = self.session.expect("standing checked a session");
        if let Some(c) = &self.cache {
            if c.next_sequence == self.next && c.session == session {
                return Ok(c.clone());
            }
        }
        let s = Snapshot::build(&self.books, session, self.next);
        self.stats.snapshots_built += 1;
        self.cache = Some(s.clone());
        Ok(s)
    }
}

#[cfg(test)]
mod tests;
