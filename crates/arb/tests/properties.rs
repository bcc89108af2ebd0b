//! Goal: the arbitrator's invariants hold under any mix of loss, duplication,
//! delay and reordering on each line. Method: proptest draws a feed (packets of
//! 1–4 messages, then an end-of-session packet) and per-line impairments,
//! drives the harness in virtual time, then checks:
//! - high reliability: strictly increasing, no message twice; with wide windows
//!   it loses exactly the messages every line lost; with retransmission it
//!   loses nothing, whatever the windows;
//! - low latency: strictly increasing, no message twice, and every packet left
//!   at the instant a copy of it arrived (it never holds);
//! - `lost_messages` counts exactly what high reliability missed.

mod common;
use common::*;
use std::collections::BTreeSet;

use fairfeed_arb::retransmit::ServerConfig;
use fairfeed_arb::{Config, Mode, RetransmitConfig, Start, Window};
use fairfeed_wire::moldudp64::{PacketRepr, Session, COUNT_END_OF_SESSION};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct LineImp {
    loss: f64,
    dup: f64,
    delay_ns: u64,
    jitter_ns: u64,
}

fn line_imp() -> impl Strategy<Value = LineImp> {
    (0.0..0.3f64, 0.0..0.2f64, 0u64..50_000, 0u64..40_000).prop_map(|(loss, dup, delay_ns, jitter_ns)| LineImp {
        loss,
        dup,
        delay_ns,
        jitter_ns,
    })
}

fn end_of_session(seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; 20];
    PacketRepr { session: Session::from_str_padded(SESSION), sequence: seq, count: COUNT_END_OF_SESSION }
        .emit(&mut b)
        .unwrap();
    b
}

struct Scenario {
    clean: Vec<Vec<u8>>,
    total: u64,
    /// (time, line, packet) arrivals.
    arrivals: Vec<(u64, usize, Vec<u8>)>,
    /// Messages no line delivered.
    lost_everywhere: BTreeSet<u64>,
}

fn scenario(sizes: &[u16], lines: &[LineImp], seed: u64) -> Scenario {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut clean = Vec::new();
    let mut seq = 1u64;
    for &n in sizes {
        clean.push(packet(seq, n));
        seq += u64::from(n);
    }
    let total = seq - 1;
    let mut arrivals = Vec::new();
    let mut delivered = BTreeSet::new();
    for (l, imp) in lines.iter().enumerate() {
        for (i, p) in clean.iter().enumerate() {
            let t = i as u64 * 10_000 + imp.delay_ns + rng.gen_range(0..=imp.jitter_ns);
            if rng.gen_bool(imp.loss) {
                continue;
            }
            delivered.extend(seqs(p));
            arrivals.push((t, l, p.clone()));
            if rng.gen_bool(imp.dup) {
                arrivals.push((t + rng.gen_range(1..30_000), l, p.clone()));
            }
        }
        let t_end = clean.len() as u64 * 10_000 + imp.delay_ns + imp.jitter_ns + 1;
        arrivals.push((t_end, l, end_of_session(seq)));
    }
    let lost_everywhere = (1..=total).filter(|s| !delivered.contains(s)).collect();
    Scenario { clean, total, arrivals, lost_everywhere }
}

fn run(cfg: Config, sc: &Scenario, server: Option<(ServerConfig, u64)>) -> Harness {
    let mut h = Harness::new(cfg);
    if let Some((scfg, rtt)) = server {
        h = h.with_server(&sc.clean, scfg, rtt);
    }
    for (t, l, p) in &sc.arrivals {
        h.arrive(*t, *l, p.clone());
    }
    h.run(u64::MAX);
    h
}

