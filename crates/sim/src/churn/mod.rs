//! A tree that changes while the feed runs (issue 43), simulated with the
//! cores the processes run: the controller ([`Controller`]), each node's
//! [`MemberClient`] and its tree [`Node`], over emulated links (the
//! `fairfeed-model` link model), on virtual time, seeded.
//!
//! A seeded schedule kills proxies (one at a time, or two at once, while
//! all the others run), has each restarted half a hold-down later (a new
//! incarnation, refused until its hold-down ends), joins receivers, and
//! removes them (gracefully or by death) while the sender sends. What
//! is measured, per receiver and message: a receiver counts for every
//! message sent from [`JOIN_SETTLE_NS`] after it was first placed until it
//! stopped (less the last [`STOP_SETTLE_NS`]); each such message released
//! never is **lost**, released twice **duplicated**, released before an
//! earlier one **out of order**. A repair is timed from the kill until
//! every child of the dead proxy runs a view with a live parent; a join
//! from the receiver's start to its first release.
//!
//! Receivers that join while the feed runs start from a snapshot of the
//! sender's books (`books`: the snapshot service's and the joiner's own
//! cores), and their applications' books are checked against the whole
//! feed's.
//!
//! Two proxies killed at once are counted apart: when they hedge for each
//! other (H = 1), the children of both lose both paths until the repair —
//! beyond what one hedge can mask, and reported as such.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::SocketAddr;

use fairfeed_tree::controller::{Controller, ControllerConfig, ControllerStats, MemberClient, MemberConfig, Told};
use fairfeed_tree::membership::MemberRole;
use fairfeed_tree::node::{
    earliest, DeadlineRule, Node, NodeConfig, Proxy, Receiver, ReleaseOrder, Sender, Transmit, NO_LINK,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde::Serialize;

use crate::model::{LinkEmulator, LinkModel};

mod books;
pub use books::BookCheck;

/// Messages sent this soon after a receiver was placed are not counted for it
/// (its parent may learn of it a link delay later).
pub const JOIN_SETTLE_NS: u64 = 10_000_000;
/// Messages sent this close before a receiver stopped are not counted for it.
pub const STOP_SETTLE_NS: u64 = 50_000_000;
/// Messages sent this long before two proxies were killed at once were
/// still on their way through them (the link model's tail is a few ms).
pub const IN_FLIGHT_NS: u64 = 10_000_000;
/// Nodes (ids) a run holds at most, joiners included.
pub const NODES_MAX: usize = 100_000;
/// Events a run may process at most.
pub const EVENTS_MAX: u64 = 2_000_000_000;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct ChurnConfig {
    pub seed: u64,
    pub receivers: usize,
    /// Proxies the controller places, and spares beside them.
    pub proxies: usize,
    pub spares: usize,
    pub fanout: usize,
    pub hedge: usize,
    pub feed_s: f64,
    pub rate_per_s: f64,
    /// One membership change every this long (mean, exponential), ns.
    pub change_every_ns: u64,
    pub link: LinkModel,
    pub heartbeat_ns: u64,
    pub dead_after_ns: u64,
    pub hold_down_ns: u64,
    /// The sender's deadline rule: the quantile controller at this target
    /// P(F) (`None`: the paper's rule, OWD_G with no margin).
    pub target_pf: Option<f64>,
    /// Some kills take two neighbouring proxies at once (beyond what H = 1
    /// masks); without, every kill is of one proxy.
    pub double_kills: bool,
}

impl Default for ChurnConfig {
    fn default() -> Self {
        ChurnConfig {
            seed: 1,
            receivers: 20,
            proxies: 4,
            spares: 1,
            fanout: 6,
            hedge: 1,
            feed_s: 5.0,
            rate_per_s: 2_000.0,
            change_every_ns: 500_000_000,
            link: LinkModel::CLOUD,
            heartbeat_ns: 10_000_000,
            dead_after_ns: 40_000_000,
            hold_down_ns: 1_000_000_000,
            target_pf: Some(0.999),
            double_kills: true,
        }
    }
}

impl ChurnConfig {
    /// The default run reshaped for `nodes` processes in all: one layer of
    /// proxies under the sender, fan-out F ≈ √(1.5 N), room for half as
    /// many receivers again (joiners find a place), one spare. `None` when
    /// the sender's fan-out cannot take the proxies so many nodes need.
    pub fn for_nodes(nodes: usize) -> Option<ChurnConfig> {
        let fanout = ((1.5 * (nodes as f64 - 2.0)).sqrt().ceil() as usize).max(4);
        let spares = 1;
        let receivers = (nodes.checked_sub(1 + spares)? as f64 / (1.0 + 1.5 / fanout as f64)).floor() as usize;
        let proxies = nodes.checked_sub(1 + spares + receivers)?.max(2);
        (proxies <= fanout).then(|| ChurnConfig { receivers, proxies, spares, fanout, ..ChurnConfig::default() })
    }
}

/// What a run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChurnResult {
    pub seed: u64,
    pub messages: u64,
    /// (receiver, message) pairs counted.
    pub deliveries_expected: u64,
    pub lost: u64,
    /// Of `lost`: while two proxies killed at once were being repaired (beyond H = 1).
    pub lost_in_double_kills: u64,
    /// Of `lost`: while one proxy killed alone was being repaired (what H = 1 should mask).
    pub lost_in_single_kills: u64,
    /// Of `lost`: away from any kill — the links' own losses (a loss burst
    /// at the sender reaches every path; the simulator has no retransmission).
    pub lost_outside_kills: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    pub kills: u64,
    pub double_kills: u64,
    pub restarts: u64,
    pub joins: u64,
    pub leaves: u64,
    pub receiver_deaths: u64,
    pub repairs: u64,
    /// Each repair's time, kill to every orphan on a live parent, ms.
    pub repair_ms: Vec<f64>,
    /// Each joiner's time from its start to its first release, ms.
    pub join_first_message_ms: Vec<f64>,
    /// Joiners that never released (the run ended first, or no room).
    pub joins_unserved: u64,
    pub versions: u64,
    /// Releases, and of them those past their deadline (released on arrival).
    pub releases: u64,
    pub late_releases: u64,
    /// Joiners' books (from their snapshot and live line) against the whole feed's.
    #[serde(flatten)]
    pub books: BookCheck,
    /// Messages released by two receivers or more, and the share of them
    /// whose releases all fell within 1 µs (P(F), virtual clocks).
    pub windowed_messages: u64,
    pub pf_1us: f64,
    pub window_p99_us: f64,
    pub controller: ControllerStats,
}

