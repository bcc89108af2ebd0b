//! The line arbitrator's shells: over live UDP ([`live`], with the
//! retransmission server's socket loop) and over capture files ([`offline`]);
//! [`client`]: the retransmission client's socket (cookie exchange included);
//! [`fill`]: a one-line gap filler over it.

pub mod client;
pub mod fill;
pub mod live;
pub mod offline;
