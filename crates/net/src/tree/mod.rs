//! The fair multicast tree's shells: one node per process ([`agent`], behind
//! `fairfeed sender|proxy|receiver`) and the whole tree in one process on
//! loopback, time-dilated ([`demo`], behind `fairfeed demo`).

pub mod agent;
pub mod demo;
