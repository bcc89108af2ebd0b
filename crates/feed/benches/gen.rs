//! `fairfeed gen` throughput: messages per second of the order-book-driven
//! generator, packets built in memory (no file I/O).
//!
//! Run: `cargo bench -p fairfeed-feed --bench gen`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fairfeed_feed::gen::{GenConfig, Generator};

fn bench(c: &mut Criterion) {
    const MESSAGES: u64 = 100_000;
    let mut g = c.benchmark_group("gen");
    g.throughput(Throughput::Elements(MESSAGES));
    g.sample_size(20);
    g.bench_function("messages", |b| {
        b.iter(|| {
            let cfg = GenConfig { messages: MESSAGES, symbols: 500, ..Default::default() };
            Generator::new(cfg).expect("valid").map(|p| p.payload.len()).sum::<usize>()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
