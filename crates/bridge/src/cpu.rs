//! CPU time of the bridge's threads: [`fairfeed_io::cpu`] and the names the
//! bridge and its bench give their runtimes' threads.

pub use fairfeed_io::cpu::{stat_ticks, this_thread_ns, threads_cpu, ThreadsCpu};

/// The bridge's publisher runtime names its threads this.
pub const PUBLISHER_THREAD: &str = "ff-bridge-pub";
/// The bench's subscriber runtime names its threads this.
pub const SUBSCRIBER_THREAD: &str = "ff-bench-subs";
