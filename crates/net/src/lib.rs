//! # fairfeed-net
//!
//! The I/O shells around fairfeed's pure cores: precise send pacing
//! ([`pace`]), capture replay over UDP ([`replay`]), and the line arbitrator
//! over live UDP ([`arb_live`], with the retransmission server's socket loop)
//! and over capture files ([`arb_offline`]), and the fair multicast tree on
//! loopback UDP ([`tree_live`], behind `fairfeed demo`). Every loop waits for
//! work the same way ([`idle`]: spin → yield → park). Everything that owns a
//! socket, a thread or a clock lives here, never in the cores.

pub mod agent;
pub mod arb_live;
pub mod arb_offline;
pub mod batch;
pub mod bench;
pub mod bench_clock;
pub mod bench_tree;
pub mod exchange_bench;
pub mod exchange_live;
pub mod idle;
pub mod pace;
pub mod replay;
pub mod tree_live;
pub mod tuning;
