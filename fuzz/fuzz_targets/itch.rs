//! Fuzz target: arbitrary bytes through `fairfeed_wire::checks::itch_message`
//! (decode, then check the invariants; see that function's docs).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fairfeed_wire::checks::itch_message(data);
});
