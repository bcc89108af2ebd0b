//! `fairfeed sender|proxy|receiver --topology tree.toml --id ID`: one tree
//! node per process (one per VM in a deployment), and `fairfeed stat` to read
//! a running node's counters.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fairfeed_feed::gen::{GenConfig, Generator};
use fairfeed_net::tree::agent::keys::{KeyCell, KeyFileWatch};
use fairfeed_net::tree::agent::{
    run_agent, write_rows, AgentConfig, ExtraCounters, Job, NodeBoard, ReceiverJob, Replicate, SenderJob, Threading,
};
use fairfeed_net::tuning::Tuning;
use fairfeed_sim::model::{LinkModel, ModelFile};
use fairfeed_tree::auth::Auth;
use fairfeed_tree::node::{DeadlineRule, NodeConfig, ReleaseOrder};
use fairfeed_tree::operator::OperatorKey;
use fairfeed_tree::plan::Topology;

use crate::cmd_arb::IdleArg;

#[derive(Clone, Copy, clap::ValueEnum)]
enum ThreadsArg {
    /// Receive, decide and send on one thread.
    One,
    /// Send on a second thread behind a bounded SPSC ring.
    Split,
    /// Every agent on a thread of its own: receive and decide, send, the sender's feed, the receiver's delivery.
    Dedicated,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum IoArg {
    /// sendmmsg(2), 32 datagrams per call.
    Udp,
    /// io_uring: 64 SENDMSG submissions per io_uring_enter(2); one multishot RECVMSG (32 posted before Linux 6.0).
    Uring,
    /// AF_XDP on the interface the node's address is on: frames through a
    /// socket's rings, the kernel's IP/UDP stack skipped (root; a fairfeed
    /// built with clang; not with --xdp-dedup or --tc-replicate).
    Afxdp,
    /// Jasper's eBPF socket interface: UDP sockets, with the XDP
    /// de-duplicator (receivers) or the TC replicator (sender, proxies) on
    /// the interface the node's address is on.
    XdpSocket,
    /// The fastest this host allows: afxdp, else uring, else udp (what was
    /// chosen and why the others were not is logged at start).
    Auto,
}

/// What every node takes.
#[derive(clap::Args)]
pub struct Common {
    /// The planner's topology file (TOML or JSON) with every node's address (keys: docs/FILES.md).
    #[arg(long, required_unless_present = "controller", conflicts_with = "controller")]
    topology: Option<PathBuf>,
    /// Instead of a topology file: register with the controller here
    /// (`fairfeed controller`), from the address it sees, and run the views
    /// it gives — placed, repaired and re-parented while the node runs.
    /// Several (comma-separated): controllers sharing a store, one leading.
    /// Names are looked up while joining (a Kubernetes Service, a Compose service).
    #[arg(long, value_parser = controller_addr, value_delimiter = ',')]
    controller: Vec<fairfeed_tree::addr::HostPort>,
    /// With --controller: the node's own socket (default: any address, a free port).
    #[arg(long, value_parser = crate::fmt::listen_addr, requires = "controller")]
    bind: Option<SocketAddr>,
    /// With --controller: children this node can feed (proxies; 0: the controller's fan-out), 0..=512.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=512), requires = "controller")]
    capacity: u16,
    /// With --controller: seconds to wait for the first view (0.1..=3,600).
    #[arg(long, default_value_t = 10.0, value_parser = join_wait, requires = "controller")]
    join_wait_s: f64,
    /// This node's id in the topology; with --controller, `any` takes the
    /// lowest free id the controller has from 100,000 up, above those
    /// operators choose (scaled Deployments need no ids).
    #[arg(long, value_parser = node_id)]
    id: u32,
    /// Under a controller: what joining left (set before the node is configured).
    #[arg(skip)]
    joined: Option<Arc<fairfeed_net::tree::agent::membership::Joined>>,
    /// The tree's authentication key: a file holding 64 hex digits (or set
    /// FAIRFEED_KEY), or a keyring for a rollover — lines `ID HEX`, the key
    /// to seal with marked `ID HEX send`. The file is watched: a changed
    /// keyring is put in force while the node runs (also on SIGHUP or a
    /// sealed `reload-keys`). Without one, packets are not authenticated.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Authentic packets sent longer ago than this are refused as replays (ms; 1..=3,600,000).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    max_age_ms: u64,
    /// Emulate links on what this node sends: `none`, `cloud` (the calibrated
    /// model), or a model file (TOML, format in docs/models/README.md).
    #[arg(long, default_value = "none")]
    link: String,
    /// Seed of the generated feed and the emulated link (same seed, same draws).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// What the node does when idle.
    #[arg(long, value_enum, default_value_t = IdleArg::Spin)]
    idle: IdleArg,
    /// Threading mode.
    #[arg(long, value_enum, default_value_t = ThreadsArg::One)]
    threads: ThreadsArg,
    /// How the node sends and receives: `udp` (sendmmsg/recvmmsg), `uring`
    /// (io_uring: batched SENDMSG submissions, one multishot RECVMSG),
    /// `afxdp` (an AF_XDP socket on the interface the node's address is on,
    /// with an XDP program steering its port there; needs root and a
    /// fairfeed built with clang; counters in `fairfeed stat` as
    /// counters.afxdp), `xdp-socket` (udp, plus --xdp-dedup or
    /// --tc-replicate on that interface, by the node's role), or `auto`
    /// (afxdp, else uring, else udp).
    #[arg(long, value_enum, default_value_t = IoArg::Udp)]
    io: IoArg,
    /// Pin the node's threads to these CPUs (work thread first), e.g. `2,3`.
    #[arg(long, value_delimiter = ',')]
    pin: Vec<usize>,
    /// mlockall(2) the process.
    #[arg(long)]
    mlock: bool,
    /// Run under SCHED_FIFO at this priority (1–99; needs CAP_SYS_NICE).
    #[arg(long)]
    fifo: Option<i32>,
    /// SO_BUSY_POLL on the node's socket, µs (needs CAP_NET_ADMIN above the sysctl default).
    #[arg(long)]
    busy_poll_us: Option<u32>,
    /// Answer `fairfeed stat` here (default: the topology's control address
    /// for this node, if any). Beyond loopback only with --operator-key-file.
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    control: Option<SocketAddr>,
    /// The operator key (a file of 64 hex digits, not the tree key): `stop`
    /// on the control socket is obeyed only sealed under it (`fairfeed
    /// control ADDR --key-file FILE stop`), and queries from beyond loopback
    /// are answered only sealed under it.
    #[arg(long)]
    operator_key_file: Option<PathBuf>,
    /// Stop after this many seconds (default: a sender stops when its feed is sent; others run until signalled).
    #[arg(long, value_parser = crate::fmt::seconds)]
    seconds: Option<f64>,
    /// At start-up, wait up to this many seconds (0..=3,600) for the
    /// topology's host names that do not resolve yet — on Kubernetes a peer's
    /// Service has no record until its pod has an IP; 0: an unresolvable
    /// name is an error at once.
    #[arg(long, default_value_t = 0.0, value_parser = resolve_wait)]
    resolve_wait_s: f64,
    /// Serve Prometheus metrics at http://ADDR/metrics (counters, gauges, latency histograms; updated twice a second).
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    metrics: Option<SocketAddr>,
    /// Write the node's counters and histograms here (JSON) at exit.
    #[arg(long)]
    stats_out: Option<PathBuf>,
    /// Report interval up the tree, ms.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    report_interval_ms: u64,
    /// Deadline offset before the first report, µs (the quantile controller
    /// holds at least this until its estimate: 200 settled messages).
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    initial_owd_us: u64,
    /// Receivers release on arrival (no hold-and-release).
    #[arg(long)]
    no_hold: bool,
    /// The clock: `system` trusts CLOCK_REALTIME (hosts disciplined by PTP or
    /// chrony); `sync` runs fairfeed's synchronization with the tree's other
    /// nodes (the sender's clock is the reference; give every node of the
    /// tree the same); `measure` probes and reports (`fairfeed stat`:
    /// node.clock) without correcting the clock.
    #[arg(long, value_enum, default_value_t = ClockArg::System)]
    clock: ClockArg,
    /// Random probe peers per node beside parents and hedge parents (same on every node).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(0..=64))]
    clock_peers: u16,
    /// Most probe pairs per interval on one parent edge: edges above many
    /// nodes are probed more often (same on every node); 1: every edge once.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    clock_rate_max: u32,
    /// With `--clock system`: where the host clock's error bound comes from.
    /// `chrony`: chrony's tracking report (`chronyc -c tracking`, every
    /// second; |offset| + root delay/2 + root dispersion, grown by the skew
    /// since its last measurement); `clockbound`: AWS ClockBound's
    /// shared-memory segment (every 100 ms; its bound grown by its maximum
    /// drift, none once it says unknown or disrupted or stops updating);
    /// `ptp`: linuxptp's ptp4l through `pmc` (every second; |offset from
    /// the grandmaster| + mean path delay + the grandmaster's advertised
    /// accuracy, grown since the last Sync; ptp4l must discipline
    /// CLOCK_REALTIME itself, `-S`: with a NIC clock, phc2sys's error is not
    /// in it); each is refused at start if it cannot be read. `auto`:
    /// ClockBound's where its segment is, else chrony's where it answers,
    /// else ptp4l's where its socket is, else none; `none`: the clock is
    /// trusted as it is (bound 0).
    #[arg(long, value_enum, default_value_t = HostClockArg::Auto)]
    host_clock: HostClockArg,
    /// chronyd's command socket for `--host-clock` (default: chronyc's own, /run/chrony/chronyd.sock).
    #[arg(long)]
    chrony_socket: Option<PathBuf>,
    /// ClockBound's shared-memory segment for `--host-clock`.
    #[arg(long, default_value = fairfeed_io::hostclock::CLOCKBOUND_SHM_DEFAULT)]
    clockbound_shm: PathBuf,
    /// linuxptp's ptp4l management socket for `--host-clock` (its `uds_address`).
    #[arg(long, default_value = fairfeed_io::hostclock::PTP4L_SOCKET_DEFAULT)]
    ptp_socket: PathBuf,
    /// A receiver whose clock error bound is above this (ns) is left out of fairness figures.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    clock_bound_limit_ns: u64,
    /// Testing: add this to every reading of this node's clock, ns (±1 hour).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true,
          value_parser = clap::value_parser!(i64).range(-3_600_000_000_000..=3_600_000_000_000))]
    clock_offset_ns: i64,
    /// Drop hedged duplicate copies in the kernel before they reach the
    /// socket: attach fairfeed's XDP de-duplicator to IFACE, the interface
    /// this node's packets arrive on (needs root, and a fairfeed built with
    /// clang). Its counters appear in `fairfeed stat` as counters.xdp.
    #[arg(long, value_name = "IFACE", value_parser = iface_name)]
    xdp_dedup: Option<String>,
    /// How the de-duplicator is attached: native (in the driver), generic
    /// (after it, any interface), auto (native, else generic).
    #[arg(long, value_enum, default_value_t = XdpModeArg::Auto, requires = "xdp_dedup")]
    xdp_mode: XdpModeArg,
    /// Let the kernel make this node's fan-out copies: attach fairfeed's TC
    /// egress replicator to IFACE, the interface its packets leave by
    /// (sender and proxies; needs root, a fairfeed built with clang, `--link
    /// none`, 2 to 64 targets behind one next hop). Each data packet then
    /// leaves user space once; counters in `fairfeed stat` as counters.tc.
    #[arg(long, value_name = "IFACE", value_parser = iface_name)]
    tc_replicate: Option<String>,
    /// Testing: make this node's clock run fast (or slow, negative) by this many ppm (±1,000).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true, value_parser = ppm_range)]
    clock_drift_ppm: f64,
    /// Testing: step this node's clock by this many ns (either sign, ±1 hour)
    /// `--clock-step-after-ms` after start, announced as the host announces
    /// its own steps (the size known; see `--clock sync`).
    #[arg(long, allow_hyphen_values = true, requires = "clock_step_after_ms",
          value_parser = clap::value_parser!(i64).range(-3_600_000_000_000..=3_600_000_000_000))]
    clock_step_ns: Option<i64>,
    /// Testing: when `--clock-step-ns` steps the clock, ms after start.
    #[arg(long, requires = "clock_step_ns", value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    clock_step_after_ms: Option<u64>,
    /// Testing: tell nobody of that step (a paused VM, a hypervisor's
    /// correction): only the probes can find it.
    #[arg(long, requires = "clock_step_ns")]
    clock_step_silent: bool,
}

