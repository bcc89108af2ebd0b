//! A live dashboard of a running tree: `fairfeed dashboard --topology
//! tree.toml` scrapes every node's `/metrics` (at the node's IP and
//! `--metrics-port`) once a second and serves a page that draws the tree
//! (hedge edges dashed), colours each node by its health, and shows OWD_G,
//! the margin, the late share, the worst receiver's release-error p99 (the
//! delivery window's bound on synchronized clocks) and CDFs of one-way delay
//! and hold over the last minute (from the receivers' histograms). The page
//! and its script are embedded; nothing is fetched from elsewhere.
//!
//! [`Poller`] is the state: fed scrapes, it keeps per-node counters and a
//! minute of histogram snapshots; the shell around it scrapes and serves.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use fairfeed_tree::plan::{Role, Topology};
use serde::Serialize;

/// The page (HTML, CSS and script in one file, embedded in the binary).
pub const PAGE: &str = include_str!("dashboard.html");

/// Scrapes kept for the CDFs (one per poll: a minute at one per second).
pub const HISTORY: usize = 60;
/// A scrape answer larger than this is refused (a node's is a few tens of KiB).
pub const SCRAPE_BYTES_MAX: usize = 4 << 20;
/// A node counts as late (warn) above this share of its releases late in the last poll.
pub const LATE_WARN: f64 = 0.01;
/// A node counts as warn with a clock error bound above this, seconds.
pub const CLOCK_BOUND_WARN_S: f64 = 1e-6;

/// One node as the page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeView {
    pub id: u32,
    pub role: &'static str,
    pub layer: i32,
    pub index: u32,
    pub children: Vec<u32>,
    pub hedge_targets: Vec<u32>,
    /// `ok`, `warn` or `down` (no answer to the last scrape).
    pub health: &'static str,
    pub why: String,
    pub late_share: Option<f64>,
    pub clock_bound_s: Option<f64>,
    pub children_silent: Option<f64>,
    pub release_error_p99_s: Option<f64>,
}

/// What `/api/state` answers.
#[derive(Debug, Clone, Serialize, Default)]
pub struct State {
    /// What is shown (the topology file, or the demo's configuration).
    pub title: String,
    pub updated_unix_ms: u64,
    pub polls: u64,
    pub nodes: Vec<NodeView>,
    pub owd_g_s: Option<f64>,
    pub margin_s: Option<f64>,
    pub late_share: Option<f64>,
    /// 1 − late ÷ released over the last minute, all receivers.
    pub on_time_share_minute: Option<f64>,
    pub release_error_p99_s: Option<f64>,
    /// (seconds, cumulative share) over the last minute.
    pub owd_cdf: Vec<(f64, f64)>,
    pub hold_cdf: Vec<(f64, f64)>,
}

/// Cumulative histogram buckets: (upper bound, count).
pub type Buckets = Vec<(f64, f64)>;

/// One scrape's values: `name` (labels dropped; a node's metrics carry its
/// own id) → value, and histograms → cumulative (upper bound, count).
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub values: HashMap<String, f64>,
    pub hists: HashMap<String, Buckets>,
}

impl Sample {
    /// Parses the text exposition format (with the `prometheus-parse` crate).
    pub fn parse(text: &str) -> Sample {
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let mut s = Sample::default();
        let Ok(scrape) = prometheus_parse::Scrape::parse(lines) else { return s };
        for x in scrape.samples {
            match x.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => {
                    s.values.insert(x.metric, v);
                }
                prometheus_parse::Value::Histogram(h) => {
                    s.hists.insert(x.metric, h.iter().map(|b| (b.less_than, b.count)).collect());
                }
                prometheus_parse::Value::Summary(_) => {}
            }
        }
        s
    }

    fn get(&self, name: &str) -> Option<f64> {
        self.values.get(name).copied()
    }
}

/// The p-quantile of cumulative buckets (the upper bound where the count passes p).
fn quantile(b: &[(f64, f64)], p: f64) -> Option<f64> {
    let total = b.iter().map(|x| x.1).fold(0.0, f64::max);
    if total <= 0.0 {
        return None;
    }
    b.iter().find(|x| x.1 >= p * total).map(|x| if x.0.is_finite() { x.0 } else { f64::NAN }).filter(|v| !v.is_nan())
}

