//! What a sender takes from a live feed: MoldUDP64 packets arriving on a
//! socket (an arbitrator's high-reliability output, an exchange's line, any
//! MoldUDP64 stream). Sans-IO: the shell hands each datagram to
//! [`Ingress::handle`] and forwards it down the tree only when told to.
//!
//! Packets go down the tree unchanged — the upstream session, sequence
//! numbers and heartbeats carried through — so that receivers hand their
//! applications the upstream line itself. What would break that line is
//! kept out and counted: datagrams that are not MoldUDP64 (`malformed`) and
//! packets whose messages all went down the tree already (`duplicates`: the
//! other line of an A/B pair sent to the same port, a retransmission
//! answered twice). A jump forward in sequence numbers is forwarded (the
//! receivers' applications see the same gap a MoldUDP64 line would show)
//! and counted (`upstream_gaps`, `upstream_gap_messages`); a new session
//! name starts over (`sessions`).

use fairfeed_wire::moldudp64::{Packet, Session};

/// What to do with one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it down the tree.
    Forward,
    /// Every message in it went down already: drop it.
    Duplicate,
    /// Not a MoldUDP64 packet: drop it.
    Malformed,
}

/// Counters of what came in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IngressStats {
    /// Datagrams handed in.
    pub datagrams: u64,
    /// Packets forwarded down the tree (heartbeats and end of session included).
    pub forwarded: u64,
    /// Messages in the forwarded packets (new ones only).
    pub messages: u64,
    /// Heartbeats forwarded.
    pub heartbeats: u64,
    /// End-of-session packets forwarded.
    pub end_of_session: u64,
    /// Packets that brought nothing new (dropped).
    pub duplicates: u64,
    /// Packets that repeated some messages and brought new ones (forwarded).
    pub overlaps: u64,
    /// Datagrams that are not MoldUDP64 (dropped).
    pub malformed: u64,
    /// Jumps forward in the upstream sequence, and the messages skipped.
    pub upstream_gaps: u64,
    /// ... and the messages skipped.
    pub upstream_gap_messages: u64,
    /// Sessions seen (a new session name starts the sequence over).
    pub sessions: u64,
}

/// The live feed's state: the session and the next sequence number expected.
#[derive(Debug, Clone, Default)]
pub struct Ingress {
    session: Option<Session>,
    next_seq: Option<u64>,
    /// Its counters.
    pub stats: IngressStats,
}

impl Ingress {
    /// Nothing seen yet: the first packet sets the session and the sequence.
    pub fn new() -> Self {
        Self::default()
    }

    /// The session and the next sequence number expected, once a packet came.
    pub fn position(&self) -> Option<(Session, u64)> {
        Some((self.session?, self.next_seq?))
    }

    /// Judges one datagram (and counts it).
    pub fn handle(&mut self, datagram: &[u8]) -> Verdict {
        self.stats.datagrams += 1;
        let Ok(p) = Packet::new_checked(datagram) else {
            self.stats.malformed += 1;
            return Verdict::Malformed;
        };
        if self.session != Some(p.session()) {
            self.session = Some(p.session());
            self.next_seq = None;
            self.stats.sessions += 1;
        }
        let (seq, count) = (p.sequence(), u64::from(p.message_count()));
        if p.is_end_of_session() || count == 0 {
            if p.is_end_of_session() {
                self.stats.end_of_session += 1;
            } else {
                self.stats.heartbeats += 1;
            }
            self.stats.forwarded += 1;
            return Verdict::Forward;
        }
        let next = self.next_seq.unwrap_or(seq);
        let end = seq.saturating_add(count);
        if end <= next {
            self.stats.duplicates += 1;
            return Verdict::Duplicate;
        }
        if seq < next {
            self.stats.overlaps += 1;
        } else if seq > next {
            self.stats.upstream_gaps += 1;
            self.stats.upstream_gap_messages += seq - next;
        }
        self.stats.messages += end - seq.max(next);
        self.stats.forwarded += 1;
        self.next_seq = Some(end);
        Verdict::Forward
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_wire::moldudp64::PacketBuilder;

    fn pkt(session: &[u8; 10], seq: u64, count: u16) -> Vec<u8> {
        let mut b = vec![0u8; 1_500];
        let mut p = PacketBuilder::new(&mut b, fairfeed_wire::field::Alpha(*session), seq).unwrap();
        for i in 0..count {
            p.push(&[b'X', i as u8]).unwrap();
        }
        let n = p.finish();
        b.truncate(n);
        b
    }

    #[test]
    fn duplicates_are_dropped_gaps_forwarded_and_everything_counted() {
        let mut i = Ingress::new();
        let s = b"SESSION001";
        assert_eq!(i.handle(&pkt(s, 1, 3)), Verdict::Forward);
        assert_eq!(i.handle(&pkt(s, 1, 3)), Verdict::Duplicate, "line B's copy");
        assert_eq!(i.handle(&pkt(s, 4, 0)), Verdict::Forward, "a heartbeat");
        assert_eq!(i.handle(&pkt(s, 3, 2)), Verdict::Forward, "an overlap brings message 4");
        assert_eq!(i.handle(&pkt(s, 8, 1)), Verdict::Forward, "a gap of 5..=7 is the upstream's");
        assert_eq!(i.handle(&[1, 2, 3]), Verdict::Malformed);
        assert_eq!(i.handle(&pkt(b"SESSION002", 1, 1)), Verdict::Forward, "a new session starts over");
        assert_eq!(i.position(), Some((fairfeed_wire::field::Alpha(*b"SESSION002"), 2)));
        let st = i.stats;
        assert_eq!((st.datagrams, st.forwarded, st.duplicates, st.malformed), (7, 5, 1, 1));
        assert_eq!((st.messages, st.heartbeats, st.overlaps), (3 + 1 + 1 + 1, 1, 1));
        assert_eq!((st.upstream_gaps, st.upstream_gap_messages, st.sessions), (1, 3, 2));
    }
}
