//! The host's own clock-error estimate, where a daemon publishes one: a node
//! run with `--clock system` trusts CLOCK_REALTIME, and on a host disciplined
//! by chrony it takes chrony's word for how far off that clock may be — the
//! bound AWS ClockBound derives from the same report: |system time offset| +
//! root delay / 2 + root dispersion, grown by the skew since the last
//! measurement. An unsynchronized daemon, or one that does not answer, gives
//! no bound (`u64::MAX`): the node is then over any limit, and says so.
//!
//! `chronyc -c tracking` (its CSV report) is read on a thread of its own,
//! never on the data path, which reads one atomic.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the watcher asks the daemon.
pub const HOST_CLOCK_POLL: Duration = Duration::from_secs(1);
/// How long one `chronyc` query may take before it counts as failed.
pub const HOST_CLOCK_TIMEOUT: Duration = Duration::from_secs(2);
/// Frequency error assumed on top of chrony's reported skew while the
/// report ages (ppm; ClockBound's `maxclockerror` default is 15 ppm — ours
/// is added to the skew chrony measured rather than replacing it).
pub const AGE_PPM: f64 = 1.0;

/// Why no estimate was read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostClockError {
    #[error("chronyc: {0}")]
    Run(String),
    #[error("chronyc's tracking report has {0} fields, not 14: {1:?}")]
    Fields(usize, String),
    #[error("chronyc's tracking report field {0} is not a number: {1:?}")]
    Number(&'static str, String),
}

/// The fields of `chronyc -c tracking` that the bound needs (seconds, ppm).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ChronyTracking {
    pub reference: String,
    pub stratum: u32,
    /// The last measurement, seconds since the epoch.
    pub ref_time_s: f64,
    /// How far the system clock is from NTP time, seconds (positive: fast).
    pub system_offset_s: f64,
    pub skew_ppm: f64,
    pub root_delay_s: f64,
    pub root_dispersion_s: f64,
    pub leap: String,
}

impl ChronyTracking {
    /// Parses one line of `chronyc -c tracking`.
    pub fn parse(line: &str) -> Result<ChronyTracking, HostClockError> {
        let f: Vec<&str> = line.trim().split(',').collect();
        if f.len() != 14 {
            return Err(HostClockError::Fields(f.len(), line.trim().to_string()));
        }
        let num = |i: usize, name: &'static str| {
            f[i].parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| HostClockError::Number(name, f[i].to_string()))
        };
        Ok(ChronyTracking {
            reference: f[0].to_string(),
            stratum: f[2].parse().map_err(|_| HostClockError::Number("stratum", f[2].to_string()))?,
            ref_time_s: num(3, "ref time")?,
            system_offset_s: num(4, "system time")?,
            skew_ppm: num(9, "skew")?,
            root_delay_s: num(10, "root delay")?,
            root_dispersion_s: num(11, "root dispersion")?,
            leap: f[13].to_string(),
        })
    }

    /// chrony has a source it trusts.
    pub fn synchronized(&self) -> bool {
        self.leap != "Not synchronised" && self.stratum > 0 && self.stratum < 16
    }

    /// The bound on CLOCK_REALTIME's error at `now_s` (seconds since the
    /// epoch), ns; `None` when chrony is not synchronized.
    pub fn bound_ns(&self, now_s: f64) -> Option<u64> {
        if !self.synchronized() {
            return None;
        }
        let age = (now_s - self.ref_time_s).max(0.0);
        let s = self.system_offset_s.abs()
            + self.root_delay_s.abs() / 2.0
            + self.root_dispersion_s.abs()
            + age * (self.skew_ppm.abs() + AGE_PPM) * 1e-6;
        Some((s * 1e9).ceil() as u64)
    }
}

/// Asks chrony once: `chronyc -c [-h SOCKET] tracking`, within [`HOST_CLOCK_TIMEOUT`].
pub fn chrony_tracking(socket: Option<&Path>) -> Result<ChronyTracking, HostClockError> {
    let mut cmd = Command::new("chronyc");
    cmd.arg("-c");
    if let Some(s) = socket {
        cmd.arg("-h").arg(s);
    }
    let mut child = cmd
        .arg("tracking")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| HostClockError::Run(format!("cannot run it ({e})")))?;
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() < HOST_CLOCK_TIMEOUT => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HostClockError::Run(format!("no answer within {HOST_CLOCK_TIMEOUT:?}")));
            }
        }
    }
    let out = child.wait_with_output().map_err(|e| HostClockError::Run(e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.trim().is_empty() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(HostClockError::Run(if err.is_empty() { format!("exit {}", out.status) } else { err }));
    }
    ChronyTracking::parse(text.lines().next().unwrap_or(""))
}

