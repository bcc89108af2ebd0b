//! The send side of a node: copies wait for their emulated link delay (when
//! link emulation is on) and go out in `sendmmsg` batches.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::batch::{BatchSend, Sent};

/// Copies waiting in the delay queue at most; beyond it copies are dropped and counted.
pub const DELAY_QUEUE_MAX: usize = 1 << 20;

/// One copy to send: when, where, what.
#[derive(Debug, Clone)]
pub struct Copy {
    pub due_ns: u64,
    pub to: SocketAddr,
    pub bytes: Arc<[u8]>,
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
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slots: Vec<Option<Copy>>,
    free: Vec<usize>,
    order: u64,
    batch: BatchSend,
    due: Vec<Copy>,
    counters: Arc<TxCounters>,
}

impl Egress {
    pub fn new(sock: UdpSocket, counters: Arc<TxCounters>) -> Self {
        Egress {
            sock,
            queue: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            order: 0,
            batch: BatchSend::default(),
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
        let s = self.batch.send(&self.sock, self.due.iter().map(|c| (&c.bytes[..], c.to)));
        self.due.clear();
        self.counters.add(s);
        s.sent
    }
}
