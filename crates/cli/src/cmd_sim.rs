//! `fairfeed sim`: experiments in the deterministic simulator.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use fairfeed_sim::experiment::{
    calibration, calibration_markdown, clock, crash, fairness, fairness_markdown, hedging, regime, regime_markdown,
    table1, with_clock, CalibrationConfig, ClockConfig, ClockSetting, FairnessConfig, RegimeConfig,
};
use fairfeed_sim::model::ModelFile;
use fairfeed_sim::montecarlo::hedging_monte_carlo;
use fairfeed_sim::plot::{bars_svg, cdf_svg, lines_svg};

#[derive(clap::Subcommand)]
pub enum Sim {
    /// Run an experiment; writes DIR/summary.json and DIR/summary.md.
    #[command(subcommand)]
    Experiment(Experiment),
}

#[derive(clap::Subcommand)]
pub enum Experiment {
    /// Direct unicast, CloudEx, tree, tree+hedging, Jasper and Jasper+controller
    /// on the same seed and link model: OML, delivery window, P(F), hold time, late share.
    Fairness {
        /// Receivers (1..=20,000).
        #[arg(long, default_value_t = 100, value_parser = receivers_range)]
        receivers: usize,
        /// Seed of every random draw (same seed, same result, bit for bit).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory (created): summary.json, summary.md and plots.
        #[arg(long)]
        out: PathBuf,
        /// Hedging factor of the hedged schemes (0..=16).
        #[arg(long, default_value_t = 2, value_parser = hedge_range)]
        hedge: usize,
        /// Trees the tree schemes shard the messages over, sharing the receivers (1..=64; message i
        /// rides tree i mod K; --rate is all trees together). Direct unicast and CloudEx have none.
        #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
        trees: usize,
        /// Multicast messages per scheme (1..=10,000,000).
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        messages: u64,
        /// Messages per second (1..=1,000,000).
        #[arg(long, default_value_t = 5_000.0, value_parser = rate_range)]
        rate: f64,
        /// A link/clock model file (TOML; the format, with examples, in docs/models/); default: the calibrated cloud model.
        #[arg(long)]
        latency_model: Option<PathBuf>,
        /// The controller's target P(F): the share of messages every receiver
        /// gets by its deadline (0.5..=0.99999). The previous (late-share)
        /// controller's row aims at a per-delivery on-time share of 1 − (1 − P(F))/N.
        #[arg(long, default_value_t = 0.99, value_parser = crate::fmt::target_pf)]
        target_pf: f64,
        /// Or give the previous controller's per-delivery on-time target directly.
        #[arg(long, value_parser = crate::fmt::target_on_time)]
        target_on_time: Option<f64>,
        /// Every node's clock: `model` (the model file's clock section; default
        /// ±20 ns), `perfect`, or `ntp` (±10 ms, ±50 ppm, 200 ns timestamp
        /// noise). Other than `model`, and without --latency-model, the link
        /// model is the floored cloud model (see docs/RESULTS.md).
        #[arg(long, value_enum, default_value_t = ClockArg::Model)]
        clock: ClockArg,
        /// fairfeed's clock synchronization on every node (the feed starts after a 10 s warm-up).
        #[arg(long, value_enum, default_value_t = OnOff::Off)]
        sync: OnOff,
        /// Only these schemes, comma-separated (default: all seven): direct-unicast,
        /// cloudex, tree, tree+hedging, jasper, jasper+late-controller, jasper+controller.
        #[arg(long, value_delimiter = ',', value_parser = scheme_name)]
        schemes: Vec<String>,
    },
    /// Clock synchronization: NTP-class raw clocks (±10 ms, ±50 ppm, 200 ns
    /// timestamp noise) on every node, fairfeed's sync on, floored cloud links
    /// with 1 % asymmetric; the feed (Jasper + controller) runs after the
    /// warm-up. Reports |synchronized − reference| over nodes and time.
    Clock {
        /// Receivers of the tree (F = 10, D = ⌈log10 N⌉, H = 2).
        #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=20_000))]
        receivers: u64,
        /// Seed of every random draw.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory (summary.json, summary.md, error.svg, error.csv).
        #[arg(long)]
        out: PathBuf,
        /// A link/clock model file (TOML); default as described above.
        #[arg(long)]
        latency_model: Option<PathBuf>,
        /// Simulated seconds of feed after the 10 s synchronization warm-up.
        #[arg(long, default_value_t = 5.0, value_parser = seconds_range)]
        seconds: f64,
        /// Feed messages per second.
        #[arg(long, default_value_t = 1_000.0, value_parser = rate_range)]
        rate: f64,
        /// Random probe peers per node, besides its parents (more: a better network solve, more probes); 0..=16.
        #[arg(long, default_value_t = 2, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=16))]
        clock_peers: usize,
        /// Most probe pairs per interval on one parent edge (edges above many
        /// nodes are probed more; 1: every edge once per interval); 1..=16.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
        clock_rate_max: u32,
        /// The P(F@1µs) the feed's deadline controller aims at (0.5..=0.99999).
        #[arg(long, default_value_t = 0.999, value_parser = crate::fmt::target_pf)]
        target_pf: f64,
    },
    /// The deadline rules against their targets: the new controller, the
    /// previous one, the paper's rule and tree + hedging, at each rate and
    /// P(F) target; achieved P(F) against the target (calibration.svg).
    Calibration {
        /// Receivers (1..=20,000); the tree is F = 10, D = ⌈log10 N⌉ with --hedge.
        #[arg(long, default_value_t = 1_000, value_parser = receivers_range)]
        receivers: usize,
        /// Seed of every random draw (same seed, same result, bit for bit).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory (created): summary.json, summary.md and plots.
        #[arg(long)]
        out: PathBuf,
        /// Hedging factor (0..=16).
        #[arg(long, default_value_t = 2, value_parser = hedge_range)]
        hedge: usize,
        /// Messages per run (1..=10,000,000); the first fifth (at most 2,000) is warm-up.
        #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        messages: u64,
        /// Message rates, comma-separated (each 1..=1,000,000 msg/s).
        #[arg(long, value_delimiter = ',', default_value = "500,1000,5000,20000", value_parser = rate_range)]
        rates: Vec<f64>,
        /// P(F) targets, comma-separated (each 0.5..=0.99999).
        #[arg(long, value_delimiter = ',', default_value = "0.9,0.99,0.999,0.9999", value_parser = crate::fmt::target_pf)]
        targets: Vec<f64>,
        /// A link/clock model file (TOML); default: the calibrated cloud model.
        #[arg(long)]
        latency_model: Option<PathBuf>,
    },
    /// Regime changes mid-run — a share of receivers turns slow, a share
    /// recovers, a layer-0 proxy crashes — under the paper's rule, the
    /// previous controller and the controller: unfair messages after the change.
    Regime {
        /// Receivers (1..=20,000).
        #[arg(long, default_value_t = 1_000, value_parser = receivers_range)]
        receivers: usize,
        /// Seed of every random draw (same seed, same result, bit for bit).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory (created): summary.json, summary.md and plots.
        #[arg(long)]
        out: PathBuf,
        /// Messages per second (1..=1,000,000).
        #[arg(long, default_value_t = 5_000.0, value_parser = rate_range)]
        rate: f64,
        /// Simulated seconds of feed (0.001..=3600); the change comes halfway.
        #[arg(long, default_value_t = 8.0, value_parser = seconds_range)]
        seconds: f64,
        /// The controllers' target P(F) (0.5..=0.99999).
        #[arg(long, default_value_t = 0.99, value_parser = crate::fmt::target_pf)]
        target_pf: f64,
        /// Share of receivers that turn slow or recover (0..=1).
        #[arg(long, default_value_t = 0.01, value_parser = share_range)]
        slow_share: f64,
        /// How much slower, µs (0..=100,000).
        #[arg(long, default_value_t = 100.0, value_parser = slow_us_range)]
        slow_us: f64,
        /// A link/clock model file (TOML) the changes apply on top of; default: the calibrated cloud model.
        #[arg(long)]
        latency_model: Option<PathBuf>,
    },
    /// Jasper's table 1: median OML of plain trees for several ⟨D, F⟩ at N = 10, 100, 1,000.
    Table1 {
        /// Seed of every random draw (same seed, same result, bit for bit).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory (created): summary.json, summary.md and plots.
        #[arg(long)]
        out: PathBuf,
        /// Multicast messages to simulate (1..=10,000,000).
        #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        messages: u64,
        /// Messages per second (1..=1,000,000).
        #[arg(long, default_value_t = 5_000.0, value_parser = rate_range)]
        rate: f64,
        /// A link/clock model file (TOML; see docs/models/); default: the calibrated cloud model.
        #[arg(long)]
        latency_model: Option<PathBuf>,
    },
    /// Jasper figures 8 and 9: trees with H = 0, 1, 2 (no holding): OML and
    /// delivery-window CDFs, OML over time, per-receiver p50/p99 one-way delays.
    Hedging {
        /// Receivers (1..=20,000).
        #[arg(long, default_value_t = 100, value_parser = receivers_range)]
        receivers: usize,
        /// Seed of every random draw (same seed, same result, bit for bit).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory (created): summary.json, summary.md and plots.
        #[arg(long)]
        out: PathBuf,
        /// Multicast messages to simulate (1..=10,000,000).
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        messages: u64,
        /// Messages per second (1..=1,000,000).
        #[arg(long, default_value_t = 5_000.0, value_parser = rate_range)]
        rate: f64,
        /// A link/clock model file (TOML; see docs/models/); default: the calibrated cloud model.
        #[arg(long)]
        latency_model: Option<PathBuf>,
    },
    /// A layer-0 proxy crashes halfway through; deliveries lost per hedging factor.
    Crash {
        /// Receivers (1..=20,000).
        #[arg(long, default_value_t = 100, value_parser = receivers_range)]
        receivers: usize,
        /// Seed of every random draw (same seed, same result, bit for bit).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory (created): summary.json, summary.md and plots.
        #[arg(long)]
        out: PathBuf,
        /// Multicast messages to simulate (1..=10,000,000).
        #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        messages: u64,
        /// Messages per second (1..=1,000,000).
        #[arg(long, default_value_t = 5_000.0, value_parser = rate_range)]
        rate: f64,
        /// A link/clock model file (TOML; see docs/models/); default: the calibrated cloud model.
        #[arg(long)]
        latency_model: Option<PathBuf>,
    },
    /// Seed 000's trading experiment (§9.4, table 2): the first two and last two
    /// receivers trade on every message; share of profit per scheme.
    Trading {
        /// Receivers (1..=20,000).
        #[arg(long, default_value_t = 100, value_parser = receivers_range)]
        receivers: usize,
        /// Hedging factor H (0..=16).
        #[arg(long, default_value_t = 2, value_parser = hedge_range)]
        hedge: usize,
        /// Seed of every random draw (same seed, same result, bit for bit).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory (created): summary.json, summary.md and plots.
        #[arg(long)]
        out: PathBuf,
        /// Market-data messages (each one an opportunity), warm-up included (1..=10,000,000).
        #[arg(long, default_value_t = 6_250, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        messages: u64,
        /// Messages per second (1..=1,000,000).
        #[arg(long, default_value_t = 5_000.0, value_parser = rate_range)]
        rate: f64,
        /// A link/clock model file (TOML; see docs/models/); default: the calibrated cloud model.
        #[arg(long)]
        latency_model: Option<PathBuf>,
        #[command(flatten)]
        untrusted: UntrustedArgs,
    },
    /// Monte Carlo of Jasper's hedging recursion (§5.2, figure 5): latency to a
    /// receiver for depths 1–4 and hedging factors 0–3, uniform hop delays.
    HedgingMc {
        /// Seed of every random draw (same seed, same result, bit for bit).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output directory (created): summary.json, summary.md and plots.
        #[arg(long)]
        out: PathBuf,
        /// Monte Carlo draws per point; 1..=10,000,000.
        #[arg(long, default_value_t = 100_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
        iterations: usize,
        /// Fan-out F of the tree; 1..=64.
        #[arg(long, default_value_t = 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=64))]
        fanout: usize,
        /// Hop delay ~ U(lo, hi): the low end, µs.
        #[arg(long, default_value_t = 10.0, value_parser = crate::fmt::us)]
        lo_us: f64,
        /// Hop delay ~ U(lo, hi): the high end, µs (at least lo).
        #[arg(long, default_value_t = 50.0, value_parser = crate::fmt::us)]
        hi_us: f64,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClockArg {
    Model,
    Perfect,
    Ntp,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

fn seconds_range(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.001, 3_600.0, "seconds")
}

fn scheme_name(s: &str) -> Result<String, String> {
    if fairfeed_sim::experiment::SCHEMES.contains(&s) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a scheme (one of {})", fairfeed_sim::experiment::SCHEMES.join(", ")))
    }
}

fn share_range(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.0, 1.0, "(a share)")
}

