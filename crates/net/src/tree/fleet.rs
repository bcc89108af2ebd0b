//! A running tree seen whole (`fairfeed stat --topology FILE`): every node
//! asked over its control socket at once, the receivers' recent releases
//! lined up per message, and what an operator asks of a fair tree — how
//! wide is each message's delivery window, how often is it within 1 µs, who
//! is late, which receivers are last and by how much.
//!
//! Over several trees the messages lined up are tree 0's (each tree numbers
//! its own; every receiver takes tree 0); the counters are every tree's.
//!
//! Release instants are each receiver's synchronized clock (the sender's
//! clock as that receiver knows it, or CLOCK_REALTIME with `--clock
//! system`): the windows are as good as those clocks, and the view says
//! what bound the receivers claim.

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use fairfeed_tree::operator::OperatorKey;
use fairfeed_tree::plan::{Role, Topology};
use serde::Serialize;

use super::agent::{parse_page, Release};
use crate::operator::{answer, request, Nonce};

/// Messages compared at most (the most recent every receiver has released).
pub const FLEET_MESSAGES_MAX: usize = 100_000;
/// A request not answered is sent again this often until the timeout.
const RETRY: Duration = Duration::from_millis(200);

/// Why the fleet cannot be seen.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("node {0} has no control address in the topology (plan with --control-port PORT)")]
    NoControl(u32),
    #[error("node {0}'s control address {1:?}: {2}")]
    BadControl(u32, String, String),
    #[error("opening a socket to ask the nodes: {0}")]
    Socket(std::io::Error),
    #[error("no receiver answered within {0:?}")]
    NoReceiver(Duration),
}

/// One receiver's part of the view.
#[derive(Debug, Clone, Serialize)]
pub struct ReceiverRow {
    pub id: u32,
    pub released: u64,
    pub late: u64,
    /// Late releases over all releases (arrived after the deadline).
    pub late_share: f64,
    /// Messages it gave up as gaps (delivered to its application as MoldUDP64 gaps).
    pub gap_packets: u64,
    /// Its clock's error bound as it reports it, ns (none: not synchronizing, or not yet known).
    pub clock_bound_ns: Option<u64>,
    /// Compared messages for which it released last.
    pub last_share: f64,
    /// How far behind the first receiver it released, p50 / p99 / max, ns.
    pub behind_p50_ns: u64,
    pub behind_p99_ns: u64,
    pub behind_max_ns: u64,
}

/// What `fairfeed stat --topology` shows.
#[derive(Debug, Clone, Serialize)]
pub struct FleetView {
    pub nodes: usize,
    /// Nodes that did not answer `stat`.
    pub down: Vec<u32>,
    pub receivers: usize,
    /// Messages every answering receiver released, compared: the range of sequences.
    pub compared: usize,
    pub first_sequence: u64,
    pub last_sequence: u64,
    /// Delivery window (last release − first) over the compared messages, ns.
    pub window_p50_ns: u64,
    pub window_p99_ns: u64,
    pub window_max_ns: u64,
    /// Share of compared messages whose window was within 1 µs, 10 µs, 100 µs.
    pub pf_1us: f64,
    pub pf_10us: f64,
    pub pf_100us: f64,
    /// Late releases over all releases, every answering receiver.
    pub late_share: f64,
    /// The largest clock bound a receiver reports, ns: windows below it are
    /// within the clocks' noise (none: no receiver synchronizes its clock).
    pub clock_bound_max_ns: Option<u64>,
    /// The sender's deadline offset (OWD_G + margin, or the controller's), ns, if it answered.
    pub deadline_offset_ns: Option<u64>,
    /// Receivers, worst first (by p99 behind the first release).
    pub rows: Vec<ReceiverRow>,
}

/// Control addresses of every node of every tree (each once), resolved now.
pub fn control_addresses(topo: &Topology) -> Result<Vec<(u32, Role, SocketAddr)>, FleetError> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for n in topo.trees.iter().flat_map(|t| &t.nodes).filter(|n| seen.insert(n.id)) {
        let Some(c) = &n.control else { return Err(FleetError::NoControl(n.id)) };
        let bad = |e: String| FleetError::BadControl(n.id, c.clone(), e);
        let hp = fairfeed_tree::addr::HostPort::parse(c, false).map_err(|e| bad(e.to_string()))?;
        let a = fairfeed_io::resolve::resolve(&hp.host, hp.port).map_err(|e| bad(e.to_string()))?;
        out.push((n.id, n.role, a));
    }
    Ok(out)
}

