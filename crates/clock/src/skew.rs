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

    /// The skew's error at true time `t`: local − true, ns.
    pub fn error_at(&self, t: u64) -> f64 {
        self.offset_ns as f64 + (t as f64 - self.epoch_ns as f64) * self.drift_ppm * 1e-6
    }
}
