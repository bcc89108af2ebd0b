//! Sharding one feed over K trees (Jasper §3, figure 3): each symbol's
//! messages ride one tree, so adding trees adds capacity, and every tree
//! ends on the same receivers.
//!
//! The [`Sharder`] takes the feed as it comes — MoldUDP64 packets of ITCH
//! 5.0 messages, from a generator, a capture or live arbitrated lines — and
//! splits each packet into one packet per tree it touches, in the order the
//! messages came. Each tree is a MoldUDP64 session of its own (named after
//! the feed's session, [`tree_session`]) numbered from 1, so each tree's
//! gaps, retransmission and deadline stay its own.
//!
//! - A message's tree is its symbol's: an explicit symbol → tree entry of
//!   the [`ShardMap`] (hot symbols on trees of their own), learnt from the
//!   Stock Directory (`R`) message that binds the symbol to its stock locate
//!   for the day; otherwise `stock locate % K`.
//! - A message with stock locate 0 concerns the whole market (`S` system
//!   event, `V`/`W` circuit breakers): it goes to **every** tree, in a packet
//!   of its own ([`Dest::Every`]), which the receivers' [`crate::merge`]
//!   delivers once, after everything before it in the feed and before
//!   everything after it.
//! - A feed heartbeat is not forwarded (each tree has its own liveness); the
//!   end of the feed's session ends every tree's session.
//!
//! Malformed input never panics and never costs the good messages around
//! it: a packet whose header does not parse is refused whole (counted); a
//! block that overruns its packet, or a message too short to carry a stock
//! locate, is dropped (counted) and the rest of the packet goes on.

use std::collections::HashMap;

use fairfeed_wire::moldudp64::{self, Packet, PacketBuilder, Session};

/// Trees one feed may be sharded over (the planner's limit).
pub const SHARD_TREES_MAX: usize = crate::plan::TREES_MAX;
/// Symbols an explicit map may name.
pub const SHARD_MAP_MAX: usize = 65_536;
/// The ITCH 5.0 message type of the Stock Directory.
const STOCK_DIRECTORY: u8 = b'R';
/// Where the symbol sits in a Stock Directory message, and its length.
const DIRECTORY_STOCK: std::ops::Range<usize> = 11..19;
/// Bytes of a message's type and stock locate.
const LOCATE_END: usize = 3;

/// Why a sharding setting or a feed packet was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// A tree count outside 1..=SHARD_TREES_MAX.
    #[error("trees must be 1..={SHARD_TREES_MAX}, got {0}")]
    Trees(usize),
    /// A shard map line that does not parse.
    #[error("line {line}: {reason}")]
    MapLine {
        /// Its line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A shard map over SHARD_MAP_MAX symbols.
    #[error("the map names more than {SHARD_MAP_MAX} symbols")]
    MapTooLarge,
    /// A feed packet that is not MoldUDP64.
    #[error("not a MoldUDP64 packet: {0}")]
    Packet(fairfeed_wire::Error),
    /// A node in no tree of the topology.
    #[error("node {0} is in no tree of the topology")]
    NotInTopology(u32),
    /// A receiver that takes none of the topology's trees.
    #[error("receiver {0} takes none of the topology's trees")]
    NoTrees(u32),
    /// A subscribed symbol the shard map does not name.
    #[error("symbol {0} is not in the shard map: a subscriber learns a symbol's tree from the map (its stock locate comes only with its directory message)")]
    Unmapped(String),
}

/// Which tree carries which symbol.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardMap {
    /// Symbol (space-padded to 8 bytes, as ITCH carries it) → tree.
    pub symbols: HashMap<[u8; 8], u16>,
}

