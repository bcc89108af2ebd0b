//! The clock-synchronization state machine of one node (sans-IO).
//!
//! Fed with the node's **raw** clock readings and the probes it receives, it
//! returns the probes to send and keeps an estimate of the node's clock
//! against the reference's: `θ(x) = offset + drift · (x − at)`, where `x` is
//! the raw local time. The corrected clock is `now_sync(x) = x − θ(x)`.
//!
//! - **Coded probes.** Every interval the node sends each peer a pair of
//!   probes `pair_gap_ns` apart, one peer at a time, spread over the interval. The receiving peer compares the pair's receive
//!   spacing with its send spacing; a pair that differs by more than
//!   `purity_ns` met queueing (counted as impure). Every probe's sample goes
//!   into the peer's forward [`Envelope`] and is echoed back (a short queue,
//!   one echo per probe sent) so the peer sees both directions too. With
//!   `pure_only` (Huygens' filter) only the lower sample of a pure pair does:
//!   software timestamps only ever add delay, so every probe is a valid upper
//!   bound for the lower envelope, and on our models the filter threw away
//!   over 90 % of the samples the envelope needs (docs/RESULTS.md).
//! - **Per peer**, both directions are fitted at once ([`joint_fit`]): the
//!   forward delays (peer → me) lie above `d + δ(x)`, the reverse ones above
//!   `d − δ(x)`, with `δ = θ_me − θ_peer` linear in our raw time and `d` the
//!   minimum delay, the same both ways; the slope is the one that lifts both
//!   lower envelopes highest together (Huygens' separating line, hard margin),
//!   so neither direction's last low point alone can tilt it.
//! - **Network effect.** Each node advertises its estimate and its level
//!   (probe hops from the reference) in its probes. Each interval a node
//!   takes, from every synchronized peer, the candidate `θ_peer + (θ_me −
//!   θ_peer)`; its estimate is the inverse-variance weighted mean (the edge's
//!   variance from the residuals plus the peer's own from its bound) of the
//!   candidates from the peers nearer the reference and, at half weight, of
//!   its own level, every edge's height taken on the node's common slope
//!   (the edges' slopes' weighted mean, one far from the others left out) —
//!   a level-ordered weighted least-squares solve over the
//!   probe graph, with the reference fixed at 0, run where the data is.
//!   Level order matters: plain Jacobi averaging over all peers lets
//!   estimates feed back around loops with stale values, and the whole graph
//!   then floats away from the reference with the network's mean drift (a
//!   test here showed tens of µs); peers further down, which derive from this
//!   node, are left out. The residuals `θ_i − θ_j − δ_ij` — what is left of
//!   the loop sums — are the error estimate, and an edge whose residual
//!   stands far out from the others (a link with asymmetric minimum delays;
//!   judged by the median and MAD weighted by level only — a peer of the
//!   node's own level counts ¾ of an anchor — since the candidates' weights
//!   measure noise, not asymmetry; peers further down whose probes say they
//!   do not derive from us, `PROBE_ANCHORED` clear, vote too at
//!   [`VOTE_WITNESS`]) is flagged and left out until it agrees again.
//!   When that outvotes every anchor, at least [`PROMOTE_MIN`] agreeing peers
//!   of the node's own level anchor it instead, one level further down.
//! - **Disputes.** An anchor — an edge to a peer nearer the reference, the
//!   reference's own above all (a child of the reference probes
//!   `graph::SIBLING_PEERS` siblings each way) — is set aside only on
//!   [`OVERRULE_VOTES`] of peers that agree with each other and are not
//!   themselves *contested*. A node is contested (it says so in its probes,
//!   `PROBE_CONTESTED`) when one of its anchors stands out from its votes
//!   (by more than that candidate's bound and [`ASYM_MIN_NS`]): such a node
//!   may be the side that is wrong, and its word cannot overturn another's
//!   anchor (two children of the reference asymmetric the same way used to
//!   outvote the good sibling between them, and the whole graph followed
//!   them). A
//!   dispute no vote can settle — an anchor that stands out and stays, or
//!   two peers that stand out and agree with each other — makes the bound
//!   the hull of every candidate that does not derive from us: the node
//!   says it does not know which side is right, rather than picking one.
//! - **Bound.** `bound_ns` is built from what the node observes, not from
//!   constants tuned on one model. Each edge's own bound comes from how
//!   sharply its two floors are pinned: the lowest sample of a direction may
//!   sit above the true floor by up to [`FLOOR_C`] times the height of its
//!   [`FLOOR_K`]-th lowest above it ([`crate::envelope::floor_spread`]), and
//!   the line through those floors tilts by as much again at the window's
//!   end (no candidate at all until each direction holds `FLOOR_K` + 1
//!   samples). A candidate's bound is its peer's advertised bound (grown by the
//!   drift's uncertainty since) plus its edge's. If every candidate's
//!   interval holds the truth, so does the estimate within the weighted
//!   mean of their bounds; candidates whose intervals have no common point
//!   (an asymmetric edge no vote caught) widen it to the hull of them all
//!   (`inconsistent_updates`). Plus the common slope's error and, between
//!   updates, [`DRIFT_UNCERTAINTY`] per ns ([`DRIFT_MAX`] while no edge has a
//!   slope yet). `hard_bound_ns` needs no symmetry assumption: half the
//!   minimum round trip, summed along the best path to the reference; the
//!   bound is never wider than it (plus the distance to that path's
//!   candidate).
//! - **Clock steps.** A pair far below an edge's fit (a step) or both probes
//!   far above it (a jump the other way) resets that edge; until a pair from
//!   another peer sits on its fit, the node's bound is unknown (`suspect`).
//!   Jumps on the edges to [`OWN_STEP_PEERS`] peers at once (and to more
//!   than half the peers heard from), or a step the
//!   host announces without its size ([`ClockSync::clock_stepped`]), are the
//!   node's own: every edge restarts and it is unsynchronized until they
//!   refit. A step whose size the host measured
//!   ([`ClockSync::clock_stepped_by`]) is taken out instead: inside, the
//!   node runs on its raw clock less every such step, so nothing it holds
//!   and nothing its peers see jumps; its bound grows by the measurement's
//!   uncertainty for a window.
//!
//! Bad probes — misdirected, from a node that is not a peer, replayed,
//! malformed, or with absurd timestamps — are refused and counted, and never
//! move the estimate.

use fairfeed_wire::overlay::{ProbeRepr, PROBE_ANCHORED, PROBE_CONTESTED, PROBE_FLAGS, PROBE_SYNCED};

use crate::envelope::{delta_with_slope, floor_spread, joint_fit, Envelope, Offer};

/// Peers one node probes at most.
pub const PEERS_MAX: usize = 256;
/// The most pairs per interval `rate_max` may ask for on one edge.
pub const RATE_MAX_LIMIT: u32 = 16;
/// Samples a direction needs before its fit is used.
pub const MIN_SAMPLES: usize = 2;
/// Samples a direction needs before a sample far below its fit counts as a
/// step: enough that the window has surely seen the floor (with every probe
/// in the envelope, 8 could all be queued — 0.7⁸ ≈ 6 % on a link where 30 %
/// of packets meet no queue — and the first unqueued ones looked like a step).
pub const STEP_SAMPLES: usize = 32;
/// An edge's slope (relative drift) is used once both directions' samples span this long.
pub const SLOPE_SPAN_NS: u64 = 1_000_000_000;
/// Candidates from peers of the node's own level count this much of their weight.
pub const SAME_LEVEL_WEIGHT: f64 = 0.5;
/// Edges are judged for asymmetry only after the node has been synchronized this long.
pub const FLAG_AFTER_NS: u64 = 1_000_000_000;
/// Samples from a peer waiting to be echoed back to it (one rides on each probe we send it).
pub const ECHO_QUEUE: usize = 4;
/// Our recent probe send stamps remembered per peer, to check echoes.
pub const SENT_RING: usize = 128;
/// Jumps (a pair far off the fit, either way) on the edges to this many
/// distinct peers — and on more than half the peers heard from — within
/// [`OWN_STEP_WINDOW_NS`] mean our own clock jumped (a peer's jump shows on
/// its edge alone) ...
pub const OWN_STEP_PEERS: usize = 2;
/// ... within this long.
pub const OWN_STEP_WINDOW_NS: u64 = 1_000_000_000;
/// A peer further from the reference whose estimate does not derive from
/// ours counts this much of an anchor in the asymmetry vote (a witness: it
/// never feeds our estimate, but its edge to us is one more path).
pub const VOTE_WITNESS: f64 = 0.5;
/// A peer of a node's own level counts this much of an anchor in the asymmetry vote.
pub const VOTE_SAME_LEVEL: f64 = 0.75;
/// Votes (an anchor 1, a peer of the node's level [`VOTE_SAME_LEVEL`], a
/// witness [`VOTE_WITNESS`]) of uncontested peers that agree with each other
/// needed to set aside an anchor (an edge to a peer nearer the reference)
/// that disagrees with them: two other anchors, or three of its level.
pub const OVERRULE_VOTES: f64 = 2.0;
/// Pairs in a row whose two probes both lie far above an edge's fit before
/// the edge counts as jumped (our clock forward, or the peer's back). One
/// such pair is a peer process held off the CPU between stamping its
/// probes and sending them as often as a jumped clock (8 node processes on
/// 2 vCPUs: three false "own steps" in 10 s): until the next pair says
/// which, the node's bound is unknown.
pub const ABOVE_PAIRS: u8 = 2;
/// Agreeing peers of a node's own level needed to outvote all its anchors.
pub const PROMOTE_MIN: usize = 2;
/// Edge slopes beyond this many robust standard deviations from the median
/// are left out of the common slope ...
pub const SLOPE_K: f64 = 5.0;
/// ... and beyond at least this much (0.05 ppm: ≈ 400 ns over half a 16-s
/// window; edges that agree differ by a few hundredths of a ppm once their
/// windows are full), scaled up by the window over the edges' median span
/// while windows fill ...
pub const SLOPE_OUTLIER_MIN: f64 = 5e-8;
/// ... when at least this many edges have a slope.
pub const SLOPE_VOTERS_MIN: usize = 3;
/// Residuals beyond this many robust standard deviations flag an edge as asymmetric.
pub const ASYM_K: f64 = 5.0;
/// ... and beyond at least this many ns.
pub const ASYM_MIN_NS: f64 = 400.0;
/// An edge's floor is judged by its `FLOOR_K`-th lowest sample ...
pub const FLOOR_K: usize = 8;
/// ... the lowest sample taken to sit at most `FLOOR_C` times that sample's
/// height above it over the true floor (see [`crate::envelope::floor_spread`]).
pub const FLOOR_C: f64 = 5.0;
/// A node whose bound is over its limit but within this many times it still
/// measures delays for the deadline (see [`ClockSync::usable`]).
pub const USABLE_FACTOR: u64 = 10;
/// The share of the worst-case tilt of an edge's floor line counted in its bound (see `edge_bound`).
pub const SLOPE_FLOOR_K: f64 = 1.0;
/// Statistical bound: this many residual rms.
pub const BOUND_K: f64 = 3.0;
/// Statistical bound: never below this (software timestamping), ns.
pub const BOUND_FLOOR_NS: f64 = 20.0;
/// An edge's standard deviation is taken as at least this, ns.
pub const EDGE_SIGMA_MIN_NS: f64 = 30.0;
/// Drift uncertainty assumed between updates (0.1 ppm).
pub const DRIFT_UNCERTAINTY: f64 = 1e-7;
/// Drift beyond this is absurd (1,000 ppm).
pub const DRIFT_MAX: f64 = 1e-3;

