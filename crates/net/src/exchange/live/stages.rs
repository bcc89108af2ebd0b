//! The threaded pipeline's other stages: an engine agent per shard and the
//! ITCH publisher (also driven inline by the run-to-completion gateway).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use fairfeed_arb::retransmit::{Journal, RetransmitServer, ServerConfig};
use fairfeed_exchange::engine::{Command, Engine, Event};
use fairfeed_exchange::itch_out::ItchWriter;
use fairfeed_io::agent::{self, Agent, RunConfig, Turn};
use fairfeed_io::clock::wall_ns;
use fairfeed_io::mailbox::{mailbox, Incoming, Outgoing};

use super::{ended, ns, Board, Cmd, ExchangeConfig, InBatch, Matching, Out, Part, Poster, PUBLISH_NS, RING_SLOTS};
use super::{ENGINE_PART_PREFIX, PUBLISHER_PART};

/// The threaded pipeline's engine and publisher agents, each on a thread of
/// its own, and the gateway's ends of their mailboxes.
pub(super) fn start_threads(
    cfg: &ExchangeConfig,
    (start, run): (Instant, &RunConfig),
    metrics: &Option<Arc<Board>>,
    threads: &mut Vec<thread::JoinHandle<Vec<Part>>>,
) -> std::io::Result<Matching> {
    let (mut cmd_tx, mut to_gw, mut pub_rx) = (Vec::new(), Vec::new(), Vec::new());
    for shard in 0..cfg.engines {
        let (tx, cmds) = mailbox::<Cmd>(RING_SLOTS)?;
        let (to_gateway, gw_rx) = mailbox::<Out>(RING_SLOTS)?;
        let (to_pub, prx) = mailbox::<Event>(RING_SLOTS)?;
        cmd_tx.push(tx);
        to_gw.push(gw_rx);
        pub_rx.push(prx);
        let a = EngineAgent {
            e: Engine::new(cfg.limits, shard as u64, cfg.engines as u64),
            start,
            cmds,
            to_gw: to_gateway,
            to_pub,
            events: Vec::with_capacity(64),
            in_batch: Vec::new(),
            poster: poster(metrics, format!("{ENGINE_PART_PREFIX}{shard}"))?,
            next_publish: 0,
            dirty: true,
        };
        let name = format!("engine-{shard}");
        let thread = name.clone();
        threads.push(agent::spawn(&thread, run.clone(), move || a, move |mut a, r| ended(&name, &r, vec![a.close()]))?);
    }
    let p = PublisherAgent { p: Publisher::new(cfg)?, rx: pub_rx, poster: poster(metrics, PUBLISHER_PART.into())? };
    threads.push(agent::spawn(
        "publisher",
        run.clone(),
        move || p,
        |mut a, r| ended("publisher", &r, vec![a.p.close()]),
    )?);
    Ok(Matching::Threaded { cmd_tx, to_gw })
}

/// A poster named `name` on `board`, where there is one.
fn poster(board: &Option<Arc<Board>>, name: String) -> std::io::Result<Option<Poster>> {
    board.as_ref().map(|b| b.poster(name)).transpose().map_err(std::io::Error::other)
}

/// One engine shard on a thread of its own (threaded pipeline): commands in
/// from the gateway, events out to the gateway (OUCH) and the publisher (ITCH).
struct EngineAgent {
    e: Engine,
    /// The origin of the steps' timestamps (the gateway's).
    start: Instant,
    cmds: Incoming<Cmd>,
    to_gw: Outgoing<Out>,
    to_pub: Outgoing<Event>,
    /// One command's events (kept for its allocation).
    events: Vec<Event>,
    /// The parts of the batch being gathered (ordering `batch`).
    in_batch: Vec<Command>,
    /// Its part on the exchange's counters board.
    poster: Option<Poster>,
    /// Counters are published at most every `PUBLISH_NS` while busy, and
    /// when it goes idle (an idle engine's counters do not change).
    next_publish: u64,
    dirty: bool,
}

