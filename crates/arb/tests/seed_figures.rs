//! Goal: the high-reliability windows behave as seed 004's figures 2, 3 and 4
//! describe, and the count mode does not stall at the end of the day.
//! Method: one input line, one message per packet, scripted arrival times in
//! virtual nanoseconds; check what leaves and when.

mod common;
use common::*;
use fairfeed_arb::{Config, Mode, Start, Window};

fn cfg(mode: Mode, max_hold_ns: u64, max_count_msgs: u64) -> Config {
    Config {
        lines: 1,
        window: Window { mode, max_hold_ns, max_count_msgs },
        start: Start::Seq(1),
        idle_flush_ns: 1_000_000,
        ..Config::default()
    }
}

/// Figure 2, time: P2 is late but beats P3's timeout; P7 is too late, so P8
/// and P9 go out at P8's timeout and P7 is discarded when it shows up.
#[test]
fn figure_2_time_window() {
    let mut h = Harness::new(cfg(Mode::Time, 50, u64::MAX));
    for (t, seq) in [(0, 1), (10, 3), (20, 4), (30, 2), (40, 5), (50, 6), (60, 8), (70, 9), (200, 7)] {
        h.arrive(t, 0, packet(seq, 1));
    }
    h.run(1_000);
    assert_eq!(h.out.hr_times(), [(0, 1), (30, 2), (30, 3), (30, 4), (40, 5), (50, 6), (110, 8), (110, 9)]);
    let s = h.arb.stats();
    assert_eq!((s.lost_messages, s.gaps_given_up, s.duplicates), (1, 1, 1));
    // Low latency never waited: each new packet left on arrival; late P2 and P7 did not.
    assert_eq!(h.out.ll_seqs(), [1, 3, 4, 5, 6, 8, 9]);
}

/// Figure 3, count (maximum-count = 2): P3 arrives while two messages are
/// held, so P3, P4, P5 go out; P7 never comes, and when P10 makes three held
/// messages, P7 is given up and P8..P10 go out.
#[test]
fn figure_3_count_window() {
    let mut h = Harness::new(cfg(Mode::Count, u64::MAX, 2));
    for (t, seq) in [(0, 1), (10, 2), (20, 4), (30, 5), (40, 3), (50, 6), (60, 8), (70, 9), (80, 10)] {
        h.arrive(t, 0, packet(seq, 1));
    }
    h.run(100);
    assert_eq!(h.out.hr_times(), [(0, 1), (10, 2), (40, 3), (40, 4), (40, 5), (50, 6), (80, 8), (80, 9), (80, 10)]);
    assert_eq!(h.arb.stats().lost_messages, 1);
}

/// Figure 4, time & count: P4 overstays P5's timeout and is given up; later P8
/// is given up because the count threshold trips before P9's timeout.
#[test]
fn figure_4_time_and_count_window() {
    let mut h = Harness::new(cfg(Mode::TimeCount, 50, 2));
    for (t, seq) in [(0, 1), (10, 2), (20, 3), (30, 5), (40, 6), (90, 4), (100, 7), (110, 9), (115, 10), (120, 11)] {
        h.arrive(t, 0, packet(seq, 1));
    }
    h.run(1_000);
    assert_eq!(
        h.out.hr_times(),
        [(0, 1), (10, 2), (20, 3), (80, 5), (80, 6), (100, 7), (120, 9), (120, 10), (120, 11)]
    );
    let s = h.arb.stats();
    assert_eq!((s.lost_messages, s.gaps_given_up), (2, 2));
}

/// The seed's count mode waits forever when traffic stops with a gap open;
/// ours gives the gap up once the feed has been idle for `idle_flush_ns`.
#[test]
fn count_mode_does_not_stall_at_end_of_day() {
    let mut h = Harness::new(cfg(Mode::Count, u64::MAX, 1_000));
    h.arrive(0, 0, packet(1, 1));
    h.arrive(10, 0, packet(3, 1));
    h.run(u64::MAX);
    assert_eq!(h.out.hr_times(), [(0, 1), (1_000_010, 3)]);
    assert_eq!(h.arb.stats().lost_messages, 1);
    assert_eq!(h.arb.next_timeout(), None);
}

/// Thresholds and mode change at run time; held packets are judged by the new
/// window, and nothing is lost or repeated by the change itself.
#[test]
fn window_changes_at_run_time() {
    let mut h = Harness::new(cfg(Mode::Count, u64::MAX, 100));
    for (t, seq) in [(0, 1), (10, 3), (20, 4), (30, 5)] {
        h.arrive(t, 0, packet(seq, 1));
    }
    h.run(40);
    assert_eq!(h.out.hr_seqs(), [1]);
    h.out.now = 40;
    h.arb.set_window(40, Window { mode: Mode::Time, max_hold_ns: 15, max_count_msgs: 100 }, &mut h.out);
    // P3 arrived at 10: with a 15 ns hold it is overdue, so it leaves now.
    assert_eq!(h.out.hr_seqs(), [1, 3, 4, 5]);
    h.arrive(50, 0, packet(2, 1)); // too late now
    h.arrive(60, 0, packet(6, 1));
    h.run(100);
    assert_eq!(h.out.hr_seqs(), [1, 3, 4, 5, 6]);
    let s = h.arb.stats();
    assert_eq!((s.lost_messages, s.window_changes, s.duplicates), (1, 1, 1));
}

/// Two lines: the earlier copy wins, the later is a duplicate, and the race
/// between the lines is measured.
#[test]
fn two_lines_race() {
    let mut h = Harness::new(Config { start: Start::Seq(1), ..Config::default() });
    for seq in 1..=100u64 {
        let t = seq * 1_000;
        let (a, b) = if seq % 4 == 0 { (t + 300, t) } else { (t, t + 500) };
        h.arrive(a, 0, packet(seq, 1));
        h.arrive(b, 1, packet(seq, 1));
    }
    h.run(1_000_000);
    assert_eq!(h.out.hr_seqs(), (1..=100).collect::<Vec<_>>());
    assert_eq!(h.out.ll_seqs(), (1..=100).collect::<Vec<_>>());
    let s = h.arb.stats_now(1_000_000);
    assert_eq!((s.lines[0].first_arrivals, s.lines[1].first_arrivals), (75, 25));
    assert_eq!(s.duplicates, 100);
    assert!((490..=510).contains(&s.lines[0].lead_ns_p50), "A leads by {}", s.lines[0].lead_ns_p50);
    assert!((290..=310).contains(&s.lines[1].lead_ns_p50), "B leads by {}", s.lines[1].lead_ns_p50);
}
