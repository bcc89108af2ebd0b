//! Names to addresses while a node runs. A deployment addresses its nodes by
//! name (a Kubernetes Service, a Compose service, DNS), and a name's address
//! changes when a pod is rescheduled: a [`Resolver`] resolves every name at
//! start-up (a name that does not resolve then is an error — or, given a
//! wait, is tried again every [`RESOLVE_RETRY`] until it does or the wait
//! is over: a Kubernetes Service has no record until its pod has an IP, and
//! a tree's pods start in any order), then again on a
//! thread of its own every [`RESOLVE_INTERVAL`] and soon after a failed send
//! (a hint from the owner) — never on the data path, which only compares a
//! generation number each turn and copies the table when it moved.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often names are resolved again.
pub const RESOLVE_INTERVAL: Duration = Duration::from_secs(10);
/// After a failed send, names are resolved again within this long (at most once per it).
pub const RESOLVE_AFTER_FAILURE: Duration = Duration::from_millis(500);
/// While waiting at start-up, unresolved names are tried again this often.
pub const RESOLVE_RETRY: Duration = Duration::from_millis(500);
/// The longest start-up wait a caller may ask for.
pub const RESOLVE_WAIT_MAX: Duration = Duration::from_secs(3_600);
/// How often the resolver thread looks at its hints and whether to stop.
const TICK: Duration = Duration::from_millis(100);

/// `host`:`port` resolved to one address: an IP literal as it is; a name
/// through the system's resolver, its first IPv4 address (else its first).
pub fn resolve(host: &str, port: u16) -> std::io::Result<SocketAddr> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let all: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{host} has no address")))
}

/// What the resolver counted.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ResolveStats {
    /// Rounds of resolving every name (after the first).
    pub rounds: u64,
    /// Names whose address changed.
    pub changes: u64,
    /// Lookups that failed (the last address is kept).
    pub failures: u64,
}

/// How a name is looked up (the system's resolver, or a test's).
pub type Lookup = Arc<dyn Fn(&str, u16) -> std::io::Result<SocketAddr> + Send + Sync>;

struct Shared {
    names: Vec<Option<(String, u16)>>,
    lookup: Lookup,
    table: Mutex<Vec<Option<SocketAddr>>>,
    generation: AtomicU64,
    send_failures: AtomicU64,
    stop: AtomicBool,
    stats: Mutex<ResolveStats>,
}

/// A table of addresses kept current by a thread of its own (none when
/// every entry is an IP literal). Dropping it stops the thread.
pub struct Resolver {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Resolver {
    /// Resolves `names` (index: node id; `None`: no address) now; errors
    /// name the first that does not resolve. `what` names the owner in logs.
    pub fn start(names: Vec<Option<(String, u16)>>, what: &str) -> std::io::Result<Resolver> {
        Self::start_with(names, what, Arc::new(resolve))
    }

    /// The same, names looked up by `lookup`.
    pub fn start_with(names: Vec<Option<(String, u16)>>, what: &str, lookup: Lookup) -> std::io::Result<Resolver> {
        Self::start_waiting(names, what, lookup, Duration::ZERO, None)
    }

