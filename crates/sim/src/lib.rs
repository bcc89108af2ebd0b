//! # fairfeed-sim
//!
//! A deterministic discrete-event simulator for the fair multicast tree: the
//! real node state machines of `fairfeed-tree`, virtual time, seeded
//! randomness (same seed and configuration, same result bit for bit), link
//! models with per-copy serialization at each sender, receivers' clock error,
//! loss and a crashing node ([`engine`]; the models are `fairfeed-model`, re-exported as [`model`]); and the experiments built
//! on it ([`experiment`]; the trading experiment with untrusted receivers,
//! the exchange's orderings and a cheater in [`trading`]).

pub mod churn;
pub mod dups;
pub mod engine;
pub mod experiment;
/// The link, clock and host-class models (their own crate, so shells that emulate links need not link the simulator).
pub use fairfeed_model as model;
pub mod montecarlo;
pub mod plot;
pub mod queue;
pub mod report;
pub mod trading;

/// Why an experiment cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// No tree can be planned for what was asked.
    #[error("{0}")]
    Plan(#[from] fairfeed_tree::plan::PlanError),
    #[error("a tree for {0} receivers has no proxy to crash")]
    NoProxy(usize),
    #[error("trading needs at least 4 receivers")]
    TooFewTraders(usize),
    #[error("--cheat-us needs --model 1: in models 2 and 3 the exchange controls the release, so a firm cannot release early")]
    CheatNeedsOwnReceiver,
    #[error("a hold at the far end of the last hop is model 2's (--host-hold-q) or model 3's (--enclave-hold-q), each with its own model")]
    HoldNeedsItsModel,
    #[error("{receivers} receivers × {messages} messages is over the {max} releases the simulator keeps; ask for fewer messages")]
    TooManyTracked { receivers: usize, messages: u64, max: usize },
}
