//! `fairfeed exchange`: the matching engine behind an OUCH 5.0 gateway,
//! publishing ITCH 5.0 on A/B lines; and `fairfeed exchange bench`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use fairfeed_bench::exchange::{exchange_bench, in_process, BenchOpts};
use fairfeed_bench::exchange_attack::Attack;
use fairfeed_io::counters::Board;
use fairfeed_net::exchange::live::{run_exchange, ExchangeConfig, Idle, Pipeline};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    bench: Option<Sub>,
    /// The exchange's configuration (TOML; `--example-config` prints one).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print an example configuration and exit.
    #[arg(long)]
    example_config: bool,
    /// Stop after this many seconds (default: on SIGINT/SIGTERM).
    #[arg(long, value_parser = crate::fmt::seconds)]
    seconds: Option<f64>,
    /// Write the report (JSON) here at exit (default: stdout).
    #[arg(long)]
    stats_out: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (gateway, sequencer, engines, ITCH publisher, order latency).
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    metrics: Option<std::net::SocketAddr>,
}

/// Serves what the exchange's threads publish as Prometheus metrics.
fn serve_metrics(addr: std::net::SocketAddr, board: Arc<Board>) -> anyhow::Result<fairfeed_ops::Endpoint> {
    let ep = fairfeed_ops::serve_metrics(addr, move |e| {
        let (j, order_latency) = fairfeed_net::exchange::live::metrics(&board);
        for part in ["gateway", "sequencer", "ordering", "publisher"] {
            e.json(&format!("fairfeed_exchange_{part}"), &j[part], &[], "the exchange (its report at exit, live)");
        }
        if !j["cheat"].is_null() {
            e.json(
                "fairfeed_exchange_cheat",
                &j["cheat"]["stats"],
                &[],
                "the cheat watch (deadline records, orders judged)",
            );
            for u in j["cheat"]["users"].as_array().map_or(&[][..], |v| &v[..]) {
                let user = u["user"].as_str().unwrap_or("");
                let flagged = if u["flagged_after"].is_null() { 0.0 } else { 1.0 };
                e.gauge(
                    "fairfeed_exchange_cheat_flagged",
                    "1: the user's orders came before its path allows",
                    &[("user", user)],
                    flagged,
                );
                let cusum = u["cusum_ns"].as_f64().unwrap_or(0.0) / 1e9;
                e.gauge(
                    "fairfeed_exchange_cheat_cusum_seconds",
                    "the cheat detector's sum of excess leads",
                    &[("user", user)],
                    cusum,
                );
            }
        }
        e.json(
            "fairfeed_exchange",
            &serde_json::json!({"ring_full": j["ring_full"]}),
            &[],
            "commands that waited for a full engine ring",
        );
        e.gauge("fairfeed_exchange_sessions", "open OUCH sessions", &[], j["sessions"].as_f64().unwrap_or(0.0));
        if let Some(engines) = j["engines"].as_object() {
            for (k, v) in engines {
                e.json("fairfeed_exchange_engine", v, &[("engine", k)], "one matching-engine thread");
            }
        }
        if let Some(h) = &order_latency {
            let help = "order latency: OUCH in at the gateway to the response written (t0→t4)";
            e.histogram(
                "fairfeed_exchange_order_latency_seconds",
                help,
                &[],
                h,
                1e-9,
                fairfeed_ops::metrics::LATENCY_BUCKETS_S,
            );
        }
    })
    .with_context(|| format!("serving metrics on {addr}"))?;
    tracing::info!(addr = %ep.addr, "exchange: metrics at http://{}/metrics", ep.addr);
    Ok(ep)
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Seed 002's latency matrix row: OUCH orders over loopback TCP at a rate, beside a TCP ping-pong.
    Bench(BenchArgs),
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum AttackArg {
    /// 300 connections from 75 addresses that never log in, dripping a byte a second each.
    IdleConnections,
    /// A logged-in client sending 2,000 orders/s that never reads its answers.
    SlowReader,
    /// 1,000 logins a second with a wrong password from one address.
    LoginGuessing,
    /// 200 connections a second, each 64 KiB of random bytes.
    Garbage,
    /// A control, no traffic: a thread busy 250 µs, 200 times a second (about what the garbage attacker's own thread takes).
    CpuControl,
}

impl AttackArg {
    fn attack(self) -> Attack {
        match self {
            AttackArg::IdleConnections => Attack::IdleConnections,
            AttackArg::SlowReader => Attack::SlowReader,
            AttackArg::LoginGuessing => Attack::LoginGuessing,
            AttackArg::Garbage => Attack::Garbage,
            AttackArg::CpuControl => Attack::CpuControl,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum PipelineArg {
    /// Run to completion where cores are few (fewer than engines + 3), threaded otherwise.
    Auto,
    /// One thread: sessions, engines and the ITCH publisher; an order never crosses a thread.
    RunToCompletion,
    /// Gateway, engine and publisher threads joined by SPSC rings.
    Threaded,
}

impl PipelineArg {
    fn pipeline(self) -> Pipeline {
        match self {
            PipelineArg::Auto => Pipeline::Auto,
            PipelineArg::RunToCompletion => Pipeline::RunToCompletion,
            PipelineArg::Threaded => Pipeline::Threaded,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum IdleArg {
    /// Spin where the host has two cores to spare beside the exchange's threads, park otherwise.
    Auto,
    /// Busy-poll: a core per thread, no wake-up latency.
    Spin,
    /// Spin 50 µs, yield 50 µs, then sleep until input (or 1 ms).
    Backoff,
    /// Sleep until input at once.
    Park,
}

impl IdleArg {
    fn idle(self) -> Idle {
        match self {
            IdleArg::Auto => Idle::Auto,
            IdleArg::Spin => Idle::Spin,
            IdleArg::Backoff => Idle::Backoff,
            IdleArg::Park => Idle::Park,
        }
    }
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Orders per second (seed 002: 10K, 50K, 100K, 250K, 500K).
    #[arg(long, default_value_t = 10_000.0, value_parser = crate::fmt::order_rate)]
    rate: f64,
    /// Products (symbols) the orders spread over (seed 002: 1, 1, 2, 5, 10).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000))]
    products: usize,
    /// Seconds of load, 0.001..=600.
    #[arg(long, default_value_t = 5.0, value_parser = bench_seconds)]
    seconds: f64,
    /// Engine threads (symbols sharded over them).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16))]
    engines: usize,
    /// Inbound fairness on: clients stamp their orders, the gateway sequences
    /// them by stamp within this window (µs; 0..=1,000,000).
    #[arg(long, default_value_t = 0.0, value_parser = window_us)]
    sequencing_window_us: f64,
    /// Client connections (each a sending and a reading thread).
    #[arg(long, default_value_t = 2, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    clients: usize,
    /// The exchange's pipeline: one thread does everything, a thread per stage, or by the cores there are.
    #[arg(long, value_enum, default_value_t = PipelineArg::Auto)]
    pipeline: PipelineArg,
    /// How the exchange's threads wait for work.
    #[arg(long, value_enum, default_value_t = IdleArg::Auto)]
    idle: IdleArg,
    /// A hostile client beside the load (paced; see docs/RESULTS.md): 300 idle connections, a client that never reads, password guessing, garbage bytes — or a control that only burns CPU.
    #[arg(long, value_enum)]
    attack: Option<AttackArg>,
    /// Run the attacker in alternate phases of this many ms (on, off, on, …)
    /// and report the load's latency in each half side by side (the first
    /// fifth of each phase in neither); 50..=10,000.
    #[arg(long, requires = "attack", value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(50..=10_000))]
    attack_phases_ms: Option<u64>,
    /// Instead: the matching core's throughput on one thread, in process.
    #[arg(long)]
    in_process: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(Sub::Bench(b)) = a.bench {
        return bench(b);
    }
    if a.example_config {
        let mut cfg = ExchangeConfig::default();
        cfg.gateway.symbols = vec!["AAPL".into(), "MSFT".into(), "NVDA".into()];
        cfg.itch_a = Some("127.0.0.1:26400".parse()?);
        cfg.itch_b = Some("127.0.0.1:26401".parse()?);
        cfg.retransmit_listen = Some("127.0.0.1:26402".parse()?);
        print!("{}", commented(&toml::to_string(&cfg)?));
        return Ok(());
    }
    let path = a.config.as_ref().context("--config FILE is required (see --example-config)")?;
    if let Some(p) = &a.stats_out {
        crate::fmt::check_outputs(&[p], &[path])?;
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut cfg: ExchangeConfig = toml::from_str(&text).map_err(|e| {
        let line = fairfeed_sim::model::toml_error_line(&text, &e);
        anyhow::anyhow!("{}: not an exchange configuration: {line}", path.display())
    })?;
    cfg.validate().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if let Some(k) = &cfg.operator_key_file {
        // Relative to the configuration file.
        let k = path.parent().map_or_else(|| k.clone(), |d| d.join(k));
        cfg.operator_key =
            Some(crate::fmt::operator_key(&k).with_context(|| format!("{}: operator_key_file", path.display()))?);
    }
    let stop = crate::fmt::stop_on_signals()?;
    let itch = match (cfg.itch_a, cfg.itch_b) {
        (None, None) => "no ITCH feed".to_string(),
        (Some(a), None) => format!("ITCH to {a}"),
        (None, Some(b)) => format!("ITCH to {b}"),
        (Some(a), Some(b)) => format!("ITCH to {a} (A) and {b} (B)"),
    };
    tracing::info!(
        listen = %cfg.listen,
        engines = cfg.engines,
        "exchange: OUCH on {} ({} users, {} symbols, {} engine thread(s)); {itch}",
        cfg.listen,
        cfg.gateway.users.len(),
        cfg.gateway.symbols.len(),
        cfg.engines,
    );
    let metrics = a.metrics.map(|_| Board::new());
    let _endpoint = match (a.metrics, &metrics) {
        (Some(addr), Some(m)) => Some(serve_metrics(addr, m.clone())?),
        _ => None,
    };
    let r = run_exchange(cfg, &stop, a.seconds, metrics).context("running the exchange")?;
    let text = serde_json::to_string_pretty(&r)?;
    match &a.stats_out {
        Some(p) => std::fs::write(p, text)?,
        None => println!("{text}"),
    }
    Ok(())
}

fn window_us(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.0, 1e6, "µs")
}

fn bench_seconds(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.001, 600.0, "seconds")
}

fn bench(b: BenchArgs) -> anyhow::Result<()> {
    if b.in_process {
        let commands = 2_000_000;
        let (rate, events) = in_process(commands, b.products.max(1), 5);
        let v = serde_json::json!({
            "orders_per_s": rate,
            "commands": commands,
            "events_per_run": events,
            "products": b.products,
            "runs": 5,
            "what": "median of 5 runs: limit orders near the mid, 30% cancels, 20% crossing IOC, one thread",
        });
        if b.json {
            println!("{v}");
        } else {
            println!(
                "matching core: {rate:.0} commands/s on one thread ({events} events per run of {commands} commands)"
            );
        }
        return Ok(());
    }
    let tick = crate::fmt::ticker(b.seconds, "orders through the gateway (tenths of a second)");
    let o = BenchOpts {
        engines: b.engines,
        window_ns: (b.sequencing_window_us * 1e3) as u64,
        clients: b.clients,
        pipeline: b.pipeline.pipeline(),
        idle: b.idle.idle(),
        attack: b.attack.map(AttackArg::attack),
        attack_phase_ms: b.attack_phases_ms.unwrap_or(0),
    };
    let r = exchange_bench(b.rate, b.products, b.seconds, o)?;
    drop(tick);
    if b.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{:?}: {:.0} orders/s asked, {:.0} achieved, {} product(s): avg {:.1} µs, σ {:.1}, min {:.1}, p50 {:.1}, p95 {:.1}, \
             p99 {:.1}, max {:.1}; TCP ping-pong p50/p99 {:.1}/{:.1} µs",
            r.pipeline,
            r.rate,
            r.achieved_rate,
            r.products,
            r.avg_us,
            r.stddev_us,
            r.min_us,
            r.p50_us,
            r.p95_us,
            r.p99_us,
            r.max_us,
            r.baseline_tcp_rtt_p50_us,
            r.baseline_tcp_rtt_p99_us
        );
        for s in &r.steps {
            println!("  {:<28} p50 {:>8.1} µs  p99 {:>8.1} µs  max {:>9.1} µs", s.name, s.p50_us, s.p99_us, s.max_us);
        }
        if let (Some(on), Some(off), Some(ratio)) = (r.attack_on, r.attack_off, r.attack_p99_ratio) {
            println!(
                "  attacker on: p50 {:.1} µs, p99 {:.1} µs ({} orders); off: p50 {:.1} µs, p99 {:.1} µs ({} orders); p99 on ÷ off {:.2}",
                on.p50_us, on.p99_us, on.orders, off.p50_us, off.p99_us, off.orders, ratio
            );
        }
        let c = &r.cpu;
        println!(
            "  CPU per order: exchange {:.0} ns ({:.0} in the kernel; {:.2} of a core), generator {:.0} ns ({:.2} of a core)",
            c.exchange_ns_per_order, c.exchange_system_ns_per_order, c.exchange_busy, c.generator_ns_per_order, c.generator_busy
        );
    }
    Ok(())
}

/// What each key of the exchange's configuration means, its unit and its limit.
const CONFIG_HELP: &[(&str, &str)] = &[
    ("listen", "OUCH 5.0 over SoupBinTCP: the address clients connect to"),
    ("engines", "matching engines, 1..=16 (threads of their own when threaded); symbols are sharded by stock locate modulo this"),
    (
        "pipeline",
        "run-to-completion (one thread owns the sessions, the engines and the ITCH publisher: an order never crosses a thread), threaded (gateway, engine and publisher threads joined by SPSC rings), or auto (threaded when the host has more cores than engines + 2); the one chosen is logged at start-up and reported",
    ),
    ("idle", "how the exchange's threads wait for work: auto (default: spin where the host has two cores to spare beside the exchange's threads, park otherwise), spin (busy polling, a core each), backoff (spin 50 us, yield 50 us, then sleep until input or 1 ms) or park (sleep in poll(2) until input)"),
    ("itch_a", "the ITCH 5.0 A line (MoldUDP64 over UDP); leave out for none"),
    ("itch_b", "the B line: the same packets again"),
    ("retransmit_listen", "answer MoldUDP64 retransmission requests from the ITCH journal here"),
    ("itch_session", "the MoldUDP64 session name, 1-10 ASCII characters"),
    ("deadlines_listen", "the cheat watch: take the sender's sealed deadline records here (fairfeed sender --deadlines-to) and judge every order carrying a DBO delivery clock (tag 0xF1) against the deadline of the data it answers, its stated response time and its session's TCP path floor; leave out for none; needs operator_key_file"),
    ("operator_key_file", "the operator key (64 hex digits, relative to this file) the sender seals its deadline records under"),
    ("sequencing_window_ns", "hold orders this long and hand them to engines in client-timestamp order; 0 = off; at most 1 s"),
    (
        "ordering",
        "fifo (default: arrival order, or client-timestamp order with sequencing_window_ns), dbo (delivery-based ordering: by the (data sequence, response time) clock each order carries in OUCH appendage tag 0xF1, each order held at most dbo_bound_ns; orders without one rank at their firm's last clock) or batch (frequent batch auctions: every order of a batch_us interval is cleared together, one uniform-price call auction per symbol against the book; within a batch arrival time does not matter, and at the marginal price the batch's orders share pro rata; a minimum quantity is refused; ITCH shows each displayed resting order's fill as C Order Executed With Price and the auction as one Q Cross Trade, type I)",
    ),
    ("batch_us", "with ordering = \"batch\": the batch interval, 1..=1,000,000 us; batches end at its multiples on the wall clock"),
    ("dbo_bound_ns", "with ordering = \"dbo\": the longest an order waits for better-ranked ones, 1 us..=1 s; set it to the spread of the firms' order-path delays (orders that arrive after it are released at once and counted late)"),
    (
        "out_buffer_max_bytes",
        "bytes queued for one client at most; a client that stops reading is closed at this limit (counted slow_reader_closes); 4096..=1 GiB, default 4 MiB",
    ),
    (
        "itch_heartbeat_ns",
        "a MoldUDP64 heartbeat (no messages, the next sequence number) on each ITCH line after this long without a packet; 1 ms..=60 s, default 1 s",
    ),
    (
        "itch_journal_max_bytes",
        "bytes of ITCH messages the retransmission journal keeps; beyond it the oldest are dropped (counted itch_journal_evicted) and requests for them go unanswered; 64 KiB..=64 GiB, default 256 MiB",
    ),
    ("session", "the SoupBinTCP session announced at login, 1-10 characters"),
    ("users", "[username, password] pairs; usernames up to 6 characters, passwords up to 10"),
    ("symbols", "tradable symbols, up to 8 characters each; the first is stock locate 1"),
    ("heartbeat_ns", "a server heartbeat after this much silence towards a logged-in client"),
    ("idle_timeout_ns", "close a connection that sent nothing (not even a heartbeat) for this long"),
    (
        "login_timeout_ns",
        "close a connection that has not logged in this long after opening, however it trickles; at most 600 s, default 5 s. At most 4 not-yet-logged-in connections per address, 256 connections in all, 5 failed logins per address per second (further connections refused for the rest of that second)",
    ),
    ("orders", "live (resting) orders across all books at most; more are rejected (reason 6)"),
    ("levels", "price levels per side of one book at most; more are rejected (reason 7)"),
    ("qty_max", "largest quantity of one order"),
    ("price_max", "highest price, in ITCH's 4 decimals (2000000000 = 200,000.0000)"),
];

/// The configuration `toml` with a comment line above each key it explains.
fn commented(toml: &str) -> String {
    let mut out = String::from("# fairfeed exchange configuration: every key, what it means and its limit.\n");
    let mut section = "";
    for line in toml.lines() {
        if let Some(s) = line.strip_prefix('[') {
            section = s.trim_end_matches(']');
        }
        let key = line.split(" = ").next().unwrap_or_default();
        let help = CONFIG_HELP.iter().find(|(k, _)| *k == key && !(key == "symbols" && section == "limits"));
        match (help, key, section) {
            (_, "symbols", "limits") => out += "# symbols the engines are sized for (stock locates 1..=symbols)\n",
            (Some((_, h)), _, _) => out += &format!("# {h}\n"),
            _ => {}
        }
        out += line;
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::commented;

    #[test]
    fn the_example_configuration_explains_every_key_and_still_parses() {
        let cfg = fairfeed_net::exchange::live::ExchangeConfig {
            itch_a: Some("127.0.0.1:26400".parse().unwrap()),
            ..Default::default()
        };
        let text = commented(&toml::to_string(&cfg).unwrap());
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.contains(" = ") && !l.starts_with('#') {
                assert!(i > 0 && lines[i - 1].starts_with("# "), "no comment above {l:?}");
            }
        }
        let back: fairfeed_net::exchange::live::ExchangeConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.out_buffer_max_bytes, cfg.out_buffer_max_bytes);
        assert_eq!(back.gateway.login_timeout_ns, cfg.gateway.login_timeout_ns);
    }
}
