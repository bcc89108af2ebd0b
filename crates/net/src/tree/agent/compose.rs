//! A node as a composition of agents, and where they run.
//!
//! [`NodeAgents::new`] builds what a node's job needs: always the data path
//! ([`NodeAgent`], with its send side inline or as an `EgressAgent`); a
//! sender's [`FeedAgent`]; a receiver's [`DeliveryAgent`] when it delivers
//! to an application; a [`ControlAgent`] when the node answers a control
//! socket or fills a metrics slot. They share nothing but mailboxes (feed →
//! node → delivery), the board and when to stop ([`Life`]), so placing them
//! is configuration: [`run_agent`] puts them on threads by
//! [`Threading`]; `fairfeed demo` runs every agent of a hundred nodes on
//! its one thread.

use std::net::UdpSocket;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use fairfeed_io::agent::{run, spawn, Agent, RunConfig};
use fairfeed_tree::node::Released;

use super::control::{ControlAgent, Life, NodeBoard, NodePoster, DELIVERY_PART, FEED_PART, NODE_PART};
use super::delivery::DeliveryAgent;
use super::feed::{FeedAgent, SnapshotFeed, SNAPSHOT_PART};
use super::node::{Links, PARK_MAX_NS};
use super::releases::ReleaseLog;
use super::snapshots::{SnapshotAgent, SNAPSHOT_MAILBOX_CAPACITY};
use super::{wall_ns, AgentConfig, AgentError, AgentReport, Job, NodeAgent, ReleaseAt, SenderJob, Threading};
use super::{RING_CAPACITY, SPIN_AHEAD_NS};
use crate::idle::IdleStrategy;
use crate::tuning::report;
use fairfeed_io::mailbox::mailbox;
use fairfeed_io::socket::bind_udp;

/// Messages waiting between a feed and its node, or a node and its delivery, at most.
pub const MAILBOX_CAPACITY: usize = RING_CAPACITY;

/// The agents of one node.
pub struct NodeAgents<'c> {
    pub node: NodeAgent<'c>,
    pub feed: Option<FeedAgent>,
    pub delivery: Option<DeliveryAgent>,
    pub control: Option<ControlAgent>,
    /// A sender's snapshot service (`--snapshot-listen`).
    pub snapshot: Option<SnapshotAgent>,
    pub life: Arc<Life>,
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> AgentError {
    move |e| AgentError::Io(what.to_string(), e)
}

/// The node's control socket, where one is asked for (a non-loopback
/// address only with an operator key).
fn control_socket(cfg: &AgentConfig) -> Result<Option<UdpSocket>, AgentError> {
    let Some(c) = cfg.control else { return Ok(None) };
    fairfeed_tree::operator::check_bind(c, cfg.operator.is_some()).map_err(|e| AgentError::Config(e.to_string()))?;
    Ok(Some(bind_udp(c, 1 << 16).map_err(|e| AgentError::Io(format!("binding the control socket {c}"), e))?))
}

