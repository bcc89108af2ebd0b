//! The clock core on an in-memory network with true time: random graphs,
//! offsets, drifts, timestamp noise, queueing, asymmetric links and clock
//! steps. Errors are measured against the truth.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use fairfeed_clock::graph::{peers, Member};
use fairfeed_clock::{ClockSync, SyncConfig};
use fairfeed_wire::overlay::ProbeRepr;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rand_distr::{Distribution, Exp};

#[derive(Clone, Copy)]
struct TrueClock {
    offset_ns: f64,
    drift: f64,
    /// (true time, jump ns)
    step: Option<(u64, f64)>,
}

impl TrueClock {
    fn local(&self, t: u64) -> u64 {
        let jump = match self.step {
            Some((at, j)) if t >= at => j,
            _ => 0.0,
        };
        (1e12 + t as f64 * (1.0 + self.drift) + self.offset_ns + jump) as u64
    }
}

/// A probe in flight: (arrival ns, order, from, to, bytes).
type InFlight = Reverse<(u64, u64, u32, u32, [u8; 72])>;

struct World {
    nodes: Vec<ClockSync>,
    clocks: Vec<TrueClock>,
    /// (from, to) → extra minimum delay on that direction, ns
    asym: Vec<(u32, u32, u64)>,
    /// (from, to, start, end, extra ns): a direction whose floor is higher
    /// for a while (a congested or rerouted path), in true time.
    episodes: Vec<(u32, u32, u64, u64, u64)>,
    /// (from, to, e-15): probes from → to advertise a drift this much off.
    bad_drift: Vec<(u32, u32, i64)>,
    floor_ns: u64,
    unqueued: f64,
    noise_ns: f64,
    rng: ChaCha12Rng,
    queue: BinaryHeap<InFlight>,
    timers: BinaryHeap<Reverse<(u64, u32)>>,
    order: u64,
    started: bool,
    /// Each node's armed timer (true time), to skip stale heap entries.
    armed: Vec<u64>,
    /// Steps the host measures and tells its node of: (node, how far the
    /// measured size is off, the uncertainty it gives), told before the
    /// node's first event at or after the step.
    announced: Vec<(u32, i64, u64)>,
}

impl World {
    fn new(n: usize, random: usize, seed: u64, spread_ns: f64, drift_ppm: f64) -> World {
        let members: Vec<Member> =
            (0..n as u32).map(|i| Member { id: i, parents: if i == 0 { vec![] } else { vec![(i - 1) / 4] } }).collect();
        let graph = peers(&members, random, seed);
        World::with_graph(&members, &graph, seed, spread_ns, drift_ppm)
    }

    /// Node 0 is the reference; `graph` says who probes whom.
    fn with_graph(
        members: &[Member],
        graph: &std::collections::BTreeMap<u32, Vec<u32>>,
        seed: u64,
        spread_ns: f64,
        drift_ppm: f64,
    ) -> World {
        let n = members.len();
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        let cfg = SyncConfig::default();
        let strides = fairfeed_clock::graph::strides(members, graph, cfg.peer_budget);
        let rates = fairfeed_clock::graph::rates(members, cfg.rate_max);
        let nodes = graph
            .iter()
            .map(|(&id, p)| {
                let mut c = ClockSync::new(id, p, id == 0, cfg);
                c.set_strides(&strides[&id]);
                c.set_rates(rates.get(&id).map_or(&[][..], |v| &v[..]));
                c
            })
            .collect();
        let clocks = (0..n)
            .map(|_| TrueClock {
                offset_ns: rng.gen_range(-spread_ns..=spread_ns),
                drift: rng.gen_range(-drift_ppm..=drift_ppm) * 1e-6,
                step: None,
            })
            .collect();
        World {
            nodes,
            clocks,
            asym: Vec::new(),
            episodes: Vec::new(),
            bad_drift: Vec::new(),
            floor_ns: 20_000,
            unqueued: 0.3,
            noise_ns: 150.0,
            rng,
            queue: BinaryHeap::new(),
            timers: BinaryHeap::new(),
            order: 0,
            started: false,
            armed: vec![u64::MAX; n],
            announced: Vec::new(),
        }
    }

    fn noise(&mut self) -> u64 {
        if self.noise_ns > 0.0 {
            Exp::new(1.0 / self.noise_ns).map_or(0.0, |d| d.sample(&mut self.rng)) as u64
        } else {
            0
        }
    }

