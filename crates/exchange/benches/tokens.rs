//! The live-order index against the hash map it replaced, on the pattern an
//! exchange sees: two clients entering orders with increasing tokens
//! (interleaved, so each client's step by 2), each looked up again at once
//! (its echo), most resting and staying, some ending soon after.
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fairfeed_exchange::tokens::TokenIndex;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// Orders entered per run (≈ 72 % of them stay live to the end).
const ORDERS: u32 = 2_000_000;

#[derive(Clone, Copy)]
enum Op {
    Insert(u32, u32),
    Get(u32, u32),
    Remove(u32, u32),
}

/// The operations, in order, as `fairfeed exchange bench` makes them: each
/// token entered and looked up at once (its echo); 20 % end at once
/// (immediate-or-cancel); 10 % of the rest trade or are canceled within the
/// next 10,000 orders; the others stay in the book (so the index grows to
/// ≈ 1.4 M live orders, and its recent end is what is touched most).
fn flow() -> Vec<Op> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut ends = std::collections::BinaryHeap::new();
    let mut ops = Vec::with_capacity(3 * ORDERS as usize);
    for t in 1..=ORDERS {
        let end = if rng.gen_bool(0.2) {
            t
        } else if rng.gen_bool(0.1) {
            t + rng.gen_range(1..10_000)
        } else {
            u32::MAX
        };
        let c = t % 2;
        ops.push(Op::Insert(c, t));
        ops.push(Op::Get(c, t));
        if end != u32::MAX {
            ends.push(std::cmp::Reverse((end, t)));
        }
        while let Some(&std::cmp::Reverse((e, tok))) = ends.peek() {
            if e > t {
                break;
            }
            ends.pop();
            ops.push(Op::Remove(tok % 2, tok));
        }
    }
    ops
}

/// Runs the operations; returns how many lookups and removals hit.
fn run<M>(
    ops: &[Op],
    m: &mut M,
    insert: impl Fn(&mut M, u32, u32),
    get: impl Fn(&M, u32, u32) -> bool,
    remove: impl Fn(&mut M, u32, u32) -> bool,
) -> u64 {
    let mut hits = 0u64;
    for &op in ops {
        match op {
            Op::Insert(c, t) => insert(m, c, t),
            Op::Get(c, t) => hits += u64::from(get(m, c, t)),
            Op::Remove(c, t) => hits += u64::from(remove(m, c, t)),
        }
    }
    hits
}

type FoldMap = HashMap<(u32, u32), [u8; 32], foldhash::fast::RandomState>;

fn bench(c: &mut Criterion) {
    let f = flow();
    let mut g = c.benchmark_group("live_orders");
    g.throughput(Throughput::Elements(u64::from(ORDERS)));
    g.sample_size(10);
    g.bench_function("token_index_2M", |b| {
        b.iter_batched(
            TokenIndex::<[u8; 32]>::default,
            |mut m| {
                run(
                    &f,
                    &mut m,
                    |m, c, t| {
                        m.insert(c, t, [0; 32]);
                    },
                    |m, c, t| m.get(c, t).is_some(),
                    |m, c, t| m.remove(c, t).is_some(),
                )
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("hash_map_2M", |b| {
        b.iter_batched(
            FoldMap::default,
            |mut m| {
                run(
                    &f,
                    &mut m,
                    |m, c, t| {
                        m.insert((c, t), [0; 32]);
                    },
                    |m, c, t| m.contains_key(&(c, t)),
                    |m, c, t| m.remove(&(c, t)).is_some(),
                )
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
