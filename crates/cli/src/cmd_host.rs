//! `fairfeed firm-host`: the far end of a last hop (deployment models 2
//! and 3) — a firm's host behind a gateway, or its enclave behind a VM.
//! It echoes the release point's probes, hands each packet to the firm's
//! ITCH application and logs when it arrived; for tests on one machine it
//! can emulate the hop's delay in user space.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use fairfeed_net::lasthop::{Delay, FirmHost, HostAddr, HostConfig};

#[derive(clap::Args)]
pub struct Args {
    /// Where the release point's packets arrive: UDP HOST:PORT (model 2), or
    /// unix:PATH (model 3: the enclave's end of the VM channel).
    #[arg(long, value_name = "ADDR", value_parser = crate::cmd_node::host_addr)]
    listen: HostAddr,
    /// Take packets only from this gateway (UDP; others are counted and dropped).
    #[arg(long, value_name = "ADDR", value_parser = crate::fmt::dest_addr)]
    gateway: Option<SocketAddr>,
    /// Hand each MoldUDP64 packet to the firm's application on this UDP port.
    #[arg(long, value_name = "ADDR", value_parser = crate::fmt::dest_addr)]
    deliver: Option<SocketAddr>,
    /// TEST: emulate the hop's fixed delay each way, µs (0..=100,000), for
    /// packets and probes alike (loopback has none worth measuring).
    #[arg(long, default_value_t = 0, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=100_000))]
    emulate_floor_us: u64,
    /// TEST: emulate queueing on top, lognormal with this median, µs (0..=100,000).
    #[arg(long, default_value_t = 0, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=100_000))]
    emulate_median_us: u64,
    /// TEST: the queueing's log-space spread (0..=3; 0.4: a p90 1.67× the
    /// median, as a Nitro channel's ≈ 50 µs p90 around 30 µs).
    #[arg(long, default_value_t = 0.0, value_parser = sigma)]
    emulate_sigma: f64,
    /// Hold each packet that comes with its deadline (a receiver's
    /// `--hosts-hold`) until then on this host's wall clock — keep it
    /// synchronized (chrony, PTP) with the release point's — then deliver.
    #[arg(long)]
    hold: bool,
    /// Seed of the emulated delays.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop after this many seconds (default: at SIGINT/SIGTERM).
    #[arg(long, value_parser = crate::fmt::seconds)]
    seconds: Option<f64>,
    /// Write one CSV row per packet: its first sequence number and the wall
    /// time it was delivered, ns (after any emulated delay and hold).
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
}

fn sigma(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.0, 3.0, "sigma")
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(p) = &a.log {
        crate::fmt::check_outputs(&[p.as_path()], &[])?;
    }
    let delay =
        Delay { floor_ns: a.emulate_floor_us * 1_000, median_ns: a.emulate_median_us * 1_000, sigma: a.emulate_sigma };
    if delay != Delay::default() {
        tracing::warn!("firm-host {}: TEST MODE, emulating a hop of {delay:?} each way", a.listen);
    }
    let stop = crate::fmt::stop_on_signals()?;
    let cfg = HostConfig {
        listen: a.listen.clone(),
        gateway: a.gateway,
        deliver: a.deliver,
        delay,
        seed: a.seed,
        stop: stop.clone(),
        keep_log: a.log.is_some(),
        max_ns: a.seconds.map(|s| (s * 1e9) as u64),
        hold: a.hold,
    };
    let mut host = FirmHost::new(cfg).with_context(|| format!("--listen {}", a.listen))?;
    tracing::info!("firm-host: listening on {}", a.listen);
    let run = fairfeed_io::agent::RunConfig { stop: Some(stop), ..fairfeed_io::agent::RunConfig::default() };
    fairfeed_io::agent::run(&mut [&mut host], &run).context("running the firm host")?;
    if let Some(p) = &a.log {
        let mut out = String::with_capacity(host.rows.len() * 32);
        out.push_str("sequence,arrival_ns\n");
        for (seq, at) in &host.rows {
            out.push_str(&format!("{seq},{at}\n"));
        }
        std::fs::write(p, out).with_context(|| format!("writing {}", p.display()))?;
    }
    println!("{}", serde_json::to_string(host.stats())?);
    Ok(())
}
