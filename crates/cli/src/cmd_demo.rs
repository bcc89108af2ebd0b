//! `fairfeed demo`: a fair multicast tree on loopback, end to end, beside
//! direct unicast on the same machine in the same command.

use std::path::PathBuf;

use std::collections::HashMap;

use crate::demo_dashboard::DemoDashboard;
use anyhow::Context;
use fairfeed_feed::gen::{GenConfig, Generator};
use fairfeed_net::tree::demo::{calibrate, run_cluster, Calibration, ClusterConfig, ClusterResult, DILATION_MAX};
use fairfeed_sim::model::{ClockModel, LinkModel};
use fairfeed_sim::plot::cdf_log_svg;
use fairfeed_tree::node::{DeadlineRule, NodeConfig, ReleaseOrder};
use fairfeed_tree::plan::{plan, PlanRequest, Topology};

/// Fewest messages a configuration sends, however dilated.
const MESSAGES_MIN: u64 = 1_000;
/// Share of each configuration's messages left out as warm-up, and the fewest:
/// the controller's tail estimator needs 200 settled messages before it speaks.
const WARMUP_SHARE: f64 = 0.2;
const WARMUP_MIN: u64 = 2 * fairfeed_tree::tail::SAMPLES_MIN as u64;
/// How often receivers and proxies report (emulated ns).
const REPORT_INTERVAL_NS: u64 = 2_000_000;
/// Emulated-link lag (measured − model one-way, p50) above which the report warns, µs.
const LAG_P50_WARN_US: f64 = 5.0;
/// Share of copies more than 5 µs behind the model above which the report warns.
const LAG_SHARE_WARN: f64 = 0.05;
/// Times a run that fell behind during its warm-up is started again with more dilation.
const DILATION_RETRIES_MAX: usize = 3;
/// Release − deadline on receivers' own clocks (p99) above which the report warns, ns.
const RELEASE_LAG_WARN_NS: u64 = 10_000;

/// A time dilation: measured (`auto`) or given.
#[derive(Debug, Clone, Copy)]
pub enum Dilation {
    Auto,
    Factor(f64),
}

