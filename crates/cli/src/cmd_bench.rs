//! `fairfeed bench`: end-to-end measurements with a same-run baseline.

use fairfeed_bench::arb::arb_latency;
use fairfeed_bench::tree::{proxy_hop, proxy_ladder, proxy_pps};
use fairfeed_bench::xdp::Replication;
use fairfeed_net::send::Backend;
use fairfeed_net::tree::agent::Threading;

/// A back-end of `bench hop-latency`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HopIoArg {
    Udp,
    Uring,
    Afxdp,
}

/// A replication path of `bench proxy-pps`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IoArg {
    Udp,
    Uring,
    Tc,
    Afxdp,
}

#[derive(clap::Subcommand)]
pub enum Bench {
    /// A tree that changes while the feed runs (simulated with the controller's, members' and nodes' own
    /// cores): proxies killed and restarted, receivers joining from the sender's snapshot and leaving; what was
    /// lost, repeated, repaired, and whether the joiners' books equal the whole feed's.
    Churn {
        /// Nodes at the start (sender, proxies, a spare, receivers), 8..=5,000.
        #[arg(long, default_value_t = 30, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(8..=5_000))]
        nodes: usize,
        /// Seeds (runs), 1..=10,000.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        seeds: u64,
        /// Sibling hedging H, 0..=4.
        #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=4))]
        hedge: usize,
        /// Seconds of feed per run (simulated).
        #[arg(long, default_value_t = 5.0, value_parser = crate::fmt::seconds)]
        feed_seconds: f64,
        /// Messages per second (1..=100,000).
        #[arg(long, default_value_t = 2_000.0, value_parser = |s: &str| crate::fmt::f64_in(s, 1.0, 1e5, "msg/s"))]
        rate: f64,
        /// One membership change every this many ms on average (10..=60,000).
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
        change_every_ms: u64,
        /// The first seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The sender's deadline controller targets this P(F) (0.5..=0.999999; 0: the paper's rule, OWD_G, no margin).
        #[arg(long, default_value_t = 0.999, value_parser = target_pf_or_paper)]
        target_pf: f64,
        /// Every kill takes one proxy (by default some take two neighbours at once, beyond what H = 1 masks).
        #[arg(long)]
        no_double_kills: bool,
        /// The links: a model file's `[link]` (format in docs/models/README.md; default: the calibrated cloud model).
        #[arg(long, value_name = "FILE")]
        latency_model: Option<std::path::PathBuf>,
        /// Print the summary as JSON (with every seed's run) on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Issue 43's fault campaign on node processes in network namespaces (root, iproute2): proxies killed,
    /// two at once, cut off, cut off with their receivers; the leading controller killed; the store
    /// restarted; receivers joining from a snapshot and leaving (with --compound: a zone's outage) — then every receiver's delivered line checked: nothing lost, twice or out of
    /// order, joiners' books equal to a receiver's that saw the whole feed.
    Faults {
        /// Seeds (runs, one after another, about 10 s + the feed each), 1..=1,000.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1_000))]
        seeds: u64,
        /// The first seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Receivers there from the start (the first is never touched: the reference), 2..=100.
        #[arg(long, default_value_t = 12, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=100))]
        receivers: usize,
        /// Receivers that may join mid-feed, 0..=50.
        #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=50))]
        joiners: usize,
        /// Proxies under the sender (one more runs as a spare), 2..=16.
        #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=16))]
        proxies: usize,
        /// Messages per second, 100..=20,000.
        #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(100..=20_000))]
        rate: u64,
        /// Seconds of feed per seed, 3..=600.
        #[arg(long, default_value_t = 8.0, value_parser = |s: &str| crate::fmt::f64_in(s, 3.0, 600.0, "seconds"))]
        feed_seconds: f64,
        /// Faults beyond one of each kind: one every this many ms on average (100..=60,000).
        #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
        change_every_ms: u64,
        /// Sibling hedging H, 0..=2 (the claim is for H = 1; 0 shows what hedging masks).
        #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=2))]
        hedge: usize,
        /// Receivers do not fill gaps from the sender's journal (what the tree lost stays lost).
        #[arg(long)]
        no_fill: bool,
        /// Compound faults too: the store node killed and, while no controller can lead, two
        /// proxies — their common children's whole gap comes from the journal (needs the store).
        #[arg(long)]
        compound: bool,
        /// Where every seed's logs, stats and node files go.
        #[arg(long, default_value = "faults-out")]
        out: std::path::PathBuf,
        /// The membership store: `jetstream` (a nats-server node in its own
        /// namespace, two controllers), `embedded` (one controller), `auto`
        /// (jetstream where nats-server is installed).
        #[arg(long, value_enum, default_value_t = FaultsStore::Auto)]
        store: FaultsStore,
        /// Print the summary as JSON (with every seed's report) on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The tree controller placing N receivers from their registrations and taking joins, beside the planner's one call.
    Controller {
        /// Receivers to place, 10..=100,000.
        #[arg(long, default_value_t = 10_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(10..=100_000))]
        receivers: usize,
        /// Joins measured into the full tree, 1..=100,000.
        #[arg(long, default_value_t = 1_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
        joins: usize,
        /// Print the report as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Latency one fair-multicast proxy hop adds, beside a bare loopback hop, same run.
    ProxyHop {
        /// Round trips to measure (each mode).
        #[arg(long, default_value_t = 20_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(100..=10_000_000))]
        samples: usize,
        /// Block in recv instead of spinning (default: spin, as latency-critical hosts do).
        #[arg(long)]
        no_busy_poll: bool,
        /// Seed 003's ladder instead: default → pinned → pinned + busy polling.
        #[arg(long)]
        ladder: bool,
        /// Print the report as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Copies per second one proxy replicates to F destinations, beside a bare sendmmsg loop, same run.
    ProxyPps {
        /// Destinations per packet (copies each packet is sent to).
        #[arg(long, default_value_t = 20, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000))]
        fanout: usize,
        /// Bytes per packet (overlay header included).
        #[arg(long, default_value_t = 200, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(40..=1_472))]
        packet_bytes: usize,
        /// Alternating rounds of each.
        #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100))]
        rounds: usize,
        /// Seconds per measured round.
        #[arg(long, default_value_t = 1.0, value_parser = crate::fmt::seconds)]
        round_seconds: f64,
        /// Run the proxy's send side on its own thread (SPSC ring between; `--io udp`).
        #[arg(long)]
        split: bool,
        /// The replication path: `udp` (the proxy agent sending with
        /// sendmmsg, on loopback), `uring` (the same agent sending through
        /// io_uring), or `tc` (one datagram per packet, copies made by the
        /// TC egress replicator, over a veth link between two namespaces
        /// the bench makes; needs root and a fairfeed built with clang), or
        /// `afxdp` (every copy a frame written to an AF_XDP socket's TX
        /// ring, over the same kind of link).
        #[arg(long, value_enum, default_value_t = IoArg::Udp)]
        io: IoArg,
        /// Print the report as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Clock synchronization over real sockets: the tree's node agents on
    /// loopback, each with a random injected clock offset and drift; reports
    /// |estimated − injected offset against the reference| after the warm-up.
    ClockSync {
        /// Nodes (sender, proxies and receivers of a small hedged tree).
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(3..=128))]
        nodes: u64,
        /// Measured seconds after the warm-up.
        #[arg(long, default_value_t = 10.0, value_parser = bench_seconds)]
        seconds: f64,
        /// Synchronization warm-up, seconds (not measured).
        #[arg(long, default_value_t = 10.0, value_parser = bench_seconds)]
        warmup: f64,
        /// Injected offsets uniform in ± this many ns.
        #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(i64).range(0..=3_600_000_000_000))]
        max_offset_ns: i64,
        /// Injected drifts uniform in ± this many ppm.
        #[arg(long, default_value_t = 100.0, value_parser = bench_ppm)]
        max_drift_ppm: f64,
        /// The feed the sender multicasts meanwhile, messages/s.
        #[arg(long, default_value_t = 1_000.0, value_parser = bench_rate)]
        rate: f64,
        /// Seed of the injected clocks.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Share of the nodes (not the reference) whose clocks step by
        /// `--step-ns` halfway through the measured seconds, announced as a
        /// host announces its own steps (at least one node when above 0).
        #[arg(long, default_value_t = 0.0, value_parser = crate::fmt::share, requires = "step_ns")]
        step_share: f64,
        /// The size of those steps, ns (either sign, ±10 s).
        #[arg(long, default_value_t = 0, allow_hyphen_values = true, requires = "step_share",
              value_parser = clap::value_parser!(i64).range(-10_000_000_000..=10_000_000_000))]
        step_ns: i64,
        /// Tell nobody of those steps (a paused VM, a hypervisor's
        /// correction): only the probes can find them. The baseline for
        /// steps the host announces.
        #[arg(long, requires = "step_share")]
        step_silent: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Seed 003's ladder extended to the I/O back-ends: round trips over a
    /// veth link between two namespaces the bench makes, one end on each
    /// back-end in turn (spinning), the other a kernel UDP echo; same run
    /// (needs root; afxdp needs a fairfeed built with clang).
    HopLatency {
        /// Back-ends, in the order each round runs them.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "udp,uring,afxdp")]
        io: Vec<HopIoArg>,
        /// Round trips per back-end per round.
        #[arg(long, default_value_t = 10_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(100..=1_000_000))]
        samples: usize,
        /// Rounds (each runs every back-end once).
        #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100))]
        rounds: usize,
        /// Print the report as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Jasper's XDP de-duplicator: hedged copies dropped in veth's driver
    /// between two network namespaces, beside the same receiver without it,
    /// same run (needs root and clang at build time).
    XdpDedup {
        /// Hedge H: every message is sent H + 1 times.
        #[arg(long, default_value_t = 2, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=8))]
        hedge: usize,
        /// Messages per round.
        #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1_000..=fairfeed_bench::xdp::MESSAGES_MAX))]
        messages: u64,
        /// Messages per second (each sent H + 1 times).
        #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
        rate: u64,
        /// Payload bytes after the overlay header.
        #[arg(long, default_value_t = 100, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4_096))]
        payload_bytes: usize,
        /// Rounds of each (without XDP, then with it).
        #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=20))]
        rounds: usize,
        /// Print the report as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// A tree of node processes carries a feed clean, then under an attack
    /// campaign on every port (docs/SECURITY.md): messages lost, P(F), and
    /// what each attack drew, side by side.
    Attack {
        /// Receivers of the tree (fan-out 2, hedge 1).
        #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=64))]
        receivers: usize,
        /// Messages per second.
        #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(100..=50_000))]
        rate: u64,
        /// Seconds of feed per run.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
        seconds: u64,
        /// Loopback ports from here: the nodes' data, control and the retransmission server.
        #[arg(long, default_value_t = 9700, value_parser = clap::value_parser!(u16).range(1_024..=65_000))]
        port: u16,
        /// Print the report as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Latency added by the live arbitrator, beside a bare UDP forwarder, on loopback.
    ArbLatency {
        /// Packets timed per path; 100..=10,000,000.
        #[arg(long, default_value_t = 20_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(100..=10_000_000))]
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

fn bench_seconds(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.1, 3_600.0, "seconds")
}

fn bench_ppm(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.0, 1_000.0, "ppm")
}

fn bench_rate(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 1.0, 100_000.0, "messages/s")
}

/// `fairfeed bench clock-sync`.
fn clock_sync_cmd(b: Bench) -> anyhow::Result<()> {
    let Bench::ClockSync {
        nodes,
        seconds,
        warmup,
        max_offset_ns,
        max_drift_ppm,
        rate,
        seed,
        step_share,
        step_ns,
        step_silent,
        json,
    } = b
    else {
        anyhow::bail!("internal: clock_sync_cmd takes the clock-sync bench");
    };
    let c = fairfeed_bench::clock::ClockBenchConfig {
        nodes: nodes as usize,
        seconds,
        warmup_s: warmup,
        max_offset_ns,
        max_drift_ppm,
        rate_per_s: rate,
        seed,
        step_share,
        step_ns,
        step_silent,
    };
    let pb = crate::fmt::progress(((seconds + warmup) * 10.0) as u64, "clock-sync: warming up, then measuring");
    let r =
        fairfeed_bench::clock::clock_sync(&c, |s| pb.set_position((s * 10.0) as u64)).map_err(anyhow::Error::msg)?;
    pb.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{r}");
    }
    Ok(())
}

/// `bench attack`: the clean run and the attacked one, side by side.
fn attack_cmd(receivers: usize, rate: u64, seconds: u64, port: u16, json: bool) -> anyhow::Result<()> {
    let exe = anyhow::Context::context(std::env::current_exe(), "finding the fairfeed binary the nodes run as")?;
    let cfg = fairfeed_bench::tree_attack::AttackConfig { exe, receivers, rate, seconds, port };
    let r = fairfeed_bench::tree_attack::run(&cfg, &mut |what| eprintln!("bench attack: {what}"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    print!("{r}");
    Ok(())
}

/// `bench faults --store`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultsStore {
    Auto,
    Jetstream,
    Embedded,
}

/// `bench faults`: the campaign's seeds, each reported as it ends.
/// `bench faults --store`: the nats-server to run as the shared store (none: the embedded one).
fn faults_store(store: FaultsStore, compound: bool) -> anyhow::Result<Option<std::path::PathBuf>> {
    let nats = match store {
        FaultsStore::Embedded => None,
        FaultsStore::Auto => fairfeed_bridge::server::find_server(),
        FaultsStore::Jetstream => Some(fairfeed_bridge::server::find_server().ok_or_else(|| {
            anyhow::anyhow!("--store jetstream: nats-server is not installed (Debian: apt-get install nats-server)")
        })?),
    };
    if compound && nats.is_none() {
        anyhow::bail!("--compound needs the shared store (nats-server, --store jetstream): its faults kill the store");
    }
    Ok(nats)
}

fn faults_cmd(b: Bench) -> anyhow::Result<()> {
    let Bench::Faults {
        seeds,
        seed,
        receivers,
        joiners,
        proxies,
        rate,
        feed_seconds,
        change_every_ms,
        hedge,
        no_fill,
        compound,
        out,
        store,
        json,
    } = b
    else {
        unreachable!("faults_cmd takes bench faults")
    };
    let nats = faults_store(store, compound)?;
    let exe = anyhow::Context::context(std::env::current_exe(), "finding the fairfeed binary the nodes run as")?;
    let change_every = std::time::Duration::from_millis(change_every_ms);
    let cfg = fairfeed_bench::faults::FaultsConfig {
        exe,
        first_seed: seed,
        seeds,
        receivers,
        joiners,
        proxies,
        rate,
        feed_s: feed_seconds,
        change_every,
        out,
        hedge,
        fill: !no_fill,
        nats,
        compound,
    };
    let pb = crate::fmt::progress(seeds, "bench faults: seeds");
    let s = fairfeed_bench::faults::run(&cfg, &mut |seed, r| {
        pb.inc(1);
        if !r.ok {
            let line = format!("seed {seed}: FAILED {}", serde_json::to_string(r).unwrap_or_default());
            if pb.is_hidden() {
                eprintln!("{line}");
            } else {
                pb.println(line);
            }
        }
    })?;
    pb.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{s}");
    }
    anyhow::ensure!(
        s.failed_seeds.is_empty(),
        "{} of {} seeds broke an invariant: {:?}",
        s.failed_seeds.len(),
        s.seeds,
        s.failed_seeds
    );
    Ok(())
}

pub fn run(b: Bench) -> anyhow::Result<()> {
    match b {
        b @ Bench::Faults { .. } => faults_cmd(b),
        b @ Bench::Churn { .. } => churn_cmd(b),
        Bench::Controller { receivers, joins, json } => controller_cmd(receivers, joins, json),
        b @ Bench::ClockSync { .. } => clock_sync_cmd(b),
        Bench::ProxyHop { samples, ladder: true, json, .. } => ladder_cmd(samples, json),
        Bench::ProxyPps {
            fanout,
            packet_bytes,
            rounds,
            round_seconds,
            split,
            io: io @ (IoArg::Tc | IoArg::Afxdp),
            json,
        } => {
            anyhow::ensure!(!split, "--split applies to --io udp (the proxy agent's send thread)");
            anyhow::ensure!((2..=64).contains(&fanout), "--fanout {fanout}: --io tc and afxdp make 2 to 64 copies");
            let path = if io == IoArg::Tc { Replication::Tc } else { Replication::AfXdp };
            kernel_pps(fanout, packet_bytes, (rounds, round_seconds), path, json)
        }
        Bench::ProxyPps { fanout, packet_bytes, rounds, round_seconds, split, io, json } => {
            let threads = if split { Threading::Split } else { Threading::One };
            let backend = if io == IoArg::Uring { Backend::Uring } else { Backend::Udp };
            pps_cmd(fanout, packet_bytes, (rounds, round_seconds), (threads, backend), json)
        }
        Bench::HopLatency { io, samples, rounds, json } => hop_cmd(&io, samples, rounds, json),
        Bench::Attack { receivers, rate, seconds, port, json } => attack_cmd(receivers, rate, seconds, port, json),
        Bench::XdpDedup { hedge, messages, rate, payload_bytes, rounds, json } => {
            xdp_dedup(hedge, (messages, rate, payload_bytes), rounds, json)
        }
        Bench::ProxyHop { samples, no_busy_poll, json, .. } => proxy_hop_cmd(samples, !no_busy_poll, json),
        Bench::ArbLatency { samples, busy_poll, idle, json } => arb_latency_cmd(samples, busy_poll, idle, json),
    }
}

fn controller_cmd(receivers: usize, joins: usize, json: bool) -> anyhow::Result<()> {
    let r = fairfeed_bench::controller::controller_scale(receivers, joins);
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "controller: {} receivers and {} proxies (F = {}) placed from registrations in {:.3} s ({} views); \
             the planner's one call for the shape: {:.4} s; then {:.0} joins/s",
            r.receivers, r.proxies, r.fanout, r.place_all_s, r.views_sent, r.plan_baseline_s, r.joins_per_s
        );
    }
    Ok(())
}

fn pps_cmd(
    fanout: usize,
    packet_bytes: usize,
    (rounds, round_seconds): (usize, f64),
    how: (Threading, Backend),
    json: bool,
) -> anyhow::Result<()> {
    // Each round times the bare loop, then the proxy.
    let tick = crate::fmt::ticker(2.0 * rounds as f64 * round_seconds, "bare sendmmsg and proxy, alternating rounds");
    let r = proxy_pps(fanout, packet_bytes, (rounds, round_seconds), how)?;
    drop(tick);
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "proxy replicating to {fanout} ({:?}): {:.0} copies/s ({:.0} packets/s in); bare sendmmsg loop: {:.0} copies/s; \
             ratio {:.2} (medians of {rounds} rounds of {round_seconds} s)",
            r.io, r.proxy_pps, r.proxy_input_pps, r.baseline_pps, r.ratio
        );
    }
    Ok(())
}

