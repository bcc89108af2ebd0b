//! Goal: the TC egress replicator turns each data packet the node sends to
//! its first target into one intact copy per target, with valid IPv4 and UDP
//! checksums, and leaves every other packet alone.
//! Method: a veth pair between two network namespaces made by the test; the
//! program on the sending end's egress; eight sockets at the other end; the
//! receiving kernel's own checks (IPv4 header checksum always; the UDP
//! checksum when the sender computes it in software, with transmit
//! checksum offload turned off by ethtool) and its UDP error counters. Needs
//! root: skipped loudly without it, a failure when FAIRFEED_REQUIRE_NETNS=1;
//! a binary built without clang, or no ethtool, fails when
//! FAIRFEED_REQUIRE_TOOLS=1.

use std::net::{SocketAddrV4, UdpSocket};
use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use fairfeed_wire::overlay::{HeaderRepr, Kind, HEADER_LEN};
use fairfeed_xdp::netns::{self, Link};
use fairfeed_xdp::{ReplicateCounters, TcReplicator};

mod common;
use common::{require, setup, udp_errors};

const SPORT: u16 = 46_200;
const SINK_PORT: u16 = 46_300;
const SINKS: u16 = 8;

fn packet(kind: Kind, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN + 100];
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seq as u8);
    }
    let h = HeaderRepr { kind: Some(kind), sequence: seq, payload_len: 100, ..HeaderRepr::default() };
    h.emit(&mut b).unwrap();
    b
}

/// Sends `datagrams` (bytes, source port) to the first sink from the first
/// end, with the replicator attached there; returns what each sink read and
/// the counters, after checking that the receiving kernel saw no bad checksum.
fn run(link: &Link, datagrams: Vec<(Vec<u8>, u16)>, software_csum: bool) -> (Vec<Vec<Vec<u8>>>, ReplicateCounters) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let rl = link.clone();
    let sinks = thread::spawn(move || {
        netns::enter(&rl.ns[1]).unwrap();
        let socks: Vec<UdpSocket> = (0..SINKS)
            .map(|i| {
                let s = UdpSocket::bind(SocketAddrV4::new(rl.addrs[1], SINK_PORT + i)).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                s
            })
            .collect();
        let before = udp_errors();
        ready_tx.send(()).unwrap();
        done_rx.recv().unwrap();
        let mut got = Vec::new();
        for s in &socks {
            let (mut v, mut buf) = (Vec::new(), vec![0u8; 2048]);
            while let Ok(n) = s.recv(&mut buf) {
                v.push(buf[..n].to_vec());
            }
            got.push(v);
        }
        let after = udp_errors();
        assert_eq!(before, after, "the receiving kernel counted UDP checksum or input errors");
        got
    });
    ready_rx.recv().unwrap();
    let sl = link.clone();
    let counters = thread::spawn(move || {
        netns::enter(&sl.ns[0]).unwrap();
        if software_csum {
            let ok = Command::new("ethtool")
                .args(["-K", &sl.ifaces[0], "tx", "off"])
                .output()
                .is_ok_and(|o| o.status.success());
            assert!(ok, "ethtool -K {} tx off", sl.ifaces[0]);
        }
        let targets: Vec<SocketAddrV4> = (0..SINKS).map(|i| SocketAddrV4::new(sl.addrs[1], SINK_PORT + i)).collect();
        let rep = TcReplicator::attach(&sl.ifaces[0], SPORT, &targets, None).expect("attach the replicator");
        let main = UdpSocket::bind(SocketAddrV4::new(sl.addrs[0], SPORT)).unwrap();
        let other = UdpSocket::bind(SocketAddrV4::new(sl.addrs[0], SPORT + 1)).unwrap();
        for (i, (b, sport)) in datagrams.iter().enumerate() {
            let s = if *sport == SPORT { &main } else { &other };
            s.send_to(b, targets[0]).unwrap();
            if i % 16 == 15 {
                thread::sleep(Duration::from_millis(2)); // 8 copies each: far below any queue limit
            }
        }
        thread::sleep(Duration::from_millis(100));
        rep.counters().unwrap()
    })
    .join()
    .unwrap();
    done_tx.send(()).unwrap();
    (sinks.join().unwrap(), counters)
}

fn check(software_csum: bool) {
    let Some(v) = setup() else { return };
    if software_csum && Command::new("ethtool").arg("--version").output().is_err() {
        assert!(!require("FAIRFEED_REQUIRE_TOOLS"), "ethtool not found and FAIRFEED_REQUIRE_TOOLS=1");
        eprintln!("SKIPPED: ethtool not found (Debian: apt-get install ethtool)");
        return;
    }
    let mut dg = Vec::new();
    for s in 1..=120u64 {
        dg.push((packet(Kind::Data, s), SPORT));
        if s % 20 == 0 {
            dg.push((packet(Kind::Report, s), SPORT)); // goes up the tree: never replicated
            dg.push((packet(Kind::Data, 1_000 + s), SPORT + 1)); // another socket's: left alone
        }
    }
    let (got, c) = run(v.link(), dg, software_csum);
    let data: Vec<Vec<u8>> = (1..=120u64).map(|s| packet(Kind::Data, s)).collect();
    for (i, sink) in got.iter().enumerate() {
        let mine: Vec<&Vec<u8>> = sink
            .iter()
            .filter(|b| {
                let h = HeaderRepr::parse(b).unwrap().0;
                h.kind == Some(Kind::Data) && h.sequence <= 120
            })
            .collect();
        let want: Vec<&Vec<u8>> = data.iter().collect();
        assert_eq!(mine.len(), 120, "sink {i}: {} data packets", mine.len());
        assert_eq!(mine, want, "sink {i}: every copy intact and in order");
        let extra = sink.len() - mine.len();
        assert_eq!(
            extra,
            if i == 0 { 12 } else { 0 },
            "sink {i}: reports and other sockets' packets only at the first"
        );
    }
    assert_eq!(c, ReplicateCounters { packets: 120, copies: 120 * 7, failed: 0, passed: c.passed }, "{c:?}");
    assert!(c.passed >= 12, "{c:?}");
}

#[test]
fn one_datagram_leaves_as_one_intact_copy_per_target() {
    check(false);
}

#[test]
fn copies_carry_valid_checksums_when_the_sender_computes_them() {
    check(true);
}

#[test]
fn the_target_list_is_checked() {
    let Some(v) = setup() else { return };
    let l = v.link().clone();
    let errs = thread::spawn(move || {
        netns::enter(&l.ns[0]).unwrap();
        let t = SocketAddrV4::new(l.addrs[1], 1);
        let many: Vec<SocketAddrV4> = (0..65).map(|i| SocketAddrV4::new(l.addrs[1], 1000 + i)).collect();
        [
            TcReplicator::attach(&l.ifaces[0], SPORT, &[], None).unwrap_err().to_string(),
            TcReplicator::attach(&l.ifaces[0], SPORT, &many, None).unwrap_err().to_string(),
            TcReplicator::attach(&l.ifaces[0], SPORT, &[t, t], None).unwrap_err().to_string(),
            TcReplicator::attach("ffx-missing0", SPORT, &[t], None).unwrap_err().to_string(),
        ]
    })
    .join()
    .unwrap();
    assert!(errs[0].contains("1 to 64 targets"), "{}", errs[0]);
    assert!(errs[1].contains("not 65"), "{}", errs[1]);
    assert!(errs[2].contains("distinct"), "{}", errs[2]);
    assert!(errs[3].contains("ffx-missing0"), "{}", errs[3]);
}
