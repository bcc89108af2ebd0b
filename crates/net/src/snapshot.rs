//! The snapshot service's sockets: a server agent that follows a feed and
//! answers SoupBinTCP logins with snapshots, and the client a joining
//! receiver fetches one with. The logic is `fairfeed_feed::snapshot`'s; this
//! is only reading, writing, accepting and timing.
//!
//! Connections come and go, but an agent's descriptors are fixed for its
//! life, so each side keeps an `epoll` set of its own for its TCP streams and
//! lends the runner that one descriptor (readable when any stream is).

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use fairfeed_feed::book::BookStats;
use fairfeed_feed::snapshot::join::{JoinStats, Joiner, Stream as JoinStream};
use fairfeed_feed::snapshot::serve::{Admission, Close, Credentials, ServerConn};
use fairfeed_feed::snapshot::{FollowStats, Follower};
use fairfeed_io::agent::{Agent, Turn};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use fairfeed_io::counters::{Board, Poster};

/// Feed datagrams read per socket per turn at most.
const FEED_READS_MAX: usize = 256;
/// Connections accepted per turn at most.
const ACCEPTS_MAX: usize = 64;
/// Bytes read from one stream per turn at most.
const READ_CHUNK: usize = 64 << 10;
/// Receive buffer of a feed socket (the open's bursts).
const FEED_RECV_BUFFER: usize = 8 << 20;
/// Feed sockets one server reads at most (an A and a B line, and spares).
pub const FEEDS_MAX: usize = 4;
/// Readiness events taken per look.
const EVENTS_MAX: usize = 64;

fn epoll() -> std::io::Result<Epoll> {
    Ok(Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?)
}

/// What a snapshot server is told.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// UDP addresses the feed arrives at (MoldUDP64; an A and a B line may both).
    pub feeds: Vec<SocketAddr>,
    pub service: ServiceConfig,
}

/// What the snapshot service is told, wherever it runs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// TCP address logins arrive at.
    pub listen: SocketAddr,
    pub credentials: Credentials,
    pub gap_wait_ns: u64,
    pub orders_max: usize,
    pub connections_max: usize,
    pub per_address_max: usize,
    pub connects_per_s_max: u32,
}

impl ServiceConfig {
    /// A service on `listen` with the default limits, any login accepted.
    pub fn new(listen: SocketAddr) -> Self {
        use fairfeed_feed::snapshot::serve as d;
        Self {
            listen,
            credentials: Credentials::default(),
            gap_wait_ns: fairfeed_feed::snapshot::GAP_WAIT_DEFAULT_NS,
            orders_max: fairfeed_feed::book::ORDERS_DEFAULT_MAX,
            connections_max: d::CONNECTIONS_DEFAULT_MAX,
            per_address_max: d::PER_ADDRESS_DEFAULT_MAX,
            connects_per_s_max: d::CONNECTS_PER_S_DEFAULT_MAX,
        }
    }
}

/// What the server did, for `--metrics` and its final report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ServerReport {
    pub serving: bool,
    /// Why the books are not served, in words (while they are not).
    pub not_serving: Option<String>,
    pub next_sequence: u64,
    pub open_orders: usize,
    pub feed: FollowStats,
    pub books: BookStats,
    pub accepted: u64,
    pub refused: BTreeMap<&'static str, u64>,
    pub closed: BTreeMap<&'static str, u64>,
    pub open: usize,
    pub snapshots_sent: u64,
    pub snapshot_messages_sent: u64,
    pub bytes_sent: u64,
    pub feed_read_errors: u64,
    /// Feed datagrams the kernel dropped for want of room in the sockets'
    /// buffers (e.g. while a large snapshot was built): a gap the books then
    /// wait for, and go stale on if no other line fills it.
    pub feed_socket_drops: u64,
}

struct Conn {
    stream: TcpStream,
    ip: IpAddr,
    core: ServerConn,
    /// Whether the epoll set also watches it for room to write.
    watching_out: bool,
}

/// Serves snapshots of the books of a feed it is handed packet by packet:
/// the listener, the connections and the follower, without feed sockets of
/// its own — inside a [`SnapshotServerAgent`] that reads the feed from UDP,
/// or inside a sender's feed agent, handed each packet it sends down the
/// tree (`fairfeed sender --snapshot-listen`).
pub struct SnapshotService {
    listener: TcpListener,
    poll: Epoll,
    conns: Vec<Option<Conn>>,
    follower: Follower,
    admission: Admission,
    credentials: Credentials,
    report: ServerReport,
    buf: Vec<u8>,
    events: Vec<EpollEvent>,
}

