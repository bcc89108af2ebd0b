//! The gateway agent: the listener and every session (SoupBinTCP / OUCH in
//! and out), the order in which commands reach matching (fifo, DBO, batch),
//! the cheat watch, and — run to completion — the engines and the publisher
//! themselves.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use fairfeed_exchange::engine::Command;
use fairfeed_exchange::gateway::{Close, Conn, Gateway};
use fairfeed_exchange::ordering::{OrderingBuffer, OrderingMode, OrderingStats};
use fairfeed_exchange::sequencer::{OrderStamps, Sequencer, SequencerStats};
use fairfeed_io::agent::{Agent, Turn};
use fairfeed_io::clock::wall_ns;
use fairfeed_io::mailbox::Incoming;
use hdrhistogram::Histogram;

use super::super::watch::{tcp_min_rtt_ns, CheatWatch};
use super::{
    hist, ns, Board, Cmd, ExchangeConfig, GatewayPart, InBatch, Inline, Matching, OrderingKind, Out, Part, Poster,
    CLOSE_DRAIN_NS, CONNECTIONS_MAX, GATEWAY_PART, LOGIN_FAILURES_PER_S_MAX, LOGIN_FAILURE_ADDRESSES_MAX, ORDER_HIST,
    PRELOGIN_PER_ADDRESS_MAX, PRELOGIN_READ_MAX, PUBLISH_NS,
};

/// The gateway agent over `listener` with `matching` behind it, and where
/// its cheat watch takes deadline records (`deadlines_listen`, bound).
pub(super) fn agent(
    cfg: &ExchangeConfig,
    listener: TcpListener,
    matching: Matching,
    start: Instant,
    metrics: Option<Arc<Board>>,
) -> std::io::Result<(GatewayAgent, Option<SocketAddr>)> {
    let rd = Readiness::new()?;
    rd.watch(&listener, EP_LISTENER)?;
    match &matching {
        Matching::Threaded { to_gw, .. } => {
            for r in to_gw {
                rd.watch(r.fd(), EP_WAKE)?;
            }
        }
        Matching::Inline(m) => {
            if let Some(r) = &m.publisher.retrans {
                rd.watch(r, EP_RETRANS)?;
            }
        }
    }
    let watch = Watch::start(cfg, &rd)?;
    let deadlines_addr = watch.as_ref().map(|w| w.sock.local_addr()).transpose()?;
    let g = GatewayLoop {
        watch,
        listener,
        rd,
        gw: Gateway::new(cfg.gateway.clone()),
        matching,
        order: Orderer::new(cfg),
        engines: cfg.engines,
        out_max: cfg.out_buffer_max_bytes,
        login_failures: std::collections::HashMap::new(),
        start,
        poster: metrics.map(|b| b.poster(GATEWAY_PART)).transpose().map_err(std::io::Error::other)?,
        by_user: Vec::new(),
        listener_resume_ns: 0,
        due: Vec::new(),
        batch: Vec::new(),
        pushed: 0,
    };
    Ok((GatewayAgent::new(g), deadlines_addr))
}

struct Session {
    sock: TcpStream,
    peer: std::net::IpAddr,
    conn: Conn,
    /// Bytes for the client; `out[out_at..]` not yet written.
    out: Vec<u8>,
    out_at: usize,
    /// Its socket was full: not written again before this (ns since start),
    /// after a wait that doubles while it stays full.
    write_blocked_until: u64,
    write_backoff_ns: u64,
    /// Since when it is closing (it drains what it was sent, for at most `CLOSE_DRAIN_NS`).
    closing: Option<u64>,
}

impl Session {
    fn unsent(&self) -> usize {
        self.out.len() - self.out_at
    }

    fn close(&mut self, now: u64) {
        self.closing.get_or_insert(now);
    }
}

/// `epoll` data of the listener, the wake-up eventfd and the retransmission
/// socket (sessions are their slot index).
const EP_LISTENER: u64 = u64::MAX;
const EP_WAKE: u64 = u64::MAX - 1;
const EP_RETRANS: u64 = u64::MAX - 2;
const EP_DEADLINES: u64 = u64::MAX - 3;
/// Readiness events taken per look.
const EP_EVENTS: usize = 512;

