//! `fairfeed bench attack`: a tree of node processes carries a feed twice —
//! once clean, once while an attacker on the same network sends datagrams
//! to every port it has (docs/SECURITY.md) — and the two runs are reported
//! side by side: messages released, the delivery window and P(F) from the
//! fleet view, and what each attack drew.
//!
//! The attacks, each round: unsealed `stop`s; `stop`s sealed under a wrong
//! key; malformed seals; the operator's own sealed `stat` captured on the
//! wire and replayed; a `stop` the operator sealed a minute ago, replayed;
//! garbage, empty and oversize datagrams on every control socket;
//! overlay-shaped junk, empty and oversize datagrams on every node's data
//! port, and an authentic data packet and clock probe captured 10 s ago,
//! replayed; bare 20-byte MoldUDP64 requests to the sender's retransmission
//! server, whose answers are counted on the attacker's socket (reflection),
//! and truncated and oversize ones; and, held for the whole run,
//! [`SLOW_CONNECTIONS`] silent TCP connections to every node's metrics
//! endpoint (a slowloris), after which another address must still be served.
//!
//! The nodes are processes of the running binary (`exe`), on loopback.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fairfeed_net::operator::Nonce;
use fairfeed_tree::operator::OperatorKey;
use fairfeed_wire::moldudp64::{RequestRepr, Session};
use serde::Serialize;

/// The bench's limits: rounds of attacks per second at most (each round
/// sends a few dozen datagrams to every node).
pub const ROUNDS_PER_S_MAX: u64 = 100;
/// Silent connections the attacker holds open to each node's metrics endpoint.
pub const SLOW_CONNECTIONS: usize = 20;
/// How long the other nodes run beyond the feed at most (they are stopped once it is over).
const RUN_SLACK: Duration = Duration::from_secs(30);
/// The sender waits this long for the tree to come up, and serves this long after its feed.
const SENDER_START_DELAY: Duration = Duration::from_millis(800);
const SENDER_LINGER: Duration = Duration::from_secs(8);

/// What to run.
#[derive(Debug, Clone)]
pub struct AttackConfig {
    /// The fairfeed binary the nodes run as.
    pub exe: PathBuf,
    pub receivers: usize,
    /// Messages per second, and seconds of feed.
    pub rate: u64,
    pub seconds: u64,
    /// Loopback ports: data at `port`, control at `port + 1`, retransmission at `port + 2`.
    pub port: u16,
}

/// What the attacker sent and drew, all rounds together.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Campaign {
    pub rounds: u64,
    pub control_datagrams: u64,
    pub data_datagrams: u64,
    pub retransmit_requests: u64,
    pub retransmit_bytes_in: u64,
    /// Bytes the retransmission server sent to the attacker's socket.
    pub retransmit_bytes_back: u64,
    /// Metrics connections the attacker opened and held (the endpoint closes those over its limits).
    pub metrics_connections: u64,
}

/// One run's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub attacked: bool,
    pub messages: u64,
    /// The fewest messages a receiver released, and the messages lost (expected − fewest).
    pub released_min: u64,
    pub lost: u64,
    /// Nodes that exited before they were told to.
    pub stopped: Vec<u32>,
    /// The fleet view over the last messages (window and P(F) across receivers).
    pub window_p50_ns: u64,
    pub window_p99_ns: u64,
    pub pf_1us: f64,
    pub pf_10us: f64,
    pub pf_100us: f64,
    pub late_share: f64,
    /// Control commands admitted sealed, all nodes; the operator's own sealed requests.
    pub sealed_accepted: u64,
    pub operator_requests: u64,
    /// Control commands refused, all nodes, by reason.
    pub control_refused: serde_json::Value,
    /// Overlay packets refused (bad tag, truncated, unknown key, replayed) or unparsable, all nodes.
    pub data_refused: u64,
    /// The sender's retransmission server's counters.
    pub retransmit: serde_json::Value,
    /// Nodes whose metrics endpoint answered a scrape from another address after the feed, of all.
    pub metrics_answered: usize,
    pub metrics_nodes: usize,
    /// Overlay packets refused as replays (authentic but too old), all nodes.
    pub data_replays_refused: u64,
    pub campaign: Campaign,
}

