//! Counters a loop hands to a metrics endpoint on another thread: every
//! long-running loop (tree nodes, the arbitrator, the retransmission
//! server, the exchange's threads, the bridge) publishes its snapshot at
//! most every [`PUBLISH_INTERVAL`], and a scrape reads the last one.

use std::time::Duration;

/// The latest counters a loop published, as JSON.
pub type JsonSlot = std::sync::Arc<std::sync::Mutex<Option<serde_json::Value>>>;

/// How often a loop publishes into its [`JsonSlot`].
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(500);

/// Puts `v` into `slot`.
pub fn publish(slot: &JsonSlot, v: &impl serde::Serialize) {
    let v = serde_json::to_value(v).ok();
    *slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = v;
}
