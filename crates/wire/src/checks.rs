//! Invariant checks over arbitrary input, shared by the property tests and the
//! cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`), so both hunt the same bugs.
//!
//! Each function decodes arbitrary bytes the way a receiver would. It must not
//! panic on any input; it panics only when an invariant breaks — for example
//! when a message that decoded does not re-encode to the same bytes.

use crate::frame::{self, LinkType};
use crate::itch;
use crate::moldudp64::{self, Packet};
use crate::ouch::{inbound, outbound};
use crate::soupbintcp;

/// ITCH: a message that parses re-emits to the identical bytes, at the
/// specified length; one that does not parse has a wrong type or length.
pub fn itch_message(data: &[u8]) {
    // The table check and the full decode agree on what is valid.
    assert_eq!(itch::validate(data).ok(), itch::Message::parse(data).ok().map(|m| m.msg_type()));
    match itch::Message::parse(data) {
        Ok(m) => {
            assert_eq!(Some(data.len()), itch::spec_len(data[0]));
            let r = m.to_repr();
            let mut buf = [0u8; itch::MESSAGE_LEN_MAX];
            let n = r.emit(&mut buf).expect("buffer holds the longest message");
            assert_eq!(n, r.buffer_len());
            assert_eq!(&buf[..n], data);
            let (mut fields, mut ts) = (0, 0);
            m.visit(&mut |name, v| {
                fields += 1;
                if name == "timestamp" {
                    if let crate::FieldValue::Uint(t) = v {
                        ts = t;
                    }
                }
            });
            assert!(fields >= 4);
            assert_eq!(ts, m.timestamp());
        }
        Err(_) => {
            let ok_len = data.first().and_then(|&t| itch::spec_len(t)) == Some(data.len());
            assert!(!ok_len, "a well-sized known type must parse");
        }
    }
}

/// MoldUDP64 + ITCH: walking a packet yields at most `count` blocks, each
/// block inside the packet, and stops at the first framing error.
pub fn moldudp64_packet(data: &[u8]) {
    let Ok(p) = Packet::new_checked(data) else {
        assert!(data.len() < moldudp64::HEADER_LEN || data.len() > moldudp64::HEADER_LEN);
        return;
    };
    let mut ok = 0usize;
    let mut consumed = moldudp64::HEADER_LEN;
    let mut errors = 0;
    for block in p.messages() {
        match block {
            Ok(b) => {
                assert_eq!(errors, 0, "no block after an error");
                ok += 1;
                consumed += 2 + b.len();
                itch_message(b);
            }
            Err(_) => errors += 1,
        }
    }
    assert!(errors <= 1);
    assert!(ok <= usize::from(p.message_count()));
    assert!(consumed <= data.len());
    if errors == 0 {
        assert_eq!(consumed, data.len(), "a clean walk consumes the whole packet");
        assert_eq!(ok, usize::from(p.message_count()));
    }
    if let Ok(r) = moldudp64::Request::new_checked(data) {
        let mut buf = [0u8; moldudp64::HEADER_LEN];
        moldudp64::RequestRepr::parse(&r).emit(&mut buf).expect("20 bytes");
        assert_eq!(&buf[..], data);
    }
}

/// SoupBinTCP: splitting a stream never claims more bytes than present, and a
/// parsed packet re-emits to a packet that parses to the same value.
pub fn soupbintcp_stream(data: &[u8]) {
    let mut rest = data;
    let mut steps = 0;
    while let Ok(Some((p, used))) = soupbintcp::split_packet(rest) {
        assert!(used <= rest.len() && used >= 3);
        let mut buf = [0u8; soupbintcp::LENGTH_PREFIX_LEN + 1 + soupbintcp::PAYLOAD_LEN_MAX];
        let n = p.emit(&mut buf).expect("buffer holds any packet");
        assert_eq!(n, p.buffer_len());
        let again = soupbintcp::split_packet(&buf[..n]).expect("re-emitted packet parses");
        assert_eq!(again, Some((p, n)));
        rest = &rest[used..];
        steps += 1;
        assert!(steps <= data.len());
        // OUCH payloads inside data packets.
        match p {
            soupbintcp::PacketRepr::UnsequencedData(m) => ouch_inbound(m),
            soupbintcp::PacketRepr::SequencedData(m) => ouch_outbound(m),
            _ => {}
        }
    }
}

