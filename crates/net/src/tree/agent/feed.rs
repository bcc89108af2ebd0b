//! A sender's feed as an agent: hands each MoldUDP64 packet to the node —
//! a scheduled one at its time, or a live one (`--listen`) as it arrives —
//! keeps the journal of what it handed, and answers retransmission requests
//! from it on a socket of its own.

use std::collections::VecDeque;
use std::net::UdpSocket;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use fairfeed_arb::retransmit::{Journal, RetransmitServer, ServerConfig};
use fairfeed_clock::skew::Skew;
use fairfeed_io::agent::{Agent, Turn};
use fairfeed_tree::ingress::{Ingress, Verdict};
use serde_json::json;

use super::control::{Life, NodePoster as Poster, TreePart};
use super::{wall_ns, AgentError, SenderJob, TimeBase};
use fairfeed_io::counters::Board;
use fairfeed_io::mailbox::Outgoing;
use fairfeed_io::socket::bind_udp;

/// Packets handed to the node in one turn at most (the rest next turn).
const TURN_PACKETS_MAX: usize = 64;
/// Live packets read in one turn at most.
const LIVE_READ_MAX: usize = 256;
/// Live packets waiting for room in the node's queue at most; beyond it
/// they are dropped and counted (the tree cannot keep up with the feed).
pub const LIVE_BACKLOG_MAX: usize = 65_536;
/// Receive buffer of the live feed's socket (bursts at the open).
const LIVE_RECV_BUFFER: usize = 8 << 20;
/// A sender with a journal sends a MoldUDP64 heartbeat (the session and the
/// next sequence number, no message) down the tree after this long without
/// a packet, as a MoldUDP64 server does while its feed is idle: a receiver
/// whose last packets were lost — a subtree cut off at the feed's end, a
/// joiner that came after it — learns where the line ends, and fills the
/// rest from the journal. Not journaled; no sequence number of its own.
pub const HEARTBEAT_NS: u64 = 250_000_000;

/// A live feed: its socket, what it checks, what waits for the node.
struct Live {
    sock: UdpSocket,
    ingress: Ingress,
    backlog: VecDeque<Vec<u8>>,
    backlog_dropped: u64,
    backlog_max: usize,
    read_errors: u64,
}

/// The retransmission server a sender runs over its own journal.
struct Journaled {
    server: RetransmitServer,
    sock: UdpSocket,
    answers: u64,
    journal_errors: u64,
    /// Times the journal started over (a new session, or a hole upstream it cannot span).
    journal_restarts: u64,
}

impl Journaled {
    /// Journals one packet sent down the tree; a new session or a hole
    /// upstream starts the journal over at it (the server answers what it holds).
    fn append(&mut self, p: &[u8]) {
        use fairfeed_arb::retransmit::JournalError;
        match self.server.journal_mut().append_packet(p) {
            Ok(()) => {}
            Err(JournalError::OtherSession | JournalError::Gap { .. }) => {
                *self.server.journal_mut() = Journal::new();
                self.journal_restarts += 1;
                if self.server.journal_mut().append_packet(p).is_err() {
                    self.journal_errors += 1;
                }
            }
            Err(_) => self.journal_errors += 1,
        }
    }
}

/// A sender's schedule: packet `k` is due at `t0 + k × gap` on the node's clock.
pub struct FeedAgent {
    job: SenderJob,
    t0: u64,
    gap_ns: u64,
    next: usize,
    last_sent_ns: u64,
    journal: Option<Journaled>,
    live: Option<Live>,
    out: Outgoing<Vec<u8>>,
    /// Turns the node's queue was full.
    queue_full: u64,
    skew: Skew,
    time: TimeBase,
    life: Arc<Life>,
    poster: Option<Poster>,
    scratch: Vec<u8>,
    /// Copies of what it sends, for the snapshot agent (`--snapshot-listen`).
    snapshot: Option<SnapshotFeed>,
    /// Local time of the last heartbeat, and how many went.
    last_beat_ns: u64,
    heartbeats: u64,
}