/// Which sequences a receiver released (a bit each), and how many again.
#[derive(Default)]
struct Seen {
    bits: Vec<u64>,
    repeats: u64,
}

impl Seen {
    /// Marks `seq`; false if it was marked already (a repeat, counted).
    fn set(&mut self, seq: u64) -> bool {
        let (w, b) = ((seq / 64) as usize, seq % 64);
        if self.bits.len() <= w {
            self.bits.resize(w + 1, 0);
        }
        let new = self.bits[w] & (1 << b) == 0;
        self.bits[w] |= 1 << b;
        self.repeats += u64::from(!new);
        new
    }

    fn has(&self, seq: u64) -> bool {
        self.bits.get((seq / 64) as usize).is_some_and(|w| w & (1 << (seq % 64)) != 0)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Dest {
    Controller,
    Node(u32),
}

#[derive(Clone)]
enum Ev {
    Datagram {
        to: Dest,
        from: SocketAddr,
        bytes: std::rc::Rc<[u8]>,
    },
    /// A node process's timer (its generation: a restarted node's old timers are void).
    Timer {
        id: u32,
        gen: u32,
    },
    ControllerTimer,
    Send,
    Change,
    /// A supervisor (systemd, Kubernetes) starts a killed proxy again.
    Restart {
        id: u32,
    },
    /// A joiner's login reaches the sender's snapshot service.
    SnapLogin {
        id: u32,
        gen: u32,
        login: Vec<u8>,
    },
    /// The snapshot service's answer, all of it, reaches the joiner.
    SnapStream {
        id: u32,
        gen: u32,
        bytes: std::rc::Rc<[u8]>,
    },
}

/// One node process.
struct Proc {
    role: MemberRole,
    gen: u32,
    addr: SocketAddr,
    node: Node,
    client: MemberClient,
    alive: bool,
    started_ns: u64,
    parent: u32,
    placed_ns: Option<u64>,
    stopped_ns: Option<u64>,
    timer_at: u64,
    /// Releases: sequence → count.
    released: Seen,
    last_released: u64,
    out_of_order: u64,
    first_release_ns: Option<u64>,
    /// A joiner's application (snapshot, then the live line).
    app: Option<books::App>,
}

/// A repair being timed: the dead proxy, when, its children then.
struct Repair {
    dead: u32,
    at_ns: u64,
    orphans: Vec<u32>,
    double: bool,
}

struct World {
    cfg: ChurnConfig,
    rng: ChaCha12Rng,
    now: u64,
    order: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Ev>>,
    free: Vec<usize>,
    ctl: Controller,
    ctl_timer_at: u64,
    procs: BTreeMap<u32, Proc>,
    by_addr: HashMap<SocketAddr, u32>,
    links: LinkEmulator,
    /// Send times by sequence.
    sent: Vec<u64>,
    /// Per sequence: the first and last release instants over receivers, and how many released it.
    windows: Vec<(u64, u64, u32)>,
    repairs: Vec<Repair>,
    /// Windows of kills (start, end of repair, two at once) for loss attribution.
    kill_windows: Vec<(u64, u64, bool)>,
    next_id: u32,
    r: ChurnResult,
    /// The generated ITCH line and the sender's snapshot service.
    feed: books::Feed,
    /// Draws the snapshot connections' delays (apart from the run's schedule).
    snap_rng: ChaCha12Rng,
}

/// The controller's place in the link emulator's table.
const CONTROLLER_LINK_ID: u32 = NODES_MAX as u32;
/// Seeds the snapshot connections' delays from the run's seed.
const SNAPSHOT_RNG_SALT: u64 = 0x736e_6170_7368_6f74;
const CONTROLLER_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 255, 255, 1)), 9700);