/// Parses `auto` or a factor in 1..=64.
fn dilation(s: &str) -> Result<Dilation, String> {
    if s == "auto" {
        return Ok(Dilation::Auto);
    }
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && (1.0..=DILATION_MAX).contains(&x) => Ok(Dilation::Factor(x)),
        _ => Err(format!("`{s}` is not `auto` or a factor in 1..={DILATION_MAX}")),
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Receivers (each a socket on its own 127.1.x.y address), 2..=1,000.
    #[arg(long, default_value_t = 100, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=1_000))]
    receivers: usize,
    /// Host seconds of feed per configuration (the emulated feed lasts this ÷ the time dilation; at least 1,000 messages).
    #[arg(long, default_value_t = 5.0, value_parser = crate::fmt::seconds)]
    seconds: f64,
    /// Multicast messages (MoldUDP64 packets) per emulated second.
    #[arg(long, default_value_t = 2_000.0, value_parser = crate::fmt::rate)]
    rate: f64,
    /// Hedging factor H (each proxy also sends to the children of H siblings), 0..=4.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=4))]
    hedge: usize,
    /// Trees the feed is sharded over by symbol (stock locate % K; market-wide messages on every tree),
    /// 1..=16. Every receiver takes every tree and delivers one merged MoldUDP64 session.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16))]
    trees: usize,
    /// Fan-out F of the tree, 2..=64 (default: the planner's choice for --receivers); the depth follows.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=64))]
    fanout: Option<usize>,
    /// Time dilation: `auto` (from the measured cost of a loopback datagram) or a factor in 1..=64.
    #[arg(long, default_value = "auto", value_parser = dilation)]
    dilation: Dilation,
    /// Feed the tree from this capture instead of a generated ITCH feed.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// The controller's target P(F) (0.5..=0.99999). A demo's run is short, so the default aims high
    /// enough that P(F) ≥ 99 % holds over its few thousand messages.
    #[arg(long, default_value_t = 0.999, value_parser = crate::fmt::target_pf)]
    target_pf: f64,
    /// Seed of every random draw (link delays, clocks, the generated feed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the report goes.
    #[arg(long, default_value = "out/demo")]
    out: PathBuf,
    /// Kept for scripts: the trading experiment now always runs.
    #[arg(long, hide = true)]
    trading: bool,
    /// The exchange's timestamp resolution in the trading experiment, ns (1..=1,000,000).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    tick_ns: u64,
    /// Jasper's deployment model for the firms' programs: 1 beside the
    /// receivers, 2 behind gateways one hop from their own hosts, 3 in
    /// enclaves behind a VM channel. For 2 and 3 the tree's real releases
    /// go over a last hop drawn as `sim experiment trading` draws it (this
    /// machine has no second host), and the report gives the fairness at
    /// the firms' programs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    model: u8,
    /// With --model 3: release early by this quantile of the channel's
    /// measured delay and hold in the enclave (0.5..=0.999999; default: the
    /// median, no hold).
    #[arg(long, value_parser = crate::cmd_sim::hold_q)]
    enclave_hold_q: Option<f64>,
    /// With --model 2: release early by this quantile of each host hop's
    /// delay, and the firms' hosts hold to the deadline on their own clocks
    /// (0.5..=0.999999; default: the median, no hold).
    #[arg(long, value_parser = crate::cmd_sim::hold_q)]
    host_hold_q: Option<f64>,
    /// Serve a live dashboard of the running tree at http://ADDR/ while the demo runs (the page of
    /// `fairfeed dashboard`, fed from the demo's nodes; its times are emulated, see the report).
    #[arg(long, value_name = "ADDR", value_parser = crate::fmt::listen_addr)]
    dashboard: Option<std::net::SocketAddr>,
}

fn payloads(a: &Args, messages: u64) -> anyhow::Result<Vec<Vec<u8>>> {
    let p: Vec<Vec<u8>> = match &a.pcap {
        Some(p) => crate::fmt::read_capture(p, None)?.into_iter().map(|d| d.payload).collect(),
        None => {
            let g = Generator::new(GenConfig {
                seed: a.seed,
                messages: (messages * 5).max(2_000),
                symbols: 100,
                ..GenConfig::default()
            })?;
            g.map(|p| p.payload).collect()
        }
    };
    anyhow::ensure!(!p.is_empty(), "no packets to send");
    Ok(p)
}

fn topologies(a: &Args) -> anyhow::Result<(Topology, Topology)> {
    let tree = plan(&PlanRequest {
        receivers: a.receivers,
        fanout: a.fanout,
        depth: None,
        hedge: a.hedge,
        cost_model: None,
        trees: a.trees,
    })
    .map_err(|e| anyhow::anyhow!("invalid tree: {e}"))?;
    let direct = plan(&PlanRequest {
        receivers: a.receivers,
        fanout: Some(a.receivers),
        depth: Some(1),
        hedge: 0,
        cost_model: None,
        trees: 1,
    })
    .map_err(|e| anyhow::anyhow!("invalid direct unicast: {e}"))?;
    Ok((tree, direct))
}

/// Everything one demo run produced.
struct Run {
    tree: Topology,
    cal: Calibration,
    jasper: ClusterResult,
    du: ClusterResult,
    /// Dilations at which the host fell behind during the warm-up (each run again with more).
    fell_behind_at: Vec<f64>,
}

