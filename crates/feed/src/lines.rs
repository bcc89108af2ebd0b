//! Redundant A/B lines derived from one clean feed, each with its own
//! impairments: loss, duplication, reordering, a fixed delay and jitter.
//!
//! Pure and seeded: the same clean packets, impairment and seed give the same
//! line, so arbitration tests are reproducible.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;

use crate::gen::GenPacket;

/// Impairments of one line. Fractions are per packet, in [0, 1].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Impairment {
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
    /// Added to every packet's time.
    pub delay_ns: u64,
    /// Uniform extra delay in [0, jitter_ns).
    pub jitter_ns: u64,
}

/// What an impairment did, for reports and test oracles.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LineReport {
    pub packets_in: u64,
    pub packets_out: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Indices (into the clean feed) of the packets this line lost.
    #[serde(skip)]
    pub lost_indices: Vec<usize>,
}

impl Impairment {
    /// Checks every fraction lies in [0, 1].
    pub fn validate(&self) -> Result<(), NotAFraction> {
        for (name, v) in [("loss", self.loss), ("dup", self.dup), ("reorder", self.reorder)] {
            if !(0.0..=1.0).contains(&v) {
                return Err(NotAFraction { name, value: v });
            }
        }
        Ok(())
    }
}

/// An impairment share outside [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("{name} must be a fraction in [0, 1], got {value}")]
pub struct NotAFraction {
    pub name: &'static str,
    pub value: f64,
}

/// Applies `imp` to `clean`, returning the line's packets in arrival order.
pub fn impair(clean: &[GenPacket], imp: &Impairment, seed: u64) -> (Vec<GenPacket>, LineReport) {
    let mut rng = ChaCha12Rng::seed_from_u64(seed);
    let mut report = LineReport { packets_in: clean.len() as u64, ..Default::default() };
    let mut out: Vec<(u64, usize, GenPacket)> = Vec::with_capacity(clean.len() + clean.len() / 50);
    // Jitter alone never reorders: a line is a FIFO path, so each packet
    // arrives after the one before it. Only `reorder` breaks the order.
    let mut fifo_t = 0u64;
    for (i, p) in clean.iter().enumerate() {
        if imp.loss > 0.0 && rng.gen_bool(imp.loss) {
            report.lost += 1;
            report.lost_indices.push(i);
            continue;
        }
        let jitter = if imp.jitter_ns > 0 { rng.gen_range(0..imp.jitter_ns) } else { 0 };
        let mut t = (p.ts_ns + imp.delay_ns + jitter).max(fifo_t + 1);
        if imp.reorder > 0.0 && rng.gen_bool(imp.reorder) {
            // Held back behind the next one to three packets.
            let k = rng.gen_range(1..=3usize);
            if let Some(later) = clean.get(i + k) {
                t = t.max(later.ts_ns + imp.delay_ns + imp.jitter_ns + 1 + rng.gen_range(0..1_000));
                report.reordered += 1;
            }
        } else {
            fifo_t = t;
        }
        out.push((t, out.len(), GenPacket { ts_ns: t, payload: p.payload.clone() }));
        if imp.dup > 0.0 && rng.gen_bool(imp.dup) {
            let td = t + rng.gen_range(1_000..50_000);
            out.push((td, out.len(), GenPacket { ts_ns: td, payload: p.payload.clone() }));
            report.duplicated += 1;
        }
    }
    out.sort_by_key(|&(t, n, _)| (t, n));
    report.packets_out = out.len() as u64;
    (out.into_iter().map(|(_, _, p)| p).collect(), report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{GenConfig, Generator};

    #[test]
    fn impairments_do_what_they_say() {
        let clean: Vec<_> =
            Generator::new(GenConfig { messages: 20_000, symbols: 10, ..Default::default() }).unwrap().collect();
        let imp = Impairment { loss: 0.05, dup: 0.03, reorder: 0.04, delay_ns: 10_000, jitter_ns: 0 };
        let (line, r) = impair(&clean, &imp, 9);
        let n = clean.len() as f64;
        assert!((r.lost as f64 / n - 0.05).abs() < 0.02, "lost {}", r.lost);
        assert!(r.duplicated > 0 && r.reordered > 0);
        assert_eq!(line.len() as u64, r.packets_in - r.lost + r.duplicated);
        assert!(line.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
        // Every surviving packet is a clean packet, unchanged.
        let clean_set: std::collections::HashSet<_> = clean.iter().map(|p| &p.payload).collect();
        assert!(line.iter().all(|p| clean_set.contains(&p.payload)));
        // No impairment: the line is the clean feed shifted by the delay.
        let (same, _) = impair(&clean, &Impairment { delay_ns: 5, ..Default::default() }, 1);
        assert!(same.iter().zip(&clean).all(|(a, b)| a.payload == b.payload && a.ts_ns >= b.ts_ns + 5));
        // Jitter keeps the order; only `reorder` changes it.
        let (jittered, _) = impair(&clean, &Impairment { jitter_ns: 50_000, ..Default::default() }, 2);
        assert!(jittered.iter().zip(&clean).all(|(a, b)| a.payload == b.payload));
    }

    #[test]
    fn bad_fractions_are_rejected() {
        assert!(Impairment { loss: 1.5, ..Default::default() }.validate().is_err());
        assert!(Impairment { dup: -0.1, ..Default::default() }.validate().is_err());
    }
}
