//! The arbitrator: N redundant lines in, a low-latency and a high-reliability
//! stream out, at the same time.
//!
//! Sans-IO: [`Arbitrator::handle_packet`] and [`Arbitrator::handle_timeout`]
//! take the current time and write their results into a [`Sink`] — packets for
//! each output stream and MoldUDP64 retransmission requests. The caller owns
//! sockets and clocks and asks [`Arbitrator::next_timeout`] when to call back.
//!
//! - **Low latency** passes a packet the moment it carries anything new and
//!   never waits (seed 004 §3.2).
//! - **High reliability** holds packets that arrive ahead of a gap and releases
//!   them in order once the gap fills, or gives the gap up when the window says
//!   so: by time (max hold per packet), by count (messages held), or either
//!   (seed 004 §3.1). An idle feed (no input for `idle_flush_ns`) and the end of
//!   the session also end the wait, so count mode cannot stall at the end of the
//!   day as the seed's does.
//! - **Retransmission** (beyond the seed): a gap still open after a grace time
//!   is requested from a MoldUDP64 retransmission server; when a window expires
//!   on a gap whose request is still alive, the output keeps waiting for the
//!   answer, so a gap is lost only when every line lost it and retransmission
//!   failed. Partial answers are accepted and the rest asked for again; no range
//!   is requested twice while a request for it is alive.
//!
//! Invariants (checked by the property tests): the high-reliability stream is
//! strictly increasing in sequence, carries no message twice, and loses a
//! message only when counted in `lost_messages`; the low-latency stream never
//! holds a packet and never repeats a message.

use std::collections::BTreeMap;

use fairfeed_wire::moldudp64::RequestRepr;
use fairfeed_wire::Alpha;

use crate::spec::{Kind, PacketInfo, SeqSpec};
use crate::stats::Stats;
use crate::types::{
    Config, Mode, RetransmitConfig, Sink, Source, Start, Stream, Window, CONTROL_DEDUP_NS, HOLES_MAX, LINES_MAX,
    REQUESTS_IN_FLIGHT_MAX,
};

#[derive(Debug)]
struct Held {
    bytes: Vec<u8>,
    info: PacketInfo,
    arrival_ns: u64,
}

#[derive(Debug, Clone, Copy)]
struct Hole {
    to: u64,
    opened_ns: u64,
    /// Retransmission for (part of) this hole failed: nothing more to wait for.
    abandoned: bool,
}

#[derive(Debug, Clone, Copy)]
struct Request {
    from: u64,
    to: u64,
    sent_ns: u64,
    attempts: u32,
    /// A short answer came: send again for the rest without waiting for the timeout.
    resend: bool,
}

#[derive(Debug, Default, Clone, Copy)]
struct ControlSeen {
    seq: u64,
    kind: Option<Kind>,
    at_ns: u64,
}

/// The arbitrator state machine.
pub struct Arbitrator {
    cfg: Config,
    spec: SeqSpec,
    next_ll: Option<u64>,
    next_hr: Option<u64>,
    /// Highest sequence end seen on any input (data or heartbeat).
    seen_end: u64,
    held: BTreeMap<u64, Held>,
    held_msgs: u64,
    held_bytes: usize,
    holes: BTreeMap<u64, Hole>,
    requests: Vec<Request>,
    /// Request pacing (GCRA): the theoretical time of the next request
    /// slot; a request may go while it is no more than the burst ahead of now.
    pace_tat: u64,
    /// The last request wanted was refused a slot (a wait is counted once).
    pace_waiting: bool,
    /// When the server last answered anything.
    last_answer_ns: u64,
    /// The first request sent since its last answer (patience runs from
    /// here: a server silent that long is down, and every range is then
    /// judged by its attempts alone, until it answers again).
    unanswered_since: Option<u64>,
    session: Option<Alpha<10>>,
    last_data_ns: u64,
    /// The window expired on the first gap and a retransmission answer is awaited.
    waiting_on_retransmit: bool,
    ended: bool,
    /// An end-of-session packet waiting for the high-reliability output to catch up.
    pending_end: Option<(u64, Vec<u8>)>,
    ctrl_ll: ControlSeen,
    ctrl_hr: ControlSeen,
    scratch: Vec<u8>,
    stats: Stats,
}

