//! Fuzz target: arbitrary bytes as OUCH 5.0 inbound and outbound messages
//! (decode, then check a decoded message re-encodes to the same bytes).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fairfeed_wire::checks::ouch_inbound(data);
    fairfeed_wire::checks::ouch_outbound(data);
});