fn proxy_hop_cmd(samples: usize, busy_poll: bool, json: bool) -> anyhow::Result<()> {
    let r = proxy_hop(samples, busy_poll)?;
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

fn arb_latency_cmd(samples: usize, busy_poll: bool, idle: crate::cmd_arb::IdleArg, json: bool) -> anyhow::Result<()> {
    let rounds = fairfeed_bench::arb::ARB_LATENCY_ROUNDS as u64 + 1;
    let pb = crate::fmt::progress(rounds, "timing forwarder and arbitrator, alternating rounds");
    let r = arb_latency(samples, busy_poll, idle.strategy(), |k| pb.set_position(k as u64))?;
    pb.finish_and_clear();
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

fn xdp_dedup(
    hedge: usize,
    (messages, rate, payload_bytes): (u64, u64, usize),
    rounds: usize,
    json: bool,
) -> anyhow::Result<()> {
    let secs = 2.0 * rounds as f64 * (messages as f64 / rate as f64 + 0.4);
    let tick = crate::fmt::ticker(secs, "a receiver without and with XDP dedup, alternating rounds");
    let r = fairfeed_bench::xdp::xdp_dedup(hedge, messages, rate, payload_bytes, rounds)?;
    drop(tick);
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "H = {hedge}: {} copies, {} dropped in the driver ({:.2} % of the extra copies, {} mode), \
                 {} delivered, {} lost; receiver CPU per delivered message {:.0} ns with XDP against {:.0} ns \
                 without (ratio {:.2}, medians of {rounds} rounds)",
            r.copies,
            r.dropped_in_kernel,
            100.0 * r.dropped_share,
            r.mode,
            r.delivered,
            r.lost,
            r.xdp_cpu_ns_per_delivered,
            r.baseline_cpu_ns_per_delivered,
            r.cpu_ratio
        );
    }
    Ok(())
}

