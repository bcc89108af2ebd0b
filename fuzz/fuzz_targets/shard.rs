//! Fuzz target: arbitrary bytes as feed packets into the sender's sharder
//! (over 1-8 trees), and its per-tree packets — with arbitrary flags and
//! orders of release — into a receiver's merge. Nothing may panic; every
//! per-tree packet is a valid MoldUDP64 packet numbered on from the last of
//! its tree; no message the sharder accepted is dropped or duplicated across
//! the trees it was split over (market-wide ones once per tree); the merge
//! delivers each release at most once.
#![no_main]
use fairfeed_tree::merge::Merge;
use fairfeed_tree::node::{Payload, Released};
use fairfeed_tree::shard::{Dest, ShardMap, Sharder};
use fairfeed_wire::moldudp64::Packet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else { return };
    let trees = usize::from(first % 8) + 1;
    let mut s = Sharder::new(trees, ShardMap::default()).expect("1..=8 trees");
    let mut merge = Merge::new(trees, 1_000);
    let mut next = vec![None::<u64>; trees];
    let (mut released, mut seq) = (0u64, vec![0u64; trees]);
    let mut i = 0;
    let mut now = 0u64;
    while i + 2 <= rest.len() {
        let len = usize::from(u16::from_be_bytes([rest[i], rest[i + 1]]) % 512);
        i += 2;
        let end = (i + len).min(rest.len());
        let packet = &rest[i..end];
        i = end;
        now += 1_000;
        let accepted: usize = Packet::new_checked(packet)
            .map(|p| {
                if p.is_heartbeat() || p.is_end_of_session() {
                    0
                } else {
                    p.messages().map_while(Result::ok).filter(|m| m.len() >= 3).count()
                }
            })
            .unwrap_or(0);
        let mut out_msgs = 0usize;
        let _ = s.split(packet, |d, b| {
            let p = Packet::new_checked(b).expect("the sharder writes valid packets");
            let t = usize::from(d.tree());
            if let Some(n) = next[t] {
                assert_eq!(p.sequence(), n, "tree {t} numbers on");
            }
            next[t] = Some(if p.is_end_of_session() { p.sequence() } else { p.next_sequence() });
            let count = if p.is_end_of_session() { 0 } else { usize::from(p.count()) };
            if matches!(d, Dest::Tree(_)) || d.tree() == 0 {
                out_msgs += count;
            }
            seq[t] += 1;
            let every = matches!(d, Dest::Every(_));
            merge.push(
                t,
                Released {
                    tree: d.tree(),
                    flags: if every { fairfeed_wire::overlay::FLAG_EVERY_TREE } else { 0 },
                    sequence: seq[t],
                    payload: Payload::from_slice(b),
                    deadline_ns: now + (t as u64) * 7,
                    arrival_ns: now,
                    send_ns: now,
                    late: false,
                    due_ns: now + (t as u64) * 7,
                    clock_ok: true,
                },
            );
        });
        assert_eq!(out_msgs, accepted, "every accepted message once (market-wide once per tree)");
        merge.flush(now + 10_000);
        while merge.poll().is_some() {
            released += 1;
        }
    }
    merge.flush(u64::MAX / 2);
    while merge.poll().is_some() {
        released += 1;
    }
    let sent: u64 = seq.iter().sum();
    assert!(released <= sent, "the merge delivers each release at most once");
});
