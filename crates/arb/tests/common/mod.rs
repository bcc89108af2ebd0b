//! A virtual-time harness around the arbitrator: scripted or random arrivals
//! per line, an optional retransmission server answering after a fixed delay,
//! and a sink that records every output with its time.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use fairfeed_arb::retransmit::{Journal, RetransmitServer, ServerConfig};
use fairfeed_arb::spec::SeqSpec;
use fairfeed_arb::{Arbitrator, Config, Sink, Source, Stream};
use fairfeed_wire::moldudp64::{Packet, PacketBuilder, RequestRepr, Session};

pub const SESSION: &str = "TESTSESS01";

/// A MoldUDP64 packet of `count` one-byte-tagged messages starting at `seq`.
pub fn packet(seq: u64, count: u16) -> Vec<u8> {
    let mut buf = vec![0u8; 1400];
    let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded(SESSION), seq).unwrap();
    for i in 0..u64::from(count) {
        b.push(&(seq + i).to_be_bytes()).unwrap();
    }
    let n = b.finish();
    buf.truncate(n);
    buf
}

/// Sequence numbers of the messages in a packet.
pub fn seqs(p: &[u8]) -> Vec<u64> {
    let p = Packet::new_checked(p).unwrap();
    (0..u64::from(p.message_count())).map(|i| p.sequence() + i).collect()
}

#[derive(Default)]
pub struct Recorder {
    pub now: u64,
    pub ll: Vec<(u64, Vec<u8>)>,
    pub hr: Vec<(u64, Vec<u8>)>,
    pub side: Vec<Vec<u8>>,
    pub requests: Vec<(u64, RequestRepr)>,
    /// Every input handed to the arbitrator (lines and answers), with its time.
    pub inputs: Vec<(u64, Vec<u8>)>,
}

impl Sink for Recorder {
    fn emit(&mut self, stream: Stream, packet: &[u8]) {
        match stream {
            Stream::LowLatency => self.ll.push((self.now, packet.to_vec())),
            Stream::HighReliability => self.hr.push((self.now, packet.to_vec())),
            Stream::Side(_) => self.side.push(packet.to_vec()),
        }
    }
    fn request(&mut self, r: RequestRepr) {
        self.requests.push((self.now, r));
    }
}

impl Recorder {
    /// Message sequence numbers of the high-reliability output, in order.
    pub fn hr_seqs(&self) -> Vec<u64> {
        self.hr
            .iter()
            .filter(|(_, p)| Packet::new_checked(&p[..]).unwrap().message_count() > 0)
            .flat_map(|(_, p)| seqs(p))
            .collect()
    }
    pub fn ll_seqs(&self) -> Vec<u64> {
        self.ll
            .iter()
            .filter(|(_, p)| Packet::new_checked(&p[..]).unwrap().message_count() > 0)
            .flat_map(|(_, p)| seqs(p))
            .collect()
    }
    /// (time, first seq) of each high-reliability data packet.
    pub fn hr_times(&self) -> Vec<(u64, u64)> {
        self.hr.iter().map(|(t, p)| (*t, Packet::new_checked(&p[..]).unwrap().sequence())).collect()
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Packet { line: usize, bytes: Vec<u8> },
    Answer(Vec<u8>),
}

/// Drives an arbitrator through timed arrivals, timeouts and (optionally) a
/// retransmission server that answers `rtt_ns` after each request.
pub struct Harness {
    pub arb: Arbitrator,
    pub out: Recorder,
    pub server: Option<RetransmitServer>,
    pub rtt_ns: u64,
    /// Requests the server never answers (to test time-outs), counted from the first.
    pub drop_requests: usize,
    /// Requests made in this time window get no answer (the client's
    /// network cut off: the request, or its answer, lost on the way).
    pub blackout: std::ops::Range<u64>,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    order: u64,
    requests_seen: usize,
    /// The client's side of the server's cookie exchange.
    client: fairfeed_arb::retransmit::Requester,
}

impl Harness {
    pub fn new(cfg: Config) -> Self {
        Harness {
            arb: Arbitrator::new(cfg, SeqSpec::moldudp64()).unwrap(),
            out: Recorder::default(),
            server: None,
            rtt_ns: 0,
            drop_requests: 0,
            blackout: 0..0,
            events: BinaryHeap::new(),
            order: 0,
            requests_seen: 0,
            client: fairfeed_arb::retransmit::Requester::default(),
        }
    }

    /// Adds a server journaling `packets` (the clean feed).
    pub fn with_server(mut self, packets: &[Vec<u8>], cfg: ServerConfig, rtt_ns: u64) -> Self {
        let mut j = Journal::new();
        for p in packets {
            j.append_packet(p).unwrap();
        }
        self.server = Some(RetransmitServer::new(j, cfg));
        self.rtt_ns = rtt_ns;
        self
    }

    pub fn arrive(&mut self, t: u64, line: usize, bytes: Vec<u8>) {
        self.order += 1;
        self.events.push(Reverse((t, self.order, Ev::Packet { line, bytes })));
    }

    /// Runs every event and timeout up to `until` (step-limited).
    pub fn run(&mut self, until: u64) {
        for _ in 0..10_000_000 {
            let next_ev = self.events.peek().map(|Reverse((t, _, _))| *t);
            let next_to = self.arb.next_timeout();
            let t = match (next_ev, next_to) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => return,
            };
            if t > until {
                return;
            }
            self.out.now = t.max(self.out.now);
            let now = self.out.now;
            if next_ev == Some(t) {
                let Reverse((_, _, ev)) = self.events.pop().unwrap();
                match ev {
                    Ev::Packet { line, bytes } => {
                        self.out.inputs.push((now, bytes.clone()));
                        self.arb.handle_packet(now, Source::Line(line), &bytes, &mut self.out)
                    }
                    Ev::Answer(bytes) => {
                        self.out.inputs.push((now, bytes.clone()));
                        self.arb.handle_packet(now, Source::Retransmit, &bytes, &mut self.out)
                    }
                }
            } else {
                self.arb.handle_timeout(now, &mut self.out);
            }
            self.answer_requests(now);
        }
        panic!("harness step limit reached");
    }

    fn answer_requests(&mut self, now: u64) {
        let Some(server) = &mut self.server else { return };
        let client = &mut self.client;
        let from = "127.0.0.1:1".parse().unwrap();
        let pending: Vec<_> = self.out.requests[self.requests_seen..].to_vec();
        self.requests_seen = self.out.requests.len();
        for (_, r) in pending {
            if self.blackout.contains(&now) {
                continue;
            }
            if self.drop_requests > 0 {
                self.drop_requests -= 1;
                continue;
            }
            let mut req = [0u8; fairfeed_arb::retransmit::REQUEST_WITH_COOKIE_LEN];
            let len = client.request(r, &mut req);
            let mut out = [0u8; 1400];
            let mut answer = server.handle_request(now, from, &req[..len], &mut out);
            if let Some(n) = answer.filter(|&n| fairfeed_arb::retransmit::Requester::is_challenge(&out[..n])) {
                // The first request's challenge, its round trip folded into this one.
                let challenge = out[..n].to_vec();
                let len = client.on_challenge(&challenge, &mut req).unwrap();
                answer = server.handle_request(now, from, &req[..len], &mut out);
            }
            if let Some(n) = answer {
                self.order += 1;
                self.events.push(Reverse((now + self.rtt_ns, self.order, Ev::Answer(out[..n].to_vec()))));
            }
        }
    }
}
