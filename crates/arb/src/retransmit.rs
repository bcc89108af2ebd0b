//! The MoldUDP64 retransmission server's core: a journal of sent messages and
//! the rules for answering requests.
//!
//! Answers carry the requested messages from the requested sequence number,
//! as many as fit one packet and the per-request cap (the MoldUDP64
//! specification lets a server send fewer than asked; clients ask again for
//! the rest). Each requester is rate-limited by a token bucket. A bad request —
//! wrong size, another session, a count of 0, a range the journal does not
//! hold — gets no answer and a counter, never a crash.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use fairfeed_wire::moldudp64::{Packet, PacketBuilder, Request, Session, COUNT_END_OF_SESSION};
use serde::Serialize;

/// Requesters tracked for rate limiting at most; when full, idle ones are forgotten.
pub const REQUESTERS_MAX: usize = 4_096;
/// A requester idle this long is forgotten.
const REQUESTER_IDLE_NS: u64 = 10_000_000_000;

/// Bytes of messages a journal keeps by default (the oldest are dropped beyond it).
pub const JOURNAL_BYTES_DEFAULT: usize = 256 << 20;
/// Dead bytes at the front of a journal's buffer before it is compacted.
const COMPACT_MIN_BYTES: usize = 1 << 16;

/// The messages of one session, by sequence number — the newest
/// `limit_bytes` of them: beyond the limit the oldest messages are dropped
/// (counted in [`Journal::evicted`]) and requests for them go unanswered as
/// out of range, so a long session's journal cannot grow without bound.
#[derive(Debug, Clone)]
pub struct Journal {
    session: Option<Session>,
    /// Sequence number of the oldest message held.
    first_seq: u64,
    /// `bytes[0]` is byte `base` of everything ever journaled.
    bytes: Vec<u8>,
    base: u64,
    /// Where the oldest held message starts, and where each held message ends
    /// (offsets into everything ever journaled).
    first_start: u64,
    ends: VecDeque<u64>,
    /// First sequence number of each journaled packet, ascending.
    packet_starts: VecDeque<u64>,
    limit_bytes: usize,
    evicted: u64,
}

/// Why a packet could not be journaled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalError {
    /// The packet's session differs from the journal's.
    OtherSession,
    /// The packet leaves a hole after the last journaled message.
    Gap {
        expected: u64,
        got: u64,
    },
    Decode(fairfeed_wire::Error),
}

impl Default for Journal {
    fn default() -> Self {
        Self::new()
    }
}

impl Journal {
    /// A journal that keeps [`JOURNAL_BYTES_DEFAULT`] bytes of messages.
    pub fn new() -> Self {
        Journal::with_limit(JOURNAL_BYTES_DEFAULT)
    }

    /// A journal that keeps the newest `limit_bytes` of messages (always at
    /// least the newest message).
    pub fn with_limit(limit_bytes: usize) -> Self {
        Journal {
            session: None,
            first_seq: 1,
            bytes: Vec::new(),
            base: 0,
            first_start: 0,
            ends: VecDeque::new(),
            packet_starts: VecDeque::new(),
            limit_bytes,
            evicted: 0,
        }
    }

    /// The session, once a packet was journaled.
    pub fn session(&self) -> Option<Session> {
        self.session
    }

    /// Sequence number after the last journaled message.
    pub fn next_seq(&self) -> u64 {
        self.first_seq + self.ends.len() as u64
    }

    /// Sequence number of the oldest message still held.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Messages held.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of messages held.
    pub fn held_bytes(&self) -> usize {
        (self.ends.back().copied().unwrap_or(self.first_start) - self.first_start) as usize
    }

