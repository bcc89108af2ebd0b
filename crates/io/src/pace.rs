//! Waiting until an instant precisely: sleep while far away, then spin.
//!
//! The kernel's sleep overshoots by tens of microseconds; a busy spin is exact
//! to the clock's resolution but burns a core. [`Pacer`] sleeps until
//! `spin_ns` before the deadline and spins the rest, as tcpreplay does.

use std::time::{Duration, Instant};

/// Default spin window: covers the usual sleep overshoot on a loaded host.
pub const SPIN_NS_DEFAULT: u64 = 100_000;

/// Waits for deadlines measured from a fixed start.
#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    start: Instant,
    spin_ns: u64,
}

impl Pacer {
    /// Starts the clock now.
    pub fn new(spin_ns: u64) -> Self {
        Pacer { start: Instant::now(), spin_ns }
    }

    /// Nanoseconds since the start.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Returns once `deadline_ns` (since the start) has passed; returns the
    /// lateness in nanoseconds (0 if the deadline was met to the ns).
    pub fn wait_until(&self, deadline_ns: u64) -> u64 {
        let now = self.now_ns();
        if now >= deadline_ns {
            return now - deadline_ns;
        }
        let left = deadline_ns - now;
        if left > self.spin_ns {
            std::thread::sleep(Duration::from_nanos(left - self.spin_ns));
        }
        loop {
            let now = self.now_ns();
            if now >= deadline_ns {
                return now - deadline_ns;
            }
            std::hint::spin_loop();
        }
    }
}
