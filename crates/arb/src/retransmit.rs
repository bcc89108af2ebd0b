//! The MoldUDP64 retransmission server's core: a journal of sent messages and
//! the rules for answering requests.
//!
//! Answers carry the requested messages from the requested sequence number,
//! as many as fit one packet and the per-request cap (the MoldUDP64
//! specification lets a server send fewer than asked; clients ask again for
//! the rest). Each requester is rate-limited by a token bucket. A bad request —
//! wrong size, another session, a count of 0, a range the journal does not
//! hold — gets no answer and a counter, never a crash.
//!
//! No reflection: UDP sources are trivially spoofed, and a 20-byte request
//! drawing a 1,400-byte answer would let anyone aim a server at a victim.
//! So, as QUIC's Retry and DTLS's HelloVerifyRequest do, a requester first
//! shows it receives at the address it claims: a request that carries no
//! valid cookie is answered with at most as many bytes as it carried — the
//! messages that fit (a client may pad its request to get more), else a
//! 20-byte [challenge](CHALLENGE_MAGIC) holding a cookie bound to its
//! address and the period. Requests that echo the cookie after the 20
//! request bytes are answered in full. fairfeed's own clients do this
//! through a [`Requester`]. A global and a per-requester budget of bytes
//! out per second bound what even verified requesters draw.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use fairfeed_wire::moldudp64::{
    Packet, PacketBuilder, Request, RequestRepr, Session, COUNT_END_OF_SESSION, HEADER_LEN as REQUEST_LEN,
};
use serde::Serialize;

/// Requesters tracked for rate limiting at most; when full, idle ones are forgotten.
pub const REQUESTERS_MAX: usize = 4_096;
/// A requester idle this long is forgotten.
const REQUESTER_IDLE_NS: u64 = 10_000_000_000;

/// Bytes of a return-routability cookie.
pub const COOKIE_LEN: usize = 16;
/// What starts a challenge: these 4 bytes, then the cookie (20 bytes in all,
/// no more than the request that drew it; a MoldUDP64 client reads it as a
/// packet of another session and drops it).
pub const CHALLENGE_MAGIC: [u8; 4] = *b"FFC1";
/// Bytes of a challenge.
pub const CHALLENGE_LEN: usize = CHALLENGE_MAGIC.len() + COOKIE_LEN;
/// Bytes of a request that carries a cookie.
pub const REQUEST_WITH_COOKIE_LEN: usize = REQUEST_LEN + COOKIE_LEN;
/// Requests longer than this are bad (a padded request fills one datagram at most).
pub const REQUEST_MAX_LEN: usize = 1_500;
/// A cookie is good in the period it was made and the next (so 1–2 periods).
pub const COOKIE_PERIOD_NS: u64 = 60_000_000_000;

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
        /// The sequence number that would continue the journal.
        expected: u64,
        /// The packet's first.
        got: u64,
    },
    /// The packet is not MoldUDP64.
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

    /// Whether it holds no packet.
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
    /// Bytes of answers per second, all requesters together (a burst of one second's worth).
    pub bytes_per_s: f64,
    /// Bytes of answers per second to one requester (a burst of one second's worth).
    pub bytes_per_s_per_requester: f64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            count_max: 500,
            packet_len_max: 1400,
            rate_per_s: 2_000.0,
            burst: 200.0,
            keep_packet_boundaries: true,
            bytes_per_s: 64e6,
            bytes_per_s_per_requester: 16e6,
        }
    }
}

/// What the server did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerStats {
    /// Requests received.
    pub requests: u64,
    /// Answers sent.
    pub answers: u64,
    /// Messages in them.
    pub messages_sent: u64,
    /// Requests that were not MoldUDP64 requests.
    pub bad_requests: u64,
    /// Requests for another session.
    pub other_session: u64,
    /// Requests for messages the journal does not hold (not sent yet, or evicted).
    pub out_of_range: u64,
    /// Requests over the requester's rate.
    pub rate_limited: u64,
    /// Answers withheld by the bytes-per-second budgets (global or the requester's).
    pub budget_limited: u64,
    /// Requests without a valid cookie (answered with at most their own size).
    pub unverified: u64,
    /// Challenges sent (an unverified request whose answer did not fit its size).
    pub challenges: u64,
    /// Bytes of requests in, and of answers and challenges out.
    pub bytes_in: u64,
    /// ... and out.
    pub bytes_out: u64,
    /// Bytes out to unverified requesters (never more than their requests' bytes).
    pub bytes_out_unverified: u64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ns: u64,
}

