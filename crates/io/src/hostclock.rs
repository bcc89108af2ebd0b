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
//!
//! On a host that runs AWS ClockBound, its daemon's shared-memory segment
//! ([`ClockBoundReading`], layout version 2) is read instead: the bound the
//! daemon published, grown by its maximum drift since, void once the daemon
//! stops updating it or says the clock is unknown or disrupted.
//!
//! On a host whose clock linuxptp's `ptp4l` disciplines, its own view is
//! read through `pmc` ([`PtpStatus`]): the offset from the grandmaster at the
//! last Sync, plus the mean path delay (a PTP offset assumes symmetric paths;
//! how asymmetric they are is unknown, and at most the whole delay), plus the
//! grandmaster's advertised accuracy, grown since by the rate offset and
//! [`AGE_PPM`].
//!
//! Either way the bound published is the one that holds at the *end* of the
//! poll interval (it only grows until the next reading), so it is never
//! smaller than the truth's between two readings.

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

/// How often the watcher reads ClockBound's segment (a memory read).
pub const CLOCKBOUND_POLL: Duration = Duration::from_millis(100);
/// Where ClockBound 2's daemon publishes its segment.
pub const CLOCKBOUND_SHM_DEFAULT: &str = "/var/run/clockbound/shm0";
/// ClockBound's segment: its magic numbers and the layout version read here.
pub const CLOCKBOUND_MAGIC: [u32; 2] = [0x414D_5A4E, 0x4342_0200];
/// The segment layout version read here.
pub const CLOCKBOUND_VERSION: u16 = 2;
/// Bytes of the header and the error-bound record (64-bit Linux).
pub const CLOCKBOUND_SEGMENT_LEN: usize = 80;
/// Reads of a segment being rewritten before giving up.
const CLOCKBOUND_READS_MAX: usize = 8;

/// Why no estimate was read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostClockError {
    /// `chronyc` gave no answer (why).
    #[error("chronyc: {0}")]
    Run(String),
    /// The segment at the path cannot be read or is not ClockBound's (why).
    #[error("ClockBound's segment {0}: {1}")]
    ClockBound(String, String),
    /// The daemon was rewriting the segment (odd generation, or two reads differ).
    #[error("ClockBound's segment {0}: being written")]
    ClockBoundBusy(String),
    /// `chronyc -c tracking` printed a line of the wrong shape (its field count, the line).
    #[error("chronyc's tracking report has {0} fields, not 14: {1:?}")]
    Fields(usize, String),
    /// A field that must be a number is not (the field, its text).
    #[error("chronyc's tracking report field {0} is not a number: {1:?}")]
    Number(&'static str, String),
    /// linuxptp's `pmc` gave no answer.
    #[error("pmc: {0}")]
    Pmc(ToolError),
    /// A field `pmc` should have printed is missing or not a number.
    #[error("pmc's answer has no usable {0}: {1:?}")]
    PtpField(&'static str, String),
}

/// Why a daemon's query tool (`chronyc`, `pmc`) gave no answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ToolError {
    /// It could not be started (not installed, not executable).
    #[error("cannot run it ({0})")]
    Spawn(String),
    /// It did not exit in time (and was killed).
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// It exited with an error, or said nothing (its stderr, or its status).
    #[error("{0}")]
    Failed(String),
    /// It ran, but the daemon behind it did not answer.
    #[error("no answer from {0}")]
    Silent(String),
}

/// The fields of `chronyc -c tracking` that the bound needs (seconds, ppm).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ChronyTracking {
    /// The reference chrony follows (an address or a refclock's name).
    pub reference: String,
    /// Its NTP stratum.
    pub stratum: u32,
    /// The last measurement, seconds since the epoch.
    pub ref_time_s: f64,
    /// How far the system clock is from NTP time, seconds (positive: fast).
    pub system_offset_s: f64,
    /// The estimated error bound of the clock's frequency, ppm.
    pub skew_ppm: f64,
    /// The round trip to the stratum-1 source at the root, seconds.
    pub root_delay_s: f64,
    /// The dispersion accumulated up to the root, seconds.
    pub root_dispersion_s: f64,
    /// The leap status (`Normal`, `Insert second`, `Delete second`, `Not synchronised`).
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
    let text = run_tool(cmd.arg("tracking")).map_err(|e| HostClockError::Run(e.to_string()))?;
    ChronyTracking::parse(text.lines().next().unwrap_or(""))
}

