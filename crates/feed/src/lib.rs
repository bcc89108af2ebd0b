//! # fairfeed-feed
//!
//! Everything about feeds as files and streams of packets: reading and writing
//! captures ([`capture`]), decoding a whole feed with sequence tracking
//! ([`decode`]), characterizing a workload ([`stats`]), generating a realistic
//! synthetic TotalView-ITCH 5.0 feed ([`gen`]) and deriving impaired A/B lines
//! from it ([`lines`]).
//!
//! The generator, decoder, statistics and impairments are pure (packets in,
//! packets or numbers out, seeded randomness); only [`capture`] touches files.

pub mod book;
pub mod capture;
pub mod decode;
pub mod gen;
pub mod lines;
pub mod snapshot;
pub mod stats;