/// How the XDP de-duplicator is attached.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpModeArg {
    Native,
    Generic,
    Auto,
}

/// A network interface name as Linux takes one: 1 to 15 bytes, no `/`, no
/// white space.
pub(crate) fn iface_name(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 15 || s.contains('/') || s.chars().any(char::is_whitespace) {
        return Err(format!("{s:?} is not an interface name (1 to 15 characters, no '/' or spaces)"));
    }
    Ok(s.to_string())
}

/// A node's address in the topology, its name resolved now (the kernel
/// paths program fixed addresses at start).
fn node_addr(n: &fairfeed_tree::plan::Node) -> Option<SocketAddr> {
    let hp = fairfeed_tree::addr::HostPort::parse(n.addr.as_deref()?, false).ok()?;
    fairfeed_io::resolve::resolve(&hp.host, hp.port).ok()
}

/// Attaches the XDP de-duplicator where asked: watching this node's own UDP
/// port on `--xdp-dedup`'s interface; kept attached while the handle lives.
fn attach_xdp(
    c: &Common,
    topology: &Topology,
    iface: Option<&String>,
) -> anyhow::Result<Option<Arc<std::sync::Mutex<fairfeed_xdp::XdpDedup>>>> {
    let Some(iface) = iface else { return Ok(None) };
    let node = topology
        .trees
        .first()
        .and_then(|t| t.nodes.iter().find(|n| n.id == c.id))
        .with_context(|| format!("no node {} in the topology", c.id))?;
    let port = node_addr(node)
        .map(|a| a.port())
        .with_context(|| format!("--xdp-dedup: node {} has no address in the topology", c.id))?;
    let mode = match c.xdp_mode {
        XdpModeArg::Native => Some(fairfeed_xdp::Mode::Native),
        XdpModeArg::Generic => Some(fairfeed_xdp::Mode::Generic),
        XdpModeArg::Auto => None,
    };
    let x = fairfeed_xdp::XdpDedup::attach(iface, port, mode).with_context(|| format!("--xdp-dedup {iface}"))?;
    tracing::info!(node = c.id, "node {}: XDP de-duplicator on {iface} ({} mode), UDP port {port}", c.id, x.mode());
    Ok(Some(Arc::new(std::sync::Mutex::new(x))))
}

/// What `--io` comes to on this host: the back-end and the interfaces the
/// kernel programs go on.
struct IoPlan {
    io: IoArg,
    xdp_dedup: Option<String>,
    tc_replicate: Option<String>,
    /// An AF_XDP back-end opened while resolving `auto`.
    afxdp: Option<(fairfeed_net::send::External, ExtraCounters)>,
}

/// The node's IPv4 address and the interface whose route covers it.
fn own_iface(c: &Common, topology: &Topology, flag: &str) -> anyhow::Result<(std::net::SocketAddrV4, String)> {
    let node = topology
        .trees
        .first()
        .and_then(|t| t.nodes.iter().find(|n| n.id == c.id))
        .with_context(|| format!("no node {} in the topology", c.id))?;
    let addr = match node_addr(node) {
        Some(SocketAddr::V4(v)) => v,
        _ => anyhow::bail!("{flag}: node {} needs an IPv4 address in the topology", c.id),
    };
    anyhow::ensure!(
        !addr.ip().is_loopback() && !addr.ip().is_unspecified(),
        "{flag}: node {} is at {addr}; the kernel paths need its address on a real interface, not loopback",
        c.id
    );
    let iface = fairfeed_xdp::neigh::iface_with(*addr.ip())
        .with_context(|| format!("{flag}: no interface of this host holds node {}'s address {}", c.id, addr.ip()))?;
    Ok((addr, iface))
}

