//! `fairfeed bridge run|bench` and `fairfeed subscribe`: the arbitrated feed
//! into NATS (seed 001 with a real broker).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fairfeed_bench::bridge::{run as bench_run, BenchConfig, BenchReport};
use fairfeed_bridge::live::{BridgeAgent, LiveConfig};
use fairfeed_bridge::publish::{Bridge, Overflow, PublishConfig};
use fairfeed_bridge::route::{By, Granularity, RouteConfig};
use fairfeed_bridge::subscribe::{subscribe, StopWhen, SubscribeConfig};

#[derive(Clone, Copy, clap::ValueEnum)]
enum GranularityArg {
    Packet,
    Message,
    Batched,
    /// Per message while the broker keeps up, batched while it does not.
    Auto,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ByArg {
    Service,
    Symbol,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum OverflowArg {
    Drop,
    Block,
}

fn granularity(g: GranularityArg) -> Granularity {
    match g {
        GranularityArg::Packet => Granularity::Packet,
        GranularityArg::Message => Granularity::Message,
        GranularityArg::Batched => Granularity::Batched,
        GranularityArg::Auto => Granularity::Auto,
    }
}

fn by(b: ByArg) -> By {
    match b {
        ByArg::Service => By::Service,
        ByArg::Symbol => By::Symbol,
    }
}

#[derive(clap::Subcommand)]
pub enum BridgeCmd {
    /// Publish MoldUDP64 packets arriving on a UDP port (e.g. `fairfeed arb --out-hr`) into NATS.
    Run(Box<RunArgs>),
    /// Seed 001's experiment: a generated feed at a fixed packet rate through the bridge to K subscribers.
    Bench(BenchArgs),
    /// The whole seed-001 matrix (rates × subscribers × service/symbol × granularities) with tables and plots.
    Matrix(MatrixArgs),
}

#[derive(clap::Args)]
pub struct MatrixArgs {
    /// Packet rates (seed 001: ≈1,300 mean, ≈10,000 peak).
    #[arg(long, value_delimiter = ',', default_value = "1300,10000", value_parser = crate::fmt::bridge_rate)]
    rates: Vec<f64>,
    /// Subscriber counts to run, comma-separated; each 1..=64.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,6,8,10", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    subscribers: Vec<usize>,
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0, value_parser = crate::fmt::seconds)]
    seconds: f64,
    /// Use this NATS server (default: start a private nats-server on a free port for each run).
    #[arg(long)]
    nats: Option<String>,
    /// Output directory (created): report and plots of the matrix.
    #[arg(long, default_value = "out/bridge-matrix")]
    out: PathBuf,
    /// Run NATS's Go client beside every row, as its baseline (see `bridge bench --baseline`).
    #[arg(long, value_name = "NATSBASE")]
    baseline: Option<PathBuf>,
}

/// Credentials and TLS for the broker (secrets from files, never from the command line).
#[derive(clap::Args, Debug, Clone)]
pub struct NatsArgs {
    /// NATS user name (the password comes from --nats-password-file).
    #[arg(long, requires = "nats_password_file", conflicts_with_all = ["nats_token_file", "nats_nkey_file", "nats_creds"])]
    nats_user: Option<String>,
    /// File holding the NATS user's password.
    #[arg(long, requires = "nats_user")]
    nats_password_file: Option<PathBuf>,
    /// File holding a NATS authentication token.
    #[arg(long, conflicts_with_all = ["nats_nkey_file", "nats_creds"])]
    nats_token_file: Option<PathBuf>,
    /// File holding an nkey seed (SU…; the server lists its public key U…).
    #[arg(long, conflicts_with = "nats_creds")]
    nats_nkey_file: Option<PathBuf>,
    /// A NATS JWT credentials file (.creds, as `nsc` writes them).
    #[arg(long)]
    nats_creds: Option<PathBuf>,
    /// CA certificate(s), PEM, that the server's certificate must chain to (implies TLS).
    #[arg(long)]
    nats_ca: Option<PathBuf>,
    /// Client certificate, PEM, for servers that verify clients (with --nats-key).
    #[arg(long, requires = "nats_key")]
    nats_cert: Option<PathBuf>,
    /// The client certificate's private key, PEM.
    #[arg(long, requires = "nats_cert")]
    nats_key: Option<PathBuf>,
    /// Refuse a server that does not offer TLS.
    #[arg(long)]
    nats_tls: bool,
}

