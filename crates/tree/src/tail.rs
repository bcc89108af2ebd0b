//! The distribution of the *last* arrival, and the deadline that covers it.
//!
//! A message is fair only if every receiver has it by its deadline, so what
//! the sender must know is, per message, the largest one-way delay over all
//! receivers. Receivers log each message's delay ([`TailLog`]); each report
//! carries the log as a tail section ([`TailView`]) and proxies merge their
//! children's by max, so the sender learns, a few report intervals later, the
//! largest delay of each message in the whole tree. [`TailEstimator`] keeps a
//! window of those and sets the deadline offset to their `target`-quantile,
//! with a confidence margin that shrinks as samples accumulate — an open-loop
//! estimate, not a feedback loop, so it means the same at 500 and at 20,000
//! messages per second.
//!
//! When there are too few samples for the quantile itself (a 0.9999 target
//! over a few thousand messages), the tail above the top samples is
//! extrapolated with an exponential fit (peaks over threshold). A regime
//! change — in one report interval, far more fresh maxima well above the
//! estimate than the target allows — raises the offset at once to that
//! interval's own estimate, before the samples settle into the window.

use std::collections::VecDeque;

use fairfeed_wire::overlay::{TailView, TAIL_HEADER_LEN, TAIL_MAX};

/// Sequences one log spans at most: older entries give way to newer ones.
pub const TAIL_SPAN_MAX: u64 = 65_536;
/// Settled per-message maxima the estimator keeps at most.
pub const WINDOW_MAX: usize = 65_536;
/// Samples needed before the estimator gives a deadline.
pub const SAMPLES_MIN: usize = 200;
/// Messages the sender tracks while their maxima arrive, at most.
pub const BOOK_MAX: usize = 1 << 18;
/// Report intervals a message's maximum is first given to arrive (the
/// settle time grows, one interval at a time, while maxima arrive later).
pub const SETTLE_INTERVALS: u64 = 6;
/// Report intervals the settle time grows to at most.
pub const SETTLE_INTERVALS_MAX: u64 = 64;
/// The newest samples compared with the whole window to see a fall.
pub const RECENT: usize = 2_000;
/// The recent estimate must stay below this share of the window's ...
pub const FALL_RATIO: f64 = 0.8;
/// ... for this many updates in a row before the older samples are dropped.
pub const FALL_UPDATES: u32 = 20;

/// Per-message largest one-way delays seen since the last report, by sequence.
#[derive(Debug, Clone, Default)]
pub struct TailLog {
    base: u64,
    vals: VecDeque<u64>,
    /// Entries given up because the log's span was exceeded.
    pub dropped: u64,
}

impl TailLog {
    /// The newest entry (a prefetch hint; dangling when empty, never read).
    #[cfg(feature = "prefetch")]
    pub fn back(&self) -> *const u64 {
        self.vals.back().map_or(std::ptr::null(), std::ptr::from_ref)
    }

    /// Folds in message `seq`'s delay (max with what is logged).
    pub fn record(&mut self, seq: u64, owd_ns: u64) {
        let v = owd_ns.max(1);
        if self.vals.is_empty() {
            self.base = seq;
            self.vals.push_back(v);
            return;
        }
        let end = self.base + self.vals.len() as u64;
        if seq < self.base {
            if end - seq > TAIL_SPAN_MAX {
                self.dropped += 1;
                return;
            }
            for _ in seq + 1..self.base {
                self.vals.push_front(0);
            }
            self.vals.push_front(v);
            self.base = seq;
        } else if seq >= end {
            if seq - self.base >= TAIL_SPAN_MAX {
                // Keep the newest span: drop what falls off the front.
                let keep_from = seq + 1 - TAIL_SPAN_MAX;
                while self.base < keep_from && !self.vals.is_empty() {
                    if self.vals.pop_front().is_some_and(|x| x > 0) {
                        self.dropped += 1;
                    }
                    self.base += 1;
                }
                if self.vals.is_empty() {
                    self.base = seq;
                }
            }
            let end = self.base + self.vals.len() as u64;
            for _ in end..seq {
                self.vals.push_back(0);
            }
            self.vals.push_back(v);
        } else {
            let slot = &mut self.vals[(seq - self.base) as usize];
            *slot = (*slot).max(v);
        }
    }

