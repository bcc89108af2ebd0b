//! Goal: arbitration is protocol-generic. Method: XDP-style packets (seed
//! 001's 16-byte header: little-endian PacketSeqNum at 4, NumberMsgEntries at
//! 15, messages prefixed by a size that counts itself) through the XDP preset,
//! including a partly overlapping packet that must be trimmed, and a non-market
//! packet that must go to the side output.

use fairfeed_arb::spec::SeqSpec;
use fairfeed_arb::{Arbitrator, Config, Sink, Source, Start, Stream};
use fairfeed_wire::moldudp64::RequestRepr;

#[derive(Default)]
struct Out {
    hr: Vec<Vec<u8>>,
    ll: Vec<Vec<u8>>,
    side: Vec<Vec<u8>>,
}

impl Sink for Out {
    fn emit(&mut self, s: Stream, p: &[u8]) {
        match s {
            Stream::HighReliability => self.hr.push(p.to_vec()),
            Stream::LowLatency => self.ll.push(p.to_vec()),
            Stream::Side(_) => self.side.push(p.to_vec()),
        }
    }
    fn request(&mut self, _: RequestRepr) {}
}

/// An XDP packet with messages `seq..seq+n`, each 6 bytes: size (2, LE, counts
/// itself), type (2), and the low 16 bits of its sequence number.
fn xdp(seq: u32, n: u8) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    p[4..8].copy_from_slice(&seq.to_le_bytes());
    p[15] = n;
    for i in 0..u32::from(n) {
        p.extend_from_slice(&6u16.to_le_bytes());
        p.extend_from_slice(&0x0100u16.to_le_bytes());
        p.extend_from_slice(&((seq + i) as u16).to_le_bytes());
    }
    let len = p.len() as u16;
    p[0..2].copy_from_slice(&len.to_le_bytes());
    p
}

fn msgs(p: &[u8]) -> Vec<u16> {
    p[16..].chunks(6).map(|m| u16::from_le_bytes([m[4], m[5]])).collect()
}

#[test]
fn xdp_packets_are_arbitrated_and_trimmed() {
    let cfg = Config { start: Start::Seq(100), ..Config::default() };
    let mut arb = Arbitrator::new(cfg, SeqSpec::xdp()).unwrap();
    let mut out = Out::default();
    arb.handle_packet(0, Source::Line(0), &xdp(100, 2), &mut out); // 100-101
    arb.handle_packet(1, Source::Line(1), &xdp(100, 2), &mut out); // duplicate
    arb.handle_packet(2, Source::Line(1), &xdp(101, 3), &mut out); // overlaps: 102-103 new
    arb.handle_packet(3, Source::Line(0), b"junk", &mut out); // not market data
    arb.handle_packet(4, Source::Line(0), &xdp(105, 1), &mut out); // ahead of a gap at 104
    arb.handle_packet(5, Source::Line(1), &xdp(104, 1), &mut out); // fills it
    let hr: Vec<u16> = out.hr.iter().flat_map(|p| msgs(p)).collect();
    assert_eq!(hr, [100, 101, 102, 103, 104, 105]);
    let trimmed = &out.hr[1];
    assert_eq!(u32::from_le_bytes(trimmed[4..8].try_into().unwrap()), 102);
    assert_eq!(trimmed[15], 2);
    assert_eq!(usize::from(u16::from_le_bytes([trimmed[0], trimmed[1]])), trimmed.len(), "PacketSize rewritten");
    assert_eq!(out.side, [b"junk".to_vec()]);
    let ll: Vec<u16> = out.ll.iter().flat_map(|p| msgs(p)).collect();
    assert_eq!(ll, [100, 101, 102, 103, 105]);
    let s = arb.stats();
    assert_eq!((s.duplicates, s.trimmed, s.non_market, s.lost_messages), (1, 2, 1, 0));
}
