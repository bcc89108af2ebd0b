//! The arbitrator's counters: per line, per output, gaps and their fate,
//! retransmission, buffer depth, and seed 004's saturation indicator.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::types::{Source, Window};

/// Recent sequence numbers remembered for the race between lines.
const RACE_RING: usize = 1 << 14;
/// Largest lead recorded (1 s); longer leads clamp.
const LEAD_NS_MAX: u64 = 1_000_000_000;

/// One line's counters.
#[derive(Debug, Clone, Serialize)]
pub struct LineStats {
    /// Packets received on the line.
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Data packets this line delivered before any other line.
    pub first_arrivals: u64,
    /// How far ahead this line was when it won: mean, p50, p99 (ns).
    pub lead_ns_mean: f64,
    /// ... its median ...
    pub lead_ns_p50: u64,
    /// ... and its 99th percentile.
    pub lead_ns_p99: u64,
    #[serde(skip)]
    lead: Histogram<u64>,
}

#[derive(Debug, Clone, Copy, Default)]
struct RaceSlot {
    seq: u64,
    line: u8,
    seen: u8,
    at_ns: u64,
    valid: bool,
}

/// All counters; `serde` gives the `--stats-json` form.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// The high-reliability window in force.
    pub window: Window,
    /// Times the window was changed at run time.
    pub window_changes: u64,
    /// Each line's counters.
    pub lines: Vec<LineStats>,
    /// Packets from the retransmission server.
    pub retransmit_packets: u64,
    /// Their bytes.
    pub retransmit_bytes: u64,
    /// Packets that were not market data of the protocol (passed to the side output).
    pub non_market: u64,
    /// Packets the low-latency output emitted.
    pub ll_packets: u64,
    /// Messages in them.
    pub ll_messages: u64,
    /// Messages the low-latency output skipped over (missing when it passed them).
    pub ll_skipped_messages: u64,
    /// Packets the high-reliability output emitted.
    pub hr_packets: u64,
    /// Packets that were held for a while (arrived ahead of a gap).
    pub held_packets: u64,
    /// Packets that brought nothing new (the other line's copy, late repeats).
    pub duplicates: u64,
    /// Packets partly new, cut down to their new messages.
    pub trimmed: u64,
    /// Gaps the high-reliability output found.
    pub gaps_opened: u64,
    /// ... filled by another line's copy ...
    pub gaps_filled_by_line: u64,
    /// ... filled by the retransmission server ...
    pub gaps_filled_by_retransmit: u64,
    /// ... and given up when the window expired.
    pub gaps_given_up: u64,
    /// Messages the high-reliability output never delivered.
    pub lost_messages: u64,
    /// Retransmission requests sent.
    pub requests_sent: u64,
    /// Requests that had no answer in time (asked again).
    pub request_timeouts: u64,
    /// Times the requests ran into their rate (`RetransmitConfig::requests_per_s`)
    /// and the next had to wait for its slot.
    pub requests_paced: u64,
    /// Requests repeated without counting an attempt because the server had
    /// answered nothing at all meanwhile (an outage waited out, within the
    /// patience).
    pub requests_waited_out: u64,
    /// Requests given up after their attempts (the gap's fate is then the window's).
    pub requests_abandoned: u64,
    /// Answers that covered only part of what was asked.
    pub partial_answers: u64,
    /// Gauges, as of the last `stats_now`: packets held ...
    pub buffer_packets: usize,
    /// ... the messages in them ...
    pub buffer_messages: u64,
    /// ... and their bytes.
    pub buffer_bytes: usize,
    /// The most packets ever held at once.
    pub buffer_packets_max_seen: usize,
    /// Gaps open now.
    pub holes_open: usize,
    /// Unique messages per second (moving average).
    pub message_rate_per_s: f64,
    /// Time the count window takes to fill at that rate (seed 004's C_t, in ns).
    pub count_window_fill_ns: f64,
    /// The worst line's p99 lead over the count window's fill time: near or
    /// above 1, the count window gives up before the slower line usually
    /// arrives, and high reliability degenerates into low latency.
    pub saturation: f64,
    #[serde(skip)]
    ring: Vec<RaceSlot>,
    #[serde(skip)]
    gauge_at: (u64, u64),
    /// The worst line's p99 lead, refreshed every [`LEAD_REFRESH`] samples
    /// (the adaptive retransmission grace reads it on the hot path).
    #[serde(skip)]
    pub(crate) lead_p99_cached: u64,
    #[serde(skip)]
    lead_samples: u64,
}

/// Lead samples between refreshes of the cached p99 lead.
const LEAD_REFRESH: u64 = 1024;

