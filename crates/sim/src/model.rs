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
//! floor_us = 0.0         # propagation floor: every delay is at least this (0: none)
//! unqueued = 0.0         # with a floor: share of packets that cross without queueing (exactly the floor)
//! asymmetric_share = 0.0 # share of directed links whose floor is longer ...
//! asymmetric_us = 0.0    # ... by this much (the case two-way clock sync cannot see)
//!
//! [clock]
//! offset_us = 0.02       # every node's clock offset, uniform in ±offset_us
//! drift_ppm = 0.0        # every node's clock drift, uniform in ±drift_ppm
//! timestamp_noise_ns = 0 # software timestamping: each reading late by an exponential of this mean
//! step_share = 0.0       # share of nodes whose clock steps (an ntpd jump) ...
//! step_us = 0.0          # ... by this much ...
//! step_at_s = 0.0        # ... at this time
//! ```
//!
//! With a floor, a hop's delay is the floor plus (unless unqueued) a body
//! drawn from the link kind with its median reduced by the floor, plus the
//! rare spike. Real paths have such a floor; Huygens-class clock sync relies
//! on it (the lowest delays of both directions meet there). The built-in
//! **cloud-floor** model ([`LinkModel::CLOUD_FLOOR`]) keeps the cloud model's
//! ≈ 30 µs mean hop on a 20 µs floor that 30 % of packets see exactly.
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
    /// Propagation floor, µs (0: none, the body alone).
    pub floor_us: f64,
    /// With a floor: share of packets that see exactly the floor.
    pub unqueued: f64,
    /// Share of directed links whose floor is longer by `asymmetric_us`.
    pub asymmetric_share: f64,
    pub asymmetric_us: f64,
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
        floor_us: 0.0,
        unqueued: 0.0,
        asymmetric_share: 0.0,
        asymmetric_us: 0.0,
    };

    /// The cloud model on a propagation floor: 20 µs that 30 % of packets see
    /// exactly, the rest a lognormal body (median 8 µs, σ 0.8) on top; mean
    /// hop ≈ 28 µs, spikes and copy cost as [`LinkModel::CLOUD`].
    pub const CLOUD_FLOOR: LinkModel = LinkModel {
        kind: LinkKind::Lognormal,
        median_us: 28.0,
        sigma: 0.8,
        floor_us: 20.0,
        unqueued: 0.3,
        ..LinkModel::CLOUD
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
        floor_us: 0.0,
        unqueued: 0.0,
        asymmetric_share: 0.0,
        asymmetric_us: 0.0,
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
            && (0.0..1.0).contains(&self.dup)
            && self.floor_us >= 0.0
            && (self.floor_us == 0.0 || self.kind == LinkKind::Uniform || self.median_us > self.floor_us)
            && (0.0..=1.0).contains(&self.unqueued)
            && (0.0..=1.0).contains(&self.asymmetric_share)
            && self.asymmetric_us >= 0.0
            && [self.median_us, self.sigma, self.min_us, self.max_us, self.spike_us, self.copy_us, self.floor_us]
                .iter()
                .all(|v| v.is_finite());
        if ok {
            Ok(())
        } else {
            Err(format!("link model out of range: {self:?}"))
        }
    }

    /// Draws one hop's delay in ns.
    pub fn sample_ns(&self, rng: &mut impl Rng) -> u64 {
        if self.floor_us > 0.0 && self.unqueued > 0.0 && rng.gen_bool(self.unqueued) {
            return (self.floor_us * 1e3) as u64;
        }
        let base_us = match self.kind {
            LinkKind::Uniform => rng.gen_range(self.min_us..=self.max_us).max(self.floor_us),
            LinkKind::Lognormal => {
                let median = self.median_us - self.floor_us;
                self.floor_us
                    + match LogNormal::new(median.ln(), self.sigma) {
                        Ok(d) => d.sample(rng),
                        Err(_) => median,
                    }
            }
        };
        let spike = if self.spike_probability > 0.0 && rng.gen_bool(self.spike_probability) {
            rng.gen_range(self.spike_us * 0.5..=self.spike_us * 1.5)
        } else {
            0.0
        };
        ((base_us + spike) * 1e3) as u64
    }
}

