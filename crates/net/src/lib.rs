//! # fairfeed-net
//!
//! The application shells around fairfeed's pure cores: capture replay over
//! UDP ([`replay`]); the line arbitrator over live UDP ([`arb_live`], with the
//! retransmission server's socket loop) and over capture files
//! ([`arb_offline`]); tree nodes as processes ([`agent`]) and the whole tree
//! on loopback UDP ([`tree_live`], behind `fairfeed demo`); the exchange
//! ([`exchange_live`]). Sockets, batching, tuning, pacing, idle strategies and
//! clocks are `fairfeed-io` (re-exported here); benchmarks are
//! `fairfeed-bench`. Everything that owns a socket, a thread or a clock lives
//! in these crates, never in the cores.

pub use fairfeed_io::{batch, idle, pace, tuning};

pub mod agent;
pub mod arb_live;
pub mod arb_offline;
pub mod exchange_live;
pub mod replay;
pub mod tree_live;
