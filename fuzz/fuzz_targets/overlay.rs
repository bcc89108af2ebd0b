//! Fuzz target: arbitrary bytes through `fairfeed_wire::checks::overlay_packet`
//! (the fair-multicast header and OWD report: decode, re-encode, compare).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fairfeed_wire::checks::overlay_packet(data);
});