impl EngineAgent {
    /// Matches one command, its events handed on (waiting while a mailbox is full).
    fn handle(&mut self, c: Cmd) {
        let t1 = ns(self.start);
        self.events.clear();
        let events = &mut self.events;
        match c.batch {
            InBatch::No => self.e.handle(c.cmd, &mut |ev| events.push(ev)),
            InBatch::Part => return self.in_batch.push(c.cmd),
            InBatch::Last => {
                self.in_batch.push(c.cmd);
                self.e.handle_batch(&self.in_batch, &mut |ev| events.push(ev));
                self.in_batch.clear();
            }
        }
        let t2 = ns(self.start);
        let k = self.events.len();
        for (i, ev) in self.events.iter().enumerate() {
            push_waiting(&mut self.to_gw, Out { ev: *ev, t0: c.t0, t1, t2, last: i + 1 == k });
            push_waiting(&mut self.to_pub, *ev);
        }
    }

    fn publish(&mut self) {
        if let Some(p) = &self.poster {
            self.next_publish = ns(self.start) + PUBLISH_NS;
            p.post(serde_json::to_value(self.e.stats).unwrap_or_default(), Vec::new());
        }
        self.dirty = false;
    }

    fn close(&mut self) -> Part {
        self.publish();
        Part::Engine(self.e.stats)
    }
}

/// Queues `v`, waking the consumer and yielding while its mailbox is full.
fn push_waiting<T>(to: &mut Outgoing<T>, mut v: T) {
    while let Err(back) = to.push(v) {
        v = back;
        to.wake();
        thread::yield_now();
    }
}

impl Agent for EngineAgent {
    fn role(&self) -> &'static str {
        "engine"
    }

    fn do_work(&mut self, _now: u64, _turn: Turn) -> usize {
        let mut n = 0;
        while let Some(c) = self.cmds.pop() {
            self.handle(c);
            n += 1;
        }
        if n == 0 {
            if self.dirty {
                self.publish();
            }
            return 0;
        }
        self.to_pub.wake();
        self.to_gw.wake();
        self.dirty = true;
        if ns(self.start) >= self.next_publish {
            self.publish();
        }
        n
    }

    fn next_due(&self) -> u64 {
        u64::MAX
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.cmds.fd()]
    }

    fn is_done(&self) -> bool {
        false
    }

    fn before_park(&mut self) -> bool {
        self.cmds.arm()
    }

    fn after_park(&mut self) {
        self.cmds.disarm();
    }
}

