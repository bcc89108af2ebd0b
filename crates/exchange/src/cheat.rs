//! Cheating that shows: a firm that runs its own receiver can act on market
//! data before its release deadline (hold-and-release only holds where the
//! exchange controls the release). The exchange cannot see the firm's
//! receiver, but it can see the physics: an order for data released at
//! `deadline` cannot arrive before `deadline + response + path`, where
//! `path` is the firm's order path's one-way delay (the exchange measures its
//! floor with probes) and `response` is the firm's response time (stamped by
//! an exchange-controlled release point under DBO; 0 when the order carries
//! none — then only cheating by more than the firm's response time shows).
//!
//! Per order the detector computes the **lead**: how much earlier the order
//! came than that floor allows, `deadline + response + path_min − arrival`.
//! An honest firm's lead is ≤ 0 but for clock error and probes that missed
//! the path's true floor; a firm that releases `X` early has leads near
//! `X − (its path's queueing)`. A one-sided CUSUM (Page's test) sums
//! `lead − allowance` and flags the firm when the sum passes `threshold`:
//! one unlucky order cannot flag an honest firm, and a steady lead of a few
//! µs flags a cheater within tens of orders.
//!
//! **Bounded influence.** One order lowers the sum by at most `give`: a
//! cheater's own host releases late now and then (timer jitter, a busy
//! core), and in Page's plain test each such order — tens of µs "behind" —
//! wiped out the evidence of the orders before it. Measured with node
//! processes on a 2-vCPU VM (`crates/cli/tests/cheat.rs`), a receiver
//! cheating by 5 µs released 3 µs early at the median but ≥ 5 µs late one
//! time in six, and the plain test never flagged it in 3,000 orders; with
//! `give` = 1 µs it does within tens. An honest firm's leads sit below
//! `−allowance` (it cannot act before the deadline), so the clip changes
//! nothing for it: its sum stays at 0.

/// Tuning of the detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CheatParams {
    /// Lead each order may have for free, ns: clock error (the sync bound,
    /// ~100 ns) plus how far below the probes' floor a path may run.
    pub allowance_ns: u64,
    /// Sum of excess leads that flags a firm, ns.
    pub threshold_ns: u64,
    /// The most one order lowers the sum, ns (bounded influence: a late
    /// outlier does not erase the evidence before it).
    pub give_ns: u64,
}

impl Default for CheatParams {
    fn default() -> Self {
        CheatParams { allowance_ns: 300, threshold_ns: 20_000, give_ns: 1_000 }
    }
}

/// What the detector knows about one firm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FirmWatch {
    /// Least one-way order-path delay measured, ns.
    pub path_min_ns: Option<u64>,
    /// Path samples taken.
    pub probes: u64,
    /// Orders judged (after the first probe).
    pub orders: u64,
    /// Orders that came before any probe of the firm's path (not judged).
    pub unmeasured: u64,
    /// The CUSUM statistic, ns.
    pub cusum_ns: u64,
    /// Largest lead seen, ns (negative: every order came after the floor).
    pub max_lead_ns: i64,
    /// The firm's order count when it was flagged.
    pub flagged_after: Option<u64>,
}

/// The exchange's watch over every firm's order timing.
#[derive(Debug, Clone)]
pub struct CheatDetector {
    params: CheatParams,
    firms: Vec<FirmWatch>,
}

impl CheatDetector {
    /// A detector for `firms` firms.
    pub fn new(params: CheatParams, firms: usize) -> Self {
        assert!(params.threshold_ns > 0, "a threshold of 0 flags everyone");
        CheatDetector { params, firms: vec![FirmWatch { max_lead_ns: i64::MIN, ..FirmWatch::default() }; firms] }
    }

    /// A measured one-way delay of `firm`'s order path (a probe). Unknown firms are ignored.
    pub fn handle_path_sample(&mut self, firm: usize, owd_ns: u64) {
        if let Some(f) = self.firms.get_mut(firm) {
            f.path_min_ns = Some(f.path_min_ns.map_or(owd_ns, |m| m.min(owd_ns)));
            f.probes += 1;
        }
    }

