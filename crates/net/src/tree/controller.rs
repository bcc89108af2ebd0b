//! `fairfeed controller`: the shell of [`fairfeed_tree::controller::Controller`].
//!
//! One UDP socket; each turn reads what waits (at most [`READS_PER_TURN`]),
//! feeds the core, runs its timers, sends what it produced, logs its events
//! and, on a new topology version, writes the topology (as `fairfeed plan`
//! would, with addresses) where asked. A source address that sends more
//! than [`RATE_PER_S`] datagrams a second (burst [`BURST`]) has the rest
//! dropped and counted before the core sees them; at most
//! [`SOURCES_MAX`] addresses are tracked (new ones beyond are dropped and
//! counted while the table is full).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;

use fairfeed_io::agent::{Agent, Turn};
use fairfeed_tree::controller::{Controller, ControllerStats, Event};
use serde::Serialize;

use super::store::{KeeperHandle, KeeperStats, Told, Write};
use fairfeed_io::socket::bind_udp;

/// Datagrams read per turn at most (the rest wait for the next turn).
pub const READS_PER_TURN: usize = 256;
/// Datagrams per second one source address may send (registrations and heartbeats).
pub const RATE_PER_S: f64 = 2_000.0;
/// The burst one source address may send at once.
pub const BURST: f64 = 400.0;
/// Source addresses tracked at most.
pub const SOURCES_MAX: usize = 65_536;

/// The controller's shell counters.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ShellStats {
    pub datagrams: u64,
    pub rate_limited: u64,
    pub sources_full: u64,
    pub send_errors: u64,
    pub topology_writes: u64,
    pub topology_write_errors: u64,
    /// Datagrams dropped while another controller leads.
    pub not_leading: u64,
    pub took_lead: u64,
    pub lost_lead: u64,
    /// Refusals not logged: the same node and reason within [`REFUSAL_LOG_EVERY_NS`].
    pub refusals_quiet: u64,
}

/// A node refused again for the same reason is logged again after this long at most.
pub const REFUSAL_LOG_EVERY_NS: u64 = 1_000_000_000;
/// (node, reason) pairs whose last logged refusal is remembered at most.
pub const REFUSALS_TRACKED_MAX: usize = 4_096;

/// Everything the controller reports at the end.
#[derive(Debug, Clone, Serialize)]
pub struct ControllerReport {
    pub addr: SocketAddr,
    pub version: u64,
    pub members: usize,
    pub waiting: usize,
    pub overloaded: usize,
    pub leading: bool,
    pub core: ControllerStats,
    pub shell: ShellStats,
    /// The store keeper's (with a store).
    pub keeper: Option<KeeperStats>,
}

struct Bucket {
    tokens: f64,
    at_ns: u64,
}

/// The controller as an agent.
pub struct ControllerAgent {
    sock: UdpSocket,
    addr: SocketAddr,
    core: Controller,
    buf: Vec<u8>,
    sources: HashMap<IpAddr, Bucket>,
    topology_out: Option<PathBuf>,
    written_version: u64,
    end_ns: u64,
    /// The store and the lease, when controllers share one.
    keeper: Option<KeeperHandle>,
    leading: bool,
    /// Members changed (put) and gone (delete) since the last write to the store.
    put: std::collections::BTreeSet<u32>,
    gone: std::collections::BTreeSet<u32>,
    /// Its part on a counters board, for a metrics endpoint.
    poster: Option<fairfeed_io::counters::Poster>,
    /// When each (node, reason) refusal was last logged.
    refusals_logged: HashMap<(u32, &'static str), u64>,
    pub stats: ShellStats,
}

/// The controller's part on its counters board.
pub const CONTROLLER_PART: &str = "controller";

impl ControllerAgent {
    /// Binds `listen`; runs until `end_ns` (wall clock; `u64::MAX`: until stopped).
    pub fn new(
        listen: SocketAddr,
        core: Controller,
        topology_out: Option<PathBuf>,
        end_ns: u64,
    ) -> std::io::Result<Self> {
        let sock = bind_udp(listen, 8 << 20)?;
        let addr = sock.local_addr()?;
        Ok(ControllerAgent {
            sock,
            addr,
            core,
            buf: vec![0u8; 65_536],
            sources: HashMap::new(),
            topology_out,
            written_version: 0,
            end_ns,
            keeper: None,
            leading: true,
            put: Default::default(),
            gone: Default::default(),
            poster: None,
            refusals_logged: HashMap::new(),
            stats: ShellStats::default(),
        })
    }

    /// Posts its report to `board` (as [`CONTROLLER_PART`]) every
    /// [`fairfeed_io::counters::PUBLISH_INTERVAL`] (for `--metrics`).
    pub fn with_publish(
        mut self,
        board: &std::sync::Arc<fairfeed_io::counters::Board>,
    ) -> Result<Self, fairfeed_io::counters::BoardError> {
        self.poster = Some(board.poster(CONTROLLER_PART)?);
        Ok(self)
    }