fn check_common(h: &Harness, sc: &Scenario) -> Result<(), TestCaseError> {
    let hr = h.out.hr_seqs();
    prop_assert!(hr.windows(2).all(|w| w[0] < w[1]), "high reliability not strictly increasing");
    let ll = h.out.ll_seqs();
    prop_assert!(ll.windows(2).all(|w| w[0] < w[1]), "low latency not strictly increasing");
    // Low latency never holds: each packet it emitted was an input at that very
    // instant, or the tail of one (trimmed to its new messages).
    for (t, p) in &h.out.ll {
        let ok = h.out.inputs.iter().any(|(ti, q)| {
            ti == t
                && (q == p || (p.len() > 20 && q.len() > 20 && seqs(q).ends_with(&seqs(p)) && q.ends_with(&p[20..])))
        });
        prop_assert!(ok, "low latency emitted a held packet");
    }
    let s = h.arb.stats();
    prop_assert_eq!(s.lost_messages, sc.total - hr.len() as u64);
    prop_assert!(h.arb.drained(), "not drained at the end");
    // One end-of-session packet on each output; on high reliability, the last thing.
    for out in [&h.out.hr, &h.out.ll] {
        let ends = out.iter().filter(|(_, p)| p.len() == 20).count();
        prop_assert_eq!(ends, 1);
    }
    prop_assert_eq!(h.out.hr.last().map(|(_, p)| p.len()), Some(20));
    Ok(())
}

fn wide() -> Config {
    Config {
        lines: 2,
        window: Window { mode: Mode::Time, max_hold_ns: 10_000_000_000, max_count_msgs: u64::MAX },
        start: Start::Seq(1),
        idle_flush_ns: 20_000_000_000,
        ..Config::default()
    }
}

fn any_window() -> impl Strategy<Value = Window> {
    (prop_oneof![Just(Mode::Time), Just(Mode::Count), Just(Mode::TimeCount)], 0u64..100_000, 0u64..30)
        .prop_map(|(mode, max_hold_ns, max_count_msgs)| Window { mode, max_hold_ns, max_count_msgs })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn wide_windows_lose_only_what_every_line_lost(
        sizes in proptest::collection::vec(1u16..5, 1..200),
        a in line_imp(), b in line_imp(), seed in any::<u64>()
    ) {
        let sc = scenario(&sizes, &[a, b], seed);
        let h = run(wide(), &sc, None);
        check_common(&h, &sc)?;
        let missing: BTreeSet<u64> = (1..=sc.total).filter(|s| !h.out.hr_seqs().contains(s)).collect();
        prop_assert_eq!(missing, sc.lost_everywhere.clone());
    }

    #[test]
    fn any_window_keeps_order_and_accounts_for_losses(
        sizes in proptest::collection::vec(1u16..5, 1..200),
        a in line_imp(), b in line_imp(), w in any_window(), seed in any::<u64>()
    ) {
        let sc = scenario(&sizes, &[a, b], seed);
        let cfg = Config { window: w, idle_flush_ns: 1_000_000, ..wide() };
        let h = run(cfg, &sc, None);
        check_common(&h, &sc)?;
    }

    #[test]
    fn retransmission_recovers_everything(
        sizes in proptest::collection::vec(1u16..5, 1..200),
        a in line_imp(), b in line_imp(), w in any_window(), seed in any::<u64>(),
        rtt in 1_000u64..100_000, count_max in 1u16..20, grace in 0u64..50_000, adaptive in any::<bool>()
    ) {
        let sc = scenario(&sizes, &[a, b], seed);
        let rt = RetransmitConfig {
            grace_ns: grace, timeout_ns: 500_000, attempts_max: 4, request_count_max: 50, adaptive_grace: adaptive,
            ..RetransmitConfig::default()
        };
        let cfg = Config { window: w, idle_flush_ns: 1_000_000, retransmit: Some(rt), ..wide() };
        let server = ServerConfig { count_max, rate_per_s: 1e9, burst: 1e9, ..ServerConfig::default() };
        let h = run(cfg, &sc, Some((server, rtt)));
        check_common(&h, &sc)?;
        prop_assert_eq!(h.out.hr_seqs(), (1..=sc.total).collect::<Vec<_>>());
    }
}