/// What the node does with its clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SyncMode {
    /// Probe, estimate, and correct the clock (`now_sync`).
    Sync,
    /// Probe and estimate, but trust the system clock (it is disciplined
    /// elsewhere, e.g. PTP); the estimate shows how good it really is.
    MeasureOnly,
    /// No probes; the system clock as it is.
    Off,
}

/// Settings of one node's synchronization.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SyncConfig {
    /// Whether and how it synchronizes.
    pub mode: SyncMode,
    /// A pair to each peer this often in steady state.
    pub interval_ns: u64,
    /// ... and this often during start-up (and after a clock step) ...
    pub startup_interval_ns: u64,
    /// ... for this long, the last `ramp_ns` of it ramping geometrically
    /// from `startup_interval_ns` to `interval_ns`.
    pub startup_ns: u64,
    /// The end of the start-up phase spent ramping (at most `startup_ns`):
    /// without it, a short dense burst and then sparse probes left the drift
    /// line pinned at the burst (docs/RESULTS.md).
    pub ramp_ns: u64,
    /// Spacing of the two probes of a pair.
    pub pair_gap_ns: u64,
    /// A pair whose receive spacing differs from its send spacing by more is impure.
    pub purity_ns: u64,
    /// Only pure pairs feed the envelopes (Huygens' filter). Off by default:
    /// with software timestamps, whose errors only ever add delay, every
    /// probe is an upper bound the lower envelope can use, and the filter
    /// threw away over 90 % of them (see docs/RESULTS.md).
    pub pure_only: bool,
    /// Samples older than this leave the envelopes.
    pub window_ns: u64,
    /// A sample this far below the envelope means a clock stepped.
    pub step_ns: u64,
    /// A node whose bound is above this is unsynchronized for fairness.
    pub bound_limit_ns: u64,
    /// Clock differences beyond this are absurd.
    pub max_skew_ns: u64,
    /// Peers a node probes at full rate in steady state: an edge to a random
    /// peer whose busier end has more peers is probed only every
    /// ⌈peers ÷ budget⌉ intervals (see [`crate::graph::strides`]), so probe
    /// traffic stays a bounded share of a receiver's packets.
    pub peer_budget: usize,
    /// Most pairs per interval on one edge: parent edges above many nodes
    /// are probed up to this often (see [`crate::graph::rates`]); 1: every
    /// edge once. It bounds the sender's probe share, whose edges are probed most.
    pub rate_max: u32,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            mode: SyncMode::Sync,
            interval_ns: 250_000_000,
            startup_interval_ns: 10_000_000,
            startup_ns: 8_000_000_000,
            ramp_ns: 6_000_000_000,
            pair_gap_ns: 20_000,
            purity_ns: 300,
            pure_only: false,
            window_ns: 16_000_000_000,
            step_ns: 20_000,
            bound_limit_ns: 1_000,
            max_skew_ns: 10_000_000_000,
            peer_budget: 6,
            rate_max: 3,
        }
    }
}

impl SyncConfig {
    /// Checks the settings; the error names the bad one.
    pub fn validate(&self) -> Result<(), InvalidSyncConfig> {
        let checks = [
            (self.interval_ns > 0, "interval_ns must be > 0"),
            (self.startup_interval_ns > 0, "startup_interval_ns must be > 0"),
            (self.ramp_ns <= self.startup_ns, "ramp_ns must be at most startup_ns"),
            (self.pair_gap_ns > 0, "pair_gap_ns must be > 0"),
            (
                self.pair_gap_ns < self.startup_interval_ns.min(self.interval_ns),
                "pair_gap_ns must be below the intervals",
            ),
            (self.window_ns >= self.interval_ns, "window_ns must be at least interval_ns"),
            (self.step_ns > 0, "step_ns must be > 0"),
            (self.max_skew_ns > 0, "max_skew_ns must be > 0"),
            (self.peer_budget > 0, "peer_budget must be > 0"),
            ((1..=RATE_MAX_LIMIT).contains(&self.rate_max), "rate_max must be within 1..=16"),
            (
                // Two probes per pair, in steady state: the window must hold them all.
                u64::from(self.rate_max) * 2 * (self.window_ns / self.interval_ns.max(1))
                    <= crate::envelope::WINDOW_SAMPLES_MAX as u64 / 2,
                "window_ns ÷ interval_ns × rate_max × 2 must leave half of WINDOW_SAMPLES_MAX for start-up",
            ),
        ];
        match checks.iter().find(|c| !c.0) {
            Some((_, why)) => Err(InvalidSyncConfig(why)),
            None => Ok(()),
        }
    }
}

/// A clock synchronization setting that cannot work, named with the rule it breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidSyncConfig(pub &'static str);

impl core::fmt::Display for InvalidSyncConfig {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for InvalidSyncConfig {}

/// Why a probe was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeError {
    /// Addressed to another node.
    Misdirected,
    /// From a node that is not one of this node's peers.
    UnknownPeer,
    /// Not newer than the last probe from that peer.
    Replayed,
    /// Fields out of their ranges (index, flags).
    Malformed,
    /// Timestamps or an advertised estimate no real clock produces.
    Absurd,
    /// Synchronization is off on this node.
    Off,
}

impl core::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ProbeError::Misdirected => "probe addressed to another node",
            ProbeError::UnknownPeer => "probe from a node that is not a peer",
            ProbeError::Replayed => "replayed probe",
            ProbeError::Malformed => "malformed probe",
            ProbeError::Absurd => "probe with absurd timestamps",
            ProbeError::Off => "clock synchronization is off",
        })
    }
}

impl std::error::Error for ProbeError {}

/// Counters of refused probes, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Refused {
    /// Addressed to another node.
    pub misdirected: u64,
    /// From a node that is not one of its peers.
    pub unknown_peer: u64,
    /// A sequence already seen (or too old).
    pub replayed: u64,
    /// Not a probe (length, kind, fields).
    pub malformed: u64,
    /// Timestamps or an advertised estimate no real clock produces.
    pub absurd: u64,
    /// Arrived while synchronization is off.
    pub off: u64,
}

impl Refused {
    fn count(&mut self, e: ProbeError) {
        match e {
            ProbeError::Misdirected => self.misdirected += 1,
            ProbeError::UnknownPeer => self.unknown_peer += 1,
            ProbeError::Replayed => self.replayed += 1,
            ProbeError::Malformed => self.malformed += 1,
            ProbeError::Absurd => self.absurd += 1,
            ProbeError::Off => self.off += 1,
        }
    }

    /// Every refused probe.
    pub fn total(&self) -> u64 {
        self.misdirected + self.unknown_peer + self.replayed + self.malformed + self.absurd + self.off
    }
}

/// Named counters and gauges of one node's synchronization.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SyncStats {
    /// Probes it sent.
    pub probes_sent: u64,
    /// Probes it took (refused ones not counted).
    pub probes_received: u64,
    /// Coded probe pairs (two probes sent back to back) received whole.
    pub pairs: u64,
    /// ... of which arrived with the gap they were sent with, within
    /// `purity_ns` (Huygens' pure pairs: neither was queued).
    pub pure_pairs: u64,
    /// Echoes of its own probes taken from its peers' probes (samples of
    /// the reverse direction).
    pub echoes: u64,
    /// Echoes naming a probe it did not send.
    pub bad_echoes: u64,
    /// Probes refused, by reason.
    pub refused: Refused,
    /// Clock steps detected (a peer's or our own), and the last one:
    /// (peer, forward direction?, ns below the envelope).
    pub steps: u64,
    /// The last step detected: (peer, forward direction?, ns below the envelope).
    pub last_step: Option<(u32, bool, i64)>,
    /// Jumps of our own clock (seen on the edges to several peers at once, or announced by the host).
    pub own_steps: u64,
    /// ... of which the host told their size, so the estimate was kept
    /// ([`ClockSync::clock_stepped_by`]).
    pub own_steps_kept: u64,
    /// Updates whose sources' intervals had no common point (one of them
    /// wrong): the bound then spans them all.
    pub inconsistent_updates: u64,
    /// Edges flagged as asymmetric now, and flaggings so far.
    pub asymmetric_edges: u64,
    /// Times an edge was flagged asymmetric so far.
    pub asymmetric_flagged: u64,
    /// Our estimate is contested now (an anchor disagrees with our other
    /// peers; see the module docs).
    pub contested: bool,
    /// Updates whose bound took the hull of a dispute no vote could settle.
    pub unresolved_disputes: u64,
    /// Updates in which peers of the node's own level outvoted all its anchors
    /// and anchored it instead (its only upstream edges were asymmetric).
    pub promotions: u64,
    /// The estimate: our clock minus the reference's, ns, and drift in ppm.
    pub offset_ns: f64,
    /// The estimated drift against the reference, ppm.
    pub drift_ppm: f64,
    /// The error bound published now, ns (the truth is within it).
    pub bound_ns: u64,
    /// The bound that needs no symmetry assumption, ns: half the minimum
    /// round trip summed along the best path to the reference (the bound
    /// is never wider; see the module docs).
    pub hard_bound_ns: u64,
    /// RMS of the fit's residuals over the peers used, ns.
    pub residual_rms_ns: f64,
    /// Peers it probes.
    pub peers: u64,
    /// Peers whose edge is usable now (both directions fitted, peer synchronized).
    pub peers_used: u64,
    /// Whether it has an estimate (a finite bound).
    pub synced: bool,
    /// Bound above the limit now, and how often it went there.
    pub over_limit: bool,
    /// Times the bound went above the limit.
    pub over_limit_events: u64,
    /// Local time of the last estimate update (the raw clock less the steps
    /// of known size: `ClockSync::clock_stepped_by`).
    pub last_update_ns: u64,
}

impl SyncStats {
    /// Share of received pairs that were pure.
    pub fn pure_fraction(&self) -> f64 {
        if self.pairs == 0 {
            0.0
        } else {
            self.pure_pairs as f64 / self.pairs as f64
        }
    }
}

/// What a peer last advertised about its clock.
#[derive(Debug, Clone, Copy)]
struct Advert {
    offset_ns: f64,
    drift: f64,
    bound_ns: f64,
    hard_ns: f64,
    synced: bool,
    /// Its estimate is contested (see [`PROBE_CONTESTED`]).
    contested: bool,
    level: u16,
    /// Our raw time when we heard it.
    at: u64,
}

