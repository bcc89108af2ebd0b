//! # fairfeed-xdp
//!
//! Jasper's kernel fast path for receivers (seed 000, §7.2 and appendix A):
//! an XDP program that drops the extra hedged copies of each overlay data
//! packet in the driver, before the kernel builds a socket buffer for them,
//! so a receiver with hedging `H` reads one copy instead of `H + 1`.
//!
//! The program (`bpf/dedup.bpf.c`, compiled by this crate's build script
//! with clang's BPF target) keeps a fixed ring of [`SLOTS`] entries indexed
//! by sequence number, as the paper's Algorithm 1 does, and drops a copy only
//! when one with the same tree, sequence number **and** 128-bit
//! authentication tag has passed: a forged packet cannot suppress the genuine
//! one (it would need the tree's key to carry the genuine tag). Everything
//! else is passed, so user space — which checks tags and keeps its own exact
//! window — stays the judge of what is delivered; the XDP program only saves
//! it work. [`XdpDedup`] loads and attaches it with aya (pure Rust, no libbpf
//! to link), and reads its counters.
//!
//! The sender's and proxies' side is [`TcReplicator`] (`bpf/replicate.bpf.c`):
//! a TC egress program that clones each data packet the node sends to its
//! first target to every other target, so user space sends one datagram per
//! packet instead of one per target.

pub mod afxdp;
pub mod neigh;
pub mod netns;
pub mod replicate;
pub mod sink;
mod testrun;

use aya::maps::{Array, PerCpuArray};
use aya::programs::{Xdp, XdpFlags};
use aya::Ebpf;
use serde::Serialize;

/// Slots the program remembers: a power of two (Algorithm 1 needs one: XDP
/// has no modulo), equal to the user-space de-duplication window.
pub const SLOTS: u64 = 65_536;
const _: () = assert!(SLOTS.is_power_of_two());

const OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/dedup.bpf.o"));
pub use replicate::{ReplicateCounters, TcReplicator};
const BUILD: &str = env!("FAIRFEED_BPF_BUILD");
const PROGRAM: &str = "ff_xdp_dedup";

/// What the program counted, summed over CPUs (the indices of `bpf/dedup.bpf.c`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DedupCounters {
    /// Overlay data packets to the port examined.
    pub data: u64,
    /// First copies of a sequence number: passed.
    pub first: u64,
    /// Copies with the sequence number and tag of one already passed: dropped in the driver.
    pub duplicate: u64,
    /// Same sequence number, different tag (forged or corrupt): passed to user space to judge.
    pub tag_differs: u64,
    /// Older than the slot's sequence number (reordered past the ring): passed.
    pub too_old: u64,
    /// To the port but not judged here (cut short, not overlay data, or a
    /// payload over the program's 4,096-byte bound): passed.
    pub unparsed: u64,
    /// Not UDP/IPv4 to the port: passed untouched.
    pub other: u64,
}

const COUNTERS: u32 = 7;

/// How the program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// In the driver (XDP_FLAGS_DRV_MODE): the fast path.
    Native,
    /// After the driver, in the generic stack (XDP_FLAGS_SKB_MODE): works on any interface, saves less.
    Generic,
}

impl Mode {
    fn flags(self) -> XdpFlags {
        match self {
            Mode::Native => XdpFlags::DRV_MODE,
            Mode::Generic => XdpFlags::SKB_MODE,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Native => "native",
            Mode::Generic => "generic",
        })
    }
}

/// Why the fast path could not be set up; each names what is missing.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    #[error("this fairfeed was built without its eBPF programs ({0}); install clang (Debian: apt-get install clang) and run `cargo build --release` again: the build picks it up")]
    NotBuilt(&'static str),
    #[error("loading an eBPF program needs root (CAP_BPF, CAP_NET_ADMIN): {0}")]
    Permission(String),
    #[error("no network interface named {0:?} in this network namespace")]
    NoInterface(String),
    #[error("the kernel refused fairfeed's XDP program: {0}")]
    Load(String),
    #[error("attaching XDP to {iface} in {mode} mode failed (does its driver support it?): {why}")]
    Attach { iface: String, mode: Mode, why: String },
    #[error("attaching the TC egress program to {iface} failed: {why}")]
    TcAttach { iface: String, why: String },
    #[error("reading the XDP program's maps failed: {0}")]
    Map(String),
}

/// What the program answered for one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `XDP_DROP`: a repeat of a copy already passed.
    Drop,
    /// `XDP_PASS`: on to the stack.
    Pass,
    /// Anything else (a bug: the program returns only the two above).
    Other(u32),
}

pub(crate) fn load_err(e: &(dyn std::error::Error + 'static)) -> XdpError {
    if is_permission(e) {
        XdpError::Permission(e.to_string())
    } else {
        XdpError::Load(e.to_string())
    }
}

/// An object of this crate's, opened (its maps made; no program loaded yet).
pub(crate) fn open_object(object: &[u8]) -> Result<Ebpf, XdpError> {
    built()?;
    Ebpf::load(object).map_err(|e| load_err(&e))
}

/// Sets entries `0..` of the `u32` array map `name`.
pub(crate) fn set_u32s(ebpf: &mut Ebpf, name: &str, values: &[u32]) -> Result<(), XdpError> {
    let map = ebpf.map_mut(name).ok_or_else(|| XdpError::Map(format!("no map {name}")))?;
    let mut a: Array<_, u32> = Array::try_from(map).map_err(|e| XdpError::Map(e.to_string()))?;
    for (i, v) in values.iter().enumerate() {
        a.set(i as u32, *v, 0).map_err(|e| XdpError::Map(e.to_string()))?;
    }
    Ok(())
}

/// XDP program `name` of `ebpf`, loaded into the kernel (the verifier's pass).
pub(crate) fn xdp_program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp, XdpError> {
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .ok_or_else(|| XdpError::Load(format!("no program {name}")))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| XdpError::Load(e.to_string()))?;
    prog.load().map_err(|e| load_err(&e))?;
    Ok(prog)
}