/// What a node process handed out during one call, to node ids.
struct Out(Vec<(u32, Vec<u8>)>);

impl Transmit for Out {
    fn send(&mut self, to: u32, bytes: &[u8]) {
        self.0.push((to, bytes.to_vec()));
    }
}

impl World {
    fn new(cfg: ChurnConfig) -> World {
        let ccfg = ControllerConfig {
            fanout: cfg.fanout,
            hedge: cfg.hedge,
            proxy_layers: 1,
            dead_after_ns: cfg.dead_after_ns,
            hold_down_ns: cfg.hold_down_ns,
            ..ControllerConfig::default()
        };
        let mut rng = ChaCha12Rng::seed_from_u64(cfg.seed);
        let links = LinkEmulator::new(cfg.link, ChaCha12Rng::seed_from_u64(rng.gen()), NODES_MAX + 1);
        let (cfg_seed, rate) = (cfg.seed, cfg.rate_per_s);
        let packets = (cfg.feed_s * cfg.rate_per_s) as u64 + 1;
        World {
            ctl: Controller::new(ccfg, None).expect("a valid controller configuration"),
            cfg,
            rng,
            now: 0,
            order: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            free: Vec::new(),
            ctl_timer_at: u64::MAX,
            procs: BTreeMap::new(),
            by_addr: HashMap::new(),
            links,
            sent: vec![0],
            windows: vec![(u64::MAX, 0, 0)],
            repairs: Vec::new(),
            kill_windows: Vec::new(),
            next_id: 0,
            r: ChurnResult::default(),
            feed: books::Feed::new(cfg_seed, packets, rate),
            snap_rng: ChaCha12Rng::seed_from_u64(cfg_seed ^ SNAPSHOT_RNG_SALT),
        }
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.order += 1;
        let slot = match self.free.pop() {
            Some(i) => {
                self.events[i] = Some(ev);
                i
            }
            None => {
                self.events.push(Some(ev));
                self.events.len() - 1
            }
        };
        self.queue.push(Reverse((at, self.order, slot)));
    }

    /// Starts a node process of `role` under `id` (a new incarnation if the id ran before).
    fn start(&mut self, id: u32, role: MemberRole) {
        let gen = self.procs.get(&id).map_or(0, |p| p.gen + 1);
        let addr = SocketAddr::from(([10, (gen % 250) as u8, (id >> 8) as u8, id as u8], 9100));
        // Receivers started while the feed runs join a running session.
        let ncfg = NodeConfig {
            order: ReleaseOrder::Sequence { gap_wait_ns: 20_000_000 },
            joins_running: self.now > 0,
            ..NodeConfig::default()
        };
        let node = match role {
            MemberRole::Sender => {
                let rule = match self.cfg.target_pf {
                    Some(target_pf) => DeadlineRule::Quantile { target_pf },
                    None => DeadlineRule::Paper { margin_ns: 0 },
                };
                Node::Sender(Box::new(Sender::new(id, Vec::new(), ncfg, rule)))
            }
            MemberRole::Proxy => Node::Proxy(Box::new(Proxy::new(id, NO_LINK, &[], &[], ncfg))),
            MemberRole::Receiver => Node::Receiver(Box::new(Receiver::new(id, NO_LINK, ncfg))),
        };
        let client = MemberClient::new(
            MemberConfig {
                role,
                want_id: id,
                capacity: 0,
                advertise: None,
                incarnation: self.rng.gen(),
                heartbeat_ns: self.cfg.heartbeat_ns,
                register_retry_ns: self.cfg.heartbeat_ns,
            },
            None,
        );
        if let Some(old) = self.procs.get(&id) {
            self.by_addr.remove(&old.addr);
        }
        self.by_addr.insert(addr, id);
        self.procs.insert(
            id,
            Proc {
                role,
                gen,
                addr,
                node,
                client,
                alive: true,
                started_ns: self.now,
                parent: NO_LINK,
                placed_ns: None,
                stopped_ns: None,
                timer_at: u64::MAX,
                released: Seen::default(),
                last_released: 0,
                out_of_order: 0,
                first_release_ns: None,
                app: (role == MemberRole::Receiver && self.now > 0).then(|| books::App::new(self.now)),
            },
        );
        self.push(self.now, Ev::Timer { id, gen });
    }

    fn stop(&mut self, id: u32, graceful: bool) {
        let now = self.now;
        let Some(p) = self.procs.get_mut(&id).filter(|p| p.alive) else { return };
        if graceful {
            p.client.leave(now);
        }
        p.alive = false;
        p.stopped_ns = Some(now);
        self.flush_client(id);
    }

    /// Sends copies a node handed out, through the emulated links.
    fn route(&mut self, from: u32, out: Out) {
        let Some(addr) = self.procs.get(&from).map(|p| p.addr) else { return };
        for (to, bytes) in out.0 {
            if to == NO_LINK {
                continue;
            }
            let bytes: std::rc::Rc<[u8]> = bytes.into();
            for at in self.links.arrivals_on(self.now, from, 0, to).into_iter().flatten() {
                self.push(at, Ev::Datagram { to: Dest::Node(to), from: addr, bytes: bytes.clone() });
            }
        }
    }

