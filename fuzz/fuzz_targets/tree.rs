//! Fuzz target: arbitrary packets (some signed with the tree's key, most not)
//! into a proxy and a receiver with authentication on, and into ones with it
//! off, at arbitrary times. Nothing may panic; a receiver never releases a
//! message before its deadline (on its synchronized clock) unless it arrived
//! late, never releases a sequence twice, and with authentication on releases
//! only signed packets. A third pair runs clock synchronization with the key:
//! an unsigned packet (a forged probe among them) never moves its clock.
#![no_main]
use std::collections::HashSet;

use fairfeed_clock::{ClockSync, SyncConfig};
use fairfeed_tree::auth::Auth;
use fairfeed_tree::node::{NodeConfig, Proxy, Receiver, Transmit};
use libfuzzer_sys::fuzz_target;

struct Null;
impl Transmit for Null {
    fn send(&mut self, _to: u32, _bytes: &[u8]) {}
}

fuzz_target!(|data: &[u8]| {
    let key = Auth::new([9; 32]);
    let cfg = NodeConfig { report_interval_ns: 1_000, ..NodeConfig::default() };
    let mut nodes = [
        (
            Proxy::new(1, 0, &[2, 3], &[4], cfg).with_auth(Some(key.clone())),
            Receiver::new(2, 1, cfg).with_auth(Some(key.clone())),
        ),
        (Proxy::new(1, 0, &[2, 3], &[4], cfg), Receiver::new(2, 1, cfg)),
        (
            Proxy::new(1, 0, &[2, 3], &[4], cfg).with_auth(Some(key.clone())).with_sync(ClockSync::new(
                1,
                &[0, 2, 3, 4],
                false,
                SyncConfig::default(),
            )),
            Receiver::new(2, 1, cfg).with_auth(Some(key.clone())).with_sync(ClockSync::new(
                2,
                &[0, 1],
                false,
                SyncConfig::default(),
            )),
        ),
    ];
    let mut seen = [HashSet::new(), HashSet::new(), HashSet::new()];
    let mut signed = HashSet::new();
    let (mut now, mut i) = (0u64, 0usize);
    while i + 2 <= data.len() {
        let (ctl, len) = (data[i], usize::from(data[i + 1]));
        i += 2;
        let end = (i + len).min(data.len());
        let mut packet = data[i..end].to_vec();
        i = end;
        now += u64::from(ctl & 0x3f) * 997;
        if ctl & 0x40 != 0 && packet.len() >= 40 {
            key.seal(&mut packet);
            if let Ok((h, _)) = fairfeed_wire::overlay::HeaderRepr::parse(&packet) {
                signed.insert(h.sequence);
            }
        }
        let unsigned = ctl & 0x40 == 0;
        for (k, (p, r)) in nodes.iter_mut().enumerate() {
            let mut copy = packet.clone();
            let before = (p.sync.stats.probes_received, r.sync.stats.probes_received);
            p.handle_packet(now, &mut copy, &mut Null);
            r.handle_packet(now, &packet);
            if k != 1 && unsigned {
                assert_eq!(
                    before,
                    (p.sync.stats.probes_received, r.sync.stats.probes_received),
                    "an unsigned probe reached the clock"
                );
            }
            if ctl & 0x80 != 0 {
                p.handle_timeout(now, &mut Null);
                r.handle_timeout(now, &mut Null);
            }
            while let Some(m) = r.poll_release() {
                assert!(m.late || m.deadline_ns <= r.sync.now_sync(now), "released before its deadline");
                assert!(k == 1 || signed.contains(&m.sequence), "an unsigned packet got through");
                assert!(r.sync.offset_at(now).is_finite());
                assert!(seen[k].insert(m.sequence), "sequence {} released twice", m.sequence);
            }
        }
    }
});
