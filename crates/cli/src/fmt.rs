//! Shared formatting helpers for the subcommands.

use std::io::Write;

use fairfeed_wire::FieldValue;

/// `HH:MM:SS.nnnnnnnnn` for nanoseconds since midnight.
pub fn time_of_day(ns: u64) -> String {
    let s = ns / 1_000_000_000;
    format!("{:02}:{:02}:{:02}.{:09}", s / 3600, (s / 60) % 60, s % 60, ns % 1_000_000_000)
}

/// A field value as JSON: numbers as numbers, prices as decimal strings, text as strings.
pub fn field_json(v: FieldValue) -> serde_json::Value {
    match v {
        FieldValue::Uint(u) => u.into(),
        FieldValue::Int(i) => i.into(),
        other => other.to_string().into(),
    }
}

/// Writes `v` as one line of JSON; a closed pipe (`| head`) ends quietly.
pub fn print_json_line(out: &mut impl Write, v: &serde_json::Value) -> anyhow::Result<bool> {
    match writeln!(out, "{v}") {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// A clap value parser for a finite number in `lo..=hi` (`unit` names it in the error).
/// A duration in seconds: 0.001..=10,000,000.
pub fn seconds(s: &str) -> Result<f64, String> {
    f64_in(s, 0.001, 1e7, "seconds")
}

/// Microseconds: 0..=10,000,000.
pub fn us(s: &str) -> Result<f64, String> {
    f64_in(s, 0.0, 1e7, "µs")
}

/// A speed-up factor: 0.001..=1,000,000.
pub fn speed(s: &str) -> Result<f64, String> {
    f64_in(s, 0.001, 1e6, "×")
}

/// Milliseconds: 0..=1,000,000.
pub fn ms(s: &str) -> Result<f64, String> {
    f64_in(s, 0.0, 1e6, "ms")
}

/// A share of packets: 0..=0.99.
pub fn share(s: &str) -> Result<f64, String> {
    f64_in(s, 0.0, 0.99, "(a share)")
}

/// Messages or packets per second: 1..=10,000,000.
pub fn rate(s: &str) -> Result<f64, String> {
    f64_in(s, 1.0, 1e7, "per second")
}

/// The bridge bench's packets per second: 1..=200,000 (seed 001's peak is ≈ 10,000; beyond this
/// machine's broker the publisher's queue would only grow).
pub fn bridge_rate(s: &str) -> Result<f64, String> {
    f64_in(s, 1.0, 200_000.0, "packets/s")
}

/// The exchange bench's orders per second: 1..=2,000,000.
pub fn order_rate(s: &str) -> Result<f64, String> {
    f64_in(s, 1.0, 2e6, "orders/s")
}

/// Mean ITCH messages per MoldUDP64 packet: 1..=100.
pub fn msgs_per_packet(s: &str) -> Result<f64, String> {
    f64_in(s, 1.0, 100.0, "messages per packet")
}

/// A target P(F) (share of messages every receiver has on time): 0.5..=0.99999.
pub fn target_pf(s: &str) -> Result<f64, String> {
    f64_in(s, 0.5, 0.99999, "(a target share of messages)")
}

/// A target share of deliveries on time: 0.5..=0.9999999.
pub fn target_on_time(s: &str) -> Result<f64, String> {
    f64_in(s, 0.5, 0.9999999, "(a target share of deliveries)")
}

pub fn f64_in(s: &str, lo: f64, hi: f64, unit: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s} is out of range {lo}..={hi} {unit}"))
    }
}

/// A NATS subject prefix: dot-separated tokens of printable ASCII without
/// spaces or the wildcards `*` and `>` (publishers may not use them), no
/// empty token, at most 200 bytes.
pub fn subject_prefix(s: &str) -> Result<String, String> {
    const MAX: usize = 200;
    if s.is_empty() || s.len() > MAX {
        return Err(format!("a subject prefix has 1 to {MAX} bytes, not {}", s.len()));
    }
    for tok in s.split('.') {
        if tok.is_empty() {
            return Err(format!("{s:?} has an empty token (leading, trailing or doubled '.')"));
        }
        if let Some(c) = tok.chars().find(|c| !c.is_ascii_graphic() || *c == '*' || *c == '>') {
            return Err(format!("{s:?} contains {c:?}; subject tokens are printable ASCII without '*', '>' or spaces"));
        }
    }
    Ok(s.to_string())
}

