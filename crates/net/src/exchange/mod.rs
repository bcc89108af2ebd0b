//! The exchange's shell: gateway, engine and publisher threads around the
//! sans-IO cores of `fairfeed-exchange` ([`live`], behind `fairfeed exchange`).

pub mod live;
pub mod watch;
