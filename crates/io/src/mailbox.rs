//! A bounded single-producer/single-consumer queue between two agents of one
//! node (feed → node, node → delivery, node → send side), with a wake-up the
//! runner understands: an `eventfd` the consumer lists among its descriptors.
//!
//! The producer writes the `eventfd` only when the consumer has *armed* it,
//! so a busy consumer costs the producer no system call. A consumer armed at
//! the end of every turn ([`Incoming::arm`]) is woken by every first item
//! after it emptied the queue, wherever it runs — on the producer's thread
//! (the runner learns of it through `epoll`) or on its own (in `ppoll`). A
//! consumer alone on its thread may arm only before it parks (the send side:
//! a hundred thousand copies a second and no wake-up while it spins).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use nix::sys::eventfd::{EfdFlags, EventFd};

/// What both ends share.
#[derive(Debug)]
struct Shared {
    wake: EventFd,
    /// The consumer wants to be woken by the next item.
    armed: AtomicBool,
    /// The producer will send no more.
    closed: AtomicBool,
    /// The `eventfd` was written and not read since (reading it costs a
    /// system call, which a spinning consumer should not pay every turn).
    rung: AtomicBool,
}

impl Shared {
    fn ring_bell(&self) {
        // Marked before it is written, so a written bell is always marked: a
        // consumer that takes the mark before the write finds nothing to
        // read and puts the mark back (`clear_bell`). Written first, a
        // producer preempted between the two left the descriptor readable
        // and unmarked, and a consumer parking on it polled it in a loop
        // until that producer ran again — on a busy host, milliseconds (the
        // exchange's engine: 4-ms stalls).
        self.rung.store(true, Ordering::SeqCst);
        let _ = self.wake.write(1);
    }

    /// Clears the bell if it is marked (one `read` only then).
    fn clear_bell(&self) {
        if self.rung.load(Ordering::Relaxed) && self.rung.swap(false, Ordering::SeqCst) && self.wake.read().is_err() {
            // Marked, not yet written: the producer is between the two.
            self.rung.store(true, Ordering::SeqCst);
        }
    }
}

/// The producer's end.
pub struct Outgoing<T> {
    ring: rtrb::Producer<T>,
    shared: Arc<Shared>,
}

/// The consumer's end.
pub struct Incoming<T> {
    ring: rtrb::Consumer<T>,
    shared: Arc<Shared>,
}

/// A queue of `capacity` items.
pub fn mailbox<T>(capacity: usize) -> std::io::Result<(Outgoing<T>, Incoming<T>)> {
    assert!(capacity > 0, "a mailbox holds something");
    let (tx, rx) = rtrb::RingBuffer::<T>::new(capacity);
    let shared = Arc::new(Shared {
        wake: EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
        // Armed from the start: the first item wakes a consumer that has
        // not had a turn yet.
        armed: AtomicBool::new(true),
        closed: AtomicBool::new(false),
        rung: AtomicBool::new(false),
    });
    Ok((Outgoing { ring: tx, shared: shared.clone() }, Incoming { ring: rx, shared }))
}

impl<T> Outgoing<T> {
    /// Queues `v`; gives it back when the queue is full. Call [`Self::wake`]
    /// after a batch of pushes.
    pub fn push(&mut self, v: T) -> Result<(), T> {
        self.ring.push(v).map_err(|rtrb::PushError::Full(v)| v)
    }

    /// Wakes the consumer if it asked to be.
    pub fn wake(&self) {
        // Pairs with the fence in `Incoming::arm`: either the consumer sees the
        // item when it re-checks, or this sees it armed.
        fence(Ordering::SeqCst);
        if self.shared.armed.swap(false, Ordering::SeqCst) {
            self.shared.ring_bell();
        }
    }

    /// No more items will come; wakes the consumer whatever its state.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.ring_bell();
    }

    /// Whether either end closed it.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }
}

impl<T> Incoming<T> {
    /// Takes every waiting item (and clears the wake-up); returns how many.
    pub fn drain(&mut self, mut f: impl FnMut(T)) -> usize {
        self.shared.clear_bell();
        let mut n = 0;
        while let Ok(v) = self.ring.pop() {
            f(v);
            n += 1;
        }
        n
    }

