//! Joiners that start from a snapshot, in the churn simulator, with the
//! cores the processes run: the sender's snapshot service is a
//! [`Follower`] (the books kept from the sender's own line) behind a
//! [`ServerConn`] (one SoupBinTCP login: `fairfeed snapshot-server`), and
//! each joiner's application sits behind a [`Joiner`] (a receiver's
//! `--snapshot`) that hands it the snapshot and then the live line. The
//! application's books are built from what it is handed and compared at
//! the end with books built from the whole feed, up to the last sequence
//! the application got.
//!
//! The feed is the generator's ITCH 5.0 over MoldUDP64 (one generated
//! packet per tree message). The snapshot's TCP connection is modelled as
//! link delays, not as packets: set-up and login take
//! [`CONNECT_ONE_WAYS`] one-way delays drawn from the run's link model, the
//! answer one more plus its bytes at [`SNAPSHOT_NS_PER_BYTE`]; TCP's own
//! retransmissions are not modelled.

use fairfeed_feed::book::Books;
use fairfeed_feed::gen::{GenConfig, Generator};
use fairfeed_feed::snapshot::join::Joiner;
use fairfeed_feed::snapshot::serve::{Credentials, ServerConn};
use fairfeed_feed::snapshot::{Follower, GAP_WAIT_DEFAULT_NS};
use fairfeed_wire::moldudp64::Packet;
use serde::Serialize;

/// The snapshot's bytes cross at 1 Gbit/s.
pub const SNAPSHOT_NS_PER_BYTE: u64 = 8;
/// One-way delays before the server reads a login: SYN, SYN-ACK, then ACK with the login.
pub const CONNECT_ONE_WAYS: u64 = 3;
/// Open orders the sender's snapshot service keeps at most.
const ORDERS_MAX: usize = 4_000_000;
/// Generated messages per tree message planned for, at most (the generator
/// packs 5.05 on average; it must not run dry before the feed ends).
const MESSAGES_PER_PACKET_PLANNED: u64 = 40;

/// The sender's side: the generated line and the snapshot service on it.
pub(super) struct Feed {
    gen: Generator,
    follower: Follower,
    /// Every packet sent, in order (the reference replays them).
    sent: Vec<Vec<u8>>,
}

impl Feed {
    /// A feed for `packets` tree messages at `rate` per second.
    pub fn new(seed: u64, packets: u64, rate: f64) -> Feed {
        let cfg = GenConfig {
            seed,
            messages: packets.saturating_mul(MESSAGES_PER_PACKET_PLANNED).max(100_000),
            rate_msgs_per_s: rate * 5.05,
            ..GenConfig::default()
        };
        let gen = Generator::new(cfg).expect("the default generator configuration is valid");
        Feed { gen, follower: Follower::new(GAP_WAIT_DEFAULT_NS, ORDERS_MAX), sent: Vec::new() }
    }

    /// The next packet to send down the tree (the generator's heartbeats are
    /// skipped: the tree keeps its own); the snapshot service follows it.
    pub fn next_packet(&mut self, now: u64) -> &[u8] {
        let p = loop {
            let p = self.gen.next().expect("the generator planned for more messages than the feed sends");
            if Packet::new_unchecked(&p.payload[..]).message_count() > 0 {
                break p.payload;
            }
        };
        self.follower.on_packet(now, &p);
        self.sent.push(p);
        self.sent.last().expect("just pushed")
    }

    /// One login at the snapshot service: what it answers (empty: it closed
    /// at once). The same server core as `fairfeed snapshot-server`.
    pub fn serve(&mut self, now: u64, login: &[u8]) -> Vec<u8> {
        let mut conn = ServerConn::new(now);
        let follower = &mut self.follower;
        match conn.on_bytes(now, login, &Credentials::default(), &mut || follower.snapshot()) {
            Ok(()) => conn.unsent().to_vec(),
            Err(_) => Vec::new(),
        }
    }
}

/// A joiner's application: its books, from the snapshot and the live line.
pub(super) struct App {
    pub joiner: Joiner,
    books: Books,
    /// The sequence number the application expects next (0: nothing yet).
    next: u64,
    /// Messages missing in its line (the tree lost them; the simulator has
    /// no retransmission).
    gaps: u64,
    /// When the first live message reached it (at its join).
    pub first_live_ns: Option<u64>,
}

impl App {
    pub fn new(now: u64) -> App {
        App { joiner: Joiner::new(now, "", ""), books: Books::new(), next: 0, gaps: 0, first_live_ns: None }
    }

    /// One released live packet of the receiver's.
    pub fn live(&mut self, now: u64, p: &[u8]) {
        let (books, next, gaps) = (&mut self.books, &mut self.next, &mut self.gaps);
        self.joiner.on_live(now, p, &mut |q| take(books, next, gaps, q));
        self.joined(now);
    }

    /// The snapshot connection's bytes, all of them (then it closed).
    pub fn stream(&mut self, now: u64, b: &[u8]) {
        let (books, next, gaps) = (&mut self.books, &mut self.next, &mut self.gaps);
        let s = self.joiner.on_stream(now, b, &mut |q| take(books, next, gaps, q));
        if s == fairfeed_feed::snapshot::join::Stream::Open {
            self.joiner.stream_closed(now);
        }
        self.joined(now);
    }

    fn joined(&mut self, now: u64) {
        if self.first_live_ns.is_none() && self.joiner.joined() {
            self.first_live_ns = Some(now);
        }
    }
}

