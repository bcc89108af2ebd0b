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
//! spike_us = 300.0       # extra delay of a spike (uniform: in [spike_us/2, spike_us*3/2])
//! spike_shape = "uniform" # or "pareto": spike_us · U^(−1/spike_alpha), at most 100 × spike_us
//! spike_alpha = 1.5      # pareto: tail index (smaller: heavier)
//! loss_burst_probability = 0.0 # chance a packet starts a loss burst at its sender ...
//! loss_burst_len = 0     # ... that loses this many of the sender's packets (it included)
//! copy_us = 2.7          # serialization cost of each copy a node sends, back to back
//! loss = 0.0             # chance a packet is lost on a hop
//! dup = 0.0              # chance a packet is delivered twice
//! floor_us = 0.0         # propagation floor: every delay is at least this (0: none)
//! unqueued = 0.0         # with a floor: share of packets that cross without queueing (exactly the floor)
//! asymmetric_share = 0.0 # share of directed links whose floor is longer ...
//! asymmetric_us = 0.0    # ... by this much (the case two-way clock sync cannot see)
//!
//! [clock]
//! offset_us = 0.02       # every node's clock offset, uniform in ±offset_us (at most 10 s)
//! drift_ppm = 0.0        # every node's clock drift, uniform in ±drift_ppm
//! timestamp_noise_ns = 0 # software timestamping: each reading late by an exponential of this mean
//! step_share = 0.0       # share of nodes whose clock steps (an ntpd jump) ...
//! step_us = 0.0          # ... by this much, either sign (at most 10 s) ...
//! step_at_s = 0.0        # ... at this time
//! step_announced = true  # the host says so at once (clock_settime); false: a silent jump
//!
//! # Host classes (any number): a share of nodes, drawn once per run, whose
//! # every hop (to or from them) is slower, optionally only for a while.
//! [[class]]
//! name = "slow-hosts"
//! share = 0.2            # share of the nodes of `roles` in the class
//! roles = "receivers"    # receivers | proxies | all
//! extra_us = 50.0        # added to every hop to or from a member
//! body_scale = 1.0       # multiplies the queueing body (above the floor) of those hops
//! from_s = 0.0           # in force from this time (true, since the run's start) ...
//! until_s = 1e9          # ... until this one
//! ramp_s = 0.0           # extra_us grows linearly over this long from from_s (a drift); 0: a step
//! ```
//!
//! Examples live in `docs/models/`.
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

#![deny(missing_docs)]

use rand::Rng;
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};

/// The shape of a latency spike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SpikeShape {
    /// Uniform in [spike_us/2, 3·spike_us/2].
    #[default]
    Uniform,
    /// Pareto from spike_us with tail index `spike_alpha`, capped at 100 × spike_us.
    Pareto,
}

/// Which nodes a class draws its members from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClassRoles {
    /// Receivers only.
    #[default]
    Receivers,
    /// Proxies only.
    Proxies,
    /// Every node (the sender too).
    All,
}

/// A class of hosts: a share of the nodes whose hops are slower, fixed for
/// the run, in force for a time window (a regime), stepped or ramped in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostClass {
    /// Its name in reports.
    pub name: String,
    /// Share of the nodes of `roles` drawn into it, in [0, 1].
    pub share: f64,
    /// Which nodes it draws from.
    pub roles: ClassRoles,
    /// Added to every hop to or from a member, µs.
    pub extra_us: f64,
    /// Multiplies the queueing body (above the floor) of those hops.
    pub body_scale: f64,
    /// In force from this true time, s since the run's start ...
    pub from_s: f64,
    /// ... until this one.
    pub until_s: f64,
    /// `extra_us` grows linearly over this long from `from_s` (0: a step).
    pub ramp_s: f64,
}

impl Default for HostClass {
    fn default() -> Self {
        HostClass {
            name: String::new(),
            share: 0.0,
            roles: ClassRoles::Receivers,
            extra_us: 0.0,
            body_scale: 1.0,
            from_s: 0.0,
            until_s: 1e9,
            ramp_s: 0.0,
        }
    }
}

