//! The release point's order proxy (`fairfeed receiver --order-proxy`): the
//! firm's program sends its OUCH session here instead of to the exchange,
//! and every Enter Order leaves with the receiver's own delivery clock
//! (`fairfeed_exchange::stamp::Stamper`) — DBO without the firm stamping,
//! and without the firm being able to stamp for itself (issue 44).
//!
//! A thin shell: a listener thread; per firm connection, one thread
//! carrying the firm's bytes through the stamper to the exchange and one
//! carrying the exchange's answers back unchanged. At most
//! [`PROXY_CONNECTIONS_MAX`] connections at once (more are refused and
//! counted; one silent for [`PROXY_IDLE_MAX`] is closed); each holds at most one SoupBinTCP packet of the firm's in the
//! stamper and a fixed buffer each way; a stream that does not frame as
//! SoupBinTCP is closed (counted).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use fairfeed_exchange::ordering::DeliveryClock;
use fairfeed_exchange::stamp::{StampStats, Stamper};
use fairfeed_io::clock::wall_ns;

/// Firm connections served at once.
pub const PROXY_CONNECTIONS_MAX: usize = 8;
/// A firm connection that sends nothing this long is closed (counted
/// `idle_closed`): an OUCH client sends a heartbeat every second, so this
/// one is gone, and it would hold a slot.
pub const PROXY_IDLE_MAX: Duration = Duration::from_secs(30);
/// How often the threads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// The release point's delivery clock: the last data message delivered and
/// when (wall ns). Written by the release path, read by the proxy. A
/// message may be delivered in the future — through a last hop (`--host`)
/// a firm's host has it at the deadline, not at the release — and counts
/// only from then: an order sent before it answers the message before.
#[derive(Debug, Default)]
pub struct ClockCell(Mutex<Cell>);

#[derive(Debug, Default)]
struct Cell {
    /// (last sequence, delivered at) of the last delivery in the past.
    now: Option<(u64, u64)>,
    /// Deliveries still ahead, in sequence order (at most [`AHEAD_MAX`]).
    ahead: std::collections::VecDeque<(u64, u64)>,
}

/// Deliveries a clock keeps ahead of now at most (a last hop holds ≤ 10 ms of them).
pub const AHEAD_MAX: usize = 65_536;

impl ClockCell {
    /// MoldUDP64 packet `payload` is delivered at `wall_ns` (now, or ahead):
    /// its last message is then the last data delivered (other bytes change nothing).
    pub fn delivered(&self, payload: &[u8], wall_ns: u64) {
        let Ok(p) = fairfeed_wire::moldudp64::Packet::new_checked(payload) else { return };
        let n = p.message_count();
        if n == 0 || n == fairfeed_wire::moldudp64::COUNT_END_OF_SESSION {
            return;
        }
        let last = p.sequence() + u64::from(n) - 1;
        let mut c = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Sequence order: never backwards (a late retransmission fills a gap behind).
        let newest = c.ahead.back().or(c.now.as_ref()).map(|x| x.0);
        if newest.is_some_and(|seq| last <= seq) {
            return;
        }
        if c.ahead.len() >= AHEAD_MAX {
            c.now = c.ahead.pop_front();
        }
        // Never delivered earlier than the one before it.
        let at = c.ahead.back().map_or(wall_ns, |x| x.1.max(wall_ns));
        c.ahead.push_back((last, at));
    }

    /// The clock at `now_ns` (None: nothing delivered yet).
    pub fn at(&self, now_ns: u64) -> Option<DeliveryClock> {
        let mut c = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        while c.ahead.front().is_some_and(|x| x.1 <= now_ns) {
            c.now = c.ahead.pop_front();
        }
        c.now.map(|(data_seq, at)| DeliveryClock { data_seq, response_ns: now_ns as i64 - at as i64 })
    }
}

/// What the proxy did.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ProxyStats {
    pub connections: u64,
    /// Refused: all [`PROXY_CONNECTIONS_MAX`] taken, or the exchange unreachable.
    pub refused_busy: u64,
    pub refused_upstream: u64,
    pub idle_closed: u64,
    #[serde(flatten)]
    pub stamp: StampStats,
}

