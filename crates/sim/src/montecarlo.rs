//! Monte Carlo of Jasper's hedging recursion (§5.2, figure 5):
//!
//! L(S, P_i^n) = min_{0 ≤ j ≤ H} { L(S, P^{n−1}_{⌊i/F⌋−j}) + L(P^{n−1}_{⌊i/F⌋−j}, P_i^n) },
//! L(S, P_i^0) and every edge ~ U(lo, hi), independent.
//!
//! Each iteration draws one message's arrival at one receiver, following its
//! H+1 parents, their H+1 parents, and so on; a node shared by several
//! descendants gets one arrival time per iteration (memoized), as in a real
//! tree. Sibling indices wrap around the layer.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde::Serialize;

/// One configuration's distribution.
#[derive(Debug, Clone, Serialize)]
pub struct McRow {
    pub depth: usize,
    pub hedge: usize,
    pub fanout: usize,
    pub mean_us: f64,
    pub sigma_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Sorted samples (for CDF plots).
    #[serde(skip)]
    pub samples_us: Vec<f64>,
}

fn layer_size(f: usize, layer: usize) -> usize {
    f.saturating_pow(layer as u32 + 1)
}

/// The recursion's parameters and one iteration's state.
struct Draw<'a> {
    f: usize,
    h: usize,
    lo: f64,
    hi: f64,
    rng: &'a mut ChaCha12Rng,
    memo: HashMap<(usize, usize), f64>,
}

impl Draw<'_> {
    /// Arrival time at node `i` of `layer`, memoized within the iteration.
    fn arrival(&mut self, layer: usize, i: usize) -> f64 {
        if let Some(&v) = self.memo.get(&(layer, i)) {
            return v;
        }
        let v = if layer == 0 {
            self.rng.gen_range(self.lo..=self.hi)
        } else {
            let size = layer_size(self.f, layer - 1);
            let p = i / self.f;
            let mut best = f64::INFINITY;
            for j in 0..=self.h.min(size - 1) {
                let q = (p + size - j % size) % size;
                let up = self.arrival(layer - 1, q);
                best = best.min(up + self.rng.gen_range(self.lo..=self.hi));
            }
            best
        };
        self.memo.insert((layer, i), v);
        v
    }
}

/// Runs `iterations` draws for each depth and hedging factor.
pub fn hedging_monte_carlo(
    depths: &[usize],
    hedges: &[usize],
    fanout: usize,
    lo_us: f64,
    hi_us: f64,
    iterations: usize,
    seed: u64,
) -> Vec<McRow> {
    assert!(fanout >= 2 && lo_us <= hi_us && iterations > 0);
    let mut rows = Vec::new();
    for &d in depths {
        for &h in hedges {
            let mut rng = ChaCha12Rng::seed_from_u64(seed ^ ((d as u64) << 32) ^ h as u64);
            let mut v = Vec::with_capacity(iterations);
            let leaf_layer = d - 1;
            for _ in 0..iterations {
                let i = rng.gen_range(0..layer_size(fanout, leaf_layer));
                let mut draw = Draw { f: fanout, h, lo: lo_us, hi: hi_us, rng: &mut rng, memo: HashMap::new() };
                v.push(draw.arrival(leaf_layer, i));
            }
            v.sort_by(f64::total_cmp);
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
            let q = |p: f64| v[((p * v.len() as f64) as usize).min(v.len() - 1)];
            rows.push(McRow {
                depth: d,
                hedge: h,
                fanout,
                mean_us: mean,
                sigma_us: var.sqrt(),
                p50_us: q(0.5),
                p99_us: q(0.99),
                samples_us: v,
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproduces_figure_5_takeaways() {
        let rows = hedging_monte_carlo(&[1, 2, 3, 4], &[0, 1, 2, 3], 10, 10.0, 50.0, 20_000, 1);
        let get = |d, h| rows.iter().find(|r| r.depth == d && r.hedge == h).unwrap();
        // No hedging: mean and σ grow with depth.
        assert!(get(4, 0).mean_us > get(2, 0).mean_us && get(4, 0).sigma_us > get(2, 0).sigma_us);
        // Hedging narrows the distribution and moves it left.
        assert!(get(3, 1).sigma_us < get(3, 0).sigma_us && get(3, 1).mean_us < get(3, 0).mean_us);
        // Diminishing returns: 0→1 gains more than 1→2.
        let gain01 = get(3, 0).mean_us - get(3, 1).mean_us;
        let gain12 = get(3, 1).mean_us - get(3, 2).mean_us;
        assert!(gain01 > gain12 && gain12 > 0.0);
        // Depth 1 has no parents to hedge over.
        assert!((get(1, 0).mean_us - 30.0).abs() < 1.0);
    }
}
