//! Run-time tuning for predictable latency (seed 003): CPU pinning,
//! `mlockall`, SCHED_FIFO and `SO_BUSY_POLL`. Each is a flag; each reports
//! what it did, because most need privileges a process may not have, and a
//! silently ignored setting is worse than none.

use std::os::fd::AsRawFd;

use serde::{Deserialize, Serialize};

/// What to ask of the operating system.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tuning {
    /// CPUs to pin the node's threads to, in order (receive/work thread, then send thread).
    pub pin: Vec<usize>,
    /// Lock all pages in memory (no page faults on the hot path).
    pub mlock: bool,
    /// Run the node's threads under SCHED_FIFO at this priority (1–99).
    pub fifo: Option<i32>,
    /// `SO_BUSY_POLL` µs on receiving sockets (the kernel polls the device
    /// queue on a blocking read instead of sleeping; loopback has no device
    /// queue to poll, so it matters only on real NICs).
    pub busy_poll_us: Option<u32>,
}

/// What one setting did.
#[derive(Debug, Clone, Serialize)]
pub struct Applied {
    /// The setting (`mlockall`, `thread 0: pin to cpu 2`, `SO_BUSY_POLL 50 µs`, …).
    pub setting: String,
    /// Whether it took.
    pub ok: bool,
    /// What was set, or why it was not.
    pub detail: String,
}

/// Why a setting did not take.
#[derive(Debug, thiserror::Error)]
pub enum TuningError {
    /// The kernel refused it (no privilege, no such CPU, …).
    #[error("{0}")]
    Os(#[from] std::io::Error),
    /// A call through `nix` failed.
    #[error("{0}")]
    Nix(#[from] nix::Error),
    /// A real-time priority out of range.
    #[error("SCHED_FIFO priority must be 1..=99")]
    Priority,
}

fn applied(setting: String, r: Result<(), TuningError>) -> Applied {
    match r {
        Ok(()) => Applied { setting, ok: true, detail: "done".into() },
        Err(e) => Applied { setting, ok: false, detail: e.to_string() },
    }
}

impl Tuning {
    /// Process-wide settings (`mlockall`); call once at start-up.
    pub fn apply_process(&self) -> Vec<Applied> {
        let mut out = Vec::new();
        if self.mlock {
            use nix::sys::mman::{mlockall, MlockAllFlags};
            let r = mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE).map_err(TuningError::from);
            out.push(applied("mlockall".into(), r));
        }
        out
    }

    /// Settings of the calling thread, the `index`-th of the node.
    pub fn apply_thread(&self, index: usize) -> Vec<Applied> {
        let mut out = Vec::new();
        if let Some(&cpu) = self.pin.get(index) {
            let r = (|| -> Result<(), TuningError> {
                let mut set = nix::sched::CpuSet::new();
                set.set(cpu)?;
                Ok(nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)?)
            })();
            out.push(applied(format!("thread {index}: pin to cpu {cpu}"), r));
        }
        if let Some(prio) = self.fifo {
            out.push(applied(format!("thread {index}: SCHED_FIFO {prio}"), sys::sched_fifo(prio)));
        }
        out
    }

    /// Socket settings (`SO_BUSY_POLL`).
    pub fn apply_socket(&self, s: &impl AsRawFd) -> Vec<Applied> {
        match self.busy_poll_us {
            Some(us) => vec![applied(format!("SO_BUSY_POLL {us} µs"), sys::busy_poll(s.as_raw_fd(), us))],
            None => Vec::new(),
        }
    }
}

/// Logs what was applied, one event each (a setting not applied is a warning).
pub fn report(who: &str, applied: &[Applied]) {
    for a in applied {
        if a.ok {
            tracing::info!(setting = a.setting, applied = true, "{who}: tuning {}: ok ({})", a.setting, a.detail);
        } else {
            tracing::warn!(
                setting = a.setting,
                applied = false,
                "{who}: tuning {}: NOT applied ({})",
                a.setting,
                a.detail
            );
        }
    }
}

/// The two calls no safe wrapper offers.
#[allow(unsafe_code)]
mod sys {
    use std::os::fd::RawFd;

    pub fn busy_poll(fd: RawFd, us: u32) -> Result<(), super::TuningError> {
        let v: libc::c_int = us.min(i32::MAX as u32) as libc::c_int;
        // SAFETY: `fd` is an open socket owned by the caller for the call's
        // duration; the option value is a c_int on the stack, its size passed.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_BUSY_POLL,
                (&raw const v).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().into())
        }
    }

    pub fn sched_fifo(priority: i32) -> Result<(), super::TuningError> {
        if !(1..=99).contains(&priority) {
            return Err(super::TuningError::Priority);
        }
        let p = libc::sched_param { sched_priority: priority };
        // SAFETY: pid 0 is the calling thread; `p` is a valid sched_param.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const p) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().into())
        }
    }
}