fn slow_us_range(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.0, 100_000.0, "µs")
}

fn receivers_range(s: &str) -> Result<usize, String> {
    let v: usize = s.parse().map_err(|_| format!("{s:?} is not a whole number"))?;
    if (1..=20_000).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s} is out of range 1..=20000 receivers"))
    }
}

fn hedge_range(s: &str) -> Result<usize, String> {
    let v: usize = s.parse().map_err(|_| format!("{s:?} is not a whole number"))?;
    if v <= 16 {
        Ok(v)
    } else {
        Err(format!("{s} is out of range 0..=16"))
    }
}

fn rate_range(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 1.0, 1_000_000.0, "messages/s")
}

pub(crate) fn read_model(p: &std::path::Path) -> anyhow::Result<ModelFile> {
    ModelFile::from_toml(&std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
}

/// The model file given, or the built-in calibrated cloud model.
fn model_or_default(p: Option<&std::path::Path>) -> anyhow::Result<ModelFile> {
    p.map_or_else(|| Ok(ModelFile::default()), read_model)
}

fn plot(path: &std::path::Path, title: &str, x: &str, series: &[(String, Vec<f64>)], clip: f64) {
    match cdf_svg(path, title, x, series, clip) {
        Ok(()) => eprintln!("sim: drew {}", path.display()),
        Err(e) => eprintln!("sim: could not draw {}: {e}", path.display()),
    }
}

/// Draws a grouped bar chart into `out`/`name` (after the summary, so the directory exists).
fn bars(out: &std::path::Path, name: &str, title: &str, y: &str, cats: &[String], series: &[(String, Vec<f64>)]) {
    let path = out.join(name);
    match bars_svg(&path, title, y, cats, series) {
        Ok(()) => eprintln!("sim: drew {}", path.display()),
        Err(e) => eprintln!("sim: could not draw {}: {e}", path.display()),
    }
}

fn write_json(out: &std::path::Path, v: &impl serde::Serialize, md: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("summary.json"), serde_json::to_string_pretty(v)?)?;
    std::fs::write(out.join("summary.md"), md)?;
    print!("{md}");
    Ok(())
}

