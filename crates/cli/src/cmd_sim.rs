//! `fairfeed sim`: experiments in the deterministic simulator.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use fairfeed_sim::experiment::{fairness, fairness_markdown, FairnessConfig};
use fairfeed_sim::model::ModelFile;

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
        #[arg(long, default_value_t = 100)]
        receivers: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
        /// Hedging factor of the hedged schemes.
        #[arg(long, default_value_t = 2)]
        hedge: usize,
        /// Multicast messages per scheme.
        #[arg(long, default_value_t = 10_000)]
        messages: u64,
        /// Messages per second.
        #[arg(long, default_value_t = 5_000.0)]
        rate: f64,
        /// A link/clock model file (TOML; see `fairfeed_sim::model`); default: the calibrated cloud model.
        #[arg(long)]
        latency_model: Option<PathBuf>,
        /// The controller's target share of on-time deliveries.
        #[arg(long, default_value_t = 0.999)]
        target_on_time: f64,
    },
}

pub fn run(s: Sim) -> anyhow::Result<()> {
    match s {
        Sim::Experiment(Experiment::Fairness {
            receivers,
            seed,
            out,
            hedge,
            messages,
            rate,
            latency_model,
            target_on_time,
        }) => {
            anyhow::ensure!((1..=20_000).contains(&receivers), "--receivers must be 1..=20,000");
            anyhow::ensure!((0.0..1.0).contains(&target_on_time), "--target-on-time must be in [0, 1)");
            let model = match &latency_model {
                Some(p) => ModelFile::from_toml(
                    &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
                )
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
                None => ModelFile::default(),
            };
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let cfg = FairnessConfig { receivers, hedge, seed, messages, rate_per_s: rate, model, target_on_time };
            let t0 = Instant::now();
            let pb = crate::fmt::progress(6, "simulating schemes");
            let rows = fairness(&cfg, |name| {
                pb.set_message(format!("simulating {name}"));
                pb.inc(1);
            })
            .map_err(anyhow::Error::msg)?;
            pb.finish_and_clear();
            let wall = t0.elapsed().as_secs_f64();
            let events: u64 = rows.iter().map(|r| r.events).sum();
            std::fs::write(out.join("summary.json"), serde_json::to_string_pretty(&rows)?)?;
            let md = format!(
                "# Fairness, N = {receivers}, seed {seed}\n\n{} messages per scheme at {rate} msg/s; link model: {}.\n\n{}\n\n\
                 {events} events in {wall:.1} s ({:.2} M events/s).\n",
                messages,
                latency_model.as_ref().map_or("calibrated cloud".to_string(), |p| p.display().to_string()),
                fairness_markdown(&rows),
                events as f64 / wall / 1e6
            );
            std::fs::write(out.join("summary.md"), &md)?;
            print!("{md}");
            Ok(())
        }
    }
}