    /// The same, waiting up to `wait` (at most [`RESOLVE_WAIT_MAX`]) for
    /// names that do not resolve yet; `stop` (set: give up now) is looked at
    /// between tries. The error names the first name still unresolved.
    pub fn start_waiting(
        names: Vec<Option<(String, u16)>>,
        what: &str,
        lookup: Lookup,
        wait: Duration,
        stop: Option<&AtomicBool>,
    ) -> std::io::Result<Resolver> {
        let deadline = Instant::now() + wait.min(RESOLVE_WAIT_MAX);
        let mut table: Vec<Option<SocketAddr>> = vec![None; names.len()];
        let mut logged = false;
        loop {
            let mut first_error = None;
            for (i, n) in names.iter().enumerate() {
                let (Some((h, p)), None) = (n, table[i]) else { continue };
                match lookup(h, *p) {
                    Ok(a) => table[i] = Some(a),
                    Err(e) if first_error.is_none() => {
                        first_error =
                            Some(std::io::Error::new(e.kind(), format!("node {i}: cannot resolve {h}:{p} ({e})")));
                    }
                    Err(_) => {}
                }
            }
            let Some(e) = first_error else { break };
            if Instant::now() + RESOLVE_RETRY > deadline || stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                return Err(e);
            }
            if !logged {
                logged = true;
                let left = names.iter().zip(&table).filter(|(n, a)| n.is_some() && a.is_none()).count();
                tracing::info!("{what}: {left} name(s) do not resolve yet ({e}); trying again every {RESOLVE_RETRY:?} for up to {wait:?}");
            }
            std::thread::sleep(RESOLVE_RETRY);
        }
        let any_name = names.iter().flatten().any(|(h, _)| h.parse::<std::net::IpAddr>().is_err());
        let shared = Arc::new(Shared {
            names,
            lookup,
            table: Mutex::new(table),
            generation: AtomicU64::new(0),
            send_failures: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stats: Mutex::new(ResolveStats::default()),
        });
        let thread = if any_name {
            let s = shared.clone();
            let what = what.to_string();
            Some(
                std::thread::Builder::new()
                    .name("fairfeed-resolve".into())
                    .spawn(move || run(&s, &what))
                    .map_err(|e| std::io::Error::new(e.kind(), format!("starting the resolver: {e}")))?,
            )
        } else {
            None
        };
        Ok(Resolver { shared, thread })
    }

