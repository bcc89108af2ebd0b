//! The follower, server connection, admission and joiner, alone and together.

use std::net::{IpAddr, Ipv4Addr};

use fairfeed_wire::moldudp64::{Packet, PacketBuilder, Session};
use fairfeed_wire::soupbintcp::PacketRepr as Soup;
use proptest::prelude::*;

use super::join::{JoinError, Joiner, Stream};
use super::serve::{Admission, Close, Credentials, Refused, ServerConn, LOGIN_TIMEOUT_NS, STALL_TIMEOUT_NS};
use super::*;
use crate::book::Books;
use crate::gen::{GenConfig, Generator};

const MS: u64 = 1_000_000;

fn feed(seed: u64, messages: u64, symbols: u32, all_types: bool) -> Vec<Vec<u8>> {
    let cfg = GenConfig { seed, messages, symbols, all_types, ..GenConfig::default() };
    Generator::new(cfg).unwrap().map(|p| p.payload).collect()
}

/// Books built from every message of `packets` (the reference).
fn books_of(packets: &[Vec<u8>]) -> Books {
    let mut b = Books::new();
    for p in packets {
        for m in Packet::new_checked(&p[..]).unwrap().messages() {
            b.apply(m.unwrap()).unwrap();
        }
    }
    b
}

/// What an application reading the joiner's output sees: its books, and
/// that the sequence numbers run without a gap or a repeat.
#[derive(Default)]
struct App {
    books: Books,
    next: Option<u64>,
    packets: usize,
}

impl App {
    fn take(&mut self, p: &[u8]) {
        let pkt = Packet::new_checked(p).unwrap();
        self.packets += 1;
        if pkt.message_count() == 0 {
            return;
        }
        if let Some(n) = self.next {
            assert_eq!(pkt.sequence(), n, "the line has a gap or a repeat");
        }
        self.next = Some(pkt.next_sequence());
        for m in pkt.messages() {
            self.books.apply(m.unwrap()).unwrap();
        }
    }
}

/// Runs one fetch: the joiner's login into a server connection over the
/// follower, the server's bytes back in chunks of `chunk`.
fn fetch(j: &mut Joiner, f: &mut Follower, now: u64, chunk: usize, app: &mut App) -> Option<Close> {
    let login = j.login(now);
    let mut conn = ServerConn::new(now);
    conn.on_bytes(now, &login, &Credentials::default(), &mut || f.snapshot()).unwrap();
    // The joiner stops reading at End of Snapshot; what follows (End of
    // Session) is still written, as a kernel would take it.
    let mut reading = true;
    while !conn.unsent().is_empty() {
        let n = conn.unsent().len().min(chunk);
        let bytes = conn.unsent()[..n].to_vec();
        conn.wrote(n, now);
        if reading && j.on_stream(now, &bytes, &mut |p| app.take(p)) == Stream::Finished {
            reading = false;
        }
    }
    conn.finished().cloned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A receiver holding the live feed from packet `from` fetches a snapshot
    /// taken after packet `at` (≥ from): its application's books, snapshot
    /// then live, equal the books of the whole feed, on a line without gaps.
    #[test]
    fn snapshot_then_live_rebuilds_the_whole_feeds_books(
        seed in 0u64..1_000, symbols in 1u32..20, all_types: bool,
        from_frac in 0.0f64..1.0, at_frac in 0.0f64..1.0, chunk in 1usize..4_000,
    ) {
        let packets = feed(seed, 3_000, symbols, all_types);
        let n = packets.len();
        let from = ((n as f64 * from_frac) as usize).min(n - 1);
        let at = from + ((n - from) as f64 * at_frac) as usize;
        let mut f = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 20);
        for p in &packets[..at] {
            f.on_packet(0, p);
        }
        let mut j = Joiner::new(0, "", "");
        let mut app = App::default();
        for p in &packets[from..at] {
            j.on_live(0, p, &mut |q| app.take(q));
        }
        prop_assert_eq!(fetch(&mut j, &mut f, 0, chunk, &mut app), Some(Close::Done));
        for p in &packets[at..] {
            f.on_packet(0, p);
            j.on_live(0, p, &mut |q| app.take(q));
        }
        prop_assert!(j.joined(), "{:?}", j.stats());
        let want = books_of(&packets);
        prop_assert_eq!(f.books().diff(&want), None);
        prop_assert_eq!(app.books.diff(&want), None);
        prop_assert!(j.stats().snapshot_messages as usize <= f.books().stats().messages as usize);
    }
}

