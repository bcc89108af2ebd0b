//! Jasper's sender- and proxy-side fast path: a TC egress program that
//! turns one datagram into one copy per target (`bpf/replicate.bpf.c`).
//!
//! The node sends each data packet once, to its first target; on the way out
//! of the interface the program clones it to every other target with
//! `bpf_clone_redirect()`, rewriting destination address and port (and MAC,
//! where the table gives one) with incremental checksum updates. What user
//! space pays per packet is one datagram instead of one per target.

use std::net::SocketAddrV4;

use aya::maps::{Array, PerCpuArray};
use aya::programs::{tc::TcAttachType, SchedClassifier};
use aya::Ebpf;
use serde::Serialize;

use crate::{built, XdpError};

/// Targets one packet is replicated to at most (`TARGETS_MAX` in the program).
pub const TARGETS_MAX: usize = 64;

const OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/replicate.bpf.o"));
const PROGRAM: &str = "ff_tc_replicate";

/// What the program counted, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReplicateCounters {
    /// Data packets replicated.
    pub packets: u64,
    /// Copies made in the kernel (the original, to the first target, not counted).
    pub copies: u64,
    /// Clones the device refused (its queue full) or rewrites that failed:
    /// copies not made, as a full socket buffer refuses a send.
    pub failed: u64,
    /// Packets left alone (not data from the node's port to its first target).
    pub passed: u64,
}

/// The replicator attached to one interface's egress; detached when dropped.
pub struct TcReplicator {
    ebpf: Ebpf,
    iface: String,
}

impl std::fmt::Debug for TcReplicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcReplicator").field("iface", &self.iface).finish()
    }
}

fn target_bytes(a: SocketAddrV4, mac: Option<[u8; 6]>) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&a.ip().octets());
    b[4..6].copy_from_slice(&a.port().to_be_bytes());
    b[6..12].copy_from_slice(&mac.unwrap_or_default());
    b
}

impl TcReplicator {
    /// Loads the program and attaches it to `iface`'s egress (of the calling
    /// thread's network namespace): data packets sent from UDP port `sport`
    /// to `targets[0]` leave as one copy per target. `macs`, when given, has
    /// one destination MAC per target (for targets on the link itself);
    /// without, every copy keeps the MAC the kernel chose for the first
    /// (targets behind one next hop: a router, or one host).
    pub fn attach(
        iface: &str,
        sport: u16,
        targets: &[SocketAddrV4],
        macs: Option<&[[u8; 6]]>,
    ) -> Result<TcReplicator, XdpError> {
        built()?;
        if targets.is_empty() || targets.len() > TARGETS_MAX {
            return Err(XdpError::Load(format!("1 to {TARGETS_MAX} targets, not {}", targets.len())));
        }
        let distinct: std::collections::HashSet<_> = targets.iter().collect();
        if distinct.len() != targets.len() {
            return Err(XdpError::Load("the targets must be distinct".into()));
        }
        if macs.is_some_and(|m| m.len() != targets.len()) {
            return Err(XdpError::Load("one MAC per target, or none".into()));
        }
        let mut ebpf = crate::open_object(OBJECT)?;
        {
            let map = ebpf.map_mut("ff_targets").ok_or_else(|| XdpError::Map("no map ff_targets".into()))?;
            let mut t: Array<_, [u8; 16]> = Array::try_from(map).map_err(|e| XdpError::Map(e.to_string()))?;
            for (i, a) in targets.iter().enumerate() {
                let mac = macs.map(|m| m[i]);
                t.set(i as u32, target_bytes(*a, mac), 0).map_err(|e| XdpError::Map(e.to_string()))?;
            }
        }
        {
            let map = ebpf.map_mut("ff_rconfig").ok_or_else(|| XdpError::Map("no map ff_rconfig".into()))?;
            let mut c: Array<_, [u8; 8]> = Array::try_from(map).map_err(|e| XdpError::Map(e.to_string()))?;
            let mut b = [0u8; 8];
            b[..4].copy_from_slice(&(targets.len() as u32).to_ne_bytes());
            b[4..6].copy_from_slice(&sport.to_be_bytes());
            b[6..8].copy_from_slice(&u16::from(macs.is_some()).to_ne_bytes());
            c.set(0, b, 0).map_err(|e| XdpError::Map(e.to_string()))?;
        }
        let prog: &mut SchedClassifier = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| XdpError::Load(format!("no program {PROGRAM}")))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| XdpError::Load(e.to_string()))?;
        prog.load().map_err(|e| crate::load_err(&e))?;
        match prog.attach(iface, TcAttachType::Egress) {
            Ok(_) => Ok(TcReplicator { ebpf, iface: iface.to_string() }),
            Err(aya::programs::ProgramError::UnknownInterface { name }) => Err(XdpError::NoInterface(name)),
            Err(e) => Err(XdpError::TcAttach { iface: iface.to_string(), why: e.to_string() }),
        }
    }

    /// The interface it is attached to.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The program's counters, summed over CPUs.
    pub fn counters(&self) -> Result<ReplicateCounters, XdpError> {
        let map = self.ebpf.map("ff_rcounters").ok_or_else(|| XdpError::Map("no map ff_rcounters".into()))?;
        let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(|e| XdpError::Map(e.to_string()))?;
        let mut v = [0u64; 4];
        for (i, slot) in v.iter_mut().enumerate() {
            let per_cpu = arr.get(&(i as u32), 0).map_err(|e| XdpError::Map(e.to_string()))?;
            *slot = per_cpu.iter().sum();
        }
        Ok(ReplicateCounters { packets: v[0], copies: v[1], failed: v[2], passed: v[3] })
    }
}
