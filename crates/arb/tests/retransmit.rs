//! Goal: gaps that every line lost are recovered through MoldUDP64
//! retransmission, the way a careful client does it. Method: two lines in
//! virtual time, a retransmission server core journaling the clean feed and
//! answering after a fixed round trip; scripted losses.

mod common;
use common::*;
use fairfeed_arb::retransmit::ServerConfig;
use fairfeed_arb::{Config, Mode, RetransmitConfig, Start, Window};

const US: u64 = 1_000;

fn clean(n: u64) -> Vec<Vec<u8>> {
    (1..=n).map(|s| packet(s, 1)).collect()
}

fn cfg(rt: RetransmitConfig) -> Config {
    Config {
        lines: 2,
        window: Window { mode: Mode::Time, max_hold_ns: 50 * US, max_count_msgs: 1_000 },
        start: Start::Seq(1),
        idle_flush_ns: 10_000 * US,
        retransmit: Some(rt),
        ..Config::default()
    }
}

fn rt() -> RetransmitConfig {
    RetransmitConfig {
        grace_ns: 20 * US,
        timeout_ns: 200 * US,
        attempts_max: 3,
        request_count_max: 100,
        adaptive_grace: false,
        patience_ns: 0,
        ..RetransmitConfig::default()
    }
}

/// Feeds seq 1..=n on both lines 10 µs apart, skipping `lost` on both.
fn feed(h: &mut Harness, n: u64, lost: &[u64]) {
    for s in 1..=n {
        if !lost.contains(&s) {
            h.arrive(s * 10 * US, 0, packet(s, 1));
            h.arrive(s * 10 * US + US, 1, packet(s, 1));
        }
    }
}

#[test]
fn a_gap_both_lines_lost_is_recovered() {
    let mut h = Harness::new(cfg(rt())).with_server(&clean(50), ServerConfig::default(), 30 * US);
    feed(&mut h, 50, &[10, 11, 12]);
    h.run(u64::MAX);
    assert_eq!(h.out.hr_seqs(), (1..=50).collect::<Vec<_>>());
    // The packet that revealed the gap (13) was kept and released after the fill.
    let s = h.arb.stats();
    assert_eq!((s.lost_messages, s.gaps_filled_by_retransmit), (0, 1));
    // One request for the gap; the server answers packet by packet, as the
    // feed was sent, and the rest is asked for at once.
    let asked: Vec<(u64, u16)> = h.out.requests.iter().map(|(_, r)| (r.sequence, r.count)).collect();
    assert_eq!(asked, [(10, 3), (11, 2), (12, 1)]);
    // Asked after the grace, not at once: 13 arrived at 130 µs.
    assert_eq!(h.out.requests[0].0, 150 * US);
}

#[test]
fn no_second_request_for_a_range_in_flight() {
    // A slow server (round trip 150 µs, under the 200 µs time-out): the gap
    // stays open while many packets arrive, yet it is requested once.
    let mut h = Harness::new(cfg(rt())).with_server(&clean(60), ServerConfig::default(), 150 * US);
    feed(&mut h, 60, &[20]);
    h.run(u64::MAX);
    assert_eq!(h.out.hr_seqs(), (1..=60).collect::<Vec<_>>());
    assert_eq!(h.out.requests.len(), 1);
    assert_eq!(h.arb.stats().request_timeouts, 0);
}

#[test]
fn a_short_answer_is_accepted_and_the_rest_asked_for() {
    let server = ServerConfig { count_max: 2, keep_packet_boundaries: false, ..ServerConfig::default() };
    let mut h = Harness::new(cfg(rt())).with_server(&clean(40), server, 10 * US);
    feed(&mut h, 40, &[5, 6, 7, 8, 9]);
    h.run(u64::MAX);
    assert_eq!(h.out.hr_seqs(), (1..=40).collect::<Vec<_>>());
    let asked: Vec<(u64, u16)> = h.out.requests.iter().map(|(_, r)| (r.sequence, r.count)).collect();
    assert_eq!(asked, [(5, 5), (7, 3), (9, 1)]);
    assert_eq!(h.arb.stats().partial_answers, 2);
}

#[test]
fn unanswered_requests_time_out_then_the_gap_is_given_up() {
    let mut h = Harness::new(cfg(rt())).with_server(&clean(30), ServerConfig::default(), 10 * US);
    h.drop_requests = usize::MAX;
    feed(&mut h, 30, &[15]);
    h.run(u64::MAX);
    let mut want: Vec<u64> = (1..=30).collect();
    want.retain(|&s| s != 15);
    assert_eq!(h.out.hr_seqs(), want);
    let s = h.arb.stats();
    assert_eq!((s.requests_sent, s.request_timeouts, s.requests_abandoned, s.lost_messages), (3, 3, 1, 1));
}

