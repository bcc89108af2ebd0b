//! `fairfeed bench faults`: issue 43's fault campaign on real processes, one
//! network namespace per node, all joined by veth pairs to a Linux bridge in
//! a namespace of their own (10.233.0.0/24, reachable only inside them; the
//! links' delay is emulated in user space by the nodes, `--link cloud`).
//!
//! A controlled tree — one or two controllers sharing NATS JetStream KV (a
//! `nats-server` in its own namespace; the embedded store and one controller
//! where none is installed), a sender with its retransmission journal and
//! snapshot service, proxies (one a spare) and receivers, all with H = 1 —
//! carries a generated ITCH feed while a seeded schedule does these, each
//! kind scheduled at least once a seed, at seeded times and in a seeded
//! order, **one at a time** (a fault of a proxy, the controller or the store
//! waits until the last one settled; joins and leaves do not wait; one the
//! feed has no time left for is dropped and counted):
//!
//! - **proxy kill** — SIGKILL; restarted with the same id half a hold-down
//!   later (refused until its hold-down ends, then a spare);
//! - **double kill** — two proxies at once, both restarted;
//! - **partition** — a proxy's cable pulled (its bridge port down) for
//!   [`PARTITION`]: the controller declares it dead and moves its subtree;
//!   back, it is told it is unknown and joins again as a new member;
//! - **controller kill** — the leading controller, SIGKILL, restarted
//!   [`CONTROLLER_DOWN`] later;
//! - **store restart** — the `nats-server` killed and started again on its
//!   JetStream directory [`STORE_DOWN`] later;
//! - **join** — a receiver started mid-feed with `--snapshot` from the sender;
//! - **leave** — a receiver stopped (SIGTERM: it says goodbye);
//! - **subtree partition** — a proxy and the receivers it parents (from the
//!   leading controller's `--topology-out`) cut off together for
//!   [`PARTITION`]: all are declared dead, come back as new members after
//!   their hold-down, and the receivers fill what they missed from the journal;
//! - **compound** (`--compound`, with the store) — a zone's outage: the
//!   store node, the leading controller and two proxies at once. No
//!   controller can lead until the store is back; the two proxies' common
//!   children have no path until one leads and repairs (≈ 1–2 s), and fill
//!   the whole gap from the sender's journal, paced under its rate.
//!
//! Every receiver hands its application (a UDP socket the bench holds in the
//! receiver's namespace) the MoldUDP64 line an unmodified ITCH program would
//! read, with gaps filled from the sender's journal. Checked after each
//! seed, per receiver, over the time it was a member: nothing missing (a
//! hole in its line, or an end short of the feed's), nothing twice, nothing
//! out of order, every message byte-equal to every other receiver's copy
//! (so each symbol's order is the feed's), and each joiner's books (snapshot,
//! then live) equal to those of the receiver that saw the whole feed.
//! Needs root and iproute2.

use std::collections::{BTreeMap, BTreeSet};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde::Serialize;

/// Namespaces (nodes) a campaign makes at most.
pub const SLOTS_MAX: usize = 200;
/// How long a partitioned proxy's cable stays out.
pub const PARTITION: Duration = Duration::from_millis(700);
/// How long a killed controller stays down before it is started again.
pub const CONTROLLER_DOWN: Duration = Duration::from_millis(1_500);
/// How long the store node stays down.
pub const STORE_DOWN: Duration = Duration::from_millis(800);
/// The controllers' timing: heartbeats every 10 ms (the member's default),
/// dead after this long silent, refused for the hold-down after.
pub const DEAD_AFTER_MS: u64 = 60;
pub const HOLD_DOWN_MS: u64 = 1_000;
/// The controllers' lease on the store.
pub const LEASE_MS: u64 = 500;
/// Proxy faults (kills, partitions) are this far apart at least once the
/// last one's proxies are back in the tree (restarted and past their
/// hold-down), so H = 1 masks each on its own; a double kill is the
/// deliberate exception.
pub const PROXY_FAULT_GAP: Duration = Duration::from_millis(400);
/// Where each receiver's application listens, inside the receiver's namespace.
const DELIVER: &str = "127.0.0.1:7700";
/// The tree's ports on every node's address.
const PORT_NODE: u16 = 9100;
const PORT_CONTROLLER: u16 = 9000;
const PORT_RETRANSMIT: u16 = 9101;
const PORT_SNAPSHOT: u16 = 9102;
const PORT_STORE: u16 = 4222;
/// A step of the schedule slower than this is noted in the timeline.
const SLOW_STEP: Duration = Duration::from_millis(300);
/// A killed process is not started again this close to the run's end.
const RESTART_BEFORE_END: Duration = Duration::from_millis(3_000);
/// The feed starts this long after the sender (everyone has joined by then).
const START_DELAY: Duration = Duration::from_millis(3_000);
/// Nodes run this long past the feed's end (gaps filled, stats written);
/// the sender lingers, answering and sending heartbeats, all but the last second of it.
const TAIL: Duration = Duration::from_millis(5_000);

/// What to run.
#[derive(Debug, Clone)]
pub struct FaultsConfig {
    /// The fairfeed binary the nodes run as.
    pub exe: PathBuf,
    pub first_seed: u64,
    pub seeds: u64,
    /// Receivers there from the start (the first is the reference, never touched).
    pub receivers: usize,
    /// Receivers that may join mid-feed.
    pub joiners: usize,
    /// Proxies the sender feeds; one more runs as a spare.
    pub proxies: usize,
    /// Messages per second, and seconds of feed per seed.
    pub rate: u64,
    pub feed_s: f64,
    /// Faults beyond one of each kind: one every this long on average.
    pub change_every: Duration,
    /// Logs, stats and the schedule of every seed go under here.
    pub out: PathBuf,
    /// Sibling hedging H (the campaign's claim is for H = 1; 0 shows what it masks).
    pub hedge: usize,
    /// Receivers fill gaps from the sender's journal (`--retransmit`);
    /// without, what the tree lost stays lost (the claim's other half).
    pub fill: bool,
    /// Share the membership through a `nats-server` (JetStream KV) with
    /// two controllers; `None`: the embedded store and one controller.
    pub nats: Option<PathBuf>,
    /// Schedule compound faults too ([`Fault::Compound`], with the store).
    pub compound: bool,
}

/// A fault the schedule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    ProxyKill,
    DoubleKill,
    Partition,
    ControllerKill,
    StoreRestart,
    Join,
    Leave,
    /// A zone's outage: the store node, the leading controller and two
    /// proxies that share a receiver, at once. No controller can lead until
    /// the store is back; their common children have no path until one
    /// repairs, and fill the whole gap from the journal.
    Compound,
    /// A proxy and the receivers it parents cut off together (their cables
    /// pulled for [`PARTITION`]): the receivers are declared dead, come back
    /// as new members after their hold-down, and fill what they missed.
    Subtree,
}