    fn publish(&mut self, now: u64) {
        if self.poster.as_mut().is_some_and(|p| p.due(now)) {
            let v = serde_json::to_value(self.report()).unwrap_or_default();
            if let Some(p) = &self.poster {
                p.post(v, Vec::new());
            }
        }
    }

    /// Shares the membership through a store: leads only while it holds
    /// the store's lease (until then, what nodes send is dropped and counted).
    pub fn with_keeper(mut self, k: KeeperHandle) -> Self {
        self.keeper = Some(k);
        self.leading = false;
        self
    }

    /// Whether it leads (always, without a store).
    pub fn leading(&self) -> bool {
        self.leading
    }

    /// Stops the keeper; its counters go in the report.
    pub fn finish(&mut self) -> Option<KeeperStats> {
        self.keeper.take().map(KeeperHandle::finish)
    }

    /// What the keeper said: lead (from its records, in a newer term) or follow.
    fn hear_keeper(&mut self, now: u64) {
        let Some(k) = &self.keeper else { return };
        while let Ok(t) = k.told.try_recv() {
            match t {
                Told::Lead { term, records } => {
                    self.stats.took_lead += 1;
                    self.leading = true;
                    tracing::info!(
                        term,
                        members = records.len(),
                        "controller: leading (term {term}, {} members)",
                        records.len()
                    );
                    self.core.restore(now, u64::from(term) << 32, records);
                }
                Told::Follow => {
                    self.stats.lost_lead += 1;
                    self.leading = false;
                    tracing::warn!("controller: following (another controller holds the lease)");
                }
            }
        }
    }

    /// Hands what changed to the keeper.
    fn store_changes(&mut self) {
        let Some(k) = &mut self.keeper else { return };
        if k.overflowed {
            k.overflowed = false;
            k.write(Write::All(self.core.records().cloned().collect()));
            self.put.clear();
            self.gone.clear();
            return;
        }
        if self.put.is_empty() && self.gone.is_empty() {
            return;
        }
        let put = std::mem::take(&mut self.put).into_iter().filter_map(|id| self.core.record(id).cloned()).collect();
        let delete = std::mem::take(&mut self.gone).into_iter().collect();
        k.write(Write::Members { put, delete });
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn core(&self) -> &Controller {
        &self.core
    }

    pub fn report(&self) -> ControllerReport {
        ControllerReport {
            addr: self.addr,
            version: self.core.version(),
            members: self.core.records().count(),
            waiting: self.core.waiting(),
            overloaded: self.core.overloaded(),
            leading: self.leading,
            core: self.core.stats,
            shell: self.stats,
            keeper: None,
        }
    }

    /// Whether `from` may send one more now.
    fn admit(&mut self, now: u64, from: IpAddr) -> bool {
        if !self.sources.contains_key(&from) && self.sources.len() >= SOURCES_MAX {
            // Forget the idle before refusing a newcomer.
            self.sources.retain(|_, b| now.saturating_sub(b.at_ns) < 10_000_000_000);
            if self.sources.len() >= SOURCES_MAX {
                self.stats.sources_full += 1;
                return false;
            }
        }
        let b = self.sources.entry(from).or_insert(Bucket { tokens: BURST, at_ns: now });
        b.tokens = (b.tokens + now.saturating_sub(b.at_ns) as f64 * 1e-9 * RATE_PER_S).min(BURST);
        b.at_ns = now;
        if b.tokens < 1.0 {
            self.stats.rate_limited += 1;
            return false;
        }
        b.tokens -= 1.0;
        true
    }

    /// Notes what the store must learn from `e`.
    fn note(&mut self, e: &Event) {
        match e {
            Event::Joined { id, .. } => {
                self.gone.remove(id);
                self.put.insert(*id);
            }
            Event::Dead { id, .. } | Event::Left { id } => {
                self.put.remove(id);
                self.gone.insert(*id);
            }
            Event::Published { changed, .. } => self.put.extend(changed.iter().copied()),
            _ => {}
        }
    }

    /// Whether `e` is logged: a refusal of a node for a reason it was refused
    /// for less than [`REFUSAL_LOG_EVERY_NS`] ago is only counted (a burst of
    /// queued heartbeats after a partition, or a peer that keeps asking).
    fn loud(&mut self, now: u64, e: &Event) -> bool {
        let Event::Refused { id, reason, .. } = e else { return true };
        let key = (*id, reason.name());
        if self.refusals_logged.get(&key).is_some_and(|&at| now < at + REFUSAL_LOG_EVERY_NS) {
            self.stats.refusals_quiet += 1;
            return false;
        }
        if self.refusals_logged.len() >= REFUSALS_TRACKED_MAX {
            self.refusals_logged.clear();
        }
        self.refusals_logged.insert(key, now);
        true
    }

    fn log(e: &Event) {
        match e {
            Event::Joined { id, role, addr, placed } => tracing::info!(
                id,
                %addr,
                "controller: {role:?} {id} joined from {addr}{}",
                if *placed { "" } else { " (not placed: a spare, or waiting for room)" }
            ),
            Event::Left { id } => tracing::info!(id, "controller: node {id} left"),
            Event::Dead { id, role, silent_ns } => tracing::warn!(
                id,
                "controller: {role:?} {id} declared dead after {:.1} ms of silence",
                *silent_ns as f64 / 1e6
            ),
            Event::Replaced { dead, spare } => {
                tracing::warn!(dead, spare, "controller: spare proxy {spare} takes the place of {dead}")
            }
            Event::Reparented { dead, moved, stranded } => tracing::warn!(
                dead,
                moved,
                stranded,
                "controller: {dead}'s {moved} children moved to its layer's other proxies{}",
                if *stranded > 0 { format!("; {stranded} found no room and wait") } else { String::new() }
            ),
            Event::Rebalanced { moved, to } => tracing::info!(
                moved,
                "controller: {moved} children moved off overloaded proxies to {to:?} (their old parents feed them {} ms more)",
                fairfeed_tree::controller::MOVE_OVERLAP_NS / 1_000_000
            ),
            Event::Refused { addr, id, reason } => {
                tracing::info!(id, %addr, "controller: refused node {id} from {addr}: {}", reason.name())
            }
            Event::Published { version, changed } => {
                tracing::debug!(version, changed = changed.len(), "controller: topology version {version}")
            }
        }
    }

    fn write_topology(&mut self) {
        let Some(p) = &self.topology_out else { return };
        if self.core.version() == self.written_version {
            return;
        }
        self.written_version = self.core.version();
        let text = match toml::to_string(&self.core.topology()) {
            Ok(t) => format!("# topology version {} (fairfeed controller)\n{t}", self.written_version),
            Err(_) => return,
        };
        // Written whole, then renamed: a reader never sees half a file.
        let tmp = p.with_extension("tmp");
        match std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, p)) {
            Ok(()) => self.stats.topology_writes += 1,
            Err(e) => {
                self.stats.topology_write_errors += 1;
                tracing::warn!("controller: writing {}: {e}", p.display());
            }
        }
    }
}

