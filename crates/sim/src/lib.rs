//! # fairfeed-sim
//!
//! A deterministic discrete-event simulator for the fair multicast tree: the
//! real node state machines of `fairfeed-tree`, virtual time, seeded
//! randomness (same seed and configuration, same result bit for bit), link
//! models with per-copy serialization at each sender, receivers' clock error,
//! loss and a crashing node ([`engine`]; the models are `fairfeed-model`, re-exported as [`model`]); and the experiments built
//! on it ([`experiment`]).

pub mod dups;
pub mod engine;
pub mod experiment;
/// The link, clock and host-class models (their own crate, so shells that emulate links need not link the simulator).
pub use fairfeed_model as model;
pub mod montecarlo;
pub mod plot;
pub mod queue;
