//! # fairfeed-clock
//!
//! Clock synchronization for the fair multicast tree, after Huygens (NSDI
//! '18), sans-IO: the same state machine runs in the simulator, the in-memory
//! test network and the UDP node processes.
//!
//! - [`sync`]: one node's state machine — coded probe pairs, the purity
//!   filter, per-peer lower envelopes, the network-wide least-squares solve
//!   (as Jacobi steps run where the data is), asymmetric-edge flagging, the
//!   corrected clock and its bounds, counters;
//! - [`envelope`]: the lower-envelope line fit over a sliding window;
//! - [`graph`]: who probes whom, from the tree;
//! - [`skew`]: a deliberately wrong clock, for tests and benchmarks on one host.
//!
//! Huygens timestamps in the NIC and reaches tens of nanoseconds in a data
//! centre. fairfeed timestamps in software (in user space, or with the
//! kernel's receive timestamps where a shell uses them); the purity filter
//! and the envelope absorb most of that noise, and the error bound says how
//! much is left.

#![deny(missing_docs)]

pub mod envelope;
pub mod graph;
pub mod skew;
pub mod sync;

pub use sync::{ClockSync, ProbeError, SyncConfig, SyncMode, SyncStats};