#[test]
fn a_and_b_lines_into_one_follower_apply_each_message_once() {
    let packets = feed(3, 2_000, 5, true);
    let mut f = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 20);
    // B runs two packets behind A, and A loses every seventh packet.
    for i in 0..packets.len() + 2 {
        if i < packets.len() && i % 7 != 3 {
            f.on_packet(i as u64, &packets[i]);
        }
        if i >= 2 {
            f.on_packet(i as u64, &packets[i - 2]);
        }
    }
    assert_eq!(f.standing(), Ok(()));
    assert_eq!(f.books().diff(&books_of(&packets)), None);
    assert!(f.stats().duplicates > 0 && f.stats().reordered > 0, "{:?}", f.stats());
}

#[test]
fn a_gap_never_filled_makes_the_books_stale_and_refused() {
    let packets = feed(4, 1_000, 3, false);
    let mut f = Follower::new(10 * MS, 1 << 20);
    f.on_packet(0, &packets[0]);
    f.on_packet(MS, &packets[2]);
    assert_eq!(f.standing(), Ok(()), "a gap is waited for");
    assert_eq!(f.next_due(), 11 * MS);
    f.on_tick(5 * MS);
    assert_eq!(f.standing(), Ok(()));
    f.on_tick(11 * MS);
    assert!(matches!(f.standing(), Err(NotServing::Gap { .. })), "{:?}", f.standing());
    assert!(f.snapshot().is_err());
    // The rest of the session changes nothing; a new session from 1 serves again.
    f.on_packet(12 * MS, &packets[1]);
    assert!(f.standing().is_err());
    let fresh = renamed(&packets[0], "NEXTDAY001");
    f.on_packet(13 * MS, &fresh);
    assert_eq!(f.standing(), Ok(()));
    assert_eq!(f.stats().sessions, 2);
}

fn renamed(p: &[u8], session: &str) -> Vec<u8> {
    let mut q = p.to_vec();
    Packet::new_unchecked(&mut q[..]).set_session(Session::from_str_padded(session));
    q
}

#[test]
fn a_follower_that_starts_mid_session_refuses_to_serve() {
    let packets = feed(5, 1_000, 3, false);
    let mut f = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 20);
    assert_eq!(f.snapshot().unwrap_err(), NotServing::NoFeed);
    f.on_packet(0, &packets[3]);
    assert!(matches!(f.snapshot(), Err(NotServing::JoinedLate { .. })));
}

#[test]
fn another_session_and_garbage_are_dropped_and_counted() {
    let packets = feed(6, 1_000, 3, false);
    let mut f = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 20);
    f.on_packet(0, &packets[0]);
    f.on_packet(0, &renamed(&packets[1], "INJECTED01"));
    f.on_packet(0, b"not a packet");
    let mut truncated = packets[1].clone();
    truncated.truncate(truncated.len() - 1);
    f.on_packet(0, &truncated);
    for p in &packets[1..] {
        f.on_packet(0, p);
    }
    assert_eq!(f.standing(), Ok(()));
    assert_eq!(f.books().diff(&books_of(&packets)), None);
    assert_eq!((f.stats().other_session, f.stats().malformed), (1, 2));
}

#[test]
fn one_snapshot_is_built_per_feed_position() {
    let packets = feed(7, 1_000, 3, false);
    let mut f = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 20);
    f.on_packet(0, &packets[0]);
    let a = f.snapshot().unwrap();
    let b = f.snapshot().unwrap();
    assert!(std::sync::Arc::ptr_eq(&a.frames, &b.frames));
    f.on_packet(0, &packets[1]);
    let c = f.snapshot().unwrap();
    assert!(c.next_sequence > a.next_sequence);
    assert_eq!(f.stats().snapshots_built, 2);
}