/// Bucket-wise `a − b` (same bounds), floored at 0.
fn minus(a: &[(f64, f64)], b: Option<&Vec<(f64, f64)>>) -> Vec<(f64, f64)> {
    a.iter()
        .map(|&(le, n)| {
            let old = b.and_then(|b| b.iter().find(|x| x.0 == le)).map_or(0.0, |x| x.1);
            (le, (n - old).max(0.0))
        })
        .collect()
}

/// Sets a node's health and why: down if it did not answer; warn on late
/// releases, silent children or a wide clock bound; ok otherwise.
fn judge(v: &mut NodeView, answered: bool) {
    let mut why = Vec::new();
    if !answered {
        v.health = "down";
        why.push("no answer to the last scrape".to_string());
    } else {
        if v.late_share.is_some_and(|x| x > LATE_WARN) {
            why.push(format!("{:.1} % late", v.late_share.unwrap_or(0.0) * 100.0));
        }
        if v.children_silent.is_some_and(|x| x > 0.0) {
            why.push("silent children".into());
        }
        if v.clock_bound_s.is_some_and(|x| x > CLOCK_BOUND_WARN_S) {
            why.push("clock bound over 1 µs".into());
        }
        v.health = if why.is_empty() { "ok" } else { "warn" };
    }
    v.why = why.join(", ");
}

/// The dashboard's state machine: scrapes in, [`State`] out.
pub struct Poller {
    topology: Topology,
    /// Per node: its last scrapes (newest last), `None` where it did not answer.
    history: HashMap<u32, VecDeque<Option<Sample>>>,
    polls: u64,
}

impl Poller {
    pub fn new(topology: Topology) -> Poller {
        Poller { topology, history: HashMap::new(), polls: 0 }
    }

    /// The nodes to scrape: (id, metrics address at `port`).
    pub fn targets(&self, port: u16) -> Vec<(u32, Option<SocketAddr>)> {
        let Some(tree) = self.topology.trees.first() else { return Vec::new() };
        tree.nodes
            .iter()
            .map(|n| {
                let hp = n.addr.as_deref().and_then(|a| fairfeed_tree::addr::HostPort::parse(a, false).ok());
                let ip = hp.and_then(|a| fairfeed_io::resolve::resolve(&a.host, a.port).ok()).map(|a| a.ip());
                (n.id, ip.map(|ip| SocketAddr::new(ip, port)))
            })
            .collect()
    }

    /// Takes one round of scrapes (`None`: the node did not answer) and returns the new state.
    pub fn update(&mut self, scrapes: Vec<(u32, Option<Sample>)>, now_unix_ms: u64) -> State {
        self.polls += 1;
        for (id, s) in scrapes {
            let h = self.history.entry(id).or_default();
            h.push_back(s);
            while h.len() > HISTORY + 1 {
                h.pop_front();
            }
        }
        self.state(now_unix_ms)
    }

    fn latest(&self, id: u32) -> (Option<&Sample>, Option<&Sample>, Option<&Sample>) {
        let Some(h) = self.history.get(&id) else { return (None, None, None) };
        let now = h.back().and_then(Option::as_ref);
        let prev = h.len().checked_sub(2).and_then(|i| h[i].as_ref());
        let oldest = h.iter().flatten().next();
        (now, prev, oldest)
    }

    fn state(&self, now_unix_ms: u64) -> State {
        let mut st = State { updated_unix_ms: now_unix_ms, polls: self.polls, ..State::default() };
        let Some(tree) = self.topology.trees.first() else { return st };
        let (mut late, mut released, mut late_min, mut released_min) = (0.0, 0.0, 0.0, 0.0);
        let (mut owd, mut hold): (Buckets, Buckets) = (Vec::new(), Vec::new());
        for n in &tree.nodes {
            let (now, prev, oldest) = self.latest(n.id);
            let delta = |name: &str, base: Option<&Sample>| {
                let v = now?.get(name)?;
                Some(v - base.and_then(|b| b.get(name)).unwrap_or(0.0))
            };
            let mut v = node_view(n, now);
            if n.role == Role::Receiver {
                let (l, r) = (delta("fairfeed_node_late_total", prev), delta("fairfeed_node_released_total", prev));
                if let (Some(l), Some(r)) = (l, r) {
                    late += l;
                    released += r;
                    v.late_share = (r > 0.0).then(|| l / r);
                }
                // Over the minute of history (zero until a second scrape).
                late_min += delta("fairfeed_node_late_total", oldest).unwrap_or(0.0);
                released_min += delta("fairfeed_node_released_total", oldest).unwrap_or(0.0);
                if let Some(s) = now {
                    let over = |name: &str| {
                        let cur = s.hists.get(name)?;
                        Some(minus(cur, oldest.and_then(|o| o.hists.get(name))))
                    };
                    if let Some(d) = over("fairfeed_node_owd_seconds") {
                        add(&mut owd, d);
                    }
                    if let Some(d) = over("fairfeed_node_hold_seconds") {
                        add(&mut hold, d);
                    }
                    v.release_error_p99_s =
                        s.hists.get("fairfeed_node_release_error_seconds").and_then(|b| quantile(b, 0.99));
                }
            }
            if n.role == Role::Sender {
                st.owd_g_s = now.and_then(|s| s.get("fairfeed_node_owd_g_seconds"));
                st.margin_s = now.and_then(|s| s.get("fairfeed_node_margin_seconds"));
            }
            judge(&mut v, now.is_some());
            st.release_error_p99_s = match (st.release_error_p99_s, v.release_error_p99_s) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            st.nodes.push(v);
        }
        st.late_share = (released > 0.0).then(|| late / released);
        st.on_time_share_minute = (released_min > 0.0).then(|| 1.0 - late_min / released_min);
        st.owd_cdf = cdf(&owd);
        st.hold_cdf = cdf(&hold);
        st
    }
}