/// Classes a model may have at most (members are kept as a bit mask per node).
pub const CLASSES_MAX: usize = 16;

/// Why a model file or a model's value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// Not TOML, or not the model's keys (the line and what is wrong there).
    #[error("{0}")]
    Toml(String),
    /// No section at all (almost surely the wrong file).
    #[error("no [link], [clock] or [[class]] section; for the built-in model give no model file")]
    Empty,
    /// More classes than [`CLASSES_MAX`].
    #[error("{0} classes; at most {CLASSES_MAX}")]
    TooManyClasses(usize),
    /// A value out of its range, named with its section and key.
    #[error("{0}")]
    Invalid(String),
}

impl HostClass {
    /// Refuses values out of their ranges, naming the class.
    pub fn validate(&self) -> Result<(), ModelError> {
        let finite = [self.share, self.extra_us, self.body_scale, self.from_s, self.until_s, self.ramp_s]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0);
        if !finite || self.share > 1.0 || self.body_scale > 1_000.0 || self.until_s < self.from_s {
            return Err(ModelError::Invalid(format!(
                "class {:?}: share in [0, 1], extra_us, ramp_s, from_s ≤ until_s finite and not negative, \
                 body_scale in [0, 1000]",
                self.name
            )));
        }
        Ok(())
    }

    /// (extra ns, body scale) of a hop at true time `t` ns, when in force.
    fn effect(&self, t: u64) -> Option<(f64, f64)> {
        let s = t as f64 / 1e9;
        if s < self.from_s || s >= self.until_s {
            return None;
        }
        let ramp = if self.ramp_s > 0.0 { ((s - self.from_s) / self.ramp_s).min(1.0) } else { 1.0 };
        Some((self.extra_us * 1e3 * ramp, self.body_scale))
    }
}

/// The distribution of one hop's delay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// Uniform in [`min_us`, `max_us`] (`LinkModel`).
    Uniform,
    /// Lognormal with median `median_us` and shape `sigma` (`LinkModel`).
    Lognormal,
}

/// Where a node's per-copy cost is paid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyLanes {
    /// One queue per node: every copy it sends waits for the one before.
    #[default]
    Node,
    /// One queue per node and tree: a node that sends on several sharded
    /// trees (the sender) sends each tree's copies on a core and NIC queue
    /// of its own, as Jasper's proxies spread copies over six Tx cores.
    Tree,
}