impl NatsArgs {
    fn security(&self) -> fairfeed_bridge::security::Security {
        fairfeed_bridge::security::Security {
            user: self.nats_user.clone(),
            password_file: self.nats_password_file.clone(),
            token_file: self.nats_token_file.clone(),
            nkey_file: self.nats_nkey_file.clone(),
            creds_file: self.nats_creds.clone(),
            ca: self.nats_ca.clone(),
            cert: self.nats_cert.clone(),
            key: self.nats_key.clone(),
            require_tls: self.nats_tls,
        }
    }
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// Where the arbitrated feed arrives.
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    listen: SocketAddr,
    /// NATS server URL; a cluster's nodes separated by commas (tls:// for TLS).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    #[command(flatten)]
    auth: NatsArgs,
    /// What one publication carries: a whole packet, one message, or the messages of a packet for one subject.
    #[arg(long, value_enum, default_value_t = GranularityArg::Batched)]
    granularity: GranularityArg,
    /// Subjects per symbol, or per service (message type).
    #[arg(long, value_enum, default_value_t = ByArg::Symbol)]
    by: ByArg,
    /// Subject prefix (dot-separated tokens, no wildcards or spaces).
    #[arg(long, default_value = "ff.itch", value_parser = crate::fmt::subject_prefix)]
    prefix: String,
    /// Publish into this JetStream stream (created if missing): acknowledged,
    /// retried through broker restarts, deduplicated; replayable by late joiners.
    #[arg(long)]
    jetstream: Option<String>,
    /// Replicas of the JetStream stream when the bridge creates it (a cluster's nodes keep copies), 1..=5.
    #[arg(long, default_value_t = 1, requires = "jetstream", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=5))]
    replicas: usize,
    /// Publications queued for the broker at most.
    #[arg(long, default_value_t = fairfeed_bridge::publish::BUFFER_DEFAULT, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    buffer: usize,
    /// When the queue is full: drop (counted) or block the feed.
    #[arg(long, value_enum, default_value_t = OverflowArg::Drop)]
    overflow: OverflowArg,
    /// Stop after this many seconds (default: on SIGINT/SIGTERM).
    #[arg(long, value_parser = crate::fmt::seconds)]
    seconds: Option<f64>,
    /// Print the counters to stderr this often, seconds.
    #[arg(long, value_parser = crate::fmt::seconds)]
    stats_interval_s: Option<f64>,
    /// Write the final counters here (JSON; default: stdout).
    #[arg(long)]
    stats_out: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (publications, drops, errors, queue).
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    metrics: Option<std::net::SocketAddr>,
    /// Fill the feed's gaps from this MoldUDP64 retransmission server before publishing (a one-line arbitrator in front of the bridge); gaps it cannot fill still go out as gap markers.
    #[arg(long, value_parser = crate::fmt::dest_addr)]
    retransmit: Option<SocketAddr>,
    /// With --retransmit: how long packets behind a gap wait for its fill before the gap is given up, ms (1..=10000).
    #[arg(long, default_value_t = 200, requires = "retransmit", value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=10_000))]
    retransmit_hold_ms: u64,
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Subscriber connections; 1..=64.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    subscribers: usize,
    /// What one publication carries: a whole packet, one message, or the messages of a packet for one subject.
    #[arg(long, value_enum, default_value_t = GranularityArg::Packet)]
    granularity: GranularityArg,
    /// Subjects per symbol, or per service (message type).
    #[arg(long, value_enum, default_value_t = ByArg::Service)]
    by: ByArg,
    /// Packets per second (seed 001: ≈1,300 mean, ≈10,000 peak).
    #[arg(long, default_value_t = 1_300.0, value_parser = crate::fmt::bridge_rate)]
    rate: f64,
    /// Seconds of feed.
    #[arg(long, default_value_t = 10.0, value_parser = crate::fmt::seconds)]
    seconds: f64,
    /// Use this server (default: start a local nats-server).
    #[arg(long)]
    nats: Option<String>,
    /// Seed of the generated feed (same seed, same feed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also run NATS's Go client with the same load through the same server, as the baseline row
    /// (`scripts/natsbase.sh` builds it from tools/natsbase and prints its path).
    #[arg(long, value_name = "NATSBASE")]
    baseline: Option<PathBuf>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct SubscribeArgs {
    /// Subject, NATS wildcards allowed, e.g. 'ff.itch.*.AAPL.>'.
    #[arg(long, default_value = "ff.itch.>")]
    subject: String,
    /// NATS server URL; a cluster's nodes separated by commas (tls:// for TLS).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    #[command(flatten)]
    auth: NatsArgs,
    /// Read this JetStream stream from its start (a late joiner) instead of live.
    #[arg(long)]
    jetstream: Option<String>,
    /// The bridge's gap markers (feed gaps before the bridge), listened for as well when --subject
    /// does not cover them; reported apart from broker gaps.
    #[arg(long, default_value = "ff.itch.*.control.gap")]
    gaps: String,
    /// Stop after this many publications.
    #[arg(long)]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, value_parser = crate::fmt::seconds)]
    seconds: Option<f64>,
    /// Stop once nothing arrived for this many seconds (after the first).
    #[arg(long, value_parser = crate::fmt::seconds)]
    idle_s: Option<f64>,
    /// Print one line per publication.
    #[arg(long, conflicts_with = "decode")]
    print: bool,
    /// Print one line per ITCH message, decoded from any granularity (sequence number, type, stock
    /// locate, timestamp, symbol), and one per gap: the feed's (before the bridge) or the broker's.
    #[arg(long)]
    decode: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(c: BridgeCmd) -> anyhow::Result<()> {
    match c {
        BridgeCmd::Run(a) => run_bridge(*a),
        BridgeCmd::Bench(a) => run_bench(a),
        BridgeCmd::Matrix(a) => run_matrix(a),
    }
}

fn run_matrix(a: MatrixArgs) -> anyhow::Result<()> {
    crate::fmt::check_out_dir(&a.out)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let grans = [Granularity::Packet, Granularity::Message, Granularity::Batched, Granularity::Auto];
    let bys = [By::Service, By::Symbol];
    let total = (a.rates.len() * a.subscribers.len() * grans.len() * bys.len()) as u64;
    let pb = crate::fmt::progress(total, "seed-001 matrix through NATS");
    let mut rows = Vec::new();
    for &rate in &a.rates {
        for &g in &grans {
            for &b in &bys {
                for &k in &a.subscribers {
                    pb.set_message(format!("{rate} pps, {g:?} by {b:?}, {k} subscriber(s)"));
                    let cfg = BenchConfig {
                        subscribers: k,
                        granularity: g,
                        by: b,
                        rate_pps: rate,
                        seconds: a.seconds,
                        nats: a.nats.clone(),
                        seed: 1,
                        baseline: a.baseline.clone(),
                    };
                    let r = bench_run(&cfg, |_| {}).map_err(|e| anyhow::anyhow!("bridge matrix: {e}"))?;
                    rows.push(r);
                    pb.inc(1);
                }
            }
        }
    }
    pb.finish_and_clear();
    let md = matrix_table(&rows, a.seconds);
    std::fs::write(a.out.join("summary.md"), &md)?;
    std::fs::write(a.out.join("summary.json"), serde_json::to_string_pretty(&rows)?)?;
    matrix_plots(&a, &rows, &grans, &bys);
    print!("{md}");
    eprintln!("bridge matrix: {} rows in {}", rows.len(), a.out.display());
    Ok(())
}

/// The matrix as a Markdown table.
fn matrix_table(rows: &[BenchReport], seconds: f64) -> String {
    let mut md = format!(
        "# Seed 001's experiment with NATS\n\n{} s per row; every subscriber subscribed to everything (`ff.itch.>`); \
         latency from the bridge's ingress tag to the subscriber, ms.\n\n\
         | packets/s | granularity | by | subscribers | publications/s | mean | min | max | p50 | p90 | p99 | lost | dup | Go client p50 / p99 / lost (same load) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        seconds
    );
    for r in rows {
        md += &format!(
            "| {:.0} | {:?} | {:?} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} | {} |\n",
            r.rate_pps,
            r.granularity,
            r.by,
            r.subscribers,
            r.publications_per_s,
            r.latency.mean_ms,
            r.latency.min_ms,
            r.latency.max_ms,
            r.latency.p50_ms,
            r.latency.p90_ms,
            r.latency.p99_ms,
            r.lost,
            r.duplicates,
            r.baseline.as_ref().map_or("—".to_string(), |v| format!(
                "{:.3} / {:.3} / {}",
                v["p50_ms"].as_f64().unwrap_or(f64::NAN),
                v["p99_ms"].as_f64().unwrap_or(f64::NAN),
                v["lost"]
            ))
        );
    }
    md
}

/// p50 and p90 against subscribers, one plot per rate and quantile.
fn matrix_plots(a: &MatrixArgs, rows: &[BenchReport], grans: &[Granularity], bys: &[By]) {
    for &rate in &a.rates {
        for (q, name) in [(0usize, "p50"), (1, "p90")] {
            let series: Vec<(String, Vec<(f64, f64)>)> = grans
                .iter()
                .flat_map(|&g| bys.iter().map(move |&b| (g, b)))
                .map(|(g, b)| {
                    let pts = rows
                        .iter()
                        .filter(|r| r.rate_pps == rate && r.granularity == g && r.by == b)
                        .map(|r| (r.subscribers as f64, if q == 0 { r.latency.p50_ms } else { r.latency.p90_ms }))
                        .collect();
                    (format!("{g:?} by {b:?}"), pts)
                })
                .collect();
            let file = a.out.join(format!("{name}_{rate:.0}pps.svg"));
            let title = format!("Bridge → NATS → subscribers at {rate:.0} packets/s: {name} latency");
            if let Err(e) =
                fairfeed_sim::plot::lines_svg(&file, &title, "subscribers", &format!("{name} (ms)"), &series, 1.0)
            {
                eprintln!("bridge matrix: could not draw {}: {e}", file.display());
            }
        }
    }
}

/// The feed's socket: blocking reads, the large buffer asked for, and a
/// warning when the kernel granted less.
fn run_bridge(a: RunArgs) -> anyhow::Result<()> {
    if let Some(p) = &a.stats_out {
        crate::fmt::check_outputs(&[p], &[])?;
    }
    let stop = crate::fmt::stop_on_signals()?;
    let route = RouteConfig { granularity: granularity(a.granularity), by: by(a.by), prefix: a.prefix.clone() };
    let mut cfg = PublishConfig::new(&a.nats);
    cfg.security = a.auth.security();
    cfg.replicas = a.replicas;
    cfg.jetstream = a.jetstream.clone();
    cfg.buffer = a.buffer;
    cfg.overflow = match a.overflow {
        OverflowArg::Drop => Overflow::Drop,
        OverflowArg::Block => Overflow::Block,
    };
    let bridge = Bridge::start(route, cfg).map_err(|e| anyhow::anyhow!("bridge: {e}"))?;
    let board = a.metrics.map(|_| fairfeed_io::counters::Board::new());
    let _metrics = match (a.metrics, board.clone()) {
        (Some(addr), Some(b)) => {
            let help = "the bridge into NATS (its report)";
            Some(crate::fmt::serve_json_metrics(addr, b, fairfeed_bridge::live::BRIDGE_PART, "fairfeed_bridge", help)?)
        }
        _ => None,
    };
    let live = LiveConfig {
        listen: a.listen,
        fill: a.retransmit.map(|s| (s, a.retransmit_hold_ms)),
        max_ns: a.seconds.map(|s| (s * 1e9) as u64),
        stats_interval_ns: a.stats_interval_s.map(|s| (s * 1e9) as u64),
        publish: board,
    };
    let mut agent = BridgeAgent::new(live, bridge).map_err(|e| anyhow::anyhow!("bridge: {e}"))?;
    tracing::info!(
        listen = %a.listen,
        nats = %a.nats,
        "bridge: {} → {} ({}), listening",
        a.listen,
        a.nats,
        a.jetstream.as_deref().unwrap_or("core NATS")
    );
    let run = fairfeed_io::agent::RunConfig { stop: Some(stop), ..fairfeed_io::agent::RunConfig::default() };
    fairfeed_io::agent::run(&mut [&mut agent], &run).context("running the bridge")?;
    let (r, v) = agent.finish(Duration::from_secs(30));
    let text = serde_json::to_string_pretty(&v)?;
    match &a.stats_out {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?,
        None => println!("{text}"),
    }
    if r.publish_errors > 0 && r.published == 0 {
        anyhow::bail!("bridge: all {} publications failed", r.publish_errors);
    }
    Ok(())
}

fn run_bench(a: BenchArgs) -> anyhow::Result<()> {
    let cfg = BenchConfig {
        subscribers: a.subscribers,
        granularity: granularity(a.granularity),
        by: by(a.by),
        rate_pps: a.rate,
        seconds: a.seconds,
        nats: a.nats,
        seed: a.seed,
        baseline: a.baseline,
    };
    let pb = crate::fmt::progress(100, "replaying through the bridge");
    let r =
        bench_run(&cfg, |f| pb.set_position((f * 100.0) as u64)).map_err(|e| anyhow::anyhow!("bridge bench: {e}"))?;
    pb.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} subscriber(s), {:?} by {:?}, {:.0} packets/s ({:.0} publications/s): mean {:.3} ms, min {:.3}, \
             p50 {:.3}, p90 {:.3}, p99 {:.3}, max {:.3}; lost {}, duplicates {}",
            r.subscribers,
            r.granularity,
            r.by,
            r.achieved_pps,
            r.publications_per_s,
            r.latency.mean_ms,
            r.latency.min_ms,
            r.latency.p50_ms,
            r.latency.p90_ms,
            r.latency.p99_ms,
            r.latency.max_ms,
            r.lost,
            r.duplicates
        );
        if let (Some(v), Some(ratio)) = (&r.baseline, r.p50_vs_baseline) {
            println!(
                "baseline ({}, same load and server): p50 {:.3} ms, p99 {:.3}; lost {} — the bridge's p50 is {ratio:.2}× it",
                v["client"].as_str().unwrap_or("?"),
                v["p50_ms"].as_f64().unwrap_or(f64::NAN),
                v["p99_ms"].as_f64().unwrap_or(f64::NAN),
                v["lost"]
            );
        }
    }
    Ok(())
}

