//! Live orders by (client, token): the index the gateway keeps its echo
//! fields in and the engine finds a resting order by.
//!
//! A hash map of millions of live orders makes every insert and every
//! lookup a cache and TLB miss, and each doubling rehashes all of it at
//! once (at 500,000 orders/s the two maps this replaces took a third of the
//! exchange thread; with these logs its p99 fell from 95 to 2.9 ms,
//! docs/RESULTS.md). But OUCH 5.0
//! asks each client's tokens (UserRefNum) to be strictly increasing, so a
//! well-behaved client's orders arrive in key order: they are appended to a
//! per-client log of fixed-size chunks — a new order lands next to the last
//! one, a lookup of a recent order is a hit, and growth is one more chunk.
//! A token that does not fit that order (a client reusing the token of an
//! order that ended, clients beyond [`CLIENTS_DIRECT`]) goes to an ordinary
//! hash map beside the logs, so any sequence of keys stays correct.
//!
//! Memory stays proportional to the live orders whatever the order of
//! removals: a chunk that empties is dropped, one whose live entries fall to
//! a quarter of it is compacted, and neighbours that then fit in one chunk
//! are merged (so no client can make thousands of tiny chunks).

use std::collections::VecDeque;

/// Keyed by what clients choose: a fast hash, randomly seeded per map so
/// that no client can choose keys that collide (`foldhash`).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Entries per chunk of a client's log.
pub const CHUNK: usize = 4_096;
/// Clients with an id below this get a log; the others only the hash map.
pub const CLIENTS_DIRECT: u32 = 4_096;
/// A chunk other than the last is compacted when at most 1 / `SPARSE` of its entries are live.
const SPARSE: usize = 4;

/// Tokens in increasing order, each with its value while live (`None`:
/// removed); the first and last key kept beside them, so finding the chunk
/// and the place in it reads no other memory.
struct Chunk<V> {
    first: u32,
    last: u32,
    keys: Vec<u32>,
    vals: Vec<Option<V>>,
    live: usize,
}

impl<V> Chunk<V> {
    fn new(token: u32, v: V, capacity: usize) -> Self {
        let mut keys = Vec::with_capacity(capacity);
        let mut vals = Vec::with_capacity(capacity);
        keys.push(token);
        vals.push(Some(v));
        Chunk { first: token, last: token, keys, vals, live: 1 }
    }

    fn push(&mut self, token: u32, v: V) {
        self.keys.push(token);
        self.vals.push(Some(v));
        self.live += 1;
        self.last = token;
    }

    /// The position of `token`, searched from where evenly spaced keys
    /// would put it (see [`gallop`]).
    fn position(&self, token: u32) -> Option<usize> {
        if token < self.first || token > self.last {
            return None;
        }
        let guess = interpolate(token, self.first, self.last, self.keys.len());
        gallop(self.keys.len(), guess, |i| self.keys[i], token).ok()
    }

    /// Keeps only the live entries.
    fn compact(&mut self) {
        let mut w = 0;
        for r in 0..self.keys.len() {
            if self.vals[r].is_some() {
                self.keys.swap(w, r);
                self.vals.swap(w, r);
                w += 1;
            }
        }
        self.keys.truncate(w);
        self.vals.truncate(w);
        if let (Some(&first), Some(&last)) = (self.keys.first(), self.keys.last()) {
            (self.first, self.last) = (first, last);
        }
        self.keys.shrink_to_fit();
        self.vals.shrink_to_fit();
    }
}

/// Where `token` would sit among `n` keys spread evenly from `first` to `last`.
fn interpolate(token: u32, first: u32, last: u32, n: usize) -> usize {
    let span = u64::from(last.saturating_sub(first));
    if span == 0 || n < 2 {
        return 0;
    }
    let off = u64::from(token.saturating_sub(first)).min(span);
    (off * (n as u64 - 1) / span) as usize
}