/// A hold at the far end of the last hop is its own model's.
fn check_holds(a: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.enclave_hold_q.is_none() || a.model == 3,
        "--enclave-hold-q is model 3's (the enclave's hold): give --model 3"
    );
    anyhow::ensure!(
        a.host_hold_q.is_none() || a.model == 2,
        "--host-hold-q is model 2's (the firms' hosts' hold): give --model 2"
    );
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    check_holds(&a)?;
    crate::fmt::check_out_dir(&a.out)?;
    let (tree, direct) = topologies(&a)?;
    let dash = match a.dashboard {
        Some(addr) => Some(DemoDashboard::start(addr, "demo: measuring a loopback datagram (calibrating)")?),
        None => None,
    };
    let link = LinkModel::CLOUD;
    // Over K trees one feed packet becomes a packet on each tree it touches:
    // the loop carries that many more.
    let split = split_factor(&tree, &payloads(&a, MESSAGES_MIN)?);
    let mut cal = calibrate(&[&tree, &direct], &link, a.rate * split).context("measuring a loopback datagram")?;
    if let Dilation::Factor(k) = a.dilation {
        cal.dilation = k;
    }
    // Receivers release in sequence order, as the node processes do.
    let node = NodeConfig {
        report_interval_ns: REPORT_INTERVAL_NS,
        initial_owd_ns: 1_000_000,
        order: ReleaseOrder::Sequence { gap_wait_ns: fairfeed_tree::node::GAP_WAIT_DEFAULT_NS },
        ..NodeConfig::default()
    };
    let FairRun { run: jasper, cfg: base, payloads, fell_behind_at } =
        run_fair_tree(&a, &tree, &mut cal, node, dash.as_ref())?;
    let pb = crate::fmt::progress(100, "direct unicast");
    let du_cfg = ClusterConfig {
        node: NodeConfig { hold_and_release: false, ..node },
        track: traders(&direct.receiver_ids).to_vec(),
        boards: show(dash.as_ref(), "direct unicast (the baseline)", &direct, cal.dilation),
        stop_if_behind_in_warmup: false,
        ..base.clone()
    };
    let du = run_cluster(&direct, &du_cfg, &payloads, |f| pb.set_position((f * 100.0) as u64))?;
    pb.finish_and_clear();
    if let Some(d) = &dash {
        d.note("finished; writing the report");
    }
    report(&a, &Run { tree, cal, jasper, du, fell_behind_at })
}

/// The dashboard's view of one configuration (none without `--dashboard`).
fn show(
    dash: Option<&DemoDashboard>,
    what: &str,
    t: &Topology,
    dilation: f64,
) -> HashMap<u32, std::sync::Arc<fairfeed_net::tree::agent::NodeBoard>> {
    dash.map_or_else(HashMap::new, |d| {
        let title = format!(
            "demo: {what} — {} receivers, F = {}, D = {}, H = {}; emulated time ({}× dilated)",
            t.receiver_ids.len(),
            t.fanout,
            t.depth,
            t.hedge,
            dilation
        );
        d.show(title, t)
    })
}

/// The fair tree's run, its configuration, the payloads it sent and the
/// dilations the host fell behind at.
struct FairRun {
    run: ClusterResult,
    cfg: ClusterConfig,
    payloads: Vec<Vec<u8>>,
    fell_behind_at: Vec<f64>,
}

