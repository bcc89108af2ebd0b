//! Where the controller keeps the tree's membership, and how one of
//! several controllers leads (issue 43): a key-value store with
//! compare-and-set — NATS JetStream KV across machines
//! (`fairfeed_bridge::kv::JetStreamKv`), or [`MemStore`] in-process for
//! one host — never a consensus of our own.
//!
//! Keys: `leader` (the [`Lease`] as JSON), `members.<id>` (a
//! [`MemberRecord`] as JSON). The leader renews its lease every quarter of
//! the lease period by compare-and-set on the revision it last wrote; a
//! follower takes the lease over by compare-and-set once the holder's
//! `until` has passed, with the next **term**. Topology versions carry the
//! term in their high 32 bits, so a view from a newer leader is always
//! newer than any an old one sent, even one it never stored.
//!
//! The [`Keeper`] runs on its own thread (store calls may wait on a
//! network); the controller's loop hands it writes and learns from it
//! whether it leads.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fairfeed_tree::controller::MemberRecord;
use serde::{Deserialize, Serialize};

/// The lease key.
pub const LEADER_KEY: &str = "leader";
/// Member records' key prefix.
pub const MEMBER_PREFIX: &str = "members.";
/// Writes waiting for the keeper at most (beyond: a full rewrite is asked for).
pub const WRITES_QUEUE_MAX: usize = 1_024;

/// A stored value and its revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Vec<u8>,
    pub revision: u64,
}

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Compare-and-set lost: the key is not at the expected revision (or exists, for a create).
    #[error("the key changed under us (compare-and-set lost)")]
    Conflict,
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
}

/// A key-value store with compare-and-set: what the controller needs of one.
pub trait KvStore: Send {
    fn entry(&mut self, key: &str) -> Result<Option<Entry>, StoreError>;
    fn put(&mut self, key: &str, value: &[u8]) -> Result<u64, StoreError>;
    /// Writes only if the key does not exist ([`StoreError::Conflict`] if it does).
    fn create(&mut self, key: &str, value: &[u8]) -> Result<u64, StoreError>;
    /// Writes only if the key is at `revision`.
    fn update(&mut self, key: &str, value: &[u8], revision: u64) -> Result<u64, StoreError>;
    fn delete(&mut self, key: &str) -> Result<(), StoreError>;
    /// Every live key.
    fn keys(&mut self) -> Result<Vec<String>, StoreError>;
    /// What it is, for log lines.
    fn describe(&self) -> String;
}

/// An in-process store for one host; clones share it (two controllers in
/// one process, as the tests run them).
#[derive(Debug, Clone, Default)]
pub struct MemStore {
    inner: Arc<Mutex<(BTreeMap<String, Entry>, u64)>>,
}

impl MemStore {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Entry>, &mut u64) -> T) -> Result<T, StoreError> {
        let mut g = self.inner.lock().map_err(|_| StoreError::Unavailable("poisoned".into()))?;
        let (map, rev) = &mut *g;
        Ok(f(map, rev))
    }
}

impl KvStore for MemStore {
    fn entry(&mut self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.with(|m, _| m.get(key).cloned())
    }

    fn put(&mut self, key: &str, value: &[u8]) -> Result<u64, StoreError> {
        self.with(|m, rev| {
            *rev += 1;
            m.insert(key.to_string(), Entry { value: value.to_vec(), revision: *rev });
            *rev
        })
    }

    fn create(&mut self, key: &str, value: &[u8]) -> Result<u64, StoreError> {
        self.with(|m, rev| {
            if m.contains_key(key) {
                return Err(StoreError::Conflict);
            }
            *rev += 1;
            m.insert(key.to_string(), Entry { value: value.to_vec(), revision: *rev });
            Ok(*rev)
        })?
    }