/// Runs a daemon's query tool within [`HOST_CLOCK_TIMEOUT`]: its output, or
/// why there is none (it could not run, timed out, failed or said nothing).
fn run_tool(cmd: &mut Command) -> Result<String, ToolError> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ToolError::Spawn(e.to_string()))?;
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() < HOST_CLOCK_TIMEOUT => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ToolError::Timeout(HOST_CLOCK_TIMEOUT));
            }
        }
    }
    let out = child.wait_with_output().map_err(|e| ToolError::Failed(e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || text.trim().is_empty() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(ToolError::Failed(if err.is_empty() { format!("exit {}", out.status) } else { err }));
    }
    Ok(text)
}

/// Where linuxptp's `ptp4l` answers management queries by default.
pub const PTP4L_SOCKET_DEFAULT: &str = "/var/run/ptp4l";

/// What `ptp4l` says of the clock it disciplines, through `pmc` (TIME_STATUS_NP,
/// CURRENT_DATA_SET and PARENT_DATA_SET).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PtpStatus {
    /// The clock minus the grandmaster at the last Sync, ns.
    pub master_offset_ns: i64,
    /// When that Sync arrived, CLOCK_REALTIME ns (0: none yet).
    pub ingress_time_ns: u64,
    /// The rate of the clock against the grandmaster, minus 1 (ptp4l's
    /// `cumulativeScaledRateOffset`, as a fraction).
    pub rate_offset: f64,
    /// Whether ptp4l sees a grandmaster.
    pub gm_present: bool,
    /// Half the measured round trip to the master, ns.
    pub mean_path_delay_ns: f64,
    /// The grandmaster's advertised `clockAccuracy`, ns (`None`: unknown, 0xFE).
    pub gm_accuracy_ns: Option<f64>,
}

/// IEEE 1588 `clockAccuracy` (0x17–0x31) as the worst error it allows, ns.
pub fn ptp_clock_accuracy_ns(code: u8) -> Option<f64> {
    // 0x17: 1 ps, then 2.5, 10, 25, 100, 250 ps, 1 ns, … 0x2F: 1 s, 0x30:
    // 10 s, 0x31: over 10 s (IEEE 1588-2019, table 5).
    const NS: [f64; 27] = [
        0.001,
        0.0025,
        0.01,
        0.025,
        0.1,
        0.25,
        1.0,
        2.5,
        10.0,
        25.0,
        100.0,
        250.0,
        1e3,
        2.5e3,
        1e4,
        2.5e4,
        1e5,
        2.5e5,
        1e6,
        2.5e6,
        1e7,
        2.5e7,
        1e8,
        2.5e8,
        1e9,
        1e10,
        f64::INFINITY,
    ];
    code.checked_sub(0x17).and_then(|i| NS.get(usize::from(i)).copied())
}

