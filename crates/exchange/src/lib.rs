//! # fairfeed-exchange
//!
//! The source of the market data and the destination of orders: a matching
//! engine ([`engine`], sans-IO).

pub mod client;
pub mod engine;
pub mod gateway;
pub mod itch_out;
pub mod sequencer;
pub mod tokens;
