//! `fairfeed arb` and `fairfeed retransmit-server`: the line arbitrator's
//! shells on capture files and on live UDP.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fairfeed_arb::retransmit::{Journal, RetransmitServer, ServerConfig};
use fairfeed_arb::spec::SeqSpec;
use fairfeed_arb::{Arbitrator, Config, Mode, RetransmitConfig, Start, Window};
use fairfeed_feed::capture::{CaptureWriter, Datagram};
use fairfeed_io::counters::Board;
use fairfeed_io::idle::IdleStrategy;
use fairfeed_net::arb::live::{run_live, run_retransmit_server, LiveConfig, ARB_PART, RETRANSMIT_PART};
use fairfeed_net::arb::offline::run_offline;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum IdleArg {
    /// Never sleep: lowest latency, one core busy.
    Spin,
    /// Spin 50 µs after the last packet, then yield the CPU until 1 ms, then sleep in poll(2).
    Backoff,
    /// Sleep in poll(2) at once: least CPU, tens of µs to wake.
    Park,
}

impl IdleArg {
    pub fn strategy(self) -> IdleStrategy {
        match self {
            IdleArg::Spin => IdleStrategy::Spin,
            IdleArg::Backoff => IdleStrategy::BACKOFF_DEFAULT,
            IdleArg::Park => IdleStrategy::Park,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ModeArg {
    Time,
    Count,
    TimeCount,
}

#[derive(clap::Args)]
pub struct Args {
    /// Line A from a capture (offline mode).
    #[arg(long, requires = "out", conflicts_with_all = ["a", "b"])]
    a_pcap: Option<PathBuf>,
    /// Line B from a capture (offline mode).
    #[arg(long)]
    b_pcap: Option<PathBuf>,
    /// Offline: the high-reliability output as a pcap.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Offline: also the low-latency output as a pcap.
    #[arg(long)]
    out_ll_pcap: Option<PathBuf>,
    /// Offline: recover gaps no line filled from this capture of the clean feed,
    /// through the retransmission server's request/response core.
    #[arg(long)]
    retransmit_journal: Option<PathBuf>,
    /// Offline: virtual round trip to the retransmission server, µs.
    #[arg(long, default_value_t = 100.0, value_parser = crate::fmt::us)]
    retransmit_rtt_us: f64,
    /// Only datagrams to this UDP port in the captures.
    #[arg(long)]
    port: Option<u16>,

    /// Live: listen for line A here.
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    a: Option<SocketAddr>,
    /// Live: listen for line B here.
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    b: Option<SocketAddr>,
    /// Live: further lines (C, D, ...).
    #[arg(long = "line", value_parser = crate::fmt::listen_addr)]
    more_lines: Vec<SocketAddr>,
    /// Live: send the low-latency output here.
    #[arg(long, value_parser = crate::fmt::dest_addr)]
    out_ll: Option<SocketAddr>,
    /// Live: send the high-reliability output here.
    #[arg(long, value_parser = crate::fmt::dest_addr)]
    out_hr: Option<SocketAddr>,
    /// Live: send non-market packets here.
    #[arg(long, value_parser = crate::fmt::dest_addr)]
    out_side: Option<SocketAddr>,
    /// Live: the MoldUDP64 retransmission server.
    #[arg(long, value_parser = crate::fmt::dest_addr)]
    retransmit: Option<SocketAddr>,
    /// Live: a UDP control socket (`stats`, `mode time|count|time-count`, `max-hold-us N`, `max-count N`).
    /// Window changes need --operator-key-file; beyond loopback, so does everything.
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    control: Option<SocketAddr>,
    /// Live: the operator key (a file of 64 hex digits): window changes on
    /// the control socket are obeyed only sealed under it (`fairfeed
    /// control ADDR --key-file FILE mode time`).
    #[arg(long, requires = "control")]
    operator_key_file: Option<std::path::PathBuf>,
    /// Live: exit once the session ended and the high-reliability output drained.
    #[arg(long)]
    exit_on_end: bool,
    /// Live: exit after this many seconds.
    #[arg(long, value_parser = crate::fmt::seconds)]
    max_seconds: Option<f64>,
    /// Live: what to do when no packet is ready: spin (lowest latency, one busy
    /// core), backoff (spin 50 µs, yield to 1 ms, then sleep), park (sleep at once).
    #[arg(long, value_enum, default_value = "backoff")]
    idle: IdleArg,
    /// Live: same as --idle spin.
    #[arg(long)]
    busy_poll: bool,
    /// Live: print a stats line to stderr this often (seconds): packets out on the high-reliability
    /// (hr) and low-latency (ll) outputs, duplicates dropped, gaps (filled by the other line, by
    /// retransmission, or given up), messages lost, packets held, and saturation — the slower
    /// line's p99 lead over the time the count window takes to fill (near or above 1 the count
    /// window gives up before the slower line arrives: widen it).
    #[arg(long, value_parser = crate::fmt::seconds)]
    stats_interval_s: Option<f64>,
    /// Live: serve Prometheus metrics at http://ADDR/metrics (the counters `control stats` shows).
    #[arg(long, conflicts_with = "a_pcap", value_parser = crate::fmt::listen_addr)]
    metrics: Option<SocketAddr>,

    /// Protocol preset: where the sequence number lives (moldudp64, xdp).
    #[arg(long, default_value = "moldudp64")]
    protocol: String,
    /// High-reliability window.
    #[arg(long, value_enum, default_value = "time-count")]
    mode: ModeArg,
    /// Time window: longest a packet is held, µs.
    #[arg(long, default_value_t = 1000.0, value_parser = crate::fmt::us)]
    max_hold_us: f64,
    /// Count window: most messages held.
    #[arg(long, default_value_t = 1000)]
    max_count: u64,
    /// Any mode: give up waiting after this long without data, ms.
    #[arg(long, default_value_t = 50.0, value_parser = crate::fmt::ms)]
    idle_flush_ms: f64,
    /// First sequence number (offline default: the lowest seen on any line;
    /// live default: the first packet's).
    #[arg(long)]
    start_seq: Option<u64>,
    /// Ask for a gap after it has been open this long, µs.
    #[arg(long, default_value_t = 200.0, value_parser = crate::fmt::us)]
    retransmit_grace_us: f64,
    /// Re-ask after this long without an answer, ms.
    #[arg(long, default_value_t = 20.0, value_parser = crate::fmt::ms)]
    retransmit_timeout_ms: f64,
    /// Asks per range before giving it up.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    retransmit_attempts: u32,
    /// Requests per second at most (paced, bursts of up to 64): keep it
    /// under the server's `--rate-per-s`, which drops what comes over it.
    #[arg(long, default_value_t = fairfeed_arb::types::REQUESTS_PER_S_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    retransmit_rate: u32,
    /// Keep asking this long while the server answers nothing at all (a
    /// partition is waited out; attempts count only while it answers others), ms.
    #[arg(long, default_value_t = 5_000.0, value_parser = |s: &str| crate::fmt::f64_in(s, 0.0, 600_000.0, "ms"))]
    retransmit_patience_ms: f64,
    /// Use exactly --retransmit-grace-us; by default the grace grows to the
    /// measured p99 lag between the lines, so gaps the slower line fills are not requested.
    #[arg(long)]
    retransmit_fixed_grace: bool,
    /// Write the statistics here as JSON at exit.
    #[arg(long)]
    stats_json: Option<PathBuf>,
}

fn config(a: &Args, lines: usize, start: Start, retransmit: bool) -> Config {
    let mode = match a.mode {
        ModeArg::Time => Mode::Time,
        ModeArg::Count => Mode::Count,
        ModeArg::TimeCount => Mode::TimeCount,
    };
    Config {
        lines,
        window: Window { mode, max_hold_ns: (a.max_hold_us * 1e3) as u64, max_count_msgs: a.max_count },
        start,
        idle_flush_ns: (a.idle_flush_ms * 1e6) as u64,
        retransmit: retransmit.then(|| RetransmitConfig {
            grace_ns: (a.retransmit_grace_us * 1e3) as u64,
            timeout_ns: (a.retransmit_timeout_ms * 1e6) as u64,
            attempts_max: a.retransmit_attempts,
            adaptive_grace: !a.retransmit_fixed_grace,
            requests_per_s: a.retransmit_rate,
            patience_ns: (a.retransmit_patience_ms * 1e6) as u64,
            ..RetransmitConfig::default()
        }),
        ..Config::default()
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let spec = SeqSpec::preset(&a.protocol)
        .with_context(|| format!("unknown --protocol {:?} (known: moldudp64, xdp)", a.protocol))?;
    if a.a_pcap.is_some() {
        offline(&a, spec)
    } else {
        live(&a, spec)
    }
}

/// Loads a capture into a retransmission journal.
fn journal(path: &std::path::Path, port: Option<u16>) -> anyhow::Result<Journal> {
    let datagrams = crate::fmt::read_capture(path, port)?;
    // The whole capture, already in memory, bounds it: no eviction.
    let mut j = Journal::with_limit(usize::MAX);
    for d in &datagrams {
        j.append_packet(&d.payload)
            .map_err(|e| anyhow::anyhow!("{}: cannot journal a packet: {e:?}", path.display()))?;
    }
    anyhow::ensure!(!j.is_empty(), "{}: no MoldUDP64 messages to journal", path.display());
    Ok(j)
}

fn offline(a: &Args, spec: SeqSpec) -> anyhow::Result<()> {
    let (Some(pa), Some(out)) = (&a.a_pcap, &a.out) else { anyhow::bail!("offline mode needs --a-pcap and --out") };
    let ins: Vec<&std::path::Path> = [Some(pa), a.b_pcap.as_ref(), a.retransmit_journal.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| p.as_path())
        .collect();
    let outs: Vec<&std::path::Path> =
        [Some(out), a.out_ll_pcap.as_ref(), a.stats_json.as_ref()].into_iter().flatten().map(|p| p.as_path()).collect();
    crate::fmt::check_outputs(&outs, &ins)?;
    let mut lines: Vec<Vec<Datagram>> = vec![crate::fmt::read_capture(pa, a.port)?];
    if let Some(pb) = &a.b_pcap {
        lines.push(crate::fmt::read_capture(pb, a.port)?);
    }
    // A capture of another protocol used to give "0 high-reliability packets" and exit 0.
    let total: usize = lines.iter().map(Vec::len).sum();
    let parsed = lines.iter().flatten().filter(|d| spec.plausible(&d.payload)).count();
    if total > 0 && parsed == 0 {
        anyhow::bail!(
            "none of the {total} UDP payloads parse as --protocol {} (known: moldudp64, xdp); is the capture of another protocol?",
            a.protocol
        );
    }
    if parsed < total {
        eprintln!(
            "arb: {} of {total} UDP payloads are not --protocol {} packets (passed to the side output, not merged)",
            total - parsed,
            a.protocol
        );
    }
    let start = match a.start_seq {
        Some(s) => Start::Seq(s),
        None => lines
            .iter()
            .flatten()
            .filter_map(|d| spec.parse(&d.payload))
            .map(|i| i.seq)
            .min()
            .map_or(Start::First, Start::Seq),
    };
    let mut server = match &a.retransmit_journal {
        Some(p) => Some(RetransmitServer::new(
            journal(p, a.port)?,
            ServerConfig { rate_per_s: 1e9, burst: 1e9, ..Default::default() },
        )),
        None => None,
    };
    let mut arb = Arbitrator::new(config(a, lines.len(), start, server.is_some()), spec).map_err(anyhow::Error::msg)?;
    let output = run_offline(&mut arb, &lines, server.as_mut(), (a.retransmit_rtt_us * 1e3) as u64);
    let dst = lines[0].first().map_or(SocketAddrV4::new(Ipv4Addr::new(233, 54, 12, 111), 26477), |d| d.dst);
    let src = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 40_000);
    let write = |path: &PathBuf, packets: &[fairfeed_net::arb::offline::Timed]| -> anyhow::Result<()> {
        let mut w = CaptureWriter::create(path)?;
        for p in packets {
            w.write(p.ts_ns, src, dst, &p.payload)?;
        }
        Ok(w.finish()?)
    };
    write(out, &output.high_reliability)?;
    if let Some(p) = &a.out_ll_pcap {
        write(p, &output.low_latency)?;
    }
    let last = lines.iter().flatten().map(|d| d.ts_ns).max().unwrap_or(0);
    let mut stats = serde_json::to_value(arb.stats_now(last))?;
    if let Some(s) = &server {
        stats["retransmit_server"] = serde_json::to_value(s.stats())?;
    }
    report(a, &stats)
}

fn report(a: &Args, stats: &serde_json::Value) -> anyhow::Result<()> {
    if let Some(p) = &a.stats_json {
        std::fs::write(p, serde_json::to_string_pretty(stats)?).with_context(|| format!("writing {}", p.display()))?;
    }
    if crate::log::json() {
        crate::log::final_report("arb", stats);
        return Ok(());
    }
    eprintln!(
        "arb: {} high-reliability packets, {} low-latency; gaps opened {}, filled by line {}, by retransmission {}, \
         given up {}; lost messages {}; duplicates {}",
        stats["hr_packets"],
        stats["ll_packets"],
        stats["gaps_opened"],
        stats["gaps_filled_by_line"],
        stats["gaps_filled_by_retransmit"],
        stats["gaps_given_up"],
        stats["lost_messages"],
        stats["duplicates"]
    );
    Ok(())
}

fn live(a: &Args, spec: SeqSpec) -> anyhow::Result<()> {
    if let Some(p) = &a.stats_json {
        crate::fmt::check_outputs(&[p], &[])?;
    }
    let lines: Vec<SocketAddr> = a.a.iter().chain(a.b.iter()).chain(a.more_lines.iter()).copied().collect();
    anyhow::ensure!(!lines.is_empty(), "give lines as --a/--b (live) or --a-pcap/--b-pcap (offline)");
    anyhow::ensure!(a.out_ll.is_some() || a.out_hr.is_some(), "give at least one of --out-ll, --out-hr");
    let start = a.start_seq.map_or(Start::First, Start::Seq);
    let arb =
        Arbitrator::new(config(a, lines.len(), start, a.retransmit.is_some()), spec).map_err(anyhow::Error::msg)?;
    let cfg = LiveConfig {
        lines,
        out_ll: a.out_ll,
        out_hr: a.out_hr,
        out_side: a.out_side,
        retransmit: a.retransmit,
        control: a.control,
        operator: a.operator_key_file.as_deref().map(crate::fmt::operator_key).transpose()?,
        exit_on_end: a.exit_on_end,
        max_seconds: a.max_seconds,
        idle: if a.busy_poll { IdleStrategy::Spin } else { a.idle.strategy() },
        stats_interval: a.stats_interval_s.map(Duration::from_secs_f64),
        publish: a.metrics.map(|_| Board::new()),
        stop: Some(crate::fmt::stop_on_signals()?),
    };
    let _metrics = match (a.metrics, cfg.publish.clone()) {
        (Some(addr), Some(board)) => {
            let help = "the live arbitrator (control stats)";
            Some(crate::fmt::serve_json_metrics(addr, board, ARB_PART, "fairfeed_arb", help)?)
        }
        _ => None,
    };
    let (stats, send_errors) = run_live(arb, &cfg, |s| {
        tracing::info!(
            hr_packets = s.hr_packets,
            ll_packets = s.ll_packets,
            duplicates = s.duplicates,
            gaps_opened = s.gaps_opened,
            lost_messages = s.lost_messages,
            "arb: hr {} ll {} dup {} gaps {} (line {}, retransmit {}, given up {}) lost {} held {} saturation {:.3}",
            s.hr_packets,
            s.ll_packets,
            s.duplicates,
            s.gaps_opened,
            s.gaps_filled_by_line,
            s.gaps_filled_by_retransmit,
            s.gaps_given_up,
            s.lost_messages,
            s.buffer_packets,
            s.saturation
        );
    })
    .context("live arbitration")?;
    let mut v = serde_json::to_value(&stats)?;
    v["send_errors"] = send_errors.into();
    report(a, &v)
}

#[derive(clap::Args)]
pub struct ServerArgs {
    /// The clean feed to serve from (a pcap of the MoldUDP64 packets sent).
    #[arg(long)]
    journal: PathBuf,
    /// Only datagrams to this UDP port in the journal capture.
    #[arg(long)]
    port: Option<u16>,
    /// Where to listen for requests, e.g. 127.0.0.1:26478.
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    listen: SocketAddr,
    /// Messages per answer at most.
    #[arg(long, default_value_t = 500)]
    count_max: u16,
    /// Requests per second per requester (token bucket rate; 1..=10,000,000).
    #[arg(long, default_value_t = 2000.0, value_parser = crate::fmt::rate)]
    rate_per_s: f64,
    /// Exit after this many seconds.
    #[arg(long, value_parser = crate::fmt::seconds)]
    max_seconds: Option<f64>,
    /// Serve Prometheus metrics at http://ADDR/metrics (requests, answers, refusals by kind).
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    metrics: Option<SocketAddr>,
}

pub fn run_server(a: ServerArgs) -> anyhow::Result<()> {
    let j = journal(&a.journal, a.port)?;
    tracing::info!(
        journaled = j.len(),
        listen = %a.listen,
        "retransmit-server: {} messages journaled, listening on {}",
        j.len(),
        a.listen
    );
    let cfg = ServerConfig { count_max: a.count_max, rate_per_s: a.rate_per_s, ..ServerConfig::default() };
    let mut server = RetransmitServer::new(j, cfg);
    let board = a.metrics.map(|_| Board::new());
    let _metrics = match (a.metrics, board.clone()) {
        (Some(addr), Some(board)) => {
            let help = "the retransmission server";
            Some(crate::fmt::serve_json_metrics(addr, board, RETRANSMIT_PART, "fairfeed_retransmit", help)?)
        }
        _ => None,
    };
    let stop = crate::fmt::stop_on_signals()?;
    run_retransmit_server(&mut server, a.listen, a.max_seconds, &stop, board.as_ref())
        .with_context(|| format!("serving on {}", a.listen))?;
    crate::log::final_report("retransmit-server", server.stats());
    Ok(())
}

#[derive(clap::Args)]
pub struct ControlArgs {
    /// The control address: an arbitrator's or a node's --control.
    #[arg(value_parser = crate::fmt::dest_addr)]
    addr: SocketAddr,
    /// Seal the command under the operator key in this file (needed for
    /// anything that changes something, and for any command from beyond the
    /// socket's own host).
    #[arg(long)]
    key_file: Option<std::path::PathBuf>,
    /// The command. Arbitrator: stats | mode time|count|time-count |
    /// max-hold-us N | max-count N. Node: stat | releases FROM | stop.
    #[arg(required = true, num_args = 1..)]
    command: Vec<String>,
}

/// Sends one control command (sealed with --key-file) and prints the reply;
/// fails when it is refused or unanswered.
pub fn run_control(a: ControlArgs) -> anyhow::Result<()> {
    let key = a.key_file.as_deref().map(crate::fmt::operator_key).transpose()?;
    let sock = std::net::UdpSocket::bind(if a.addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    let (datagram, nonce) = fairfeed_net::operator::request(key.as_ref(), a.addr, &a.command.join(" "));
    sock.send_to(&datagram, a.addr)?;
    let mut buf = vec![0u8; 65_536];
    let n = sock.recv(&mut buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            anyhow::anyhow!("no reply from {} within 2 s (is a --control socket there?)", a.addr)
        }
        _ => anyhow::anyhow!("no reply from {} (is a --control socket there?): {e}", a.addr),
    })?;
    // With a key, an answer not sealed to this request is not taken (it may be forged).
    let body = match fairfeed_net::operator::answer(key.as_ref(), nonce.as_slice(), &buf[..n]) {
        Ok(body) => body,
        Err(fairfeed_net::operator::AnswerError::Refused(why)) => {
            println!("{why}");
            anyhow::bail!("{} refused the command (the refusal is not sealed)", a.addr)
        }
        Err(e) => anyhow::bail!("{}: {e}", a.addr),
    };
    let reply = String::from_utf8_lossy(body);
    println!("{reply}");
    anyhow::ensure!(
        !["error", "refused", "unknown"].iter().any(|p| reply.starts_with(p)),
        "{} refused the command",
        a.addr
    );
    Ok(())
}
