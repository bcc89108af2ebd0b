//! Goal: a receiver in sequence order hands its application what a MoldUDP64
//! line would — strictly increasing sequence numbers, no duplicates, gaps
//! only where a message never came within the gap wait (each counted) — and
//! never releases a message before its deadline or before its predecessor,
//! whatever order, delay, loss and duplication its copies arrive with.
//!
//! Method: overlay data packets built by hand (deadlines that go backwards
//! as a controller lowering its offset makes them), each copied 0 to 3 times
//! with random delays, some past the deadline and some past the gap wait;
//! the receiver driven in virtual time exactly at its own timeouts, as the
//! shells drive it. Properties checked on every run; a second group with no
//! loss and delays inside the gap wait must deliver everything, at
//! `max(deadline, predecessor's release)`.

use fairfeed_tree::node::{NodeConfig, Receiver, ReleaseOrder, Transmit};
use fairfeed_wire::overlay::{HeaderRepr, Kind, HEADER_LEN};
use proptest::prelude::*;

struct Discard;

impl Transmit for Discard {
    fn send(&mut self, _to: u32, _bytes: &[u8]) {}
}

const GAP_WAIT_NS: u64 = 2_000_000;
const SPACING_NS: u64 = 100_000;
const OFFSET_NS: u64 = 1_000_000;

fn packet(sequence: u64, send_ns: u64, deadline_ns: u64) -> Vec<u8> {
    let payload = sequence.to_be_bytes();
    let mut b = vec![0u8; HEADER_LEN + payload.len()];
    let h = HeaderRepr {
        kind: Some(Kind::Data),
        sequence,
        send_ns,
        deadline_ns,
        origin: 9,
        payload_len: payload.len() as u16,
        ..HeaderRepr::default()
    };
    h.emit(&mut b).expect("room for the header");
    b[HEADER_LEN..].copy_from_slice(&payload);
    b
}

/// One message: its deadline jitter and its copies' delays (ns after send).
#[derive(Debug, Clone)]
struct Msg {
    jitter_ns: i64,
    delays_ns: Vec<u64>,
}

/// A release: sequence, deadline, first arrival, when it was released.
#[derive(Debug, Clone, Copy)]
struct Out {
    sequence: u64,
    deadline_ns: u64,
    arrival_ns: u64,
    at_ns: u64,
}

/// Drives one receiver through `msgs`; returns its releases and the receiver.
fn drive(msgs: &[Msg], hold: bool) -> (Vec<Out>, Receiver) {
    let cfg = NodeConfig {
        hold_and_release: hold,
        order: ReleaseOrder::Sequence { gap_wait_ns: GAP_WAIT_NS },
        ..NodeConfig::default()
    };
    let mut rx = Receiver::new(1, 0, cfg);
    let mut arrivals: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let seq = i as u64 + 1;
        let send = 10_000_000 + seq * SPACING_NS;
        let deadline = (send + OFFSET_NS).saturating_add_signed(m.jitter_ns);
        for &d in &m.delays_ns {
            arrivals.push((send + d, seq, packet(seq, send, deadline)));
        }
    }
    arrivals.sort_by_key(|a| (a.0, a.1));
    let mut out = Vec::new();
    let mut next = 0;
    let mut now = 0;
    loop {
        let timer = rx.next_timeout().unwrap_or(u64::MAX);
        let arrival = arrivals.get(next).map_or(u64::MAX, |a| a.0);
        if timer == u64::MAX && arrival == u64::MAX {
            break;
        }
        if rx.held() == 0 && arrival == u64::MAX {
            break;
        }
        if timer <= arrival {
            now = now.max(timer);
            rx.handle_timeout(now, &mut Discard);
        } else {
            now = now.max(arrival);
            rx.handle_packet(now, &arrivals[next].2);
            next += 1;
        }
        while let Some(r) = rx.poll_release() {
            assert_eq!(r.payload.as_slice(), r.sequence.to_be_bytes(), "the payload travels with its sequence");
            // Driven exactly at its timeouts, the receiver releases when each message fell due.
            assert_eq!(r.due_ns, now, "seq {} released at {now}, due at {}", r.sequence, r.due_ns);
            out.push(Out { sequence: r.sequence, deadline_ns: r.deadline_ns, arrival_ns: r.arrival_ns, at_ns: now });
        }
    }
    (out, rx)
}

fn msg(max_delay_ns: u64, loss: bool) -> impl Strategy<Value = Msg> {
    let copies = if loss { 0..=3usize } else { 1..=3usize };
    (-300_000i64..=300_000, prop::collection::vec(0..max_delay_ns, copies))
        .prop_map(|(jitter_ns, delays_ns)| Msg { jitter_ns, delays_ns })
}

