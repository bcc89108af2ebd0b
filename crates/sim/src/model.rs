//! Link and clock models, described in a TOML file a user can write.
//!
//! ```toml
//! # latency-model.toml
//! [link]
//! kind = "lognormal"     # or "uniform"
//! median_us = 25.0       # lognormal: median one-way delay of a hop
//! sigma = 0.35           # lognormal: shape (spread) of the body
//! min_us = 10.0          # uniform: lower bound
//! max_us = 50.0          # uniform: upper bound
//! spike_probability = 0.0001  # chance a packet hits a latency spike
//! spike_us = 300.0       # extra delay of a spike (uniform in [spike_us/2, spike_us*3/2])
//! copy_us = 2.7          # serialization cost of each copy a node sends, back to back
//! loss = 0.0             # chance a packet is lost on a hop
//! dup = 0.0              # chance a packet is delivered twice
//!
//! [clock]
//! offset_us = 0.02       # receivers' clock offsets, uniform in ±offset_us
//! drift_ppm = 0.0        # receivers' clock drift, uniform in ±drift_ppm
//! ```
//!
//! The built-in **cloud** model is calibrated to Jasper's measurements in one
//! AWS region: a hop costs ≈ 30 µs (lognormal body, median 25 µs, σ 0.35) and
//! each extra copy a node sends ≈ 2.7 µs; one packet in 10,000 hits a spike of
//! 150–450 µs (with one in 1,000, the median OML of a 1,000-receiver tree
//! without hedging is spike-dominated, far above the paper's table 1). Clocks default to
//! Huygens-class sync (±20 ns offsets, no drift); `clock.offset_us = 20` gives
//! NTP-class error.

use rand::Rng;
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};

/// The distribution of one hop's delay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    Uniform,
    Lognormal,
}

/// One hop's delay, loss and the per-copy cost at its sender.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkModel {
    pub kind: LinkKind,
    pub median_us: f64,
    pub sigma: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub spike_probability: f64,
    pub spike_us: f64,
    pub copy_us: f64,
    pub loss: f64,
    /// Chance a packet is delivered twice (the copy 1–50 µs later).
    pub dup: f64,
}

impl Default for LinkModel {
    fn default() -> Self {
        LinkModel::CLOUD
    }
}

impl LinkModel {
    /// Calibrated to Jasper's per-hop ≈ 30 µs and per-copy ≈ 2.7 µs.
    pub const CLOUD: LinkModel = LinkModel {
        kind: LinkKind::Lognormal,
        median_us: 25.0,
        sigma: 0.35,
        min_us: 10.0,
        max_us: 50.0,
        spike_probability: 0.0001,
        spike_us: 300.0,
        copy_us: 2.7,
        loss: 0.0,
        dup: 0.0,
    };

    /// Jasper §5.2's analysis: uniform hop delays, no spikes, no copy cost.
    pub const UNIFORM: LinkModel = LinkModel {
        kind: LinkKind::Uniform,
        median_us: 30.0,
        sigma: 0.0,
        min_us: 10.0,
        max_us: 50.0,
        spike_probability: 0.0,
        spike_us: 0.0,
        copy_us: 0.0,
        loss: 0.0,
        dup: 0.0,
    };

    /// Checks the parameters make sense.
    pub fn validate(&self) -> Result<(), String> {
        let ok = self.median_us > 0.0
            && self.sigma >= 0.0
            && self.min_us >= 0.0
            && self.max_us >= self.min_us
            && (0.0..=1.0).contains(&self.spike_probability)
            && self.spike_us >= 0.0
            && self.copy_us >= 0.0
            && (0.0..1.0).contains(&self.loss)
            && (0.0..1.0).contains(&self.dup);
        if ok {
            Ok(())
        } else {
            Err(format!("link model out of range: {self:?}"))
        }
    }

    /// Draws one hop's delay in ns.
    pub fn sample_ns(&self, rng: &mut impl Rng) -> u64 {
        let base_us = match self.kind {
            LinkKind::Uniform => rng.gen_range(self.min_us..=self.max_us),
            LinkKind::Lognormal => match LogNormal::new(self.median_us.ln(), self.sigma) {
                Ok(d) => d.sample(rng),
                Err(_) => self.median_us,
            },
        };
        let spike = if self.spike_probability > 0.0 && rng.gen_bool(self.spike_probability) {
            rng.gen_range(self.spike_us * 0.5..=self.spike_us * 1.5)
        } else {
            0.0
        };
        ((base_us + spike) * 1e3) as u64
    }
}

/// Receivers' clock errors.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClockModel {
    pub offset_us: f64,
    pub drift_ppm: f64,
}

impl Default for ClockModel {
    fn default() -> Self {
        ClockModel { offset_us: 0.02, drift_ppm: 0.0 }
    }
}

/// One receiver's clock: local = true + offset + drift · true.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clock {
    pub offset_ns: f64,
    pub drift: f64,
}

impl Clock {
    pub const PERFECT: Clock = Clock { offset_ns: 0.0, drift: 0.0 };

    pub fn draw(m: &ClockModel, rng: &mut impl Rng) -> Clock {
        let o = m.offset_us * 1e3;
        let d = m.drift_ppm * 1e-6;
        Clock {
            offset_ns: if o > 0.0 { rng.gen_range(-o..=o) } else { 0.0 },
            drift: if d > 0.0 { rng.gen_range(-d..=d) } else { 0.0 },
        }
    }

