//! The lower envelope of a peer's one-way-delay samples, over a sliding window.
//!
//! A sample is `(x, y)`: `x` the local time it was taken, `y` = receive stamp
//! − send stamp, i.e. the one-way delay plus the clocks' offset. Queueing only
//! ever adds delay, so the points that matter lie at the bottom: we fit the
//! line below every point that maximizes its height at the window's mean `x`
//! (the linear program "minimize Σ (yₖ − a − b·xₖ) subject to the line staying
//! below every point", whose optimum is the lower convex hull's edge spanning
//! the mean). Its slope is the clocks' relative drift, its height the offset
//! plus the minimum delay. Huygens separates the two directions' points with
//! an SVM; with the minimum delays symmetric both find the same line in the
//! noise-free case, and the hull needs no tuning parameter.

use std::collections::VecDeque;

/// Samples kept per direction at most: bounds what one peer can make a node
/// hold, and must cover a whole window at the highest probe rate
/// ([`crate::SyncConfig::validate`] checks it; at 512 an edge probed 8 pairs
/// per interval kept only 8 of its 16 s, and its drift erred twice as much).
pub const WINDOW_SAMPLES_MAX: usize = 4_096;
/// The step check's fit is refreshed at least every this many samples.
pub const REFIT_EVERY: usize = 16;

/// A sample counts as a step only if it is below the fit by more than the
/// step threshold plus this slope error (20 ppm) times its distance from the
/// window's oldest sample: a few-sample window's slope extrapolates badly.
pub const STEP_SLOPE_TOLERANCE: f64 = 2e-5;

/// Samples each third needs for the long-baseline slope (one queued sample
/// alone must not set it).
pub const THIRD_SAMPLES: usize = 3;
/// Windows spanning at least this take their slope from the lowest points of their first and last thirds.
pub const THIRDS_SPAN_NS: u64 = 2_000_000_000;

/// A fitted line `y = y0 + slope · (x − x0)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    /// Where the line is anchored (local ns).
    pub x0: u64,
    /// Its value at `x0`, ns.
    pub y0: f64,
    /// Its slope (ns per ns).
    pub slope: f64,
}

impl Line {
    /// Its value at `x`.
    pub fn at(&self, x: u64) -> f64 {
        self.y0 + self.slope * (x as f64 - self.x0 as f64)
    }
}

/// What happened to a sample offered to the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Taken into the window.
    Added,
    /// Far below the fitted line (by this many ns): one of the clocks jumped.
    /// The window was cleared.
    Step(i64),
}

/// The sliding window of samples and its fit.
#[derive(Debug, Clone, Default)]
pub struct Envelope {
    samples: VecDeque<(u64, i64)>,
    fit: Option<Line>,
    /// A sample far below the fit, waiting for a second to confirm a step.
    low: Option<(u64, i64)>,
    /// Samples taken in since the last refit.
    stale: usize,
}

impl Envelope {
    /// Samples in the window.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether the window holds no sample.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The fit, once the window has `min` samples.
    pub fn fit(&self, min: usize) -> Option<Line> {
        if self.samples.len() >= min {
            self.fit
        } else {
            None
        }
    }

    /// Time between the oldest and newest sample.
    pub fn span(&self) -> u64 {
        match (self.samples.front(), self.samples.back()) {
            (Some(a), Some(b)) => b.0 - a.0,
            _ => 0,
        }
    }

    /// True when a sample at `(x, y)` lies more than `step_ns` (plus the
    /// fit's slope tolerance) *above* the fit of a window of at least `min`
    /// samples: queueing, or a clock that jumped the other way. One such
    /// sample means nothing; the caller asks for a pair, from several peers.
    pub fn far_above(&self, x: u64, y: i64, step_ns: u64, min: usize) -> bool {
        let Some(f) = self.fit(min) else { return false };
        let reach = x.saturating_sub(self.samples.front().map_or(x, |s| s.0)) as f64;
        y as f64 > f.at(x) + step_ns as f64 + STEP_SLOPE_TOLERANCE * reach
    }

    /// The middle of the window's time span (0 when empty).
    pub fn middle(&self) -> u64 {
        match (self.samples.front(), self.samples.back()) {
            (Some(a), Some(b)) => a.0 + (b.0 - a.0) / 2,
            _ => 0,
        }
    }