/// The snapshot agent's part on the board its feed reads.
pub const SNAPSHOT_PART: &str = "snapshots";

/// The copies a sender hands its snapshot agent.
pub struct SnapshotFeed {
    pub out: Outgoing<Vec<u8>>,
    /// Where the snapshot agent posts its report (as [`SNAPSHOT_PART`]).
    pub report: Arc<Board>,
    /// Copies dropped with its mailbox full (its books then see a gap).
    dropped: u64,
}

impl SnapshotFeed {
    pub fn new(out: Outgoing<Vec<u8>>, report: Arc<Board>) -> Self {
        Self { out, report, dropped: 0 }
    }

    fn copy(&mut self, p: &[u8]) {
        if self.out.push(p.to_vec()).is_err() {
            self.dropped += 1;
        }
    }
}

impl FeedAgent {
    /// The feed of `job`, starting at wall time `now`, into `out`.
    pub fn new(
        job: &SenderJob,
        now: u64,
        out: Outgoing<Vec<u8>>,
        (skew, time): (Skew, TimeBase),
        life: Arc<Life>,
        poster: Option<Poster>,
    ) -> Result<Self, AgentError> {
        if job.listen.is_none() && (job.rate_per_s.is_nan() || job.rate_per_s <= 0.0) {
            return Err(AgentError::Config("the sender's rate must be positive".into()));
        }
        let live = match job.listen {
            None => None,
            Some(a) => Some(Live {
                sock: bind_udp(a, LIVE_RECV_BUFFER)
                    .map_err(|e| AgentError::Io(format!("binding the live feed's socket to {a}"), e))?,
                ingress: Ingress::new(),
                backlog: VecDeque::new(),
                backlog_dropped: 0,
                backlog_max: 0,
                read_errors: 0,
            }),
        };
        let journal = match job.retransmit_listen {
            None => None,
            Some(a) => Some(Journaled {
                server: RetransmitServer::new(Journal::new(), ServerConfig::default()),
                sock: bind_udp(a, 1 << 20)
                    .map_err(|e| AgentError::Io(format!("binding the retransmission server to {a}"), e))?,
                answers: 0,
                journal_errors: 0,
                journal_restarts: 0,
            }),
        };
        let local = skew.local(time.at(now));
        Ok(FeedAgent {
            job: job.clone(),
            t0: local + job.start_delay_ns,
            gap_ns: if live.is_some() { 0 } else { (1e9 / job.rate_per_s) as u64 },
            next: 0,
            last_sent_ns: local,
            journal,
            live,
            out,
            queue_full: 0,
            skew,
            time,
            life,
            poster,
            scratch: vec![0u8; 2048],
            snapshot: None,
            last_beat_ns: local,
            heartbeats: 0,
        })
    }

    /// Hands a copy of every packet it sends to a snapshot agent.
    pub fn with_snapshot(mut self, f: SnapshotFeed) -> Self {
        self.snapshot = Some(f);
        self
    }