#[derive(Debug, Clone)]
struct Peer {
    id: u32,
    next_pair: u64,
    /// Last pair received and a mask of its indices seen, for replay refusal.
    last_rx: Option<(u64, u8)>,
    /// The first probe of the pair in progress: (pair, its tx, our rx).
    first: Option<(u64, u64, u64)>,
    /// Samples peer → me (x = our receive time) and me → peer (x = our send time).
    fwd: Envelope,
    rev: Envelope,
    /// The first probe of the pair in progress lay far above the fit.
    first_above: bool,
    /// Pairs in a row with both probes far above the fit.
    above_pairs: u8,
    /// Samples from the peer to echo, oldest first: (its tx, our rx).
    echo: std::collections::VecDeque<(u64, u64)>,
    /// Newest echo taken in (its tx stamp, ours).
    last_echo_tx: u64,
    sent: [u64; SENT_RING],
    sent_next: usize,
    advert: Option<Advert>,
    asymmetric: bool,
    residual_ns: f64,
    /// Our estimate takes this peer as a source (said in our probes to it) ...
    source: bool,
    /// ... and its estimate takes us as one of its sources (said in its probes).
    derives_from_us: bool,
    /// Probed every `stride`-th interval in steady state ...
    stride: u32,
    /// ... `rate` pairs each time (see [`crate::graph::rates`]).
    rate: u32,
}

impl Peer {
    fn new(id: u32) -> Self {
        Peer {
            id,
            stride: 1,
            rate: 1,
            next_pair: 1,
            last_rx: None,
            first: None,
            first_above: false,
            above_pairs: 0,
            fwd: Envelope::default(),
            rev: Envelope::default(),
            echo: std::collections::VecDeque::with_capacity(ECHO_QUEUE),
            last_echo_tx: 0,
            sent: [0; SENT_RING],
            sent_next: 0,
            advert: None,
            asymmetric: false,
            residual_ns: 0.0,
            source: false,
            derives_from_us: false,
        }
    }

    /// θ_me − θ_peer at `x`, its slope (once both directions span
    /// [`SLOPE_SPAN_NS`]), half the min round trip, and the edge's own error
    /// bound (see [`edge_bound`]).
    fn edge(&self, x: u64) -> Option<(f64, Option<f64>, f64, f64)> {
        if self.fwd.len() < MIN_SAMPLES || self.rev.len() < MIN_SAMPLES {
            return None;
        }
        let e = joint_fit(&self.fwd, &self.rev, 2.0 * DRIFT_MAX)?;
        let slope = (self.fwd.span().min(self.rev.span()) >= SLOPE_SPAN_NS).then_some(e.slope);
        Some((e.delta_at(x), slope, e.delay.max(0.0), edge_bound(&self.fwd, &self.rev, e.slope, x)))
    }

    /// What the peer's probe says about its clock (and whether it derives from us).
    fn heard(&mut self, now: u64, p: &ProbeRepr) {
        let finite = |v: u64| if v == u64::MAX { f64::INFINITY } else { v as f64 };
        self.derives_from_us = p.flags & PROBE_ANCHORED != 0;
        self.advert = Some(Advert {
            offset_ns: p.offset_ps as f64 / 1e3,
            drift: p.drift_e15 as f64 * 1e-15,
            bound_ns: finite(p.bound_ns),
            hard_ns: finite(p.hard_bound_ns),
            synced: p.flags & PROBE_SYNCED != 0,
            contested: p.flags & PROBE_CONTESTED != 0,
            level: p.level,
            at: now,
        });
    }

    /// The echo a probe carries: a sample of our probe to the peer, me →
    /// peer, into the reverse window. True when it shows a step.
    fn take_echo(&mut self, p: &ProbeRepr, cfg: &SyncConfig, stats: &mut SyncStats) -> bool {
        if p.echo_tx_ns == 0 || p.echo_tx_ns <= self.last_echo_tx {
            return false;
        }
        if !self.sent.contains(&p.echo_tx_ns) {
            stats.bad_echoes += 1;
            return false;
        }
        self.last_echo_tx = p.echo_tx_ns;
        let y = p.echo_rx_ns as i64 - p.echo_tx_ns as i64;
        stats.echoes += 1;
        if let Offer::Step(b) = self.rev.offer(p.echo_tx_ns, y, cfg.window_ns, cfg.step_ns, STEP_SAMPLES) {
            stats.last_step = Some((self.id, false, b));
            return true;
        }
        false
    }

    /// A probe of index `index` lay far above the fit (`above`): (the edge
    /// jumped — [`ABOVE_PAIRS`] whole pairs in a row far above; the pair sat
    /// on its fit; this pair alone lay far above).
    fn pair_above(&mut self, index: u8, above: bool) -> (bool, bool, bool) {
        if index == 0 {
            self.first_above = above;
            return (false, false, false);
        }
        let first = std::mem::take(&mut self.first_above);
        let both = above && first;
        self.above_pairs = if both { self.above_pairs.saturating_add(1) } else { 0 };
        let quiet = !above && !first && self.fwd.fit(STEP_SAMPLES).is_some();
        (both && self.above_pairs >= ABOVE_PAIRS, quiet, both)
    }

    fn reset(&mut self) {
        self.fwd.clear();
        self.rev.clear();
        self.echo.clear();
        self.first = None;
        self.first_above = false;
        self.above_pairs = 0;
        self.asymmetric = false;
        // Echoes of probes sent before the jump would carry the old clocks'
        // relation into the fresh window (after a step back, below every new
        // sample: the envelope kept them and the node sat 1 ms off): forget
        // what we sent, and accept echoes of what we send from now on, even
        // with stamps below the old ones.
        self.sent = [0; SENT_RING];
        self.last_echo_tx = 0;
    }
}

/// What the asymmetry vote says of our anchors (see `flag_asymmetric`).
#[derive(Debug, Clone, Copy)]
struct Dispute {
    /// An anchor stands out from the votes: our estimate is contested.
    disputed: bool,
    /// ... and it is still in use: only the hull of the candidates is sure.
    unresolved: bool,
}

/// One candidate estimate from one peer.
struct Candidate {
    peer: usize,
    level: u16,
    theta: f64,
    /// The peer's own estimate, extrapolated to now.
    theta_peer: f64,
    slope: Option<f64>,
    weight: f64,
    /// How far `theta` may be from the truth: the peer's own bound plus the edge's.
    bound: f64,
    hard: f64,
    /// The peer says its estimate is contested: it cannot help set aside an anchor.
    contested: bool,
}

/// One node's clock synchronization.
#[derive(Debug, Clone)]
pub struct ClockSync {
    /// Its node id.
    pub id: u32,
    cfg: SyncConfig,
    reference: bool,
    peers: Vec<Peer>,
    started: Option<u64>,
    fast_until: u64,
    next_round: u64,
    /// The slot of the round the next probe goes in.
    next_peer: usize,
    /// Steady state: each peer `rate` times per round, spread evenly.
    schedule: Vec<usize>,
    /// Intervals begun (each peer's turn comes once per interval).
    round: u64,
    /// Second probes of pairs waiting to go: (due, peer index, pair, first tx).
    seconds: Vec<(u64, usize, u64)>,
    offset_ns: f64,
    drift: f64,
    at: u64,
    bound_ns: f64,
    hard_ns: f64,
    last_rms: f64,
    synced: bool,
    synced_since: Option<u64>,
    /// How fast the bound grows after an update: [`DRIFT_UNCERTAINTY`], or
    /// [`DRIFT_MAX`] while no edge has a slope yet.
    drift_unc: f64,
    /// Recent jumps seen on our edges: (raw time, peer), newest last.
    jumps: std::collections::VecDeque<(u64, u32)>,
    /// A jump was seen on one edge and no other peer's pair has yet shown
    /// that our own clock held: our bound is unknown meanwhile.
    suspect: bool,
    /// Probe hops from the reference (`u16::MAX` while unsynchronized).
    level: u16,
    /// Our estimate is contested (see [`PROBE_CONTESTED`]): said in our probes.
    contested: bool,
    /// `SyncMode::Off` on a host whose clock daemon publishes its error
    /// estimate: that bound, ns (`u64::MAX`: the daemon is unsynchronized).
    host_bound: Option<u64>,
    /// The steps of our raw clock whose size we were told, summed (new −
    /// old, ns). Inside, every time is on the raw clock less this — a
    /// timescale with no step in it: neither our windows nor our peers' see
    /// one; only the public calls convert.
    moved: i64,
    /// How far off those sizes may be, and until when (inside time): the
    /// windows hold samples from before the last step until then, and the
    /// bound says so.
    step_slack: (u64, f64),
    /// Its counters and its estimate now.
    pub stats: SyncStats,
}

impl ClockSync {
    /// A node `id` probing `peers`; `reference` makes its clock the reference.
    pub fn new(id: u32, peers: &[u32], reference: bool, cfg: SyncConfig) -> Self {
        assert!(peers.len() <= PEERS_MAX, "at most {PEERS_MAX} peers");
        let mut ids: Vec<u32> = peers.iter().copied().filter(|&p| p != id).collect();
        ids.sort_unstable();
        ids.dedup();
        let stats = SyncStats { peers: ids.len() as u64, synced: reference, ..SyncStats::default() };
        let mut c = ClockSync {
            id,
            cfg,
            reference,
            peers: ids.into_iter().map(Peer::new).collect(),
            started: None,
            fast_until: 0,
            next_round: 0,
            next_peer: 0,
            schedule: Vec::new(),
            round: 0,
            seconds: Vec::new(),
            offset_ns: 0.0,
            drift: 0.0,
            at: 0,
            bound_ns: if reference { 0.0 } else { f64::INFINITY },
            hard_ns: if reference { 0.0 } else { f64::INFINITY },
            last_rms: 0.0,
            synced: reference,
            synced_since: None,
            level: if reference { 0 } else { u16::MAX },
            contested: false,
            jumps: std::collections::VecDeque::new(),
            drift_unc: DRIFT_UNCERTAINTY,
            suspect: false,
            host_bound: None,
            moved: 0,
            step_slack: (0, 0.0),
            stats,
        };
        c.reschedule();
        c
    }

    /// Probes peer `id` `rate` pairs per interval in steady state (capped at
    /// `rate_max`; see [`crate::graph::rates`]). Unknown peers are ignored.
    pub fn set_rates(&mut self, rates: &[(u32, u32)]) {
        let max = self.cfg.rate_max.max(1);
        for &(id, rate) in rates {
            if let Some(p) = self.peers.iter_mut().find(|p| p.id == id) {
                p.rate = rate.clamp(1, max);
            }
        }
        self.reschedule();
    }

