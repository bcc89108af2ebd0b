//! The controller: the tree's membership and placement at run time
//! (issue 43), sans-IO.
//!
//! Nodes register (role, the id they want or any, capacity), sealed with the
//! tree key; the controller places each one, keeps a heartbeat clock per
//! member, and hands every member its **view** of the current topology
//! version ([`crate::membership::Assign`]): parent, children, hedge
//! targets, hedge parents, and each of those nodes' address — the address its
//! registration came from, so nobody types one.
//!
//! Placement follows the planner's shape (seed 000 §3): the sender feeds
//! layer 0, proxies fill layers `0..proxy_layers` (each under the proxy of the
//! layer above with the fewest children and room), receivers hang under the
//! last proxy layer, and every proxy hedges for the next `H` proxies of its
//! layer (in id order) by sending their children copies too. A receiver with
//! no room anywhere waits (`pending`) until a proxy joins; a proxy with no
//! room is a **spare**.
//!
//! **Repair.** A member silent for `dead_after_ns` is declared dead and held
//! down (`hold_down_ns`: its id is refused until then, so a flapping node does
//! not churn the tree). A dead proxy's place goes to a spare whole — same
//! parent, same children — or, without one, its children move to the live
//! proxies of its layer with the fewest children, up to
//! [`REPAIR_LOAD_MAX`] × their capacity (counted as `overloaded`).
//!
//! **Make-before-break.** The controller never moves a node away from a live
//! parent: joins only add edges, deaths only remove edges to the dead, so a
//! switch of versions can lose nothing that the dead node would have
//! forwarded, and receivers' first-copy-wins de-duplication hides the
//! overlap of the hedged paths.
//!
//! Time is an argument ([`Controller::handle_packet`],
//! [`Controller::handle_timeout`]); what it sends is polled
//! ([`Controller::poll_transmit`]), what happened too
//! ([`Controller::poll_event`]). The shell (`fairfeed controller`) owns the
//! socket and the store.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;

use crate::membership::{
    Assign, Heartbeat, Leave, MemberRole, Message, Peer, Refuse, RefuseReason, Register, ANY_ID, CONTROLLER_ORIGIN,
    LINKS_MAX, NO_PARENT, PEERS_MAX,
};
use fairfeed_wire::overlay::{HeaderRepr, Kind};
use serde::{Deserialize, Serialize};

use crate::auth::{Auth, AuthStats};
use crate::plan::{Node as PlanNode, Role, Topology, Tree};

/// A repair may load a proxy up to this many times its capacity.
pub const REPAIR_LOAD_MAX: usize = 2;
/// Members at most (receivers, proxies and the sender).
pub const MEMBERS_MAX: usize = 100_000;
/// Ids the controller gives nodes that ask for any (`--id any`) start here,
/// above the ids operators and the planner choose (below it), so the two
/// never collide.
pub const ANY_ID_BASE: u32 = MEMBERS_MAX as u32;
/// Proxy layers at most (the planner's depth limit less the receivers' layer).
pub const PROXY_LAYERS_MAX: usize = crate::plan::DEPTH_MAX - 1;
/// Messages waiting to be sent at most; beyond, views are re-sent on the next heartbeat.
pub const OUTBOX_MAX: usize = 65_536;
/// A member that has not sent its first heartbeat yet (a process starting
/// its node after joining) is given at least this long.
pub const JOIN_GRACE_NS: u64 = 2_000_000_000;
/// Events waiting to be read at most (the oldest are dropped and counted).
pub const EVENTS_MAX: usize = 4_096;
/// A child moved off an overloaded proxy ([`Controller`]'s rebalancing) is
/// fed by its old parent this long after its new parent starts: make
/// before break — its new view is sent at once (and again on a heartbeat
/// naming an older version), so it runs it well before its old parent stops.
pub const MOVE_OVERLAP_NS: u64 = 200_000_000;

/// How the controller shapes and watches the tree.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ControllerConfig {
    /// Children per node where it registers no capacity of its own (the sender's too).
    pub fanout: usize,
    /// Siblings each proxy hedges for.
    pub hedge: usize,
    /// Proxy layers between the sender and the receivers (the tree's depth less one).
    pub proxy_layers: usize,
    /// A member silent this long is declared dead.
    pub dead_after_ns: u64,
    /// A member declared dead is refused this long.
    pub hold_down_ns: u64,
    /// Members one IP address may hold (a host running many nodes; a flood from one address stops here).
    pub members_per_ip_max: usize,
    /// Members at most (1..=MEMBERS_MAX).
    pub members_max: usize,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            fanout: 10,
            hedge: 1,
            proxy_layers: 1,
            dead_after_ns: 40_000_000,
            hold_down_ns: 5_000_000_000,
            members_per_ip_max: 256,
            members_max: MEMBERS_MAX,
        }
    }
}

/// A configuration the controller cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A fan-out outside 1..=LINKS_MAX.
    #[error("fan-out {0} out of range (1..={LINKS_MAX})")]
    Fanout(usize),
    /// A hedge whose copies (F + H·F) do not fit a view.
    #[error("hedge {hedge} too large for fan-out {fanout}: a proxy's copies (F + H·F) must fit a view ({LINKS_MAX})")]
    Hedge {
        /// The hedge asked for.
        hedge: usize,
        /// The fan-out asked for.
        fanout: usize,
    },
    /// Proxy layers outside 0..=PROXY_LAYERS_MAX.
    #[error("proxy layers {0} out of range (0..={PROXY_LAYERS_MAX})")]
    Layers(usize),
    /// A dead-after of 0, or a hold-down shorter than it.
    #[error("dead-after must be > 0 and the hold-down at least as long")]
    Timers,
    /// A members limit outside 1..=MEMBERS_MAX.
    #[error("members limit {0} out of range (1..={MEMBERS_MAX})")]
    Members(usize),
}

impl ControllerConfig {
    /// Refuses settings it cannot run with.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.fanout == 0 || self.fanout > LINKS_MAX {
            return Err(ConfigError::Fanout(self.fanout));
        }
        if (self.hedge + 1) * self.fanout * REPAIR_LOAD_MAX > LINKS_MAX {
            return Err(ConfigError::Hedge { hedge: self.hedge, fanout: self.fanout });
        }
        if self.proxy_layers > PROXY_LAYERS_MAX {
            return Err(ConfigError::Layers(self.proxy_layers));
        }
        if self.dead_after_ns == 0 || self.hold_down_ns < self.dead_after_ns {
            return Err(ConfigError::Timers);
        }
        if self.members_max == 0 || self.members_max > MEMBERS_MAX || self.members_per_ip_max == 0 {
            return Err(ConfigError::Members(self.members_max));
        }
        Ok(())
    }
}

/// One member as the controller keeps it (and as the store holds it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Its id.
    pub id: u32,
    /// Its role.
    pub role: MemberRole2,
    /// Its registration's incarnation.
    pub incarnation: u64,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Children it can feed (proxies).
    pub capacity: usize,
    /// Where it is placed: its layer (−1: the sender) and parent; `None`: a spare or waiting.
    pub layer: Option<i32>,
    /// Its parent.
    pub parent: Option<u32>,
    /// Its children.
    pub children: Vec<u32>,
}

/// [`MemberRole`] for serde.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberRole2 {
    /// The tree's root.
    Sender,
    /// An inner node.
    Proxy,
    /// A leaf.
    Receiver,
}

impl From<MemberRole> for MemberRole2 {
    fn from(r: MemberRole) -> Self {
        match r {
            MemberRole::Sender => Self::Sender,
            MemberRole::Proxy => Self::Proxy,
            MemberRole::Receiver => Self::Receiver,
        }
    }
}