/// The fair tree's run. The calibration can be short of what this host
/// gives the loop now: if the host falls behind the emulation during the
/// warm-up, the run stops there and starts again with more dilation (auto
/// only; a few times). Returns the run, its configuration, the payloads and
/// the dilations the host fell behind at.
fn run_fair_tree(
    a: &Args,
    tree: &Topology,
    cal: &mut Calibration,
    node: NodeConfig,
    dash: Option<&DemoDashboard>,
) -> anyhow::Result<FairRun> {
    let mut fell_behind_at = Vec::new();
    loop {
        let messages = ((a.seconds * a.rate / cal.dilation) as u64).max(MESSAGES_MIN);
        let payloads = payloads(a, messages)?;
        let retry = matches!(a.dilation, Dilation::Auto)
            && cal.dilation < DILATION_MAX
            && fell_behind_at.len() < DILATION_RETRIES_MAX;
        let base = ClusterConfig {
            messages,
            rate_per_s: a.rate,
            link: LinkModel::CLOUD,
            clock: ClockModel::default(),
            node,
            rule: DeadlineRule::Quantile { target_pf: a.target_pf },
            seed: a.seed,
            warmup_messages: ((messages as f64 * WARMUP_SHARE) as u64).max(WARMUP_MIN).min(messages / 2),
            // Models 2 and 3 follow every receiver's releases over its last hop.
            track: if a.model > 1 { tree.receiver_ids.clone() } else { traders(&tree.receiver_ids).to_vec() },
            dilation: cal.dilation,
            boards: show(dash, "fair tree (hedging + hold-and-release)", tree, cal.dilation),
            stop_if_behind_in_warmup: retry,
        };
        eprintln!(
            "demo: {} receivers, {} tree(s), F = {}, D = {}, H = {}; a loopback datagram costs {:.2} µs here, so time \
             runs {}× dilated: {messages} messages per configuration",
            a.receivers,
            tree.trees.len(),
            tree.fanout,
            tree.depth,
            tree.hedge,
            cal.datagram_ns / 1e3,
            cal.dilation
        );
        let pb = crate::fmt::progress(100, "fair tree (hedging + hold-and-release)");
        let r = run_cluster(tree, &base, &payloads, |f| pb.set_position((f * 100.0) as u64))?;
        pb.finish_and_clear();
        if !r.fell_behind_in_warmup {
            return Ok(FairRun { run: r, cfg: base, payloads, fell_behind_at });
        }
        let late = r.lag_timeline.last().map_or(0.0, |t| t.1);
        let next = (cal.dilation * 1.5).ceil().min(DILATION_MAX);
        eprintln!(
            "demo: this host fell behind the emulation at {}× during the warm-up ({:.0} % of copies more than 5 µs \
             late); again at {next}×",
            cal.dilation,
            late * 100.0
        );
        fell_behind_at.push(cal.dilation);
        cal.dilation = next;
    }
}

/// Per-tree packets per feed packet when `tree`'s trees split `payloads` (1 on one tree).
fn split_factor(tree: &Topology, payloads: &[Vec<u8>]) -> f64 {
    let k = tree.trees.len();
    let Ok(mut s) = fairfeed_tree::shard::Sharder::new(k, Default::default()) else { return 1.0 };
    if k == 1 || payloads.is_empty() {
        return 1.0;
    }
    let per_tree: usize = payloads.iter().map(|p| s.split(p, |_, _| {}).unwrap_or(0)).sum();
    (per_tree as f64 / payloads.len() as f64).max(1.0)
}

/// The first two and the last two receivers.
fn traders(ids: &[u32]) -> [u32; 4] {
    let n = ids.len();
    [ids[0], ids[1.min(n - 1)], ids[n.saturating_sub(2)], ids[n - 1]]
}

/// Profit shares (seed 000 §9.4, appendix C): every message is a race;
/// each trader answers it the moment its receiver releases it, stamping its
/// order with its own clock at `tick` resolution, and the exchange takes the
/// earliest stamp. The release instant is the one a receiver on its own host
/// makes — when the message fell due on its clock (`Released::due_ns`) — not
/// when the demo's one thread, turning a hundred receivers one after another,
/// reached it (that lag, a serialization no deployment has, is reported
/// apart as the release error). A tie among k traders gives each 1/k.
fn shares(r: &ClusterResult, ids: &[u32], tick: u64) -> fairfeed_sim::experiment::RaceShares {
    let t = traders(ids);
    let mut at: std::collections::BTreeMap<u64, [Option<u64>; 4]> = std::collections::BTreeMap::new();
    for &(rx, seq, ns, _) in &r.tracked {
        if seq <= r.warmup_messages {
            continue;
        }
        if let Some(k) = t.iter().position(|&x| x == rx) {
            at.entry(seq).or_insert([None; 4])[k] = Some(ns / tick.max(1));
        }
    }
    fairfeed_sim::experiment::race_shares(at.into_values())
}

