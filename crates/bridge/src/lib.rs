//! # fairfeed-bridge
//!
//! The arbitrated feed into a message broker (seed 001), with NATS as the
//! broker: [`route`] decides subjects and granularity (sans-IO), [`publish`]
//! is the publisher shell (core NATS or JetStream, bounded queue with a
//! counted overflow policy, reconnects), [`subscribe`] counts and times what
//! arrives, [`live`] is `fairfeed bridge run` as an agent, [`cpu`] measures
//! each side's CPU time per message for seed 001's experiment (in
//! `fairfeed-bench`), and [`server`] runs a local `nats-server` for tests
//! and the bench; [`kv`] is the tree controller's store in a JetStream
//! key-value bucket.

pub mod consume;
pub mod cpu;
pub mod kv;
pub mod live;
pub mod publish;
pub mod route;
pub mod security;
pub mod server;
pub mod subscribe;
pub mod tag;

/// Why the bridge, a subscriber or the benchmark could not do its work; each
/// variant carries the message the command line prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BridgeError {
    /// Flags or values that do not fit together.
    #[error("{0}")]
    Config(String),
    /// A secret file (password, token, nkey, credentials) that cannot be read.
    #[error("{0}")]
    Secret(String),
    /// No connection to the broker (with the diagnosis when there is one).
    #[error("{0}")]
    Connect(String),
    /// The broker refused or failed an operation (subscribe, stream, consumer).
    #[error("{0}")]
    Nats(String),
    /// A runtime thread pool could not be started.
    #[error("{0}")]
    Runtime(String),
    /// The benchmark's feed or its baseline failed.
    #[error("{0}")]
    Bench(String),
}