    fn delay(&mut self, from: u32, to: u32, t: u64) -> u64 {
        let extra = self.asym.iter().find(|a| a.0 == from && a.1 == to).map_or(0, |a| a.2)
            + self
                .episodes
                .iter()
                .filter(|e| e.0 == from && e.1 == to && (e.2..e.3).contains(&t))
                .map(|e| e.4)
                .sum::<u64>();
        let q =
            if self.rng.gen_bool(self.unqueued) { 0.0 } else { Exp::new(1.0 / 8_000.0).unwrap().sample(&mut self.rng) };
        self.floor_ns + extra + q as u64
    }

    fn run(&mut self, until: u64) {
        if !self.started {
            self.started = true;
            for id in 0..self.nodes.len() as u32 {
                self.arm(id, 0);
            }
        }
        loop {
            let tq = self.queue.peek().map(|Reverse(e)| e.0);
            let tt = self.timers.peek().map(|Reverse(e)| e.0);
            let t = match (tq, tt) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => {
                    self.tell_due(until);
                    break;
                }
            };
            self.tell_due(t.min(until));
            if t > until {
                break;
            }
            if tq == Some(t) {
                let Reverse((t, _, from, to, bytes)) = self.queue.pop().unwrap();
                let local = self.clocks[to as usize].local(t) + self.noise();
                let mut p = ProbeRepr::parse(&bytes).unwrap();
                for b in self.bad_drift.iter().filter(|b| b.0 == from && b.1 == to) {
                    p.drift_e15 += b.2;
                }
                let _ = self.nodes[to as usize].handle_probe(local, from, &p);
                self.arm(to, t);
            } else {
                let Reverse((t, id)) = self.timers.pop().unwrap();
                if self.armed[id as usize] != t {
                    continue; // moved since
                }
                self.armed[id as usize] = u64::MAX;
                let local = self.clocks[id as usize].local(t);
                if self.nodes[id as usize].next_timeout().is_none_or(|t| t > local) {
                    self.arm(id, t);
                    continue;
                }
                let mut out = Vec::new();
                self.nodes[id as usize].handle_timeout(local, &mut |to, p| out.push((to, *p)));
                for (to, p) in out {
                    let mut b = [0u8; 72];
                    p.emit(&mut b).unwrap();
                    // The stamp is taken before the packet leaves.
                    let at = t + self.noise() + self.delay(id, to, t);
                    self.order += 1;
                    self.queue.push(Reverse((at, self.order, id, to, b)));
                }
                self.arm(id, t);
            }
        }
    }

    /// Tells each node whose host announced a step by true time `upto` of
    /// it, at the step (the host's notice is at once).
    fn tell_due(&mut self, upto: u64) {
        let mut k = 0;
        while k < self.announced.len() {
            let (id, off, unc) = self.announced[k];
            match self.clocks[id as usize].step {
                Some((at, jump)) if at <= upto => {
                    self.announced.swap_remove(k);
                    let local = self.clocks[id as usize].local(at);
                    self.nodes[id as usize].clock_stepped_by(local, jump as i64 + off, unc);
                }
                _ => k += 1,
            }
        }
    }

    /// Schedules node `id`'s next timer, in true time.
    fn arm(&mut self, id: u32, now: u64) {
        let Some(due) = self.nodes[id as usize].next_timeout() else { return };
        let c = self.clocks[id as usize];
        let local_now = c.local(now);
        let t = (now + ((due.saturating_sub(local_now)) as f64 / (1.0 + c.drift)).ceil() as u64).max(now + 1);
        if t < self.armed[id as usize] {
            self.armed[id as usize] = t;
            self.timers.push(Reverse((t, id)));
        }
    }

    /// Each node's synchronized clock minus the reference's, at true time `t`, ns.
    /// Runs 15 s; returns the time, every node's error then, and the edges
    /// node `id` has flagged.
    fn settle(&mut self, id: usize) -> (u64, Vec<f64>, Vec<u32>) {
        let t = 15_000_000_000;
        self.run(t);
        let flagged = self.nodes[id].edges().filter(|e| e.2).map(|e| e.0).collect();
        (t, self.errors(t), flagged)
    }

    fn errors(&self, t: u64) -> Vec<f64> {
        // The reference's timescale (its raw clock less a step it corrected for).
        let r = self.nodes[0].now_sync(self.clocks[0].local(t)) as f64;
        (1..self.nodes.len()).map(|i| self.nodes[i].now_sync(self.clocks[i].local(t)) as f64 - r).collect()
    }
}