impl Experiment {
    /// The directory the experiment writes into.
    fn out(&self) -> &std::path::Path {
        match self {
            Experiment::Fairness { out, .. }
            | Experiment::Clock { out, .. }
            | Experiment::Calibration { out, .. }
            | Experiment::Regime { out, .. }
            | Experiment::Table1 { out, .. }
            | Experiment::Hedging { out, .. }
            | Experiment::Crash { out, .. }
            | Experiment::Trading { out, .. }
            | Experiment::HedgingMc { out, .. } => out,
        }
    }
}

pub fn run(s: Sim) -> anyhow::Result<()> {
    let Sim::Experiment(e) = &s;
    // Minutes of simulation must not end in an unwritable directory.
    crate::fmt::check_out_dir(e.out())?;
    match s {
        Sim::Experiment(Experiment::Table1 { seed, out, messages, rate, latency_model }) => {
            let model = model_or_default(latency_model.as_deref())?;
            let c = FairnessConfig { seed, messages, rate_per_s: rate, model, ..FairnessConfig::default() };
            table1_cmd(&c, &out)
        }
        Sim::Experiment(Experiment::Hedging { receivers, seed, out, messages, rate, latency_model }) => {
            let model = model_or_default(latency_model.as_deref())?;
            hedging_cmd(
                FairnessConfig { receivers, seed, messages, rate_per_s: rate, model, ..FairnessConfig::default() },
                &out,
            )
        }
        Sim::Experiment(Experiment::Crash { receivers, seed, out, messages, rate, latency_model }) => {
            let model = model_or_default(latency_model.as_deref())?;
            let c = FairnessConfig { receivers, seed, messages, rate_per_s: rate, model, ..FairnessConfig::default() };
            crash_cmd(&c, &out)
        }
        Sim::Experiment(e @ Experiment::Trading { .. }) => trading_entry(e),
        Sim::Experiment(Experiment::HedgingMc { seed, out, iterations, fanout, lo_us, hi_us }) => {
            hedging_mc(seed, &out, iterations, fanout, lo_us, hi_us)
        }
        Sim::Experiment(e @ Experiment::Fairness { .. }) => fairness_entry(e),
        Sim::Experiment(e @ Experiment::Regime { .. }) => regime_entry(e),
        Sim::Experiment(e @ Experiment::Calibration { .. }) => calibration_entry(e),
        Sim::Experiment(e @ Experiment::Clock { .. }) => clock_entry(e),
    }
}

/// `sim experiment regime`: its flags into a configuration.
fn regime_entry(e: Experiment) -> anyhow::Result<()> {
    let Experiment::Regime { receivers, seed, out, rate, seconds, target_pf, slow_share, slow_us, latency_model } = e
    else {
        unreachable!("regime_entry takes sim experiment regime")
    };
    let model = model_or_default(latency_model.as_deref())?;
    let base = FairnessConfig { receivers, seed, rate_per_s: rate, target_pf, model, ..FairnessConfig::default() };
    let c = RegimeConfig { base, seconds, change_s: seconds / 2.0, slow_share, slow_us };
    regime_cmd(&c, &out)
}

/// `sim experiment calibration`: its flags into a configuration.
fn calibration_entry(e: Experiment) -> anyhow::Result<()> {
    let Experiment::Calibration { receivers, seed, out, hedge, messages, rates, targets, latency_model } = e else {
        unreachable!("calibration_entry takes sim experiment calibration")
    };
    let model = model_or_default(latency_model.as_deref())?;
    let base = FairnessConfig { receivers, hedge, seed, messages, model, ..FairnessConfig::default() };
    let label = latency_model.as_ref().map_or("calibrated cloud".to_string(), |p| p.display().to_string());
    calibration_cmd(&CalibrationConfig { base, rates, targets }, &out, &label)
}