/// `binary_search` of `token` among `n` increasing keys (`key(i)`), begun
/// at `guess` and widened by doubling steps until it brackets the answer:
/// near a good guess it reads a line or two of memory where a plain binary
/// search of thousands of keys misses the cache at every step.
fn gallop(n: usize, guess: usize, key: impl Fn(usize) -> u32, token: u32) -> Result<usize, usize> {
    if n == 0 {
        return Err(0);
    }
    let g = guess.min(n - 1);
    let at = key(g);
    // The answer lies in [lo, hi).
    let (mut lo, mut hi) = if at == token {
        return Ok(g);
    } else if at < token {
        let (mut lo, mut step) = (g + 1, 1);
        loop {
            let i = g + step;
            if i >= n {
                break (lo, n);
            }
            if key(i) >= token {
                break (lo, i + 1);
            }
            lo = i + 1;
            step *= 2;
        }
    } else {
        let (mut hi, mut step) = (g, 1);
        loop {
            let Some(i) = g.checked_sub(step) else { break (0, hi) };
            if key(i) <= token {
                break (i, hi);
            }
            hi = i;
            step *= 2;
        }
    };
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match key(mid).cmp(&token) {
            std::cmp::Ordering::Equal => return Ok(mid),
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
        }
    }
    Err(lo)
}

/// One client's live orders whose tokens came in increasing order.
/// Invariants: chunks are non-empty, each holds a live entry, keys increase
/// across chunks, and every key is at most `last`.
struct Log<V, const N: usize> {
    chunks: VecDeque<Chunk<V>>,
    /// The highest token ever appended (`None`: none yet).
    last: Option<u32>,
}

impl<V, const N: usize> Default for Log<V, N> {
    fn default() -> Self {
        Log { chunks: VecDeque::new(), last: None }
    }
}

impl<V, const N: usize> Log<V, N> {
    /// True when `token` would be appended (it is above every token seen).
    fn is_next(&self, token: u32) -> bool {
        self.last.is_none_or(|l| token > l)
    }

    fn push(&mut self, token: u32, v: V) {
        debug_assert!(self.is_next(token));
        match self.chunks.back_mut() {
            Some(c) if c.keys.len() < N => c.push(token, v),
            _ => {
                // The full chunk stops being the last: if most of it is gone,
                // compact it now (only the last chunk may stay sparse).
                let n = self.chunks.len();
                if let Some(c) = self.chunks.back_mut().filter(|c| c.live * SPARSE <= c.keys.len()) {
                    c.compact();
                    self.merge(n - 1);
                }
                self.chunks.push_back(Chunk::new(token, v, N));
            }
        }
        self.last = Some(token);
    }

    /// (chunk, position) of `token` while it is live.
    fn find(&self, token: u32) -> Option<(usize, usize)> {
        if self.is_next(token) {
            return None;
        }
        let (first, last) = (self.chunks.front()?.first, self.chunks.back()?.last);
        let guess = interpolate(token, first, last, self.chunks.len());
        let c = match gallop(self.chunks.len(), guess, |i| self.chunks[i].first, token) {
            Ok(c) => c,
            Err(after) => after.checked_sub(1)?,
        };
        let i = self.chunks[c].position(token)?;
        self.chunks[c].vals[i].is_some().then_some((c, i))
    }

    fn remove(&mut self, token: u32) -> Option<V> {
        let (c, i) = self.find(token)?;
        let last = c + 1 == self.chunks.len();
        let chunk = &mut self.chunks[c];
        let v = chunk.vals[i].take();
        chunk.live -= 1;
        if chunk.live == 0 {
            self.chunks.remove(c);
            self.merge(c);
        } else if !last && chunk.live * SPARSE <= chunk.keys.len() {
            chunk.compact();
            self.merge(c + 1);
            self.merge(c);
        }
        v
    }

    /// Merges chunks `at - 1` and `at` when together they fit in one.
    fn merge(&mut self, at: usize) {
        if at == 0 || at >= self.chunks.len() {
            return;
        }
        if self.chunks[at - 1].keys.len() + self.chunks[at].keys.len() > N {
            return;
        }
        let Some(next) = self.chunks.remove(at) else { return };
        let prev = &mut self.chunks[at - 1];
        prev.keys.extend(next.keys);
        prev.vals.extend(next.vals);
        prev.live += next.live;
        prev.last = next.last;
    }
}

/// Live orders by (client, token), `N` entries per chunk; see the module's documentation.
pub struct TokenIndex<V, const N: usize = CHUNK> {
    logs: Vec<Log<V, N>>,
    /// Keys that did not come in increasing order for their client.
    others: HashMap<(u32, u32), V>,
    len: usize,
}

impl<V, const N: usize> Default for TokenIndex<V, N> {
    fn default() -> Self {
        TokenIndex { logs: Vec::new(), others: HashMap::default(), len: 0 }
    }
}

impl<V, const N: usize> TokenIndex<V, N> {
    const CHUNK_OK: () = assert!(N >= 2 * SPARSE && N <= u32::MAX as usize);

