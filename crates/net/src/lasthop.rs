//! The last hop of deployment models 2 and 3 over real sockets: the
//! release point's side ([`LastHopOut`], driven by a receiver's delivery
//! agent) and the far side ([`FirmHost`], an agent: a firm's host behind a
//! gateway, or the firm's enclave behind its VM).
//!
//! The logic is [`fairfeed_tree::lasthop::LastHop`]; this is only sockets.
//! Hosts are UDP addresses (model 2: a gateway forwards over the network)
//! or Unix datagram sockets (model 3: the VM → enclave channel). A Nitro
//! enclave is reached over AF_VSOCK; this host's kernel has no
//! `vsock_loopback` (a local AF_VSOCK connect to CID 1 times out), so the
//! channel here is a Unix socket, and its delay — tens of µs with a jitter
//! that matters more than its mean — is emulated in user space by the far
//! side ([`HostConfig::delay`]), for probes and data alike, so the release
//! point measures it as it would a real one.

use std::collections::VecDeque;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use fairfeed_io::agent::{Agent, Turn};
use fairfeed_io::clock::wall_ns;
use fairfeed_tree::lasthop::{framed, probe, LastHop, LastHopConfig, Out};
use fairfeed_wire::moldudp64::Packet;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// The largest datagram either side reads.
const DATAGRAM_MAX: usize = 65_536;
/// Datagrams read per turn at most (others wait for the next turn).
const READS_PER_TURN: usize = 256;

/// Where a last hop ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostAddr {
    /// A firm's host over the network (model 2).
    Udp(SocketAddr),
    /// An enclave's channel on this host (model 3): a Unix datagram socket.
    Unix(PathBuf),
}

impl std::fmt::Display for HostAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostAddr::Udp(a) => write!(f, "{a}"),
            HostAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Why a last hop's host address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostAddrError<E: std::fmt::Display> {
    #[error("{0:?}: give a socket path after unix:")]
    EmptyPath(String),
    #[error("{0:?}: a Unix socket path has at most 107 bytes")]
    PathTooLong(String),
    #[error("{0}")]
    Udp(E),
}

impl HostAddr {
    /// `unix:PATH`, or what `udp` makes of anything else (a clap parser's resolution).
    pub fn parse<E: std::fmt::Display>(
        s: &str,
        udp: impl Fn(&str) -> Result<SocketAddr, E>,
    ) -> Result<HostAddr, HostAddrError<E>> {
        match s.strip_prefix("unix:") {
            Some("") => Err(HostAddrError::EmptyPath(s.into())),
            Some(p) if p.len() > 107 => Err(HostAddrError::PathTooLong(s.into())),
            Some(p) => Ok(HostAddr::Unix(PathBuf::from(p))),
            None => udp(s).map(HostAddr::Udp).map_err(HostAddrError::Udp),
        }
    }
}

/// The release point's side of the last hop: a [`LastHop`] and its sockets.
pub struct LastHopOut {
    core: LastHop,
    hosts: Vec<HostAddr>,
    udp: Option<UdpSocket>,
    unix: Option<UnixDatagram>,
    /// The largest lead, published for the node (`Receiver::set_last_hop_ns`).
    lead: Arc<AtomicU64>,
    send_failed: u64,
    /// Echoes from no host of ours.
    unknown_source: u64,
    buf: Vec<u8>,
    /// Frame each packet with its deadline (hosts that hold to it).
    framed: bool,
    scratch: Vec<u8>,
}