fn serving() -> Follower {
    let mut f = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 20);
    for p in feed(8, 500, 3, false).iter().take(5) {
        f.on_packet(0, p);
    }
    f
}

fn login_bytes(user: &str, pass: &str) -> Vec<u8> {
    let mut v = Vec::new();
    push_frame(
        &mut v,
        Soup::LoginRequest {
            username: Alpha::from_str_padded(user),
            password: Alpha::from_str_padded(pass),
            session: Alpha([b' '; 10]),
            sequence: 1,
        },
    );
    v
}

use fairfeed_wire::Alpha;

#[test]
fn misbehaving_clients_are_closed_with_a_reason() {
    let mut f = serving();
    let creds = Credentials { user_pass: Some(("firm1".into(), "secret".into())) };
    let mut snap = || f.snapshot();

    let mut c = ServerConn::new(0);
    assert_eq!(c.on_tick(LOGIN_TIMEOUT_NS - 1), Ok(()));
    assert_eq!(c.on_tick(LOGIN_TIMEOUT_NS), Err(Close::LoginTimeout));

    let mut c = ServerConn::new(0);
    assert!(matches!(c.on_bytes(0, &[0, 0, 1], &creds, &mut snap), Err(Close::Garbage(_))));

    let mut c = ServerConn::new(0);
    assert_eq!(c.on_bytes(0, &[0xff; 300], &creds, &mut snap), Err(Close::Oversized));

    let mut c = ServerConn::new(0);
    let mut u = Vec::new();
    push_frame(&mut u, Soup::UnsequencedData(b"hello"));
    assert_eq!(c.on_bytes(0, &u, &creds, &mut snap), Err(Close::Unexpected('U')));

    // A wrong password is answered with Login Rejected `A`, then closed.
    let mut c = ServerConn::new(0);
    c.on_bytes(0, &login_bytes("firm1", "guess"), &creds, &mut snap).unwrap();
    assert_eq!(c.unsent(), &[0, 2, b'J', b'A']);
    c.wrote(4, 0);
    assert_eq!(c.finished(), Some(&Close::NotAuthorized));

    // A client that reads up to End of Snapshot and leaves got its snapshot.
    let mut c = ServerConn::new(0);
    c.on_bytes(0, &login_bytes("firm1", "secret"), &creds, &mut snap).unwrap();
    assert_eq!(c.on_peer_closed(), Close::Logout, "it left before the snapshot");
    let n = c.unsent().len() - 3;
    c.wrote(n, 0);
    assert_eq!(c.on_peer_closed(), Close::Done);
    // The right one gets the snapshot; one that stops reading is cut off.
    let mut c = ServerConn::new(0);
    let login = login_bytes("firm1", "secret");
    c.on_bytes(0, &login[..10], &creds, &mut snap).unwrap();
    c.on_bytes(0, &login[10..], &creds, &mut snap).unwrap();
    assert!(c.unsent().len() > 100);
    c.wrote(100, MS);
    assert_eq!(c.next_due(), MS + STALL_TIMEOUT_NS);
    assert_eq!(c.on_tick(MS + STALL_TIMEOUT_NS), Err(Close::Stalled));
}

#[test]
fn stale_books_are_answered_with_session_not_available() {
    let mut f = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 20);
    let mut c = ServerConn::new(0);
    c.on_bytes(0, &login_bytes("", ""), &Credentials::default(), &mut || f.snapshot()).unwrap();
    assert_eq!(c.unsent(), &[0, 2, b'J', b'S']);
    c.wrote(4, 0);
    assert_eq!(c.finished(), Some(&Close::NotServing(NotServing::NoFeed)));
}