impl From<MemberRole2> for MemberRole {
    fn from(r: MemberRole2) -> Self {
        match r {
            MemberRole2::Sender => Self::Sender,
            MemberRole2::Proxy => Self::Proxy,
            MemberRole2::Receiver => Self::Receiver,
        }
    }
}

#[derive(Debug, Clone)]
struct Member {
    rec: MemberRecord,
    last_seen_ns: u64,
    /// Heartbeats heard from it.
    beats: u64,
    /// The version it says it runs.
    applied: u64,
    /// Its view as last sent, and that view's version.
    view: Option<Assign>,
    view_version: u64,
}

/// What happened, for the shell's log and store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A node registered.
    Joined {
        /// Its id.
        id: u32,
        /// Its role.
        role: MemberRole,
        /// Where it listens.
        addr: SocketAddr,
        /// It was placed in the tree (else: a spare, or waiting for room).
        placed: bool,
    },
    /// A member left.
    Left {
        /// Its id.
        id: u32,
    },
    /// A member was declared dead.
    Dead {
        /// Its id.
        id: u32,
        /// Its role.
        role: MemberRole,
        /// How long it had been silent, ns.
        silent_ns: u64,
    },
    /// A dead proxy's place taken by a spare.
    Replaced {
        /// The dead proxy.
        dead: u32,
        /// The spare that took its place.
        spare: u32,
    },
    /// A dead proxy's children moved to live proxies of its layer (`stranded`: no room anywhere).
    Reparented {
        /// The dead proxy.
        dead: u32,
        /// Children moved.
        moved: usize,
        /// Children left without a parent (no room anywhere).
        stranded: usize,
    },
    /// Children moved off proxies loaded beyond their capacity (by earlier
    /// repairs) onto proxies of their layer with room (`to`: the proxies
    /// that took them).
    Rebalanced {
        /// Children moved.
        moved: usize,
        /// The proxies that took them.
        to: Vec<u32>,
    },
    /// A node was refused.
    Refused {
        /// Where it registered from.
        addr: SocketAddr,
        /// The id it asked for.
        id: u32,
        /// Why.
        reason: RefuseReason,
    },
    /// A new topology version: the members whose views changed.
    Published {
        /// The version.
        version: u64,
        /// The members whose views changed.
        changed: Vec<u32>,
    },
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ControllerStats {
    /// Datagrams taken.
    pub packets: u64,
    /// Datagrams that are not membership messages.
    pub malformed: u64,
    /// Messages a controller does not take (views, refusals).
    pub unexpected: u64,
    /// Registrations.
    pub registrations: u64,
    /// Heartbeats.
    pub heartbeats: u64,
    /// Members that left.
    pub leaves: u64,
    /// Registrations refused.
    pub refused: u64,
    /// Members declared dead.
    pub deaths: u64,
    /// Dead proxies repaired.
    pub repairs: u64,
    /// ... by a spare taking the place.
    pub spares_used: u64,
    /// Children left without a parent by a repair.
    pub stranded: u64,
    /// Children moved by rebalancing (make before break).
    pub moves: u64,
    /// Views sent.
    pub views_sent: u64,
    /// Topology versions published.
    pub versions: u64,
    /// Datagrams not sent because the outbox was full.
    pub outbox_full: u64,
    /// Events dropped because the event queue was full (the oldest first).
    pub events_dropped: u64,
    /// Views sent again because a member's heartbeat showed an older one.
    pub stale_views: u64,
    /// Datagrams refused by the tree key.
    pub auth_refused: u64,
    /// ... by reason.
    #[serde(skip)]
    pub auth: AuthStats,
}

/// The controller's state machine.
pub struct Controller {
    cfg: ControllerConfig,
    auth: Option<Auth>,
    members: BTreeMap<u32, Member>,
    /// Ids declared dead, refused until then.
    held: BTreeMap<u32, u64>,
    /// Receivers (and proxies) waiting for room, in arrival order.
    waiting: BTreeSet<u32>,
    /// Members whose view may have changed since it was sent.
    dirty: BTreeSet<u32>,
    /// Placed proxies by layer.
    layers: BTreeMap<i32, BTreeSet<u32>>,
    /// Children moved by rebalancing whose old parent still feeds them:
    /// child → (old parent, until when).
    leaving: BTreeMap<u32, (u32, u64)>,
    sender: Option<u32>,
    version: u64,
    seq: u64,
    /// The time of the call being handled (stamped on what is sent).
    now: u64,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<Event>,
    /// Its counters.
    pub stats: ControllerStats,
}

