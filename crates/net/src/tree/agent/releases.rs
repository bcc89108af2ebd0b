//! A receiver's recent releases, for a fleet view of fairness: the node's
//! data path appends each release (its sequence and the instant on the
//! receiver's synchronized clock), the control agent answers `releases FROM`
//! with a page of them, and `fairfeed stat --topology` lines the receivers'
//! pages up per message (delivery window, P(F), who is last).

use std::collections::VecDeque;
use std::sync::Mutex;

use serde_json::json;

/// Releases a receiver keeps (the oldest go first).
pub const RELEASE_LOG_MAX: usize = 65_536;
/// Releases in one answer at most (≈ 12 bytes each: one datagram of ≈ 8 KiB).
pub const RELEASES_PER_ANSWER: usize = 600;

/// One release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub sequence: u64,
    /// The release instant on the receiver's synchronized clock (the
    /// sender's clock as the receiver knows it; CLOCK_REALTIME with `--clock system`).
    pub at_ns: u64,
    /// It arrived after its deadline.
    pub late: bool,
    /// The receiver's clock was within its bound limit.
    pub clock_ok: bool,
}

/// The log the data path writes and the control agent reads.
#[derive(Debug, Default)]
pub struct ReleaseLog {
    inner: Mutex<VecDeque<Release>>,
}

impl ReleaseLog {
    /// Appends a turn's releases (one lock per turn, not per release).
    pub fn push_all(&self, rs: &[Release]) {
        if rs.is_empty() {
            return;
        }
        let mut q = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for r in rs {
            if q.len() >= RELEASE_LOG_MAX {
                q.pop_front();
            }
            q.push_back(*r);
        }
    }

    /// The first and last sequence kept, if any.
    pub fn range(&self) -> Option<(u64, u64)> {
        let q = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Some((q.front()?.sequence, q.back()?.sequence))
    }

    /// Up to `max` releases from the first with a sequence ≥ `from`, as the
    /// control socket answers them: `{"range": [first, last], "first": s0,
    /// "t0": ns0, "d": [[s − s0, t − t0], …], "late": [s…], "unsynced": [s…]}`.
    pub fn page(&self, from: u64, max: usize) -> serde_json::Value {
        let q = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let range = q.front().zip(q.back()).map(|(a, b)| [a.sequence, b.sequence]);
        let start = q.partition_point(|r| r.sequence < from);
        let page: Vec<Release> = q.iter().skip(start).take(max.min(RELEASES_PER_ANSWER)).copied().collect();
        drop(q);
        let (s0, t0) = page.first().map_or((0, 0), |r| (r.sequence, r.at_ns));
        let d: Vec<[i64; 2]> = page.iter().map(|r| [(r.sequence - s0) as i64, r.at_ns as i64 - t0 as i64]).collect();
        let late: Vec<u64> = page.iter().filter(|r| r.late).map(|r| r.sequence).collect();
        let unsynced: Vec<u64> = page.iter().filter(|r| !r.clock_ok).map(|r| r.sequence).collect();
        json!({"range": range, "first": s0, "t0": t0, "d": d, "late": late, "unsynced": unsynced})
    }
}

/// A page read back: the sequences the receiver keeps (first, last), and the releases.
pub type Page = (Option<(u64, u64)>, Vec<Release>);

/// A page as [`ReleaseLog::page`] wrote it, read back.
pub fn parse_page(v: &serde_json::Value) -> Option<Page> {
    let range = v.get("range").and_then(|r| Some((r.get(0)?.as_u64()?, r.get(1)?.as_u64()?)));
    let (s0, t0) = (v.get("first")?.as_u64()?, v.get("t0")?.as_u64()?);
    let late: std::collections::HashSet<u64> =
        v.get("late")?.as_array()?.iter().filter_map(serde_json::Value::as_u64).collect();
    let unsynced: std::collections::HashSet<u64> =
        v.get("unsynced")?.as_array()?.iter().filter_map(serde_json::Value::as_u64).collect();
    let mut out = Vec::new();
    for e in v.get("d")?.as_array()? {
        let (ds, dt) = (e.get(0)?.as_i64()?, e.get(1)?.as_i64()?);
        let sequence = s0.checked_add(u64::try_from(ds).ok()?)?;
        let at_ns = t0.checked_add_signed(dt)?;
        out.push(Release { sequence, at_ns, late: late.contains(&sequence), clock_ok: !unsynced.contains(&sequence) });
    }
    Some((range, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_round_trip_and_stay_bounded() {
        let log = ReleaseLog::default();
        let rs: Vec<Release> = (1..=1_000u64)
            .map(|s| Release { sequence: s, at_ns: 1_000_000 + s * 500 - s % 3, late: s % 97 == 0, clock_ok: s != 5 })
            .collect();
        log.push_all(&rs);
        assert_eq!(log.range(), Some((1, 1_000)));
        let p = log.page(400, 10_000);
        let (range, back) = parse_page(&p).unwrap();
        assert_eq!(range, Some((1, 1_000)));
        assert_eq!(back.len(), RELEASES_PER_ANSWER);
        assert_eq!(back[..], rs[399..399 + RELEASES_PER_ANSWER]);
        assert!(serde_json::to_string(&p).unwrap().len() < 9_000, "one page fits a datagram comfortably");
        let (_, tail) = parse_page(&log.page(990, 100)).unwrap();
        assert_eq!(tail[..], rs[989..]);
        let (_, none) = parse_page(&log.page(5_000, 100)).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn the_log_keeps_the_newest() {
        let log = ReleaseLog::default();
        let rs: Vec<Release> = (0..(RELEASE_LOG_MAX as u64 + 10))
            .map(|s| Release { sequence: s, at_ns: s, late: false, clock_ok: true })
            .collect();
        log.push_all(&rs);
        assert_eq!(log.range(), Some((10, RELEASE_LOG_MAX as u64 + 9)));
    }
}