    /// The peers change (a controller moved the node, or its neighbours):
    /// edges to peers still named keep everything they have learnt; new ones
    /// start empty and are probed at the start-up pace for a while, as at
    /// start; edges to peers no longer named are dropped (their probes are
    /// refused from now on, `unknown_peer`). At most [`PEERS_MAX`], the
    /// lowest ids kept. Strides and rates of new peers are 1; `now` is raw.
    pub fn set_peers(&mut self, now: u64, peers: &[u32]) {
        let mut ids: Vec<u32> = peers.iter().copied().filter(|&p| p != self.id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.truncate(PEERS_MAX);
        if ids.iter().eq(self.peers.iter().map(|p| &p.id)) {
            return;
        }
        let mut old = std::mem::take(&mut self.peers);
        let mut added = false;
        for id in ids {
            match old.iter().position(|p| p.id == id) {
                Some(i) => self.peers.push(old.swap_remove(i)),
                None => {
                    self.peers.push(Peer::new(id));
                    added = true;
                }
            }
        }
        // Pairs in flight name peers by index: let them go (a half pair is impure anyway).
        self.seconds.clear();
        self.next_peer = 0;
        self.stats.peers = self.peers.len() as u64;
        self.reschedule();
        if added && self.started.is_some() {
            let now = self.inside(now);
            self.fast_until = self.fast_until.max(now + self.cfg.startup_ns);
            self.next_round = self.next_round.min(now + self.cfg.startup_interval_ns);
        }
    }

    /// The steady-state round: peer `p`'s k-th turn at k ÷ rate of the way
    /// through it (ties by peer order, so all rates 1 is the plain order).
    fn reschedule(&mut self) {
        let mut slots: Vec<(u64, usize)> = Vec::new();
        for (i, p) in self.peers.iter().enumerate() {
            let r = u64::from(p.rate.max(1));
            slots.extend((0..r).map(|k| (k * (1 << 32) / r, i)));
        }
        slots.sort_unstable();
        self.schedule = slots.into_iter().map(|s| s.1).collect();
    }

    /// Probes peer `id` only every `stride`-th interval in steady state (the
    /// start-up phase probes every peer every interval); see
    /// [`crate::graph::strides`]. Unknown peers are ignored.
    pub fn set_strides(&mut self, strides: &[(u32, u32)]) {
        for &(id, stride) in strides {
            if let Some(p) = self.peers.iter_mut().find(|p| p.id == id) {
                p.stride = stride.max(1);
            }
        }
    }

    /// Synchronization that does nothing (the system clock as it is).
    pub fn off(id: u32) -> Self {
        ClockSync::new(id, &[], true, SyncConfig { mode: SyncMode::Off, ..SyncConfig::default() })
    }

    /// Its settings.
    pub fn config(&self) -> &SyncConfig {
        &self.cfg
    }

    /// Whether it is the reference clock (the root: never corrected).
    pub fn is_reference(&self) -> bool {
        self.reference
    }

    /// The peers this node probes.
    pub fn peer_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.peers.iter().map(|p| p.id)
    }

    /// The estimated offset of our raw clock against the reference at raw time `x`, ns.
    pub fn offset_at(&self, x: u64) -> f64 {
        self.offset_in(self.inside(x)) + self.moved as f64
    }

    /// The offset at inside time `x` (the raw clock less the steps of known size).
    fn offset_in(&self, x: u64) -> f64 {
        self.offset_ns + self.drift * (x as f64 - self.at as f64)
    }

    /// Inside time (see `moved`) at raw time `raw`.
    fn inside(&self, raw: u64) -> u64 {
        if raw == u64::MAX {
            raw
        } else {
            raw.saturating_add_signed(self.moved.saturating_neg())
        }
    }

    /// Raw time at inside time `x`.
    fn outside(&self, x: u64) -> u64 {
        if x == u64::MAX {
            x
        } else {
            x.saturating_add_signed(self.moved).min(u64::MAX - 1)
        }
    }

    /// The synchronized clock at raw time `local`.
    pub fn now_sync(&self, local: u64) -> u64 {
        if self.cfg.mode != SyncMode::Sync {
            return local;
        }
        // The reference's timescale is its raw clock less the steps it was told of.
        let x = self.inside(local);
        if self.reference {
            return x;
        }
        self.sync_in(x)
    }

    /// The synchronized clock at inside time `x`.
    fn sync_in(&self, x: u64) -> u64 {
        (x as f64 - self.offset_in(x)).round().max(0.0) as u64
    }

    /// The raw time at which the synchronized clock reads `sync`: the first
    /// raw time whose synchronized reading is at or after it (a timer due a
    /// nanosecond early would be re-armed at the same instant for ever).
    pub fn to_local(&self, sync: u64) -> u64 {
        if self.cfg.mode != SyncMode::Sync || sync == u64::MAX {
            return sync;
        }
        if self.reference {
            return self.outside(sync);
        }
        self.outside(self.to_inside(sync))
    }

    /// The inside time at which the synchronized clock reads `sync`.
    fn to_inside(&self, sync: u64) -> u64 {
        // now_sync(x) = x − offset − drift·(x − at) = sync, solved for x in
        // small numbers (absolute ns lose precision in f64). A fixed-point
        // iteration converges by a factor of `drift` per step: two steps left
        // 4 ns at 5.6 ms and 856 ppm, past the final correction's reach.
        let since = (sync as f64 - self.at as f64 + self.offset_ns) / (1.0 - self.drift);
        let x = self.at as f64 + since;
        let mut local = if x.is_finite() { x.round().clamp(0.0, (u64::MAX - 1) as f64) as u64 } else { sync };
        // Rounding lands a few ns either side: step up to the first raw time
        // that reads at or after `sync`, then back while the one before does too.
        let mut step = 1u64;
        while self.sync_in(local) < sync && local < u64::MAX - 1 {
            local = local.saturating_add(step).min(u64::MAX - 1);
            step = step.saturating_mul(2);
        }
        let mut step = 1u64;
        while step > 0 {
            if local >= step && self.sync_in(local - step) >= sync {
                local -= step;
                step = step.saturating_mul(2);
            } else {
                step /= 2;
            }
        }
        local
    }

    /// A clock left to the host (`SyncMode::Off`) whose daemon publishes its
    /// error estimate (chrony's, `fairfeed_io::hostclock`): that bound is this
    /// node's from now on (`u64::MAX`: the daemon is not synchronized, the
    /// node over any limit). Counted like the node's own bound going over.
    pub fn set_host_bound(&mut self, bound_ns: u64) {
        if self.cfg.mode != SyncMode::Off {
            return;
        }
        self.host_bound = Some(bound_ns);
        let over = bound_ns > self.cfg.bound_limit_ns;
        if over && !self.stats.over_limit {
            self.stats.over_limit_events += 1;
        }
        self.stats.over_limit = over;
        self.stats.bound_ns = bound_ns;
        self.stats.synced = bound_ns != u64::MAX;
    }

    /// The host daemon's bound, when one is read (see [`ClockSync::set_host_bound`]).
    pub fn host_bound(&self) -> Option<u64> {
        self.host_bound
    }

    /// The statistical error bound at raw time `local`, ns (`u64::MAX` before any estimate).
    pub fn bound_ns(&self, local: u64) -> u64 {
        self.bound_in(self.inside(local))
    }

    /// The bound at inside time `local`.
    fn bound_in(&self, local: u64) -> u64 {
        if self.cfg.mode == SyncMode::Off {
            return self.host_bound.unwrap_or(0);
        }
        if self.reference {
            return self.step_slack_at(local).ceil() as u64;
        }
        if self.suspect {
            return u64::MAX;
        }
        let b = self.bound_ns + self.drift_unc * local.saturating_sub(self.at) as f64;
        if b.is_finite() {
            b.ceil() as u64
        } else {
            u64::MAX
        }
    }

    /// True while the estimate is usable and its bound within the limit.
    pub fn within_limit(&self, local: u64) -> bool {
        self.within_in(self.inside(local))
    }

    fn within_in(&self, local: u64) -> bool {
        if self.cfg.mode == SyncMode::Off {
            return self.host_bound.is_none_or(|b| b <= self.cfg.bound_limit_ns);
        }
        self.synced && !self.suspect && self.bound_in(local) <= self.cfg.bound_limit_ns
    }

    /// True while the bound is within [`USABLE_FACTOR`] × the limit, over
    /// the fairness limit or not: good enough to measure delays with, the
    /// bound said alongside (a feed's deadline covers it). Beyond that a
    /// node is left out of the deadline as well: one receiver's 300-µs bound
    /// would have held every message 300 µs longer.
    pub fn usable(&self, local: u64) -> bool {
        let cap = self.cfg.bound_limit_ns.saturating_mul(USABLE_FACTOR);
        if self.cfg.mode == SyncMode::Off {
            return self.host_bound.is_none_or(|b| b <= cap);
        }
        self.synced && self.bound_ns(local) <= cap
    }

    /// When something is due next (raw time); `None`: never.
    pub fn next_timeout(&self) -> Option<u64> {
        if self.cfg.mode == SyncMode::Off || self.peers.is_empty() {
            return None;
        }
        let inside = self.seconds.iter().map(|s| s.0).min().map_or(self.next_round, |s| s.min(self.next_round));
        Some(self.outside(inside)).filter(|&t| t != u64::MAX)
    }

    /// The probing interval at `now`: `startup_interval_ns` during start-up,
    /// its last `ramp_ns` ramping geometrically to `interval_ns`, so the
    /// first estimate comes fast and the drift is fitted over the whole
    /// phase — a short dense burst then sparse probes left the line pinned
    /// at the burst, its slope error growing with the distance (a p99 bump
    /// to ≈ 120 ns some seconds after it, docs/RESULTS.md).
    fn interval(&self, now: u64) -> u64 {
        let (fast, slow) = (self.cfg.startup_interval_ns, self.cfg.interval_ns);
        let ramp_from = self.fast_until.saturating_sub(self.cfg.ramp_ns);
        if now < ramp_from {
            return fast;
        }
        if now >= self.fast_until || fast >= slow {
            return slow;
        }
        let left = (self.fast_until - now) as f64 / self.cfg.ramp_ns.max(1) as f64;
        let ramp = (slow as f64 / fast as f64).powf(1.0 - left.clamp(0.0, 1.0));
        // Whole microseconds: the same schedule wherever it runs.
        ((fast as f64 * ramp / 1e3).round() as u64 * 1_000).clamp(fast, slow)
    }

    /// Sends what is due (`send(to, probe)`) and updates the estimate each round.
    pub fn handle_timeout(&mut self, now: u64, send: &mut dyn FnMut(u32, &ProbeRepr)) {
        if self.cfg.mode == SyncMode::Off || self.peers.is_empty() {
            return;
        }
        // Probes carry inside time: a step of known size never shows on the wire.
        let now = self.inside(now);
        if self.started.is_none() {
            self.started = Some(now);
            self.fast_until = now + self.cfg.startup_ns;
            self.next_round = now;
        }
        let mut i = 0;
        while i < self.seconds.len() {
            if self.seconds[i].0 <= now {
                let (_, p, pair) = self.seconds.swap_remove(i);
                self.send_probe(now, p, pair, 1, send);
            } else {
                i += 1;
            }
        }
        if now >= self.next_round {
            // One peer per slot, the slots spread over the interval: a node
            // with many peers must not queue its own probes behind each other
            // (a pair whose second probe waits behind the first probes to
            // other peers is impure).
            // Start-up: every peer once per (short) interval; then the schedule.
            let fast = now < self.fast_until;
            let n = if fast { self.peers.len() } else { self.schedule.len() };
            let k = self.next_peer % n;
            self.next_peer = (k + 1) % n;
            let p = if fast { k } else { self.schedule[k] };
            if k == 0 {
                self.round += 1;
                self.update(now);
            }
            let stride = if fast { 1 } else { u64::from(self.peers[p].stride) };
            if self.round % stride == 0 {
                let pair = self.peers[p].next_pair;
                self.peers[p].next_pair += 1;
                self.send_probe(now, p, pair, 0, send);
                self.seconds.push((now + self.cfg.pair_gap_ns, p, pair));
            }
            let slot = (self.interval(now) / n as u64).max(self.cfg.pair_gap_ns * 2);
            self.next_round = now + slot;
        }
    }