/// The ITCH side: events in, MoldUDP64 packets out on the A and B lines, the
/// journal of what was sent, retransmission answers, heartbeats on a quiet
/// line. Driven by the publisher thread (threaded pipeline) or inline by
/// the one thread of the run-to-completion pipeline.
pub(super) struct Publisher {
    w: ItchWriter,
    sock: UdpSocket,
    lines: [Option<SocketAddr>; 2],
    server: RetransmitServer,
    pub(super) retrans: Option<UdpSocket>,
    heartbeat_ns: u64,
    last_sent: u64,
    packets: u64,
    answers: u64,
    heartbeats: u64,
    start: Instant,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl Publisher {
    pub(super) fn new(cfg: &ExchangeConfig) -> std::io::Result<Self> {
        let sock = UdpSocket::bind("0.0.0.0:0")?;
        let retrans = match cfg.retransmit_listen {
            Some(a) => {
                let s = UdpSocket::bind(a)?;
                s.set_nonblocking(true)?;
                Some(s)
            }
            None => None,
        };
        let mut p = Publisher {
            w: ItchWriter::new(&cfg.itch_session, &cfg.gateway.symbols),
            sock,
            lines: [cfg.itch_a, cfg.itch_b],
            server: RetransmitServer::new(Journal::with_limit(cfg.itch_journal_max_bytes), ServerConfig::default()),
            retrans,
            heartbeat_ns: cfg.itch_heartbeat_ns,
            last_sent: wall_ns(),
            packets: 0,
            answers: 0,
            heartbeats: 0,
            start: Instant::now(),
            buf: vec![0u8; 2048],
            out: vec![0u8; 1400],
        };
        p.w.open(wall_ns());
        p.send(wall_ns());
        Ok(p)
    }

    fn send(&mut self, now: u64) {
        let packets = self.w.take_packets();
        for pk in &packets {
            for to in self.lines.into_iter().flatten() {
                let _ = self.sock.send_to(pk, to);
            }
            let _ = self.server.journal_mut().append_packet(pk);
            self.packets += 1;
            self.last_sent = now;
        }
        self.w.recycle(packets);
    }

    pub(super) fn on_event(&mut self, now: u64, ev: &Event) {
        self.w.on_event(now, ev);
    }

    /// Sends what the events made.
    pub(super) fn flush(&mut self, now: u64) {
        self.w.flush();
        self.send(now);
    }

    /// Heartbeats on a quiet line and retransmission answers; true if it did anything.
    pub(super) fn tick(&mut self, now: u64) -> bool {
        let mut any = false;
        if now.saturating_sub(self.last_sent) >= self.heartbeat_ns {
            let hb = self.w.heartbeat();
            for to in self.lines.into_iter().flatten() {
                let _ = self.sock.send_to(&hb, to);
            }
            self.heartbeats += 1;
            self.last_sent = now;
            any = true;
        }
        if let Some(s) = &self.retrans {
            while let Ok((n, from)) = s.recv_from(&mut self.buf) {
                any = true;
                if let Some(len) = self.server.handle_request(ns(self.start), from, &self.buf[..n], &mut self.out) {
                    if s.send_to(&self.out[..len], from).is_ok() {
                        self.answers += 1;
                    }
                }
            }
        }
        any
    }

    pub(super) fn counters(&self) -> serde_json::Value {
        serde_json::json!({
            "itch_packets": self.packets,
            "itch_messages": self.w.messages,
            "itch_heartbeats": self.heartbeats,
            "retransmit_answers": self.answers,
            "itch_journal_evicted": self.server.journal().evicted(),
        })
    }

    /// Ends the session (End of Session on both lines) and reports.
    pub(super) fn close(&mut self) -> Part {
        self.w.close(wall_ns());
        self.send(wall_ns());
        Part::Publisher(self.packets, self.w.messages, self.answers, self.heartbeats, self.server.journal().evicted())
    }
}

/// The publisher on a thread of its own (threaded pipeline): every engine's
/// events in, the ITCH lines, heartbeats and retransmission answers out.
struct PublisherAgent {
    p: Publisher,
    rx: Vec<Incoming<Event>>,
    /// Its part on the exchange's counters board.
    poster: Option<Poster>,
}

impl Agent for PublisherAgent {
    fn role(&self) -> &'static str {
        "publisher"
    }

    fn do_work(&mut self, now: u64, _turn: Turn) -> usize {
        if let Some(p) = self.poster.as_mut().and_then(|p| p.due(now).then_some(p)) {
            p.post(self.p.counters(), Vec::new());
        }
        let p = &mut self.p;
        let n: usize = self.rx.iter_mut().map(|r| r.drain(|ev| p.on_event(now, &ev))).sum();
        if n > 0 {
            p.flush(now);
        }
        n + usize::from(p.tick(now))
    }

    fn next_due(&self) -> u64 {
        let heartbeat = self.p.last_sent.saturating_add(self.p.heartbeat_ns);
        heartbeat.min(self.poster.as_ref().map_or(u64::MAX, Poster::next_ns))
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds: Vec<BorrowedFd<'_>> = self.rx.iter().map(Incoming::fd).collect();
        fds.extend(self.p.retrans.as_ref().map(AsFd::as_fd));
        fds
    }

    fn is_done(&self) -> bool {
        false
    }

    fn before_park(&mut self) -> bool {
        self.rx.iter().all(Incoming::arm)
    }

    fn after_park(&mut self) {
        self.rx.iter().for_each(Incoming::disarm);
    }
}
