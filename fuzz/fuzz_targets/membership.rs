//! Fuzz target: arbitrary bytes as a controller's life — datagrams from
//! any address (registrations, heartbeats, leaves, junk, each sealed or
//! not), and the passing of time, in any order. Nothing may panic, and
//! whatever happened, the tree the controller runs is one the planner's
//! checks accept and every member's record agrees with its parent's.
#![no_main]
use std::net::SocketAddr;

use fairfeed_tree::controller::{Controller, ControllerConfig, MemberClient, MemberConfig};
use fairfeed_tree::membership::{MemberRole, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cfg = ControllerConfig { fanout: 3, hedge: 1, proxy_layers: 2, ..ControllerConfig::default() };
    let mut c = Controller::new(cfg, None).expect("a valid config");
    let mut now = 1_000_000_000u64;
    for chunk in data.chunks(6) {
        let [op, a, b, d, ..] = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0), *chunk.get(3).unwrap_or(&0), 0];
        now += u64::from(d) * 1_000_000;
        let from = SocketAddr::from(([127, 0, a % 8, b % 8], 9000));
        match op % 4 {
            0 => {
                // A well-formed client's datagram (register or heartbeat, as it is due).
                let role = [MemberRole::Sender, MemberRole::Proxy, MemberRole::Receiver][usize::from(a % 3)];
                let mut cl = MemberClient::new(
                    MemberConfig {
                        role,
                        want_id: u32::from(b % 16),
                        capacity: u16::from(d % 4),
                        advertise: None,
                        incarnation: u64::from(a),
                        heartbeat_ns: 10_000_000,
                        register_retry_ns: 10_000_000,
                    },
                    None,
                );
                cl.handle_timeout(now);
                while let Some(p) = cl.poll_transmit() {
                    c.handle_packet(now, from, &p);
                }
            }
            1 => c.handle_packet(now, from, chunk),
            2 => c.handle_timeout(now),
            _ => {
                let _ = Message::parse(chunk);
            }
        }
        while c.poll_transmit().is_some() {}
        while c.poll_event().is_some() {}
    }
    let t = c.topology();
    for r in c.records() {
        if let Some(p) = r.parent {
            let parent = c.record(p).expect("a parent is a member");
            assert!(parent.children.contains(&r.id), "{} lists {}", p, r.id);
        }
    }
    if t.trees[0].nodes.iter().any(|n| n.role == fairfeed_tree::plan::Role::Sender) && !t.receiver_ids.is_empty() {
        fairfeed_tree::plan::validate(&t).expect("the controller's tree is a valid plan");
    }
});