impl<'c> NodeAgents<'c> {
    /// The agents of node `cfg.id` (on `sock`, or bound to its address in the
    /// topology); each release at a receiver is also handed to `on_release`.
    pub fn new(
        cfg: &'c AgentConfig,
        sock: Option<UdpSocket>,
        on_release: impl FnMut(&Released, ReleaseAt) + 'c,
    ) -> Result<Self, AgentError> {
        let now = wall_ns();
        let life = Arc::new(Life::new(cfg.stop.clone(), now, cfg.max_seconds));
        let ctl = control_socket(cfg)?;
        let delivers = matches!(&cfg.job, Job::Receiver(j) if j.deliver.is_some() || j.retransmit.is_some() || j.snapshot.is_some() || j.last_hop.is_some());
        // A last hop's largest lead, from the delivery to the node.
        let last_hop =
            matches!(&cfg.job, Job::Receiver(j) if j.last_hop.is_some()).then(|| Arc::new(AtomicU64::new(0)));
        let sends = matches!(&cfg.job, Job::Sender(_));
        let board = cfg.board.clone().or_else(|| ctl.is_some().then(NodeBoard::new));
        let poster = |name: &str, wanted: bool| -> Result<Option<NodePoster>, AgentError> {
            let Some(b) = board.as_ref().filter(|_| wanted) else { return Ok(None) };
            b.poster(name).map(Some).map_err(|e| AgentError::Config(e.to_string()))
        };
        let (node_poster, feed_poster, delivery_poster) =
            (poster(NODE_PART, true)?, poster(FEED_PART, sends)?, poster(DELIVERY_PART, delivers)?);
        let clock = (cfg.clock.skew, cfg.time);
        let (mut feed, feed_in) = match &cfg.job {
            Job::Sender(j) => {
                let (tx, rx) = mailbox(MAILBOX_CAPACITY).map_err(io("making the feed's mailbox"))?;
                (Some(FeedAgent::new(j, now, tx, clock, life.clone(), feed_poster)?), Some(rx))
            }
            _ => (None, None),
        };
        let snapshot = match &cfg.job {
            Job::Sender(SenderJob { snapshot: Some(c), .. }) => {
                let (tx, rx) = mailbox(SNAPSHOT_MAILBOX_CAPACITY).map_err(io("making the snapshot agent's mailbox"))?;
                let board = fairfeed_io::counters::Board::new();
                let poster = board.poster(SNAPSHOT_PART).map_err(|e| AgentError::Config(e.to_string()))?;
                feed = feed.map(|f| f.with_snapshot(SnapshotFeed::new(tx, board)));
                Some(SnapshotAgent::new(c, rx, life.clone(), poster)?)
            }
            _ => None,
        };
        let (delivery, delivery_out) = match &cfg.job {
            Job::Receiver(j) if delivers => {
                let (tx, rx) = mailbox(MAILBOX_CAPACITY).map_err(io("making the delivery's mailbox"))?;
                let lead = last_hop.clone().unwrap_or_default();
                (Some(DeliveryAgent::new(j, rx, clock, life.clone(), delivery_poster, lead)?), Some(tx))
            }
            _ => (None, None),
        };
        // A receiver with a control socket keeps its recent releases for `releases FROM` (the fleet view).
        let releases = (ctl.is_some() && matches!(cfg.job, Job::Receiver(_))).then(|| Arc::new(ReleaseLog::default()));
        let links = Links {
            feed: feed_in,
            delivery: delivery_out,
            poster: node_poster,
            life: life.clone(),
            releases: releases.clone(),
            last_hop,
        };
        let node = NodeAgent::new(cfg, sock, links, on_release)?;
        let control = match &board {
            Some(b) => Some(
                ControlAgent::new(ctl, b, life.clone())
                    .map_err(|e| AgentError::Config(e.to_string()))?
                    .with_operator(cfg.operator.clone())
                    .with_keys(cfg.keys.clone())
                    .with_extra(cfg.extra.clone())
                    .with_releases(releases),
            ),
            None => None,
        };
        Ok(NodeAgents { node, feed, delivery, control, snapshot, life })
    }

    /// Every agent, for a runner that drives them all on one thread.
    pub fn agents(&mut self) -> Vec<&mut dyn Agent> {
        let mut v: Vec<&mut dyn Agent> = vec![&mut self.node];
        if let Some(f) = &mut self.feed {
            v.push(f);
        }
        if let Some(d) = &mut self.delivery {
            v.push(d);
        }
        if let Some(c) = &mut self.control {
            v.push(c);
        }
        if let Some(s) = &mut self.snapshot {
            v.push(s);
        }
        v
    }

    /// Stops what still runs and reports: the node's counters with the
    /// feed's and delivery's.
    pub fn finish(self) -> AgentReport {
        self.life.finish();
        let mut r = self.node.finish();
        let extra: Vec<serde_json::Value> = self
            .feed
            .iter()
            .map(FeedAgent::counters)
            .chain(self.delivery.iter().map(DeliveryAgent::counters))
            .collect();
        let rows = std::mem::take(&mut r.rows);
        let mut r = super::control::compose(&r, &extra);
        r.rows = rows;
        r
    }
}