/// Binds the release point's Unix socket under an abstract name (so hosts can answer it).
fn bind_unix() -> std::io::Result<UnixDatagram> {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = format!("fairfeed-lasthop-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
    let s = UnixDatagram::bind_addr(&UnixAddr::from_abstract_name(name.as_bytes())?)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

impl LastHopOut {
    /// `cfg.hosts` is taken from `hosts`; `lead` receives the largest lead;
    /// `framed`: each packet goes with its deadline in front
    /// ([`fairfeed_tree::lasthop::framed`]), for hosts that hold to it.
    pub fn new(
        hosts: Vec<HostAddr>,
        cfg: LastHopConfig,
        lead: Arc<AtomicU64>,
        framed: bool,
    ) -> std::io::Result<LastHopOut> {
        let secret = rand::rngs::StdRng::from_entropy().gen();
        let core = LastHop::new(LastHopConfig { hosts: hosts.len(), secret, ..cfg })
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let udp = if hosts.iter().any(|h| matches!(h, HostAddr::Udp(_))) {
            let s = UdpSocket::bind("0.0.0.0:0")?;
            s.set_nonblocking(true)?;
            Some(s)
        } else {
            None
        };
        let unix = if hosts.iter().any(|h| matches!(h, HostAddr::Unix(_))) { Some(bind_unix()?) } else { None };
        Ok(LastHopOut {
            core,
            hosts,
            udp,
            unix,
            lead,
            send_failed: 0,
            unknown_source: 0,
            buf: vec![0; DATAGRAM_MAX],
            framed,
            scratch: Vec::with_capacity(DATAGRAM_MAX),
        })
    }

    /// A released packet, due at the hosts at wall time `deadline_ns`.
    /// (Times here are read at the socket, not the turn's: the hop's
    /// measurement and its sends are only as exact as they are.)
    pub fn release(&mut self, deadline_ns: u64, payload: &[u8]) {
        let now = wall_ns();
        let mut failed = 0u64;
        let net = Net { hosts: &self.hosts, udp: &self.udp, unix: &self.unix, framed: self.framed };
        let scratch = &mut self.scratch;
        self.core.on_release(now, deadline_ns, payload, &mut |o| failed += u64::from(!net.send(o, scratch)));
        self.send_failed += failed;
    }

    /// Reads the hosts' echoes and sends what is due; returns the work done.
    pub fn service(&mut self) -> usize {
        let mut n = 0;
        for _ in 0..READS_PER_TURN {
            let Some(s) = &self.udp else { break };
            let Ok((k, from)) = s.recv_from(&mut self.buf) else { break };
            let now = wall_ns();
            match self.hosts.iter().position(|h| *h == HostAddr::Udp(from)) {
                Some(h) => self.core.on_packet(now, h, &self.buf[..k]),
                None => self.unknown_source += 1,
            }
            n += 1;
        }
        for _ in 0..READS_PER_TURN {
            let Some(s) = &self.unix else { break };
            let Ok((k, from)) = s.recv_from(&mut self.buf) else { break };
            let now = wall_ns();
            let host = from
                .as_pathname()
                .and_then(|p| self.hosts.iter().position(|h| matches!(h, HostAddr::Unix(q) if q == p)));
            match host {
                Some(h) => self.core.on_packet(now, h, &self.buf[..k]),
                None => self.unknown_source += 1,
            }
            n += 1;
        }
        let mut failed = 0u64;
        let net = Net { hosts: &self.hosts, udp: &self.udp, unix: &self.unix, framed: self.framed };
        let scratch = &mut self.scratch;
        n += self.core.send_due(wall_ns(), &mut |o| failed += u64::from(!net.send(o, scratch)));
        self.send_failed += failed;
        self.lead.store(self.core.lead_max_ns(), Ordering::Relaxed);
        n
    }

    /// Packets still waiting for some host.
    pub fn pending(&self) -> usize {
        self.core.pending()
    }

    /// Wall time of the next send or probe (`u64::MAX`: none).
    pub fn next_due(&self) -> u64 {
        self.core.next_timeout().unwrap_or(u64::MAX)
    }

    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut v: Vec<BorrowedFd<'_>> = self.udp.iter().map(|s| s.as_fd()).collect();
        v.extend(self.unix.iter().map(|s| s.as_fd()));
        v
    }

    /// Its counters: the core's, each host's address beside its own, and the sockets'.
    pub fn counters(&self) -> serde_json::Value {
        let s = self.core.stats();
        let mut v = serde_json::to_value(&s).unwrap_or_default();
        if let Some(hosts) = v.get_mut("hosts").and_then(|h| h.as_array_mut()) {
            for (h, a) in hosts.iter_mut().zip(&self.hosts) {
                h["addr"] = a.to_string().into();
            }
        }
        v["compensate"] = self.core.config().compensate.into();
        v["send_failed"] = self.send_failed.into();
        v["unknown_source"] = self.unknown_source.into();
        v
    }
}

/// The release point's sockets, borrowed for one batch of the core's outputs.
struct Net<'a> {
    hosts: &'a [HostAddr],
    udp: &'a Option<UdpSocket>,
    unix: &'a Option<UnixDatagram>,
    framed: bool,
}

