//! What the kernel-path tests share: making a veth pair between two
//! namespaces (or saying loudly why not), and the namespace's UDP errors.

use fairfeed_xdp::netns::VethPair;

#[allow(dead_code)]
pub fn require(var: &str) -> bool {
    std::env::var(var).as_deref() == Ok("1")
}

/// A fresh veth pair, or `None` (printed as SKIPPED) where this binary has no
/// eBPF programs or the process may not make namespaces; a failure instead
/// when FAIRFEED_REQUIRE_TOOLS=1 or FAIRFEED_REQUIRE_NETNS=1 says they must be there.
pub fn setup() -> Option<VethPair> {
    setup_queues(1)
}

/// As [`setup`], each end with `queues` receive and transmit queues.
pub fn setup_queues(queues: u32) -> Option<VethPair> {
    if let Err(e) = fairfeed_xdp::built() {
        assert!(!require("FAIRFEED_REQUIRE_TOOLS"), "{e} and FAIRFEED_REQUIRE_TOOLS=1");
        eprintln!("SKIPPED: {e}");
        return None;
    }
    match VethPair::with_queues(queues) {
        Ok(v) => Some(v),
        Err(e) => {
            let msg = format!("cannot make a veth pair between namespaces (needs root and iproute2): {e}");
            assert!(!require("FAIRFEED_REQUIRE_NETNS"), "{msg} and FAIRFEED_REQUIRE_NETNS=1");
            eprintln!("SKIPPED: {msg}");
            None
        }
    }
}

/// UDP InCsumErrors and InErrors of the namespace the calling thread is in.
#[allow(dead_code)]
pub fn udp_errors() -> (u64, u64) {
    let t = std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap();
    let rows: Vec<Vec<&str>> =
        t.lines().filter(|l| l.starts_with("Udp:")).map(|l| l.split_whitespace().collect()).collect();
    let at = |k: &str| rows[0].iter().position(|x| *x == k).map_or(0, |i| rows[1][i].parse().unwrap_or(0));
    (at("InCsumErrors"), at("InErrors"))
}