/// Every node's clock errors.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClockModel {
    pub offset_us: f64,
    pub drift_ppm: f64,
    /// Mean of the exponential delay of every software timestamp, ns.
    pub timestamp_noise_ns: f64,
    /// Share of nodes whose clock steps by `step_us` at `step_at_s`.
    pub step_share: f64,
    pub step_us: f64,
    pub step_at_s: f64,
}

impl Default for ClockModel {
    fn default() -> Self {
        ClockModel {
            offset_us: 0.02,
            drift_ppm: 0.0,
            timestamp_noise_ns: 0.0,
            step_share: 0.0,
            step_us: 0.0,
            step_at_s: 0.0,
        }
    }
}

impl ClockModel {
    /// Perfect clocks.
    pub const PERFECT: ClockModel = ClockModel {
        offset_us: 0.0,
        drift_ppm: 0.0,
        timestamp_noise_ns: 0.0,
        step_share: 0.0,
        step_us: 0.0,
        step_at_s: 0.0,
    };
    /// NTP-class raw clocks (±10 ms, ±50 ppm) with software timestamps (200 ns mean noise).
    pub const NTP: ClockModel = ClockModel {
        offset_us: 10_000.0,
        drift_ppm: 50.0,
        timestamp_noise_ns: 200.0,
        step_share: 0.0,
        step_us: 0.0,
        step_at_s: 0.0,
    };

    pub fn validate(&self) -> Result<(), String> {
        let vals = [self.offset_us, self.drift_ppm, self.timestamp_noise_ns, self.step_us, self.step_at_s];
        if vals.iter().any(|v| !v.is_finite() || *v < 0.0) || !(0.0..=1.0).contains(&self.step_share) {
            return Err("clock: offset_us, drift_ppm, timestamp_noise_ns, step_us and step_at_s must be finite and \
                        not negative; step_share in [0, 1]"
                .into());
        }
        if self.drift_ppm > 1_000.0 {
            return Err(format!("clock: drift_ppm {} is above 1000", self.drift_ppm));
        }
        Ok(())
    }
}

/// One node's clock: local = true + offset + drift · true (+ a step from a time on).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clock {
    pub offset_ns: f64,
    pub drift: f64,
    /// (true time ns, jump ns)
    pub step: Option<(u64, f64)>,
}

impl Clock {
    pub const PERFECT: Clock = Clock { offset_ns: 0.0, drift: 0.0, step: None };

    pub fn draw(m: &ClockModel, rng: &mut impl Rng) -> Clock {
        let o = m.offset_us * 1e3;
        let d = m.drift_ppm * 1e-6;
        let offset_ns = if o > 0.0 { rng.gen_range(-o..=o) } else { 0.0 };
        let drift = if d > 0.0 { rng.gen_range(-d..=d) } else { 0.0 };
        let step = (m.step_share > 0.0 && rng.gen_bool(m.step_share.min(1.0)))
            .then_some(((m.step_at_s * 1e9) as u64, m.step_us * 1e3));
        Clock { offset_ns, drift, step }
    }

    fn jump_at(&self, t: u64) -> f64 {
        match self.step {
            Some((at, j)) if t >= at => j,
            _ => 0.0,
        }
    }

    /// Local reading at true time `t`.
    pub fn local(&self, t: u64) -> u64 {
        (t as f64 * (1.0 + self.drift) + self.offset_ns + self.jump_at(t)).max(0.0) as u64
    }

    /// True time at which the local clock reads `l` (the first whole ns at or after).
    pub fn true_at(&self, l: u64) -> u64 {
        // Float rounding can land a nanosecond short, and a timer that fires
        // before its local due time would be re-armed at the same instant for ever.
        let mut t = self.true_at_approx(l);
        for _ in 0..4 {
            if self.local(t) >= l {
                break;
            }
            t += 1;
        }
        t
    }