/// Sends `ask(id)` to each of `to` from one socket and collects one JSON
/// answer per node, asking again every [`RETRY`] until `timeout`.
fn ask_all(
    sock: &UdpSocket,
    to: &[(u32, SocketAddr)],
    (key, cmd): (Option<&OperatorKey>, &dyn Fn(u32) -> String),
    timeout: Duration,
) -> HashMap<u32, serde_json::Value> {
    let by_addr: HashMap<SocketAddr, u32> = to.iter().map(|&(id, a)| (a, id)).collect();
    let mut got: HashMap<u32, serde_json::Value> = HashMap::new();
    // Each node's sealed requests so far: its answer must be sealed to one of them.
    let mut sent: HashMap<u32, Vec<Nonce>> = HashMap::new();
    let until = Instant::now() + timeout;
    let mut buf = vec![0u8; 65_536];
    while got.len() < to.len() && Instant::now() < until {
        for &(id, a) in to.iter().filter(|(id, _)| !got.contains_key(id)) {
            let (datagram, nonce) = request(key, a, &cmd(id));
            sent.entry(id).or_default().extend(nonce);
            let _ = sock.send_to(&datagram, a);
        }
        let round = (Instant::now() + RETRY).min(until);
        while got.len() < to.len() {
            let left = round.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let _ = sock.set_read_timeout(Some(left));
            let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
            let Some(&id) = by_addr.get(&from) else { continue };
            let Ok(body) = answer(key, sent.get(&id).map_or(&[][..], Vec::as_slice), &buf[..n]) else { continue };
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
                got.insert(id, v);
            }
        }
    }
    got
}

/// Asks every node of `topo` and builds the view over at most `messages`
/// recent messages.
pub fn fleet(
    topo: &Topology,
    messages: usize,
    timeout: Duration,
    key: Option<&OperatorKey>,
) -> Result<FleetView, FleetError> {
    let nodes = control_addresses(topo)?;
    let sock = UdpSocket::bind("0.0.0.0:0").map_err(FleetError::Socket)?;
    let all: Vec<(u32, SocketAddr)> = nodes.iter().map(|&(id, _, a)| (id, a)).collect();
    let stats = ask_all(&sock, &all, (key, &|_| "stat".into()), timeout);
    let down: Vec<u32> = nodes.iter().map(|n| n.0).filter(|id| !stats.contains_key(id)).collect();
    let receivers: Vec<(u32, SocketAddr)> =
        nodes.iter().filter(|n| n.1 == Role::Receiver && stats.contains_key(&n.0)).map(|&(id, _, a)| (id, a)).collect();
    if receivers.is_empty() {
        return Err(FleetError::NoReceiver(timeout));
    }
    // The sequences every answering receiver still keeps: the last `messages` of them.
    let ranges: Vec<(u64, u64)> = receivers
        .iter()
        .filter_map(|(id, _)| {
            let r = &stats[id]["counters"]["release_log"];
            Some((r.get("first")?.as_u64()?, r.get("last")?.as_u64()?))
        })
        .collect();
    let lo = ranges.iter().map(|r| r.0).max().unwrap_or(1);
    let hi = ranges.iter().map(|r| r.1).min().unwrap_or(0);
    let from = hi.saturating_sub(messages.min(FLEET_MESSAGES_MAX) as u64 - 1).max(lo);
    let mut releases: HashMap<u32, Vec<Release>> = HashMap::new();
    if ranges.len() == receivers.len() && hi >= lo {
        releases = page_all(&sock, &receivers, (from, hi), timeout, key);
    }
    Ok(view(topo, &stats, &releases, down, (from, hi)))
}

/// Every receiver's releases `from..=to`, page by page, all receivers at once.
fn page_all(
    sock: &UdpSocket,
    receivers: &[(u32, SocketAddr)],
    (from, to): (u64, u64),
    timeout: Duration,
    key: Option<&OperatorKey>,
) -> HashMap<u32, Vec<Release>> {
    let mut out: HashMap<u32, Vec<Release>> = receivers.iter().map(|r| (r.0, Vec::new())).collect();
    let mut next: HashMap<u32, u64> = receivers.iter().map(|r| (r.0, from)).collect();
    loop {
        let want: Vec<(u32, SocketAddr)> = receivers.iter().filter(|r| next[&r.0] <= to).copied().collect();
        if want.is_empty() {
            break;
        }
        let answers = ask_all(sock, &want, (key, &|id| format!("releases {}", next[&id])), timeout);
        if answers.is_empty() {
            break;
        }
        for (id, v) in answers {
            let Some((_, page)) = parse_page(&v) else {
                next.insert(id, u64::MAX);
                continue;
            };
            let last = page.last().map(|r| r.sequence);
            out.entry(id).or_default().extend(page.into_iter().filter(|r| r.sequence <= to));
            next.insert(id, last.map_or(u64::MAX, |l| l + 1));
        }
    }
    out
}