impl Fault {
    const ALL: [Fault; 9] = [
        Fault::ProxyKill,
        Fault::DoubleKill,
        Fault::Partition,
        Fault::ControllerKill,
        Fault::StoreRestart,
        Fault::Join,
        Fault::Leave,
        Fault::Compound,
        Fault::Subtree,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::ProxyKill => "proxy_kill",
            Fault::DoubleKill => "double_kill",
            Fault::Partition => "partition",
            Fault::ControllerKill => "controller_kill",
            Fault::StoreRestart => "store_restart",
            Fault::Join => "join",
            Fault::Leave => "leave",
            Fault::Compound => "compound",
            Fault::Subtree => "subtree_partition",
        }
    }

    fn touches_proxies(self) -> bool {
        matches!(self, Fault::ProxyKill | Fault::DoubleKill | Fault::Partition | Fault::Compound | Fault::Subtree)
    }

    /// Faults that need the shared store (and its two controllers).
    fn needs_store(self) -> bool {
        matches!(self, Fault::ControllerKill | Fault::StoreRestart | Fault::Compound)
    }
}

/// Why the campaign could not run.
#[derive(Debug, thiserror::Error)]
pub enum FaultsError {
    #[error("network namespaces are not available here (needs root and iproute2): {0}")]
    NoNamespaces(String),
    #[error("{0}")]
    Config(String),
    #[error("{what}: {err}")]
    Io { what: String, err: std::io::Error },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> FaultsError {
    let what = what.into();
    move |err| FaultsError::Io { what, err }
}

/// What a seed counts, and a campaign sums over its seeds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Faults applied, by kind; and those the schedule had no time left for.
    pub faults: BTreeMap<&'static str, u64>,
    pub faults_dropped: BTreeMap<&'static str, u64>,
    /// The feed's messages (the reference receiver's line).
    pub messages: u64,
    /// Messages missing from a receiver's line while it was a member.
    pub lost: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Messages whose bytes differ between two receivers.
    pub corrupted: u64,
    /// Receivers still members at the end whose line stopped short of the feed's.
    pub unfinished: u64,
    pub joins: u64,
    /// Joiners whose books equal the reference's (`None`: no joiner).
    pub books_equal: Option<bool>,
    /// Gaps the receivers' trees left, all filled from the journal.
    pub tree_gaps: u64,
    /// Controller events in the logs: repairs (a spare in a dead proxy's
    /// place, or its children moved), leads taken, and children moved off
    /// overloaded proxies onto one that came back (odd seeds' tight trees).
    pub repairs: u64,
    pub leads_taken: u64,
    pub rebalanced: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        for (k, v) in &o.faults {
            *self.faults.entry(k).or_default() += v;
        }
        for (k, v) in &o.faults_dropped {
            *self.faults_dropped.entry(k).or_default() += v;
        }
        self.messages += o.messages;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.out_of_order += o.out_of_order;
        self.corrupted += o.corrupted;
        self.unfinished += o.unfinished;
        self.joins += o.joins;
        self.tree_gaps += o.tree_gaps;
        self.repairs += o.repairs;
        self.leads_taken += o.leads_taken;
        self.rebalanced += o.rebalanced;
        if let Some(eq) = o.books_equal {
            self.books_equal = Some(self.books_equal.unwrap_or(true) && eq);
        }
    }
}

/// One seed's outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SeedReport {
    pub seed: u64,
    #[serde(flatten)]
    pub c: Counts,
    pub receivers: u64,
    /// Whether a spare proxy ran (even seeds).
    pub spare: bool,
    /// Processes the schedule did not stop that failed, with their logs' last lines.
    pub failures: Vec<String>,
    /// What was done when, from the feed's start: `+1.234 s proxy_kill proxy2`.
    pub timeline: Vec<String>,
    pub ok: bool,
}

/// The campaign's outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FaultsSummary {
    pub seeds: u64,
    pub store: &'static str,
    pub nodes: usize,
    pub hedge: usize,
    pub fill: bool,
    #[serde(flatten)]
    pub c: Counts,
    pub failed_seeds: Vec<u64>,
    pub per_seed: Vec<SeedReport>,
}

// ---------------------------------------------------------------- fabric