/// Why the figures may not be what the model says (empty when they are).
fn warnings(r: &Run) -> Vec<String> {
    let mut w = Vec::new();
    // At the largest dilation the loop is not short of emulated time: the
    // machine is busy (other processes take its cores).
    let remedy = if r.cal.dilation >= DILATION_MAX {
        "the dilation is at its largest, so the machine is busy elsewhere: try fewer --receivers or a quieter machine"
    } else {
        "try a larger --dilation, or a quieter machine"
    };
    for (name, x) in [("fair tree", &r.jasper), ("direct unicast", &r.du)] {
        if x.link_lag_p50_us > LAG_P50_WARN_US || x.link_lag_share > LAG_SHARE_WARN {
            w.push(format!(
                "{name}: the machine could not keep up — copies reached the next node {:.1} µs (p50) / {:.1} µs (p99) \
                 later than the emulated link says, {:.1} % of them more than 5 µs late{}; latencies include that \
                 backlog ({remedy})",
                x.link_lag_p50_us,
                x.link_lag_p99_us,
                x.link_lag_share * 100.0,
                behind_when(&x.lag_timeline)
            ));
        } else if let Some(worst) = x.lag_timeline.iter().map(|t| t.1).reduce(f64::max).filter(|&s| s > LAG_SHARE_WARN)
        {
            w.push(format!(
                "{name}: the machine fell behind for part of the run — up to {:.0} % of copies more than 5 µs late{} \
                 ({remedy})",
                worst * 100.0,
                behind_when(&x.lag_timeline)
            ));
        }
        if x.release_error_p99_ns > RELEASE_LAG_WARN_NS {
            w.push(format!(
                "{name}: releases ran up to {:.1} µs (p99) after their deadline: the loop could not release every \
                 receiver on time ({remedy})",
                x.release_error_p99_ns as f64 / 1e3
            ));
        }
        if x.lost > 0 {
            w.push(format!(
                "{name}: {} deliveries lost (the emulated links lose nothing: the kernel dropped them)",
                x.lost
            ));
        }
    }
    w
}

/// When in the run the host was behind: " from 40 % to 75 % of the run", or "".
fn behind_when(timeline: &[(f64, f64)]) -> String {
    let behind: Vec<f64> = timeline.iter().filter(|t| t.1 > LAG_SHARE_WARN).map(|t| t.0).collect();
    match (behind.first(), behind.last()) {
        (Some(a), Some(b)) if a == b => {
            format!(" (behind in one stretch of {}, at {:.0} % of the run)", timeline.len(), a * 100.0)
        }
        (Some(a), Some(b)) => format!(
            " (behind in {} of {} stretches, from {:.0} % to {:.0} % of the run)",
            behind.len(),
            timeline.len(),
            a * 100.0,
            b * 100.0
        ),
        _ => String::new(),
    }
}

fn summary(a: &Args, r: &Run, trading: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
    let (j, du) = (&r.jasper, &r.du);
    let mut v = serde_json::to_value(j)?;
    v["trading"] = trading.clone();
    v["du_oml_p50_us"] = du.oml_p50_us.into();
    v["du_oml_p99_us"] = du.oml_p99_us.into();
    v["du_dws_p50_us"] = du.dws_p50_us.into();
    v["du_dws_p99_us"] = du.dws_p99_us.into();
    v["du_pf_1us"] = du.pf_1us.into();
    v["du_lost"] = du.lost.into();
    v["du_link_oneway_p50_us"] = du.link_oneway_p50_us.into();
    v["du_link_model_p50_us"] = du.link_model_p50_us.into();
    v["du_link_lag_share"] = du.link_lag_share.into();
    v["hedge"] = r.tree.hedge.into();
    v["du_delivered_identical"] = du.delivered_identical.into();
    v["fanout"] = r.tree.fanout.into();
    v["depth"] = r.tree.depth.into();
    v["seconds"] = a.seconds.into();
    v["rate_per_s"] = a.rate.into();
    v["datagram_us"] = (r.cal.datagram_ns / 1e3).into();
    v["copies_per_message"] = fairfeed_net::tree::demo::copies_per_message(&r.tree).into();
    v["warnings"] = warnings(r).into();
    v["fell_behind_at_dilation"] = r.fell_behind_at.clone().into();
    Ok(v)
}

