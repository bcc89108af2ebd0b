//! Experiments: each builds its configurations, runs them, and returns rows
//! that serialize to `summary.json`.

use fairfeed_tree::node::{DeadlineRule, NodeConfig};
use fairfeed_tree::plan::{plan, PlanRequest};
use serde::Serialize;

use crate::engine::{run, ClockResult, RunResult, SimConfig, SimSync};
use crate::model::{ClockModel, LinkModel, ModelFile};

/// One row of the fairness experiment (Jasper's table 3 and figure 11): the
/// scheme and its tree, and the run's measures flattened beside them.
#[derive(Debug, Clone, Serialize)]
pub struct FairnessRow {
    pub scheme: String,
    pub hedge: usize,
    pub fanout: usize,
    pub depth: usize,
    /// Busiest node's egress load: copies per message × per-copy cost × rate.
    /// Above 1 its queue grows without bound and latencies grow with run length.
    pub busiest_node_load: f64,
    #[serde(flatten)]
    pub run: RunResult,
}

/// Settings shared by the fairness runs.
#[derive(Debug, Clone)]
pub struct FairnessConfig {
    pub receivers: usize,
    pub hedge: usize,
    pub seed: u64,
    pub messages: u64,
    pub rate_per_s: f64,
    pub model: ModelFile,
    /// Target share of deliveries on time for the controller rows
    /// (for a P(F) target p at N receivers, about 1 − (1 − p)/N).
    pub target_on_time: f64,
    /// Clock synchronization on every node (the feed starts after its warm-up).
    pub sync: Option<SimSync>,
}

impl Default for FairnessConfig {
    fn default() -> Self {
        FairnessConfig {
            receivers: 100,
            hedge: 2,
            seed: 1,
            messages: 10_000,
            rate_per_s: 5_000.0,
            model: ModelFile::default(),
            target_on_time: 0.9999,
            sync: None,
        }
    }
}

fn load(topo: &fairfeed_tree::plan::Topology, c: &FairnessConfig) -> f64 {
    let copies = topo.trees[0].nodes.iter().map(|n| n.children.len() + n.hedge_targets.len()).max().unwrap_or(0);
    copies as f64 * c.model.link.copy_us * 1e-6 * c.rate_per_s
}

fn row(scheme: &str, hedge: usize, fanout: usize, depth: usize, load: f64, run: RunResult) -> FairnessRow {
    FairnessRow { scheme: scheme.into(), hedge, fanout, depth, busiest_node_load: load, run }
}

/// The six schemes of the fairness comparison, on the same seed and model:
/// direct unicast; CloudEx (direct unicast + hold-and-release); a tree; a tree
/// with hedging; Jasper (tree + hedging + hold-and-release, the paper's rule);
/// and Jasper with our deadline controller. `progress` is told each scheme.
pub fn fairness(c: &FairnessConfig, mut progress: impl FnMut(&str)) -> Result<Vec<FairnessRow>, String> {
    let n = c.receivers;
    let direct =
        plan(&PlanRequest { receivers: n, fanout: Some(n), depth: Some(1), hedge: 0, cost_model: None, trees: 1 })
            .map_err(|e| e.to_string())?;
    let tree0 = heuristic_tree(n, 0)?;
    let treeh = heuristic_tree(n, c.hedge)?;
    let base = sim_base(c, NodeConfig::default(), DeadlineRule::Paper { margin_ns: 0 });
    let no_hold = NodeConfig { hold_and_release: false, ..base.node };
    let controller = DeadlineRule::Controller { target_on_time: c.target_on_time };
    let runs: [(&str, &fairfeed_tree::plan::Topology, usize, NodeConfig, DeadlineRule); 6] = [
        ("direct-unicast", &direct, 0, no_hold, base.rule),
        ("cloudex", &direct, 0, base.node, base.rule),
        ("tree", &tree0, 0, no_hold, base.rule),
        ("tree+hedging", &treeh, c.hedge, no_hold, base.rule),
        ("jasper", &treeh, c.hedge, base.node, base.rule),
        ("jasper+controller", &treeh, c.hedge, base.node, controller),
    ];
    let mut rows = Vec::new();
    for (name, topo, hedge, node, rule) in runs {
        progress(name);
        let l = load(topo, c);
        // An overloaded sender's queue grows with every message; a short run
        // shows it as well as a long one without holding millions of copies.
        let messages = if l > 1.0 { c.messages.min(OVERLOADED_MESSAGES_MAX) } else { c.messages };
        let cfg = SimConfig { node, rule, messages, warmup_messages: (messages / 5).min(2_000), ..base.clone() };
        rows.push(row(name, hedge, topo.fanout, topo.depth, l, run(topo, &cfg)));
    }
    Ok(rows)
}

