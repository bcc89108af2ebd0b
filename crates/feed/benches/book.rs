//! The snapshot service's costs: keeping books from a feed (the follower,
//! per message, beside decoding the same messages and nothing else — the
//! baseline from the same run) and building one snapshot of them (per open
//! order and state message, beside copying the same number of bytes).
//!
//! Run: `cargo bench -p fairfeed-feed --bench book`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fairfeed_feed::gen::{GenConfig, Generator};
use fairfeed_feed::snapshot::{Follower, GAP_WAIT_DEFAULT_NS};
use fairfeed_wire::itch::Message;
use fairfeed_wire::moldudp64::Packet;

const MESSAGES: u64 = 400_000;

fn packets() -> Vec<Vec<u8>> {
    let cfg = GenConfig { messages: MESSAGES, symbols: 1_000, seed: 7, ..Default::default() };
    Generator::new(cfg).expect("valid config").map(|p| p.payload).collect()
}

fn follow(packets: &[Vec<u8>]) -> Follower {
    let mut f = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 24);
    for p in packets {
        f.on_packet(0, p);
    }
    f
}

fn bench(c: &mut Criterion) {
    let packets = packets();
    let messages: u64 =
        packets.iter().map(|p| u64::from(Packet::new_checked(&p[..]).unwrap().message_count() % 0xFFFF)).sum();
    let mut g = c.benchmark_group("book");
    g.sample_size(20);
    g.throughput(Throughput::Elements(messages));
    g.bench_function("decode_only", |b| {
        b.iter(|| {
            let mut n = 0u64;
            for p in &packets {
                for m in Packet::new_checked(&p[..]).unwrap().messages() {
                    n += u64::from(Message::parse(m.unwrap()).is_ok());
                }
            }
            black_box(n)
        })
    });
    g.bench_function("follow", |b| b.iter(|| black_box(follow(&packets).next_sequence())));
    g.finish();

    // A busy day's middle: a million open orders over 1,000 stocks.
    let adds = adds(1_000_000, 1_000);
    let s = follow(&adds).snapshot().unwrap();
    eprintln!("snapshot: {} messages, {} bytes", s.messages, s.frames.len());
    let mut g = c.benchmark_group("snapshot");
    g.sample_size(10);
    g.throughput(Throughput::Elements(s.messages as u64));
    g.bench_function("build_1m_orders", |b| {
        b.iter_batched(|| follow(&adds), |mut f| black_box(f.snapshot().unwrap().frames.len()), BatchSize::LargeInput)
    });
    g.bench_function("copy_same_bytes", |b| b.iter(|| black_box(black_box(&s.frames[..]).to_vec())));
    g.finish();
}

/// A session of `orders` add orders over `stocks` stocks, packed as a feed.
fn adds(orders: u64, stocks: u16) -> Vec<Vec<u8>> {
    use fairfeed_wire::itch::AddOrderRepr;
    use fairfeed_wire::moldudp64::{PacketBuilder, Session};
    use fairfeed_wire::{Price4, Stock, Timestamp48};
    let session = Session::from_str_padded("BENCH00001");
    let (mut out, mut seq, mut i) = (Vec::new(), 1u64, 0u64);
    while i < orders {
        let mut buf = vec![0u8; 1400];
        let mut b = PacketBuilder::new(&mut buf, session, seq).unwrap();
        while i < orders && b.fits(36) {
            let locate = (i % u64::from(stocks)) as u16 + 1;
            let add = AddOrderRepr {
                stock_locate: locate,
                tracking_number: 0,
                timestamp: Timestamp48(34_200_000_000_000 + i),
                order_ref: i + 1,
                side: if i % 2 == 0 { b'B' } else { b'S' },
                shares: 100,
                stock: Stock::from_str_padded("STOCK"),
                price: Price4(1_000_000 + (i % 200) as u32 * 100),
            };
            b.push_with(36, |m| {
                add.emit(m).unwrap();
            })
            .unwrap();
            i += 1;
        }
        seq += u64::from(b.count());
        let n = b.finish();
        buf.truncate(n);
        out.push(buf);
    }
    out
}

criterion_group!(benches, bench);
criterion_main!(benches);