/// One line per decoded message or gap (`subscribe --decode`).
fn print_event(e: fairfeed_bridge::consume::Event<'_>) {
    use fairfeed_bridge::consume::Event;
    match e {
        Event::Message { subject, seq, msg } => {
            let stock = msg.stock().map(|s| String::from_utf8_lossy(s.trimmed()).into_owned()).unwrap_or_default();
            let seq = seq.map_or("-".to_string(), |s| s.to_string());
            println!(
                "{subject} seq {seq} type {} locate {} ts {} {stock}",
                msg.as_bytes()[0] as char,
                msg.stock_locate(),
                msg.timestamp()
            );
        }
        Event::FeedGap { first, missing } => {
            println!("FEED GAP: {missing} messages from seq {first} lost before the bridge")
        }
        Event::BrokerGap { subject, missing } => {
            println!("BROKER GAP: {missing} publications of {subject} not delivered")
        }
        Event::EndOfSession { subject } => println!("{subject}: end of session"),
    }
}

pub fn run_subscribe(a: SubscribeArgs) -> anyhow::Result<()> {
    let cfg = SubscribeConfig {
        url: a.nats.clone(),
        subject: a.subject.clone(),
        jetstream: a.jetstream.clone(),
        stop: StopWhen {
            publications: a.count,
            after: a.seconds.map(Duration::from_secs_f64),
            idle: a.idle_s.map(Duration::from_secs_f64),
            // SIGTERM / SIGINT: stop and still print the summary.
            flag: Some(crate::fmt::stop_on_signals()?),
        },
        gaps: Some(a.gaps.clone()),
        security: a.auth.security(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (print, decode) = (a.print, a.decode);
    let mut decoder = fairfeed_bridge::consume::Decoder::default();
    let (r, _) = rt
        .block_on(subscribe(&cfg, None, |m, lat| {
            if decode {
                decoder.handle(m.subject.as_str(), &m.payload, &mut print_event);
            }
            if print {
                let (body, tag) =
                    fairfeed_bridge::tag::split(&m.payload).map_or((&m.payload[..], None), |(b, t)| (b, Some(t)));
                let f = |x: Option<u64>| x.map_or("-".into(), |v| v.to_string());
                println!(
                    "{} seq {} count {} pub {} latency {} µs, {} bytes",
                    m.subject,
                    f(tag.map(|t| t.seq)),
                    f(tag.map(|t| u64::from(t.count))),
                    f(tag.map(|t| t.pub_seq)),
                    f(lat),
                    body.len()
                );
            }
        }))
        .map_err(|e| anyhow::anyhow!("subscribe: {e}"))?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else if crate::log::json() {
        crate::log::final_report("subscribe", &r);
    } else {
        eprintln!(
            "subscribe {}: {} publications ({} messages), {} duplicates, {} missing (broker), {} reordered; \
             feed gaps {} ({} messages lost before the bridge); latency p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            a.subject,
            r.publications,
            r.messages,
            r.duplicates,
            r.missing,
            r.reordered,
            r.feed_gaps,
            r.feed_gap_messages,
            r.latency.p50_ms,
            r.latency.p99_ms,
            r.latency.max_ms
        );
        if let Some(e) = &r.last_consumer_error {
            eprintln!(
                "subscribe {}: the JetStream consumer reported {} errors (last: {e})",
                a.subject, r.consumer_errors
            );
        }
    }
    Ok(())
}