    /// Messages dropped to stay within the limit.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Appends a sent MoldUDP64 packet. Heartbeats and repeats are accepted and
    /// change nothing; a packet past a hole is refused.
    pub fn append_packet(&mut self, payload: &[u8]) -> Result<(), JournalError> {
        let p = Packet::new_checked(payload).map_err(JournalError::Decode)?;
        match self.session {
            None => {
                self.session = Some(p.session());
                self.first_seq = p.sequence();
            }
            Some(s) if s != p.session() => return Err(JournalError::OtherSession),
            Some(_) => {}
        }
        if p.message_count() == 0 {
            return Ok(());
        }
        let next = self.next_seq();
        if p.sequence() > next {
            return Err(JournalError::Gap { expected: next, got: p.sequence() });
        }
        if p.sequence() == next {
            self.packet_starts.push_back(next);
        }
        for (i, m) in p.messages().enumerate() {
            let m = m.map_err(JournalError::Decode)?;
            if p.sequence() + i as u64 == self.next_seq() {
                self.bytes.extend_from_slice(m);
                self.ends.push_back(self.base + self.bytes.len() as u64);
            }
        }
        self.evict();
        Ok(())
    }

    /// Drops the oldest messages while more than the limit is held.
    fn evict(&mut self) {
        while self.held_bytes() > self.limit_bytes && self.ends.len() > 1 {
            if let Some(end) = self.ends.pop_front() {
                self.first_start = end;
                self.first_seq += 1;
                self.evicted += 1;
            }
        }
        while self.packet_starts.len() > 1 && self.packet_starts[1] <= self.first_seq {
            self.packet_starts.pop_front();
        }
        let dead = (self.first_start - self.base) as usize;
        if dead >= COMPACT_MIN_BYTES && dead * 2 >= self.bytes.len() {
            self.bytes.drain(..dead);
            self.base = self.first_start;
        }
    }

    /// Sequence number after the last message of the originally sent packet
    /// that holds `seq`.
    pub fn packet_end(&self, seq: u64) -> u64 {
        let i = self.packet_starts.partition_point(|&s| s <= seq);
        self.packet_starts.get(i).copied().unwrap_or_else(|| self.next_seq())
    }

    /// Message `seq`, if held.
    pub fn get(&self, seq: u64) -> Option<&[u8]> {
        let i = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        let end = *self.ends.get(i)?;
        let start = if i == 0 { self.first_start } else { self.ends[i - 1] };
        self.bytes.get((start - self.base) as usize..(end - self.base) as usize)
    }
}

/// Server limits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ServerConfig {
    /// Messages one answer carries at most.
    pub count_max: u16,
    /// Largest answer packet (UDP payload).
    pub packet_len_max: usize,
    /// Requests per second each requester may make, on average.
    pub rate_per_s: f64,
    /// End each answer where the originally sent packet ended, so a client that
    /// re-asks for the rest rebuilds the feed packet for packet.
    pub keep_packet_boundaries: bool,
    /// Requests a requester may make in a burst.
    pub burst: f64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            count_max: 500,
            packet_len_max: 1400,
            rate_per_s: 2_000.0,
            burst: 200.0,
            keep_packet_boundaries: true,
        }
    }
}

/// What the server did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerStats {
    pub requests: u64,
    pub answers: u64,
    pub messages_sent: u64,
    pub bad_requests: u64,
    pub other_session: u64,
    pub out_of_range: u64,
    pub rate_limited: u64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ns: u64,
}

/// The server state machine: request bytes in, answer bytes out.
pub struct RetransmitServer {
    journal: Journal,
    cfg: ServerConfig,
    buckets: HashMap<SocketAddr, Bucket>,
    stats: ServerStats,
}

impl RetransmitServer {
    pub fn new(journal: Journal, cfg: ServerConfig) -> Self {
        assert!(cfg.packet_len_max >= 64, "answer packets must hold at least one message");
        RetransmitServer { journal, cfg, buckets: HashMap::new(), stats: ServerStats::default() }
    }

    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn journal_mut(&mut self) -> &mut Journal {
        &mut self.journal
    }

