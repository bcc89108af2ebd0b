//! # fairfeed-arb
//!
//! Line arbitration for sequenced market-data feeds, after seed 004 and beyond
//! it: any number of redundant lines in; a low-latency and a high-reliability
//! stream out at the same time; time, count and time-and-count windows that can
//! change at run time; any protocol described by a [`spec::SeqSpec`] (presets
//! for MoldUDP64 and an XDP-style header); and recovery of packets every line
//! lost, through MoldUDP64 retransmission requests ([`arbitrator`]) answered by the
//! server core in [`retransmit`].
//!
//! Everything here is sans-IO: time is a number passed in, output goes to a
//! [`Sink`]. The UDP and file shells live in `fairfeed-net` and the CLI.
//!
//! ```
//! use fairfeed_arb::{Arbitrator, Config, Sink, Source, Stream};
//! use fairfeed_arb::spec::SeqSpec;
//! # use fairfeed_wire::moldudp64::{PacketBuilder, RequestRepr, Session};
//! #[derive(Default)]
//! struct Out(Vec<(Stream, Vec<u8>)>);
//! impl Sink for Out {
//!     fn emit(&mut self, s: Stream, p: &[u8]) { self.0.push((s, p.to_vec())) }
//!     fn request(&mut self, _: RequestRepr) {}
//! }
//! # let packet = |seq| { let mut b = [0u8; 64]; let mut p = PacketBuilder::new(&mut b, Session::from_str_padded("S"), seq).unwrap(); p.push(b"m").unwrap(); let n = p.finish(); b[..n].to_vec() };
//! let mut arb = Arbitrator::new(Config::default(), SeqSpec::moldudp64()).unwrap();
//! let mut out = Out::default();
//! arb.handle_packet(0, Source::Line(0), &packet(1), &mut out);   // A: seq 1
//! arb.handle_packet(10, Source::Line(1), &packet(1), &mut out);  // B: same, dropped
//! arb.handle_packet(20, Source::Line(1), &packet(2), &mut out);  // B wins seq 2
//! let hr: Vec<_> = out.0.iter().filter(|(s, _)| *s == Stream::HighReliability).collect();
//! assert_eq!(hr.len(), 2);
//! ```

#![deny(missing_docs)]

pub mod arbitrator;
pub mod retransmit;
pub mod spec;
pub mod stats;
pub mod types;

pub use arbitrator::Arbitrator;
pub use types::{
    Config, Mode, RetransmitConfig, Sink, Source, Start, Stream, Window, BUFFER_BYTES_DEFAULT_MAX,
    BUFFER_PACKETS_DEFAULT_MAX, CONTROL_DEDUP_NS, HOLES_MAX, LINES_MAX, REQUESTS_IN_FLIGHT_MAX,
};