/// `sim experiment clock`: its flags into a configuration.
fn clock_entry(e: Experiment) -> anyhow::Result<()> {
    let Experiment::Clock {
        receivers,
        seed,
        out,
        latency_model,
        seconds,
        rate,
        clock_peers,
        clock_rate_max,
        target_pf,
    } = e
    else {
        unreachable!("clock_entry takes sim experiment clock")
    };
    let mut c = ClockConfig {
        receivers: receivers as usize,
        seed,
        seconds,
        rate_per_s: rate,
        target_pf,
        ..ClockConfig::default()
    };
    c.sync.random_peers = clock_peers;
    c.sync.cfg.rate_max = clock_rate_max;
    if let Some(p) = &latency_model {
        c.model = read_model(p)?;
    }
    clock_cmd(&c, &out)
}

/// `sim experiment trading`: seed 000's table of schemes, or (with any of
/// issue 44's flags) one deployment model and ordering.
fn trading_entry(e: Experiment) -> anyhow::Result<()> {
    let Experiment::Trading { receivers, hedge, seed, out, messages, rate, latency_model, untrusted } = e else {
        anyhow::bail!("internal: trading_entry takes the trading experiment");
    };
    let model = model_or_default(latency_model.as_deref())?;
    let c = FairnessConfig { receivers, hedge, seed, messages, rate_per_s: rate, model, ..FairnessConfig::default() };
    match untrusted.setup() {
        Some(s) => trading_models_cmd(&c, &s, &out),
        None => trading_cmd(c, &out),
    }
}

fn hedging_mc(
    seed: u64,
    out: &std::path::Path,
    iterations: usize,
    fanout: usize,
    lo_us: f64,
    hi_us: f64,
) -> anyhow::Result<()> {
    anyhow::ensure!((1..=10_000_000).contains(&iterations), "--iterations must be 1..=10,000,000");
    anyhow::ensure!((2..=64).contains(&fanout), "--fanout must be 2..=64");
    anyhow::ensure!(0.0 <= lo_us && lo_us <= hi_us, "need 0 <= --lo-us <= --hi-us");
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let rows = hedging_monte_carlo(&[1, 2, 3, 4], &[0, 1, 2, 3], fanout, lo_us, hi_us, iterations, seed);
    std::fs::write(out.join("summary.json"), serde_json::to_string_pretty(&rows)?)?;
    let mut md = format!(
                "# Hedging Monte Carlo (Jasper §5.2), F = {fanout}, hops ~ U({lo_us}, {hi_us}) µs, {iterations} iterations, seed {seed}\n\n\
                 | D | H | mean µs | σ µs | p50 µs | p99 µs |\n|---|---|---|---|---|---|\n"
            );
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {:.1} | {:.2} | {:.1} | {:.1} |\n",
            r.depth, r.hedge, r.mean_us, r.sigma_us, r.p50_us, r.p99_us
        ));
    }
    std::fs::write(out.join("summary.md"), &md)?;
    print!("{md}");
    let by_depth: Vec<(String, Vec<f64>)> =
        rows.iter().filter(|r| r.hedge == 0).map(|r| (format!("D={}, H=0", r.depth), r.samples_us.clone())).collect();
    plot(
        &out.join("cdf_by_depth_h0.svg"),
        "No hedging: latency grows and spreads with depth",
        "latency (µs)",
        &by_depth,
        1.0,
    );
    let by_h: Vec<(String, Vec<f64>)> =
        rows.iter().filter(|r| r.depth == 3).map(|r| (format!("D=3, H={}", r.hedge), r.samples_us.clone())).collect();
    plot(
        &out.join("cdf_by_hedge_d3.svg"),
        "Hedging narrows the distribution and moves it left",
        "latency (µs)",
        &by_h,
        1.0,
    );
    Ok(())
}

/// Runs the fairness experiment and writes its rows, table and plots.
/// Deliveries (messages × receivers × schemes) above which a fairness run
/// first estimates its time and memory from a pilot and says so.
const ESTIMATE_ABOVE_DELIVERIES: f64 = 2e8;
/// Messages the pilot runs at most, and (messages × receivers) it aims at.
const PILOT_MESSAGES: u64 = 200;
const PILOT_DELIVERIES: u64 = 1_000_000;

/// A size in words: 2.8 GB, 410 MB.
fn bytes_text(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.0} MB", b as f64 / (1u64 << 20) as f64)
    }
}

/// A duration in words: 1 h 05 min, 12 min, 40 s.
fn seconds_text(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..=119 => format!("{s} s"),
        120..=5_999 => format!("{} min", s / 60),
        _ => format!("{} h {:02} min", s / 3_600, s / 60 % 60),
    }
}

