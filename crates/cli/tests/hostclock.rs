//! `--clock system` on a host disciplined by chrony: the node takes chrony's
//! own error estimate as its clock bound (issue 40, item 7). The test starts
//! two chronyd of its own on loopback — a server with a local reference and a
//! client that follows it with `-x` (it never touches the host's clock) —
//! and points the tree's nodes at the client's command socket.

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
    let bad = Command::new(bin())
        .args(["receiver", "--topology", t, "--id", "0", "--host-clock", "chrony", "--chrony-socket"])
        .arg(d.path().join("nobody.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("--host-clock chrony"), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("error")).count(), 1, "{err}");

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
