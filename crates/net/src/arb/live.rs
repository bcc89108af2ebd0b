//! The arbitrator on live UDP: one socket per line, outputs sent to UDP
//! addresses, retransmission requests to a MoldUDP64 server, and a control
//! socket that changes the window at run time.
//!
//! One agent ([`ArbAgent`], on `fairfeed_io::agent`'s runner): every socket
//! is non-blocking; when nothing is ready the runner parks in `ppoll(2)`
//! until the next packet or the arbitrator's next timer, or — with a
//! spinning idle strategy — spins, trading a core for latency (seed 003).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use fairfeed_arb::stats::Stats;
use fairfeed_arb::{Arbitrator, Mode, Sink, Source, Stream};
use fairfeed_tree::operator::{Access, AuthCounters, Verifier};
use fairfeed_wire::moldudp64::RequestRepr;

use super::client::RetransmitClient;
use fairfeed_io::agent::{Agent, RunConfig, Turn};

/// Receive buffer asked for on each line socket: absorbs bursts while the loop is busy.
pub const LINE_RECV_BUFFER_BYTES: usize = 8 << 20;
/// Datagrams read from one socket per loop turn at most, so one busy line
/// cannot starve the others or the timers.
pub const RECV_BATCH_MAX: usize = 64;
/// Largest datagram accepted.
const DATAGRAM_MAX: usize = 65_536;
/// A control request's bytes read at most (the rest is ignored).
const CONTROL_REQUEST_MAX: usize = 512;

/// Where the live arbitrator listens and sends.
#[derive(Debug, Clone, Default)]
pub struct LiveConfig {
    pub lines: Vec<SocketAddr>,
    pub out_ll: Option<SocketAddr>,
    pub out_hr: Option<SocketAddr>,
    pub out_side: Option<SocketAddr>,
    pub retransmit: Option<SocketAddr>,
    pub control: Option<SocketAddr>,
    /// The operator key: window changes on the control socket are obeyed
    /// only sealed under it; `stats` is answered to loopback or sealed.
    pub operator: Option<fairfeed_tree::operator::OperatorKey>,
    /// Stop once the session ended and the high-reliability output drained.
    pub exit_on_end: bool,
    pub max_seconds: Option<f64>,
    pub idle: IdleStrategy,
    /// Call `on_stats` this often.
    pub stats_interval: Option<Duration>,
    /// Post the counters (as `control stats` shows them) to this board, as
    /// [`ARB_PART`], every [`fairfeed_io::counters::PUBLISH_INTERVAL`], for a
    /// metrics endpoint on another thread.
    pub publish: Option<Arc<Board>>,
    /// Set from outside (a signal handler) to stop the loop; it then reports as at the end.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// The arbitrator's part on its counters board.
pub const ARB_PART: &str = "arb";
/// The retransmission server's part on its counters board.
pub const RETRANSMIT_PART: &str = "retransmit-server";

use fairfeed_io::counters::{Board, Poster};
use std::sync::Arc;

use crate::idle::IdleStrategy;
use fairfeed_io::socket::bind_udp;

struct UdpSink<'a> {
    out: &'a UdpSocket,
    retrans: Option<&'a RetransmitClient>,
    cfg: &'a LiveConfig,
    send_errors: u64,
}

impl Sink for UdpSink<'_> {
    fn emit(&mut self, stream: Stream, packet: &[u8]) {
        let to = match stream {
            Stream::LowLatency => self.cfg.out_ll,
            Stream::HighReliability => self.cfg.out_hr,
            Stream::Side(_) => self.cfg.out_side,
        };
        if let Some(to) = to {
            if self.out.send_to(packet, to).is_err() {
                self.send_errors += 1;
            }
        }
    }
    fn request(&mut self, r: RequestRepr) {
        if let Some(c) = self.retrans {
            if !c.request(r) {
                self.send_errors += 1;
            }
        }
    }
}

/// What an arbitrator's control command does: `stats` (and unknown
/// commands, answered "error") only read; everything else changes the window.
fn access(cmd: &str) -> Access {
    match cmd.split_whitespace().next() {
        Some("mode" | "max-hold-us" | "max-count") => Access::Change,
        _ => Access::Read,
    }
}

/// Control answers that are refusals, per second at most (the rest are counted, not answered).
pub const REFUSALS_PER_S: u64 = 100;

/// The control socket's state: the operator-key check and the refusal budget.
struct ControlSide {
    verifier: Verifier,
    /// Refusals answered in the current second: (second, count).
    refusals: (u64, u64),
}