#[test]
fn ntp_class_clocks_converge_to_well_under_a_microsecond() {
    let mut w = World::new(60, 2, 1, 10e6, 50.0);
    w.run(20_000_000_000);
    let t = 20_000_000_000;
    let e = w.errors(t);
    let mut abs: Vec<f64> = e.iter().map(|x| x.abs()).collect();
    abs.sort_by(f64::total_cmp);
    // Raw clocks ±10 ms, ±50 ppm; 150 ns mean timestamp noise on every stamp.
    assert!(abs[abs.len() / 2] < 200.0, "median |error| {} ns: {e:?}", abs[abs.len() / 2]);
    assert!(abs[abs.len() * 9 / 10] < 400.0, "p90 |error| {} ns: {e:?}", abs[abs.len() * 9 / 10]);
    assert!(abs[abs.len() - 1] < 3_000.0, "max |error| {} ns: {e:?}", abs[abs.len() - 1]);
    for (i, n) in w.nodes.iter().enumerate().skip(1) {
        assert!(n.stats.synced, "node {i} not synced");
        assert!(n.stats.pure_pairs > 0);
        // The statistical bound covers the true error (for nearly every node).
        let _ = i;
    }
    let covered = w
        .nodes
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(i, n)| e[i - 1].abs() <= n.bound_ns(w.clocks[*i].local(t)) as f64)
        .count();
    assert!(covered as f64 >= 0.9 * (w.nodes.len() - 1) as f64, "bound covers {covered} nodes");
}

#[test]
fn an_asymmetric_link_is_flagged_and_corrected_by_the_others() {
    let mut w = World::new(40, 3, 2, 1e6, 20.0);
    // Node 17 ↔ its parent (4): 6 µs more one way than the other.
    w.asym.push((17, 4, 6_000));
    w.run(15_000_000_000);
    let e = w.errors(15_000_000_000);
    let n17 = &w.nodes[17];
    let flagged: Vec<u32> = n17.edges().filter(|e| e.2).map(|e| e.0).collect();
    // The asymmetric edge is flagged; a bystander whose residual brushed the
    // 400 ns threshold may be too (left out, harmlessly).
    assert!(flagged.contains(&4) && flagged.len() <= 2, "edges of 17: {:?}", n17.edges().collect::<Vec<_>>());
    assert!(e[16].abs() < 300.0, "node 17 error {} ns (uncorrected: 3,000)", e[16]);
    assert!(n17.stats.asymmetric_flagged >= 1);
}

#[test]
fn a_clock_step_is_detected_and_recovered() {
    let mut w = World::new(30, 2, 3, 1e6, 10.0);
    w.clocks[9].step = Some((8_000_000_000, 2_000_000.0));
    w.run(8_000_000_000);
    assert!(w.errors(7_999_000_000)[8].abs() < 300.0);
    // Within a few probe intervals node 9 knows: its edges to two peers
    // jumped at once (its own clock, not theirs). It never claims to be
    // within its limit while off.
    for k in 1..=80u64 {
        let t = 8_000_000_000 + k * 100_000_000;
        w.run(t);
        let (err, local) = (w.errors(t)[8].abs(), w.clocks[9].local(t));
        assert!(err <= 1_000.0 || !w.nodes[9].within_limit(local), "{t}: {err} ns off within the limit");
    }
    assert!(w.nodes[9].stats.own_steps > 0, "{:?}", w.nodes[9].stats);
    let e = w.errors(16_000_000_000);
    assert!(e[8].abs() < 500.0, "after the step: {} ns", e[8]);
}

