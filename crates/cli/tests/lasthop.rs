//! Goal (issue 44, models 2 and 3 as node processes): a receiver that
//! forwards its releases over one more hop — to firms' hosts (model 2, UDP)
//! and to an enclave's channel (model 3, a Unix socket) — gets the packets
//! to every host at the same time, although the hosts are at different
//! distances, by sending to each early by its measured delay; without that
//! compensation the hop's spread stays.
//!
//! Method: a one-receiver tree as `fairfeed` processes on loopback. The
//! receiver forwards to four `fairfeed firm-host` processes: three over
//! UDP with emulated fixed delays of 0, 250 and 500 µs each way, and one
//! over a Unix socket with an emulated enclave channel (lognormal, median
//! 300 µs, σ 0.4). Each host logs when each packet reached it (after its
//! emulated delay, which the receiver knows nothing of: it sees only its
//! probes' round trips). Per host, the median over packets of its arrival
//! minus host 0's is the host's offset; the run is made with and without
//! compensation, and a third time with the hosts holding each packet to
//! its deadline (`--hosts-hold`, `firm-host --hold`), sent early by the
//! hop's 0.99 quantile.
//!
//! Medians, not tails: seven processes share this machine's two cores, and
//! their scheduling delays (ms) land on a few packets whatever the hop does.

mod common;
use common::bin;
use common::cluster::Cluster;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CONTROL: &str = "127.0.8.10:9867";
/// Emulated one-way floors of the UDP hosts, µs; the enclave's channel median.
const FLOORS_US: [u64; 3] = [0, 250, 500];
const ENCLAVE_MEDIAN_US: u64 = 300;

struct Run {
    /// Per host: first MoldUDP64 sequence → arrival wall ns, in log order.
    arrivals: Vec<Vec<(u64, u64)>>,
    last_hop: serde_json::Value,
    /// (send, deadline, release) per release at the receiver.
    rows: Vec<(u64, u64, u64)>,
}

fn host(args: &[String], err: &std::path::Path) -> Child {
    Command::new(bin())
        .arg("firm-host")
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(err).unwrap())
        .spawn()
        .expect("spawn firm-host")
}

fn read_log(p: &std::path::Path) -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("sequence,arrival_ns"));
    lines
        .map(|l| {
            let (a, b) = l.split_once(',').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Early by each host's median delay.
    Compensate,
    /// Every host at the deadline.
    Off,
    /// Early by a far quantile, and the hosts hold to the deadline.
    Hold,
}

fn run(mode: Mode) -> Run {
    let mut c = Cluster::plan(1, 1, 0, &["--loopback-port".into(), "9860".into()]);
    let enclave = c.path("enclave.sock");
    let mut hosts: Vec<Child> = Vec::new();
    let mut addrs: Vec<String> = Vec::new();
    for (k, floor) in FLOORS_US.iter().enumerate() {
        let addr = format!("127.0.8.{}:9861", k + 1);
        let log = c.path(&format!("host-{k}.csv")).display().to_string();
        let mut a: Vec<String> =
            ["--listen", &addr, "--emulate-floor-us", &floor.to_string(), "--seconds", "30", "--log", &log]
                .iter()
                .map(|s| s.to_string())
                .collect();
        if mode == Mode::Hold {
            a.push("--hold".into());
        }
        hosts.push(host(&a, &c.path(&format!("host-{k}.err"))));
        addrs.push(addr);
    }
    let unix = format!("unix:{}", enclave.display());
    let log = c.path("host-3.csv").display().to_string();
    let median = ENCLAVE_MEDIAN_US.to_string();
    let mut a: Vec<String> =
        ["--listen", &unix, "--emulate-median-us", &median, "--emulate-sigma", "0.4", "--seconds", "30", "--log", &log]
            .iter()
            .map(|s| s.to_string())
            .collect();
    if mode == Mode::Hold {
        a.push("--hold".into());
    }
    hosts.push(host(&a, &c.path("host-3.err")));
    addrs.push(unix);
    std::thread::sleep(Duration::from_millis(300));

    let rx = c.ids("receiver")[0];
    let mut a: Vec<String> = vec!["--seconds".into(), "30".into(), "--control".into(), CONTROL.into()];
    for h in &addrs {
        a.extend(["--host".into(), h.clone()]);
    }
    match mode {
        Mode::Compensate => {}
        Mode::Off => a.push("--no-compensate".into()),
        Mode::Hold => a.extend(["--hosts-hold".into(), "--lead-quantile".into(), "0.99".into()]),
    }
    c.start(rx, &a);
    common::fairfeed(&["stat", CONTROL, "--timeout-ms", "20000"]);
    let sender = c.ids("sender")[0];
    let args: Vec<String> = ["--rate", "1000", "--feed-seconds", "3", "--start-delay-ms", "700", "--linger-ms", "1000"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    c.start(sender, &args);
    c.wait(sender, Duration::from_secs(30));
    c.stop_all();
    for mut h in hosts {
        let _ = Command::new("kill").args(["-TERM", &h.id().to_string()]).status();
        assert!(h.wait().unwrap().success(), "a firm host failed");
    }
    assert!(!enclave.exists(), "the enclave's socket file is removed at exit");
    let arrivals = (0..4).map(|k| read_log(&c.path(&format!("host-{k}.csv")))).collect();
    let stats = c.stats(rx);
    let log = std::fs::read_to_string(c.path(&format!("log-{rx}.csv"))).unwrap();
    let rows = log
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<u64> = l.split(',').map(|x| x.parse().unwrap()).collect();
            (f[1], f[2], f[4])
        })
        .collect();
    Run { arrivals, last_hop: stats["counters"]["last_hop"].clone(), rows }
}