fn resolve_io(c: &Common, topology: &Topology) -> anyhow::Result<IoPlan> {
    let given = IoPlan { io: c.io, xdp_dedup: c.xdp_dedup.clone(), tc_replicate: c.tc_replicate.clone(), afxdp: None };
    match c.io {
        IoArg::Udp | IoArg::Uring | IoArg::Afxdp => Ok(given),
        IoArg::XdpSocket => {
            anyhow::ensure!(
                c.xdp_dedup.is_none() && c.tc_replicate.is_none(),
                "--io xdp-socket picks the interface itself; leave out --xdp-dedup and --tc-replicate"
            );
            let (_, iface) = own_iface(c, topology, "--io xdp-socket")?;
            let me = topology
                .trees
                .first()
                .and_then(|t| t.nodes.iter().find(|n| n.id == c.id))
                .with_context(|| format!("no node {} in the topology", c.id))?;
            let mut plan = IoPlan { io: IoArg::Udp, xdp_dedup: None, tc_replicate: None, afxdp: None };
            if me.role == fairfeed_tree::plan::Role::Receiver {
                plan.xdp_dedup = Some(iface);
            } else {
                let targets = me.children.len() + me.hedge_targets.len();
                if (2..=fairfeed_xdp::replicate::TARGETS_MAX).contains(&targets) && c.link == "none" {
                    plan.tc_replicate = Some(iface);
                } else {
                    tracing::warn!(
                        node = c.id,
                        "--io xdp-socket: node {} sends its {targets} copies itself (TC replication takes 2 to {} \
                         targets and --link none; --link is {})",
                        c.id,
                        fairfeed_xdp::replicate::TARGETS_MAX,
                        c.link
                    );
                }
            }
            Ok(plan)
        }
        IoArg::Auto => {
            let why_not = if c.xdp_dedup.is_some() || c.tc_replicate.is_some() {
                "--xdp-dedup or --tc-replicate holds the XDP hook".to_string()
            } else {
                match attach_afxdp(c, topology) {
                    Ok(x) => {
                        tracing::info!(node = c.id, "--io auto: node {} runs on AF_XDP", c.id);
                        return Ok(IoPlan { io: IoArg::Afxdp, afxdp: Some(x), ..given });
                    }
                    Err(e) => format!("{e:#}"),
                }
            };
            match fairfeed_net::send::SendPath::new(fairfeed_net::send::Backend::Uring) {
                Ok(_) => {
                    tracing::info!(node = c.id, "--io auto: node {} runs on io_uring (not AF_XDP: {why_not})", c.id);
                    Ok(IoPlan { io: IoArg::Uring, ..given })
                }
                Err(e) => {
                    tracing::info!(
                        node = c.id,
                        "--io auto: node {} runs on sendmmsg/recvmmsg (not AF_XDP: {why_not}; not io_uring: {e})",
                        c.id
                    );
                    Ok(IoPlan { io: IoArg::Udp, ..given })
                }
            }
        }
    }
}

/// The AF_XDP back-end on the interface the node's address is on, where asked.
fn attach_afxdp(c: &Common, topology: &Topology) -> anyhow::Result<(fairfeed_net::send::External, ExtraCounters)> {
    anyhow::ensure!(
        c.xdp_dedup.is_none() && c.tc_replicate.is_none(),
        "--io afxdp: its XDP program owns the interface's XDP hook and its frames skip TC; \
         leave out --xdp-dedup and --tc-replicate"
    );
    let (addr, iface) = own_iface(c, topology, "--io afxdp")?;
    let io = match fairfeed_xdp::afxdp::NodeIo::open(&iface, addr, fairfeed_xdp::Mode::Native) {
        Err(fairfeed_xdp::XdpError::Attach { .. }) => {
            fairfeed_xdp::afxdp::NodeIo::open(&iface, addr, fairfeed_xdp::Mode::Generic)
        }
        r => r,
    }
    .with_context(|| format!("--io afxdp on {iface}"))?;
    let mode = io.mode();
    tracing::info!(node = c.id, "node {}: AF_XDP on {iface} queue 0 ({mode:?} mode), UDP port {}", c.id, addr.port());
    if fairfeed_net::send::ExternalRecv::reads_socket(&io.recv) {
        let queues =
            fairfeed_xdp::afxdp::rx_queues(&iface).map_or("an unknown number of".to_string(), |q| q.to_string());
        tracing::warn!(
            node = c.id,
            "node {}: {iface} has {queues} receive queues; datagrams the NIC puts on queues other than 0 take the \
             kernel's path (read from the node's socket, counted rx_via_kernel) — steer them to queue 0: \
             ethtool -N {iface} flow-type udp4 dst-port {} action 0",
            c.id,
            addr.port()
        );
    }
    let stats = io.stats.clone();
    let read = Arc::new(move || stats.json(mode));
    Ok((
        fairfeed_net::send::External::new("AF_XDP", Box::new(io.recv), Box::new(io.send)),
        ExtraCounters { name: "afxdp", read },
    ))
}

/// The TC replicator and its socket for a sender or proxy, where asked.
fn attach_tc(
    c: &Common,
    topology: &Topology,
    iface: Option<&String>,
) -> anyhow::Result<Option<(Replicate, ExtraCounters)>> {
    let Some(iface) = iface else { return Ok(None) };
    anyhow::ensure!(
        c.link == "none",
        "--tc-replicate: the kernel sends every copy at once; it cannot emulate links (--link {})",
        c.link
    );
    let tree = topology.trees.first().context("the topology has no tree")?;
    let me = tree.nodes.iter().find(|n| n.id == c.id).with_context(|| format!("no node {} in the topology", c.id))?;
    anyhow::ensure!(
        me.role != fairfeed_tree::plan::Role::Receiver,
        "--tc-replicate: node {} is a receiver; it sends no copies to replicate",
        c.id
    );
    let fanout: Vec<u32> = me.children.iter().chain(&me.hedge_targets).copied().collect();
    anyhow::ensure!(
        (2..=fairfeed_xdp::replicate::TARGETS_MAX).contains(&fanout.len()),
        "--tc-replicate: node {} sends to {} targets; the replicator makes 2 to {}",
        c.id,
        fanout.len(),
        fairfeed_xdp::replicate::TARGETS_MAX
    );
    let v4 = |id: u32| -> anyhow::Result<std::net::SocketAddrV4> {
        match tree.nodes.iter().find(|n| n.id == id).and_then(node_addr) {
            Some(SocketAddr::V4(v)) => Ok(v),
            _ => anyhow::bail!("--tc-replicate: node {id} needs an IPv4 address in the topology"),
        }
    };
    let targets: Vec<std::net::SocketAddrV4> = fanout.iter().map(|&t| v4(t)).collect::<anyhow::Result<_>>()?;
    // The replicator knows this node's copies by their source port: a socket of their own.
    let sock = UdpSocket::bind((*v4(c.id)?.ip(), 0)).context("--tc-replicate: binding the replication socket")?;
    let port = sock.local_addr()?.port();
    let macs = fairfeed_xdp::neigh::next_hop_macs(iface, &targets)
        .map_err(|e| anyhow::anyhow!("--tc-replicate {iface}: {e}"))?;
    let r = fairfeed_xdp::TcReplicator::attach(iface, port, &targets, Some(&macs))
        .with_context(|| format!("--tc-replicate {iface}"))?;
    tracing::info!(
        node = c.id,
        "node {}: TC replicator on {iface}: one datagram to {}, copies to {} more",
        c.id,
        targets[0],
        targets.len() - 1
    );
    let r = Arc::new(std::sync::Mutex::new(r));
    let read = Arc::new(move || {
        let r = r.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match r.counters() {
            Ok(c) => serde_json::to_value(c).unwrap_or_default(),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        }
    });
    Ok(Some((Replicate { sock: Arc::new(sock), fanout }, ExtraCounters { name: "tc", read })))
}

fn xdp_counters(x: &std::sync::Mutex<fairfeed_xdp::XdpDedup>) -> serde_json::Value {
    let x = x.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match x.counters() {
        Ok(c) => serde_json::to_value(c).unwrap_or_default(),
        Err(e) => serde_json::json!({ "error": e.to_string() }),
    }
}

/// Where `--clock system` takes the host clock's error bound from.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HostClockArg {
    Auto,
    Chrony,
    Clockbound,
    Ptp,
    None,
}

/// The host clock daemon's bound for `--clock system` (see `--host-clock`).
fn host_bound(c: &Common) -> anyhow::Result<Option<Arc<std::sync::atomic::AtomicU64>>> {
    if c.clock != ClockArg::System || c.host_clock == HostClockArg::None {
        return Ok(None);
    }
    use fairfeed_io::hostclock::{HostClockSource, HostClockWatch};
    let chrony = HostClockSource::Chrony(c.chrony_socket.clone());
    let ptp = HostClockSource::Ptp(c.ptp_socket.clone());
    let sources = match c.host_clock {
        HostClockArg::Clockbound => vec![HostClockSource::ClockBound(c.clockbound_shm.clone())],
        HostClockArg::Chrony => vec![chrony],
        HostClockArg::Ptp => vec![ptp],
        // ClockBound where its segment is, else chrony, else ptp4l where its socket is.
        _ if c.clockbound_shm.exists() => vec![HostClockSource::ClockBound(c.clockbound_shm.clone())],
        _ if c.ptp_socket.exists() => vec![chrony, ptp],
        _ => vec![chrony],
    };
    let mut started = Err(fairfeed_io::hostclock::HostClockError::Run("no source".into()));
    let mut name = "";
    for source in sources {
        name = source.name();
        started = HostClockWatch::start(source);
        if started.is_ok() {
            break;
        }
    }
    match started {
        Ok(w) => {
            let b = w.bound().load(std::sync::atomic::Ordering::Relaxed);
            let said =
                if b == u64::MAX { format!("none yet: {name} cannot bound the clock") } else { format!("{b} ns") };
            tracing::info!(node = c.id, host_bound_ns = b, "node {}: clock error bound from {name}: {said}", c.id);
            Ok(Some(w.detach()))
        }
        Err(e) if c.host_clock == HostClockArg::Chrony => {
            anyhow::bail!("--host-clock chrony: {e} (is chronyd running? --chrony-socket names its command socket)")
        }
        Err(e) if c.host_clock == HostClockArg::Clockbound => {
            anyhow::bail!(
                "--host-clock clockbound: {e} (is the clockbound daemon running? --clockbound-shm names its segment)"
            )
        }
        Err(e) if c.host_clock == HostClockArg::Ptp => {
            anyhow::bail!("--host-clock ptp: {e} (is ptp4l running? --ptp-socket names its management socket)")
        }
        Err(e) => {
            tracing::info!(node = c.id, "node {}: no host clock bound ({e}); the clock is trusted as it is", c.id);
            Ok(None)
        }
    }
}