/// A running proxy; stops with its `stop` flag.
pub struct OrderProxy {
    pub addr: SocketAddr,
    stats: Arc<Mutex<ProxyStats>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl OrderProxy {
    /// Listens on `listen`, forwarding to the exchange at `exchange`,
    /// stamping with `cell`; a connection silent for `idle` is closed
    /// ([`PROXY_IDLE_MAX`] in service).
    pub fn start(
        listen: SocketAddr,
        exchange: SocketAddr,
        cell: Arc<ClockCell>,
        stop: Arc<AtomicBool>,
        idle: Duration,
    ) -> std::io::Result<OrderProxy> {
        let l = TcpListener::bind(listen)?;
        l.set_nonblocking(true)?;
        let addr = l.local_addr()?;
        let stats = Arc::new(Mutex::new(ProxyStats::default()));
        let st = stats.clone();
        let thread = thread::Builder::new()
            .name("order-proxy".into())
            .spawn(move || accept_loop(&l, (exchange, idle), &cell, &stop, &st))?;
        Ok(OrderProxy { addr, stats, thread: Some(thread) })
    }

    pub fn stats(&self) -> ProxyStats {
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the listener thread (after the stop flag is set).
    pub fn join(mut self) -> ProxyStats {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stats()
    }
}

fn accept_loop(
    l: &TcpListener,
    (exchange, idle): (SocketAddr, Duration),
    cell: &Arc<ClockCell>,
    stop: &Arc<AtomicBool>,
    st: &Arc<Mutex<ProxyStats>>,
) {
    let open = Arc::new(AtomicU64::new(0));
    let mut pairs = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok((firm, _)) = l.accept() else {
            thread::sleep(POLL / 10);
            continue;
        };
        let mut s = st.lock().unwrap_or_else(PoisonError::into_inner);
        if open.load(Ordering::Relaxed) as usize >= PROXY_CONNECTIONS_MAX {
            s.refused_busy += 1;
            continue; // dropped: closed
        }
        let Ok(up) = TcpStream::connect_timeout(&exchange, Duration::from_secs(2)) else {
            s.refused_upstream += 1;
            continue;
        };
        s.connections += 1;
        drop(s);
        open.fetch_add(1, Ordering::Relaxed);
        let _ = firm.set_nodelay(true);
        let _ = up.set_nodelay(true);
        pairs.push(serve((firm, up, idle), cell.clone(), stop.clone(), st.clone(), open.clone()));
    }
    for p in pairs {
        let _ = p.join();
    }
}

/// One firm connection: its bytes stamped up, the exchange's answers down.
fn serve(
    (firm, up, idle): (TcpStream, TcpStream, Duration),
    cell: Arc<ClockCell>,
    stop: Arc<AtomicBool>,
    st: Arc<Mutex<ProxyStats>>,
    open: Arc<AtomicU64>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let (Ok(mut firm_w), Ok(mut up_r)) = (firm.try_clone(), up.try_clone()) else { return };
        let _ = up_r.set_read_timeout(Some(POLL));
        let down_stop = stop.clone();
        let down = thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            while !down_stop.load(Ordering::Relaxed) {
                match up_r.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) if firm_w.write_all(&buf[..n]).is_ok() => {}
                    Ok(_) => break,
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(_) => break,
                }
            }
            let _ = firm_w.shutdown(Shutdown::Both);
        });
        let (mut firm_r, mut up_w) = (firm, up);
        let _ = firm_r.set_read_timeout(Some(POLL));
        let (mut stamper, mut buf, mut out) = (Stamper::default(), [0u8; 16 * 1024], Vec::new());
        let mut last = std::time::Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if last.elapsed() > idle {
                st.lock().unwrap_or_else(PoisonError::into_inner).idle_closed += 1;
                break;
            }
            match firm_r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    last = std::time::Instant::now();
                    out.clear();
                    let before = stamper.stats;
                    let r = stamper.handle_bytes(&buf[..n], cell.at(wall_ns()), &mut out);
                    add(&mut st.lock().unwrap_or_else(PoisonError::into_inner).stamp, stamper.stats, before);
                    if up_w.write_all(&out).is_err() || r.is_err() {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        let _ = up_w.shutdown(Shutdown::Both);
        let _ = firm_r.shutdown(Shutdown::Both);
        let _ = down.join();
        open.fetch_sub(1, Ordering::Relaxed);
    })
}