    /// Bumped each time an address changed.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// The addresses now.
    pub fn table(&self) -> Vec<Option<SocketAddr>> {
        self.shared.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// A send failed: resolve again soon.
    pub fn send_failed(&self) {
        self.shared.send_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a thread keeps names current (some entry is a name).
    pub fn watches_names(&self) -> bool {
        self.thread.is_some()
    }

    /// Its counters so far.
    pub fn stats(&self) -> ResolveStats {
        *self.shared.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(s: &Shared, what: &str) {
    let mut last_round = Instant::now();
    let mut failures_seen = 0;
    let mut last_hinted = Instant::now() - RESOLVE_AFTER_FAILURE;
    while !s.stop.load(Ordering::Relaxed) {
        std::thread::sleep(TICK);
        let failures = s.send_failures.load(Ordering::Relaxed);
        let hinted = failures != failures_seen && last_hinted.elapsed() >= RESOLVE_AFTER_FAILURE;
        if !hinted && last_round.elapsed() < RESOLVE_INTERVAL {
            continue;
        }
        if hinted {
            failures_seen = failures;
            last_hinted = Instant::now();
        }
        last_round = Instant::now();
        round(s, what);
    }
}

/// Resolves every name once; publishes the table if an address changed.
fn round(s: &Shared, what: &str) {
    let old = s.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    let mut new = old.clone();
    let (mut changes, mut failures) = (0, 0);
    for (i, n) in s.names.iter().enumerate() {
        let Some((h, p)) = n else { continue };
        if h.parse::<std::net::IpAddr>().is_ok() {
            continue;
        }
        match (s.lookup)(h, *p) {
            Ok(a) if Some(a) != old[i] => {
                tracing::info!(node = i, name = %h, addr = %a, "{what}: {h}:{p} (node {i}) now resolves to {a}");
                new[i] = Some(a);
                changes += 1;
            }
            Ok(_) => {}
            Err(e) => {
                failures += 1;
                tracing::warn!(node = i, name = %h, "{what}: cannot resolve {h}:{p} (node {i}): {e}; keeping its last address");
            }
        }
    }
    if changes > 0 {
        *s.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = new;
        s.generation.fetch_add(1, Ordering::Release);
    }
    let mut st = s.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    st.rounds += 1;
    st.changes += changes;
    st.failures += failures;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_need_no_thread_and_names_resolve_at_start() {
        let r = Resolver::start(vec![Some(("127.0.0.1".into(), 9)), None], "test").unwrap();
        assert!(!r.watches_names());
        assert_eq!(r.table(), vec![Some("127.0.0.1:9".parse().unwrap()), None]);
        let r = Resolver::start(vec![Some(("localhost".into(), 9))], "test").unwrap();
        assert!(r.watches_names());
        assert_eq!(r.table()[0].map(|a| a.port()), Some(9));
        assert!(r.table()[0].unwrap().ip().is_loopback());
        let e = Resolver::start(vec![None, Some(("nosuchhost.invalid".into(), 9))], "test").err().unwrap();
        assert!(e.to_string().contains("node 1: cannot resolve nosuchhost.invalid:9"), "{e}");
    }

    /// A name that resolves only later (a pod not scheduled yet) is waited
    /// for when asked; without a wait it is an error at once; a stop ends the wait.
    #[test]
    fn start_up_waits_for_names_that_come_later_when_asked() {
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        let lookup: Lookup = Arc::new(move |h: &str, p: u16| {
            if h == "late.example" && c.fetch_add(1, Ordering::Relaxed) < 2 {
                return Err(std::io::Error::new(std::io::ErrorKind::NotFound, "no record yet"));
            }
            Ok(SocketAddr::from(([127, 0, 0, 2], p)))
        });
        let names = || vec![Some(("early.example".to_string(), 1)), Some(("late.example".to_string(), 2))];
        let e = Resolver::start_waiting(names(), "t", lookup.clone(), Duration::ZERO, None).err().unwrap();
        assert!(e.to_string().contains("node 1: cannot resolve late.example:2"), "{e}");
        let t0 = Instant::now();
        let r = Resolver::start_waiting(names(), "t", lookup.clone(), Duration::from_secs(10), None).unwrap();
        assert_eq!(r.table()[1], Some(SocketAddr::from(([127, 0, 0, 2], 2))));
        assert!(t0.elapsed() < Duration::from_secs(5), "it waited only until the name resolved");
        let never: Lookup = Arc::new(|_: &str, _: u16| Err(std::io::Error::new(std::io::ErrorKind::NotFound, "none")));
        let stop = AtomicBool::new(true);
        let t0 = Instant::now();
        assert!(Resolver::start_waiting(names(), "t", never.clone(), Duration::from_secs(60), Some(&stop)).is_err());
        assert!(t0.elapsed() < Duration::from_secs(2), "a stop ends the wait");
        let t0 = Instant::now();
        assert!(Resolver::start_waiting(names(), "t", never, Duration::from_millis(1_200), None).is_err());
        assert!(t0.elapsed() < Duration::from_secs(3), "the wait is bounded");
    }

    /// A name that moves (a rescheduled pod) is seen soon after a failed send.
    #[test]
    fn a_moved_name_is_picked_up_after_a_failed_send() {
        let moved = Arc::new(AtomicBool::new(false));
        let m = moved.clone();
        let lookup: Lookup = Arc::new(move |_h: &str, p: u16| {
            let ip = if m.load(Ordering::Relaxed) { [10, 0, 0, 2] } else { [10, 0, 0, 1] };
            Ok(SocketAddr::from((ip, p)))
        });
        let r = Resolver::start_with(vec![Some(("node-3.tree".into(), 9100))], "test", lookup).unwrap();
        assert_eq!(r.table()[0], Some("10.0.0.1:9100".parse().unwrap()));
        let g = r.generation();
        moved.store(true, Ordering::Relaxed);
        r.send_failed();
        let t = Instant::now();
        while r.generation() == g {
            assert!(t.elapsed() < Duration::from_secs(5), "the move was not picked up");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(r.table()[0], Some("10.0.0.2:9100".parse().unwrap()));
        assert_eq!(r.stats().changes, 1);
    }
}