impl Net<'_> {
    /// Sends one of the core's outputs (a data packet framed with its
    /// deadline if asked, in `scratch`); whether the send succeeded.
    fn send(&self, o: Out<'_>, scratch: &mut Vec<u8>) -> bool {
        let (host, bytes) = match &o {
            Out::Probe { host, bytes } => (*host, &bytes[..]),
            Out::Data { host, deadline_ns, payload } if self.framed => {
                framed::emit(*deadline_ns, payload, scratch);
                (*host, &scratch[..])
            }
            Out::Data { host, payload, .. } => (*host, *payload),
        };
        match (&self.hosts[host], self.udp, self.unix) {
            (HostAddr::Udp(a), Some(s), _) => s.send_to(bytes, a).is_ok(),
            (HostAddr::Unix(p), _, Some(s)) => s.send_to(bytes, p).is_ok(),
            _ => false,
        }
    }
}

/// The far side's emulated hop delay, each way: a floor plus lognormal
/// queueing (both 0: none — a real hop's own delay only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Delay {
    pub floor_ns: u64,
    /// The queueing's median, ns, and its log-space spread.
    pub median_ns: u64,
    pub sigma: f64,
}

impl Delay {
    fn sample(&self, rng: &mut impl Rng) -> u64 {
        if self.median_ns == 0 {
            return self.floor_ns;
        }
        // Box–Muller: one standard normal.
        let (u, v): (f64, f64) = (rng.gen_range(f64::MIN_POSITIVE..1.0), rng.gen());
        let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
        self.floor_ns + (self.median_ns as f64 * (self.sigma * z).exp()) as u64
    }
}

/// The most echoes a host sends per second (a spoofed flood of probes
/// cannot turn it into a reflector); the rest are dropped and counted.
pub const ECHOES_PER_S_MAX: u64 = 2_000;
/// Datagrams waiting in the emulated delay line at most; more are dropped and counted.
pub const DELAY_LINE_MAX: usize = 65_536;
/// Arrival rows a host keeps for its log at most.
pub const ARRIVAL_ROWS_MAX: usize = 10_000_000;

/// Where a host listens and what it does.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub listen: HostAddr,
    /// The one release point it takes packets from (None: any).
    pub gateway: Option<SocketAddr>,
    /// The firm's unmodified ITCH application (None: count only).
    pub deliver: Option<SocketAddr>,
    /// Emulated delay each way (see the module docs).
    pub delay: Delay,
    pub seed: u64,
    pub stop: Arc<AtomicBool>,
    /// Keep one row per arrival for the log.
    pub keep_log: bool,
    /// Stop after this long (None: when `stop` is set).
    pub max_ns: Option<u64>,
    /// Hold each framed packet to its deadline on this host's wall clock
    /// (the release point sent it early by a far quantile of the hop).
    pub hold: bool,
}

/// A firm host's counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HostStats {
    pub packets: u64,
    pub probes: u64,
    pub echoes: u64,
    pub echoes_limited: u64,
    pub delivered: u64,
    pub deliver_failed: u64,
    /// Datagrams that were neither a probe nor a MoldUDP64 packet.
    pub bad_packets: u64,
    pub from_stranger: u64,
    pub delay_line_full: u64,
    /// Packets that came with their deadline; of those, held to it, and
    /// arrived after it (delivered at once).
    pub framed: u64,
    pub held: u64,
    pub late: u64,
    pub late_max_ns: u64,
}

enum Socket {
    Udp(UdpSocket),
    Unix(UnixDatagram),
}

enum Peer {
    Udp(SocketAddr),
    Unix(UnixAddr),
}

/// A firm's host (model 2) or enclave (model 3): echoes the release
/// point's probes, hands data to the firm's application, and logs when
/// each packet arrived (after the emulated delay, if any).
pub struct FirmHost {
    cfg: HostConfig,
    sock: Socket,
    app: UdpSocket,
    /// Datagrams on their emulated way: (due, inbound?, peer, bytes).
    line: VecDeque<(u64, bool, Option<Peer>, Vec<u8>)>,
    rng: rand_chacha::ChaCha8Rng,
    stats: HostStats,
    /// (first sequence, arrival wall ns) per data packet.
    pub rows: Vec<(u64, u64)>,
    /// Packets held to their deadline: (due, packet), in arrival order.
    holding: VecDeque<(u64, Vec<u8>)>,
    bucket: (u64, u64),
    started_ns: u64,
    buf: Vec<u8>,
}

