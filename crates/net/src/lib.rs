//! # fairfeed-net
//!
//! The I/O shells around fairfeed's pure cores: precise send pacing
//! ([`pace`]) and capture replay over UDP ([`replay`]). Everything that owns a
//! socket, a thread or a clock lives here, never in the cores.

pub mod pace;
pub mod replay;
