//! What the release point's order proxy (`fairfeed receiver --order-proxy`)
//! adds to a firm's order path: one Enter Order's round trip to an exchange
//! stand-in that answers each order at once, over loopback TCP — directly,
//! and through the proxy (which stamps the delivery clock on the way).
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use fairfeed_exchange::client::{self, Order};
use fairfeed_net::order_proxy::{ClockCell, OrderProxy, PROXY_IDLE_MAX};

/// An exchange stand-in: answers every SoupBinTCP packet with one byte.
fn answering() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let _ = s.set_nodelay(true);
                let (mut buf, mut have) = (vec![0u8; 65_536], 0usize);
                while let Ok(n) = s.read(&mut buf[have..]) {
                    if n == 0 {
                        break;
                    }
                    have += n;
                    let mut at = 0;
                    while have - at >= 2 {
                        let len = usize::from(u16::from_be_bytes([buf[at], buf[at + 1]])) + 2;
                        if have - at < len {
                            break;
                        }
                        at += len;
                        if s.write_all(&[1]).is_err() {
                            return;
                        }
                    }
                    buf.copy_within(at..have, 0);
                    have -= at;
                }
            });
        }
    });
    addr
}

fn round_trip(s: &mut TcpStream, order: &[u8]) {
    s.write_all(order).unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
}

fn bench(c: &mut Criterion) {
    let exchange = answering();
    let cell = Arc::new(ClockCell::default());
    let mut p = vec![0u8; 20];
    p[18..20].copy_from_slice(&1u16.to_be_bytes());
    p.extend_from_slice(&[0, 1, b'x']);
    cell.delivered(&p, fairfeed_io::clock::wall_ns());
    let stop = Arc::new(AtomicBool::new(false));
    let proxy = OrderProxy::start("127.0.0.1:0".parse().unwrap(), exchange, cell, stop, PROXY_IDLE_MAX).unwrap();
    let mut order = Vec::new();
    client::enter_order(
        &Order { token: 1, side: b'B', qty: 100, symbol: "AAPL", price: 10_000, ..Default::default() },
        &mut order,
    );
    let mut g = c.benchmark_group("order_path");
    g.measurement_time(Duration::from_secs(5));
    for (name, addr) in [("direct", exchange), ("through_the_proxy", proxy.addr)] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        g.bench_function(name, |b| b.iter(|| round_trip(&mut s, &order)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
