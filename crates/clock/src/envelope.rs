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

/// Samples kept per direction at most.
pub const WINDOW_SAMPLES_MAX: usize = 512;

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
    pub x0: u64,
    pub y0: f64,
    pub slope: f64,
}

impl Line {
    pub fn at(&self, x: u64) -> f64 {
        self.y0 + self.slope * (x as f64 - self.x0 as f64)
    }
}

/// What happened to a sample offered to the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
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
}

impl Envelope {
    /// Samples in the window.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

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

    /// The lowest delay in the window.
    pub fn min_y(&self) -> Option<i64> {
        self.samples.iter().map(|s| s.1).min()
    }

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
        if let Some((lx, ly)) = self.low.take() {
            self.insert(lx, ly, window_ns);
        }
        self.insert(x, y, window_ns);
        self.refit();
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
    }
}

/// The best supporting line of the lower hull at the mean x (see the module doc).
pub fn lower_fit(pts: &[(u64, i64)]) -> Option<Line> {
    let first = pts.first()?;
    let x0 = first.0;
    let rel: Vec<(i128, i128)> = pts.iter().map(|&(x, y)| (i128::from(x - x0), i128::from(y))).collect();
    let mut hull: Vec<(i128, i128)> = Vec::with_capacity(rel.len());
    for &p in &rel {
        // Among equal x keep the lowest point.
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
            let cross = (b.0 - a.0) * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0);
            if cross <= 0 {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(p);
    }
    if hull.len() == 1 {
        return Some(Line { x0, y0: hull[0].1 as f64, slope: 0.0 });
    }
    let span = rel.last().map_or(0, |p| p.0);
    let mut slope = hull_slope(&hull, &rel);
    if span as u64 >= THIRDS_SPAN_NS {
        // Long baseline: detrended by the hull's slope, the line through the
        // lowest points of the window's first and last thirds. Its slope errs by the
        // noise over half the span; the hull edge at the mean can be two
        // close points, whose slope, extrapolated to the window's end, errs
        // by far more.
        let r = |p: &(i128, i128)| p.1 as f64 - slope * p.0 as f64;
        // First and last third: the baseline is at least a third of the span
        // (halves' minima can sit side by side at the boundary).
        let lowest = |first: bool| {
            rel.iter()
                .filter(|p| if first { p.0 * 3 < span } else { p.0 * 3 >= span * 2 })
                .min_by(|a, b| r(a).total_cmp(&r(b)))
                .copied()
        };
        let enough = |first: bool| {
            rel.iter().filter(|p| if first { p.0 * 3 < span } else { p.0 * 3 >= span * 2 }).count() >= THIRD_SAMPLES
        };
        if let (true, true, Some(a), Some(b)) = (enough(true), enough(false), lowest(true), lowest(false)) {
            if b.0 > a.0 {
                slope += (r(&b) - r(&a)) / (b.0 - a.0) as f64;
            }
        }
    }
    // The supporting line with that slope: below every point, touching one.
    let y0 = rel.iter().map(|p| p.1 as f64 - slope * p.0 as f64).fold(f64::INFINITY, f64::min);
    Some(Line { x0, y0, slope })
}

/// The slope of the lower hull's edge spanning the mean x (the LP optimum).
fn hull_slope(hull: &[(i128, i128)], rel: &[(i128, i128)]) -> f64 {
    let mean = rel.iter().map(|p| p.0 as f64).sum::<f64>() / rel.len() as f64;
    let i = hull.windows(2).position(|w| (w[1].0 as f64) >= mean).unwrap_or(hull.len() - 2);
    let (a, b) = (hull[i], hull[i + 1]);
    (b.1 - a.1) as f64 / (b.0 - a.0) as f64
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
    fn single_and_duplicate_x() {
        assert_eq!(lower_fit(&[]), None);
        let l = lower_fit(&[(5, 10), (5, 7)]).unwrap();
        assert_eq!((l.y0, l.slope), (7.0, 0.0));
    }
}