/// One hop's delay, loss and the per-copy cost at its sender.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkModel {
    /// The distribution of the body.
    pub kind: LinkKind,
    /// Lognormal: median one-way delay of a hop, µs.
    pub median_us: f64,
    /// Lognormal: shape (spread) of the body.
    pub sigma: f64,
    /// Uniform: lower bound, µs.
    pub min_us: f64,
    /// Uniform: upper bound, µs.
    pub max_us: f64,
    /// Chance a packet hits a latency spike.
    pub spike_probability: f64,
    /// Size of a spike, µs (its distribution: `spike_shape`).
    pub spike_us: f64,
    /// Serialization cost of each copy a node sends, back to back, µs.
    pub copy_us: f64,
    /// Chance a packet is lost on a hop.
    pub loss: f64,
    /// Chance a packet is delivered twice (the copy 1–50 µs later).
    pub dup: f64,
    /// Propagation floor, µs (0: none, the body alone).
    pub floor_us: f64,
    /// With a floor: share of packets that see exactly the floor.
    pub unqueued: f64,
    /// Share of directed links whose floor is longer by `asymmetric_us`.
    pub asymmetric_share: f64,
    /// How much longer those floors are, µs (what two-way clock sync cannot see).
    pub asymmetric_us: f64,
    /// The distribution of a spike's size.
    pub spike_shape: SpikeShape,
    /// Pareto spikes: tail index (smaller: heavier).
    pub spike_alpha: f64,
    /// Chance a packet starts a loss burst at its sender ...
    pub loss_burst_probability: f64,
    /// ... that loses this many of the sender's packets (it included).
    pub loss_burst_len: u32,
    /// Where the per-copy cost is paid (`node`, or per `tree` on sharded trees).
    pub copy_lanes: CopyLanes,
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
        spike_shape: SpikeShape::Uniform,
        spike_alpha: 1.5,
        loss_burst_probability: 0.0,
        loss_burst_len: 0,
        copy_lanes: CopyLanes::Node,
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
        spike_shape: SpikeShape::Uniform,
        spike_alpha: 1.5,
        loss_burst_probability: 0.0,
        loss_burst_len: 0,
        copy_lanes: CopyLanes::Node,
    };

    /// Checks the parameters make sense; the error names the first field that does not.
    pub fn validate(&self) -> Result<(), ModelError> {
        let finite = |v: f64| v.is_finite();
        let share = |v: f64| (0.0..=1.0).contains(&v);
        let below_one = |v: f64| (0.0..1.0).contains(&v);
        let checks: [(&str, f64, bool, &str); 16] = [
            ("median_us", self.median_us, finite(self.median_us) && self.median_us > 0.0, "> 0"),
            ("sigma", self.sigma, finite(self.sigma) && self.sigma >= 0.0, ">= 0"),
            ("min_us", self.min_us, finite(self.min_us) && self.min_us >= 0.0, ">= 0"),
            ("max_us", self.max_us, finite(self.max_us) && self.max_us >= self.min_us, ">= min_us"),
            ("spike_probability", self.spike_probability, share(self.spike_probability), "in 0..=1"),
            ("spike_us", self.spike_us, finite(self.spike_us) && self.spike_us >= 0.0, ">= 0"),
            ("copy_us", self.copy_us, finite(self.copy_us) && self.copy_us >= 0.0, ">= 0"),
            ("loss", self.loss, below_one(self.loss), "in 0..1"),
            ("dup", self.dup, below_one(self.dup), "in 0..1"),
            ("floor_us", self.floor_us, finite(self.floor_us) && self.floor_us >= 0.0, ">= 0"),
            (
                "floor_us",
                self.floor_us,
                self.floor_us == 0.0 || self.kind == LinkKind::Uniform || self.median_us > self.floor_us,
                "below median_us (lognormal)",
            ),
            ("unqueued", self.unqueued, share(self.unqueued), "in 0..=1"),
            ("asymmetric_share", self.asymmetric_share, share(self.asymmetric_share), "in 0..=1"),
            ("asymmetric_us", self.asymmetric_us, finite(self.asymmetric_us) && self.asymmetric_us >= 0.0, ">= 0"),
            ("spike_alpha", self.spike_alpha, self.spike_alpha > 0.1 && self.spike_alpha <= 100.0, "in 0.1..=100"),
            ("loss_burst_probability", self.loss_burst_probability, below_one(self.loss_burst_probability), "in 0..1"),
        ];
        if let Some((name, v, _, want)) = checks.iter().find(|c| !c.2) {
            return Err(ModelError::Invalid(format!("[link] {name} = {v} is out of range (must be {want})")));
        }
        if self.loss_burst_len > 1_000_000 {
            return Err(ModelError::Invalid(format!(
                "[link] loss_burst_len = {} is out of range (at most 1000000)",
                self.loss_burst_len
            )));
        }
        Ok(())
    }

    /// Draws one hop's delay in ns.
    pub fn sample_ns(&self, rng: &mut impl Rng) -> u64 {
        self.sample_scaled_ns(rng, 1.0)
    }

    /// Draws one hop's delay in ns, its body above the floor scaled by `scale`.
    pub fn sample_scaled_ns(&self, rng: &mut impl Rng, scale: f64) -> u64 {
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
        let base_us = self.floor_us.min(base_us) + (base_us - self.floor_us).max(0.0) * scale;
        let spike = if self.spike_probability > 0.0 && rng.gen_bool(self.spike_probability) {
            match self.spike_shape {
                SpikeShape::Uniform => rng.gen_range(self.spike_us * 0.5..=self.spike_us * 1.5),
                SpikeShape::Pareto => {
                    let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
                    (self.spike_us * u.powf(-1.0 / self.spike_alpha)).min(self.spike_us * 100.0)
                }
            }
        } else {
            0.0
        };
        ((base_us + spike) * 1e3) as u64
    }
}