impl ControllerAgent {
    /// The core's next timer, the keeper's next word (polled every 10 ms at most with a store), the end.
    fn next_due_core(&self) -> u64 {
        if self.keeper.is_some() {
            let soon = fairfeed_io::clock::wall_ns() + 10_000_000;
            let core = self.core.next_timeout().filter(|_| self.leading).unwrap_or(u64::MAX);
            return core.min(soon).min(self.end_ns);
        }
        self.core.next_timeout().map_or(self.end_ns, |t| t.min(self.end_ns))
    }
}

impl Agent for ControllerAgent {
    fn role(&self) -> &'static str {
        "controller"
    }

    fn do_work(&mut self, now: u64, turn: Turn) -> usize {
        let mut work = 0;
        self.publish(now);
        self.hear_keeper(now);
        if !self.leading {
            // Another controller leads: nodes' datagrams are its to answer.
            while turn == Turn::All && self.sock.recv_from(&mut self.buf).is_ok() {
                self.stats.not_leading += 1;
                work += 1;
            }
            return work;
        }
        if turn == Turn::All {
            for _ in 0..READS_PER_TURN {
                let Ok((n, from)) = self.sock.recv_from(&mut self.buf) else { break };
                self.stats.datagrams += 1;
                work += 1;
                if self.admit(now, from.ip()) {
                    let b = self.buf[..n].to_vec();
                    self.core.handle_packet(now, from, &b);
                }
            }
        }
        if self.core.next_timeout().is_some_and(|t| t <= now) {
            self.core.handle_timeout(now);
            work += 1;
        }
        while let Some((to, b)) = self.core.poll_transmit() {
            self.stats.send_errors += u64::from(self.sock.send_to(&b, to).is_err());
            work += 1;
        }
        while let Some(e) = self.core.poll_event() {
            if self.loud(now, &e) {
                Self::log(&e);
            }
            self.note(&e);
        }
        self.store_changes();
        self.write_topology();
        work
    }

    fn next_due(&self) -> u64 {
        let publish = self.poster.as_ref().map_or(u64::MAX, fairfeed_io::counters::Poster::next_ns);
        self.next_due_core().min(publish)
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.sock.as_fd()]
    }

    fn is_done(&self) -> bool {
        fairfeed_io::clock::wall_ns() >= self.end_ns
    }
}