/// Adds histogram buckets `d` into `acc` (the first taken as they are).
fn add(acc: &mut Vec<(f64, f64)>, d: Vec<(f64, f64)>) {
    if acc.is_empty() {
        *acc = d;
    } else {
        for (a, b) in acc.iter_mut().zip(d) {
            a.1 += b.1;
        }
    }
}

/// Cumulative buckets as a CDF (the `+Inf` bucket left out).
fn cdf(b: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let total = b.iter().map(|x| x.1).fold(0.0, f64::max);
    if total <= 0.0 {
        return Vec::new();
    }
    b.iter().filter(|x| x.0.is_finite()).map(|x| (x.0, x.1 / total)).collect()
}

/// A node's place in the tree and what its latest scrape says of it.
fn node_view(n: &fairfeed_tree::plan::Node, now: Option<&Sample>) -> NodeView {
    NodeView {
        id: n.id,
        role: match n.role {
            Role::Sender => "sender",
            Role::Proxy => "proxy",
            Role::Receiver => "receiver",
        },
        layer: n.layer,
        index: n.index,
        children: n.children.clone(),
        hedge_targets: n.hedge_targets.clone(),
        health: "ok",
        why: String::new(),
        late_share: None,
        clock_bound_s: now.and_then(|s| s.get("fairfeed_node_clock_stats_bound_seconds")),
        children_silent: now.and_then(|s| s.get("fairfeed_node_children_silent")),
        release_error_p99_s: None,
    }
}

/// `GET /metrics` from `addr`: the body, or `None` (no answer within `timeout`, not 200, too large).
pub fn scrape(addr: SocketAddr, timeout: Duration) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    s.take(SCRAPE_BYTES_MAX as u64 + 1).read_to_end(&mut raw).ok()?;
    if raw.len() > SCRAPE_BYTES_MAX {
        return None;
    }
    let text = String::from_utf8(raw).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// How often the dashboard scrapes every node.
pub const POLL: Duration = Duration::from_secs(1);
/// One scrape's time limit (a node that does not answer within it counts as down).
pub const SCRAPE_TIMEOUT: Duration = Duration::from_millis(400);
/// Nodes scraped at once.
pub const SCRAPE_PARALLEL: usize = 16;

/// The page and `/api/state` on a bounded endpoint; [`Server::show`] sets what the state answers.
pub struct Server {
    ep: crate::Endpoint,
    state: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    /// Serves the page at `http://listen/` (nothing to show yet).
    pub fn start(listen: SocketAddr) -> std::io::Result<Server> {
        use std::sync::{Arc, Mutex};
        let state = Arc::new(Mutex::new(serde_json::to_string(&State::default()).unwrap_or_default()));
        let st = state.clone();
        let handler: crate::http::Handler = Arc::new(move |path| match path {
            "/" | "/index.html" => Some((200, "text/html; charset=utf-8", PAGE.to_string())),
            "/api/state" => {
                let body = st.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
                Some((200, "application/json", body))
            }
            _ => None,
        });
        let ep = crate::http::serve(listen, crate::http::Limits::default(), handler)?;
        Ok(Server { ep, state })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.ep.addr
    }