impl ShardMap {
    /// Reads a map: one `SYMBOL TREE` pair per line (whitespace between,
    /// `#` starts a comment), for a feed over `trees` trees. Names the first
    /// bad line.
    pub fn parse(text: &str, trees: usize) -> Result<ShardMap, ShardError> {
        check_trees(trees)?;
        let mut symbols = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let bad = |reason: String| ShardError::MapLine { line, reason };
            let mut parts = content.split_whitespace();
            let (Some(sym), Some(tree), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad(format!("expected `SYMBOL TREE`, got {content:?}")));
            };
            if sym.is_empty() || sym.len() > 8 || !sym.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(format!("symbol {sym:?} is not 1-8 printable characters")));
            }
            let t: u16 = tree.parse().map_err(|_| bad(format!("tree {tree:?} is not a number")))?;
            if usize::from(t) >= trees {
                return Err(bad(format!("tree {t} out of range 0..{trees}")));
            }
            if symbols.insert(pad_symbol(sym), t).is_some() {
                return Err(bad(format!("symbol {sym} mapped twice")));
            }
            if symbols.len() > SHARD_MAP_MAX {
                return Err(ShardError::MapTooLarge);
            }
        }
        Ok(ShardMap { symbols })
    }
}

fn check_trees(trees: usize) -> Result<(), ShardError> {
    if (1..=SHARD_TREES_MAX).contains(&trees) {
        Ok(())
    } else {
        Err(ShardError::Trees(trees))
    }
}

/// `sym` as ITCH carries it: left-aligned, space-padded to 8 bytes.
pub fn pad_symbol(sym: &str) -> [u8; 8] {
    let mut s = [b' '; 8];
    for (d, b) in s.iter_mut().zip(sym.bytes()) {
        *d = b;
    }
    s
}

/// Tree `tree`'s MoldUDP64 session: the feed's first seven characters, `T`,
/// and the tree as two digits (`NASDAQ01` → `NASDAQ0T03`).
pub fn tree_session(feed: Session, tree: u16) -> Session {
    let mut s = feed;
    s.0[7] = b'T';
    s.0[8] = b'0' + (tree / 10 % 10) as u8;
    s.0[9] = b'0' + (tree % 10) as u8;
    s
}

/// Where a sharded packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// Tree `t` alone carries it.
    Tree(u16),
    /// Tree `t`'s copy of a packet that every tree carries (market-wide
    /// messages, the end of the session): receivers deliver it once.
    Every(u16),
}

impl Dest {
    /// The tree it goes to (a market-wide packet: this copy's).
    pub fn tree(self) -> u16 {
        match self {
            Dest::Tree(t) | Dest::Every(t) => t,
        }
    }
}

/// Sharding counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShardStats {
    /// Feed packets taken.
    pub packets_in: u64,
    /// Messages in them.
    pub messages_in: u64,
    /// Per-tree packets out (a market-wide packet counts once per tree).
    pub packets_out: u64,
    /// Market-wide messages (sent to every tree).
    pub every_tree: u64,
    /// Symbols bound to a tree by the map when their directory message came.
    pub mapped_symbols: u64,
    /// Heartbeats (sent on every tree).
    pub heartbeats: u64,
    /// Packets refused whole (no MoldUDP64 header).
    pub bad_packets: u64,
    /// Blocks that overran their packet, messages too short for a stock locate.
    pub bad_messages: u64,
}

/// Splits one feed's packets over K trees (see the module docs).
pub struct Sharder {
    trees: usize,
    map: ShardMap,
    /// Stock locate → tree, for locates the map binds.
    by_locate: HashMap<u16, u16>,
    /// Each tree's next MoldUDP64 sequence number.
    next_seq: Vec<u64>,
    /// The feed's session, once seen.
    session: Option<Session>,
    /// Messages of the packet being split, per tree: (start, end) into the input.
    pending: Vec<Vec<(usize, usize)>>,
    buf: Vec<u8>,
    /// Its counters.
    pub stats: ShardStats,
}

impl Sharder {
    /// A sharder over `trees` trees with `map` (trees out of range refused).
    pub fn new(trees: usize, map: ShardMap) -> Result<Sharder, ShardError> {
        check_trees(trees)?;
        if let Some((s, &t)) = map.symbols.iter().find(|(_, &t)| usize::from(t) >= trees) {
            return Err(ShardError::MapLine {
                line: 0,
                reason: format!("{} maps to tree {t}, out of range 0..{trees}", String::from_utf8_lossy(s).trim()),
            });
        }
        Ok(Sharder {
            trees,
            map,
            by_locate: HashMap::new(),
            next_seq: vec![1; trees],
            session: None,
            pending: vec![Vec::new(); trees],
            buf: vec![0; moldudp64::PACKET_LEN_MAX],
            stats: ShardStats::default(),
        })
    }