fn check_line(out: &[Out], rx: &Receiver, hold: bool) {
    for w in out.windows(2) {
        assert!(w[1].sequence > w[0].sequence, "strictly increasing: {} after {}", w[1].sequence, w[0].sequence);
        assert!(w[1].at_ns >= w[0].at_ns, "releases in time order");
    }
    for o in out {
        if hold {
            assert!(
                o.at_ns >= o.deadline_ns,
                "seq {} released at {} before its deadline {}",
                o.sequence,
                o.at_ns,
                o.deadline_ns
            );
        }
        assert!(o.at_ns >= o.arrival_ns);
    }
    let s = &rx.stats;
    if let (Some(first), Some(last)) = (out.first(), out.last()) {
        // Every sequence between the first and the last release is accounted
        // for: released, or in a gap that was counted.
        assert_eq!(last.sequence - first.sequence + 1, out.len() as u64 + s.gap_packets, "{s:?}");
    }
    assert_eq!(s.released, out.len() as u64);
    assert_eq!(rx.held(), 0, "nothing left behind");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Losses, duplicates, copies late past their deadline and past the gap wait.
    #[test]
    fn any_arrival_order_gives_a_moldudp64_line(
        msgs in prop::collection::vec(msg(6_000_000, true), 1..200),
        hold in any::<bool>(),
    ) {
        let (out, rx) = drive(&msgs, hold);
        check_line(&out, &rx, hold);
        // A message none of whose copies came is never released.
        for o in &out {
            prop_assert!(!msgs[o.sequence as usize - 1].delays_ns.is_empty());
        }
    }

    /// Nothing lost, every copy within the gap wait: everything delivered, in
    /// order, each at max(its deadline, its arrival, its predecessor's release).
    #[test]
    fn without_loss_everything_is_delivered_at_its_time(
        msgs in prop::collection::vec(msg(1_500_000, false), 1..200),
    ) {
        let (out, rx) = drive(&msgs, true);
        check_line(&out, &rx, true);
        // Up before the session, the line starts at message 1, however late it comes (within the gap wait).
        prop_assert_eq!(out[0].sequence, 1);
        prop_assert_eq!(out.len(), msgs.len());
        prop_assert_eq!((rx.stats.gaps, rx.stats.gap_packets), (0, 0));
        let mut prev = 0;
        for o in &out {
            let due = o.deadline_ns.max(o.arrival_ns).max(prev);
            prop_assert_eq!(o.at_ns, due, "seq {}", o.sequence);
            prev = o.at_ns;
        }
    }
}

/// A hand-made case: 2 lost, 3 and 4 wait for it until the gap wait ends,
/// then go together; 2's copy after that is dropped, not delivered.
#[test]
fn a_gap_holds_its_successors_for_the_gap_wait_then_is_given_up() {
    let ms = 1_000_000;
    let msgs = vec![
        Msg { jitter_ns: 0, delays_ns: vec![50_000] },
        Msg { jitter_ns: 0, delays_ns: vec![9 * ms] },
        Msg { jitter_ns: 0, delays_ns: vec![60_000, 70_000] },
        Msg { jitter_ns: -200_000, delays_ns: vec![40_000] },
        Msg { jitter_ns: 0, delays_ns: vec![30_000] },
    ];
    let (out, rx) = drive(&msgs, true);
    let seqs: Vec<u64> = out.iter().map(|o| o.sequence).collect();
    assert_eq!(seqs, vec![1, 3, 4, 5]);
    let deadline3 = 10_000_000 + 3 * SPACING_NS + OFFSET_NS;
    assert_eq!(out[1].at_ns, deadline3 + GAP_WAIT_NS, "3 waits the gap wait past its deadline");
    assert_eq!(out[2].at_ns, out[1].at_ns, "4 (an earlier deadline) goes right after 3");
    assert_eq!((rx.stats.gaps, rx.stats.gap_packets, rx.stats.after_gap), (1, 1, 1));
    assert_eq!(rx.stats.duplicates, 1, "3's second copy");
    assert!(rx.stats.held_by_gap >= 3, "{:?}", rx.stats);
}

/// A late copy of a missing message filled inside the gap wait is released
/// at once, and its successors right after it, in order.
#[test]
fn a_late_copy_inside_the_gap_wait_fills_the_gap() {
    let msgs = vec![
        Msg { jitter_ns: 0, delays_ns: vec![50_000] },
        Msg { jitter_ns: 0, delays_ns: vec![2_500_000] },
        Msg { jitter_ns: 0, delays_ns: vec![60_000] },
    ];
    let (out, rx) = drive(&msgs, true);
    assert_eq!(out.iter().map(|o| o.sequence).collect::<Vec<_>>(), vec![1, 2, 3]);
    let arrival2 = 10_000_000 + 2 * SPACING_NS + 2_500_000;
    assert_eq!((out[1].at_ns, out[2].at_ns), (arrival2, arrival2));
    assert_eq!(rx.stats.late, 1);
    assert_eq!(rx.stats.gaps, 0);
}

