//! A receiver's delivery as an agent: each released message goes to the
//! application as a plain MoldUDP64 datagram, optionally through a one-line
//! arbitrator that asks the sender's retransmission server for whatever the
//! tree lost, and optionally after a snapshot (`--snapshot`: a receiver
//! joining a running feed hands its application the books first, then the
//! live line from where the snapshot ends), and optionally over a last
//! hop (`--host`: a gateway's firm hosts, a VM's enclave channel), each host
//! sent to early by its measured delay ([`crate::lasthop`]).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use fairfeed_arb::Start;
use fairfeed_clock::skew::Skew;
use fairfeed_io::agent::{Agent, Turn};
use serde_json::json;

use super::control::{Life, NodePoster as Poster, TreePart};
use super::{wall_ns, AgentError, ReceiverJob, TimeBase};
use crate::arb::fill::{FillConfig, GapFiller};
use crate::lasthop::LastHopOut;
use crate::snapshot::SnapshotClient;
use fairfeed_io::mailbox::Incoming;

/// How long the filling arbitrator holds a message behind a gap.
const FILL_HOLD_NS: u64 = 200_000_000;
/// How long it waits before asking for a gap to be filled.
const FILL_GRACE_NS: u64 = 1_000_000;

/// One released message: its payload, the (true) time of its release,
/// and the wall time of its deadline (when a last hop's hosts are to have it).
#[derive(Debug)]
pub struct Delivered {
    pub true_ns: u64,
    pub deadline_wall_ns: u64,
    pub payload: Vec<u8>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    delivered: u64,
    failed: u64,
}

/// Where the line's packets go: the application's socket, and the last
/// hop to the firms' hosts or enclave (models 2 and 3).
struct Outlet {
    sock: UdpSocket,
    to: Option<SocketAddr>,
    counts: Counts,
    hop: Option<LastHopOut>,
    /// Wall clock of the turn (the join's timers run on it).
    now: u64,
    /// Wall time the packet being delivered is due at the hosts (a filled
    /// or snapshot packet has none: now).
    deadline: u64,
}

impl Outlet {
    /// Sends one packet to the application and over the last hop.
    fn send(&mut self, p: &[u8]) {
        self.counts.delivered += 1;
        if let Some(to) = self.to {
            if self.sock.send_to(p, to).is_err() {
                self.counts.failed += 1;
            }
        }
        if let Some(h) = &mut self.hop {
            h.release(self.deadline, p);
        }
    }
}

/// The application's side: its outlet, and the snapshot join in front of it.
struct AppOut {
    out: Outlet,
    join: Option<SnapshotClient>,
}

impl AppOut {
    /// One packet of the line, in sequence order: to the application, or
    /// through the join while it has not joined.
    fn take(&mut self, p: &[u8]) {
        let out = &mut self.out;
        match &mut self.join {
            Some(j) => j.on_live(out.now, p, &mut |q| out.send(q)),
            None => out.send(p),
        }
    }

    /// The join's connection and timers, and the last hop's.
    fn service(&mut self) -> usize {
        let out = &mut self.out;
        out.deadline = out.now;
        let n = self.join.as_mut().map_or(0, |j| j.service(out.now, &mut |q| out.send(q)));
        n + out.hop.as_mut().map_or(0, LastHopOut::service)
    }
}

/// Where a receiver's releases go.
pub struct DeliveryAgent {
    app: AppOut,
    fill: Option<GapFiller>,
    inbox: Incoming<Delivered>,
    skew: Skew,
    time: TimeBase,
    life: Arc<Life>,
    poster: Option<Poster>,
    /// What one turn took from the inbox (kept to reuse its allocation).
    batch: Vec<Delivered>,
}

