//! Workload characterization of a feed, after seed 001's section 2: packets,
//! messages, bytes, messages per packet, message and packet sizes, peak rates
//! per second, and the same-symbol interarrival distribution.
//!
//! Pure: fed `(capture time, UDP payload)` pairs in capture order.

use std::collections::BTreeMap;

use fairfeed_wire::itch;
use fairfeed_wire::moldudp64::Packet;
use hdrhistogram::Histogram;
use serde::Serialize;

/// Interarrival bounds reported as a CDF, in nanoseconds (1 µs … 1 s).
pub const INTERARRIVAL_BOUNDS_NS: [u64; 7] =
    [1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000, 1_000_000_000];

/// Accumulates the statistics.
pub struct StatsBuilder {
    packets: u64,
    data_packets: u64,
    messages: u64,
    undecodable: u64,
    bytes: u64,
    msg_bytes: u64,
    first_ts: Option<u64>,
    last_ts: u64,
    per_packet: Histogram<u64>,
    packet_size: Histogram<u64>,
    msg_size: BTreeMap<char, (u64, u64)>,
    per_second: BTreeMap<u64, (u64, u64, u64)>,
    last_seen: Vec<u64>,
    interarrival: Histogram<u64>,
}

/// Summary statistics of a distribution.
#[derive(Debug, Clone, Serialize)]
pub struct Dist {
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

/// The peak second of a feed.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Peak {
    /// Capture second (Unix time).
    pub second: u64,
    pub packets: u64,
    pub messages: u64,
    pub bytes: u64,
}

/// The characterization `fairfeed stats` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub packets: u64,
    pub data_packets: u64,
    pub messages: u64,
    pub undecodable_messages: u64,
    /// UDP payload bytes.
    pub bytes: u64,
    pub duration_s: f64,
    pub mean_packets_per_s: f64,
    pub mean_messages_per_s: f64,
    pub msgs_per_packet: Dist,
    pub packet_bytes: Dist,
    /// Mean ITCH message length (without the 2-byte block length).
    pub msg_bytes_mean: f64,
    /// Messages and mean length per type.
    pub types: BTreeMap<String, (u64, f64)>,
    pub peak_packets: Peak,
    pub peak_messages: Peak,
    pub peak_bytes: Peak,
    /// Time since the previous message on the same symbol (stock locate), ns.
    pub same_symbol_interarrival_ns: Dist,
    /// Share of same-symbol repeats within each bound of
    /// [`INTERARRIVAL_BOUNDS_NS`], as `(bound_ns, fraction)`.
    pub same_symbol_cdf: Vec<(u64, f64)>,
}

impl Default for StatsBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// Largest value the histograms track (one hour in ns); larger values clamp.
/// Bounded histograms, because hdrhistogram's `saturating_record` clamps
/// instead of growing an auto-resizing one.
pub const HIST_VALUE_MAX: u64 = 3_600_000_000_000;

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_VALUE_MAX, 3).expect("valid bounds")
}

fn dist(h: &Histogram<u64>) -> Dist {
    Dist {
        mean: if h.is_empty() { 0.0 } else { h.mean() },
        p50: h.value_at_quantile(0.5),
        p90: h.value_at_quantile(0.9),
        p99: h.value_at_quantile(0.99),
        max: h.max(),
    }
}

impl StatsBuilder {
    pub fn new() -> Self {
        StatsBuilder {
            packets: 0,
            data_packets: 0,
            messages: 0,
            undecodable: 0,
            bytes: 0,
            msg_bytes: 0,
            first_ts: None,
            last_ts: 0,
            per_packet: hist(),
            packet_size: hist(),
            msg_size: BTreeMap::new(),
            per_second: BTreeMap::new(),
            last_seen: vec![u64::MAX; usize::from(u16::MAX) + 1],
            interarrival: hist(),
        }
    }

    /// Adds one packet captured at `ts_ns` (Unix ns).
    pub fn add(&mut self, ts_ns: u64, payload: &[u8]) {
        self.packets += 1;
        self.bytes += payload.len() as u64;
        self.first_ts.get_or_insert(ts_ns);
        self.last_ts = self.last_ts.max(ts_ns);
        self.packet_size.saturating_record(payload.len() as u64);
        let sec = self.per_second.entry(ts_ns / 1_000_000_000).or_default();
        sec.0 += 1;
        sec.2 += payload.len() as u64;
        let Ok(p) = Packet::new_checked(payload) else {
            return;
        };
        if p.message_count() == 0 {
            return;
        }
        self.data_packets += 1;
        self.per_packet.saturating_record(u64::from(p.message_count()));
        for block in p.messages() {
            let Ok(m) = block.and_then(itch::Message::parse) else {
                self.undecodable += 1;
                continue;
            };
            self.messages += 1;
            sec.1 += 1;
            let len = m.as_bytes().len() as u64;
            self.msg_bytes += len;
            let e = self.msg_size.entry(m.msg_type() as char).or_default();
            e.0 += 1;
            e.1 += len;
            let locate = usize::from(m.stock_locate());
            if locate != 0 {
                let t = m.timestamp();
                let prev = self.last_seen[locate];
                if prev != u64::MAX && t >= prev {
                    self.interarrival.saturating_record(t - prev);
                }
                self.last_seen[locate] = t;
            }
        }
    }

    /// The statistics so far.
    pub fn finish(&self) -> Stats {
        let duration_s = self.first_ts.map_or(0.0, |f| (self.last_ts - f) as f64 / 1e9);
        let peak = |key: fn(&(u64, u64, u64)) -> u64| {
            self.per_second
                .iter()
                .max_by_key(|(s, v)| (key(v), std::cmp::Reverse(**s)))
                .map(|(&second, &(packets, messages, bytes))| Peak { second, packets, messages, bytes })
                .unwrap_or_default()
        };
        let n = self.interarrival.len().max(1) as f64;
        Stats {
            packets: self.packets,
            data_packets: self.data_packets,
            messages: self.messages,
            undecodable_messages: self.undecodable,
            bytes: self.bytes,
            duration_s,
            mean_packets_per_s: if duration_s > 0.0 { self.packets as f64 / duration_s } else { 0.0 },
            mean_messages_per_s: if duration_s > 0.0 { self.messages as f64 / duration_s } else { 0.0 },
            msgs_per_packet: dist(&self.per_packet),
            packet_bytes: dist(&self.packet_size),
            msg_bytes_mean: if self.messages > 0 { self.msg_bytes as f64 / self.messages as f64 } else { 0.0 },
            types: self.msg_size.iter().map(|(t, &(c, b))| (t.to_string(), (c, b as f64 / c as f64))).collect(),
            peak_packets: peak(|v| v.0),
            peak_messages: peak(|v| v.1),
            peak_bytes: peak(|v| v.2),
            same_symbol_interarrival_ns: dist(&self.interarrival),
            same_symbol_cdf: INTERARRIVAL_BOUNDS_NS
                .iter()
                .map(|&b| (b, self.interarrival.count_between(0, b) as f64 / n))
                .collect(),
        }
    }
}