/// Every node's clock errors.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClockModel {
    /// Every node's raw offset, uniform in ±offset_us (at most 10 s).
    pub offset_us: f64,
    /// Every node's raw drift, uniform in ±drift_ppm.
    pub drift_ppm: f64,
    /// Mean of the exponential delay of every software timestamp, ns.
    pub timestamp_noise_ns: f64,
    /// Share of nodes whose clock steps by `step_us` at `step_at_s`.
    pub step_share: f64,
    /// The step's size, µs, either sign (at most 10 s).
    pub step_us: f64,
    /// When it steps: true time, s since the run's start.
    pub step_at_s: f64,
    /// The host announces the step (a daemon's `clock_settime`, which Linux
    /// reports to a `TFD_TIMER_CANCEL_ON_SET` timer): the node learns of it at
    /// once. `false`: a silent jump (a paused VM, a hypervisor's correction),
    /// found only by the probes.
    pub step_announced: bool,
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
            step_announced: true,
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
        step_announced: true,
    };
    /// NTP-class raw clocks (±10 ms, ±50 ppm) with software timestamps (200 ns mean noise).
    pub const NTP: ClockModel = ClockModel {
        offset_us: 10_000.0,
        drift_ppm: 50.0,
        timestamp_noise_ns: 200.0,
        step_share: 0.0,
        step_us: 0.0,
        step_at_s: 0.0,
        step_announced: true,
    };

    /// Refuses values out of their ranges, naming them.
    pub fn validate(&self) -> Result<(), ModelError> {
        let vals = [self.offset_us, self.drift_ppm, self.timestamp_noise_ns, self.step_at_s];
        if vals.iter().any(|v| !v.is_finite() || *v < 0.0)
            || !self.step_us.is_finite()
            || !(0.0..=1.0).contains(&self.step_share)
        {
            return Err(ModelError::Invalid(
                "clock: offset_us, drift_ppm, timestamp_noise_ns and step_at_s must be finite and not \
                        negative, step_us finite (either sign); step_share in [0, 1]"
                    .into(),
            ));
        }
        if self.offset_us > CLOCK_OFFSET_MAX_US || self.step_us.abs() > CLOCK_OFFSET_MAX_US {
            return Err(ModelError::Invalid(format!(
                "clock: offset_us {} and step_us {} must be at most {CLOCK_OFFSET_MAX_US} (10 s)",
                self.offset_us, self.step_us
            )));
        }
        if self.drift_ppm > 1_000.0 {
            return Err(ModelError::Invalid(format!("clock: drift_ppm {} is above 1000", self.drift_ppm)));
        }
        Ok(())
    }
}

/// Where every simulated raw clock starts (at true time 0, before its
/// offset): far above the largest offset and step a model may give
/// ([`CLOCK_OFFSET_MAX_US`]), so no clock reads below it.
pub const LOCAL_EPOCH_NS: u64 = 100_000_000_000;
/// The largest `offset_us` and `step_us` a clock model may give (10 s).
pub const CLOCK_OFFSET_MAX_US: f64 = 10_000_000.0;

/// One node's clock: local = epoch + true + offset + drift · true (+ a step from a time on).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clock {
    /// Offset at true time 0, ns.
    pub offset_ns: f64,
    /// Drift (ns per ns; 1e-6 is 1 ppm).
    pub drift: f64,
    /// (true time ns, jump ns)
    pub step: Option<(u64, f64)>,
}

impl Clock {
    /// The true clock.
    pub const PERFECT: Clock = Clock { offset_ns: 0.0, drift: 0.0, step: None };

    /// One node's clock drawn from the model.
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

