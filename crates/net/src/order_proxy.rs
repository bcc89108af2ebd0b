//! The release point's order proxy (`fairfeed receiver --order-proxy`): the
//! firm's program sends its OUCH session here instead of to the exchange,
//! and every Enter Order leaves with the receiver's own delivery clock
//! (`fairfeed_exchange::stamp::Stamper`) — DBO without the firm stamping,
//! and without the firm being able to stamp for itself (issue 44).
//!
//! A thin shell: one agent (`io::agent`, role `order-proxy`) on a thread of
//! its own serves the listener and every connection from one `epoll` set,
//! carrying the firm's bytes through the stamper to the exchange and the
//! exchange's answers back unchanged. At most [`PROXY_CONNECTIONS_MAX`]
//! connections at once (more are refused and counted; one silent for
//! [`PROXY_IDLE_MAX`] is closed); the exchange connection is opened
//! without waiting (an unreachable exchange closes that pair, counted, and
//! holds up no other); each pair holds at most one SoupBinTCP packet of the
//! firm's in the stamper and [`PROXY_PENDING_MAX`] bytes each way (a side
//! that does not read stops the other being read, counted
//! `backpressured`); a stream that does not frame as SoupBinTCP is closed
//! (counted).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use fairfeed_exchange::ordering::DeliveryClock;
use fairfeed_exchange::stamp::{StampStats, Stamper};
use fairfeed_io::agent::{self, Agent, RunConfig, Turn};
use fairfeed_io::clock::wall_ns;
use fairfeed_io::idle::IdleStrategy;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

/// Firm connections served at once.
pub const PROXY_CONNECTIONS_MAX: usize = 8;
/// A firm connection that sends nothing this long is closed (counted
/// `idle_closed`): an OUCH client sends a heartbeat every second, so this
/// one is gone, and it would hold a slot.
pub const PROXY_IDLE_MAX: Duration = Duration::from_secs(30);
/// How often the agent looks at the stop flag while parked.
const POLL: Duration = Duration::from_millis(50);

/// The release point's delivery clock: the last data message delivered and
/// when (wall ns). Written by the release path, read by the proxy. A
/// message may be delivered in the future — through a last hop (`--host`)
/// a firm's host has it at the deadline, not at the release — and counts
/// only from then: an order sent before it answers the message before.
#[derive(Debug, Default)]
pub struct ClockCell(Mutex<Cell>);

#[derive(Debug, Default)]
struct Cell {
    /// (last sequence, delivered at) of the last delivery in the past.
    now: Option<(u64, u64)>,
    /// Deliveries still ahead, in sequence order (at most [`AHEAD_MAX`]).
    ahead: std::collections::VecDeque<(u64, u64)>,
}

/// Deliveries a clock keeps ahead of now at most (a last hop holds ≤ 10 ms of them).
pub const AHEAD_MAX: usize = 65_536;

impl ClockCell {
    /// MoldUDP64 packet `payload` is delivered at `wall_ns` (now, or ahead):
    /// its last message is then the last data delivered (other bytes change nothing).
    pub fn delivered(&self, payload: &[u8], wall_ns: u64) {
        let Ok(p) = fairfeed_wire::moldudp64::Packet::new_checked(payload) else { return };
        let n = p.message_count();
        if n == 0 || n == fairfeed_wire::moldudp64::COUNT_END_OF_SESSION {
            return;
        }
        let last = p.sequence() + u64::from(n) - 1;
        let mut c = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Sequence order: never backwards (a late retransmission fills a gap behind).
        let newest = c.ahead.back().or(c.now.as_ref()).map(|x| x.0);
        if newest.is_some_and(|seq| last <= seq) {
            return;
        }
        if c.ahead.len() >= AHEAD_MAX {
            c.now = c.ahead.pop_front();
        }
        // Never delivered earlier than the one before it.
        let at = c.ahead.back().map_or(wall_ns, |x| x.1.max(wall_ns));
        c.ahead.push_back((last, at));
    }

    /// The clock at `now_ns` (None: nothing delivered yet).
    pub fn at(&self, now_ns: u64) -> Option<DeliveryClock> {
        let mut c = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        while c.ahead.front().is_some_and(|x| x.1 <= now_ns) {
            c.now = c.ahead.pop_front();
        }
        c.now.map(|(data_seq, at)| DeliveryClock { data_seq, response_ns: now_ns as i64 - at as i64 })
    }
}