/// How a node treats its clock.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClockArg {
    System,
    Sync,
    Measure,
}

fn ppm_range(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, -1_000.0, 1_000.0, "ppm")
}

fn clock_opts(c: &Common) -> fairfeed_net::tree::agent::ClockOpts {
    use fairfeed_clock::{SyncConfig, SyncMode};
    let mode = match c.clock {
        ClockArg::System => SyncMode::Off,
        ClockArg::Sync => SyncMode::Sync,
        ClockArg::Measure => SyncMode::MeasureOnly,
    };
    fairfeed_net::tree::agent::ClockOpts {
        sync: SyncConfig {
            mode,
            bound_limit_ns: c.clock_bound_limit_ns,
            rate_max: c.clock_rate_max,
            ..SyncConfig::default()
        },
        random_peers: usize::from(c.clock_peers),
        skew: {
            let epoch = fairfeed_net::tree::agent::wall_ns();
            fairfeed_clock::skew::Skew {
                step_ns: c.clock_step_ns.unwrap_or(0),
                step_at_ns: epoch.saturating_add(c.clock_step_after_ms.unwrap_or(0).saturating_mul(1_000_000)),
                step_silent: c.clock_step_silent,
                ..fairfeed_clock::skew::Skew::new(c.clock_offset_ns, c.clock_drift_ppm, epoch)
            }
        },
        host_bound: None,
    }
}

#[derive(clap::Args)]
pub struct SenderArgs {
    #[command(flatten)]
    common: Common,
    /// Packets per second.
    #[arg(long, default_value_t = 1_000.0, value_parser = crate::fmt::rate)]
    rate: f64,
    /// Seconds of generated feed (rate × seconds packets).
    #[arg(long, default_value_t = 5.0, value_parser = crate::fmt::seconds)]
    feed_seconds: f64,
    /// Send this capture's UDP payloads instead of a generated ITCH feed.
    #[arg(long, conflicts_with = "listen")]
    pcap: Option<PathBuf>,
    /// A live feed: send the MoldUDP64 packets arriving at this UDP address
    /// down the tree as they come (an arbitrator's --out-hr, an exchange's
    /// ITCH line), session and sequence numbers unchanged, until stopped
    /// (SIGTERM/SIGINT, --seconds). Datagrams that are not MoldUDP64 and
    /// packets already sent are dropped and counted (`fairfeed stat`:
    /// counters.live.ingress).
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["rate", "feed_seconds"], value_parser = crate::fmt::listen_addr)]
    listen: Option<SocketAddr>,
    /// Wait before the first packet, ms (let the tree's processes come up); 0..=3,600,000.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    start_delay_ms: u64,
    /// Keep serving reports and retransmissions after the last packet, ms; 0..=3,600,000.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    linger_ms: u64,
    /// Serve MoldUDP64 retransmission requests from a journal of the feed here
    /// (and send a MoldUDP64 heartbeat down the tree after 250 ms without a
    /// packet, so a receiver that lost the last packets learns where the line ends).
    #[arg(long, value_parser = crate::fmt::listen_addr)]
    retransmit_listen: Option<SocketAddr>,
    /// Serve GLIMPSE-style snapshots of the books of what it sends here
    /// (SoupBinTCP, as `fairfeed snapshot-server`), for receivers that join
    /// late with `--snapshot ADDR`.
    #[arg(long, value_name = "ADDR", value_parser = crate::fmt::listen_addr)]
    snapshot_listen: Option<SocketAddr>,
    /// With --snapshot-listen: the username logins must give (default: any).
    #[arg(long, requires_all = ["snapshot_listen", "snapshot_password_file"], value_parser = crate::fmt::soup_user)]
    snapshot_user: Option<String>,
    /// With --snapshot-user: a file whose first line is the password.
    #[arg(long, value_name = "FILE", requires = "snapshot_user")]
    snapshot_password_file: Option<PathBuf>,
    /// Deadline rule: aim the controller at this P(F), 0.5..=0.99999 (default: the paper's rule, OWD_G + margin).
    #[arg(long, value_parser = crate::fmt::target_pf)]
    target_pf: Option<f64>,
    /// The paper's rule: deadline = now + OWD_G + this margin (µs).
    #[arg(long, default_value_t = 0)]
    margin_us: i64,
    /// On a topology of several trees: which tree carries which symbol, one
    /// `SYMBOL TREE` pair per line (`#` comments; hot symbols on trees of their
    /// own); symbols not named ride tree `stock locate % K`.
    #[arg(long, value_name = "FILE")]
    shard_map: Option<PathBuf>,
    /// Tell the exchange each packet's deadline here (UDP: sealed deadline
    /// records, for its cheat detector: exchange config `deadlines_listen`);
    /// needs --operator-key-file (the records are sealed under it) and one tree.
    #[arg(long, value_name = "ADDR", requires = "operator_key_file", value_parser = crate::fmt::dest_addr)]
    deadlines_to: Option<SocketAddr>,
}