/// The namespaces: a switch holding a bridge, and one per node slot, slot i
/// at 10.233.0.(i + 1); removed on drop.
struct Fabric {
    /// The campaign's process id: names of its namespaces and interfaces.
    tag: u32,
    switch: String,
    slots: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), FaultsError> {
    let out = Command::new("ip").args(args).output().map_err(io("cannot run `ip` (iproute2)"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(FaultsError::Io {
        what: format!("ip {}", args.join(" ")),
        err: std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
    })
}

impl Fabric {
    fn build(slots: usize) -> Result<Fabric, FaultsError> {
        assert!(slots <= SLOTS_MAX, "at most {SLOTS_MAX} slots");
        remove_stale();
        let tag = std::process::id();
        let switch = format!("ffq{tag}-sw");
        ip(&["netns", "add", &switch]).map_err(|e| FaultsError::NoNamespaces(e.to_string()))?;
        let mut f = Fabric { tag, switch, slots: Vec::new() };
        ip(&["-n", &f.switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &f.switch, "link", "set", "br0", "up"])?;
        for i in 0..slots {
            let ns = format!("ffq{tag}-{i}");
            ip(&["netns", "add", &ns])?;
            f.slots.push(ns.clone());
            let (a, b) = (f.node_iface(i), f.switch_iface(i));
            ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])?;
            ip(&["link", "set", &a, "netns", &ns])?;
            ip(&["link", "set", &b, "netns", &f.switch])?;
            ip(&["-n", &f.switch, "link", "set", &b, "master", "br0", "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", f.addr(i)), "dev", &a])?;
            ip(&["-n", &ns, "link", "set", &a, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(f)
    }

    fn node_iface(&self, i: usize) -> String {
        format!("fq{}n{i}", self.tag)
    }

    fn switch_iface(&self, i: usize) -> String {
        format!("fq{}s{i}", self.tag)
    }

    fn addr(&self, i: usize) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, 233, 0, u8::try_from(i + 1).expect("slots fit a /24"))
    }

    /// Pulls slot `i`'s cable (`up` false) or plugs it back.
    fn cable(&self, i: usize, up: bool) -> Result<(), FaultsError> {
        ip(&["-n", &self.switch, "link", "set", &self.switch_iface(i), if up { "up" } else { "down" }])
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for ns in self.slots.iter().chain([&self.switch]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Removes namespaces an earlier campaign left (killed before it could):
/// `ffq<pid>-…` whose process is gone.
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name.strip_prefix("ffq").and_then(|r| r.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

/// Whether network namespaces can be made here.
pub fn available() -> bool {
    let tag = format!("ffq-probe-{}", std::process::id());
    ip(&["netns", "add", &tag]).is_ok() && ip(&["netns", "del", &tag]).is_ok()
}

// ---------------------------------------------------------------- layout

/// Which slot holds what.
#[derive(Debug, Clone, Copy)]
struct Layout {
    proxies: usize,
    receivers: usize,
    joiners: usize,
}

impl Layout {
    const STORE: usize = 0;
    const CONTROLLERS: [usize; 2] = [1, 2];
    const SENDER: usize = 3;

    fn proxy(&self, p: usize) -> usize {
        4 + p
    }
    /// Proxies run: those placed and a spare.
    fn proxies_run(&self) -> usize {
        self.proxies + 1
    }
    fn receiver(&self, r: usize) -> usize {
        4 + self.proxies_run() + r
    }
    fn slots(&self) -> usize {
        self.receiver(self.receivers + self.joiners)
    }
    fn proxy_id(p: usize) -> u32 {
        10 + u32::try_from(p).expect("few proxies")
    }
    fn receiver_id(r: usize) -> u32 {
        1_000 + u32::try_from(r).expect("few receivers")
    }
}

// ---------------------------------------------------------------- schedule

/// One of every kind the store allows, then more at `change_every` on
/// average, at seeded times over the feed (from 0.5 s to 1.5 s before its end).
fn schedule(cfg: &FaultsConfig, seed: u64) -> Vec<(Duration, Fault)> {
    let mut rng = ChaCha12Rng::seed_from_u64(seed ^ 0x000f_a017);
    let kinds: Vec<Fault> = Fault::ALL
        .into_iter()
        .filter(|k| cfg.nats.is_some() || !k.needs_store())
        .filter(|k| cfg.compound || *k != Fault::Compound)
        .collect();
    let mut faults = kinds.clone();
    let span = (cfg.feed_s - 2.0).max(0.5);
    let extra = (span / cfg.change_every.as_secs_f64().max(0.05)).floor() as usize;
    for _ in 0..extra {
        faults.push(kinds[rng.gen_range(0..kinds.len())]);
    }
    faults.shuffle(&mut rng);
    // Evenly spread, each jittered within its share of the span.
    let share = span / faults.len() as f64;
    faults
        .into_iter()
        .enumerate()
        .map(|(i, f)| (Duration::from_secs_f64(0.5 + share * (i as f64 + rng.gen_range(0.0..0.8))), f))
        .collect()
}

// ---------------------------------------------------------------- processes

struct Proc {
    name: String,
    slot: usize,
    child: Child,
    /// Stopped by the schedule (its exit is not a failure).
    stopped: bool,
    /// Its log's length when it started (what it said comes after).
    log_at: usize,
}

/// A delivered line's collector: a socket in a receiver's namespace.
struct Collector {
    receiver: usize,
    thread: JoinHandle<Vec<Vec<u8>>>,
}

fn collect(ns: String, receiver: usize, stop: Arc<AtomicBool>) -> Result<Collector, FaultsError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let what = format!("{DELIVER} in {ns}");
    let thread = std::thread::spawn(move || {
        let opened = fairfeed_xdp::netns::enter(&ns).and_then(|()| {
            let s = fairfeed_io::socket::bind_udp(DELIVER.parse().expect("an address"), 8 << 20)?;
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(Duration::from_millis(50)))?;
            Ok(s)
        });
        let sock: UdpSocket = match opened {
            Ok(s) => {
                let _ = tx.send(Ok(()));
                s
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return Vec::new();
            }
        };
        let mut buf = [0u8; 2048];
        let mut got = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(n) = sock.recv(&mut buf) {
                got.push(buf[..n].to_vec());
            }
        }
        got
    });
    rx.recv().map_err(|_| FaultsError::Config("a collector thread died".into()))?.map_err(io(what))?;
    Ok(Collector { receiver, thread })
}

/// One seed's run: its processes, collectors and directory.
struct Seed<'a> {
    cfg: &'a FaultsConfig,
    fab: &'a Fabric,
    lay: Layout,
    seed: u64,
    dir: PathBuf,
    key: PathBuf,
    procs: Vec<Proc>,
    collectors: Vec<Collector>,
    stop: Arc<AtomicBool>,
    /// When every node stops by itself (its `--seconds`), from the sender's start.
    t0: Instant,
    until: Instant,
    faults: BTreeMap<&'static str, u64>,
    dropped: BTreeMap<&'static str, u64>,
    /// Receivers started (the initial ones, then joiners), and those stopped.
    joined: usize,
    left: Vec<usize>,
    /// When the last fault of a proxy, the controller or the store has
    /// settled: the next waits for it (faults one at a time).
    calm_at: Instant,
    feed_at: Instant,
    timeline: Vec<String>,
}

