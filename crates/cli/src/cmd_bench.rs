//! `fairfeed bench`: end-to-end measurements with a same-run baseline.

use fairfeed_net::bench::{arb_latency, proxy_hop};

#[derive(clap::Subcommand)]
pub enum Bench {
    /// Latency one fair-multicast proxy hop adds, beside a bare loopback hop, same run.
    ProxyHop {
        #[arg(long, default_value_t = 20_000)]
        samples: usize,
        /// Block in recv instead of spinning (default: spin, as latency-critical hosts do).
        #[arg(long)]
        no_busy_poll: bool,
        #[arg(long)]
        json: bool,
    },
    /// Latency added by the live arbitrator, beside a bare UDP forwarder, on loopback.
    ArbLatency {
        /// Packets timed per path.
        #[arg(long, default_value_t = 20_000)]
        samples: usize,
        /// Spin instead of sleeping (sender, receiver, forwarder and arbitrator).
        #[arg(long)]
        busy_poll: bool,
        /// The arbitrator's idle strategy when not --busy-poll.
        #[arg(long, value_enum, default_value = "backoff")]
        idle: crate::cmd_arb::IdleArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(b: Bench) -> anyhow::Result<()> {
    match b {
        Bench::ProxyHop { samples, no_busy_poll, json } => {
            anyhow::ensure!((100..=10_000_000).contains(&samples), "--samples must be 100..=10,000,000");
            let r = proxy_hop(samples, !no_busy_poll)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "proxy hop adds {:.2} µs at the median; a bare loopback hop takes {:.2} µs (ratio {:.2}); \
                     via proxy p50/p99 {:.1}/{:.1} µs, direct {:.1}/{:.1} µs",
                    r.proxy_hop_p50_us,
                    r.baseline_oneway_p50_us,
                    r.ratio,
                    r.via_proxy.p50_us,
                    r.via_proxy.p99_us,
                    r.direct.p50_us,
                    r.direct.p99_us
                );
            }
            Ok(())
        }
        Bench::ArbLatency { samples, busy_poll, idle, json } => {
            anyhow::ensure!((100..=10_000_000).contains(&samples), "--samples must be 100..=10,000,000");
            let r = arb_latency(samples, busy_poll, idle.strategy())?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "one-way loopback latency, p50 / p99 (µs): forwarder {:.1} / {:.1}, arbitrator {:.1} / {:.1}; \
                     added p50 {:.1} µs (ratio {:.2}); arbitrator idle {}{}",
                    r.baseline_forwarder.p50_us,
                    r.baseline_forwarder.p99_us,
                    r.arbitrator.p50_us,
                    r.arbitrator.p99_us,
                    r.added_p50_us,
                    r.ratio_p50,
                    r.idle,
                    if busy_poll { ", busy polling" } else { "" }
                );
            }
            Ok(())
        }
    }
}