    /// The lowest delay in the window.
    pub fn min_y(&self) -> Option<i64> {
        self.samples.iter().map(|s| s.1).min()
    }

    /// Forgets every sample and the fit (after a step).
    pub fn clear(&mut self) {
        self.samples.clear();
        self.fit = None;
        self.low = None;
    }

    /// Offers a sample; samples older than `window_ns` behind the newest leave.
    /// Two samples in a row more than `step_ns` below the current fit (with
    /// at least `min` samples) clear the window and report a step; one alone
    /// is held back a sample (a window of queued samples and one at the floor
    /// look the same), then taken in.
    pub fn offer(&mut self, x: u64, y: i64, window_ns: u64, step_ns: u64, min: usize) -> Offer {
        if let Some(f) = self.fit(min) {
            // The fit's slope is uncertain: allow for STEP_SLOPE_TOLERANCE over
            // the distance from the window's oldest sample.
            let reach = x.saturating_sub(self.samples.front().map_or(x, |s| s.0)) as f64;
            if (y as f64) < f.at(x) - step_ns as f64 - STEP_SLOPE_TOLERANCE * reach {
                if let Some(first) = self.low.take() {
                    let below = (f.at(x) - y as f64) as i64;
                    self.clear();
                    self.samples.push_back(first);
                    self.insert(x, y, window_ns);
                    self.refit();
                    return Offer::Step(below);
                }
                self.low = Some((x, y));
                return Offer::Added;
            }
        }
        let mut under = false;
        if let Some((lx, ly)) = self.low.take() {
            self.insert(lx, ly, window_ns);
            under = true;
        }
        self.insert(x, y, window_ns);
        // The fit serves the step check only (the edge is fitted from both
        // directions on demand): refresh it when a sample lands at or under
        // it, and every REFIT_EVERY samples otherwise (samples leaving the
        // window, the mean moving). A full refit per sample cost more than
        // the rest of the simulation.
        self.stale += 1;
        under |= self.fit.is_none_or(|f| (y as f64) <= f.at(x));
        if under || self.stale >= REFIT_EVERY {
            self.refit();
        }
        Offer::Added
    }

    fn insert(&mut self, x: u64, y: i64, window_ns: u64) {
        // Keep x sorted (echoes may arrive slightly out of order).
        let pos = self.samples.iter().rposition(|s| s.0 <= x).map_or(0, |p| p + 1);
        self.samples.insert(pos, (x, y));
        let newest = self.samples.back().map_or(x, |s| s.0);
        while self.samples.len() > WINDOW_SAMPLES_MAX
            || self.samples.front().is_some_and(|s| newest.saturating_sub(s.0) > window_ns)
        {
            self.samples.pop_front();
        }
    }

    fn refit(&mut self) {
        self.fit = lower_fit(self.samples.make_contiguous());
        self.stale = 0;
    }
}

/// The best supporting line of the lower hull at the mean x (see the module doc).
pub fn lower_fit(pts: &[(u64, i64)]) -> Option<Line> {
    let &(x0, base) = pts.first()?;
    // Relative to the first sample, in floating point.
    let rel: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| ((x - x0) as f64, (y - base) as f64)).collect();
    let hull = lower_hull_f64(pts, x0, base);
    if hull.len() == 1 {
        return Some(Line { x0, y0: base as f64 + hull[0].1, slope: 0.0 });
    }
    let span = rel.last().map_or(0.0, |p| p.0);
    let mut slope = hull_slope(&hull, &rel);
    if span >= THIRDS_SPAN_NS as f64 {
        // Long baseline: detrended by the hull's slope, the line through the
        // lowest points of the window's first and last thirds. Its slope errs by the
        // noise over half the span; the hull edge at the mean can be two
        // close points, whose slope, extrapolated to the window's end, errs
        // by far more.
        let r = |p: &(f64, f64)| p.1 - slope * p.0;
        // First and last third: the baseline is at least a third of the span
        // (halves' minima can sit side by side at the boundary).
        let third =
            |first: bool| rel.iter().filter(move |p| if first { p.0 * 3.0 < span } else { p.0 * 3.0 >= span * 2.0 });
        let lowest = |first: bool| third(first).min_by(|a, b| r(a).total_cmp(&r(b))).copied();
        let enough = |first: bool| third(first).count() >= THIRD_SAMPLES;
        if let (true, true, Some(a), Some(b)) = (enough(true), enough(false), lowest(true), lowest(false)) {
            if b.0 > a.0 {
                slope += (r(&b) - r(&a)) / (b.0 - a.0);
            }
        }
    }
    // The supporting line with that slope: below every point, touching one.
    let y0 = rel.iter().map(|p| p.1 - slope * p.0).fold(f64::INFINITY, f64::min);
    Some(Line { x0, y0: base as f64 + y0, slope })
}