#[derive(clap::Args)]
pub struct ProxyArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
pub struct ReceiverArgs {
    #[command(flatten)]
    common: Common,
    /// Send each released MoldUDP64 packet to this local UDP port at the
    /// release instant (an unmodified ITCH application listens there).
    #[arg(long, value_parser = crate::fmt::dest_addr)]
    deliver: Option<SocketAddr>,
    /// Fill what the tree lost from this MoldUDP64 retransmission server.
    #[arg(long, value_parser = crate::fmt::dest_addr)]
    retransmit: Option<SocketAddr>,
    /// With --retransmit: deliver the session from this sequence number (1:
    /// from its beginning, filling whatever came before the first release);
    /// default: from the first packet released (joining a running feed).
    #[arg(long, requires = "retransmit", value_parser = clap::value_parser!(u64).range(1..))]
    retransmit_from: Option<u64>,
    /// Write one CSV row per release (sequence, send, deadline, arrival, release ns).
    #[arg(long)]
    log: Option<PathBuf>,
    /// Releases go out in sequence order, as a MoldUDP64 line delivers them;
    /// a missing message holds its successors this long past their deadline
    /// (for its hedged copy) before it is given up as a gap, µs (0..=10,000,000;
    /// counted in `fairfeed stat` as node.gaps / node.gap_packets; with
    /// --retransmit the gap is then filled).
    #[arg(long, default_value_t = fairfeed_tree::node::GAP_WAIT_DEFAULT_NS / 1_000,
          value_parser = clap::value_parser!(u64).range(0..=fairfeed_tree::node::GAP_WAIT_MAX_NS / 1_000))]
    gap_wait_us: u64,
    /// On a topology of several trees: deliver only these symbols (one per
    /// line, `#` comments) and the market-wide messages, taking only the trees
    /// that carry them — which --shard-map (the sender's) must name.
    #[arg(long, value_name = "FILE", requires = "shard_map")]
    symbols: Option<PathBuf>,
    /// The sender's symbol → tree map (see `fairfeed sender --shard-map`).
    #[arg(long, value_name = "FILE")]
    shard_map: Option<PathBuf>,
    /// Join a running feed: fetch the books from this snapshot server
    /// (`fairfeed snapshot-server`, GLIMPSE-style SoupBinTCP) and hand the
    /// application the snapshot first, numbered up to where the live line
    /// continues, then the live line from there — no gap, no duplicate.
    #[arg(long, value_name = "ADDR", value_parser = crate::fmt::dest_addr, conflicts_with = "retransmit_from")]
    snapshot: Option<SocketAddr>,
    /// With --snapshot: the username to log in with (blank: a server that asks for none).
    #[arg(long, requires = "snapshot", default_value = "", value_parser = crate::fmt::soup_user)]
    snapshot_user: String,
    /// With --snapshot: a file holding the password (its first line).
    #[arg(long, value_name = "FILE", requires = "snapshot")]
    snapshot_password_file: Option<PathBuf>,
    /// TEST MODE — cheat: release every message this many µs before its
    /// deadline (0..=1,000), as a firm running its own receiver could; it
    /// exists only to test the exchange's cheat detector (issue 44). Logged
    /// loudly at start; the release log still shows the sender's deadlines.
    #[arg(long, default_value_t = 0, value_name = "US",
          value_parser = clap::value_parser!(u64).range(0..=fairfeed_tree::node::RELEASE_LEAD_MAX_NS / 1_000))]
    cheat_us: u64,
    /// Proxy the firm's OUCH session (it connects here instead of to the
    /// exchange): every Enter Order leaves stamped with this receiver's
    /// delivery clock — the last data message it released and the time since
    /// (OUCH appendage 0xF1, for the exchange's DBO ordering and cheat
    /// watch); the firm stamps nothing and cannot stamp for itself.
    #[arg(long, value_name = "ADDR", requires = "exchange", value_parser = crate::fmt::listen_addr)]
    order_proxy: Option<SocketAddr>,
    /// With --order-proxy: the exchange's OUCH address.
    #[arg(long, value_name = "ADDR", requires = "order_proxy", value_parser = crate::fmt::dest_addr)]
    exchange: Option<SocketAddr>,
    /// Deployment model 2 or 3: forward each release over one more hop, to
    /// this firm host (UDP HOST:PORT: `fairfeed firm-host`, or an unmodified
    /// ITCH consumer) or enclave channel (unix:PATH). Each host is sent to
    /// early by its one-way delay, measured with probes it echoes (a host
    /// that answers none gets the packet at the deadline), so the hosts, not
    /// only this receiver, have it at the deadline; the deadline grows by
    /// the largest lead. Repeat for up to 64 hosts.
    #[arg(long = "host", value_name = "ADDR", value_parser = host_addr)]
    hosts: Vec<fairfeed_net::lasthop::HostAddr>,
    /// With --host: no compensation — every host is sent to at the deadline
    /// (the hop's spread stays; for comparison).
    #[arg(long, requires = "hosts")]
    no_compensate: bool,
    /// With --host: the longest lead a host gets, µs (0..=100,000; a host
    /// whose delay asks for more is counted in last_hop.hosts[].capped).
    #[arg(long, requires = "hosts", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(0..=fairfeed_tree::lasthop::LEAD_LIMIT_NS / 1_000))]
    lead_max_us: u64,
    /// With --host: the hosts hold each packet to its deadline (`fairfeed
    /// firm-host --hold`, on a clock synchronized with this one): each packet
    /// goes with its deadline in front (16 bytes; an unmodified ITCH
    /// consumer cannot take it), sent early by --lead-quantile of the hop.
    #[arg(long, requires = "hosts")]
    hosts_hold: bool,
    /// With --host: each host's lead is this quantile of its measured
    /// delays (0.5..=0.999999; default 0.5, the median; with --hosts-hold a
    /// far one, e.g. 0.999, so packets arrive before the deadline they are held to).
    #[arg(long, requires = "hosts", default_value_t = 0.5, value_parser = crate::cmd_sim::hold_q)]
    lead_quantile: f64,
}

/// A clap value parser for a last hop's host: `unix:PATH` or a UDP `HOST:PORT`.
pub(crate) fn host_addr(s: &str) -> Result<fairfeed_net::lasthop::HostAddr, String> {
    fairfeed_net::lasthop::HostAddr::parse(s, crate::fmt::dest_addr).map_err(|e| e.to_string())
}

/// The last hop of `--host`: at most [`fairfeed_tree::lasthop::HOSTS_MAX`] hosts, none twice.
fn last_hop_job(a: &ReceiverArgs) -> anyhow::Result<Option<fairfeed_net::tree::agent::LastHopJob>> {
    use fairfeed_tree::lasthop::{LastHopConfig, HOSTS_MAX};
    if a.hosts.is_empty() {
        return Ok(None);
    }
    anyhow::ensure!(
        a.hosts.len() <= HOSTS_MAX,
        "--host: {} hosts, a last hop serves at most {HOSTS_MAX}",
        a.hosts.len()
    );
    for (i, h) in a.hosts.iter().enumerate() {
        anyhow::ensure!(!a.hosts[..i].contains(h), "--host {h}: given twice");
    }
    anyhow::ensure!(
        !(a.hosts_hold && a.no_compensate),
        "--hosts-hold sends early by each host's delay: drop --no-compensate"
    );
    let cfg = LastHopConfig {
        compensate: !a.no_compensate,
        lead_max_ns: a.lead_max_us * 1_000,
        lead_quantile: a.lead_quantile,
        hosts_hold: a.hosts_hold,
        ..LastHopConfig::default()
    };
    Ok(Some(fairfeed_net::tree::agent::LastHopJob { hosts: a.hosts.clone(), cfg, framed: a.hosts_hold }))
}

/// The shard map in `p` for a topology of `trees` trees; one line names a bad entry.
fn load_shard_map(p: &Path, trees: usize) -> anyhow::Result<fairfeed_tree::shard::ShardMap> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading shard map {}", p.display()))?;
    let map =
        fairfeed_tree::shard::ShardMap::parse(&text, trees).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    anyhow::ensure!(!map.symbols.is_empty(), "{}: the shard map names no symbol", p.display());
    Ok(map)
}

/// A subscription file: one symbol per line (1-8 printable characters), `#` comments.
fn load_symbols(p: &Path) -> anyhow::Result<Vec<[u8; 8]>> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading symbols {}", p.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let sym = line.split('#').next().unwrap_or("").trim();
        if sym.is_empty() {
            continue;
        }
        anyhow::ensure!(
            sym.len() <= 8 && sym.bytes().all(|b| b.is_ascii_graphic()),
            "{} line {}: symbol {sym:?} is not 1-8 printable characters",
            p.display(),
            i + 1
        );
        out.push(fairfeed_tree::shard::pad_symbol(sym));
    }
    anyhow::ensure!(!out.is_empty(), "{}: no symbol", p.display());
    Ok(out)
}

#[derive(clap::Args)]
pub struct StatArgs {
    /// The node's control address (its --control); the fields are explained in docs/FILES.md.
    #[arg(value_parser = crate::fmt::dest_addr, required_unless_present = "topology", conflicts_with = "topology")]
    addr: Option<SocketAddr>,
    /// The whole tree instead: ask every node at its control address in this
    /// topology (plan with --control-port) and show the fleet — each recent
    /// message's delivery window and P(F) across the receivers, late
    /// releases, gaps, and the receivers that release last.
    #[arg(long)]
    topology: Option<PathBuf>,
    /// With --topology: messages compared at most (the most recent every receiver released), 1..=100,000.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=100_000), requires = "topology")]
    messages: u64,
    /// With --topology: receivers listed, worst first, 1..=100,000.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100_000), requires = "topology")]
    worst: u64,
    /// With --topology: the view as one JSON object.
    #[arg(long, requires = "topology")]
    json: bool,
    /// Give up after this long, ms; 1..=600,000.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    timeout_ms: u64,
    /// Seal the requests under the operator key in this file (a node
    /// answers queries from beyond its own host only sealed).
    #[arg(long)]
    key_file: Option<PathBuf>,
}

/// Reads a topology (TOML or JSON, either gzipped — as `plan --emit k8s`
/// stores a large one) and validates it whole: one line names the first fault.
pub(crate) fn load_topology(p: &Path) -> anyhow::Result<Topology> {
    let bytes = std::fs::read(p).with_context(|| format!("reading topology {}", p.display()))?;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut out)
            .with_context(|| format!("{}: not a gzipped topology", p.display()))?;
        out
    } else {
        bytes
    };
    let text =
        String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{}: not a topology (not UTF-8 text)", p.display()))?;
    let name = p.to_string_lossy();
    let name = name.strip_suffix(".gz").unwrap_or(&name);
    let t: Topology = if name.ends_with(".json") {
        serde_json::from_str(&text).with_context(|| format!("{}: not a topology", p.display()))?
    } else {
        toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!("{}: not a topology: {}", p.display(), fairfeed_sim::model::toml_error_line(&text, &e))
        })?
    };
    fairfeed_tree::plan::validate(&t).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    Ok(t)
}

