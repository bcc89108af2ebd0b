//! The arbitrator on live UDP: one socket per line, outputs sent to UDP
//! addresses, retransmission requests to a MoldUDP64 server, and a control
//! socket that changes the window at run time.
//!
//! Single-threaded: every socket is non-blocking; when nothing is ready the
//! loop sleeps in `poll(2)` until the next packet or the arbitrator's next
//! timer, or — with `busy_poll` — spins, trading a core for latency (seed 003).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use fairfeed_arb::stats::Stats;
use fairfeed_arb::{Arbitrator, Mode, Sink, Source, Stream};
use fairfeed_tree::operator::{Access, AuthCounters, Verifier};
use fairfeed_wire::moldudp64::RequestRepr;

use super::client::RetransmitClient;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

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
    /// Publish the counters here (as `control stats` shows them) every
    /// [`PUBLISH_INTERVAL`], for a metrics endpoint on another thread.
    pub publish: Option<JsonSlot>,
    /// Set from outside (a signal handler) to stop the loop; it then reports as at the end.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

pub use crate::publish::{publish, JsonSlot, PUBLISH_INTERVAL};

pub use crate::idle::IdleStrategy;
use crate::idle::{Idler, Wait};

pub use fairfeed_io::socket::bind_udp;

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

/// Runs until the session ends (with `exit_on_end`) or `max_seconds` pass;
/// returns the final counters and the number of failed sends.
pub fn run_live(
    mut arb: Arbitrator,
    cfg: &LiveConfig,
    mut on_stats: impl FnMut(&Stats),
) -> std::io::Result<(Stats, u64)> {
    assert!(!cfg.lines.is_empty(), "at least one line");
    let lines: Vec<UdpSocket> =
        cfg.lines.iter().map(|a| bind_udp(*a, LINE_RECV_BUFFER_BYTES)).collect::<Result<_, _>>()?;
    let out = UdpSocket::bind("0.0.0.0:0")?;
    let retrans = cfg.retransmit.map(RetransmitClient::new).transpose()?;
    let (ctl, mut side) = ControlSide::bind(cfg)?;
    for (l, s) in lines.iter().enumerate() {
        if let Ok(a) = s.local_addr() {
            tracing::info!(line = l, addr = %a, "arb: line {} on {a}", char::from(b'A' + (l as u8).min(25)));
        }
    }
    if let Some(a) = ctl.as_ref().and_then(|c| c.local_addr().ok()) {
        tracing::info!(control = %a, "arb: control socket at {a} (`fairfeed control {a} stats`)");
    }
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let mut sink = UdpSink { out: &out, retrans: retrans.as_ref(), cfg, send_errors: 0 };
    let mut buf = vec![0u8; DATAGRAM_MAX];
    let mut next_stats = cfg.stats_interval.map(|d| d.as_nanos() as u64);
    let mut next_publish = 0;
    let mut idler = Idler::new(cfg.idle);
    loop {
        let mut got = 0;
        for (l, s) in lines.iter().enumerate() {
            for _ in 0..RECV_BATCH_MAX {
                let Ok(n) = s.recv(&mut buf) else { break };
                arb.handle_packet(now(), Source::Line(l), &buf[..n], &mut sink);
                got += 1;
            }
        }
        if let Some(r) = &retrans {
            while let Some(n) = r.recv(&mut buf) {
                arb.handle_packet(now(), Source::Retransmit, &buf[..n], &mut sink);
                got += 1;
            }
        }
        if let Some(c) = &ctl {
            if let Ok((n, from)) = c.recv_from(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n.min(CONTROL_REQUEST_MAX)]).into_owned();
                if let Some(reply) = side.handle(&mut arb, now(), &text, from, &mut sink) {
                    let _ = c.send_to(&reply, from);
                }
            }
        }
        let t = now();
        if arb.next_timeout().is_some_and(|d| d <= t) {
            arb.handle_timeout(t, &mut sink);
        }
        if let Some(slot) = cfg.publish.as_ref().filter(|_| t >= next_publish) {
            next_publish = t + PUBLISH_INTERVAL.as_nanos() as u64;
            publish(slot, &stats_json(arb.stats_now(t), &side.verifier.counters));
        }
        if let Some(ns) = next_stats {
            if t >= ns {
                on_stats(arb.stats_now(t));
                next_stats = cfg.stats_interval.map(|d| t + d.as_nanos() as u64);
            }
        }
        let stopped = cfg.stop.as_ref().is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
        if stopped || (cfg.exit_on_end && arb.drained()) || cfg.max_seconds.is_some_and(|m| t as f64 / 1e9 >= m) {
            break;
        }
        if got > 0 {
            idler.busy();
            continue;
        }
        match idler.wait(t) {
            Wait::Spin => {
                std::hint::spin_loop();
                continue;
            }
            Wait::Yield => {
                std::thread::yield_now();
                continue;
            }
            Wait::Park => {}
        }
        // Nothing ready: sleep until a packet or the next timer (at most 10 ms).
        let wait_ns = arb.next_timeout().map_or(10_000_000, |d| d.saturating_sub(now())).min(10_000_000);
        if wait_ns < 1_000_000 {
            std::hint::spin_loop();
            continue;
        }
        let mut fds: Vec<PollFd> = lines.iter().map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN)).collect();
        if let Some(r) = &retrans {
            fds.push(PollFd::new(r.fd(), PollFlags::POLLIN));
        }
        if let Some(c) = &ctl {
            fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
        }
        let ms = u16::try_from(wait_ns / 1_000_000).unwrap_or(10);
        let _ = poll(&mut fds, PollTimeout::from(ms));
    }
    let t = now();
    arb.handle_timeout(t, &mut sink);
    Ok((arb.stats_now(t).clone(), sink.send_errors))
}

/// Serves MoldUDP64 retransmission requests on `listen` from `server`'s
/// journal until `max_seconds` pass (or forever).
pub fn run_retransmit_server(
    server: &mut fairfeed_arb::retransmit::RetransmitServer,
    listen: SocketAddr,
    max_seconds: Option<f64>,
    stop: &std::sync::atomic::AtomicBool,
    publish_to: Option<&JsonSlot>,
) -> std::io::Result<()> {
    let sock = bind_udp(listen, 1 << 20)?;
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let start = Instant::now();
    let mut buf = [0u8; 2048];
    let mut out = vec![0u8; fairfeed_wire::moldudp64::PACKET_LEN_DEFAULT_MAX];
    let mut next_publish = Duration::ZERO;
    while max_seconds.is_none_or(|m| start.elapsed().as_secs_f64() < m)
        && !stop.load(std::sync::atomic::Ordering::Relaxed)
    {
        if let Some(slot) = publish_to.filter(|_| start.elapsed() >= next_publish) {
            next_publish = start.elapsed() + PUBLISH_INTERVAL;
            publish(slot, &server.stats());
        }
        let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
        let now = start.elapsed().as_nanos() as u64;
        if let Some(len) = server.handle_request(now, from, &buf[..n], &mut out) {
            let _ = sock.send_to(&out[..len], from);
        }
    }
    Ok(())
}