    fn allow(&mut self, now: u64, from: SocketAddr) -> bool {
        if self.buckets.len() >= REQUESTERS_MAX && !self.buckets.contains_key(&from) {
            self.buckets.retain(|_, b| now.saturating_sub(b.at_ns) < REQUESTER_IDLE_NS);
            if self.buckets.len() >= REQUESTERS_MAX {
                return false;
            }
        }
        let (rate, burst) = (self.cfg.rate_per_s, self.cfg.burst);
        let b = self.buckets.entry(from).or_insert(Bucket { tokens: burst, at_ns: now });
        b.tokens = (b.tokens + now.saturating_sub(b.at_ns) as f64 * rate / 1e9).min(burst);
        b.at_ns = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Answers one request datagram; returns the answer's length in `out`, or
    /// `None` when the request gets no answer.
    pub fn handle_request(&mut self, now_ns: u64, from: SocketAddr, request: &[u8], out: &mut [u8]) -> Option<usize> {
        self.stats.requests += 1;
        let Ok(r) = Request::new_checked(request) else {
            self.stats.bad_requests += 1;
            return None;
        };
        if r.count() == 0 || r.count() == COUNT_END_OF_SESSION {
            self.stats.bad_requests += 1;
            return None;
        }
        let Some(session) = self.journal.session() else {
            self.stats.out_of_range += 1;
            return None;
        };
        if r.session() != session {
            self.stats.other_session += 1;
            return None;
        }
        if self.journal.get(r.sequence()).is_none() {
            self.stats.out_of_range += 1;
            return None;
        }
        if !self.allow(now_ns, from) {
            self.stats.rate_limited += 1;
            return None;
        }
        let cap = out.len().min(self.cfg.packet_len_max);
        let mut b = PacketBuilder::new(&mut out[..cap], session, r.sequence()).ok()?;
        let mut end = r.sequence() + u64::from(r.count().min(self.cfg.count_max));
        if self.cfg.keep_packet_boundaries {
            end = end.min(self.journal.packet_end(r.sequence()));
        }
        for seq in r.sequence()..end {
            let Some(m) = self.journal.get(seq) else { break };
            if b.push(m).is_err() {
                break;
            }
        }
        self.stats.answers += 1;
        self.stats.messages_sent += u64::from(b.count());
        Some(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_wire::moldudp64::RequestRepr;

    fn journal(n: u64) -> Journal {
        journal_within(n, JOURNAL_BYTES_DEFAULT, |_| {})
    }

    /// Messages 1..=n (8 bytes each, two per packet) into a journal of
    /// `limit` bytes, `after` called once per packet.
    fn journal_within(n: u64, limit: usize, after: impl Fn(&Journal)) -> Journal {
        let mut j = Journal::with_limit(limit);
        for seq in (1..=n).step_by(2) {
            let mut buf = [0u8; 100];
            let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("S1"), seq).unwrap();
            b.push(&seq.to_be_bytes()).unwrap();
            b.push(&(seq + 1).to_be_bytes()).unwrap();
            let len = b.finish();
            j.append_packet(&buf[..len]).unwrap();
            after(&j);
        }
        j
    }

    fn req(seq: u64, count: u16) -> [u8; 20] {
        let mut b = [0u8; 20];
        RequestRepr { session: Session::from_str_padded("S1"), sequence: seq, count }.emit(&mut b).unwrap();
        b
    }

    #[test]
    fn a_journal_keeps_the_newest_messages_within_its_limit_and_refuses_the_rest() {
        // 8-byte messages, two per packet; room for 100 of them.
        let j = journal_within(100_000, 800, |j| assert!(j.held_bytes() <= 800));
        assert_eq!((j.len(), j.first_seq(), j.next_seq(), j.evicted()), (100, 99_901, 100_001, 99_900));
        assert!(j.bytes.len() <= 2 * 800 + COMPACT_MIN_BYTES, "the buffer is compacted: {} bytes", j.bytes.len());
        for seq in 99_901..=100_000u64 {
            assert_eq!(j.get(seq), Some(&seq.to_be_bytes()[..]), "message {seq}");
        }
        assert_eq!(j.get(99_900), None, "dropped");
        assert_eq!(j.get(100_001), None, "not yet sent");
        assert_eq!(j.packet_end(99_901), 99_903, "packet boundaries survive eviction");
        let mut s = RetransmitServer::new(j, ServerConfig::default());
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut out = [0u8; 1400];
        assert_eq!(s.handle_request(0, from, &req(5, 10), &mut out), None, "an evicted range is out of range");
        assert_eq!(s.stats().out_of_range, 1);
        let n = s.handle_request(0, from, &req(99_991, 10), &mut out).unwrap();
        let p = Packet::new_checked(&out[..n]).unwrap();
        assert_eq!((p.sequence(), p.count()), (99_991, 2));
    }

    #[test]
    fn one_message_larger_than_the_limit_is_still_kept() {
        let mut j = Journal::with_limit(4);
        let mut buf = [0u8; 100];
        let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("S1"), 1).unwrap();
        b.push(&[7u8; 20]).unwrap();
        let len = b.finish();
        j.append_packet(&buf[..len]).unwrap();
        assert_eq!((j.len(), j.get(1).map(<[u8]>::len)), (1, Some(20)));
    }

    #[test]
    fn answers_from_the_requested_sequence_with_a_cap() {
        let cfg = ServerConfig { count_max: 10, keep_packet_boundaries: false, ..Default::default() };
        let mut s = RetransmitServer::new(journal(1000), cfg);
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut out = [0u8; 1400];
        let n = s.handle_request(0, from, &req(101, 50), &mut out).unwrap();
        let p = Packet::new_checked(&out[..n]).unwrap();
        assert_eq!((p.sequence(), p.count()), (101, 10));
        let first = p.messages().next().unwrap().unwrap();
        assert_eq!(first, &101u64.to_be_bytes());
    }

    #[test]
    fn answers_keep_the_original_packet_boundaries() {
        // The journal's packets hold two messages each: 1-2, 3-4, ...
        let mut s = RetransmitServer::new(journal(100), ServerConfig::default());
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut out = [0u8; 1400];
        for (seq, want) in [(5, 2), (6, 1), (9, 2)] {
            let n = s.handle_request(0, from, &req(seq, 50), &mut out).unwrap();
            assert_eq!(Packet::new_checked(&out[..n]).unwrap().count(), want);
        }
        let mut s =
            RetransmitServer::new(journal(100), ServerConfig { keep_packet_boundaries: false, ..Default::default() });
        let n = s.handle_request(0, from, &req(5, 50), &mut out).unwrap();
        assert_eq!(Packet::new_checked(&out[..n]).unwrap().count(), 50);
    }

    #[test]
    fn bad_requests_get_nothing() {
        let mut s = RetransmitServer::new(journal(100), ServerConfig::default());
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut out = [0u8; 1400];
        assert!(s.handle_request(0, from, &req(101, 5), &mut out).is_none()); // past the end
        assert!(s.handle_request(0, from, &req(0, 5), &mut out).is_none()); // before the start
        assert!(s.handle_request(0, from, &req(5, 0), &mut out).is_none()); // count 0
        assert!(s.handle_request(0, from, &req(5, 1)[..19], &mut out).is_none()); // short
        let mut other = req(5, 1);
        other[0] = b'X';
        assert!(s.handle_request(0, from, &other, &mut out).is_none()); // other session
        let st = s.stats();
        assert_eq!((st.out_of_range, st.bad_requests, st.other_session), (2, 2, 1));
    }

    #[test]
    fn requesters_are_rate_limited_independently() {
        let cfg = ServerConfig { rate_per_s: 10.0, burst: 3.0, ..Default::default() };
        let mut s = RetransmitServer::new(journal(100), cfg);
        let (a, b): (SocketAddr, SocketAddr) = ("127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap());
        let mut out = [0u8; 1400];
        let answered = (0..10).filter(|_| s.handle_request(0, a, &req(1, 1), &mut out).is_some()).count();
        assert_eq!(answered, 3);
        assert!(s.handle_request(0, b, &req(1, 1), &mut out).is_some());
        // 100 ms later, one more token for a.
        assert!(s.handle_request(100_000_000, a, &req(1, 1), &mut out).is_some());
        assert!(s.handle_request(100_000_000, a, &req(1, 1), &mut out).is_none());
        assert_eq!(s.stats().rate_limited, 8);
    }

    #[test]
    fn journal_refuses_holes_and_ignores_repeats() {
        let mut j = journal(10);
        let mut buf = [0u8; 100];
        let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("S1"), 20).unwrap();
        b.push(b"x").unwrap();
        let n = b.finish();
        assert_eq!(j.append_packet(&buf[..n]), Err(JournalError::Gap { expected: 11, got: 20 }));
        assert_eq!(j.len(), 10);
        assert_eq!(j.get(10), Some(&10u64.to_be_bytes()[..]));
        assert_eq!(j.get(11), None);
    }
}