impl PtpStatus {
    /// Parses `pmc`'s answer to TIME_STATUS_NP, CURRENT_DATA_SET and
    /// PARENT_DATA_SET (its plain "name value" lines).
    pub fn parse(text: &str) -> Result<PtpStatus, HostClockError> {
        let field = |name: &'static str| -> Result<&str, HostClockError> {
            text.lines()
                .map(str::trim)
                .find_map(|l| l.strip_prefix(name).filter(|r| r.starts_with([' ', '\t'])).map(str::trim))
                .ok_or_else(|| HostClockError::PtpField(name, text.trim().chars().take(200).collect()))
        };
        let num = |name: &'static str| -> Result<f64, HostClockError> {
            let v = field(name)?;
            v.parse::<f64>().ok().filter(|x| x.is_finite()).ok_or_else(|| HostClockError::PtpField(name, v.into()))
        };
        let accuracy = field("gm.ClockAccuracy")?;
        let code = u8::from_str_radix(accuracy.trim_start_matches("0x"), 16)
            .map_err(|_| HostClockError::PtpField("gm.ClockAccuracy", accuracy.into()))?;
        Ok(PtpStatus {
            master_offset_ns: {
                let v = field("master_offset")?;
                v.parse().map_err(|_| HostClockError::PtpField("master_offset", v.into()))?
            },
            ingress_time_ns: {
                let v = field("ingress_time")?;
                v.parse().map_err(|_| HostClockError::PtpField("ingress_time", v.into()))?
            },
            rate_offset: num("cumulativeScaledRateOffset")?,
            gm_present: match field("gmPresent")? {
                "true" => true,
                "false" => false,
                v => return Err(HostClockError::PtpField("gmPresent", v.into())),
            },
            mean_path_delay_ns: num("meanPathDelay")?,
            gm_accuracy_ns: ptp_clock_accuracy_ns(code),
        })
    }

    /// The bound on CLOCK_REALTIME's error at `now_ns` (CLOCK_REALTIME), ns:
    /// |offset| + mean path delay + the grandmaster's accuracy (where it
    /// says), grown since the last Sync by the rate offset and
    /// [`AGE_PPM`]. `None` without a grandmaster or a Sync.
    pub fn bound_ns(&self, now_ns: u64) -> Option<u64> {
        if !self.gm_present || self.ingress_time_ns == 0 {
            return None;
        }
        let age = now_ns.saturating_sub(self.ingress_time_ns) as f64;
        let b = self.master_offset_ns.unsigned_abs() as f64
            + self.mean_path_delay_ns.abs()
            + self.gm_accuracy_ns.unwrap_or(0.0)
            + age * (self.rate_offset.abs() + AGE_PPM * 1e-6);
        b.is_finite().then(|| b.ceil() as u64)
    }
}

/// Asks `ptp4l` once through `pmc -u -b 0 -s SOCKET`, within [`HOST_CLOCK_TIMEOUT`].
pub fn ptp_status(socket: &Path) -> Result<PtpStatus, HostClockError> {
    let mut cmd = Command::new("pmc");
    cmd.args(["-u", "-b", "0", "-s"]).arg(socket);
    cmd.args(["GET TIME_STATUS_NP", "GET CURRENT_DATA_SET", "GET PARENT_DATA_SET"]);
    let text = run_tool(&mut cmd).map_err(HostClockError::Pmc)?;
    if !text.contains("RESPONSE MANAGEMENT") {
        return Err(HostClockError::Pmc(ToolError::Silent(format!("ptp4l at {}", socket.display()))));
    }
    PtpStatus::parse(&text)
}

/// ClockBound's clock status (its `ClockStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ClockBoundStatus {
    /// The daemon does not know yet.
    Unknown,
    /// Following its source: the bound holds.
    Synchronized,
    /// Lost its source: the bound still holds, grown by the drift allowance since `as_of`.
    FreeRunning,
    /// The clock was disrupted (a VM migrated, say): no bound until it recovers.
    Disrupted,
}

/// One consistent reading of ClockBound's shared-memory segment. Times are
/// CLOCK_MONOTONIC_COARSE ns, as the daemon writes them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClockBoundReading {
    /// The segment's generation (even when it is consistent).
    pub generation: u16,
    /// When the record was written.
    pub as_of_ns: u64,
    /// After this the record must not be used.
    pub void_after_ns: u64,
    /// The bound on CLOCK_REALTIME's error at `as_of`, ns.
    pub bound_ns: u64,
    /// Changes whenever the clock was disrupted.
    pub disruption_marker: u64,
    /// The drift the bound grows by since `as_of`, parts per billion.
    pub max_drift_ppb: u32,
    /// The daemon's view of the clock.
    pub status: ClockBoundStatus,
}

