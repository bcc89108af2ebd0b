//! Every agent's counters in one place: a process's [`Board`].
//!
//! Aeron keeps every agent's counters in one counters file that its tools
//! read; this is the same idea in memory. Each agent that has counters to
//! show holds a [`Poster`] on a board, under a name of its own (`node`,
//! `feed`, `gateway`, `engine.0`, `arb`, …), and posts its part — its
//! counters, and where it measures latency its histograms — at most every
//! [`PUBLISH_INTERVAL`], plus whenever a reader asks. Whatever shows the
//! counters (`fairfeed stat`, a `--metrics` endpoint, the demo's dashboard)
//! reads the board, off the agents' threads, and composes what it shows from
//! the parts. No agent serializes a report or waits for a reader on its
//! data path: a post is one short lock, and a turn with nothing due costs
//! one atomic load.
//!
//! **Asking for fresh parts.** A reader that wants every part as of now (a
//! `stat` request) calls [`Board::ask`]: it raises the board's generation and
//! rings each poster's `eventfd` ([`Poster::fd`]), so a parked agent wakes
//! for it and a spinning one sees it with one atomic load. Each poster posts
//! on its next turn (but not more often than every [`POST_GAP_MIN_NS`], so
//! a flood of requests costs a data path at most one post per gap), and
//! [`Board::caught_up`] says when all have. A post made after an ask always
//! satisfies it: a part is stamped with the generation current when it is
//! posted.
//!
//! The value type is the board's: `serde_json::Value` where a part is its
//! counters as JSON, or a type of the shell's where a part is richer (a tree
//! node posts its report without serializing it).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use nix::sys::eventfd::{EfdFlags, EventFd};

/// How often an agent posts its part unasked.
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(500);
/// [`PUBLISH_INTERVAL`] in ns.
pub const PUBLISH_INTERVAL_NS: u64 = PUBLISH_INTERVAL.as_nanos() as u64;
/// An agent posts on request at most this often.
pub const POST_GAP_MIN_NS: u64 = 5_000_000;
/// Parts on one board at most (a process's agents; a demo's node has a
/// board of its own).
pub const PARTS_MAX: usize = 64;
/// Posters of one board start their schedules this many slots of
/// `PUBLISH_INTERVAL / STAGGER_SLOTS` apart, so agents of many nodes on one
/// thread do not all copy their histograms in one turn.
const STAGGER_SLOTS: u64 = 16;

/// Latency histograms by name (ns).
pub type Hists = Vec<(&'static str, Histogram<u64>)>;

/// One part as last posted.
#[derive(Debug, Clone)]
pub struct Post<T> {
    /// The board's generation when it was posted (it answers every ask up to it).
    pub generation: u64,
    /// The part's counters.
    pub value: T,
    /// Its latency histograms, where it has any.
    pub hists: Hists,
}

#[derive(Debug)]
struct Entry<T> {
    name: String,
    bell: Arc<EventFd>,
    post: Option<Post<T>>,
}

/// Where a process's agents post their counters.
#[derive(Debug)]
pub struct Board<T = serde_json::Value> {
    /// The generation readers want (raised by each [`Board::ask`]).
    want: AtomicU64,
    entries: Mutex<Vec<Entry<T>>>,
}

/// The parts of a board, as [`Board::read`] shows them.
pub struct Parts<'a, T>(&'a [Entry<T>]);

impl<'a, T> Parts<'a, T> {
    /// The part posted under `name`, if it has posted.
    pub fn get(&self, name: &str) -> Option<&'a Post<T>> {
        self.0.iter().find(|e| e.name == name).and_then(|e| e.post.as_ref())
    }

    /// Every part that has posted, by name, in the order the posters were made.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a Post<T>)> + 'a {
        self.0.iter().filter_map(|e| e.post.as_ref().map(|p| (e.name.as_str(), p)))
    }
}

/// Why a poster could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    /// The board has [`PARTS_MAX`] posters.
    #[error("the counters board is full ({PARTS_MAX} parts)")]
    Full,
    /// Another poster has the name.
    #[error("the counters board already has a part named {0:?}")]
    Taken(String),
    /// The poster's `eventfd` could not be made.
    #[error("making a poster's eventfd: {0}")]
    Io(#[from] std::io::Error),
}