impl Controller {
    /// A controller with `cfg` (refused when out of range), sealing with `auth` when given.
    pub fn new(cfg: ControllerConfig, auth: Option<Auth>) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Controller {
            cfg,
            auth,
            members: BTreeMap::new(),
            held: BTreeMap::new(),
            waiting: BTreeSet::new(),
            dirty: BTreeSet::new(),
            layers: BTreeMap::new(),
            leaving: BTreeMap::new(),
            sender: None,
            version: 0,
            seq: 0,
            now: 0,
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: ControllerStats::default(),
        })
    }

    /// Its settings.
    pub fn config(&self) -> &ControllerConfig {
        &self.cfg
    }

    /// The current topology version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Every member's record, by id.
    pub fn records(&self) -> impl Iterator<Item = &MemberRecord> {
        self.members.values().map(|m| &m.rec)
    }

    /// Member `id`'s record.
    pub fn record(&self, id: u32) -> Option<&MemberRecord> {
        self.members.get(&id).map(|m| &m.rec)
    }

    /// Members waiting for room.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Proxies loaded beyond their capacity by a repair.
    pub fn overloaded(&self) -> usize {
        self.members.values().filter(|m| m.rec.children.len() > m.rec.capacity).count()
    }

    /// Takes over from records a store kept (a follower that now leads):
    /// every member counts as heard from at `now`, and every view is re-sent.
    pub fn restore(&mut self, now: u64, version: u64, records: Vec<MemberRecord>) {
        self.now = now;
        self.members.clear();
        self.waiting.clear();
        self.layers.clear();
        self.sender = None;
        for rec in records {
            let id = rec.id;
            match (rec.role, rec.layer) {
                (MemberRole2::Receiver, None) => {
                    self.waiting.insert(id);
                }
                (MemberRole2::Proxy, Some(l)) => {
                    self.layers.entry(l).or_default().insert(id);
                }
                (MemberRole2::Sender, _) => self.sender = Some(id),
                _ => {}
            }
            self.members
                .insert(id, Member { rec, last_seen_ns: now, beats: 1, applied: 0, view: None, view_version: 0 });
            self.dirty.insert(id);
        }
        self.version = version;
        self.flush(now);
    }

    /// A datagram from `from` at `now` (wall-clock ns, the time base of the nodes' seals).
    pub fn handle_packet(&mut self, now: u64, from: SocketAddr, bytes: &[u8]) {
        self.now = now;
        self.stats.packets += 1;
        let Ok((h, payload)) = HeaderRepr::parse(bytes) else {
            self.stats.malformed += 1;
            return;
        };
        if h.kind != Some(Kind::Membership) {
            self.stats.unexpected += 1;
            return;
        }
        if let Some(a) = &self.auth {
            if let Err(e) = a.open(bytes, now) {
                self.stats.auth.count(e);
                self.stats.auth_refused += 1;
                return;
            }
        }
        let Ok(m) = Message::parse(payload) else {
            self.stats.malformed += 1;
            return;
        };
        match m {
            Message::Register(r) => self.register(now, from, r),
            Message::Heartbeat(hb) => self.heartbeat(now, from, hb),
            Message::Leave(l) => self.leave(now, l),
            Message::Assign(_) | Message::Refuse(_) => self.stats.unexpected += 1,
        }
        self.flush(now);
    }

    /// When [`Self::handle_timeout`] next has work.
    pub fn next_timeout(&self) -> Option<u64> {
        let silent = self.members.values().map(|m| m.last_seen_ns.saturating_add(self.silence_allowed(m))).min();
        let held = self.held.values().min().copied();
        let leaving = self.leaving.values().map(|&(_, until)| until).min();
        silent.into_iter().chain(held).chain(leaving).min()
    }

    /// Declares the silent dead, repairs around them, ends hold-downs.
    pub fn handle_timeout(&mut self, now: u64) {
        self.now = now;
        self.held.retain(|_, until| *until > now);
        let dead: Vec<(u32, u64)> = self
            .members
            .values()
            .filter(|m| now.saturating_sub(m.last_seen_ns) >= self.silence_allowed(m))
            .map(|m| (m.rec.id, now - m.last_seen_ns))
            .collect();
        for (id, silent_ns) in dead {
            let role = self.members[&id].rec.role.into();
            self.stats.deaths += 1;
            self.push_event(Event::Dead { id, role, silent_ns });
            self.remove(id);
            self.held.insert(id, now + self.cfg.hold_down_ns);
        }
        // Overlaps that ended: the old parents stop feeding.
        let ended: Vec<u32> = self.leaving.iter().filter(|(_, &(_, until))| until <= now).map(|(&c, _)| c).collect();
        for c in ended {
            if let Some((o, _)) = self.leaving.remove(&c) {
                self.dirty.insert(o);
            }
        }
        self.rebalance(now);
        self.flush(now);
    }

    /// The next datagram to send and where.
    pub fn poll_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.out.pop_front()
    }

    /// The next event for the log and the store.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The current topology as the planner writes it (placed members only;
    /// addresses filled): what `fairfeed plan` would have written for this
    /// membership, and what [`crate::plan::validate`] accepts.
    pub fn topology(&self) -> Topology {
        let mut nodes = Vec::new();
        let mut index: BTreeMap<i32, u32> = BTreeMap::new();
        for m in self.members.values() {
            let Some(layer) = m.rec.layer else { continue };
            let i = index.entry(layer).or_default();
            nodes.push(PlanNode {
                id: m.rec.id,
                role: match m.rec.role {
                    MemberRole2::Sender => Role::Sender,
                    MemberRole2::Proxy => Role::Proxy,
                    MemberRole2::Receiver => Role::Receiver,
                },
                layer,
                index: *i,
                parent: m.rec.parent,
                children: m.rec.children.clone(),
                hedge_targets: self.hedge_targets(m.rec.id),
                addr: Some(m.rec.addr.to_string()),
                control: None,
            });
            *i += 1;
        }
        let receiver_ids: Vec<u32> =
            nodes.iter().filter(|n| n.role == Role::Receiver).map(|n| n.id).collect::<Vec<_>>();
        let fanout = self.members.values().map(|m| m.rec.children.len()).max().unwrap_or(0).max(self.cfg.fanout);
        Topology {
            receivers: receiver_ids.len(),
            fanout,
            depth: self.cfg.proxy_layers + 1,
            hedge: self.cfg.hedge,
            sharding: "one tree (the controller's)".into(),
            receiver_ids,
            trees: vec![Tree { id: 0, nodes }],
        }
    }

    /// How long `m` may be silent: the dead-after, or the join grace before its first heartbeat.
    fn silence_allowed(&self, m: &Member) -> u64 {
        if m.beats == 0 {
            self.cfg.dead_after_ns.max(JOIN_GRACE_NS)
        } else {
            self.cfg.dead_after_ns
        }
    }

    fn push_event(&mut self, e: Event) {
        if self.events.len() >= EVENTS_MAX {
            self.events.pop_front();
            self.stats.events_dropped += 1;
        }
        self.events.push_back(e);
    }

    fn send(&mut self, to: SocketAddr, m: &Message) {
        if self.out.len() >= OUTBOX_MAX {
            self.stats.outbox_full += 1;
            return;
        }
        self.seq += 1;
        let b = crate::membership::packet(m, CONTROLLER_ORIGIN, self.seq, self.now, self.auth.as_ref());
        self.out.push_back((to, b));
    }

    fn refuse(&mut self, to: SocketAddr, id: u32, incarnation: u64, reason: RefuseReason, retry_after_ns: u64) {
        self.stats.refused += 1;
        self.push_event(Event::Refused { addr: to, id, reason });
        let retry_after_ms = u32::try_from(retry_after_ns.div_ceil(1_000_000)).unwrap_or(u32::MAX);
        self.send(to, &Message::Refuse(Refuse { incarnation, reason, retry_after_ms }));
    }
}

/// Membership: registrations, heartbeats, leaves and deaths.
impl Controller {
    fn register(&mut self, now: u64, from: SocketAddr, r: Register) {
        self.stats.registrations += 1;
        let addr = r.advertise.unwrap_or(from);
        let id = if r.want_id == ANY_ID {
            // The same process asking again keeps the id it was given.
            match self.members.values().find(|m| m.rec.incarnation == r.incarnation) {
                Some(m) => m.rec.id,
                None => match self.free_id() {
                    Some(id) => id,
                    None => return self.refuse(from, ANY_ID, r.incarnation, RefuseReason::Full, self.cfg.hold_down_ns),
                },
            }
        } else {
            r.want_id
        };
        if let Some(&until) = self.held.get(&id) {
            return self.refuse(from, id, r.incarnation, RefuseReason::HeldDown, until.saturating_sub(now));
        }
        if let Some(m) = self.members.get_mut(&id) {
            if m.rec.incarnation == r.incarnation {
                // Asked again (our answer was lost): the same view, sent again.
                m.last_seen_ns = now;
                m.view = None;
                self.dirty.insert(id);
                return;
            }
            let wait = self.cfg.dead_after_ns;
            return self.refuse(from, id, r.incarnation, RefuseReason::IdTaken, wait);
        }
        if self.members.len() >= self.cfg.members_max
            || self.members.values().filter(|m| m.rec.addr.ip() == addr.ip()).count() >= self.cfg.members_per_ip_max
        {
            return self.refuse(from, id, r.incarnation, RefuseReason::Full, self.cfg.hold_down_ns);
        }
        if self.members.values().any(|m| m.rec.addr == addr) {
            // Two members at one address would receive each other's copies; the
            // other one (a process this one replaced?) is dead within dead-after.
            let wait = self.cfg.dead_after_ns;
            return self.refuse(from, id, r.incarnation, RefuseReason::AddrTaken, wait);
        }
        if r.role == MemberRole::Sender && self.sender.is_some() {
            return self.refuse(from, id, r.incarnation, RefuseReason::SenderTaken, 0);
        }
        let capacity = if r.capacity == 0 { self.cfg.fanout } else { usize::from(r.capacity).min(LINKS_MAX) };
        let rec = MemberRecord {
            id,
            role: r.role.into(),
            incarnation: r.incarnation,
            addr,
            capacity,
            layer: None,
            parent: None,
            children: Vec::new(),
        };
        self.members.insert(id, Member { rec, last_seen_ns: now, beats: 0, applied: 0, view: None, view_version: 0 });
        self.dirty.insert(id);
        match r.role {
            MemberRole::Sender => self.place_sender(id),
            MemberRole::Proxy => self.place_proxy(id),
            MemberRole::Receiver => {
                self.waiting.insert(id);
            }
        }
        self.place_waiting();
        let placed = self.members[&id].rec.layer.is_some();
        self.push_event(Event::Joined { id, role: r.role, addr, placed });
        self.rebalance(now);
    }