/// Which sockets have input: one `epoll` set over the listener, every
/// session, the wake-up and (run to completion) the retransmission socket,
/// so a pass reads only the sessions that sent something — 300 idle
/// connections used to cost 300 `read` calls a pass.
struct Readiness {
    epoll: nix::sys::epoll::Epoll,
    events: Vec<nix::sys::epoll::EpollEvent>,
    /// Slots with input (set by a look, cleared by the read).
    ready: Vec<bool>,
    listener: bool,
    /// The deadline-records socket has input.
    deadlines: bool,
}

impl Readiness {
    fn new() -> std::io::Result<Self> {
        let epoll = nix::sys::epoll::Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC)?;
        Ok(Readiness {
            epoll,
            events: vec![nix::sys::epoll::EpollEvent::empty(); EP_EVENTS],
            ready: Vec::new(),
            listener: true,
            deadlines: false,
        })
    }

    fn watch(&self, fd: impl std::os::fd::AsFd, data: u64) -> std::io::Result<()> {
        use nix::sys::epoll::{EpollEvent, EpollFlags};
        Ok(self.epoll.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, data))?)
    }

    /// Watches the listener for connections again, or stops (`on` false):
    /// a connection it cannot accept keeps it ready, which would wake every look.
    fn watch_listener(&mut self, listener: &TcpListener, on: bool) {
        use nix::sys::epoll::{EpollEvent, EpollFlags};
        let flags = if on { EpollFlags::EPOLLIN } else { EpollFlags::empty() };
        let _ = self.epoll.modify(listener, &mut EpollEvent::new(flags, EP_LISTENER));
        self.listener = on;
    }

    /// Notes what has input, waiting up to `timeout_ms` for something.
    fn look(&mut self, timeout_ms: u16) {
        let t = nix::sys::epoll::EpollTimeout::from(timeout_ms);
        let Ok(n) = self.epoll.wait(&mut self.events, t) else { return };
        for e in &self.events[..n] {
            match e.data() {
                EP_LISTENER => self.listener = true,
                EP_DEADLINES => self.deadlines = true,
                EP_WAKE | EP_RETRANS => {}
                i => {
                    let i = i as usize;
                    if i >= self.ready.len() {
                        self.ready.resize(i + 1, false);
                    }
                    self.ready[i] = true;
                }
            }
        }
    }
}

struct GatewayLoop {
    listener: TcpListener,
    rd: Readiness,
    gw: Gateway,
    matching: Matching,
    order: Orderer,
    engines: usize,
    /// Bytes queued for one client at most.
    out_max: usize,
    /// Per address: (start of its current one-second window, failed logins in it).
    login_failures: std::collections::HashMap<std::net::IpAddr, (u64, u32)>,
    start: Instant,
    /// Its part on the exchange's counters board.
    poster: Option<Poster>,
    /// Session slot of each logged-in user, rebuilt per batch of responses.
    by_user: Vec<usize>,
    /// After a failed `accept`, when the listener is watched again (ns since
    /// `start`; 0: it is watched).
    listener_resume_ns: u64,
    /// The cheat watch and its deadline-records socket (`deadlines_listen`).
    watch: Option<Watch>,
    /// Commands the orderer released (with their batch), reused.
    due: Vec<(Command, Option<u64>)>,
    /// One batch's commands for one engine, reused.
    batch: Vec<Command>,
    /// Engine shards pushed to this turn (bit per shard): only they are
    /// woken — waking a parked engine with nothing for it costs it a turn.
    pushed: u16,
}

/// The live side of the cheat watch.
struct Watch {
    watch: Box<CheatWatch>,
    sock: UdpSocket,
    /// When the sessions' round trips were last read (ns since start).
    last_rtt_ns: u64,
}

/// How often each session's TCP minimum round trip is read for the cheat watch.
const WATCH_RTT_EVERY_NS: u64 = 100_000_000;
/// Deadline datagrams read per pass at most (the rest wait for the next).
const WATCH_READS_PER_PASS: usize = 256;

