//! Goal: the metrics endpoint, out of file descriptors, neither spins on the
//! connection it cannot accept nor hangs when it is dropped.
//!
//! Method: in a process of its own (this test binary, one test), lower the
//! descriptor limit, fill it with `/dev/null`, free one for a client's
//! connection and leave none for the endpoint's `accept`. The endpoint's
//! thread must count the failures, use little CPU while they last, and
//! drop within a second or so.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairfeed_ops::http::{serve, Handler, Limits};
use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The `stat` file of this process's thread named `name`, opened now (there
/// will be no descriptor to open it with later).
/// (A new thread names itself once it runs: looked for again until then.)
fn thread_stat(name: &str) -> File {
    let t0 = Instant::now();
    loop {
        let found = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
            .and_then(|t| File::open(t.path().join("stat")).ok());
        match found {
            Some(f) => return f,
            None if t0.elapsed() < Duration::from_secs(5) => std::thread::sleep(Duration::from_millis(10)),
            None => panic!("no thread named {name}"),
        }
    }
}

/// The CPU time (ns) a thread's `stat` file reports now.
fn cpu_ns(stat: &File) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 1_024];
    let n = stat.read_at(&mut buf, 0).unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) * (1_000_000_000 / 100)
    // USER_HZ ticks
}

#[test]
fn out_of_descriptors_the_endpoint_backs_off_and_still_drops() {
    let handler: Handler = Arc::new(|_| Some((200, "text/plain", "up\n".to_string())));
    let ep = serve("127.0.0.1:0".parse().unwrap(), Limits::default(), handler).unwrap();
    let (stats, addr) = (ep.stats.clone(), ep.addr);
    let stat = thread_stat("metrics-http");
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    // Room for a few more descriptors than are open now, then fill it.
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    setrlimit(Resource::RLIMIT_NOFILE, (open + 8).min(hard), hard).unwrap();
    let mut filler: Vec<File> = Vec::new();
    while let Ok(f) = File::open("/dev/null") {
        filler.push(f);
    }
    assert!(!filler.is_empty(), "the limit was reached");
    filler.pop(); // one descriptor for the client
    let client = std::net::TcpStream::connect(addr).expect("the kernel completes the handshake");
    // The endpoint now cannot accept it: it must wait between tries, not spin.
    let cpu0 = cpu_ns(&stat);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(600));
    let cpu = cpu_ns(&stat) - cpu0;
    let errors = stats.accept_errors.load(Ordering::Relaxed);
    let elapsed = t0.elapsed();
    // Dropped while it still has no descriptor (its wake-up connection fails too).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(ep);
        let _ = tx.send(());
    });
    let dropped = rx.recv_timeout(Duration::from_secs(3));
    drop((client, filler));
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    assert!(errors >= 2, "accept failures are counted: {errors}");
    assert!(errors <= 40, "{errors} tries in {elapsed:?}: retrying at once");
    assert!(cpu < 200_000_000, "the endpoint's thread used {cpu} ns of CPU in {elapsed:?}");
    assert!(dropped.is_ok(), "dropping the endpoint hung");
}