#[test]
fn admission_bounds_connections_per_address_and_per_second() {
    let a = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let b = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
    let mut adm = Admission::new(3, 2, 3);
    assert_eq!(adm.admit(a, 0), Ok(()));
    assert_eq!(adm.admit(a, 0), Ok(()));
    assert_eq!(adm.admit(a, 0), Err(Refused::PerAddress(2)));
    adm.release(a);
    assert_eq!(adm.admit(a, 0), Ok(()));
    adm.release(a);
    assert_eq!(adm.admit(a, 0), Err(Refused::Rate(3)), "a fourth connect in the same second");
    assert_eq!(adm.admit(a, 1_000_000_000), Ok(()), "the next second");
    assert_eq!(adm.admit(b, 1_000_000_000), Ok(()));
    assert_eq!(adm.open(), 3);
    assert_eq!(adm.admit(b, 1_000_000_000), Err(Refused::Full(3)));
    adm.release(a);
    assert_eq!(adm.admit(b, 1_000_000_000), Ok(()));
}

/// A generated feed of `n` messages, a server that has followed its first
/// ten packets, and a joiner with its application, nothing fetched yet.
fn joiner_after_ten(seed: u64, n: u64) -> (Vec<Vec<u8>>, Follower, Joiner, App) {
    let packets = feed(seed, n, 4, false);
    let mut f = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 20);
    for p in &packets[..10] {
        f.on_packet(0, p);
    }
    (packets, f, Joiner::new(0, "", ""), App::default())
}

#[test]
fn a_snapshot_behind_the_live_feed_is_fetched_again() {
    let (packets, mut f, mut j, mut app) = joiner_after_ten(9, 2_000);
    for p in &packets[20..30] {
        j.on_live(0, p, &mut |q| app.take(q));
    }
    fetch(&mut j, &mut f, 0, 1 << 20, &mut app);
    assert!(!j.joined());
    assert_eq!(j.stats().failures.get("behind"), Some(&1));
    assert!(!j.want_fetch(50 * MS) && j.want_fetch(100 * MS), "a backoff before the next fetch");
    for p in &packets[10..40] {
        f.on_packet(0, p);
    }
    fetch(&mut j, &mut f, 100 * MS, 1 << 20, &mut app);
    assert!(j.joined());
    for p in &packets[30..] {
        f.on_packet(0, p);
        j.on_live(0, p, &mut |q| app.take(q));
    }
    assert_eq!(app.books.diff(&books_of(&packets)), None);
    assert_eq!(j.stats().join_ns, 100 * MS);
}

/// A joiner fetches at once, and its place in the tree may come later: a
/// snapshot asked for before the live line arrived is fetched again at once
/// (the server has followed the feed since), not after the backoff; behind
/// again, the server lags the live line, and the backoff applies.
#[test]
fn a_snapshot_asked_for_before_the_live_line_came_is_fetched_again_at_once() {
    let (packets, mut f, mut j, mut app) = joiner_after_ten(9, 2_000);
    fetch(&mut j, &mut f, 0, 1 << 20, &mut app);
    for p in &packets[10..30] {
        f.on_packet(5 * MS, p);
    }
    for p in &packets[20..30] {
        j.on_live(5 * MS, p, &mut |q| app.take(q));
    }
    assert_eq!(j.stats().failures.get("behind"), Some(&1));
    assert!(j.want_fetch(5 * MS), "no backoff: the snapshot was older than the live line");
    // The server now lags the live line: behind again, and the backoff applies.
    let mut lagging = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 20);
    for p in &packets[..15] {
        lagging.on_packet(0, p);
    }
    fetch(&mut j, &mut lagging, 6 * MS, 1 << 20, &mut app);
    assert_eq!(j.stats().failures.get("behind"), Some(&2));
    assert!(!j.want_fetch(50 * MS) && j.want_fetch(106 * MS), "a backoff before the next fetch");
    fetch(&mut j, &mut f, 106 * MS, 1 << 20, &mut app);
    assert!(j.joined());
    for p in &packets[30..] {
        j.on_live(200 * MS, p, &mut |q| app.take(q));
    }
    assert_eq!(app.books.diff(&books_of(&packets)), None);
}

