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

use fairfeed_io::cpu::ThreadClock;
use fairfeed_ops::http::{serve, Handler, Limits};
use nix::sys::resource::{getrlimit, setrlimit, Resource};

#[test]
fn out_of_descriptors_the_endpoint_backs_off_and_still_drops() {
    let handler: Handler = Arc::new(|_| Some((200, "text/plain", "up\n".to_string())));
    let ep = serve("127.0.0.1:0".parse().unwrap(), Limits::default(), handler).unwrap();
    let (stats, addr) = (ep.stats.clone(), ep.addr);
    let clock = ThreadClock::wait("metrics-http", Duration::from_secs(5)).expect("the thread is named");
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
    let cpu0 = clock.ns();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(600));
    let cpu = clock.ns() - cpu0;
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