impl FirmHost {
    pub fn new(cfg: HostConfig) -> std::io::Result<FirmHost> {
        let sock = match &cfg.listen {
            HostAddr::Udp(a) => {
                let s = UdpSocket::bind(a)?;
                s.set_nonblocking(true)?;
                Socket::Udp(s)
            }
            HostAddr::Unix(p) => {
                // A stale socket file from an earlier run is ours to replace; anything else is refused by bind.
                if std::fs::symlink_metadata(p).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                {
                    std::fs::remove_file(p)?;
                }
                let s = UnixDatagram::bind(p)?;
                s.set_nonblocking(true)?;
                Socket::Unix(s)
            }
        };
        let app = UdpSocket::bind("0.0.0.0:0")?;
        let rng = rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed);
        Ok(FirmHost {
            cfg,
            sock,
            app,
            line: VecDeque::new(),
            rng,
            stats: HostStats::default(),
            rows: Vec::new(),
            holding: VecDeque::new(),
            bucket: (0, 0),
            started_ns: wall_ns(),
            buf: vec![0; DATAGRAM_MAX],
        })
    }

    /// The address it listens on (a UDP port 0 resolved).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.sock {
            Socket::Udp(s) => s.local_addr().ok(),
            Socket::Unix(_) => None,
        }
    }

    pub fn stats(&self) -> &HostStats {
        &self.stats
    }

    /// Puts a datagram on the emulated line (or handles it now, with no delay).
    fn enqueue(&mut self, now: u64, inbound: bool, peer: Option<Peer>, bytes: Vec<u8>) {
        if self.line.len() >= DELAY_LINE_MAX {
            self.stats.delay_line_full += 1;
            return;
        }
        let d = self.cfg.delay.sample(&mut self.rng);
        // A line keeps its order (a channel does not reorder): due no earlier than the one before.
        let due = (now + d).max(self.line.back().map_or(0, |l| l.0));
        self.line.push_back((due, inbound, peer, bytes));
    }

    fn read(&mut self, now: u64) -> usize {
        let mut n = 0;
        for _ in 0..READS_PER_TURN {
            let (k, peer) = match &self.sock {
                Socket::Udp(s) => match s.recv_from(&mut self.buf) {
                    Ok((k, a)) => (k, Peer::Udp(a)),
                    Err(_) => break,
                },
                Socket::Unix(s) => match s.recv_from(&mut self.buf) {
                    Ok((k, a)) => (k, Peer::Unix(a)),
                    Err(_) => break,
                },
            };
            n += 1;
            if let (Some(g), Peer::Udp(a)) = (self.cfg.gateway, &peer) {
                if *a != g {
                    self.stats.from_stranger += 1;
                    continue;
                }
            }
            let bytes = self.buf[..k].to_vec();
            self.enqueue(now, true, Some(peer), bytes);
        }
        n
    }

    /// Handles one datagram that has crossed the emulated line inbound.
    fn arrive(&mut self, now: u64, peer: Option<Peer>, bytes: Vec<u8>) {
        if probe::looks_like(&bytes) {
            self.stats.probes += 1;
            let Some(echo) = probe::echo(&bytes) else {
                self.stats.bad_packets += 1;
                return;
            };
            let second = now / 1_000_000_000;
            if self.bucket.0 != second {
                self.bucket = (second, 0);
            }
            if self.bucket.1 >= ECHOES_PER_S_MAX {
                self.stats.echoes_limited += 1;
                return;
            }
            self.bucket.1 += 1;
            // The echo crosses the line back.
            self.enqueue(now, false, peer, echo.to_vec());
            return;
        }
        let Some((deadline, packet)) = framed::parse(&bytes) else {
            self.deliver(now, &bytes);
            return;
        };
        self.stats.framed += 1;
        if now > deadline {
            self.stats.late += 1;
            self.stats.late_max_ns = self.stats.late_max_ns.max(now - deadline);
        }
        if !(self.cfg.hold && (deadline > now || !self.holding.is_empty())) {
            self.deliver(now, packet);
            return;
        }
        if self.holding.len() >= DELAY_LINE_MAX {
            self.stats.delay_line_full += 1;
            return;
        }
        self.stats.held += 1;
        // In order: never before the one held ahead of it.
        let due = deadline.max(self.holding.back().map_or(0, |h| h.0));
        self.holding.push_back((due, packet.to_vec()));
    }

    /// Hands one MoldUDP64 packet to the application (and the log).
    fn deliver(&mut self, now: u64, bytes: &[u8]) {
        let Ok(p) = Packet::new_checked(bytes) else {
            self.stats.bad_packets += 1;
            return;
        };
        self.stats.packets += 1;
        if self.cfg.keep_log && self.rows.len() < ARRIVAL_ROWS_MAX {
            self.rows.push((p.sequence(), now));
        }
        if let Some(app) = self.cfg.deliver {
            self.stats.delivered += 1;
            self.stats.deliver_failed += u64::from(self.app.send_to(bytes, app).is_err());
        }
    }

    fn send_back(&mut self, peer: Option<Peer>, bytes: &[u8]) {
        let ok = match (&self.sock, peer) {
            (Socket::Udp(s), Some(Peer::Udp(a))) => s.send_to(bytes, a).is_ok(),
            (Socket::Unix(s), Some(Peer::Unix(a))) => s.send_to_addr(bytes, &a).is_ok(),
            _ => false,
        };
        self.stats.echoes += u64::from(ok);
    }
}

