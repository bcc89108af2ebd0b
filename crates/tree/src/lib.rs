//! # fairfeed-tree
//!
//! The fair multicast core after Jasper (seed 000), sans-IO:
//! - [`plan`]: the tree planner (fan-out, depth, sibling hedging, several
//!   trees sharing receivers), its validation and Graphviz output;
//! - [`node`]: the sender, proxy and receiver state machines — first copy wins,
//!   hold-and-release at the deadline, OWD reports aggregated up the tree, and
//!   the deadline controller;
//! - [`tail`]: per-message largest delays carried up the tree in reports,
//!   and the quantile estimator that sets the deadline from them;
//! - [`dedup`]: bounded duplicate detection; [`owd`]: the OWD window;
//! - [`lasthop`]: the hop after the release point in deployment models 2
//!   and 3 (gateway → firm host, VM → enclave), probed and compensated;
//! - [`auth`]: the data path's packet tags; [`operator`]: control commands
//!   sealed under the operator key.
//!
//! Nothing here owns a socket or reads a clock: time is an argument and output
//! goes to a [`node::Transmit`], so the simulator and the UDP shell drive the
//! same code.

#![deny(missing_docs)]

pub mod addr;
pub mod auth;
pub mod controller;
pub mod deadlines;
pub mod dedup;
pub mod ingress;
pub mod lasthop;
pub mod membership;
pub mod merge;
pub mod node;
pub mod operator;
pub mod owd;
pub mod plan;
pub mod shard;
pub mod sharded;
pub mod tail;
