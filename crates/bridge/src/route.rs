//! Which NATS subject each part of the feed goes to — sans-IO.
//!
//! The router reads MoldUDP64 packets of TotalView-ITCH 5.0 (the arbitrated
//! stream) and turns each into publications:
//!
//! | granularity | one publication per | payload |
//! |---|---|---|
//! | `packet` | MoldUDP64 packet | the packet, unchanged |
//! | `message` | ITCH message | the message |
//! | `batched` | (packet, subject) | the packet's messages for that subject, as MoldUDP64 message blocks (2-byte length + message) |
//!
//! Subjects (`prefix` is `ff.itch`, `<session>` the MoldUDP64 session, trimmed):
//! - by symbol: `<prefix>.<session>.<SYMBOL>.<type>` per message (`batch` in
//!   place of the type when batched); messages without a stock — system
//!   events, market-wide ones — go to `_SYS`; a stock locate not yet named by a
//!   Stock Directory message (joined mid-day) to `_L<locate>`.
//! - by service: `<prefix>.<session>.<service>.<type>`, with services
//!   `system` (S), `reference` (R H Y L V W K J h), `orders` (A F E C X D U),
//!   `trades` (P Q B), `imbalance` (I N O).
//! - whole packets: `<prefix>.<session>.pkt.<token>`, the token being the
//!   packet's one symbol or service, or `_MIXED` when its messages differ.
//!
//! Subject tokens keep letters, digits, `-` and `_`; anything else (a `.` in
//! "BRK.B", spaces, wildcards) becomes `_`. End of session is published on
//! `<prefix>.<session>.control.eos`; heartbeats are not published.
//!
//! Every publication carries its first MoldUDP64 sequence number and message
//! count, the bridge's publication number (`pub_seq`, consecutive: a
//! subscriber to everything detects gaps), and its number on its own subject
//! (`subject_seq`, consecutive per subject: a subscriber to some subjects
//! detects gaps on each).
//!
//! **The feed's own sequence is checked.** MoldUDP64 numbers every message;
//! the router expects each packet to start where the last one ended. A packet
//! (or heartbeat, or end of session) further on means messages lost before
//! the bridge: they are counted (`feed_gaps`, `feed_gap_messages`) and a gap
//! marker is published on `<prefix>.<session>.control.gap` — payload the first
//! missing sequence number and the number missing, 8 bytes each, big-endian —
//! so a subscriber tells a feed gap (a marker) from a broker gap (a hole in
//! `pub_seq` / `subject_seq`). A packet wholly behind (a duplicate, or the
//! other line of an A/B pair sent to the same port) is dropped and counted;
//! one partly behind publishes only its new messages (message and batched
//! granularity; whole packets go out as they came). A new session (another
//! session name) starts the count afresh; the first packet seen sets it
//! (a bridge joining mid-day reports no gap for what came before).

use std::collections::HashMap;
use std::ops::Range;

use async_nats::Subject;
use bytes::{Bytes, BytesMut};

use fairfeed_wire::itch::Message;
use fairfeed_wire::moldudp64::{Packet, Session, COUNT_END_OF_SESSION, COUNT_HEARTBEAT};

/// Stock locates tracked at most (ITCH's field is 16 bits).
pub const LOCATES_MAX: usize = 65_536;
/// Subjects whose per-subject counters are kept at most; beyond it, new
/// subjects share one overflow counter (and say so in their `subject_seq` = 0).
pub const SUBJECTS_MAX: usize = 100_000;

/// One publish per packet, per message, or per (packet, subject).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    Packet,
    Message,
    Batched,
    /// Per message while the broker keeps up, per (packet, subject) batch
    /// while it does not: the shell says which with [`Router::set_batching`]
    /// (the bridge: from its queue to the broker). Packets are routed whole
    /// either way and the queue is one FIFO, so no subject is reordered.
    Auto,
}

/// Subjects by symbol or by service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    Service,
    Symbol,
}

/// How to route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfig {
    pub granularity: Granularity,
    pub by: By,
    pub prefix: String,
}

impl Default for RouteConfig {
    fn default() -> Self {
        RouteConfig { granularity: Granularity::Message, by: By::Symbol, prefix: "ff.itch".into() }
    }
}

/// One thing to publish. Its subject is shared with the router's own copy
/// and its payload is a slice of one buffer per packet, so routing a packet
/// allocates once, however many publications it makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    pub subject: Subject,
    /// MoldUDP64 sequence number of its first message.
    pub seq: u64,
    /// Messages it carries.
    pub count: u16,
    /// The bridge's publication number, from 1, consecutive.
    pub pub_seq: u64,
    /// Its number on its subject, from 1, consecutive per subject.
    pub subject_seq: u64,
    /// The content, then the bridge's tag ([`crate::tag`]).
    pub payload: Bytes,
}

impl Publication {
    /// The content without the tag.
    pub fn body(&self) -> &[u8] {
        &self.payload[..self.payload.len().saturating_sub(crate::tag::TAG_LEN)]
    }
}

/// Router counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RouteStats {
    pub packets: u64,
    pub messages: u64,
    pub publications: u64,
    pub heartbeats: u64,
    pub bad_packets: u64,
    pub bad_messages: u64,
    pub unknown_locates: u64,
    pub subjects: usize,
    pub subjects_overflow: u64,
    /// Packets wholly behind the expected sequence number (dropped).
    pub duplicate_packets: u64,
    /// Messages of packets partly behind it (not published again).
    pub duplicate_messages: u64,
    /// Jumps in the feed's sequence (each published as a gap marker).
    pub feed_gaps: u64,
    /// Messages those jumps skipped.
    pub feed_gap_messages: u64,
    /// Payload bytes published (before the bridge's tag).
    pub payload_bytes: u64,
    /// `Auto` granularity: packets routed as batches, and switches between modes.
    pub auto_batched_packets: u64,
    pub auto_switches: u64,
}