/// Both runs.
#[derive(Debug, Clone, Serialize)]
pub struct AttackReport {
    pub receivers: usize,
    pub rate: u64,
    pub seconds: u64,
    pub clean: RunReport,
    pub attacked: RunReport,
}

fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A node of the planned tree: id, role, data and control addresses.
struct Planned {
    id: u32,
    role: String,
    addr: String,
    control: String,
    metrics: String,
}

struct Run<'a> {
    cfg: &'a AttackConfig,
    dir: PathBuf,
    topo: PathBuf,
    nodes: Vec<Planned>,
    procs: Vec<(u32, Child)>,
}

impl Run<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn start(&mut self, n: usize, extra: &[String]) -> std::io::Result<()> {
        let (id, role) = (self.nodes[n].id, self.nodes[n].role.clone());
        let mut args: Vec<String> = [
            role.as_str(),
            "--topology",
            &self.topo.display().to_string(),
            "--id",
            &id.to_string(),
            "--key-file",
            &self.path("tree.key").display().to_string(),
            "--operator-key-file",
            &self.path("operator.key").display().to_string(),
            "--link",
            "cloud",
            "--idle",
            "park",
            "--stats-out",
            &self.path(&format!("stats-{id}.json")).display().to_string(),
            "--metrics",
            &self.nodes[n].metrics,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().cloned());
        let err = std::fs::File::create(self.path(&format!("stderr-{id}.txt")))?;
        let child = Command::new(&self.cfg.exe).args(&args).stdout(Stdio::null()).stderr(err).spawn()?;
        self.procs.push((id, child));
        Ok(())
    }

    fn stats(&self, id: u32) -> serde_json::Value {
        std::fs::read_to_string(self.path(&format!("stats-{id}.json")))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }
}

