//! A deliberately wrong clock: `local = true + offset + drift · (true − epoch)`,
//! plus `step_ns` from true time `step_at_ns` on (a step the host announces,
//! as a daemon's `clock_settime` would be).
//!
//! All processes on one host share one true clock, so a test or benchmark
//! that gives each node its own skew knows every node's true error exactly.

/// Offset (ns) and drift (ppm) added to a true clock.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Skew {
    /// Offset at `epoch_ns`, ns.
    pub offset_ns: i64,
    /// Drift, parts per million (positive: runs fast).
    pub drift_ppm: f64,
    /// True time the drift counts from.
    pub epoch_ns: u64,
    /// A step of this many ns (either sign; 0: none) ...
    #[serde(default)]
    pub step_ns: i64,
    /// ... from this true time on ...
    #[serde(default)]
    pub step_at_ns: u64,
    /// ... told to nobody (a paused VM, a hypervisor's correction): only
    /// the probes can find it. Otherwise the node is told, as a host's own
    /// steps are.
    #[serde(default)]
    pub step_silent: bool,
}

impl Skew {
    /// No skew: the true clock.
    pub const NONE: Skew =
        Skew { offset_ns: 0, drift_ppm: 0.0, epoch_ns: 0, step_ns: 0, step_at_ns: 0, step_silent: false };

    /// Offset and drift only.
    pub fn new(offset_ns: i64, drift_ppm: f64, epoch_ns: u64) -> Skew {
        Skew { offset_ns, drift_ppm, epoch_ns, ..Skew::NONE }
    }

    /// Whether it changes nothing (no offset, drift or step).
    pub fn is_none(&self) -> bool {
        self.offset_ns == 0 && self.drift_ppm == 0.0 && self.step_ns == 0
    }

    /// The step, once true time `t` has reached it: (its true time, its size).
    pub fn step_by(&self, t: u64) -> Option<(u64, i64)> {
        (self.step_ns != 0 && t >= self.step_at_ns).then_some((self.step_at_ns, self.step_ns))
    }

    /// The skewed reading at true time `t`.
    pub fn local(&self, t: u64) -> u64 {
        let since = t as f64 - self.epoch_ns as f64;
        let step = self.step_by(t).map_or(0, |s| s.1);
        (t as i128 + i128::from(self.offset_ns) + i128::from(step) + (since * self.drift_ppm * 1e-6).round() as i128)
            .max(0) as u64
    }

    /// True time at which the skewed clock reads `l` (the first whole ns at
    /// or after). After a backward step readings repeat: from true time
    /// `from` on, the first time at or after `from` at which it reads at
    /// least `l` (a timer armed after the step must wait for the clock to
    /// get there again, not fire at once for ever).
    pub fn true_at_from(&self, l: u64, from: u64) -> u64 {
        if l == u64::MAX {
            return l;
        }
        if self.step_ns == 0 {
            return self.true_at(l).max(from);
        }
        let before = Skew { step_ns: 0, ..*self };
        let after = Skew { step_ns: 0, offset_ns: self.offset_ns.saturating_add(self.step_ns), ..*self };
        let t = before.true_at(l);
        if t < self.step_at_ns && !(self.step_ns < 0 && from >= self.step_at_ns) {
            return t.max(from);
        }
        after.true_at(l).max(self.step_at_ns).max(from)
    }

    /// True time at which the skewed clock reads `l` (the first whole ns at or after).
    pub fn true_at(&self, l: u64) -> u64 {
        if self.step_ns != 0 {
            return self.true_at_from(l, 0);
        }
        if self.is_none() || l == u64::MAX {
            return l;
        }
        if self.drift_ppm == 0.0 {
            return (i128::from(l) - i128::from(self.offset_ns)).clamp(0, i128::from(u64::MAX - 1)) as u64;
        }
        let d = self.drift_ppm * 1e-6;
        // local − true at the answer, in small numbers (absolute ns lose precision in f64).
        let err = self.offset_ns as f64 + ((l as f64 - self.epoch_ns as f64) - self.offset_ns as f64) * d / (1.0 + d);
        let mut t = (i128::from(l) - err.round() as i128).clamp(0, i128::from(u64::MAX - 1)) as u64;
        // Rounding may land a few ns either side.
        for _ in 0..16 {
            if self.local(t) >= l {
                break;
            }
            t += 1;
        }
        for _ in 0..16 {
            if t == 0 || self.local(t - 1) < l {
                break;
            }
            t -= 1;
        }
        t
    }

    /// The skew's error at true time `t`: local − true, ns.
    pub fn error_at(&self, t: u64) -> f64 {
        let step = self.step_by(t).map_or(0, |s| s.1);
        (self.offset_ns + step) as f64 + (t as f64 - self.epoch_ns as f64) * self.drift_ppm * 1e-6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn true_at_inverts_local_at_wall_clock_magnitudes() {
        let t0 = 1_790_000_000_000_000_000u64;
        for (offset_ns, drift_ppm) in [(0, 0.0), (7_000_123, 93.7), (-9_999_999, -100.0), (-20, 0.5)] {
            let s = Skew::new(offset_ns, drift_ppm, t0 - 5_000_000_000);
            for k in 0..1_000u64 {
                let l = t0 + k * 7_919_113;
                let t = s.true_at(l);
                assert!(s.local(t) >= l, "{offset_ns} {drift_ppm}: local({t}) < {l}");
                assert!(t == 0 || s.local(t - 1) < l, "{offset_ns} {drift_ppm}: not the first ns");
            }
        }
    }

    #[test]
    fn a_step_moves_readings_and_timers_wait_for_the_clock_after_it() {
        let t0 = 1_790_000_000_000_000_000u64;
        for step_ns in [1_000_000i64, -1_000_000] {
            let s = Skew { step_ns, step_at_ns: t0 + 5_000_000, ..Skew::new(7_000, 20.0, t0) };
            let plain = Skew { step_ns: 0, ..s };
            assert_eq!(s.local(t0 + 4_999_999), plain.local(t0 + 4_999_999));
            assert_eq!(s.local(t0 + 5_000_000) as i64, plain.local(t0 + 5_000_000) as i64 + step_ns);
            assert_eq!(s.error_at(t0 + 6_000_000), plain.error_at(t0 + 6_000_000) + step_ns as f64);
            for k in 0..2_000u64 {
                let l = plain.local(t0) + k * 9_973;
                // Before the step, and after it, from a time past the step.
                let t = s.true_at(l);
                assert!(s.local(t) >= l, "{step_ns}: local({t}) < {l}");
                let from = t0 + 5_000_001;
                let u = s.true_at_from(l, from);
                assert!(u >= from && s.local(u) >= l, "{step_ns}: {u} reads {} < {l}", s.local(u));
                assert!(u == from || s.local(u - 1) < l, "{step_ns}: {u} is not the first ns after {from}");
            }
        }
    }
}