    /// What `/api/state` answers from now on.
    pub fn show(&self, s: &State) {
        *self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            serde_json::to_string(s).unwrap_or_default();
    }
}

/// Milliseconds since the Unix epoch (the page shows when the state was made).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Calls `poll` every [`POLL`] until `stop` is set (looking at `stop` every 50 ms).
pub fn every_poll(stop: &std::sync::atomic::AtomicBool, mut poll: impl FnMut()) {
    use std::sync::atomic::Ordering::Relaxed;
    while !stop.load(Relaxed) {
        let until = std::time::Instant::now() + POLL;
        poll();
        while std::time::Instant::now() < until && !stop.load(Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One round of scrapes of `targets`, [`SCRAPE_PARALLEL`] at a time.
pub fn scrape_all(targets: &[(u32, Option<SocketAddr>)]) -> Vec<(u32, Option<Sample>)> {
    let mut scrapes = Vec::with_capacity(targets.len());
    for chunk in targets.chunks(SCRAPE_PARALLEL) {
        std::thread::scope(|s| {
            let hs: Vec<_> = chunk
                .iter()
                .map(|&(id, a)| {
                    s.spawn(move || (id, a.and_then(|a| scrape(a, SCRAPE_TIMEOUT)).map(|b| Sample::parse(&b))))
                })
                .collect();
            scrapes.extend(hs.into_iter().filter_map(|h| h.join().ok()));
        });
    }
    scrapes
}

/// Serves the dashboard at `listen` until `stop` is set: scrapes every
/// node's metrics at its IP and `metrics_port` each [`POLL`], on the calling thread.
pub fn run(
    topology: Topology,
    title: &str,
    listen: SocketAddr,
    metrics_port: u16,
    stop: &std::sync::atomic::AtomicBool,
) -> std::io::Result<SocketAddr> {
    let server = Server::start(listen)?;
    let addr = server.addr();
    tracing::info!(%addr, metrics_port, "dashboard: http://{addr}/ (scraping each node's :{metrics_port}/metrics every second)");
    let mut poller = Poller::new(topology);
    let targets = poller.targets(metrics_port);
    every_poll(stop, || {
        let mut s = poller.update(scrape_all(&targets), unix_ms());
        s.title = title.to_string();
        server.show(&s);
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_tree::plan::{plan, PlanRequest};

    fn body(late: u64, released: u64, bound: f64) -> String {
        let mut e = crate::metrics::Exposition::new();
        let l = [("node", "0"), ("role", "receiver")];
        e.counter("fairfeed_node_late_total", "h", &l, late as f64);
        e.counter("fairfeed_node_released_total", "h", &l, released as f64);
        e.gauge("fairfeed_node_clock_stats_bound_seconds", "h", &l, bound);
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for _ in 0..released {
            h.record(50_000).unwrap();
        }
        e.histogram("fairfeed_node_owd_seconds", "h", &l, &h, 1e-9, crate::metrics::LATENCY_BUCKETS_S);
        e.render()
    }

    #[test]
    fn health_late_share_and_cdfs_follow_the_scrapes() {
        let req = PlanRequest { receivers: 4, fanout: Some(2), depth: None, hedge: 1, cost_model: None, trees: 1 };
        let topo = plan(&req).unwrap();
        let ids: Vec<u32> = topo.trees[0].nodes.iter().map(|n| n.id).collect();
        let mut p = Poller::new(topo);
        let round =
            |late, rel, bound| ids.iter().map(|&id| (id, Some(Sample::parse(&body(late, rel, bound))))).collect();
        p.update(round(0, 100, 1e-7), 1);
        let s = p.update(round(5, 200, 1e-7), 2);
        let r0 = s.nodes.iter().find(|n| n.id == 0).unwrap();
        assert_eq!(r0.late_share, Some(0.05));
        assert_eq!(r0.health, "warn", "{r0:?}");
        assert!(!s.owd_cdf.is_empty() && s.owd_cdf.last().unwrap().1 == 1.0, "{:?}", s.owd_cdf);
        // Node 0 stops answering: down at once.
        let mut next: Vec<(u32, Option<Sample>)> = round(5, 300, 1e-7);
        next.iter_mut().find(|(id, _)| *id == 0).unwrap().1 = None;
        let s = p.update(next, 3);
        assert_eq!(s.nodes.iter().find(|n| n.id == 0).unwrap().health, "down");
        assert_eq!(s.nodes.iter().find(|n| n.id == 1).unwrap().health, "ok");
    }
}