    /// Folds in a child's tail (each group's max applied to every sequence of it).
    pub fn merge(&mut self, t: &TailView) {
        let stride = u64::from(t.stride);
        for (first, v) in t.entries() {
            for s in first..first + stride {
                self.record(s, v);
            }
        }
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.vals.is_empty()
    }

    /// Appends the log as a tail section to `out` (coarsened to at most
    /// [`TAIL_MAX`] entries) and empties it.
    pub fn drain_into(&mut self, out: &mut Vec<u8>) {
        if self.vals.is_empty() {
            return;
        }
        let mut stride = 1usize;
        while self.vals.len().div_ceil(stride) > TAIL_MAX {
            stride *= 2;
        }
        let (a, b) = self.vals.as_slices();
        let mut groups = Vec::with_capacity(self.vals.len().div_ceil(stride));
        let mut it = a.iter().chain(b).copied();
        loop {
            let g = it.by_ref().take(stride).fold(None, |m: Option<u64>, v| Some(m.unwrap_or(0).max(v)));
            match g {
                Some(v) => groups.push(v),
                None => break,
            }
        }
        let at = out.len();
        out.resize(at + TAIL_HEADER_LEN + 2 * groups.len(), 0);
        let stride = u16::try_from(stride).expect("span / TAIL_MAX fits u16");
        let _ = TailView::emit(self.base, stride, &groups, &mut out[at..]);
        self.vals.clear();
    }
}

/// Estimator settings.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TailConfig {
    /// The target P(F): the share of messages every receiver has by its deadline.
    pub target: f64,
    /// A message's maximum is taken as final this long after it was sent, at
    /// first (reports climb the tree up to an interval per level) ...
    pub settle_ns: u64,
    /// ... and this much longer after each update that saw maxima arrive for
    /// messages already settled (a deeper tree, slower reports) ...
    pub settle_step_ns: u64,
    /// ... up to this.
    pub settle_max_ns: u64,
    /// Confidence (standard deviations) of the margin above the estimate.
    pub z: f64,
}

impl TailConfig {
    /// Settings for a target P(F) and a report interval, the rest at their defaults.
    pub fn new(target: f64, report_interval_ns: u64) -> Self {
        assert!((0.0..1.0).contains(&target), "target P(F) must be in [0, 1)");
        assert!(report_interval_ns > 0, "report interval must be positive");
        TailConfig {
            target,
            settle_ns: SETTLE_INTERVALS * report_interval_ns,
            settle_step_ns: report_interval_ns,
            settle_max_ns: SETTLE_INTERVALS_MAX * report_interval_ns,
            z: 1.0,
        }
    }
}

/// What the estimator did, for stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct TailStats {
    /// Settled per-message maxima in the window.
    pub samples: u64,
    /// The last estimate of the target quantile (with its margin), ns.
    pub estimate_ns: u64,
    /// Regime changes detected (fresh maxima far above the estimate); each
    /// restarts the window from the new regime's samples.
    pub surges: u64,
    /// Falls detected (the newest samples' estimate well below the window's
    /// for a while); each drops all but the newest samples.
    pub falls: u64,
    /// Rises detected (significantly more of the newest samples above the
    /// estimate than the target allows); each drops all but the newest samples.
    pub rises: u64,
    /// Tail entries for messages already settled or never tracked.
    pub stale_entries: u64,
    /// Of those, entries for messages settled too early (each update that
    /// sees some lengthens the settle time).
    pub late_entries: u64,
    /// The settle time now, ns.
    pub settle_ns: u64,
    /// Settled messages no receiver reported (lost everywhere, or reports lost).
    pub unreported: u64,
}