/// A requester's budgets: requests and bytes.
#[derive(Debug, Clone, Copy)]
struct RequesterBudget {
    requests: Bucket,
    bytes: Bucket,
}

/// The server state machine: request bytes in, answer bytes out.
pub struct RetransmitServer {
    journal: Journal,
    cfg: ServerConfig,
    buckets: HashMap<SocketAddr, RequesterBudget>,
    bytes: Bucket,
    /// The cookies' key (random per server).
    secret: [u8; 32],
    stats: ServerStats,
}

impl RetransmitServer {
    /// A server answering from `journal`, its cookies keyed by a random secret.
    pub fn new(journal: Journal, cfg: ServerConfig) -> Self {
        Self::with_secret(journal, cfg, rand::random())
    }

    /// A server whose cookies are keyed by `secret` (tests; `new` draws one).
    pub fn with_secret(journal: Journal, cfg: ServerConfig, secret: [u8; 32]) -> Self {
        assert!(cfg.packet_len_max >= 64, "answer packets must hold at least one message");
        assert!(cfg.bytes_per_s > 0.0 && cfg.bytes_per_s_per_requester > 0.0, "budgets are positive");
        let bytes = Bucket { tokens: cfg.bytes_per_s, at_ns: 0 };
        RetransmitServer { journal, cfg, buckets: HashMap::new(), bytes, secret, stats: ServerStats::default() }
    }