#[test]
fn a_joiner_waits_for_a_live_packet_before_it_joins() {
    let (packets, mut f, mut j, mut app) = joiner_after_ten(10, 1_000);
    fetch(&mut j, &mut f, 0, 1 << 20, &mut app);
    assert!(!j.joined() && app.packets == 0, "nothing is delivered before the live feed is held");
    for p in &packets[5..] {
        j.on_live(0, p, &mut |q| app.take(q));
    }
    assert!(j.joined());
    assert!(j.stats().live_trimmed > 0);
    assert_eq!(app.books.diff(&books_of(&packets)), None);
}

#[test]
fn failed_fetches_are_typed_counted_and_retried() {
    let packets = feed(11, 1_000, 4, false);
    let mut j = Joiner::new(0, "", "");
    let mut out = |_: &[u8]| panic!("nothing delivered");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            {
                let mut v = Vec::new();
                push_frame(&mut v, Soup::LoginRejected { reason: b'S' });
                v
            },
            "rejected",
        ),
        (vec![0, 0], "garbage"),
        (
            {
                let mut v = Vec::new();
                push_frame(&mut v, Soup::LoginAccepted { session: Alpha::from_str_padded("S"), sequence: 1 });
                push_frame(&mut v, Soup::SequencedData(b"Zbad"));
                v
            },
            "not_itch",
        ),
        (
            {
                let mut v = Vec::new();
                push_frame(&mut v, Soup::EndOfSession);
                v
            },
            "closed",
        ),
    ];
    let mut now = 0;
    for (bytes, kind) in &cases {
        while !j.want_fetch(now) {
            now += 100 * MS;
        }
        j.login(now);
        assert_eq!(j.on_stream(now, bytes, &mut out), Stream::Finished);
        assert_eq!(j.stats().failures.get(kind), Some(&1), "{kind}: {:?}", j.stats());
    }
    // More snapshot messages than the feed had before its end: refused.
    while !j.want_fetch(now) {
        now += 100 * MS;
    }
    j.login(now);
    let mut v = Vec::new();
    push_frame(&mut v, Soup::LoginAccepted { session: Alpha::from_str_padded("S"), sequence: 1 });
    let first = Packet::new_checked(&packets[0][..]).unwrap();
    for m in first.messages().take(3) {
        push_frame(&mut v, Soup::SequencedData(m.unwrap()));
    }
    let mut end = [0u8; fairfeed_wire::glimpse::END_OF_SNAPSHOT_LEN];
    fairfeed_wire::glimpse::EndOfSnapshot { next_sequence: 3 }.emit(&mut end);
    push_frame(&mut v, Soup::SequencedData(&end));
    j.on_stream(now, &v, &mut out);
    assert_eq!(j.stats().failures.get("too_long"), Some(&1));
    // A fetch that never ends times out; a closed connection is a failure.
    while !j.want_fetch(now) {
        now += 100 * MS;
    }
    j.login(now);
    assert!(j.on_tick(now + super::join::FETCH_TIMEOUT_NS));
    while !j.want_fetch(now) {
        now += 100 * MS;
    }
    j.login(now);
    j.stream_closed(now);
    assert_eq!(j.stats().failures.get("timeout"), Some(&1));
    assert_eq!(j.stats().failures.get("closed"), Some(&2));
    assert!(matches!(JoinError::Behind { snapshot_next: 1, live_first: 2 }.kind(), "behind"));
}

#[test]
fn a_live_packet_straddling_the_snapshot_is_cut_at_it() {
    let s = Session::from_str_padded("CUT0000001");
    let mut buf = [0u8; 200];
    let mut b = PacketBuilder::new(&mut buf, s, 5).unwrap();
    for i in 0..4u8 {
        b.push(&[b'W', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, i]).unwrap();
    }
    let n = b.finish();
    let mut next = 7;
    let mut got = Vec::new();
    let cut = super::join::deliver_from(&buf[..n], &mut next, &mut |p| got.push(p.to_vec()));
    assert_eq!(cut, 2);
    assert_eq!(next, 9);
    let p = Packet::new_checked(&got[0][..]).unwrap();
    assert_eq!((p.sequence(), p.message_count()), (7, 2));
    assert_eq!(p.messages().next().unwrap().unwrap()[11], 2);
}