/// Runs the schemes with a progress bar over every message they send (the
/// runs share a `Watch`); Ctrl-C (or SIGTERM, SIGHUP) stops them early —
/// each lets what it sent settle — and what was done is written. Returns
/// the rows and whether it was stopped.
fn fairness_watched(
    cfg: &FairnessConfig,
    signal: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<(Vec<fairfeed_sim::experiment::FairnessRow>, bool)> {
    use std::sync::atomic::Ordering;
    let schemes = if cfg.schemes.is_empty() { 7 } else { cfg.schemes.len() } as u64;
    let watch = std::sync::Arc::new(fairfeed_sim::engine::Watch::default());
    let cfg = FairnessConfig { watch: Some(watch.clone()), ..cfg.clone() };
    let done = std::sync::atomic::AtomicBool::new(false);
    let pb = crate::fmt::progress(cfg.messages * schemes, "simulating messages (all schemes)");
    let rows = std::thread::scope(|s| {
        s.spawn(|| {
            let mut told = false;
            while !done.load(Ordering::Relaxed) {
                pb.set_position(watch.sent.load(Ordering::Relaxed));
                if signal.load(Ordering::Relaxed) && !told {
                    told = true;
                    watch.stop.store(true, Ordering::Relaxed);
                    eprintln!("sim: stopping: what every receiver had by now is written");
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        });
        let rows = fairness(&cfg, |name| pb.set_message(format!("{name} done")));
        done.store(true, Ordering::Relaxed);
        rows
    })
    .map_err(anyhow::Error::msg)?;
    pb.finish_and_clear();
    Ok((rows, watch.stop.load(Ordering::Relaxed)))
}

fn fairness_cmd(cfg: &FairnessConfig, out: &std::path::Path, model_label: &str) -> anyhow::Result<()> {
    // Signals are ours from the start (a background job may have inherited SIGINT ignored).
    let signal = crate::fmt::stop_on_signals()?;
    let n_schemes = if cfg.schemes.is_empty() { 7 } else { cfg.schemes.len() };
    let deliveries = cfg.messages as f64 * cfg.receivers as f64 * n_schemes as f64;
    if deliveries > ESTIMATE_ABOVE_DELIVERIES {
        // A pilot of about PILOT_DELIVERIES deliveries: a few seconds at any N.
        let pilot = (PILOT_DELIVERIES / cfg.receivers as u64).clamp(10, PILOT_MESSAGES);
        eprintln!("sim: a large run ({deliveries:.1e} deliveries): estimating it from a {pilot}-message pilot …");
        let e = fairfeed_sim::experiment::fairness_estimate(cfg, pilot).map_err(anyhow::Error::msg)?;
        if signal.load(std::sync::atomic::Ordering::Relaxed) {
            anyhow::bail!("stopped during the estimate, before any scheme ran: nothing to write");
        }
        eprintln!(
            "sim: about {} and {} of memory ({} schemes on {} threads; the pilot: {} messages in {:.1} s). \
             Ctrl-C stops early and writes what was done.",
            seconds_text(e.seconds),
            bytes_text(e.bytes),
            e.schemes,
            e.threads,
            e.pilot_messages,
            e.pilot_seconds
        );
    }
    let t0 = Instant::now();
    let (rows, interrupted) = fairness_watched(cfg, &signal)?;
    let wall = t0.elapsed().as_secs_f64();
    let events: u64 = rows.iter().map(|r| r.run.events).sum();
    let stopped = if interrupted {
        let sent: Vec<String> = rows.iter().map(|r| format!("{} {}", r.scheme, r.run.messages)).collect();
        format!(
            "**Stopped early** (a signal): each scheme's figures cover the messages every receiver had by then, from \
             the first on ({}), of the {} asked for; schemes not yet started are left out.\n\n",
            sent.join(", "),
            cfg.messages
        )
    } else {
        String::new()
    };
    let md = format!(
        "# Fairness, N = {}, seed {}\n\n{stopped}{} messages per scheme at {} msg/s{}, the first {} left out as \
         warm-up (at least the deadline controller's start-up); link model: {model_label}; \
         controller target P(F) {} (previous controller: {} of deliveries on time).\n\n{}\n\n{events} events in {wall:.1} s ({:.2} M events/s).\n",
        cfg.receivers,
        cfg.seed,
        cfg.messages,
        cfg.rate_per_s,
        if cfg.trees > 1 { format!(" over {} trees (round robin)", cfg.trees) } else { String::new() },
        rows.iter().map(|r| r.run.warmup_messages).max().unwrap_or(0),
        cfg.target_pf,
        cfg.late_share_target(),
        fairness_markdown(&rows),
        events as f64 / wall / 1e6
    );
    write_json(out, &rows, &md)?;
    let stable: Vec<&fairfeed_sim::experiment::FairnessRow> =
        rows.iter().filter(|r| r.busiest_node_load <= 1.0).collect();
    let n = cfg.receivers;
    let oml: Vec<(String, Vec<f64>)> = stable.iter().map(|r| (r.scheme.clone(), r.run.oml_us.clone())).collect();
    plot(
        &out.join("oml_cdf.svg"),
        &format!("Overall multicast latency, N = {n} (overloaded schemes left out)"),
        "OML (µs)",
        &oml,
        0.995,
    );
    let dws: Vec<(String, Vec<f64>)> = stable.iter().map(|r| (r.scheme.clone(), r.run.dws_us.clone())).collect();
    plot(&out.join("dws_cdf.svg"), &format!("Delivery window, N = {n}"), "delivery window (µs)", &dws, 0.995);
    Ok(())
}

/// `sim experiment fairness`: the schemes under the chosen clocks.
fn fairness_entry(e: Experiment) -> anyhow::Result<()> {
    let Experiment::Fairness {
        receivers,
        seed,
        out,
        hedge,
        trees,
        messages,
        rate,
        latency_model,
        target_pf,
        target_on_time,
        clock,
        sync,
        schemes,
    } = e
    else {
        anyhow::bail!("internal: fairness_entry takes the fairness experiment");
    };
    anyhow::ensure!((1..=20_000).contains(&receivers), "--receivers must be 1..=20,000");
    let model = match &latency_model {
        Some(p) => read_model(p)?,
        None => ModelFile::default(),
    };
    let cfg = FairnessConfig {
        receivers,
        hedge,
        trees,
        seed,
        messages,
        rate_per_s: rate,
        model,
        target_pf,
        target_on_time,
        sync: None,
        schemes,
        watch: None,
    };
    let setting = match clock {
        ClockArg::Model => ClockSetting::Model,
        ClockArg::Perfect => ClockSetting::Perfect,
        ClockArg::Ntp => ClockSetting::Ntp,
    };
    let cfg = with_clock(cfg, setting, sync == OnOff::On, latency_model.is_some());
    let mut label = latency_model.as_ref().map_or_else(
        || if setting == ClockSetting::Model { "calibrated cloud" } else { "floored cloud" }.to_string(),
        |p| p.display().to_string(),
    );
    label.push_str(&format!(
        "; clocks: {}; sync: {}",
        match setting {
            ClockSetting::Model => "model",
            ClockSetting::Perfect => "perfect",
            ClockSetting::Ntp => "NTP-class (±10 ms, ±50 ppm, 200 ns stamps)",
        },
        if sync == OnOff::On { "on (10 s warm-up before the feed)" } else { "off" }
    ));
    fairness_cmd(&cfg, &out, &label)
}

/// Runs Jasper's table 1 and writes its rows.
/// A layer-0 proxy crashes halfway: losses per hedging factor; table and bar chart.
fn crash_cmd(c: &FairnessConfig, out: &std::path::Path) -> anyhow::Result<()> {
    let (receivers, seed, messages, rate) = (c.receivers, c.seed, c.messages, c.rate_per_s);
    let pb = crate::fmt::progress(3, "simulating hedging factors");
    let mut rows = Vec::new();
    for h in [0, 1, 2] {
        rows.extend(crash(c, &[h]).map_err(anyhow::Error::msg)?);
        pb.inc(1);
    }
    pb.finish_and_clear();
    let mut md = format!(
        "# A layer-0 proxy crashes halfway, N = {receivers}, seed {seed}, {messages} messages at {rate} msg/s\n\n\
             | H | receivers with loss | deliveries lost | messages incomplete |\n|---|---|---|---|\n"
    );
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            r.hedge, r.receivers_with_loss, r.lost_deliveries, r.incomplete_messages
        ));
    }
    write_json(out, &rows, &md)?;
    let cats: Vec<String> = rows.iter().map(|r| format!("H = {}", r.hedge)).collect();
    let lost: Vec<f64> = rows.iter().map(|r| r.lost_deliveries as f64).collect();
    let title = format!("A layer-0 proxy crashes halfway, N = {receivers}: deliveries lost");
    bars(out, "losses.svg", &title, "deliveries lost", &cats, &[("deliveries lost".into(), lost)]);
    Ok(())
}