    fn update(&mut self, key: &str, value: &[u8], revision: u64) -> Result<u64, StoreError> {
        self.with(|m, rev| {
            if m.get(key).map(|e| e.revision) != Some(revision) {
                return Err(StoreError::Conflict);
            }
            *rev += 1;
            m.insert(key.to_string(), Entry { value: value.to_vec(), revision: *rev });
            Ok(*rev)
        })?
    }

    fn delete(&mut self, key: &str) -> Result<(), StoreError> {
        self.with(|m, _| {
            m.remove(key);
        })
    }

    fn keys(&mut self) -> Result<Vec<String>, StoreError> {
        self.with(|m, _| m.keys().cloned().collect())
    }

    fn describe(&self) -> String {
        "the embedded store (this process only)".into()
    }
}

/// Who leads, until when, in which term.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: String,
    /// Wall-clock ns.
    pub until_ns: u64,
    pub term: u32,
}

/// What the controller's loop hands the keeper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Member records to write (id, record), and ids to delete.
    Members { put: Vec<MemberRecord>, delete: Vec<u32> },
    /// Every record as it is (after a queue overflow): the store is made equal to it.
    All(Vec<MemberRecord>),
}

/// What the keeper tells the controller's loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Told {
    /// This controller leads from now on, in `term`, from these records.
    Lead { term: u32, records: Vec<MemberRecord> },
    /// It lost the lease (another took it, or the store stayed unreachable past the lease).
    Follow,
}

/// The keeper's counters.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct KeeperStats {
    pub renewals: u64,
    pub takeovers: u64,
    pub lost: u64,
    pub writes: u64,
    pub deletes: u64,
    pub errors: u64,
    pub bad_records: u64,
    /// Writes that failed (the store unreachable) and were made again later.
    pub retried: u64,
    /// Member writes still waiting for the store when the counters were read.
    pub pending: u64,
}

/// The store's side of a controller: lease and writes, on a thread of its own.
pub struct Keeper {
    store: Box<dyn KvStore>,
    name: String,
    lease_ns: u64,
    lease: Option<(Lease, u64)>,
    writes: Receiver<Write>,
    told: SyncSender<Told>,
    stop: Arc<AtomicBool>,
    /// Member writes not yet in the store, newest per id (`None`: a
    /// delete): a write the store did not take is made again at the next
    /// tick, so an outage loses nothing a follower would read. One entry
    /// per member id at most (the controller holds at most
    /// [`fairfeed_tree::controller::MEMBERS_MAX`]).
    pending: BTreeMap<u32, Option<MemberRecord>>,
    /// After a [`Write::All`]: member ids to keep; the others are deleted
    /// once the store lists its keys.
    prune: Option<std::collections::BTreeSet<u32>>,
    pub stats: KeeperStats,
}

/// The controller loop's handle on its keeper.
pub struct KeeperHandle {
    pub writes: SyncSender<Write>,
    pub told: Receiver<Told>,
    pub stop: Arc<AtomicBool>,
    pub thread: Option<std::thread::JoinHandle<KeeperStats>>,
    /// A write found the queue full: the next one must be everything.
    pub overflowed: bool,
}

