//! The probe graph: which nodes exchange probes.
//!
//! Each node probes its parents (its tree parent and the proxies that hedge
//! for it), a few random nodes of the same tree (never the reference) and,
//! for the reference's children, their siblings in a ring; edges are made symmetric,
//! so both ends probe each other and see both directions. The random edges
//! close loops across subtrees — the loops the network effect needs — and the
//! graph is a pure function of the node list and a seed, so every node
//! computes the same one from the topology file.

use std::collections::{BTreeMap, BTreeSet};

/// One node's id and the nodes it receives data from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its node id.
    pub id: u32,
    /// The nodes it receives data from (its tree parents).
    pub parents: Vec<u32>,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Peers of its own level each child of the reference probes (each
/// picks the next ones in a ring, so most have twice as many).
pub const SIBLING_PEERS: usize = 2;

/// Every node's peers: parents, the reference's children's siblings (see
/// [`SIBLING_PEERS`]), `random` random others, made symmetric.
pub fn peers(members: &[Member], random: usize, seed: u64) -> BTreeMap<u32, Vec<u32>> {
    let ids: Vec<u32> = members.iter().map(|m| m.id).collect();
    let known: BTreeSet<u32> = ids.iter().copied().collect();
    let mut adj: BTreeMap<u32, BTreeSet<u32>> = ids.iter().map(|&i| (i, BTreeSet::new())).collect();
    let link = |a: u32, b: u32, adj: &mut BTreeMap<u32, BTreeSet<u32>>| {
        if a != b && known.contains(&a) && known.contains(&b) {
            adj.entry(a).or_default().insert(b);
            adj.entry(b).or_default().insert(a);
        }
    };
    for m in members {
        for &p in &m.parents {
            link(m.id, p, &mut adj);
        }
    }
    // Random edges never touch the reference (a node without parents): its
    // edges are flagged only against two agreeing others, so one asymmetric
    // random edge to it could rarely be outvoted, and a receiver whose
    // nearest peer it is would take it as its only anchor — one sparsely
    // probed edge instead of its parents (366 ns in the simulator).
    let roots: BTreeSet<u32> = members.iter().filter(|m| m.parents.is_empty()).map(|m| m.id).collect();
    // A node whose only parents are the reference has one anchor: if that
    // edge is asymmetric nothing can say so, and the node (and every node
    // below it) sits half the asymmetry off under a small bound (2.5 µs on
    // seeds 5 and 6 of the simulator). Each such node also probes the next
    // `SIBLING_PEERS` of them (a ring in id order): peers of its own level,
    // synchronized over their own edges, whose vote outweighs one bad anchor.
    for (a, b) in sibling_edges(members) {
        link(a, b, &mut adj);
    }
    let mut state = seed;
    if ids.len() > 2 {
        for m in members {
            let mut added = 0;
            let mut tries = 0;
            while added < random && tries < 8 * random + 8 {
                tries += 1;
                let other = ids[(splitmix(&mut state) % ids.len() as u64) as usize];
                if other != m.id && !adj[&m.id].contains(&other) && !roots.contains(&other) && !m.parents.is_empty() {
                    link(m.id, other, &mut adj);
                    added += 1;
                }
            }
        }
    }
    cap_degree(&mut adj, crate::sync::PEERS_MAX);
    adj.into_iter().map(|(k, v)| (k, v.into_iter().collect())).collect()
}

/// Keeps every node within `cap` peers. A hub — a sender with a thousand
/// direct receivers (direct unicast, CloudEx) — keeps `cap` of its edges,
/// evenly spread over its peers in id order; the nodes it drops synchronize
/// through the peers they still have (their siblings' ring and their random
/// peers), one level further from the reference. A node left with no path to
/// the reference at all is never synchronized, and says so (its bound stays
/// unknown, its releases count as unsynchronized). Hubs are trimmed in id
/// order, the graph a pure function of its input like the rest.
fn cap_degree(adj: &mut BTreeMap<u32, BTreeSet<u32>>, cap: usize) {
    let hubs: Vec<u32> = adj.iter().filter(|(_, v)| v.len() > cap).map(|(&k, _)| k).collect();
    for h in hubs {
        let peers: Vec<u32> = adj[&h].iter().copied().collect();
        if peers.len() <= cap {
            continue; // trimmed already, as the peer of an earlier hub
        }
        let keep: BTreeSet<u32> = (0..cap).map(|i| peers[i * peers.len() / cap]).collect();
        for p in peers.into_iter().filter(|p| !keep.contains(p)) {
            adj.get_mut(&h).map(|v| v.remove(&p));
            adj.get_mut(&p).map(|v| v.remove(&h));
        }
    }
}

/// How often each edge is probed: every node's peers with a stride (probe
/// every `stride`-th interval). Parent edges (the tree and its hedges, the
/// anchors of the solve) are probed every interval; an edge to a random peer
/// every ⌈d ÷ `budget`⌉ intervals, d the larger peer count of its ends that
/// are leaves (receivers: a node that forwards to children sends and reads
/// far more data than probes, and its random edges close the loops the
/// solve needs most). Both ends compute the same stride, so a receiver's
/// probes sent *and* answered stay near `budget` peers' worth however many
/// nodes picked it. (Without it a receiver picked by many others probed 8–9
/// peers, 1.3 % of its packets at 5,000 msg/s against 0.7 % on average.)
pub fn strides(members: &[Member], graph: &BTreeMap<u32, Vec<u32>>, budget: usize) -> BTreeMap<u32, Vec<(u32, u32)>> {
    let budget = budget.max(1);
    let parent_edge: BTreeSet<(u32, u32)> =
        members.iter().flat_map(|m| m.parents.iter().flat_map(move |&p| [(m.id, p), (p, m.id)])).collect();
    let forwards: BTreeSet<u32> = members.iter().flat_map(|m| m.parents.iter().copied()).collect();
    let degree = |id: u32| if forwards.contains(&id) { 0 } else { graph.get(&id).map_or(0, Vec::len) };
    graph
        .iter()
        .map(|(&a, peers)| {
            let s = peers
                .iter()
                .map(|&b| {
                    let stride =
                        if parent_edge.contains(&(a, b)) { 1 } else { degree(a).max(degree(b)).div_ceil(budget) };
                    (b, stride.max(1) as u32)
                })
                .collect();
            (a, s)
        })
        .collect()
}

/// Nodes under an edge per pair per interval, in the square-root rule of [`rates`].
pub const RATE_SCALE: f64 = 9.0;

/// Pairs per interval on the parent edges (and the sibling edges of
/// [`SIBLING_PEERS`], at the lower rate of their two ends' parent edges,
/// since they stand in for those when flagged): the edge from `c` to a parent is
/// probed ⌊√((r + 1) ÷ [`RATE_SCALE`]) + ½⌋ times per interval (at least
/// once, at most `rate_max`), r the nodes `c` forwards to directly or through
/// others; other edges once. A node's error is inherited by every node it
/// forwards to, so an edge's error counts r + 1 times in the sum of all
/// nodes' squared errors; with an edge's variance falling as 1 ÷ its
/// samples, that sum is smallest for a given number of probes when each edge
/// gets them in proportion to √(r + 1). The scale sets how many: at 9, no
/// proxy of a Jasper-shaped tree spends a larger share of its packets on
/// probes than a receiver does (N = 1,000, F = 10, two hedges: worst proxy
/// 3.2 %, worst receiver 3.5 % at 1,000 msg/s; at 1 it was 8.2 %). The cap
/// (`SyncConfig::rate_max`, 3 by default) keeps the node with the most such
/// edges, the sender, within the probe budget: at 8 its share was 8.0 % at
/// 1,000 msg/s (1.85 % at 5,000), at 3 it is 4.2 % (0.93 %), and the sync
/// error was the same within the seeds' spread. Both ends compute the same
/// rate.
pub fn rates(members: &[Member], rate_max: u32) -> BTreeMap<u32, Vec<(u32, u32)>> {
    let rate_max = rate_max.max(1);
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for m in members {
        for &p in &m.parents {
            children.entry(p).or_default().push(m.id);
        }
    }
    let reach = |id: u32| -> usize {
        let mut seen: BTreeSet<u32> = BTreeSet::new();
        let mut stack = vec![id];
        while let Some(x) = stack.pop() {
            for &c in children.get(&x).map_or(&[][..], |v| &v[..]) {
                if c != id && seen.insert(c) {
                    stack.push(c);
                }
            }
        }
        seen.len()
    };
    let rate = |id: u32| ((((reach(id) as f64 + 1.0) / RATE_SCALE).sqrt() + 0.5).floor() as u32).clamp(1, rate_max);
    let mut out: BTreeMap<u32, Vec<(u32, u32)>> = BTreeMap::new();
    for m in members {
        if m.parents.is_empty() {
            continue;
        }
        let r = rate(m.id);
        for &p in &m.parents {
            if p != m.id {
                out.entry(m.id).or_default().push((p, r));
                out.entry(p).or_default().push((m.id, r));
            }
        }
    }
    // The sibling edges stand in for a parent edge when it is flagged: probed as often.
    for (a, b) in sibling_edges(members) {
        let r = rate(a).min(rate(b));
        out.entry(a).or_default().push((b, r));
        out.entry(b).or_default().push((a, r));
    }
    out
}

/// The edges between the reference's children (nodes whose parents are all
/// references): each to the next [`SIBLING_PEERS`] in id order, in a ring,
/// each edge once.
fn sibling_edges(members: &[Member]) -> BTreeSet<(u32, u32)> {
    let roots: BTreeSet<u32> = members.iter().filter(|m| m.parents.is_empty()).map(|m| m.id).collect();
    let firsts: Vec<u32> = members
        .iter()
        .filter(|m| !m.parents.is_empty() && m.parents.iter().all(|p| roots.contains(p)))
        .map(|m| m.id)
        .collect();
    let mut edges = BTreeSet::new();
    for (i, &a) in firsts.iter().enumerate() {
        for k in 1..=SIBLING_PEERS.min(firsts.len().saturating_sub(1)) {
            let b = firsts[(i + k) % firsts.len()];
            edges.insert((a.min(b), a.max(b)));
        }
    }
    edges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_keeps_at_most_peers_max_and_every_node_still_reaches_it() {
        // Direct unicast at N = 20,000: one sender, every receiver its child.
        for n in [300u32, 1_000, 20_000] {
            let members: Vec<Member> =
                (0..=n).map(|i| Member { id: i, parents: if i == 0 { vec![] } else { vec![0] } }).collect();
            let g = peers(&members, 2, 3);
            assert!(g.values().all(|v| v.len() <= crate::sync::PEERS_MAX), "n {n}");
            assert_eq!(g[&0].len(), crate::sync::PEERS_MAX.min(n as usize), "n {n}");
            // Every receiver has a path to the sender (breadth-first from it).
            let mut seen = BTreeSet::from([0u32]);
            let mut frontier = vec![0u32];
            while let Some(x) = frontier.pop() {
                for &y in &g[&x] {
                    if seen.insert(y) {
                        frontier.push(y);
                    }
                }
            }
            assert_eq!(seen.len(), n as usize + 1, "n {n}: every node reaches the reference");
        }
    }

    #[test]
    fn symmetric_deterministic_and_includes_parents() {
        let members: Vec<Member> =
            (0..50).map(|i| Member { id: i, parents: if i == 0 { vec![] } else { vec![(i - 1) / 3] } }).collect();
        let a = peers(&members, 2, 7);
        assert_eq!(a, peers(&members, 2, 7));
        for (k, v) in &a {
            for p in v {
                assert!(a[p].contains(k), "{k} → {p} not symmetric");
            }
            assert!(!v.contains(k));
        }
        for m in &members {
            for p in &m.parents {
                assert!(a[&m.id].contains(p));
            }
        }
        assert!(a.values().all(|v| v.len() >= 2));
    }

    #[test]
    fn strides_keep_parents_at_full_rate_and_agree_at_both_ends() {
        // A flat star: node 0 is everyone's parent, the rest of the edges are random.
        let members: Vec<Member> =
            (0..400).map(|i| Member { id: i, parents: if i == 0 { vec![] } else { vec![0] } }).collect();
        let g = peers(&members, 3, 5);
        let budget = 4;
        let s = strides(&members, &g, budget);
        let stride = |a: u32, b: u32| s[&a].iter().find(|x| x.0 == b).unwrap().1;
        for (&a, peers) in &g {
            for &b in peers {
                assert_eq!(stride(a, b), stride(b, a), "{a}–{b}");
                if a == 0 || b == 0 {
                    assert_eq!(stride(a, b), 1, "parent edge {a}–{b} at full rate");
                }
            }
            if a != 0 {
                // Probed peers per interval: the parent, plus each random peer 1/stride.
                let load: f64 = s[&a].iter().map(|&(_, k)| 1.0 / f64::from(k)).sum();
                assert!(load <= budget as f64 + 1.0, "node {a}: {load} peers per interval");
            }
        }
        let busiest = (1..400).max_by_key(|i| g[i].len()).unwrap();
        assert!(g[&busiest].len() > budget + 1, "the graph has a node above the budget to test");
    }

    #[test]
    fn rates_follow_the_square_root_of_what_an_edge_carries() {
        // Four levels of fan-out 4 under node 0 (1 + 4 + 16 + 64 + 256 nodes),
        // and a hedge: node 5 also receives from node 2.
        let mut members: Vec<Member> =
            (0..341).map(|i| Member { id: i, parents: if i == 0 { vec![] } else { vec![(i - 1) / 4] } }).collect();
        members[5].parents.push(2);
        let r = rates(&members, 8);
        let rate = |a: u32, b: u32| r[&a].iter().find(|x| x.0 == b).map(|x| x.1);
        // Node 1 forwards to 4 + 16 + 64 nodes: ⌊√(85 ÷ 9) + ½⌋ = 3 pairs per interval, both ends.
        assert_eq!((rate(1, 0), rate(0, 1)), (Some(3), Some(3)));
        // Node 5 forwards to 4 + 16: ⌊√(21 ÷ 9) + ½⌋ = 2, on both its parent edges.
        assert_eq!((rate(5, 1), rate(5, 2), rate(2, 5)), (Some(2), Some(2), Some(2)));
        // Node 21 forwards to 4; receivers to none: once.
        assert_eq!((rate(21, 5), rate(85, 21), rate(21, 85)), (Some(1), Some(1), Some(1)));
        // Only parent edges are listed, and the cap holds.
        assert_eq!(rate(85, 86), None);
        assert_eq!(rates(&members, 2)[&1].iter().find(|x| x.0 == 0).map(|x| x.1), Some(2));
        assert!(rates(&members, 1).values().flatten().all(|x| x.1 == 1));
    }
}
