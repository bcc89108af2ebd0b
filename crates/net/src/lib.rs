//! # fairfeed-net
//!
//! The application shells around fairfeed's pure cores, a folder per
//! application: capture replay over UDP ([`replay`]) and recording
//! ([`capture`]); the line arbitrator
//! over live UDP and over capture files ([`arb`]); tree nodes as processes
//! and the whole tree on loopback, time-dilated ([`tree`]); the exchange
//! ([`exchange`]). Sockets, batching, tuning, pacing, idle strategies and
//! clocks are `fairfeed-io` (re-exported here); benchmarks are
//! `fairfeed-bench`. Everything that owns a socket, a thread or a clock lives
//! in these crates, never in the cores.

pub use fairfeed_io::{batch, idle, pace, send, tuning};

pub mod arb;
pub mod capture;
pub mod exchange;
pub mod lasthop;
pub mod operator;
pub mod order_proxy;
pub mod replay;
pub mod snapshot;
pub mod tree;
