//! Clocks.

/// CLOCK_REALTIME in ns since the Unix epoch (what PTP/chrony discipline, and
/// what the kernel stamps received datagrams with); 0 before 1970.
pub fn wall_ns() -> u64 {
    // clock_gettime(2) through the vDSO directly: `SystemTime::now()` and
    // `duration_since` cost as much again (6 % of the exchange's thread at
    // 500,000 orders/s, measured).
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME) {
        Ok(t) if t.tv_sec() >= 0 => t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64,
        _ => 0,
    }
}

/// CLOCK_MONOTONIC in ns (never stepped; slewed with CLOCK_REALTIME).
fn monotonic_ns() -> i128 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec()),
        Err(_) => 0,
    }
}

/// Tries per reading of [`realtime_minus_monotonic`]: the tightest is kept.
pub const STEP_READ_TRIES: usize = 3;

/// CLOCK_REALTIME − CLOCK_MONOTONIC now, ns, and how well it is known (half
/// the time between the two monotonic readings around the realtime one; the
/// tightest of [`STEP_READ_TRIES`]). The kernel keeps the two clocks' rates
/// equal — a daemon's frequency and offset slewing moves both — so this
/// difference changes only when CLOCK_REALTIME is stepped
/// (`clock_settime`, `adjtimex(ADJ_SETOFFSET)`, a leap second), and by
/// exactly the step.
pub fn realtime_minus_monotonic() -> (i64, u64) {
    let mut best = (0i64, u64::MAX);
    for _ in 0..STEP_READ_TRIES {
        let a = monotonic_ns();
        let r = i128::from(wall_ns());
        let b = monotonic_ns();
        let half = ((b - a).max(0) as u64).div_ceil(2);
        if half < best.1 {
            best = ((r - (a + b) / 2) as i64, half);
        }
    }
    best
}

/// A step of the host's clock, as [`HostStepWatch`] saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostStep {
    /// New reading minus the reading the clock would have had, ns.
    pub delta_ns: i64,
    /// How far off `delta_ns` may be, ns.
    pub uncertainty_ns: u64,
}

/// Finds steps of CLOCK_REALTIME from successive
/// [`realtime_minus_monotonic`] readings (sans-IO: fed the readings). Any
/// change beyond the two readings' own widths (and [`HOST_STEP_MARGIN_NS`])
/// is a step; within them it is not told apart from reading noise.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostStepWatch {
    last: Option<(i64, u64)>,
    /// Steps seen so far.
    pub steps: u64,
}

/// Beyond the readings' widths, a change must exceed this to count as a step.
pub const HOST_STEP_MARGIN_NS: u64 = 20;

impl HostStepWatch {
    /// The next reading `(difference, half width)`; a step since the last one, if any.
    pub fn observe(&mut self, (diff, half): (i64, u64)) -> Option<HostStep> {
        let prev = self.last.replace((diff, half));
        let (before, half_before) = prev?;
        let delta = diff.saturating_sub(before);
        let width = half.saturating_add(half_before);
        if delta.unsigned_abs() <= width.saturating_add(HOST_STEP_MARGIN_NS) {
            // No step: keep the tighter of the two as the reference.
            if half_before < half {
                self.last = prev;
            }
            return None;
        }
        self.steps += 1;
        Some(HostStep { delta_ns: delta, uncertainty_ns: width })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_the_change_in_realtime_minus_monotonic_and_noise_is_not() {
        let mut w = HostStepWatch::default();
        assert_eq!(w.observe((5_000, 30)), None);
        // Reading noise within the widths: no step.
        assert_eq!(w.observe((5_050, 30)), None);
        assert_eq!(w.observe((4_960, 40)), None);
        // A 1-ms step back (from the tighter of the readings before, 5,050 ± 30), then one forward.
        assert_eq!(w.observe((-995_000, 30)), Some(HostStep { delta_ns: -1_000_050, uncertainty_ns: 60 }));
        assert_eq!(w.observe((-994_990, 10)), None);
        assert_eq!(w.observe((5_000, 10)), Some(HostStep { delta_ns: 999_990, uncertainty_ns: 20 }));
        assert_eq!(w.steps, 2);
    }

    #[test]
    fn the_hosts_clocks_do_not_step_while_we_watch() {
        // On an undisturbed host the difference holds within its widths.
        let mut w = HostStepWatch::default();
        for _ in 0..1_000 {
            let r = realtime_minus_monotonic();
            assert!(r.1 < 1_000_000, "{r:?}");
            let _ = w.observe(r);
        }
        assert_eq!(w.steps, 0);
    }
}