/// One edge fitted from both directions at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EdgeFit {
    /// Where the fit is anchored (local ns of the receiving end).
    pub x0: u64,
    /// θ_receiver − θ_sender of the forward direction at `x0`, ns.
    pub delta0: f64,
    /// Its slope (relative drift).
    pub slope: f64,
    /// The minimum one-way delay (half the minimum round trip), ns.
    pub delay: f64,
}

impl EdgeFit {
    /// θ_receiver − θ_sender at `x`, ns.
    pub fn delta_at(&self, x: u64) -> f64 {
        self.delta0 + self.slope * (x as f64 - self.x0 as f64)
    }
}

/// The edge between a forward and a reverse window, jointly (Huygens'
/// separating line, in its hard-margin form): forward delays are
/// `d + δ(x)` plus queueing, reverse ones `d − δ(x)` plus queueing, with
/// `δ(x) = δ₀ + b·x` and the minimum delay `d` the same both ways. For a slope
/// `b`, the highest lines under each set are `min(y − b·x)` and `min(y + b·x)`;
/// their sum (2d) is concave in `b` and largest at the true slope, so we take
/// the `b` in `±slope_max` that maximizes it — a breakpoint of either lower
/// hull. Both directions' points over the whole window pin the slope, where
/// each direction alone can be tilted by one low point at its end.
pub fn joint_fit(fwd: &Envelope, rev: &Envelope, slope_max: f64) -> Option<EdgeFit> {
    let x0 = fwd.samples.front()?.0.min(rev.samples.front()?.0);
    let y0 = fwd.samples.front()?.1;
    let (f, r) = (lower_hull_f64(&fwd.samples, x0, y0), lower_hull_f64(&rev.samples, x0, y0));
    let lowest = |h: &[(f64, f64)], b: f64| h.iter().map(|p| p.1 - b * p.0).fold(f64::INFINITY, f64::min);
    let sum = |b: f64| lowest(&f, b) + lowest(&r, -b);
    let slopes = |h: &[(f64, f64)], sign: f64| -> Vec<f64> {
        h.windows(2).map(|w| sign * (w[1].1 - w[0].1) / (w[1].0 - w[0].0)).collect()
    };
    let mut best = (f64::NEG_INFINITY, 0.0f64, 0.0f64);
    for b in slopes(&f, 1.0).into_iter().chain(slopes(&r, -1.0)).chain([-slope_max, slope_max]) {
        if b.is_nan() || b.abs() > slope_max {
            continue;
        }
        let v = sum(b);
        // Ties form an interval (the sum is concave): keep its ends, take its middle.
        if v > best.0 + 1e-6 {
            best = (v, b, b);
        } else if (v - best.0).abs() <= 1e-6 {
            best = (best.0, best.1.min(b), best.2.max(b));
        }
    }
    let b = (best.1 + best.2) / 2.0;
    let (mf, mr) = (lowest(&f, b), lowest(&r, -b));
    if !(mf.is_finite() && mr.is_finite()) {
        return None;
    }
    // Heights are relative to y0, which the forward and reverse sets share.
    Some(EdgeFit { x0, delta0: (mf - mr) / 2.0, slope: b, delay: (mf + mr) / 2.0 + y0 as f64 })
}

/// θ_receiver − θ_sender of an edge at `x`, for a given slope `b`: the
/// highest lines of slope `b` under the forward points and of slope `−b`
/// under the reverse points, at `x`, half their difference (the heights
/// [`joint_fit`] takes at its own slope). With `b` from more than this edge —
/// both nodes' drifts, each from all their edges — the height at the window's
/// end no longer carries this edge's own slope error times half the window.
pub fn delta_with_slope(fwd: &Envelope, rev: &Envelope, b: f64, x: u64) -> Option<f64> {
    let lowest = |env: &Envelope, b: f64| {
        env.samples.iter().map(|&(xi, y)| y as f64 - b * (xi as f64 - x as f64)).fold(f64::INFINITY, f64::min)
    };
    let (mf, mr) = (lowest(fwd, b), lowest(rev, -b));
    (mf.is_finite() && mr.is_finite()).then_some((mf - mr) / 2.0)
}

