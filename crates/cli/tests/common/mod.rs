//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `fairfeed` binary cargo built for these tests.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_fairfeed")
}

/// Runs `fairfeed` with `args`; panics with its stderr unless it succeeds.
pub fn fairfeed(args: &[&str]) -> Output {
    let out = Command::new(bin()).args(args).output().expect("spawn fairfeed");
    assert!(out.status.success(), "fairfeed {args:?} failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    out
}

/// Parses stdout as one JSON value.
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// The real NASDAQ captures: `FAIRFEED_ITCH_REAL` (scripts/test.sh sets it),
/// else `../shared/data/itch50-real` beside the checkout. Their absence is a
/// loud failure, never a silent pass.
pub fn real_data_dir() -> PathBuf {
    let d = match std::env::var_os("FAIRFEED_ITCH_REAL") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/itch50-real"),
    };
    assert!(
        d.is_dir(),
        "REAL DATA MISSING: {} not found; fetch the captures with scripts/get-real-captures.sh DIR and set FAIRFEED_ITCH_REAL=DIR",
        d.display()
    );
    d
}

/// True if `tool --version`-style probing succeeds. When FAIRFEED_REQUIRE_TOOLS=1
/// (the README test command sets it) a missing tool fails the test; otherwise the
/// test says loudly that it is skipped.
pub fn have_tool(cmd: &str, args: &[&str]) -> bool {
    let ok = Command::new(cmd).args(args).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = format!("external tool `{cmd} {}` is not available", args.join(" "));
        if std::env::var("FAIRFEED_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!("{msg} (FAIRFEED_REQUIRE_TOOLS=1): run scripts/test.sh to install it");
        }
        eprintln!("SKIPPED: {msg}; run scripts/test.sh to install it");
    }
    ok
}

/// A temporary directory for one test's files.
pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Every `.pcap` in the real-data directory, sorted.
pub fn real_captures() -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(real_data_dir())
        .expect("read real data dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    assert!(v.len() >= 40, "expected the full set of real captures, found {}", v.len());
    v
}
pub mod cluster;

/// Plans the small tree several tests run as processes — 4 receivers, two
/// proxies, hedging 1, node N at 127.1.0.(N + 1):`port` — into `dir`/tree.toml.
pub fn small_tree(dir: &Path, port: u16) -> PathBuf {
    small_tree_with(dir, port, &[])
}

/// [`small_tree`] with more `plan` flags (e.g. `--control-port P`).
pub fn small_tree_with(dir: &Path, port: u16, extra: &[&str]) -> PathBuf {
    let topo = dir.join("tree.toml");
    let p = port.to_string();
    let mut args = vec!["plan", "--receivers", "4", "--fanout", "2", "--hedge", "1", "--loopback-port", &p];
    args.extend_from_slice(extra);
    args.extend(["--out", topo.to_str().unwrap()]);
    fairfeed(&args);
    topo
}

/// Every datagram arriving at `sock` until `stop` (what an application
/// listening there would read).
pub fn collect_datagrams(
    sock: std::net::UdpSocket,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<Vec<u8>>> {
    std::thread::spawn(move || {
        sock.set_read_timeout(Some(std::time::Duration::from_millis(50))).unwrap();
        let mut buf = [0u8; 2048];
        let mut got = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok(n) = sock.recv(&mut buf) {
                got.push(buf[..n].to_vec());
            }
        }
        got
    })
}

pub fn delivery_socket() -> (std::net::UdpSocket, String) {
    let s = fairfeed_io::socket::bind_udp("127.0.0.1:0".parse().unwrap(), 8 << 20).unwrap();
    s.set_nonblocking(false).unwrap();
    let a = s.local_addr().unwrap().to_string();
    (s, a)
}

/// An application's books from what it received, and the first and last
/// sequence numbers of its line (asserting there is no gap and no repeat).
pub fn app_books(packets: &[Vec<u8>]) -> (fairfeed_feed::book::Books, u64, u64) {
    let mut b = fairfeed_feed::book::Books::new();
    let (mut first, mut next) = (None, None);
    for p in packets {
        let p = fairfeed_wire::moldudp64::Packet::new_checked(&p[..]).expect("a MoldUDP64 packet");
        if p.message_count() == 0 {
            continue;
        }
        if let Some(n) = next {
            assert_eq!(p.sequence(), n, "the application's line has a gap or a repeat");
        }
        first.get_or_insert(p.sequence());
        next = Some(p.next_sequence());
        for m in p.messages() {
            b.apply(m.unwrap()).unwrap_or_else(|e| panic!("the application's books refuse a message: {e}"));
        }
    }
    (b, first.unwrap_or(0), next.unwrap_or(0))
}

/// A free loopback port (TCP or UDP) that no other caller in this test
/// process has been handed. The kernel's "bind port 0" answer is free only
/// until it is dropped: asked twice before the first child process binds its
/// port, it may give the same port again, and the second child then fails to
/// bind while a scrape of "its" port reaches the first (CI, stop 56).
pub fn free_port(tcp: bool) -> u16 {
    use std::sync::Mutex;
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1_000 {
        let port = if tcp {
            std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
        } else {
            std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
        };
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
    panic!("no fresh loopback port after 1,000 tries");
}

/// [`free_port`] as `127.0.0.1:PORT`.
pub fn free_addr(tcp: bool) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port(tcp)))
}