fn table1_cmd(c: &FairnessConfig, out: &std::path::Path) -> anyhow::Result<()> {
    let (seed, messages, rate) = (c.seed, c.messages, c.rate_per_s);
    let shapes =
        [(10, 1, 10), (10, 2, 4), (100, 1, 100), (100, 2, 10), (100, 3, 5), (1000, 2, 32), (1000, 3, 10), (1000, 4, 6)];
    let pb = crate::fmt::progress(shapes.len() as u64, "simulating tree shapes");
    let mut rows = Vec::new();
    for shape in &shapes {
        rows.extend(table1(c, std::slice::from_ref(shape)).map_err(anyhow::Error::msg)?);
        pb.inc(1);
    }
    pb.finish_and_clear();
    let mut md = format!(
        "# Table 1: median OML of plain trees (no hedging, no holding), seed {seed}, {messages} messages at {rate} msg/s\n\n\
         | N | D | F | OML p50 µs | OML p99 µs | busiest node load |\n|---|---|---|---|---|---|\n"
    );
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2}{} |\n",
            r.receivers,
            r.depth,
            r.fanout,
            r.oml_p50_us,
            r.oml_p99_us,
            r.busiest_node_load,
            if r.busiest_node_load > 1.0 { " (overloaded)" } else { "" }
        ));
    }
    write_json(out, &rows, &md)?;
    let cats: Vec<String> = rows.iter().map(|r| format!("{}:{}×{}", r.receivers, r.depth, r.fanout)).collect();
    let series = [
        ("OML p50".to_string(), rows.iter().map(|r| r.oml_p50_us).collect()),
        ("OML p99".to_string(), rows.iter().map(|r| r.oml_p99_us).collect()),
    ];
    bars(out, "oml.svg", "Plain trees: OML by N:D×F", "OML (µs)", &cats, &series);
    Ok(())
}

/// Runs the regime-change experiment; writes its table and rows.
fn regime_cmd(c: &RegimeConfig, out: &std::path::Path) -> anyhow::Result<()> {
    let (receivers, seed, rate, seconds) = (c.base.receivers, c.base.seed, c.base.rate_per_s, c.seconds);
    let (target_pf, slow_share, slow_us) = (c.base.target_pf, c.slow_share, c.slow_us);
    let t0 = Instant::now();
    let pb = crate::fmt::progress(9, "simulating scenarios × rules");
    let rows = regime(c, |done, _| pb.set_position(done as u64)).map_err(anyhow::Error::msg)?;
    pb.finish_and_clear();
    let md = format!(
        "# Regime changes, N = {receivers}, seed {seed}, {rate} msg/s for {seconds} s, change at {} s, \
         target P(F) {target_pf}\n\n`receivers-turn-slow`: {:.1} % of receivers become {slow_us} µs slower at \
         the change; `receivers-recover`: they were slower until it; `proxy-crash`: the first layer-0 proxy \
         stops (hedges take over). Warm-up (the first fifth of messages, at most 2,000) is excluded.\n\n{}\n\
         Simulated in {:.1} s.\n",
        c.change_s,
        slow_share * 100.0,
        regime_markdown(&rows),
        t0.elapsed().as_secs_f64()
    );
    write_json(out, &rows, &md)?;
    let cats: Vec<String> = rows.iter().map(|r| format!("{}/{}", r.scenario, r.rule)).collect();
    let series = [
        ("P(F@1µs) before, %".to_string(), rows.iter().map(|r| r.pf_before * 100.0).collect()),
        ("P(F@1µs) from 1 s after, %".to_string(), rows.iter().map(|r| r.pf_after * 100.0).collect()),
    ];
    bars(out, "pf.svg", "P(F) before and after the change, per scenario/rule", "P(F@1µs) %", &cats, &series);
    Ok(())
}