/// What the watcher saw so far.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HostClockStats {
    pub queries: u64,
    pub failures: u64,
    pub unsynchronized: u64,
    pub last_error: Option<String>,
    pub last: Option<ChronyTracking>,
}

/// A thread that asks chrony every [`HOST_CLOCK_POLL`] and publishes the
/// bound (ns; `u64::MAX`: none — unsynchronized, or no answer) in an atomic.
pub struct HostClockWatch {
    bound: Arc<AtomicU64>,
    stats: Arc<std::sync::Mutex<HostClockStats>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostClockWatch {
    /// Asks once now (an error if chrony cannot be asked at all: the
    /// operator named it), then keeps asking on a thread.
    pub fn start(socket: Option<PathBuf>) -> Result<HostClockWatch, HostClockError> {
        let first = chrony_tracking(socket.as_deref())?;
        let bound = Arc::new(AtomicU64::new(u64::MAX));
        let stats = Arc::new(std::sync::Mutex::new(HostClockStats::default()));
        let stop = Arc::new(AtomicBool::new(false));
        record(&bound, &stats, Ok(first));
        let (b, s, st) = (bound.clone(), stats.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("ff-hostclock".into())
            .spawn(move || {
                // Until stopped, or every other holder of the bound let it go (detached).
                while !st.load(Ordering::Relaxed) && Arc::strong_count(&b) > 1 {
                    let t0 = Instant::now();
                    while t0.elapsed() < HOST_CLOCK_POLL && !st.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if !st.load(Ordering::Relaxed) {
                        record(&b, &s, chrony_tracking(socket.as_deref()));
                    }
                }
            })
            .map_err(|e| HostClockError::Run(format!("cannot start its thread ({e})")))?;
        Ok(HostClockWatch { bound, stats, stop, thread: Some(thread) })
    }

    /// The bound now, ns (`u64::MAX`: none).
    pub fn bound(&self) -> Arc<AtomicU64> {
        self.bound.clone()
    }

    /// The bound, the thread left running until every clone of it is dropped.
    pub fn detach(mut self) -> Arc<AtomicU64> {
        self.thread.take();
        self.bound.clone()
    }

    pub fn stats(&self) -> HostClockStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for HostClockWatch {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::Relaxed);
            let _ = t.join();
        }
    }
}

fn record(bound: &AtomicU64, stats: &std::sync::Mutex<HostClockStats>, got: Result<ChronyTracking, HostClockError>) {
    let now_s = crate::clock::wall_ns() as f64 / 1e9;
    let Ok(mut s) = stats.lock() else { return };
    s.queries += 1;
    match got {
        Ok(t) => {
            let b = t.bound_ns(now_s);
            s.unsynchronized += u64::from(b.is_none());
            bound.store(b.unwrap_or(u64::MAX), Ordering::Relaxed);
            s.last = Some(t);
        }
        Err(e) => {
            s.failures += 1;
            s.last_error = Some(e.to_string());
            bound.store(u64::MAX, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chrony_reports_parse_into_bounds_and_bad_ones_into_errors() {
        // Real `chronyc -c tracking` lines (chrony 4.3, a loopback server).
        let synced = "7F000001,127.0.0.1,9,1795833256.839558363,-0.000001177,-0.000000043,0.000000251,0.193,-0.013,0.437,0.000005478,0.000000951,0.1,Normal";
        let t = ChronyTracking::parse(synced).unwrap();
        assert!(t.synchronized());
        // 1.177 + 5.478/2 + 0.951 µs, and 0.437 + 1 ppm over one second of age.
        let b = t.bound_ns(t.ref_time_s).unwrap();
        assert_eq!(b, 4_867);
        assert_eq!(t.bound_ns(t.ref_time_s + 1.0).unwrap(), 4_867 + 1_437);
        let unsynced = "00000000,,0,0.000000000,0.000000000,0.000000000,0.000000000,0.000,0.000,0.000,1.000000000,1.000000000,0.0,Not synchronised";
        assert_eq!(ChronyTracking::parse(unsynced).unwrap().bound_ns(1e9), None);
        assert!(matches!(ChronyTracking::parse("506 Cannot talk to daemon"), Err(HostClockError::Fields(1, _))));
        let nan = synced.replace("0.000005478", "nan");
        assert!(matches!(ChronyTracking::parse(&nan), Err(HostClockError::Number("root delay", _))));
    }
}