    /// What a node's membership client has for the controller.
    fn flush_client(&mut self, id: u32) {
        let Some(p) = self.procs.get_mut(&id) else { return };
        let addr = p.addr;
        let mut out = Vec::new();
        while let Some(b) = p.client.poll_transmit() {
            out.push(b);
        }
        for b in out {
            let bytes: std::rc::Rc<[u8]> = b.into();
            for at in self.links.arrivals_on(self.now, id, 0, CONTROLLER_LINK_ID).into_iter().flatten() {
                self.push(at, Ev::Datagram { to: Dest::Controller, from: addr, bytes: bytes.clone() });
            }
        }
    }

    fn flush_controller(&mut self) {
        while let Some((to, b)) = self.ctl.poll_transmit() {
            let Some(&id) = self.by_addr.get(&to) else { continue };
            let bytes: std::rc::Rc<[u8]> = b.into();
            for at in self.links.arrivals_on(self.now, CONTROLLER_LINK_ID, 0, id).into_iter().flatten() {
                self.push(at, Ev::Datagram { to: Dest::Node(id), from: CONTROLLER_ADDR, bytes: bytes.clone() });
            }
        }
        while self.ctl.poll_event().is_some() {}
        let due = self.ctl.next_timeout().unwrap_or(u64::MAX);
        if due < self.ctl_timer_at {
            self.ctl_timer_at = due;
            self.push(due.max(self.now), Ev::ControllerTimer);
        }
    }

    /// Re-arms node `id`'s timer if its next due time moved earlier.
    fn arm(&mut self, id: u32) {
        let Some(p) = self.procs.get_mut(&id).filter(|p| p.alive) else { return };
        let join_due = p.app.as_ref().map_or(u64::MAX, |a| a.joiner.next_due());
        let due = earliest([p.node.next_timeout(), p.client.next_timeout(), Some(join_due)]).unwrap_or(u64::MAX);
        if due < p.timer_at {
            p.timer_at = due;
            let gen = p.gen;
            self.push(due.max(self.now), Ev::Timer { id, gen });
        }
    }

    /// `n` one-way delays of the run's link model (the snapshot's TCP connection).
    fn snapshot_delay(&mut self, n: u64) -> u64 {
        (0..n).map(|_| self.cfg.link.sample_ns(&mut self.snap_rng)).sum()
    }

    /// A joiner's login at the sender's snapshot service: the answer goes back whole.
    fn on_snap_login(&mut self, id: u32, gen: u32, login: &[u8]) {
        let bytes = self.feed.serve(self.now, login);
        let at = self.now + self.snapshot_delay(1) + bytes.len() as u64 * books::SNAPSHOT_NS_PER_BYTE;
        self.push(at, Ev::SnapStream { id, gen, bytes: bytes.into() });
    }

    /// The snapshot service's answer at the joiner.
    fn on_snap_stream(&mut self, id: u32, gen: u32, bytes: &[u8]) {
        let now = self.now;
        let Some(p) = self.procs.get_mut(&id).filter(|p| p.alive && p.gen == gen) else { return };
        if let Some(a) = &mut p.app {
            a.stream(now, bytes);
        }
        self.arm(id);
    }

    /// Releases node `id` has ready.
    fn take_releases(&mut self, id: u32) {
        let now = self.now;
        let Some(p) = self.procs.get_mut(&id) else { return };
        while let Some(m) = p.node.poll_release() {
            if p.released.set(m.sequence) {
                if let Some(w) = self.windows.get_mut(m.sequence as usize) {
                    w.0 = w.0.min(now);
                    w.1 = w.1.max(now);
                    w.2 += 1;
                }
                self.r.late_releases += u64::from(m.late);
                self.r.releases += 1;
            }
            if m.sequence < p.last_released {
                p.out_of_order += 1;
            }
            p.last_released = p.last_released.max(m.sequence);
            p.first_release_ns.get_or_insert(now);
            if let Some(a) = &mut p.app {
                a.live(now, &m.payload);
            }
        }
    }

    fn on_datagram(&mut self, to: Dest, from: SocketAddr, bytes: &[u8]) {
        let now = self.now;
        let Dest::Node(id) = to else {
            self.ctl.handle_packet(now, from, bytes);
            self.flush_controller();
            return;
        };
        let Some(p) = self.procs.get_mut(&id).filter(|p| p.alive) else { return };
        if bytes.get(3) == Some(&(fairfeed_wire::overlay::Kind::Membership as u8)) {
            if let Some(Told::View(v)) = p.client.handle_packet(now, bytes) {
                let links = fairfeed_tree::controller::view_links(&v);
                p.parent = v.parent;
                if v.parent != fairfeed_tree::membership::NO_PARENT || p.role == MemberRole::Sender {
                    p.placed_ns.get_or_insert(now);
                }
                let _ = p.node.set_links(&links);
                self.check_repairs();
            }
        } else {
            let mut out = Out(Vec::new());
            let mut b = bytes.to_vec();
            let _ = p.node.handle_packet(now, &mut b, &mut out);
            self.route(id, out);
            self.take_releases(id);
        }
        self.arm(id);
    }

