//! Reading and writing captures: pcap (µs or ns) and pcapng in, pcap with
//! nanosecond timestamps out, Ethernet/IPv4/UDP framing both ways.
//!
//! This is the file-I/O shell around `fairfeed_wire::frame`; the decoders stay
//! pure. Frames that are not IPv4/UDP are skipped and counted, never fatal.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;

use fairfeed_wire::frame::{self, LinkType, UdpFrameRepr};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, Endianness, TsResolution};

/// Errors of the capture shell.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    // Not `source`: the error is part of this message, and a chain would print it twice.
    #[error("{path}: {err}")]
    Io { path: String, err: std::io::Error },
    #[error("{path}: not a pcap or pcapng file ({detail})")]
    Format { path: String, detail: String },
    /// A pcap or pcapng magic number, then a header that is cut short or invalid.
    #[error("{path}: a {kind} file whose header is cut short or invalid ({detail})")]
    Header { path: String, kind: &'static str, detail: String },
    /// A record after the header is damaged (e.g. the file was cut short).
    #[error("{path}: damaged record ({detail})")]
    Damaged { path: String, detail: String },
    #[error("{path}: writing failed: {detail}")]
    Write { path: String, detail: String },
}

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Capture time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// The link type, or `None` if we cannot read it.
    pub link: Option<LinkType>,
    pub data: Vec<u8>,
}

/// One UDP datagram found in a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Capture time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub payload: Vec<u8>,
}

/// Counts of frames a reader skipped, by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SkipCounts {
    pub not_udp: u64,
    pub other_port: u64,
    pub bad_frame: u64,
    pub unknown_link: u64,
    /// Where reading stopped early because the file is damaged (e.g.
    /// truncated): after how many frames, and what was wrong. Everything
    /// before it was read.
    pub damaged: Option<(u64, String)>,
}

enum Inner {
    Pcap(PcapReader<BufReader<File>>, Option<LinkType>),
    PcapNg(Box<PcapNgReader<BufReader<File>>>, Vec<(Option<LinkType>, u64, u64)>),
}

/// Reads pcap or pcapng files frame by frame.
pub struct CaptureReader {
    inner: Inner,
    path: String,
}

fn link_of(d: DataLink) -> Option<LinkType> {
    LinkType::from_pcap(u32::from(d))
}

/// (multiplier, divisor) turning a pcapng timestamp into nanoseconds.
fn tsresol_scale(opts: &[InterfaceDescriptionOption]) -> (u64, u64) {
    let resol = opts.iter().find_map(|o| match o {
        InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
        _ => None,
    });
    match resol.unwrap_or(6) {
        r if r & 0x80 != 0 => (1_000_000_000, 1u64 << (r & 0x7f).min(63)),
        r if r <= 9 => (10u64.pow(9 - u32::from(r)), 1),
        r => (1, 10u64.pow(u32::from(r.min(19)) - 9)),
    }
}

impl CaptureReader {
    /// Opens a capture, telling pcap from pcapng by the magic number.
    pub fn open(path: &Path) -> Result<Self, CaptureError> {
        let p = path.display().to_string();
        let io = |err| CaptureError::Io { path: p.clone(), err };
        let mut f = File::open(path).map_err(io)?;
        let mut magic = [0u8; 4];
        if let Err(err) = f.read_exact(&mut magic) {
            if err.kind() == std::io::ErrorKind::UnexpectedEof {
                let len = std::fs::metadata(path).map_or(0, |m| m.len());
                return Err(CaptureError::Format {
                    path: p,
                    detail: format!("{len} bytes: too short for a capture's header"),
                });
            }
            return Err(io(err));
        }
        let f = File::open(path).map_err(io)?;
        let is_ng = magic == [0x0a, 0x0d, 0x0d, 0x0a];
        let is_pcap = matches!(u32::from_le_bytes(magic), 0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1);
        let fmt = |e: pcap_file::PcapError| match (is_ng, is_pcap) {
            (true, _) => CaptureError::Header { path: p.clone(), kind: "pcapng", detail: e.to_string() },
            (_, true) => CaptureError::Header { path: p.clone(), kind: "pcap", detail: e.to_string() },
            _ => CaptureError::Format { path: p.clone(), detail: e.to_string() },
        };
        let inner = if is_ng {
            Inner::PcapNg(Box::new(PcapNgReader::new(BufReader::new(f)).map_err(fmt)?), Vec::new())
        } else {
            let r = PcapReader::new(BufReader::new(f)).map_err(fmt)?;
            let link = link_of(r.header().datalink);
            Inner::Pcap(r, link)
        };
        Ok(CaptureReader { inner, path: p })
    }

