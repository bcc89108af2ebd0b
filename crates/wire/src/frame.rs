//! The link, IPv4 and UDP layers around captured market-data packets.
//!
//! [`parse_udp`] digs the UDP payload out of a captured frame for the link
//! types captures of multicast feeds use (Ethernet with optional 802.1Q tags,
//! Linux cooked SLL and SLL2, raw IPv4, BSD loopback), trimming Ethernet padding
//! by the IPv4 and UDP lengths. [`UdpFrameRepr::emit`] writes an Ethernet + IPv4
//! + UDP header, checksums included, so our captures open cleanly in Wireshark.

use crate::error::{check_len, Error, Protocol};

/// Link-layer header types (pcap `LINKTYPE_*`) we can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    /// `LINKTYPE_NULL` (0): BSD loopback, 4-byte host-order family.
    Null,
    /// `LINKTYPE_ETHERNET` (1).
    Ethernet,
    /// `LINKTYPE_RAW` (101) or `LINKTYPE_IPV4` (228): the IP header first.
    Raw,
    /// `LINKTYPE_LINUX_SLL` (113).
    LinuxSll,
    /// `LINKTYPE_LINUX_SLL2` (276).
    LinuxSll2,
}

impl LinkType {
    /// Maps a pcap link-type number.
    pub fn from_pcap(n: u32) -> Option<Self> {
        Some(match n {
            0 => LinkType::Null,
            1 => LinkType::Ethernet,
            101 | 228 | 12 | 14 => LinkType::Raw,
            113 => LinkType::LinuxSll,
            276 => LinkType::LinuxSll2,
            _ => return None,
        })
    }
}

/// Bytes of an Ethernet header without VLAN tags.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Bytes of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Bytes of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// Bytes `UdpFrameRepr::emit` writes before the payload.
pub const UDP_FRAME_HEADER_LEN: usize = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN;
/// VLAN tags we skip at most (802.1Q and QinQ).
const VLAN_TAGS_MAX: usize = 2;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;
const IP_PROTO_UDP: u8 = 17;

/// A UDP datagram found in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// IPv4 source address.
    pub src_ip: [u8; 4],
    /// IPv4 destination address.
    pub dst_ip: [u8; 4],
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// The UDP payload (borrowed from the frame).
    pub payload: &'a [u8],
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Finds the UDP payload in a captured frame.
pub fn parse_udp(link: LinkType, frame: &[u8]) -> Result<UdpDatagram<'_>, Error> {
    let ip = match link {
        LinkType::Raw => frame,
        LinkType::Null => {
            check_len(frame, 4)?;
            &frame[4..]
        }
        LinkType::LinuxSll => {
            check_len(frame, 16)?;
            if be16(frame, 14) != ETHERTYPE_IPV4 {
                return Err(Error::Unsupported { reason: "not IPv4" });
            }
            &frame[16..]
        }
        LinkType::LinuxSll2 => {
            check_len(frame, 20)?;
            if be16(frame, 0) != ETHERTYPE_IPV4 {
                return Err(Error::Unsupported { reason: "not IPv4" });
            }
            &frame[20..]
        }
        LinkType::Ethernet => {
            check_len(frame, ETHERNET_HEADER_LEN)?;
            let mut at = 12;
            let mut tags = 0;
            let mut ethertype = be16(frame, at);
            while (ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ) && tags < VLAN_TAGS_MAX {
                at += 4;
                check_len(frame, at + 2)?;
                ethertype = be16(frame, at);
                tags += 1;
            }
            if ethertype != ETHERTYPE_IPV4 {
                return Err(Error::Unsupported { reason: "not IPv4" });
            }
            &frame[at + 2..]
        }
    };
    parse_ipv4_udp(ip)
}

fn parse_ipv4_udp(ip: &[u8]) -> Result<UdpDatagram<'_>, Error> {
    check_len(ip, IPV4_HEADER_LEN)?;
    if ip[0] >> 4 != 4 {
        return Err(Error::Unsupported { reason: "not IPv4" });
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ihl < IPV4_HEADER_LEN {
        return Err(Error::Malformed { protocol: Protocol::Frame, reason: "IPv4 header length < 20" });
    }
    let total = usize::from(be16(ip, 2));
    if total < ihl {
        return Err(Error::Malformed { protocol: Protocol::Frame, reason: "IPv4 total length < header length" });
    }
    check_len(ip, total)?;
    let flags_frag = be16(ip, 6);
    if flags_frag & 0x3fff != 0 {
        return Err(Error::Unsupported { reason: "IPv4 fragment" });
    }
    if ip[9] != IP_PROTO_UDP {
        return Err(Error::Unsupported { reason: "not UDP" });
    }
    let udp = &ip[ihl..total];
    check_len(udp, UDP_HEADER_LEN)?;
    let udp_len = usize::from(be16(udp, 4));
    if udp_len < UDP_HEADER_LEN {
        return Err(Error::Malformed { protocol: Protocol::Frame, reason: "UDP length < 8" });
    }
    check_len(udp, udp_len)?;
    Ok(UdpDatagram {
        src_ip: [ip[12], ip[13], ip[14], ip[15]],
        dst_ip: [ip[16], ip[17], ip[18], ip[19]],
        src_port: be16(udp, 0),
        dst_port: be16(udp, 2),
        payload: &udp[UDP_HEADER_LEN..udp_len],
    })
}

