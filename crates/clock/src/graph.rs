//! The probe graph: which nodes exchange probes.
//!
//! Each node probes its parents (its tree parent and the proxies that hedge
//! for it) and a few random nodes of the same tree; edges are made symmetric,
//! so both ends probe each other and see both directions. The random edges
//! close loops across subtrees — the loops the network effect needs — and the
//! graph is a pure function of the node list and a seed, so every node
//! computes the same one from the topology file.

use std::collections::{BTreeMap, BTreeSet};

/// One node's id and the nodes it receives data from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u32,
    pub parents: Vec<u32>,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Every node's peers: parents, `random` random others, made symmetric.
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
    let mut state = seed;
    if ids.len() > 2 {
        for m in members {
            let mut added = 0;
            let mut tries = 0;
            while added < random && tries < 8 * random + 8 {
                tries += 1;
                let other = ids[(splitmix(&mut state) % ids.len() as u64) as usize];
                if other != m.id && !adj[&m.id].contains(&other) {
                    link(m.id, other, &mut adj);
                    added += 1;
                }
            }
        }
    }
    adj.into_iter().map(|(k, v)| (k, v.into_iter().collect())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