    /// The cookie of `from` in `period`.
    fn cookie(&self, from: SocketAddr, period: u64) -> [u8; COOKIE_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.secret);
        match from.ip() {
            std::net::IpAddr::V4(a) => h.update(&a.octets()),
            std::net::IpAddr::V6(a) => h.update(&a.octets()),
        };
        h.update(&from.port().to_le_bytes());
        h.update(&period.to_le_bytes());
        let mut c = [0u8; COOKIE_LEN];
        c.copy_from_slice(&h.finalize().as_bytes()[..COOKIE_LEN]);
        c
    }

    /// Whether `request` carries `from`'s cookie of this period or the last.
    fn verified(&self, now: u64, from: SocketAddr, request: &[u8]) -> bool {
        let Some(got) = request.get(REQUEST_LEN..REQUEST_WITH_COOKIE_LEN) else { return false };
        let period = now / COOKIE_PERIOD_NS;
        [period, period.saturating_sub(1)].iter().any(|&p| {
            let want = self.cookie(from, p);
            want.iter().zip(got).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
        })
    }

    /// The challenge for `from` in `out`; its length.
    fn challenge(&mut self, now: u64, from: SocketAddr, out: &mut [u8]) -> Option<usize> {
        let c = self.cookie(from, now / COOKIE_PERIOD_NS);
        let out = out.get_mut(..CHALLENGE_LEN)?;
        out[..CHALLENGE_MAGIC.len()].copy_from_slice(&CHALLENGE_MAGIC);
        out[CHALLENGE_MAGIC.len()..].copy_from_slice(&c);
        self.stats.challenges += 1;
        Some(CHALLENGE_LEN)
    }

    /// What it did.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// What it answers from.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// What it answers from, to append the packets sent.
    pub fn journal_mut(&mut self) -> &mut Journal {
        &mut self.journal
    }

    /// Takes one request from `from`'s request budget (false: over it, or too many requesters).
    fn allow(&mut self, now: u64, from: SocketAddr) -> bool {
        if self.buckets.len() >= REQUESTERS_MAX && !self.buckets.contains_key(&from) {
            self.buckets.retain(|_, b| now.saturating_sub(b.requests.at_ns) < REQUESTER_IDLE_NS);
            if self.buckets.len() >= REQUESTERS_MAX {
                return false;
            }
        }
        let (rate, burst, bps) = (self.cfg.rate_per_s, self.cfg.burst, self.cfg.bytes_per_s_per_requester);
        let b = self.buckets.entry(from).or_insert(RequesterBudget {
            requests: Bucket { tokens: burst, at_ns: now },
            bytes: Bucket { tokens: bps, at_ns: now },
        });
        b.requests.take(now, rate, burst, 1.0)
    }

    /// Takes `n` bytes from the global budget and `from`'s (false: either is short; neither is taken).
    fn spend(&mut self, now: u64, from: SocketAddr, n: usize) -> bool {
        let (g, r) = (self.cfg.bytes_per_s, self.cfg.bytes_per_s_per_requester);
        let Some(b) = self.buckets.get_mut(&from) else { return false };
        let n = n as f64;
        b.bytes.refill(now, r, r);
        self.bytes.refill(now, g, g);
        if b.bytes.tokens < n || self.bytes.tokens < n {
            return false;
        }
        b.bytes.tokens -= n;
        self.bytes.tokens -= n;
        true
    }

    /// Answers one request datagram; returns the answer's length in `out`, or
    /// `None` when the request gets no answer. The answer is a MoldUDP64
    /// packet, or — for a requester without a valid cookie whose answer
    /// would not fit its request's size — a challenge ([`CHALLENGE_MAGIC`]).
    pub fn handle_request(&mut self, now_ns: u64, from: SocketAddr, request: &[u8], out: &mut [u8]) -> Option<usize> {
        self.stats.requests += 1;
        self.stats.bytes_in += request.len() as u64;
        let head = request.get(..REQUEST_LEN).filter(|_| request.len() <= REQUEST_MAX_LEN);
        let Some(Ok(r)) = head.map(Request::new_checked) else {
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
        let verified = self.verified(now_ns, from, request);
        // No more bytes out than in until the requester has shown it receives there.
        let cap = out.len().min(self.cfg.packet_len_max).min(if verified { usize::MAX } else { request.len() });
        let (len, count) = self.build(r.sequence(), r.count(), session, &mut out[..cap]);
        let len = match (verified, count) {
            (_, 1..) => len,
            (false, 0) => self.challenge(now_ns, from, out)?,
            (true, 0) => return None,
        };
        if !self.spend(now_ns, from, len) {
            self.stats.budget_limited += 1;
            return None;
        }
        self.stats.bytes_out += len as u64;
        if !verified {
            self.stats.unverified += 1;
            self.stats.bytes_out_unverified += len as u64;
        }
        if count > 0 {
            self.stats.answers += 1;
            self.stats.messages_sent += u64::from(count);
        }
        Some(len)
    }

    /// The answer from `seq` (at most `count` messages) in `out`: its length and message count.
    fn build(&self, seq: u64, count: u16, session: Session, out: &mut [u8]) -> (usize, u16) {
        let Ok(mut b) = PacketBuilder::new(out, session, seq) else { return (0, 0) };
        let mut end = seq + u64::from(count.min(self.cfg.count_max));
        if self.cfg.keep_packet_boundaries {
            end = end.min(self.journal.packet_end(seq));
        }
        for s in seq..end {
            let Some(m) = self.journal.get(s) else { break };
            if b.push(m).is_err() {
                break;
            }
        }
        let n = b.count();
        (b.finish(), n)
    }
}

impl Bucket {
    fn refill(&mut self, now: u64, rate: f64, burst: f64) {
        self.tokens = (self.tokens + now.saturating_sub(self.at_ns) as f64 * rate / 1e9).min(burst);
        self.at_ns = self.at_ns.max(now);
    }

    fn take(&mut self, now: u64, rate: f64, burst: f64, n: f64) -> bool {
        self.refill(now, rate, burst);
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }
}

/// A client's side of the cookie exchange: sends requests with the
/// server's cookie once it has one, and answers a challenge by asking
/// again with it. Pure: the shell sends what it returns.
#[derive(Debug, Clone, Copy, Default)]
pub struct Requester {
    cookie: Option<[u8; COOKIE_LEN]>,
    /// The last request, asked again when a challenge arrives.
    last: Option<RequestRepr>,
    /// Challenges taken.
    pub challenges: u64,
}

impl Requester {
    /// `r` in `out` (with the cookie once known); its length.
    pub fn request(&mut self, r: RequestRepr, out: &mut [u8; REQUEST_WITH_COOKIE_LEN]) -> usize {
        self.last = Some(r);
        if r.emit(&mut out[..REQUEST_LEN]).is_err() {
            return 0;
        }
        match self.cookie {
            Some(c) => {
                out[REQUEST_LEN..].copy_from_slice(&c);
                REQUEST_WITH_COOKIE_LEN
            }
            None => REQUEST_LEN,
        }
    }