/// The service an ITCH message type belongs to.
pub fn service(msg_type: u8) -> &'static str {
    match msg_type {
        b'S' => "system",
        b'A' | b'F' | b'E' | b'C' | b'X' | b'D' | b'U' => "orders",
        b'P' | b'Q' | b'B' => "trades",
        b'I' | b'N' | b'O' => "imbalance",
        _ => "reference",
    }
}

/// `s` as one NATS subject token.
pub fn token(s: &str) -> String {
    let t: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    if t.is_empty() {
        "_".into()
    } else {
        t
    }
}

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A subject token's place in [`Tokens`].
type TokenId = u32;
/// A subject's place in [`Subjects`].
type SubjectId = u32;

/// Subject tokens (symbols, services, `_SYS`, `_L<locate>`), each built once.
/// Hostile input can name any number of stocks: past [`SUBJECTS_MAX`] tokens
/// a new one is built for its message and not kept.
#[derive(Debug, Default)]
struct Tokens {
    strings: Vec<String>,
    by_stock: Map<[u8; 8], TokenId>,
    /// Names learned from the feed (a directory or any message naming the stock).
    by_locate: Map<u16, TokenId>,
    /// `_L<locate>` for locates not named yet.
    unknown: Map<u16, TokenId>,
}

/// The fixed tokens' ids.
const TOKEN_SYS: TokenId = 0;
const TOKEN_MIXED: TokenId = 1;
const TOKEN_SERVICE0: TokenId = 2;
const SERVICES: [&str; 5] = ["system", "reference", "orders", "trades", "imbalance"];

fn service_token(msg_type: u8) -> TokenId {
    let name = service(msg_type);
    TOKEN_SERVICE0 + SERVICES.iter().position(|s| *s == name).unwrap_or(1) as TokenId
}

impl Tokens {
    fn new() -> Self {
        let mut t = Tokens::default();
        t.strings.push("_SYS".into());
        t.strings.push("_MIXED".into());
        t.strings.extend(SERVICES.iter().map(|s| s.to_string()));
        t
    }

    fn add(&mut self, s: String) -> Option<TokenId> {
        (self.strings.len() < SUBJECTS_MAX).then(|| {
            self.strings.push(s);
            (self.strings.len() - 1) as TokenId
        })
    }
}

/// Subjects (`<prefix>.<session>.<token>.<kind>`), each built once per
/// session and numbered: a message's subject is a lookup of its (token, kind),
/// not a string built and hashed per message.
#[derive(Debug, Default)]
struct Subjects {
    names: Vec<Subject>,
    /// Publications so far on each subject.
    counts: Vec<u64>,
    /// Subjects by name: the same name reached from two tokens (a symbol
    /// named by the message and by its locate) shares one count.
    by_name: Map<String, SubjectId>,
    /// (token, kind) → subject in the current session; kind is the ITCH
    /// message type, or [`KIND_BATCH`] / [`KIND_PACKET`].
    by_key: Map<(TokenId, u16), SubjectId>,
}

/// Kinds of subject besides a message type (any byte off the wire, 0..=255).
const KIND_BATCH: u16 = 256;
const KIND_PACKET: u16 = 257;

/// What a publication's subject is.
enum Named {
    /// A numbered subject.
    Known(SubjectId),
    /// Beyond [`SUBJECTS_MAX`]: the name, its publications not counted.
    Untracked(Subject),
}

/// A publication routed and written into the packet's buffer, not handed on yet.
#[derive(Debug)]
struct Pending {
    subject: Subject,
    seq: u64,
    count: u16,
    pub_seq: u64,
    subject_seq: u64,
    range: Range<usize>,
}

/// The router: subjects, symbol names learned from the feed, counters.
#[derive(Debug)]
pub struct Router {
    cfg: RouteConfig,
    tokens: Tokens,
    subjects: Subjects,
    /// The session's subject token, and the raw session it was made from.
    session: Option<(Session, String)>,
    pub_seq: u64,
    pub stats: RouteStats,
    groups: Vec<(TokenId, u64, u16, Vec<u8>)>,
    /// The session and the sequence number expected next on it.
    expect: Option<(Session, u64)>,
    /// The session whose end was published (a second end of it is a duplicate).
    ended: Option<Session>,
    /// `Auto` granularity: batch now.
    batching: bool,
    /// The packet being routed: its publications' payloads and tags, one
    /// after another, and what each is.
    buf: BytesMut,
    pending: Vec<Pending>,
    /// When the packet being routed arrived (the tag's latency stamp).
    ingress_ns: u64,
}

/// Bytes a batch's payload is given beyond its first block.
const BATCH_SPARE: usize = 64;

impl Router {
    pub fn new(cfg: RouteConfig) -> Self {
        Router {
            cfg,
            tokens: Tokens::new(),
            subjects: Subjects::default(),
            session: None,
            pub_seq: 0,
            stats: RouteStats::default(),
            groups: Vec::new(),
            expect: None,
            ended: None,
            batching: false,
            buf: BytesMut::new(),
            pending: Vec::new(),
            ingress_ns: 0,
        }
    }