fn report(a: &Args, r: &Run) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let ids: Vec<u32> = (0..r.jasper.receivers as u32).collect();
    let (j, d) = (shares(&r.jasper, &ids, a.tick_ns), shares(&r.du, &ids, a.tick_ns));
    let trading = serde_json::json!({
        "traders": traders(&ids), "tick_ns": a.tick_ns,
        "tree_shares": j.shares, "tree_ci95": j.ci95, "tree_opportunities": j.races, "tree_ties": j.ties,
        "du_shares": d.shares, "du_ci95": d.ci95, "du_opportunities": d.races, "du_ties": d.ties,
    });
    let mut v = summary(a, r, &trading)?;
    let hop = last_hop(a, r);
    if let Some((f, sh)) = &hop {
        v["last_hop"] = serde_json::to_value(f)?;
        v["last_hop"]["shares"] = serde_json::json!({"shares": sh.shares, "ci95": sh.ci95, "opportunities": sh.races});
    }
    std::fs::write(a.out.join("summary.json"), serde_json::to_string_pretty(&v)?)?;
    let md = crate::demo_report::markdown(
        &crate::demo_report::Facts {
            receivers: r.jasper.receivers,
            fanout: r.tree.fanout,
            depth: r.tree.depth,
            hedge: r.tree.hedge,
            seconds: a.seconds,
            rate: a.rate,
            target_pf: a.target_pf,
            tick_ns: a.tick_ns,
            cal: r.cal,
            copies: fairfeed_net::tree::demo::copies_per_message(&r.tree),
            traders: traders(&ids),
            fell_behind_at: r.fell_behind_at.clone(),
            shares: [j, d],
        },
        &r.jasper,
        &r.du,
        &warnings(r),
    );
    let md = match &hop {
        Some((f, sh)) => md + &last_hop_md(f, sh),
        None => md,
    };
    std::fs::write(a.out.join("report.md"), &md)?;
    print!("{md}");
    plots(a, r);
    std::fs::write(a.out.join("report.html"), crate::demo_report::html(&md))?;
    eprintln!("demo: report in {} (and report.html)", a.out.join("report.md").display());
    Ok(())
}

/// Models 2 and 3: the tree's releases over each receiver's drawn last hop
/// (`fairfeed_sim::trading::last_hop_figures`), and the four traders'
/// shares at their programs.
fn last_hop(
    a: &Args,
    r: &Run,
) -> Option<(fairfeed_sim::trading::LastHopFigures, fairfeed_sim::experiment::RaceShares)> {
    use fairfeed_sim::trading::DeployModel;
    let model = match a.model {
        2 => DeployModel::Gateway,
        3 => DeployModel::Enclave,
        _ => return None,
    };
    let ids = &r.tree.receiver_ids;
    let index: HashMap<u32, usize> = ids.iter().enumerate().map(|(k, &id)| (id, k)).collect();
    let releases: Vec<(usize, u64, u64)> =
        r.jasper.tracked.iter().filter_map(|&(rx, seq, _, at)| index.get(&rx).map(|&k| (k, seq, at))).collect();
    let f = fairfeed_sim::trading::last_hop_figures(
        model,
        a.enclave_hold_q.or(a.host_hold_q),
        ids.len(),
        &releases,
        r.jasper.warmup_messages,
        a.seed,
    );
    let t = traders(ids);
    let mut at: std::collections::BTreeMap<u64, [Option<u64>; 4]> = std::collections::BTreeMap::new();
    for &(k, seq, ns) in &f.arrivals {
        if seq <= r.jasper.warmup_messages {
            continue;
        }
        if let Some(p) = t.iter().position(|&x| x == ids[k]) {
            at.entry(seq).or_insert([None; 4])[p] = Some(ns / a.tick_ns.max(1));
        }
    }
    let sh = fairfeed_sim::experiment::race_shares(at.into_values());
    Some((f, sh))
}