impl ControlSide {
    /// The control socket `cfg` asks for (beyond loopback only with an operator key), and its state.
    fn bind(cfg: &LiveConfig) -> std::io::Result<(Option<UdpSocket>, ControlSide)> {
        if let Some(a) = cfg.control {
            fairfeed_tree::operator::check_bind(a, cfg.operator.is_some())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
        }
        let ctl = cfg.control.map(|a| bind_udp(a, 1 << 16)).transpose()?;
        let local = ctl.as_ref().and_then(|c| c.local_addr().ok());
        Ok((ctl, ControlSide { verifier: Verifier::new(cfg.operator.clone(), local), refusals: (0, 0) }))
    }

    /// The reply to one datagram `text` from `from` (none: refused beyond the budget).
    fn handle(
        &mut self,
        arb: &mut Arbitrator,
        now: u64,
        text: &str,
        from: SocketAddr,
        sink: &mut UdpSink<'_>,
    ) -> Option<Vec<u8>> {
        match self.verifier.admit(fairfeed_io::clock::wall_ns(), text, from.ip(), access) {
            Ok(a) => {
                let body = control(arb, now, a.command, sink, &self.verifier.counters);
                Some(self.verifier.answer(a.sealed, body.as_bytes()))
            }
            Err(e) => {
                tracing::debug!(%from, "arb control: refused: {e}");
                let second = now / 1_000_000_000;
                if self.refusals.0 != second {
                    self.refusals = (second, 0);
                }
                self.refusals.1 += 1;
                let why = format!("error: refused: {e}");
                // Beyond loopback never more bytes than the request carried (no reflection).
                let mut n = if from.ip().is_loopback() { why.len() } else { why.len().min(text.len()) };
                while !why.is_char_boundary(n) {
                    n -= 1;
                }
                (self.refusals.1 <= REFUSALS_PER_S).then(|| why.as_bytes()[..n].to_vec())
            }
        }
    }
}

/// The counters as `stats` shows them: the arbitrator's and the control socket's.
fn stats_json(stats: &Stats, auth: &AuthCounters) -> serde_json::Value {
    let mut v = serde_json::to_value(stats).unwrap_or_default();
    v["control_auth"] = serde_json::to_value(auth).unwrap_or_default();
    v
}

/// Applies one admitted control command; returns the reply.
fn control(arb: &mut Arbitrator, now: u64, cmd: &str, sink: &mut UdpSink<'_>, auth: &AuthCounters) -> String {
    let mut w = arb.window();
    let mut it = cmd.split_whitespace();
    let (Some(verb), arg) = (it.next(), it.next()) else { return "error: empty command".into() };
    let num = || arg.and_then(|a| a.parse::<u64>().ok());
    match (verb, arg) {
        ("stats", _) => return stats_json(arb.stats_now(now), auth).to_string(),
        ("mode", Some("time")) => w.mode = Mode::Time,
        ("mode", Some("count")) => w.mode = Mode::Count,
        ("mode", Some("time-count")) => w.mode = Mode::TimeCount,
        ("max-hold-us", _) if num().is_some() => w.max_hold_ns = num().unwrap_or(0).saturating_mul(1000),
        ("max-count", _) if num().is_some() => w.max_count_msgs = num().unwrap_or(0),
        _ => {
            let cmd: String = cmd.chars().take(32).collect();
            return format!(
                "error: unknown command {cmd:?} (try: stats | mode time|count|time-count | max-hold-us N | max-count N)"
            );
        }
    }
    tracing::warn!("arb control: window now {w:?} (sealed under the operator key)");
    arb.set_window(now, w, sink);
    format!("ok {}", serde_json::to_string(&w).unwrap_or_default())
}

/// The live arbitrator as an agent (`fairfeed_io::agent`): its line
/// sockets, the retransmission client and the control socket are its
/// descriptors; the arbitrator's next timeout, the counters' publication
/// and `on_stats` its timers. The arbitrator runs on a monotonic clock from
/// the agent's start.
pub struct ArbAgent<'c, F: FnMut(&Stats)> {
    arb: Arbitrator,
    cfg: &'c LiveConfig,
    lines: Vec<UdpSocket>,
    out: UdpSocket,
    retrans: Option<RetransmitClient>,
    ctl: Option<UdpSocket>,
    side: ControlSide,
    start: Instant,
    /// Wall time at `start` (the runner's timers are wall times).
    start_wall: u64,
    buf: Vec<u8>,
    next_stats: Option<u64>,
    poster: Option<Poster>,
    send_errors: u64,
    on_stats: F,
    done: bool,
}