impl Watch {
    fn start(cfg: &ExchangeConfig, rd: &Readiness) -> std::io::Result<Option<Watch>> {
        let Some(addr) = cfg.deadlines_listen else { return Ok(None) };
        let key = cfg.operator_key.clone().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "deadlines_listen needs the operator key")
        })?;
        let sock = fairfeed_io::socket::bind_udp(addr, 4 << 20)?;
        rd.watch(&sock, EP_DEADLINES)?;
        let users = cfg.gateway.users.iter().map(|u| u.0.clone()).collect();
        Ok(Some(Watch { watch: Box::new(CheatWatch::new(key, users)), sock, last_rtt_ns: 0 }))
    }

    /// Takes the deadline records waiting (when the socket said so).
    fn read(&mut self, ready: &mut bool, buf: &mut [u8]) -> bool {
        if !std::mem::take(ready) {
            return false;
        }
        for _ in 0..WATCH_READS_PER_PASS {
            match self.sock.recv(buf) {
                Ok(n) => self.watch.on_datagram(&buf[..n]),
                Err(_) => return true,
            }
        }
        // More may wait: look again next pass.
        *ready = true;
        true
    }

    /// Every logged-in session's TCP minimum round trip, now and then.
    fn sample_paths(&mut self, sessions: &[Option<Session>], now: u64) {
        if now < self.last_rtt_ns + WATCH_RTT_EVERY_NS {
            return;
        }
        self.last_rtt_ns = now;
        for s in sessions.iter().flatten().filter(|s| s.closing.is_none()) {
            if let (Some(u), Some(rtt)) = (s.conn.user, tcp_min_rtt_ns(s.sock.as_fd())) {
                self.watch.on_rtt(u as usize, rtt);
            }
        }
    }
}

/// The order commands reach matching in (config `ordering`).
enum Orderer {
    /// FIFO; with a window, client-timestamp order within it (CloudEx).
    Window(Sequencer),
    /// DBO (by delivery clock, each order held at most the bound) or batch
    /// (every order of one interval together, cleared in one call auction).
    Buffer(Box<OrderingBuffer<Command>>),
}

impl Orderer {
    fn new(cfg: &ExchangeConfig) -> Self {
        let firms = cfg.gateway.users.len();
        match cfg.ordering {
            OrderingKind::Dbo => {
                Orderer::Buffer(Box::new(OrderingBuffer::new(OrderingMode::Dbo { bound_ns: cfg.dbo_bound_ns }, firms)))
            }
            OrderingKind::Batch => Orderer::Buffer(Box::new(OrderingBuffer::new(
                OrderingMode::Batch { interval_ns: cfg.batch_us * 1_000 },
                firms,
            ))),
            OrderingKind::Fifo => Orderer::Window(Sequencer::new(cfg.sequencing_window_ns)),
        }
    }

    /// A command arrived at `now`: returned if it goes to matching at once.
    fn take(&mut self, c: Command, st: OrderStamps, now: u64) -> Option<Command> {
        match self {
            Orderer::Window(s) if s.window_ns() == 0 => Some(c),
            Orderer::Window(s) => {
                s.push(c, st.client_ns, now);
                None
            }
            Orderer::Buffer(b) => {
                let firm = match c {
                    Command::New(o) => o.client,
                    Command::Cancel { client, .. } | Command::Replace { client, .. } => client,
                };
                // The gateway's clients are its users, fewer than the buffer's firms (checked in the config).
                let firm = u16::try_from(firm).unwrap_or(u16::MAX);
                b.handle_order(now, firm, st.clock, c).err().map(|(c, _)| c)
            }
        }
    }

    /// Whether anything is held.
    fn holds(&self) -> bool {
        match self {
            Orderer::Window(s) => !s.is_empty(),
            Orderer::Buffer(b) => b.held() > 0,
        }
    }

    /// What is due at `now`, into `out`, each with its batch (batch ordering).
    fn due(&mut self, now: u64, out: &mut Vec<(Command, Option<u64>)>) {
        match self {
            Orderer::Window(s) => out.extend(std::iter::from_fn(|| s.pop_due(now)).map(|c| (c, None))),
            Orderer::Buffer(b) => {
                b.handle_timeout(now);
                out.extend(std::iter::from_fn(|| b.poll_release()).map(|r| (r.item, r.batch)));
            }
        }
    }

    fn stats(&self) -> (SequencerStats, OrderingStats) {
        match self {
            Orderer::Window(s) => (s.stats, OrderingStats::default()),
            Orderer::Buffer(b) => (SequencerStats::default(), b.stats),
        }
    }
}

/// How long the listener is left alone after a failed `accept` (out of file
/// descriptors, say): its pending connection keeps it ready, and accepting
/// again at once would spin the thread that serves every session.
pub const ACCEPT_RETRY_NS: u64 = 50_000_000;

