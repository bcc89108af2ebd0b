//! The live-order index against a plain hash map: any sequence of inserts,
//! removals and lookups gives the same answers, and its memory stays
//! proportional to what is live.

use fairfeed_exchange::tokens::{TokenIndex, CLIENTS_DIRECT};
use proptest::prelude::*;
use std::collections::HashMap;

/// Small chunks, so a few hundred operations compact, merge and drop them.
const N: usize = 8;

#[derive(Debug, Clone)]
enum Op {
    /// A token `delta` past the client's highest so far (≤ 0: a reuse, out of order).
    Insert {
        client: u32,
        delta: i64,
    },
    /// The token `back` below the client's highest.
    Remove {
        client: u32,
        back: u32,
    },
    Get {
        client: u32,
        back: u32,
    },
}

fn client() -> impl Strategy<Value = u32> {
    prop_oneof![8 => 0u32..3, 1 => Just(CLIENTS_DIRECT + 7)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (client(), prop_oneof![9 => 1i64..3, 1 => 3i64..40, 2 => -30i64..=0])
            .prop_map(|(client, delta)| Op::Insert { client, delta }),
        4 => (client(), 0u32..48).prop_map(|(client, back)| Op::Remove { client, back }),
        2 => (client(), 0u32..48).prop_map(|(client, back)| Op::Get { client, back }),
    ]
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut ix: TokenIndex<u64, N> = TokenIndex::default();
    let mut model: HashMap<(u32, u32), u64> = HashMap::new();
    let mut high: HashMap<u32, u32> = HashMap::new();
    for (step, op) in ops.iter().enumerate() {
        let v = step as u64;
        match *op {
            Op::Insert { client, delta } => {
                let h = high.entry(client).or_insert(0);
                let token = u32::try_from((i64::from(*h) + delta).max(0)).unwrap_or(u32::MAX);
                *h = (*h).max(token);
                prop_assert_eq!(ix.insert(client, token, v), model.insert((client, token), v), "insert {}", token);
            }
            Op::Remove { client, back } => {
                let token = high.get(&client).copied().unwrap_or(0).saturating_sub(back);
                prop_assert_eq!(ix.remove(client, token), model.remove(&(client, token)), "remove {}", token);
            }
            Op::Get { client, back } => {
                let token = high.get(&client).copied().unwrap_or(0).saturating_sub(back);
                prop_assert_eq!(ix.get(client, token), model.get(&(client, token)));
                prop_assert_eq!(ix.contains(client, token), model.contains_key(&(client, token)));
            }
        }
        prop_assert_eq!(ix.len(), model.len());
        ix.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
        // Memory: every chunk but a client's last is over a quarter live (or
        // compacted), so slots ≤ 4 × live + one chunk per client.
        let (chunks, slots) = ix.footprint();
        prop_assert!(slots <= 4 * model.len() + 4 * N, "{} slots for {} live", slots, model.len());
        prop_assert!(chunks <= 2 * slots / N + 3 * 4, "{} chunks for {} slots", chunks, slots);
    }
    for (&(c, t), v) in &model {
        prop_assert_eq!(ix.get(c, t), Some(v));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn behaves_like_a_hash_map(ops in proptest::collection::vec(op(), 1..400)) {
        run(&ops)?;
    }
}

/// A client that keeps one order of every chunk alive and lets the rest go
/// cannot make the index hold a chunk per live order.
#[test]
fn one_survivor_per_chunk_does_not_keep_the_chunks() {
    let mut ix: TokenIndex<u32, 64> = TokenIndex::default();
    let mut token = 0;
    for _ in 0..1_000 {
        let first = token + 1;
        for _ in 0..64 {
            token += 1;
            ix.insert(0, token, token);
        }
        for t in first + 1..=token {
            ix.remove(0, t);
        }
    }
    assert_eq!(ix.len(), 1_000);
    ix.check().unwrap();
    let (chunks, slots) = ix.footprint();
    assert!(slots <= 4 * 1_000 + 64, "{slots} slots for 1,000 live");
    assert!(chunks <= 40, "{chunks} chunks for 1,000 live in chunks of 64");
    for k in 0..1_000u32 {
        assert_eq!(ix.get(0, k * 64 + 1), Some(&(k * 64 + 1)));
    }
}

/// The usual case: increasing tokens, orders ending in about the order they
/// came: the logs drop chunks from the front and nothing goes to the map.
#[test]
fn increasing_tokens_ending_in_order_stay_in_the_logs() {
    let mut ix: TokenIndex<u32> = TokenIndex::default();
    for t in 1..=100_000u32 {
        assert_eq!(ix.insert(t % 4, t, t), None);
        if t > 10_000 {
            assert_eq!(ix.remove((t - 10_000) % 4, t - 10_000), Some(t - 10_000));
        }
    }
    assert_eq!(ix.len(), 10_000);
    ix.check().unwrap();
    let (chunks, slots) = ix.footprint();
    assert!(chunks <= 4 * 3 + 4, "{chunks} chunks");
    assert!(slots <= 10_000 + 4 * 4_096, "{slots} slots");
}
