//! A measuring sink for benchmarks (`bpf/sink.bpf.c`): an XDP program that
//! counts and drops every UDP/IPv4 datagram to a port range at the far end
//! of a link, so a sender's rate is measured at the least receive cost the
//! kernel offers, the same for every sender compared.

use std::ops::RangeInclusive;

use aya::maps::PerCpuArray;
use aya::Ebpf;

use crate::{attach_in, open_object, set_u32s, xdp_program, XdpError};

const OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sink.bpf.o"));

/// The sink attached (natively) to one interface; detached when dropped.
pub struct XdpSink {
    ebpf: Ebpf,
}

impl std::fmt::Debug for XdpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpSink").finish_non_exhaustive()
    }
}

impl XdpSink {
    /// Attaches to `iface` of the calling thread's namespace in driver mode,
    /// dropping and counting datagrams to `ports`.
    pub fn attach(iface: &str, ports: RangeInclusive<u16>) -> Result<XdpSink, XdpError> {
        let mut ebpf = open_object(OBJECT)?;
        set_u32s(&mut ebpf, "ff_sink_ports", &[u32::from(*ports.start()), u32::from(*ports.end())])?;
        attach_in(xdp_program(&mut ebpf, "ff_xdp_sink")?, iface, &[crate::Mode::Native])?;
        Ok(XdpSink { ebpf })
    }

    /// Datagrams dropped so far (summed over CPUs).
    pub fn datagrams(&self) -> Result<u64, XdpError> {
        let map = self.ebpf.map("ff_sink_counters").ok_or_else(|| XdpError::Map("no map ff_sink_counters".into()))?;
        let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(|e| XdpError::Map(e.to_string()))?;
        let v = arr.get(&0, 0).map_err(|e| XdpError::Map(e.to_string()))?;
        Ok(v.iter().sum())
    }
}