/// How sharply a window's floor is pinned down, observed from its own
/// samples: detrended by slope `b`, the `k`-th lowest sample's height above
/// the lowest (`None` with fewer than `k + 1` samples: a few samples, all
/// queued alike, look sharp and pin nothing). The lowest sample sits above the true floor by an
/// amount nobody sees; where many samples crowd the floor that amount is
/// small, and where the nearest ones lie far above it (few unqueued packets,
/// noisy timestamps) it may be as large as their spacing. The order
/// statistics' spacing is the observable scale of that error (for an
/// exponential floor density the lowest's excess over `c` times this gap has
/// probability `(1 + c)^−(k−1)`), so an edge's bound scales with it instead
/// of with a constant tuned on one model.
pub fn floor_spread(env: &Envelope, b: f64, x: u64, k: usize) -> Option<f64> {
    if env.samples.len() <= k {
        return None;
    }
    let mut v: Vec<f64> = env.samples.iter().map(|&(xi, y)| y as f64 - b * (xi as f64 - x as f64)).collect();
    let lowest = v.iter().copied().fold(f64::INFINITY, f64::min);
    let (_, kth, _) = v.select_nth_unstable_by(k, f64::total_cmp);
    let spread = *kth - lowest;
    spread.is_finite().then_some(spread.max(0.0))
}