    /// Trees it shards over.
    pub fn trees(&self) -> usize {
        self.trees
    }

    /// The tree of stock locate `locate` (0: every tree — `None`).
    pub fn tree_of(&self, locate: u16) -> Option<u16> {
        if locate == 0 {
            return None;
        }
        Some(self.by_locate.get(&locate).copied().unwrap_or((usize::from(locate) % self.trees) as u16))
    }

    /// Each tree's next MoldUDP64 sequence number (what its session has sent + 1).
    pub fn next_sequences(&self) -> &[u64] {
        &self.next_seq
    }

    /// Splits one feed packet; hands the per-tree packets to `out` in tree
    /// order (a market-wide message ends the packets before it, then goes to
    /// every tree, and the messages after it start new ones). Returns the
    /// packets handed out.
    pub fn split(&mut self, packet: &[u8], mut out: impl FnMut(Dest, &[u8])) -> Result<usize, ShardError> {
        let p = match Packet::new_checked(packet) {
            Ok(p) => p,
            Err(e) => {
                self.stats.bad_packets += 1;
                return Err(ShardError::Packet(e));
            }
        };
        self.stats.packets_in += 1;
        let session = *self.session.get_or_insert(p.session());
        if p.is_heartbeat() {
            self.stats.heartbeats += 1;
            return Ok(0);
        }
        if p.is_end_of_session() {
            return Ok(self.end_session(session, &mut out));
        }
        let base = packet.as_ptr() as usize;
        let mut sent = 0;
        for m in p.messages() {
            let Ok(m) = m else {
                self.stats.bad_messages += 1;
                break;
            };
            self.stats.messages_in += 1;
            let Some(locate) = m.get(1..LOCATE_END).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
                self.stats.bad_messages += 1;
                continue;
            };
            if m[0] == STOCK_DIRECTORY && locate != 0 {
                self.learn(locate, m);
            }
            let start = m.as_ptr() as usize - base;
            match self.tree_of(locate) {
                Some(t) => self.pending[usize::from(t)].push((start, start + m.len())),
                None => {
                    sent += self.flush(packet, session, &mut out);
                    sent += self.every(session, m, &mut out);
                }
            }
        }
        sent += self.flush(packet, session, &mut out);
        Ok(sent)
    }

    /// Binds `locate` to its mapped tree when the directory names a mapped symbol.
    fn learn(&mut self, locate: u16, m: &[u8]) {
        let Some(sym) = m.get(DIRECTORY_STOCK).and_then(|s| <[u8; 8]>::try_from(s).ok()) else { return };
        if let Some(&t) = self.map.symbols.get(&sym) {
            if self.by_locate.insert(locate, t).is_none() {
                self.stats.mapped_symbols += 1;
            }
        }
    }

    /// Sends each tree's pending messages as one packet (or more, if they outgrow one).
    fn flush(&mut self, input: &[u8], session: Session, out: &mut impl FnMut(Dest, &[u8])) -> usize {
        let mut sent = 0;
        for t in 0..self.trees {
            let mut i = 0;
            while i < self.pending[t].len() {
                let s = tree_session(session, t as u16);
                let Ok(mut b) = PacketBuilder::new(&mut self.buf, s, self.next_seq[t]) else { break };
                while let Some(&(a, z)) = self.pending[t].get(i) {
                    if b.push(&input[a..z]).is_err() {
                        break;
                    }
                    i += 1;
                }
                let n = b.count();
                let len = b.finish();
                self.next_seq[t] += u64::from(n);
                self.stats.packets_out += 1;
                out(Dest::Tree(t as u16), &self.buf[..len]);
                sent += 1;
            }
            self.pending[t].clear();
        }
        sent
    }

    /// Sends market-wide message `m` to every tree.
    fn every(&mut self, session: Session, m: &[u8], out: &mut impl FnMut(Dest, &[u8])) -> usize {
        self.stats.every_tree += 1;
        for t in 0..self.trees {
            let s = tree_session(session, t as u16);
            let Ok(mut b) = PacketBuilder::new(&mut self.buf, s, self.next_seq[t]) else { return t };
            if b.push(m).is_err() {
                return t;
            }
            let len = b.finish();
            self.next_seq[t] += 1;
            self.stats.packets_out += 1;
            out(Dest::Every(t as u16), &self.buf[..len]);
        }
        self.trees
    }

    /// Ends every tree's session.
    fn end_session(&mut self, session: Session, out: &mut impl FnMut(Dest, &[u8])) -> usize {
        for t in 0..self.trees {
            let r = moldudp64::PacketRepr {
                session: tree_session(session, t as u16),
                sequence: self.next_seq[t],
                count: moldudp64::COUNT_END_OF_SESSION,
            };
            let _ = r.emit(&mut self.buf);
            self.stats.packets_out += 1;
            out(Dest::Every(t as u16), &self.buf[..moldudp64::HEADER_LEN]);
        }
        self.trees
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An ITCH-like message: type, locate, then `len - 3` filler bytes.
    fn msg(kind: u8, locate: u16, len: usize, fill: u8) -> Vec<u8> {
        let mut m = vec![fill; len.max(3)];
        m[0] = kind;
        m[1..3].copy_from_slice(&locate.to_be_bytes());
        m
    }

    fn directory(locate: u16, sym: &str) -> Vec<u8> {
        let mut m = msg(b'R', locate, 39, 0);
        m[DIRECTORY_STOCK].copy_from_slice(&pad_symbol(sym));
        m
    }

    fn packet(seq: u64, msgs: &[Vec<u8>]) -> Vec<u8> {
        let mut buf = vec![0; moldudp64::PACKET_LEN_MAX];
        let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("NASDAQ01"), seq).unwrap();
        for m in msgs {
            b.push(m).unwrap();
        }
        let n = b.finish();
        buf.truncate(n);
        buf
    }

    fn split_all(s: &mut Sharder, p: &[u8]) -> Vec<(Dest, Vec<u8>)> {
        let mut v = Vec::new();
        s.split(p, |d, b| v.push((d, b.to_vec()))).unwrap();
        v
    }

    fn blocks(p: &[u8]) -> Vec<Vec<u8>> {
        Packet::new_checked(p).unwrap().messages().map(|m| m.unwrap().to_vec()).collect()
    }

    #[test]
    fn symbols_go_to_their_tree_and_market_wide_messages_to_every_tree_in_feed_order() {
        let mut s = Sharder::new(3, ShardMap::default()).unwrap();
        let p = packet(1, &[msg(b'A', 4, 36, 1), msg(b'A', 5, 36, 2), msg(b'S', 0, 12, 3), msg(b'E', 7, 31, 4)]);
        let out = split_all(&mut s, &p);
        let dests: Vec<Dest> = out.iter().map(|(d, _)| *d).collect();
        // locate 4 → tree 1, 5 → tree 2; then S to all three; then 7 → tree 1.
        assert_eq!(
            dests,
            [Dest::Tree(1), Dest::Tree(2), Dest::Every(0), Dest::Every(1), Dest::Every(2), Dest::Tree(1)]
        );
        // Each tree numbers its own session from 1.
        let seqs: Vec<(u64, String)> = out
            .iter()
            .map(|(_, b)| {
                let p = Packet::new_checked(&b[..]).unwrap();
                (p.sequence(), p.session().as_str().unwrap().to_string())
            })
            .collect();
        assert_eq!(seqs[0], (1, "NASDAQ0T01".into()));
        assert_eq!(seqs[3], (2, "NASDAQ0T01".into()));
        assert_eq!(seqs[5], (3, "NASDAQ0T01".into()));
        assert_eq!(seqs[2], (1, "NASDAQ0T00".into()));
        assert_eq!(s.next_sequences(), [2, 4, 3]);
        assert_eq!(s.stats.every_tree, 1);
    }

    #[test]
    fn a_mapped_symbol_rides_its_tree_once_its_directory_message_binds_it() {
        let map = ShardMap::parse("# hot symbols\nAAPL 3\n  MSFT   0  # big\n", 4).unwrap();
        let mut s = Sharder::new(4, map).unwrap();
        let out = split_all(&mut s, &packet(1, &[directory(10, "AAPL"), msg(b'A', 10, 36, 0), msg(b'A', 12, 36, 0)]));
        let dests: Vec<Dest> = out.iter().map(|(d, _)| *d).collect();
        // AAPL (locate 10, 10 % 4 = 2) rides tree 3 as mapped; locate 12 tree 0 by the rule.
        assert_eq!(dests, [Dest::Tree(0), Dest::Tree(3)]);
        assert_eq!(blocks(&out[1].1).len(), 2, "the directory and the order go together");
        assert_eq!(s.stats.mapped_symbols, 1);
    }

    #[test]
    fn bad_maps_name_their_line() {
        for (text, want) in [
            ("AAPL", "line 1"),
            ("AAPL 9", "out of range"),
            ("AAPL x", "not a number"),
            ("\nAAPL 1\nAAPL 2", "line 3: symbol AAPL mapped twice"),
            ("TOOLONGSYM 1", "1-8 printable"),
        ] {
            let e = ShardMap::parse(text, 4).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        assert_eq!(Sharder::new(0, ShardMap::default()).err(), Some(ShardError::Trees(0)));
        assert_eq!(Sharder::new(65, ShardMap::default()).err(), Some(ShardError::Trees(65)));
    }

    #[test]
    fn garbage_is_counted_and_the_good_messages_around_it_go_on() {
        let mut s = Sharder::new(2, ShardMap::default()).unwrap();
        assert!(matches!(s.split(&[1, 2, 3], |_, _| {}), Err(ShardError::Packet(_))));
        // A message too short for a locate between two good ones; then a truncated block.
        let mut p = packet(1, &[msg(b'A', 2, 36, 0), vec![b'A', 0], msg(b'A', 3, 36, 0), msg(b'A', 4, 36, 0)]);
        p.truncate(p.len() - 5);
        let out = split_all(&mut s, &p);
        let got: usize = out.iter().map(|(_, b)| blocks(b).len()).sum();
        assert_eq!(got, 2);
        assert_eq!((s.stats.bad_packets, s.stats.bad_messages), (1, 2));
        // Heartbeats are not forwarded; the end of session ends every tree.
        let mut hb = packet(9, &[]);
        hb[18..20].copy_from_slice(&0u16.to_be_bytes());
        assert_eq!(s.split(&hb, |_, _| panic!("forwarded a heartbeat")).unwrap(), 0);
        hb[18..20].copy_from_slice(&0xFFFFu16.to_be_bytes());
        let out = split_all(&mut s, &hb);
        assert_eq!(out.len(), 2);
        assert!(out
            .iter()
            .all(|(d, b)| matches!(d, Dest::Every(_)) && Packet::new_checked(&b[..]).unwrap().is_end_of_session()));
    }

    proptest! {
        /// Every message reaches exactly its tree (market-wide ones every
        /// tree), each tree's session is gap-free from 1, and each tree's
        /// messages keep the feed's order.
        #[test]
        fn every_message_once_in_order_on_its_tree(
            trees in 1usize..9,
            feed in proptest::collection::vec(proptest::collection::vec((0u16..40, 3usize..60), 0..30), 1..20),
        ) {
            let mut s = Sharder::new(trees, ShardMap::default()).unwrap();
            let mut want: Vec<Vec<Vec<u8>>> = vec![Vec::new(); trees];
            let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); trees];
            let mut next = vec![1u64; trees];
            let mut seq = 1;
            let mut fill = 0u8;
            for pkt in feed {
                let msgs: Vec<Vec<u8>> = pkt.iter().map(|&(l, n)| { fill = fill.wrapping_add(1); msg(b'A', l, n, fill) }).collect();
                for m in &msgs {
                    let l = u16::from_be_bytes([m[1], m[2]]);
                    if l == 0 {
                        want.iter_mut().for_each(|w| w.push(m.clone()));
                    } else {
                        want[usize::from(l) % trees].push(m.clone());
                    }
                }
                let p = packet(seq, &msgs);
                seq += msgs.len() as u64;
                for (d, b) in split_all(&mut s, &p) {
                    let t = usize::from(d.tree());
                    let v = Packet::new_checked(&b[..]).unwrap();
                    prop_assert_eq!(v.sequence(), next[t]);
                    next[t] += u64::from(v.count());
                    got[t].extend(blocks(&b));
                }
            }
            prop_assert_eq!(got, want);
        }
    }
}
