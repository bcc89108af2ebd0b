//! The send side of a node: copies wait for their emulated link delay (when
//! link emulation is on) and go out in `sendmmsg` batches — inline in the
//! node's agent, or as an [`EgressAgent`] on a thread of its own behind a
//! bounded ring ([`super::Threading::Split`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fairfeed_io::agent::{Agent, Turn};

use super::TimeBase;
use crate::batch::Sent;
use crate::tuning::Applied;
use fairfeed_io::mailbox::{Incoming, Outgoing};
use fairfeed_io::send::SendPath;

/// Copies waiting in the delay queue at most; beyond it copies are dropped and counted.
pub const DELAY_QUEUE_MAX: usize = 1 << 20;

/// One copy to send: when, where, what; when it was handed to its
/// (emulated) link and the link's modelled delay, ns of the node's true time.
#[derive(Debug, Clone)]
pub struct Copy {
    pub due_ns: u64,
    pub to: SocketAddr,
    /// The packet, shared by its copies (a buffer of the node's pool, reused once every copy is sent).
    pub bytes: Arc<Vec<u8>>,
    pub handed_ns: u64,
    pub model_ns: u64,
    /// Sent from the replication socket: the kernel makes the node's other copies.
    pub fanout: bool,
}

/// Copies in flight per destination a [`Tap`] keeps at most (older ones are dropped).
pub const TAP_FLIGHTS_MAX: usize = 65_536;
/// Path lengths a [`Tap`] tells apart (longer paths count as this long).
pub const TAP_PATH_LINKS_MAX: usize = 8;

/// What a measuring harness (the demo) taps from the node agents it runs:
/// every copy's measured one-way latency between nodes (handed to its
/// emulated link → read by the next node) beside the link model's, and
/// every receiver arrival's one-way delay by the number of links crossed.
/// Pairing a read with its send relies on loopback delivering each socket's
/// datagrams in order.
#[derive(Debug, Default)]
pub struct Tap {
    inner: Mutex<TapInner>,
    /// Copies read so far, and those more than [`Tap::LAG_LATE_NS`] behind the
    /// model: read while the run goes on, to see the host falling behind.
    pub copies: AtomicU64,
    pub late_copies: AtomicU64,
}

#[derive(Debug, Default)]
struct TapInner {
    flights: HashMap<SocketAddr, VecDeque<(u64, u64)>>,
    /// Per copy: measured and modelled one-way ns.
    pub link: Vec<(u64, u64)>,
    /// Receiver arrivals' one-way delay, ns, by links crossed.
    pub paths: Vec<Vec<u64>>,
}

impl Tap {
    /// A copy this much (emulated ns) behind its modelled one-way latency counts as late.
    pub const LAG_LATE_NS: u64 = 5_000;

    fn sent(&self, to: SocketAddr, handed_ns: u64, model_ns: u64) {
        let mut t = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let q = t.flights.entry(to).or_default();
        if q.len() >= TAP_FLIGHTS_MAX {
            q.pop_front();
        }
        q.push_back((handed_ns, model_ns));
    }