/// Takes the connections waiting on the listener: each into a free slot —
/// with every slot taken, the oldest connection not logged in is closed to
/// make room (counted `prelogin_evicted`) — unless its address already holds
/// `PRELOGIN_PER_ADDRESS_MAX` connections that have not logged in, or every
/// slot holds a logged-in session (refused, counted). Returns whether any came.
fn accept(g: &mut GatewayLoop, sessions: &mut Vec<Option<Session>>) -> bool {
    if g.listener_resume_ns != 0 && ns(g.start) >= g.listener_resume_ns {
        g.listener_resume_ns = 0;
        g.rd.watch_listener(&g.listener, true);
    }
    if !std::mem::take(&mut g.rd.listener) {
        return false;
    }
    let mut any = false;
    loop {
        let (sock, from) = match g.listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // This connection went away before it was taken, or a signal: the next may do.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted) => {
                continue
            }
            Err(_) => {
                g.gw.stats.accept_errors += 1;
                g.rd.watch_listener(&g.listener, false);
                g.listener_resume_ns = ns(g.start) + ACCEPT_RETRY_NS;
                break;
            }
        };
        any = true;
        let peer = from.ip();
        // Refused: dropped, the client sees the connection closed.
        let Some(slot) = admit(g, sessions, peer) else { continue };
        let _ = sock.set_nodelay(true);
        let _ = sock.set_nonblocking(true);
        // The gateway's clock is the wall clock (OUCH stamps nanoseconds since midnight).
        let i = slot.unwrap_or(sessions.len());
        if g.rd.watch(&sock, i as u64).is_err() {
            g.gw.stats.refused_connections += 1;
            continue;
        }
        let s = Session {
            sock,
            peer,
            conn: Conn::new(wall_ns()),
            out: Vec::new(),
            out_at: 0,
            write_blocked_until: 0,
            write_backoff_ns: 0,
            closing: None,
        };
        match slot {
            Some(i) => sessions[i] = Some(s),
            None => sessions.push(Some(s)),
        }
        // A new socket may have bytes already.
        g.rd.look(0);
        if let Some(r) = g.rd.ready.get_mut(i) {
            *r = true;
        }
    }
    any
}

/// Whether a connection from `peer` is taken, and where: `Some(Some(i))` in
/// slot `i`, `Some(None)` at the end; `None`: refused (counted). A peer
/// guessing passwords, or holding too many connections that have not
/// logged in, is refused; with every slot taken the oldest connection that
/// has not logged in makes room (a real client logs in within a round trip;
/// one that holds a slot without logging in is the cheapest to lose).
fn admit(g: &mut GatewayLoop, sessions: &mut [Option<Session>], peer: std::net::IpAddr) -> Option<Option<usize>> {
    let now = ns(g.start);
    let guessing = g
        .login_failures
        .get(&peer)
        .is_some_and(|&(since, n)| now - since < 1_000_000_000 && n >= LOGIN_FAILURES_PER_S_MAX);
    if guessing {
        g.gw.stats.login_rate_limited += 1;
        return None;
    }
    let waiting = sessions.iter().flatten().filter(|s| s.peer == peer && s.conn.user.is_none()).count();
    if waiting >= PRELOGIN_PER_ADDRESS_MAX {
        g.gw.stats.refused_connections += 1;
        return None;
    }
    match sessions.iter().position(Option::is_none) {
        Some(i) => Some(Some(i)),
        None if sessions.len() < CONNECTIONS_MAX => Some(None),
        None => match oldest_prelogin(sessions) {
            Some(i) => {
                g.gw.stats.prelogin_evicted += 1;
                sessions[i] = None;
                Some(Some(i))
            }
            None => {
                g.gw.stats.refused_connections += 1;
                None
            }
        },
    }
}

/// The slot of the oldest open connection that has not logged in.
fn oldest_prelogin(sessions: &[Option<Session>]) -> Option<usize> {
    sessions
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            s.as_ref().filter(|s| s.conn.user.is_none() && s.closing.is_none()).map(|s| (s.conn.opened_ns(), i))
        })
        .min()
        .map(|(_, i)| i)
}

/// Counts a failed login from `peer` in its current one-second window,
/// keeping the table bounded (stale windows go first, then everything).
fn note_login_failure(
    t: &mut std::collections::HashMap<std::net::IpAddr, (u64, u32)>,
    peer: std::net::IpAddr,
    now: u64,
) {
    if t.len() >= LOGIN_FAILURE_ADDRESSES_MAX && !t.contains_key(&peer) {
        t.retain(|_, (since, _)| now - *since < 1_000_000_000);
        if t.len() >= LOGIN_FAILURE_ADDRESSES_MAX {
            t.clear();
        }
    }
    let e = t.entry(peer).or_insert((now, 0));
    if now - e.0 >= 1_000_000_000 {
        *e = (now, 0);
    }
    e.1 += 1;
}

