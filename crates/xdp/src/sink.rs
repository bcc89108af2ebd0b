//! A measuring sink for benchmarks (`bpf/sink.bpf.c`): an XDP program that
//! counts and drops every UDP/IPv4 datagram to a port range at the far end
//! of a link, so a sender's rate is measured at the least receive cost the
//! kernel offers, the same for every sender compared.

use std::ops::RangeInclusive;

use aya::maps::{Array, PerCpuArray};
use aya::programs::{Xdp, XdpFlags};
use aya::Ebpf;

use crate::{built, is_permission, XdpError};

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
        built()?;
        let load_err = |e: &(dyn std::error::Error + 'static)| {
            if is_permission(e) {
                XdpError::Permission(e.to_string())
            } else {
                XdpError::Load(e.to_string())
            }
        };
        let mut ebpf = Ebpf::load(OBJECT).map_err(|e| load_err(&e))?;
        {
            let map = ebpf.map_mut("ff_sink_ports").ok_or_else(|| XdpError::Map("no map ff_sink_ports".into()))?;
            let mut p: Array<_, u32> = Array::try_from(map).map_err(|e| XdpError::Map(e.to_string()))?;
            p.set(0, u32::from(*ports.start()), 0).map_err(|e| XdpError::Map(e.to_string()))?;
            p.set(1, u32::from(*ports.end()), 0).map_err(|e| XdpError::Map(e.to_string()))?;
        }
        let prog: &mut Xdp = ebpf
            .program_mut("ff_xdp_sink")
            .ok_or_else(|| XdpError::Load("no program ff_xdp_sink".into()))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| XdpError::Load(e.to_string()))?;
        prog.load().map_err(|e| load_err(&e))?;
        match prog.attach(iface, XdpFlags::DRV_MODE) {
            Ok(_) => Ok(XdpSink { ebpf }),
            Err(aya::programs::ProgramError::UnknownInterface { name }) => Err(XdpError::NoInterface(name)),
            Err(e) => Err(XdpError::Attach { iface: iface.to_string(), mode: crate::Mode::Native, why: e.to_string() }),
        }
    }

    /// Datagrams dropped so far (summed over CPUs).
    pub fn datagrams(&self) -> Result<u64, XdpError> {
        let map = self.ebpf.map("ff_sink_counters").ok_or_else(|| XdpError::Map("no map ff_sink_counters".into()))?;
        let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(|e| XdpError::Map(e.to_string()))?;
        let v = arr.get(&0, 0).map_err(|e| XdpError::Map(e.to_string()))?;
        Ok(v.iter().sum())
    }
}
