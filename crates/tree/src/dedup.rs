//! Bounded duplicate detection over overlay sequence numbers.
//!
//! Jasper's XDP de-duplicator (its appendix A) keeps a fixed power-of-two
//! buffer and assumes messages sent a second apart are never reordered. Ours is
//! a sliding bitmap of [`WINDOW`] sequence numbers: memory is fixed (8 KiB),
//! any reordering within the window is handled exactly, and the assumption —
//! nothing arrives more than `WINDOW` sequence numbers late — is checked: a
//! copy older than the window is refused and counted, never delivered twice.

/// Sequence numbers remembered (a power of two).
pub const WINDOW: u64 = 1 << 16;
const WORDS: usize = (WINDOW / 64) as usize;
const _: () = assert!(WINDOW.is_power_of_two() && WINDOW >= 64);

/// What [`Dedup::check`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// First copy: deliver it.
    New,
    /// A later copy of something delivered: drop it.
    Duplicate,
    /// Older than the window: cannot tell, so dropped and counted (the window
    /// assumption was violated).
    TooOld,
}

/// The sliding window.
#[derive(Debug, Clone)]
pub struct Dedup {
    /// Lowest sequence number the window covers.
    base: u64,
    bits: Box<[u64; WORDS]>,
    /// Sequence numbers seen again.
    pub duplicates: u64,
    /// Sequence numbers below the window (too old to tell).
    pub too_old: u64,
}

impl Default for Dedup {
    fn default() -> Self {
        Dedup { base: 0, bits: Box::new([0; WORDS]), duplicates: 0, too_old: 0 }
    }
}

impl Dedup {
    fn slot(seq: u64) -> (usize, u64) {
        let i = seq & (WINDOW - 1);
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    /// The word [`Dedup::check`] will read for `seq` (a prefetch hint).
    #[cfg(feature = "prefetch")]
    pub fn line(&self, seq: u64) -> *const u64 {
        self.bits.as_ptr().wrapping_add(Self::slot(seq).0)
    }

    /// Records `seq` and says whether it was new.
    pub fn check(&mut self, seq: u64) -> Seen {
        if seq < self.base {
            self.too_old += 1;
            return Seen::TooOld;
        }
        if seq >= self.base + WINDOW {
            // Slide: forget everything that falls out of the window.
            let new_base = seq - WINDOW + 1;
            if new_base - self.base >= WINDOW {
                self.bits.fill(0);
            } else {
                for s in self.base..new_base {
                    let (w, b) = Self::slot(s);
                    self.bits[w] &= !b;
                }
            }
            self.base = new_base;
        }
        let (w, b) = Self::slot(seq);
        if self.bits[w] & b != 0 {
            self.duplicates += 1;
            Seen::Duplicate
        } else {
            self.bits[w] |= b;
            Seen::New
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn window_slides_and_counts_violations() {
        let mut d = Dedup::default();
        assert_eq!(d.check(5), Seen::New);
        assert_eq!(d.check(5), Seen::Duplicate);
        assert_eq!(d.check(WINDOW + 10), Seen::New); // base moves to 11
        assert_eq!(d.check(5), Seen::TooOld);
        assert_eq!(d.check(11), Seen::New);
        assert_eq!(d.check(10 * WINDOW), Seen::New);
        assert_eq!((d.duplicates, d.too_old), (1, 1));
    }

    proptest! {
        /// Against an exact set: within the window every verdict is exact,
        /// and nothing is ever reported New twice.
        #[test]
        fn matches_an_exact_set(seqs in proptest::collection::vec(0u64..3 * WINDOW, 1..2000)) {
            let mut d = Dedup::default();
            let mut seen = std::collections::HashSet::new();
            let mut max = 0u64;
            for s in seqs {
                let v = d.check(s);
                let in_window = s + WINDOW > max.max(s);
                if v == Seen::New {
                    prop_assert!(seen.insert(s), "{} reported new twice", s);
                } else if in_window && v == Seen::Duplicate {
                    prop_assert!(seen.contains(&s));
                }
                if in_window && !seen.contains(&s) {
                    prop_assert!(v != Seen::Duplicate);
                }
                max = max.max(s);
            }
        }
    }
}