impl Stats {
    pub(crate) fn new(lines: usize, window: Window) -> Self {
        let line = LineStats {
            packets: 0,
            bytes: 0,
            first_arrivals: 0,
            lead_ns_mean: 0.0,
            lead_ns_p50: 0,
            lead_ns_p99: 0,
            lead: Histogram::new_with_bounds(1, LEAD_NS_MAX, 2).expect("valid bounds"),
        };
        Stats {
            window,
            window_changes: 0,
            lines: vec![line; lines],
            retransmit_packets: 0,
            retransmit_bytes: 0,
            non_market: 0,
            ll_packets: 0,
            ll_messages: 0,
            ll_skipped_messages: 0,
            hr_packets: 0,
            held_packets: 0,
            duplicates: 0,
            trimmed: 0,
            gaps_opened: 0,
            gaps_filled_by_line: 0,
            gaps_filled_by_retransmit: 0,
            gaps_given_up: 0,
            lost_messages: 0,
            requests_sent: 0,
            request_timeouts: 0,
            requests_paced: 0,
            requests_waited_out: 0,
            requests_abandoned: 0,
            partial_answers: 0,
            buffer_packets: 0,
            buffer_messages: 0,
            buffer_bytes: 0,
            buffer_packets_max_seen: 0,
            holes_open: 0,
            message_rate_per_s: 0.0,
            count_window_fill_ns: f64::INFINITY,
            saturation: 0.0,
            ring: vec![RaceSlot::default(); RACE_RING],
            gauge_at: (0, 0),
            lead_p99_cached: 0,
            lead_samples: 0,
        }
    }

    pub(crate) fn count_input(&mut self, source: Source, bytes: usize) {
        match source {
            Source::Line(l) => {
                self.lines[l].packets += 1;
                self.lines[l].bytes += bytes as u64;
            }
            Source::Retransmit => {
                self.retransmit_packets += 1;
                self.retransmit_bytes += bytes as u64;
            }
        }
    }

    /// Which line delivered `seq` first, and by how much.
    pub(crate) fn race(&mut self, source: Source, seq: u64, now: u64) {
        let Source::Line(line) = source else { return };
        let slot = &mut self.ring[(seq as usize) & (RACE_RING - 1)];
        if slot.valid && slot.seq == seq {
            let bit = 1u8 << line;
            if slot.seen & bit == 0 {
                slot.seen |= bit;
                let lead = now.saturating_sub(slot.at_ns).min(LEAD_NS_MAX);
                let winner = usize::from(slot.line);
                self.lines[winner].lead.saturating_record(lead);
                self.lead_samples += 1;
                if self.lead_samples % LEAD_REFRESH == 0 {
                    self.lead_p99_cached = self.lines.iter().map(|l| l.lead.value_at_quantile(0.99)).max().unwrap_or(0);
                }
            }
            return;
        }
        *slot = RaceSlot { seq, line: line as u8, seen: 1 << line, at_ns: now, valid: true };
        if self.gauge_at == (0, 0) {
            self.gauge_at = (now, self.ll_messages); // the message rate is measured from the first data
        }
        self.lines[line].first_arrivals += 1;
    }

    pub(crate) fn update_gauges(&mut self, now: u64, packets: usize, msgs: u64, bytes: usize, holes: usize) {
        self.buffer_packets = packets;
        self.buffer_messages = msgs;
        self.buffer_bytes = bytes;
        self.buffer_packets_max_seen = self.buffer_packets_max_seen.max(packets);
        self.holes_open = holes;
        for l in &mut self.lines {
            l.lead_ns_mean = if l.lead.is_empty() { 0.0 } else { l.lead.mean() };
            l.lead_ns_p50 = l.lead.value_at_quantile(0.5);
            l.lead_ns_p99 = l.lead.value_at_quantile(0.99);
        }
        let (t0, m0) = self.gauge_at;
        if now > t0 && self.ll_messages > m0 {
            let rate = (self.ll_messages - m0) as f64 * 1e9 / (now - t0) as f64;
            self.message_rate_per_s =
                if self.message_rate_per_s == 0.0 { rate } else { 0.7 * self.message_rate_per_s + 0.3 * rate };
            self.gauge_at = (now, self.ll_messages);
        }
        if self.message_rate_per_s > 0.0 {
            self.count_window_fill_ns = self.window.max_count_msgs as f64 / self.message_rate_per_s * 1e9;
            let lead = self.lines.iter().map(|l| l.lead_ns_p99).max().unwrap_or(0) as f64;
            self.saturation = lead / self.count_window_fill_ns.max(1.0);
        }
    }
}