/// Adds what one read changed (`now − before`) to the shared counters.
fn add(s: &mut StampStats, now: StampStats, before: StampStats) {
    s.packets += now.packets - before.packets;
    s.stamped += now.stamped - before.stamped;
    s.replaced_own_clock += now.replaced_own_clock - before.replaced_own_clock;
    s.before_any_data += now.before_any_data - before.before_any_data;
    s.unreadable += now.unreadable - before.unreadable;
    s.malformed += now.malformed - before.malformed;
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_exchange::client;

    /// A fake exchange: accepts and keeps every connection, echoing nothing;
    /// what each sent is read into `got`.
    fn exchange() -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        thread::spawn(move || {
            for s in l.incoming().flatten() {
                let g = g.clone();
                thread::spawn(move || {
                    let mut s = s;
                    let mut b = [0u8; 4096];
                    while let Ok(n) = s.read(&mut b) {
                        if n == 0 {
                            break;
                        }
                        g.lock().unwrap().extend_from_slice(&b[..n]);
                    }
                });
            }
        });
        (addr, got)
    }

    fn closed(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        matches!(s.read(&mut [0u8; 16]), Ok(0) | Err(_))
    }

    /// A delivery ahead (a last hop's deadline) counts only from its time:
    /// an order before it answers the message before.
    #[test]
    fn a_delivery_ahead_counts_from_its_time() {
        let packet = |seq: u64| {
            let mut p = vec![0u8; 20];
            p[10..18].copy_from_slice(&seq.to_be_bytes());
            p[18..20].copy_from_slice(&1u16.to_be_bytes());
            p.extend_from_slice(&[0, 1, b'x']);
            p
        };
        let cell = ClockCell::default();
        assert!(cell.at(0).is_none());
        cell.delivered(&packet(1), 1_000);
        cell.delivered(&packet(2), 5_000);
        cell.delivered(&packet(2), 6_000); // not again
        cell.delivered(&packet(3), 4_000); // never before the one before it
        assert!(cell.at(999).is_none(), "nothing delivered yet");
        assert_eq!(cell.at(2_000), Some(DeliveryClock { data_seq: 1, response_ns: 1_000 }));
        assert_eq!(cell.at(5_100), Some(DeliveryClock { data_seq: 3, response_ns: 100 }));
    }

    /// Orders come out stamped; a client that sends garbage is cut off and
    /// counted; beyond the limit connections are refused; the others go on.
    #[test]
    fn stamps_orders_and_contains_misbehaving_clients() {
        let (up, got) = exchange();
        let cell = Arc::new(ClockCell::default());
        let mut p = vec![0u8; 20];
        p[10..18].copy_from_slice(&7u64.to_be_bytes());
        p[18..20].copy_from_slice(&3u16.to_be_bytes());
        p.extend_from_slice(&[0, 1, b'x', 0, 1, b'y', 0, 1, b'z']);
        cell.delivered(&p, wall_ns());
        let stop = Arc::new(AtomicBool::new(false));
        let proxy =
            OrderProxy::start("127.0.0.1:0".parse().unwrap(), up, cell, stop.clone(), Duration::from_secs(2)).unwrap();
        let mut good = TcpStream::connect(proxy.addr).unwrap();
        let mut garbage = TcpStream::connect(proxy.addr).unwrap();
        garbage.write_all(&[0, 0, 0xff, 0xff]).unwrap();
        assert!(closed(&mut garbage), "a stream that is not SoupBinTCP is closed");
        let mut others: Vec<TcpStream> =
            (0..PROXY_CONNECTIONS_MAX - 1).map(|_| TcpStream::connect(proxy.addr).unwrap()).collect();
        thread::sleep(Duration::from_millis(300));
        let mut extra = TcpStream::connect(proxy.addr).unwrap();
        assert!(closed(&mut extra), "one connection too many is refused");
        let mut b = Vec::new();
        client::enter_order(
            &client::Order { token: 1, side: b'B', qty: 1, symbol: "AAPL", price: 1, ..Default::default() },
            &mut b,
        );
        good.write_all(&b).unwrap();
        thread::sleep(Duration::from_millis(300));
        let bytes = got.lock().unwrap().clone();
        let Ok(Some((fairfeed_wire::soupbintcp::PacketRepr::UnsequencedData(m), _))) =
            fairfeed_wire::soupbintcp::split_packet(&bytes)
        else {
            panic!("the order reached the exchange: {bytes:?}")
        };
        let Ok(fairfeed_wire::ouch::inbound::Message::EnterOrder(o)) = fairfeed_wire::ouch::inbound::Message::parse(m)
        else {
            panic!("an Enter Order")
        };
        use fairfeed_wire::macros::Tail;
        let clock = fairfeed_exchange::sequencer::stamps(o.to_repr().appendage.as_slice()).clock.unwrap();
        assert_eq!(clock.data_seq, 9, "the last message of the packet released");
        let s = proxy.stats();
        assert_eq!((s.refused_busy, s.stamp.malformed, s.stamp.stamped), (1, 1, 1), "{s:?}");
        // The silent ones are closed after the idle limit; the talking one stays.
        let mut silent = others.pop().unwrap();
        assert!(closed(&mut silent), "a silent connection is closed");
        assert!(proxy.stats().idle_closed >= 1);
        stop.store(true, Ordering::Relaxed);
        others.clear();
        proxy.join();
    }
}
