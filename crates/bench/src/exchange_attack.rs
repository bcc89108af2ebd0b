//! Hostile clients for `fairfeed exchange bench --attack KIND`: each runs on
//! a thread of its own beside the well-behaved load, paced (so that what it
//! costs the others is the exchange's doing, not a stolen core), and counts
//! what it managed.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fairfeed_exchange::client;
use serde::Serialize;

/// Connections the idle-connections attack holds at most.
pub const IDLE_CONNECTIONS: usize = 300;
/// Orders per second the slow reader sends (and never reads the answers to).
pub const SLOW_READER_RATE: u64 = 2_000;
/// Login attempts per second of the guesser.
pub const GUESSES_PER_S: u64 = 1_000;
/// Garbage connections per second (64 KiB of random bytes each).
pub const GARBAGE_PER_S: u64 = 200;

/// What a hostile client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Attack {
    /// 300 connections from 75 loopback addresses that never log in and
    /// drip one byte a second each (the slot-exhaustion attack).
    IdleConnections,
    /// A logged-in client that sends 2,000 orders/s and never reads.
    SlowReader,
    /// 1,000 logins a second with a wrong password, from one address.
    LoginGuessing,
    /// 200 connections a second, each sending 64 KiB of random bytes.
    Garbage,
    /// A control, not an attack: no traffic at all, a thread that keeps a
    /// CPU busy [`CONTROL_BURN`] at a time, [`GARBAGE_PER_S`] times a second —
    /// about what the garbage attacker's own thread takes — to tell an
    /// attacker's cost to the others on a shared host from what the
    /// exchange's handling of it costs.
    CpuControl,
}

/// How long the control keeps a CPU busy each time (the garbage attacker's
/// thread took ≈ 5 % of a vCPU while on, 200 calls a second: 250 µs each).
pub const CONTROL_BURN: Duration = Duration::from_micros(250);

/// What the attacker managed.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct AttackStats {
    /// Connections it opened.
    pub connections: u64,
    /// Connections the exchange refused or closed on it.
    pub closed_on_it: u64,
    pub bytes_sent: u64,
}

/// When the attacker runs: until `stop`, and only while `active` (the bench
/// turns it on and off in phases to compare the load with and without it
/// under the same conditions; always on otherwise).
#[derive(Clone)]
pub struct Switch {
    pub stop: Arc<AtomicBool>,
    pub active: Arc<AtomicBool>,
}

impl Switch {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn on(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }
}

/// Runs `kind` against `addr` until `stop`; `user` is a real account (the slow reader logs in with it).
pub fn spawn(
    kind: Attack,
    addr: SocketAddr,
    user: (String, String),
    symbol: String,
    sw: Switch,
) -> thread::JoinHandle<AttackStats> {
    let run = move || {
        let mut st = AttackStats::default();
        match kind {
            Attack::IdleConnections => idle_connections(addr, &sw, &mut st),
            Attack::SlowReader => slow_reader(addr, &user, &symbol, &sw, &mut st),
            Attack::LoginGuessing => paced(GUESSES_PER_S, &sw, || guess(addr, &user.0, &mut st)),
            Attack::Garbage => {
                let mut x = 0x9E37_79B9_7F4A_7C15u64;
                paced(GARBAGE_PER_S, &sw, || garbage(addr, &mut x, &mut st));
            }
            Attack::CpuControl => paced(GARBAGE_PER_S, &sw, || {
                let t = Instant::now();
                while t.elapsed() < CONTROL_BURN {
                    std::hint::spin_loop();
                }
            }),
        }
        st
    };
    thread::Builder::new().name(ATTACKER_THREAD.into()).spawn(run).expect("spawn the attacker's thread")
}

/// The attacker's thread is named this (the bench reads its CPU time by name).
pub const ATTACKER_THREAD: &str = "ff-attacker";

/// Calls `f` `per_s` times a second until `stop`, skipping the calls that
/// fall while the switch is off.
fn paced(per_s: u64, sw: &Switch, mut f: impl FnMut()) {
    let gap = Duration::from_nanos(1_000_000_000 / per_s.max(1));
    let mut next = Instant::now();
    while !sw.stopped() {
        if sw.on() {
            f();
        }
        next += gap;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            thread::sleep(d);
        }
    }
}

fn connect_from(ip: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::V4(SocketAddrV4::new(ip, 0)).into())?;
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    s.connect_timeout(&to.into(), Duration::from_millis(500))?;
    Ok(s.into())
}