    fn true_at_approx(&self, l: u64) -> u64 {
        let inv = |jump: f64| ((l as f64 - self.offset_ns - jump) / (1.0 + self.drift)).max(0.0).ceil() as u64;
        match self.step {
            None => inv(0.0),
            Some((at, j)) => {
                let before = inv(0.0);
                if before < at {
                    before
                } else {
                    // After the step; a forward jump skips readings: the step's instant.
                    inv(j).max(at)
                }
            }
        }
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
        m.clock.validate()?;
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
        for step in [None, Some((5_000, 2_000.0)), Some((5_000, -2_000.0))] {
            let c = Clock { offset_ns: 1234.5, drift: 20e-6, step };
            for t in [0u64, 1_000, 4_999, 5_000, 7_000, 10_000_000_000] {
                let l = c.local(t);
                assert!(c.true_at(l).abs_diff(t) <= 1 || (step.is_some_and(|s| s.1 < 0.0)), "{step:?} {t}");
                assert!(c.local(c.true_at(l)) >= l, "{step:?} {t}");
            }
        }
    }

    #[test]
    fn floored_links_have_their_floor() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let m = LinkModel::CLOUD_FLOOR;
        let v: Vec<u64> = (0..100_000).map(|_| m.sample_ns(&mut rng)).collect();
        assert_eq!(*v.iter().min().unwrap(), 20_000);
        let at_floor = v.iter().filter(|&&x| x == 20_000).count() as f64 / v.len() as f64;
        assert!((0.28..0.32).contains(&at_floor), "{at_floor}");
        let mean = v.iter().sum::<u64>() as f64 / v.len() as f64 / 1e3;
        assert!((25.0..=31.0).contains(&mean), "mean {mean}");
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
    /// Picks the asymmetric directed links (a hash of the pair with this salt).
    salt: u64,
    busy_until: Vec<u64>,
    /// (node, start ns, length ns, extra delay ns)
    pub slow: Option<(u32, u64, u64, u64)>,
}

impl LinkEmulator {
    /// Emulates links from `nodes` nodes, drawing from `rng`.
    pub fn new(link: LinkModel, mut rng: rand_chacha::ChaCha12Rng, nodes: usize) -> Self {
        let salt = if link.asymmetric_share > 0.0 { rng.gen() } else { 0 };
        LinkEmulator { link, rng, salt, busy_until: vec![0; nodes], slow: None }
    }

    /// The extra floor of the directed link `from → to`, ns.
    pub fn asymmetry_ns(&self, from: u32, to: u32) -> u64 {
        if self.link.asymmetric_share <= 0.0 {
            return 0;
        }
        let mut z = self.salt ^ (u64::from(from) << 32 | u64::from(to));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        if ((z >> 11) as f64 / (1u64 << 53) as f64) < self.link.asymmetric_share {
            (self.link.asymmetric_us * 1e3) as u64
        } else {
            0
        }
    }

    /// Makes `slow` — (node, start ns, length ns, extra ns) — one node's latency spike.
    pub fn with_slow(mut self, slow: Option<(u32, u64, u64, u64)>) -> Self {
        self.slow = slow;
        self
    }

    /// When a copy node `from` sends to `to` at `now` arrives, and when its
    /// duplicate does (if any); both `None` if it is lost.
    pub fn arrivals(&mut self, now: u64, from: u32, to: u32) -> [Option<u64>; 2] {
        let f = from as usize;
        let depart = now.max(self.busy_until[f]) + (self.link.copy_us * 1e3) as u64;
        self.busy_until[f] = depart;
        if self.link.loss > 0.0 && self.rng.gen_bool(self.link.loss) {
            return [None, None];
        }
        let mut at = depart + self.link.sample_ns(&mut self.rng) + self.asymmetry_ns(from, to);
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
            // The pointer alone is not enough: a freed buffer's address comes back.
            Some((p, n, rc)) if *p == bytes.as_ptr() && *n == bytes.len() && **rc == *bytes => rc.clone(),
            _ => {
                let rc: std::rc::Rc<[u8]> = std::rc::Rc::from(bytes);
                self.last = Some((bytes.as_ptr(), bytes.len(), rc.clone()));
                rc
            }
        }
    }
}