/// A capture's UDP datagrams (to `port`, if given), for commands that send
/// or merge them: a file damaged part-way gives what came before the damage,
/// with a warning saying where; one with nothing readable is an error.
pub fn read_capture(
    path: &std::path::Path,
    port: Option<u16>,
) -> anyhow::Result<Vec<fairfeed_feed::capture::Datagram>> {
    let (datagrams, skipped) = fairfeed_feed::capture::read_datagrams(path, port)?;
    if let Some((frames, detail)) = &skipped.damaged {
        anyhow::ensure!(
            !datagrams.is_empty(),
            "{}: damaged after {frames} frames ({detail}), and no UDP datagram before that",
            path.display()
        );
        eprintln!(
            "fairfeed: warning: {}: damaged after {frames} frames ({detail}); using the {} datagrams before it",
            path.display(),
            datagrams.len()
        );
    }
    Ok(datagrams)
}

/// A progress bar for work that runs for a known time but reports nothing
/// while it runs: it follows the clock on its own thread, and clears itself
/// when dropped.
pub struct Ticker {
    pb: indicatif::ProgressBar,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub fn ticker(seconds: f64, what: &str) -> Ticker {
    use std::sync::atomic::{AtomicBool, Ordering};
    let len = (seconds.max(0.1) * 10.0).ceil() as u64;
    let pb = progress(len, what);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (pb2, stop2) = (pb.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while !stop2.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(100));
            pb2.set_position(((t0.elapsed().as_secs_f64() * 10.0) as u64).min(len));
        }
    });
    Ticker { pb, stop, thread: Some(thread) }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.pb.finish_and_clear();
    }
}

/// A flag SIGTERM, SIGINT and SIGHUP set: the loop stops and reports as at
/// its end (SIGHUP is what an SSH disconnect sends: a long run ends as if
/// stopped, with its final report, rather than dying with exit 129).
pub fn stop_on_signals() -> anyhow::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| anyhow::anyhow!("installing the signal handler: {e}"))?;
    }
    Ok(stop)
}

/// Serves the counters an agent posts to `board` as `part` as Prometheus metrics named `prefix`_….
pub fn serve_json_metrics(
    addr: std::net::SocketAddr,
    board: std::sync::Arc<fairfeed_io::counters::Board>,
    part: &'static str,
    prefix: &'static str,
    help: &'static str,
) -> anyhow::Result<fairfeed_ops::Endpoint> {
    let ep = fairfeed_ops::serve_metrics(addr, move |e| {
        if let Some(v) = board.value(part) {
            e.json(prefix, &v, &[], help);
        }
    })
    .map_err(|e| anyhow::anyhow!("serving metrics on {addr}: {e}"))?;
    tracing::info!(addr = %ep.addr, "{prefix}: metrics at http://{}/metrics", ep.addr);
    Ok(ep)
}

/// Where a file `p` would be, resolved (the file itself if it exists, else
/// its resolved directory and its name): two names of one file compare equal.
fn resolved(p: &std::path::Path) -> std::path::PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    dir.join(p.file_name().unwrap_or_default())
}

/// Checks, before any work starts, that every output file can be written
/// and that no two outputs — and no output and input — are the same file:
/// a run that would fail or overwrite its own input after minutes of work
/// fails at once instead, naming the path.
pub fn check_outputs(outputs: &[&std::path::Path], inputs: &[&std::path::Path]) -> anyhow::Result<()> {
    let mut seen: Vec<(std::path::PathBuf, &std::path::Path)> = Vec::new();
    for &i in inputs {
        seen.push((resolved(i), i));
    }
    for &o in outputs {
        let r = resolved(o);
        if let Some((_, other)) = seen.iter().find(|(x, _)| *x == r) {
            if inputs.contains(other) {
                anyhow::bail!(
                    "output {} would overwrite the input {}: write it elsewhere",
                    o.display(),
                    other.display()
                );
            }
            anyhow::bail!(
                "outputs {} and {} are the same file: give each a file of its own",
                other.display(),
                o.display()
            );
        }
        seen.push((r, o));
        writable_file(o)?;
    }
    Ok(())
}