/// A receiver that was descheduled reads a backlog in one batch, a message
/// behind its successor: the whole batch is taken in before any gap is
/// judged (gaps are given up at a timeout, never on an arrival).
#[test]
fn a_backlog_read_in_one_batch_is_not_cut_by_a_gap() {
    let cfg = NodeConfig { order: ReleaseOrder::Sequence { gap_wait_ns: GAP_WAIT_NS }, ..NodeConfig::default() };
    let mut rx = Receiver::new(1, 0, cfg);
    let deadline = |seq: u64| 1_000_000 + seq * SPACING_NS;
    // Far past every deadline and gap wait: the node was stalled.
    let t = 50_000_000;
    for seq in [1u64, 3, 2, 5, 4] {
        rx.handle_packet(t, &packet(seq, 0, deadline(seq)));
    }
    rx.handle_timeout(t, &mut Discard);
    let mut seqs = Vec::new();
    while let Some(r) = rx.poll_release() {
        seqs.push(r.sequence);
    }
    assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    assert_eq!((rx.stats.gaps, rx.stats.after_gap, rx.stats.late), (0, 0, 5));
}

/// A receiver that joins a running session (its first packet is number
/// 1,000) waits the gap wait once for what might come before, then starts
/// the line where it joined — no gap counted, nothing dropped after.
#[test]
fn a_late_joiner_starts_where_it_joined_after_one_gap_wait() {
    let cfg = NodeConfig { order: ReleaseOrder::Sequence { gap_wait_ns: GAP_WAIT_NS }, ..NodeConfig::default() };
    let mut rx = Receiver::new(1, 0, cfg);
    for seq in 1_000u64..1_005 {
        rx.handle_packet(seq * 1_000, &packet(seq, 0, 2_000_000 + seq));
    }
    let first_due = rx.next_timeout().unwrap_or(u64::MAX);
    assert_eq!(first_due, 2_000_000 + 1_000 + GAP_WAIT_NS, "the first release waits the gap wait");
    rx.handle_timeout(first_due, &mut Discard);
    let mut seqs = Vec::new();
    while let Some(r) = rx.poll_release() {
        seqs.push(r.sequence);
    }
    assert_eq!(seqs, (1_000..1_005).collect::<Vec<_>>());
    assert_eq!((rx.stats.gaps, rx.stats.gap_packets, rx.stats.after_gap), (0, 0, 0));
}

/// The same joiner told it joins a running session (`joins_running`: a
/// receiver joining from a snapshot, or placed while the feed runs) starts
/// at its first message's deadline, as every other receiver releases it —
/// one that waited the gap wait released a gap wait's worth of messages
/// that much late. A predecessor arriving before that deadline still comes
/// first; one arriving after is behind the line's start.
#[test]
fn a_joiner_of_a_running_session_starts_at_its_first_deadline() {
    let cfg = NodeConfig {
        order: ReleaseOrder::Sequence { gap_wait_ns: GAP_WAIT_NS },
        joins_running: true,
        ..NodeConfig::default()
    };
    let mut rx = Receiver::new(1, 0, cfg);
    for seq in 1_001u64..1_005 {
        rx.handle_packet(seq * 1_000, &packet(seq, 0, 2_000_000 + seq));
    }
    assert_eq!(rx.next_timeout().unwrap_or(u64::MAX), 2_000_000 + 1_001, "no gap wait before the first release");
    // 1,000 comes (a slower path) before 1,001's deadline: the line starts there.
    rx.handle_packet(1_500_000, &packet(1_000, 0, 2_000_000 + 1_000));
    assert_eq!(rx.next_timeout().unwrap_or(u64::MAX), 2_000_000 + 1_000);
    let mut released = Vec::new();
    for _ in 0..8 {
        let t = rx.next_timeout().unwrap_or(u64::MAX);
        if t == u64::MAX || t > 2_100_000 {
            break;
        }
        rx.handle_timeout(t, &mut Discard);
        while let Some(r) = rx.poll_release() {
            released.push((r.sequence, r.due_ns));
        }
    }
    let want: Vec<(u64, u64)> = (1_000u64..1_005).map(|s| (s, 2_000_000 + s)).collect();
    assert_eq!(released, want, "each at its own deadline");
    // 999 after the start: not delivered out of order.
    rx.handle_packet(2_050_000, &packet(999, 0, 2_000_000 + 999));
    assert_eq!(rx.stats.after_gap, 1);
    assert_eq!((rx.stats.gaps, rx.stats.gap_packets, rx.stats.late), (0, 0, 0));
}