impl ClockBoundReading {
    /// Parses the segment's bytes: the header (magic, size, layout version,
    /// generation), then the error-bound record. A generation of 0 (never
    /// written) is refused; an odd one (being written) is `ClockBoundBusy`:
    /// read again.
    pub fn parse(b: &[u8]) -> Result<ClockBoundReading, HostClockError> {
        let bad = |why: &str| HostClockError::ClockBound(String::new(), why.to_string());
        if b.len() < CLOCKBOUND_SEGMENT_LEN {
            return Err(bad(&format!("{} bytes, not {CLOCKBOUND_SEGMENT_LEN}", b.len())));
        }
        let u16_at = |o: usize| u16::from_ne_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let i64_at = |o: usize| i64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if [u32_at(0), u32_at(4)] != CLOCKBOUND_MAGIC {
            return Err(bad("no ClockBound magic number"));
        }
        if (u32_at(8) as usize) < CLOCKBOUND_SEGMENT_LEN {
            return Err(bad(&format!("its header says {} bytes", u32_at(8))));
        }
        match u16_at(12) {
            0 => return Err(bad("not initialized yet (layout version 0)")),
            CLOCKBOUND_VERSION => {}
            v => return Err(bad(&format!("layout version {v}; this reads version {CLOCKBOUND_VERSION}"))),
        }
        let generation = u16_at(14);
        if generation == 0 {
            return Err(bad("never written (generation 0)"));
        }
        if generation % 2 == 1 {
            return Err(HostClockError::ClockBoundBusy(String::new()));
        }
        let timespec = |o: usize| -> Result<u64, HostClockError> {
            let (sec, nsec) = (i64_at(o), i64_at(o + 8));
            let ns = u64::try_from(sec).ok().zip(u64::try_from(nsec).ok().filter(|&n| n < 1_000_000_000));
            ns.and_then(|(s, n)| s.checked_mul(1_000_000_000)?.checked_add(n)).ok_or_else(|| bad("a bad timestamp"))
        };
        let status = match u32_at(68) {
            0 => ClockBoundStatus::Unknown,
            1 => ClockBoundStatus::Synchronized,
            2 => ClockBoundStatus::FreeRunning,
            3 => ClockBoundStatus::Disrupted,
            s => return Err(bad(&format!("clock status {s}"))),
        };
        let bound_ns = u64::try_from(i64_at(48)).map_err(|_| bad("a negative bound"))?;
        let max_drift_ppb = u32_at(64);
        if max_drift_ppb >= 1_000_000_000 {
            return Err(bad(&format!("a drift of {max_drift_ppb} ppb")));
        }
        Ok(ClockBoundReading {
            generation,
            as_of_ns: timespec(16)?,
            void_after_ns: timespec(32)?,
            bound_ns,
            disruption_marker: u64::from_ne_bytes(b[56..64].try_into().expect("8 bytes")),
            max_drift_ppb,
            status,
        })
    }

    /// The bound on CLOCK_REALTIME's error at monotonic time `mono_ns`, ns,
    /// as ClockBound's own client computes it (the bound grown by the drift
    /// since `as_of`); `None` when the clock cannot be bounded: the daemon
    /// says unknown or disrupted, or stopped updating past `void_after`.
    pub fn bound_ns_at(&self, mono_ns: u64) -> Option<u64> {
        match self.status {
            ClockBoundStatus::Unknown | ClockBoundStatus::Disrupted => return None,
            ClockBoundStatus::Synchronized | ClockBoundStatus::FreeRunning => {}
        }
        if mono_ns >= self.void_after_ns {
            return None;
        }
        let age = mono_ns.saturating_sub(self.as_of_ns);
        let drift = (u128::from(age) * u128::from(self.max_drift_ppb)).div_ceil(1_000_000_000);
        Some(self.bound_ns.saturating_add(u64::try_from(drift).unwrap_or(u64::MAX)))
    }
}

/// Reads ClockBound's segment at `path` until a read is consistent (two
/// reads equal, the generation even): the daemon rewrites it in place. What
/// is not a usable segment is refused at the first read.
pub fn clockbound_read(path: &Path) -> Result<ClockBoundReading, HostClockError> {
    let name = || path.display().to_string();
    let read = || std::fs::read(path).map_err(|e| HostClockError::ClockBound(name(), e.to_string()));
    for _ in 0..CLOCKBOUND_READS_MAX {
        let (a, b) = (read()?, read()?);
        match ClockBoundReading::parse(&a) {
            Ok(r) if a == b => return Ok(r),
            Ok(_) | Err(HostClockError::ClockBoundBusy(_)) => std::thread::sleep(Duration::from_micros(50)),
            Err(HostClockError::ClockBound(_, why)) => return Err(HostClockError::ClockBound(name(), why)),
            Err(e) => return Err(e),
        }
    }
    Err(HostClockError::ClockBoundBusy(name()))
}