impl<'c, F: FnMut(&Stats)> ArbAgent<'c, F> {
    /// Binds every socket `cfg` names.
    pub fn new(arb: Arbitrator, cfg: &'c LiveConfig, on_stats: F) -> std::io::Result<Self> {
        assert!(!cfg.lines.is_empty(), "at least one line");
        let lines: Vec<UdpSocket> =
            cfg.lines.iter().map(|a| bind_udp(*a, LINE_RECV_BUFFER_BYTES)).collect::<Result<_, _>>()?;
        let out = UdpSocket::bind("0.0.0.0:0")?;
        let retrans = cfg.retransmit.map(RetransmitClient::new).transpose()?;
        let (ctl, side) = ControlSide::bind(cfg)?;
        for (l, s) in lines.iter().enumerate() {
            if let Ok(a) = s.local_addr() {
                tracing::info!(line = l, addr = %a, "arb: line {} on {a}", char::from(b'A' + (l as u8).min(25)));
            }
        }
        if let Some(a) = ctl.as_ref().and_then(|c| c.local_addr().ok()) {
            tracing::info!(control = %a, "arb: control socket at {a} (`fairfeed control {a} stats`)");
        }
        Ok(ArbAgent {
            arb,
            cfg,
            lines,
            out,
            retrans,
            ctl,
            side,
            start: Instant::now(),
            start_wall: fairfeed_io::clock::wall_ns(),
            buf: vec![0u8; DATAGRAM_MAX],
            next_stats: cfg.stats_interval.map(|d| d.as_nanos() as u64),
            poster: cfg.publish.as_ref().map(|b| b.poster(ARB_PART)).transpose().map_err(std::io::Error::other)?,
            send_errors: 0,
            on_stats,
            done: false,
        })
    }

    /// The arbitrator's clock.
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Flushes what the window still holds; the final counters and the failed sends.
    pub fn finish(mut self) -> (Stats, u64) {
        let t = self.now();
        let mut sink = UdpSink { out: &self.out, retrans: self.retrans.as_ref(), cfg: self.cfg, send_errors: 0 };
        self.arb.handle_timeout(t, &mut sink);
        let errors = self.send_errors + sink.send_errors;
        (self.arb.stats_now(t).clone(), errors)
    }
}

impl<F: FnMut(&Stats)> Agent for ArbAgent<'_, F> {
    fn role(&self) -> &'static str {
        "arbitrator"
    }

    fn do_work(&mut self, _wall: u64, turn: Turn) -> usize {
        let now = self.now();
        // The sink borrows the sockets it sends on; the fields below are the others.
        let mut sink = UdpSink { out: &self.out, retrans: self.retrans.as_ref(), cfg: self.cfg, send_errors: 0 };
        let mut work = 0;
        if turn == Turn::All {
            for (l, s) in self.lines.iter().enumerate() {
                for _ in 0..RECV_BATCH_MAX {
                    let Ok(n) = s.recv(&mut self.buf) else { break };
                    self.arb.handle_packet(now, Source::Line(l), &self.buf[..n], &mut sink);
                    work += 1;
                }
            }
            if let Some(r) = &self.retrans {
                while let Some(n) = r.recv(&mut self.buf) {
                    self.arb.handle_packet(now, Source::Retransmit, &self.buf[..n], &mut sink);
                    work += 1;
                }
            }
            if let Some(c) = &self.ctl {
                if let Ok((n, from)) = c.recv_from(&mut self.buf) {
                    let text = String::from_utf8_lossy(&self.buf[..n.min(CONTROL_REQUEST_MAX)]).into_owned();
                    if let Some(reply) = self.side.handle(&mut self.arb, now, &text, from, &mut sink) {
                        let _ = c.send_to(&reply, from);
                    }
                    work += 1;
                }
            }
        }
        let t = self.start.elapsed().as_nanos() as u64;
        if self.arb.next_timeout().is_some_and(|d| d <= t) {
            self.arb.handle_timeout(t, &mut sink);
            work += 1;
        }
        self.send_errors += sink.send_errors;
        if let Some(p) = self.poster.as_mut().and_then(|p| p.due(t).then_some(p)) {
            p.post(stats_json(self.arb.stats_now(t), &self.side.verifier.counters), Vec::new());
        }
        if self.next_stats.is_some_and(|ns| t >= ns) {
            (self.on_stats)(self.arb.stats_now(t));
            self.next_stats = self.cfg.stats_interval.map(|d| t + d.as_nanos() as u64);
        }
        self.done =
            (self.cfg.exit_on_end && self.arb.drained()) || self.cfg.max_seconds.is_some_and(|m| t as f64 / 1e9 >= m);
        work
    }

    fn next_due(&self) -> u64 {
        let publish = self.poster.as_ref().map_or(u64::MAX, Poster::next_ns);
        let end = self.cfg.max_seconds.map_or(u64::MAX, |m| (m * 1e9) as u64);
        let due =
            self.arb.next_timeout().unwrap_or(u64::MAX).min(publish).min(self.next_stats.unwrap_or(u64::MAX)).min(end);
        // On the arbitrator's clock; the runner's is the wall clock.
        if due == u64::MAX {
            u64::MAX
        } else {
            self.start_wall.saturating_add(due)
        }
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds: Vec<BorrowedFd<'_>> = self.lines.iter().map(|s| s.as_fd()).collect();
        fds.extend(self.retrans.as_ref().map(RetransmitClient::fd));
        fds.extend(self.ctl.as_ref().map(|c| c.as_fd()));
        fds
    }

    fn is_done(&self) -> bool {
        self.done
    }
}