/// Closes (counted) every session holding more than `out_max` unsent bytes:
/// a client that does not read must not make the exchange hold its output.
fn shed_slow_readers(g: &mut GatewayLoop, sessions: &mut [Option<Session>], now: u64) {
    for s in sessions.iter_mut().flatten() {
        if s.closing.is_none() && s.unsent() > g.out_max {
            s.out.clear();
            s.out_at = 0;
            g.gw.stats.slow_reader_closes += 1;
            g.gw.closed(&mut s.conn, Close::Logout);
            s.close(now);
        }
    }
}

/// Drops the closing sessions that have drained, or have had `CLOSE_DRAIN_NS` to.
fn drop_closed(sessions: &mut [Option<Session>], now: u64) {
    for slot in sessions.iter_mut() {
        if slot.as_ref().and_then(|s| s.closing.map(|t| s.unsent() == 0 || now - t > CLOSE_DRAIN_NS)) == Some(true) {
            *slot = None;
        }
    }
}

/// `x` as JSON (null if it cannot be).
fn v(x: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(x).unwrap_or_default()
}

/// Posts the gateway's counters and the order latency for the metrics endpoint.
fn publish_gateway(g: &GatewayLoop, latency: &Histogram<u64>, ring_full: u64, sessions: &[Option<Session>]) {
    let Some(p) = &g.poster else { return };
    let (q, o) = g.order.stats();
    let mut j = serde_json::json!({
        "gateway": v(&g.gw.stats),
        "sequencer": v(&q),
        "ordering": v(&o),
        "ring_full": ring_full,
        "sessions": sessions.iter().flatten().count(),
    });
    if let Some(w) = &g.watch {
        j["cheat"] = w.watch.report();
    }
    if let Matching::Inline(x) = &g.matching {
        let engines = x.engines.iter().enumerate().map(|(k, e)| (k.to_string(), v(&e.stats)));
        j["engines"] = serde_json::Value::Object(engines.collect());
        j["publisher"] = x.publisher.counters();
    }
    p.post(j, vec![(ORDER_HIST, latency.clone())]);
}

/// Responses matched or received since the last look.
fn take_responses(g: &mut GatewayLoop, outs: &mut Vec<Out>) {
    match &mut g.matching {
        Matching::Threaded { to_gw, .. } => {
            for r in to_gw.iter_mut() {
                r.drain(|o| outs.push(o));
            }
        }
        Matching::Inline(m) => {
            outs.append(&mut m.done);
            // The ITCH packets of what was matched, before anything else is read.
            m.publisher.flush(wall_ns());
        }
    }
}

/// The responses to their clients (OUCH), written once for the whole batch
/// (a write per command cost a system call each, and loopback TCP does the
/// receiver's work inside it: 60 % of the thread at 250,000 orders/s), each
/// command's steps timed.
fn respond(g: &mut GatewayLoop, outs: &[Out], sessions: &mut [Option<Session>], hists: &mut [Histogram<u64>; 5]) {
    if outs.is_empty() {
        return;
    }
    let (t3, wall) = (ns(g.start), wall_ns());
    // Each user's session, found once per batch rather than per message (a
    // scan of every connection per message cost the most under the
    // idle-connections attack).
    let by_user = &mut g.by_user;
    by_user.clear();
    for (i, s) in sessions.iter().enumerate() {
        let Some((u, closing)) = s.as_ref().and_then(|s| s.conn.user.map(|u| (u as usize, s.closing.is_some()))) else {
            continue;
        };
        if by_user.len() <= u {
            by_user.resize(u + 1, usize::MAX);
        }
        // A user's live session before one still draining on its way out.
        let held = sessions.get(by_user[u]).and_then(Option::as_ref);
        if held.is_none_or(|h| h.closing.is_some() && !closing) {
            by_user[u] = i;
        }
    }
    for o in outs {
        g.gw.on_event(wall, &o.ev, &mut |client, bytes| {
            let at = by_user.get(client as usize).copied().unwrap_or(usize::MAX);
            if let Some(Some(s)) = sessions.get_mut(at) {
                s.out.extend_from_slice(bytes);
            }
        });
    }
    flush_all(sessions, t3);
    let t4 = ns(g.start);
    for o in outs.iter().filter(|o| o.last) {
        let t3 = t3.max(o.t2);
        for (h, v) in hists.iter_mut().zip([o.t1 - o.t0, o.t2 - o.t1, t3 - o.t2, t4 - t3, t4 - o.t0]) {
            let _ = h.record(v.max(1));
        }
    }
}