impl Drop for Seed<'_> {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl<'a> Seed<'a> {
    fn new(cfg: &'a FaultsConfig, fab: &'a Fabric, lay: Layout, seed: u64) -> Result<Seed<'a>, FaultsError> {
        let dir = cfg.out.join(format!("seed-{seed}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io(dir.display().to_string()))?;
        let key = dir.join("tree.key");
        std::fs::write(&key, format!("{:02x}", seed % 251).repeat(32)).map_err(io(key.display().to_string()))?;
        let now = Instant::now();
        Ok(Seed {
            cfg,
            fab,
            lay,
            seed,
            dir,
            key,
            procs: Vec::new(),
            collectors: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            t0: now,
            until: now,
            faults: BTreeMap::new(),
            dropped: BTreeMap::new(),
            joined: 0,
            left: Vec::new(),
            calm_at: now,
            feed_at: now,
            timeline: Vec::new(),
        })
    }

    fn spawn(&mut self, name: &str, slot: usize, exe: &Path, args: &[String]) -> Result<(), FaultsError> {
        let log = self.dir.join(format!("{name}.log"));
        let log_at = std::fs::metadata(&log).map_or(0, |m| usize::try_from(m.len()).unwrap_or(usize::MAX));
        let err =
            std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(io(log.display().to_string()))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.fab.slots[slot]])
            .arg(exe)
            .args(args)
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(io(format!("starting {name}")))?;
        self.procs.push(Proc { name: name.to_string(), slot, child, stopped: false, log_at });
        Ok(())
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Waits (10 s at most) for `needle` in `name`'s log.
    fn wait_log(&self, name: &str, needle: &str) -> Result<(), FaultsError> {
        self.wait_log_count(name, needle, 1)
    }

    /// Notes a step of the schedule that took long (a loaded host: a
    /// killed process slow to go, an `ip` command slow to answer), so the
    /// timeline shows why faults came later than drawn.
    fn note_slow(&mut self, since: Instant) {
        let took = since.elapsed();
        if took > SLOW_STEP {
            self.note(format!("(that step took {:.1} s)", took.as_secs_f64()));
        }
    }

    fn note(&mut self, what: String) {
        let at = Instant::now().saturating_duration_since(self.feed_at).as_secs_f64();
        self.timeline.push(format!("+{at:.3} s {what}"));
    }

    fn signal(&mut self, name: &str, sig: nix::sys::signal::Signal) {
        self.note(format!("{sig} {name}"));
        if let Some(p) = self.procs.iter_mut().rev().find(|p| p.name == name && !p.stopped) {
            p.stopped = true;
            let pid = nix::unistd::Pid::from_raw(i32::try_from(p.child.id()).unwrap_or(i32::MAX));
            // Not reaped here: a process takes its time to die on a loaded
            // host (seconds, seen), and the schedule must not stall on it. Its
            // restart reaps it first ([`Seed::reap`]), as its port must be free.
            let _ = nix::sys::signal::kill(pid, sig);
        }
    }

    /// Waits for the stopped processes named `name` to be gone.
    fn reap(&mut self, name: &str) {
        for p in self.procs.iter_mut().filter(|p| p.name == name && p.stopped) {
            let _ = p.child.wait();
        }
    }

    fn running(&self, name: &str) -> bool {
        self.procs.iter().any(|p| p.name == name && !p.stopped)
    }

    fn controllers(&self) -> String {
        let n = if self.cfg.nats.is_some() { 2 } else { 1 };
        Layout::CONTROLLERS[..n]
            .iter()
            .map(|&s| format!("{}:{PORT_CONTROLLER}", self.fab.addr(s)))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn seconds_left(&self) -> String {
        format!("{:.3}", self.until.saturating_duration_since(Instant::now()).as_secs_f64().max(0.5))
    }

    /// A tree node's arguments (`id` a number), its stats in NAME.json.
    fn node_args(&self, role: &str, name: &str, slot: usize, id: u32) -> Vec<String> {
        let bind = format!("{}:{PORT_NODE}", self.fab.addr(slot));
        let stats = self.dir.join(format!("{name}.json"));
        let mut a: Vec<String> = [role, "--controller", &self.controllers(), "--bind", &bind, "--id", &id.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--key-file", path(&self.key), "--idle", "park", "--link", "cloud"].map(String::from));
        // Never waiting to join past the run's end.
        let left = self.until.saturating_duration_since(Instant::now()).as_secs_f64();
        a.extend(["--join-wait-s".into(), format!("{:.3}", left.clamp(0.5, 10.0))]);
        a.extend(["--seed".into(), self.seed.to_string(), "--stats-out".into(), path(&stats).to_string()]);
        a
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

// ---------------------------------------------------------------- starting

impl Seed<'_> {
    fn start_store(&mut self) -> Result<(), FaultsError> {
        let Some(nats) = self.cfg.nats.clone() else { return Ok(()) };
        let js = self.dir.join("js");
        let args: Vec<String> =
            ["-a", &self.fab.addr(Layout::STORE).to_string(), "-p", &PORT_STORE.to_string(), "-js", "-sd", path(&js)]
                .iter()
                .map(|s| s.to_string())
                .collect();
        self.spawn("store", Layout::STORE, &nats, &args)?;
        self.wait_log_count("store", "Server is ready", self.count_in("store", "Server is ready") + 1)
    }

    fn count_in(&self, name: &str, needle: &str) -> usize {
        self.log(name).matches(needle).count()
    }

    /// Waits (10 s at most) for `needle` to appear `n` times in `name`'s log.
    fn wait_log_count(&self, name: &str, needle: &str, n: usize) -> Result<(), FaultsError> {
        let t = Instant::now();
        while self.count_in(name, needle) < n {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(FaultsError::Config(format!(
                    "{name} did not log {needle:?} within 10 s:\n{}",
                    self.log(name)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn start_controller(&mut self, which: usize) -> Result<(), FaultsError> {
        let slot = Layout::CONTROLLERS[which];
        let name = ["ctl-a", "ctl-b"][which];
        let listen = format!("{}:{PORT_CONTROLLER}", self.fab.addr(slot));
        let fanout = self.fanout();
        let hedge = self.cfg.hedge.to_string();
        let mut a: Vec<String> =
            ["controller", "--listen", &listen, "--fanout", &fanout.to_string(), "--hedge", &hedge]
                .iter()
                .map(|s| s.to_string())
                .collect();
        a.extend(["--depth", "2", "--dead-after-ms", &DEAD_AFTER_MS.to_string(), "--hold-down-ms"].map(String::from));
        a.extend([HOLD_DOWN_MS.to_string(), "--key-file".into(), path(&self.key).into(), "--name".into(), name.into()]);
        a.extend(["--seconds".into(), self.seconds_left()]);
        a.extend(["--topology-out".into(), path(&self.dir.join(format!("{name}.topology.toml"))).into()]);
        if self.cfg.nats.is_some() {
            let url = format!("nats://{}:{PORT_STORE}", self.fab.addr(Layout::STORE));
            a.extend(["--store".into(), url, "--lease-ms".into(), LEASE_MS.to_string()]);
        }
        self.spawn(name, slot, &self.cfg.exe.clone(), &a)
    }

    /// Even seeds run a spare proxy (a dead proxy's place taken whole), odd
    /// ones place every proxy, and the tree is tight: the initial receivers
    /// fill it, so a repair loads proxies beyond their capacity and the
    /// proxy that comes back takes the excess (rebalancing, make before break).
    fn spare(&self) -> bool {
        self.seed % 2 == 0
    }

    fn fanout(&self) -> usize {
        if self.spare() {
            (self.lay.receivers + self.lay.joiners).div_ceil(self.lay.proxies)
        } else {
            self.lay.receivers.div_ceil(self.lay.proxies_run())
        }
    }

    /// Receiver places in the tree with every proxy running.
    fn room(&self) -> usize {
        let placed = if self.spare() { self.lay.proxies } else { self.lay.proxies_run() };
        placed * self.fanout()
    }

    fn start_proxy(&mut self, p: usize) -> Result<(), FaultsError> {
        let name = format!("proxy{p}");
        let args = [
            self.node_args("proxy", &name, self.lay.proxy(p), Layout::proxy_id(p)),
            vec!["--seconds".into(), self.seconds_left()],
        ]
        .concat();
        self.spawn(&name, self.lay.proxy(p), &self.cfg.exe.clone(), &args)
    }

    /// Receiver `r` (its application's socket first); `snapshot` for a joiner.
    fn start_receiver(&mut self, r: usize, snapshot: bool) -> Result<(), FaultsError> {
        let slot = self.lay.receiver(r);
        self.collectors.push(collect(self.fab.slots[slot].clone(), r, self.stop.clone())?);
        let name = format!("receiver{r}");
        let sender = self.fab.addr(Layout::SENDER);
        let mut args = self.node_args("receiver", &name, slot, Layout::receiver_id(r));
        args.extend(["--deliver".into(), DELIVER.into()]);
        if self.cfg.fill {
            args.extend(["--retransmit".into(), format!("{sender}:{PORT_RETRANSMIT}")]);
        }
        if snapshot {
            args.extend(["--snapshot".into(), format!("{sender}:{PORT_SNAPSHOT}")]);
        }
        args.extend(["--seconds".into(), self.seconds_left()]);
        self.spawn(&name, slot, &self.cfg.exe.clone(), &args)
    }

    fn start_sender(&mut self) -> Result<(), FaultsError> {
        let slot = Layout::SENDER;
        let me = self.fab.addr(slot);
        let mut args = self.node_args("sender", "sender", slot, 1);
        let placed = if self.spare() { self.lay.proxies } else { self.lay.proxies_run() };
        args.extend(["--capacity".into(), placed.to_string(), "--rate".into(), self.cfg.rate.to_string()]);
        args.extend(["--feed-seconds".into(), format!("{}", self.cfg.feed_s)]);
        args.extend(["--start-delay-ms".into(), START_DELAY.as_millis().to_string()]);
        args.extend(["--linger-ms".into(), (TAIL.as_millis() - 1_000).to_string()]);
        args.extend(["--retransmit-listen".into(), format!("{me}:{PORT_RETRANSMIT}")]);
        args.extend(["--snapshot-listen".into(), format!("{me}:{PORT_SNAPSHOT}")]);
        self.spawn("sender", slot, &self.cfg.exe.clone(), &args)
    }

    /// Store, controllers, sender, proxies, receivers; returns when the feed starts.
    fn start(&mut self) -> Result<Instant, FaultsError> {
        let run = START_DELAY + Duration::from_secs_f64(self.cfg.feed_s) + TAIL + Duration::from_secs(1);
        self.until = Instant::now() + run;
        self.start_store()?;
        self.start_controller(0)?;
        self.wait_log("ctl-a", "controller: leading")?;
        if self.cfg.nats.is_some() {
            self.start_controller(1)?;
        }
        self.t0 = Instant::now();
        self.until = self.t0 + run;
        self.start_sender()?;
        std::thread::sleep(Duration::from_millis(300));
        for p in 0..self.lay.proxies_run() {
            self.start_proxy(p)?;
        }
        std::thread::sleep(Duration::from_millis(300));
        for r in 0..self.lay.receivers {
            self.start_receiver(r, false)?;
        }
        self.joined = self.lay.receivers;
        Ok(self.t0 + START_DELAY)
    }
}

// ---------------------------------------------------------------- faults

/// A restart due later.
enum Later {
    Proxy(usize),
    Cable(usize),
    Controller(usize),
    Store,
}

impl Seed<'_> {
    fn live_proxies(&self) -> Vec<usize> {
        (0..self.lay.proxies_run()).filter(|&p| self.running(&format!("proxy{p}"))).collect()
    }

    /// A running controller whose present incarnation says it leads (and
    /// has not said since that it follows).
    fn leader(&self) -> Option<usize> {
        let n = if self.cfg.nats.is_some() { 2 } else { 1 };
        (0..n).find(|&i| {
            let name = ["ctl-a", "ctl-b"][i];
            let Some(p) = self.procs.iter().rev().find(|p| p.name == name && !p.stopped) else { return false };
            let log = self.log(name);
            let said = log.get(p.log_at..).unwrap_or("");
            said.rfind("controller: leading").is_some_and(|l| said.rfind("controller: following").is_none_or(|f| f < l))
        })
    }

    /// Applies `f` now (`None`: not possible now); restarts it needs go in `later`.
    fn apply(
        &mut self,
        f: Fault,
        rng: &mut ChaCha12Rng,
        later: &mut Vec<(Instant, Later)>,
    ) -> Result<bool, FaultsError> {
        let now = Instant::now();
        let live = self.live_proxies();
        // Faults come one at a time (a double kill is one): a proxy, the
        // leading controller or the store goes down only once the last such
        // fault settled — the killed proxies back past their hold-down, a
        // controller leading again. H = 1 masks one proxy's death and the
        // controller repairs two at once within dead-after; two proxies killed
        // while no controller leads (a store outage) are the compound fault:
        // nothing masks it, and the journal fill must bring back the whole gap.
        if f.touches_proxies() && live.len() < self.lay.proxies_run() {
            return Ok(false);
        }
        if !matches!(f, Fault::Join | Fault::Leave) && now < self.calm_at {
            return Ok(false);
        }
        let half_hold = Duration::from_millis(HOLD_DOWN_MS / 2);
        // Declared dead, then refused for the hold-down: back in the tree after.
        let held_down = Duration::from_millis(DEAD_AFTER_MS + HOLD_DOWN_MS);
        match f {
            Fault::DoubleKill => {
                let t = Instant::now();
                self.kill_two(&live, None, rng, t + half_hold, later);
                self.calm_at = t + half_hold.max(held_down) + PROXY_FAULT_GAP;
            }
            Fault::ProxyKill => {
                let p = live[rng.gen_range(0..live.len())];
                self.signal(&format!("proxy{p}"), nix::sys::signal::Signal::SIGKILL);
                let t = Instant::now();
                later.push((t + half_hold, Later::Proxy(p)));
                self.calm_at = t + half_hold.max(held_down) + PROXY_FAULT_GAP;
            }
            Fault::Partition => {
                let p = live[rng.gen_range(0..live.len())];
                self.note(format!("cable of proxy{p} pulled"));
                self.fab.cable(self.lay.proxy(p), false)?;
                let t = Instant::now();
                later.push((t + PARTITION, Later::Cable(self.lay.proxy(p))));
                self.calm_at = t + PARTITION.max(held_down) + PROXY_FAULT_GAP;
            }
            Fault::Subtree => return self.pull_subtree(&live, rng, later),
            Fault::ControllerKill => {
                let Some(i) = self.leader() else { return Ok(false) };
                self.signal(["ctl-a", "ctl-b"][i], nix::sys::signal::Signal::SIGKILL);
                let t = Instant::now();
                later.push((t + CONTROLLER_DOWN, Later::Controller(i)));
                // The follower leads within two leases (the other is down for CONTROLLER_DOWN).
                self.calm_at = t + Duration::from_millis(3 * LEASE_MS) + PROXY_FAULT_GAP;
            }
            Fault::StoreRestart | Fault::Compound => return self.store_outage(f == Fault::Compound, &live, rng, later),
            Fault::Join => {
                // Only as many receivers as the tree has room for.
                if self.joined >= self.lay.receivers + self.lay.joiners || self.joined - self.left.len() >= self.room()
                {
                    return Ok(false);
                }
                self.joined += 1;
                self.note(format!("join receiver{}", self.joined - 1));
                self.start_receiver(self.joined - 1, true)?;
            }
            Fault::Leave => {
                let cands: Vec<usize> = (1..self.lay.receivers).filter(|r| !self.left.contains(r)).collect();
                let Some(&r) = cands.choose(rng) else { return Ok(false) };
                self.left.push(r);
                self.signal(&format!("receiver{r}"), nix::sys::signal::Signal::SIGTERM);
            }
        }
        Ok(true)
    }

    /// A proxy and the receivers it parents cut off together (their cables
    /// pulled for [`PARTITION`]): the receivers too are declared dead and
    /// held down, and back after.
    fn pull_subtree(
        &mut self,
        live: &[usize],
        rng: &mut ChaCha12Rng,
        later: &mut Vec<(Instant, Later)>,
    ) -> Result<bool, FaultsError> {
        let Some((p, kids)) = self.subtree(live, rng) else { return Ok(false) };
        let names: Vec<String> = kids.iter().map(|r| format!("receiver{r}")).collect();
        self.note(format!("cables of proxy{p} and its children {} pulled", names.join(", ")));
        let slots: Vec<usize> =
            std::iter::once(self.lay.proxy(p)).chain(kids.iter().map(|&r| self.lay.receiver(r))).collect();
        for &slot in &slots {
            self.fab.cable(slot, false)?;
        }
        let t = Instant::now();
        later.extend(slots.into_iter().map(|slot| (t + PARTITION, Later::Cable(slot))));
        let held_down = Duration::from_millis(DEAD_AFTER_MS + HOLD_DOWN_MS);
        self.calm_at = t + PARTITION.max(held_down) + PROXY_FAULT_GAP;
        Ok(true)
    }

    /// The store node killed (restarted after [`STORE_DOWN`]); `compound`: a
    /// zone's outage — the store node, the leading controller and two
    /// proxies at once. No controller can lead until the store is back; the
    /// proxies' children have no path till then.
    fn store_outage(
        &mut self,
        compound: bool,
        live: &[usize],
        rng: &mut ChaCha12Rng,
        later: &mut Vec<(Instant, Later)>,
    ) -> Result<bool, FaultsError> {
        if !self.running("store") {
            return Ok(false);
        }
        let leader = if compound { self.leader() } else { None };
        if compound && leader.is_none() {
            return Ok(false);
        }
        self.signal("store", nix::sys::signal::Signal::SIGKILL);
        let t = Instant::now();
        later.push((t + STORE_DOWN, Later::Store));
        // Back, and a controller leading within two leases after.
        self.calm_at = t + STORE_DOWN + Duration::from_millis(2 * LEASE_MS) + PROXY_FAULT_GAP;
        if let Some(i) = leader {
            let half_hold = Duration::from_millis(HOLD_DOWN_MS / 2);
            let held_down = Duration::from_millis(DEAD_AFTER_MS + HOLD_DOWN_MS);
            self.signal(["ctl-a", "ctl-b"][i], nix::sys::signal::Signal::SIGKILL);
            later.push((t + CONTROLLER_DOWN, Later::Controller(i)));
            self.kill_two(live, leader, rng, t + half_hold, later);
            self.calm_at = self.calm_at.max(t + half_hold.max(held_down) + PROXY_FAULT_GAP);
        }
        Ok(true)
    }

    /// Pairs of live proxies that are both of some receiver's paths (its
    /// parent and a sibling hedging for it), from the topology `leader`
    /// wrote last; empty where it has written none.
    fn shared_paths(&self, leader: usize, live: &[usize]) -> Vec<[usize; 2]> {
        let Some(tree) = self.topology(leader) else { return Vec::new() };
        let index = |id: u32| live.iter().copied().find(|&p| Layout::proxy_id(p) == id);
        let proxies = || tree.nodes.iter().filter(|n| n.role == fairfeed_tree::plan::Role::Proxy);
        let mut pairs = BTreeSet::new();
        for parent in proxies() {
            for hedger in proxies().filter(|h| h.id != parent.id) {
                let shared = parent.children.iter().any(|c| hedger.hedge_targets.contains(c));
                if let (true, Some(a), Some(b)) = (shared, index(parent.id), index(hedger.id)) {
                    pairs.insert([a.min(b), a.max(b)]);
                }
            }
        }
        pairs.into_iter().collect()
    }

    /// The tree `leader` last wrote (`--topology-out`), if it wrote one.
    fn topology(&self, leader: usize) -> Option<fairfeed_tree::plan::Tree> {
        let file = self.dir.join(format!("{}.topology.toml", ["ctl-a", "ctl-b"][leader]));
        let text = std::fs::read_to_string(file).ok()?;
        toml::from_str::<fairfeed_tree::plan::Topology>(&text).ok()?.trees.into_iter().next()
    }

    /// A live proxy and the running receivers it parents (never the
    /// reference, receiver 0), from the leader's topology.
    fn subtree(&self, live: &[usize], rng: &mut ChaCha12Rng) -> Option<(usize, Vec<usize>)> {
        let tree = self.topology(self.leader()?)?;
        let running = |r: &usize| !self.left.contains(r) && self.running(&format!("receiver{r}"));
        let mut cands: Vec<(usize, Vec<usize>)> = tree
            .nodes
            .iter()
            .filter(|n| n.role == fairfeed_tree::plan::Role::Proxy && !n.children.is_empty())
            .filter_map(|n| {
                let p = live.iter().copied().find(|&p| Layout::proxy_id(p) == n.id)?;
                let kids: Vec<usize> =
                    n.children.iter().map(|&c| c.saturating_sub(Layout::receiver_id(0)) as usize).collect();
                (!kids.contains(&0)).then(|| (p, kids.into_iter().filter(running).collect()))
            })
            .collect();
        cands.retain(|(_, kids)| !kids.is_empty());
        cands.choose(rng).cloned()
    }

    /// Two of the live proxies killed at once, restarted at `back`: for a
    /// compound fault (`leader` given), two that share a receiver where the
    /// leader's topology shows any.
    fn kill_two(
        &mut self,
        live: &[usize],
        leader: Option<usize>,
        rng: &mut ChaCha12Rng,
        back: Instant,
        later: &mut Vec<(Instant, Later)>,
    ) {
        let shared = leader.map(|l| self.shared_paths(l, live)).unwrap_or_default();
        let victims: Vec<usize> = match shared.choose(rng) {
            Some(pair) => {
                self.note(format!("proxy{} and proxy{} both feed a receiver", pair[0], pair[1]));
                pair.to_vec()
            }
            None => live.choose_multiple(rng, 2).copied().collect(),
        };
        for p in &victims {
            self.signal(&format!("proxy{p}"), nix::sys::signal::Signal::SIGKILL);
        }
        later.extend(victims.into_iter().map(|p| (back, Later::Proxy(p))));
    }

    fn restart(&mut self, l: Later) -> Result<(), FaultsError> {
        // A process started this close to the end would outlive the run.
        let late = self.until.saturating_duration_since(Instant::now()) < RESTART_BEFORE_END;
        match l {
            Later::Cable(slot) => {
                self.note(format!("cable of slot {slot} back"));
                self.fab.cable(slot, true)
            }
            _ if late => {
                self.note("too close to the end to restart".into());
                Ok(())
            }
            Later::Proxy(p) => {
                self.reap(&format!("proxy{p}"));
                if self.until.saturating_duration_since(Instant::now()) < RESTART_BEFORE_END {
                    self.note(format!("proxy{p} went too late to restart"));
                    return Ok(());
                }
                self.note(format!("restart proxy{p}"));
                // Back in the tree once its hold-down ends (half of it is left,
                // if the restart came on time); the next fault waits for that.
                let back = Instant::now() + Duration::from_millis(HOLD_DOWN_MS / 2 + DEAD_AFTER_MS) + PROXY_FAULT_GAP;
                self.calm_at = self.calm_at.max(back);
                self.start_proxy(p)
            }
            Later::Controller(i) => {
                self.reap(["ctl-a", "ctl-b"][i]);
                self.note(format!("restart {}", ["ctl-a", "ctl-b"][i]));
                self.start_controller(i)
            }
            Later::Store => {
                self.reap("store");
                self.note("restart store".into());
                // The killed one's entry is marked stopped; start it again on its directory.
                self.start_store()
            }
        }
    }

    /// Runs the schedule from `feed_at`: each fault when due and possible
    /// (a proxy fault waits for the last one's proxies to be back; the
    /// others do not wait for it); those not applied by the end of the feed
    /// (less 1.5 s) are dropped and counted.
    fn run_schedule(&mut self, feed_at: Instant, plan: Vec<(Duration, Fault)>) -> Result<(), FaultsError> {
        let mut rng = ChaCha12Rng::seed_from_u64(self.seed ^ 0x5eed_f417);
        let last = feed_at + Duration::from_secs_f64((self.cfg.feed_s - 1.5).max(0.5));
        let mut pending: Vec<(Instant, Fault)> = plan.into_iter().map(|(d, f)| (feed_at + d, f)).collect();
        let mut later: Vec<(Instant, Later)> = Vec::new();
        while !pending.is_empty() || !later.is_empty() {
            let now = Instant::now();
            let mut i = 0;
            while i < later.len() {
                if later[i].0 <= now {
                    let (_, l) = later.swap_remove(i);
                    let t = Instant::now();
                    self.restart(l)?;
                    self.note_slow(t);
                } else {
                    i += 1;
                }
            }
            // A restart may have taken seconds on a loaded host: look again.
            let now = Instant::now();
            if now > last {
                if !pending.is_empty() {
                    self.note(format!("{} faults dropped", pending.len()));
                }
                for (_, f) in pending.drain(..) {
                    *self.dropped.entry(f.name()).or_default() += 1;
                }
            }
            for i in 0..pending.len() {
                let (at, f) = pending[i];
                let t = Instant::now();
                let applied = at <= now && self.apply(f, &mut rng, &mut later)?;
                self.note_slow(t);
                if applied {
                    *self.faults.entry(f.name()).or_default() += 1;
                    pending.remove(i);
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- checking

/// A receiver's line as its application read it.
#[derive(Default)]
struct Line {
    /// Sequence → message bytes, live messages only (a joiner's snapshot is left out).
    messages: BTreeMap<u64, Vec<u8>>,
    first: Option<u64>,
    end: u64,
    lost: u64,
    duplicated: u64,
    out_of_order: u64,
    books: Option<fairfeed_feed::book::Books>,
}

/// Reads `packets` in order, as the application did; messages before
/// `live_from` (a snapshot) count for the books and the line but are not
/// kept for comparison. A message that comes after a later one fills a
/// hole out of order (it was not lost, but the line broke); one that comes
/// again is a duplicate.
fn read_line(packets: &[Vec<u8>], live_from: u64) -> Line {
    let mut l = Line::default();
    let mut books = fairfeed_feed::book::Books::new();
    let mut books_ok = true;
    let mut next: Option<u64> = None;
    // Holes in the line so far (sequence numbers skipped).
    let mut holes = BTreeSet::new();
    for p in packets {
        let Ok(p) = fairfeed_wire::moldudp64::Packet::new_checked(&p[..]) else { continue };
        if p.message_count() == 0 {
            continue;
        }
        let (seq, end) = (p.sequence(), p.next_sequence());
        if let Some(n) = next.filter(|&n| seq < n) {
            for s in seq..end.min(n) {
                if holes.remove(&s) {
                    l.out_of_order += 1;
                } else {
                    l.duplicated += 1;
                }
            }
            if end <= n {
                continue;
            }
        }
        if let Some(n) = next.filter(|&n| seq > n) {
            holes.extend(n..seq);
        }
        l.first.get_or_insert(seq);
        let from = next.map_or(seq, |n| n.max(seq));
        next = Some(end);
        for (k, m) in p.messages().enumerate() {
            let s = seq + k as u64;
            let Ok(m) = m else { continue };
            if s < from {
                continue;
            }
            books_ok &= books.apply(m).is_ok();
            if s >= live_from {
                l.messages.insert(s, m.to_vec());
            }
        }
    }
    l.lost = holes.len() as u64;
    l.end = next.unwrap_or(0);
    l.books = books_ok.then_some(books);
    l
}

/// A running process's threads as the kernel sees them: `name state wchan` each.
fn threads_of(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return "gone".into() };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let p = t.path();
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        // `pid (comm) state …`: the name may hold spaces, so split at the last ')'.
        let (name, rest) =
            stat.rsplit_once(')').map_or(("?", ""), |(a, b)| (a.split_once('(').map_or("?", |x| x.1), b));
        let state = rest.split_whitespace().next().unwrap_or("?");
        let wchan = std::fs::read_to_string(p.join("wchan")).unwrap_or_default();
        out.push(format!("{name} {state} {wchan}"));
    }
    out.join(", ")
}

fn stats(dir: &Path, name: &str) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).ok()?).ok()
}

impl Seed<'_> {
    /// Waits for every node to stop, then checks what each application read.
    fn finish(&mut self) -> SeedReport {
        // Nodes stop at their `--seconds`, counted from when they joined: one
        // that joined late (held down, or while no controller led) runs on,
        // and is told to stop at the run's end — as an operator would.
        let nodes = |p: &Proc| !(p.stopped || p.name.starts_with("ctl") || p.name == "store");
        std::thread::sleep(self.until.saturating_duration_since(Instant::now()) + Duration::from_millis(500));
        for p in self.procs.iter_mut().filter(|p| nodes(p)) {
            if p.child.try_wait().ok().flatten().is_none() {
                let pid = nix::unistd::Pid::from_raw(i32::try_from(p.child.id()).unwrap_or(i32::MAX));
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for p in self.procs.iter_mut().filter(|p| nodes(p)) {
            while p.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let mut r = SeedReport {
            seed: self.seed,
            c: Counts { faults: self.faults.clone(), faults_dropped: self.dropped.clone(), ..Counts::default() },
            timeline: std::mem::take(&mut self.timeline),
            ..SeedReport::default()
        };
        for p in &mut self.procs {
            let done = p.child.try_wait().ok().flatten();
            if p.stopped || p.name.starts_with("ctl") || p.name == "store" {
                continue;
            }
            if !done.is_some_and(|s| s.success()) {
                let log = std::fs::read_to_string(self.dir.join(format!("{}.log", p.name))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                let status = match done {
                    Some(st) => st.to_string(),
                    None => format!("still running 5 s after SIGTERM ({})", threads_of(p.child.id())),
                };
                r.failures.push(format!("{} (slot {}): {status}: {}", p.name, p.slot, tail.join(" | ")));
            }
        }
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        self.stop.store(true, Ordering::Relaxed);
        for c in ["ctl-a", "ctl-b"] {
            let log = self.log(c);
            r.c.repairs += (log.matches("takes the place of").count() + log.matches("children moved").count()) as u64;
            r.c.leads_taken += log.matches("controller: leading").count() as u64;
            r.c.rebalanced += log
                .lines()
                .filter_map(|l| {
                    l.split("controller: ").nth(1)?.split(" children moved off").next()?.parse::<u64>().ok()
                })
                .sum::<u64>();
        }
        r.spare = self.spare();
        self.check_lines(&mut r);
        r.ok = r.c.lost + r.c.duplicated + r.c.out_of_order + r.c.corrupted + r.c.unfinished == 0
            && r.failures.is_empty()
            && r.c.books_equal != Some(false)
            && r.c.messages > 0;
        r
    }

    fn check_lines(&mut self, r: &mut SeedReport) {
        let mut lines: BTreeMap<usize, Line> = BTreeMap::new();
        for c in std::mem::take(&mut self.collectors) {
            let packets = c.thread.join().unwrap_or_default();
            let st = stats(&self.dir, &format!("receiver{}", c.receiver));
            let live_from = st.as_ref().and_then(|s| s["counters"]["join"]["joined_at_sequence"].as_u64()).unwrap_or(0);
            r.c.tree_gaps += st.as_ref().and_then(|s| s["node"]["gaps"].as_u64()).unwrap_or(0);
            lines.insert(c.receiver, read_line(&packets, live_from));
        }
        r.receivers = lines.len() as u64;
        let Some(reference) = lines.get(&0) else { return };
        let end = reference.end;
        r.c.messages = end.saturating_sub(1);
        // The reference itself must start at the feed's first message.
        r.c.lost += reference.first.map_or(r.c.messages, |f| f - 1);
        let mut union: BTreeMap<u64, &Vec<u8>> = BTreeMap::new();
        for (&i, l) in &lines {
            r.c.lost += l.lost;
            r.c.duplicated += l.duplicated;
            r.c.out_of_order += l.out_of_order;
            let member_at_end = !self.left.contains(&i);
            if member_at_end && l.end != end {
                r.c.unfinished += 1;
            }
            for (s, m) in &l.messages {
                match union.get(s) {
                    Some(x) if *x != m => r.c.corrupted += 1,
                    Some(_) => {}
                    None => {
                        union.insert(*s, m);
                    }
                }
            }
        }
        let joiners: Vec<&Line> = lines.range(self.lay.receivers..).map(|(_, l)| l).collect();
        r.c.joins = joiners.len() as u64;
        if !joiners.is_empty() {
            r.c.books_equal = Some(match &reference.books {
                Some(want) => joiners.iter().all(|l| l.books.as_ref().is_some_and(|b| b.diff(want).is_none())),
                None => false,
            });
        }
    }
}

// ---------------------------------------------------------------- campaign

fn check(cfg: &FaultsConfig) -> Result<Layout, FaultsError> {
    let lay = Layout { proxies: cfg.proxies, receivers: cfg.receivers, joiners: cfg.joiners };
    let bad = |m: String| Err(FaultsError::Config(m));
    if !(2..=16).contains(&cfg.proxies) {
        return bad(format!("{} proxies: 2 to 16", cfg.proxies));
    }
    if !(2..=100).contains(&cfg.receivers) || cfg.joiners > 50 {
        return bad(format!(
            "{} receivers and {} joiners: 2 to 100 receivers, 0 to 50 joiners",
            cfg.receivers, cfg.joiners
        ));
    }
    if lay.slots() > SLOTS_MAX {
        return bad(format!("{} nodes: at most {SLOTS_MAX}", lay.slots()));
    }
    if cfg.hedge > 2 {
        return bad(format!("H = {}: 0 to 2", cfg.hedge));
    }
    if cfg.feed_s < 3.0 {
        return bad(format!("{} s of feed: at least 3 s (the faults need room)", cfg.feed_s));
    }
    Ok(lay)
}

/// Runs the campaign's seeds one after the other on one fabric.
pub fn run(cfg: &FaultsConfig, progress: &mut dyn FnMut(u64, &SeedReport)) -> Result<FaultsSummary, FaultsError> {
    let lay = check(cfg)?;
    let fab = Fabric::build(lay.slots())?;
    let mut s = FaultsSummary {
        seeds: cfg.seeds,
        store: if cfg.nats.is_some() { "jetstream" } else { "embedded" },
        nodes: lay.slots() - usize::from(cfg.nats.is_none()) * 2,
        hedge: cfg.hedge,
        fill: cfg.fill,
        ..FaultsSummary::default()
    };
    for seed in cfg.first_seed..cfg.first_seed + cfg.seeds {
        let mut run = Seed::new(cfg, &fab, lay, seed)?;
        let feed_at = run.start()?;
        let plan = schedule(cfg, seed);
        std::thread::sleep(feed_at.saturating_duration_since(Instant::now()));
        run.feed_at = feed_at;
        run.run_schedule(feed_at, plan)?;
        let r = run.finish();
        drop(run);
        s.c.add(&r.c);
        if !r.ok {
            s.failed_seeds.push(seed);
        }
        progress(seed, &r);
        s.per_seed.push(r);
    }
    Ok(s)
}

/// The campaign in one line, as `fairfeed bench faults` prints it.
impl std::fmt::Display for FaultsSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self;
        writeln!(
            f,
            "faults: {} seeds, {} nodes, store {}; faults {}; {} messages; lost {}, duplicated {}, out of order {}, \
             corrupted {}, unfinished {}; {} joins, books equal {}; {} gaps the trees left{}; {} repairs; {} children rebalanced; \
             {} leads taken; failed seeds {:?}",
            s.seeds,
            s.nodes,
            s.store,
            serde_json::to_string(&s.c.faults).unwrap_or_default(),
            s.c.messages,
            s.c.lost,
            s.c.duplicated,
            s.c.out_of_order,
            s.c.corrupted,
            s.c.unfinished,
            s.c.joins,
            s.c.books_equal.map_or("n/a".to_string(), |b| b.to_string()),
            s.c.tree_gaps,
            if s.fill { " (filled from the journal)" } else { "" },
            s.c.repairs,
            s.c.rebalanced,
            s.c.leads_taken,
            s.failed_seeds
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn cfg(nats: bool) -> FaultsConfig {
        FaultsConfig {
            exe: PathBuf::from("fairfeed"),
            first_seed: 1,
            seeds: 1,
            receivers: 8,
            joiners: 2,
            proxies: 3,
            rate: 1_000,
            feed_s: 8.0,
            change_every: Duration::from_secs(2),
            out: PathBuf::from("/tmp"),
            hedge: 1,
            fill: true,
            nats: nats.then(|| PathBuf::from("nats-server")),
            compound: true,
        }
    }

    #[test]
    fn every_seed_schedules_each_kind_its_store_allows_within_the_feed() {
        for seed in 0..50 {
            let p = schedule(&cfg(true), seed);
            for k in Fault::ALL {
                assert!(p.iter().any(|(_, f)| *f == k), "seed {seed}: {k:?} missing");
            }
            assert!(p.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
            assert!(p.iter().all(|(t, _)| t.as_secs_f64() >= 0.5 && t.as_secs_f64() <= 6.5), "{p:?}");
            let q = schedule(&cfg(false), seed);
            assert!(!q.iter().any(|(_, f)| f.needs_store()));
        }
        assert_eq!(schedule(&cfg(true), 7), schedule(&cfg(true), 7), "seeded");
    }

    fn packet(seq: u64, msgs: &[&[u8]]) -> Vec<u8> {
        let mut b = vec![0u8; 2048];
        let session = fairfeed_wire::moldudp64::Session::from_str_padded("FAULTS0001");
        let mut w = fairfeed_wire::moldudp64::PacketBuilder::new(&mut b[..], session, seq).unwrap();
        for m in msgs {
            w.push(m).unwrap();
        }
        let n = w.finish();
        b.truncate(n);
        b
    }

    #[test]
    fn a_line_counts_holes_repeats_and_reordering() {
        let m: &[u8] = b"x";
        let pk = [packet(1, &[m, m]), packet(3, &[m]), packet(3, &[m]), packet(6, &[m]), packet(4, &[m, m, m])];
        let l = read_line(&pk, 0);
        assert_eq!(l.first, Some(1));
        assert_eq!(l.end, 7);
        assert_eq!(l.out_of_order, 2, "4 and 5 came after 6");
        assert_eq!(l.lost, 0, "but came");
        assert_eq!(l.duplicated, 2, "3 and 6 came twice");
        assert_eq!(l.messages.len(), 4);
        let l = read_line(&pk[..4], 0);
        assert_eq!((l.lost, l.out_of_order), (2, 0), "4 and 5 never came");
        let l = read_line(&pk[..2], 3);
        assert_eq!(l.messages.keys().copied().collect::<Vec<_>>(), vec![3], "a snapshot's messages are not compared");
    }
}