impl Arbitrator {
    /// A new arbitrator; checks the configuration.
    pub fn new(cfg: Config, spec: SeqSpec) -> Result<Self, crate::spec::ConfigError> {
        use crate::spec::ConfigError;
        spec.validate()?;
        if cfg.lines == 0 || cfg.lines > LINES_MAX {
            return Err(ConfigError::Lines { max: LINES_MAX, got: cfg.lines });
        }
        if cfg.retransmit.is_some() && spec.session.is_none() {
            return Err(ConfigError::NoSession(spec.name.clone()));
        }
        if cfg.buffer_packets_max == 0 || cfg.buffer_bytes_max == 0 {
            return Err(ConfigError::Buffers);
        }
        if cfg.retransmit.is_some_and(|r| r.requests_per_s == 0 || r.request_burst == 0) {
            return Err(ConfigError::RequestRate);
        }
        let (next_ll, next_hr) = match cfg.start {
            Start::First => (None, None),
            Start::Seq(s) => (Some(s), Some(s)),
        };
        let stats = Stats::new(cfg.lines, cfg.window);
        Ok(Arbitrator {
            seen_end: next_hr.unwrap_or(0),
            cfg,
            spec,
            next_ll,
            next_hr,
            held: BTreeMap::new(),
            held_msgs: 0,
            held_bytes: 0,
            holes: BTreeMap::new(),
            requests: Vec::new(),
            pace_tat: 0,
            pace_waiting: false,
            last_answer_ns: 0,
            unanswered_since: None,
            session: None,
            last_data_ns: 0,
            waiting_on_retransmit: false,
            ended: false,
            pending_end: None,
            ctrl_ll: ControlSeen::default(),
            ctrl_hr: ControlSeen::default(),
            scratch: Vec::new(),
            stats,
        })
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The counters, with the gauges (buffer depth, saturation) brought up to date.
    pub fn stats_now(&mut self, now_ns: u64) -> &Stats {
        self.stats.update_gauges(now_ns, self.held.len(), self.held_msgs, self.held_bytes, self.holes.len());
        &self.stats
    }

    /// The window in force.
    pub fn window(&self) -> Window {
        self.cfg.window
    }

    /// Next sequence number the high-reliability output will emit.
    pub fn next_high_reliability(&self) -> Option<u64> {
        self.next_hr
    }

    /// Packets held now.
    pub fn held_packets(&self) -> usize {
        self.held.len()
    }

    /// True once an end-of-session packet was seen on any input.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// True when the session ended and the high-reliability output has
    /// everything it will ever emit: nothing held, no gap pending.
    pub fn drained(&self) -> bool {
        self.ended
            && self.held.is_empty()
            && self.next_hr.is_some_and(|n| n >= self.seen_end)
            && self.pending_end.is_none()
    }

    /// Changes the window at run time. Held packets stay held and are judged
    /// by the new window from now on: nothing is lost or repeated by the change
    /// itself.
    pub fn set_window(&mut self, now_ns: u64, window: Window, sink: &mut impl Sink) {
        self.cfg.window = window;
        self.stats.window = window;
        self.stats.window_changes += 1;
        self.check_windows(now_ns, sink);
    }

    /// Feeds one packet from a line or from the retransmission server.
    pub fn handle_packet(&mut self, now_ns: u64, source: Source, packet: &[u8], sink: &mut impl Sink) {
        if let Source::Line(l) = source {
            assert!(l < self.cfg.lines, "line {l} out of range");
        }
        self.stats.count_input(source, packet.len());
        let Some(info) = self.spec.parse(packet) else {
            self.stats.non_market += 1;
            sink.emit(Stream::Side(source), packet);
            return;
        };
        if self.session.is_none() {
            self.session = self.spec.session(packet).and_then(|s| <[u8; 10]>::try_from(s).ok()).map(Alpha);
        }
        if info.kind != Kind::Data {
            self.handle_control(now_ns, packet, info, sink);
        } else {
            self.last_data_ns = now_ns;
            self.stats.race(source, info.seq, now_ns);
            self.low_latency(packet, &info, sink);
            self.high_reliability(now_ns, source, packet, info, sink);
        }
        self.service(now_ns, sink);
    }

    /// Call when [`Self::next_timeout`] has passed (calling early is harmless).
    pub fn handle_timeout(&mut self, now_ns: u64, sink: &mut impl Sink) {
        self.service(now_ns, sink);
    }

    /// The earliest time at which a timeout could change something.
    pub fn next_timeout(&self) -> Option<u64> {
        let mut t: Option<u64> = None;
        let mut at = |x: u64| t = Some(t.map_or(x, |y| y.min(x)));
        // While the output waits on retransmission, only the requests' timers matter.
        if !self.waiting_on_retransmit {
            if !self.held.is_empty() || !self.holes.is_empty() {
                at(self.last_data_ns.saturating_add(self.cfg.idle_flush_ns));
            }
            if let Some((_, h)) = self.held.first_key_value() {
                if self.cfg.window.mode != Mode::Count {
                    at(h.arrival_ns.saturating_add(self.cfg.window.max_hold_ns));
                }
            }
            if let Some((_, h)) = self.holes.first_key_value() {
                if self.held.is_empty() && self.cfg.window.mode != Mode::Count {
                    at(h.opened_ns.saturating_add(self.cfg.window.max_hold_ns));
                }
            }
        }
        if let Some(rt) = self.cfg.retransmit {
            let slot = self.pace_next(&rt);
            if self.requests.len() < REQUESTS_IN_FLIGHT_MAX {
                let grace = self.grace_ns(&rt);
                for (_, h) in self.holes.iter().filter(|(&f, h)| !h.abandoned && !self.covered(f)) {
                    at(h.opened_ns.saturating_add(grace).max(slot));
                }
            }
            for r in &self.requests {
                at(if r.resend { slot } else { r.sent_ns.saturating_add(rt.timeout_ns).max(slot) });
            }
        }
        t
    }

    /// How long a gap may stay open before it is requested.
    fn grace_ns(&self, rt: &RetransmitConfig) -> u64 {
        if rt.adaptive_grace {
            rt.grace_ns.max(self.stats.lead_p99_cached)
        } else {
            rt.grace_ns
        }
    }

    /// The first missing range inside [from, to), if any.
    fn first_missing(&self, from: u64, to: u64) -> Option<(u64, u64)> {
        let (&a, h) = self.holes.range(..to).find(|(_, h)| h.to > from)?;
        Some((a.max(from), h.to.min(to)))
    }

    /// True if an alive request covers sequence `seq`.
    fn covered(&self, seq: u64) -> bool {
        self.requests.iter().any(|r| r.from <= seq && seq < r.to)
    }

    fn low_latency(&mut self, packet: &[u8], info: &PacketInfo, sink: &mut impl Sink) {
        let next = *self.next_ll.get_or_insert(info.seq);
        if info.seq >= next {
            if info.seq > next {
                self.stats.ll_skipped_messages += info.seq - next;
            }
            sink.emit(Stream::LowLatency, packet);
            self.stats.ll_packets += 1;
            self.stats.ll_messages += info.count;
            self.next_ll = Some(info.end());
        } else if info.end() > next && self.spec.trim(packet, info, next - info.seq, &mut self.scratch) {
            sink.emit(Stream::LowLatency, &self.scratch);
            self.stats.ll_packets += 1;
            self.stats.ll_messages += info.end() - next;
            self.stats.trimmed += 1;
            self.next_ll = Some(info.end());
        }
    }

    fn high_reliability(&mut self, now: u64, source: Source, packet: &[u8], info: PacketInfo, sink: &mut impl Sink) {
        let next = *self.next_hr.get_or_insert(info.seq);
        if source == Source::Retransmit {
            // Even a late answer tells which request it answered.
            self.last_answer_ns = now;
            self.unanswered_since = None;
            self.answered(info.seq, info.end());
        }
        if info.end() <= next {
            self.stats.duplicates += 1;
            return;
        }
        self.note_seen(now, info.seq, info.end());
        if info.seq <= next {
            self.fill_holes(next, info.end(), source);
            if info.seq == next {
                sink.emit(Stream::HighReliability, packet);
            } else if self.spec.trim(packet, &info, next - info.seq, &mut self.scratch) {
                self.stats.trimmed += 1;
                sink.emit(Stream::HighReliability, &self.scratch);
            } else {
                // Overlapping and not trimmable: the new messages stay missing.
                self.stats.duplicates += 1;
                self.reopen(next, info.end(), now);
                return;
            }
            self.stats.hr_packets += 1;
            self.next_hr = Some(info.end());
            self.release(sink);
        } else {
            if let Some(h) = self.held.get(&info.seq) {
                if h.info.end() >= info.end() {
                    self.stats.duplicates += 1;
                    return;
                }
            }
            // Ahead of a gap: hold a copy.
            self.fill_holes(info.seq, info.end(), source);
            let bytes = packet.to_vec();
            self.held_bytes += bytes.len();
            self.held_msgs += info.count;
            if let Some(old) = self.held.insert(info.seq, Held { bytes, info, arrival_ns: now }) {
                self.held_bytes -= old.bytes.len();
                self.held_msgs -= old.info.count;
            }
            self.stats.held_packets += 1;
        }
    }

    fn handle_control(&mut self, now: u64, packet: &[u8], info: PacketInfo, sink: &mut impl Sink) {
        if info.kind == Kind::EndOfSession {
            self.ended = true;
        }
        let next_ll = *self.next_ll.get_or_insert(info.seq);
        if info.seq >= next_ll && fresh(&mut self.ctrl_ll, info, now) {
            sink.emit(Stream::LowLatency, packet);
        }
        let next_hr = *self.next_hr.get_or_insert(info.seq);
        // A heartbeat's sequence is the next one expected: anything below it is a gap.
        self.note_seen(now, info.seq, info.seq);
        let in_order = info.seq == next_hr && self.held.is_empty();
        if in_order && fresh(&mut self.ctrl_hr, info, now) {
            sink.emit(Stream::HighReliability, packet);
        } else if !in_order && info.kind == Kind::EndOfSession && self.pending_end.is_none() {
            self.pending_end = Some((info.seq, packet.to_vec()));
        }
    }

    /// Records that the sequence reaches `end` and that everything before
    /// `gap_to` should have arrived: a jump opens a hole.
    fn note_seen(&mut self, now: u64, gap_to: u64, end: u64) {
        let from = self.seen_end.max(self.next_hr.unwrap_or(0));
        if gap_to > from {
            self.open_hole(from, gap_to, now);
        }
        self.seen_end = self.seen_end.max(end);
    }

    fn open_hole(&mut self, from: u64, to: u64, now: u64) {
        if from >= to {
            return;
        }
        self.holes.insert(from, Hole { to, opened_ns: now, abandoned: false });
        self.stats.gaps_opened += 1;
    }

    /// A range that was about to be filled but could not be (untrimmable overlap).
    fn reopen(&mut self, from: u64, to: u64, now: u64) {
        self.holes.entry(from).or_insert(Hole { to, opened_ns: now, abandoned: false });
    }

    /// Removes [from, to) from the holes; counts holes closed, by source.
    fn fill_holes(&mut self, from: u64, to: u64, source: Source) -> u64 {
        if self.holes.is_empty() {
            return 0;
        }
        let overlapping: Vec<u64> =
            self.holes.range(..to).filter(|(&a, h)| h.to > from && a < to).map(|(&a, _)| a).collect();
        let mut closed = 0;
        for a in overlapping {
            let Some(h) = self.holes.remove(&a) else { continue };
            if a < from {
                self.holes.insert(a, Hole { to: from, ..h });
            }
            if h.to > to {
                self.holes.insert(to, Hole { to: h.to, ..h });
            }
            if a >= from && h.to <= to {
                closed += 1;
                match source {
                    Source::Line(_) => self.stats.gaps_filled_by_line += 1,
                    Source::Retransmit => self.stats.gaps_filled_by_retransmit += 1,
                }
            }
        }
        closed
    }

    /// Emits held packets that are now in order.
    fn release(&mut self, sink: &mut impl Sink) {
        let Some(mut next) = self.next_hr else { return };
        while let Some(entry) = self.held.first_entry() {
            if *entry.key() > next {
                break;
            }
            let h = entry.remove();
            self.held_bytes -= h.bytes.len();
            self.held_msgs -= h.info.count;
            if h.info.end() <= next {
                self.stats.duplicates += 1;
                continue;
            }
            if h.info.seq == next {
                sink.emit(Stream::HighReliability, &h.bytes);
            } else if self.spec.trim(&h.bytes, &h.info, next - h.info.seq, &mut self.scratch) {
                self.stats.trimmed += 1;
                sink.emit(Stream::HighReliability, &self.scratch);
            } else {
                self.stats.duplicates += 1;
                continue;
            }
            self.stats.hr_packets += 1;
            next = h.info.end();
        }
        self.next_hr = Some(next);
        self.holes.retain(|_, h| h.to > next);
        if let Some((&a, &h)) = self.holes.first_key_value() {
            if a < next {
                self.holes.remove(&a);
                self.holes.insert(next, h);
            }
        }
        self.requests.retain(|r| r.to > next);
        if self.held.is_empty() && self.seen_end <= next {
            self.holes.clear();
        }
        if self.held.is_empty() && self.pending_end.as_ref().is_some_and(|(s, _)| *s <= next) {
            if let Some((seq, p)) = self.pending_end.take() {
                sink.emit(Stream::HighReliability, &p);
                self.ctrl_hr = ControlSeen { seq, kind: Some(Kind::EndOfSession), at_ns: u64::MAX };
            }
        }
    }

    /// Timers, windows and retransmission, after any event.
    fn service(&mut self, now: u64, sink: &mut impl Sink) {
        if self.held.is_empty() && self.holes.is_empty() && self.requests.is_empty() {
            return; // the common case: in order, nothing waiting
        }
        self.check_windows(now, sink);
        if self.cfg.retransmit.is_some() {
            self.retransmit(now, sink, false);
        }
    }

    /// Whether the window (or idleness, the session's end, a full buffer)
    /// says to stop waiting for the first gap.
    fn window_expired(&self, now: u64) -> bool {
        let w = self.cfg.window;
        let idle = now.saturating_sub(self.last_data_ns) >= self.cfg.idle_flush_ns;
        let full = self.held.len() > self.cfg.buffer_packets_max
            || self.held_bytes > self.cfg.buffer_bytes_max
            || self.holes.len() > HOLES_MAX;
        let first_arrival = self
            .held
            .first_key_value()
            .map(|(_, h)| h.arrival_ns)
            .or(self.holes.first_key_value().map(|(_, h)| h.opened_ns));
        let by_time = first_arrival.is_some_and(|t| now.saturating_sub(t) >= w.max_hold_ns);
        let by_count = self.held_msgs > w.max_count_msgs;
        let by_window = match w.mode {
            Mode::Time => by_time,
            Mode::Count => by_count,
            Mode::TimeCount => by_time || by_count,
        };
        idle || full || by_window
    }

    fn check_windows(&mut self, now: u64, sink: &mut impl Sink) {
        self.waiting_on_retransmit = false;
        // Each pass gives up one gap or stops; bounded by the number of holes.
        for _ in 0..=HOLES_MAX + 1 {
            let Some(next) = self.next_hr else { return };
            if self.held.is_empty() && self.seen_end <= next {
                return;
            }
            if !self.window_expired(now) {
                return;
            }
            let full = self.held.len() > self.cfg.buffer_packets_max || self.held_bytes > self.cfg.buffer_bytes_max;
            if self.cfg.retransmit.is_some() && !full && !self.first_gap_abandoned() {
                // The lines are done with this gap; retransmission is not.
                self.retransmit(now, sink, true);
                self.waiting_on_retransmit = !self.first_gap_abandoned();
                if self.waiting_on_retransmit {
                    return;
                }
                continue;
            }
            self.give_up_first_gap(sink);
        }
    }

    fn first_gap_abandoned(&self) -> bool {
        let Some(next) = self.next_hr else { return true };
        self.holes.get(&next).is_none_or(|h| h.abandoned)
    }

    fn give_up_first_gap(&mut self, sink: &mut impl Sink) {
        let Some(next) = self.next_hr else { return };
        let target = self.held.first_key_value().map(|(&s, _)| s).unwrap_or(self.seen_end);
        if target <= next {
            self.release(sink);
            return;
        }
        self.stats.gaps_given_up += 1;
        self.stats.lost_messages += target - next;
        self.next_hr = Some(target);
        self.holes.remove(&next);
        self.release(sink);
    }

    /// Sends requests for holes past their grace (or all, when `forced`),
    /// re-sends timed-out ones, and abandons ranges out of attempts.
    fn retransmit(&mut self, now: u64, sink: &mut impl Sink, forced: bool) {
        let Some(rt) = self.cfg.retransmit else { return };
        let Some(session) = self.session else { return };
        // Time-outs and short answers first.
        let mut i = 0;
        while i < self.requests.len() {
            // Ask only for what is still missing: the first hole in the range.
            let Some((from, to)) = self.first_missing(self.requests[i].from, self.requests[i].to) else {
                self.requests.swap_remove(i); // the lines filled it meanwhile
                continue;
            };
            self.requests[i].from = from;
            self.requests[i].to = to;
            let r = self.requests[i];
            if r.resend {
                if !self.pace(now, &rt) {
                    i += 1; // its turn comes with the next request slot
                    continue;
                }
                self.requests[i] = Request { sent_ns: now, resend: false, ..r };
                self.send_request(now, sink, session, r.from, r.to);
                i += 1;
                continue;
            }
            if now.saturating_sub(r.sent_ns) < rt.timeout_ns {
                i += 1;
                continue;
            }
            // A time-out counts as an attempt only if the server answered
            // others meanwhile (then this range may be gone from its
            // journal); while it answers nothing at all — the client's
            // network or the server down for a while — the range is asked
            // for again, uncounted, for the patience; a partition is waited
            // out, not given up.
            let silent = self.last_answer_ns < r.sent_ns;
            let patient = silent && now.saturating_sub(self.unanswered_since.unwrap_or(now)) < rt.patience_ns;
            if r.attempts >= rt.attempts_max && !patient {
                self.stats.request_timeouts += 1;
                self.requests.swap_remove(i);
                for h in self.holes.range_mut(..r.to).filter(|(_, h)| h.to > r.from) {
                    h.1.abandoned = true;
                }
                self.stats.requests_abandoned += 1;
                continue;
            }
            if !self.pace(now, &rt) {
                i += 1;
                continue;
            }
            self.stats.request_timeouts += 1;
            self.stats.requests_waited_out += u64::from(patient);
            self.requests[i] = Request { sent_ns: now, attempts: r.attempts + u32::from(!patient), ..r };
            self.send_request(now, sink, session, r.from, r.to);
            i += 1;
        }
        // New holes.
        let grace = self.grace_ns(&rt);
        let due: Vec<(u64, u64)> = self
            .holes
            .iter()
            .filter(|(_, h)| !h.abandoned && (forced || now.saturating_sub(h.opened_ns) >= grace))
            .map(|(&a, h)| (a, h.to))
            .collect();
        for (mut from, to) in due {
            while from < to && self.requests.len() < REQUESTS_IN_FLIGHT_MAX {
                // Skip what an alive request already covers.
                if let Some(r) = self.requests.iter().find(|r| r.from <= from && from < r.to) {
                    from = r.to;
                    continue;
                }
                if !self.pace(now, &rt) {
                    return; // the rest goes with the next request slots
                }
                let limit = self.requests.iter().filter(|r| r.from > from).map(|r| r.from).min().unwrap_or(u64::MAX);
                let end = to.min(limit).min(from + u64::from(rt.request_count_max));
                self.requests.push(Request { from, to: end, sent_ns: now, attempts: 1, resend: false });
                self.send_request(now, sink, session, from, end);
                from = end;
            }
        }
    }

    /// Takes a request slot at `now` if one is free (GCRA: at most
    /// `requests_per_s` on average, `request_burst` back to back).
    fn pace(&mut self, now: u64, rt: &RetransmitConfig) -> bool {
        let (interval, tolerance) = Self::pace_shape(rt);
        let tat = self.pace_tat.max(now);
        if tat - now > tolerance {
            self.stats.requests_paced += u64::from(!self.pace_waiting);
            self.pace_waiting = true;
            return false;
        }
        self.pace_waiting = false;
        self.pace_tat = tat + interval;
        true
    }

    /// When the next request slot is free.
    fn pace_next(&self, rt: &RetransmitConfig) -> u64 {
        self.pace_tat.saturating_sub(Self::pace_shape(rt).1)
    }

    /// (ns between slots, how far ahead of now the schedule may run).
    fn pace_shape(rt: &RetransmitConfig) -> (u64, u64) {
        let interval = 1_000_000_000 / u64::from(rt.requests_per_s.max(1));
        (interval, interval * u64::from(rt.request_burst.max(1) - 1))
    }

    fn send_request(&mut self, now: u64, sink: &mut impl Sink, session: Alpha<10>, from: u64, to: u64) {
        self.unanswered_since.get_or_insert(now);
        let count = (to - from).min(u64::from(u16::MAX - 1)) as u16;
        sink.request(RequestRepr { session, sequence: from, count });
        self.stats.requests_sent += 1;
    }

    /// An answer covered [from, to): shrink the requests it answered; if an
    /// answer was short, ask again for the rest at once.
    fn answered(&mut self, from: u64, to: u64) {
        for r in &mut self.requests {
            if r.from >= from && r.from < to {
                if to < r.to {
                    self.stats.partial_answers += 1;
                    // The next `retransmit` pass asks for the rest.
                    r.from = to;
                    r.resend = true;
                } else {
                    r.from = r.to; // fully answered
                }
            }
        }
        self.requests.retain(|r| r.from < r.to);
    }
}

/// True if this control packet was not just forwarded (A and B copies of one heartbeat).
fn fresh(seen: &mut ControlSeen, info: PacketInfo, now: u64) -> bool {
    let same = seen.kind == Some(info.kind) && seen.seq == info.seq;
    // One end of session per stream, ever; heartbeats once per dedup window.
    let repeat = same && (info.kind == Kind::EndOfSession || now.saturating_sub(seen.at_ns) < CONTROL_DEDUP_NS);
    if !repeat {
        *seen = ControlSeen { seq: info.seq, kind: Some(info.kind), at_ns: now };
    }
    !repeat
}
