//! The bridge's router on one thread, per ITCH message: MoldUDP64 parsing,
//! subjects, sequence numbers and the tag, at every granularity (each
//! publication as the bridge queues it, tagged) — the
//! user-space part of the bridge's hot path, without the broker.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fairfeed_bridge::route::{By, Granularity, RouteConfig, Router};
use fairfeed_feed::gen::{GenConfig, Generator};

fn routes(c: &mut Criterion) {
    let g = Generator::new(GenConfig { seed: 1, messages: 50_000, symbols: 500, ..GenConfig::default() }).unwrap();
    let feed: Vec<Vec<u8>> = g.map(|p| p.payload).filter(|p| p.len() > 20).collect();
    let mut r = Router::new(RouteConfig::default());
    let mut messages = 0;
    for p in &feed {
        messages += r.route(p, 1, |_| {}) as u64;
    }
    let messages = messages.max(r.stats.messages);
    let mut group = c.benchmark_group("route");
    group.throughput(Throughput::Elements(messages));
    for (name, granularity, by) in [
        ("message-symbol", Granularity::Message, By::Symbol),
        ("message-service", Granularity::Message, By::Service),
        ("batched-symbol", Granularity::Batched, By::Symbol),
        ("packet-symbol", Granularity::Packet, By::Symbol),
    ] {
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_batched(
                || Router::new(RouteConfig { granularity, by, ..RouteConfig::default() }),
                |mut r| {
                    let mut n = 0u64;
                    for p in &feed {
                        r.route(p, 1, |publication| {
                            n += publication.payload.len() as u64 + publication.subject.len() as u64;
                        });
                    }
                    n
                },
                criterion::BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, routes);
criterion_main!(benches);