/// Once a millisecond: counters published, sessions' timers, the publisher's
/// heartbeats and retransmissions when it runs here.
fn tick(g: &mut GatewayLoop, sessions: &mut [Option<Session>], now: u64) {
    let wall = wall_ns();
    // Closing sessions are past their timers (and counted once).
    for s in sessions.iter_mut().flatten().filter(|s| s.closing.is_none()) {
        if g.gw.on_tick(&mut s.conn, wall, &mut s.out).is_err() {
            s.close(now);
        }
    }
    if let Matching::Inline(m) = &mut g.matching {
        m.publisher.tick(wall);
    }
}

/// The gateway's clock for its sessions' timers, the published counters
/// and (run to completion) the publisher's heartbeats: once a millisecond.
const TICK_NS: u64 = 1_000_000;

/// The gateway (threaded pipeline) or the whole exchange (run to
/// completion) as an agent: sessions in and out, the ordering, and the
/// engines' ends of their mailboxes or the engines themselves.
pub(super) struct GatewayAgent {
    g: GatewayLoop,
    sessions: Vec<Option<Session>>,
    /// The five steps' latencies.
    hists: [Histogram<u64>; 5],
    buf: Vec<u8>,
    /// Pushes that found an engine's mailbox full.
    ring_full: u64,
    /// When it next ticks (wall ns).
    next_tick: u64,
    /// When the counters may next be published (ns since start), and
    /// whether they changed since.
    next_publish: u64,
    dirty: bool,
    /// One read's commands, and one pass's responses (kept for their allocations).
    cmds: Vec<(Command, OrderStamps)>,
    outs: Vec<Out>,
}

impl GatewayAgent {
    fn new(g: GatewayLoop) -> Self {
        GatewayAgent {
            g,
            sessions: Vec::new(),
            hists: [hist(), hist(), hist(), hist(), hist()],
            buf: vec![0u8; 65_536],
            ring_full: 0,
            next_tick: 0,
            next_publish: 0,
            dirty: true,
            cmds: Vec::new(),
            outs: Vec::with_capacity(256),
        }
    }

    fn publish(&mut self, t: u64) {
        self.dirty = false;
        self.next_publish = t + PUBLISH_NS;
        publish_gateway(&self.g, &self.hists[4], self.ring_full, &self.sessions);
    }

    /// Its timers, once a millisecond: counters, sessions, the cheat watch's paths.
    fn tick(&mut self, now: u64, t: u64) {
        self.next_tick = now + TICK_NS;
        if self.dirty && t >= self.next_publish {
            self.publish(t);
        }
        tick(&mut self.g, &mut self.sessions, t);
        if let Some(w) = &mut self.g.watch {
            w.sample_paths(&self.sessions, t);
        }
    }

    pub(super) fn close(self) -> Vec<Part> {
        close_gateway(self.g, self.hists, self.ring_full)
    }
}

impl Agent for GatewayAgent {
    fn role(&self) -> &'static str {
        match self.g.matching {
            Matching::Threaded { .. } => "gateway",
            Matching::Inline(_) => "exchange",
        }
    }

    fn do_work(&mut self, now: u64, _turn: Turn) -> usize {
        let g = &mut self.g;
        let mut busy = accept(g, &mut self.sessions);
        busy |= read_sessions(g, &mut self.sessions, &mut self.buf, &mut self.cmds, &mut self.ring_full);
        if g.order.holds() {
            busy = true;
            route_due(g, &mut self.ring_full);
        }
        let pushed = std::mem::take(&mut g.pushed);
        if let (Matching::Threaded { cmd_tx, .. }, true) = (&g.matching, pushed != 0) {
            for (k, tx) in cmd_tx.iter().enumerate() {
                if pushed & (1 << k) != 0 {
                    tx.wake();
                }
            }
        }
        self.outs.clear();
        take_responses(g, &mut self.outs);
        busy |= !self.outs.is_empty();
        respond(g, &self.outs, &mut self.sessions, &mut self.hists);
        let t = ns(g.start);
        if now >= self.next_tick {
            self.tick(now, t);
        }
        let g = &mut self.g;
        shed_slow_readers(g, &mut self.sessions, t);
        flush_all(&mut self.sessions, t);
        drop_closed(&mut self.sessions, t);
        self.dirty |= busy;
        if !busy && self.dirty {
            // About to go idle: what changed since the last publish is published now.
            self.publish(t);
        }
        usize::from(busy)
    }

    fn next_due(&self) -> u64 {
        self.next_tick
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.g.rd.epoll.0.as_fd()]
    }

    fn is_done(&self) -> bool {
        false
    }

    fn before_park(&mut self) -> bool {
        match &self.g.matching {
            Matching::Threaded { to_gw, .. } => to_gw.iter().all(Incoming::arm),
            Matching::Inline(_) => true,
        }
    }

    fn after_park(&mut self) {
        if let Matching::Threaded { to_gw, .. } = &self.g.matching {
            to_gw.iter().for_each(Incoming::disarm);
        }
    }
}

