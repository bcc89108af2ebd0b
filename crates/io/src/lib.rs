//! # fairfeed-io
//!
//! The low-level I/O every fairfeed shell is built from, apart from the
//! shells themselves: agents and the runner that places them on threads
//! ([`agent`]), UDP sockets ([`socket`]), `recvmmsg`/`sendmmsg`
//! batching with kernel receive stamps ([`batch`]), thread and socket tuning
//! ([`tuning`]), precise pacing ([`pace`]), how loops wait for work
//! ([`idle`]), bounded queues between agents with a wake-up the runner
//! understands ([`mailbox`]), the board every agent posts its counters to
//! ([`counters`]), the wall clock ([`clock`]) and threads' CPU time ([`cpu`]). Nothing here knows a protocol.
//! Send back-ends sit side by side behind [`send::SendPath`]: `sendmmsg`
//! ([`batch`]) and io_uring ([`uring`]); AF_XDP would be one more.

#![deny(missing_docs)]

pub mod agent;
pub mod batch;
pub mod clock;
pub mod counters;
pub mod cpu;
pub mod hostclock;
pub mod idle;
pub mod mailbox;
pub mod pace;
pub mod resolve;
pub mod send;
pub mod socket;
pub mod tuning;
pub mod uring;