    /// The lowest id from [`ANY_ID_BASE`] on neither a member's nor held down.
    fn free_id(&self) -> Option<u32> {
        let ids = ANY_ID_BASE..ANY_ID_BASE + self.cfg.members_max as u32 * 2;
        ids.into_iter().find(|i| !self.members.contains_key(i) && !self.held.contains_key(i))
    }

    fn heartbeat(&mut self, now: u64, from: SocketAddr, hb: Heartbeat) {
        self.stats.heartbeats += 1;
        match self.members.get_mut(&hb.id) {
            Some(m) if m.rec.incarnation == hb.incarnation => {
                m.last_seen_ns = now;
                m.beats += 1;
                m.applied = hb.version;
                if hb.version < m.view_version {
                    // Its view was lost on the way: send it again.
                    self.stats.stale_views += 1;
                    m.view = None;
                    self.dirty.insert(hb.id);
                }
            }
            _ => self.refuse(from, hb.id, hb.incarnation, RefuseReason::Unknown, 0),
        }
    }

    fn leave(&mut self, _now: u64, l: Leave) {
        if self.members.get(&l.id).is_some_and(|m| m.rec.incarnation == l.incarnation) {
            self.stats.leaves += 1;
            self.remove(l.id);
            self.push_event(Event::Left { id: l.id });
        } else {
            self.stats.unexpected += 1;
        }
    }

    /// Takes member `id` out of the tree and repairs around it.
    fn remove(&mut self, id: u32) {
        let Some(m) = self.members.remove(&id) else { return };
        self.waiting.remove(&id);
        self.dirty.remove(&id);
        if let Some((o, _)) = self.leaving.remove(&id) {
            // Its old parent stops feeding it.
            self.dirty.insert(o);
        }
        self.leaving.retain(|_, (o, _)| *o != id);
        let rec = m.rec;
        if let Some(q) = rec.parent {
            self.detach(q, id);
        }
        match (rec.role, rec.layer) {
            (MemberRole2::Sender, _) => {
                self.sender = None;
                for c in rec.children {
                    if let Some(m) = self.members.get_mut(&c) {
                        m.rec.parent = None;
                        self.dirty.insert(c);
                    }
                }
            }
            (MemberRole2::Proxy, Some(layer)) => {
                self.leave_layer(layer, id);
                self.repair(id, layer, rec.parent, rec.children);
            }
            _ => {}
        }
        self.place_waiting();
    }

    /// A dead proxy's children: to a spare whole, else to its layer's least loaded.
    fn repair(&mut self, dead: u32, layer: i32, parent: Option<u32>, children: Vec<u32>) {
        if children.is_empty() && parent.is_none() {
            return;
        }
        self.stats.repairs += 1;
        let spare =
            self.members.values().find(|m| m.rec.role == MemberRole2::Proxy && m.rec.layer.is_none()).map(|m| m.rec.id);
        if let Some(s) = spare {
            self.stats.spares_used += 1;
            self.attach(s, layer, parent);
            for &c in &children {
                self.set_parent(c, Some(s));
            }
            if let Some(m) = self.members.get_mut(&s) {
                m.rec.children = children;
            }
            self.push_event(Event::Replaced { dead, spare: s });
            return;
        }
        let (mut moved, mut stranded) = (0, 0);
        let mut orphans: VecDeque<(u32, i32)> = children.into_iter().map(|c| (c, layer + 1)).collect();
        while let Some((c, at)) = orphans.pop_front() {
            match self.parent_for(at, REPAIR_LOAD_MAX) {
                Some(p) => {
                    self.members.get_mut(&p).expect("a live parent").rec.children.push(c);
                    self.touch_children_of(p);
                    self.set_parent(c, Some(p));
                    moved += 1;
                }
                None => {
                    stranded += 1;
                    self.stats.stranded += 1;
                    let Some(m) = self.members.get_mut(&c) else { continue };
                    m.rec.parent = None;
                    m.rec.layer = None;
                    let grandchildren = std::mem::take(&mut m.rec.children);
                    match m.rec.role {
                        MemberRole2::Receiver => {
                            self.waiting.insert(c);
                        }
                        // A stranded proxy becomes a spare; its own children are orphans in turn.
                        _ => {
                            self.leave_layer(at, c);
                            orphans.extend(grandchildren.into_iter().map(|g| (g, at + 1)));
                        }
                    }
                    self.dirty.insert(c);
                }
            }
        }
        self.push_event(Event::Reparented { dead, moved, stranded });
    }
}

/// Placement.
impl Controller {
    /// Moves children off proxies loaded beyond their capacity (repairs
    /// load a proxy up to [`REPAIR_LOAD_MAX`] times) onto proxies of their
    /// layer with room — a proxy that joined or came back — make before
    /// break: the child's new parent feeds it at once, its old parent for
    /// [`MOVE_OVERLAP_NS`] more.
    fn rebalance(&mut self, now: u64) {
        let (mut moved, mut to) = (0, BTreeSet::new());
        let layers: Vec<i32> = self.layers.keys().copied().collect();
        for layer in layers {
            while let Some((o, n)) = self.move_pair(layer) {
                let Some(&c) = self.members[&o].rec.children.last() else { break };
                self.detach(o, c);
                self.members.get_mut(&n).expect("a live proxy").rec.children.push(c);
                self.touch_children_of(n);
                self.set_parent(c, Some(n));
                self.leaving.insert(c, (o, now + MOVE_OVERLAP_NS));
                self.stats.moves += 1;
                moved += 1;
                to.insert(n);
            }
        }
        if moved > 0 {
            self.push_event(Event::Rebalanced { moved, to: to.into_iter().collect() });
        }
    }

    /// On `layer`: the proxy most over its capacity and the least loaded one with room.
    fn move_pair(&self, layer: i32) -> Option<(u32, u32)> {
        let proxies = || self.layers.get(&layer).into_iter().flatten().filter_map(|p| self.members.get(p));
        let over = proxies()
            .filter(|m| m.rec.children.len() > m.rec.capacity)
            .max_by_key(|m| (m.rec.children.len() - m.rec.capacity, std::cmp::Reverse(m.rec.id)))?
            .rec
            .id;
        let room = proxies()
            .filter(|m| m.rec.id != over && m.rec.children.len() < m.rec.capacity)
            .min_by_key(|m| (m.rec.children.len(), m.rec.id))?
            .rec
            .id;
        Some((over, room))
    }

    /// Where a node of `layer` goes: the sender (layer 0) or the least loaded
    /// proxy of the layer above with room (`load` × its capacity).
    fn parent_for(&self, layer: i32, load: usize) -> Option<u32> {
        if layer == 0 {
            // Layer 0 hangs under the sender (or will, once it registers).
            let (cap, n) = match self.sender.and_then(|s| self.members.get(&s)) {
                Some(s) => (s.rec.capacity, s.rec.children.len()),
                None => (self.cfg.fanout, self.layer_size(0)),
            };
            return (n < cap * load).then_some(self.sender.unwrap_or(NO_PARENT));
        }
        self.layers
            .get(&(layer - 1))?
            .iter()
            .filter_map(|p| self.members.get(p))
            .filter(|m| m.rec.children.len() < m.rec.capacity * load)
            .min_by_key(|m| (m.rec.children.len(), m.rec.id))
            .map(|m| m.rec.id)
    }

    fn layer_size(&self, layer: i32) -> usize {
        if layer == self.cfg.proxy_layers as i32 {
            return self.members.values().filter(|m| m.rec.layer == Some(layer)).count();
        }
        self.layers.get(&layer).map_or(0, BTreeSet::len)
    }