/// The operator key (`--operator-key-file`); refused when it is the tree's key.
fn load_operator(c: &Common) -> anyhow::Result<Option<OperatorKey>> {
    let Some(p) = &c.operator_key_file else { return Ok(None) };
    let key = crate::fmt::operator_key(p)?;
    let op_bytes = fairfeed_tree::auth::key_from_hex(&crate::fmt::key_text(p)?).map_err(anyhow::Error::msg)?;
    if load_auth(c)?.is_some_and(|a| a.holds(&op_bytes)) {
        anyhow::bail!(
            "--operator-key-file {} holds the tree's key: give the operator a key of its own (a proxy holds the tree \
             key and must not be able to stop its peers)",
            p.display()
        );
    }
    Ok(Some(key))
}

fn load_auth(c: &Common) -> anyhow::Result<Option<Auth>> {
    let (text, from) = match (&c.key_file, std::env::var("FAIRFEED_KEY")) {
        (Some(p), _) => (crate::fmt::key_text(p)?, p.display().to_string()),
        (None, Ok(k)) => (k, "FAIRFEED_KEY".to_string()),
        (None, Err(_)) => return Ok(None),
    };
    let mut a = Auth::from_text(&text).map_err(|e| anyhow::anyhow!("bad key in {from}: {e}"))?;
    if a.is_all_zero() {
        tracing::warn!(
            node = c.id,
            "a key in {from} is all zeros: anyone can guess it, so packets are as good as unauthenticated; make a \
             random one (head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')"
        );
    }
    a.max_age_ns = c.max_age_ms * 1_000_000;
    Ok(Some(a))
}

fn load_link(s: &str) -> anyhow::Result<Option<LinkModel>> {
    Ok(match s {
        "none" => None,
        "cloud" => Some(LinkModel::CLOUD),
        path => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading link model {path}"))?;
            Some(ModelFile::from_toml(&text).map_err(|e| anyhow::anyhow!("{path}: {e}"))?.link)
        }
    })
}

/// What a topology of several trees cannot offer yet: one line naming it.
fn refuse_on_several_trees(c: &Common, topology: &Topology, job: &Job) -> anyhow::Result<()> {
    let sharded = topology.trees.len() > 1;
    let retransmits = match job {
        Job::Sender(s) => s.retransmit_listen.is_some(),
        Job::Receiver(r) => r.retransmit.is_some(),
        Job::Proxy => false,
    };
    let snapshots = match job {
        Job::Sender(s) => s.snapshot.is_some(),
        Job::Receiver(r) => r.snapshot.is_some(),
        Job::Proxy => false,
    };
    if sharded && snapshots {
        anyhow::bail!(
            "{}: a topology of {} trees delivers one merged session numbered by the receiver, not the feed's \
             sequence numbers a snapshot ends at; --snapshot and --snapshot-listen need a topology of one tree (plan with --trees 1)",
            topology_name(c),
            topology.trees.len()
        );
    }
    if sharded && retransmits {
        anyhow::bail!(
            "{}: a topology of {} trees splits the feed into one MoldUDP64 session per tree; retransmission \
             (--retransmit-listen / --retransmit) serves one session and is not yet offered per tree: plan with --trees 1 \
             to use it",
            topology_name(c),
            topology.trees.len()
        );
    }
    Ok(())
}

/// The topology's name in messages: its file, or the controller's.
fn topology_name(c: &Common) -> String {
    match (&c.topology, c.controller.first()) {
        (Some(p), _) => p.display().to_string(),
        (None, Some(a)) => format!("the controller at {a}"),
        (None, None) => "the topology".into(),
    }
}

/// `--join-wait-s`: 0.1 to 3,600 seconds.
fn join_wait(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(0.1..=3_600.0).contains(&v) {
        return Err(format!("{v} is out of range 0.1..=3600"));
    }
    Ok(v)
}

/// `--id`: a node id, or `any` (the controller's choice).
fn node_id(s: &str) -> Result<u32, String> {
    if s == "any" {
        return Ok(fairfeed_tree::membership::ANY_ID);
    }
    match s.parse::<u32>() {
        Ok(v) if v < fairfeed_tree::membership::CONTROLLER_ORIGIN => Ok(v),
        _ => Err(format!("`{s}` is not a node id (0..{}) or `any`", fairfeed_tree::membership::CONTROLLER_ORIGIN)),
    }
}

/// `--controller`: HOST:PORT, a name or an IP (names are looked up while joining).
fn controller_addr(s: &str) -> Result<fairfeed_tree::addr::HostPort, String> {
    fairfeed_tree::addr::HostPort::parse(s, false).map_err(|e| e.to_string())
}