/// What the proxy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProxyStats {
    /// Firm connections taken (an exchange connection opened for each).
    pub connections: u64,
    /// Refused: all [`PROXY_CONNECTIONS_MAX`] taken.
    pub refused_busy: u64,
    /// Closed because the exchange could not be reached (or went away before it answered).
    pub refused_upstream: u64,
    /// Closed after [`PROXY_IDLE_MAX`] (or the `idle` given) without a byte from the firm.
    pub idle_closed: u64,
    /// Times one side stopped being read because the other side's buffer
    /// ([`PROXY_PENDING_MAX`]) was full (the slower side sets the pace).
    pub backpressured: u64,
    /// The stamper's counters, over every connection.
    #[serde(flatten)]
    pub stamp: StampStats,
}

/// A running proxy; stops with its `stop` flag.
pub struct OrderProxy {
    /// Where firms connect.
    pub addr: SocketAddr,
    stats: Arc<Mutex<ProxyStats>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl OrderProxy {
    /// Listens on `listen`, forwarding to the exchange at `exchange`,
    /// stamping with `cell`; a connection silent for `idle` is closed
    /// ([`PROXY_IDLE_MAX`] in service). One agent on a thread of its own
    /// serves the listener and every connection.
    pub fn start(
        listen: SocketAddr,
        exchange: SocketAddr,
        cell: Arc<ClockCell>,
        stop: Arc<AtomicBool>,
        idle: Duration,
    ) -> std::io::Result<OrderProxy> {
        let listener = TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(Mutex::new(ProxyStats::default()));
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))?;
        let a = ProxyAgent {
            listener,
            epoll,
            events: vec![EpollEvent::empty(); EVENTS_MAX],
            pairs: (0..PROXY_CONNECTIONS_MAX).map(|_| None).collect(),
            exchange,
            idle_ns: idle.as_nanos() as u64,
            cell,
            local: ProxyStats::default(),
            shared: stats.clone(),
            buf: vec![0u8; READ_MAX],
            next_tick: 0,
        };
        // Parked until a socket has something (the old blocking reads' wake-up),
        // at most POLL so the stop flag is seen.
        let cfg = RunConfig {
            idle: IdleStrategy::Park,
            spin_ahead_ns: 0,
            park_max_ns: POLL.as_nanos() as u64,
            stop: Some(stop),
        };
        let thread = agent::spawn(
            "order-proxy",
            cfg,
            move || a,
            |mut a, r| {
                if let Err(e) = r {
                    tracing::error!("order proxy: its runner failed: {e}");
                }
                a.close_all();
            },
        )?;
        Ok(OrderProxy { addr, stats, thread: Some(thread) })
    }

    /// What it did so far.
    pub fn stats(&self) -> ProxyStats {
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for its thread (after the stop flag is set).
    pub fn join(mut self) -> ProxyStats {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stats()
    }
}

/// `epoll` data of the listener; a pair's sockets are `2·slot` (the firm's)
/// and `2·slot + 1` (the exchange's).
const LISTENER: u64 = u64::MAX;
/// Readiness events taken per look.
const EVENTS_MAX: usize = 64;
/// Bytes read from a socket at once.
const READ_MAX: usize = 16 * 1024;
/// Bytes one connection holds for the other side at most, each way: a side
/// that does not take them stops the other being read.
pub const PROXY_PENDING_MAX: usize = 64 * 1024;
/// How often idle connections and pending connects are looked at.
const TICK_NS: u64 = 10_000_000;

/// One firm connection and the exchange connection opened for it.
struct Pair {
    firm: TcpStream,
    up: TcpStream,
    stamper: Stamper,
    /// Stamped bytes for the exchange, and the exchange's for the firm, not yet written.
    to_up: Vec<u8>,
    to_firm: Vec<u8>,
    /// The exchange accepted the connection (a nonblocking connect completed).
    connected: bool,
    /// When the firm last sent something (wall ns).
    last_ns: u64,
    /// The `epoll` interest of each socket now.
    interest: (EpollFlags, EpollFlags),
}

impl Pair {
    /// What each socket should wake the agent for: input while the other
    /// side's buffer has room, writability while something waits for it
    /// (or, the exchange's, until its connect completes).
    fn wanted(&self) -> (EpollFlags, EpollFlags) {
        let (mut firm, mut up) = (EpollFlags::empty(), EpollFlags::empty());
        if self.to_up.len() < PROXY_PENDING_MAX {
            firm |= EpollFlags::EPOLLIN;
        }
        if !self.to_firm.is_empty() {
            firm |= EpollFlags::EPOLLOUT;
        }
        if self.to_firm.len() < PROXY_PENDING_MAX {
            up |= EpollFlags::EPOLLIN;
        }
        if !self.to_up.is_empty() || !self.connected {
            up |= EpollFlags::EPOLLOUT;
        }
        (firm, up)
    }
}