    pub fn config(&self) -> &RouteConfig {
        &self.cfg
    }

    /// For `Auto` granularity: batch the packets routed from now on (or stop).
    pub fn set_batching(&mut self, on: bool) {
        if on != self.batching {
            self.stats.auto_switches += 1;
        }
        self.batching = on;
    }

    /// The session's token; a new session starts its subjects afresh.
    fn session_token(&mut self, session: Session) -> String {
        match &self.session {
            Some((s, t)) if *s == session => t.clone(),
            _ => {
                let t = token(&String::from_utf8_lossy(session.trimmed()));
                self.session = Some((session, t.clone()));
                self.subjects.by_key.clear();
                t
            }
        }
    }

    /// The symbol or service token of one message (learning names from the feed).
    fn key(&mut self, m: &[u8]) -> TokenId {
        let t = m[0];
        if self.cfg.by == By::Service {
            return service_token(t);
        }
        let locate = if m.len() >= 3 { u16::from_be_bytes([m[1], m[2]]) } else { 0 };
        if let Ok(msg) = Message::parse(m) {
            if let Some(stock) = msg.stock() {
                let mut raw = [b' '; 8];
                let trimmed = stock.trimmed();
                raw[..trimmed.len().min(8)].copy_from_slice(&trimmed[..trimmed.len().min(8)]);
                let id = match self.tokens.by_stock.get(&raw) {
                    Some(&id) => Some(id),
                    None => {
                        let id = self.tokens.add(token(&String::from_utf8_lossy(trimmed)));
                        if let Some(id) = id {
                            self.tokens.by_stock.insert(raw, id);
                        }
                        id
                    }
                };
                let Some(id) = id else {
                    // Past the token limit: this message's subject is not numbered.
                    return TokenId::MAX;
                };
                if locate != 0 && self.tokens.by_locate.len() < LOCATES_MAX {
                    self.tokens.by_locate.entry(locate).or_insert(id);
                }
                return id;
            }
        }
        if locate == 0 {
            return TOKEN_SYS;
        }
        if let Some(&id) = self.tokens.by_locate.get(&locate) {
            return id;
        }
        self.stats.unknown_locates += 1;
        match self.tokens.unknown.get(&locate) {
            Some(&id) => id,
            None => match self.tokens.add(format!("_L{locate}")) {
                Some(id) => {
                    self.tokens.unknown.insert(locate, id);
                    id
                }
                None => TokenId::MAX,
            },
        }
    }

    /// The name of `tok` for a message `m` (rebuilt when it is past the limit).
    fn token_name(&self, tok: TokenId, m: Option<&[u8]>) -> String {
        if let Some(s) = self.tokens.strings.get(tok as usize) {
            return s.clone();
        }
        let Some(m) = m else { return "_MIXED".into() };
        match Message::parse(m).ok().and_then(|msg| msg.stock()) {
            Some(stock) => token(&String::from_utf8_lossy(stock.trimmed())),
            None if m.len() >= 3 => format!("_L{}", u16::from_be_bytes([m[1], m[2]])),
            None => "_SYS".into(),
        }
    }

