//! A one-line gap filler: a MoldUDP64 line in, the same line out in
//! sequence order, what it lost asked for from a MoldUDP64 retransmission
//! server and put back in its place. One shell over the arbitrator's core
//! (one line, a time window), shared by a receiver's delivery
//! (`--retransmit`) and the bridge (`bridge run --retransmit`).

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use fairfeed_arb::spec::SeqSpec;
use fairfeed_arb::stats::Stats;
use fairfeed_arb::{Arbitrator, Config, Mode, RetransmitConfig, Sink, Source, Start, Stream, Window};
use fairfeed_wire::moldudp64::RequestRepr;

use super::client::RetransmitClient;

/// Largest datagram an answer may be.
const ANSWER_MAX: usize = 65_536;

/// How a gap filler holds and asks.
#[derive(Debug, Clone, Copy)]
pub struct FillConfig {
    pub server: SocketAddr,
    /// How long a message waits behind a gap before the gap is given up, ns.
    pub hold_ns: u64,
    /// How long a gap is open before it is asked for, ns.
    pub grace_ns: u64,
    /// Where the line starts (`Start::First`: wherever the first packet is).
    pub start: Start,
}

/// Why a gap filler could not start.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    #[error("the gap filler's window: {0}")]
    Config(String),
    #[error("the retransmission server {0}: {1}")]
    Server(SocketAddr, std::io::Error),
}

/// See the module docs.
pub struct GapFiller {
    arb: Arbitrator,
    client: RetransmitClient,
    buf: Vec<u8>,
    requests: u64,
}

/// The arbitrator's outputs: the in-order line to `out`, requests to the server.
struct FillSink<'a, F: FnMut(&[u8])> {
    out: &'a mut F,
    client: &'a RetransmitClient,
    requests: &'a mut u64,
}

impl<F: FnMut(&[u8])> Sink for FillSink<'_, F> {
    fn emit(&mut self, stream: Stream, packet: &[u8]) {
        if stream == Stream::HighReliability {
            (self.out)(packet);
        }
    }

    fn request(&mut self, r: RequestRepr) {
        if self.client.request(r) {
            *self.requests += 1;
        }
    }
}

impl GapFiller {
    pub fn new(cfg: FillConfig) -> Result<GapFiller, FillError> {
        let arb_cfg = Config {
            lines: 1,
            window: Window { mode: Mode::Time, max_hold_ns: cfg.hold_ns, max_count_msgs: 1_000_000 },
            start: cfg.start,
            retransmit: Some(RetransmitConfig { grace_ns: cfg.grace_ns, adaptive_grace: false, ..Default::default() }),
            ..Config::default()
        };
        let arb = Arbitrator::new(arb_cfg, SeqSpec::moldudp64()).map_err(|e| FillError::Config(e.to_string()))?;
        let client = RetransmitClient::new(cfg.server).map_err(|e| FillError::Server(cfg.server, e))?;
        Ok(GapFiller { arb, client, buf: vec![0u8; ANSWER_MAX], requests: 0 })
    }

    /// A packet of the line at `now`; what is now in order goes to `out`.
    pub fn packet(&mut self, now: u64, p: &[u8], out: &mut impl FnMut(&[u8])) {
        let mut sink = FillSink { out, client: &self.client, requests: &mut self.requests };
        self.arb.handle_packet(now, Source::Line(0), p, &mut sink);
    }

    /// The server's answers and the window's timers at `now`; returns the work done.
    pub fn service(&mut self, now: u64, out: &mut impl FnMut(&[u8])) -> usize {
        let mut sink = FillSink { out, client: &self.client, requests: &mut self.requests };
        let mut n = 0;
        while let Some(k) = sink.client.recv(&mut self.buf) {
            self.arb.handle_packet(now, Source::Retransmit, &self.buf[..k], &mut sink);
            n += 1;
        }
        if self.arb.next_timeout().is_some_and(|t| t <= now) {
            self.arb.handle_timeout(now, &mut sink);
            n += 1;
        }
        n
    }

    /// Gives up whatever still waits for a fill (it goes out with its gaps).
    pub fn give_up(&mut self, out: &mut impl FnMut(&[u8])) {
        let mut sink = FillSink { out, client: &self.client, requests: &mut self.requests };
        self.arb.handle_timeout(u64::MAX / 2, &mut sink);
    }

    /// When the window next needs a turn (the clock `packet` and `service` are given).
    pub fn next_timeout(&self) -> Option<u64> {
        self.arb.next_timeout()
    }

    /// The socket the server answers on.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.client.fd()
    }

    /// Gaps asked for (sent).
    pub fn requests(&self) -> u64 {
        self.requests
    }

    pub fn stats(&self) -> &Stats {
        self.arb.stats()
    }

    /// Its counters: requests, failed sends, challenges answered, the arbitrator's.
    pub fn counters(&self) -> serde_json::Value {
        let (requests, send_errors, challenges) = self.client.counts();
        serde_json::json!({
            "requests": requests,
            "request_send_errors": send_errors,
            "challenges": challenges,
            "arbitrator": self.arb.stats(),
        })
    }
}