impl Agent for FirmHost {
    fn role(&self) -> &'static str {
        "firm-host"
    }

    fn do_work(&mut self, now: u64, turn: Turn) -> usize {
        let mut n = if turn == Turn::All { self.read(now) } else { 0 };
        let now = if n > 0 { wall_ns() } else { now };
        while self.line.front().is_some_and(|l| l.0 <= now) {
            let Some((_, inbound, peer, bytes)) = self.line.pop_front() else { break };
            if inbound {
                self.arrive(now, peer, bytes);
            } else {
                self.send_back(peer, &bytes);
            }
            n += 1;
        }
        while self.holding.front().is_some_and(|h| h.0 <= now) {
            let Some((_, packet)) = self.holding.pop_front() else { break };
            self.deliver(wall_ns(), &packet);
            n += 1;
        }
        n
    }

    fn next_due(&self) -> u64 {
        let stop = self.cfg.max_ns.map_or(u64::MAX, |m| self.started_ns + m);
        let held = self.holding.front().map_or(u64::MAX, |h| h.0);
        self.line.front().map_or(stop, |l| l.0.min(stop)).min(held)
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![match &self.sock {
            Socket::Udp(s) => s.as_fd(),
            Socket::Unix(s) => s.as_fd(),
        }]
    }

    fn is_done(&self) -> bool {
        self.cfg.stop.load(Ordering::Relaxed) || self.cfg.max_ns.is_some_and(|m| wall_ns() >= self.started_ns + m)
    }
}