/// Which of a pair's sockets `epoll` said have something.
#[derive(Debug, Clone, Copy, Default)]
struct Ready {
    any: bool,
    firm: bool,
    up: bool,
}

/// Why a pair is closed.
enum Closing {
    /// Either side closed or failed, or the firm's bytes were not SoupBinTCP.
    Done,
    /// The exchange could not be reached.
    Upstream,
}

/// The proxy as an agent: the listener and every pair on one `epoll` set.
struct ProxyAgent {
    listener: TcpListener,
    epoll: Epoll,
    events: Vec<EpollEvent>,
    pairs: Vec<Option<Pair>>,
    exchange: SocketAddr,
    idle_ns: u64,
    cell: Arc<ClockCell>,
    /// Its counters, and where `stats()` reads them (copied when they change).
    local: ProxyStats,
    shared: Arc<Mutex<ProxyStats>>,
    buf: Vec<u8>,
    /// When idle connections and connects are next looked at (wall ns).
    next_tick: u64,
}

impl ProxyAgent {
    /// Takes the connections waiting: each with a nonblocking connect to the
    /// exchange (a dead exchange never holds up the others), or refused when
    /// every slot is taken. Returns how many came.
    fn accept(&mut self, now: u64) -> usize {
        let mut n = 0;
        while let Ok((firm, _)) = self.listener.accept() {
            n += 1;
            let Some(slot) = self.pairs.iter().position(Option::is_none) else {
                self.local.refused_busy += 1;
                continue; // dropped: closed
            };
            let Ok(up) = connect_nonblocking(self.exchange) else {
                self.local.refused_upstream += 1;
                continue;
            };
            let _ = firm.set_nonblocking(true);
            let _ = firm.set_nodelay(true);
            let _ = up.set_nodelay(true);
            let p = Pair {
                firm,
                up,
                stamper: Stamper::default(),
                to_up: Vec::new(),
                to_firm: Vec::new(),
                connected: false,
                last_ns: now,
                interest: (EpollFlags::empty(), EpollFlags::empty()),
            };
            let (f, u) = p.wanted();
            let s = slot as u64;
            if self.epoll.add(&p.firm, EpollEvent::new(f, 2 * s)).is_err()
                || self.epoll.add(&p.up, EpollEvent::new(u, 2 * s + 1)).is_err()
            {
                self.local.refused_upstream += 1;
                let _ = self.epoll.delete(&p.firm);
                continue;
            }
            self.pairs[slot] = Some(Pair { interest: (f, u), ..p });
            self.local.connections += 1;
        }
        n
    }

    /// Moves what pair `slot` has: the firm's bytes stamped towards the
    /// exchange, the exchange's back unchanged. Returns the bytes moved, or
    /// why the pair must close.
    fn pump(&mut self, slot: usize, ready: Ready, now: u64) -> Result<usize, Closing> {
        let Some(p) = self.pairs[slot].as_mut() else { return Ok(0) };
        let mut moved = 0;
        if !p.connected {
            match p.up.take_error() {
                Ok(Some(_)) | Err(_) => return Err(Closing::Upstream),
                Ok(None) => p.connected = p.up.peer_addr().is_ok(),
            }
        }
        if ready.firm && p.to_up.len() < PROXY_PENDING_MAX {
            match read_some(&mut p.firm, &mut self.buf) {
                Some(0) => return Err(Closing::Done),
                Some(n) => {
                    p.last_ns = now;
                    moved += n;
                    let before = p.stamper.stats;
                    let r = p.stamper.handle_bytes(&self.buf[..n], self.cell.at(wall_ns()), &mut p.to_up);
                    add(&mut self.local.stamp, p.stamper.stats, before);
                    if r.is_err() {
                        return Err(Closing::Done);
                    }
                }
                None => {}
            }
        }
        if ready.up && p.to_firm.len() < PROXY_PENDING_MAX {
            match read_some(&mut p.up, &mut self.buf) {
                Some(0) => return Err(Closing::Done),
                Some(n) => {
                    moved += n;
                    p.to_firm.extend_from_slice(&self.buf[..n]);
                }
                None => {}
            }
        }
        moved += write_some(&mut p.up, &mut p.to_up, p.connected)?;
        moved += write_some(&mut p.firm, &mut p.to_firm, true)?;
        let wanted = p.wanted();
        if wanted != p.interest {
            // A side's buffer filled: the other is no longer read.
            let paused = |was: EpollFlags, now: EpollFlags| {
                was.contains(EpollFlags::EPOLLIN) && !now.contains(EpollFlags::EPOLLIN)
            };
            self.local.backpressured +=
                u64::from(paused(p.interest.0, wanted.0)) + u64::from(paused(p.interest.1, wanted.1));
            let s = slot as u64;
            let _ = self.epoll.modify(&p.firm, &mut EpollEvent::new(wanted.0, 2 * s));
            let _ = self.epoll.modify(&p.up, &mut EpollEvent::new(wanted.1, 2 * s + 1));
            p.interest = wanted;
        }
        Ok(moved)
    }