    /// Where a live feed is taken from.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self.live.as_ref().and_then(|l| l.sock.local_addr().ok())
    }

    fn local_at(&self, wall: u64) -> u64 {
        self.skew.local(self.time.at(wall))
    }

    fn wall_at_local(&self, local: u64) -> u64 {
        super::wall_at_local(&self.skew, &self.time, local)
    }

    /// Hands over the packets due at `local`; returns how many.
    fn hand_over(&mut self, local: u64) -> usize {
        let mut n = 0;
        while self.next < self.job.payloads.len() && local >= self.t0 + self.next as u64 * self.gap_ns {
            if n == TURN_PACKETS_MAX {
                break;
            }
            let p = &self.job.payloads[self.next];
            if self.out.push(p.clone()).is_err() {
                // The node is behind: try again next turn, in order.
                self.queue_full += 1;
                break;
            }
            if let Some(j) = &mut self.journal {
                j.append(p);
            }
            if let Some(s) = &mut self.snapshot {
                s.copy(p);
            }
            self.next += 1;
            self.last_sent_ns = local;
            n += 1;
        }
        if n > 0 {
            self.out.wake();
        }
        n
    }

    /// Answers retransmission requests; returns how many it read.
    fn serve(&mut self, now: u64) -> usize {
        let Some(j) = &mut self.journal else { return 0 };
        let mut out = [0u8; fairfeed_wire::moldudp64::PACKET_LEN_DEFAULT_MAX];
        let mut n = 0;
        while let Ok((len, from)) = j.sock.recv_from(&mut self.scratch) {
            n += 1;
            if let Some(k) = j.server.handle_request(now, from, &self.scratch[..len], &mut out) {
                if j.sock.send_to(&out[..k], from).is_ok() {
                    j.answers += 1;
                }
            }
        }
        n
    }

    /// Reads the live feed and hands the node what it should forward, in
    /// arrival order (what the node has no room for waits, bounded); returns
    /// how many datagrams it read or handed.
    fn take_live(&mut self, local: u64) -> usize {
        let Some(l) = &mut self.live else { return 0 };
        let mut n = 0;
        // What waited first.
        while let Some(p) = l.backlog.pop_front() {
            match self.out.push(p) {
                Ok(()) => n += 1,
                Err(p) => {
                    l.backlog.push_front(p);
                    self.queue_full += 1;
                    break;
                }
            }
        }
        let mut buf = [0u8; 65_536];
        for _ in 0..LIVE_READ_MAX {
            let len = match l.sock.recv(&mut buf) {
                Ok(len) => len,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    l.read_errors += 1;
                    break;
                }
            };
            n += 1;
            let p = &buf[..len];
            if l.ingress.handle(p) != Verdict::Forward {
                continue;
            }
            if let Some(j) = &mut self.journal {
                j.append(p);
            }
            if let Some(s) = &mut self.snapshot {
                s.copy(p);
            }
            self.next += 1;
            self.last_sent_ns = local;
            if !l.backlog.is_empty() {
                if l.backlog.len() >= LIVE_BACKLOG_MAX {
                    l.backlog_dropped += 1;
                } else {
                    l.backlog.push_back(p.to_vec());
                }
            } else if let Err(p) = self.out.push(p.to_vec()) {
                self.queue_full += 1;
                l.backlog.push_back(p);
            }
        }
        l.backlog_max = l.backlog_max.max(l.backlog.len());
        if n > 0 {
            self.out.wake();
        }
        n
    }

    /// Where the journal's line ends: its session and the next sequence
    /// number (what a heartbeat announces; `None`: no journal, or nothing in it).
    fn line_end(&self) -> Option<(fairfeed_wire::moldudp64::Session, u64)> {
        let j = self.journal.as_ref()?.server.journal();
        Some((j.session()?, j.next_seq()))
    }

    /// When the next heartbeat is due (local ns; `u64::MAX`: none — no
    /// journal to fill from, or no packet yet).
    fn beat_due(&self) -> u64 {
        match self.line_end() {
            Some(_) => self.last_sent_ns.max(self.last_beat_ns).saturating_add(HEARTBEAT_NS),
            None => u64::MAX,
        }
    }

    /// Sends a heartbeat down the tree if one is due at `local`.
    fn beat(&mut self, local: u64) -> usize {
        let Some((session, next)) = self.line_end() else { return 0 };
        if local < self.beat_due() || self.out.is_closed() {
            return 0;
        }
        let mut b = [0u8; fairfeed_wire::moldudp64::HEADER_LEN];
        let Ok(hb) = fairfeed_wire::moldudp64::PacketBuilder::new(&mut b, session, next) else { return 0 };
        let len = hb.finish();
        if self.out.push(b[..len].to_vec()).is_err() {
            self.queue_full += 1;
            return 0;
        }
        self.out.wake();
        self.last_beat_ns = local;
        self.heartbeats += 1;
        1
    }

    fn all_handed(&self) -> bool {
        self.live.is_none() && self.next >= self.job.payloads.len()
    }

    /// Its counters, as they go into the node's report.
    pub fn counters(&self) -> serde_json::Value {
        let mut c = json!({
            "feed_sent": self.next,
            "feed_total": self.job.payloads.len(),
            "feed_queue_full": self.queue_full,
            "heartbeats": self.heartbeats,
        });
        if let Some(l) = &self.live {
            c["feed_total"] = serde_json::Value::Null;
            c["live"] = json!({
                "listen": l.sock.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                "ingress": l.ingress.stats,
                "position": l.ingress.position().map(|(s, q)| json!({
                    "session": String::from_utf8_lossy(&s.0).trim_end().to_string(),
                    "next_sequence": q,
                })),
                "backlog": l.backlog.len(),
                "backlog_max": l.backlog_max,
                "backlog_dropped": l.backlog_dropped,
                "read_errors": l.read_errors,
            });
        }
        if let Some(j) = &self.journal {
            c["retransmit_answers"] = j.answers.into();
            c["journal_errors"] = j.journal_errors.into();
            c["journal_restarts"] = j.journal_restarts.into();
            c["journal_evicted"] = j.server.journal().evicted().into();
            c["retransmit_server"] = serde_json::to_value(j.server.stats()).unwrap_or_default();
        }
        if let Some(s) = &self.snapshot {
            c["snapshot"] = s.report.value(SNAPSHOT_PART).unwrap_or_default();
            c["snapshot"]["copies_dropped"] = s.dropped.into();
        }
        c
    }
}