    /// Whether `datagram` (from the server) is a challenge rather than an answer.
    pub fn is_challenge(datagram: &[u8]) -> bool {
        datagram.len() == CHALLENGE_LEN && datagram[..CHALLENGE_MAGIC.len()] == CHALLENGE_MAGIC
    }

    /// Takes a challenge's cookie and returns the last request again, with
    /// it, in `out` (its length); `None` when `datagram` is no challenge.
    pub fn on_challenge(&mut self, datagram: &[u8], out: &mut [u8; REQUEST_WITH_COOKIE_LEN]) -> Option<usize> {
        if !Self::is_challenge(datagram) {
            return None;
        }
        let mut c = [0u8; COOKIE_LEN];
        c.copy_from_slice(&datagram[CHALLENGE_MAGIC.len()..]);
        self.cookie = Some(c);
        self.challenges += 1;
        let last = self.last?;
        Some(self.request(last, out))
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

    /// A request from `from` with its cookie (as after a challenge).
    fn v(s: &RetransmitServer, from: SocketAddr, seq: u64, count: u16) -> [u8; REQUEST_WITH_COOKIE_LEN] {
        let mut b = [0u8; REQUEST_WITH_COOKIE_LEN];
        b[..20].copy_from_slice(&req(seq, count));
        b[20..].copy_from_slice(&s.cookie(from, 0));
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
        assert_eq!(s.handle_request(0, from, &v(&s, from, 5, 10), &mut out), None, "an evicted range is out of range");
        assert_eq!(s.stats().out_of_range, 1);
        let n = s.handle_request(0, from, &v(&s, from, 99_991, 10), &mut out).unwrap();
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
        let n = s.handle_request(0, from, &v(&s, from, 101, 50), &mut out).unwrap();
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
            let n = s.handle_request(0, from, &v(&s, from, seq, 50), &mut out).unwrap();
            assert_eq!(Packet::new_checked(&out[..n]).unwrap().count(), want);
        }
        let mut s =
            RetransmitServer::new(journal(100), ServerConfig { keep_packet_boundaries: false, ..Default::default() });
        let n = s.handle_request(0, from, &v(&s, from, 5, 50), &mut out).unwrap();
        assert_eq!(Packet::new_checked(&out[..n]).unwrap().count(), 50);
    }