/// CLOCK_MONOTONIC_COARSE now, ns (the clock ClockBound's times are on).
pub fn monotonic_coarse_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .map(|t| u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap_or(0))
        .unwrap_or(0)
}

/// Where a host's clock-error estimate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostClockSource {
    /// chrony's tracking report (`chronyc -c tracking`; its command socket, or chronyc's default).
    Chrony(Option<PathBuf>),
    /// AWS ClockBound's shared-memory segment.
    ClockBound(PathBuf),
    /// linuxptp's `ptp4l`, through `pmc` at its management socket.
    Ptp(PathBuf),
}

impl HostClockSource {
    fn poll(&self) -> Duration {
        match self {
            HostClockSource::Chrony(_) | HostClockSource::Ptp(_) => HOST_CLOCK_POLL,
            HostClockSource::ClockBound(_) => CLOCKBOUND_POLL,
        }
    }

    /// The source's name, for logs and reports.
    pub fn name(&self) -> &'static str {
        match self {
            HostClockSource::Chrony(_) => "chrony",
            HostClockSource::ClockBound(_) => "ClockBound",
            HostClockSource::Ptp(_) => "ptp4l",
        }
    }

    /// Reads the source once: the bound that holds until `ahead` from now
    /// (`None`: none — unsynchronized, disrupted), and what was read.
    fn read(&self, ahead: Duration) -> Result<(Option<u64>, HostClockReading), HostClockError> {
        match self {
            HostClockSource::Chrony(socket) => {
                let t = chrony_tracking(socket.as_deref())?;
                let at_s = crate::clock::wall_ns() as f64 / 1e9 + ahead.as_secs_f64();
                Ok((t.bound_ns(at_s), HostClockReading::Chrony(t)))
            }
            HostClockSource::ClockBound(path) => {
                let r = clockbound_read(path)?;
                let at = monotonic_coarse_ns().saturating_add(u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX));
                Ok((r.bound_ns_at(at), HostClockReading::ClockBound(r)))
            }
            HostClockSource::Ptp(socket) => {
                let s = ptp_status(socket)?;
                let at = crate::clock::wall_ns().saturating_add(u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX));
                Ok((s.bound_ns(at), HostClockReading::Ptp(s)))
            }
        }
    }
}

/// The last thing a source said.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum HostClockReading {
    /// chrony's tracking report.
    Chrony(ChronyTracking),
    /// ClockBound's segment.
    ClockBound(ClockBoundReading),
    /// ptp4l's status, through `pmc`.
    Ptp(PtpStatus),
}

/// What the watcher saw so far.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HostClockStats {
    /// Readings attempted.
    pub queries: u64,
    /// Readings that failed (the bound is then unknown).
    pub failures: u64,
    /// Readings whose source said the clock was not synchronized.
    pub unsynchronized: u64,
    /// The last failure's message.
    pub last_error: Option<String>,
    /// The last reading.
    pub last: Option<HostClockReading>,
}