#[test]
fn a_step_of_known_size_keeps_the_estimate_and_the_bound_covers_the_measurement() {
    // The host measures its step (CLOCK_REALTIME against CLOCK_MONOTONIC)
    // to within 100 ns, and is 80 ns off: the node moves everything it holds
    // on a timescale with the step taken out, stays synchronized throughout,
    // and its bound covers the 80 ns until the samples from before the step
    // have left its windows.
    // The reference (node 0) keeps its timescale the same way.
    for (id, jump) in [(9, 2_000_000.0), (9, -2_000_000.0), (9, 30_000.0), (0, 2_000_000.0), (0, -2_000_000.0)] {
        let mut w = World::new(30, 2, 3, 1e6, 10.0);
        w.clocks[id].step = Some((8_000_000_000, jump));
        w.announced.push((id as u32, 80, 100));
        w.run(8_000_000_000);
        for k in 1..=400u64 {
            let t = 8_000_000_000 + k * 20_000_000;
            w.run(t);
            let local = w.clocks[9].local(t);
            let (err, bound) = (w.errors(t)[8].abs(), w.nodes[9].bound_ns(local));
            assert!(w.nodes[9].within_limit(local), "{id} {jump}: {t}: node 9 unsynchronized after a known step");
            assert!(err <= bound as f64, "{id} {jump}: {t}: {err:.0} ns off under a {bound}-ns bound");
            assert!(err < 400.0, "{id} {jump}: {t}: {err:.0} ns off");
            // Every other node's bound holds too (its peers restart their edge to node 9).
            for (i, e) in w.errors(t).iter().enumerate() {
                let b = w.nodes[i + 1].bound_ns(w.clocks[i + 1].local(t));
                assert!(e.abs() <= b as f64, "{id} {jump}: {t}: node {} {e:.0} ns off under {b} ns", i + 1);
            }
        }
        let s = &w.nodes[id].stats;
        assert_eq!((s.own_steps, s.own_steps_kept), (1, 1), "{id} {jump}: {s:?}");
        assert_eq!(s.bad_echoes, 0, "{id} {jump}: echoes of probes sent before the step are moved, not refused");
        // Probes carry the node's stepless timescale: no peer saw a jump.
        let seen: u64 = w.nodes.iter().map(|n| n.stats.steps).sum();
        assert_eq!(seen, 0, "{id} {jump}: jumps seen on the edges");
    }
}

#[test]
fn bad_probes_are_refused_and_never_move_the_clock() {
    let mut w = World::new(10, 1, 4, 1e6, 10.0);
    w.run(6_000_000_000);
    let t = 6_000_000_000;
    let node = &mut w.nodes[3];
    let peer = node.peer_ids().next().unwrap();
    let before = (node.offset_at(1), node.stats.clone());
    let local = w.clocks[3].local(t);
    let good = ProbeRepr { target: 3, index: 0, pair: 1_000_000, tx_ns: local, ..ProbeRepr::default() };
    let cases = [
        (peer, ProbeRepr { target: 4, ..good }),
        (99, good),
        (peer, ProbeRepr { index: 2, ..good }),
        (peer, ProbeRepr { flags: 0x80, ..good }),
        (peer, ProbeRepr { tx_ns: local - 20_000_000_000, ..good }),
        (peer, ProbeRepr { offset_ps: i64::MAX, ..good }),
        (peer, ProbeRepr { drift_e15: 10_000_000_000_000, ..good }),
        (peer, ProbeRepr { pair: 1, ..good }),
    ];
    for (from, p) in cases {
        assert!(node.handle_probe(local, from, &p).is_err(), "accepted {p:?} from {from}");
    }
    assert_eq!(node.stats.refused.total(), before.1.refused.total() + cases.len() as u64);
    assert_eq!(node.offset_at(1), before.0);
    assert_eq!(node.stats.probes_received, before.1.probes_received);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]
    #[test]
    fn offsets_are_recovered_for_random_graphs_drifts_and_noise(
        seed in 0u64..1_000,
        n in 8usize..32,
        random in 2usize..4,
        drift in 0.0f64..50.0,
        noise in 0.0f64..150.0,
    ) {
        let mut w = World::new(n, random, seed, 10e6, drift);
        w.noise_ns = noise;
        w.run(20_000_000_000);
        let e = w.errors(20_000_000_000);
        let mut abs: Vec<f64> = e.iter().map(|x| x.abs()).collect();
        abs.sort_by(f64::total_cmp);
        // Two or more random peers per node, stamp noise up to 150 ns.
        // Tolerances grow with the timestamp noise (mean of the exponential on
        // every stamp); at 150 ns the figures table shows p50 ≈ 20 ns, p99 ≈ 100.
        prop_assert!(abs[abs.len() / 2] < 20.0 + 0.5 * noise, "median {} ns, errors {:?}", abs[abs.len() / 2], e);
        prop_assert!(abs[abs.len() - 1] < 100.0 + 2.0 * noise, "max {} ns, errors {:?}", abs[abs.len() - 1], e);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]
    /// Conditions the core was not tuned on — a random share (up to a tenth)
    /// of directed links asymmetric by up to 50 µs, few unqueued packets,
    /// noisy stamps, raw clocks anywhere in ±1 s and ±500 ppm: whatever the
    /// error, the bound covers it (or says it does not know), and no node
    /// is microseconds off while claiming to be within its limit.
    #[test]
    fn bounds_cover_the_truth_on_random_asymmetric_noisy_graphs(
        seed in 0u64..1_000,
        n in 10usize..28,
        asym_share in 0.0f64..0.03,
        asym_us in 5u64..50,
        unqueued in 0.05f64..0.3,
        noise in 0.0f64..1_000.0,
    ) {
        let (coverage, lying, asym) = asymmetric_case(seed, n, asym_share, asym_us, unqueued, noise);
        prop_assert!(coverage >= 0.99, "bound covers {coverage:.4} of samples; asym {asym:?}");
        prop_assert!(lying.is_empty(), "µs off within the limit: {lying:?}; asym {asym:?}");
    }
}