/// OUCH inbound: a parsed message re-emits to identical bytes.
pub fn ouch_inbound(data: &[u8]) {
    if let Ok(m) = inbound::Message::parse(data) {
        let r = m.to_repr();
        let mut buf = [0u8; 256];
        let n = r.emit(&mut buf).expect("fits");
        assert_eq!(&buf[..n], data);
    }
}

/// OUCH outbound: a parsed message re-emits to identical bytes.
pub fn ouch_outbound(data: &[u8]) {
    if let Ok(m) = outbound::Message::parse(data) {
        let r = m.to_repr();
        let mut buf = [0u8; 256];
        let n = r.emit(&mut buf).expect("fits");
        assert_eq!(&buf[..n], data);
    }
}

/// Frames: any link type, any bytes; a found payload lies inside the frame.
pub fn udp_frame(data: &[u8]) {
    let Some((&selector, frame_bytes)) = data.split_first() else {
        return;
    };
    let link = [LinkType::Ethernet, LinkType::Raw, LinkType::LinuxSll, LinkType::LinuxSll2, LinkType::Null]
        [usize::from(selector) % 5];
    if let Ok(d) = frame::parse_udp(link, frame_bytes) {
        let start = d.payload.as_ptr() as usize - frame_bytes.as_ptr() as usize;
        assert!(start + d.payload.len() <= frame_bytes.len());
        moldudp64_packet(d.payload);
    }
}

/// Overlay: a header that parses re-emits to the same 40 bytes, and a report
/// or probe that parses re-emits to the same bytes.
pub fn overlay_packet(data: &[u8]) {
    if let Ok((h, payload)) = crate::overlay::HeaderRepr::parse(data) {
        let mut buf = [0u8; crate::overlay::HEADER_LEN];
        h.emit(&mut buf).expect("40 bytes");
        assert_eq!(&buf[..38], &data[..38]);
        assert_eq!(payload.len(), usize::from(h.payload_len));
        if let Ok(r) = crate::overlay::ReportRepr::parse(payload) {
            let mut rb = [0u8; crate::overlay::REPORT_LEN];
            r.emit(&mut rb).expect("report length");
            assert_eq!(&rb[..], &payload[..crate::overlay::REPORT_LEN]);
            if let Ok(Some(t)) = crate::overlay::TailView::parse(&payload[crate::overlay::REPORT_LEN..]) {
                let mut d = [0u64; crate::overlay::TAIL_MAX];
                for (slot, v) in d.iter_mut().zip(t.delays()) {
                    *slot = v;
                }
                let mut tb = [0u8; crate::overlay::TAIL_HEADER_LEN + 2 * crate::overlay::TAIL_MAX];
                let n =
                    crate::overlay::TailView::emit(t.first_seq, t.stride, &d[..t.len()], &mut tb).expect("tail length");
                assert_eq!(&tb[..n], &payload[crate::overlay::REPORT_LEN..crate::overlay::REPORT_LEN + n]);
                assert!(t.entries().all(|(s, v)| s >= t.first_seq && v <= crate::overlay::TAIL_OWD_MAX_NS));
            }
        }
        if let Ok(p) = crate::overlay::ProbeRepr::parse(payload) {
            let mut pb = [0u8; crate::overlay::PROBE_LEN];
            p.emit(&mut pb).expect("probe length");
            assert_eq!(&pb[..], &payload[..crate::overlay::PROBE_LEN]);
        }
        moldudp64_packet(payload);
    }
}
