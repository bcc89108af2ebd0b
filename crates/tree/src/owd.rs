//! A receiver's one-way-delay window: the last [`OWD_WINDOW`] samples, from
//! which the p95 Jasper reports is taken.

/// Samples kept (a ring).
pub const OWD_WINDOW: usize = 1024;

/// The last samples, in nanoseconds (clamped at 0: a skewed clock can make an
/// OWD look negative).
#[derive(Debug, Clone)]
pub struct OwdWindow {
    ring: Vec<u64>,
    next: usize,
    filled: bool,
}

impl Default for OwdWindow {
    fn default() -> Self {
        OwdWindow { ring: vec![0; OWD_WINDOW], next: 0, filled: false }
    }
}

impl OwdWindow {
    /// Adds one sample (a negative delay counts as 0), overwriting the oldest once full.
    pub fn record(&mut self, owd_ns: i64) {
        self.ring[self.next] = owd_ns.max(0) as u64;
        self.next = (self.next + 1) % OWD_WINDOW;
        self.filled |= self.next == 0;
    }

    /// Where the next sample goes (a prefetch hint).
    #[cfg(feature = "prefetch")]
    pub fn next_slot(&self) -> *const u64 {
        self.ring.as_ptr().wrapping_add(self.next)
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        if self.filled {
            OWD_WINDOW
        } else {
            self.next
        }
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The q-quantile (0..=1) of the window, or `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let n = self.len();
        if n == 0 {
            return None;
        }
        let mut v: Vec<u64> = self.ring[..n].to_vec();
        let k = ((q.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n) - 1;
        Some(*v.select_nth_unstable(k).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_of_a_known_window() {
        let mut w = OwdWindow::default();
        assert_eq!(w.quantile(0.95), None);
        for i in 1..=100 {
            w.record(i);
        }
        assert_eq!(w.quantile(0.95), Some(95));
        assert_eq!(w.quantile(1.0), Some(100));
        w.record(-5);
        assert_eq!(w.quantile(0.0), Some(0));
        for _ in 0..OWD_WINDOW {
            w.record(7);
        }
        assert_eq!(w.quantile(0.95), Some(7), "old samples rolled out");
    }
}
