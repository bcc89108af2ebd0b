//! # fairfeed-bench
//!
//! Benchmarks on real sockets behind `fairfeed bench` and `fairfeed exchange
//! bench`. Every figure comes with a baseline measured in the same run
//! (machines are noisy; ratios travel, absolute numbers do not):
//!
//! - [`arb`] — one-way latency through the live arbitrator beside a bare UDP forwarder;
//! - [`tree`] — a proxy hop (and seed 003's ladder for it) beside a bare
//!   loopback hop, and a proxy's replication rate beside a bare `sendmmsg` loop;
//! - [`clock`] — node agents on loopback with injected clock errors, synchronized;
//! - [`controller`] — the tree controller placing N receivers from their
//!   registrations, beside the planner's one call for the same shape;
//! - [`exchange`] — order-to-acknowledgement latency over OUCH/SoupBinTCP beside
//!   a bare TCP ping-pong, and the matching core's in-process throughput;
//!   [`exchange_attack`] — hostile clients run beside that load;
//! - [`bridge`] — seed 001's experiment: the feed into NATS by the bridge,
//!   subscribers measuring latency by the bridge's tag, beside NATS's own Go
//!   client publishing the same load;
//! - [`xdp`] — Jasper's XDP de-duplicator on a veth link between network
//!   namespaces beside the same receiver without it.

pub mod arb;
pub mod bridge;
pub mod clock;
pub mod controller;
pub mod exchange;
pub mod exchange_attack;
pub mod faults;
pub mod hop;
pub mod tree;
pub mod tree_attack;
pub mod xdp;