fn hop_cmd(io: &[HopIoArg], samples: usize, rounds: usize, json: bool) -> anyhow::Result<()> {
    use fairfeed_bench::hop::HopIo;
    let mut ios: Vec<HopIo> = Vec::new();
    for i in io {
        let h = match i {
            HopIoArg::Udp => HopIo::Udp,
            HopIoArg::Uring => HopIo::Uring,
            HopIoArg::Afxdp => HopIo::Afxdp,
        };
        anyhow::ensure!(!ios.contains(&h), "--io: {h:?} named twice");
        ios.push(h);
    }
    let tick = crate::fmt::ticker(
        (ios.len() * rounds * samples) as f64 * 30e-6 + ios.len() as f64 * rounds as f64 * 0.3,
        "round trips over veth, back-ends in turn",
    );
    let r = fairfeed_bench::hop::hop_latency(&ios, samples, rounds)?;
    drop(tick);
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("| back-end | round trip p50 / p90 / p99 / p99.9 µs | one way p50 µs | × udp | lost |");
        println!("|---|---|---|---|---|");
        for w in &r.rows {
            println!(
                "| {:?} | {:.1} / {:.1} / {:.1} / {:.1} | {:.2} | {:.2} | {} |",
                w.io, w.rtt_p50_us, w.rtt_p90_us, w.rtt_p99_us, w.rtt_p999_us, w.oneway_p50_us, w.ratio_to_udp, w.lost
            );
        }
    }
    Ok(())
}

