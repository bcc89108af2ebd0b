//! The arbitrator over captures: lines are pcap files, time is the capture's.
//!
//! Line packets are merged in capture-time order and fed to the same core the
//! live shell drives; the core's timers fire at virtual instants between them.
//! With a journal, retransmission requests go to the same server core the live
//! `fairfeed retransmit-server` runs, and its answers come back `rtt_ns` later
//! in virtual time — the live request/response path, without sockets.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;

use fairfeed_arb::retransmit::{Requester, RetransmitServer, REQUEST_WITH_COOKIE_LEN};
use fairfeed_arb::{Arbitrator, Sink, Source, Stream};
use fairfeed_feed::capture::Datagram;
use fairfeed_wire::moldudp64::RequestRepr;

/// One output packet with its virtual time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timed {
    pub ts_ns: u64,
    pub payload: Vec<u8>,
}

/// What an offline run produced.
#[derive(Debug, Default)]
pub struct OfflineOutput {
    pub high_reliability: Vec<Timed>,
    pub low_latency: Vec<Timed>,
    pub side: u64,
}

#[derive(Default)]
struct Collect {
    now: u64,
    out: OfflineOutput,
    requests: Vec<RequestRepr>,
}

impl Sink for Collect {
    fn emit(&mut self, stream: Stream, packet: &[u8]) {
        let t = Timed { ts_ns: self.now, payload: packet.to_vec() };
        match stream {
            Stream::HighReliability => self.out.high_reliability.push(t),
            Stream::LowLatency => self.out.low_latency.push(t),
            Stream::Side(_) => self.out.side += 1,
        }
    }
    fn request(&mut self, r: RequestRepr) {
        self.requests.push(r);
    }
}

/// Runs `arb` over the lines (each in capture order). Requests go to `server`
/// (if any), answered `rtt_ns` later. Returns the outputs.
pub fn run_offline(
    arb: &mut Arbitrator,
    lines: &[Vec<Datagram>],
    mut server: Option<&mut RetransmitServer>,
    rtt_ns: u64,
) -> OfflineOutput {
    // (time, order, line index or usize::MAX for an answer, packet index / answer)
    let mut heap: BinaryHeap<Reverse<(u64, u64, usize, usize)>> = BinaryHeap::new();
    let mut answers: Vec<Vec<u8>> = Vec::new();
    let mut order = 0u64;
    for (l, line) in lines.iter().enumerate() {
        for (i, d) in line.iter().enumerate() {
            order += 1;
            heap.push(Reverse((d.ts_ns, order, l, i)));
        }
    }
    let me: SocketAddr = "127.0.0.1:0".parse().expect("valid address");
    let mut sink = Collect::default();
    let mut client = Requester::default();
    let mut buf = vec![0u8; fairfeed_wire::moldudp64::PACKET_LEN_DEFAULT_MAX];
    // Timeouts that change nothing must not spin forever: bounded per instant.
    let (mut idle_at, mut idle_n) = (u64::MAX, 0u32);
    loop {
        let next_ev = heap.peek().map(|Reverse((t, ..))| *t);
        let next_to = arb.next_timeout();
        let (t, is_event) = match (next_ev, next_to) {
            (Some(a), Some(b)) if b < a => (b, false),
            (Some(a), _) => (a, true),
            (None, Some(b)) => (b, false),
            (None, None) => break,
        };
        sink.now = sink.now.max(t);
        if is_event {
            let Some(Reverse((_, _, l, i))) = heap.pop() else { break };
            if l == usize::MAX {
                arb.handle_packet(sink.now, Source::Retransmit, &answers[i], &mut sink);
            } else {
                arb.handle_packet(sink.now, Source::Line(l), &lines[l][i].payload, &mut sink);
            }
        } else {
            if idle_at == sink.now {
                idle_n += 1;
                assert!(idle_n < 100_000, "arbitrator timer stuck at {} ns", sink.now);
            } else {
                (idle_at, idle_n) = (sink.now, 0);
            }
            arb.handle_timeout(sink.now, &mut sink);
        }
        for r in std::mem::take(&mut sink.requests) {
            let Some(server) = server.as_deref_mut() else { continue };
            let mut req = [0u8; REQUEST_WITH_COOKIE_LEN];
            let len = client.request(r, &mut req);
            let mut answer = server.handle_request(sink.now, me, &req[..len], &mut buf);
            if let Some(n) = answer.filter(|&n| Requester::is_challenge(&buf[..n])) {
                // The first request's challenge: its round trip folded into this one.
                let challenge = buf[..n].to_vec();
                let len = client.on_challenge(&challenge, &mut req).unwrap_or(0);
                answer = server.handle_request(sink.now, me, &req[..len], &mut buf);
            }
            if let Some(n) = answer {
                answers.push(buf[..n].to_vec());
                order += 1;
                heap.push(Reverse((sink.now + rtt_ns, order, usize::MAX, answers.len() - 1)));
            }
        }
    }
    sink.out
}