/// A thread that reads the host's source every poll interval
/// ([`HOST_CLOCK_POLL`] for chrony, [`CLOCKBOUND_POLL`] for ClockBound) and
/// publishes the bound (ns; `u64::MAX`: none — unsynchronized, or no
/// answer) in an atomic.
pub struct HostClockWatch {
    bound: Arc<AtomicU64>,
    stats: Arc<std::sync::Mutex<HostClockStats>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostClockWatch {
    /// Reads once now (an error if the source cannot be read at all: the
    /// operator named it), then keeps reading on a thread.
    pub fn start(source: HostClockSource) -> Result<HostClockWatch, HostClockError> {
        let poll = source.poll();
        // Slack for a late poll: the thread may wake a little after the interval.
        let ahead = poll + poll / 2;
        let first = source.read(ahead)?;
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
                    while t0.elapsed() < poll && !st.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(10).min(poll));
                    }
                    if !st.load(Ordering::Relaxed) {
                        record(&b, &s, source.read(ahead));
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

    /// What it saw so far.
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

fn record(
    bound: &AtomicU64,
    stats: &std::sync::Mutex<HostClockStats>,
    got: Result<(Option<u64>, HostClockReading), HostClockError>,
) {
    let Ok(mut s) = stats.lock() else { return };
    s.queries += 1;
    match got {
        Ok((b, t)) => {
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

    /// `pmc -u -b 0 'GET TIME_STATUS_NP' 'GET CURRENT_DATA_SET' 'GET
    /// PARENT_DATA_SET'` against linuxptp 3.1.1's ptp4l, a free-running
    /// slave of a second ptp4l over a veth pair (software timestamps).
    const PMC: &str = "sending: GET TIME_STATUS_NP
sending: GET CURRENT_DATA_SET
sending: GET PARENT_DATA_SET
\t72b7c9.fffe.4a42d2-0 seq 0 RESPONSE MANAGEMENT TIME_STATUS_NP 
\t\tmaster_offset              159
\t\tingress_time               1795972354101861613
\t\tcumulativeScaledRateOffset +0.000000000
\t\tscaledLastGmPhaseChange    0
\t\tgmTimeBaseIndicator        0
\t\tlastGmPhaseChange          0x0000'0000000000000000.0000
\t\tgmPresent                  true
\t\tgmIdentity                 9a57ab.fffe.356fa1
\t72b7c9.fffe.4a42d2-0 seq 1 RESPONSE MANAGEMENT CURRENT_DATA_SET 
\t\tstepsRemoved     1
\t\toffsetFromMaster 159.0
\t\tmeanPathDelay    2005.0
\t72b7c9.fffe.4a42d2-0 seq 2 RESPONSE MANAGEMENT PARENT_DATA_SET 
\t\tparentPortIdentity                    9a57ab.fffe.356fa1-1
\t\tparentStats                           0
\t\tobservedParentOffsetScaledLogVariance 0xffff
\t\tobservedParentClockPhaseChangeRate    0x7fffffff
\t\tgrandmasterPriority1                  1
\t\tgm.ClockClass                         248
\t\tgm.ClockAccuracy                      0xfe
\t\tgm.OffsetScaledLogVariance            0xffff
\t\tgrandmasterPriority2                  128
\t\tgrandmasterIdentity                   9a57ab.fffe.356fa1
";

    #[test]
    fn ptp4ls_answers_parse_into_bounds_and_bad_ones_into_errors() {
        let s = PtpStatus::parse(PMC).unwrap();
        assert_eq!((s.master_offset_ns, s.ingress_time_ns, s.gm_present), (159, 1_795_972_354_101_861_613, true));
        assert_eq!((s.mean_path_delay_ns, s.gm_accuracy_ns), (2005.0, None));
        // 159 + 2,005 at the Sync; then 1 ppm of age.
        assert_eq!(s.bound_ns(s.ingress_time_ns), Some(2_164));
        assert_eq!(s.bound_ns(s.ingress_time_ns + 1_000_000_000), Some(3_164));
        // A grandmaster that says it is within 100 ns (0x21) adds that.
        let good = PtpStatus::parse(&PMC.replace("0xfe", "0x21")).unwrap();
        assert_eq!(good.bound_ns(good.ingress_time_ns), Some(2_264));
        // Before any Sync, or with no grandmaster: no bound.
        let none = PtpStatus::parse(&PMC.replace("gmPresent                  true", "gmPresent false")).unwrap();
        assert_eq!(none.bound_ns(u64::MAX), None);
        let early = PtpStatus::parse(&PMC.replace("1795972354101861613", "0")).unwrap();
        assert_eq!(early.bound_ns(5), None);
        assert!(matches!(PtpStatus::parse("sending: GET TIME_STATUS_NP\n"), Err(HostClockError::PtpField(..))));
        let junk = PMC.replace("2005.0", "lots");
        assert!(matches!(PtpStatus::parse(&junk), Err(HostClockError::PtpField("meanPathDelay", _))));
        assert_eq!(ptp_clock_accuracy_ns(0x20), Some(25.0));
        assert_eq!(ptp_clock_accuracy_ns(0x2f), Some(1e9));
        assert_eq!(ptp_clock_accuracy_ns(0xfe), None);
        assert_eq!(ptp_clock_accuracy_ns(0x16), None);
    }
}