fn ladder_cmd(samples: usize, json: bool) -> anyhow::Result<()> {
    let rungs = proxy_ladder(samples)?;
    if json {
        println!("{}", serde_json::to_string(&rungs)?);
    } else {
        println!("| rung | via proxy p50 / p99 / p99.9 µs | direct p50 / p99 µs | added p50 µs | ratio |");
        println!("|---|---|---|---|---|");
        for r in &rungs {
            let (v, d) = (&r.report.via_proxy, &r.report.direct);
            println!(
                "| {} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} | {:.2} | {:.2} |",
                r.name, v.p50_us, v.p99_us, v.p999_us, d.p50_us, d.p99_us, r.report.proxy_hop_p50_us, r.report.ratio
            );
        }
    }
    Ok(())
}

fn kernel_pps(
    fanout: usize,
    packet_bytes: usize,
    (rounds, round_seconds): (usize, f64),
    path: Replication,
    json: bool,
) -> anyhow::Result<()> {
    let what = match path {
        Replication::Tc => "bare sendmmsg and TC replication, alternating rounds",
        Replication::AfXdp => "bare sendmmsg and AF_XDP, alternating rounds",
    };
    let tick = crate::fmt::ticker(2.0 * rounds as f64 * (round_seconds + 0.2), what);
    let r = fairfeed_bench::xdp::replication_pps(fanout, packet_bytes, (rounds, round_seconds), path)?;
    drop(tick);
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else if path == Replication::AfXdp {
        println!(
            "AF_XDP ({:?} mode) to {fanout} over veth: {:.0} copies/s; bare sendmmsg of every copy: {:.0} copies/s; \
             ratio {:.2} (medians of {rounds} rounds of {round_seconds} s; {} frames found the link full)",
            r.afxdp_mode.unwrap_or(fairfeed_xdp::afxdp::XskMode::Copy),
            r.proxy_pps,
            r.baseline_pps,
            r.ratio,
            r.afxdp.map_or(0, |c| c.tx_full)
        );
    } else {
        println!(
            "TC replication to {fanout} over veth: {:.0} copies/s ({:.0} datagrams/s from user space); bare sendmmsg \
             of every copy: {:.0} copies/s; ratio {:.2} (medians of {rounds} rounds of {round_seconds} s; {} clone failures)",
            r.proxy_pps, r.packets_pps, r.baseline_pps, r.ratio, r.tc.failed
        );
    }
    Ok(())
}

