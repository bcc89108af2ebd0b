//! # fairfeed-bridge
//!
//! The arbitrated feed into a message broker (seed 001), with NATS as the
//! broker: [`route`] decides subjects and granularity (sans-IO), [`publish`]
//! is the publisher shell (core NATS or JetStream, bounded queue with a
//! counted overflow policy, reconnects), [`subscribe`] counts and times what
//! arrives, [`bench`] redoes seed 001's experiment (with [`cpu`], each side's
//! CPU time per message), and [`server`] runs a local `nats-server` for tests
//! and the bench.

pub mod bench;
pub mod consume;
pub mod cpu;
pub mod publish;
pub mod route;
pub mod security;
pub mod server;
pub mod subscribe;
pub mod tag;