    fn on_timer(&mut self, id: u32, gen: u32) {
        let now = self.now;
        let Some(p) = self.procs.get_mut(&id).filter(|p| p.alive && p.gen == gen) else { return };
        if p.timer_at > now && p.timer_at != u64::MAX {
            return;
        }
        p.timer_at = u64::MAX;
        let mut out = Out(Vec::new());
        if p.node.next_timeout().is_some_and(|t| t <= now) {
            p.node.handle_timeout(now, &mut out);
        }
        if p.client.next_timeout().is_some_and(|t| t <= now) {
            p.client.handle_timeout(now);
        }
        let login = p.app.as_mut().and_then(|a| {
            a.joiner.on_tick(now);
            a.joiner.want_fetch(now).then(|| a.joiner.login(now))
        });
        if let Some(login) = login {
            let at = now + self.snapshot_delay(books::CONNECT_ONE_WAYS);
            self.push(at, Ev::SnapLogin { id, gen, login });
        }
        self.route(id, out);
        self.take_releases(id);
        self.flush_client(id);
        self.arm(id);
    }

    /// Repairs whose orphans all run views with a live parent are done.
    fn check_repairs(&mut self) {
        let now = self.now;
        let procs = &self.procs;
        let mut done = Vec::new();
        for (i, rep) in self.repairs.iter().enumerate() {
            let settled = rep.orphans.iter().all(|o| {
                procs.get(o).is_none_or(|p| {
                    !p.alive
                        || (p.parent != rep.dead
                            && p.parent != NO_LINK
                            && procs.get(&p.parent).is_some_and(|q| q.alive))
                })
            });
            if settled {
                done.push(i);
            }
        }
        for i in done.into_iter().rev() {
            let rep = self.repairs.swap_remove(i);
            self.r.repair_ms.push((now - rep.at_ns) as f64 / 1e6);
            if let Some(w) = self.kill_windows.iter_mut().rev().find(|w| w.0 == rep.at_ns && w.2 == rep.double) {
                w.1 = w.1.max(now);
            }
        }
    }