    /// An order from `firm` arrived at `arrival_ns` (exchange clock) for data
    /// released at `deadline_ns`, the firm's response time stamped
    /// `response_ns` (None: not stamped). Returns true when this order flags
    /// the firm (once).
    pub fn handle_order(&mut self, firm: usize, deadline_ns: u64, arrival_ns: u64, response_ns: Option<i64>) -> bool {
        let p = self.params;
        let Some(f) = self.firms.get_mut(firm) else { return false };
        let Some(path) = f.path_min_ns else {
            f.unmeasured += 1;
            return false;
        };
        f.orders += 1;
        let floor = i128::from(deadline_ns) + i128::from(response_ns.unwrap_or(0)) + i128::from(path);
        let lead = (floor - i128::from(arrival_ns)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        f.max_lead_ns = f.max_lead_ns.max(lead);
        let excess = (i128::from(lead) - i128::from(p.allowance_ns)).max(-i128::from(p.give_ns));
        let step = i128::from(f.cusum_ns) + excess;
        f.cusum_ns = step.clamp(0, i128::from(u64::MAX)) as u64;
        if f.flagged_after.is_none() && f.cusum_ns > p.threshold_ns {
            f.flagged_after = Some(f.orders);
            return true;
        }
        false
    }

    /// What it knows of `firm`.
    pub fn firm(&self, firm: usize) -> Option<&FirmWatch> {
        self.firms.get(firm)
    }

    /// Firms flagged so far.
    pub fn flagged(&self) -> impl Iterator<Item = usize> + '_ {
        self.firms.iter().enumerate().filter(|(_, f)| f.flagged_after.is_some()).map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A path: 20 µs floor plus lognormal-ish queueing (median ≈ 2 µs).
    fn path(rng: &mut ChaCha8Rng, floor: u64, median: f64, sigma: f64) -> u64 {
        let z: f64 = (0..12).map(|_| rng.gen::<f64>()).sum::<f64>() - 6.0;
        floor + (median * (sigma * z).exp()) as u64
    }

    /// Orders of `firms` firms, the first releasing `cheat_ns` early; returns the detector.
    fn campaign(orders_per_firm: u64, cheat_ns: u64, stamped: bool, seed: u64) -> CheatDetector {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let firms = 4;
        let mut d = CheatDetector::new(CheatParams::default(), firms);
        // Firm 3's path is 50 µs slower and jittery.
        let shape = |f: usize| if f == 3 { (70_000, 10_000.0, 0.8) } else { (20_000, 2_000.0, 0.5) };
        for f in 0..firms {
            let (fl, m, s) = shape(f);
            for _ in 0..256 {
                let x = path(&mut rng, fl, m, s);
                d.handle_path_sample(f, x);
            }
        }
        for i in 0..orders_per_firm {
            let deadline = 1_000_000 + i * 200_000;
            for f in 0..firms {
                let (fl, m, s) = shape(f);
                let response = 2_000 + rng.gen_range(0..1_000);
                let early = if f == 0 { cheat_ns } else { 0 };
                let arrival = deadline - early + response + path(&mut rng, fl, m, s);
                d.handle_order(f, deadline, arrival, stamped.then_some(response as i64));
            }
        }
        d
    }

    #[test]
    fn a_firm_releasing_5us_early_is_flagged_within_1000_orders_and_honest_ones_never() {
        // Unstamped, the lead is the cheat less the response time (2–3 µs)
        // and queueing: it shows, more slowly, while the cheat exceeds them.
        for (stamped, cheat) in [(true, 5_000), (false, 5_000)] {
            let d = campaign(1_000, cheat, stamped, 7);
            let after = d.firm(0).and_then(|f| f.flagged_after);
            assert!(after.is_some_and(|n| n <= 1_000), "stamped {stamped}: cheater flagged after {after:?}");
            assert_eq!(d.flagged().collect::<Vec<_>>(), vec![0], "stamped {stamped}: an honest firm flagged");
        }
    }

    #[test]
    fn no_honest_firm_is_flagged_over_a_million_orders() {
        let d = campaign(250_000, 0, true, 11);
        assert_eq!(d.flagged().count(), 0, "{:?}", (0..4).map(|f| d.firm(f).copied()).collect::<Vec<_>>());
        let d = campaign(250_000, 0, false, 12);
        assert_eq!(d.flagged().count(), 0);
    }

    /// A 5-µs cheater whose host releases late one time in five (by 5–60
    /// µs) is still flagged; honest firms with the same jitter are not.
    #[test]
    fn a_cheat_behind_late_outliers_still_shows() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut d = CheatDetector::new(CheatParams::default(), 3);
        for f in 0..3 {
            for _ in 0..1_000 {
                let x = path(&mut rng, 20_000, 2_000.0, 0.5);
                d.handle_path_sample(f, x);
            }
        }
        for i in 0..3_000u64 {
            let deadline = 1_000_000 + i * 1_000_000;
            for f in 0..3 {
                let late = if rng.gen_range(0..5) == 0 { rng.gen_range(5_000..60_000) } else { 1_000 };
                let release = deadline + late - if f == 0 { 5_000 } else { 0 };
                let arrival = release + 2_000 + path(&mut rng, 20_000, 2_000.0, 0.5);
                d.handle_order(f, deadline, arrival, Some(2_000));
            }
        }
        assert!(d.firm(0).and_then(|f| f.flagged_after).is_some_and(|n| n <= 1_000), "{:?}", d.firm(0));
        assert_eq!(d.flagged().collect::<Vec<_>>(), vec![0]);
        // Page's plain test (no bound on one order's influence) loses it.
        let plain = CheatParams { give_ns: u64::MAX / 4, ..CheatParams::default() };
        let mut p = CheatDetector::new(plain, 1);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for _ in 0..1_000 {
            let x = path(&mut rng, 20_000, 2_000.0, 0.5);
            p.handle_path_sample(0, x);
        }
        for i in 0..3_000u64 {
            let deadline = 1_000_000 + i * 1_000_000;
            let late = if rng.gen_range(0..5) == 0 { rng.gen_range(5_000..60_000) } else { 1_000 };
            let arrival = deadline + late - 5_000 + 2_000 + path(&mut rng, 20_000, 2_000.0, 0.5);
            p.handle_order(0, deadline, arrival, Some(2_000));
        }
        let plain_after = p.firm(0).and_then(|f| f.flagged_after);
        let bounded_after = d.firm(0).and_then(|f| f.flagged_after);
        assert!(plain_after.is_none_or(|n| Some(n) > bounded_after), "plain {plain_after:?} vs {bounded_after:?}");
    }

    #[test]
    fn orders_before_any_probe_are_not_judged() {
        let mut d = CheatDetector::new(CheatParams::default(), 1);
        assert!(!d.handle_order(0, 100, 0, None));
        assert!(!d.handle_order(5, 100, 0, None), "unknown firm");
        assert_eq!(d.firm(0).map(|f| f.unmeasured), Some(1));
    }
}
