//! What a loop does when a turn found no work: Aeron's idle strategies, in one
//! place for every shell (the arbitrator, tree nodes and their send threads,
//! the exchange). Seed 003 shows why it matters: waking a parked thread costs
//! tens of µs on a VM, so a latency-critical loop spins; a loop that may be
//! idle for long should not burn a core for it.

/// How a loop waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleStrategy {
    /// Never sleep: lowest latency, one core always busy.
    Spin,
    /// Spin for `spin_ns` after the last work, then yield the CPU until
    /// `yield_ns`, then park (the shell's own wait: `poll(2)` on its sockets,
    /// or a thread park) — the backoff of Aeron's `BackoffIdleStrategy`.
    Backoff {
        /// ns of spinning after the last work.
        spin_ns: u64,
        /// ns after the last work until it parks (yielding from `spin_ns` on).
        yield_ns: u64,
    },
    /// Park at once: least CPU, highest wake-up latency.
    #[default]
    Park,
}

impl IdleStrategy {
    /// Spin 50 µs, yield until 1 ms, then park.
    pub const BACKOFF_DEFAULT: IdleStrategy = IdleStrategy::Backoff { spin_ns: 50_000, yield_ns: 1_000_000 };
}

/// What an idle turn should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Spin once (`std::hint::spin_loop`) and look again.
    Spin,
    /// Give the CPU to another thread, then look again.
    Yield,
    /// Sleep until input or the next timer.
    Park,
}

/// An idle strategy with its state: how long the loop has gone without work.
#[derive(Debug, Clone, Copy)]
pub struct Idler {
    /// The strategy it follows.
    pub strategy: IdleStrategy,
    /// When the current idle stretch began (ns on the caller's clock).
    idle_since: Option<u64>,
}

impl Idler {
    /// An idler that has seen no idle turn yet.
    pub fn new(strategy: IdleStrategy) -> Self {
        if let IdleStrategy::Backoff { spin_ns, yield_ns } = strategy {
            assert!(spin_ns <= yield_ns, "a backoff spins first, then yields: spin_ns ≤ yield_ns");
        }
        Idler { strategy, idle_since: None }
    }

    /// The turn did work: the next idle stretch starts from spinning again.
    pub fn busy(&mut self) {
        self.idle_since = None;
    }

    /// The turn at `now` found nothing: what to do now.
    pub fn wait(&mut self, now: u64) -> Wait {
        let since = *self.idle_since.get_or_insert(now);
        let idle_for = now.saturating_sub(since);
        match self.strategy {
            IdleStrategy::Spin => Wait::Spin,
            IdleStrategy::Backoff { spin_ns, .. } if idle_for < spin_ns => Wait::Spin,
            IdleStrategy::Backoff { yield_ns, .. } if idle_for < yield_ns => Wait::Yield,
            IdleStrategy::Backoff { .. } | IdleStrategy::Park => Wait::Park,
        }
    }

    /// [`Idler::wait`], doing the spin or the yield itself and calling `park` to park.
    pub fn idle(&mut self, now: u64, park: impl FnOnce()) {
        match self.wait(now) {
            Wait::Spin => std::hint::spin_loop(),
            Wait::Yield => std::thread::yield_now(),
            Wait::Park => park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_spins_then_yields_then_parks_and_starts_over_after_work() {
        let mut i = Idler::new(IdleStrategy::Backoff { spin_ns: 100, yield_ns: 1_000 });
        assert_eq!(i.wait(5_000), Wait::Spin, "the stretch starts now");
        assert_eq!(i.wait(5_099), Wait::Spin);
        assert_eq!(i.wait(5_100), Wait::Yield);
        assert_eq!(i.wait(5_999), Wait::Yield);
        assert_eq!(i.wait(6_000), Wait::Park);
        assert_eq!(i.wait(9_000), Wait::Park);
        i.busy();
        assert_eq!(i.wait(9_500), Wait::Spin, "work resets the backoff");
        assert_eq!(Idler::new(IdleStrategy::Spin).wait(u64::MAX), Wait::Spin);
        assert_eq!(Idler::new(IdleStrategy::Park).wait(0), Wait::Park);
    }

    #[test]
    #[should_panic(expected = "spin_ns ≤ yield_ns")]
    fn a_backoff_that_yields_before_it_spins_is_refused() {
        let _ = Idler::new(IdleStrategy::Backoff { spin_ns: 10, yield_ns: 5 });
    }
}
