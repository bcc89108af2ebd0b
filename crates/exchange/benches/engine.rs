//! The matching core's throughput on one thread: a mixed flow of limit orders
//! around a moving mid, cancels and IOCs over 16 symbols — continuous, and
//! cleared as frequent batch auctions.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fairfeed_exchange::engine::{Command, Engine, Limits, NewOrder, Side, Tif};
use rand::{Rng, SeedableRng};

fn flow(n: usize) -> Vec<Command> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut live: Vec<(u32, u32)> = Vec::new();
    let mut v = Vec::with_capacity(n);
    for i in 0..n as u32 {
        let r: f64 = rng.gen();
        if r < 0.3 && !live.is_empty() {
            let (c, t) = live.swap_remove(rng.gen_range(0..live.len()));
            v.push(Command::Cancel { client: c, token: t, leave: 0 });
        } else {
            let side = if rng.gen_bool(0.5) { Side::Buy } else { Side::Sell };
            let off: i64 = rng.gen_range(-20..=20);
            let price = (1_000_000 + off * 100) as u32;
            let tif = if r > 0.9 { Tif::Ioc } else { Tif::Day };
            let client = rng.gen_range(1..=8);
            v.push(Command::New(NewOrder {
                client,
                token: i,
                symbol: rng.gen_range(1..=16),
                side,
                price,
                qty: rng.gen_range(1..=10) * 100,
                tif,
                market: false,
                hidden: false,
                min_qty: 0,
            }));
            if tif == Tif::Day {
                live.push((client, i));
            }
        }
    }
    v
}

fn bench(c: &mut Criterion) {
    let cmds = flow(1_000_000);
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(cmds.len() as u64));
    g.sample_size(10);
    g.bench_function("mixed_flow_1M", |b| {
        b.iter(|| {
            let mut e = Engine::new(Limits { symbols: 16, ..Limits::default() }, 0, 1);
            let mut n = 0u64;
            for c in &cmds {
                e.handle(*c, &mut |_| n += 1);
            }
            n
        })
    });
    // The same flow as frequent batch auctions of 100 commands (ordering
    // `batch`): one call auction per symbol per batch instead of matching
    // each order on arrival — the cost of the third fairness definition.
    g.bench_function("mixed_flow_1M_batches_of_100", |b| {
        b.iter(|| {
            let mut e = Engine::new(Limits { symbols: 16, ..Limits::default() }, 0, 1);
            let mut n = 0u64;
            for batch in cmds.chunks(100) {
                e.handle_batch(batch, &mut |_| n += 1);
            }
            n
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
