//! The fair multicast tree's shells: one node per process ([`agent`], behind
//! `fairfeed sender|proxy|receiver`), the whole tree in one process on
//! loopback, time-dilated ([`demo`], behind `fairfeed demo`), and a running
//! tree seen whole from its nodes' control sockets ([`fleet`], behind
//! `fairfeed stat --topology`).

pub mod agent;
pub mod demo;
pub mod fleet;
