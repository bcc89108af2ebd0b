//! The subscriber side as a library: decoded ITCH messages per subject, with
//! the feed's gaps and the broker's gaps told apart — what a bank's service
//! calls instead of re-implementing the bridge's framing.
//!
//! [`Decoder`] is sans-IO: fed a publication's subject and payload (as NATS
//! delivered them), it takes off the bridge's tag, unpacks the payload by the
//! granularity its subject shows (one message; a `…batch` of MoldUDP64-style
//! blocks; a `…pkt.…` MoldUDP64 packet; `…control.gap` and `…control.eos`),
//! decodes each ITCH message, and checks the publication's number on its
//! subject: a jump is a [`Event::BrokerGap`] (the broker lost publications of
//! that subject), a gap marker a [`Event::FeedGap`] (messages lost before the
//! bridge). [`consume`] subscribes and drives it.
//!
//! ```no_run
//! # async fn run() -> Result<(), fairfeed_bridge::BridgeError> {
//! use fairfeed_bridge::consume::{consume, Event};
//! use fairfeed_bridge::subscribe::{SubscribeConfig, StopWhen};
//! let cfg = SubscribeConfig {
//!     url: "nats://127.0.0.1:4222".into(),
//!     subject: "ff.itch.*.AAPL.>".into(),
//!     jetstream: None,
//!     stop: StopWhen::default(),
//!     gaps: Some(fairfeed_bridge::subscribe::gap_subject("ff.itch")),
//!     security: Default::default(),
//! };
//! consume(&cfg, |e| match e {
//!     Event::Message { seq, msg, .. } => println!("{seq:?}: {}", msg.as_bytes()[0] as char),
//!     Event::FeedGap { first, missing } => eprintln!("feed lost {missing} from {first}"),
//!     Event::BrokerGap { subject, missing } => eprintln!("broker lost {missing} on {subject}"),
//!     _ => {}
//! })
//! .await?;
//! # Ok(()) }
//! ```

use crate::BridgeError;
use std::collections::HashMap;

use fairfeed_wire::itch::Message;
use fairfeed_wire::moldudp64::{Packet, HEADER_LEN};
use serde::Serialize;

use crate::subscribe::{is_gap_marker, subscribe, SubscribeConfig, SubscribeReport};

/// What a consumer is told, in arrival order.
#[derive(Debug)]
pub enum Event<'a> {
    /// One ITCH message, decoded, with its MoldUDP64 sequence number — `None`
    /// for the second and later messages of a batch, which carries only its
    /// first message's number (its messages are a subject's share of a
    /// packet, not consecutive).
    Message { subject: &'a str, seq: Option<u64>, msg: Message<'a> },
    /// Messages lost before the bridge (the feed's own gap).
    FeedGap { first: u64, missing: u64 },
    /// Publications of `subject` the broker did not deliver (a jump in the subject's numbers).
    BrokerGap { subject: &'a str, missing: u64 },
    /// The session ended.
    EndOfSession { subject: &'a str },
}

/// What the decoder refused or noticed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DecodeStats {
    pub publications: u64,
    pub messages: u64,
    /// Payloads without the bridge's tag.
    pub untagged: u64,
    /// Messages or blocks that do not parse as ITCH 5.0 (skipped; the rest of the payload is kept).
    pub bad_messages: u64,
    pub feed_gaps: u64,
    pub broker_gaps: u64,
    /// Publications behind their subject's latest (arrived late; delivered anyway).
    pub reordered: u64,
}

/// Subjects whose publication numbers are followed at most (beyond: not checked).
pub const SUBJECTS_MAX: usize = 1_000_000;

/// The sans-IO decoder of the bridge's publications.
#[derive(Debug, Default)]
pub struct Decoder {
    last: HashMap<String, u64>,
    pub stats: DecodeStats,
}

