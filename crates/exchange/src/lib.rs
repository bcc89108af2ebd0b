//! # fairfeed-exchange
//!
//! The source of the market data and the destination of orders: a matching
//! engine ([`engine`], sans-IO), the fair ordering of orders before it
//! ([`ordering`]: FIFO, DBO, frequent batch auctions cleared by
//! [`auction`]), and a watch for firms that act before their data's release
//! ([`cheat`]).

#![deny(missing_docs)]

pub mod auction;
pub mod cheat;
pub mod client;
pub mod engine;
pub mod gateway;
pub mod itch_out;
pub mod ordering;
pub mod sequencer;
pub mod stamp;
pub mod tokens;
