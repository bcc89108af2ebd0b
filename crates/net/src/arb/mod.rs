//! The line arbitrator's shells: over live UDP ([`live`], with the
//! retransmission server's socket loop) and over capture files ([`offline`]).

pub mod live;
pub mod offline;