/// `bench churn`: the campaign's seeds on every core, summed up.
fn churn_cmd(b: Bench) -> anyhow::Result<()> {
    let Bench::Churn {
        nodes,
        seeds,
        hedge,
        feed_seconds: feed_s,
        rate,
        change_every_ms,
        seed,
        target_pf,
        no_double_kills,
        latency_model,
        json,
    } = b
    else {
        unreachable!("churn_cmd takes bench churn")
    };
    let link = match &latency_model {
        None => fairfeed_sim::model::LinkModel::CLOUD,
        Some(p) => {
            let m = crate::cmd_sim::read_model(p)?;
            anyhow::ensure!(
                m.classes.is_empty(),
                "--latency-model {}: bench churn takes the model's [link] only, not host classes",
                p.display()
            );
            m.link
        }
    };
    let shape = fairfeed_sim::churn::ChurnConfig::for_nodes(nodes)
        .ok_or_else(|| anyhow::anyhow!("--nodes {nodes}: one sender's fan-out cannot take the proxies so many need"))?;
    let (receivers, proxies, spares, fanout) = (shape.receivers, shape.proxies, shape.spares, shape.fanout);
    let cfg = fairfeed_sim::churn::ChurnConfig {
        seed,
        hedge,
        feed_s,
        rate_per_s: rate,
        change_every_ns: change_every_ms * 1_000_000,
        target_pf: (target_pf > 0.0).then_some(target_pf),
        double_kills: !no_double_kills,
        link,
        ..shape
    };
    let pb = crate::fmt::progress(seeds, "bench churn: seeds");
    let s = fairfeed_sim::churn::campaign(&cfg, seeds, &|n| pb.set_position(n));
    pb.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    let header = format!(
        "churn: {seeds} seeds, {receivers} receivers under {proxies} proxies (+{spares} spare, F = {fanout}, H = {hedge}), \
         {feed_s} s at {rate} msg/s, a change every {change_every_ms} ms"
    );
    println!("{header}");
    print!("{s}");
    Ok(())
}

/// `--target-pf`: 0 (the paper's rule) or 0.5..=0.999999.
fn target_pf_or_paper(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v == 0.0 || (0.5..=0.999_999).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v}: give 0 (the paper's rule) or a target in 0.5..=0.999999"))
    }
}