/// What one random asymmetric graph gives: bound coverage, the samples
/// microseconds off while within the limit, the asymmetric links.
type Lying = Vec<(usize, u64, f64, u64)>;
fn asymmetric_case(
    seed: u64,
    n: usize,
    asym_share: f64,
    asym_us: u64,
    unqueued: f64,
    noise: f64,
) -> (f64, Lying, Vec<(u32, u32, u64)>) {
    let mut w = World::new(n, 2, seed, 1e9, 500.0);
    w.noise_ns = noise;
    w.unqueued = unqueued;
    let mut rng = ChaCha12Rng::seed_from_u64(seed ^ 0xA5);
    let edges: Vec<(u32, Vec<u32>)> = w.nodes.iter().map(|c| (c.id, c.peer_ids().collect())).collect();
    for (a, peers) in edges {
        for b in peers {
            if rng.gen_bool(asym_share) {
                w.asym.push((a, b, asym_us * 1_000));
            }
        }
    }
    let (mut inside, mut total, mut lying) = (0u32, 0u32, Vec::new());
    for k in 0..10u64 {
        let t = 15_000_000_000 + k * 500_000_000;
        w.run(t);
        let e = w.errors(t);
        for (i, node) in w.nodes.iter().enumerate().skip(1) {
            let local = w.clocks[i].local(t);
            let (err, bound) = (e[i - 1].abs(), node.bound_ns(local));
            total += 1;
            inside += u32::from(err <= bound as f64);
            if err > 1_000.0 && node.within_limit(local) {
                lying.push((i, t, err, bound));
            }
        }
    }
    let coverage = f64::from(inside) / f64::from(total);
    (coverage, lying, w.asym)
}

/// Counterexamples the property above found (2026-11-28), kept. Links 1→0
/// and 3→0 — two of the reference's four children — 5 µs asymmetric the same
/// way: each good child was outvoted 2 to 1 by the two bad siblings it probes,
/// the whole graph followed them 2.5 µs off under 100-ns bounds (6.7 % of
/// samples covered). Now an anchor is set aside only on
/// [`fairfeed_clock::sync::OVERRULE_VOTES`] of uncontested peers, and a
/// dispute nobody can settle widens the bound to the hull.
#[test]
fn bounds_cover_the_truth_on_the_asymmetric_graph_of_seed_479() {
    let (coverage, lying, asym) = asymmetric_case(479, 16, 0.02380169677956323, 5, 0.05, 0.0);
    assert!(coverage >= 0.999, "bound covers {coverage:.4} of samples; asym {asym:?}");
    assert!(lying.is_empty(), "µs off within the limit: {lying:?}");
}