impl SnapshotService {
    /// Binds the listener.
    pub fn new(cfg: &ServiceConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind(cfg.listen)?;
        listener.set_nonblocking(true)?;
        Ok(Self {
            listener,
            poll: epoll()?,
            conns: Vec::new(),
            follower: Follower::new(cfg.gap_wait_ns, cfg.orders_max),
            admission: Admission::new(cfg.connections_max, cfg.per_address_max, cfg.connects_per_s_max),
            credentials: cfg.credentials.clone(),
            report: ServerReport::default(),
            buf: vec![0u8; READ_CHUNK],
            events: vec![EpollEvent::empty(); EVENTS_MAX],
        })
    }

    /// The address logins go to (with its port when 0 was asked for).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// What it did so far.
    pub fn report(&self) -> ServerReport {
        let mut r = self.report.clone();
        let standing = self.follower.standing();
        r.serving = standing.is_ok();
        r.not_serving = standing.err().map(|e| e.to_string());
        r.next_sequence = self.follower.next_sequence();
        r.open_orders = self.follower.books().orders();
        r.feed = *self.follower.stats();
        r.books = *self.follower.book_stats();
        r.open = self.admission.open();
        r
    }

    /// One datagram of the feed, at `now` (wall ns).
    pub fn take_packet(&mut self, now: u64, p: &[u8]) {
        self.follower.on_packet(now, p);
    }

    /// Accepts, reads, writes and times out; returns the work done.
    pub fn service(&mut self, now: u64) -> usize {
        self.follower.on_tick(now);
        self.accept(now) + self.service_conns(now)
    }

    /// When [`Self::service`] next has something due (`u64::MAX`: nothing).
    pub fn next_due(&self) -> u64 {
        let conns = self.conns.iter().flatten().map(|c| c.core.next_due()).min().unwrap_or(u64::MAX);
        self.follower.next_due().min(conns)
    }

    /// The listener and the connections' `epoll` set.
    pub fn fds(&self) -> [BorrowedFd<'_>; 2] {
        [self.listener.as_fd(), self.poll.0.as_fd()]
    }

    fn accept(&mut self, now: u64) -> usize {
        let mut n = 0;
        for _ in 0..ACCEPTS_MAX {
            let (stream, from) = match self.listener.accept() {
                Ok(x) => x,
                Err(_) => break,
            };
            n += 1;
            if let Err(why) = self.admission.admit(from.ip(), now) {
                *self.report.refused.entry(why.kind()).or_default() += 1;
                continue;
            }
            let slot = self.conns.iter().position(Option::is_none).unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            let ok = stream.set_nonblocking(true).is_ok()
                && self.poll.add(&stream, EpollEvent::new(EpollFlags::EPOLLIN, slot as u64)).is_ok();
            if !ok {
                self.admission.release(from.ip());
                *self.report.refused.entry("io").or_default() += 1;
                continue;
            }
            let _ = stream.set_nodelay(true);
            self.report.accepted += 1;
            self.conns[slot] = Some(Conn { stream, ip: from.ip(), core: ServerConn::new(now), watching_out: false });
        }
        n
    }

    fn close(&mut self, i: usize, why: &Close) {
        let Some(c) = self.conns[i].take() else { return };
        let _ = self.poll.delete(&c.stream);
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
        self.admission.release(c.ip);
        if *why == Close::Done {
            self.report.snapshots_sent += 1;
            self.report.snapshot_messages_sent += c.core.snapshot_messages as u64;
        }
        *self.report.closed.entry(why.kind()).or_default() += 1;
    }