    fn place_sender(&mut self, id: u32) {
        self.sender = Some(id);
        let layer0: Vec<u32> = self.members.values().filter(|m| m.rec.layer == Some(0)).map(|m| m.rec.id).collect();
        for &c in &layer0 {
            self.set_parent(c, Some(id));
        }
        let m = self.members.get_mut(&id).expect("just inserted");
        m.rec.layer = Some(-1);
        m.rec.children = layer0;
    }

    fn place_proxy(&mut self, id: u32) {
        for layer in 0..self.cfg.proxy_layers as i32 {
            if let Some(p) = self.parent_for(layer, 1) {
                self.attach(id, layer, (p != NO_PARENT).then_some(p));
                return;
            }
        }
        // No room anywhere: a spare, first in line for a repair.
    }

    /// Places waiting receivers where there is room.
    fn place_waiting(&mut self) {
        let layer = self.cfg.proxy_layers as i32;
        while let Some(&r) = self.waiting.first() {
            let Some(p) = self.parent_for(layer, 1) else { return };
            self.waiting.remove(&r);
            self.attach(r, layer, (p != NO_PARENT).then_some(p));
        }
    }

    /// Puts `id` on `layer` under `parent` (listed among its children).
    fn attach(&mut self, id: u32, layer: i32, parent: Option<u32>) {
        let is_proxy = {
            let m = self.members.get_mut(&id).expect("a member");
            m.rec.layer = Some(layer);
            m.rec.parent = parent;
            m.rec.role == MemberRole2::Proxy
        };
        self.dirty.insert(id);
        if let Some(p) = parent {
            if let Some(pm) = self.members.get_mut(&p) {
                pm.rec.children.push(id);
            }
            self.touch_children_of(p);
        }
        if is_proxy {
            self.layers.entry(layer).or_default().insert(id);
            self.touch_layer(layer);
        }
    }

    fn set_parent(&mut self, c: u32, p: Option<u32>) {
        if let Some(m) = self.members.get_mut(&c) {
            m.rec.parent = p;
            self.dirty.insert(c);
        }
    }

    /// Takes `child` off `parent`'s list.
    fn detach(&mut self, parent: u32, child: u32) {
        if let Some(pm) = self.members.get_mut(&parent) {
            pm.rec.children.retain(|&c| c != child);
            self.touch_children_of(parent);
        }
    }

    fn leave_layer(&mut self, layer: i32, id: u32) {
        if let Some(l) = self.layers.get_mut(&layer) {
            l.remove(&id);
        }
        self.touch_layer(layer);
    }

    /// `p`'s children changed: it, they, and whoever hedges for it see it.
    fn touch_children_of(&mut self, p: u32) {
        self.dirty.insert(p);
        if let Some(m) = self.members.get(&p) {
            self.dirty.extend(m.rec.children.iter().copied());
            if let Some(l) = m.rec.layer {
                let hedgers = self.hedgers_of(l, p);
                self.dirty.extend(hedgers);
            }
        }
    }

    /// A layer's membership changed: its hedging shifts, for every proxy and child in it.
    fn touch_layer(&mut self, layer: i32) {
        let ids: Vec<u32> = self.layers.get(&layer).map(|l| l.iter().copied().collect()).unwrap_or_default();
        for p in ids {
            self.dirty.insert(p);
            if let Some(m) = self.members.get(&p) {
                self.dirty.extend(m.rec.children.iter().copied());
            }
        }
    }

    /// The proxies `p` hedges for: the next `H` of its layer in id order (circular).
    fn hedged_for(&self, p: u32) -> Vec<u32> {
        let Some(layer) = self.members.get(&p).and_then(|m| m.rec.layer) else { return Vec::new() };
        let Some(l) = self.layers.get(&layer).filter(|l| l.contains(&p)) else { return Vec::new() };
        let n = l.len();
        let after = l.range(p + 1..).chain(l.range(..p)).copied();
        after.take(self.cfg.hedge.min(n.saturating_sub(1))).collect()
    }

    /// The proxies of `layer` that hedge for `p`: the previous `H` in id order.
    fn hedgers_of(&self, layer: i32, p: u32) -> Vec<u32> {
        let Some(l) = self.layers.get(&layer) else { return Vec::new() };
        let n = l.len();
        let before = l.range(..p).rev().chain(l.range(p + 1..).rev()).copied();
        before.take(self.cfg.hedge.min(n.saturating_sub(1))).collect()
    }

    fn hedge_targets(&self, p: u32) -> Vec<u32> {
        let mut t = Vec::new();
        for s in self.hedged_for(p) {
            t.extend(self.members[&s].rec.children.iter().copied());
        }
        t
    }

    /// Member `id`'s view (its version filled in by [`Self::flush`]).
    fn view(&self, id: u32) -> Assign {
        let m = &self.members[&id].rec;
        let unplaced = m.layer.is_none();
        let hedge_targets = if m.role == MemberRole2::Proxy { self.hedge_targets(id) } else { Vec::new() };
        let hedge_parents = match (m.parent, m.layer) {
            (Some(q), Some(l)) if l > 0 => self.hedgers_of(l - 1, q),
            _ => Vec::new(),
        };
        let mut peers: Vec<Peer> = Vec::new();
        let add = |id: u32, peers: &mut Vec<Peer>| {
            if let Some(n) = self.members.get(&id) {
                if peers.len() < PEERS_MAX && !peers.iter().any(|p| p.id == id) {
                    peers.push(Peer { id, role: n.rec.role.into(), addr: n.rec.addr });
                }
            }
        };
        // Children moved away that this node still feeds (make before break).
        let leaving: Vec<u32> =
            self.leaving.iter().filter(|(c, (o, _))| *o == id && !m.children.contains(c)).map(|(&c, _)| c).collect();
        let children: Vec<u32> = m.children.iter().chain(&leaving).copied().collect();
        add(id, &mut peers);
        for &x in m.parent.iter().chain(&children).chain(&hedge_targets).chain(&hedge_parents) {
            add(x, &mut peers);
        }
        Assign {
            incarnation: m.incarnation,
            id,
            version: 0,
            tree: 0,
            role: m.role.into(),
            layer: if unplaced { crate::membership::UNPLACED } else { m.layer.unwrap_or(0) as i8 },
            parent: m.parent.unwrap_or(NO_PARENT),
            fanout: self.cfg.fanout as u16,
            hedge: self.cfg.hedge as u8,
            depth: (self.cfg.proxy_layers + 1) as u8,
            children: children.into_iter().take(LINKS_MAX).collect(),
            hedge_targets: hedge_targets.into_iter().take(LINKS_MAX).collect(),
            hedge_parents: hedge_parents.into_iter().take(LINKS_MAX).collect(),
            peers,
        }
    }

    /// Publishes a new version if any view changed, and sends the changed views.
    fn flush(&mut self, _now: u64) {
        let dirty = std::mem::take(&mut self.dirty);
        let mut changed = Vec::new();
        let mut views = Vec::new();
        for id in dirty {
            if !self.members.contains_key(&id) {
                continue;
            }
            let v = self.view(id);
            if self.members[&id].view.as_ref() != Some(&v) {
                changed.push(id);
                views.push(v);
            }
        }
        if changed.is_empty() {
            return;
        }
        self.version += 1;
        self.stats.versions += 1;
        let version = self.version;
        for v in views {
            let id = v.id;
            let to = self.members[&id].rec.addr;
            let mut sent = v.clone();
            sent.version = version;
            self.stats.views_sent += 1;
            self.send(to, &Message::Assign(sent));
            let m = self.members.get_mut(&id).expect("a member");
            m.view = Some(v);
            m.view_version = version;
        }
        self.push_event(Event::Published { version, changed });
    }
}