    /// The subject of (token, kind) in `session`; `m` is the message, to name
    /// a token past the limit.
    fn subject(&mut self, session: &str, tok: TokenId, kind: u16, m: Option<&[u8]>) -> Named {
        if let Some(&id) = self.subjects.by_key.get(&(tok, kind)) {
            return Named::Known(id);
        }
        let suffix: std::borrow::Cow<'static, str> = match kind {
            KIND_BATCH => "batch".into(),
            KIND_PACKET => "".into(),
            // A message type from the wire: letters and digits as they are,
            // anything else (a space, a wildcard) as `_`, like every token.
            t if (t as u8).is_ascii_alphanumeric() => ((t as u8) as char).to_string().into(),
            _ => "_".into(),
        };
        let name = match kind {
            KIND_PACKET => format!("{}.{session}.pkt.{}", self.cfg.prefix, self.token_name(tok, m)),
            _ => format!("{}.{session}.{}.{suffix}", self.cfg.prefix, self.token_name(tok, m)),
        };
        if tok == TokenId::MAX {
            return self.subject_named(name);
        }
        let s = self.subject_named(name);
        if let Named::Known(id) = s {
            self.subjects.by_key.insert((tok, kind), id);
        }
        s
    }

    /// The subject called `name` (control subjects, and the slow path).
    fn subject_named(&mut self, name: String) -> Named {
        if let Some(&id) = self.subjects.by_name.get(name.as_str()) {
            return Named::Known(id);
        }
        if self.subjects.names.len() >= SUBJECTS_MAX {
            return Named::Untracked(Subject::from(name));
        }
        let id = self.subjects.names.len() as SubjectId;
        self.subjects.names.push(Subject::from(name.as_str()));
        self.subjects.counts.push(0);
        self.subjects.by_name.insert(name, id);
        self.stats.subjects = self.subjects.names.len();
        Named::Known(id)
    }

    /// Numbers a publication of `parts` (concatenated) on `subject` and
    /// writes it, with its tag, into the packet's buffer.
    fn emit(&mut self, subject: Named, seq: u64, count: u16, parts: &[&[u8]]) {
        self.pub_seq += 1;
        let (subject, subject_seq) = match subject {
            Named::Known(id) => {
                let n = &mut self.subjects.counts[id as usize];
                *n += 1;
                (self.subjects.names[id as usize].clone(), *n)
            }
            Named::Untracked(name) => {
                self.stats.subjects_overflow += 1;
                (name, 0)
            }
        };
        let start = self.buf.len();
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.stats.publications += 1;
        self.stats.payload_bytes += (self.buf.len() - start) as u64;
        let tag = crate::tag::Tag { seq, count, pub_seq: self.pub_seq, subject_seq, ingress_ns: self.ingress_ns };
        tag.write(&mut self.buf);
        let range = start..self.buf.len();
        self.pending.push(Pending { subject, seq, count, pub_seq: self.pub_seq, subject_seq, range });
    }

    /// Hands on the packet's publications, their payloads slices of one buffer.
    fn flush(&mut self, out: &mut impl FnMut(Publication)) {
        if self.pending.is_empty() {
            return;
        }
        let all = std::mem::take(&mut self.buf).freeze();
        for p in self.pending.drain(..) {
            out(Publication {
                subject: p.subject,
                seq: p.seq,
                count: p.count,
                pub_seq: p.pub_seq,
                subject_seq: p.subject_seq,
                payload: all.slice(p.range),
            });
        }
    }

    /// Checks `p`'s place in the feed's sequence: publishes a gap marker for
    /// messages skipped, and returns how many of its messages were already
    /// routed (all of them: a duplicate, dropped).
    fn sequence_check(&mut self, p: &Packet<&[u8]>, session: &str) -> u64 {
        let (seq, count) = (p.sequence(), p.count());
        let carried = if count == COUNT_HEARTBEAT || count == COUNT_END_OF_SESSION { 0 } else { u64::from(count) };
        let next = match self.expect {
            Some((s, next)) if s == p.session() => next,
            // First packet, or a new session: nothing to compare with.
            _ => seq,
        };
        if seq > next {
            let missing = seq - next;
            self.stats.feed_gaps += 1;
            self.stats.feed_gap_messages += missing;
            let subject = self.subject_named(format!("{}.{session}.control.gap", self.cfg.prefix));
            self.emit(subject, next, 0, &[&next.to_be_bytes(), &missing.to_be_bytes()]);
        }
        self.expect = Some((p.session(), next.max(seq + carried)));
        let behind = next.saturating_sub(seq).min(carried);
        if carried > 0 && behind == carried {
            self.stats.duplicate_packets += 1;
        } else {
            self.stats.duplicate_messages += behind;
        }
        behind
    }

    /// One publication per (packet, subject): the packet's messages for it
    /// as MoldUDP64-style blocks, in the order their subjects first appear.
    fn route_batched(&mut self, session: &str, keys: Vec<(u64, u8, TokenId, &[u8])>) {
        // Groups are kept between packets (their buffers too): `used` of them are this packet's.
        let mut groups = std::mem::take(&mut self.groups);
        let mut used = 0;
        // Tokens past the limit are named per message, so each gets a group of its own name.
        let mut untracked: Vec<(String, u64, u16, Vec<u8>)> = Vec::new();
        for (seq, _, k, m) in keys {
            let block = |v: &mut Vec<u8>| {
                v.extend_from_slice(&(m.len() as u16).to_be_bytes());
                v.extend_from_slice(m);
            };
            if k == TokenId::MAX {
                let name = self.token_name(k, Some(m));
                match untracked.iter_mut().find(|g| g.0 == name) {
                    Some(g) => {
                        g.2 += 1;
                        block(&mut g.3);
                    }
                    None => {
                        let mut v = Vec::with_capacity(BATCH_SPARE);
                        block(&mut v);
                        untracked.push((name, seq, 1, v));
                    }
                }
                continue;
            }
            match groups[..used].iter_mut().find(|g| g.0 == k) {
                Some(g) => {
                    g.2 += 1;
                    block(&mut g.3);
                }
                None => {
                    if used == groups.len() {
                        groups.push((k, seq, 0, Vec::with_capacity(BATCH_SPARE)));
                    }
                    let g = &mut groups[used];
                    g.3.clear();
                    (g.0, g.1, g.2) = (k, seq, 1);
                    block(&mut g.3);
                    used += 1;
                }
            }
        }
        for g in &groups[..used] {
            let subject = self.subject(session, g.0, KIND_BATCH, None);
            self.emit(subject, g.1, g.2, &[&g.3]);
        }
        for (name, seq, count, payload) in untracked {
            let subject = self.subject_named(format!("{}.{session}.{name}.batch", self.cfg.prefix));
            self.emit(subject, seq, count, &[&payload]);
        }
        self.groups = groups;
    }

    /// Routes one MoldUDP64 packet that arrived at `ingress_ns` (CLOCK_REALTIME
    /// ns, the tag's latency stamp); hands `out` the publications it made,
    /// each tagged, and returns how many.
    pub fn route(&mut self, packet: &[u8], ingress_ns: u64, mut out: impl FnMut(Publication)) -> usize {
        let before = self.stats.publications;
        self.ingress_ns = ingress_ns;
        let n = self.route_packet(packet);
        self.flush(&mut out);
        debug_assert_eq!(self.stats.publications - before, n as u64);
        n
    }

    /// Routes one packet into the buffer; returns the publications it made.
    fn route_packet(&mut self, packet: &[u8]) -> usize {
        let before = self.stats.publications;
        let Ok(p) = Packet::new_checked(packet) else {
            self.stats.bad_packets += 1;
            return 0;
        };
        self.stats.packets += 1;
        let session = self.session_token(p.session());
        let behind = self.sequence_check(&p, &session);
        // Room for the packet's content and a tag per message (one allocation).
        self.buf.reserve(packet.len() + usize::from(p.message_count().min(512)) * crate::tag::TAG_LEN + 64);
        // `count`, not `message_count` (0 for an end of session as for a heartbeat).
        let carried = p.count();
        if carried != COUNT_HEARTBEAT && carried != COUNT_END_OF_SESSION && behind == u64::from(carried) {
            return (self.stats.publications - before) as usize;
        }
        match p.count() {
            COUNT_HEARTBEAT => {
                self.stats.heartbeats += 1;
                return (self.stats.publications - before) as usize;
            }
            COUNT_END_OF_SESSION if self.ended == Some(p.session()) => {
                self.stats.duplicate_packets += 1;
                return (self.stats.publications - before) as usize;
            }
            COUNT_END_OF_SESSION => {
                self.ended = Some(p.session());
                let subject = self.subject_named(format!("{}.{session}.control.eos", self.cfg.prefix));
                self.emit(subject, p.sequence(), 0, &[packet]);
                return (self.stats.publications - before) as usize;
            }
            _ => {}
        }
        let base = p.sequence();
        let mut keys: Vec<(u64, u8, TokenId, &[u8])> = Vec::with_capacity(usize::from(p.message_count()));
        for (i, m) in p.messages().enumerate().skip(behind as usize) {
            match m {
                Ok(m) if !m.is_empty() => {
                    let k = self.key(m);
                    keys.push((base + i as u64, m[0], k, m));
                }
                _ => self.stats.bad_messages += 1,
            }
        }
        self.stats.messages += keys.len() as u64;
        let granularity = match self.cfg.granularity {
            Granularity::Auto if self.batching => {
                self.stats.auto_batched_packets += 1;
                Granularity::Batched
            }
            Granularity::Auto => Granularity::Message,
            g => g,
        };
        match granularity {
            Granularity::Packet => {
                let first = keys.first().map_or(TOKEN_MIXED, |k| k.2);
                let same = first != TokenId::MAX && keys.iter().all(|k| k.2 == first);
                let tok = if same { first } else { TOKEN_MIXED };
                let subject = self.subject(&session, tok, KIND_PACKET, None);
                self.emit(subject, base, p.message_count(), &[packet]);
            }
            Granularity::Message | Granularity::Auto => {
                for (seq, t, k, m) in keys {
                    let subject = self.subject(&session, k, u16::from(t), Some(m));
                    self.emit(subject, seq, 1, &[m]);
                }
            }
            Granularity::Batched => self.route_batched(&session, keys),
        }
        (self.stats.publications - before) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_feed::gen::{GenConfig, Generator};
    use fairfeed_wire::moldudp64::{PacketBuilder, Session};
    use std::collections::HashMap;

    fn feed(messages: u64, seed: u64) -> Vec<Vec<u8>> {
        let g = Generator::new(GenConfig { seed, messages, symbols: 20, ..GenConfig::default() }).unwrap();
        g.map(|p| p.payload).collect()
    }

    /// Every ITCH message of the feed by sequence number.
    fn messages(feed: &[Vec<u8>]) -> HashMap<u64, Vec<u8>> {
        let mut out = HashMap::new();
        for p in feed {
            let pk = Packet::new_checked(&p[..]).unwrap();
            let c = pk.message_count();
            if c == 0 || c == COUNT_END_OF_SESSION {
                continue;
            }
            for (i, m) in pk.messages().enumerate() {
                out.insert(pk.sequence() + i as u64, m.unwrap().to_vec());
            }
        }
        out
    }

    /// Splits a batched payload back into messages.
    fn blocks(mut b: &[u8]) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        while b.len() >= 2 {
            let n = usize::from(u16::from_be_bytes([b[0], b[1]]));
            v.push(b[2..2 + n].to_vec());
            b = &b[2 + n..];
        }
        assert!(b.is_empty());
        v
    }

    fn all(cfg: RouteConfig, feed: &[Vec<u8>]) -> (Vec<Publication>, RouteStats) {
        let mut r = Router::new(cfg);
        let mut out = Vec::new();
        for p in feed {
            r.route(p, 1, |x| out.push(x));
        }
        (out, r.stats)
    }

    #[test]
    fn every_message_is_published_once_at_every_granularity() {
        let f = feed(20_000, 3);
        let want = messages(&f);
        for by in [By::Symbol, By::Service] {
            for g in [Granularity::Message, Granularity::Batched, Granularity::Packet] {
                let (pubs, stats) = all(RouteConfig { granularity: g, by, ..RouteConfig::default() }, &f);
                let mut got: HashMap<u64, Vec<u8>> = HashMap::new();
                for (i, p) in pubs.iter().enumerate() {
                    assert_eq!(p.pub_seq, i as u64 + 1, "publication numbers are consecutive");
                    if p.subject.ends_with("control.eos") {
                        continue;
                    }
                    let parts: Vec<Vec<u8>> = match g {
                        Granularity::Message => vec![p.body().to_vec()],
                        Granularity::Batched => blocks(p.body()),
                        Granularity::Packet => {
                            Packet::new_checked(p.body()).unwrap().messages().map(|m| m.unwrap().to_vec()).collect()
                        }
                        Granularity::Auto => unreachable!("not in this loop"),
                    };
                    assert_eq!(parts.len(), usize::from(p.count), "{g:?}: count header matches");
                    for (k, m) in parts.into_iter().enumerate() {
                        assert!(got.insert(p.seq + k as u64, m).is_none() || g == Granularity::Batched, "twice");
                    }
                }
                if g != Granularity::Batched {
                    assert_eq!(got, want, "{g:?} by {by:?}");
                }
                assert_eq!(stats.messages as usize, want.len());
                assert_eq!(stats.bad_packets + stats.bad_messages, 0);
            }
        }
    }

    #[test]
    fn batched_groups_keep_every_message_on_its_symbols_subject() {
        let f = feed(20_000, 4);
        let want = messages(&f);
        let (msg_pubs, _) = all(RouteConfig::default(), &f);
        let subject_of: HashMap<Vec<u8>, String> = msg_pubs
            .iter()
            .filter(|p| !p.subject.ends_with("eos"))
            .map(|p| (p.body().to_vec(), p.subject.rsplit_once('.').unwrap().0.to_string()))
            .collect();
        let (pubs, _) = all(RouteConfig { granularity: Granularity::Batched, ..RouteConfig::default() }, &f);
        let mut n = 0;
        for p in pubs.iter().filter(|p| p.subject.ends_with(".batch")) {
            let base = p.subject.strip_suffix(".batch").unwrap();
            for m in blocks(p.body()) {
                assert_eq!(subject_of[&m], base, "a message in another symbol's batch");
                n += 1;
            }
        }
        assert_eq!(n, want.len());
        assert!(pubs.len() < msg_pubs.len() / 2, "batching cuts publications: {} vs {}", pubs.len(), msg_pubs.len());
    }

    #[test]
    fn subjects_name_symbols_services_and_unknown_locates() {
        let session = Session::from_str_padded("SESS 1");
        let dir = fairfeed_wire::itch::StockDirectoryRepr {
            stock_locate: 7,
            stock: fairfeed_wire::Alpha::from_str_padded("BRK.B"),
            ..Default::default()
        };
        let mut m = [0u8; 39];
        dir.emit(&mut m).unwrap();
        let mut exec = [0u8; 31];
        exec[0] = b'E';
        exec[1..3].copy_from_slice(&7u16.to_be_bytes());
        let mut other = exec;
        other[1..3].copy_from_slice(&9u16.to_be_bytes());
        let mut buf = vec![0u8; 1400];
        let mut b = PacketBuilder::new(&mut buf, session, 1).unwrap();
        b.push(&m).unwrap();
        b.push(&exec).unwrap();
        b.push(&other).unwrap();
        let n = b.finish();
        let pkt = buf[..n].to_vec();
        let subjects = |cfg: RouteConfig| {
            let mut r = Router::new(cfg);
            let mut v = Vec::new();
            r.route(&pkt, 1, |p| v.push(p.subject.to_string()));
            v
        };
        assert_eq!(
            subjects(RouteConfig::default()),
            ["ff.itch.SESS_1.BRK_B.R", "ff.itch.SESS_1.BRK_B.E", "ff.itch.SESS_1._L9.E"]
        );
        let by_service = RouteConfig { by: By::Service, ..RouteConfig::default() };
        assert_eq!(
            subjects(by_service),
            ["ff.itch.SESS_1.reference.R", "ff.itch.SESS_1.orders.E", "ff.itch.SESS_1.orders.E"]
        );
        let batched = RouteConfig { granularity: Granularity::Batched, ..RouteConfig::default() };
        assert_eq!(subjects(batched), ["ff.itch.SESS_1.BRK_B.batch", "ff.itch.SESS_1._L9.batch"]);
        let packet = RouteConfig { granularity: Granularity::Packet, ..RouteConfig::default() };
        assert_eq!(subjects(packet), ["ff.itch.SESS_1.pkt._MIXED"]);
    }

    /// A packet's publications are slices of one buffer, one after another,
    /// each ending in its tag: routing a packet allocates its payloads once.
    #[test]
    fn a_packets_publications_share_one_buffer_each_tagged() {
        let f = feed(2_000, 9);
        let mut r = Router::new(RouteConfig::default());
        let mut checked = 0;
        for (i, p) in f.iter().enumerate() {
            let mut pubs = Vec::new();
            r.route(p, 1_000 + i as u64, |x| pubs.push(x));
            for w in pubs.windows(2) {
                let end = w[0].payload.as_ptr() as usize + w[0].payload.len();
                assert_eq!(w[1].payload.as_ptr() as usize, end, "contiguous in one buffer");
                checked += 1;
            }
            for x in &pubs {
                let (body, tag) = crate::tag::split(&x.payload).expect("tagged");
                assert_eq!(body, x.body());
                assert_eq!((tag.seq, tag.count, tag.pub_seq), (x.seq, x.count, x.pub_seq));
                assert_eq!((tag.subject_seq, tag.ingress_ns), (x.subject_seq, 1_000 + i as u64));
            }
        }
        assert!(checked > 1_000, "{checked}");
    }

    /// Subjects go to the broker unchecked by the client (the bridge skips
    /// its validation), so a message type off the wire must not put a space
    /// or a wildcard into one.
    #[test]
    fn hostile_message_types_make_valid_subjects() {
        let session = Session::from_str_padded("S");
        for t in [b' ', b'>', b'*', b'\n', b'.', 0xE9, 0] {
            let mut m = [0u8; 12];
            m[0] = t;
            m[1..3].copy_from_slice(&9u16.to_be_bytes());
            let mut buf = vec![0u8; 200];
            let mut b = PacketBuilder::new(&mut buf, session, 1).unwrap();
            b.push(&m).unwrap();
            let n = b.finish();
            let mut r = Router::new(RouteConfig::default());
            let mut subjects = Vec::new();
            r.route(&buf[..n], 1, |p| subjects.push(p.subject.to_string()));
            assert_eq!(subjects, ["ff.itch.S._L9._"], "type {t:#04x}");
            assert!(crate::publish::valid_prefix(&subjects[0]));
        }
        for bad in ["", "a b", "a..b", ".a", "a.", "a.*", "a.>", "a\tb", "é"] {
            assert!(!crate::publish::valid_prefix(bad), "{bad:?}");
        }
        assert!(crate::publish::valid_prefix("ff.itch-2_x"));
    }

    /// A feed naming more stocks than the router keeps subjects for: every
    /// message is still published on its own symbol's subject, the subjects
    /// past the limit are named per message and counted, and nothing kept
    /// grows past its limit.
    #[test]
    fn more_symbols_than_subjects_are_published_untracked_and_counted() {
        let names = SUBJECTS_MAX + 50;
        let session = Session::from_str_padded("S");
        let mut buf = vec![0u8; 1400];
        let mut packets = Vec::new();
        let mut seq = 1;
        for chunk in (0..names).collect::<Vec<_>>().chunks(30) {
            let mut b = PacketBuilder::new(&mut buf, session, seq).unwrap();
            for &i in chunk {
                let dir = fairfeed_wire::itch::StockDirectoryRepr {
                    // Locates repeat: names learned first keep their locate.
                    stock_locate: (i % 60_000) as u16 + 1,
                    stock: fairfeed_wire::Alpha::from_str_padded(&format!("Z{i}")),
                    ..Default::default()
                };
                let mut m = [0u8; 39];
                dir.emit(&mut m).unwrap();
                b.push(&m).unwrap();
            }
            seq += chunk.len() as u64;
            let n = b.finish();
            packets.push(buf[..n].to_vec());
        }
        for g in [Granularity::Message, Granularity::Batched, Granularity::Packet] {
            let mut r = Router::new(RouteConfig { granularity: g, ..RouteConfig::default() });
            let mut published = 0;
            let mut untracked = 0;
            for p in &packets {
                r.route(p, 1, |p| {
                    published += u64::from(p.count);
                    if p.subject_seq == 0 {
                        untracked += 1;
                    }
                    if g != Granularity::Packet {
                        let name = p.subject.split('.').nth(3).unwrap();
                        let body =
                            if g == Granularity::Message { p.body().to_vec() } else { blocks(p.body())[0].clone() };
                        let want =
                            format!("Z{}", String::from_utf8_lossy(&body[11..19]).trim().trim_start_matches('Z'));
                        assert_eq!(name, want, "{g:?}");
                    }
                });
            }
            assert_eq!(published, names as u64, "{g:?}");
            assert_eq!(r.stats.bad_messages, 0);
            assert!(r.stats.subjects <= SUBJECTS_MAX, "{g:?}");
            assert!(r.tokens.strings.len() <= SUBJECTS_MAX);
            assert!(r.tokens.by_stock.len() <= SUBJECTS_MAX && r.tokens.by_locate.len() <= LOCATES_MAX);
            if g == Granularity::Message {
                assert_eq!(r.stats.subjects, SUBJECTS_MAX);
                assert_eq!(r.stats.subjects_overflow, untracked);
                assert!(untracked >= 50, "{untracked}");
            }
        }
    }

    #[test]
    fn bad_packets_are_counted_not_published() {
        let mut r = Router::new(RouteConfig::default());
        assert_eq!(r.route(&[1, 2, 3], 1, |_| panic!("published garbage")), 0);
        assert_eq!(r.stats.bad_packets, 1);
        assert_eq!(token("a.b c*>"), "a_b_c__");
    }

    /// Packets of `f` with a data message count (not heartbeats or the end).
    fn data(f: &[Vec<u8>]) -> Vec<usize> {
        (0..f.len())
            .filter(|&i| {
                let c = Packet::new_checked(&f[i][..]).unwrap().message_count();
                c != 0 && c != COUNT_END_OF_SESSION
            })
            .collect()
    }

    #[test]
    fn packets_lost_before_the_bridge_become_counted_gap_markers() {
        let f = feed(5_000, 8);
        let d = data(&f);
        // Drop one run of three packets and two single packets.
        let dropped: std::collections::BTreeSet<usize> = [d[10], d[11], d[12], d[40], d[90]].into();
        let missing: u64 =
            dropped.iter().map(|&i| u64::from(Packet::new_checked(&f[i][..]).unwrap().message_count())).sum();
        let kept: Vec<Vec<u8>> =
            f.iter().enumerate().filter(|(i, _)| !dropped.contains(i)).map(|x| x.1.clone()).collect();
        let (out, st) = all(RouteConfig::default(), &kept);
        assert_eq!((st.feed_gaps, st.feed_gap_messages, st.duplicate_packets), (3, missing, 0), "{st:?}");
        let markers: Vec<&Publication> = out.iter().filter(|p| p.subject.ends_with(".control.gap")).collect();
        assert_eq!(markers.len(), 3);
        for (m, run) in markers.iter().zip([&[d[10], d[11], d[12]][..], &[d[40]], &[d[90]]]) {
            let first = Packet::new_checked(&f[run[0]][..]).unwrap().sequence();
            let n: u64 = run.iter().map(|&i| u64::from(Packet::new_checked(&f[i][..]).unwrap().message_count())).sum();
            let got = (
                u64::from_be_bytes(m.body()[..8].try_into().unwrap()),
                u64::from_be_bytes(m.body()[8..].try_into().unwrap()),
            );
            assert_eq!((m.seq, m.count, got), (first, 0, (first, n)), "{}", m.subject);
        }
        // Everything that arrived is still published, once.
        let want = messages(&kept);
        let got: Vec<u64> = out.iter().filter(|p| p.count == 1).map(|p| p.seq).collect();
        assert_eq!(got.len(), want.len());
    }

    #[test]
    fn a_and_b_copies_to_one_bridge_publish_once() {
        let f = feed(3_000, 9);
        let (single, _) = all(RouteConfig::default(), &f);
        let both: Vec<Vec<u8>> = f.iter().flat_map(|p| [p.clone(), p.clone()]).collect();
        let (out, st) = all(RouteConfig::default(), &both);
        let strip =
            |v: &[Publication]| v.iter().map(|p| (p.subject.to_string(), p.seq, p.body().to_vec())).collect::<Vec<_>>();
        assert_eq!(strip(&out), strip(&single), "the second copy of every packet publishes nothing");
        let ends = f.iter().filter(|p| Packet::new_checked(&p[..]).unwrap().is_end_of_session()).count();
        assert_eq!(st.duplicate_packets as usize, data(&f).len() + ends, "every data packet and the end: {st:?}");
        assert_eq!((st.feed_gaps, st.duplicate_messages), (0, 0));
    }

    #[test]
    fn a_packet_partly_behind_publishes_only_its_new_messages() {
        let s = Session::from_str_padded("TEST000001");
        let pkt = |seq: u64, n: u8| {
            let mut buf = vec![0u8; 1400];
            let mut b = PacketBuilder::new(&mut buf[..], s, seq).unwrap();
            for k in 0..n {
                // A System Event message (12 bytes), its code byte marking which one.
                let mut m = [0u8; 12];
                m[0] = b'S';
                m[11] = b'A' + (seq as u8 + k);
                b.push(&m).unwrap();
            }
            let len = b.finish();
            buf.truncate(len);
            buf
        };
        let mut r = Router::new(RouteConfig::default());
        let mut out = Vec::new();
        r.route(&pkt(1, 3), 1, |p| out.push(p));
        r.route(&pkt(2, 3), 1, |p| out.push(p)); // 2 and 3 again, 4 new
        r.route(&pkt(7, 1), 1, |p| out.push(p)); // 5 and 6 lost
        let seqs: Vec<(u64, String)> =
            out.iter().map(|p| (p.seq, p.subject.rsplit('.').next().unwrap().to_string())).collect();
        assert_eq!(
            seqs,
            [(1, "S"), (2, "S"), (3, "S"), (4, "S"), (5, "gap"), (7, "S")].map(|(a, b)| (a, b.to_string()))
        );
        assert_eq!((r.stats.duplicate_messages, r.stats.duplicate_packets, r.stats.feed_gap_messages), (2, 0, 2));
        // A new session starts afresh: no gap, nothing behind.
        let mut buf = [0u8; 64];
        let b = PacketBuilder::new(&mut buf[..], Session::from_str_padded("TEST000002"), 1).unwrap();
        let len = b.finish();
        r.route(&buf[..len], 1, |p| out.push(p));
        assert_eq!(r.stats.feed_gaps, 1);
        // Its end of session, from both lines: published once.
        let mut eos = buf[..len].to_vec();
        eos[18..20].copy_from_slice(&COUNT_END_OF_SESSION.to_be_bytes());
        let n = out.len();
        r.route(&eos, 1, |p| out.push(p));
        r.route(&eos, 1, |p| out.push(p));
        assert_eq!((out.len() - n, r.stats.duplicate_packets), (1, 1), "{:?}", r.stats);
        assert!(out.last().unwrap().subject.ends_with(".control.eos"));
    }

    #[test]
    fn auto_switches_between_messages_and_batches_without_losing_or_reordering() {
        let f = feed(6_000, 13);
        let want = messages(&f);
        let mut r = Router::new(RouteConfig { granularity: Granularity::Auto, ..RouteConfig::default() });
        let mut out = Vec::new();
        for (i, p) in f.iter().enumerate() {
            // Batch for a stretch, as a bridge whose broker fell behind would.
            r.set_batching((i / 200) % 2 == 1);
            r.route(p, 1, |x| out.push(x));
        }
        assert!(r.stats.auto_batched_packets > 0 && r.stats.auto_switches >= 4, "{:?}", r.stats);
        let (mut got, mut per_symbol): (Vec<Vec<u8>>, HashMap<String, Vec<u64>>) = (Vec::new(), HashMap::new());
        for p in &out {
            if p.subject.contains(".control.") {
                continue;
            }
            let parts = if p.subject.ends_with(".batch") { blocks(p.body()) } else { vec![p.body().to_vec()] };
            let symbol = p.subject.split('.').nth(3).unwrap().to_string();
            per_symbol.entry(symbol).or_default().push(p.seq);
            got.extend(parts);
        }
        let mut w: Vec<Vec<u8>> = want.into_values().collect();
        got.sort();
        w.sort();
        assert_eq!(got, w, "every message once, whichever mode carried it");
        for (sym, seqs) in per_symbol {
            assert!(seqs.windows(2).all(|x| x[0] < x[1]), "{sym}: a symbol's publications stay in feed order");
        }
    }
}
