//! Goal (issue 40, item 7): `--clock system` takes its bound from AWS
//! ClockBound's shared-memory segment where the daemon publishes one, and
//! reads it exactly as ClockBound's own client does.
//! Method: AWS's `clock-bound-shm` crate — the writer the ClockBound daemon
//! uses, and its reader — writes segments (synchronized, disrupted, void);
//! our reader reads the same files and must give the bound AWS's reader
//! gives, refuse what it refuses, and a watcher must follow the daemon's
//! updates. Nothing of ClockBound's is ours; no daemon is needed.

use std::ffi::CString;
use std::time::{Duration, Instant};

use clock_bound_shm::{ClockErrorBound, ClockStatus, ShmReader, ShmWrite, ShmWriter};
use fairfeed_io::hostclock::{
    clockbound_read, monotonic_coarse_ns, ClockBoundStatus, HostClockError, HostClockSource, HostClockWatch,
};
use nix026::sys::time::TimeSpec;

const BOUND_NS: i64 = 5_000;
const DRIFT_PPB: u32 = 15_000;

fn mono() -> TimeSpec {
    clock_bound_shm::common::clock_gettime_safe(clock_bound_shm::common::CLOCK_MONOTONIC).unwrap()
}

fn ceb(as_of: TimeSpec, void_after: TimeSpec, status: ClockStatus) -> ClockErrorBound {
    ClockErrorBound::new(as_of, void_after, BOUND_NS, 7, DRIFT_PPB, status, true)
}

/// AWS's reader: the half-width of its (earliest, latest), and its status.
fn theirs(path: &std::path::Path) -> (u64, ClockStatus) {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    let mut r = ShmReader::new(c.as_c_str()).unwrap();
    let (earliest, latest, status) = r.snapshot().unwrap().now().unwrap();
    let width = latest - earliest;
    (u64::try_from(width.tv_sec() * 1_000_000_000 + width.tv_nsec()).unwrap() / 2, status)
}

#[test]
fn our_reader_gives_clockbounds_own_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shm0");
    let mut w = ShmWriter::new(&path).unwrap();
    let now = mono();
    // Published 2 s ago: the bound has grown by 2 s × 15 ppm = 30 µs since.
    let as_of = now - TimeSpec::new(2, 0);
    w.write(&ceb(as_of, now + TimeSpec::new(60, 0), ClockStatus::Synchronized));

    let r = clockbound_read(&path).unwrap();
    assert_eq!((r.bound_ns, r.max_drift_ppb, r.disruption_marker), (5_000, DRIFT_PPB, 7));
    assert_eq!(r.status, ClockBoundStatus::Synchronized);
    assert!(r.generation > 0 && r.generation % 2 == 0);
    let ours = r.bound_ns_at(monotonic_coarse_ns()).unwrap();
    let (aws, status) = theirs(&path);
    assert_eq!(status, ClockStatus::Synchronized);
    // Read a moment apart: the bound grows 15 ns per ms between the two.
    eprintln!("published 2 s ago, 5 µs at 15 ppm: ours {ours} ns, ClockBound's reader {aws} ns");
    assert!(ours.abs_diff(aws) <= 150, "ours {ours} ns, ClockBound's {aws} ns");
    assert!((30_000..40_000).contains(&(ours - 5_000)), "2 s of drift at 15 ppm: {ours}");

    // Disrupted: ClockBound says so; we give no bound.
    w.write(&ceb(mono(), mono() + TimeSpec::new(60, 0), ClockStatus::Disrupted));
    assert_eq!(theirs(&path).1, ClockStatus::Disrupted);
    assert_eq!(clockbound_read(&path).unwrap().bound_ns_at(monotonic_coarse_ns()), None);

    // The daemon stopped updating past void_after: ClockBound says unknown; no bound.
    let now = mono();
    w.write(&ceb(now - TimeSpec::new(20, 0), now - TimeSpec::new(1, 0), ClockStatus::Synchronized));
    assert_eq!(theirs(&path).1, ClockStatus::Unknown);
    assert_eq!(clockbound_read(&path).unwrap().bound_ns_at(monotonic_coarse_ns()), None);

    // Past the restart grace, before void_after: free running, still bounded, as ClockBound says.
    let now = mono();
    w.write(&ceb(now - TimeSpec::new(10, 0), now + TimeSpec::new(50, 0), ClockStatus::Synchronized));
    let (aws, status) = theirs(&path);
    assert_eq!(status, ClockStatus::FreeRunning);
    let ours = clockbound_read(&path).unwrap().bound_ns_at(monotonic_coarse_ns()).unwrap();
    assert!(ours.abs_diff(aws) <= 150, "ours {ours} ns, ClockBound's {aws} ns");
}

#[test]
fn the_watcher_follows_the_daemon_and_publishes_a_bound_that_holds_until_it_reads_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shm0");
    let mut w = ShmWriter::new(&path).unwrap();
    w.write(&ceb(mono(), mono() + TimeSpec::new(60, 0), ClockStatus::Synchronized));
    let watch = HostClockWatch::start(HostClockSource::ClockBound(path.clone())).unwrap();
    let published = watch.bound().load(std::sync::atomic::Ordering::Relaxed);
    let now = clockbound_read(&path).unwrap().bound_ns_at(monotonic_coarse_ns()).unwrap();
    // It holds until the next reading (100 ms, with slack): above the bound now.
    assert!(published >= now && published <= now + 10_000, "published {published}, now {now}");
    // The daemon says disrupted: within a few polls, no bound.
    w.write(&ceb(mono(), mono() + TimeSpec::new(60, 0), ClockStatus::Disrupted));
    let t0 = Instant::now();
    while watch.bound().load(std::sync::atomic::Ordering::Relaxed) != u64::MAX {
        assert!(t0.elapsed() < Duration::from_secs(3), "the watcher did not see the disruption");
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = watch.stats();
    assert!(s.queries >= 2 && s.unsynchronized >= 1, "{s:?}");
}

#[test]
fn what_is_not_a_clockbound_segment_is_refused_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none");
    assert!(matches!(clockbound_read(&missing), Err(HostClockError::ClockBound(..))));
    assert!(HostClockWatch::start(HostClockSource::ClockBound(missing)).is_err());
    let junk = dir.path().join("junk");
    std::fs::write(&junk, [0x5a_u8; 80]).unwrap();
    let e = clockbound_read(&junk).unwrap_err().to_string();
    assert!(e.contains("magic"), "{e}");
    std::fs::write(&junk, [0_u8; 10]).unwrap();
    let e = clockbound_read(&junk).unwrap_err().to_string();
    assert!(e.contains("10 bytes"), "{e}");
    // A segment the writer created but never wrote: not initialized yet.
    let fresh = dir.path().join("fresh");
    let _w = ShmWriter::new(&fresh).unwrap();
    assert!(clockbound_read(&fresh).is_err());
}