fn median(mut v: Vec<i64>) -> i64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Per host, the median of its arrival minus host 0's, µs (over packets every host got).
fn offsets(r: &Run) -> Vec<f64> {
    let first: HashMap<u64, u64> = r.arrivals[0].iter().copied().collect();
    r.arrivals
        .iter()
        .map(|a| {
            let d: Vec<i64> = a.iter().filter_map(|(s, t)| first.get(s).map(|t0| *t as i64 - *t0 as i64)).collect();
            median(d) as f64 / 1e3
        })
        .collect()
}

/// The window at hosts `k` (last arrival − first, per packet), µs: p50, p90, p99.
fn window(r: &Run, k: std::ops::Range<usize>) -> [f64; 3] {
    let mut w: Vec<i64> = (0..r.arrivals[0].len())
        .map(|i| {
            let t = r.arrivals[k.clone()].iter().map(|a| a[i].1 as i64);
            t.clone().max().unwrap() - t.min().unwrap()
        })
        .collect();
    w.sort_unstable();
    [50, 90, 99].map(|p| w[(w.len() - 1) * p / 100] as f64 / 1e3)
}

fn every_host_got_the_line_in_order(r: &Run) {
    let want: Vec<u64> = r.arrivals[0].iter().map(|a| a.0).collect();
    assert!(want.len() >= 2_000, "host 0 got {} packets", want.len());
    for (k, a) in r.arrivals.iter().enumerate() {
        let seqs: Vec<u64> = a.iter().map(|x| x.0).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "host {k}: packets out of order");
        assert_eq!(seqs, want, "host {k} got what host 0 got");
    }
}

#[test]
fn compensation_brings_hosts_and_an_enclave_at_different_distances_together() {
    let on = run(Mode::Compensate);
    every_host_got_the_line_in_order(&on);
    let hosts = on.last_hop["hosts"].as_array().expect("last_hop counters").clone();
    let lead = |k: usize| hosts[k]["lead_ns"].as_u64().unwrap() as f64 / 1e3;
    let off_on = offsets(&on);
    eprintln!(
        "compensated: leads {:?} µs; offsets from host 0 {off_on:?} µs; window p50/p90/p99 at the UDP hosts {:?} µs, with the enclave {:?} µs",
        (0..4).map(lead).collect::<Vec<_>>(),
        window(&on, 0..3),
        window(&on, 0..4)
    );
    for h in &hosts {
        assert_eq!(h["unprobed"], 0, "every host was probed before the feed: {h}");
        assert_eq!(h["stray_echoes"], 0, "{h}");
    }
    // The leads the probes found follow the emulated distances.
    let d2 = lead(2) - lead(0);
    assert!((400.0..650.0).contains(&d2), "host 2's lead is {d2} µs beyond host 0's (emulated: 500)");
    for (k, o) in off_on.iter().enumerate() {
        assert!(o.abs() < 100.0, "host {k} is {o} µs from host 0 at the median (compensated)");
    }
    // The release point releases ahead by the largest lead, and the sender's deadline covers it.
    let lead_max = on.last_hop["lead_max_ns"].as_u64().unwrap() as i64;
    let early = median(on.rows.iter().map(|r| r.2 as i64 - r.1 as i64).collect());
    assert!(early < -lead_max * 3 / 4, "released {early} ns from the deadline; the largest lead is {lead_max}");
    let offset = median(on.rows.iter().map(|r| r.1 as i64 - r.0 as i64).collect());
    assert!(offset > lead_max, "the deadline offset {offset} ns covers the last hop's {lead_max}");

    let off = run(Mode::Off);
    every_host_got_the_line_in_order(&off);
    let off_off = offsets(&off);
    eprintln!(
        "uncompensated: offsets from host 0 {off_off:?} µs; window p50/p90/p99 at the UDP hosts {:?} µs, with the enclave {:?} µs",
        window(&off, 0..3),
        window(&off, 0..4)
    );
    assert_eq!(off.last_hop["hosts"][0]["probes"], 0);
    assert!(off_off[2] > 350.0, "without compensation host 2 stays behind: {off_off:?}");
    assert!(off_off[3] > 200.0, "and the enclave: {off_off:?}");

    // The hosts hold to the deadline: sent early by a far quantile of each
    // hop, they wait on their own clocks — the enclave channel's jitter,
    // which a median lead cannot remove, goes too.
    let hold = run(Mode::Hold);
    every_host_got_the_line_in_order(&hold);
    let off_hold = offsets(&hold);
    let (w_on, w_hold) = (window(&on, 0..4), window(&hold, 0..4));
    eprintln!(
        "hosts holding: the largest lead {} µs; offsets from host 0 {off_hold:?} µs; window p50/p90/p99 at the UDP hosts {:?} µs, with the enclave {w_hold:?} µs",
        hold.last_hop["lead_max_ns"].as_u64().unwrap_or(0) as f64 / 1e3,
        window(&hold, 0..3)
    );
    for (k, o) in off_hold.iter().enumerate() {
        assert!(o.abs() < 100.0, "host {k} is {o} µs from host 0 at the median (holding)");
    }
    assert!(w_hold[1] < w_on[1] * 0.6, "holding narrows the window with the enclave at p90: {w_hold:?} vs {w_on:?}");
}
