//! Whole-feed decoding: MoldUDP64 sequence tracking per session, ITCH message
//! counts per type, gaps and typed error counts. Pure: fed one UDP payload at
//! a time, so it serves files (`fairfeed decode`) and live sockets alike.

use std::collections::BTreeMap;

use fairfeed_wire::itch;
use fairfeed_wire::moldudp64::Packet;
use serde::Serialize;

/// Gap ranges kept in a summary; further gaps are only counted.
pub const GAP_LIST_MAX: usize = 1000;

/// What one packet held, for printing.
#[derive(Debug)]
pub enum PacketEvent<'a> {
    /// A data packet; each block decoded or the error that stopped it.
    Data {
        session: String,
        sequence: u64,
        messages: Vec<Result<itch::Message<'a>, fairfeed_wire::Error>>,
    },
    Heartbeat {
        session: String,
        next_sequence: u64,
    },
    EndOfSession {
        session: String,
        next_sequence: u64,
    },
    /// Not a MoldUDP64 packet.
    Bad(fairfeed_wire::Error),
}

/// Sequence state of one MoldUDP64 session.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionState {
    pub first_seq: u64,
    pub next_seq: u64,
    pub packets: u64,
    pub messages: u64,
    pub gaps: u64,
    pub missing_messages: u64,
    /// Late packets whose messages were all seen before.
    pub duplicate_packets: u64,
    /// Late packets that filled (part of) an earlier gap.
    pub reordered_packets: u64,
    pub ended: bool,
    /// Gaps not yet filled, as [from, to) ranges (at most [`OPEN_GAPS_MAX`]).
    #[serde(skip)]
    open_gaps: Vec<(u64, u64)>,
}

/// Open gaps tracked per session; beyond this, late packets for further gaps
/// count as duplicates and their messages stay counted as missing.
pub const OPEN_GAPS_MAX: usize = 4096;

impl SessionState {
    /// One packet's sequence numbers (`seq`..`next`): the gap it opens, or
    /// how many missing messages it fills.
    fn account(&mut self, seq: u64, next: u64, has_messages: bool, end: bool) -> (Option<(u64, u64)>, u64) {
        self.packets += 1;
        let mut gap = None;
        let mut filled = 0;
        if end {
            self.ended = true;
        }
        if seq > self.next_seq {
            gap = Some((self.next_seq, seq));
            self.gaps += 1;
            self.missing_messages += seq - self.next_seq;
            if self.open_gaps.len() < OPEN_GAPS_MAX {
                self.open_gaps.push((self.next_seq, seq));
            }
        } else if seq < self.next_seq && has_messages {
            // Late: either it fills (part of) an open gap — reordering — or it
            // repeats messages already seen.
            filled = self.fill(seq, next);
            if filled > 0 {
                self.reordered_packets += 1;
                self.missing_messages -= filled;
            } else {
                self.duplicate_packets += 1;
            }
        }
        self.next_seq = self.next_seq.max(next);
        (gap, filled)
    }

    /// Removes [from, to) from the open gaps; returns how many missing messages it filled.
    fn fill(&mut self, from: u64, to: u64) -> u64 {
        let mut filled = 0;
        let mut kept = Vec::with_capacity(self.open_gaps.len() + 1);
        for &(a, b) in &self.open_gaps {
            let (lo, hi) = (a.max(from), b.min(to));
            if lo >= hi {
                kept.push((a, b));
                continue;
            }
            filled += hi - lo;
            if a < lo {
                kept.push((a, lo));
            }
            if hi < b {
                kept.push((hi, b));
            }
        }
        self.open_gaps = kept;
        filled
    }
}

/// Counters over a whole feed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub packets: u64,
    pub data_packets: u64,
    pub heartbeats: u64,
    pub end_of_session: u64,
    pub messages: u64,
    pub bytes: u64,
    /// Messages per ITCH type (type byte as a one-character key).
    pub types: BTreeMap<String, u64>,
    /// First sequence number seen (first session).
    pub first_seq: u64,
    /// The sequence number expected next (first session).
    pub next_seq: u64,
    /// Sequence gaps opened (all sessions).
    pub gaps: u64,
    /// Messages in gaps that no later packet filled.
    pub missing_messages: u64,
    pub duplicate_packets: u64,
    pub reordered_packets: u64,
    /// Decode errors (all kinds).
    pub errors: u64,
    pub error_kinds: BTreeMap<String, u64>,
    /// The first gaps as [expected, got) ranges (at most [`GAP_LIST_MAX`]).
    pub gap_list: Vec<(u64, u64)>,
    /// More gaps than `gap_list` holds (`gaps` counts them all).
    pub gap_list_truncated: bool,
    pub sessions: BTreeMap<String, SessionState>,
}

/// Feeds packets in, keeps a [`Summary`].
#[derive(Debug)]
pub struct FeedDecoder {
    summary: Summary,
    first_session: Option<String>,
    types: [u64; 256],
}