/// The controllers' addresses, names looked up until `wait` ends (a Service may come up after the node).
fn resolve_controllers(c: &Common, wait: std::time::Duration) -> anyhow::Result<Vec<SocketAddr>> {
    use std::net::ToSocketAddrs;
    let t0 = std::time::Instant::now();
    let mut out = Vec::new();
    for hp in &c.controller {
        if let Some(a) = hp.literal() {
            out.push(a);
            continue;
        }
        loop {
            match (hp.host.as_str(), hp.port).to_socket_addrs() {
                Ok(all) => {
                    let all: Vec<SocketAddr> = all.collect();
                    if let Some(a) = all.iter().find(|a| a.is_ipv4()).or(all.first()) {
                        out.push(*a);
                        break;
                    }
                }
                Err(e) if t0.elapsed() >= wait => {
                    anyhow::bail!("--controller {hp}: cannot resolve {:?} ({e})", hp.host)
                }
                Err(_) => {}
            }
            if t0.elapsed() >= wait {
                anyhow::bail!("--controller {hp}: {:?} has no address", hp.host);
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    Ok(out)
}

/// Before a node is configured: under a controller, join it (the node's id
/// is the one it was given); with a topology file, an id is needed.
fn prepare(c: &mut Common, role: fairfeed_tree::membership::MemberRole) -> anyhow::Result<()> {
    if c.controller.is_empty() {
        anyhow::ensure!(
            c.id != fairfeed_tree::membership::ANY_ID,
            "--id any needs --controller (a topology file names every node)"
        );
        return Ok(());
    }
    // Not stoppable by a signal yet (none is caught before the node runs): the wait is bounded.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let j = join_controller(c, role, &stop)?;
    c.id = j.view.id;
    c.joined = Some(Arc::new(j));
    Ok(())
}

/// Registers with the controller and waits for the first view.
fn join_controller(
    c: &Common,
    role: fairfeed_tree::membership::MemberRole,
    stop: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<fairfeed_net::tree::agent::membership::Joined> {
    if c.xdp_dedup.is_some() || c.tc_replicate.is_some() || matches!(c.io, IoArg::Afxdp | IoArg::XdpSocket) {
        anyhow::bail!("the kernel paths (--xdp-dedup, --tc-replicate, --io afxdp|xdp-socket) are set up for a planned topology, not yet under --controller");
    }
    // Fresh per process start: a restarted node is a new member.
    let incarnation: u64 = rand::random();
    let cfg = fairfeed_tree::controller::MemberConfig {
        role,
        want_id: c.id,
        capacity: c.capacity,
        advertise: None,
        incarnation,
        heartbeat_ns: c.report_interval_ms * 1_000_000,
        register_retry_ns: c.report_interval_ms * 1_000_000,
    };
    let bind = c.bind.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    let wait = std::time::Duration::from_secs_f64(c.join_wait_s);
    let controllers = resolve_controllers(c, wait)?;
    let j = fairfeed_net::tree::agent::membership::join(&controllers, bind, cfg, load_auth(c)?, wait, stop).map_err(
        |e| match c.id {
            fairfeed_tree::membership::ANY_ID => anyhow::anyhow!("node (--id any): {e}"),
            id => anyhow::anyhow!("node {id}: {e}"),
        },
    )?;
    tracing::info!(
        node = j.view.id,
        version = j.view.version,
        "node {}: joined the controller (topology version {}: parent {}, {} children)",
        j.view.id,
        j.view.version,
        if j.view.parent == fairfeed_tree::membership::NO_PARENT {
            "none".to_string()
        } else {
            j.view.parent.to_string()
        },
        j.view.children.len()
    );
    Ok(j)
}

/// What `--io` and the kernel programs come to: the back-end, the counters
/// they add, the TC replicator and the AF_XDP sender.
struct KernelPaths {
    io: fairfeed_net::send::Backend,
    extra: Vec<ExtraCounters>,
    replicate: Option<Replicate>,
    external: Option<fairfeed_net::send::External>,
}

fn kernel_paths(c: &Common, topology: &Topology) -> anyhow::Result<KernelPaths> {
    let plan = resolve_io(c, topology)?;
    let xdp = attach_xdp(c, topology, plan.xdp_dedup.as_ref())?;
    let tc = attach_tc(c, topology, plan.tc_replicate.as_ref())?;
    let mut extra: Vec<ExtraCounters> = Vec::new();
    if let Some(x) = xdp {
        extra.push(ExtraCounters { name: "xdp", read: Arc::new(move || xdp_counters(&x)) });
    }
    let replicate = tc.map(|(r, e)| {
        extra.push(e);
        r
    });
    let afxdp = match (plan.io, plan.afxdp) {
        (_, Some(x)) => Some(x),
        (IoArg::Afxdp, None) => Some(attach_afxdp(c, topology)?),
        _ => None,
    };
    let external = afxdp.map(|(x, e)| {
        extra.push(e);
        x
    });
    let io = match plan.io {
        IoArg::Udp | IoArg::XdpSocket | IoArg::Auto => fairfeed_net::send::Backend::Udp,
        IoArg::Uring => fairfeed_net::send::Backend::Uring,
        IoArg::Afxdp => fairfeed_net::send::Backend::AfXdp,
    };
    Ok(KernelPaths { io, extra, replicate, external })
}

/// The command line's --control, else the topology's control address for this node.
fn control_addr(c: &Common, topology: &Topology) -> anyhow::Result<Option<SocketAddr>> {
    if let Some(a) = c.control {
        return Ok(Some(a));
    }
    match fairfeed_tree::plan::node_in_trees(topology, c.id).first().and_then(|(_, n)| n.control.as_deref()) {
        Some(s) => {
            Ok(Some(crate::fmt::listen_addr(s).map_err(|e| anyhow::anyhow!("node {}'s control address: {e}", c.id))?))
        }
        None => Ok(None),
    }
}

fn config(c: &Common, rule: DeadlineRule, job: Job) -> anyhow::Result<AgentConfig> {
    if let (Some(p), Some(t)) = (&c.stats_out, &c.topology) {
        crate::fmt::check_outputs(&[p], &[t])?;
    }
    let stop = crate::fmt::stop_on_signals()?;
    let (topology, membership) = match (&c.topology, &c.joined) {
        (Some(p), _) => (load_topology(p)?, None),
        (None, Some(j)) => (fairfeed_tree::controller::view_topology(&j.view), Some(j.clone())),
        (None, None) => anyhow::bail!("give --topology FILE or --controller ADDR"),
    };
    let KernelPaths { io, extra, replicate, external } = kernel_paths(c, &topology)?;
    let control = control_addr(c, &topology)?;
    // A key file is watched: a new keyring in it is put in force while the node runs.
    let auth = load_auth(c)?;
    let keys = match (&c.key_file, &auth) {
        (Some(p), Some(a)) => {
            let cell = KeyCell::new(a);
            KeyFileWatch::start(p.clone(), cell.clone()).context("watching the key file")?.detach();
            Some(cell)
        }
        _ => None,
    };
    refuse_on_several_trees(c, &topology, &job)?;
    Ok(AgentConfig {
        topology: Arc::new(topology),
        id: c.id,
        node: NodeConfig {
            report_interval_ns: c.report_interval_ms * 1_000_000,
            initial_owd_ns: c.initial_owd_us * 1_000,
            hold_and_release: !c.no_hold,
            ..NodeConfig::default()
        },
        rule,
        auth: auth.clone(),
        keys,
        link: load_link(&c.link)?,
        seed: c.seed,
        idle: c.idle.strategy(),
        threads: match c.threads {
            ThreadsArg::One => Threading::One,
            ThreadsArg::Split => Threading::Split,
            ThreadsArg::Dedicated => Threading::Dedicated,
        },
        tuning: Tuning { pin: c.pin.clone(), mlock: c.mlock, fifo: c.fifo, busy_poll_us: c.busy_poll_us },
        control,
        operator: load_operator(c)?,
        max_seconds: c.seconds,
        resolve_wait: std::time::Duration::from_secs_f64(c.resolve_wait_s),
        job,
        stop,
        clock: fairfeed_net::tree::agent::ClockOpts { host_bound: host_bound(c)?, ..clock_opts(c) },
        time: fairfeed_net::tree::agent::TimeBase::WALL,
        tap: None,
        board: c.metrics.map(|_| NodeBoard::new()),
        extra,
        replicate,
        shards: Default::default(),
        io,
        external,
        membership,
    })
}

/// Starts the node's metrics endpoint, if asked for; keep it alive while the node runs.
fn metrics_endpoint(c: &Common, cfg: &AgentConfig) -> anyhow::Result<Option<fairfeed_ops::Endpoint>> {
    let (Some(addr), Some(board)) = (c.metrics, cfg.board.clone()) else { return Ok(None) };
    let ep = fairfeed_ops::serve_metrics(addr, move |e| node_metrics(&board, e))
        .with_context(|| format!("serving metrics on {addr}"))?;
    tracing::info!(node = c.id, addr = %ep.addr, "node {}: metrics at http://{}/metrics", c.id, ep.addr);
    Ok(Some(ep))
}

/// A node's board as metrics: the shell's counters (`fairfeed_agent_*`),
/// the state machine's (`fairfeed_node_*`: counters, OWD_G, margin, clock
/// offset and bound, …) and the latency histograms.
pub(crate) fn node_metrics(board: &NodeBoard, e: &mut fairfeed_ops::Exposition) {
    let Some((r, hists)) = fairfeed_net::tree::agent::report(board, true) else { return };
    let id = r.id.to_string();
    let labels = [("node", id.as_str()), ("role", r.role.as_str())];
    e.gauge("fairfeed_node_uptime_seconds", "seconds since the node started", &labels, r.uptime_s);
    e.json("fairfeed_agent", &r.counters, &labels, "the node's I/O shell (fairfeed stat: counters; docs/FILES.md)");
    e.json("fairfeed_node", &r.node, &labels, "the node's state machine (fairfeed stat: node; docs/FILES.md)");
    for (name, h) in &hists {
        let help = match *name {
            "owd" => "one-way delay, sender to this receiver",
            "hold" => "time a message was held before its release",
            _ => "release instant minus deadline, on the synchronized clock",
        };
        let metric = format!("fairfeed_node_{name}_seconds");
        e.histogram(&metric, help, &labels, h, 1e-9, fairfeed_ops::metrics::LATENCY_BUCKETS_S);
    }
}

fn finish(c: &Common, cfg: &AgentConfig, mut r: fairfeed_net::tree::agent::AgentReport) -> anyhow::Result<()> {
    for e in &cfg.extra {
        r.counters[e.name] = (e.read)();
    }
    let r = &r;
    match &c.stats_out {
        Some(p) => {
            let text = serde_json::to_string_pretty(r)?;
            std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
            tracing::info!(node = r.id, file = %p.display(), "node {}: report written to {}", r.id, p.display());
        }
        None => crate::log::final_report("node", r),
    }
    Ok(())
}

fn feed(a: &SenderArgs) -> anyhow::Result<Vec<Vec<u8>>> {
    if let Some(p) = &a.pcap {
        return Ok(crate::fmt::read_capture(p, None)?.into_iter().map(|d| d.payload).collect());
    }
    let packets = (a.rate * a.feed_seconds).ceil() as usize;
    anyhow::ensure!(packets <= 10_000_000, "at most 10,000,000 packets per run");
    let g = Generator::new(GenConfig {
        seed: a.common.seed,
        messages: (packets as u64 * 8).max(100),
        symbols: 100,
        ..GenConfig::default()
    })?;
    Ok(g.map(|p| p.payload).take(packets).collect())
}

/// The sender's snapshot service (`--snapshot-listen`), with its login if given.
fn snapshot_service(a: &SenderArgs) -> anyhow::Result<Option<fairfeed_net::snapshot::ServiceConfig>> {
    let Some(listen) = a.snapshot_listen else { return Ok(None) };
    let mut c = fairfeed_net::snapshot::ServiceConfig::new(listen);
    if let (Some(u), Some(p)) = (&a.snapshot_user, &a.snapshot_password_file) {
        c.credentials.user_pass = Some((u.clone(), crate::fmt::soup_password_file(p)?));
    }
    Ok(Some(c))
}

pub fn run_sender(mut a: SenderArgs) -> anyhow::Result<()> {
    let payloads = if a.listen.is_some() { Vec::new() } else { feed(&a)? };
    // Joined once the feed is loaded: the heartbeats start with the node.
    prepare(&mut a.common, fairfeed_tree::membership::MemberRole::Sender)?;
    anyhow::ensure!(a.listen.is_some() || !payloads.is_empty(), "nothing to send");
    let rule = match a.target_pf {
        Some(pf) => DeadlineRule::Quantile { target_pf: pf },
        None => DeadlineRule::Paper { margin_ns: a.margin_us * 1_000 },
    };
    let job = Job::Sender(SenderJob {
        payloads,
        rate_per_s: a.rate,
        start_delay_ns: a.start_delay_ms * 1_000_000,
        linger_ns: a.linger_ms * 1_000_000,
        retransmit_listen: a.retransmit_listen,
        listen: a.listen,
        snapshot: snapshot_service(&a)?,
        deadlines_to: a.deadlines_to,
    });
    let mut cfg = config(&a.common, rule, job)?;
    if let Some(p) = &a.shard_map {
        cfg.shards.map = load_shard_map(p, cfg.topology.trees.len())?;
    }
    let _metrics = metrics_endpoint(&a.common, &cfg)?;
    let r = run_agent(&cfg, |_, _| {}).map_err(|e| anyhow::anyhow!("sender {}: {e}", a.common.id))?;
    finish(&a.common, &cfg, r)
}

pub fn run_proxy(mut a: ProxyArgs) -> anyhow::Result<()> {
    prepare(&mut a.common, fairfeed_tree::membership::MemberRole::Proxy)?;
    let cfg = config(&a.common, DeadlineRule::Paper { margin_ns: 0 }, Job::Proxy)?;
    let _metrics = metrics_endpoint(&a.common, &cfg)?;
    let r = run_agent(&cfg, |_, _| {}).map_err(|e| anyhow::anyhow!("proxy {}: {e}", a.common.id))?;
    finish(&a.common, &cfg, r)
}

pub fn run_receiver(mut a: ReceiverArgs) -> anyhow::Result<()> {
    prepare(&mut a.common, fairfeed_tree::membership::MemberRole::Receiver)?;
    if let Some(p) = &a.log {
        let outs: Vec<&Path> = std::iter::once(p.as_path()).chain(a.common.stats_out.as_deref()).collect();
        let topo: Vec<&Path> = a.common.topology.iter().map(PathBuf::as_path).collect();
        crate::fmt::check_outputs(&outs, &topo)?;
    }
    let snapshot = match a.snapshot {
        None => None,
        Some(server) => Some(fairfeed_net::tree::agent::SnapshotJoin {
            server,
            user: a.snapshot_user.clone(),
            password: a
                .snapshot_password_file
                .as_deref()
                .map(crate::fmt::soup_password_file)
                .transpose()?
                .unwrap_or_default(),
        }),
    };
    let job = Job::Receiver(ReceiverJob {
        deliver: a.deliver,
        retransmit: a.retransmit,
        fill_from: a.retransmit_from,
        keep_log: a.log.is_some(),
        snapshot,
        last_hop: last_hop_job(&a)?,
    });
    let mut cfg = config(&a.common, DeadlineRule::Paper { margin_ns: 0 }, job)?;
    cfg.node.order = ReleaseOrder::Sequence { gap_wait_ns: a.gap_wait_us * 1_000 };
    // A receiver joining from a snapshot joins a running session: its line
    // starts where it joined, at that message's deadline.
    cfg.node.joins_running = a.snapshot.is_some();
    cfg.node.release_lead_ns = a.cheat_us * 1_000;
    if a.cheat_us > 0 {
        tracing::warn!(
            "receiver {}: --cheat-us {}: TEST MODE, releasing every message {} µs before its deadline",
            a.common.id,
            a.cheat_us,
            a.cheat_us
        );
    }
    if let Some(p) = &a.shard_map {
        cfg.shards.map = load_shard_map(p, cfg.topology.trees.len())?;
    }
    if let Some(p) = &a.symbols {
        cfg.shards.symbols = Some(load_symbols(p)?);
    }
    let cell = Arc::new(fairfeed_net::order_proxy::ClockCell::default());
    let proxy = start_order_proxy(&a, &mut cfg, &cell)?;
    let _metrics = metrics_endpoint(&a.common, &cfg)?;
    let stamps = proxy.is_some();
    // Behind a last hop the firm's host has the data at the deadline, not at the release.
    let behind_hop = !a.hosts.is_empty();
    let r = run_agent(&cfg, |m, at| {
        if stamps {
            cell.delivered(&m.payload, if behind_hop { at.deadline_wall_ns.max(at.wall_ns) } else { at.wall_ns });
        }
    })
    .map_err(|e| anyhow::anyhow!("receiver {}: {e}", a.common.id))?;
    cfg.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(p) = &a.log {
        write_rows(p, &r.rows).with_context(|| format!("writing {}", p.display()))?;
    }
    finish(&a.common, &cfg, r)
}

/// `--order-proxy` with `--exchange`: the firms' orders stamped with this
/// receiver's delivery clock (`cell`) on their way to the exchange.
fn start_order_proxy(
    a: &ReceiverArgs,
    cfg: &mut AgentConfig,
    cell: &Arc<fairfeed_net::order_proxy::ClockCell>,
) -> anyhow::Result<Option<Arc<fairfeed_net::order_proxy::OrderProxy>>> {
    let (Some(listen), Some(exchange)) = (a.order_proxy, a.exchange) else { return Ok(None) };
    let idle = fairfeed_net::order_proxy::PROXY_IDLE_MAX;
    let p = fairfeed_net::order_proxy::OrderProxy::start(listen, exchange, cell.clone(), cfg.stop.clone(), idle)
        .with_context(|| format!("--order-proxy {listen}"))?;
    tracing::info!("receiver {}: stamping the orders of firms connected to {} for {exchange}", a.common.id, p.addr);
    let p = Arc::new(p);
    let q = p.clone();
    cfg.extra.push(ExtraCounters {
        name: "order_proxy",
        read: Arc::new(move || serde_json::to_value(q.stats()).unwrap_or_default()),
    });
    Ok(Some(p))
}

/// `stat --topology`: the fleet view.
fn run_fleet(a: &StatArgs) -> anyhow::Result<()> {
    let Some(p) = &a.topology else { anyhow::bail!("give a node's control address or --topology FILE") };
    let topo = load_topology(p)?;
    let key = a.key_file.as_deref().map(crate::fmt::operator_key).transpose()?;
    let timeout = Duration::from_millis(a.timeout_ms);
    let v = fairfeed_net::tree::fleet::fleet(&topo, a.messages as usize, timeout, key.as_ref())
        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    use std::io::Write;
    let text =
        if a.json { serde_json::to_string_pretty(&v)? } else { fairfeed_net::tree::fleet::text(&v, a.worst as usize) };
    let _ = writeln!(std::io::stdout(), "{text}");
    Ok(())
}

/// `stat` asks again this often until answered (UDP: a request or its
/// answer may be dropped, by a full socket buffer under load or a flood).
const STAT_RETRY_MS: u64 = 200;

pub fn run_stat(a: StatArgs) -> anyhow::Result<()> {
    let Some(addr) = a.addr else { return run_fleet(&a) };
    let key = a.key_file.as_deref().map(crate::fmt::operator_key).transpose()?;
    let s = UdpSocket::bind(if addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
    let until = std::time::Instant::now() + Duration::from_millis(a.timeout_ms);
    let mut buf = vec![0u8; 65_536];
    // With a key: only an answer sealed to one of our requests is taken.
    let (mut sent, mut not_taken) = (Vec::new(), None);
    let body = loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            if let Some(e) = not_taken {
                anyhow::bail!("no answer taken from {addr} within {} ms: {e}", a.timeout_ms);
            }
            anyhow::bail!("no answer from {} within {} ms (is a node's --control there?)", addr, a.timeout_ms);
        }
        let (datagram, nonce) = fairfeed_net::operator::request(key.as_ref(), addr, "stat");
        sent.extend(nonce);
        s.send_to(&datagram, addr).with_context(|| format!("asking {}", addr))?;
        s.set_read_timeout(Some(left.min(Duration::from_millis(STAT_RETRY_MS))))?;
        match s.recv(&mut buf) {
            Ok(n) => match fairfeed_net::operator::answer(key.as_ref(), &sent, &buf[..n]) {
                Ok(body) => break body.to_vec(),
                Err(fairfeed_net::operator::AnswerError::Refused(why)) => {
                    anyhow::bail!("{addr} refused the request: {}", why.trim())
                }
                Err(e) => not_taken = Some(e),
            },
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            // Nothing listens there (ICMP port unreachable): ask again until the time is up.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                std::thread::sleep(left.min(Duration::from_millis(STAT_RETRY_MS)));
            }
            Err(e) => anyhow::bail!("no answer from {} (is a node's --control there?): {e}", addr),
        }
    };
    let text = String::from_utf8_lossy(&body);
    if let Some(why) = text.strip_prefix("refused: ") {
        anyhow::bail!("{addr} refused the request: {}", why.trim());
    }
    let v: serde_json::Value = serde_json::from_slice(&body).context("the answer is not JSON")?;
    use std::io::Write;
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

fn resolve_wait(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 0.0, 3_600.0, "s")
}
