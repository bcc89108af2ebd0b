//! A deliberately wrong clock: `local = true + offset + drift · (true − epoch)`.
//!
//! All processes on one host share one true clock, so a test or benchmark
//! that gives each node its own skew knows every node's true error exactly.

/// Offset (ns) and drift (ppm) added to a true clock.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Skew {
    pub offset_ns: i64,
    pub drift_ppm: f64,
    /// True time the drift counts from.
    pub epoch_ns: u64,
}

impl Skew {
    pub const NONE: Skew = Skew { offset_ns: 0, drift_ppm: 0.0, epoch_ns: 0 };

    pub fn is_none(&self) -> bool {
        self.offset_ns == 0 && self.drift_ppm == 0.0
    }

    /// The skewed reading at true time `t`.
    pub fn local(&self, t: u64) -> u64 {
        let since = t as f64 - self.epoch_ns as f64;
        (t as i128 + i128::from(self.offset_ns) + (since * self.drift_ppm * 1e-6).round() as i128).max(0) as u64
    }

    /// True time at which the skewed clock reads `l` (the first whole ns at or after).
    pub fn true_at(&self, l: u64) -> u64 {
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
        self.offset_ns as f64 + (t as f64 - self.epoch_ns as f64) * self.drift_ppm * 1e-6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn true_at_inverts_local_at_wall_clock_magnitudes() {
        let t0 = 1_790_000_000_000_000_000u64;
        for (offset_ns, drift_ppm) in [(0, 0.0), (7_000_123, 93.7), (-9_999_999, -100.0), (-20, 0.5)] {
            let s = Skew { offset_ns, drift_ppm, epoch_ns: t0 - 5_000_000_000 };
            for k in 0..1_000u64 {
                let l = t0 + k * 7_919_113;
                let t = s.true_at(l);
                assert!(s.local(t) >= l, "{offset_ns} {drift_ppm}: local({t}) < {l}");
                assert!(t == 0 || s.local(t - 1) < l, "{offset_ns} {drift_ppm}: not the first ns");
            }
        }
    }
}