fn quantile(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((q * v.len() as f64) as usize).min(v.len() - 1)]
}

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The sender's deadline offset from its stats: the tail estimate, else
/// OWD_G plus margin, plus its clock bound (several trees: the largest).
fn deadline_offset(node: &serde_json::Value) -> u64 {
    if let Some(v) = node["deadline_offsets_ns"].as_array() {
        return v.iter().filter_map(serde_json::Value::as_u64).max().unwrap_or(0);
    }
    let tail = n(&node["tail"]["estimate_ns"]);
    let owd = n(&node["owd_g_ns"]) as i64 + node["margin_ns"].as_i64().unwrap_or(0);
    (if tail > 0 { tail } else { owd.max(0) as u64 }) + n(&node["clock_bound_ns"])
}

/// Over the messages every receiver released: each one's window, how far
/// behind the first each receiver was, and who was last how often.
struct Windows {
    complete: usize,
    windows: Vec<u64>,
    behind: HashMap<u32, Vec<u64>>,
    last_count: HashMap<u32, u64>,
}

fn windows_of(releases: &HashMap<u32, Vec<Release>>) -> Windows {
    let receivers = releases.len();
    // Per message: each receiver's release instant.
    let mut at: BTreeMap<u64, Vec<(u32, u64)>> = BTreeMap::new();
    for (&id, rs) in releases {
        for r in rs {
            at.entry(r.sequence).or_default().push((id, r.at_ns));
        }
    }
    let complete: Vec<&Vec<(u32, u64)>> = at.values().filter(|v| v.len() == receivers && receivers > 0).collect();
    let mut w = Windows {
        complete: complete.len(),
        windows: Vec::with_capacity(complete.len()),
        behind: HashMap::new(),
        last_count: HashMap::new(),
    };
    for v in &complete {
        let lo = v.iter().map(|x| x.1).min().unwrap_or(0);
        let (last_id, hi) = v.iter().max_by_key(|x| x.1).map_or((0, 0), |x| (x.0, x.1));
        w.windows.push(hi - lo);
        *w.last_count.entry(last_id).or_default() += 1;
        for &(id, t) in v.iter() {
            w.behind.entry(id).or_default().push(t - lo);
        }
    }
    w
}

/// The view from the answers (pure: the tests feed it directly).
pub fn view(
    topo: &Topology,
    stats: &HashMap<u32, serde_json::Value>,
    releases: &HashMap<u32, Vec<Release>>,
    down: Vec<u32>,
    (first, last): (u64, u64),
) -> FleetView {
    let Windows { complete, mut windows, mut behind, last_count } = windows_of(releases);
    let count = windows.len().max(1) as f64;
    let within = |ns: u64| windows.iter().filter(|&&w| w <= ns).count() as f64 / count;
    let (pf_1us, pf_10us, pf_100us) = (within(1_000), within(10_000), within(100_000));
    let mut rows: Vec<ReceiverRow> = stats
        .iter()
        .filter(|(id, s)| s["role"] == "receiver" && (releases.contains_key(id) || releases.is_empty()))
        .map(|(&id, s)| {
            let node = &s["node"];
            let (released, late) = (n(&node["released"]), n(&node["late"]));
            let mut b = behind.remove(&id).unwrap_or_default();
            ReceiverRow {
                id,
                released,
                late,
                late_share: if released > 0 { late as f64 / released as f64 } else { 0.0 },
                gap_packets: n(&node["gap_packets"]),
                // fairfeed's sync (`bound_now_ns`), or the host daemon's under `--clock system`.
                clock_bound_ns: node["clock"]["bound_now_ns"]
                    .as_u64()
                    .or(node["clock"]["host_bound_ns"].as_u64())
                    .filter(|&b| b < u64::MAX),
                last_share: *last_count.get(&id).unwrap_or(&0) as f64 / count,
                behind_p50_ns: quantile(&mut b, 0.5),
                behind_p99_ns: quantile(&mut b, 0.99),
                behind_max_ns: b.iter().copied().max().unwrap_or(0),
            }
        })
        .collect();
    rows.sort_by_key(|r| (std::cmp::Reverse(r.behind_p99_ns), r.id));
    let (rel, late): (u64, u64) = rows.iter().fold((0, 0), |a, r| (a.0 + r.released, a.1 + r.late));
    let sender = fairfeed_tree::plan::sender_id(topo).and_then(|id| stats.get(&id));
    let deadline_offset_ns = sender.map(|s| deadline_offset(&s["node"]));
    FleetView {
        nodes: topo.trees.iter().flat_map(|t| &t.nodes).map(|n| n.id).collect::<std::collections::HashSet<_>>().len(),
        down,
        receivers: rows.len(),
        compared: complete,
        first_sequence: if complete == 0 { 0 } else { first },
        last_sequence: if complete == 0 { 0 } else { last },
        window_p50_ns: quantile(&mut windows, 0.5),
        window_p99_ns: quantile(&mut windows, 0.99),
        window_max_ns: windows.iter().copied().max().unwrap_or(0),
        pf_1us,
        pf_10us,
        pf_100us,
        late_share: if rel > 0 { late as f64 / rel as f64 } else { 0.0 },
        clock_bound_max_ns: rows.iter().filter_map(|r| r.clock_bound_ns).max(),
        deadline_offset_ns,
        rows,
    }
}

