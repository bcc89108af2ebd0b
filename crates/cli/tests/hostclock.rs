//! `--clock system` on a host disciplined by chrony: the node takes chrony's
//! own error estimate as its clock bound (issue 40, item 7). The test starts
//! two chronyd of its own on loopback — a server with a local reference and a
//! client that follows it with `-x` (it never touches the host's clock) —
//! and points the tree's nodes at the client's command socket. Likewise
//! linuxptp's ptp4l: a grandmaster and a free-running slave over a veth pair
//! between two network namespaces the test makes, the node reading the
//! slave through `pmc`.

mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A chronyd that is killed when the test ends, however it ends.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chronyd(dir: &std::path::Path, name: &str, conf: &str) -> Daemon {
    let f = dir.join(format!("{name}.conf"));
    std::fs::write(&f, conf).unwrap();
    let child = Command::new("chronyd")
        .args(["-d", "-x", "-u", "root", "-f"])
        .arg(&f)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
        .spawn()
        .expect("chronyd");
    Daemon(child)
}

fn tracking(sock: &std::path::Path) -> String {
    let o = Command::new("chronyc").arg("-c").arg("-h").arg(sock).arg("tracking").output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A chronyd serving a local reference on loopback and a second one (`-x`)
/// following it; returns both and the follower's command socket.
fn chrony_pair(dir_path: &std::path::Path) -> (Daemon, Daemon, std::path::PathBuf) {
    // chronyd refuses a command socket in a directory others can enter.
    std::fs::set_permissions(dir_path, std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = dir_path.display().to_string();
    let ntp_port = free_port(false);
    let server = chronyd(
        dir_path,
        "server",
        &format!(
            "local stratum 8\nport {ntp_port}\nbindaddress 127.0.0.1\nallow 127.0.0.1\ncmdport 0\n\
             bindcmdaddress {dir}/server.sock\npidfile {dir}/server.pid\n"
        ),
    );
    let sock = dir_path.join("client.sock");
    let client = chronyd(
        dir_path,
        "client",
        &format!(
            "server 127.0.0.1 port {ntp_port} iburst minpoll -4 maxpoll -4\nport 0\ncmdport 0\n\
             bindcmdaddress {}\npidfile {dir}/client.pid\n",
            sock.display()
        ),
    );
    (server, client, sock)
}

/// A receiver told to read `source` (`--host-clock chrony|ptp`) at `socket`,
/// where nothing answers, refuses to start, in one line.
fn refuses_where_nothing_answers(topology: &str, source: &str, socket: &std::path::Path) {
    let flag = if source == "ptp" { "--ptp-socket" } else { "--chrony-socket" };
    let bad = Command::new(bin())
        .args(["receiver", "--topology", topology, "--id", "0", "--host-clock", source, flag])
        .arg(socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains(&format!("--host-clock {source}")), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("error")).count(), 1, "{err}");
}

#[test]
fn clock_system_takes_chronys_bound_and_the_sender_covers_it() {
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if !have_tool("chronyd", &["-v"]) || !have_tool("chronyc", &["-v"]) || !is_root {
        eprintln!("SKIPPED: needs chronyd, chronyc and root (chronyd's -x keeps it off the host's clock)");
        return;
    }
    let d = tmp();
    let (_server, _client, sock) = chrony_pair(d.path());
    // A node told to read chrony where nothing answers refuses to start, in one line.
    let topo = small_tree_with(d.path(), 9760, &["--control-port", "9770"]);
    let t = topo.to_str().unwrap();
    refuses_where_nothing_answers(t, "chrony", &d.path().join("nobody.sock"));

    let common = |id: &str| -> Vec<String> {
        [
            "--topology",
            t,
            "--id",
            id,
            "--idle",
            "park",
            "--clock",
            "system",
            "--host-clock",
            "chrony",
            "--clock-bound-limit-ns",
            "1000000",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["--chrony-socket".to_string(), sock.display().to_string()])
        .collect()
    };
    // The client has not synchronized yet when the nodes start: chrony says so, and so do they.
    let first = tracking(&sock);
    let mut nodes: Vec<Daemon> = Vec::new();
    for (role, id) in
        [("receiver", "0"), ("receiver", "1"), ("receiver", "2"), ("receiver", "3"), ("proxy", "5"), ("proxy", "6")]
    {
        let child =
            Command::new(bin()).arg(role).args(common(id)).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        nodes.push(Daemon(child));
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut args = common("4");
    args.extend(["--rate", "1000", "--feed-seconds", "8"].iter().map(|s| s.to_string()));
    let sender =
        Command::new(bin()).arg("sender").args(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let _sender = Daemon(sender);
    // Wait for chrony to synchronize (iburst at 16 ms polls), then for reports to climb.
    let t0 = Instant::now();
    while !tracking(&sock).ends_with(",Normal") {
        assert!(t0.elapsed() < Duration::from_secs(20), "the test's chronyd never synchronized: {}", tracking(&sock));
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    let r = json(&fairfeed(&["stat", "127.1.0.1:9770"]));
    let b = r["node"]["clock"]["host_bound_ns"]
        .as_u64()
        .unwrap_or_else(|| panic!("receiver 0's host bound: {}", r["node"]["clock"]));
    assert!(b > 0 && b < 1_000_000, "chrony's bound for a loopback server is µs: {b} ns ({})", tracking(&sock));
    assert_eq!(r["node"]["clock"]["mode"], "system");
    let s = json(&fairfeed(&["stat", "127.1.0.5:9770"]));
    let covered = s["node"]["clock_bound_ns"].as_u64().unwrap();
    // The sender's deadline covers the largest bound its receivers report.
    assert!(covered > 0 && covered < 1_000_000, "sender: {}", s["node"]);
    // The fleet view shows the bound the receivers take from chrony.
    let fleet = json(&fairfeed(&["stat", "--topology", t, "--json"]));
    let shown = fleet["clock_bound_max_ns"].as_u64().unwrap_or_else(|| panic!("fleet: {fleet}"));
    assert!(shown > 0 && shown < 1_000_000, "fleet: {fleet}");
    eprintln!("chrony before: {first}; receiver 0's bound {b} ns; the sender covers {covered} ns; fleet {shown} ns");
}

/// Two network namespaces joined by a veth pair, each with a ptp4l on its
/// end (software time stamps): a grandmaster and a free-running slave
/// (`free_running 1`: it measures, never adjusts the host's clock). Torn
/// down when dropped.
struct PtpPair {
    ns: [String; 2],
    daemons: Vec<Daemon>,
    /// The slave's management socket.
    sock: std::path::PathBuf,
}

impl Drop for PtpPair {
    fn drop(&mut self) {
        self.daemons.clear();
        for ns in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn ip(args: &[&str]) {
    let ok = Command::new("ip").args(args).status().is_ok_and(|s| s.success());
    assert!(ok, "ip {args:?}");
}

fn ptp_pair(dir: &std::path::Path) -> PtpPair {
    let tag = std::process::id() % 100_000;
    let ns = [format!("ffptpa{tag}"), format!("ffptpb{tag}")];
    let ifs = [format!("ffpa{tag}"), format!("ffpb{tag}")];
    let mut pair = PtpPair { ns: ns.clone(), daemons: Vec::new(), sock: dir.join("ptpb.sock") };
    for n in &ns {
        ip(&["netns", "add", n]);
    }
    ip(&["link", "add", &ifs[0], "type", "veth", "peer", "name", &ifs[1]]);
    for (n, i) in ns.iter().zip(&ifs) {
        ip(&["link", "set", i, "netns", n]);
        ip(&["-n", n, "link", "set", i, "up"]);
    }
    for (k, (n, i)) in ns.iter().zip(&ifs).enumerate() {
        let name = if k == 0 { "ptpa" } else { "ptpb" };
        let role = if k == 0 { "priority1 1\n" } else { "slaveOnly 1\n" };
        let conf = dir.join(format!("{name}.conf"));
        std::fs::write(
            &conf,
            format!(
                "[global]\n{role}free_running 1\nlogSyncInterval -3\nuds_address {}\n",
                dir.join(format!("{name}.sock")).display()
            ),
        )
        .unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", n, "ptp4l", "-2", "-S", "-m", "-i", i, "-f"])
            .arg(&conf)
            .stdout(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("ptp4l");
        pair.daemons.push(Daemon(child));
    }
    pair
}

#[test]
fn clock_system_takes_ptp4ls_bound() {
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if !have_tool("ptp4l", &["-v"]) || !have_tool("pmc", &["-v"]) || !have_tool("ip", &["-V"]) || !is_root {
        eprintln!("SKIPPED: needs linuxptp (ptp4l, pmc), iproute2 and root (network namespaces)");
        return;
    }
    // Nobody steps the host's clock meanwhile: the slave only measures.
    let mut steps = fairfeed_io::clock::HostStepWatch::default();
    let _ = steps.observe(fairfeed_io::clock::realtime_minus_monotonic());
    let d = tmp();
    let pair = ptp_pair(d.path());
    let topo = small_tree_with(d.path(), 9860, &["--control-port", "9870"]);
    let t = topo.to_str().unwrap();
    // Where no ptp4l answers, a node told to read one refuses to start, in one line.
    refuses_where_nothing_answers(t, "ptp", &d.path().join("nobody.sock"));
    // The slave follows the grandmaster once the announce timeout has passed.
    let t0 = Instant::now();
    let status = loop {
        if let Ok(s) = fairfeed_io::hostclock::ptp_status(&pair.sock) {
            if s.bound_ns(fairfeed_io::clock::wall_ns()).is_some() {
                break s;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the test's ptp4l never followed its grandmaster");
        std::thread::sleep(Duration::from_millis(250));
    };
    let node = Command::new(bin())
        .args(["receiver", "--topology", t, "--id", "0", "--idle", "park", "--clock", "system"])
        .args(["--host-clock", "ptp", "--clock-bound-limit-ns", "1000000", "--seconds", "6", "--ptp-socket"])
        .arg(&pair.sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _node = Daemon(node);
    std::thread::sleep(Duration::from_secs(2));
    let r = json(&fairfeed(&["stat", "127.1.0.1:9870"]));
    let b = r["node"]["clock"]["host_bound_ns"]
        .as_u64()
        .unwrap_or_else(|| panic!("receiver 0's host bound: {}", r["node"]["clock"]));
    assert_eq!(r["node"]["clock"]["mode"], "system");
    // |offset| + mean path delay (and a second of age at most 1 ppm and the
    // rate offset), from what ptp4l said: µs over a veth pair.
    let floor = status.master_offset_ns.unsigned_abs() as f64 + status.mean_path_delay_ns;
    assert!(b > 0 && b < 1_000_000, "ptp4l's bound over a veth pair is µs: {b} ns ({status:?})");
    assert!(b as f64 >= floor * 0.5, "{b} ns against |offset| + delay {floor} ns a moment earlier ({status:?})");
    assert_eq!(steps.observe(fairfeed_io::clock::realtime_minus_monotonic()), None, "the host's clock was stepped");
    eprintln!("ptp4l: {status:?}; receiver 0's bound {b} ns");
}