/// Plans the tree with `exe plan` and reads back its nodes.
fn plan(cfg: &AttackConfig, dir: &Path) -> std::io::Result<(PathBuf, Vec<Planned>)> {
    let topo = dir.join("tree.toml");
    let out = Command::new(&cfg.exe)
        .args(["plan", "--receivers", &cfg.receivers.to_string(), "--fanout", "2", "--hedge", "1"])
        .args(["--loopback-port", &cfg.port.to_string(), "--control-port", &(cfg.port + 1).to_string()])
        .arg("--out")
        .arg(&topo)
        .output()?;
    if !out.status.success() {
        return Err(io_err(format!("plan: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    let t: toml::Value = toml::from_str(&std::fs::read_to_string(&topo)?).map_err(io_err)?;
    let nodes = t["trees"][0]["nodes"]
        .as_array()
        .ok_or_else(|| io_err("the plan has no nodes"))?
        .iter()
        .map(|n| Planned {
            id: n["id"].as_integer().unwrap_or(0) as u32,
            role: n["role"].as_str().unwrap_or_default().to_string(),
            addr: n.get("addr").and_then(|a| a.as_str()).unwrap_or_default().to_string(),
            control: n.get("control").and_then(|a| a.as_str()).unwrap_or_default().to_string(),
            metrics: {
                let a = n.get("addr").and_then(|a| a.as_str()).unwrap_or_default();
                format!("{}:{}", a.rsplit_once(':').map_or(a, |x| x.0), cfg.port + 3)
            },
        })
        .collect();
    Ok((topo, nodes))
}

/// Builds a control request for an address: the datagram and its nonce.
type MakeRequest<'a> = dyn Fn(SocketAddr) -> (Vec<u8>, Option<Nonce>) + 'a;

/// Sends `datagram(to)` to `to` until answered (at most 10 times, each
/// counted in `sent`); the answer, if any.
fn ask(
    sock: &UdpSocket,
    to: &str,
    (key, datagram): (&OperatorKey, &MakeRequest<'_>),
    sent: &mut u64,
) -> Option<serde_json::Value> {
    let to: SocketAddr = to.parse().ok()?;
    let mut buf = vec![0u8; 65_536];
    let mut nonces = Vec::new();
    for _ in 0..10 {
        let (d, nonce) = datagram(to);
        nonces.extend(nonce);
        sock.send_to(&d, to).ok()?;
        *sent += 1;
        if let Ok(n) = sock.recv(&mut buf) {
            // Only an answer sealed to one of these requests is taken.
            let body = fairfeed_net::operator::answer(Some(key), &nonces, &buf[..n]).ok()?;
            return serde_json::from_slice(body).ok();
        }
    }
    None
}

/// The datagrams every round sends to each control socket.
fn control_attacks(to: SocketAddr, captured: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let wrong = OperatorKey::new([0x11; 32]);
    let mut v = vec![
        b"stop".to_vec(),
        wrong.seal(wall_ns(), rand::random(), to, "stop").into_bytes(),
        b"ffauth1 1 00 00 stop".to_vec(),
        vec![0xff; 1_400],
        Vec::new(),
        b"stop \0\0\0 please".to_vec(),
    ];
    v.extend(captured.iter().cloned());
    v
}

/// What the attacker captured on the wire: sealed control commands, and
/// authentic overlay packets (a data packet and a probe, 10 s old).
struct Captured {
    control: Vec<Vec<u8>>,
    data: Vec<Vec<u8>>,
}

/// A data packet and a clock probe sealed under the tree key `auth` 10 s ago.
fn old_packets(auth: &fairfeed_tree::auth::Auth) -> Vec<Vec<u8>> {
    use fairfeed_wire::overlay::{HeaderRepr, Kind, ProbeRepr, HEADER_LEN};
    let then = wall_ns().saturating_sub(10_000_000_000);
    let h = HeaderRepr {
        kind: Some(Kind::Data),
        sequence: 1,
        send_ns: then,
        deadline_ns: then + 1_000_000,
        payload_len: 20,
        ..HeaderRepr::default()
    };
    let mut data = vec![0u8; HEADER_LEN + 20];
    let _ = h.emit(&mut data);
    auth.seal(&mut data);
    let cfg = fairfeed_tree::node::NodeConfig::default();
    let probe =
        fairfeed_tree::node::probe_packet(&cfg, Some(auth), 0, &ProbeRepr { tx_ns: then, ..ProbeRepr::default() });
    vec![data, probe]
}

/// One round of every attack.
fn round(socks: &[UdpSocket; 2], run: &Run<'_>, captured: &Captured, rs: &str, c: &mut Campaign) {
    let (a, r) = (&socks[0], &socks[1]);
    let mut shaped = vec![0xFA, 0x1F, 2, 1];
    shaped.extend((0..60).map(|_| rand::random::<u8>()));
    let mut to_data = vec![shaped.clone(), Vec::new(), vec![0xFA], vec![0x5a; 1_400], shaped[..30].to_vec()];
    to_data.extend(captured.data.iter().cloned());
    for n in &run.nodes {
        let Ok(to) = n.control.parse::<SocketAddr>() else { continue };
        for d in &control_attacks(to, &captured.control) {
            c.control_datagrams += u64::from(a.send_to(d, n.control.as_str()).is_ok());
        }
        for d in &to_data {
            c.data_datagrams += u64::from(a.send_to(d, n.addr.as_str()).is_ok());
        }
    }
    for seq in 1..=20u64 {
        let mut req = [0u8; 20];
        let repr = RequestRepr { session: Session::from_str_padded("FAIRFEED01"), sequence: seq * 50, count: 500 };
        if repr.emit(&mut req).is_ok() && r.send_to(&req, rs).is_ok() {
            c.retransmit_requests += 1;
            c.retransmit_bytes_in += req.len() as u64;
        }
    }
    // Truncated and oversize requests draw nothing.
    for d in [vec![0u8; 5], vec![0u8; 1_600]] {
        c.retransmit_bytes_in += u64::from(r.send_to(&d, rs).is_ok()) * d.len() as u64;
    }
    let mut buf = [0u8; 65_536];
    while let Ok(k) = r.recv(&mut buf) {
        c.retransmit_bytes_back += k as u64;
    }
    while a.recv(&mut buf).is_ok() {}
    c.rounds += 1;
}

fn sum(vals: impl Iterator<Item = serde_json::Value>) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for v in vals {
        for (k, x) in v.as_object().into_iter().flatten() {
            let e = out.entry(k.clone()).or_insert(0.into());
            *e = (e.as_u64().unwrap_or(0) + x.as_u64().unwrap_or(0)).into();
        }
    }
    serde_json::Value::Object(out)
}

/// Keys and a plan in a fresh directory; every node started, the sender
/// last. Returns the run, the operator key and the sender's start.
fn launch(cfg: &AttackConfig, attacked: bool) -> std::io::Result<(Run<'_>, OperatorKey, Instant)> {
    let dir = std::env::temp_dir().join(format!("fairfeed-attack-{}-{}", std::process::id(), u8::from(attacked)));
    std::fs::create_dir_all(&dir)?;
    let hex = |b: [u8; 32]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    std::fs::write(dir.join("tree.key"), hex(rand::random()))?;
    let op_bytes: [u8; 32] = rand::random();
    std::fs::write(dir.join("operator.key"), hex(op_bytes))?;
    let (topo, nodes) = plan(cfg, &dir)?;
    let mut run = Run { cfg, dir, topo, nodes, procs: Vec::new() };
    let others: Vec<usize> = (0..run.nodes.len()).filter(|&i| run.nodes[i].role != "sender").collect();
    for i in others {
        run.start(i, &["--seconds".into(), (cfg.seconds + RUN_SLACK.as_secs()).to_string()])?;
    }
    let sender = run.nodes.iter().position(|n| n.role == "sender").ok_or_else(|| io_err("no sender"))?;
    let sender_args: Vec<String> = [
        "--rate",
        &cfg.rate.to_string(),
        "--feed-seconds",
        &cfg.seconds.to_string(),
        "--start-delay-ms",
        &SENDER_START_DELAY.as_millis().to_string(),
        "--linger-ms",
        &SENDER_LINGER.as_millis().to_string(),
        "--retransmit-listen",
        &format!("127.0.0.1:{}", cfg.port + 2),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    run.start(sender, &sender_args)?;
    Ok((run, OperatorKey::new(op_bytes), Instant::now()))
}

/// [`SLOW_CONNECTIONS`] silent connections to each node's metrics endpoint, held until dropped.
fn slowloris(nodes: &[Planned]) -> Vec<std::net::TcpStream> {
    let mut held = Vec::new();
    for n in nodes {
        let Ok(to) = n.metrics.parse::<SocketAddr>() else { continue };
        for _ in 0..SLOW_CONNECTIONS {
            if let Ok(s) = std::net::TcpStream::connect_timeout(&to, Duration::from_millis(200)) {
                held.push(s);
            }
        }
    }
    held
}

/// Whether the metrics endpoint at `at` serves a scrape from 127.0.0.2 (another address than the attacker's).
fn scrape_from_elsewhere(at: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(to) = at.parse::<SocketAddr>() else { return false };
    let Ok(s) = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None) else { return false };
    let from: SocketAddr = ([127, 0, 0, 2], 0).into();
    if s.bind(&from.into()).is_err() || s.connect_timeout(&to.into(), Duration::from_secs(2)).is_err() {
        return false;
    }
    let mut s: std::net::TcpStream = s.into();
    let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
    if s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// Stops every node (SIGTERM: each writes its counters); the nodes that had stopped before.
fn stop_all(run: &mut Run<'_>) -> Vec<u32> {
    let mut procs = std::mem::take(&mut run.procs);
    let mut stopped = Vec::new();
    for (id, c) in &mut procs {
        if c.try_wait().ok().flatten().is_some() {
            stopped.push(*id);
        }
    }
    for (_, c) in &procs {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM);
    }
    for (_, c) in &mut procs {
        let _ = c.wait();
    }
    stopped
}

/// A run that ends early (an error) leaves no node running and no files behind.
impl Drop for Run<'_> {
    fn drop(&mut self) {
        stop_all(self);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Overlay packets every node refused or could not parse.
fn data_refused(run: &Run<'_>) -> u64 {
    run.nodes
        .iter()
        .map(|n| {
            let s = run.stats(n.id);
            let a = &s["node"]["auth"];
            ["bad_tag", "truncated", "unknown_key", "replayed"].iter().map(|k| a[k].as_u64().unwrap_or(0)).sum::<u64>()
                + s["node"]["bad_packets"].as_u64().unwrap_or(0)
        })
        .sum()
}

/// What an attacker captured on the wire: the operator's own sealed `stat`
/// to the first receiver (replayed there it is a replay, elsewhere another
/// node's), a `stop` sealed a minute ago, and old data packets.
fn capture(
    run: &Run<'_>,
    op: &fairfeed_tree::operator::OperatorKey,
    opsock: &UdpSocket,
    operator_requests: &mut u64,
) -> std::io::Result<Captured> {
    let rx0 = &run.nodes[run.nodes.iter().position(|n| n.role == "receiver").ok_or_else(|| io_err("no receiver"))?];
    let first: SocketAddr = rx0.control.parse().map_err(io_err)?;
    let capture = fairfeed_net::operator::request(Some(op), first, "stat");
    let _ = ask(opsock, &rx0.control, (op, &|_| capture.clone()), operator_requests);
    let stale = op.seal(wall_ns() - 60_000_000_000, rand::random(), first, "stop").into_bytes();
    let tree_key =
        fairfeed_tree::auth::Auth::from_text(&std::fs::read_to_string(run.path("tree.key"))?).map_err(io_err)?;
    Ok(Captured { control: vec![capture.0, stale], data: old_packets(&tree_key) })
}

/// One run of the tree, attacked or not.
fn one_run(cfg: &AttackConfig, attacked: bool, progress: &mut dyn FnMut(&str)) -> std::io::Result<RunReport> {
    let (mut run, op, started) = launch(cfg, attacked)?;
    let rs = format!("127.0.0.1:{}", cfg.port + 2);
    std::thread::sleep(Duration::from_millis(600));
    progress(if attacked { "attacked run: feed on, attacking" } else { "clean run: feed on" });
    // The operator's own sealed `stat`, as an attacker would capture it on the
    // wire (sealed for one receiver: replayed there it is a replay, elsewhere
    // another node's), and a `stop` it sealed a minute ago.
    let opsock = UdpSocket::bind("127.0.0.1:0")?;
    opsock.set_read_timeout(Some(Duration::from_millis(300)))?;
    let mut operator_requests = 0u64;
    let captured = capture(&run, &op, &opsock, &mut operator_requests)?;
    let slow = if attacked { slowloris(&run.nodes) } else { Vec::new() };
    let socks = [UdpSocket::bind("127.0.0.1:0")?, UdpSocket::bind("127.0.0.1:0")?];
    socks[0].set_nonblocking(true)?;
    socks[1].set_read_timeout(Some(Duration::from_millis(2)))?;
    let mut camp = Campaign { metrics_connections: slow.len() as u64, ..Campaign::default() };
    // Until the feed's end (the sender lingers well past it, so it is asked too).
    let until = started + SENDER_START_DELAY + Duration::from_secs(cfg.seconds) + Duration::from_millis(300);
    while Instant::now() < until {
        if attacked {
            round(&socks, &run, &captured, &rs, &mut camp);
        }
        std::thread::sleep(Duration::from_nanos(1_000_000_000 / ROUNDS_PER_S_MAX));
    }
    progress("feed over: asking the nodes and the fleet");
    // Counters over the control sockets, sealed (each request a fresh nonce),
    // before the fleet view adds sealed requests of its own.
    let mut live = Vec::new();
    for n in &run.nodes {
        let seal = |to| fairfeed_net::operator::request(Some(&op), to, "stat");
        live.push((n.role.clone(), ask(&opsock, &n.control, (&op, &seal), &mut operator_requests).unwrap_or_default()));
    }
    let topology: fairfeed_tree::plan::Topology =
        toml::from_str(&std::fs::read_to_string(&run.topo)?).map_err(io_err)?;
    let view = fairfeed_net::tree::fleet::fleet(&topology, 2_000, Duration::from_secs(3), Some(&op)).map_err(io_err)?;
    let metrics_answered = run.nodes.iter().filter(|n| scrape_from_elsewhere(&n.metrics)).count();
    drop(slow);
    let stopped = stop_all(&mut run);
    let expected = cfg.rate * cfg.seconds;
    let receivers = run.nodes.iter().filter(|n| n.role == "receiver");
    let released_min = receivers.map(|n| run.stats(n.id)["node"]["released"].as_u64().unwrap_or(0)).min().unwrap_or(0);
    let auth = sum(live.iter().map(|(_, v)| v["counters"]["control"]["auth"].clone()));
    let mut control_refused = auth.clone();
    if let Some(o) = control_refused.as_object_mut() {
        o.remove("sealed");
        o.remove("loopback");
    }
    let retransmit = live.iter().find(|(r, _)| r == "sender").map(|(_, v)| v["counters"]["retransmit_server"].clone());
    let report = RunReport {
        attacked,
        messages: expected,
        released_min,
        lost: expected.saturating_sub(released_min),
        stopped,
        window_p50_ns: view.window_p50_ns,
        window_p99_ns: view.window_p99_ns,
        pf_1us: view.pf_1us,
        pf_10us: view.pf_10us,
        pf_100us: view.pf_100us,
        late_share: view.late_share,
        sealed_accepted: auth["sealed"].as_u64().unwrap_or(0),
        operator_requests,
        control_refused,
        data_refused: data_refused(&run),
        data_replays_refused: run
            .nodes
            .iter()
            .map(|n| run.stats(n.id)["node"]["auth"]["replayed"].as_u64().unwrap_or(0))
            .sum(),
        metrics_answered,
        metrics_nodes: run.nodes.len(),
        retransmit: retransmit.unwrap_or_default(),
        campaign: camp,
    };
    Ok(report)
}

/// The clean run, then the attacked one.
pub fn run(cfg: &AttackConfig, progress: &mut dyn FnMut(&str)) -> std::io::Result<AttackReport> {
    assert!(cfg.receivers >= 2 && cfg.rate > 0 && cfg.seconds > 0, "a tree, a feed");
    let clean = one_run(cfg, false, progress)?;
    let attacked = one_run(cfg, true, progress)?;
    Ok(AttackReport { receivers: cfg.receivers, rate: cfg.rate, seconds: cfg.seconds, clean, attacked })
}

/// The clean run beside the attacked one, as `fairfeed bench attack` prints it.
impl std::fmt::Display for AttackReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self;
        writeln!(
            f,
            "{} receivers, {} msg/s for {} s; clean run beside the attacked one:",
            r.receivers, r.rate, r.seconds
        )?;
        writeln!(f, "{:<28} {:>14} {:>14}", "", "clean", "attacked")?;
        let mut row = |name: &str, g: &dyn Fn(&RunReport) -> String| {
            writeln!(f, "{name:<28} {:>14} {:>14}", g(&r.clean), g(&r.attacked))
        };
        row("messages lost", &|x| x.lost.to_string())?;
        row("nodes stopped", &|x| x.stopped.len().to_string())?;
        row("window p50 / p99 (µs)", &|x| {
            format!("{:.0} / {:.0}", x.window_p50_ns as f64 / 1e3, x.window_p99_ns as f64 / 1e3)
        })?;
        row("P(F) 1 / 10 / 100 µs", &|x| format!("{:.2}/{:.2}/{:.2}", x.pf_1us, x.pf_10us, x.pf_100us))?;
        row("late share", &|x| format!("{:.4}", x.late_share))?;
        row("sealed commands admitted", &|x| format!("{} of {}", x.sealed_accepted, x.operator_requests))?;
        row("control datagrams refused", &|x| {
            x.control_refused
                .as_object()
                .map_or(0, |o| o.values().filter_map(serde_json::Value::as_u64).sum::<u64>())
                .to_string()
        })?;
        row("overlay datagrams refused", &|x| x.data_refused.to_string())?;
        row("of them replays", &|x| x.data_replays_refused.to_string())?;
        row("metrics endpoints serving", &|x| format!("{} of {}", x.metrics_answered, x.metrics_nodes))?;
        row("retransmit bytes in / back", &|x| {
            format!("{} / {}", x.campaign.retransmit_bytes_in, x.campaign.retransmit_bytes_back)
        })?;
        writeln!(f, "attacks sent: {}", serde_json::to_string(&r.attacked.campaign).unwrap_or_default())
    }
}