impl Default for FeedDecoder {
    fn default() -> Self {
        FeedDecoder { summary: Summary::default(), first_session: None, types: [0; 256] }
    }
}

impl FeedDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn error(&mut self, e: &fairfeed_wire::Error) {
        self.summary.errors += 1;
        *self.summary.error_kinds.entry(e.kind().to_string()).or_default() += 1;
    }

    /// Decodes one UDP payload and updates the counters.
    pub fn handle<'a>(&mut self, payload: &'a [u8]) -> PacketEvent<'a> {
        self.summary.packets += 1;
        self.summary.bytes += payload.len() as u64;
        let p = match Packet::new_checked(payload) {
            Ok(p) => p,
            Err(e) => {
                self.error(&e);
                return PacketEvent::Bad(e);
            }
        };
        let session = p.session().to_string();
        let first = self.first_session.get_or_insert_with(|| session.clone()).clone();
        let seq = p.sequence();
        let next = p.next_sequence();
        let st = self.summary.sessions.entry(session.clone()).or_insert_with(|| SessionState {
            first_seq: seq,
            next_seq: seq,
            ..Default::default()
        });
        let (gap, filled) = st.account(seq, next, p.message_count() > 0, p.is_end_of_session());
        let (first_seq, next_seq) = (st.first_seq, st.next_seq);
        if session == first {
            self.summary.first_seq = first_seq;
            self.summary.next_seq = next_seq;
        }
        self.summary.missing_messages -= filled;
        if let Some((from, to)) = gap {
            self.summary.gaps += 1;
            self.summary.missing_messages += to - from;
            if self.summary.gap_list.len() < GAP_LIST_MAX {
                self.summary.gap_list.push((from, to));
            } else {
                self.summary.gap_list_truncated = true;
            }
        }
        if p.is_heartbeat() {
            self.summary.heartbeats += 1;
            return PacketEvent::Heartbeat { session, next_sequence: seq };
        }
        if p.is_end_of_session() {
            self.summary.end_of_session += 1;
            return PacketEvent::EndOfSession { session, next_sequence: seq };
        }
        self.summary.data_packets += 1;
        let mut messages = Vec::with_capacity(usize::from(p.count()));
        let mut decoded = 0;
        for block in p.into_messages() {
            let m = block.and_then(itch::Message::parse);
            match &m {
                Ok(msg) => {
                    decoded += 1;
                    self.types[usize::from(msg.msg_type())] += 1;
                }
                Err(e) => self.error(e),
            }
            messages.push(m);
        }
        self.summary.messages += decoded;
        if let Some(s) = self.summary.sessions.get_mut(&session) {
            s.messages += decoded;
        }
        PacketEvent::Data { session, sequence: seq, messages }
    }

    /// The counters so far.
    pub fn summary(&self) -> Summary {
        let mut s = self.summary.clone();
        s.duplicate_packets = s.sessions.values().map(|x| x.duplicate_packets).sum();
        s.reordered_packets = s.sessions.values().map(|x| x.reordered_packets).sum();
        s.types = (0..=255u8)
            .filter(|&t| self.types[usize::from(t)] > 0)
            .map(|t| ((t as char).to_string(), self.types[usize::from(t)]))
            .collect();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_wire::moldudp64::{PacketBuilder, Session};

    fn packet(seq: u64, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; 200];
        let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("S"), seq).unwrap();
        let mut msg = [0u8; 12];
        fairfeed_wire::itch::SystemEventRepr { event_code: b'O', ..Default::default() }.emit(&mut msg).unwrap();
        for _ in 0..n {
            b.push(&msg).unwrap();
        }
        let len = b.finish();
        buf.truncate(len);
        buf
    }

    #[test]
    fn reordering_fills_gaps_and_duplicates_are_told_apart() {
        let mut d = FeedDecoder::new();
        for (seq, n) in [(1, 2), (5, 2), (3, 2), (3, 2), (1, 1), (9, 1), (7, 1)] {
            d.handle(&packet(seq, n));
        }
        let s = d.summary();
        assert_eq!(s.gaps, 2); // 3..5 and 7..9 opened
        assert_eq!(s.reordered_packets, 2); // 3 and 7 came late and filled
        assert_eq!(s.duplicate_packets, 2); // the second 3, and 1
        assert_eq!(s.missing_messages, 1); // 8 never came
        assert_eq!(s.next_seq, 10);
        assert!(!s.gap_list_truncated);
    }

    #[test]
    fn a_long_gap_list_says_it_is_cut_short() {
        let mut d = FeedDecoder::new();
        for i in 0..(GAP_LIST_MAX as u64 + 5) {
            d.handle(&packet(1 + 2 * i, 1));
        }
        let s = d.summary();
        assert_eq!(s.gaps, GAP_LIST_MAX as u64 + 4);
        assert_eq!(s.gap_list.len(), GAP_LIST_MAX);
        assert!(s.gap_list_truncated, "the list holds fewer gaps than `gaps` counts");
    }
}