/// A node's side of membership: registers, keeps its heartbeat, and hands
/// the shell each newer view of itself.
pub struct MemberClient {
    cfg: MemberConfig,
    auth: Option<Auth>,
    state: ClientState,
    /// The version of the view last handed out (what the heartbeat says it runs).
    version: u64,
    seq: u64,
    out: VecDeque<Vec<u8>>,
    /// When the controller was last heard from.
    pub last_heard_ns: u64,
    /// Its counters.
    pub stats: MemberStats,
}

/// What a member is and how often it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberConfig {
    /// What it wants to be.
    pub role: MemberRole,
    /// The id it wants, or ANY_ID.
    pub want_id: u32,
    /// Children it can feed (proxies; 0: the controller's fan-out).
    pub capacity: u16,
    /// Where it wants copies sent (`None`: where its datagrams come from).
    pub advertise: Option<SocketAddr>,
    /// Random per process start.
    pub incarnation: u64,
    /// How often it sends a heartbeat, ns.
    pub heartbeat_ns: u64,
    /// A registration unanswered this long is sent again (keep it below
    /// the controller's dead-after: a registration counts as a heartbeat).
    pub register_retry_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientState {
    /// Registering; the next attempt at this time.
    Registering {
        next_ns: u64,
    },
    /// A member under `id`; the next heartbeat at this time.
    Member {
        id: u32,
        next_ns: u64,
    },
    /// Refused: register again at this time (`u64::MAX`: never).
    Refused {
        until_ns: u64,
    },
    Left,
}

/// What the controller told a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Told {
    /// A newer view: apply it.
    View(Assign),
    /// The controller will not take it (now).
    Refused {
        /// Why.
        reason: RefuseReason,
        /// Ask again after this long, ns (0: do not).
        retry_after_ns: u64,
    },
}

/// A member's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemberStats {
    /// Registrations sent.
    pub registrations: u64,
    /// Heartbeats sent.
    pub heartbeats: u64,
    /// Views applied.
    pub views: u64,
    /// Views for another incarnation or older than the one applied.
    pub stale_views: u64,
    /// Refusals received.
    pub refusals: u64,
    /// Datagrams that are not membership messages.
    pub malformed: u64,
    /// Datagrams refused by the tree key.
    pub auth_refused: u64,
}

impl MemberClient {
    /// A member client with `cfg`, sealing with `auth` when given.
    pub fn new(cfg: MemberConfig, auth: Option<Auth>) -> Self {
        MemberClient {
            cfg,
            auth,
            state: ClientState::Registering { next_ns: 0 },
            version: 0,
            seq: 0,
            out: VecDeque::new(),
            last_heard_ns: 0,
            stats: MemberStats::default(),
        }
    }

    /// The id it holds (none before the first view).
    pub fn id(&self) -> Option<u32> {
        match self.state {
            ClientState::Member { id, .. } => Some(id),
            _ => None,
        }
    }

    /// The version of the view it runs.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// When it next wants a turn (a registration or a heartbeat due; `None`: never).
    pub fn next_timeout(&self) -> Option<u64> {
        match self.state {
            ClientState::Registering { next_ns } | ClientState::Member { next_ns, .. } => Some(next_ns),
            ClientState::Refused { until_ns } => Some(until_ns),
            ClientState::Left => None,
        }
    }

    /// Registers or beats, as due.
    pub fn handle_timeout(&mut self, now: u64) {
        match self.state {
            ClientState::Refused { until_ns } if now >= until_ns => {
                self.state = ClientState::Registering { next_ns: now };
                self.handle_timeout(now);
            }
            ClientState::Registering { next_ns } if now >= next_ns => {
                self.stats.registrations += 1;
                let c = self.cfg;
                let m = Register {
                    incarnation: c.incarnation,
                    role: c.role,
                    capacity: c.capacity,
                    want_id: c.want_id,
                    advertise: c.advertise,
                };
                self.push(now, c.want_id, &Message::Register(m));
                self.state = ClientState::Registering { next_ns: now + c.register_retry_ns };
            }
            ClientState::Member { id, next_ns } if now >= next_ns => {
                self.stats.heartbeats += 1;
                let hb = Heartbeat { incarnation: self.cfg.incarnation, id, version: self.version };
                self.push(now, id, &Message::Heartbeat(hb));
                self.state = ClientState::Member { id, next_ns: now + self.cfg.heartbeat_ns };
            }
            _ => {}
        }
    }

    /// Says goodbye (the controller takes it out at once, with no hold-down).
    pub fn leave(&mut self, now: u64) {
        if let ClientState::Member { id, .. } = self.state {
            self.push(now, id, &Message::Leave(Leave { incarnation: self.cfg.incarnation, id }));
        }
        self.state = ClientState::Left;
    }

    /// A datagram from the controller's address.
    pub fn handle_packet(&mut self, now: u64, bytes: &[u8]) -> Option<Told> {
        let Ok((h, payload)) = HeaderRepr::parse(bytes) else {
            self.stats.malformed += 1;
            return None;
        };
        if h.kind != Some(Kind::Membership) || h.origin != CONTROLLER_ORIGIN {
            self.stats.malformed += 1;
            return None;
        }
        if let Some(a) = &self.auth {
            if a.open(bytes, now).is_err() {
                self.stats.auth_refused += 1;
                return None;
            }
        }
        let Ok(m) = Message::parse(payload) else {
            self.stats.malformed += 1;
            return None;
        };
        match m {
            Message::Assign(a) if a.incarnation == self.cfg.incarnation && a.version > self.version => {
                if self.cfg.want_id != ANY_ID && a.id != self.cfg.want_id {
                    self.stats.malformed += 1;
                    return None;
                }
                self.last_heard_ns = now;
                self.stats.views += 1;
                self.version = a.version;
                if !matches!(self.state, ClientState::Member { .. } | ClientState::Left) {
                    self.state = ClientState::Member { id: a.id, next_ns: now + self.cfg.heartbeat_ns };
                }
                Some(Told::View(a))
            }
            Message::Assign(_) => {
                self.stats.stale_views += 1;
                None
            }
            Message::Refuse(r) if r.incarnation == self.cfg.incarnation => {
                self.last_heard_ns = now;
                self.stats.refusals += 1;
                let retry_after_ns = u64::from(r.retry_after_ms) * 1_000_000;
                self.state = match r.reason {
                    RefuseReason::Unknown => ClientState::Registering { next_ns: now },
                    RefuseReason::SenderTaken => ClientState::Refused { until_ns: u64::MAX },
                    _ => ClientState::Refused { until_ns: now + retry_after_ns.max(self.cfg.register_retry_ns) },
                };
                Some(Told::Refused { reason: r.reason, retry_after_ns })
            }
            _ => {
                self.stats.malformed += 1;
                None
            }
        }
    }

    /// The next datagram for the controller.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    fn push(&mut self, now: u64, origin: u32, m: &Message) {
        self.seq += 1;
        let b = crate::membership::packet(m, origin, self.seq, now, self.auth.as_ref());
        // A member sends a handful per interval; the shell drains every turn.
        if self.out.len() < 64 {
            self.out.push_back(b);
        }
    }
}

/// The links a view gives its node ([`crate::node::Node::set_links`]).
pub fn view_links(a: &Assign) -> crate::node::TreeLinks {
    crate::node::TreeLinks {
        parent: (a.parent != NO_PARENT).then_some(a.parent),
        children: a.children.clone(),
        hedge_targets: a.hedge_targets.clone(),
        hedge_parents: a.hedge_parents.clone(),
    }
}

