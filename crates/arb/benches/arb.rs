//! Arbitration decision cost per input packet, both outputs decided at once,
//! over a generated ITCH feed split into A and B lines:
//! - `in_order`: both lines deliver every packet in order (B 5 µs behind), so
//!   half the inputs are new and half are duplicates;
//! - `loss_reorder`: each line loses 1% and reorders 0.5% of its packets.
//!
//! Seed 004's anchors: 6 ns (low latency) and 42 ns (high reliability, ITCH)
//! on an FPGA; 150 ns for a software arbitrator on IBM PowerEN.
//!
//! Run: `cargo bench -p fairfeed-arb --bench arb`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fairfeed_arb::spec::SeqSpec;
use fairfeed_arb::{Arbitrator, Config, Sink, Source, Start, Stream};
use fairfeed_feed::gen::{GenConfig, GenPacket, Generator};
use fairfeed_feed::lines::{impair, Impairment};
use fairfeed_wire::moldudp64::RequestRepr;

/// Counts outputs; a real shell would hand the bytes to a socket here.
#[derive(Default)]
struct Count(u64);

impl Sink for Count {
    fn emit(&mut self, _s: Stream, p: &[u8]) {
        self.0 += p.len() as u64;
    }
    fn request(&mut self, _r: RequestRepr) {}
}

fn merged(clean: &[GenPacket], a: Impairment, b: Impairment) -> Vec<(u64, usize, Vec<u8>)> {
    let (la, _) = impair(clean, &a, 1);
    let (lb, _) = impair(clean, &b, 2);
    let mut v: Vec<_> = la
        .into_iter()
        .map(|p| (p.ts_ns, 0, p.payload))
        .chain(lb.into_iter().map(|p| (p.ts_ns, 1, p.payload)))
        .collect();
    v.sort_by_key(|x| (x.0, x.1));
    v
}

fn run(inputs: &[(u64, usize, Vec<u8>)]) -> u64 {
    let cfg = Config { start: Start::Seq(1), ..Config::default() };
    let mut arb = Arbitrator::new(cfg, SeqSpec::moldudp64()).expect("valid");
    let mut sink = Count::default();
    for (t, l, p) in inputs {
        arb.handle_packet(*t, Source::Line(*l), p, &mut sink);
    }
    sink.0
}

fn bench(c: &mut Criterion) {
    let clean: Vec<GenPacket> =
        Generator::new(GenConfig { messages: 200_000, symbols: 500, ..Default::default() }).expect("valid").collect();
    let in_order = merged(&clean, Impairment::default(), Impairment { delay_ns: 5_000, ..Default::default() });
    let lossy = Impairment { loss: 0.01, reorder: 0.005, jitter_ns: 2_000, ..Default::default() };
    let loss_reorder = merged(&clean, lossy, Impairment { delay_ns: 5_000, ..lossy });
    let mut g = c.benchmark_group("arb");
    for (name, inputs) in [("in_order", &in_order), ("loss_reorder", &loss_reorder)] {
        g.throughput(Throughput::Elements(inputs.len() as u64));
        g.bench_function(name, |b| b.iter(|| black_box(run(black_box(inputs)))));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
