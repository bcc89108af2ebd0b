//! Property tests: every message type round-trips, and arbitrary bytes never
//! panic any decoder. The arbitrary-input checks are the same functions the
//! fuzz targets run (`fairfeed_wire::checks`).

use fairfeed_wire::checks;
use fairfeed_wire::frame::{parse_udp, LinkType, UdpFrameRepr};
use fairfeed_wire::itch;
use fairfeed_wire::moldudp64::{Packet, PacketBuilder, Session};
use fairfeed_wire::ouch::{inbound, outbound};
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr};
use fairfeed_wire::Alpha;
use proptest::prelude::*;

/// Random body bytes of a given type at its exact length.
fn typed_bytes(types: &'static [u8], spec_len: fn(u8) -> Option<usize>) -> impl Strategy<Value = Vec<u8>> {
    proptest::sample::select(types).prop_flat_map(move |t| {
        let n = spec_len(t).unwrap();
        proptest::collection::vec(any::<u8>(), n - 1).prop_map(move |mut v| {
            v.insert(0, t);
            v
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn itch_every_type_round_trips(bytes in typed_bytes(itch::TYPES, itch::spec_len)) {
        let m = itch::Message::parse(&bytes).unwrap();
        let r = m.to_repr();
        prop_assert_eq!(r.buffer_len(), bytes.len());
        let mut buf = vec![0xa5u8; bytes.len() + 3];
        prop_assert_eq!(r.emit(&mut buf), Ok(bytes.len()));
        prop_assert_eq!(&buf[..bytes.len()], &bytes[..]);
        prop_assert_eq!(&buf[bytes.len()..], &[0xa5u8; 3][..]);
        let again = itch::Message::parse(&buf[..bytes.len()]).unwrap().to_repr();
        prop_assert_eq!(again, r);
    }

    #[test]
    fn ouch_fixed_types_round_trip(bytes in typed_bytes(inbound::TYPES, inbound::spec_len),
                                   out in typed_bytes(outbound::TYPES, outbound::spec_len)) {
        // Messages with an appendage need a consistent length field: zero it.
        let fix = |mut b: Vec<u8>, has_tail: bool| { if has_tail { let n = b.len(); b[n-2] = 0; b[n-1] = 0; } b };
        let b = fix(bytes.clone(), matches!(bytes[0], b'O' | b'U'));
        let m = inbound::Message::parse(&b).unwrap();
        let mut buf = vec![0u8; b.len()];
        prop_assert_eq!(m.to_repr().emit(&mut buf), Ok(b.len()));
        prop_assert_eq!(&buf, &b);
        let o = fix(out.clone(), matches!(out[0], b'A' | b'U' | b'E' | b'R'));
        let m = outbound::Message::parse(&o).unwrap();
        let mut buf = vec![0u8; o.len()];
        prop_assert_eq!(m.to_repr().emit(&mut buf), Ok(o.len()));
        prop_assert_eq!(&buf, &o);
    }

    #[test]
    fn moldudp64_builder_round_trips(msgs in proptest::collection::vec(typed_bytes(itch::TYPES, itch::spec_len), 0..40),
                                     seq in any::<u64>()) {
        let mut buf = [0u8; 1400];
        let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("ABC"), seq).unwrap();
        let mut packed = 0;
        for m in &msgs {
            if b.push(m).is_err() { break; }
            packed += 1;
        }
        let n = b.finish();
        let p = Packet::new_checked(&buf[..n]).unwrap();
        prop_assert_eq!(usize::from(p.count()), packed);
        prop_assert_eq!(p.sequence(), seq);
        let got: Vec<&[u8]> = p.messages().map(|m| m.unwrap()).collect();
        let want: Vec<&[u8]> = msgs[..packed].iter().map(|m| &m[..]).collect();
        prop_assert_eq!(got, want);
        checks::moldudp64_packet(&buf[..n]);
    }

    #[test]
    fn soupbintcp_packets_round_trip(kind in 0u8..10, payload in proptest::collection::vec(any::<u8>(), 0..80),
                                     seq in any::<u64>(), user in "[a-z]{0,6}", reason in any::<u8>()) {
        let p = match kind {
            0 => PacketRepr::Debug(&payload),
            1 => PacketRepr::LoginAccepted { session: Alpha::from_str_left_padded("S1"), sequence: seq },
            2 => PacketRepr::LoginRejected { reason },
            3 => PacketRepr::SequencedData(&payload),
            4 => PacketRepr::ServerHeartbeat,
            5 => PacketRepr::EndOfSession,
            6 => PacketRepr::LoginRequest { username: Alpha::from_str_padded(&user), password: Alpha::from_str_padded("pw"),
                                            session: Alpha::default(), sequence: seq },
            7 => PacketRepr::UnsequencedData(&payload),
            8 => PacketRepr::ClientHeartbeat,
            _ => PacketRepr::LogoutRequest,
        };
        let mut buf = vec![0xa5u8; p.buffer_len() + 1];
        let n = p.emit(&mut buf).unwrap();
        prop_assert_eq!(n, p.buffer_len());
        prop_assert_eq!(split_packet(&buf[..n]), Ok(Some((p, n))));
        prop_assert_eq!(buf[n], 0xa5);
        for cut in 0..n { prop_assert_eq!(split_packet(&buf[..cut]), Ok(None)); }
    }

    #[test]
    fn frame_round_trips(payload in proptest::collection::vec(any::<u8>(), 0..1500), port in any::<u16>(), ip in any::<[u8; 4]>()) {
        let r = UdpFrameRepr { src_mac: [2; 6], dst_mac: [3; 6], src_ip: ip, dst_ip: [127, 0, 0, 1],
                               src_port: 1, dst_port: port, ttl: 1, ident: 0 };
        let mut buf = vec![0u8; 42 + payload.len()];
        let n = r.emit(&payload, &mut buf).unwrap();
        let d = parse_udp(LinkType::Ethernet, &buf[..n]).unwrap();
        prop_assert_eq!(d.payload, &payload[..]);
        prop_assert_eq!(d.dst_port, port);
        prop_assert_eq!(d.src_ip, ip);
    }

    #[test]
    fn report_tails_round_trip(first in 0u64..u64::MAX / 2, stride in 1u16..300,
                               delays in proptest::collection::vec(prop_oneof![Just(0u64), 1u64..200_000_000], 0..=512)) {
        use fairfeed_wire::overlay::{owd_decode, owd_code, TailView, TAIL_HEADER_LEN, TAIL_OWD_MAX_NS};
        let mut b = vec![0u8; TAIL_HEADER_LEN + 2 * delays.len() + 5];
        let n = TailView::emit(first, stride, &delays, &mut b).unwrap();
        prop_assert_eq!(n, TAIL_HEADER_LEN + 2 * delays.len());
        let t = TailView::parse(&b[..n]).unwrap().unwrap();
        prop_assert_eq!((t.first_seq, t.stride, t.len()), (first, stride, delays.len()));
        for (got, &want) in t.delays().zip(&delays) {
            if want == 0 {
                prop_assert_eq!(got, 0);
            } else {
                // Rounded up, by at most one part in 4096, saturating at the top.
                let w = want.min(TAIL_OWD_MAX_NS);
                prop_assert!(got >= w && got - w <= w / 4096 + 1, "{} -> {}", want, got);
                prop_assert_eq!(owd_decode(owd_code(got)), Some(got));
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        checks::itch_message(&data);
        checks::moldudp64_packet(&data);
        checks::soupbintcp_stream(&data);
        checks::ouch_inbound(&data);
        checks::ouch_outbound(&data);
        checks::udp_frame(&data);
        checks::overlay_packet(&data);
    }

    #[test]
    fn mutated_packets_never_panic(msgs in proptest::collection::vec(typed_bytes(itch::TYPES, itch::spec_len), 1..20),
                                   flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
                                   cut in any::<usize>()) {
        // Start from a valid packet so mutations reach deep into the decoders.
        let mut buf = [0u8; 1400];
        let mut b = PacketBuilder::new(&mut buf, Session::default(), 1).unwrap();
        for m in &msgs { if b.push(m).is_err() { break; } }
        let n = b.finish();
        let mut v = buf[..n].to_vec();
        for (at, x) in flips { let i = at % v.len(); v[i] ^= x; }
        let cut = cut % (v.len() + 1);
        checks::moldudp64_packet(&v[..cut]);
        checks::moldudp64_packet(&v);
    }
}