    /// The next frame, or `None` at the end of the file.
    pub fn next_frame(&mut self) -> Option<Result<Frame, CaptureError>> {
        let fmt = |e: pcap_file::PcapError| CaptureError::Damaged { path: self.path.clone(), detail: damage(&e) };
        match &mut self.inner {
            Inner::Pcap(r, link) => {
                let p = r.next_packet()?;
                Some(p.map_err(fmt).map(|p| Frame {
                    ts_ns: p.timestamp.as_nanos() as u64,
                    link: *link,
                    data: p.data.into_owned(),
                }))
            }
            Inner::PcapNg(r, ifaces) => loop {
                let block = match r.next_block()? {
                    Ok(b) => b,
                    Err(e) => return Some(Err(fmt(e))),
                };
                match block {
                    Block::InterfaceDescription(idb) => {
                        let (mul, div) = tsresol_scale(&idb.options);
                        ifaces.push((link_of(idb.linktype), mul, div));
                    }
                    Block::EnhancedPacket(epb) => {
                        let (link, mul, div) = ifaces.get(epb.interface_id as usize).copied().unwrap_or((None, 1, 1));
                        // pcap-file reports the raw tick count as nanoseconds; rescale by if_tsresol.
                        let raw = epb.timestamp.as_nanos() as u64;
                        let ts_ns = (u128::from(raw) * u128::from(mul) / u128::from(div)) as u64;
                        return Some(Ok(Frame { ts_ns, link, data: epb.data.into_owned() }));
                    }
                    Block::SimplePacket(spb) => {
                        let link = ifaces.first().and_then(|i| i.0);
                        return Some(Ok(Frame { ts_ns: 0, link, data: spb.data.into_owned() }));
                    }
                    _ => {}
                }
            },
        }
    }
}

impl Iterator for CaptureReader {
    type Item = Result<Frame, CaptureError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_frame()
    }
}

/// Extracts a UDP datagram from a frame, counting what it skips.
/// `port` keeps only datagrams to that destination port.
pub fn udp_of(frame: &Frame, port: Option<u16>, skipped: &mut SkipCounts) -> Option<Datagram> {
    let Some(link) = frame.link else {
        skipped.unknown_link += 1;
        return None;
    };
    match frame::parse_udp(link, &frame.data) {
        Ok(d) if port.is_none_or(|p| p == d.dst_port) => Some(Datagram {
            ts_ns: frame.ts_ns,
            src: SocketAddrV4::new(Ipv4Addr::from(d.src_ip), d.src_port),
            dst: SocketAddrV4::new(Ipv4Addr::from(d.dst_ip), d.dst_port),
            payload: d.payload.to_vec(),
        }),
        Ok(_) => {
            skipped.other_port += 1;
            None
        }
        Err(fairfeed_wire::Error::Unsupported { .. }) => {
            skipped.not_udp += 1;
            None
        }
        Err(_) => {
            skipped.bad_frame += 1;
            None
        }
    }
}

/// What is wrong with a damaged record, in words.
fn damage(e: &pcap_file::PcapError) -> String {
    match e {
        pcap_file::PcapError::IncompleteBuffer => "the file ends inside a record: truncated".into(),
        pcap_file::PcapError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            "the file ends inside a record: truncated".into()
        }
        other => other.to_string(),
    }
}