/// Attaches `prog` to `iface` in the first of `modes` that works.
pub(crate) fn attach_in(prog: &mut Xdp, iface: &str, modes: &[Mode]) -> Result<Mode, XdpError> {
    let mut last = None;
    for &m in modes {
        match prog.attach(iface, m.flags()) {
            Ok(_) => return Ok(m),
            Err(aya::programs::ProgramError::UnknownInterface { name }) => return Err(XdpError::NoInterface(name)),
            Err(e) => last = Some(XdpError::Attach { iface: iface.to_string(), mode: m, why: e.to_string() }),
        }
    }
    Err(last.unwrap_or_else(|| XdpError::Load("no mode to try".into())))
}

/// The de-duplicator's object opened, watching UDP destination `port`.
fn load_dedup(port: u16) -> Result<Ebpf, XdpError> {
    let mut ebpf = open_object(OBJECT)?;
    set_u32s(&mut ebpf, "ff_config", &[u32::from(port)])?;
    Ok(ebpf)
}

/// The de-duplicator's program, loaded into the kernel (the verifier's pass).
fn dedup_program(ebpf: &mut Ebpf) -> Result<&mut Xdp, XdpError> {
    xdp_program(ebpf, PROGRAM)
}

/// The de-duplicator attached to one interface; detached when dropped.
pub struct XdpDedup {
    ebpf: Ebpf,
    iface: String,
    mode: Mode,
}

impl std::fmt::Debug for XdpDedup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpDedup").field("iface", &self.iface).field("mode", &self.mode).finish()
    }
}

pub(crate) fn is_permission(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.raw_os_error() == Some(1) {
                return true;
            }
        }
        cur = e.source();
    }
    false
}

/// Whether this binary carries the eBPF programs (it was built with clang).
pub fn built() -> Result<(), XdpError> {
    if BUILD == "ok" && !OBJECT.is_empty() {
        Ok(())
    } else {
        Err(XdpError::NotBuilt(BUILD))
    }
}

impl XdpDedup {
    /// Loads the program, sets the UDP destination `port` it watches (0:
    /// every port) and attaches it to `iface` of the calling thread's network
    /// namespace in `mode`; `None` tries native, then generic.
    pub fn attach(iface: &str, port: u16, mode: Option<Mode>) -> Result<XdpDedup, XdpError> {
        let mut ebpf = load_dedup(port)?;
        let prog = dedup_program(&mut ebpf)?;
        let modes: &[Mode] = match mode {
            Some(m) => &[m][..],
            None => &[Mode::Native, Mode::Generic],
        };
        let mode = attach_in(prog, iface, modes)?;
        Ok(XdpDedup { ebpf, iface: iface.to_string(), mode })
    }

    /// The program loaded into the kernel but attached nowhere: for running
    /// it on frames one at a time ([`XdpDedup::run`]), in tests.
    pub fn unattached(port: u16) -> Result<XdpDedup, XdpError> {
        let mut ebpf = load_dedup(port)?;
        dedup_program(&mut ebpf)?;
        Ok(XdpDedup { ebpf, iface: String::new(), mode: Mode::Generic })
    }

    /// Runs the loaded program once on the Ethernet frame `frame`
    /// (`BPF_PROG_TEST_RUN`: the kernel's own execution of it, maps
    /// included) and returns its verdict.
    pub fn run(&self, frame: &[u8]) -> Result<Verdict, XdpError> {
        let prog: &Xdp = self
            .ebpf
            .program(PROGRAM)
            .ok_or_else(|| XdpError::Load(format!("no program {PROGRAM}")))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| XdpError::Load(e.to_string()))?;
        let fd = prog.fd().map_err(|e| XdpError::Load(e.to_string()))?;
        let code =
            testrun::run(std::os::fd::AsFd::as_fd(fd), frame).map_err(|e| XdpError::Load(format!("test run: {e}")))?;
        Ok(match code {
            1 => Verdict::Drop,
            2 => Verdict::Pass,
            c => Verdict::Other(c),
        })
    }

    /// The interface it is attached to.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The mode it is attached in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The program's counters, summed over CPUs.
    pub fn counters(&self) -> Result<DedupCounters, XdpError> {
        let map = self.ebpf.map("ff_counters").ok_or_else(|| XdpError::Map("no map ff_counters".into()))?;
        let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(|e| XdpError::Map(e.to_string()))?;
        let mut v = [0u64; COUNTERS as usize];
        for (i, slot) in v.iter_mut().enumerate() {
            let per_cpu = arr.get(&(i as u32), 0).map_err(|e| XdpError::Map(e.to_string()))?;
            *slot = per_cpu.iter().sum();
        }
        Ok(DedupCounters {
            data: v[0],
            first: v[1],
            duplicate: v[2],
            tag_differs: v[3],
            too_old: v[4],
            unparsed: v[5],
            other: v[6],
        })
    }
}