    #[test]
    fn bad_requests_get_nothing() {
        let mut s = RetransmitServer::new(journal(100), ServerConfig::default());
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut out = [0u8; 1400];
        assert!(s.handle_request(0, from, &v(&s, from, 101, 5), &mut out).is_none()); // past the end
        assert!(s.handle_request(0, from, &v(&s, from, 0, 5), &mut out).is_none()); // before the start
        assert!(s.handle_request(0, from, &v(&s, from, 5, 0), &mut out).is_none()); // count 0
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
        let answered = (0..10).filter(|_| s.handle_request(0, a, &v(&s, a, 1, 1), &mut out).is_some()).count();
        assert_eq!(answered, 3);
        assert!(s.handle_request(0, b, &v(&s, b, 1, 1), &mut out).is_some());
        // 100 ms later, one more token for a.
        assert!(s.handle_request(100_000_000, a, &v(&s, a, 1, 1), &mut out).is_some());
        assert!(s.handle_request(100_000_000, a, &v(&s, a, 1, 1), &mut out).is_none());
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

    #[test]
    fn an_unverified_requester_never_gets_more_bytes_than_it_sent_and_a_verified_one_gets_everything() {
        let mut s = RetransmitServer::with_secret(journal(1000), ServerConfig::default(), [1; 32]);
        let (victim, me): (SocketAddr, SocketAddr) = ("192.0.2.7:9".parse().unwrap(), "127.0.0.1:5".parse().unwrap());
        let mut out = [0u8; 1400];
        // A spoofed 20-byte request: a 20-byte challenge, nothing more.
        let n = s.handle_request(0, victim, &req(1, 50), &mut out).unwrap();
        assert_eq!(n, CHALLENGE_LEN);
        assert!(Requester::is_challenge(&out[..n]));
        assert!(Packet::new_checked(&out[..n]).map_or(true, |p| p.session() != Session::from_str_padded("S1")));
        // A padded request gets what fits its size.
        let mut padded = [0u8; 60];
        padded[..20].copy_from_slice(&req(1, 50));
        let n = s.handle_request(0, victim, &padded, &mut out).unwrap();
        assert!(n <= 60);
        assert_eq!(Packet::new_checked(&out[..n]).unwrap().count(), 2, "two 8-byte messages fit in 60 bytes");
        // Another address's cookie, or a cookie two periods old, does not verify.
        // (Unverified, its 36 bytes draw one 30-byte answer of one message.)
        let mut stolen = v(&s, me, 1, 50);
        let unverified = s.stats().unverified;
        assert_eq!(s.handle_request(0, victim, &stolen, &mut out), Some(30));
        stolen[20..].copy_from_slice(&s.cookie(victim, 0));
        assert_eq!(s.handle_request(2 * COOKIE_PERIOD_NS, victim, &stolen, &mut out), Some(30));
        let st = s.stats().clone();
        assert_eq!(st.unverified, unverified + 2);
        assert!(st.bytes_out_unverified <= st.bytes_in, "{st:?}");
        // A client through a Requester: the challenge, then the full answer.
        let mut c = Requester::default();
        let mut r = [0u8; REQUEST_WITH_COOKIE_LEN];
        let len = c.request(RequestRepr { session: Session::from_str_padded("S1"), sequence: 1, count: 50 }, &mut r);
        let n = s.handle_request(0, me, &r[..len], &mut out).unwrap();
        let len = c.on_challenge(&out[..n], &mut r).expect("a challenge");
        assert_eq!(len, REQUEST_WITH_COOKIE_LEN);
        let n = s.handle_request(0, me, &r[..len], &mut out).unwrap();
        assert!(!Requester::is_challenge(&out[..n]));
        assert_eq!(Packet::new_checked(&out[..n]).unwrap().count(), 2, "one original packet");
        // ... and the cookie is good for the next period too.
        let len = c.request(RequestRepr { session: Session::from_str_padded("S1"), sequence: 3, count: 2 }, &mut r);
        let n = s.handle_request(COOKIE_PERIOD_NS + 1, me, &r[..len], &mut out).unwrap();
        assert_eq!(Packet::new_checked(&out[..n]).unwrap().sequence(), 3);
        assert_eq!(c.on_challenge(&out[..n], &mut r), None, "an answer is no challenge");
    }

    #[test]
    fn byte_budgets_bound_what_verified_requesters_draw() {
        let cfg = ServerConfig {
            bytes_per_s: 10_000.0,
            bytes_per_s_per_requester: 4_000.0,
            keep_packet_boundaries: false,
            ..Default::default()
        };
        let mut s = RetransmitServer::with_secret(journal(10_000), cfg, [2; 32]);
        let mut out = [0u8; 1400];
        let mut drawn = 0;
        for port in 1..=10u16 {
            let from: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            for _ in 0..20 {
                drawn += s.handle_request(0, from, &v(&s, from, 1, 500), &mut out).unwrap_or(0);
            }
        }
        assert!(drawn <= 10_000, "the global budget: {drawn}");
        assert!(drawn > 8_000, "the budget is used: {drawn}");
        assert!(s.stats().budget_limited > 0);
        // One second later the budgets are full again.
        let from: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(s.handle_request(1_000_000_000, from, &v(&s, from, 1, 500), &mut out).is_some());
    }

    proptest::proptest! {
        #[test]
        fn no_datagram_from_an_unverified_source_draws_more_bytes_than_it_carried(
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1600),
            seq in 0u64..1200, count in 0u16..600, pad in 0usize..1500,
        ) {
            let mut s = RetransmitServer::with_secret(journal(1000), ServerConfig::default(), [3; 32]);
            let from: SocketAddr = "198.51.100.1:7".parse().unwrap();
            let mut out = [0u8; 1400];
            let n = s.handle_request(0, from, &b, &mut out).unwrap_or(0);
            proptest::prop_assert!(n <= b.len());
            let mut r = req(seq, count).to_vec();
            r.resize(20 + pad, 0);
            let n = s.handle_request(0, from, &r, &mut out).unwrap_or(0);
            proptest::prop_assert!(n <= r.len());
        }
    }
}