/// The paper's heuristic tree (F = 10, D = ⌈log10 N⌉) with hedging factor `hedge`.
fn heuristic_tree(receivers: usize, hedge: usize) -> Result<fairfeed_tree::plan::Topology, String> {
    plan(&PlanRequest { receivers, fanout: None, depth: None, hedge, cost_model: None, trees: 1 })
        .map_err(|e| e.to_string())
}

/// Messages simulated for a scheme whose busiest node is overloaded.
pub const OVERLOADED_MESSAGES_MAX: u64 = 1_000;

fn sim_base(c: &FairnessConfig, node: NodeConfig, rule: DeadlineRule) -> SimConfig {
    SimConfig {
        seed: c.seed,
        messages: c.messages,
        rate_per_s: c.rate_per_s,
        warmup_messages: (c.messages / 5).min(2_000),
        link: c.model.link,
        clock: c.model.clock,
        node,
        rule,
        crash: None,
        stall: None,
        slow: None,
        track: Vec::new(),
        sync: c.sync,
    }
}

/// How the fairness experiment's clocks are set (`--clock`, `--sync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSetting {
    /// The model file's clock section (default: Huygens-class ±20 ns).
    Model,
    Perfect,
    /// NTP-class raw clocks: ±10 ms, ±50 ppm, 200 ns timestamp noise.
    Ntp,
}

/// Applies `--clock`/`--sync` to a fairness configuration: the clock model,
/// and — when no link model was given and clocks are not from the model —
/// the floored cloud link model (sync needs a floor; without sync it is
/// used too, so the rows compare on one network).
pub fn with_clock(mut c: FairnessConfig, clock: ClockSetting, sync: bool, link_given: bool) -> FairnessConfig {
    match clock {
        ClockSetting::Model => {}
        ClockSetting::Perfect => c.model.clock = ClockModel::PERFECT,
        ClockSetting::Ntp => c.model.clock = ClockModel::NTP,
    }
    if clock != ClockSetting::Model && !link_given {
        c.model.link = LinkModel::CLOUD_FLOOR;
    }
    c.sync = sync.then(SimSync::default);
    c
}

/// Settings of the clock experiment.
#[derive(Debug, Clone)]
pub struct ClockConfig {
    pub receivers: usize,
    pub hedge: usize,
    pub seed: u64,
    /// Simulated seconds of feed after the synchronization warm-up.
    pub seconds: f64,
    pub rate_per_s: f64,
    pub model: ModelFile,
    pub sync: SimSync,
}

impl Default for ClockConfig {
    fn default() -> Self {
        let mut link = LinkModel::CLOUD_FLOOR;
        // 1 % of directed links have a 5 µs longer floor: asymmetry two-way sync cannot see alone.
        link.asymmetric_share = 0.01;
        link.asymmetric_us = 5.0;
        ClockConfig {
            receivers: 1_000,
            hedge: 2,
            seed: 1,
            seconds: 5.0,
            rate_per_s: 1_000.0,
            model: ModelFile { link, clock: ClockModel::NTP },
            sync: SimSync::default(),
        }
    }
}

/// The clock experiment's summary.
#[derive(Debug, Clone, Serialize)]
pub struct ClockSummary {
    pub receivers: usize,
    pub nodes: usize,
    pub seed: u64,
    #[serde(flatten)]
    pub clock: ClockResult,
    /// The fairness of the feed that ran meanwhile (Jasper + controller).
    pub pf_1us: f64,
    pub dws_p99_us: f64,
    pub late_fraction: f64,
    pub oml_p50_us: f64,
    pub lost_deliveries: u64,
    pub warmup_s: f64,
    pub feed_seconds: f64,
    pub events: u64,
    #[serde(skip)]
    pub series: Vec<(f64, f64, f64)>,
}