/// The sender's view of per-message maxima, and the deadline offset they call for.
#[derive(Debug, Clone)]
pub struct TailEstimator {
    /// Its settings.
    pub cfg: TailConfig,
    /// Messages sent and not yet settled: (send ns, largest delay so far), from `book_base`.
    book: VecDeque<(u64, u64)>,
    book_base: u64,
    /// The first sequence of the current run of consecutive sends: entries
    /// from it up to `book_base` are for messages already settled.
    run_base: u64,
    settle_ns: u64,
    /// Late entries since the last update.
    late_fresh: u64,
    window: VecDeque<u64>,
    scratch: Vec<u64>,
    estimate: Option<u64>,
    /// Since the last update: values of entries that crossed above the
    /// estimate, and how many entries got their first value.
    fresh_over: Vec<u64>,
    fresh_seen: u64,
    /// A floor from a detected regime change, and the earliest time it lifts
    /// (it also waits for the window to refill).
    surge: Option<(u64, u64)>,
    /// Updates in a row the recent estimate was below the window's.
    low_streak: u32,
    /// Its counters.
    pub stats: TailStats,
}

impl TailEstimator {
    /// An estimator with `cfg` (no estimate until enough messages settled).
    pub fn new(cfg: TailConfig) -> Self {
        assert!(cfg.settle_max_ns >= cfg.settle_ns, "settle time cap below the initial settle time");
        TailEstimator {
            cfg,
            book: VecDeque::new(),
            book_base: 1,
            run_base: 1,
            settle_ns: cfg.settle_ns,
            late_fresh: 0,
            window: VecDeque::new(),
            scratch: Vec::new(),
            estimate: None,
            fresh_over: Vec::new(),
            fresh_seen: 0,
            surge: None,
            low_streak: 0,
            stats: TailStats { settle_ns: cfg.settle_ns, ..TailStats::default() },
        }
    }

    /// Message `seq` was sent at `now`.
    pub fn sent(&mut self, seq: u64, now: u64) {
        if self.book.is_empty() || seq != self.book_base + self.book.len() as u64 {
            self.settle_all();
            self.book_base = seq;
            self.run_base = seq;
        }
        self.book.push_back((now, 0));
        if self.book.len() > BOOK_MAX {
            // Settled for room, not by time: maxima that arrive for it later
            // say nothing about the settle time.
            self.settle_front();
            self.run_base = self.book_base;
        }
    }

    /// Folds in a tail from the tree.
    pub fn merge(&mut self, t: &TailView) {
        let stride = u64::from(t.stride);
        // Only maxima well above the estimate (by a tenth) are evidence of a
        // new regime; a small shift reaches the window's quantile on its own.
        let thr = self.estimate.map_or(u64::MAX, |e| {
            let e = e.max(self.surge.map_or(0, |s| s.0));
            e + e / 10
        });
        for (first, v) in t.entries() {
            for s in first..first + stride {
                let Some(i) = s.checked_sub(self.book_base).filter(|&i| i < self.book.len() as u64) else {
                    self.stats.stale_entries += 1;
                    if (self.run_base..self.book_base).contains(&s) {
                        self.late_fresh += 1;
                    }
                    continue;
                };
                let slot = &mut self.book[i as usize].1;
                self.fresh_seen += u64::from(*slot == 0);
                if *slot <= thr && v > thr && self.fresh_over.len() < BOOK_MAX {
                    self.fresh_over.push(v);
                }
                *slot = (*slot).max(v);
            }
        }
    }

    fn settle_front(&mut self) {
        if let Some((_, v)) = self.book.pop_front() {
            self.book_base += 1;
            if v == 0 {
                self.stats.unreported += 1;
                return;
            }
            if self.window.len() >= WINDOW_MAX {
                self.window.pop_front();
            }
            self.window.push_back(v);
        }
    }

    fn settle_all(&mut self) {
        while !self.book.is_empty() {
            self.settle_front();
        }
    }

