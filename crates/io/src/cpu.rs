//! CPU time of named threads, read from `/proc/self/task` — how the benches
//! split a per-message cost between the sides running in one process (the
//! bridge's publisher runtime and its subscribers', the exchange's threads
//! and the load generator), the kernel's work on each side included, as
//! system time.
//!
//! Per thread, `schedstat`'s first field is the time it ran, in ns; `stat`'s
//! `utime` and `stime` (clock ticks) split that into user and system time.
//! A thread's name (`comm`) is what its runtime's builder gave it, cut to 15
//! bytes by the kernel.

use serde::Serialize;

/// CPU time of a set of threads, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ThreadsCpu {
    /// Threads found with the name.
    pub threads: usize,
    /// Time on a CPU (`schedstat`), ns.
    pub ns: u64,
    /// Of which user space, ns (from `utime`, tick resolution).
    pub user_ns: u64,
    /// Of which the kernel, ns (from `stime`, tick resolution).
    pub system_ns: u64,
}

impl ThreadsCpu {
    /// The CPU used between `before` and `self`.
    pub fn since(&self, before: &ThreadsCpu) -> ThreadsCpu {
        ThreadsCpu {
            threads: self.threads,
            ns: self.ns.saturating_sub(before.ns),
            user_ns: self.user_ns.saturating_sub(before.user_ns),
            system_ns: self.system_ns.saturating_sub(before.system_ns),
        }
    }
}

/// Fields 14 and 15 (`utime`, `stime`) of a `/proc/…/stat` line, in ticks.
/// The name (field 2) may hold spaces and parentheses: fields are counted
/// after its last `)`.
pub fn stat_ticks(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace().skip(11);
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

/// The first field of a `/proc/…/schedstat` line: time on a CPU, ns.
fn schedstat_ns(schedstat: &str) -> Option<u64> {
    schedstat.split_ascii_whitespace().next()?.parse().ok()
}

fn ticks_per_s() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as u64,
        _ => 100,
    }
}

/// CPU time of this process's threads named `name` (`None` off Linux or
/// when `/proc` cannot be read).
pub fn threads_cpu(name: &str) -> Option<ThreadsCpu> {
    threads_cpu_where(|n| n == name)
}

/// CPU time of this process's threads whose name passes `pick`, summed.
pub fn threads_cpu_where(pick: impl Fn(&str) -> bool) -> Option<ThreadsCpu> {
    let tick_ns = 1_000_000_000 / ticks_per_s();
    let mut sum = ThreadsCpu::default();
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let dir = task.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else { continue };
        if !pick(comm.trim_end()) {
            continue;
        }
        // A thread may exit between the reads: skip it rather than fail.
        let Ok(sched) = std::fs::read_to_string(dir.join("schedstat")) else { continue };
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else { continue };
        let Some(ns) = schedstat_ns(&sched) else { continue };
        let Some((u, s)) = stat_ticks(&stat) else { continue };
        sum.threads += 1;
        sum.ns += ns;
        sum.user_ns += u * tick_ns;
        sum.system_ns += s * tick_ns;
    }
    Some(sum)
}

/// One thread's `schedstat`, opened once and read again in place: its CPU
/// time stays readable where no new descriptor can be opened (a test that
/// exhausts them, say).
pub struct ThreadClock(std::fs::File);

impl ThreadClock {
    /// The first of this process's threads named `name`; `None` if there is
    /// none (yet: a new thread names itself once it runs).
    pub fn open(name: &str) -> Option<ThreadClock> {
        std::fs::read_dir("/proc/self/task").ok()?.flatten().find_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            if comm.trim_end() != name {
                return None;
            }
            std::fs::File::open(t.path().join("schedstat")).ok().map(ThreadClock)
        })
    }

    /// [`ThreadClock::open`], looked for again every 10 ms for up to `limit`.
    pub fn wait(name: &str, limit: std::time::Duration) -> Option<ThreadClock> {
        let t0 = std::time::Instant::now();
        loop {
            match Self::open(name) {
                Some(c) => return Some(c),
                None if t0.elapsed() < limit => std::thread::sleep(std::time::Duration::from_millis(10)),
                None => return None,
            }
        }
    }

    /// The thread's time on a CPU so far, ns (0 once it has exited).
    pub fn ns(&self) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 128];
        let n = self.0.read_at(&mut buf, 0).unwrap_or(0);
        std::str::from_utf8(&buf[..n]).ok().and_then(schedstat_ns).unwrap_or(0)
    }
}

/// CPU time of the calling thread, ns (`CLOCK_THREAD_CPUTIME_ID`).
pub fn this_thread_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(0, |t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let line = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 777 888 0 0 20 0 1 0";
        assert_eq!(stat_ticks(line), Some((777, 888)));
        assert_eq!(stat_ticks("4242 (x) S 1 2"), None);
        assert_eq!(stat_ticks("no name"), None);
    }

    #[test]
    fn a_named_busy_thread_is_found_and_its_time_counted() {
        let h = std::thread::Builder::new()
            .name("ff-cpu-test".into())
            .spawn(|| {
                let t0 = this_thread_ns();
                let mut x = 0u64;
                while this_thread_ns() - t0 < 50_000_000 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                let seen = threads_cpu("ff-cpu-test").expect("/proc is readable");
                (x, seen)
            })
            .unwrap();
        let (_, seen) = h.join().unwrap();
        assert_eq!(seen.threads, 1);
        assert!(seen.ns >= 50_000_000, "{seen:?}");
        assert_eq!(threads_cpu("no-such-thread").unwrap().threads, 0);
    }

    #[test]
    fn a_thread_clock_reads_its_thread_again_without_opening_anything() {
        let (go, wait_go) = std::sync::mpsc::channel::<()>();
        let (done, wait_done) = std::sync::mpsc::channel::<()>();
        let h = std::thread::Builder::new()
            .name("ff-clock-test".into())
            .spawn(move || {
                let _ = wait_go.recv();
                let t0 = this_thread_ns();
                while this_thread_ns() - t0 < 30_000_000 {
                    std::hint::spin_loop();
                }
                let _ = done.send(());
                let _ = wait_go.recv(); // until told to end
            })
            .unwrap();
        let clock = ThreadClock::wait("ff-clock-test", std::time::Duration::from_secs(5)).expect("found");
        let before = clock.ns();
        go.send(()).unwrap();
        wait_done.recv().unwrap();
        let spun = clock.ns() - before;
        drop(go);
        h.join().unwrap();
        assert!((29_000_000..1_000_000_000).contains(&spun), "the clock saw {spun} ns of a 30 ms spin");
        assert!(ThreadClock::open("no-such-thread").is_none());
    }
}