impl Agent for FeedAgent {
    fn role(&self) -> &'static str {
        "feed"
    }

    fn do_work(&mut self, now: u64, turn: Turn) -> usize {
        let local = self.local_at(now);
        let mut work = if self.live.is_some() { self.take_live(local) } else { self.hand_over(local) };
        work += self.beat(local);
        if turn == Turn::All {
            work += self.serve(local);
        }
        if let Some(s) = &self.snapshot {
            if work > 0 {
                s.out.wake();
            }
        }
        if !self.out.is_closed() && self.all_handed() && local.saturating_sub(self.last_sent_ns) >= self.job.linger_ns {
            // Sent, and lingered for the last reports and retransmissions.
            self.out.close();
            work += 1;
        }
        if let Some(mut p) = self.poster.take() {
            p.post_due(now, || TreePart::Counters(self.counters()));
            self.poster = Some(p);
        }
        work
    }

    fn next_due(&self) -> u64 {
        let poster = self.poster.as_ref().map_or(u64::MAX, Poster::next_ns);
        let beat = if self.out.is_closed() || self.beat_due() == u64::MAX {
            u64::MAX
        } else {
            self.wall_at_local(self.beat_due())
        };
        if let Some(l) = &self.live {
            // Woken by its socket; a backlog is retried at once.
            return if l.backlog.is_empty() { poster.min(beat) } else { 0 };
        }
        let l = if self.all_handed() {
            self.last_sent_ns.saturating_add(self.job.linger_ns)
        } else {
            self.t0 + self.next as u64 * self.gap_ns
        };
        let due = if self.out.is_closed() { u64::MAX } else { self.wall_at_local(l) };
        due.min(poster).min(beat)
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds: Vec<BorrowedFd<'_>> = self.journal.iter().map(|j| j.sock.as_fd()).collect();
        fds.extend(self.live.iter().map(|l| l.sock.as_fd()));
        fds.extend(self.poster.iter().map(Poster::fd));
        fds
    }

    fn is_done(&self) -> bool {
        self.out.is_closed() || self.life.over(wall_ns())
    }
}