#[test]
fn a_gap_the_other_line_fills_is_not_requested() {
    let mut h = Harness::new(cfg(rt())).with_server(&clean(30), ServerConfig::default(), 10 * US);
    for s in 1..=30u64 {
        if s != 7 {
            h.arrive(s * 10 * US, 0, packet(s, 1));
        }
        let late = if s == 7 { 5 * US } else { US }; // B's copy of 7 comes within the grace
        h.arrive(s * 10 * US + late, 1, packet(s, 1));
    }
    h.run(u64::MAX);
    assert_eq!(h.out.hr_seqs(), (1..=30).collect::<Vec<_>>());
    assert!(h.out.requests.is_empty());
    assert_eq!(h.arb.stats().gaps_filled_by_line, 0); // B simply won the race for 7: no gap opened
}

#[test]
fn partial_overlap_is_trimmed_never_repeated() {
    // The server packs 5 messages per answer while the lines carry 1 per
    // packet: answers overlap what line B delivers meanwhile.
    let server = ServerConfig { keep_packet_boundaries: false, ..ServerConfig::default() };
    let mut h = Harness::new(cfg(rt())).with_server(&clean(40), server, 25 * US);
    for s in 1..=40u64 {
        if !(10..=14).contains(&s) {
            h.arrive(s * 10 * US, 0, packet(s, 1));
            h.arrive(s * 10 * US + US, 1, packet(s, 1));
        }
    }
    // B delivers 10 very late, after the request was sent.
    h.arrive(180 * US, 1, packet(10, 1));
    h.run(u64::MAX);
    assert_eq!(h.out.hr_seqs(), (1..=40).collect::<Vec<_>>());
    assert!(h.arb.stats().trimmed >= 1);
}

/// Line B lags A by 300 µs. When A loses packets, a fixed 20 µs grace asks the
/// server for gaps B is about to fill; the adaptive grace has learnt the lag
/// and asks for nothing.
#[test]
fn adaptive_grace_learns_the_line_lag() {
    let run = |adaptive: bool| {
        let c = Config {
            window: Window { mode: Mode::Time, max_hold_ns: 1_000 * US, max_count_msgs: 10_000 },
            ..cfg(RetransmitConfig { adaptive_grace: adaptive, ..rt() })
        };
        let mut h = Harness::new(c).with_server(&clean(3_000), ServerConfig::default(), 30 * US);
        for s in 1..=3_000u64 {
            if !(s > 2_000 && s % 100 == 0) {
                h.arrive(s * 10 * US, 0, packet(s, 1));
            }
            h.arrive(s * 10 * US + 300 * US, 1, packet(s, 1));
        }
        h.run(u64::MAX);
        assert_eq!(h.out.hr_seqs(), (1..=3_000).collect::<Vec<_>>());
        let s = h.arb.stats();
        (s.requests_sent, s.gaps_filled_by_line)
    };
    let (fixed_requests, _) = run(false);
    let (adaptive_requests, filled_by_line) = run(true);
    assert_eq!(fixed_requests, 9); // 2100..2900; nothing after 3000 reveals its gap
    assert_eq!(adaptive_requests, 0);
    assert_eq!(filled_by_line, 9);
}

/// A receiver's gap filler (`net::arb::fill`): one line, a 200-ms hold,
/// 1-ms grace, the default request limits.
fn filler() -> Config {
    Config {
        lines: 1,
        window: Window { mode: Mode::Time, max_hold_ns: 200_000 * US, max_count_msgs: 1_000_000 },
        start: Start::Seq(1),
        retransmit: Some(RetransmitConfig { grace_ns: 1_000 * US, adaptive_grace: false, ..Default::default() }),
        ..Config::default()
    }
}

/// A subtree cut off for `outage` packets (no path while no controller
/// could lead): the line resumes and the whole gap must come back from a
/// server that keeps its default limits (2,000 requests/s per requester),
/// at `per_s` packets/s of feed.
fn long_outage(cfg: Config, n: u64, per_s: u64, outage: std::ops::Range<u64>) -> Harness {
    cut_off(cfg, n, per_s, outage, 0..0)
}

/// As [`long_outage`], and the receiver's own network cut off for
/// `blackout` (ns) as well: nothing reaches it then, line or answers.
fn cut_off(cfg: Config, n: u64, per_s: u64, outage: std::ops::Range<u64>, blackout: std::ops::Range<u64>) -> Harness {
    let mut h = Harness::new(cfg).with_server(&clean(n), ServerConfig::default(), 200 * US);
    let gap = 1_000_000_000 / per_s;
    for s in (1..=n).filter(|s| !outage.contains(s) && !blackout.contains(&(s * gap))) {
        h.arrive(s * gap, 0, packet(s, 1));
    }
    h.blackout = blackout;
    h.run(u64::MAX);
    h
}