    /// Reads what a connection sent; false when it ended.
    fn read_conn(&mut self, i: usize, now: u64) -> Option<Close> {
        let c = self.conns[i].as_mut()?;
        let follower = &mut self.follower;
        loop {
            match c.stream.read(&mut self.buf) {
                Ok(0) => return Some(c.core.on_peer_closed()),
                Ok(k) => {
                    if let Err(why) =
                        c.core.on_bytes(now, &self.buf[..k], &self.credentials, &mut || follower.snapshot())
                    {
                        return Some(why);
                    }
                    if k < self.buf.len() {
                        return None;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
                Err(_) => return Some(c.core.on_peer_closed()),
            }
        }
    }

    /// Writes what a connection has waiting; its end once everything is out.
    fn write_conn(&mut self, i: usize, now: u64) -> Option<Close> {
        let c = self.conns[i].as_mut()?;
        while !c.core.unsent().is_empty() {
            match c.stream.write(c.core.unsent()) {
                Ok(k) => {
                    self.report.bytes_sent += k as u64;
                    c.core.wrote(k, now);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return Some(c.core.on_peer_closed()),
            }
        }
        let want_out = !c.core.unsent().is_empty();
        if want_out != c.watching_out {
            let flags = if want_out { EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT } else { EpollFlags::EPOLLIN };
            let _ = self.poll.modify(&c.stream, &mut EpollEvent::new(flags, i as u64));
            c.watching_out = want_out;
        }
        if let Err(why) = c.core.on_tick(now) {
            return Some(why);
        }
        c.core.finished().cloned()
    }

    fn service_conns(&mut self, now: u64) -> usize {
        let n = self.poll.wait(&mut self.events, EpollTimeout::ZERO).unwrap_or(0);
        let ready: Vec<(usize, EpollFlags)> =
            self.events[..n].iter().map(|e| (e.data() as usize, e.events())).collect();
        for (i, flags) in ready {
            if flags.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
                if let Some(why) = self.read_conn(i, now) {
                    self.close(i, &why);
                }
            }
        }
        for i in 0..self.conns.len() {
            if let Some(why) = self.write_conn(i, now) {
                self.close(i, &why);
            }
        }
        n
    }
}

/// The snapshot server's part on its counters board.
pub const SERVER_PART: &str = "snapshot-server";

/// Follows a feed from UDP sockets and serves snapshots of it.
pub struct SnapshotServerAgent {
    feeds: Vec<UdpSocket>,
    service: SnapshotService,
    poster: Option<Poster>,
    until: u64,
    buf: Vec<u8>,
}

impl SnapshotServerAgent {
    /// Binds the feed sockets and the listener; serves until `until` (wall
    /// ns), posting its report to `board` (as [`SERVER_PART`]) where given.
    pub fn new(cfg: &ServerConfig, board: Option<&Arc<Board>>, until: u64) -> std::io::Result<Self> {
        assert!(!cfg.feeds.is_empty() && cfg.feeds.len() <= FEEDS_MAX, "1..={FEEDS_MAX} feeds");
        let feeds = cfg
            .feeds
            .iter()
            .map(|a| {
                let s = fairfeed_io::socket::bind_udp(*a, FEED_RECV_BUFFER)?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let service = SnapshotService::new(&cfg.service)?;
        let poster = board.map(|b| b.poster(SERVER_PART)).transpose().map_err(std::io::Error::other)?;
        Ok(Self { feeds, service, poster, until, buf: vec![0u8; READ_CHUNK] })
    }

    /// The address logins go to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.service.local_addr()
    }

    /// The feed sockets' addresses.
    pub fn feed_addrs(&self) -> std::io::Result<Vec<SocketAddr>> {
        self.feeds.iter().map(UdpSocket::local_addr).collect()
    }

    /// What it did so far.
    pub fn report(&self) -> ServerReport {
        let mut r = self.service.report();
        r.feed_socket_drops = self.feeds.iter().filter_map(fairfeed_io::socket::udp_drops).sum();
        r
    }

    fn read_feeds(&mut self, now: u64) -> usize {
        let mut n = 0;
        for s in &self.feeds {
            for _ in 0..FEED_READS_MAX {
                match s.recv(&mut self.buf) {
                    Ok(k) => {
                        self.service.take_packet(now, &self.buf[..k]);
                        n += 1;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        self.service.report.feed_read_errors += 1;
                        break;
                    }
                }
            }
        }
        n
    }
}

impl Agent for SnapshotServerAgent {
    fn role(&self) -> &'static str {
        "snapshot-server"
    }

    fn do_work(&mut self, now: u64, _turn: Turn) -> usize {
        let mut work = self.read_feeds(now);
        work += self.service.service(now);
        if self.poster.as_mut().is_some_and(|p| p.due(now)) {
            let r = serde_json::to_value(self.report()).unwrap_or_default();
            if let Some(p) = &self.poster {
                p.post(r, Vec::new());
            }
        }
        work
    }

    fn next_due(&self) -> u64 {
        let publish = self.poster.as_ref().map_or(u64::MAX, Poster::next_ns);
        self.service.next_due().min(publish).min(self.until)
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds: Vec<BorrowedFd<'_>> = self.feeds.iter().map(AsFd::as_fd).collect();
        fds.extend(self.service.fds());
        fds
    }

    fn is_done(&self) -> bool {
        fairfeed_io::clock::wall_ns() >= self.until
    }
}

/// A joining receiver's side: connects to the snapshot server when its
/// [`Joiner`] asks, feeds it the bytes, closes when it is done.
pub struct SnapshotClient {
    server: SocketAddr,
    joiner: Joiner,
    conn: Option<ClientConn>,
    poll: Epoll,
    events: Vec<EpollEvent>,
    buf: Vec<u8>,
}

struct ClientConn {
    stream: TcpStream,
    connected: bool,
    login: Vec<u8>,
    sent: usize,
}

impl SnapshotClient {
    pub fn new(server: SocketAddr, user: &str, password: &str, now: u64) -> std::io::Result<Self> {
        Ok(Self {
            server,
            joiner: Joiner::new(now, user, password),
            conn: None,
            poll: epoll()?,
            events: vec![EpollEvent::empty(); 4],
            buf: vec![0u8; READ_CHUNK],
        })
    }

    pub fn stats(&self) -> &JoinStats {
        self.joiner.stats()
    }

    pub fn joined(&self) -> bool {
        self.joiner.joined()
    }

    /// The descriptor readable when the connection has something.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.poll.0.as_fd()
    }

    pub fn next_due(&self) -> u64 {
        self.joiner.next_due()
    }

    /// A released live packet; what the application gets goes to `out`.
    pub fn on_live(&mut self, now: u64, p: &[u8], out: &mut impl FnMut(&[u8])) {
        self.joiner.on_live(now, p, out);
    }

    fn drop_conn(&mut self) {
        if let Some(c) = self.conn.take() {
            let _ = self.poll.delete(&c.stream);
        }
    }

    /// Starts a non-blocking connect (no turn ever waits for the server).
    fn connect(&mut self, now: u64) {
        let started = (|| -> std::io::Result<TcpStream> {
            let s = Socket::new(Domain::for_address(self.server), Type::STREAM, Some(Protocol::TCP))?;
            s.set_nonblocking(true)?;
            s.set_nodelay(true)?;
            match s.connect(&SockAddr::from(self.server)) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                Err(e) => return Err(e),
            }
            let stream: TcpStream = s.into();
            self.poll.add(&stream, EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT, 0))?;
            Ok(stream)
        })();
        match started {
            Ok(stream) => {
                let login = self.joiner.login(now);
                self.conn = Some(ClientConn { stream, connected: false, login, sent: 0 });
            }
            Err(e) => self.joiner.connect_failed(now, &e.to_string()),
        }
    }

    /// Connects, writes the login, reads the snapshot; returns work done.
    pub fn service(&mut self, now: u64, out: &mut impl FnMut(&[u8])) -> usize {
        if self.conn.is_none() && self.joiner.want_fetch(now) {
            self.connect(now);
            return 1;
        }
        if self.joiner.on_tick(now) {
            self.drop_conn();
            return 1;
        }
        let n = self.poll.wait(&mut self.events, EpollTimeout::ZERO).unwrap_or(0);
        if n == 0 {
            return 0;
        }
        let Some(c) = self.conn.as_mut() else { return 0 };
        if !c.connected {
            match c.stream.take_error() {
                Ok(None) if c.stream.peer_addr().is_ok() => c.connected = true,
                Ok(None) => return 0,
                Ok(Some(e)) | Err(e) => {
                    self.drop_conn();
                    self.joiner.connect_failed(now, &e.to_string());
                    return 1;
                }
            }
        }
        while c.sent < c.login.len() {
            match c.stream.write(&c.login[c.sent..]) {
                Ok(k) => c.sent += k,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => break,
            }
        }
        if c.sent == c.login.len() {
            let _ = self.poll.modify(&c.stream, &mut EpollEvent::new(EpollFlags::EPOLLIN, 0));
        }
        while let Some(c) = self.conn.as_mut() {
            match c.stream.read(&mut self.buf) {
                Ok(0) => {
                    self.drop_conn();
                    self.joiner.stream_closed(now);
                    break;
                }
                Ok(k) => {
                    if self.joiner.on_stream(now, &self.buf[..k], out) == JoinStream::Finished {
                        self.drop_conn();
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.drop_conn();
                    self.joiner.stream_closed(now);
                    break;
                }
            }
        }
        1
    }
}

/// Runs a snapshot server on this thread until `until` (wall ns) or `stop`.
pub fn run_server(
    cfg: &ServerConfig,
    board: Option<&Arc<Board>>,
    until: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::io::Result<ServerReport> {
    let mut agent = SnapshotServerAgent::new(cfg, board, until)?;
    let run = fairfeed_io::agent::RunConfig { stop: Some(stop), ..Default::default() };
    fairfeed_io::agent::run(&mut [&mut agent], &run)?;
    Ok(agent.report())
}