    /// Takes the next waiting item, if any (clearing the wake-up, as
    /// [`Self::drain`] does, for a consumer that must own itself per item).
    pub fn pop(&mut self) -> Option<T> {
        self.shared.clear_bell();
        self.ring.pop().ok()
    }

    /// Asks to be woken by the next item; false if one is already waiting
    /// (then take it rather than wait).
    pub fn arm(&self) -> bool {
        self.shared.armed.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.ring.is_empty() {
            true
        } else {
            self.shared.armed.store(false, Ordering::SeqCst);
            false
        }
    }

    /// Spinning again: no wake-ups needed.
    pub fn disarm(&self) {
        self.shared.armed.store(false, Ordering::SeqCst);
    }

    /// Whether nothing waits in it now.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// The producer closed it and everything it sent was taken.
    pub fn is_finished(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire) && self.ring.is_empty()
    }

    /// Readable when the consumer should look.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.shared.wake.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

    fn readable<T>(rx: &Incoming<T>) -> bool {
        let mut fds = [PollFd::new(rx.fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
    }

    #[test]
    fn an_armed_consumer_is_woken_once_and_a_busy_one_not_at_all() {
        let (mut tx, mut rx) = mailbox::<u32>(4).unwrap();
        tx.push(1).unwrap();
        tx.wake();
        assert!(readable(&rx), "armed from the start");
        assert_eq!(rx.drain(|_| {}), 1);
        tx.push(9).unwrap();
        tx.wake();
        assert!(!readable(&rx), "not armed since: no system call, no wake-up");
        assert_eq!(rx.drain(|_| {}), 1);
        assert!(rx.arm());
        tx.push(2).unwrap();
        tx.wake();
        tx.push(3).unwrap();
        tx.wake();
        assert!(readable(&rx), "armed: woken");
        let mut got = Vec::new();
        rx.drain(|v| got.push(v));
        assert_eq!(got, [2, 3]);
        assert!(!readable(&rx), "drain clears the wake-up");
    }

    #[test]
    fn arming_with_an_item_waiting_says_so_and_a_full_queue_gives_the_item_back() {
        let (mut tx, rx) = mailbox::<u32>(2).unwrap();
        tx.push(1).unwrap();
        tx.push(2).unwrap();
        assert_eq!(tx.push(3), Err(3));
        assert!(!rx.arm(), "an item is waiting");
        tx.wake();
        assert!(!readable(&rx), "disarmed again by arm()");
    }

    #[test]
    fn a_bell_marked_but_not_yet_written_stays_marked_until_it_is_cleared() {
        let (_tx, mut rx) = mailbox::<u32>(2).unwrap();
        // The producer's first half of `ring_bell`: marked, not yet written.
        rx.shared.rung.store(true, Ordering::SeqCst);
        assert_eq!(rx.drain(|_| {}), 0);
        assert!(rx.shared.rung.load(Ordering::SeqCst), "the mark is put back: nothing was read");
        // The second half: written. The next look clears it.
        rx.shared.wake.write(1).unwrap();
        assert!(readable(&rx));
        assert_eq!(rx.pop(), None);
        assert!(!readable(&rx), "a written bell is always marked, so it is read, never polled for ever");
    }

    #[test]
    fn closing_wakes_and_finishes_once_drained() {
        let (mut tx, mut rx) = mailbox::<u32>(2).unwrap();
        tx.push(7).unwrap();
        tx.close();
        assert!(tx.is_closed());
        assert!(readable(&rx));
        assert!(!rx.is_finished(), "an item is still waiting");
        rx.drain(|_| {});
        assert!(rx.is_finished());
    }

    #[test]
    fn across_threads_nothing_is_lost_or_reordered() {
        let (mut tx, mut rx) = mailbox::<u64>(64).unwrap();
        let n = 100_000u64;
        let t = std::thread::spawn(move || {
            let mut k = 0;
            while k < n {
                if tx.push(k).is_ok() {
                    k += 1;
                }
                tx.wake();
            }
            tx.close();
        });
        let mut want = 0;
        while !rx.is_finished() {
            rx.drain(|v| {
                assert_eq!(v, want);
                want += 1;
            });
            if rx.arm() {
                let mut fds = [PollFd::new(rx.fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, PollTimeout::from(100u16));
            }
        }
        t.join().unwrap();
        assert_eq!(want, n);
    }
}