impl Decoder {
    /// Decodes one publication; tells `each` what it holds.
    pub fn handle<'a>(&mut self, subject: &'a str, payload: &'a [u8], each: &mut impl FnMut(Event<'a>)) {
        self.stats.publications += 1;
        let Some((body, tag)) = crate::tag::split(payload) else {
            self.stats.untagged += 1;
            return;
        };
        self.check_order(subject, tag.subject_seq, each);
        if is_gap_marker(subject) {
            let u = |r: std::ops::Range<usize>| {
                body.get(r).map_or(0, |b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
            };
            self.stats.feed_gaps += 1;
            each(Event::FeedGap { first: u(0..8), missing: u(8..16) });
        } else if subject.ends_with(".control.eos") {
            each(Event::EndOfSession { subject });
        } else if subject.ends_with(".batch") {
            self.blocks(subject, tag.seq, false, body, each);
        } else if subject.contains(".pkt.") {
            match Packet::new_checked(body) {
                // The blocks after the 20-byte header, as a batch's.
                Ok(p) => self.blocks(subject, p.sequence(), true, body.get(HEADER_LEN..).unwrap_or_default(), each),
                Err(_) => self.stats.bad_messages += 1,
            }
        } else {
            self.message(subject, Some(tag.seq), body, each);
        }
    }

    /// MoldUDP64-style blocks (2-byte length, message), the first numbered
    /// `seq`, the others `seq + i` when `consecutive` (a packet), unknown otherwise (a batch).
    fn blocks<'a>(
        &mut self,
        subject: &'a str,
        seq: u64,
        consecutive: bool,
        body: &'a [u8],
        each: &mut impl FnMut(Event<'a>),
    ) {
        let (mut rest, mut i) = (body, 0u64);
        while rest.len() >= 2 {
            let n = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
            let Some(m) = rest.get(2..2 + n) else {
                self.stats.bad_messages += 1;
                break;
            };
            self.message(subject, (i == 0 || consecutive).then_some(seq + i), m, each);
            (rest, i) = (&rest[2 + n..], i + 1);
        }
    }

    fn message<'a>(&mut self, subject: &'a str, seq: Option<u64>, m: &'a [u8], each: &mut impl FnMut(Event<'a>)) {
        match Message::parse(m) {
            Ok(msg) => {
                self.stats.messages += 1;
                each(Event::Message { subject, seq, msg });
            }
            Err(_) => self.stats.bad_messages += 1,
        }
    }

    fn check_order<'a>(&mut self, subject: &'a str, n: u64, each: &mut impl FnMut(Event<'a>)) {
        if n == 0 {
            return;
        }
        let room = self.last.len() < SUBJECTS_MAX;
        let last = match self.last.get_mut(subject) {
            Some(l) => l,
            None if room => self.last.entry(subject.to_string()).or_insert(n - 1),
            None => return,
        };
        if n > *last + 1 {
            self.stats.broker_gaps += 1;
            each(Event::BrokerGap { subject, missing: n - *last - 1 });
        } else if n <= *last {
            self.stats.reordered += 1;
            return;
        }
        *last = n;
    }
}