impl Drop for FirmHost {
    fn drop(&mut self) {
        if let HostAddr::Unix(p) = &self.cfg.listen {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn host(gateway: Option<SocketAddr>) -> FirmHost {
        let cfg = HostConfig {
            listen: HostAddr::Udp("127.0.0.1:0".parse().unwrap()),
            gateway,
            deliver: None,
            delay: Delay::default(),
            seed: 1,
            stop: Arc::new(AtomicBool::new(false)),
            keep_log: true,
            max_ns: None,
            hold: false,
        };
        FirmHost::new(cfg).unwrap()
    }

    /// Turns the host until `f` holds (at most 2 s).
    fn turn_until(h: &mut FirmHost, f: impl Fn(&HostStats) -> bool) {
        let t0 = std::time::Instant::now();
        while !f(h.stats()) && t0.elapsed() < Duration::from_secs(2) {
            h.do_work(wall_ns(), Turn::All);
        }
    }

    /// A flood of probes gets at most the echo budget back; junk and
    /// strangers are counted and change nothing; a real packet still arrives.
    #[test]
    fn a_host_answers_a_probe_flood_within_its_budget_and_counts_junk() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut h = host(Some(peer.local_addr().unwrap()));
        let to = h.local_addr().unwrap();
        let flood = 3 * ECHOES_PER_S_MAX;
        for n in 0..flood {
            peer.send_to(&probe::emit(probe::Kind::Probe, n), to).unwrap();
            if n % 64 == 0 {
                h.do_work(wall_ns(), Turn::All);
            }
        }
        peer.send_to(b"FFLH\x07junk-junk-junk!", to).unwrap();
        peer.send_to(b"short", to).unwrap();
        stranger.send_to(&probe::emit(probe::Kind::Probe, 1), to).unwrap();
        let mut p = vec![0u8; 20];
        p[..10].copy_from_slice(b"SESSION001");
        p[10..18].copy_from_slice(&7u64.to_be_bytes());
        peer.send_to(&p, to).unwrap();
        turn_until(&mut h, |s| s.packets == 1 && s.from_stranger == 1);
        let s = h.stats().clone();
        // All within one or two seconds' budgets.
        assert!(s.echoes <= 2 * ECHOES_PER_S_MAX && s.echoes >= ECHOES_PER_S_MAX, "{s:?}");
        assert_eq!(s.echoes + s.echoes_limited, flood, "{s:?}");
        assert_eq!(s.probes, flood + 1, "the junk that looked like a probe: {s:?}");
        assert_eq!((s.from_stranger, s.packets, s.bad_packets), (1, 1, 2), "{s:?}");
        assert_eq!(h.rows, vec![(7, h.rows[0].1)]);
    }

    /// The release point's side over a real socket: a host that echoes is
    /// measured, one that does not is sent to at the deadline.
    #[test]
    fn a_release_point_measures_an_echoing_host() {
        let mut far = host(None);
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        silent.set_nonblocking(true).unwrap();
        let lead = Arc::new(AtomicU64::new(0));
        let hosts = vec![HostAddr::Udp(far.local_addr().unwrap()), HostAddr::Udp(silent.local_addr().unwrap())];
        let cfg = LastHopConfig { probe_interval_ns: 100_000, ..LastHopConfig::default() };
        let mut out = LastHopOut::new(hosts, cfg, lead.clone(), false).unwrap();
        let t0 = std::time::Instant::now();
        while out.counters()["hosts"][0]["echoes"].as_u64() < Some(fairfeed_tree::lasthop::PROBES_MIN as u64)
            && t0.elapsed() < Duration::from_secs(5)
        {
            out.service();
            far.do_work(wall_ns(), Turn::All);
        }
        let c = out.counters();
        assert!(c["hosts"][0]["lead_ns"].as_u64().unwrap() > 0, "{c}");
        assert_eq!(c["hosts"][1]["echoes"], 0);
        assert_eq!(lead.load(Ordering::Relaxed), c["lead_max_ns"].as_u64().unwrap());
        let mut p = vec![0u8; 20];
        p[..10].copy_from_slice(b"SESSION001");
        p[10..18].copy_from_slice(&1u64.to_be_bytes());
        out.release(wall_ns(), &p);
        let mut buf = [0u8; 64];
        let t0 = std::time::Instant::now();
        let got = loop {
            out.service();
            if let Ok((k, _)) = silent.recv_from(&mut buf) {
                if !probe::looks_like(&buf[..k]) {
                    break k;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(2), "the silent host got nothing");
        };
        assert_eq!(&buf[..got], &p[..]);
        assert_eq!(out.counters()["hosts"][1]["unprobed"], 1);
    }

    #[test]
    fn host_addresses_parse_or_say_why_not() {
        let udp = |s: &str| s.parse::<SocketAddr>().map_err(|e| e.to_string());
        assert_eq!(HostAddr::parse("unix:/run/e.sock", udp), Ok(HostAddr::Unix("/run/e.sock".into())));
        assert_eq!(HostAddr::parse("127.0.0.1:9", udp), Ok(HostAddr::Udp("127.0.0.1:9".parse().unwrap())));
        assert!(HostAddr::parse("unix:", udp).unwrap_err().to_string().contains("path"));
        assert!(HostAddr::parse(&format!("unix:/{}", "a".repeat(120)), udp).is_err());
        assert!(HostAddr::parse("nowhere", udp).is_err());
    }
}