    fn live(&self, role: MemberRole, placed: bool) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|(_, p)| p.alive && p.role == role && (!placed || p.placed_ns.is_some()))
            .map(|(&id, _)| id)
            .collect()
    }

    fn kill_proxy(&mut self, id: u32, double: bool) {
        let orphans = self.ctl.record(id).map(|r| r.children.clone()).unwrap_or_default();
        self.stop(id, false);
        self.r.kills += 1;
        self.repairs.push(Repair { dead: id, at_ns: self.now, orphans, double });
        // Its supervisor starts it again; the controller holds it down first.
        let back = self.now + self.cfg.hold_down_ns / 2;
        self.push(back, Ev::Restart { id });
    }

    /// One membership change, drawn from the run's seed.
    fn change(&mut self) {
        let roll: f64 = self.rng.gen();
        let proxies = self.live(MemberRole::Proxy, true);
        let receivers = self.live(MemberRole::Receiver, true);
        // Proxies die one at a time (or two at once) while every other one runs:
        // the campaign tests repair, not a tree left without the proxies to carry it.
        let all_up = self.procs.values().filter(|p| p.role == MemberRole::Proxy).all(|p| p.alive);
        let single = if self.cfg.double_kills { 0.3 } else { 0.4 };
        if roll < single && all_up && proxies.len() > 1 {
            let v = proxies[self.rng.gen_range(0..proxies.len())];
            self.kill_windows.push((self.now, self.now, false));
            self.kill_proxy(v, false);
        } else if roll < 0.4 && all_up && proxies.len() > 2 {
            // Two at once: neighbours in id order (each hedges for the other under H = 1).
            let i = self.rng.gen_range(0..proxies.len() - 1);
            self.r.double_kills += 1;
            self.kill_windows.push((self.now, self.now, true));
            self.kill_proxy(proxies[i], true);
            self.kill_proxy(proxies[i + 1], true);
        } else if roll < 0.7 {
            if self.procs.len() < NODES_MAX - 1 {
                self.r.joins += 1;
                let id = self.next_id;
                self.next_id += 1;
                self.start(id, MemberRole::Receiver);
            }
        } else if receivers.len() > 2 {
            let v = receivers[self.rng.gen_range(0..receivers.len())];
            let graceful = self.rng.gen_bool(0.5);
            if graceful {
                self.r.leaves += 1;
            } else {
                self.r.receiver_deaths += 1;
            }
            self.stop(v, graceful);
        }
    }

    /// The nodes at the start: the sender (id 0), proxies and spares, receivers.
    fn start_all(&mut self) -> u32 {
        self.start(0, MemberRole::Sender);
        let proxies = (self.cfg.proxies + self.cfg.spares) as u32;
        for i in 0..proxies {
            self.start(1 + i, MemberRole::Proxy);
        }
        let first_receiver = 1 + proxies;
        for i in 0..self.cfg.receivers as u32 {
            self.start(first_receiver + i, MemberRole::Receiver);
        }
        self.next_id = first_receiver + self.cfg.receivers as u32;
        0
    }

    fn send(&mut self, sender: u32) {
        let now = self.now;
        let Some(p) = self.procs.get_mut(&sender).filter(|p| p.alive) else { return };
        let Node::Sender(s) = &mut p.node else { return };
        let seq = self.sent.len() as u64;
        let mut out = Out(Vec::new());
        let got = s.handle_message(now, self.feed.next_packet(now), &mut out);
        s.update(now);
        debug_assert_eq!(got, seq);
        self.sent.push(now);
        self.windows.push((u64::MAX, 0, 0));
        self.route(sender, out);
        self.arm(sender);
    }

    fn score(&mut self) {
        let end = self.now;
        for p in self.procs.values().filter(|p| p.role == MemberRole::Receiver) {
            let Some(placed) = p.placed_ns else {
                continue;
            };
            // A joiner's first message is the first live one its application got (after its snapshot).
            let first = p.app.as_ref().map_or(p.first_release_ns, |a| a.first_live_ns);
            match first {
                None if p.started_ns > 0 => self.r.joins_unserved += 1,
                Some(f) if p.started_ns > 0 => self.r.join_first_message_ms.push((f - p.started_ns) as f64 / 1e6),
                _ => {}
            }
            let from = placed + JOIN_SETTLE_NS;
            let to = p.stopped_ns.map_or(end, |s| s.saturating_sub(STOP_SETTLE_NS));
            for (seq, &t) in self.sent.iter().enumerate().skip(1) {
                if t < from || t > to {
                    continue;
                }
                self.r.deliveries_expected += 1;
                if !p.released.has(seq as u64) {
                    self.r.lost += 1;
                    // In flight at the kill (sent up to IN_FLIGHT_NS before it) to the end of the repair.
                    let dead_after = self.cfg.dead_after_ns;
                    let within = |w: &&(u64, u64, bool)| t + IN_FLIGHT_NS >= w.0 && t <= w.1 + dead_after;
                    match self.kill_windows.iter().filter(within).map(|w| w.2).max() {
                        Some(true) => self.r.lost_in_double_kills += 1,
                        Some(false) => self.r.lost_in_single_kills += 1,
                        None => self.r.lost_outside_kills += 1,
                    }
                }
            }
            self.r.duplicated += p.released.repeats;
            self.r.out_of_order += p.out_of_order;
        }
        let mut w: Vec<f64> = self.windows.iter().filter(|w| w.2 >= 2).map(|w| (w.1 - w.0) as f64 / 1e3).collect();
        self.r.windowed_messages = w.len() as u64;
        self.r.pf_1us =
            if w.is_empty() { 0.0 } else { w.iter().filter(|&&x| x <= 1.0).count() as f64 / w.len() as f64 };
        self.r.window_p99_us = quantile(&mut w, 0.99);
        self.r.books = books::check(&self.feed, self.procs.values().filter_map(|p| p.app.as_ref()));
    }
}

/// Runs one seed of the churn schedule.
pub fn run(cfg: &ChurnConfig) -> ChurnResult {
    assert!(cfg.receivers + cfg.proxies + cfg.spares + 1 < NODES_MAX / 2, "too many nodes");
    assert!(cfg.rate_per_s > 0.0 && cfg.feed_s > 0.0 && cfg.change_every_ns > 0);
    let mut w = World::new(cfg.clone());
    let sender = w.start_all();
    // A quiet start (everyone placed and the deadline controller's first reports), then the feed.
    let feed_start = 300_000_000;
    let gap = (1e9 / cfg.rate_per_s) as u64;
    let messages = (cfg.feed_s * cfg.rate_per_s) as u64;
    let feed_end = feed_start + messages * gap;
    w.push(feed_start, Ev::Send);
    let first_change = feed_start + cfg.change_every_ns;
    w.push(first_change, Ev::Change);
    // Everything held is released and every repair is over well after the feed.
    let end = feed_end + 500_000_000;
    let mut events = 0u64;
    while let Some(Reverse((t, _, slot))) = w.queue.pop() {
        if t > end {
            break;
        }
        events += 1;
        assert!(events < EVENTS_MAX, "the churn run exceeded {EVENTS_MAX} events");
        w.now = t;
        let ev = w.events[slot].take().expect("a queued event");
        w.free.push(slot);
        match ev {
            Ev::Datagram { to, from, bytes } => w.on_datagram(to, from, &bytes),
            Ev::Timer { id, gen } => w.on_timer(id, gen),
            Ev::ControllerTimer => {
                w.ctl_timer_at = u64::MAX;
                if w.ctl.next_timeout().is_some_and(|due| due <= t) {
                    w.ctl.handle_timeout(t);
                }
                w.flush_controller();
            }
            Ev::Send => {
                w.send(sender);
                if (w.sent.len() as u64) <= messages {
                    w.push(t + gap, Ev::Send);
                }
            }
            Ev::SnapLogin { id, gen, login } => w.on_snap_login(id, gen, &login),
            Ev::SnapStream { id, gen, bytes } => w.on_snap_stream(id, gen, &bytes),
            Ev::Restart { id } => {
                if w.procs.get(&id).is_some_and(|p| !p.alive) {
                    w.r.restarts += 1;
                    w.start(id, MemberRole::Proxy);
                }
            }
            Ev::Change => {
                w.change();
                let mean = w.cfg.change_every_ns as f64;
                let next = t + (-mean * (1.0 - w.rng.gen::<f64>()).ln()) as u64;
                if next < feed_end {
                    w.push(next, Ev::Change);
                }
            }
        }
    }
    w.now = end;
    w.score();
    w.r.seed = cfg.seed;
    w.r.messages = w.sent.len() as u64 - 1;
    w.r.repairs = w.ctl.stats.repairs;
    w.r.versions = w.ctl.stats.versions;
    w.r.controller = w.ctl.stats;
    w.r
}