/// Runs the calibration experiment; writes its table, rows and plot.
fn calibration_cmd(c: &CalibrationConfig, out: &std::path::Path, label: &str) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let jobs = c.rates.len() * (2 + 2 * c.targets.len());
    let pb = crate::fmt::progress(jobs as u64, "simulating rules × rates × targets");
    let rows = calibration(c, |done, _| pb.set_position(done as u64)).map_err(anyhow::Error::msg)?;
    pb.finish_and_clear();
    let wall = t0.elapsed().as_secs_f64();
    let events: u64 = rows.iter().map(|r| r.events).sum();
    let md = format!(
        "# Deadline calibration, N = {}, H = {}, seed {}\n\n{} messages per run (warm-up excluded from every \
         column); link model: {label}. P(F@1µs): share of messages whose delivery window is at most 1 µs; \
         miss / target miss: (1 − P(F)) / (1 − target).\n\n{}\n{events} events in {wall:.1} s ({:.2} M events/s, {} threads).\n",
        c.base.receivers,
        c.base.hedge,
        c.base.seed,
        c.base.messages,
        calibration_markdown(&rows),
        events as f64 / wall / 1e6,
        fairfeed_sim::experiment::sim_threads(),
    );
    write_json(out, &rows, &md)?;
    // Calibration curve in "nines": −log10(1 − P). A run with no miss is drawn at its resolution.
    let nines = |p: f64, n: u64| -(1.0 - p).max(1.0 / n.max(1) as f64).log10();
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for rule in ["controller", "late-controller"] {
        for &rate in &c.rates {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.rule == rule && r.rate_per_s == rate)
                .filter_map(|r| r.target_pf.map(|t| (nines(t, u64::MAX), nines(r.pf_1us, r.messages))))
                .collect();
            series.push((format!("{rule}, {rate} msg/s"), pts));
        }
    }
    let diag: Vec<(f64, f64)> = c.targets.iter().map(|&t| (nines(t, u64::MAX), nines(t, u64::MAX))).collect();
    series.push(("target (achieved = target)".to_string(), diag));
    let path = out.join("calibration.svg");
    match lines_svg(
        &path,
        &format!("Achieved P(F) against target, N = {} (nines: −log10(1 − P))", c.base.receivers),
        "target P(F), nines",
        "achieved P(F@1µs), nines",
        &series,
        1.0,
    ) {
        Ok(()) => eprintln!("sim: drew {}", path.display()),
        Err(e) => eprintln!("sim: could not draw {}: {e}", path.display()),
    }
    Ok(())
}

/// Runs the clock experiment and writes its summary and error plot.
fn clock_cmd(c: &ClockConfig, out: &std::path::Path) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let pb = crate::fmt::progress(1, "simulating clock synchronization");
    let r = clock(c).map_err(anyhow::Error::msg)?;
    pb.finish_and_clear();
    if r.timer_stalls > 0 {
        tracing::warn!(timer_stalls = r.timer_stalls, "sim: {} node timers stalled and were moved on", r.timer_stalls);
    }
    let md = fairfeed_sim::report::clock_markdown(c, &r, t0.elapsed().as_secs_f64());
    write_json(out, &r, &md)?;
    clock_series(&r.series, out)
}

/// `error.csv` and `error.svg`: the sync error over time.
fn clock_series(series: &[fairfeed_sim::engine::ClockSample], out: &std::path::Path) -> anyhow::Result<()> {
    std::fs::write(out.join("error.csv"), fairfeed_sim::report::clock_series_csv(series))?;
    let p50: Vec<(f64, f64)> = series.iter().map(|x| (x.time_s, x.p50_ns.max(1.0))).collect();
    let p99: Vec<(f64, f64)> = series.iter().map(|x| (x.time_s, x.p99_ns.max(1.0))).collect();
    let max: Vec<(f64, f64)> = series.iter().map(|x| (x.time_s, x.max_ns.max(1.0))).collect();
    let path = out.join("error.svg");
    match lines_svg(
        &path,
        "Sync error over time: |synchronized clock − reference| over nodes",
        "time (s)",
        "|error| (ns)",
        &[
            ("p50 over nodes".to_string(), p50),
            ("p99 over nodes".to_string(), p99),
            ("max over nodes".to_string(), max),
        ],
        0.98,
    ) {
        Ok(()) => eprintln!("sim: drew {}", path.display()),
        Err(e) => eprintln!("sim: could not draw {}: {e}", path.display()),
    }
    Ok(())
}

fn hedging_cmd(c: FairnessConfig, out: &std::path::Path) -> anyhow::Result<()> {
    let (receivers, rate) = (c.receivers, c.rate_per_s);
    let pb = crate::fmt::progress(3, "simulating hedging factors");
    let rows = hedging(&c, &[0, 1, 2], |h| {
        pb.set_message(format!("simulating H={h}"));
        pb.inc(1);
    })
    .map_err(anyhow::Error::msg)?;
    pb.finish_and_clear();
    let md = fairfeed_sim::report::hedging_markdown(&c, &rows);
    write_json(out, &rows, &md)?;
    hedging_plots(&rows, receivers, rate, out);
    Ok(())
}

/// Figures 8 and 9: CDFs of OML, delivery window and receivers' OWD, and OML over time.
fn hedging_plots(rows: &[fairfeed_sim::experiment::HedgingRow], receivers: usize, rate: f64, out: &std::path::Path) {
    let runs: Vec<(usize, &fairfeed_sim::engine::RunResult)> =
        rows.iter().filter_map(|r| r.run.as_ref().map(|x| (r.hedge, x))).collect();
    let name = |h: usize| format!("H = {h}");
    type Pick = fn(&fairfeed_sim::engine::RunResult) -> &Vec<f64>;
    let cdfs: [(&str, String, &str, Pick, f64); 4] = [
        (
            "oml_cdf.svg",
            format!("Overall multicast latency, N = {receivers} (figure 8a)"),
            "OML (µs)",
            |r| &r.oml_us,
            0.995,
        ),
        (
            "dws_cdf.svg",
            format!("Delivery window, N = {receivers} (figure 8c)"),
            "delivery window (µs)",
            |r| &r.dws_us,
            0.995,
        ),
        (
            "receiver_p99_owd_cdf.svg",
            "Per-receiver p99 one-way delay, CDF over receivers (figure 9b)".into(),
            "p99 OWD (µs)",
            |r| &r.receiver_owd_p99_us,
            1.0,
        ),
        (
            "receiver_p50_owd_cdf.svg",
            "Per-receiver p50 one-way delay, CDF over receivers (figure 9a)".into(),
            "p50 OWD (µs)",
            |r| &r.receiver_owd_p50_us,
            1.0,
        ),
    ];
    for (file, title, x, pick, clip) in cdfs {
        let series: Vec<(String, Vec<f64>)> = runs.iter().map(|(h, r)| (name(*h), pick(r).clone())).collect();
        plot(&out.join(file), &title, x, &series, clip);
    }
    let over_time: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|(h, r)| (name(*h), r.oml_series_us.iter().enumerate().map(|(i, &y)| (i as f64 / rate, y)).collect()))
        .collect();
    match lines_svg(
        &out.join("oml_over_time.svg"),
        &format!("OML over time, N = {receivers} (figure 8b)"),
        "time (s)",
        "OML (µs)",
        &over_time,
        0.999,
    ) {
        Ok(()) => eprintln!("sim: drew {}", out.join("oml_over_time.svg").display()),
        Err(e) => eprintln!("sim: could not draw OML over time: {e}"),
    }
}