impl<T> Board<T> {
    /// An empty board.
    pub fn new() -> Arc<Self> {
        Arc::new(Board { want: AtomicU64::new(0), entries: Mutex::new(Vec::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Entry<T>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A poster for the part `name` (unique on this board).
    pub fn poster(self: &Arc<Self>, name: impl Into<String>) -> Result<Poster<T>, BoardError> {
        let name = name.into();
        let mut entries = self.lock();
        if entries.len() >= PARTS_MAX {
            return Err(BoardError::Full);
        }
        if entries.iter().any(|e| e.name == name) {
            return Err(BoardError::Taken(name));
        }
        let bell = Arc::new(
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(std::io::Error::from)?,
        );
        let index = entries.len();
        entries.push(Entry { name, bell: bell.clone(), post: None });
        Ok(Poster {
            board: self.clone(),
            index,
            bell,
            served: 0,
            next_ns: None,
            last_ns: None,
            stagger_ns: PUBLISH_INTERVAL_NS / STAGGER_SLOTS * (index as u64 % STAGGER_SLOTS),
        })
    }

    /// Asks every poster for a fresh part; returns the generation to wait for.
    pub fn ask(&self) -> u64 {
        let g = self.want.fetch_add(1, Ordering::SeqCst) + 1;
        for e in self.lock().iter() {
            let _ = e.bell.write(1);
        }
        g
    }

    /// Every poster has posted generation `g` or later.
    pub fn caught_up(&self, g: u64) -> bool {
        self.lock().iter().all(|e| e.post.as_ref().is_some_and(|p| p.generation >= g))
    }

    /// Runs `f` on the parts as they stand (the board is locked meanwhile:
    /// keep `f` short — copy out what you need).
    pub fn read<R>(&self, f: impl FnOnce(&Parts<'_, T>) -> R) -> R {
        let entries = self.lock();
        f(&Parts(&entries))
    }

    /// The value last posted under `name`.
    pub fn value(&self, name: &str) -> Option<T>
    where
        T: Clone,
    {
        self.read(|p| p.get(name).map(|p| p.value.clone()))
    }
}

/// One agent's handle on its part of a board.
#[derive(Debug)]
pub struct Poster<T = serde_json::Value> {
    board: Arc<Board<T>>,
    index: usize,
    bell: Arc<EventFd>,
    /// The last generation it answered.
    served: u64,
    /// When it next posts unasked (its own time base; none before its first look).
    next_ns: Option<u64>,
    /// When it last posted (none yet).
    last_ns: Option<u64>,
    stagger_ns: u64,
}

impl<T> Poster<T> {
    /// Whether to post now: the interval passed, or a reader asked and
    /// [`POST_GAP_MIN_NS`] passed since the last post. One atomic load when
    /// not. `now` is in the agent's own time base (any, kept the same).
    pub fn due(&mut self, now: u64) -> bool {
        let next = *self.next_ns.get_or_insert(now.saturating_add(self.stagger_ns));
        let want = self.board.want.load(Ordering::SeqCst);
        let asked = want != self.served && self.last_ns.is_none_or(|l| now >= l.saturating_add(POST_GAP_MIN_NS));
        if !asked && now < next {
            return false;
        }
        let _ = self.bell.read();
        self.served = want;
        self.last_ns = Some(now);
        self.next_ns = Some(now.saturating_add(PUBLISH_INTERVAL_NS));
        true
    }

    /// When it is next due (0 before its first look: at once).
    pub fn next_ns(&self) -> u64 {
        let Some(next) = self.next_ns else { return 0 };
        if self.board.want.load(Ordering::Relaxed) != self.served {
            return next.min(self.last_ns.map_or(0, |l| l.saturating_add(POST_GAP_MIN_NS)));
        }
        next
    }

    /// Readable when a reader asks.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.bell.as_fd()
    }

    /// Posts its part now.
    pub fn post(&self, value: T, hists: Hists) {
        let generation = self.board.want.load(Ordering::SeqCst);
        self.board.lock()[self.index].post = Some(Post { generation, value, hists });
    }

    /// Posts its last part: it will not post again, and this part answers
    /// every ask from now on (an agent that closed is not waited for).
    pub fn post_final(&self, value: T, hists: Hists) {
        self.board.lock()[self.index].post = Some(Post { generation: u64::MAX, value, hists });
    }

    /// Posts `value()` (no histograms) if it is [`due`](Self::due).
    pub fn post_due(&mut self, now: u64, value: impl FnOnce() -> T) {
        if self.due(now) {
            self.post(value(), Vec::new());
        }
    }

    /// The board it posts to.
    pub fn board(&self) -> &Arc<Board<T>> {
        &self.board
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_post_on_their_interval_and_when_asked_but_not_more_often_than_the_gap() {
        let board: Arc<Board> = Board::new();
        let mut a = board.poster("a").unwrap();
        let mut b = board.poster("b").unwrap();
        assert!(matches!(board.poster("a"), Err(BoardError::Taken(_))));
        // First look: `a` (slot 0) is due at once, `b` a stagger slot later.
        assert!(a.due(1_000));
        a.post(serde_json::json!({"n": 1}), Vec::new());
        assert!(!b.due(1_000));
        assert_eq!(b.next_ns(), 1_000 + PUBLISH_INTERVAL_NS / STAGGER_SLOTS);
        assert!(!a.due(2_000), "not again before the interval");
        let g = board.ask();
        assert!(!board.caught_up(g), "b has never posted");
        assert!(b.due(2_000), "asked: b posts though its slot is later");
        b.post(serde_json::json!({"n": 2}), Vec::new());
        assert!(!a.due(2_000), "asked, but a posted less than the gap ago");
        assert_eq!(a.next_ns(), 1_000 + POST_GAP_MIN_NS);
        assert!(a.due(1_000 + POST_GAP_MIN_NS));
        a.post(serde_json::json!({"n": 3}), Vec::new());
        assert!(board.caught_up(g));
        assert_eq!(board.value("a"), Some(serde_json::json!({"n": 3})));
        let names: Vec<String> = board.read(|p| p.iter().map(|(n, _)| n.to_string()).collect());
        assert_eq!(names, ["a", "b"]);
        assert!(a.due(1_000 + POST_GAP_MIN_NS + PUBLISH_INTERVAL_NS), "and again after the interval");
    }

    #[test]
    fn an_ask_rings_every_posters_bell_until_it_answers() {
        let board: Arc<Board<u32>> = Board::new();
        let mut a = board.poster("a").unwrap();
        assert!(a.due(0));
        a.post(1, Vec::new());
        board.ask();
        assert!(a.bell.read().is_ok(), "the bell is rung");
        board.ask();
        assert!(a.due(POST_GAP_MIN_NS));
        assert!(a.bell.read().is_err(), "answering clears it");
    }

    #[test]
    fn a_board_holds_at_most_parts_max_posters() {
        let board: Arc<Board<u8>> = Board::new();
        let posters: Vec<_> = (0..PARTS_MAX).map(|k| board.poster(k.to_string()).unwrap()).collect();
        assert_eq!(posters.len(), PARTS_MAX);
        assert!(matches!(board.poster("one more"), Err(BoardError::Full)));
    }
}
