//! Goal: an exchange out of file descriptors keeps serving its sessions
//! without spinning on the connection it cannot accept, counts the
//! failures, and takes new clients again once descriptors are free.
//!
//! Method: in a process of its own (this test binary, one test), a logged-in
//! client, then the descriptor limit lowered and filled with `/dev/null`,
//! one left for a second client's connection and none for the exchange's
//! `accept`. The exchange thread's CPU is read from a `schedstat` opened
//! beforehand (`fairfeed_io::cpu::ThreadClock`: no descriptor is left later).

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use fairfeed_exchange::client;
use fairfeed_exchange::gateway::GatewayConfig;
use fairfeed_io::cpu::ThreadClock;
use fairfeed_net::exchange::live::{Exchange, ExchangeConfig, Idle, Pipeline};
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr};
use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The two users of the test's exchange.
const USERS: [(&str, &str); 2] = [("FDTEST1", "pw1"), ("FDTEST2", "pw2")];

/// Logs in as `user`; true once Login Accepted arrives.
fn logs_in(s: &mut TcpStream, user: (&str, &str)) -> bool {
    let mut out = Vec::new();
    client::login(user.0, user.1, 0, &mut out);
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    if s.write_all(&out).is_err() {
        return false;
    }
    let (mut buf, mut have) = (vec![0u8; 4_096], 0);
    while let Ok(n) = s.read(&mut buf[have..]) {
        if n == 0 {
            return false;
        }
        have += n;
        if let Ok(Some((p, _))) = split_packet(&buf[..have]) {
            return matches!(p, PacketRepr::LoginAccepted { .. });
        }
    }
    false
}

#[test]
fn out_of_descriptors_the_exchange_backs_off_serves_and_recovers() {
    let cfg = ExchangeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        pipeline: Pipeline::RunToCompletion,
        idle: Idle::Park,
        gateway: GatewayConfig {
            users: USERS.iter().map(|&(u, p)| (u.to_string(), p.to_string())).collect(),
            ..GatewayConfig::default()
        },
        ..ExchangeConfig::default()
    };
    let x = Exchange::start(cfg).unwrap();
    let clock = ThreadClock::wait("exchange", Duration::from_secs(5)).expect("the thread is named");
    let mut first = TcpStream::connect(x.addr).unwrap();
    assert!(logs_in(&mut first, USERS[0]), "a client logs in");
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    setrlimit(Resource::RLIMIT_NOFILE, (open + 8).min(hard), hard).unwrap();
    let mut filler: Vec<File> = Vec::new();
    while let Ok(f) = File::open("/dev/null") {
        filler.push(f);
    }
    filler.pop(); // one descriptor for the second client
    let mut second = TcpStream::connect(x.addr).expect("the kernel completes the handshake");
    // The exchange cannot accept it: it must leave the listener alone between tries.
    let cpu0 = clock.ns();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(600));
    let cpu = clock.ns() - cpu0;
    let elapsed = t0.elapsed();
    // Descriptors back: the waiting client is taken and logs in.
    drop(filler);
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    let second_in = logs_in(&mut second, USERS[1]);
    let r = x.finish();
    let errors = r.gateway.accept_errors;
    assert!(cpu < 200_000_000, "the exchange thread used {cpu} ns of CPU in {elapsed:?} (spinning)");
    assert!((2..=40).contains(&errors), "{errors} failed accepts in {elapsed:?}");
    assert!(second_in, "the waiting client is served once descriptors are free");
    assert_eq!(r.gateway.logins, 2, "{:?}", r.gateway);
}
