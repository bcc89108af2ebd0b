//! Fuzz target: arbitrary bytes through `fairfeed_wire::checks::moldudp64_packet`
//! (decode, then check the invariants; see that function's docs).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fairfeed_wire::checks::moldudp64_packet(data);
});