/// The lower convex hull of samples sorted by x, relative to (x0, y0), in
/// floating point (cross products of near-collinear points may round: such a
/// point is then kept or dropped, which moves no supporting line by more than
/// the rounding).
fn lower_hull_f64<'a>(samples: impl IntoIterator<Item = &'a (u64, i64)>, x0: u64, y0: i64) -> Vec<(f64, f64)> {
    let mut hull: Vec<(f64, f64)> = Vec::with_capacity(32);
    for &(x, y) in samples {
        let p = ((x - x0) as f64, (y - y0) as f64);
        if let Some(last) = hull.last_mut() {
            if last.0 == p.0 {
                if p.1 < last.1 {
                    hull.pop();
                } else {
                    continue;
                }
            }
        }
        while hull.len() >= 2 {
            let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
            if (b.0 - a.0) * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0) <= 0.0 {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(p);
    }
    hull
}

/// The slope of the lower hull's edge spanning the mean x (the LP optimum).
fn hull_slope(hull: &[(f64, f64)], rel: &[(f64, f64)]) -> f64 {
    let mean = rel.iter().map(|p| p.0).sum::<f64>() / rel.len() as f64;
    let i = hull.windows(2).position(|w| w[1].0 >= mean).unwrap_or(hull.len() - 2);
    let (a, b) = (hull[i], hull[i + 1]);
    (b.1 - a.1) / (b.0 - a.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_the_floor_under_noise_above() {
        // y = 1000 + 0.00005·x (50 ppm), plus non-negative queueing noise.
        let mut e = Envelope::default();
        for k in 0..200u64 {
            let x = k * 10_000_000;
            let noise = (k * 7919 % 13) as i64 * 500 * i64::from(k % 3 != 0);
            let y = 1000 + (x as f64 * 5e-5) as i64 + noise;
            assert_eq!(e.offer(x, y, u64::MAX, 1_000_000, 2), Offer::Added);
        }
        let f = e.fit(2).unwrap();
        assert!((f.slope - 5e-5).abs() < 1e-8, "slope {}", f.slope);
        assert!((f.at(1_000_000_000) - 51_000.0).abs() < 2.0, "{}", f.at(1_000_000_000));
    }

    #[test]
    fn window_slides_and_steps_clear_it() {
        let mut e = Envelope::default();
        let s = 250_000_000;
        for k in 0..10u64 {
            e.offer(k * s, 500, 5 * s, 10_000, 2);
        }
        assert_eq!(e.len(), 6);
        // One low sample is held back, then taken in when the next is normal.
        assert_eq!(e.offer(11 * s, -50_000, 5 * s, 10_000, 2), Offer::Added);
        assert_eq!(e.len(), 6);
        assert_eq!(e.offer(12 * s, 500, 5 * s, 10_000, 2), Offer::Added);
        assert_eq!(e.min_y(), Some(-50_000));
        // Two in a row are a step.
        let mut e = Envelope::default();
        for k in 0..10u64 {
            e.offer(k * s, 500, 5 * s, 10_000, 2);
        }
        assert_eq!(e.offer(11 * s, -50_000, 5 * s, 10_000, 2), Offer::Added);
        assert!(matches!(e.offer(12 * s, -50_010, 5 * s, 10_000, 2), Offer::Step(b) if b > 50_000));
        assert_eq!(e.len(), 2);
    }

    #[test]
    fn joint_fit_recovers_offset_drift_and_delay() {
        // δ(x) = 3,000 ns + 40 ppm · x, minimum delay 20 µs both ways; every
        // fifth sample at the floor, the rest queued by up to 30 µs.
        let (d, a, b) = (20_000.0, 3_000.0, 4e-5);
        let (mut f, mut r) = (Envelope::default(), Envelope::default());
        for k in 0..400u64 {
            let x = 1_000_000_000 + k * 25_000_000;
            let q = |salt: u64| if (k + salt) % 5 == 0 { 0.0 } else { ((k * 7919 + salt * 104_729) % 30_000) as f64 };
            let delta = a + b * (x - 1_000_000_000) as f64;
            f.offer(x, (d + delta + q(0)).round() as i64, u64::MAX, 1_000_000, 2);
            r.offer(x + 3_000_000, (d - delta - b * 3e6 + q(2)).round() as i64, u64::MAX, 1_000_000, 2);
        }
        let e = joint_fit(&f, &r, 1e-3).unwrap();
        let x = 1_000_000_000 + 399 * 25_000_000;
        assert!((e.delta_at(x) - (a + b * 399.0 * 25e6)).abs() < 2.0, "{e:?}");
        assert!((e.slope - b).abs() < 1e-9, "{e:?}");
        assert!((e.delay - d).abs() < 2.0, "{e:?}");
        // One direction's newest sample far too low (a stamp gone wrong)
        // tilts the joint line by less than it tilts that direction alone.
        let alone = |e: &Envelope| e.fit(2).unwrap().at(x);
        let before = alone(&f);
        f.offer(x + 1, (d + a + b * 399.0 * 25e6 - 400.0) as i64, u64::MAX, 1_000_000, 2);
        let joint = joint_fit(&f, &r, 1e-3).unwrap().delta_at(x) - (a + b * 399.0 * 25e6);
        assert!(joint.abs() < (alone(&f) - before).abs() / 2.0 + 1.0, "joint error {joint}");
    }

    #[test]
    fn single_and_duplicate_x() {
        assert_eq!(lower_fit(&[]), None);
        let l = lower_fit(&[(5, 10), (5, 7)]).unwrap();
        assert_eq!((l.y0, l.slope), (7.0, 0.0));
    }

    #[test]
    fn height_on_a_given_slope_matches_the_joint_fit_on_its_own() {
        // δ(x) = 5,000 + 2e-5·x around a 20 µs floor, some samples queued.
        let (mut f, mut r) = (Envelope::default(), Envelope::default());
        for i in 0..200u64 {
            let x = 1_000_000_000 + i * 50_000_000;
            let delta = 5_000.0 + 2e-5 * (x - 1_000_000_000) as f64;
            let q = if i % 3 == 0 { 0.0 } else { (i * 37 % 900) as f64 };
            f.offer(x, (20_000.0 + delta + q) as i64, 16_000_000_000, 1 << 40, 1000);
            r.offer(x + 1_000, (20_000.0 - delta + q) as i64, 16_000_000_000, 1 << 40, 1000);
        }
        let e = joint_fit(&f, &r, 1e-3).unwrap();
        let end = 1_000_000_000 + 199 * 50_000_000;
        let d = delta_with_slope(&f, &r, e.slope, end).unwrap();
        assert!((d - e.delta_at(end)).abs() < 1e-3, "{d} vs {}", e.delta_at(end));
        let truth = 5_000.0 + 2e-5 * (end - 1_000_000_000) as f64;
        assert!((delta_with_slope(&f, &r, 2e-5, end).unwrap() - truth).abs() <= 1.0);
        assert_eq!(delta_with_slope(&Envelope::default(), &r, 0.0, end), None);
    }
}