    /// Local reading at true time `t`.
    pub fn local(&self, t: u64) -> u64 {
        (t as f64 * (1.0 + self.drift) + self.offset_ns).max(0.0) as u64
    }

    /// True time at which the local clock reads `l` (the first whole ns at or after).
    pub fn true_at(&self, l: u64) -> u64 {
        ((l as f64 - self.offset_ns) / (1.0 + self.drift)).max(0.0).ceil() as u64
    }
}

/// A whole model file.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelFile {
    pub link: LinkModel,
    pub clock: ClockModel,
}

impl ModelFile {
    pub fn from_toml(s: &str) -> Result<Self, String> {
        let m: ModelFile = toml::from_str(s).map_err(|e| e.to_string())?;
        m.link.validate()?;
        if m.clock.offset_us < 0.0 || m.clock.drift_ppm < 0.0 {
            return Err("clock offset and drift must not be negative".into());
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn cloud_model_is_calibrated() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut v: Vec<u64> = (0..100_000).map(|_| LinkModel::CLOUD.sample_ns(&mut rng)).collect();
        v.sort_unstable();
        let mean = v.iter().sum::<u64>() as f64 / v.len() as f64 / 1e3;
        assert!((24.0..=29.0).contains(&(v[v.len() / 2] as f64 / 1e3)), "median {}", v[v.len() / 2]);
        assert!((25.0..=32.0).contains(&mean), "mean {mean} µs (Jasper: ≈ 30 µs per hop)");
    }

    #[test]
    fn clocks_invert() {
        let c = Clock { offset_ns: 1234.5, drift: 20e-6 };
        for t in [0u64, 1_000, 10_000_000_000] {
            let l = c.local(t);
            assert!(c.true_at(l).abs_diff(t) <= 1);
        }
    }

    #[test]
    fn model_files_parse_and_validate() {
        let m = ModelFile::from_toml("[link]\nkind = \"uniform\"\nmin_us = 5\nmax_us = 9\n[clock]\noffset_us = 20\n")
            .unwrap();
        assert_eq!(m.link.kind, LinkKind::Uniform);
        assert_eq!(m.clock.offset_us, 20.0);
        assert!(ModelFile::from_toml("[link]\nloss = 2.0\n").is_err());
    }
}

/// Emulated links from every node: each node's copies leave back to back
/// (`copy_us` apart), then take a drawn hop delay; some are lost, some
/// duplicated; one node may be slow for a while. Shared by the simulator and
/// the loopback data plane, so both emulate the same cloud.
pub struct LinkEmulator {
    pub link: LinkModel,
    rng: rand_chacha::ChaCha12Rng,
    busy_until: Vec<u64>,
    /// (node, start ns, length ns, extra delay ns)
    pub slow: Option<(u32, u64, u64, u64)>,
}

impl LinkEmulator {
    /// Emulates links from `nodes` nodes, drawing from `rng`.
    pub fn new(link: LinkModel, rng: rand_chacha::ChaCha12Rng, nodes: usize) -> Self {
        LinkEmulator { link, rng, busy_until: vec![0; nodes], slow: None }
    }

    /// Makes `slow` — (node, start ns, length ns, extra ns) — one node's latency spike.
    pub fn with_slow(mut self, slow: Option<(u32, u64, u64, u64)>) -> Self {
        self.slow = slow;
        self
    }

    /// When a copy node `from` sends at `now` arrives, and when its duplicate
    /// does (if any); both `None` if it is lost.
    pub fn arrivals(&mut self, now: u64, from: u32) -> [Option<u64>; 2] {
        let f = from as usize;
        let depart = now.max(self.busy_until[f]) + (self.link.copy_us * 1e3) as u64;
        self.busy_until[f] = depart;
        if self.link.loss > 0.0 && self.rng.gen_bool(self.link.loss) {
            return [None, None];
        }
        let mut at = depart + self.link.sample_ns(&mut self.rng);
        if let Some((node, start, len, extra)) = self.slow {
            if node == from && now >= start && now < start + len {
                at += extra;
            }
        }
        let dup = if self.link.dup > 0.0 && self.rng.gen_bool(self.link.dup) {
            Some(at + self.rng.gen_range(1_000..50_000))
        } else {
            None
        };
        [Some(at), dup]
    }
}

/// One `Rc` per distinct buffer a node sends to many destinations in a row:
/// replication without a copy per destination.
#[derive(Default)]
pub struct ShareLast {
    last: Option<(*const u8, usize, std::rc::Rc<[u8]>)>,
}

impl ShareLast {
    /// The shared bytes of `bytes` (reused when it is the buffer of the previous call).
    pub fn share(&mut self, bytes: &[u8]) -> std::rc::Rc<[u8]> {
        match &self.last {
            Some((p, n, rc)) if *p == bytes.as_ptr() && *n == bytes.len() => rc.clone(),
            _ => {
                let rc: std::rc::Rc<[u8]> = std::rc::Rc::from(bytes);
                self.last = Some((bytes.as_ptr(), bytes.len(), rc.clone()));
                rc
            }
        }
    }
}