    fn close(&mut self, slot: usize, why: Closing) {
        let Some(p) = self.pairs[slot].take() else { return };
        if matches!(why, Closing::Upstream) {
            self.local.refused_upstream += 1;
        }
        // Counted before either end can see the close.
        self.publish();
        let _ = self.epoll.delete(&p.firm);
        let _ = self.epoll.delete(&p.up);
        let _ = p.up.shutdown(Shutdown::Both);
        let _ = p.firm.shutdown(Shutdown::Both);
    }

    /// Closes the connections silent too long; returns how many.
    fn tick(&mut self, now: u64) -> usize {
        self.next_tick = now + TICK_NS;
        let mut closed = 0;
        for slot in 0..self.pairs.len() {
            if self.pairs[slot].as_ref().is_some_and(|p| now.saturating_sub(p.last_ns) > self.idle_ns) {
                self.local.idle_closed += 1;
                self.close(slot, Closing::Done);
                closed += 1;
            }
        }
        closed
    }

    fn close_all(&mut self) {
        for slot in 0..self.pairs.len() {
            self.close(slot, Closing::Done);
        }
        self.publish();
    }

    fn publish(&self) {
        let mut s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if *s != self.local {
            *s = self.local;
        }
    }
}

impl Agent for ProxyAgent {
    fn role(&self) -> &'static str {
        "order-proxy"
    }

    fn do_work(&mut self, now: u64, _turn: Turn) -> usize {
        let n = self.epoll.wait(&mut self.events, EpollTimeout::ZERO).unwrap_or(0);
        let mut ready = [Ready::default(); PROXY_CONNECTIONS_MAX];
        let mut listener = false;
        for e in &self.events[..n] {
            match e.data() {
                LISTENER => listener = true,
                d => {
                    // Only its readable side is read (a read that finds nothing costs a system call).
                    let r = &mut ready[(d / 2) as usize % PROXY_CONNECTIONS_MAX];
                    r.any = true;
                    let readable =
                        e.events().intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR);
                    if d % 2 == 0 {
                        r.firm |= readable;
                    } else {
                        r.up |= readable;
                    }
                }
            }
        }
        let mut work = if listener { self.accept(now) } else { 0 };
        for (slot, &r) in ready.iter().enumerate().filter(|r| r.1.any) {
            match self.pump(slot, r, now) {
                Ok(moved) => work += moved,
                Err(why) => {
                    work += 1;
                    self.close(slot, why);
                }
            }
        }
        if now >= self.next_tick {
            work += self.tick(now);
        }
        if work > 0 {
            self.publish();
        }
        work
    }

    fn next_due(&self) -> u64 {
        self.next_tick
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.epoll.0.as_fd()]
    }

    fn is_done(&self) -> bool {
        false
    }

    fn on_close(&mut self, _now: u64) {
        self.publish();
    }
}

/// A TCP connection to `to`, its connect under way (never waited for here).
fn connect_nonblocking(to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::for_address(to), socket2::Type::STREAM, None)?;
    s.set_nonblocking(true)?;
    match s.connect(&to.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(nix::libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from(s))
}

/// One read: `Some(0)` at the end of the stream (or an error), `Some(n)`
/// bytes, `None` when nothing waits.
fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> Option<usize> {
    match s.read(buf) {
        Ok(n) => Some(n),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => None,
        Err(_) => Some(0),
    }
}