    fn send_probe(&mut self, now: u64, p: usize, pair: u64, index: u8, send: &mut dyn FnMut(u32, &ProbeRepr)) {
        let off = self.offset_in(now);
        let peer = &mut self.peers[p];
        let (echo_tx_ns, echo_rx_ns) = peer.echo.pop_front().unwrap_or((0, 0));
        peer.sent[peer.sent_next % SENT_RING] = now;
        peer.sent_next += 1;
        let finite = |v: f64| if v.is_finite() { v.ceil() as u64 } else { u64::MAX };
        let probe = ProbeRepr {
            target: peer.id,
            index,
            // While suspect (a jump seen, not yet judged) our bound is
            // unknown, and so is what we advertise: nobody takes our
            // estimate on trust meanwhile.
            flags: if self.synced && !self.suspect { PROBE_SYNCED } else { 0 }
                | if peer.source { PROBE_ANCHORED } else { 0 }
                | if self.contested { PROBE_CONTESTED } else { 0 },
            level: self.level,
            pair,
            tx_ns: now,
            echo_tx_ns,
            echo_rx_ns,
            offset_ps: (off * 1e3).round() as i64,
            drift_e15: (self.drift * 1e15).round() as i64,
            bound_ns: if self.suspect { u64::MAX } else { finite(self.bound_ns) },
            hard_bound_ns: if self.suspect { u64::MAX } else { finite(self.hard_ns) },
        };
        self.stats.probes_sent += 1;
        send(peer.id, &probe);
    }

    /// A probe from node `from` arrived at raw time `now`.
    pub fn handle_probe(&mut self, now: u64, from: u32, p: &ProbeRepr) -> Result<(), ProbeError> {
        let now = self.inside(now);
        let r = self.admit(now, from, p);
        match r {
            Ok(i) => {
                self.stats.probes_received += 1;
                self.take(now, i, p);
                Ok(())
            }
            Err(e) => {
                self.stats.refused.count(e);
                Err(e)
            }
        }
    }

    fn admit(&self, now: u64, from: u32, p: &ProbeRepr) -> Result<usize, ProbeError> {
        if self.cfg.mode == SyncMode::Off {
            return Err(ProbeError::Off);
        }
        if p.target != self.id {
            return Err(ProbeError::Misdirected);
        }
        let i = self.peers.binary_search_by_key(&from, |q| q.id).map_err(|_| ProbeError::UnknownPeer)?;
        if p.index > 1 || p.flags & !PROBE_FLAGS != 0 || p.pair == 0 {
            return Err(ProbeError::Malformed);
        }
        if let Some((pair, mask)) = self.peers[i].last_rx {
            if p.pair < pair || (p.pair == pair && mask & (1 << p.index) != 0) {
                return Err(ProbeError::Replayed);
            }
        }
        let skew = self.cfg.max_skew_ns as i128;
        let absurd = (i128::from(now) - i128::from(p.tx_ns)).abs() > skew
            || (p.echo_tx_ns != 0 && (i128::from(p.echo_rx_ns) - i128::from(p.echo_tx_ns)).abs() > skew)
            || i128::from(p.offset_ps).abs() > skew * 1000
            || (p.drift_e15 as f64 * 1e-15).abs() > DRIFT_MAX;
        if absurd {
            return Err(ProbeError::Absurd);
        }
        Ok(i)
    }

    fn take(&mut self, now: u64, i: usize, p: &ProbeRepr) {
        let cfg = self.cfg;
        let ClockSync { peers, stats, .. } = self;
        let peer = &mut peers[i];
        peer.last_rx = Some(match peer.last_rx {
            Some((pair, mask)) if pair == p.pair => (pair, mask | 1 << p.index),
            _ => (p.pair, 1 << p.index),
        });
        peer.heard(now, p);
        let mut stepped = peer.take_echo(p, &cfg, stats);
        // The probe: peer → me. Its pair tells whether it met queueing (purity).
        let y = now as i64 - p.tx_ns as i64;
        // Both probes of a pair far above the fit: our clock jumped forward
        // or the peer's back (a down-jump shows below the fit, as a step).
        let above = peer.fwd.far_above(now, y, cfg.step_ns, STEP_SAMPLES);
        let (mut jumped, quiet, lifted) = peer.pair_above(p.index, above);
        if lifted && !jumped && !self.reference {
            // A stalled sender or a jumped clock: unknown until the next pair.
            self.suspect = true;
        }
        let mut sample: Option<(u64, i64, u64)> = (!cfg.pure_only).then_some((now, y, p.tx_ns));
        match (p.index, peer.first) {
            (0, _) => peer.first = Some((p.pair, p.tx_ns, now)),
            (1, Some((pair, tx0, rx0))) if pair == p.pair => {
                peer.first = None;
                stats.pairs += 1;
                let tx_gap = p.tx_ns as i64 - tx0 as i64;
                let rx_gap = now as i64 - rx0 as i64;
                if (rx_gap - tx_gap).unsigned_abs() <= cfg.purity_ns && tx_gap > 0 {
                    stats.pure_pairs += 1;
                    if cfg.pure_only {
                        // The pair's lower sample.
                        let y0 = rx0 as i64 - tx0 as i64;
                        sample = Some(if y0 <= y { (rx0, y0, tx0) } else { (now, y, p.tx_ns) });
                    }
                }
            }
            _ => peer.first = None,
        }
        if let Some((x, y, tx)) = sample {
            if peer.echo.len() == ECHO_QUEUE {
                peer.echo.pop_front();
            }
            peer.echo.push_back((tx, x));
            if let Offer::Step(b) = peer.fwd.offer(x, y, cfg.window_ns, cfg.step_ns, STEP_SAMPLES) {
                stepped = true;
                stats.last_step = Some((peer.id, true, b));
            }
        }
        if stepped {
            // One of the two clocks jumped: start this edge afresh, probing fast.
            stats.steps += 1;
            peer.reset();
            self.fast_until = now + cfg.startup_ns;
            self.next_round = self.next_round.min(now + cfg.startup_interval_ns);
            jumped = true;
        }
        if jumped {
            // A jump up: this edge's floor is as stale as after a step down.
            peer.reset();
            let id = peer.id;
            self.jumped(now, id);
        } else if quiet && !stepped && self.suspect && self.jumps.iter().all(|j| j.1 != peer.id) {
            // A whole pair from another peer on its fit: our clock held, the
            // jump was the other peer's.
            self.suspect = false;
            self.jumps.clear();
        }
    }

    /// A jump on the edge to `peer` (its edge reset). One edge alone: that
    /// peer's clock, and the
    /// estimate is recomputed at once without it. Edges to
    /// [`OWN_STEP_PEERS`] peers, and to more than half those heard from,
    /// within [`OWN_STEP_WINDOW_NS`] (or our only peer): our own clock
    /// jumped — every edge restarts, and until they have refitted we are
    /// unsynchronized, the bound unknown. Waiting for
    /// the next round instead left a stepped node releasing 1 ms off under a
    /// 100-ns bound for 400 ms in the simulator.
    fn jumped(&mut self, now: u64, peer: u32) {
        while self.jumps.front().is_some_and(|j| now.saturating_sub(j.0) > OWN_STEP_WINDOW_NS) {
            self.jumps.pop_front();
        }
        self.jumps.retain(|j| j.1 != peer);
        self.jumps.push_back((now, peer));
        if self.reference {
            return;
        }
        self.suspect = true;
        // Our own jump shows on every edge; another node's on its edge
        // alone. When a share of the nodes steps at once, two of our peers
        // may be among them: more than half the peers we hear from must
        // show it (a level-1 node probing four siblings took two of them
        // stepping for its own step, and restarted for nothing).
        let heard = self
            .peers
            .iter()
            .filter(|p| p.advert.is_some_and(|a| now.saturating_sub(a.at) <= OWN_STEP_WINDOW_NS))
            .count();
        if self.jumps.len() >= OWN_STEP_PEERS.max(heard / 2 + 1).min(self.peers.len()) {
            self.own_step(now);
        }
        self.update(now);
    }

    /// Our own clock was stepped: the host said so (a daemon's
    /// `clock_settime`, seen by a `TFD_TIMER_CANCEL_ON_SET` timer), or the
    /// edges to several peers jumped at once. Every edge restarts and we are
    /// unsynchronized, the bound unknown, until they have refitted (a few
    /// start-up intervals).
    pub fn clock_stepped(&mut self, now: u64) {
        if self.cfg.mode == SyncMode::Off || self.reference {
            return;
        }
        let now = self.inside(now);
        self.own_step(now);
        self.update(now);
    }

    /// Our own clock was stepped by `delta_ns` (its reading after the step
    /// minus the reading it would have had), known to within
    /// `uncertainty_ns`: the host measured it — CLOCK_REALTIME against
    /// CLOCK_MONOTONIC, which no step moves
    /// (`fairfeed_io::clock::HostStepWatch`) — or a test injected it. `now`
    /// is a reading after the step. The estimate is kept: inside, the node
    /// runs on its raw clock less every step of known size, a timescale with
    /// no step in it, so neither its windows nor its peers' (its probes'
    /// stamps are inside time) see one; only the public calls convert. That
    /// timescale may itself have moved by the uncertainty, so the bound grows
    /// by it until every sample taken before the step has left the windows
    /// (`window_ns`). A size known no better than `step_ns`: as
    /// [`ClockSync::clock_stepped`]. The reference keeps its timescale the
    /// same way and says its bound is the uncertainty meanwhile.
    pub fn clock_stepped_by(&mut self, now: u64, delta_ns: i64, uncertainty_ns: u64) {
        if self.cfg.mode == SyncMode::Off {
            return;
        }
        if uncertainty_ns > self.cfg.step_ns {
            // Known no better than a jump would show: as a step of unknown
            // size (the reference's clock is then the timescale, as it is).
            self.clock_stepped(now);
            return;
        }
        self.moved = self.moved.saturating_add(delta_ns);
        let x = self.inside(now);
        let u = uncertainty_ns as f64;
        self.step_slack = (x.saturating_add(self.cfg.window_ns), self.step_slack_at(x) + u);
        if self.reference {
            (self.bound_ns, self.hard_ns) = (self.step_slack.1, self.step_slack.1);
        } else {
            self.bound_ns += u;
            self.hard_ns += u;
        }
        self.stats.own_steps += 1;
        self.stats.own_steps_kept += 1;
        self.refresh_stats(x, self.stats.peers_used as usize, self.last_rms);
    }

    fn own_step(&mut self, now: u64) {
        self.jumps.clear();
        self.suspect = false;
        self.step_slack = (0, 0.0);
        self.stats.own_steps += 1;
        for p in &mut self.peers {
            p.reset();
        }
        // The estimate was of the clock before the jump: nothing is known now.
        self.synced = false;
        self.synced_since = None;
        self.level = u16::MAX;
        self.bound_ns = f64::INFINITY;
        self.fast_until = now + self.cfg.startup_ns;
        self.next_round = self.next_round.min(now + self.cfg.startup_interval_ns);
    }