/// NTP-class raw clocks on every node, fairfeed's synchronization on, the
/// feed (Jasper + controller) running after the warm-up: how close each
/// node's synchronized clock stays to the reference.
pub fn clock(c: &ClockConfig) -> Result<ClockSummary, String> {
    let topo = heuristic_tree(c.receivers, c.hedge)?;
    let messages = ((c.seconds * c.rate_per_s) as u64).max(1);
    let cfg = SimConfig {
        seed: c.seed,
        messages,
        rate_per_s: c.rate_per_s,
        warmup_messages: (messages / 5).min(2_000),
        link: c.model.link,
        clock: c.model.clock,
        node: NodeConfig::default(),
        rule: DeadlineRule::Controller { target_on_time: 1.0 - 0.01 / c.receivers as f64 },
        crash: None,
        stall: None,
        slow: None,
        track: Vec::new(),
        sync: Some(c.sync),
    };
    let r = run(&topo, &cfg);
    let nodes = topo.trees[0].nodes.len();
    Ok(ClockSummary {
        receivers: c.receivers,
        nodes,
        seed: c.seed,
        clock: r.clock.clone().unwrap_or_default(),
        pf_1us: r.pf_1us,
        dws_p99_us: r.dws_p99_us,
        late_fraction: r.late_fraction,
        oml_p50_us: r.oml_p50_us,
        lost_deliveries: r.lost_deliveries,
        warmup_s: c.sync.warmup_ns as f64 / 1e9,
        feed_seconds: c.seconds,
        events: r.events,
        series: r.clock_series,
    })
}

/// One row of the depth/fan-out table (Jasper's table 1).
#[derive(Debug, Clone, Serialize)]
pub struct ShapeRow {
    pub receivers: usize,
    pub depth: usize,
    pub fanout: usize,
    pub oml_p50_us: f64,
    pub oml_p99_us: f64,
    pub busiest_node_load: f64,
}

/// Median OML of plain trees (no hedging, no holding) for each ⟨D, F⟩.
pub fn table1(c: &FairnessConfig, shapes: &[(usize, usize, usize)]) -> Result<Vec<ShapeRow>, String> {
    let node = NodeConfig { hold_and_release: false, ..NodeConfig::default() };
    let mut rows = Vec::new();
    for &(n, d, f) in shapes {
        let topo =
            plan(&PlanRequest { receivers: n, fanout: Some(f), depth: Some(d), hedge: 0, cost_model: None, trees: 1 })
                .map_err(|e| e.to_string())?;
        let l = load(&topo, c);
        let messages = if l > 1.0 { c.messages.min(OVERLOADED_MESSAGES_MAX) } else { c.messages };
        let cfg = SimConfig {
            messages,
            warmup_messages: messages / 5,
            ..sim_base(c, node, DeadlineRule::Paper { margin_ns: 0 })
        };
        let r = run(&topo, &cfg);
        rows.push(ShapeRow {
            receivers: n,
            depth: d,
            fanout: f,
            oml_p50_us: r.oml_p50_us,
            oml_p99_us: r.oml_p99_us,
            busiest_node_load: l,
        });
    }
    Ok(rows)
}

/// One row of the proxy-crash experiment.
#[derive(Debug, Clone, Serialize)]
pub struct CrashRow {
    pub receivers: usize,
    pub hedge: usize,
    /// The crashed node (a layer-0 proxy) and when it stopped, ms.
    pub crashed_node: u32,
    pub crash_at_ms: f64,
    /// Receivers that missed at least one message.
    pub receivers_with_loss: usize,
    /// (message, receiver) deliveries lost.
    pub lost_deliveries: u64,
    /// Messages some receiver never got.
    pub incomplete_messages: u64,
    pub messages: u64,
}

