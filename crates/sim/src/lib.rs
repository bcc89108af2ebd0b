//! # fairfeed-sim
//!
//! A deterministic discrete-event simulator for the fair multicast tree: the
//! real node state machines of `fairfeed-tree`, virtual time, seeded
//! randomness (same seed and configuration, same result bit for bit), link
//! models with per-copy serialization at each sender, receivers' clock error,
//! loss and a crashing node ([`engine`], [`model`]); and the experiments built
//! on it ([`experiment`]).

pub mod engine;
pub mod experiment;
pub mod model;
pub mod montecarlo;
pub mod plot;