/// The view as a person reads it: the fleet's figures, then the receivers, worst first.
pub fn text(v: &FleetView, worst: usize) -> String {
    let us = |ns: u64| ns as f64 / 1e3;
    let mut s = format!(
        "{} nodes, {} answering{}; {} receivers\n",
        v.nodes,
        v.nodes - v.down.len(),
        if v.down.is_empty() { String::new() } else { format!(" (not answering: {:?})", v.down) },
        v.receivers
    );
    if v.compared == 0 {
        s += "no message released by every answering receiver yet (is the feed running?)\n";
    } else {
        s += &format!(
            "messages {}..={} ({} compared, released by every answering receiver)\n\
             delivery window p50 {:.3} µs, p99 {:.3} µs, max {:.3} µs\n\
             P(F): within 1 µs {:.2} %, 10 µs {:.2} %, 100 µs {:.2} %\n",
            v.first_sequence,
            v.last_sequence,
            v.compared,
            us(v.window_p50_ns),
            us(v.window_p99_ns),
            us(v.window_max_ns),
            v.pf_1us * 100.0,
            v.pf_10us * 100.0,
            v.pf_100us * 100.0
        );
    }
    s += &format!("late releases (arrived after the deadline): {:.3} % of all\n", v.late_share * 100.0);
    if let Some(d) = v.deadline_offset_ns {
        s += &format!("the sender's deadline offset: {:.1} µs\n", us(d));
    }
    s += &format!(
        "release instants are each receiver's synchronized clock; the largest bound a receiver reports: {}\n\n",
        v.clock_bound_max_ns
            .map_or_else(|| "none (clocks trusted as they are)".to_string(), |b| format!("{:.3} µs", us(b)))
    );
    s += &format!(
        "{:>8} {:>10} {:>8} {:>8} {:>10} {:>12} {:>12} {:>12}\n",
        "receiver", "released", "late %", "gaps", "last %", "behind p50", "behind p99", "behind max"
    );
    for r in v.rows.iter().take(worst) {
        s += &format!(
            "{:>8} {:>10} {:>8.3} {:>8} {:>10.2} {:>10.3}µs {:>10.3}µs {:>10.3}µs\n",
            r.id,
            r.released,
            r.late_share * 100.0,
            r.gap_packets,
            r.last_share * 100.0,
            us(r.behind_p50_ns),
            us(r.behind_p99_ns),
            us(r.behind_max_ns)
        );
    }
    if v.rows.len() > worst {
        s += &format!("… and {} more (--worst N, or --json for all)\n", v.rows.len() - worst);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn windows_pf_and_the_last_receiver_from_releases() {
        let topo = fairfeed_tree::plan::plan(&fairfeed_tree::plan::PlanRequest {
            receivers: 3,
            fanout: Some(3),
            depth: Some(1),
            hedge: 0,
            cost_model: None,
            trees: 1,
        })
        .unwrap();
        let stat = |released: u64, late: u64| json!({"role": "receiver", "node": {"released": released, "late": late}});
        let stats: HashMap<u32, serde_json::Value> = [(0, stat(100, 1)), (1, stat(100, 0)), (2, stat(100, 3))].into();
        // Receiver 2 always 2 µs behind; receiver 1 500 ns behind on every other message.
        let mut releases: HashMap<u32, Vec<Release>> = HashMap::new();
        for s in 1..=100u64 {
            let t = s * 1_000_000;
            for (id, d) in [(0, 0), (1, if s % 2 == 0 { 500 } else { 0 }), (2, 2_000)] {
                releases.entry(id).or_default().push(Release {
                    sequence: s,
                    at_ns: t + d,
                    late: false,
                    clock_ok: true,
                });
            }
        }
        let v = view(&topo, &stats, &releases, vec![3], (1, 100));
        assert_eq!((v.compared, v.receivers, v.down.clone()), (100, 3, vec![3]));
        assert_eq!((v.window_p50_ns, v.window_max_ns), (2_000, 2_000));
        assert_eq!((v.pf_1us, v.pf_10us), (0.0, 1.0));
        assert_eq!(v.rows[0].id, 2, "the worst receiver first");
        assert_eq!((v.rows[0].last_share, v.rows[0].behind_p99_ns), (1.0, 2_000));
        assert!((v.late_share - 4.0 / 300.0).abs() < 1e-12);
        let t = text(&v, 10);
        assert!(t.contains("P(F): within 1 µs 0.00 %, 10 µs 100.00 %") && t.contains("not answering: [3]"), "{t}");
    }
}