    /// Settles what is due and recomputes the estimate; called once per
    /// report interval. Returns the offset (ns) the deadline should add to
    /// the send time, before any clock bound, or `None` while samples are too few.
    pub fn update(&mut self, now: u64) -> Option<u64> {
        if self.late_fresh > 0 {
            self.stats.late_entries += self.late_fresh;
            self.late_fresh = 0;
            self.settle_ns = (self.settle_ns + self.cfg.settle_step_ns).min(self.cfg.settle_max_ns);
            self.stats.settle_ns = self.settle_ns;
        }
        while self.book.front().is_some_and(|&(t, _)| now.saturating_sub(t) >= self.settle_ns) {
            self.settle_front();
        }
        // A regime change: far more fresh maxima above the estimate than the
        // target allows, in one interval. The floor is then the interval's own
        // estimate (the value that only as many fresh maxima as the target
        // allows exceed), and the window restarts: a mix of old and new
        // samples would put the quantile inside the new regime's body.
        if self.estimate.is_some() {
            let expected = self.fresh_seen as f64 * (1.0 - self.cfg.target);
            let limit = 2.0 + 2.0 * expected + 3.0 * expected.sqrt();
            if self.fresh_over.len() as f64 > limit {
                self.stats.surges += 1;
                let k = (expected.floor() as usize).min(self.fresh_over.len() - 1);
                self.fresh_over.sort_unstable_by(|a, b| b.cmp(a));
                let floor = self.surge.map_or(0, |s| s.0).max(self.fresh_over[k]);
                self.surge = Some((floor, now + self.settle_ns * 2));
                self.window.clear();
                self.low_streak = 0;
            }
        }
        self.fresh_over.clear();
        self.fresh_seen = 0;
        if self.surge.is_some_and(|(_, until)| now >= until && self.window.len() >= SAMPLES_MIN) {
            self.surge = None;
        }
        self.stats.samples = self.window.len() as u64;
        if self.window.len() < SAMPLES_MIN {
            return self.surge.map(|s| s.0).or(self.estimate);
        }
        let q = self.quantile_of(0);
        // A rise too small for a surge: significantly more of the newest
        // samples above the estimate than the target allows (a binomial
        // test). Keep only the newest: old samples would hold the quantile
        // inside the new regime's body for as long as the window is long.
        let recent = RECENT.min(self.window.len() / 2);
        if recent >= SAMPLES_MIN {
            let over = self.window.range(self.window.len() - recent..).filter(|&&v| v > q).count() as f64;
            let expected = recent as f64 * (1.0 - self.cfg.target);
            if over > 3.0 + expected + 3.0 * expected.sqrt() {
                self.stats.rises += 1;
                self.low_streak = 0;
                self.window.drain(..self.window.len() - recent);
                let q = self.quantile_of(0);
                return Some(self.set_estimate(q));
            }
        }
        // A fall: the newest samples' estimate well below the window's, for a
        // while. Keep only the newest, or the offset stays high for as long
        // as the window is long.
        if self.window.len() >= 2 * RECENT {
            let recent = self.quantile_of(self.window.len() - RECENT);
            self.low_streak = if (recent as f64) < FALL_RATIO * q as f64 { self.low_streak + 1 } else { 0 };
            if self.low_streak >= FALL_UPDATES {
                self.stats.falls += 1;
                self.low_streak = 0;
                self.window.drain(..self.window.len() - RECENT);
                let q = self.quantile_of(0);
                return Some(self.set_estimate(q));
            }
        }
        Some(self.set_estimate(q))
    }

    fn set_estimate(&mut self, q: u64) -> u64 {
        self.estimate = Some(q);
        self.stats.estimate_ns = q;
        self.stats.samples = self.window.len() as u64;
        q.max(self.surge.map_or(0, |s| s.0))
    }

    /// The settled samples the estimate is taken over, the newest first.
    pub fn newest_samples(&self) -> impl Iterator<Item = u64> + '_ {
        self.window.iter().rev().copied()
    }

    /// How many samples are settled.
    pub fn sample_count(&self) -> usize {
        self.window.len()
    }

    /// Its settings.
    pub fn config(&self) -> TailConfig {
        self.cfg
    }

    /// The upper quantile estimate over the window's samples from index `from`.
    fn quantile_of(&mut self, from: usize) -> u64 {
        self.scratch.clear();
        self.scratch.extend(self.window.range(from..).copied());
        quantile_upper(&mut self.scratch, self.cfg.target, self.cfg.z)
    }
}