/// Runs until the session ends (with `exit_on_end`) or `max_seconds` pass;
/// returns the final counters and the number of failed sends.
pub fn run_live(arb: Arbitrator, cfg: &LiveConfig, on_stats: impl FnMut(&Stats)) -> std::io::Result<(Stats, u64)> {
    let mut a = ArbAgent::new(arb, cfg, on_stats)?;
    let run = RunConfig { idle: cfg.idle, stop: cfg.stop.clone(), ..RunConfig::default() };
    fairfeed_io::agent::run(&mut [&mut a], &run)?;
    Ok(a.finish())
}

/// A MoldUDP64 retransmission server as an agent: its socket, and the
/// counters' publication as its timer.
pub struct RetransmitAgent<'s> {
    server: &'s mut fairfeed_arb::retransmit::RetransmitServer,
    sock: UdpSocket,
    start: Instant,
    max_ns: Option<u64>,
    poster: Option<Poster>,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl<'s> RetransmitAgent<'s> {
    pub fn new(
        server: &'s mut fairfeed_arb::retransmit::RetransmitServer,
        listen: SocketAddr,
        max_seconds: Option<f64>,
        publish_to: Option<&Arc<Board>>,
    ) -> std::io::Result<Self> {
        Ok(RetransmitAgent {
            server,
            sock: bind_udp(listen, 1 << 20)?,
            start: Instant::now(),
            max_ns: max_seconds.map(|m| (m * 1e9) as u64),
            poster: publish_to.map(|b| b.poster(RETRANSMIT_PART)).transpose().map_err(std::io::Error::other)?,
            buf: vec![0u8; 2048],
            out: vec![0u8; fairfeed_wire::moldudp64::PACKET_LEN_DEFAULT_MAX],
        })
    }
}

impl Agent for RetransmitAgent<'_> {
    fn role(&self) -> &'static str {
        "retransmit-server"
    }

    fn do_work(&mut self, wall: u64, turn: Turn) -> usize {
        let mut work = 0;
        if turn == Turn::All {
            for _ in 0..RECV_BATCH_MAX {
                let Ok((n, from)) = self.sock.recv_from(&mut self.buf) else { break };
                let now = self.start.elapsed().as_nanos() as u64;
                if let Some(len) = self.server.handle_request(now, from, &self.buf[..n], &mut self.out) {
                    let _ = self.sock.send_to(&self.out[..len], from);
                }
                work += 1;
            }
        }
        if let Some(p) = self.poster.as_mut().and_then(|p| p.due(wall).then_some(p)) {
            p.post(serde_json::to_value(self.server.stats()).unwrap_or_default(), Vec::new());
        }
        work
    }

    fn next_due(&self) -> u64 {
        let end = self.max_ns.map_or(u64::MAX, |m| {
            fairfeed_io::clock::wall_ns().saturating_add(m.saturating_sub(self.start.elapsed().as_nanos() as u64))
        });
        end.min(self.poster.as_ref().map_or(u64::MAX, Poster::next_ns))
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.sock.as_fd()]
    }

    fn is_done(&self) -> bool {
        self.max_ns.is_some_and(|m| self.start.elapsed().as_nanos() as u64 >= m)
    }
}

/// Serves MoldUDP64 retransmission requests on `listen` from `server`'s
/// journal until `max_seconds` pass, or `stop` is set (or forever).
pub fn run_retransmit_server(
    server: &mut fairfeed_arb::retransmit::RetransmitServer,
    listen: SocketAddr,
    max_seconds: Option<f64>,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    publish_to: Option<&Arc<Board>>,
) -> std::io::Result<()> {
    let mut a = RetransmitAgent::new(server, listen, max_seconds, publish_to)?;
    let run = RunConfig { idle: IdleStrategy::Park, stop: Some(stop.clone()), ..RunConfig::default() };
    fairfeed_io::agent::run(&mut [&mut a], &run)?;
    Ok(())
}