    /// A datagram was read at `at` (true ns) on `me`.
    pub fn read(&self, me: SocketAddr, at: u64) {
        let mut t = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((handed, model)) = t.flights.get_mut(&me).and_then(VecDeque::pop_front) {
            let measured = at.saturating_sub(handed);
            t.link.push((measured, model));
            self.copies.fetch_add(1, Ordering::Relaxed);
            if measured.saturating_sub(model) > Self::LAG_LATE_NS {
                self.late_copies.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A receiver took in a new message that crossed `hops` links in `owd_ns`.
    pub fn arrival(&self, hops: u8, owd_ns: u64) {
        let mut t = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if t.paths.is_empty() {
            t.paths = vec![Vec::new(); TAP_PATH_LINKS_MAX + 1];
        }
        t.paths[usize::from(hops).min(TAP_PATH_LINKS_MAX)].push(owd_ns);
    }

    /// Takes what was tapped: per-copy (measured, model) ns, and arrivals' OWD by links crossed.
    pub fn take(&self) -> (Vec<(u64, u64)>, Vec<Vec<u64>>) {
        let mut t = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (std::mem::take(&mut t.link), std::mem::take(&mut t.paths))
    }
}

/// Counters both threads of a node update.
#[derive(Debug, Default)]
pub struct TxCounters {
    pub packets_out: AtomicU64,
    pub send_failed: AtomicU64,
    pub send_calls: AtomicU64,
    pub queue_full: AtomicU64,
}

impl TxCounters {
    pub fn add(&self, s: Sent) {
        self.packets_out.fetch_add(s.sent, Ordering::Relaxed);
        self.send_failed.fetch_add(s.failed, Ordering::Relaxed);
        self.send_calls.fetch_add(s.calls, Ordering::Relaxed);
    }
}

/// The delay queue and the batched sender.
pub struct Egress {
    sock: UdpSocket,
    /// The socket whose datagrams the TC replicator fans out ([`super::Replicate`]).
    fanout_sock: Option<UdpSocket>,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slots: Vec<Option<Copy>>,
    free: Vec<usize>,
    order: u64,
    batch: SendPath,
    due: Vec<Copy>,
    counters: Arc<TxCounters>,
    tap: Option<Arc<Tap>>,
}

impl Egress {
    pub fn new(
        sock: UdpSocket,
        fanout_sock: Option<UdpSocket>,
        batch: SendPath,
        counters: Arc<TxCounters>,
        tap: Option<Arc<Tap>>,
    ) -> Self {
        Egress {
            tap,
            sock,
            fanout_sock,
            queue: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            order: 0,
            batch,
            due: Vec::new(),
            counters,
        }
    }

    /// Queues a copy (sent by the next [`Egress::flush`] at or after its due time).
    pub fn push(&mut self, c: Copy) {
        if self.queue.len() >= DELAY_QUEUE_MAX {
            self.counters.queue_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let due = c.due_ns;
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(c);
                i
            }
            None => {
                self.slots.push(Some(c));
                self.slots.len() - 1
            }
        };
        self.order += 1;
        self.queue.push(Reverse((due, self.order, i)));
    }

    /// When the earliest queued copy is due.
    pub fn next_due(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse((d, ..))| *d)
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Sends every copy due by `now` in batches; returns how many went out.
    pub fn flush(&mut self, now: u64) -> u64 {
        while self.queue.peek().is_some_and(|Reverse((d, ..))| *d <= now) {
            let Some(Reverse((_, _, i))) = self.queue.pop() else { break };
            if let Some(c) = self.slots[i].take() {
                self.due.push(c);
            }
            self.free.push(i);
        }
        if self.due.is_empty() {
            return 0;
        }
        let mut s = self.batch.send(&self.sock, self.due.iter().filter(|c| !c.fanout).map(|c| (&c.bytes[..], c.to)));
        if let Some(f) = &self.fanout_sock {
            let k = self.batch.send(f, self.due.iter().filter(|c| c.fanout).map(|c| (&c.bytes[..], c.to)));
            s = Sent { sent: s.sent + k.sent, failed: s.failed + k.failed, calls: s.calls + k.calls };
        }
        if let Some(t) = &self.tap {
            for c in self.due.iter().take(s.sent as usize) {
                t.sent(c.to, c.handed_ns, c.model_ns);
            }
        }
        self.due.clear();
        self.counters.add(s);
        s.sent
    }
}

/// The node's side of a send thread: the ring and the thread.
pub struct EgressHandle {
    pub ring: Outgoing<Copy>,
    pub thread: Option<std::thread::JoinHandle<Vec<Applied>>>,
}

/// A node's send side as an agent of its own: takes copies from the ring,
/// holds them for their emulated delay, sends them in batches. It asks to be
/// woken only when it parks (it spins through a hundred thousand copies a
/// second otherwise).
pub struct EgressAgent {
    ring: Incoming<Copy>,
    egress: Egress,
    time: TimeBase,
    /// The thread tuning applied where it runs.
    pub applied: Vec<Applied>,
}

impl EgressAgent {
    pub fn new(ring: Incoming<Copy>, egress: Egress, time: TimeBase, applied: Vec<Applied>) -> Self {
        EgressAgent { ring, egress, time, applied }
    }
}

impl Agent for EgressAgent {
    fn role(&self) -> &'static str {
        "egress"
    }

    fn do_work(&mut self, now: u64, _turn: Turn) -> usize {
        let egress = &mut self.egress;
        let got = self.ring.drain(|c| egress.push(c));
        got + self.egress.flush(self.time.at(now)) as usize
    }

    fn next_due(&self) -> u64 {
        self.egress.next_due().map_or(u64::MAX, |d| self.time.wall_at(d))
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.ring.fd()]
    }

    fn is_done(&self) -> bool {
        self.ring.is_finished() && self.egress.is_empty()
    }

    fn before_park(&mut self) -> bool {
        self.ring.arm()
    }

    fn after_park(&mut self) {
        self.ring.disarm();
    }
}