    /// Live entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of `client`'s `token`.
    pub fn get(&self, client: u32, token: u32) -> Option<&V> {
        if let Some(log) = self.logs.get(client as usize) {
            if let Some((c, i)) = log.find(token) {
                return log.chunks[c].vals[i].as_ref();
            }
        }
        if self.others.is_empty() {
            return None;
        }
        self.others.get(&(client, token))
    }

    /// The value of `client`'s `token`, to change.
    pub fn get_mut(&mut self, client: u32, token: u32) -> Option<&mut V> {
        if let Some(log) = self.logs.get_mut(client as usize) {
            if let Some((c, i)) = log.find(token) {
                return log.chunks[c].vals[i].as_mut();
            }
        }
        if self.others.is_empty() {
            return None;
        }
        self.others.get_mut(&(client, token))
    }

    /// Whether `client`'s `token` is held.
    pub fn contains(&self, client: u32, token: u32) -> bool {
        self.get(client, token).is_some()
    }

    /// Inserts `v` for (client, token); the value it replaces, if it was live.
    pub fn insert(&mut self, client: u32, token: u32, v: V) -> Option<V> {
        if client < CLIENTS_DIRECT {
            let at = client as usize;
            let () = Self::CHUNK_OK;
            if at >= self.logs.len() {
                self.logs.resize_with(at + 1, Log::default);
            }
            let log = &mut self.logs[at];
            if log.is_next(token) {
                log.push(token, v);
                self.len += 1;
                return None;
            }
            if let Some((c, i)) = log.find(token) {
                return log.chunks[c].vals[i].replace(v);
            }
        }
        let old = self.others.insert((client, token), v);
        self.len += usize::from(old.is_none());
        old
    }

    /// Removes (client, token); its value, if it was live.
    pub fn remove(&mut self, client: u32, token: u32) -> Option<V> {
        let v = match self.logs.get_mut(client as usize).and_then(|l| l.remove(token)) {
            Some(v) => Some(v),
            None if self.others.is_empty() => None,
            None => self.others.remove(&(client, token)),
        };
        self.len -= usize::from(v.is_some());
        v
    }

    /// Chunks held by every client's log, and entries they hold, live or not
    /// (for tests and memory accounting).
    pub fn footprint(&self) -> (usize, usize) {
        let chunks = self.logs.iter().map(|l| l.chunks.len()).sum();
        let slots: usize = self.logs.iter().flat_map(|l| l.chunks.iter()).map(|c| c.keys.len()).sum();
        (chunks, slots + self.others.len())
    }

    /// Checks the logs' invariants (tests).
    #[doc(hidden)]
    pub fn check(&self) -> Result<(), InvariantBroken> {
        let mut live = self.others.len();
        for (client, log) in self.logs.iter().enumerate() {
            let mut prev: Option<u32> = None;
            for (k, c) in log.chunks.iter().enumerate() {
                let n = c.vals.iter().filter(|v| v.is_some()).count();
                if c.keys.first() != Some(&c.first) || c.keys.last() != Some(&c.last) {
                    return Err(InvariantBroken(format!("client {client} chunk {k}: first or last key out of date")));
                }
                if c.keys.is_empty() || c.keys.len() != c.vals.len() || n != c.live || n == 0 || c.keys.len() > N {
                    return Err(InvariantBroken(format!("client {client} chunk {k}: bad sizes or live count")));
                }
                if k + 1 < log.chunks.len() && n * SPARSE <= c.keys.len() && c.keys.len() > n {
                    return Err(InvariantBroken(format!(
                        "client {client} chunk {k}: {n} live of {} and not the last",
                        c.keys.len()
                    )));
                }
                for &key in &c.keys {
                    if prev.is_some_and(|p| key <= p) || log.last.is_none_or(|l| key > l) {
                        return Err(InvariantBroken(format!("client {client} chunk {k}: key {key} out of order")));
                    }
                    prev = Some(key);
                }
                live += n;
            }
        }
        if live != self.len {
            return Err(InvariantBroken(format!("len {} but {live} live", self.len)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::gallop;
    use proptest::prelude::*;

    proptest! {
        /// From any guess, the answer `binary_search` gives.
        #[test]
        fn gallop_is_a_binary_search(mut keys in proptest::collection::vec(0u32..500, 0..200), token in 0u32..520, guess in 0usize..250) {
            keys.sort_unstable();
            keys.dedup();
            prop_assert_eq!(gallop(keys.len(), guess, |i| keys[i], token), keys.binary_search(&token));
        }
    }
}

/// An invariant of the token index that does not hold (its tests' check).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvariantBroken(pub String);