fn idle_connections(addr: SocketAddr, sw: &Switch, st: &mut AttackStats) {
    // The bytes of a valid login request, one a second: never complete, never wrong.
    let mut login = Vec::new();
    client::login("NOBODY", "x", 0, &mut login);
    let mut at = 0usize;
    let mut socks: Vec<Option<TcpStream>> = Vec::new();
    let (mut next_drip, mut opened) = (Instant::now(), false);
    while !sw.stopped() {
        if !sw.on() {
            // Off: every connection closed; on again: all opened anew.
            socks.clear();
            opened = false;
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        if !std::mem::replace(&mut opened, true) {
            for k in 0..IDLE_CONNECTIONS {
                let ip = Ipv4Addr::new(127, 0, 2, (k / 4 + 1) as u8);
                if let Ok(s) = connect_from(ip, addr) {
                    let _ = s.set_nonblocking(true);
                    st.connections += 1;
                    socks.push(Some(s));
                }
            }
        }
        if Instant::now() < next_drip {
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        next_drip = Instant::now() + Duration::from_secs(1);
        for slot in &mut socks {
            let Some(s) = slot else { continue };
            // One byte of a login request that never completes.
            match s.write(&login[at % login.len()..at % login.len() + 1]) {
                Ok(n) => st.bytes_sent += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    st.closed_on_it += 1;
                    *slot = None;
                }
            }
        }
        at += 1;
    }
}

fn slow_reader(addr: SocketAddr, user: &(String, String), symbol: &str, sw: &Switch, st: &mut AttackStats) {
    let Ok(mut s) = TcpStream::connect(addr) else { return };
    st.connections += 1;
    // A tiny receive buffer, never read: the exchange's output to it piles up.
    let _ = socket2::SockRef::from(&s).set_recv_buffer_size(4096);
    let mut out = Vec::new();
    client::login(&user.0, &user.1, 0, &mut out);
    if s.write_all(&out).is_err() {
        return;
    }
    let mut token = 0u32;
    paced(SLOW_READER_RATE / 100, sw, || {
        out.clear();
        for _ in 0..100 {
            token += 1;
            let o = client::Order {
                token,
                side: if token % 2 == 0 { b'B' } else { b'S' },
                qty: 100,
                symbol,
                // Far from the market: rests, never trades with the well-behaved load.
                price: if token % 2 == 0 { 10_000 } else { 100_000_000 },
                ioc: false,
                hidden: false,
                stamp: None,
                clock: None,
                min_qty: 0,
            };
            client::enter_order(&o, &mut out);
        }
        match s.write_all(&out) {
            Ok(()) => st.bytes_sent += out.len() as u64,
            Err(_) => {
                st.closed_on_it += 1;
                // Closed on it: it comes back and does it again.
                if let Ok(n) = TcpStream::connect(addr) {
                    let _ = socket2::SockRef::from(&n).set_recv_buffer_size(4096);
                    s = n;
                    st.connections += 1;
                    out.clear();
                    client::login(&user.0, &user.1, 0, &mut out);
                    let _ = s.write_all(&out);
                }
            }
        }
    });
}

fn guess(addr: SocketAddr, user: &str, st: &mut AttackStats) {
    let Ok(mut s) = connect_from(Ipv4Addr::new(127, 0, 3, 1), addr) else {
        st.closed_on_it += 1;
        return;
    };
    st.connections += 1;
    let mut out = Vec::new();
    client::login(user, "wrong", 0, &mut out);
    if s.write_all(&out).is_ok() {
        st.bytes_sent += out.len() as u64;
    }
    let mut b = [0u8; 64];
    if !matches!(s.read(&mut b), Ok(n) if n > 0) {
        st.closed_on_it += 1;
    }
}

fn garbage(addr: SocketAddr, x: &mut u64, st: &mut AttackStats) {
    let Ok(mut s) = connect_from(Ipv4Addr::new(127, 0, 4, 1), addr) else {
        st.closed_on_it += 1;
        return;
    };
    st.connections += 1;
    let mut buf = vec![0u8; 64 << 10];
    for b in buf.iter_mut() {
        // xorshift: cheap bytes that are not a SoupBinTCP stream.
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *b = *x as u8;
    }
    match s.write_all(&buf) {
        Ok(()) => st.bytes_sent += buf.len() as u64,
        Err(_) => st.closed_on_it += 1,
    }
}