impl KeeperHandle {
    /// Hands `w` to the keeper; on a full queue, remembers to send everything next.
    pub fn write(&mut self, w: Write) {
        match self.writes.try_send(w) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.overflowed = true,
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Stops the keeper (its lease lapses by itself) and returns its counters.
    pub fn finish(mut self) -> KeeperStats {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

fn wall_ns() -> u64 {
    fairfeed_io::clock::wall_ns()
}

impl Keeper {
    /// Starts the keeper of controller `name` on `store` with leases of `lease`.
    pub fn spawn(store: Box<dyn KvStore>, name: String, lease: Duration) -> std::io::Result<KeeperHandle> {
        let (wtx, wrx) = std::sync::mpsc::sync_channel(WRITES_QUEUE_MAX);
        let (ttx, trx) = std::sync::mpsc::sync_channel(16);
        let stop = Arc::new(AtomicBool::new(false));
        let mut k = Keeper {
            store,
            name,
            lease_ns: lease.as_nanos() as u64,
            lease: None,
            writes: wrx,
            told: ttx,
            stop: stop.clone(),
            pending: BTreeMap::new(),
            prune: None,
            stats: KeeperStats::default(),
        };
        let thread = std::thread::Builder::new().name("fairfeed-keeper".into()).spawn(move || {
            k.run();
            k.stats.pending = k.pending.len() as u64;
            k.stats
        })?;
        Ok(KeeperHandle { writes: wtx, told: trx, stop, thread: Some(thread), overflowed: false })
    }

    fn run(&mut self) {
        let tick = Duration::from_nanos((self.lease_ns / 4).max(1_000_000));
        while !self.stop.load(Ordering::Relaxed) {
            self.tend_lease();
            if self.lease.is_some() {
                self.flush();
            } else {
                // The leader owns the store now; what this one had not written is its to write.
                self.pending.clear();
                self.prune = None;
            }
            // Writes until the next tick.
            let until = std::time::Instant::now() + tick;
            while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
                match self.writes.recv_timeout(left) {
                    Ok(w) if self.lease.is_some() => self.apply(w),
                    Ok(_) => {}
                    Err(_) => break,
                }
                if self.stop.load(Ordering::Relaxed) {
                    return;
                }
            }
        }
    }

    /// Renews the lease it holds, or takes a lapsed one.
    fn tend_lease(&mut self) {
        let now = wall_ns();
        if let Some((l, rev)) = &self.lease {
            let renewed = Lease { holder: self.name.clone(), until_ns: now + self.lease_ns, term: l.term };
            let body = serde_json::to_vec(&renewed).expect("a lease serializes");
            match self.store.update(LEADER_KEY, &body, *rev) {
                Ok(r) => {
                    self.stats.renewals += 1;
                    self.lease = Some((renewed, r));
                }
                Err(StoreError::Unavailable(e)) if now < l.until_ns => {
                    // Still ours until it lapses; the next tick tries again.
                    self.stats.errors += 1;
                    tracing::warn!("controller {}: renewing the lease: {e}", self.name);
                }
                Err(e) => {
                    self.stats.lost += 1;
                    tracing::warn!("controller {}: lost the lead ({e})", self.name);
                    self.lease = None;
                    let _ = self.told.send(Told::Follow);
                }
            }
            return;
        }
        let current = match self.store.entry(LEADER_KEY) {
            Ok(c) => c,
            Err(e) => {
                self.stats.errors += 1;
                tracing::debug!("controller {}: reading the lease: {e}", self.name);
                return;
            }
        };
        let held: Option<Lease> = current.as_ref().and_then(|e| serde_json::from_slice(&e.value).ok());
        let term = held.as_ref().map_or(1, |l| l.term + 1);
        if held.as_ref().is_some_and(|l| l.until_ns > now && l.holder != self.name) {
            return;
        }
        let mine = Lease { holder: self.name.clone(), until_ns: now + self.lease_ns, term };
        let body = serde_json::to_vec(&mine).expect("a lease serializes");
        let took = match &current {
            None => self.store.create(LEADER_KEY, &body),
            Some(e) => self.store.update(LEADER_KEY, &body, e.revision),
        };
        let Ok(rev) = took else { return };
        self.stats.takeovers += 1;
        let records = self.load();
        tracing::debug!(
            "controller {}: leading (term {term}) from {} with {} members",
            self.name,
            self.store.describe(),
            records.len()
        );
        self.lease = Some((mine, rev));
        let _ = self.told.send(Told::Lead { term, records });
    }

    fn load(&mut self) -> Vec<MemberRecord> {
        let keys = self.store.keys().unwrap_or_default();
        let mut out = Vec::new();
        for k in keys.iter().filter(|k| k.starts_with(MEMBER_PREFIX)) {
            match self.store.entry(k) {
                Ok(Some(e)) => match serde_json::from_slice(&e.value) {
                    Ok(r) => out.push(r),
                    Err(_) => self.stats.bad_records += 1,
                },
                Ok(None) => {}
                Err(_) => self.stats.errors += 1,
            }
        }
        out
    }

    /// Takes `w` into the pending writes and makes what it can.
    fn apply(&mut self, w: Write) {
        match w {
            Write::Members { put, delete } => {
                for r in put {
                    self.pending.insert(r.id, Some(r));
                }
                for id in delete {
                    self.pending.insert(id, None);
                }
            }
            Write::All(all) => {
                self.prune = Some(all.iter().map(|r| r.id).collect());
                for r in all {
                    self.pending.insert(r.id, Some(r));
                }
            }
        }
        self.flush();
    }

    /// Writes the pending records, oldest id first, until the store fails
    /// (the rest wait for the next tick); then deletes what a full rewrite left over.
    fn flush(&mut self) {
        while let Some((&id, r)) = self.pending.first_key_value() {
            let key = format!("{MEMBER_PREFIX}{id}");
            let done = match r {
                Some(r) => {
                    let body = serde_json::to_vec(r).expect("a record serializes");
                    self.store.put(&key, &body).map(|_| self.stats.writes += 1)
                }
                None => self.store.delete(&key).map(|()| self.stats.deletes += 1),
            };
            if done.is_err() {
                self.stats.errors += 1;
                self.stats.retried += 1;
                return;
            }
            self.pending.remove(&id);
        }
        let Some(keep) = &self.prune else { return };
        let Ok(keys) = self.store.keys() else {
            self.stats.errors += 1;
            return;
        };
        let stale: Vec<u32> = keys
            .into_iter()
            .filter_map(|k| k.strip_prefix(MEMBER_PREFIX).and_then(|id| id.parse().ok()))
            .filter(|id| !keep.contains(id))
            .collect();
        self.prune = None;
        for id in stale {
            self.pending.insert(id, None);
        }
        if !self.pending.is_empty() {
            self.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_store_compares_and_sets() {
        let mut s = MemStore::default();
        let r1 = s.create("k", b"a").unwrap();
        assert_eq!(s.create("k", b"b"), Err(StoreError::Conflict));
        let r2 = s.update("k", b"c", r1).unwrap();
        assert_eq!(s.update("k", b"d", r1), Err(StoreError::Conflict), "a stale revision loses");
        assert_eq!(s.entry("k").unwrap(), Some(Entry { value: b"c".to_vec(), revision: r2 }));
        s.delete("k").unwrap();
        assert_eq!(s.entry("k").unwrap(), None);
    }

    #[test]
    fn one_controller_leads_and_a_follower_takes_over_with_a_newer_term_from_the_stored_records() {
        let store = MemStore::default();
        let lease = Duration::from_millis(80);
        let a = Keeper::spawn(Box::new(store.clone()), "a".into(), lease).unwrap();
        let lead = a.told.recv_timeout(Duration::from_secs(2)).unwrap();
        let Told::Lead { term: t1, .. } = lead else { panic!("{lead:?}") };
        let b = Keeper::spawn(Box::new(store.clone()), "b".into(), lease).unwrap();
        std::thread::sleep(lease * 3);
        assert!(b.told.try_recv().is_err(), "b follows while a renews");
        let rec = MemberRecord {
            id: 7,
            role: fairfeed_tree::controller::MemberRole2::Receiver,
            incarnation: 1,
            addr: "127.0.0.1:9".parse().unwrap(),
            capacity: 1,
            layer: Some(1),
            parent: Some(3),
            children: vec![],
        };
        let mut a = a;
        a.write(Write::Members { put: vec![rec.clone()], delete: vec![] });
        std::thread::sleep(lease / 2);
        a.finish();
        // How soon is a benchmark's question (docs/RESULTS.md); here: it does.
        let took = b.told.recv_timeout(Duration::from_secs(10)).unwrap();
        match took {
            Told::Lead { term, records } => {
                assert_eq!(term, t1 + 1);
                assert_eq!(records, vec![rec], "the follower starts from what the leader stored");
            }
            Told::Follow => panic!("b should lead"),
        }
        b.finish();
    }
    /// A store whose member writes fail while `down` is set (the lease key
    /// still works: an outage shorter than the lease).
    struct Flaky {
        inner: MemStore,
        down: Arc<AtomicBool>,
    }

    impl KvStore for Flaky {
        fn entry(&mut self, key: &str) -> Result<Option<Entry>, StoreError> {
            self.inner.entry(key)
        }
        fn put(&mut self, key: &str, value: &[u8]) -> Result<u64, StoreError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("down".into()));
            }
            self.inner.put(key, value)
        }
        fn create(&mut self, key: &str, value: &[u8]) -> Result<u64, StoreError> {
            self.inner.create(key, value)
        }
        fn update(&mut self, key: &str, value: &[u8], revision: u64) -> Result<u64, StoreError> {
            self.inner.update(key, value, revision)
        }
        fn delete(&mut self, key: &str) -> Result<(), StoreError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("down".into()));
            }
            self.inner.delete(key)
        }
        fn keys(&mut self) -> Result<Vec<String>, StoreError> {
            self.inner.keys()
        }
        fn describe(&self) -> String {
            "flaky".into()
        }
    }

    fn record(id: u32, incarnation: u64) -> MemberRecord {
        MemberRecord {
            id,
            role: fairfeed_tree::controller::MemberRole2::Proxy,
            incarnation,
            addr: "127.0.0.1:9".parse().unwrap(),
            capacity: 4,
            layer: Some(1),
            parent: Some(1),
            children: vec![],
        }
    }

    /// Found by `fairfeed bench faults`: writes made while the store node
    /// restarted were lost, and the controller that took over later
    /// declared live nodes dead from stale records. Now they wait and are
    /// made once the store is back.
    #[test]
    fn writes_the_store_refused_are_made_once_it_is_back() {
        let store = MemStore::default();
        let down = Arc::new(AtomicBool::new(false));
        let lease = Duration::from_millis(200);
        let flaky = Flaky { inner: store.clone(), down: down.clone() };
        let mut a = Keeper::spawn(Box::new(flaky), "a".into(), lease).unwrap();
        assert!(matches!(a.told.recv_timeout(Duration::from_secs(2)).unwrap(), Told::Lead { .. }));
        a.write(Write::Members { put: vec![record(10, 1), record(11, 1), record(12, 1)], delete: vec![] });
        std::thread::sleep(lease / 2);
        down.store(true, Ordering::SeqCst);
        // While the store is down: 10 restarts (a new incarnation), 12 leaves.
        a.write(Write::Members { put: vec![record(10, 2)], delete: vec![12] });
        std::thread::sleep(lease / 2);
        let mut view = store.clone();
        assert_eq!(
            view.keys().unwrap().iter().filter(|k| k.starts_with(MEMBER_PREFIX)).count(),
            3,
            "nothing written yet"
        );
        down.store(false, Ordering::SeqCst);
        std::thread::sleep(lease);
        let stats = a.finish();
        assert!(stats.retried > 0 && stats.pending == 0, "{stats:?}");
        let got: Vec<MemberRecord> = view
            .keys()
            .unwrap()
            .iter()
            .filter(|k| k.starts_with(MEMBER_PREFIX))
            .map(|k| serde_json::from_slice(&view.entry(k).unwrap().unwrap().value).unwrap())
            .collect();
        assert_eq!(got, vec![record(10, 2), record(11, 1)], "the newest of each, the leaver gone");
    }
}
