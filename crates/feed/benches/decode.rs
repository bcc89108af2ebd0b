//! ITCH 5.0 decode and MoldUDP64 framing throughput, ours beside the `itch5`
//! crate on the same buffer: 200,000 messages of a generated trading-day slice
//! (the generator's type mix), laid out as the 2-byte-length-prefixed stream
//! both decoders read. Both validate every message's type and exact length
//! and do the same work per message (count it, sum add and execute shares).
//!
//! Run: `cargo bench -p fairfeed-feed --bench decode`

use std::hint::black_box;
use std::ops::ControlFlow;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fairfeed_feed::gen::{GenConfig, Generator};
use fairfeed_wire::itch::Message;
use fairfeed_wire::moldudp64::Packet;

const MESSAGES: u64 = 200_000;

fn packets() -> Vec<Vec<u8>> {
    let cfg = GenConfig { messages: MESSAGES, symbols: 500, seed: 7, ..Default::default() };
    Generator::new(cfg).expect("valid config").map(|p| p.payload).collect()
}

fn stream(packets: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in packets {
        let Ok(p) = Packet::new_checked(&p[..]) else {
            continue;
        };
        let Ok(_) = p.messages().try_for_each(|b| -> Result<(), fairfeed_wire::Error> {
            let b = b?;
            out.extend_from_slice(&(b.len() as u16).to_be_bytes());
            out.extend_from_slice(b);
            Ok(())
        }) else {
            continue;
        };
    }
    out
}

/// Our decoder over the length-prefixed stream.
fn ours(buf: &[u8]) -> (u64, u64) {
    let (mut n, mut shares) = (0u64, 0u64);
    let mut rest = buf;
    while let Some((len, tail)) = rest.split_first_chunk::<2>() {
        let len = usize::from(u16::from_be_bytes(*len));
        let Some((body, tail)) = tail.split_at_checked(len) else {
            break;
        };
        rest = tail;
        match Message::parse(body) {
            Ok(Message::AddOrder(m)) => shares += u64::from(m.shares()),
            Ok(Message::AddOrderMpid(m)) => shares += u64::from(m.shares()),
            Ok(Message::OrderExecuted(m)) => shares += u64::from(m.executed_shares()),
            Ok(_) => {}
            Err(_) => break,
        }
        n += 1;
    }
    (n, shares)
}

/// The same work through `itch5`.
#[derive(Default)]
struct Itch5Sum {
    n: u64,
    shares: u64,
}

macro_rules! count {
    ($($f:ident: $t:ty),*) => { $(fn $f(&mut self, _m: &$t) -> ControlFlow<()> { self.n += 1; ControlFlow::Continue(()) })* };
}

impl itch5::MessageHandler for Itch5Sum {
    fn on_add_order_no_mpid_attribution(&mut self, m: &itch5::messages::AddOrderNoMPIDAttribution) -> ControlFlow<()> {
        self.n += 1;
        self.shares += u64::from(m.shares());
        ControlFlow::Continue(())
    }
    fn on_add_order_with_mpid_attribution(
        &mut self,
        m: &itch5::messages::AddOrderWithMPIDAttribution,
    ) -> ControlFlow<()> {
        self.n += 1;
        self.shares += u64::from(m.shares());
        ControlFlow::Continue(())
    }
    fn on_order_executed(&mut self, m: &itch5::messages::OrderExecuted) -> ControlFlow<()> {
        self.n += 1;
        self.shares += u64::from(m.executed_shares());
        ControlFlow::Continue(())
    }
    count!(on_system_event: itch5::messages::SystemEvent,
           on_stock_directory: itch5::messages::StockDirectory,
           on_stock_trading_action: itch5::messages::StockTradingAction,
           on_market_participant_position: itch5::messages::MarketParticipantPosition,
           on_mwcb_decline_level: itch5::messages::MWCBDeclineLevel,
           on_order_executed_with_price: itch5::messages::OrderExecutedWithPrice,
           on_order_cancel: itch5::messages::OrderCancel,
           on_order_delete: itch5::messages::OrderDelete,
           on_order_replace: itch5::messages::OrderReplace,
           on_trade: itch5::messages::Trade);
}

fn theirs(buf: &[u8]) -> (u64, u64) {
    let mut h = Itch5Sum::default();
    let _ = itch5::Parser::new(buf).parse_stream(&mut h);
    (h.n, h.shares)
}

fn bench(c: &mut Criterion) {
    let packets = packets();
    let buf = stream(&packets);
    assert_eq!(ours(&buf), theirs(&buf), "both decoders must see the same stream");
    assert_eq!(ours(&buf).0, MESSAGES);

    let mut g = c.benchmark_group("itch_decode");
    g.throughput(Throughput::Elements(MESSAGES));
    g.bench_function("fairfeed", |b| b.iter(|| black_box(ours(black_box(&buf)))));
    g.bench_function("itch5", |b| b.iter(|| black_box(theirs(black_box(&buf)))));
    g.bench_function("fairfeed_to_repr", |b| {
        b.iter(|| {
            let mut rest = black_box(&buf[..]);
            let mut n = 0u64;
            while let Some((len, tail)) = rest.split_first_chunk::<2>() {
                let (body, tail) = tail.split_at(usize::from(u16::from_be_bytes(*len)));
                rest = tail;
                if let Ok(m) = Message::parse(body) {
                    black_box(m.to_repr());
                    n += 1;
                }
            }
            n
        })
    });
    g.finish();

    let mut g = c.benchmark_group("moldudp64");
    g.throughput(Throughput::Elements(MESSAGES));
    g.bench_function("framing_only", |b| {
        b.iter(|| {
            let mut n = 0u64;
            for p in black_box(&packets) {
                if let Ok(p) = Packet::new_checked(&p[..]) {
                    n += p.messages().filter(|m| m.is_ok()).count() as u64;
                }
            }
            n
        })
    });
    g.bench_function("framing_and_validate", |b| {
        b.iter(|| {
            let mut n = 0u64;
            for p in black_box(&packets) {
                if let Ok(p) = Packet::new_checked(&p[..]) {
                    for m in p.messages() {
                        n += u64::from(m.and_then(fairfeed_wire::itch::validate).is_ok());
                    }
                }
            }
            n
        })
    });
    g.bench_function("framing_and_itch", |b| {
        b.iter(|| {
            let mut n = 0u64;
            for p in black_box(&packets) {
                if let Ok(p) = Packet::new_checked(&p[..]) {
                    for m in p.messages() {
                        if let Ok(m) = m.and_then(Message::parse) {
                            n += u64::from(m.stock_locate() != 0);
                        }
                    }
                }
            }
            n
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