/// Ethernet + IPv4 + UDP header values for writing frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpFrameRepr {
    /// Ethernet source address.
    pub src_mac: [u8; 6],
    /// Ethernet destination address.
    pub dst_mac: [u8; 6],
    /// IPv4 source address.
    pub src_ip: [u8; 4],
    /// IPv4 destination address.
    pub dst_ip: [u8; 4],
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// IPv4 time to live.
    pub ttl: u8,
    /// IPv4 identification field.
    pub ident: u16,
}

/// The Ethernet address an IPv4 multicast group maps to (RFC 1112).
pub fn multicast_mac(ip: [u8; 4]) -> [u8; 6] {
    [0x01, 0x00, 0x5e, ip[1] & 0x7f, ip[2], ip[3]]
}

fn checksum_add(mut sum: u32, b: &[u8]) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

fn checksum_fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl UdpFrameRepr {
    /// Writes a whole frame — headers then `payload` — into `buf`; returns its length.
    pub fn emit(&self, payload: &[u8], buf: &mut [u8]) -> Result<usize, Error> {
        let n = UDP_FRAME_HEADER_LEN + payload.len();
        if IPV4_HEADER_LEN + UDP_HEADER_LEN + payload.len() > usize::from(u16::MAX) {
            return Err(Error::Malformed { protocol: Protocol::Frame, reason: "payload too long for IPv4" });
        }
        check_len(buf, n)?;
        let buf = &mut buf[..n];
        buf[0..6].copy_from_slice(&self.dst_mac);
        buf[6..12].copy_from_slice(&self.src_mac);
        buf[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let ip_len = (IPV4_HEADER_LEN + UDP_HEADER_LEN + payload.len()) as u16;
        let udp_len = (UDP_HEADER_LEN + payload.len()) as u16;
        {
            let ip = &mut buf[14..34];
            ip[0] = 0x45;
            ip[1] = 0;
            ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
            ip[4..6].copy_from_slice(&self.ident.to_be_bytes());
            ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // don't fragment
            ip[8] = self.ttl;
            ip[9] = IP_PROTO_UDP;
            ip[10..12].fill(0);
            ip[12..16].copy_from_slice(&self.src_ip);
            ip[16..20].copy_from_slice(&self.dst_ip);
            let c = checksum_fold(checksum_add(0, ip));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        {
            let (hdr, rest) = buf[34..].split_at_mut(UDP_HEADER_LEN);
            hdr[0..2].copy_from_slice(&self.src_port.to_be_bytes());
            hdr[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
            hdr[4..6].copy_from_slice(&udp_len.to_be_bytes());
            hdr[6..8].fill(0);
            rest.copy_from_slice(payload);
            // Pseudo-header, UDP header and payload.
            let mut sum = checksum_add(0, &self.src_ip);
            sum = checksum_add(sum, &self.dst_ip);
            sum += u32::from(IP_PROTO_UDP) + u32::from(udp_len);
            sum = checksum_add(sum, hdr);
            sum = checksum_add(sum, rest);
            let c = match checksum_fold(sum) {
                0 => 0xffff, // 0 means "no checksum" in UDP over IPv4
                c => c,
            };
            hdr[6..8].copy_from_slice(&c.to_be_bytes());
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr() -> UdpFrameRepr {
        UdpFrameRepr {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: multicast_mac([233, 54, 12, 111]),
            src_ip: [10, 0, 0, 1],
            dst_ip: [233, 54, 12, 111],
            src_port: 40000,
            dst_port: 26477,
            ttl: 32,
            ident: 7,
        }
    }

    #[test]
    fn emit_then_parse() {
        let mut buf = [0xa5u8; 100];
        let n = repr().emit(b"hello", &mut buf).unwrap();
        assert_eq!(n, 47);
        assert_eq!(&buf[0..6], &[0x01, 0x00, 0x5e, 54, 12, 111]);
        let d = parse_udp(LinkType::Ethernet, &buf[..n]).unwrap();
        assert_eq!(d.payload, b"hello");
        assert_eq!((d.src_port, d.dst_port), (40000, 26477));
        assert_eq!(d.dst_ip, [233, 54, 12, 111]);
        // The IPv4 header checksums to zero, as receivers verify it.
        assert_eq!(checksum_fold(checksum_add(0, &buf[14..34])), 0);
        // Ethernet padding after the datagram is ignored.
        let d = parse_udp(LinkType::Ethernet, &buf[..n + 13]).unwrap();
        assert_eq!(d.payload, b"hello");
    }

    #[test]
    fn vlan_tag_is_skipped() {
        let mut plain = [0u8; 64];
        let n = repr().emit(b"x", &mut plain).unwrap();
        let mut tagged = [0u8; 68];
        tagged[..12].copy_from_slice(&plain[..12]);
        tagged[12..16].copy_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        tagged[16..n + 4].copy_from_slice(&plain[12..n]);
        assert_eq!(parse_udp(LinkType::Ethernet, &tagged[..n + 4]).unwrap().payload, b"x");
    }

    #[test]
    fn truncated_and_foreign_frames_are_errors() {
        let mut buf = [0u8; 64];
        let n = repr().emit(b"hello", &mut buf).unwrap();
        for cut in 0..n {
            assert!(parse_udp(LinkType::Ethernet, &buf[..cut]).is_err(), "cut at {cut}");
        }
        buf[23] = 6; // TCP
        assert_eq!(parse_udp(LinkType::Ethernet, &buf[..n]), Err(Error::Unsupported { reason: "not UDP" }));
    }
}