fn trading_cmd(c: FairnessConfig, out: &std::path::Path) -> anyhow::Result<()> {
    let (receivers, hedge, seed, messages, rate) = (c.receivers, c.hedge, c.seed, c.messages, c.rate_per_s);
    let pb = crate::fmt::progress(5, "simulating schemes");
    let rows = fairfeed_sim::experiment::trading(&c, |s| {
        pb.set_message(format!("simulating {s}"));
        pb.inc(1);
    })
    .map_err(anyhow::Error::msg)?;
    pb.finish_and_clear();
    let t = rows.first().map_or([0; 4], |r| r.traders);
    let mut md = format!(
                "# Share of profit, N = {receivers}, H = {hedge}, seed {seed}, {messages} messages at {rate} msg/s (first {} warm-up)\n\n\
                 Traders are receivers {}, {}, {}, {}; the earliest order timestamp wins each opportunity (a tie among k traders gives each 1/k, its expected value); ± is the 95 % interval over the opportunities.\n\n\
                 | scheme | P1 | P2 | P3 | P4 | opportunities | ties | late releases | max deviation from 25 % |\n|---|---|---|---|---|---|---|---|---|\n",
                (messages / 5).min(2_000),
                t[0],
                t[1],
                t[2],
                t[3]
            );
    md.push_str("| ideal | 25% | 25% | 25% | 25% | | | | |\n");
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} pp |\n",
            r.scheme,
            share_ci(r.shares[0], r.ci95[0]),
            share_ci(r.shares[1], r.ci95[1]),
            share_ci(r.shares[2], r.ci95[2]),
            share_ci(r.shares[3], r.ci95[3]),
            r.opportunities,
            r.ties,
            r.late.iter().sum::<u64>(),
            r.max_deviation_pp
        ));
    }
    write_json(out, &rows, &md)?;
    let cats: Vec<String> = rows.iter().map(|r| r.scheme.clone()).collect();
    let series: Vec<(String, Vec<f64>)> =
        (0..4).map(|k| (format!("P{}", k + 1), rows.iter().map(|r| r.shares[k] * 100.0).collect())).collect();
    bars(out, "shares.svg", &format!("Share of profit per trader, N = {receivers}"), "share %", &cats, &series);
    Ok(())
}

/// Issue 44's flags of `sim experiment trading`: any of them runs one
/// deployment model and ordering (summary.json: a `TradingSummary`) instead
/// of seed 000's table of schemes.
#[derive(clap::Args, Debug, Clone)]
pub struct UntrustedArgs {
    /// Jasper's deployment model: 1 the firm beside the receiver, 2 behind a
    /// gateway one hop away, 3 in an enclave behind a VM channel (default 1).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=3))]
    model: Option<u8>,
    /// The exchange's ordering of orders (default fifo).
    #[arg(long, value_enum)]
    ordering: Option<OrderingArg>,
    /// Batch auction interval, µs (1..=1,000,000), with --ordering batch.
    #[arg(long, default_value_t = 1_000.0, value_parser = batch_us)]
    batch_us: f64,
    /// Trader 1 runs its own receiver and releases this much early, µs (0..=1,000; model 1 only).
    #[arg(long, value_parser = cheat_us)]
    cheat_us: Option<f64>,
    /// Trader 4's order path is this much slower and jittery, µs (0..=10,000).
    #[arg(long, value_parser = slow_path_us)]
    slow_path_us: Option<f64>,
    /// Model 3: release early by this quantile of the channel's measured
    /// delay and hold in the enclave to the deadline (0.5..=0.999999; default: median, no hold).
    #[arg(long, value_parser = hold_q)]
    enclave_hold_q: Option<f64>,
    /// Model 2: release early by this quantile of the host hop's measured
    /// delay, and the firm's host holds to the deadline on its own clock
    /// (0.5..=0.999999; default: median, no hold).
    #[arg(long, value_parser = hold_q)]
    host_hold_q: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OrderingArg {
    Fifo,
    Dbo,
    Batch,
}

fn batch_us(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 1.0, 1e6, "µs")
}
fn cheat_us(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.0, 1e3, "µs")
}
fn slow_path_us(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.0, 1e4, "µs")
}
pub(crate) fn hold_q(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.5, 0.999_999, "(a quantile)")
}

impl UntrustedArgs {
    /// The setup, if any of the flags was given.
    fn setup(&self) -> Option<fairfeed_sim::trading::TradingSetup> {
        use fairfeed_sim::trading::{DeployModel, OrderingChoice, TradingSetup};
        let any = self.model.is_some()
            || self.ordering.is_some()
            || self.cheat_us.is_some()
            || self.slow_path_us.is_some()
            || self.enclave_hold_q.is_some()
            || self.host_hold_q.is_some();
        let d = TradingSetup::default();
        any.then(|| TradingSetup {
            model: match self.model {
                Some(2) => DeployModel::Gateway,
                Some(3) => DeployModel::Enclave,
                _ => DeployModel::Colocated,
            },
            ordering: match self.ordering {
                None | Some(OrderingArg::Fifo) => OrderingChoice::Fifo,
                Some(OrderingArg::Dbo) => OrderingChoice::Dbo,
                Some(OrderingArg::Batch) => OrderingChoice::Batch { interval_us: self.batch_us },
            },
            cheat_us: self.cheat_us.unwrap_or(0.0),
            slow_path_us: self.slow_path_us.unwrap_or(d.slow_path_us),
            enclave_hold_q: self.enclave_hold_q,
            host_hold_q: self.host_hold_q,
        })
    }
}

fn trading_models_cmd(
    c: &FairnessConfig,
    s: &fairfeed_sim::trading::TradingSetup,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    let pb = crate::fmt::progress(2, "simulating");
    let r = fairfeed_sim::trading::trading_models(c, s, |m| {
        pb.set_message(m.to_string());
        pb.inc(1);
    })?;
    pb.finish_and_clear();
    write_json(out, &r, &fairfeed_sim::trading::markdown(&r))
}

/// A share and its 95 % interval, in per cent.
fn share_ci(share: f64, ci95: f64) -> String {
    format!("{:.1} ± {:.1}%", share * 100.0, ci95 * 100.0)
}
