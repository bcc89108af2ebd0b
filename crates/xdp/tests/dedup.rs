//! Goal: the XDP de-duplicator drops exactly the extra copies of each
//! message in veth's driver, never a genuine copy because of a forged one,
//! and leaves everything else alone.
//! Method: a veth pair between two network namespaces made by the test; the
//! program attached natively to the receiving end; datagrams sent from the
//! other end; what the receiving socket reads compared with what was sent,
//! and with the program's counters. Needs root: skipped loudly without it, a
//! failure when FAIRFEED_REQUIRE_NETNS=1 (scripts/test.sh sets it as root);
//! a binary built without clang is a failure when FAIRFEED_REQUIRE_TOOLS=1.

use std::collections::BTreeMap;
use std::net::{SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use fairfeed_tree::auth::Auth;
use fairfeed_tree::dedup::{Dedup, Seen};
use fairfeed_wire::overlay::{HeaderRepr, Kind, HEADER_LEN};
use fairfeed_xdp::netns::{self, Link};
use fairfeed_xdp::{DedupCounters, Mode, XdpDedup};

mod common;
use common::setup;

const PORT: u16 = 46_100;
const OTHER_PORT: u16 = 46_101;

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn packet(seq: u64, hop: u8, auth: Option<&Auth>) -> Vec<u8> {
    let mut b = vec![0x42; HEADER_LEN + 60];
    let h = HeaderRepr {
        kind: Some(Kind::Data),
        sequence: seq,
        send_ns: now_ns(),
        payload_len: 60,
        ..HeaderRepr::default()
    };
    h.emit(&mut b).unwrap();
    if let Some(a) = auth {
        a.seal(&mut b);
    }
    b[6] = hop; // proxies bump the hop count; the tag leaves it out
    b
}

/// Sends `datagrams` (bytes, destination port) from the link's first end to
/// its second, where the program watches `PORT`; returns what sockets on
/// `PORT` and `OTHER_PORT` read, in order, and the program's counters.
fn exchange(link: &Link, datagrams: Vec<(Vec<u8>, u16)>) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, DedupCounters, Mode) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let (rl, rdone) = (link.clone(), done.clone());
    let receiver = thread::spawn(move || {
        netns::enter(&rl.ns[1]).unwrap();
        let prog = XdpDedup::attach(&rl.ifaces[1], PORT, Some(Mode::Native)).expect("attach natively on veth");
        let socks: Vec<UdpSocket> = [PORT, OTHER_PORT]
            .iter()
            .map(|&p| {
                let s = UdpSocket::bind(SocketAddrV4::new(rl.addrs[1], p)).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect();
        ready_tx.send(()).unwrap();
        // Read as they come (a socket's buffer holds a few hundred), until
        // the sender is done and both sockets have been quiet for 300 ms.
        let (mut got, mut buf) = (vec![Vec::new(), Vec::new()], vec![0u8; 65_536]);
        let mut quiet = 0;
        while quiet < 300 {
            let mut any = false;
            for (s, v) in socks.iter().zip(&mut got) {
                while let Ok(n) = s.recv(&mut buf) {
                    v.push(buf[..n].to_vec());
                    any = true;
                }
            }
            if any || !rdone.load(Ordering::Acquire) {
                quiet = 0;
            } else {
                quiet += 1;
            }
            thread::sleep(Duration::from_millis(1));
        }
        let c = prog.counters().unwrap();
        (got, c, prog.mode())
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).expect("receiver ready");
    let sl = link.clone();
    thread::spawn(move || {
        netns::enter(&sl.ns[0]).unwrap();
        let s = UdpSocket::bind(SocketAddrV4::new(sl.addrs[0], 0)).unwrap();
        for (i, (b, port)) in datagrams.iter().enumerate() {
            s.send_to(b, SocketAddrV4::new(sl.addrs[1], *port)).unwrap();
            if i % 32 == 31 {
                thread::sleep(Duration::from_millis(2)); // stay far below any queue limit
            }
        }
    })
    .join()
    .unwrap();
    done.store(true, Ordering::Release);
    let (mut got, c, mode) = receiver.join().unwrap();
    let other = got.pop().unwrap();
    (got.pop().unwrap(), other, c, mode)
}

fn seq_of(b: &[u8]) -> u64 {
    HeaderRepr::parse(b).unwrap().0.sequence
}

#[test]
fn only_the_first_copy_of_each_message_reaches_the_socket() {
    let Some(v) = setup() else { return };
    let auth = Auth::new([7; 32]);
    // Three copies of 600 messages, as hedges arrive: the second and third
    // copies trail by 4 and 8 messages, each with its own hop count.
    let n = 600u64;
    let pk: Vec<Vec<u8>> = (1..=n).map(|s| packet(s, 1, Some(&auth))).collect();
    let mut dg = Vec::new();
    for step in 0..n + 8 {
        for k in 0..3u64 {
            if let Some(m) = step.checked_sub(4 * k).filter(|&m| m < n) {
                let mut b = pk[m as usize].clone();
                b[6] = 1 + k as u8;
                dg.push((b, PORT));
            }
        }
    }
    let (got, _, c, mode) = exchange(v.link(), dg);
    assert_eq!(mode, Mode::Native);
    let seqs: Vec<u64> = got.iter().map(|b| seq_of(b)).collect();
    assert_eq!(seqs, (1..=n).collect::<Vec<_>>(), "each message once, first copies, in order");
    assert!(got.iter().all(|b| b[6] == 1), "the copy kept is the first to arrive");
    assert_eq!((c.data, c.first, c.duplicate), (3 * n, n, 2 * n), "{c:?}");
    assert_eq!((c.tag_differs, c.too_old, c.unparsed), (0, 0, 0), "{c:?}");
}

#[test]
fn a_forged_copy_never_suppresses_the_genuine_one() {
    let Some(v) = setup() else { return };
    let auth = Auth::new([9; 32]);
    let forger = Auth::new([10; 32]); // a key that is not the tree's
    let mut dg = Vec::new();
    for s in 1..=400u64 {
        let genuine = packet(s, 1, Some(&auth));
        let mut forged = packet(s, 1, Some(&forger));
        forged[HEADER_LEN..HEADER_LEN + 60].fill(0x66); // what the forger wants delivered
        if s <= 200 {
            // The forgery arrives first, then two genuine copies.
            dg.extend([(forged, PORT), (genuine.clone(), PORT), (genuine, PORT)]);
        } else {
            // Genuine, forgery, genuine.
            dg.extend([(genuine.clone(), PORT), (forged, PORT), (genuine, PORT)]);
        }
    }
    let (got, _, c, _) = exchange(v.link(), dg);
    // The receiver's own checks: tag, then the duplicate window.
    let (mut dedup, mut delivered, mut refused) = (Dedup::default(), BTreeMap::new(), 0);
    for b in &got {
        match auth.open(b, now_ns()) {
            Ok(_) => {
                if dedup.check(seq_of(b)) == Seen::New {
                    *delivered.entry(seq_of(b)).or_insert(0) += 1;
                    assert!(b[HEADER_LEN..HEADER_LEN + 60].iter().all(|&x| x == 0x42), "genuine payload");
                }
            }
            Err(_) => refused += 1,
        }
    }
    assert_eq!(delivered.len(), 400, "every genuine message delivered");
    assert!(delivered.values().all(|&k| k == 1));
    assert_eq!(refused, 400, "every forgery reached user space and was refused there");
    // First-forged: forgery passes, genuine differs (passes, replaces it), genuine repeat dropped.
    // Genuine-first: genuine passes, forgery differs (passes, replaces), genuine differs again (passes).
    assert_eq!(c.tag_differs, 200 + 400, "{c:?}");
    assert_eq!(c.duplicate, 200, "{c:?}");
    assert_eq!(got.len(), 400 * 3 - 200);
}

#[test]
fn traffic_it_does_not_own_passes_untouched() {
    let Some(v) = setup() else { return };
    let auth = Auth::new([3; 32]);
    let mut dg = Vec::new();
    // Identical overlay copies to another port: not ours, all delivered.
    let p = packet(77, 1, Some(&auth));
    dg.extend([(p.clone(), OTHER_PORT), (p.clone(), OTHER_PORT), (p, OTHER_PORT)]);
    // Garbage to our port, three times: not an overlay packet, all passed.
    for _ in 0..3 {
        dg.push((b"not an overlay packet at all, but long enough to look at".to_vec(), PORT));
    }
    // A cut-short overlay packet: passed (user space counts it).
    dg.push((packet(5, 1, Some(&auth))[..30].to_vec(), PORT));
    // Unauthenticated packets de-duplicate on the sequence number alone.
    let u = packet(1_000, 1, None);
    dg.extend([(u.clone(), PORT), (u.clone(), PORT), (u, PORT)]);
    // Reordered past the ring: sequence s after s + SLOTS (same slot) is passed, counted.
    let (old, new) = (packet(2_000, 1, Some(&auth)), packet(2_000 + fairfeed_xdp::SLOTS, 1, Some(&auth)));
    dg.extend([(new, PORT), (old.clone(), PORT), (old, PORT)]);
    let (got, other, c, _) = exchange(v.link(), dg);
    assert_eq!(other.len(), 3, "another port's copies all arrive");
    assert_eq!(got.len(), 3 + 1 + 1 + 3, "{c:?}");
    assert_eq!(c.unparsed, 4, "{c:?}");
    assert_eq!(c.too_old, 2, "{c:?}");
    assert_eq!(c.duplicate, 2, "the unauthenticated repeats: {c:?}");
    assert!(c.other >= 3, "{c:?}");
}

#[test]
fn attaching_to_a_missing_interface_says_so() {
    let Some(v) = setup() else { return };
    let ns = v.link().ns[1].clone();
    let e = thread::spawn(move || {
        netns::enter(&ns).unwrap();
        XdpDedup::attach("ffx-missing0", PORT, None).unwrap_err().to_string()
    })
    .join()
    .unwrap();
    assert!(e.contains("ffx-missing0") && e.contains("no network interface"), "{e}");
}