impl DeliveryAgent {
    pub fn new(
        job: &ReceiverJob,
        inbox: Incoming<Delivered>,
        (skew, time): (Skew, TimeBase),
        life: Arc<Life>,
        poster: Option<Poster>,
        lead: Arc<AtomicU64>,
    ) -> Result<Self, AgentError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |e| AgentError::Io(what, e)
        };
        let sock = UdpSocket::bind("0.0.0.0:0").map_err(io("binding the delivery socket"))?;
        let fill = match job.retransmit {
            None => None,
            Some(server) => {
                let cfg = FillConfig {
                    server,
                    hold_ns: FILL_HOLD_NS,
                    grace_ns: FILL_GRACE_NS,
                    start: job.fill_from.map_or(Start::First, Start::Seq),
                };
                Some(GapFiller::new(cfg).map_err(|e| AgentError::Config(e.to_string()))?)
            }
        };
        let join = match &job.snapshot {
            None => None,
            Some(j) => Some(
                SnapshotClient::new(j.server, &j.user, &j.password, wall_ns())
                    .map_err(io("making the snapshot client"))?,
            ),
        };
        let hop = match &job.last_hop {
            None => None,
            Some(h) => Some(
                LastHopOut::new(h.hosts.clone(), h.cfg, lead.clone(), h.framed)
                    .map_err(io("binding the last hop's sockets"))?,
            ),
        };
        let now = wall_ns();
        let out = Outlet { sock, to: job.deliver, counts: Counts::default(), hop, now, deadline: now };
        let app = AppOut { out, join };
        Ok(DeliveryAgent { app, fill, inbox, skew, time, life, poster, batch: Vec::new() })
    }

    fn release(&mut self, now: u64, deadline: u64, payload: &[u8]) {
        self.app.out.deadline = deadline;
        match &mut self.fill {
            Some(f) => {
                let app = &mut self.app;
                f.packet(now, payload, &mut |p| app.take(p));
            }
            None => self.app.take(payload),
        }
    }

    /// Answers from the retransmission server, and the filler's timers.
    fn service(&mut self, now: u64) -> usize {
        let n = self.app.service();
        let Some(f) = &mut self.fill else { return n };
        let app = &mut self.app;
        n + f.service(now, &mut |p| app.take(p))
    }

    /// Its counters, as they go into the node's report.
    pub fn counters(&self) -> serde_json::Value {
        let counts = &self.app.out.counts;
        let mut c = json!({ "delivered": counts.delivered, "deliver_failed": counts.failed });
        if let Some(f) = &self.fill {
            c["retransmit_requests"] = f.requests().into();
            c["fill"] = serde_json::to_value(f.stats()).unwrap_or_default();
        }
        if let Some(j) = &self.app.join {
            c["join"] = serde_json::to_value(j.stats()).unwrap_or_default();
        }
        if let Some(h) = &self.app.out.hop {
            c["last_hop"] = h.counters();
        }
        c
    }
}

impl Agent for DeliveryAgent {
    fn role(&self) -> &'static str {
        "delivery"
    }

    fn do_work(&mut self, now: u64, _turn: Turn) -> usize {
        self.app.out.now = now;
        let mut batch = std::mem::take(&mut self.batch);
        let mut work = self.inbox.drain(|d| batch.push(d));
        for d in batch.drain(..) {
            self.release(d.true_ns, d.deadline_wall_ns, &d.payload);
        }
        self.batch = batch;
        work += self.service(self.skew.local(self.time.at(now)));
        if !self.inbox.arm() {
            work += 1;
        }
        if let Some(mut p) = self.poster.take() {
            p.post_due(now, || TreePart::Counters(self.counters()));
            self.poster = Some(p);
        }
        work
    }

    fn next_due(&self) -> u64 {
        if !self.inbox.is_empty() {
            return 0;
        }
        let arb = self.fill.as_ref().and_then(GapFiller::next_timeout);
        let due = arb.map_or(u64::MAX, |l| super::wall_at_local(&self.skew, &self.time, l));
        let join = self.app.join.as_ref().map_or(u64::MAX, SnapshotClient::next_due);
        let hop = self.app.out.hop.as_ref().map_or(u64::MAX, LastHopOut::next_due);
        due.min(join).min(hop).min(self.poster.as_ref().map_or(u64::MAX, Poster::next_ns))
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds = vec![self.inbox.fd()];
        fds.extend(self.fill.iter().map(GapFiller::fd));
        fds.extend(self.app.join.iter().map(SnapshotClient::fd));
        fds.extend(self.app.out.hop.iter().flat_map(LastHopOut::fds));
        fds.extend(self.poster.iter().map(Poster::fd));
        fds
    }

    fn is_done(&self) -> bool {
        let now = wall_ns();
        let hop_idle = self.app.out.hop.as_ref().is_none_or(|h| h.pending() == 0);
        self.inbox.is_empty() && ((self.inbox.is_finished() && hop_idle) || self.life.over(now))
    }
}
