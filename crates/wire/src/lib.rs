//! # fairfeed-wire
//!
//! Zero-copy views and plain value types for the wire formats fairfeed speaks:
//! [`moldudp64`] packets and retransmission requests, [`itch`] TotalView-ITCH
//! 5.0 messages (all 23 types), [`soupbintcp`] framing, [`ouch`] 5.0 order
//! entry messages, and the Ethernet/IPv4/UDP [`frame`] around captured packets.
//!
//! Contract:
//! - No I/O and no allocation: this crate is `no_std` and works on borrowed
//!   buffers; callers own every output buffer.
//! - Every decoder validates lengths before reading. Bad input of any kind
//!   returns a typed [`Error`], never panics and never reads out of bounds.
//! - Every value type's `emit` writes exactly `buffer_len()` bytes and returns
//!   [`Error::Truncated`] instead of panicking on a short buffer.
//!
//! ```
//! use fairfeed_wire::{moldudp64::Packet, itch::Message};
//! # let bytes = [b'S', b'E', b'S', b'S', b'I', b'O', b'N', b'0', b'0', b'1', 0,0,0,0,0,0,0,1, 0,0];
//! let packet = Packet::new_checked(&bytes[..])?;
//! for block in packet.messages() {
//!     let msg = Message::parse(block?)?;
//!     println!("{} locate {}", msg.name(), msg.stock_locate());
//! }
//! # Ok::<(), fairfeed_wire::Error>(())
//! ```
#![cfg_attr(not(test), no_std)]
#![deny(missing_docs)]

#[macro_use]
pub mod macros;

#[doc(hidden)]
pub mod checks;
pub mod error;
pub mod field;
pub mod frame;
pub mod glimpse;
pub mod itch;
pub mod moldudp64;
pub mod ouch;
pub mod overlay;
pub mod soupbintcp;

pub use error::{Error, Protocol};
pub use field::{Alpha, FieldValue, OuchPrice, Price4, Price8, Stock, Timestamp48};
pub use itch::Message as ItchMessage;
pub use moldudp64::Packet as MoldPacket;