/// The report's section on models 2 and 3.
fn last_hop_md(f: &fairfeed_sim::trading::LastHopFigures, sh: &fairfeed_sim::experiment::RaceShares) -> String {
    let what = if f.model == 2 {
        format!(
            "behind gateways: each receiver forwards to its firm's own host over one more hop (per host a propagation \
             delay uniform in 10–40 µs plus queueing, lognormal with median 1 µs){}",
            f.host_hold_q.map_or(String::new(), |q| format!(
                ", early by the hop's {q} quantile, and each host holds to the aim on its own clock (σ {} ns from \
                 its gateway's)",
                fairfeed_sim::trading::HOST_SYNC_SIGMA_NS
            ))
        )
    } else {
        format!(
            "in enclaves: each receiver forwards over a VM → enclave channel (lognormal, median 30 µs, p90 50 µs){}",
            f.enclave_hold_q.map_or(String::new(), |q| format!(
                ", early by the channel's {q} quantile, and the enclave holds to the aim"
            ))
        )
    };
    let shares: Vec<String> = sh.shares.iter().map(|x| format!("{:.1} %", x * 100.0)).collect();
    format!(
        "\n## The firms' programs (model {})\n\nThe firms run {what}. Each release point forwards early by its hop's \
         probed {}, against a budget of {:.1} µs added to every release (the largest lead). The hop is **drawn**, \
         as `fairfeed sim experiment trading` draws it — this machine has no second host — on the tree's real \
         releases above.\n\n| at the firms' programs | value |\n|---|---|\n| messages every firm got | {} |\n\
         | delivery window p50 / p99 | {:.2} / {:.2} µs |\n| P(F@1µs) / P(F@5µs) | {:.4} / {:.4} |\n\
         | receiver release → program, p50 / p99 | {:.1} / {:.1} µs |\n| the four traders' shares (orders stamped with the true instant each program got the message) | {} (± {:.1} %) |\n",
        f.model,
        f.enclave_hold_q.or(f.host_hold_q).map_or("median".to_string(), |q| format!("{q} quantile")),
        f.budget_us,
        f.messages,
        f.window_p50_us,
        f.window_p99_us,
        f.pf_1us,
        f.pf_5us,
        f.added_p50_us,
        f.added_p99_us,
        shares.join(" / "),
        sh.ci95.iter().copied().fold(0.0, f64::max) * 100.0,
    )
}

fn plots(a: &Args, r: &Run) {
    let (j, du) = (&r.jasper, &r.du);
    let names = ["fair tree", "direct unicast"];
    let oml = vec![(names[0].to_string(), j.oml_us.clone()), (names[1].to_string(), du.oml_us.clone())];
    let dws = vec![(names[0].to_string(), j.dws_us.clone()), (names[1].to_string(), du.dws_us.clone())];
    let hold = vec![(names[0].to_string(), j.hold_us.clone())];
    for (file, title, x, series, floor) in [
        ("oml_cdf.svg", "Send → last receiver (OML), emulated µs; left is faster", "OML (µs, log)", &oml, 1.0),
        ("dws_cdf.svg", "Delivery window, emulated µs; left is fairer", "delivery window (µs, log)", &dws, 0.001),
        ("hold_cdf.svg", "Hold time at receivers (on-time messages)", "hold (µs, log)", &hold, 0.1),
    ] {
        for f in [file.to_string(), file.replace(".svg", ".png")] {
            if let Err(e) = cdf_log_svg(&a.out.join(&f), title, x, series, floor) {
                eprintln!("demo: could not draw {f}: {e}");
            }
        }
    }
}