/// Reads every UDP datagram of a capture (to `port`, if given). A file
/// damaged part-way (truncated, a bad record) gives what came before the
/// damage, with `SkipCounts::damaged` saying where; a file that is not a
/// capture at all is an error.
pub fn read_datagrams(path: &Path, port: Option<u16>) -> Result<(Vec<Datagram>, SkipCounts), CaptureError> {
    let mut skipped = SkipCounts::default();
    let mut out = Vec::new();
    let mut frames = 0u64;
    for frame in CaptureReader::open(path)? {
        match frame {
            Ok(f) => {
                frames += 1;
                if let Some(d) = udp_of(&f, port, &mut skipped) {
                    out.push(d);
                }
            }
            // A damaged file (truncated, a bad record): keep what came before, say where.
            Err(CaptureError::Damaged { detail, .. }) => {
                skipped.damaged = Some((frames, detail));
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok((out, skipped))
}

/// What went wrong in pcap-file, in words: its I/O errors say "Error reading
/// bytes" even when writing; the OS's reason (e.g. "No space left on device") is inside.
fn pcap_detail(e: &pcap_file::PcapError) -> String {
    match e {
        pcap_file::PcapError::IoError(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// Writes UDP payloads as Ethernet/IPv4/UDP frames into a nanosecond pcap.
pub struct CaptureWriter {
    writer: PcapWriter<BufWriter<File>>,
    path: String,
    frame_buf: Vec<u8>,
    ident: u16,
}

/// Snap length of the captures we write: the largest IPv4 UDP frame.
pub const SNAPLEN: u32 = 65_535;

impl CaptureWriter {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> Result<Self, CaptureError> {
        let p = path.display().to_string();
        let f = File::create(path).map_err(|err| CaptureError::Io { path: p.clone(), err })?;
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::Little,
        };
        let writer = PcapWriter::with_header(BufWriter::with_capacity(1 << 20, f), header)
            .map_err(|e| CaptureError::Write { path: p.clone(), detail: pcap_detail(&e) })?;
        Ok(CaptureWriter { writer, path: p, frame_buf: vec![0; SNAPLEN as usize], ident: 0 })
    }

    /// Appends one datagram from `src` to `dst` captured at `ts_ns`.
    pub fn write(
        &mut self,
        ts_ns: u64,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        payload: &[u8],
    ) -> Result<(), CaptureError> {
        let dst_mac = if dst.ip().is_multicast() {
            frame::multicast_mac(dst.ip().octets())
        } else {
            [0x02, 0, dst.ip().octets()[1], dst.ip().octets()[2], dst.ip().octets()[3], 0x02]
        };
        let s = src.ip().octets();
        let repr = UdpFrameRepr {
            src_mac: [0x02, 0, s[1], s[2], s[3], 0x01],
            dst_mac,
            src_ip: s,
            dst_ip: dst.ip().octets(),
            src_port: src.port(),
            dst_port: dst.port(),
            ttl: 32,
            ident: self.ident,
        };
        self.ident = self.ident.wrapping_add(1);
        let n = repr
            .emit(payload, &mut self.frame_buf)
            .map_err(|e| CaptureError::Write { path: self.path.clone(), detail: e.to_string() })?;
        let pkt = PcapPacket::new(std::time::Duration::from_nanos(ts_ns), n as u32, &self.frame_buf[..n]);
        self.writer
            .write_packet(&pkt)
            .map_err(|e| CaptureError::Write { path: self.path.clone(), detail: pcap_detail(&e) })?;
        Ok(())
    }

    /// Flushes and closes the file.
    pub fn finish(self) -> Result<(), CaptureError> {
        let path = self.path;
        let mut w = self.writer.into_writer();
        std::io::Write::flush(&mut w).map_err(|err| CaptureError::Io { path, err })
    }
}