/// Subscribes as `cfg` says and tells `each` every decoded message and gap
/// until `cfg.stop`; returns the subscription's report and the decoder's.
/// A subject's first publication sets where its numbering starts (a late
/// joiner does not see what came before as a gap).
pub async fn consume(
    cfg: &SubscribeConfig,
    mut each: impl FnMut(Event<'_>),
) -> Result<(SubscribeReport, DecodeStats), BridgeError> {
    let mut d = Decoder::default();
    let (r, _) = subscribe(cfg, None, |m, _| d.handle(m.subject.as_str(), &m.payload, &mut each)).await?;
    Ok((r, d.stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::{By, Granularity, RouteConfig, Router};
    use fairfeed_feed::gen::{GenConfig, Generator};

    /// (subject, tagged payload) per publication.
    type Pubs = Vec<(String, Vec<u8>)>;

    /// The feed's messages by sequence number, and the router's publications, tagged.
    fn published(g: Granularity, drop_packet: Option<usize>) -> (HashMap<u64, Vec<u8>>, Pubs) {
        let feed: Vec<Vec<u8>> =
            Generator::new(GenConfig { seed: 4, messages: 3_000, symbols: 15, ..GenConfig::default() })
                .unwrap()
                .map(|p| p.payload)
                .collect();
        let mut want = HashMap::new();
        let mut r = Router::new(RouteConfig { granularity: g, by: By::Symbol, ..RouteConfig::default() });
        let mut out = Vec::new();
        for (i, p) in feed.iter().enumerate() {
            let pk = Packet::new_checked(&p[..]).unwrap();
            if Some(i) == drop_packet {
                continue;
            }
            for (k, m) in pk.messages().enumerate() {
                want.insert(pk.sequence() + k as u64, m.unwrap().to_vec());
            }
            r.route(p, 1, |x| out.push((x.subject.to_string(), x.payload.to_vec())));
        }
        (want, out)
    }

    #[test]
    fn every_message_comes_back_decoded_at_every_granularity() {
        for g in [Granularity::Message, Granularity::Batched, Granularity::Packet] {
            let (want, pubs) = published(g, None);
            let mut d = Decoder::default();
            let (mut got, mut unnumbered) = (HashMap::new(), Vec::new());
            for (s, p) in &pubs {
                d.handle(s, p, &mut |e| {
                    if let Event::Message { seq, msg, .. } = e {
                        match seq {
                            Some(seq) => {
                                assert!(got.insert(seq, msg.as_bytes().to_vec()).is_none(), "{g:?}: {seq} twice")
                            }
                            None => unnumbered.push(msg.as_bytes().to_vec()),
                        }
                    }
                });
            }
            // Numbered ones are the feed's at their numbers; with the unnumbered
            // (batches' later messages) they are the whole feed, once.
            assert!(got.iter().all(|(k, v)| want.get(k) == Some(v)), "{g:?}");
            let mut all: Vec<Vec<u8>> = got.into_values().chain(unnumbered).collect();
            let mut w: Vec<Vec<u8>> = want.into_values().collect();
            all.sort();
            w.sort();
            assert_eq!(all, w, "{g:?}");
            assert_eq!((d.stats.bad_messages, d.stats.untagged, d.stats.broker_gaps), (0, 0, 0), "{g:?}");
        }
    }

    #[test]
    fn feed_gaps_and_broker_gaps_are_told_apart() {
        // Packet 40 lost before the bridge; then the broker loses one publication.
        let (_, mut pubs) = published(Granularity::Message, Some(40));
        // A publication whose subject has later ones (a loss at a subject's end shows nowhere).
        let victim = (500..pubs.len())
            .find(|&i| !pubs[i].0.contains(".control.") && pubs[i + 1..].iter().any(|(s, _)| *s == pubs[i].0))
            .unwrap();
        let lost_subject = pubs.remove(victim).0;
        let mut d = Decoder::default();
        let (mut feed, mut broker) = (Vec::new(), Vec::new());
        for (s, p) in &pubs {
            d.handle(s, p, &mut |e| match e {
                Event::FeedGap { first, missing } => feed.push((first, missing)),
                Event::BrokerGap { subject, missing } => broker.push((subject.to_string(), missing)),
                _ => {}
            });
        }
        assert_eq!(feed.len(), 1, "{feed:?}");
        assert!(feed[0].1 > 0);
        assert_eq!(broker, [(lost_subject, 1)], "the broker's loss, on its subject");
        // Garbage and untagged payloads are counted, not decoded.
        d.handle("ff.itch.S.AAPL.A", b"no tag here", &mut |_| panic!("nothing to tell"));
        assert_eq!(d.stats.untagged, 1);
    }
}