    /// Recomputes the estimate from the peers (at inside time `now`); called each round.
    fn update(&mut self, now: u64) {
        self.stats.last_update_ns = now;
        if self.reference {
            // After a step of known size, the timescale's own uncertainty for a window.
            let b = self.step_slack_at(now);
            (self.bound_ns, self.hard_ns) = (b, b);
        }
        if self.reference || self.cfg.mode == SyncMode::Off {
            self.refresh_stats(now, 0, 0.0);
            return;
        }
        let mut cands = self.candidates(now);
        if cands.is_empty() {
            // Nothing to go on: keep extrapolating, but say so.
            self.synced = false;
            self.synced_since = None;
            self.level = u16::MAX;
            self.bound_ns = f64::INFINITY;
            self.refresh_stats(now, 0, 0.0);
            return;
        }
        // Level order: our estimate comes from peers nearer the reference,
        // so no estimate feeds back into itself around a loop.
        let up = cands.iter().map(|c| c.level).min().unwrap_or(u16::MAX);
        let level = up.saturating_add(1);
        // Peers up to our own level are judged (those below may derive from
        // us); those below that say they do not are witnesses in the vote.
        let witnesses: Vec<Candidate> = {
            let (keep, below): (Vec<Candidate>, Vec<Candidate>) = cands.into_iter().partition(|c| c.level <= level);
            cands = keep;
            below.into_iter().filter(|c| !self.peers[c.peer].derives_from_us).collect()
        };
        // The common slope first, and every edge's height on it: an edge is
        // judged by where its floor lies on the slope the others agree on,
        // not on its own (in the simulator an edge whose own line crossed the
        // others' near `now` with a slope 1.4 ppm off looked fine judged on
        // it, was unflagged, and its slope moved every edge's height; see
        // `common_slope`).
        let (slope, slope_err) = self.common_slope(&mut cands, level, now);
        // No edge has spanned long enough for a slope: the drift is not
        // known, and between updates the clock may run off at any legal rate.
        self.drift_unc = if slope_err.is_nan() { DRIFT_MAX } else { DRIFT_UNCERTAINTY };
        let slope_err = if slope_err.is_nan() { 0.0 } else { slope_err };
        let settled = self.synced_since.is_some_and(|s| now.saturating_sub(s) >= FLAG_AFTER_NS);
        let dispute = self.flag_asymmetric(&cands, &witnesses, level, settled);
        let level = self.anchor_level(&cands, level);
        // Same-level peers count at a lower weight: each is anchored upstream
        // by its own paths, so they correct one poor upstream edge without
        // letting a loop float free.
        for c in cands.iter_mut() {
            if c.level == level {
                c.weight *= SAME_LEVEL_WEIGHT;
            }
        }
        let used: Vec<&Candidate> = cands.iter().filter(|c| !self.peers[c.peer].asymmetric).collect();
        for p in &mut self.peers {
            p.source = false;
        }
        if !used.iter().any(|c| c.level < level) {
            self.synced = false;
            self.synced_since = None;
            self.level = u16::MAX;
            self.bound_ns = f64::INFINITY;
            self.refresh_stats(now, 0, 0.0);
            return;
        }
        self.level = level;
        for c in &used {
            self.peers[c.peer].source = true;
        }
        // Contested: an anchor of ours disagrees with our other peers. (Not
        // passed down to the nodes that derive from us: at N = 1,000 with a
        // twentieth of the links asymmetric that tainted four nodes in five,
        // and nothing could be corrected any more.)
        self.contested = dispute.disputed;
        let w: f64 = used.iter().map(|c| c.weight).sum();
        let theta = used.iter().map(|c| c.weight * c.theta).sum::<f64>() / w;
        let rms = (used.iter().map(|c| c.weight * (c.theta - theta).powi(2)).sum::<f64>() / w).sqrt();
        for c in &cands {
            self.peers[c.peer].residual_ns = theta - c.theta;
        }
        self.offset_ns = theta;
        self.drift = slope.clamp(-DRIFT_MAX, DRIFT_MAX);
        self.at = now;
        let (bound, hard) = self.bound_of(&cands, &used, theta, (BOUND_K * rms, BOUND_K * slope_err), dispute);
        let slack = self.step_slack_at(now);
        (self.bound_ns, self.hard_ns) = (bound + slack, hard + slack);
        self.last_rms = rms;
        self.synced = true;
        self.synced_since.get_or_insert(now);
        let n = used.len();
        self.refresh_stats(now, n, rms);
    }

    /// Our bound (and our symmetry-free bound) for the estimate `theta` from
    /// the `used` candidates; `(residuals, slope)`: what the residuals and
    /// the common slope's error ask for.
    fn bound_of(
        &mut self,
        cands: &[Candidate],
        used: &[&Candidate],
        theta: f64,
        (residuals, slope): (f64, f64),
        dispute: Dispute,
    ) -> (f64, f64) {
        // An unresolved dispute: the truth may lie with any of them — but
        // for those whose estimates take ours in (peers of our own level
        // using us at half weight): their bounds hold ours, and a hull over
        // them fed each other's bounds back round the loop (6.9 ms bounds).
        self.stats.unresolved_disputes += u64::from(dispute.unresolved);
        let disputed: Vec<&Candidate> = if dispute.unresolved {
            cands.iter().filter(|c| !self.peers[c.peer].derives_from_us).collect()
        } else {
            Vec::new()
        };
        let (spread, consistent) = combined_bound(used, theta, &disputed);
        self.stats.inconsistent_updates += u64::from(!consistent);
        // Never wider than what needs no symmetry at all: half the minimum
        // round trip along a path to the reference, plus how far our
        // estimate is from that path's candidate — what we advertise as our
        // hard bound, so it holds by induction (the path's bound alone
        // does not: the estimate is a mean over several paths). Hulls over
        // loops of peers of one level once fed each other's bounds to
        // milliseconds.
        let hard = used.iter().map(|c| (c.theta - theta).abs() + c.hard).fold(f64::INFINITY, f64::min);
        ((BOUND_FLOOR_NS + spread.max(residuals) + slope).min(hard), hard)
    }

    /// How far the stepless timescale may have moved at inside time `x`: the
    /// uncertainty of steps of known size while samples from before the last
    /// one may still be in the windows (see [`ClockSync::clock_stepped_by`]).
    fn step_slack_at(&self, x: u64) -> f64 {
        if x < self.step_slack.0 {
            self.step_slack.1
        } else {
            0.0
        }
    }

    /// The level we take: one below our nearest anchors, or — when every
    /// anchor was outvoted by [`PROMOTE_MIN`] agreeing peers of that level
    /// (our only upstream edges are asymmetric) — one further down, those
    /// peers anchoring us, so nothing they derive from feeds back into us.
    /// Too few to outvote them: an outvoted anchor is still an anchor.
    fn anchor_level(&mut self, cands: &[Candidate], level: u16) -> u16 {
        if cands.iter().any(|c| c.level < level && !self.peers[c.peer].asymmetric) {
            return level;
        }
        let agreeing = cands.iter().filter(|c| c.level == level && !self.peers[c.peer].asymmetric).count();
        if agreeing >= PROMOTE_MIN {
            self.stats.promotions += 1;
            return level + 1;
        }
        for c in cands.iter().filter(|c| c.level < level) {
            self.peers[c.peer].asymmetric = false;
        }
        level
    }

    /// Our drift against the reference — the weighted mean of every usable
    /// edge's, each through its peer's — and each edge's height at `now` on
    /// that slope (an edge's own slope, from its own points only, errs √n
    /// times more, and over half a window that was most of its error).
    /// Returns the slope (our previous one if no edge has one yet) and the
    /// error its standard error makes at `now`: every edge's height carries
    /// it alike, so the residuals cannot show it.
    ///
    /// Robust to a few edges: a slope more than [`SLOPE_K`] MADs (and
    /// [`SLOPE_OUTLIER_MIN`]) from the median of the others is left out. One
    /// edge's slope — its own fit composed with its peer's advertised drift —
    /// can be far off for a while (in the simulator one edge of a receiver's
    /// ten sat 0.5–1.4 ppm off for a few updates); in the mean it moved the
    /// node's slope by 0.17 ppm, and every edge's height with it, ≈ 1 µs.
    fn common_slope(&self, cands: &mut [Candidate], level: u16, now: u64) -> (f64, f64) {
        // Same-level peers weigh less, as in the estimate (see `update`).
        let weight = |c: &Candidate| if c.level == level { c.weight * SAME_LEVEL_WEIGHT } else { c.weight };
        // (slope, weight) of each edge not flagged; the median by weight, so
        // that the edges nearest the reference count most and a group of
        // peers cannot vote their own drift in.
        let slopes: Vec<(f64, f64)> = cands
            .iter()
            .filter(|c| !self.peers[c.peer].asymmetric)
            .filter_map(|c| c.slope.map(|s| (s, weight(c))))
            .collect();
        let (med, mad) = median_and_mad(&slopes);
        // A slope's noise falls with its window's span: the floor is for
        // full windows, and wider while they fill (start-up, new edges).
        let mut spans: Vec<u64> = cands
            .iter()
            .filter(|c| c.slope.is_some())
            .map(|c| self.peers[c.peer].fwd.span().min(self.peers[c.peer].rev.span()))
            .collect();
        spans.sort_unstable();
        let span = spans.get(spans.len() / 2).copied().unwrap_or(0).max(1) as f64;
        let floor = SLOPE_OUTLIER_MIN * (self.cfg.window_ns as f64 / span).max(1.0);
        // Two slopes have no median to stand out from: both are kept.
        let thr = if slopes.len() >= SLOPE_VOTERS_MIN { (SLOPE_K * mad).max(floor) } else { f64::INFINITY };
        let usable = |c: &Candidate| c.slope.is_some_and(|s| (s - med).abs() <= thr) && !self.peers[c.peer].asymmetric;
        let sloped: Vec<(f64, f64)> =
            cands.iter().filter(|c| usable(c)).filter_map(|c| c.slope.map(|s| (weight(c), s))).collect();
        let ws: f64 = sloped.iter().map(|x| x.0).sum();
        if ws <= 0.0 {
            return (self.drift, f64::NAN);
        }
        let slope = sloped.iter().map(|x| x.0 * x.1).sum::<f64>() / ws;
        let var = sloped.iter().map(|x| x.0 * (x.1 - slope).powi(2)).sum::<f64>() / ws;
        // From the middle of the windows to their end.
        let reach = cands
            .iter()
            .filter(|c| usable(c))
            .map(|c| self.peers[c.peer].fwd.span().min(self.peers[c.peer].rev.span()) as f64 / 2.0)
            .fold(0.0, f64::max);
        for c in cands.iter_mut().filter(|c| c.slope.is_some()) {
            let p = &self.peers[c.peer];
            if let Some(a) = p.advert {
                // Our slope is the peer's seen through the edge: s = a·(1 − b) + b.
                let b = (slope - a.drift) / (1.0 - a.drift);
                if let Some(d) = delta_with_slope(&p.fwd, &p.rev, b, now) {
                    c.theta = c.theta_peer + d;
                }
            }
        }
        (slope, (var / sloped.len() as f64).sqrt() * reach)
    }