/// Several seeds, and what they add up to.
#[derive(Debug, Clone, Serialize)]
pub struct ChurnSummary {
    pub seeds: u64,
    pub receivers: usize,
    pub proxies: usize,
    pub hedge: usize,
    pub messages: u64,
    pub deliveries_expected: u64,
    pub lost: u64,
    pub lost_in_double_kills: u64,
    pub lost_in_single_kills: u64,
    pub lost_outside_kills: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    pub kills: u64,
    pub double_kills: u64,
    pub restarts: u64,
    pub repairs: u64,
    pub repair_p50_ms: f64,
    pub repair_p99_ms: f64,
    pub repair_max_ms: f64,
    pub joins: u64,
    pub joins_unserved: u64,
    pub join_first_message_p50_ms: f64,
    pub join_first_message_p99_ms: f64,
    pub leaves: u64,
    pub receiver_deaths: u64,
    /// Over the messages two receivers or more released: the share whose
    /// releases fell within 1 µs (virtual clocks: what the deadlines and
    /// late copies leave), and the worst seed's window p99.
    pub pf_1us: f64,
    pub window_p99_worst_us: f64,
    /// Releases past their deadline, as a share of all releases.
    pub late_share: f64,
    /// Every joiner whose line came whole has books equal to the whole
    /// feed's (`null`: no joiner had a whole line to check). Lines with
    /// messages missing are counted apart (`books_with_gaps`), with the loss.
    pub books_equal: Option<bool>,
    #[serde(flatten)]
    pub books: BookCheck,
    pub per_seed: Vec<ChurnResult>,
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Runs seeds `1..=seeds` of `cfg` (on every core, each seed on one) and sums them up.
pub fn campaign(cfg: &ChurnConfig, seeds: u64, progress: &(dyn Fn(u64) + Sync)) -> ChurnSummary {
    let done = std::sync::atomic::AtomicU64::new(0);
    let threads = std::thread::available_parallelism().map_or(1, usize::from).min(seeds as usize).max(1);
    let next = std::sync::atomic::AtomicU64::new(1);
    let mut per_seed: Vec<ChurnResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if seed > seeds {
                            break;
                        }
                        out.push(run(&ChurnConfig { seed: cfg.seed.wrapping_add(seed - 1), ..cfg.clone() }));
                        progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("a churn run")).collect()
    });
    per_seed.sort_by_key(|r| r.seed);
    let sum = |f: fn(&ChurnResult) -> u64| per_seed.iter().map(f).sum::<u64>();
    let mut repair: Vec<f64> = per_seed.iter().flat_map(|r| r.repair_ms.iter().copied()).collect();
    let mut join: Vec<f64> = per_seed.iter().flat_map(|r| r.join_first_message_ms.iter().copied()).collect();
    let lost = sum(|r| r.lost);
    let mut books = BookCheck::default();
    for r in &per_seed {
        books.add(&r.books);
    }
    ChurnSummary {
        seeds,
        receivers: cfg.receivers,
        proxies: cfg.proxies,
        hedge: cfg.hedge,
        messages: sum(|r| r.messages),
        deliveries_expected: sum(|r| r.deliveries_expected),
        lost,
        lost_in_double_kills: sum(|r| r.lost_in_double_kills),
        lost_in_single_kills: sum(|r| r.lost_in_single_kills),
        lost_outside_kills: sum(|r| r.lost_outside_kills),
        duplicated: sum(|r| r.duplicated),
        out_of_order: sum(|r| r.out_of_order),
        kills: sum(|r| r.kills),
        double_kills: sum(|r| r.double_kills),
        restarts: sum(|r| r.restarts),
        repairs: sum(|r| r.repairs),
        repair_p50_ms: quantile(&mut repair, 0.5),
        repair_p99_ms: quantile(&mut repair, 0.99),
        repair_max_ms: repair.last().copied().unwrap_or(0.0),
        joins: sum(|r| r.joins),
        joins_unserved: sum(|r| r.joins_unserved),
        join_first_message_p50_ms: quantile(&mut join, 0.5),
        join_first_message_p99_ms: quantile(&mut join, 0.99),
        leaves: sum(|r| r.leaves),
        receiver_deaths: sum(|r| r.receiver_deaths),
        pf_1us: {
            let n = sum(|r| r.windowed_messages).max(1) as f64;
            per_seed.iter().map(|r| r.pf_1us * r.windowed_messages as f64).sum::<f64>() / n
        },
        window_p99_worst_us: per_seed.iter().map(|r| r.window_p99_us).fold(0.0, f64::max),
        late_share: sum(|r| r.late_releases) as f64 / sum(|r| r.releases).max(1) as f64,
        books_equal: (books.books_checked > books.books_with_gaps).then_some(books.books_differ == 0),
        books,
        per_seed,
    }
}

