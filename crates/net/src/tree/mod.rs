//! The fair multicast tree's shells: one node per process ([`agent`], behind
//! `fairfeed sender|proxy|receiver`), the whole tree in one process on
//! loopback, time-dilated ([`demo`], behind `fairfeed demo`), and a running
//! tree seen whole from its nodes' control sockets ([`fleet`], behind
//! `fairfeed stat --topology`), and the controller that places nodes at
//! run time ([`controller`], behind `fairfeed controller`).

pub mod agent;
pub mod controller;
pub mod demo;
pub mod fleet;
pub mod store;