/// Crashes the first layer-0 proxy halfway through, for each hedging factor.
pub fn crash(c: &FairnessConfig, hedges: &[usize]) -> Result<Vec<CrashRow>, String> {
    let mut rows = Vec::new();
    for &h in hedges {
        let topo = heuristic_tree(c.receivers, h)?;
        let Some(victim) =
            topo.trees[0].nodes.iter().find(|n| n.layer == 0 && n.role == fairfeed_tree::plan::Role::Proxy)
        else {
            return Err(format!("a tree for {} receivers has no proxy to crash", c.receivers));
        };
        let at_ns = (c.messages as f64 / 2.0 / c.rate_per_s * 1e9) as u64;
        let cfg = SimConfig {
            crash: Some((victim.id, at_ns)),
            warmup_messages: 0,
            ..sim_base(c, NodeConfig::default(), DeadlineRule::Paper { margin_ns: 0 })
        };
        let r = run(&topo, &cfg);
        rows.push(CrashRow {
            receivers: c.receivers,
            hedge: h,
            crashed_node: victim.id,
            crash_at_ms: at_ns as f64 / 1e6,
            receivers_with_loss: r.receivers_with_loss,
            lost_deliveries: r.lost_deliveries,
            incomplete_messages: r.incomplete_messages,
            messages: r.messages,
        });
    }
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn fairness_markdown(rows: &[FairnessRow]) -> String {
    let mut s = String::from(
        "| scheme | N | H | F×D | OML p50 µs | OML p99 µs | DWS p50 µs | DWS p99 µs | P(F) 0 µs | P(F) 1 µs | hold mean µs | late | load |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {}×{} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {:.1} | {:.4} | {:.2}{} |\n",
            r.scheme,
            r.run.receivers,
            r.hedge,
            r.fanout,
            r.depth,
            r.run.oml_p50_us,
            r.run.oml_p99_us,
            r.run.dws_p50_us,
            r.run.dws_p99_us,
            r.run.pf_0us,
            r.run.pf_1us,
            r.run.hold_mean_us,
            r.run.late_fraction,
            r.busiest_node_load,
            if r.busiest_node_load > 1.0 { " (overloaded)" } else { "" }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> FairnessConfig {
        FairnessConfig { receivers: 30, hedge: 1, messages: 3_000, rate_per_s: 2_000.0, ..FairnessConfig::default() }
    }

    #[test]
    fn hold_and_release_shares_the_profit_and_direct_unicast_does_not() {
        let c = FairnessConfig { messages: 2_500, ..small() };
        let rows = trading(&c, |_| {}).unwrap();
        let by = |name: &str| rows.iter().find(|r| r.scheme == name).unwrap().clone();
        let du = by("direct-unicast");
        assert!(du.shares[2] + du.shares[3] < 0.05, "the last receivers lose under direct unicast: {du:?}");
        let j = by("jasper+controller");
        assert!(j.max_deviation_pp < 5.0, "every trader near 25 %: {j:?}");
        assert!(j.opportunities >= 1_900);
    }

    #[test]
    fn hedging_survives_a_proxy_crash() {
        let rows = crash(&small(), &[0, 1]).unwrap();
        assert!(rows[0].lost_deliveries > 0 && rows[0].receivers_with_loss > 0, "H=0 must lose: {:?}", rows[0]);
        assert_eq!((rows[1].lost_deliveries, rows[1].receivers_with_loss), (0, 0), "H=1 must not lose");
    }

    #[test]
    fn table_1_optimum_depth_grows_with_n() {
        let c = FairnessConfig { messages: 1_500, ..small() };
        let rows = table1(&c, &[(100, 2, 10), (100, 3, 5), (10, 1, 10), (10, 2, 4)]).unwrap();
        assert!(rows[0].oml_p50_us < rows[1].oml_p50_us, "N=100: D=2 beats D=3");
        assert!(rows[2].oml_p50_us < rows[3].oml_p50_us, "N=10: D=1 beats D=2");
    }

    #[test]
    fn duplicates_and_a_stalled_proxy_lose_nothing_and_repeat_nothing() {
        let c = small();
        let topo = heuristic_tree(30, 1).unwrap();
        let victim =
            topo.trees[0].nodes.iter().find(|n| n.layer == 0 && n.role == fairfeed_tree::plan::Role::Proxy).unwrap().id;
        let link = crate::model::LinkModel { dup: 0.05, loss: 0.0, ..c.model.link };
        let cfg = SimConfig {
            link,
            stall: Some((victim, 300_000_000, 200_000_000)),
            ..sim_base(&c, NodeConfig::default(), DeadlineRule::Paper { margin_ns: 0 })
        };
        let r = run(&topo, &cfg);
        assert_eq!(r.lost_deliveries, 0, "hedging covers the stalled proxy; duplicates are dropped");
        assert_eq!(r.incomplete_messages, 0);
        assert_eq!(r.repeated_deliveries, 0);
    }

    #[test]
    fn a_slow_proxy_hurts_less_with_hedging() {
        let c = small();
        let oml99 = |h: usize| {
            let topo = heuristic_tree(30, h).unwrap();
            let victim = topo.trees[0]
                .nodes
                .iter()
                .find(|n| n.layer == 0 && n.role == fairfeed_tree::plan::Role::Proxy)
                .unwrap()
                .id;
            let node = NodeConfig { hold_and_release: false, ..NodeConfig::default() };
            let cfg = SimConfig {
                slow: Some((victim, 0, 10_000_000_000, 500_000)),
                ..sim_base(&c, node, DeadlineRule::Paper { margin_ns: 0 })
            };
            run(&topo, &cfg).oml_p99_us
        };
        assert!(oml99(0) > 500.0, "H=0: the slow proxy's subtree waits 500 µs more");
        assert!(oml99(1) < 300.0, "H=1: a sibling's copy arrives first");
    }

    #[test]
    fn same_seed_same_result() {
        let a = serde_json_like(&fairness(&small(), |_| {}).unwrap());
        let b = serde_json_like(&fairness(&small(), |_| {}).unwrap());
        assert_eq!(a, b);
        let c = serde_json_like(&fairness(&FairnessConfig { seed: 2, ..small() }, |_| {}).unwrap());
        assert_ne!(a, c);
    }

    fn serde_json_like(rows: &[FairnessRow]) -> String {
        format!("{rows:?}")
    }

    #[test]
    fn hold_and_release_and_the_controller_do_what_they_claim() {
        let rows = fairness(&small(), |_| {}).unwrap();
        let get = |s: &str| rows.iter().find(|r| r.scheme == s).unwrap();
        // Without holding nothing is simultaneous; with it most messages are.
        assert_eq!(get("tree+hedging").run.pf_1us, 0.0);
        assert!(get("jasper").run.pf_1us > 0.5, "jasper P(F) {}", get("jasper").run.pf_1us);
        // The controller trades a little latency for fewer late deliveries.
        assert!(get("jasper+controller").run.late_fraction <= get("jasper").run.late_fraction);
        assert!(get("jasper+controller").run.pf_1us >= get("jasper").run.pf_1us);
        // Hedging cuts the tail.
        assert!(get("tree+hedging").run.oml_p99_us < get("tree").run.oml_p99_us);
        for r in &rows {
            assert_eq!(r.run.incomplete_messages, 0, "{}: lossless links lost messages", r.scheme);
            assert_eq!(r.run.repeated_deliveries, 0, "{}: a receiver delivered a message twice", r.scheme);
        }
    }
}

/// One row of the hedging experiment (Jasper figures 8 and 9).
#[derive(Debug, Clone, Serialize)]
pub struct HedgingRow {
    pub receivers: usize,
    pub hedge: usize,
    pub oml_p50_us: f64,
    pub oml_p99_us: f64,
    pub dws_p50_us: f64,
    pub dws_p99_us: f64,
    /// Median over receivers of each receiver's p50 / p99 one-way delay.
    pub receiver_owd_p50_median_us: f64,
    pub receiver_owd_p99_median_us: f64,
    pub messages: u64,
    pub events: u64,
    pub wall_s: f64,
    pub events_per_s: f64,
    #[serde(skip)]
    pub run: Option<RunResult>,
}

/// Trees with hedging factors `hedges` (no holding), on one seed and model.
pub fn hedging(
    c: &FairnessConfig,
    hedges: &[usize],
    mut progress: impl FnMut(usize),
) -> Result<Vec<HedgingRow>, String> {
    let node = NodeConfig { hold_and_release: false, ..NodeConfig::default() };
    let mut rows = Vec::new();
    for &h in hedges {
        progress(h);
        let topo = heuristic_tree(c.receivers, h)?;
        let t0 = std::time::Instant::now();
        let r = run(&topo, &sim_base(c, node, DeadlineRule::Paper { margin_ns: 0 }));
        let wall_s = t0.elapsed().as_secs_f64();
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        rows.push(HedgingRow {
            receivers: c.receivers,
            hedge: h,
            oml_p50_us: r.oml_p50_us,
            oml_p99_us: r.oml_p99_us,
            dws_p50_us: r.dws_p50_us,
            dws_p99_us: r.dws_p99_us,
            receiver_owd_p50_median_us: median(&r.receiver_owd_p50_us),
            receiver_owd_p99_median_us: median(&r.receiver_owd_p99_us),
            messages: r.messages,
            events: r.events,
            wall_s,
            events_per_s: r.events as f64 / wall_s.max(1e-9),
            run: Some(r),
        });
    }
    Ok(rows)
}

/// One scheme of the trading-fairness experiment (seed 000 §9.4, table 2).
#[derive(Debug, Clone, Serialize)]
pub struct TradingRow {
    pub scheme: String,
    /// The traders' receiver ids: the first two and the last two receivers.
    pub traders: [u32; 4],
    /// Share of the profit (opportunities won) per trader.
    pub shares: [f64; 4],
    pub wins: [u64; 4],
    pub opportunities: u64,
    /// Opportunities decided by a tie between equal timestamps (broken at random).
    pub ties: u64,
    /// Releases after their deadline, per trader.
    pub late: [u64; 4],
    /// Largest |share − 25 %|, percentage points.
    pub max_deviation_pp: f64,
}

/// Seed 000's trading experiment in the simulator: 100 receivers, of which
/// the first two and the last two trade with the same strategy. Every market
/// data message is an opportunity; each trader reacts to it the moment it is
/// delivered and stamps its order with its own (synchronized, imperfect)
/// clock; the exchange takes the earliest timestamp (appendix C), ties broken
/// at random. Profit share = share of opportunities won. Schemes: direct
/// unicast, a tree, a tree with hedging, Jasper (tree + hedging +
/// hold-and-release), Jasper with the deadline controller.
pub fn trading(c: &FairnessConfig, mut progress: impl FnMut(&str)) -> Result<Vec<TradingRow>, String> {
    use rand::{Rng, SeedableRng};
    let n = c.receivers;
    if n < 4 {
        return Err("trading needs at least 4 receivers".into());
    }
    let direct =
        plan(&PlanRequest { receivers: n, fanout: Some(n), depth: Some(1), hedge: 0, cost_model: None, trees: 1 })
            .map_err(|e| e.to_string())?;
    let tree0 = heuristic_tree(n, 0)?;
    let treeh = heuristic_tree(n, c.hedge)?;
    let ids = &treeh.receiver_ids;
    let traders = [ids[0], ids[1], ids[n - 2], ids[n - 1]];
    let base = sim_base(c, NodeConfig::default(), DeadlineRule::Paper { margin_ns: 0 });
    let no_hold = NodeConfig { hold_and_release: false, ..base.node };
    let controller = DeadlineRule::Controller { target_on_time: c.target_on_time };
    let runs: [(&str, &fairfeed_tree::plan::Topology, NodeConfig, DeadlineRule); 5] = [
        ("direct-unicast", &direct, no_hold, base.rule),
        ("tree", &tree0, no_hold, base.rule),
        ("tree+hedging", &treeh, no_hold, base.rule),
        ("jasper", &treeh, base.node, base.rule),
        ("jasper+controller", &treeh, base.node, controller),
    ];
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(c.seed ^ 0x7ad1);
    let mut rows = Vec::new();
    for (name, topo, node, rule) in runs {
        progress(name);
        let cfg = SimConfig { node, rule, track: traders.to_vec(), ..base.clone() };
        let r = run(topo, &cfg);
        // Per message: each trader's timestamp (its clock at release).
        let mut stamps: std::collections::HashMap<u64, [Option<u64>; 4]> = std::collections::HashMap::new();
        let mut late = [0u64; 4];
        for t in &r.tracked {
            if t.sequence <= cfg.warmup_messages {
                continue;
            }
            let Some(k) = traders.iter().position(|&x| x == t.receiver) else { continue };
            stamps.entry(t.sequence).or_insert([None; 4])[k] = Some(t.local_ns);
            late[k] += u64::from(t.late);
        }
        let (mut wins, mut ties) = ([0u64; 4], 0u64);
        let mut seqs: Vec<u64> = stamps.keys().copied().collect();
        seqs.sort_unstable();
        for seq in &seqs {
            let s = stamps[seq];
            let Some(best) = s.iter().flatten().min().copied() else { continue };
            let at: Vec<usize> = (0..4).filter(|&k| s[k] == Some(best)).collect();
            if at.len() > 1 {
                ties += 1;
            }
            wins[at[rng.gen_range(0..at.len())]] += 1;
        }
        let total: u64 = wins.iter().sum();
        let shares = wins.map(|w| if total > 0 { w as f64 / total as f64 } else { 0.0 });
        let max_deviation_pp = shares.iter().map(|s| (s - 0.25).abs() * 100.0).fold(0.0, f64::max);
        rows.push(TradingRow {
            scheme: name.into(),
            traders,
            shares,
            wins,
            opportunities: total,
            ties,
            late,
            max_deviation_pp,
        });
    }
    Ok(rows)
}
