//! What fair ordering costs per order: the DBO buffer (16 firms, each order
//! ranked by its delivery clock, heartbeats every few orders, released on
//! progress or on its bound) and the batch buffer, beside the same buffer in
//! FIFO mode (a pass-through: the floor of the interface) and a bare binary
//! heap push/pop of the same keys (the floor of any ranking). Then one call
//! auction over a batch of 64 orders on a 200-order book; and the release
//! point's order stamper against a plain copy.
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fairfeed_exchange::auction::{clear, AuctionOrder};
use fairfeed_exchange::engine::Side;
use fairfeed_exchange::ordering::{DeliveryClock, OrderingBuffer, OrderingMode};
use rand::{Rng, SeedableRng};

const FIRMS: u16 = 16;
const ORDERS: usize = 100_000;

/// (arrival ns, firm, clock, heartbeat?) — data every 20 µs, each firm
/// answering it after 2–30 µs over a path of 20–70 µs, and a heartbeat per
/// firm per data message.
fn flow() -> Vec<(u64, u16, DeliveryClock, bool)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut v = Vec::with_capacity(ORDERS * 2);
    let mut seq = 0u64;
    while v.len() < ORDERS * 2 {
        seq += 1;
        let t = seq * 20_000;
        for f in 0..FIRMS {
            let path = 20_000 + u64::from(f) * 3_000;
            let r = rng.gen_range(2_000..30_000);
            v.push((
                t + r + path + rng.gen_range(0..2_000),
                f,
                DeliveryClock { data_seq: seq, response_ns: r as i64 },
                false,
            ));
            v.push((t + path, f, DeliveryClock { data_seq: seq, response_ns: 0 }, true));
        }
    }
    v.sort_by_key(|x| x.0);
    v
}

fn drive(mode: OrderingMode, flow: &[(u64, u16, DeliveryClock, bool)]) -> usize {
    let mut b = OrderingBuffer::new(mode, usize::from(FIRMS));
    let mut out = 0;
    for &(t, f, c, hb) in flow {
        if b.next_timeout().is_some_and(|d| d <= t) {
            b.handle_timeout(t);
        }
        if hb {
            b.handle_heartbeat(t, f, c);
        } else {
            let _ = b.handle_order(t, f, Some(c), ());
        }
        while b.poll_release().is_some() {
            out += 1;
        }
    }
    out
}

fn ordering(c: &mut Criterion) {
    let flow = flow();
    let orders = flow.iter().filter(|x| !x.3).count() as u64;
    let mut g = c.benchmark_group("ordering");
    g.throughput(Throughput::Elements(orders));
    for (name, mode) in [
        ("fifo", OrderingMode::Fifo),
        ("dbo", OrderingMode::Dbo { bound_ns: 100_000 }),
        ("batch-100us", OrderingMode::Batch { interval_ns: 100_000 }),
    ] {
        g.bench_function(name, |b| b.iter(|| drive(mode, &flow)));
    }
    g.bench_function("bare-heap", |b| {
        b.iter(|| {
            let mut h = std::collections::BinaryHeap::new();
            let mut out = 0;
            for &(t, _, c, hb) in &flow {
                if !hb {
                    h.push(std::cmp::Reverse((c, t)));
                }
                while h.len() > 64 {
                    h.pop();
                    out += 1;
                }
            }
            out
        })
    });
    g.finish();
}

fn auction(c: &mut Criterion) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let mut orders: Vec<AuctionOrder> = (0..200)
        .map(|i| {
            let buy = i % 2 == 0;
            let limit = if buy { rng.gen_range(9_000..10_000) } else { rng.gen_range(10_001..11_000) };
            AuctionOrder {
                side: if buy { Side::Buy } else { Side::Sell },
                limit,
                qty: rng.gen_range(1..1_000),
                resting: true,
            }
        })
        .collect();
    orders.extend((0..64).map(|i| AuctionOrder {
        side: if i % 2 == 0 { Side::Buy } else { Side::Sell },
        limit: rng.gen_range(9_500..10_500),
        qty: rng.gen_range(1..1_000),
        resting: false,
    }));
    let mut g = c.benchmark_group("auction");
    g.throughput(Throughput::Elements(64));
    g.bench_function("clear-64-on-200", |b| {
        b.iter_batched(|| orders.clone(), |o| clear(&o, Some(10_000)), BatchSize::SmallInput)
    });
    g.finish();
}

/// The release point's stamper (`--order-proxy`): one firm session's bytes
/// — 10,000 Enter Orders (half with a min-quantity option) and cancels —
/// rewritten with the receiver's delivery clock, against copying them.
fn stamper(c: &mut Criterion) {
    use fairfeed_exchange::client::{self, Order};
    use fairfeed_exchange::stamp::Stamper;
    let mut bytes = Vec::new();
    for i in 0..10_000u32 {
        let o = Order {
            token: i,
            side: b'B',
            qty: 100,
            symbol: "AAPL",
            price: 10_000,
            min_qty: (i % 2) * 10,
            ..Default::default()
        };
        client::enter_order(&o, &mut bytes);
        if i % 4 == 0 {
            client::cancel_order(i, 0, &mut bytes);
        }
    }
    let clock = DeliveryClock { data_seq: 42, response_ns: 1_500 };
    let mut g = c.benchmark_group("stamp");
    g.throughput(Throughput::Elements(10_000));
    g.bench_function("stamp_10k_orders_in_4k_reads", |b| {
        let mut out = Vec::with_capacity(bytes.len() * 2);
        b.iter(|| {
            let mut s = Stamper::default();
            out.clear();
            for chunk in bytes.chunks(4096) {
                s.handle_bytes(chunk, Some(clock), &mut out).unwrap();
            }
            out.len()
        })
    });
    g.bench_function("copy_10k_orders_in_4k_reads", |b| {
        let mut out = Vec::with_capacity(bytes.len() * 2);
        b.iter(|| {
            out.clear();
            for chunk in bytes.chunks(4096) {
                out.extend_from_slice(chunk);
            }
            out.len()
        })
    });
    g.finish();
}

criterion_group!(benches, ordering, auction, stamper);
criterion_main!(benches);