/// The campaign's sums, as `fairfeed bench churn` prints them (after its header).
impl std::fmt::Display for ChurnSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self;
        writeln!(
            f,
            "  lost {} of {} deliveries ({} while one proxy killed alone was repaired, {} while two killed at once were, \
             {} away from any kill: the links' own), duplicated {}, out of order {}",
            s.lost,
            s.deliveries_expected,
            s.lost_in_single_kills,
            s.lost_in_double_kills,
            s.lost_outside_kills,
            s.duplicated,
            s.out_of_order
        )?;
        writeln!(
            f,
            "  kills {} ({} double), restarts {}, repairs {}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (kill to every orphan on a live parent)",
            s.kills, s.double_kills, s.restarts, s.repairs, s.repair_p50_ms, s.repair_p99_ms, s.repair_max_ms
        )?;
        writeln!(
            f,
            "  joins {} ({} unserved): first live message after the snapshot p50 {:.1} ms, p99 {:.1} ms; leaves {}, receiver deaths {}",
            s.joins,
            s.joins_unserved,
            s.join_first_message_p50_ms,
            s.join_first_message_p99_ms,
            s.leaves,
            s.receiver_deaths
        )?;
        writeln!(
            f,
            "  joiners' books against the whole feed's: {} checked, equal {} ({} differ; {} lines with {} messages missing, \
             counted apart); {} snapshots fetched, {} failed and fetched again",
            s.books.books_checked,
            s.books_equal.map_or("n/a".to_string(), |b| b.to_string()),
            s.books.books_differ,
            s.books.books_with_gaps,
            s.books.join_gaps,
            s.books.snapshot_fetches,
            s.books.snapshot_fetch_failures
        )?;
        writeln!(
            f,
            "  P(F@1µs) {:.4} (virtual clocks), window p99 {:.2} µs (worst seed), late releases {:.4} %",
            s.pf_1us,
            s.window_p99_worst_us,
            s.late_share * 100.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_count_bench_churn_takes_has_a_shape_that_fits() {
        for nodes in 8..=5_000 {
            let c = ChurnConfig::for_nodes(nodes).unwrap_or_else(|| panic!("{nodes} nodes: no shape"));
            assert!(1 + c.spares + c.proxies + c.receivers <= nodes, "{nodes}: {c:?}");
            assert!(c.proxies <= c.fanout && c.receivers > 0, "{nodes}: {c:?}");
        }
        assert!(ChurnConfig::for_nodes(1).is_none());
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let cfg = ChurnConfig { feed_s: 1.0, receivers: 8, ..ChurnConfig::default() };
        let a = run(&cfg);
        let b = run(&cfg);
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
        assert!(a.messages == 2_000 && a.deliveries_expected > 8 * 1_500, "{a:?}");
    }

    #[test]
    fn with_one_hedge_single_proxy_deaths_lose_nothing_and_nothing_repeats() {
        let cfg = ChurnConfig { feed_s: 3.0, receivers: 12, ..ChurnConfig::default() };
        let s = campaign(&cfg, 4, &|_| {});
        if std::env::var("CHURN_PRINT").is_ok() {
            let mut t = s.clone();
            t.per_seed.clear();
            eprintln!("{}", serde_json::to_string_pretty(&t).unwrap());
        }
        assert!(s.kills > 0 && s.repairs > 0 && s.joins > 0, "{s:?}");
        assert_eq!(s.lost_in_single_kills, 0, "{s:#?}");
        // Joiners start from the sender's snapshot: their books are the whole feed's.
        assert!(s.books.books_checked > 0, "{s:#?}");
        assert_eq!(s.books_equal, Some(true), "{s:#?}");
        assert_eq!(s.duplicated, 0);
        assert_eq!(s.out_of_order, 0);
    }

    #[test]
    fn without_hedging_a_dead_proxy_costs_its_children_messages_until_the_repair() {
        // The measure is not a rubber stamp: H = 0 loses what the dead proxy would have forwarded.
        let cfg = ChurnConfig { feed_s: 3.0, receivers: 12, hedge: 0, ..ChurnConfig::default() };
        let s = campaign(&cfg, 3, &|_| {});
        assert!(s.kills > 0, "{s:?}");
        assert!(s.lost > 0, "{s:#?}");
    }
}