/// A runner for an agent of the node that runs on a thread of its own.
fn alone(cfg: &AgentConfig, idle: IdleStrategy) -> RunConfig {
    RunConfig { idle, spin_ahead_ns: SPIN_AHEAD_NS, park_max_ns: PARK_MAX_NS, stop: Some(cfg.stop.clone()) }
}

/// Runs node `cfg.id` until it is told to stop, its time is up, or (a
/// sender) its feed is sent and the linger is over. Placement by
/// `cfg.threads`: the data path, a sender's feed and a receiver's delivery
/// on this thread (`One`, `Split`; `Split` sends on a thread of its own), or
/// every agent on a thread of its own (`Dedicated`); the control agent, when
/// there is one, always on its own thread, parked until asked. Each release
/// at a receiver is also handed to `on_release`.
pub fn run_agent(cfg: &AgentConfig, on_release: impl FnMut(&Released, ReleaseAt)) -> Result<AgentReport, AgentError> {
    let mut a = NodeAgents::new(cfg, None, on_release)?;
    if cfg.idle != IdleStrategy::Spin {
        // Wake from ppoll(2) when asked, not up to the default 50 µs later.
        let _ = nix::sys::prctl::set_timerslack(1_000);
    }
    let who = a.node.who().to_string();
    report(&who, a.node.tuning());
    tracing::info!(node = cfg.id, addr = %a.node.addr(), "{who}: running on {}", a.node.addr());
    if let Some(c) = a.control.as_ref().and_then(ControlAgent::addr) {
        tracing::info!(node = cfg.id, control = %c, "{who}: answering `fairfeed stat` at {c}");
    }
    if let Some(l) = a.snapshot.as_ref().and_then(SnapshotAgent::addr) {
        tracing::info!(node = cfg.id, snapshot = %l, "{who}: serving snapshots of what it sends at {l}");
    }
    if let Some(l) = a.feed.as_ref().and_then(FeedAgent::listen_addr) {
        tracing::info!(node = cfg.id, listen = %l, "{who}: taking the live feed (MoldUDP64) at {l}");
    }
    let control = match a.control.take() {
        Some(c) => Some(
            spawn("fairfeed-ctl", alone(cfg, IdleStrategy::Park), move || c, |c, _| c)
                .map_err(io("starting the control thread"))?,
        ),
        None => None,
    };
    // Building a snapshot takes milliseconds: never on the feed's or the node's thread.
    let snapshot = match a.snapshot.take() {
        Some(s) => Some(
            spawn("fairfeed-snap", alone(cfg, IdleStrategy::Park), move || s, |s, _| s)
                .map_err(io("starting the snapshot thread"))?,
        ),
        None => None,
    };
    let dedicated = cfg.threads == Threading::Dedicated;
    let feed = match if dedicated { a.feed.take() } else { None } {
        Some(f) => Some(
            spawn("fairfeed-feed", alone(cfg, cfg.idle), move || f, |f, _| f)
                .map_err(io("starting the feed thread"))?,
        ),
        None => None,
    };
    let delivery = match if dedicated { a.delivery.take() } else { None } {
        Some(d) => Some(
            spawn("fairfeed-deliver", alone(cfg, cfg.idle), move || d, |d, _| d)
                .map_err(io("starting the delivery thread"))?,
        ),
        None => None,
    };
    let result =
        run(&mut a.agents(), &alone(cfg, cfg.idle)).map_err(|e| AgentError::Io(format!("{who}: the node loop"), e));
    // Whatever still runs elsewhere stops now (and hands its agent back).
    a.life.finish();
    a.control = control.and_then(|t| t.join().ok());
    // (The snapshot agent published its last counters when its runner closed it.)
    a.snapshot = snapshot.and_then(|t| t.join().ok());
    a.feed = a.feed.or(feed.and_then(|t| t.join().ok()));
    a.delivery = a.delivery.or(delivery.and_then(|t| t.join().ok()));
    result?;
    let why = if cfg.stop.load(std::sync::atomic::Ordering::Relaxed) { "stopped by a signal" } else { "finished" };
    tracing::info!(node = cfg.id, "{who}: {why}");
    Ok(a.finish())
}