    /// One candidate per usable peer: its estimate plus our edge to it,
    /// weighted by the inverse of its variance — the edge's (from the
    /// residuals) plus the peer's own (from its advertised bound), so peers
    /// nearer the reference count for more and the whole graph cannot drift
    /// away from it together.
    fn candidates(&self, now: u64) -> Vec<Candidate> {
        let edge_var = self.last_rms.max(EDGE_SIGMA_MIN_NS).powi(2);
        // An edge's variance falls with its samples: relative to our median
        // edge's, so a sparsely probed random edge counts for less.
        let mut counts: Vec<usize> =
            self.peers.iter().map(|p| p.fwd.len().min(p.rev.len())).filter(|&n| n >= MIN_SAMPLES).collect();
        counts.sort_unstable();
        let median = counts.get(counts.len() / 2).copied().unwrap_or(1).max(1) as f64;
        let mut out = Vec::new();
        for (i, p) in self.peers.iter().enumerate() {
            let (Some(a), Some((delta, dslope, half_rtt, edge_bound))) = (p.advert, p.edge(now)) else { continue };
            // An edge whose floors are not yet pinned (too few samples since
            // it started or restarted) cannot say how wrong it is: not yet.
            if !a.synced || !a.bound_ns.is_finite() || a.level == u16::MAX || !edge_bound.is_finite() {
                continue;
            }
            // The advertised estimate is as of the probe's send time, a
            // one-way delay before we heard it.
            let theta_peer = a.offset_ns + a.drift * (now as f64 - a.at as f64 + half_rtt);
            let peer_sigma = (a.bound_ns - BOUND_FLOOR_NS).max(0.0) / BOUND_K;
            out.push(Candidate {
                peer: i,
                level: a.level,
                theta: theta_peer + delta,
                theta_peer,
                // The peer's drift is per ns of its clock, the edge's per ns
                // of ours: d(θ_peer)/dx = a · (1 − b), and the product term
                // (up to 100 ppm × 100 ppm = 10 ppb) adds up level by level.
                slope: dslope.map(|d| a.drift * (1.0 - d) + d),
                weight: 1.0 / (edge_var * median / p.fwd.len().min(p.rev.len()).max(1) as f64 + peer_sigma.powi(2)),
                // The peer's bound as of its send time, grown since by the drift's uncertainty.
                bound: a.bound_ns + DRIFT_UNCERTAINTY * (now.saturating_sub(a.at) as f64 + half_rtt) + edge_bound,
                hard: a.hard_ns + half_rtt,
                contested: a.contested,
            });
        }
        out
    }

    /// Flags edges whose candidate stands out from the others (robustly:
    /// distance from the weighted median beyond [`ASYM_K`] weighted MADs),
    /// and clears flags on edges that agree again. Returns whether an anchor
    /// stands out from all the votes (our estimate is contested) and whether
    /// one that does is still in use (the dispute is unresolved).
    fn flag_asymmetric(&mut self, cands: &[Candidate], witnesses: &[Candidate], level: u16, settled: bool) -> Dispute {
        // Not by the candidates' weights: those measure each edge's noise,
        // not the risk that its minimum delays differ — one precise anchor
        // must not outvote several peers that agree with each other. By
        // level only: a peer of our own level counts [`VOTE_SAME_LEVEL`] of
        // an anchor, so two of them still outvote one anchor, but one
        // asymmetric anchor and one asymmetric peer of our level no longer
        // tie with two good anchors (a proxy in the simulator sat 2.5 µs off
        // on such a tie: the lower median fell on the bad side).
        // Witnesses — peers further down whose estimates do not derive from
        // ours — vote at [`VOTE_WITNESS`]: two edges to our own level that
        // are asymmetric the same way outvote one good anchor, but not the
        // anchor and the paths through other subtrees together (a proxy in
        // the simulator sat 5 µs off under a 137-ns bound that way).
        let vote = |c: &Candidate| if c.level < level { 1.0 } else { VOTE_SAME_LEVEL };
        let votes = |judge: &dyn Fn(&Candidate) -> bool| -> Vec<(f64, f64)> {
            cands
                .iter()
                .filter(|c| judge(c))
                .map(|c| (c.theta, vote(c)))
                .chain(witnesses.iter().filter(|c| judge(c)).map(|c| (c.theta, VOTE_WITNESS)))
                .collect()
        };
        // Disputed: an anchor stands out from every vote, contested or not —
        // by more than its own bound and [`ASYM_MIN_NS`], not by the votes'
        // spread (votes microseconds apart widen a MAD threshold until
        // nothing stands out).
        let all = votes(&|_| true);
        let med = weighted_median(all.clone());
        let far = |c: &Candidate| (c.theta - med).abs() > ASYM_MIN_NS + c.bound;
        let disputed = all.len() >= 3 && cands.iter().any(|c| c.level < level && far(c));
        // Only peers whose own estimates are not contested judge: two
        // children of the reference whose edges to it are asymmetric the
        // same way agree with each other, and each used to outvote the good
        // anchor of the sibling between them (and the whole graph followed
        // them 2.5 µs off under 100-ns bounds). An anchor of ours judges
        // even when contested: it is what our level stands on.
        let judges = votes(&|c: &Candidate| c.level < level || !c.contested);
        if judges.len() < 3 || !settled {
            for c in cands.iter() {
                self.peers[c.peer].asymmetric = false;
            }
        } else {
            let (med, mad) = median_and_mad(&judges);
            let thr = (ASYM_K * mad).max(ASYM_MIN_NS);
            // An anchor — an edge to a peer nearer the reference, the
            // reference's own above all — is set aside only when at least
            // [`OVERRULE_VOTES`] of uncontested peers agree with each other
            // against it. Fewer, and it stays: the dispute is unresolved and
            // the bound takes the hull (two children of the reference
            // asymmetric the same way outvoted the good sibling between them
            // 2 to 1, and once it had followed them no node saw a dispute).
            let agreeing: f64 =
                votes(&|c: &Candidate| !c.contested).iter().filter(|v| (v.0 - med).abs() <= thr).map(|v| v.1).sum();
            for c in cands.iter() {
                let d = (c.theta - med).abs();
                let p = &mut self.peers[c.peer];
                if !p.asymmetric && d > thr && (c.level >= level || agreeing >= OVERRULE_VOTES) {
                    p.asymmetric = true;
                    self.stats.asymmetric_flagged += 1;
                } else if p.asymmetric && d < thr / 2.0 {
                    p.asymmetric = false;
                }
            }
        }
        // Unresolved: an anchor that stands out is still in use, or two or
        // more peers that stand out agree with each other. One edge standing
        // alone is an asymmetric link; several saying the same thing may be
        // the side that is right (three of a node's inbound links 7 µs slow
        // made its good siblings look wrong, and it sat 3.5 µs off under a
        // 190-ns bound).
        let out: Vec<&Candidate> = cands.iter().chain(witnesses).filter(|c| far(c)).collect();
        let agree = out
            .iter()
            .enumerate()
            .any(|(i, a)| out[i + 1..].iter().any(|b| (a.theta - b.theta).abs() <= ASYM_MIN_NS + a.bound.max(b.bound)));
        let unresolved = all.len() >= 3
            && (agree || disputed && cands.iter().any(|c| c.level < level && far(c) && !self.peers[c.peer].asymmetric));
        Dispute { disputed, unresolved }
    }

    fn refresh_stats(&mut self, now: u64, used: usize, rms: f64) {
        let over = !self.within_in(now);
        if over && !self.stats.over_limit && self.started.is_some() {
            self.stats.over_limit_events += 1;
        }
        let bound = self.bound_in(now);
        let asymmetric = self.peers.iter().filter(|p| p.asymmetric).count() as u64;
        let s = &mut self.stats;
        s.over_limit = over;
        // Against the raw clock, as the public calls are.
        s.offset_ns = self.offset_ns + self.moved as f64;
        s.drift_ppm = self.drift * 1e6;
        s.bound_ns = bound;
        s.hard_bound_ns = if self.hard_ns.is_finite() { self.hard_ns.ceil() as u64 } else { u64::MAX };
        s.residual_rms_ns = rms;
        s.peers_used = used as u64;
        s.synced = self.synced;
        s.asymmetric_edges = asymmetric;
        s.contested = self.contested;
    }

    /// Each peer's id, last residual (ns) and whether its edge is flagged asymmetric.
    pub fn edges(&self) -> impl Iterator<Item = (u32, f64, bool)> + '_ {
        self.peers.iter().map(|p| (p.id, p.residual_ns, p.asymmetric))
    }
}

/// How far the weighted mean `theta` of `used` may be from the truth, and
/// whether their intervals agree. Each candidate's own bound (its peer's
/// plus its edge's, both observed) combines as the estimate combines them:
/// if every interval θᵢ ± Bᵢ holds the truth, so does θ ± Σwᵢ·Bᵢ/Σwᵢ
/// (linearly, as if every error leaned the same way: candidates share
/// upstream paths). Intervals with no common point mean one of them does
/// not (an asymmetric edge no vote has caught): then only the hull of them
/// all is sure to hold it, and the bound says so.
fn combined_bound(used: &[&Candidate], theta: f64, disputed: &[&Candidate]) -> (f64, bool) {
    let w: f64 = used.iter().map(|c| c.weight).sum();
    let linear = used.iter().map(|c| c.weight * c.bound).sum::<f64>() / w;
    let lo = used.iter().map(|c| c.theta - c.bound).fold(f64::NEG_INFINITY, f64::max);
    let hi = used.iter().map(|c| c.theta + c.bound).fold(f64::INFINITY, f64::min);
    if lo > hi || !disputed.is_empty() {
        (used.iter().chain(disputed).map(|c| (c.theta - theta).abs() + c.bound).fold(0.0, f64::max), false)
    } else {
        (linear, true)
    }
}

/// An edge's own error bound at `x`: the offset is half the difference of
/// the two directions' floors, and each floor's lowest sample may sit above
/// the true floor by up to [`FLOOR_C`] times its [`FLOOR_K`]-th sample's
/// height above it ([`floor_spread`]); half the larger of the two.
///
/// The height is taken at `x`, usually the window's end, on a slope fitted
/// from the same floors: an error of `g` at each end of a baseline of about
/// two thirds of the span tilts it by up to `3g ÷ span`, which at `reach`
/// from the window's middle moves the height by `3g · reach ÷ span`
/// ([`SLOPE_FLOOR_K`] times that: the floors' errors are rarely both at
/// their worst, and opposed).
fn edge_bound(fwd: &Envelope, rev: &Envelope, slope: f64, x: u64) -> f64 {
    let f = floor_spread(fwd, slope, x, FLOOR_K).unwrap_or(f64::INFINITY);
    let r = floor_spread(rev, -slope, x, FLOOR_K).unwrap_or(f64::INFINITY);
    let g = f.max(r);
    if !g.is_finite() {
        return f64::INFINITY;
    }
    let span = fwd.span().min(rev.span()) as f64;
    let middle = fwd.middle().max(rev.middle()) as f64;
    let reach = (x as f64 - middle).max(0.0);
    let tilt = if span > 0.0 { SLOPE_FLOOR_K * 3.0 * g * reach / span } else { 0.0 };
    FLOOR_C * g / 2.0 + tilt
}