/// Links 0→2, 1→2 and 10→2 — three of node 2's inbound links — 7 µs slow:
/// its good siblings looked wrong, and it sat 3.5 µs off under a 190-ns
/// bound (98.3 % covered). Two peers that stand out and agree with each
/// other are a dispute, not two asymmetric links: the bound takes the hull.
#[test]
fn bounds_cover_the_truth_on_the_asymmetric_graph_of_seed_400() {
    let (coverage, lying, asym) = asymmetric_case(400, 13, 0.023840116668502793, 7, 0.05, 0.0);
    assert!(coverage >= 0.999, "bound covers {coverage:.4} of samples; asym {asym:?}");
    assert!(lying.is_empty(), "µs off within the limit: {lying:?}");
}

/// Prints the figures in docs/RESULTS.md ("Clock synchronization core"):
/// `cargo test --release -p fairfeed-clock --test network -- --ignored --nocapture`
#[test]
#[ignore]
fn figures() {
    println!("| nodes | random peers | stamp noise ns | |err| p50 ns | p90 ns | p99 ns | max ns | bound covers | pure pairs | probes sent /s/node |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (n, random, noise) in
        [(60, 2, 0.0), (60, 2, 50.0), (60, 2, 150.0), (200, 2, 50.0), (200, 3, 150.0), (60, 1, 200.0)]
    {
        let mut w = World::new(n, random, 11, 10e6, 50.0);
        w.noise_ns = noise;
        let mut all = Vec::new();
        let mut covered = 0usize;
        // After 10 s of convergence, every node every 2 s until 30 s.
        for k in 0..=10u64 {
            let t = 10_000_000_000 + k * 2_000_000_000;
            w.run(t);
            let e = w.errors(t);
            for (i, x) in e.iter().enumerate() {
                let node = &w.nodes[i + 1];
                covered += usize::from(x.abs() <= node.bound_ns(w.clocks[i + 1].local(t)) as f64);
            }
            all.extend(e.into_iter().map(f64::abs));
        }
        all.sort_by(f64::total_cmp);
        let q = |p: f64| all[((all.len() as f64 * p).ceil() as usize).clamp(1, all.len()) - 1];
        let (pairs, pure, sent) = w
            .nodes
            .iter()
            .fold((0, 0, 0), |a, n| (a.0 + n.stats.pairs, a.1 + n.stats.pure_pairs, a.2 + n.stats.probes_sent));
        println!(
            "| {n} | {random} | {noise:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} % | {:.1} % | {:.1} |",
            q(0.5),
            q(0.9),
            q(0.99),
            all[all.len() - 1],
            100.0 * covered as f64 / all.len() as f64,
            100.0 * pure as f64 / pairs.max(1) as f64,
            sent as f64 / n as f64 / 30.0,
        );
    }
}

#[test]
fn drifts_compose_exactly_down_the_tree() {
    // Noise-free links, drifts up to ±100 ppm: a node's drift is its
    // parent's seen through the edge, a·(1 − b) + b, not a + b — the product
    // term (up to 10 ppb per level) would tilt every edge's height at the
    // window's end by it times half the window.
    let mut w = World::new(21, 0, 3, 10e6, 100.0);
    w.noise_ns = 0.0;
    w.unqueued = 1.0;
    let t = 20_000_000_000;
    w.run(t);
    let r = w.clocks[0];
    for i in 1..21 {
        let c = w.clocks[i];
        let th = |t: u64| c.local(t) as f64 - r.local(t) as f64;
        let truth = (th(t + 1_000_000_000) - th(t)) / (c.local(t + 1_000_000_000) as f64 - c.local(t) as f64);
        let err_ppb = (w.nodes[i].stats.drift_ppm * 1e-6 - truth) * 1e9;
        // Integer-ns stamps leave about 1 ppb; without the product term node 17 was 19.7 ppb off.
        assert!(err_ppb.abs() < 2.0, "node {i}: drift off by {err_ppb:.3} ppb");
    }
}

#[test]
fn an_edge_is_probed_at_its_rate_in_steady_state() {
    let cfg = SyncConfig { rate_max: 4, ..SyncConfig::default() };
    let mut c = ClockSync::new(1, &[0, 2, 3], false, cfg);
    // 6 is above the cap: 4.
    c.set_rates(&[(0, 6), (2, 2)]);
    let mut sent = std::collections::BTreeMap::<u32, u64>::new();
    let mut t = 0u64;
    // Past the start-up phase, then 20 intervals.
    let end = cfg.startup_ns + 21 * cfg.interval_ns;
    while t < end {
        let counting = t >= cfg.startup_ns + cfg.interval_ns;
        c.handle_timeout(t, &mut |to, _| {
            if counting {
                *sent.entry(to).or_default() += 1;
            }
        });
        t = c.next_timeout().expect("a probe is due").max(t + 1);
    }
    // Pairs: two probes each; 4, 2 and 1 pairs per interval (±1 pair at the edges).
    let pairs = |id: u32| sent[&id] as f64 / 2.0 / 20.0;
    assert!((pairs(0) - 4.0).abs() <= 0.1, "{sent:?}");
    assert!((pairs(2) - 2.0).abs() <= 0.1, "{sent:?}");
    assert!((pairs(3) - 1.0).abs() <= 0.1, "{sent:?}");
}

#[test]
fn one_asymmetric_anchor_and_one_asymmetric_peer_do_not_outvote_two_good_anchors() {
    // 0 → {1, 2, 3} → {4, 5}: nodes 4 and 5 each receive from 1, 2 and 3,
    // and probe each other (same level). The links 4 → 1 and 4 → 5 are 5 µs
    // longer than their way back, so node 4's candidates through 1 and 5 are
    // both 2.5 µs low: two against two, and an unweighted lower median fell
    // on them and flagged the good parents (a proxy in the simulator).
    let members: Vec<Member> = (0..6u32)
        .map(|i| Member {
            id: i,
            parents: match i {
                0 => vec![],
                1..=3 => vec![0],
                _ => vec![1, 2, 3],
            },
        })
        .collect();
    let mut graph = peers(&members, 0, 1);
    graph.get_mut(&4).unwrap().push(5);
    graph.get_mut(&5).unwrap().push(4);
    let mut w = World::with_graph(&members, &graph, 4, 1e6, 20.0);
    w.asym.push((4, 1, 5_000));
    w.asym.push((4, 5, 5_000));
    let (_, e, flagged) = w.settle(4);
    assert!(e[3].abs() < 300.0, "node 4 error {} ns; edges {:?}", e[3], w.nodes[4].edges().collect::<Vec<_>>());
    assert!(flagged.contains(&1) && !flagged.contains(&2) && !flagged.contains(&3), "flagged {flagged:?}");
}

#[test]
fn a_child_of_the_reference_with_an_asymmetric_edge_to_it_is_corrected_by_its_siblings() {
    // 0 → {1, 2, 3, 4}: the reference's children, probing each other in a
    // ring (`graph::SIBLING_PEERS`). The link 1 → 0 is 5 µs longer than its
    // way back: through its only anchor node 1 sits 2.5 µs off, and an edge
    // to the reference used never to be flagged (seeds 5 and 6 of the
    // simulator: a level-1 proxy 2.5 µs off under a bound of ~110 ns).
    let members: Vec<Member> =
        (0..5u32).map(|i| Member { id: i, parents: if i == 0 { vec![] } else { vec![0] } }).collect();
    let graph = peers(&members, 0, 1);
    assert!(graph[&1].contains(&2) && graph[&1].contains(&4), "siblings in a ring: {graph:?}");
    let mut w = World::with_graph(&members, &graph, 5, 1e6, 20.0);
    w.asym.push((1, 0, 5_000));
    let (t, e, flagged) = w.settle(1);
    let n1 = &w.nodes[1];
    assert!(e[0].abs() < 300.0, "node 1 error {} ns; edges {:?}", e[0], n1.edges().collect::<Vec<_>>());
    assert_eq!(flagged, [0], "its edge to the reference flagged");
    // It says its estimate is contested (its anchor disagrees with its
    // peers), so its word cannot set aside a sibling's anchor; theirs agree.
    assert!(n1.stats.contested, "node 1 contested");
    assert!((2..5).all(|i| !w.nodes[i].stats.contested), "its siblings are not");
    assert!(e[0].abs() <= n1.bound_ns(w.clocks[1].local(t)) as f64 + 100.0, "and its bound about covers it");
    for (i, x) in e.iter().enumerate().skip(1) {
        assert!(x.abs() < 300.0, "node {} error {x} ns", i + 1);
    }
}

/// 0 → {1, 2, 3, 4} → 5, node 5 probing all four.
fn diamond(seed: u64) -> World {
    let members: Vec<Member> = (0..6u32)
        .map(|i| Member {
            id: i,
            parents: match i {
                0 => vec![],
                5 => vec![1],
                _ => vec![0],
            },
        })
        .collect();
    let graph: std::collections::BTreeMap<u32, Vec<u32>> = [
        (0, vec![1, 2, 3, 4]),
        (1, vec![0, 5]),
        (2, vec![0, 5]),
        (3, vec![0, 5]),
        (4, vec![0, 5]),
        (5, vec![1, 2, 3, 4]),
    ]
    .into_iter()
    .collect();
    World::with_graph(&members, &graph, seed, 1e6, 20.0)
}

/// Node 5's largest |error| sampled every 250 ms over [from, to] s, and when.
fn worst_of_node_5(w: &mut World, from: u64, to: u64) -> (f64, f64) {
    let mut worst = (0.0f64, 0.0);
    for k in 0..=(to - from) * 4 {
        let t = from * 1_000_000_000 + k * 250_000_000;
        w.run(t);
        let e = w.errors(t)[4];
        if e.abs() > worst.0.abs() {
            worst = (e, t as f64 / 1e9);
        }
    }
    worst
}

#[test]
fn a_peer_advertising_a_wrong_drift_does_not_tilt_the_node() {
    // Node 2's probes to node 5 advertise a drift 1 ppm off (its estimate
    // glitched, or it lies); its offset, extrapolated over one probe
    // interval, still looks right. In the simulator one such edge of ten
    // moved a receiver's slope by 0.17 ppm and its clock by 1.1 µs. Its
    // slope is left out now.
    let mut w = diamond(7);
    w.bad_drift.push((2, 5, 1_000_000_000));
    let worst = worst_of_node_5(&mut w, 12, 30);
    // 44 ns; 258 ns when its slope went into the mean.
    assert!(worst.0.abs() < 150.0, "node 5 {:.0} ns off at {:.2} s", worst.0, worst.1);
}

#[test]
fn an_edge_whose_floor_tilts_in_its_window_does_not_tilt_the_node() {
    // The path 2 → 5 is 8 µs slower from 12 s to 26 s (a congested or
    // rerouted path). Once the samples before it leave the 16-s window
    // (28 s on), that edge's lowest points are the episode's, early, and
    // the new floor, late: its line tilts (≈ 0.13 ppm, both directions
    // fitted together) while passing through the new floor near `now`.
    let mut w = diamond(8);
    w.episodes.push((2, 5, 12_000_000_000, 26_000_000_000, 8_000));
    let worst = worst_of_node_5(&mut w, 26, 44);
    // 139 ns; 488 ns when the tilted slope went into the mean.
    assert!(worst.0.abs() < 250.0, "node 5 {:.0} ns off at {:.2} s", worst.0, worst.1);
}

/// Bound coverage over many random graphs (the property's, with a wider
/// asymmetric share), one line per graph — the sweep in docs/results/clock.md:
/// `SHARE=0.2 COUNT=30 cargo test --release -p fairfeed-clock --test network -- --ignored --nocapture asymmetry_sweep`
#[test]
#[ignore]
fn asymmetry_sweep() {
    let env = |k: &str| std::env::var(k).ok();
    let max: f64 = env("SHARE").and_then(|s| s.parse().ok()).unwrap_or(0.2);
    let count: u64 = env("COUNT").and_then(|s| s.parse().ok()).unwrap_or(30);
    let mut rng = ChaCha12Rng::seed_from_u64(env("SWEEP_SEED").and_then(|s| s.parse().ok()).unwrap_or(99));
    let mut worst = 1.0f64;
    for k in 0..count {
        let seed = rng.gen_range(0..100_000u64);
        let n = rng.gen_range(10..28usize);
        let share = rng.gen_range(0.0..max);
        let us = rng.gen_range(5..50u64);
        let unq = rng.gen_range(0.05..0.3);
        let noise = rng.gen_range(0.0..1000.0);
        let (cov, lying, asym) = asymmetric_case(seed, n, share, us, unq, noise);
        worst = worst.min(cov);
        println!(
            "{k}: SEED={seed} N={n} SHARE={share} US={us} UNQ={unq} NOISE={noise}: cov {cov:.4} lying {} asym {}",
            lying.len(),
            asym.len()
        );
    }
    println!("worst coverage {worst:.4}");
}
