//! CPU time of the bridge's threads: [`fairfeed_io::cpu`], the names the
//! bridge and its bench give their runtimes' threads, and the runtimes.

use crate::BridgeError;
pub use fairfeed_io::cpu::{stat_ticks, this_thread_ns, threads_cpu, ThreadsCpu};

/// The bridge's publisher runtime names its threads this.
pub const PUBLISHER_THREAD: &str = "ff-bridge-pub";
/// The bench's subscriber runtime names its threads this.
pub const SUBSCRIBER_THREAD: &str = "ff-bench-subs";

/// A multi-threaded tokio runtime of `workers` threads named `name` (so
/// their CPU time can be read by name).
pub fn named_runtime(workers: usize, name: &str) -> Result<tokio::runtime::Runtime, BridgeError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| BridgeError::Runtime(e.to_string()))
}
