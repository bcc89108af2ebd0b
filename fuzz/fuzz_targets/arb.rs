//! Fuzz target: arbitrary packets, lines, times and window changes into the
//! arbitrator (with retransmission on). It must never panic, and its
//! high-reliability output must stay strictly increasing without repeats.
#![no_main]
use fairfeed_arb::spec::SeqSpec;
use fairfeed_arb::{Arbitrator, Config, Mode, RetransmitConfig, Sink, Source, Stream, Window};
use fairfeed_wire::moldudp64::RequestRepr;
use libfuzzer_sys::fuzz_target;

struct Check {
    spec: SeqSpec,
    next: Option<u64>,
}

impl Sink for Check {
    fn emit(&mut self, s: Stream, p: &[u8]) {
        if s != Stream::HighReliability {
            return;
        }
        let Some(i) = self.spec.parse(p) else { panic!("high reliability emitted a non-market packet") };
        if i.count > 0 {
            if let Some(n) = self.next {
                assert!(i.seq >= n, "high reliability went backwards: {} < {n}", i.seq);
            }
            self.next = Some(i.end());
        }
    }
    fn request(&mut self, r: RequestRepr) {
        assert!(r.count > 0);
    }
}

fuzz_target!(|data: &[u8]| {
    let cfg = Config {
        lines: 3,
        window: Window { mode: Mode::TimeCount, max_hold_ns: 1_000, max_count_msgs: 8 },
        retransmit: Some(RetransmitConfig::default()),
        ..Config::default()
    };
    let mut arb = Arbitrator::new(cfg, SeqSpec::moldudp64()).unwrap();
    let mut sink = Check { spec: SeqSpec::moldudp64(), next: None };
    let mut now = 0u64;
    let mut rest = data;
    // Records: [op, dt, len, bytes...]
    while let [op, dt, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (pkt, after) = tail.split_at(n);
        rest = after;
        now += u64::from(*dt) * 100;
        match op % 8 {
            0..=2 => arb.handle_packet(now, Source::Line(usize::from(op % 3)), pkt, &mut sink),
            3 => arb.handle_packet(now, Source::Retransmit, pkt, &mut sink),
            4 => {
                let mode = [Mode::Time, Mode::Count, Mode::TimeCount][usize::from(*dt % 3)];
                let w = Window { mode, max_hold_ns: u64::from(*len) * 50, max_count_msgs: u64::from(*dt % 16) };
                arb.set_window(now, w, &mut sink);
            }
            _ => arb.handle_timeout(now, &mut sink),
        }
    }
    // Drain: the timers must run out in bounded steps.
    for _ in 0..10_000 {
        match arb.next_timeout() {
            Some(t) => {
                now = now.max(t);
                arb.handle_timeout(now, &mut sink);
            }
            None => break,
        }
        now += 1;
    }
});