/// The part of the topology a view shows, as a topology a node starts from:
/// the node itself and every peer it names, with addresses, one layer apart
/// as the links say (what a node process reads from a topology file).
pub fn view_topology(a: &Assign) -> Topology {
    let role = |r: MemberRole| match r {
        MemberRole::Sender => Role::Sender,
        MemberRole::Proxy => Role::Proxy,
        MemberRole::Receiver => Role::Receiver,
    };
    let me_layer = if a.layer == crate::membership::UNPLACED { 0 } else { i32::from(a.layer) };
    let mut nodes: Vec<PlanNode> = Vec::with_capacity(a.peers.len() + 1);
    for p in &a.peers {
        let layer = if p.id == a.id {
            me_layer
        } else if p.id == a.parent || a.hedge_parents.contains(&p.id) {
            me_layer - 1
        } else {
            me_layer + 1
        };
        let mut n = PlanNode {
            id: p.id,
            role: role(p.role),
            layer,
            index: 0,
            parent: None,
            children: Vec::new(),
            hedge_targets: Vec::new(),
            addr: Some(p.addr.to_string()),
            control: None,
        };
        if p.id == a.id {
            n.parent = (a.parent != NO_PARENT).then_some(a.parent);
            n.children.clone_from(&a.children);
            n.hedge_targets.clone_from(&a.hedge_targets);
        } else if p.id == a.parent {
            n.children.push(a.id);
        } else if a.hedge_parents.contains(&p.id) {
            n.hedge_targets.push(a.id);
        } else if a.children.contains(&p.id) {
            // Each link from both ends (the clock's probe graph takes a
            // node's edges from its children's side).
            n.parent = Some(a.id);
        }
        nodes.push(n);
    }
    let receiver_ids = nodes.iter().filter(|n| n.role == Role::Receiver).map(|n| n.id).collect::<Vec<_>>();
    Topology {
        receivers: receiver_ids.len(),
        fanout: usize::from(a.fanout).max(1),
        depth: usize::from(a.depth).max(1),
        hedge: usize::from(a.hedge),
        sharding: "one tree (the controller's)".into(),
        receiver_ids,
        trees: vec![Tree { id: a.tree, nodes }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn addr(id: u32) -> SocketAddr {
        SocketAddr::from(([127, 9, (id >> 8) as u8, id as u8], 9000))
    }

    /// Nodes and the controller over a perfect in-memory network.
    struct Net {
        c: Controller,
        clients: BTreeMap<u32, MemberClient>,
        /// The view each node runs.
        views: BTreeMap<u32, Assign>,
        /// Nodes that stopped (their datagrams go nowhere, none reach them).
        down: BTreeSet<u32>,
        now: u64,
        drop_views: bool,
    }

    impl Net {
        fn new(cfg: ControllerConfig, key: Option<Auth>) -> Net {
            Net {
                c: Controller::new(cfg, key).unwrap(),
                clients: BTreeMap::new(),
                views: BTreeMap::new(),
                down: BTreeSet::new(),
                now: 1_000 * MS,
                drop_views: false,
            }
        }

        fn join(&mut self, id: u32, role: MemberRole, incarnation: u64) {
            let cfg = MemberConfig {
                role,
                want_id: id,
                capacity: 0,
                advertise: None,
                incarnation,
                heartbeat_ns: 10 * MS,
                register_retry_ns: 10 * MS,
            };
            self.down.remove(&id);
            // A new process: what the old one ran is not what this one runs.
            self.views.remove(&id);
            self.clients.insert(id, MemberClient::new(cfg, self.c.auth.clone()));
        }

        /// Runs `ms` milliseconds in 1 ms steps.
        fn run(&mut self, ms: u64) {
            for _ in 0..ms {
                self.now += MS;
                let now = self.now;
                for (&id, cl) in &mut self.clients {
                    if self.down.contains(&id) {
                        continue;
                    }
                    cl.handle_timeout(now);
                    while let Some(b) = cl.poll_transmit() {
                        self.c.handle_packet(now, addr(id), &b);
                    }
                }
                if self.c.next_timeout().is_some_and(|t| t <= now) {
                    self.c.handle_timeout(now);
                }
                while let Some((to, b)) = self.c.poll_transmit() {
                    let Some((&id, cl)) = self.clients.iter_mut().find(|(&id, _)| addr(id) == to) else { continue };
                    if self.down.contains(&id) || self.drop_views {
                        continue;
                    }
                    if let Some(Told::View(v)) = cl.handle_packet(now, &b) {
                        self.views.insert(id, v);
                    }
                }
            }
        }

        /// What every node runs agrees with the controller's topology, which the planner's checks accept.
        fn check(&self) {
            let t = self.c.topology();
            if self.c.waiting() > 0 {
                let last = self.c.cfg.proxy_layers as i32;
                assert_eq!(self.c.parent_for(last, 1), None, "a receiver waits only while there is no room");
            }
            if self.c.sender.is_some() && !t.receiver_ids.is_empty() {
                crate::plan::validate(&t).unwrap_or_else(|e| panic!("{e}: {t:#?}"));
            }
            for rec in self.c.records() {
                if self.down.contains(&rec.id) {
                    continue;
                }
                // A record of a process the id's node replaced (restarted with a
                // new incarnation): gone, and declared dead within dead-after.
                if self.clients.get(&rec.id).is_some_and(|cl| cl.cfg.incarnation != rec.incarnation) {
                    continue;
                }
                let v = &self.views[&rec.id];
                // Its children, and those moved away it still feeds.
                let mut children = rec.children.clone();
                children.extend(
                    self.c
                        .leaving
                        .iter()
                        .filter(|(c, (o, _))| *o == rec.id && !rec.children.contains(c))
                        .map(|(c, _)| c),
                );
                assert_eq!(v.children, children, "node {} runs its children", rec.id);
                assert_eq!(v.parent, rec.parent.unwrap_or(NO_PARENT), "node {} runs its parent", rec.id);
                let n = t.trees[0].nodes.iter().find(|n| n.id == rec.id);
                if let Some(n) = n {
                    assert_eq!(v.hedge_targets, n.hedge_targets, "node {}", rec.id);
                }
                // Every link named in a view has its address there.
                for x in v.children.iter().chain(&v.hedge_targets).chain(&v.hedge_parents) {
                    assert!(v.peers.iter().any(|p| p.id == *x), "node {} knows where {x} is", rec.id);
                }
            }
        }
    }

    fn small(f: usize) -> ControllerConfig {
        ControllerConfig { fanout: f, hedge: 1, proxy_layers: 1, hold_down_ns: 500 * MS, ..Default::default() }
    }

    #[test]
    fn nodes_register_and_run_a_tree_the_planner_accepts() {
        let mut n = Net::new(small(2), Some(Auth::new([3; 32])));
        n.join(100, MemberRole::Sender, 1);
        for p in 10..12 {
            n.join(p, MemberRole::Proxy, 1);
        }
        for r in 0..4 {
            n.join(r, MemberRole::Receiver, 1);
        }
        n.run(30);
        n.check();
        let t = n.c.topology();
        assert_eq!(t.receiver_ids, vec![0, 1, 2, 3]);
        // With H = 1 every receiver hears from both proxies.
        let r0 = &n.views[&0];
        assert_eq!(r0.hedge_parents.len(), 1);
        assert_eq!(n.c.waiting(), 0);
        // A fifth receiver waits for room; a proxy joins as a spare (layer 0 is full)...
        n.join(4, MemberRole::Receiver, 1);
        n.join(12, MemberRole::Proxy, 1);
        n.run(30);
        assert_eq!(n.c.waiting(), 1, "no room under two proxies of fan-out 2");
        assert_eq!(n.views[&12].layer, crate::membership::UNPLACED, "a spare");
        n.check();
    }

    #[test]
    fn a_dead_proxy_is_replaced_by_a_spare_or_its_children_move_and_it_is_held_down() {
        let mut n = Net::new(small(2), None);
        n.join(100, MemberRole::Sender, 1);
        for p in [10, 11, 12] {
            n.join(p, MemberRole::Proxy, 1);
        }
        for r in 0..4 {
            n.join(r, MemberRole::Receiver, 1);
        }
        n.run(30);
        let victim = n.views[&0].parent;
        n.down.insert(victim);
        n.run(60);
        assert_eq!(n.c.stats.deaths, 1);
        assert_eq!(n.views[&0].parent, 12, "the spare took the dead proxy's place");
        n.check();
        // No spare left: the next death moves the children to the last proxy (overloaded).
        let victim = n.views[&0].parent;
        n.down.insert(victim);
        n.run(60);
        assert_eq!(n.c.stats.deaths, 2);
        let last = n.c.topology().trees[0].nodes.iter().filter(|x| x.role == Role::Proxy).count();
        assert_eq!(last, 1);
        assert_eq!(n.c.overloaded(), 1, "four receivers on a proxy of capacity 2");
        n.check();
        // The dead come back as new members, after the hold-down.
        n.join(victim, MemberRole::Proxy, 2);
        n.run(100);
        assert!(n.c.record(victim).is_none(), "held down");
        assert!(n.c.stats.refused >= 1);
        n.run(600);
        assert!(n.c.record(victim).is_some(), "admitted after the hold-down");
        n.check();
    }

    /// A repair without a spare loads a proxy beyond its capacity; a proxy
    /// that joins later takes the excess, make before break: the old parent
    /// keeps feeding the moved children until [`MOVE_OVERLAP_NS`] has passed.
    #[test]
    fn a_proxy_that_joins_takes_the_children_a_repair_piled_up_before_their_old_parent_lets_go() {
        let mut n = Net::new(small(2), None);
        n.join(100, MemberRole::Sender, 1);
        for p in [10, 11] {
            n.join(p, MemberRole::Proxy, 1);
        }
        for r in 0..4 {
            n.join(r, MemberRole::Receiver, 1);
        }
        n.run(30);
        n.down.insert(10);
        n.run(60);
        assert_eq!(n.c.overloaded(), 1, "{:?}", n.c.record(11));
        assert_eq!(n.views[&11].children.len(), 4);
        // A new proxy: room under the sender, and two of 11's four children for it.
        n.join(12, MemberRole::Proxy, 1);
        n.run(20);
        assert_eq!(n.c.stats.moves, 2);
        assert_eq!(n.c.overloaded(), 0);
        let moved: Vec<u32> = n.views[&12].children.clone();
        assert_eq!(moved.len(), 2);
        for c in &moved {
            assert_eq!(n.views[c].parent, 12, "{c} runs its new parent");
            assert!(n.views[&11].children.contains(c), "and its old parent still feeds it");
        }
        n.check();
        n.run(MOVE_OVERLAP_NS / MS + 10);
        assert_eq!(n.views[&11].children.len(), 2, "the old parent let go");
        assert!(moved.iter().all(|c| !n.views[&11].children.contains(c)));
        n.check();
    }

    #[test]
    fn lost_views_are_sent_again_and_forged_registrations_change_nothing() {
        let mut n = Net::new(small(4), Some(Auth::new([5; 32])));
        n.join(100, MemberRole::Sender, 1);
        n.join(10, MemberRole::Proxy, 1);
        n.drop_views = true;
        n.run(5);
        n.drop_views = false;
        n.join(0, MemberRole::Receiver, 1);
        n.run(40);
        // The two lost first views: the sender asked again; the proxy's next view (its new child) came anyway.
        assert!(n.c.stats.registrations >= 4, "{:?}", n.c.stats);
        assert_eq!(n.views.len(), 3, "every node runs a view");
        n.check();
        // A lost update: the receiver's next heartbeat names the old version, and gets the new one.
        n.drop_views = true;
        n.join(1, MemberRole::Receiver, 1);
        n.run(3);
        n.drop_views = false;
        n.run(30);
        assert!(n.c.stats.stale_views >= 1, "{:?}", n.c.stats);
        n.check();
        // A registration sealed with another key, and junk: counted, nothing joins.
        let mut forger = MemberClient::new(
            MemberConfig {
                role: MemberRole::Receiver,
                want_id: 7,
                capacity: 0,
                advertise: None,
                incarnation: 9,
                heartbeat_ns: 10 * MS,
                register_retry_ns: 10 * MS,
            },
            Some(Auth::new([6; 32])),
        );
        forger.handle_timeout(n.now);
        let b = forger.poll_transmit().unwrap();
        n.c.handle_packet(n.now, addr(7), &b);
        n.c.handle_packet(n.now, addr(7), &b[..10]);
        assert!(n.c.record(7).is_none());
        assert_eq!(n.c.stats.auth_refused, 1);
        assert_eq!(n.c.stats.malformed, 1);
    }

    #[test]
    fn one_address_holds_a_bounded_number_of_members() {
        let cfg = ControllerConfig { members_per_ip_max: 3, ..small(4) };
        let mut c = Controller::new(cfg, None).unwrap();
        for i in 0..10u64 {
            let mut cl = MemberClient::new(
                MemberConfig {
                    role: MemberRole::Receiver,
                    want_id: ANY_ID,
                    capacity: 0,
                    advertise: None,
                    incarnation: i,
                    heartbeat_ns: 10 * MS,
                    register_retry_ns: 10 * MS,
                },
                None,
            );
            cl.handle_timeout(MS);
            let from = SocketAddr::from(([127, 9, 0, 1], 9000 + i as u16));
            c.handle_packet(MS, from, &cl.poll_transmit().unwrap());
        }
        assert_eq!(c.records().count(), 3);
        assert_eq!(c.stats.refused, 7);
        // And one address holds one member: a second registration from it waits.
        let mut cl = MemberClient::new(
            MemberConfig {
                role: MemberRole::Receiver,
                want_id: 50,
                capacity: 0,
                advertise: None,
                incarnation: 99,
                heartbeat_ns: 10 * MS,
                register_retry_ns: 10 * MS,
            },
            None,
        );
        cl.handle_timeout(MS);
        c.handle_packet(MS, SocketAddr::from(([127, 9, 0, 1], 9000)), &cl.poll_transmit().unwrap());
        assert!(c.record(50).is_none());
        assert_eq!(c.stats.refused, 8);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Whatever joins, dies and comes back in whatever order, every
        /// node runs the controller's topology and the planner accepts it.
        #[test]
        fn any_churn_keeps_a_valid_tree(
            f in 2usize..5,
            layers in 1usize..3,
            ops in proptest::collection::vec((0u8..4, 0u32..24), 1..40),
        ) {
            let cfg = ControllerConfig { fanout: f, hedge: 1, proxy_layers: layers, hold_down_ns: 100 * MS, ..Default::default() };
            let mut n = Net::new(cfg, None);
            n.join(1000, MemberRole::Sender, 1);
            let mut inc = 10;
            for (op, x) in ops {
                inc += 1;
                match op {
                    0 => n.join(x, MemberRole::Receiver, inc),
                    1 => n.join(100 + x, MemberRole::Proxy, inc),
                    2 => { n.down.insert(x); }
                    _ => { n.down.insert(100 + x); }
                }
                n.run(50);
                n.check();
            }

        }
    }
}