/// One packet handed to the application: its messages into the books.
fn take(books: &mut Books, next: &mut u64, gaps: &mut u64, p: &[u8]) {
    let Ok(pkt) = Packet::new_checked(p) else { return };
    if *next > 0 && pkt.sequence() > *next {
        *gaps += pkt.sequence() - *next;
    }
    for m in pkt.messages().flatten() {
        let _ = books.apply(m);
    }
    *next = (*next).max(pkt.next_sequence());
}

/// Joiners' books against the whole feed's.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct BookCheck {
    /// Joiners whose application got a snapshot and a live line.
    pub books_checked: u64,
    /// Of them, lines with messages missing (counted in `lost` too): their
    /// books are compared but expected to differ.
    pub books_with_gaps: u64,
    /// Of the whole lines, books that differ from the whole feed's.
    pub books_differ: u64,
    /// Messages missing in the joiners' lines.
    pub join_gaps: u64,
    /// Snapshots the joiners fetched, and of them those that failed (most
    /// often one behind the live line, fetched again).
    pub snapshot_fetches: u64,
    pub snapshot_fetch_failures: u64,
}

impl BookCheck {
    pub fn add(&mut self, o: &BookCheck) {
        self.books_checked += o.books_checked;
        self.books_with_gaps += o.books_with_gaps;
        self.books_differ += o.books_differ;
        self.join_gaps += o.join_gaps;
        self.snapshot_fetches += o.snapshot_fetches;
        self.snapshot_fetch_failures += o.snapshot_fetch_failures;
    }
}

/// Replays the feed once and compares each joiner's books with the feed's
/// at the last sequence its application got.
pub(super) fn check<'a>(feed: &Feed, apps: impl Iterator<Item = &'a App>) -> BookCheck {
    let apps: Vec<&App> = apps.collect();
    let mut c = BookCheck::default();
    for a in &apps {
        let s = a.joiner.stats();
        c.snapshot_fetches += s.attempts;
        c.snapshot_fetch_failures += s.failures.values().sum::<u64>();
    }
    let mut marks: Vec<&App> = apps.into_iter().filter(|a| a.first_live_ns.is_some() && a.next > 1).collect();
    marks.sort_by_key(|a| a.next);
    c.books_checked = marks.len() as u64;
    let mut reference = Books::new();
    let mut at = 0;
    for p in &feed.sent {
        let pkt = Packet::new_unchecked(&p[..]);
        for (seq, m) in (pkt.sequence()..).zip(pkt.messages().flatten()) {
            let _ = reference.apply(m);
            while let Some(a) = marks.get(at).filter(|a| a.next == seq + 1) {
                c.join_gaps += a.gaps;
                if a.gaps > 0 {
                    c.books_with_gaps += 1;
                } else if reference.diff(&a.books).is_some() {
                    c.books_differ += 1;
                }
                at += 1;
            }
        }
    }
    // A line that ran past the feed (it cannot): counted as differing.
    c.books_differ += (marks.len() - at) as u64;
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A feed of `n` packets, and an application that joins after `at` of them.
    fn joined_after(at: usize, n: usize, skip: Option<usize>) -> (Feed, App) {
        let mut feed = Feed::new(7, n as u64, 1_000.0);
        let mut app = App::new(0);
        let mut live = Vec::new();
        for i in 0..n {
            let p = feed.next_packet(i as u64).to_vec();
            if i == at {
                let login = app.joiner.login(i as u64);
                let answer = feed.serve(i as u64, &login);
                assert!(answer.len() > 100, "a snapshot, not a refusal");
                app.stream(i as u64, &answer);
            }
            if i >= at && Some(i) != skip {
                live.push(p);
            }
        }
        for (i, p) in live.iter().enumerate() {
            app.live((n + i) as u64, p);
        }
        (feed, app)
    }

    #[test]
    fn a_joiner_from_a_snapshot_has_the_whole_feeds_books() {
        let (feed, app) = joined_after(300, 1_000, None);
        assert!(app.joiner.joined() && app.first_live_ns.is_some());
        assert!(app.joiner.stats().snapshot_messages > 0);
        let c = check(&feed, [&app].into_iter());
        assert_eq!((c.books_checked, c.books_differ, c.books_with_gaps, c.join_gaps), (1, 0, 0, 0), "{c:?}");
    }

    #[test]
    fn a_line_with_a_hole_or_without_its_snapshot_is_caught() {
        let (feed, app) = joined_after(300, 1_000, Some(600));
        let c = check(&feed, [&app].into_iter());
        assert_eq!((c.books_checked, c.books_with_gaps), (1, 1), "{c:?}");
        assert!(c.join_gaps > 0);
        // The live line alone, no snapshot: a whole line from its start, wrong books.
        let (feed, whole) = joined_after(300, 1_000, None);
        let mut bare = App::new(0);
        let first_live = whole.joiner.stats().joined_at_sequence;
        for p in &feed.sent {
            let pkt = Packet::new_unchecked(&p[..]);
            if pkt.sequence() >= first_live {
                take(&mut bare.books, &mut bare.next, &mut bare.gaps, p);
            }
        }
        bare.first_live_ns = Some(1);
        let c = check(&feed, [&whole, &bare].into_iter());
        assert_eq!((c.books_checked, c.books_differ, c.books_with_gaps), (2, 1, 0), "{c:?}");
    }
}
