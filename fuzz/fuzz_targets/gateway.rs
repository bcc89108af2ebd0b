//! Fuzz target: arbitrary bytes, in arbitrary chunks, from two connections
//! into the OUCH/SoupBinTCP gateway and the matching engine behind it, with
//! engine events fed back and the clock ticking. Nothing may panic; a
//! connection that errs is closed and the other goes on; the engine's book
//! never rests crossed among orders without a minimum quantity.
#![no_main]
use fairfeed_exchange::client;
use fairfeed_exchange::engine::{Engine, Limits, Side};
use fairfeed_exchange::gateway::{Conn, Gateway, GatewayConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cfg = GatewayConfig {
        users: vec![("A".into(), "a".into()), ("B".into(), "b".into())],
        symbols: vec!["AAPL".into(), "MSFT".into()],
        ..GatewayConfig::default()
    };
    let mut g = Gateway::new(cfg);
    let mut e = Engine::new(Limits { symbols: 2, orders: 256, levels: 16, ..Limits::default() }, 0, 1);
    let mut conns = [Conn::new(0), Conn::new(0)];
    let mut open = [true, true];
    // Both log in first, so the fuzzer reaches the OUCH paths.
    for (i, (u, p)) in [("A", "a"), ("B", "b")].iter().enumerate() {
        let mut b = Vec::new();
        client::login(u, p, 0, &mut b);
        let _ = g.on_bytes(&mut conns[i], 0, &b, &mut |_, _| {}, &mut Vec::new());
    }
    let mut now = 0u64;
    let mut i = 0;
    while i + 2 <= data.len() {
        let (ctl, len) = (data[i], usize::from(data[i + 1]));
        i += 2;
        let end = (i + len).min(data.len());
        let chunk = &data[i..end];
        i = end;
        now += u64::from(ctl >> 2) * 1_000_000;
        let k = usize::from(ctl & 1);
        if !open[k] {
            continue;
        }
        let mut cmds = Vec::new();
        let mut out = Vec::new();
        if g.on_bytes(&mut conns[k], now, chunk, &mut |c, _| cmds.push(c), &mut out).is_err() {
            open[k] = false;
        }
        for c in cmds {
            let mut evs = Vec::new();
            e.handle(c, &mut |ev| evs.push(ev));
            for ev in evs {
                g.on_event(now, &ev, &mut |_, _| {});
            }
        }
        if ctl & 2 != 0 {
            for (c, o) in conns.iter_mut().zip(open.iter_mut()) {
                if *o && g.on_tick(c, now, &mut Vec::new()).is_err() {
                    *o = false;
                }
            }
        }
        for sym in 1..=2 {
            let best = |side| e.best_without_minimum(sym, side);
            if let (Some(b), Some(a)) = (best(Side::Buy), best(Side::Sell)) {
                assert!(b < a, "crossed book");
            }
        }
    }
});
