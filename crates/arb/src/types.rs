//! The arbitrator's vocabulary: what it is configured with (lines, windows,
//! retransmission, where the sequence starts), where packets come from, the
//! streams it writes and the [`Sink`] it writes them to. The state machine
//! ([`crate::arbitrator`]) and its counters ([`crate::stats`]) both use these,
//! and neither imports the other.

use fairfeed_wire::moldudp64::RequestRepr;

/// Lines at most (A/B is 2; some venues run 3 or 4).
pub const LINES_MAX: usize = 8;
/// Held packets at most, by default: ~1 s of a busy feed.
pub const BUFFER_PACKETS_DEFAULT_MAX: usize = 65_536;
/// Held bytes at most, by default.
pub const BUFFER_BYTES_DEFAULT_MAX: usize = 64 << 20;
/// Gaps tracked at most; beyond it the oldest gap is given up.
pub const HOLES_MAX: usize = 4_096;
/// Retransmission requests alive at once at most.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;
/// Requests a client sends per second by default: three quarters of the
/// retransmission server's default per-requester rate, so jitter between
/// the two buckets never has the server drop a request.
pub const REQUESTS_PER_S_DEFAULT: u32 = 1_500;
/// Requests a client sends back to back by default (the server's burst is 200).
pub const REQUEST_BURST_DEFAULT: u32 = 64;
/// How long a client keeps asking a silent server by default.
pub const PATIENCE_DEFAULT_NS: u64 = 5_000_000_000;
/// A control packet (heartbeat, end of session) with the same sequence number
/// as the last one forwarded on a stream is forwarded again only after this long,
/// so A and B copies of one heartbeat yield one.
pub const CONTROL_DEDUP_NS: u64 = 100_000_000;

/// When the high-reliability output gives up waiting for a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    /// A held packet waits at most `max_hold_ns`.
    Time,
    /// At most `max_count_msgs` messages are held.
    Count,
    /// Whichever comes first.
    TimeCount,
}

/// The high-reliability window; can change at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Window {
    /// Which limit ends a wait: time, count or both.
    pub mode: Mode,
    /// Longest a packet is held behind a gap, ns (time modes).
    pub max_hold_ns: u64,
    /// Most messages held behind a gap (count modes).
    pub max_count_msgs: u64,
}

/// Retransmission settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RetransmitConfig {
    /// A gap open this long is requested (the other line usually fills it sooner).
    pub grace_ns: u64,
    /// A request unanswered this long is sent again.
    pub timeout_ns: u64,
    /// Sends per range before the gap is given up.
    pub attempts_max: u32,
    /// Messages asked for in one request at most.
    pub request_count_max: u16,
    /// Wait at least as long as the slower line usually lags (the measured
    /// p99 lead between lines) before asking, so gaps the other line will fill
    /// anyway are not requested.
    pub adaptive_grace: bool,
    /// Requests sent per second at most, on average (new, repeated and
    /// "the rest" requests alike). A server drops what comes over its
    /// per-requester rate unanswered, and a dropped request only times out:
    /// a client that outruns the server abandons a gap the server would
    /// have filled. Keep it under the server's rate (its default:
    /// [`crate::retransmit::ServerConfig`]'s 2,000/s).
    pub requests_per_s: u32,
    /// Requests that may go at once after a quiet spell (the bucket's depth).
    pub request_burst: u32,
    /// How long the server may answer nothing at all, from the first request
    /// it left unanswered, before its silence counts: until then a timed-out
    /// request is asked again without using an attempt (the client's network
    /// or the server down for a while — a partition is waited out, not
    /// given up). After it the server counts as down, and every range is
    /// judged by `attempts_max` alone until it answers again; a server that
    /// answers other requests has lost the range, and `attempts_max`
    /// decides too. 0: `attempts_max` always decides.
    pub patience_ns: u64,
}

impl Default for RetransmitConfig {
    fn default() -> Self {
        RetransmitConfig {
            grace_ns: 200_000,
            timeout_ns: 20_000_000,
            attempts_max: 5,
            request_count_max: 1_000,
            adaptive_grace: true,
            requests_per_s: REQUESTS_PER_S_DEFAULT,
            request_burst: REQUEST_BURST_DEFAULT,
            patience_ns: PATIENCE_DEFAULT_NS,
        }
    }
}

/// Where the sequence starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Start {
    /// At the first packet seen (joining a running feed).
    First,
    /// At this sequence number (a session from its start: MoldUDP64 begins at 1).
    Seq(u64),
}

/// Everything the arbitrator is configured with.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Config {
    /// Redundant lines merged, 1..=[`LINES_MAX`].
    pub lines: usize,
    /// The high-reliability window.
    pub window: Window,
    /// Where the sequence starts.
    pub start: Start,
    /// No input on any line for this long ends every wait (count mode's end of day).
    pub idle_flush_ns: u64,
    /// Packets held at most (beyond: the oldest gap is given up).
    pub buffer_packets_max: usize,
    /// Bytes held at most.
    pub buffer_bytes_max: usize,
    /// Asking a retransmission server for gaps (`None`: never).
    pub retransmit: Option<RetransmitConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lines: 2,
            window: Window { mode: Mode::TimeCount, max_hold_ns: 1_000_000, max_count_msgs: 1_000 },
            start: Start::First,
            idle_flush_ns: 50_000_000,
            buffer_packets_max: BUFFER_PACKETS_DEFAULT_MAX,
            buffer_bytes_max: BUFFER_BYTES_DEFAULT_MAX,
            retransmit: None,
        }
    }
}

/// Where a packet came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Line `n` (0: A, 1: B, …).
    Line(usize),
    /// An answer from the retransmission server.
    Retransmit,
}

/// The output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Every message once, as soon as any line brings it (gaps passed over).
    LowLatency,
    /// Every message once, in order, a gap waited for within the window.
    HighReliability,
    /// Packets that are not market data of the configured protocol, passed on
    /// untouched with the line they came from.
    Side(Source),
}

/// Receives what the arbitrator produces.
pub trait Sink {
    /// A packet for one of the outputs.
    fn emit(&mut self, stream: Stream, packet: &[u8]);
    /// A retransmission request to send to the server.
    fn request(&mut self, request: RequestRepr);
}