/// Can `p` be written as a file? (Creates nothing that stays.)
fn writable_file(p: &std::path::Path) -> anyhow::Result<()> {
    if p.is_dir() {
        anyhow::bail!("{} is a directory, not a file to write", p.display());
    }
    let existed = p.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", p.display()))?;
    if !existed {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Checks, before any work starts, that `dir` is (or can be made) a
/// directory whose files can be written: creates it, and a probe file in it
/// that it removes again.
pub fn check_out_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    if dir.exists() && !dir.is_dir() {
        anyhow::bail!("{} is not a directory (--out names a directory for the report)", dir.display());
    }
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let probe = dir.join(format!(".fairfeed-write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| anyhow::anyhow!("cannot write into {}: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// `HOST:PORT` (an IP address or a name, e.g. `localhost:9200`,
/// `node-7.tree:9100`), resolved now — at start-up — to one address (IPv4
/// first, as the loopback examples use); `any_port`: port 0 allowed.
fn resolve(s: &str, any_port: bool) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let hp = fairfeed_tree::addr::HostPort::parse(s, any_port).map_err(|e| e.to_string())?;
    if let Some(a) = hp.literal() {
        return Ok(a);
    }
    let all: Vec<std::net::SocketAddr> = (hp.host.as_str(), hp.port)
        .to_socket_addrs()
        .map_err(|e| format!("{s:?}: cannot resolve {:?} ({e})", hp.host))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| format!("{s:?}: {:?} has no address", hp.host))
}

/// A clap value parser for an address to send to: `HOST:PORT`, a real port.
pub fn dest_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    resolve(s, false)
}

/// A clap value parser for an address to listen on: `HOST:PORT` (port 0: any free port).
pub fn listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    resolve(s, true)
}

/// The text of a key file (64 hex digits), with a one-line error naming
/// the file when it cannot be read or is not text.
pub fn key_text(p: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let bytes = std::fs::read(p).with_context(|| format!("reading key {}", p.display()))?;
    // A raw 32-byte key (e.g. straight from /dev/urandom) is not text at all.
    String::from_utf8(bytes).map_err(|_| {
        anyhow::anyhow!(
            "bad key in {}: a key is 64 hex digits in a text file (make one: head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')",
            p.display()
        )
    })
}

/// The operator key in `p` (`--operator-key-file`, `--key-file` of `stat` and `control`).
pub fn operator_key(p: &std::path::Path) -> anyhow::Result<fairfeed_tree::operator::OperatorKey> {
    let text = key_text(p)?;
    let bytes = fairfeed_tree::auth::key_from_hex(&text)
        .map_err(|e| anyhow::anyhow!("bad operator key in {}: {e}", p.display()))?;
    anyhow::ensure!(
        bytes.iter().any(|&b| b != 0),
        "bad operator key in {}: all zeros (anyone can guess it); make a random one: head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'",
        p.display()
    );
    Ok(fairfeed_tree::operator::OperatorKey::new(bytes))
}

/// A clap value parser for a SoupBinTCP username: up to 6 printable ASCII
/// characters, no spaces (blank: none).
pub fn soup_user(s: &str) -> Result<String, String> {
    if s.len() <= 6 && s.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a SoupBinTCP username (up to 6 printable ASCII characters, no spaces)"))
    }
}

/// The SoupBinTCP password in file `p`: its first line, 1-10 printable ASCII
/// characters — a one-line error naming the file otherwise.
pub fn soup_password_file(p: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let text = std::fs::read_to_string(p).with_context(|| format!("reading password {}", p.display()))?;
    let pass = text.lines().next().unwrap_or("").trim();
    anyhow::ensure!(
        !pass.is_empty() && pass.len() <= 10 && pass.bytes().all(|b| b.is_ascii_graphic()),
        "bad password in {}: its first line must be 1-10 printable ASCII characters, no spaces",
        p.display()
    );
    Ok(pass.to_string())
}
