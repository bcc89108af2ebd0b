//! Fuzz target: arbitrary bytes as a last hop's life — releases, packets
//! from its hosts (echoes, forged or not, junk) and timer turns, in any
//! order. Nothing may panic; every host gets every released packet exactly
//! once and in release order, however the leads moved.
#![no_main]
use fairfeed_tree::lasthop::{probe, LastHop, LastHopConfig, Out};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else { return };
    let hosts = usize::from(first % 4) + 1;
    let cfg = LastHopConfig { hosts, secret: 5, probe_interval_ns: 10_000, ..LastHopConfig::default() };
    let mut hop = LastHop::new(cfg).expect("a valid config");
    let mut got: Vec<Vec<u64>> = vec![Vec::new(); hosts];
    let mut probes: Vec<(usize, [u8; probe::LEN])> = Vec::new();
    let mut released = 0u64;
    let mut now = 0u64;
    let record = |o: Out<'_>, got: &mut Vec<Vec<u64>>, probes: &mut Vec<(usize, [u8; probe::LEN])>| match o {
        Out::Probe { host, bytes } => probes.push((host, bytes)),
        Out::Data { host, payload, .. } => got[host].push(u64::from_be_bytes(payload.try_into().expect("8 bytes"))),
    };
    for chunk in rest.chunks(4) {
        let [op, a, b, c] = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0), *chunk.get(3).unwrap_or(&0)];
        now += u64::from(a) * 1_000;
        match op % 5 {
            0 => {
                let deadline = now + u64::from(u16::from_be_bytes([b, c])) * 100;
                hop.on_release(now, deadline, &released.to_be_bytes(), &mut |o| record(o, &mut got, &mut probes));
                released += 1;
            }
            1 => {
                // The echo of a probe in flight (a genuine answer).
                if let Some((h, p)) = probes.pop() {
                    hop.on_packet(now, h, &probe::echo(&p).expect("a probe"));
                }
            }
            2 => hop.on_packet(now, usize::from(b % 6), &probe::emit(probe::Kind::Echo, u64::from(c))),
            3 => hop.on_packet(now, usize::from(b % 6), chunk),
            _ => {
                hop.send_due(now, &mut |o| record(o, &mut got, &mut probes));
            }
        }
        let _ = probe::View::parse(chunk);
        let _ = fairfeed_tree::lasthop::framed::parse(chunk);
    }
    hop.send_due(u64::MAX / 2, &mut |o| record(o, &mut got, &mut probes));
    let want: Vec<u64> = (0..released).collect();
    for g in &got {
        assert_eq!(g, &want, "every packet once, in order");
    }
    assert_eq!(hop.pending(), 0);
});