/// Routes the orders the ordering releases now (a batch's as one).
fn route_due(g: &mut GatewayLoop, ring_full: &mut u64) {
    let mut due = std::mem::take(&mut g.due);
    g.order.due(wall_ns(), &mut due);
    let mut at = 0;
    while at < due.len() {
        match due[at].1 {
            None => {
                route(g, due[at].0, InBatch::No, ring_full);
                at += 1;
            }
            Some(b) => {
                let end = at + due[at..].iter().take_while(|d| d.1 == Some(b)).count();
                route_batch(g, &due[at..end], ring_full);
                at = end;
            }
        }
    }
    due.clear();
    g.due = due;
}

/// The gateway's parts of the report (and the inline engines' and publisher's).
fn close_gateway(g: GatewayLoop, hists: [Histogram<u64>; 5], ring_full: u64) -> Vec<Part> {
    let (q, o) = g.order.stats();
    let cheat = g.watch.as_ref().map(|w| w.watch.report());
    let mut parts = vec![Part::Gateway(Box::new(GatewayPart {
        stats: g.gw.stats,
        hists,
        ring_full,
        sequencer: q,
        ordering: o,
        cheat,
    }))];
    if let Matching::Inline(m) = g.matching {
        let Inline { engines, mut publisher, .. } = *m;
        parts.extend(engines.into_iter().map(|e| Part::Engine(e.stats)));
        parts.push(publisher.close());
    }
    parts
}