#[test]
fn a_partition_in_the_middle_of_a_fill_is_waited_out() {
    // 2.4 s lost, the fill under way, then the receiver's cable pulled for
    // 0.7 s (bench faults: a compound fault, then its subtree cut off).
    // Every request then times out; the server answered nothing meanwhile,
    // so the ranges are asked for again until it answers — not given up
    // after five tries (100 ms).
    let blackout = 4_000_000 * US..4_700_000 * US;
    let h = cut_off(filler(), 8_000, 1_000, 1_000..3_400, blackout.clone());
    let s = h.arb.stats();
    assert_eq!((s.lost_messages, s.requests_abandoned, s.gaps_given_up), (0, 0, 0));
    assert!(s.requests_waited_out > 0, "the blackout outlasted the attempts");
    // What the blackout itself took is asked for once it ends, like the rest.
    assert!(h.out.hr_seqs() == (1..=8_000).collect::<Vec<_>>(), "the line is not whole and in order");
    // Without patience, the same blackout costs what the fill had left.
    let mut cfg = filler();
    cfg.retransmit.as_mut().unwrap().patience_ns = 0;
    gave_up(cut_off(cfg, 8_000, 1_000, 1_000..3_400, blackout).arb.stats(), 1_000);
}

/// The filler gave ranges up and lost more than `lost` messages.
fn gave_up(s: &fairfeed_arb::stats::Stats, lost: u64) {
    assert!(
        s.requests_abandoned > 0 && s.lost_messages > lost,
        "{} abandoned, {} lost",
        s.requests_abandoned,
        s.lost_messages
    );
}

#[test]
fn a_long_outage_is_filled_whole_from_a_rate_limited_server() {
    // 2.4 s of a 1,000 packets/s line lost (bench faults' compound fault).
    let h = long_outage(filler(), 6_000, 1_000, 1_000..3_400);
    let s = h.arb.stats();
    assert_eq!((s.lost_messages, s.requests_abandoned, s.gaps_given_up), (0, 0, 0));
    assert!(h.out.hr_seqs() == (1..=6_000).collect::<Vec<_>>(), "the line is not whole and in order");
}

#[test]
fn a_long_outage_is_filled_at_the_paced_rate() {
    // The 2,400 missing packets need 2,400 requests (the server answers
    // packet by packet); at 1,500/s the line is whole ≈ 1.6 s after it
    // resumed, and no request was wasted on the server's rate limit.
    let h = long_outage(filler(), 6_000, 1_000, 1_000..3_400);
    let last_filled = h.out.hr_times().into_iter().find(|&(_, seq)| seq == 3_399).map(|(t, _)| t).unwrap();
    let resumed = 3_400 * 1_000 * US;
    let took = last_filled - resumed;
    assert!((1_500_000 * US..1_800_000 * US).contains(&took), "the gap took {took} ns to fill");
    assert_eq!(h.arb.stats().request_timeouts, 0);
}

#[test]
fn a_client_that_outruns_the_server_abandons_the_gap() {
    // The same outage with pacing far above the server's 2,000/s: the
    // server drops what comes over its rate, those requests time out, and
    // after their attempts the gap is given up — why the client paces.
    let mut cfg = filler();
    cfg.retransmit.as_mut().unwrap().requests_per_s = 1_000_000;
    cfg.retransmit.as_mut().unwrap().request_burst = 1_000;
    gave_up(long_outage(cfg, 6_000, 1_000, 1_000..3_400).arb.stats(), 0);
}

#[test]
fn a_server_that_is_down_holds_the_line_for_the_patience_once_not_per_gap() {
    // The retransmission server answers nothing at all. The first gap is
    // waited on for the patience (1 s here): it may be a partition that
    // heals. After that the server counts as down, and a later gap is
    // given up after its attempts alone (5 × 20 ms), as before patience.
    let mut cfg = filler();
    cfg.retransmit.as_mut().unwrap().patience_ns = 1_000_000 * US;
    let mut h = Harness::new(cfg).with_server(&clean(6_000), ServerConfig::default(), 200 * US);
    h.drop_requests = usize::MAX;
    for s in (1..=6_000u64).filter(|&s| s != 1_000 && s != 4_000) {
        h.arrive(s * 1_000 * US, 0, packet(s, 1));
    }
    h.run(u64::MAX);
    let out = |seq: u64| h.out.hr_times().into_iter().find(|&(_, s)| s == seq).map(|(t, _)| t).unwrap();
    let held = |seq: u64| out(seq) - seq * 1_000 * US;
    assert!(held(1_001) >= 1_000_000 * US, "the first gap was not waited on: {} ns", held(1_001));
    assert!(held(4_001) < 300_000 * US, "the second gap waited on a server known down: {} ns", held(4_001));
    assert_eq!(h.arb.stats().lost_messages, 2);
}