/// Writes what `pending` holds (when the socket is `ready`); returns the
/// bytes written.
fn write_some(s: &mut TcpStream, pending: &mut Vec<u8>, ready: bool) -> Result<usize, Closing> {
    if !ready || pending.is_empty() {
        return Ok(0);
    }
    match s.write(pending) {
        Ok(n) => {
            pending.drain(..n);
            Ok(n)
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => Ok(0),
        Err(_) => Err(Closing::Done),
    }
}

/// Adds what one read changed (`now − before`) to the shared counters.
fn add(s: &mut StampStats, now: StampStats, before: StampStats) {
    s.packets += now.packets - before.packets;
    s.stamped += now.stamped - before.stamped;
    s.replaced_own_clock += now.replaced_own_clock - before.replaced_own_clock;
    s.before_any_data += now.before_any_data - before.before_any_data;
    s.unreadable += now.unreadable - before.unreadable;
    s.malformed += now.malformed - before.malformed;
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_exchange::client;
    use std::sync::atomic::Ordering;

    /// A fake exchange: accepts and keeps every connection, echoing nothing;
    /// what each sent is read into `got`.
    fn exchange() -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        thread::spawn(move || {
            for s in l.incoming().flatten() {
                let g = g.clone();
                thread::spawn(move || {
                    let mut s = s;
                    let mut b = [0u8; 4096];
                    while let Ok(n) = s.read(&mut b) {
                        if n == 0 {
                            break;
                        }
                        g.lock().unwrap().extend_from_slice(&b[..n]);
                    }
                });
            }
        });
        (addr, got)
    }

    /// The proxy closed it (a read timing out is not a close).
    fn closed(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        match s.read(&mut [0u8; 16]) {
            Ok(0) => true,
            Err(e) => matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe),
            Ok(_) => false,
        }
    }

    /// An exchange that cannot be reached closes that firm's connection
    /// (counted) and holds up no other; an exchange that stops reading
    /// stops its firm being read (counted) without the proxy holding more
    /// than its limit, and the other firms go on.
    #[test]
    fn an_unreachable_or_stalled_exchange_costs_only_its_own_connection() {
        let dead = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap(); // closed again at once
        let stop = Arc::new(AtomicBool::new(false));
        let cell = Arc::new(ClockCell::default());
        let to_dead =
            OrderProxy::start("127.0.0.1:0".parse().unwrap(), dead, cell.clone(), stop.clone(), PROXY_IDLE_MAX)
                .unwrap();
        let mut firm = TcpStream::connect(to_dead.addr).unwrap();
        assert!(closed(&mut firm), "no exchange: the firm's connection is closed");
        assert_eq!(to_dead.stats().refused_upstream, 1);

        // A stalled exchange: accepts, never reads.
        let stalled = TcpListener::bind("127.0.0.1:0").unwrap();
        let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let h = held.clone();
        let stalled_addr = stalled.local_addr().unwrap();
        thread::spawn(move || {
            for s in stalled.incoming().flatten() {
                h.lock().unwrap().push(s);
            }
        });
        let proxy = OrderProxy::start("127.0.0.1:0".parse().unwrap(), stalled_addr, cell, stop.clone(), PROXY_IDLE_MAX)
            .unwrap();
        let mut flood = TcpStream::connect(proxy.addr).unwrap();
        flood.set_nonblocking(true).unwrap();
        // Debug packets (valid SoupBinTCP, passed through unstamped) until
        // the kernel's buffers and the proxy's are full.
        let mut packet = vec![0x03, 0xff, b'+'];
        packet.resize(0x3ff + 2, b'x');
        let (mut sent, mut at, t0) = (0usize, 0usize, std::time::Instant::now());
        while t0.elapsed() < Duration::from_secs(2) {
            // A partial write leaves the rest of the packet for the next.
            match flood.write(&packet[at..]) {
                Ok(n) => {
                    sent += n;
                    at = (at + n) % packet.len();
                }
                Err(_) => thread::sleep(Duration::from_millis(10)),
            }
        }
        let s = proxy.stats();
        assert!(s.backpressured > 0, "the flood waited for the exchange: {s:?}");
        assert!(sent < 64 << 20, "the proxy stopped reading the flood ({sent} bytes taken)");
        // Another firm on the same proxy is still served (its connection is
        // taken and its bytes are read and stamped).
        let mut other = TcpStream::connect(proxy.addr).unwrap();
        let mut b = Vec::new();
        client::enter_order(
            &client::Order { token: 1, side: b'B', qty: 1, symbol: "AAPL", price: 1, ..Default::default() },
            &mut b,
        );
        other.write_all(&b).unwrap();
        thread::sleep(Duration::from_millis(300));
        let s = proxy.stats();
        assert_eq!(s.connections, 2, "{s:?}");
        assert!(s.stamp.packets > 0, "{s:?}");
        stop.store(true, Ordering::Relaxed);
        to_dead.join();
        proxy.join();
    }

    /// A delivery ahead (a last hop's deadline) counts only from its time:
    /// an order before it answers the message before.
    #[test]
    fn a_delivery_ahead_counts_from_its_time() {
        let packet = |seq: u64| {
            let mut p = vec![0u8; 20];
            p[10..18].copy_from_slice(&seq.to_be_bytes());
            p[18..20].copy_from_slice(&1u16.to_be_bytes());
            p.extend_from_slice(&[0, 1, b'x']);
            p
        };
        let cell = ClockCell::default();
        assert!(cell.at(0).is_none());
        cell.delivered(&packet(1), 1_000);
        cell.delivered(&packet(2), 5_000);
        cell.delivered(&packet(2), 6_000); // not again
        cell.delivered(&packet(3), 4_000); // never before the one before it
        assert!(cell.at(999).is_none(), "nothing delivered yet");
        assert_eq!(cell.at(2_000), Some(DeliveryClock { data_seq: 1, response_ns: 1_000 }));
        assert_eq!(cell.at(5_100), Some(DeliveryClock { data_seq: 3, response_ns: 100 }));
    }

    /// Orders come out stamped; a client that sends garbage is cut off and
    /// counted; beyond the limit connections are refused; the others go on.
    #[test]
    fn stamps_orders_and_contains_misbehaving_clients() {
        let (up, got) = exchange();
        let cell = Arc::new(ClockCell::default());
        let mut p = vec![0u8; 20];
        p[10..18].copy_from_slice(&7u64.to_be_bytes());
        p[18..20].copy_from_slice(&3u16.to_be_bytes());
        p.extend_from_slice(&[0, 1, b'x', 0, 1, b'y', 0, 1, b'z']);
        cell.delivered(&p, wall_ns());
        let stop = Arc::new(AtomicBool::new(false));
        let proxy =
            OrderProxy::start("127.0.0.1:0".parse().unwrap(), up, cell, stop.clone(), Duration::from_secs(2)).unwrap();
        let mut good = TcpStream::connect(proxy.addr).unwrap();
        let mut garbage = TcpStream::connect(proxy.addr).unwrap();
        garbage.write_all(&[0, 0, 0xff, 0xff]).unwrap();
        assert!(closed(&mut garbage), "a stream that is not SoupBinTCP is closed");
        let mut others: Vec<TcpStream> =
            (0..PROXY_CONNECTIONS_MAX - 1).map(|_| TcpStream::connect(proxy.addr).unwrap()).collect();
        thread::sleep(Duration::from_millis(300));
        let mut extra = TcpStream::connect(proxy.addr).unwrap();
        assert!(closed(&mut extra), "one connection too many is refused");
        let mut b = Vec::new();
        client::enter_order(
            &client::Order { token: 1, side: b'B', qty: 1, symbol: "AAPL", price: 1, ..Default::default() },
            &mut b,
        );
        good.write_all(&b).unwrap();
        thread::sleep(Duration::from_millis(300));
        let bytes = got.lock().unwrap().clone();
        let Ok(Some((fairfeed_wire::soupbintcp::PacketRepr::UnsequencedData(m), _))) =
            fairfeed_wire::soupbintcp::split_packet(&bytes)
        else {
            panic!("the order reached the exchange: {bytes:?}")
        };
        let Ok(fairfeed_wire::ouch::inbound::Message::EnterOrder(o)) = fairfeed_wire::ouch::inbound::Message::parse(m)
        else {
            panic!("an Enter Order")
        };
        use fairfeed_wire::macros::Tail;
        let clock = fairfeed_exchange::sequencer::stamps(o.to_repr().appendage.as_slice()).clock.unwrap();
        assert_eq!(clock.data_seq, 9, "the last message of the packet released");
        let s = proxy.stats();
        assert_eq!((s.refused_busy, s.stamp.malformed, s.stamp.stamped), (1, 1, 1), "{s:?}");
        // The silent ones are closed after the idle limit; the talking one stays.
        let mut silent = others.pop().unwrap();
        assert!(closed(&mut silent), "a silent connection is closed");
        assert!(proxy.stats().idle_closed >= 1);
        stop.store(true, Ordering::Relaxed);
        others.clear();
        proxy.join();
    }
}