/// Reads every session that has bytes; routes the commands to their engine
/// shard. Returns whether anything arrived.
fn read_sessions(
    g: &mut GatewayLoop,
    sessions: &mut [Option<Session>],
    buf: &mut [u8],
    cmds: &mut Vec<(Command, OrderStamps)>,
    ring_full: &mut u64,
) -> bool {
    let mut busy = false;
    g.rd.look(0);
    // Deadline records before orders: an order and the record of the data it
    // answers that came in the same pass are judged with the record.
    if let Some(w) = &mut g.watch {
        busy |= w.read(&mut g.rd.deadlines, buf);
    }
    for (i, slot) in sessions.iter_mut().enumerate() {
        if !g.rd.ready.get_mut(i).is_some_and(std::mem::take) {
            continue;
        }
        let Some(s) = slot else { continue };
        if s.closing.is_some() {
            continue; // nothing more is taken from a session being closed
        }
        // Before login a client has one small packet to send: a connection
        // that sends more before logging in is read in small pieces (garbage
        // is refused after its first bytes, not after 64 KiB of them).
        let limit = if s.conn.user.is_none() { PRELOGIN_READ_MAX.min(buf.len()) } else { buf.len() };
        match s.sock.read(&mut buf[..limit]) {
            Ok(0) => {
                g.gw.closed(&mut s.conn, Close::Logout);
                *slot = None;
                continue;
            }
            Ok(n) => {
                busy = true;
                cmds.clear();
                let r = g.gw.on_bytes(&mut s.conn, wall_ns(), &buf[..n], &mut |c, ts| cmds.push((c, ts)), &mut s.out);
                for &(c, st) in cmds.iter() {
                    if let (Some(w), Command::New(o)) = (&mut g.watch, c) {
                        w.watch.on_order(o.client as usize, st.clock, wall_ns());
                    }
                    if let Some(c) = g.order.take(c, st, wall_ns()) {
                        route(g, c, InBatch::No, ring_full);
                    }
                }
                if r.is_err() {
                    let now = ns(g.start);
                    // A refused login, or garbage before any login: the address
                    // counts towards its failures per second.
                    let garbage = matches!(r, Err(Close::Protocol(_))) && s.conn.user.is_none();
                    if r == Err(Close::LoginRejected) || garbage {
                        note_login_failure(&mut g.login_failures, s.peer, now);
                    }
                    s.close(now);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => {
                g.gw.closed(&mut s.conn, Close::Logout);
                *slot = None;
            }
        }
    }
    busy
}

/// Hands a command to the engine shard of its symbol: over its ring
/// (waiting while it is full), or, run to completion, to the engine itself.
fn route(g: &mut GatewayLoop, c: Command, batch: InBatch, ring_full: &mut u64) {
    let shard = shard_of(g, &c);
    let t0 = ns(g.start);
    match &mut g.matching {
        Matching::Threaded { cmd_tx, .. } => {
            // Woken once a turn (`GatewayAgent::do_work`), or here while full.
            g.pushed |= 1 << shard;
            let mut item = Cmd { cmd: c, t0, batch };
            while let Err(back) = cmd_tx[shard].push(item) {
                *ring_full += 1;
                item = back;
                cmd_tx[shard].wake();
                thread::yield_now();
            }
        }
        Matching::Inline(m) => {
            let Inline { engines, publisher, events, done } = &mut **m;
            events.clear();
            match batch {
                InBatch::No => engines[shard].handle(c, &mut |ev| events.push(ev)),
                InBatch::Part => return g.batch.push(c),
                InBatch::Last => {
                    g.batch.push(c);
                    engines[shard].handle_batch(&g.batch, &mut |ev| events.push(ev));
                    g.batch.clear();
                }
            }
            let t2 = ns(g.start);
            let (now, k) = (wall_ns(), events.len());
            for (i, ev) in events.iter().enumerate() {
                publisher.on_event(now, ev);
                done.push(Out { ev: *ev, t0, t1: t0, t2, last: i + 1 == k });
            }
        }
    }
}

/// The engine shard of a command's symbol (a cancel or replace: of the order it names).
fn shard_of(g: &GatewayLoop, c: &Command) -> usize {
    let sym = match *c {
        Command::New(o) => Some(o.symbol),
        Command::Cancel { client, token, .. } | Command::Replace { client, token, .. } => g.gw.symbol_of(client, token),
    };
    sym.map_or(0, |s| usize::from(s.max(1) - 1) % g.engines)
}

/// Hands one batch to matching: each engine shard gets its part, the last
/// command marked, and clears it in one call auction per symbol.
fn route_batch(g: &mut GatewayLoop, batch: &[(Command, Option<u64>)], ring_full: &mut u64) {
    // One shard's commands after another (run to completion gathers a
    // shard's parts in one buffer), each shard in arrival order; the shard
    // of each command found once.
    let mut by_shard: Vec<(usize, Command)> = batch.iter().map(|b| (shard_of(g, &b.0), b.0)).collect();
    by_shard.sort_by_key(|x| x.0);
    for (i, &(shard, c)) in by_shard.iter().enumerate() {
        let last = by_shard.get(i + 1).is_none_or(|n| n.0 != shard);
        route(g, c, if last { InBatch::Last } else { InBatch::Part }, ring_full);
    }
}

/// How long a session whose socket was full is left alone before the next
/// write: from this, doubling while it stays full, up to [`WRITE_RETRY_MAX_NS`].
const WRITE_RETRY_NS: u64 = 50_000;
const WRITE_RETRY_MAX_NS: u64 = 1_000_000;

/// Writes what each session has to send. A session whose socket is full is
/// tried again after [`WRITE_RETRY_NS`], doubling while it stays full (a
/// client that does not read cost a failed `write` per pass), and what it was sent is consumed from an offset
/// (a partial write of a large backlog used to move the rest down each time).
fn flush_all(sessions: &mut [Option<Session>], now: u64) {
    for s in sessions.iter_mut().flatten() {
        if now < s.write_blocked_until {
            continue;
        }
        while s.unsent() > 0 {
            match s.sock.write(&s.out[s.out_at..]) {
                Ok(0) => break,
                Ok(n) => {
                    s.out_at += n;
                    s.write_backoff_ns = 0;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    s.write_backoff_ns = (s.write_backoff_ns * 2).clamp(WRITE_RETRY_NS, WRITE_RETRY_MAX_NS);
                    s.write_blocked_until = now + s.write_backoff_ns;
                    break;
                }
                Err(_) => {
                    s.out.clear();
                    s.out_at = 0;
                    s.close(now);
                }
            }
        }
        if s.out_at == s.out.len() {
            s.out.clear();
            s.out_at = 0;
        } else if s.out_at > s.out.len() / 2 {
            s.out.drain(..s.out_at);
            s.out_at = 0;
        }
    }
}