/// The weighted median of `(value, weight)` pairs and their weighted MAD,
/// scaled to a standard deviation for normal data.
fn median_and_mad(v: &[(f64, f64)]) -> (f64, f64) {
    let med = weighted_median(v.to_vec());
    let mad = weighted_median(v.iter().map(|&(x, w)| ((x - med).abs(), w)).collect()) * 1.4826;
    (med, mad)
}

fn weighted_median(mut v: Vec<(f64, f64)>) -> f64 {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let half = v.iter().map(|x| x.1).sum::<f64>() / 2.0;
    let mut acc = 0.0;
    for &(x, w) in &v {
        acc += w;
        if acc >= half {
            return x;
        }
    }
    v.last().map_or(0.0, |x| x.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The case that hung `sim experiment clock` (5.6 ms, 856 ppm: the old
    /// two-step inverse was 4 ns short, the timer re-armed at the same
    /// instant for ever), then any estimate within ±1 s and ±1,000 ppm: the
    /// raw time `to_local` gives is the first whose synchronized reading is
    /// at or after the one asked for.
    #[test]
    fn to_local_is_the_first_raw_time_at_or_after_any_estimate() {
        let mut s = ClockSync::new(5, &[0], false, SyncConfig::default());
        let check = |s: &ClockSync, sync: u64| {
            let l = s.to_local(sync);
            assert!(s.now_sync(l) >= sync, "off {} drift {} at {}: now_sync({l}) < {sync}", s.offset_ns, s.drift, s.at);
            assert!(l == 0 || s.now_sync(l - 1) < sync, "off {} drift {}: {l} is not the first", s.offset_ns, s.drift);
        };
        (s.offset_ns, s.drift, s.at) = (5_583_894.502_523_916, 0.000_856_278_879_752_041_1, 5_856_506_949);
        check(&s, 5_860_000_000);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..20_000 {
            s.offset_ns = (next() * 2.0 - 1.0) * 1e9;
            s.drift = (next() * 2.0 - 1.0) * 1e-3;
            s.at = 2_000_000_000 + (next() * 1e11) as u64;
            let sync = 2_000_000_000 + (next() * 1e11) as u64;
            check(&s, sync);
        }
    }

    /// A peer that probes `node` with a clock `skew_ns` ahead of it, one pair
    /// every 10 ms from raw time `from`, for `pairs` pairs, 20 µs away.
    fn feed(node: &mut ClockSync, peer: u32, from: u64, pairs: u64, skew_ns: i64, first_pair: u64) {
        for k in 0..pairs {
            let t = from + k * 10_000_000;
            for index in 0..2u8 {
                let tx = (t as i64 + i64::from(index) * 20_000 + skew_ns) as u64;
                let rx = t + u64::from(index) * 20_000 + 20_000;
                let p = ProbeRepr {
                    target: node.id,
                    index,
                    pair: first_pair + k,
                    tx_ns: tx,
                    flags: PROBE_SYNCED,
                    bound_ns: 0,
                    ..ProbeRepr::default()
                };
                node.handle_probe(rx, peer, &p).unwrap();
            }
        }
    }

    #[test]
    fn a_step_the_host_announces_makes_the_node_unsynchronized_at_once() {
        let mut s = ClockSync::new(5, &[0, 1, 2], false, SyncConfig::default());
        (s.synced, s.bound_ns, s.at, s.level) = (true, 50.0, 1_000_000_000, 1);
        assert!(s.within_limit(1_000_000_000));
        s.clock_stepped(1_000_000_001);
        assert_eq!(s.stats.own_steps, 1);
        assert!(!s.within_limit(1_000_000_001));
        assert_eq!(s.bound_ns(1_000_000_001), u64::MAX);
        assert!(!s.usable(1_000_000_001));
        // The reference's clock is the reference: nothing to do.
        let mut r = ClockSync::new(0, &[5], true, SyncConfig::default());
        r.clock_stepped(1);
        assert_eq!((r.stats.own_steps, r.bound_ns(1)), (0, 0));
    }

    #[test]
    fn a_step_of_known_size_is_taken_out_at_every_public_call() {
        let t0 = 10_000_000_000u64;
        let mut s = ClockSync::new(5, &[0, 1], false, SyncConfig::default());
        (s.synced, s.bound_ns, s.hard_ns, s.at, s.level, s.offset_ns, s.drift) =
            (true, 50.0, 500.0, t0, 1, 7_000.0, 2e-6);
        (s.started, s.next_round) = (Some(t0), t0 + 5_000);
        let (due, before) = (s.next_timeout().expect("a probe is due"), s.now_sync(t0 + 1_000));
        for d in [1_000_000i64, -3_000_000] {
            let moved = s.moved;
            // Our raw clock jumps by `d` at t0 + 1,000 (raw, before the jump), known within 80 ns.
            s.clock_stepped_by((t0 as i64 + 1_000 + moved + d) as u64, d, 80);
            let raw = |x: u64| (x as i64 + moved + d) as u64;
            assert_eq!(s.now_sync(raw(t0 + 1_000)), before, "{d}: the synchronized clock reads on");
            assert_eq!(s.to_local(before), raw(s.to_local(before).wrapping_sub((moved + d) as u64)));
            assert!(s.now_sync(s.to_local(before)) >= before);
            assert_eq!(s.next_timeout(), Some((due as i64 + moved + d) as u64), "{d}: timers move with the clock");
            assert!((s.offset_at(raw(t0)) - (7_000.0 + (moved + d) as f64)).abs() < 1e-6, "{d}");
            assert!(s.within_limit(raw(t0 + 1_000)), "{d}: still synchronized");
        }
        // The bound grew by both uncertainties (and by a µs of drift uncertainty, rounded up).
        assert_eq!(s.bound_ns(s.to_local(before)), 50 + 80 + 80 + 1);
        assert_eq!((s.stats.own_steps, s.stats.own_steps_kept, s.stats.steps), (2, 2, 0));
        // Probes go out stamped on the stepless timescale.
        let mut after = Vec::new();
        s.handle_timeout(s.next_timeout().expect("a probe is due"), &mut |to, p| after.push((to, p.tx_ns)));
        assert!(after.iter().all(|a| a.1 >= t0 && a.1 < t0 + 1_000_000_000), "{after:?}");
        // A size known no better than a jump shows: as a step of unknown size.
        s.clock_stepped_by(t0, 5_000_000, s.cfg.step_ns + 1);
        assert!(!s.within_limit(t0) && s.stats.own_steps_kept == 2 && s.stats.own_steps == 3);
    }

    #[test]
    fn a_jump_on_one_edge_is_suspect_until_another_peer_shows_our_clock_held() {
        let t0 = 10_000_000_000;
        let mut s = ClockSync::new(5, &[1, 2, 3], false, SyncConfig::default());
        // Peers 1 and 2 hold steady; enough samples for a fit.
        for peer in [1, 2] {
            feed(&mut s, peer, t0, 40, 0, 1);
        }
        // Peer 1's clock jumps 1 ms ahead: its probes land far below the fit.
        feed(&mut s, 1, t0 + 400_000_000, 1, 1_000_000, 41);
        assert_eq!(s.stats.steps, 1);
        assert_eq!(s.bound_ns(t0 + 401_000_000), u64::MAX, "one jumped edge: our bound unknown meanwhile");
        // Peer 2's next pair sits on its fit: our clock held; no own step.
        feed(&mut s, 2, t0 + 402_000_000, 1, 0, 41);
        assert_eq!(s.stats.own_steps, 0);
        assert!(!s.suspect);
        // Now both remaining peers see a jump at once: our own clock stepped.
        let mut o = ClockSync::new(5, &[1, 2, 3], false, SyncConfig::default());
        for peer in [1, 2] {
            feed(&mut o, peer, t0, 40, 0, 1);
        }
        for peer in [1, 2] {
            feed(&mut o, peer, t0 + 400_000_000, 1, 1_000_000, 41);
        }
        assert_eq!(o.stats.own_steps, 1);
        assert!(!o.synced && o.bound_ns(t0 + 401_000_000) == u64::MAX);
    }

    #[test]
    fn the_edge_bound_grows_with_how_loosely_the_floor_is_pinned() {
        let mut sharp = (Envelope::default(), Envelope::default());
        let mut loose = (Envelope::default(), Envelope::default());
        for i in 0..64u64 {
            let x = 1_000_000_000 + i * 10_000_000;
            // Sharp: every fourth sample at the floor. Loose: the floor's
            // neighbours hundreds of ns above it.
            let q = if i % 4 == 0 { 0 } else { 5_000 };
            let l = if i == 0 { 0 } else { 300 * (i as i64 % 7 + 1) };
            for (env, y) in [
                (&mut sharp.0, 20_000 + q),
                (&mut sharp.1, 20_000 + q),
                (&mut loose.0, 20_000 + l),
                (&mut loose.1, 20_000 + l),
            ] {
                env.offer(x, y, 16_000_000_000, 20_000, STEP_SAMPLES);
            }
        }
        let at = 1_700_000_000;
        let b_sharp = edge_bound(&sharp.0, &sharp.1, 0.0, at);
        let b_loose = edge_bound(&loose.0, &loose.1, 0.0, at);
        assert_eq!(b_sharp, 0.0, "eight samples at the floor pin it");
        assert!(b_loose >= FLOOR_C * 300.0 / 2.0, "{b_loose}");
    }

    #[test]
    fn the_start_up_interval_holds_then_ramps_to_the_steady_one() {
        let cfg = SyncConfig::default();
        let mut s = ClockSync::new(1, &[0], false, cfg);
        let t0 = 5_000_000_000;
        s.handle_timeout(t0, &mut |_, _| {});
        let at = |dt: u64| s.interval(t0 + dt);
        let flat = cfg.startup_ns - cfg.ramp_ns;
        assert_eq!(at(0), cfg.startup_interval_ns);
        assert_eq!(at(flat - 1), cfg.startup_interval_ns);
        assert_eq!(at(cfg.startup_ns), cfg.interval_ns);
        let mut last = 0;
        for k in 0..=100 {
            let i = at(flat + cfg.ramp_ns * k / 100);
            assert!(i >= last && (cfg.startup_interval_ns..=cfg.interval_ns).contains(&i), "{k}: {i}");
            last = i;
        }
        // Halfway up the ramp: the geometric mean of the two intervals (50 ms).
        let mid = at(flat + cfg.ramp_ns / 2) as f64;
        assert!((mid - 50e6).abs() < 1e3, "{mid}");
        // No ramp: dense until the end of start-up.
        let mut flat_only = ClockSync::new(1, &[0], false, SyncConfig { ramp_ns: 0, ..cfg });
        flat_only.handle_timeout(t0, &mut |_, _| {});
        assert_eq!(flat_only.interval(t0 + cfg.startup_ns - 1), cfg.startup_interval_ns);
        assert!(SyncConfig { ramp_ns: cfg.startup_ns + 1, ..cfg }.validate().is_err());
    }
}