    /// Local reading at true time `t`: from [`LOCAL_EPOCH_NS`], so that a
    /// clock set back by as much as the model allows still runs from the
    /// start (true time starts at 0 here; a raw clock stuck at 0 for the first
    /// second of a −1 s offset looked like a step to every peer).
    pub fn local(&self, t: u64) -> u64 {
        (LOCAL_EPOCH_NS as f64 + t as f64 * (1.0 + self.drift) + self.offset_ns + self.jump_at(t)).max(0.0) as u64
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

    /// The first true time at or after `from` at which the local clock
    /// reads at least `l`. Differs from [`Clock::true_at`] only after a
    /// backward step: readings then repeat, and a timer armed for one of them
    /// must wait for the clock to reach it again, not fire at once for ever.
    pub fn true_at_from(&self, l: u64, from: u64) -> u64 {
        match self.step {
            Some((at, j)) if j < 0.0 && from >= at && self.local(from) < l => {
                let after = Clock { step: None, offset_ns: self.offset_ns + j, ..*self };
                after.true_at(l).max(from)
            }
            _ => self.true_at(l).max(from),
        }
    }

    fn true_at_approx(&self, l: u64) -> u64 {
        let inv = |jump: f64| {
            ((l as f64 - LOCAL_EPOCH_NS as f64 - self.offset_ns - jump) / (1.0 + self.drift)).max(0.0).ceil() as u64
        };
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
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelFile {
    /// `[link]`: every hop.
    pub link: LinkModel,
    /// `[clock]`: every node's clock.
    pub clock: ClockModel,
    /// `[[class]]`: the host classes, at most [`CLASSES_MAX`].
    #[serde(rename = "class")]
    pub classes: Vec<HostClass>,
}

/// A TOML error as one line — `line 3, column 10: invalid type: …` — rather
/// than the parser's multi-line excerpt (command-line errors are one line).
pub fn toml_error_line(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim().replace('\n', "; ");
    match e.span() {
        Some(span) => {
            let before = &text.as_bytes()[..span.start.min(text.len())];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
            format!("line {line}, column {column}: {msg}")
        }
        None => msg,
    }
}

impl ModelFile {
    /// Parses and validates a model file's text.
    pub fn from_toml(s: &str) -> Result<Self, ModelError> {
        let table: toml::Table = toml::from_str(s).map_err(|e| ModelError::Toml(toml_error_line(s, &e)))?;
        if table.is_empty() {
            // An empty file (or only comments) is almost surely the wrong file.
            return Err(ModelError::Empty);
        }
        let m: ModelFile = toml::from_str(s).map_err(|e| ModelError::Toml(toml_error_line(s, &e)))?;
        m.link.validate()?;
        m.clock.validate()?;
        if m.classes.len() > CLASSES_MAX {
            return Err(ModelError::TooManyClasses(m.classes.len()));
        }
        for c in &m.classes {
            c.validate()?;
        }
        Ok(m)
    }

    /// Draws each class's members among the nodes: `roles[id]` is node id's
    /// role (`None`: no node); returns a bit mask of classes per node.
    pub fn draw_members(&self, roles: &[Option<ClassRoles>], rng: &mut impl Rng) -> Vec<u16> {
        let mut mask = vec![0u16; roles.len()];
        for (i, c) in self.classes.iter().enumerate() {
            for (id, r) in roles.iter().enumerate() {
                let eligible = match (r, c.roles) {
                    (None, _) => false,
                    (Some(_), ClassRoles::All) => true,
                    (Some(r), want) => *r == want,
                };
                if eligible && c.share > 0.0 && rng.gen_bool(c.share.min(1.0)) {
                    mask[id] |= 1 << i;
                }
            }
        }
        mask
    }
}

/// Emulated links from every node: each node's copies leave back to back
/// (`copy_us` apart), then take a drawn hop delay; some are lost, some
/// duplicated; one node may be slow for a while. Shared by the simulator and
/// the loopback data plane, so both emulate the same cloud.
pub struct LinkEmulator {
    /// The model it draws from.
    pub link: LinkModel,
    rng: rand_chacha::ChaCha12Rng,
    /// Picks the asymmetric directed links (a hash of the pair with this salt).
    salt: u64,
    busy_until: Vec<u64>,
    /// With [`CopyLanes::Tree`]: when each (node, tree ≥ 1) queue is free
    /// (tree 0 uses `busy_until`).
    lane_busy: std::collections::HashMap<(u32, u16), u64>,
    /// (node, start ns, length ns, extra delay ns)
    pub slow: Option<(u32, u64, u64, u64)>,
    classes: Vec<HostClass>,
    /// Per node, a bit per class it belongs to.
    members: Vec<u16>,
    /// Per node, packets its current loss burst still loses.
    burst_left: Vec<u32>,
    /// Packets lost in bursts.
    pub burst_lost: u64,
}

impl LinkEmulator {
    /// Emulates links from `nodes` nodes, drawing from `rng`.
    pub fn new(link: LinkModel, mut rng: rand_chacha::ChaCha12Rng, nodes: usize) -> Self {
        let salt = if link.asymmetric_share > 0.0 { rng.gen() } else { 0 };
        LinkEmulator {
            link,
            rng,
            salt,
            busy_until: vec![0; nodes],
            lane_busy: std::collections::HashMap::new(),
            slow: None,
            classes: Vec::new(),
            members: Vec::new(),
            burst_left: vec![0; nodes],
            burst_lost: 0,
        }
    }

    /// Host classes and each node's membership mask (from [`ModelFile::draw_members`]).
    pub fn with_classes(mut self, classes: &[HostClass], members: Vec<u16>) -> Self {
        assert!(classes.len() <= CLASSES_MAX, "at most {CLASSES_MAX} classes");
        self.classes = classes.to_vec();
        self.members = members;
        self
    }

    /// Nodes in class `i`.
    pub fn class_members(&self, i: usize) -> usize {
        self.members.iter().filter(|&&m| m & (1 << i) != 0).count()
    }

    /// (extra ns, body scale) of the classes a hop `from → to` touches at `t`.
    fn class_effect(&self, t: u64, from: u32, to: u32) -> (u64, f64) {
        let m = |id: u32| self.members.get(id as usize).copied().unwrap_or(0);
        let mask = m(from) | m(to);
        if mask == 0 {
            return (0, 1.0);
        }
        let (mut extra, mut scale) = (0.0, 1.0f64);
        for (i, c) in self.classes.iter().enumerate() {
            if mask & (1 << i) != 0 {
                if let Some((e, s)) = c.effect(t) {
                    extra += e;
                    scale = scale.max(s);
                }
            }
        }
        (extra as u64, scale)
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
        self.arrivals_on(now, from, 0, to)
    }

    /// [`LinkEmulator::arrivals`] for a copy of tree `tree`'s packet: under
    /// [`CopyLanes::Tree`] it waits only for the same tree's copies.
    pub fn arrivals_on(&mut self, now: u64, from: u32, tree: u16, to: u32) -> [Option<u64>; 2] {
        let f = from as usize;
        let cost = (self.link.copy_us * 1e3) as u64;
        let busy = match (self.link.copy_lanes, tree) {
            (CopyLanes::Tree, 1..) => self.lane_busy.entry((from, tree)).or_insert(0),
            _ => &mut self.busy_until[f],
        };
        let depart = now.max(*busy) + cost;
        *busy = depart;
        if self.link.loss > 0.0 && self.rng.gen_bool(self.link.loss) {
            return [None, None];
        }
        if self.link.loss_burst_len > 0 {
            if self.burst_left[f] == 0
                && self.link.loss_burst_probability > 0.0
                && self.rng.gen_bool(self.link.loss_burst_probability)
            {
                self.burst_left[f] = self.link.loss_burst_len;
            }
            if self.burst_left[f] > 0 {
                self.burst_left[f] -= 1;
                self.burst_lost += 1;
                return [None, None];
            }
        }
        let (extra, scale) = self.class_effect(now, from, to);
        let hop = if scale == 1.0 {
            self.link.sample_ns(&mut self.rng)
        } else {
            self.link.sample_scaled_ns(&mut self.rng, scale)
        };
        let mut at = depart + hop + self.asymmetry_ns(from, to) + extra;
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
    fn after_a_backward_step_a_reading_is_reached_again_later() {
        let c = Clock { offset_ns: 0.0, drift: 0.0, step: Some((5_000, -2_000.0)) };
        // At 6,000 the clock reads 4,000 past its epoch: a timer for 4,500 is
        // due at 6,500, not at once (where `true_at` puts the reading: 4,500).
        let l = c.local(4_500);
        assert_eq!(c.true_at(l), 4_500);
        assert_eq!(c.true_at_from(l, 6_000), 6_500);
        assert_eq!(c.true_at_from(l, 7_000), 7_000, "past it already: now");
        assert_eq!(c.true_at_from(c.local(9_000), 6_000), 9_000);
        let fwd = Clock { step: Some((5_000, 2_000.0)), ..c };
        assert_eq!(fwd.true_at_from(fwd.local(4_500), 6_000), 6_000);
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
        assert!(ModelFile::from_toml("[link]\nmedian = 20.0\n").is_err(), "a misspelt key is an error");
        assert!(ModelFile::from_toml("[[class]]\nshare = 1.5\n").is_err());
        assert!(ModelFile::from_toml("[[class]]\nfrom_s = 5\nuntil_s = 1\n").is_err());
        assert!(ModelFile::from_toml("[link]\nspike_shape = \"gamma\"\n").is_err());
    }

    #[test]
    fn copies_queue_per_node_or_per_tree() {
        let flat = LinkModel {
            kind: LinkKind::Uniform,
            min_us: 10.0,
            max_us: 10.0,
            spike_probability: 0.0,
            ..LinkModel::CLOUD
        };
        let rng = || rand_chacha::ChaCha12Rng::seed_from_u64(1);
        // One queue: the second tree's copy waits for the first's 2.7 µs.
        let mut one = LinkEmulator::new(flat, rng(), 4);
        let a = one.arrivals_on(0, 1, 0, 2)[0].unwrap();
        let b = one.arrivals_on(0, 1, 1, 3)[0].unwrap();
        assert_eq!(b - a, 2_700);
        // A queue per tree: both leave at once; the same tree's next copy waits.
        let mut lanes = LinkEmulator::new(LinkModel { copy_lanes: CopyLanes::Tree, ..flat }, rng(), 4);
        let a = lanes.arrivals_on(0, 1, 0, 2)[0].unwrap();
        let b = lanes.arrivals_on(0, 1, 1, 3)[0].unwrap();
        let c = lanes.arrivals_on(0, 1, 1, 2)[0].unwrap();
        assert_eq!((a, b, c - b), (12_700, 12_700, 2_700));
    }

    #[test]
    fn example_model_files_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/models");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let m = ModelFile::from_toml(&std::fs::read_to_string(&p).unwrap());
                assert!(m.is_ok(), "{}: {:?}", p.display(), m.err());
                n += 1;
            }
        }
        assert!(n >= 6, "{n} example models");
        let cloud = ModelFile::from_toml(&std::fs::read_to_string(dir.join("cloud.toml")).unwrap()).unwrap();
        assert_eq!(cloud, ModelFile::default(), "cloud.toml is the built-in default");
    }

    #[test]
    fn classes_draw_their_share_and_act_in_their_window() {
        let m = ModelFile::from_toml(
            "[[class]]\nshare = 0.2\nextra_us = 50\nfrom_s = 1\nuntil_s = 2\n\
             [[class]]\nshare = 1.0\nroles = \"proxies\"\nextra_us = 10\nramp_s = 1\n",
        )
        .unwrap();
        let mut roles = vec![Some(ClassRoles::Receivers); 10_000];
        roles[0] = None;
        roles[1] = Some(ClassRoles::Proxies);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let members = m.draw_members(&roles, &mut rng);
        let slow = members.iter().filter(|&&x| x & 1 != 0).count();
        assert!((1_800..2_200).contains(&slow), "{slow}");
        assert_eq!(members[0], 0);
        assert_eq!(members[1] & 2, 2);
        assert_eq!(members.iter().filter(|&&x| x & 2 != 0).count(), 1, "only proxies");
        let c = &m.classes[0];
        assert_eq!(c.effect(999_999_999), None);
        assert_eq!(c.effect(1_500_000_000), Some((50_000.0, 1.0)));
        assert_eq!(c.effect(2_000_000_000), None);
        let ramp = &m.classes[1];
        assert_eq!(ramp.effect(500_000_000), Some((5_000.0, 1.0)));
        assert_eq!(ramp.effect(5_000_000_000), Some((10_000.0, 1.0)));
        // Through the emulator: a hop to a slow member in the window is 50 µs later.
        let link = LinkModel { spike_probability: 0.0, copy_us: 0.0, ..LinkModel::UNIFORM };
        let link = LinkModel { min_us: 10.0, max_us: 10.0, ..link };
        let slow_id = members.iter().position(|&x| x & 1 != 0).unwrap() as u32;
        let fast_id = (2..).find(|&i| members[i] == 0).unwrap() as u32;
        let mut e = LinkEmulator::new(link, rand_chacha::ChaCha12Rng::seed_from_u64(1), 10_000)
            .with_classes(&m.classes, members);
        let t = 1_500_000_000;
        assert_eq!(e.arrivals(t, 0, slow_id)[0], Some(t + 60_000));
        assert_eq!(e.arrivals(t, 0, fast_id)[0], Some(t + 10_000));
        assert_eq!(e.arrivals(t + 1_000_000_000, 0, slow_id)[0], Some(t + 1_000_000_000 + 10_000));
    }

    #[test]
    fn a_bad_link_model_is_named_field_by_field() {
        // It once printed the whole struct with Debug (issue 17).
        assert!(LinkModel::CLOUD.validate().is_ok());
        let e = LinkModel { spike_probability: 2.0, ..LinkModel::CLOUD }.validate().unwrap_err();
        assert_eq!(e.to_string(), "[link] spike_probability = 2 is out of range (must be in 0..=1)");
        let e = LinkModel { median_us: f64::NAN, ..LinkModel::CLOUD }.validate().unwrap_err().to_string();
        assert!(e.starts_with("[link] median_us = NaN"), "{e}");
        assert!(!e.contains("LinkModel {"));
    }

    #[test]
    fn pareto_spikes_and_loss_bursts() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let m = LinkModel {
            spike_probability: 1.0,
            spike_us: 100.0,
            spike_shape: SpikeShape::Pareto,
            spike_alpha: 1.5,
            ..LinkModel::UNIFORM
        };
        let v: Vec<u64> = (0..100_000).map(|_| m.sample_ns(&mut rng)).collect();
        // P(spike > 400 µs) = 4^-1.5 = 1/8 (hop ≤ 50 µs on top).
        let over = v.iter().filter(|&&x| x > 450_000).count() as f64 / v.len() as f64;
        assert!((0.10..0.14).contains(&over), "{over}");
        assert!(*v.iter().max().unwrap() <= 10_050_000, "capped at 100 × spike_us");
        let m = LinkModel { loss_burst_probability: 0.001, loss_burst_len: 20, ..LinkModel::UNIFORM };
        let mut e = LinkEmulator::new(m, rand_chacha::ChaCha12Rng::seed_from_u64(2), 2);
        let lost: Vec<bool> = (0..200_000).map(|i| e.arrivals(i * 1_000, 0, 1)[0].is_none()).collect();
        let n_lost = lost.iter().filter(|&&l| l).count();
        assert_eq!(n_lost as u64, e.burst_lost);
        assert!(n_lost % 20 == 0 || lost[lost.len() - 1], "whole bursts of 20 unless the run ends inside one");
        assert!((2_000..6_000).contains(&n_lost), "{n_lost}");
        let bursts = lost.windows(2).filter(|w| !w[0] && w[1]).count();
        assert!(n_lost / bursts >= 20, "losses come in runs");
    }
}