/// An upper estimate of the `p`-quantile of `x` (reordered in place): the
/// order statistic `z` standard deviations above `n·p` when at least 10
/// samples lie above the quantile; otherwise an exponential tail fitted to
/// the top samples (peaks over threshold), with its mean excess raised by
/// `z/√k`, extrapolated to `p`.
pub fn quantile_upper(x: &mut [u64], p: f64, z: f64) -> u64 {
    let n = x.len();
    assert!(n > 0, "no samples");
    let m = n as f64 * (1.0 - p);
    if m >= 10.0 {
        let rank = (n as f64 * p + z * (n as f64 * p * (1.0 - p)).sqrt()).ceil() as usize;
        let k = rank.clamp(1, n) - 1;
        return *x.select_nth_unstable(k).1;
    }
    // k top samples over the threshold u: u + β ln(k / m), β their mean excess.
    let k = ((10.0 * m).ceil() as usize).max(20).min(n / 2).max(1);
    let (_, u, top) = x.select_nth_unstable(n - k - 1);
    let u = *u;
    let beta = top.iter().map(|&v| (v - u) as f64).sum::<f64>() / k as f64;
    let beta = beta * (1.0 + z / (k as f64).sqrt());
    let ext = (k as f64 / m.max(1e-9)).ln().max(0.0);
    u + (beta * ext).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn tail_of(log: &mut TailLog) -> Vec<u8> {
        let mut b = Vec::new();
        log.drain_into(&mut b);
        b
    }

    #[test]
    fn logs_merge_by_max_and_coarsen() {
        let mut a = TailLog::default();
        a.record(10, 500);
        a.record(12, 700);
        a.record(9, 300);
        a.record(12, 600);
        let b = tail_of(&mut a);
        assert!(a.is_empty());
        let t = TailView::parse(&b).unwrap().unwrap();
        assert_eq!(t.entries().collect::<Vec<_>>(), vec![(9, 300), (10, 500), (12, 700)]);
        // A proxy merges two children.
        let mut p = TailLog::default();
        p.merge(&t);
        let mut c = TailLog::default();
        c.record(11, 900);
        c.record(12, 100);
        p.merge(&TailView::parse(&tail_of(&mut c)).unwrap().unwrap());
        let b = tail_of(&mut p);
        let t = TailView::parse(&b).unwrap().unwrap();
        assert_eq!(t.entries().collect::<Vec<_>>(), vec![(9, 300), (10, 500), (11, 900), (12, 700)]);
        // More than TAIL_MAX sequences: coarsened, each group the max of its members.
        for s in 0..1_500u64 {
            p.record(1_000 + s, s + 1);
        }
        let b = tail_of(&mut p);
        let t = TailView::parse(&b).unwrap().unwrap();
        assert_eq!((t.stride, t.len()), (4, 375));
        assert!(t.entries().all(|(s, v)| v >= s - 1_000 + 4 && v < s - 1_000 + 4 + 4));
    }

    #[test]
    fn logs_stay_within_their_span() {
        let mut a = TailLog::default();
        a.record(1, 5);
        a.record(1 + 10 * TAIL_SPAN_MAX, 6);
        assert_eq!(a.dropped, 1);
        a.record(1, 7);
        assert_eq!(a.dropped, 2, "too far behind the newest");
        let b = tail_of(&mut a);
        let t = TailView::parse(&b).unwrap().unwrap();
        assert_eq!(t.entries().collect::<Vec<_>>(), vec![(1 + 10 * TAIL_SPAN_MAX, 6)]);
    }

    #[test]
    fn quantiles_are_close_and_above() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        // Exponential with mean 10 µs over 100 µs: p-quantile = 100 + 10 ln(1/(1−p)) µs.
        for (n, p) in [(65_536usize, 0.99), (65_536, 0.999), (65_536, 0.9999), (5_000, 0.999), (2_000, 0.9999)] {
            let mut over = 0;
            for _ in 0..20 {
                let mut x: Vec<u64> =
                    (0..n).map(|_| 100_000 + (-10_000.0 * (1.0 - rng.gen::<f64>()).ln()) as u64).collect();
                let q = quantile_upper(&mut x, p, 1.0) as f64;
                let truth = 100_000.0 + 10_000.0 * (1.0 / (1.0 - p)).ln();
                // Extrapolating far beyond the data (under one sample above the quantile) is looser.
                let tol = if (n as f64) * (1.0 - p) < 1.0 { 0.5 } else { 0.25 };
                assert!((q - truth).abs() < tol * (truth - 100_000.0), "n {n} p {p}: {q} vs {truth}");
                over += usize::from(q >= truth);
            }
            assert!(over >= 10, "n {n} p {p}: the margin puts most estimates above the truth ({over}/20)");
        }
    }

    #[test]
    fn settle_time_grows_while_maxima_arrive_after_it() {
        // Maxima arrive 75 ns after the send (a deep tree), the settle time
        // starts at 50: every message first settles unreported.
        let cfg = TailConfig { target: 0.99, settle_ns: 50, settle_step_ns: 10, settle_max_ns: 200, z: 1.0 };
        let mut e = TailEstimator::new(cfg);
        let mut sent = VecDeque::new();
        let (mut seq, mut offset) = (0, None);
        for step in 0..100u64 {
            let now = step * 10;
            for _ in 0..10 {
                seq += 1;
                e.sent(seq, now);
                sent.push_back((seq, now));
            }
            let mut log = TailLog::default();
            while sent.front().is_some_and(|&(_, t)| now >= t + 75) {
                let (s, _) = sent.pop_front().unwrap();
                log.record(s, 1_000 + s % 7);
            }
            if !log.is_empty() {
                e.merge(&TailView::parse(&tail_of(&mut log)).unwrap().unwrap());
            }
            offset = e.update(now);
        }
        let st = e.stats;
        assert_eq!(st.settle_ns, 80, "grown to the first interval past the arrival: {st:?}");
        assert!(st.late_entries > 0 && st.unreported > 0, "{st:?}");
        assert!(st.samples >= 500, "{st:?}");
        assert_eq!(offset, Some(1_006), "{st:?}");
        // A cap holds it however late maxima come.
        let cfg = TailConfig { settle_max_ns: 60, ..cfg };
        let mut e = TailEstimator::new(cfg);
        for s in 1..=1_000u64 {
            e.sent(s, s);
            let mut log = TailLog::default();
            log.record(s.saturating_sub(100).max(1), 5);
            e.merge(&TailView::parse(&tail_of(&mut log)).unwrap().unwrap());
            e.update(s);
        }
        assert_eq!(e.stats.settle_ns, 60);
    }

    #[test]
    fn estimator_settles_samples_and_reacts_to_a_surge() {
        let cfg = TailConfig { target: 0.99, settle_ns: 50, settle_step_ns: 10, settle_max_ns: 100, z: 1.0 };
        let mut e = TailEstimator::new(cfg);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut now = 0;
        let mut seq = 0;
        let mut feed = |e: &mut TailEstimator, now: &mut u64, slow: u64| {
            let mut log = TailLog::default();
            for _ in 0..100 {
                seq += 1;
                e.sent(seq, *now);
                log.record(seq, 1_000 + rng.gen_range(0..100) + slow);
            }
            let b = tail_of(&mut log);
            e.merge(&TailView::parse(&b).unwrap().unwrap());
            *now += 100;
            e.update(*now)
        };
        assert_eq!(feed(&mut e, &mut now, 0), None, "too few samples");
        let mut off = None;
        for _ in 0..20 {
            off = feed(&mut e, &mut now, 0);
        }
        let off = off.unwrap();
        assert!((1_095..=1_100).contains(&off), "{off}");
        // Every message now 5 µs slower: the very next update covers it.
        let surged = feed(&mut e, &mut now, 5_000).unwrap();
        assert!(surged >= 6_000, "{surged}");
        assert_eq!(e.stats.surges, 1);
        // The new regime holds: no more surges, and the window holds only its samples.
        for _ in 0..30 {
            let o = feed(&mut e, &mut now, 5_000).unwrap();
            assert!((6_000..=6_300).contains(&o), "{o}");
        }
        assert_eq!(e.stats.surges, 1);
        // Back to fast: the offset falls once the newest samples say so for a while.
        let mut o = 0;
        for _ in 0..100 {
            o = feed(&mut e, &mut now, 0).unwrap();
        }
        assert!(e.stats.falls >= 1 && o <= 1_100, "{o}, {:?}", e.stats);
        assert_eq!(e.stats.unreported, 0);
    }
}
