//! AF_XDP: a node's datagrams between its user space and the driver,
//! without the kernel's IP and UDP stack or a socket buffer per datagram.
//!
//! [`Xsk`] is one AF_XDP socket on one queue of one interface: a UMEM of
//! [`FRAMES`] frames of [`FRAME_SIZE`] bytes shared with the kernel, and the
//! four rings (fill and completion for the UMEM, RX and TX for the socket),
//! each [`RING_SIZE`] entries, read and written with acquire/release atomics
//! on the producer and consumer indices as the kernel's `if_xdp.h` ABI
//! prescribes. Half the frames belong to the fill ring (the kernel writes
//! received frames into them), half to transmission (a free list, refilled
//! from the completion ring). [`XskSteer`] is the XDP program
//! (`bpf/xsk.bpf.c`) that sends the node's UDP port to the socket and
//! passes everything else (ARP, control traffic) to the stack.
//!
//! Frames are plain Ethernet II / IPv4 / UDP, built and parsed here
//! ([`UdpHeaders`], [`parse_udp`]) with both checksums; the payload's
//! checksum sum is computed once per packet and reused for every copy.
//!
//! Zero-copy needs a driver that supports it (mlx5, ice, i40e, …); elsewhere
//! (veth, which the tests use) the kernel copies each frame once between
//! the UMEM and its own buffers ("copy mode"), still skipping the stack.
//!
//! The rings are memory shared with the kernel, so this module needs
//! `unsafe`: every block says what makes it sound.
#![allow(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use aya::maps::{PerCpuArray, XskMap};
use aya::Ebpf;
use serde::Serialize;

use crate::{Mode, XdpError};

/// Bytes per UMEM frame (one datagram each).
pub const FRAME_SIZE: u32 = 2048;
/// Entries of each ring.
pub const RING_SIZE: u32 = 2048;
/// Frames of the UMEM: a ring's worth for receiving, a ring's worth for sending.
pub const FRAMES: u32 = 2 * RING_SIZE;
const _: () = assert!(RING_SIZE.is_power_of_two() && FRAME_SIZE.is_power_of_two());
/// Descriptors queued on the TX ring before the kernel is told.
pub const TX_KICK_EVERY: usize = 32;
/// Ethernet + IPv4 + UDP header bytes of every frame.
pub const HEADERS: usize = 14 + 20 + 8;
/// The largest payload a frame holds.
pub const PAYLOAD_MAX: usize = FRAME_SIZE as usize - HEADERS;

const OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xsk.bpf.o"));

/// How the socket moves frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum XskMode {
    /// The driver reads and writes the UMEM itself.
    ZeroCopy,
    /// The kernel copies each frame between the UMEM and its own buffers.
    Copy,
}

/// What one socket counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct XskCounters {
    /// Frames read from the RX ring.
    pub rx_frames: u64,
    /// Frames put on the TX ring.
    pub tx_frames: u64,
    /// Frames not sent: no free frame or no room on the TX ring even after
    /// reclaiming completions and telling the kernel (a full link).
    pub tx_full: u64,
    /// `sendto` calls that told the kernel to transmit.
    pub kicks: u64,
    /// Frames the kernel dropped on receive (its `XDP_STATISTICS`).
    pub rx_dropped: u64,
    /// Times the kernel found the fill ring empty.
    pub rx_fill_empty: u64,
}

/// One mapped ring.
struct Ring {
    map: *mut libc::c_void,
    len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut u8,
    mask: u32,
}

impl Ring {
    /// Maps ring `pgoff` of `fd`, entries of `entry` bytes.
    fn map(fd: i32, off: &libc::xdp_ring_offset, pgoff: u64, entry: usize) -> std::io::Result<Ring> {
        let len = off.desc as usize + RING_SIZE as usize * entry;
        // SAFETY: a shared mapping of the socket's ring, which the kernel sized on setsockopt.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let at = |o: u64| (map as *mut u8).wrapping_add(o as usize);
        Ok(Ring {
            map,
            len,
            producer: at(off.producer) as *const AtomicU32,
            consumer: at(off.consumer) as *const AtomicU32,
            flags: at(off.flags) as *const AtomicU32,
            desc: at(off.desc),
            mask: RING_SIZE - 1,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: inside the live mapping, 4-byte aligned (the kernel's layout).
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: as above.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Entry `i` (masked) as a pointer to `T`.
    fn slot<T>(&self, i: u32) -> *mut T {
        self.desc.wrapping_add((i & self.mask) as usize * std::mem::size_of::<T>()) as *mut T
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping what `map` mapped.
        unsafe { libc::munmap(self.map, self.len) };
    }
}

/// What both halves of a socket share: the descriptor and the UMEM (unmapped
/// after the descriptor closes, when the last half goes).
struct Core {
    fd: OwnedFd,
    umem: *mut u8,
    umem_len: usize,
    mode: XskMode,
    queue: u32,
}

// The UMEM pointer is our own mapping; each half touches only its own frames.
unsafe impl Send for Core {}
unsafe impl Sync for Core {}

impl Drop for Core {
    fn drop(&mut self) {
        // SAFETY: the UMEM mapping made in Xsk::open (the kernel holds its own page references).
        unsafe { libc::munmap(self.umem as *mut libc::c_void, self.umem_len) };
    }
}

impl Core {
    /// Frame bytes at `addr`.
    #[allow(clippy::mut_from_ref)]
    fn frame(&self, addr: u64, len: usize) -> &mut [u8] {
        let a = addr as usize;
        assert!(a + len <= self.umem_len, "frame {a}+{len} outside the UMEM");
        // SAFETY: inside our UMEM (checked); the frame belongs to the calling
        // half (handed over by the kernel or taken from its free list), and
        // the borrow ends before the frame goes back.
        unsafe { std::slice::from_raw_parts_mut(self.umem.add(a), len) }
    }
}

/// The receiving half of an AF_XDP socket: the RX and fill rings.
pub struct XskRx {
    core: Arc<Core>,
    fill: Ring,
    rx: Ring,
    rx_frames: u64,
}

/// The sending half: the TX and completion rings and the free frames.
pub struct XskTx {
    core: Arc<Core>,
    comp: Ring,
    tx: Ring,
    free: Vec<u64>,
    /// TX descriptors written but not yet published to the kernel.
    pending: u32,
    tx_frames: u64,
    tx_full: u64,
    kicks: u64,
}

// Each half's rings are its own; the kernel is the other side of each.
unsafe impl Send for XskRx {}
unsafe impl Send for XskTx {}

/// One AF_XDP socket bound to one queue of an interface (both halves; see
/// [`Xsk::split`] to give them to two owners).
pub struct Xsk {
    rx: XskRx,
    tx: XskTx,
}

impl std::fmt::Debug for Xsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xsk").field("mode", &self.rx.core.mode).field("queue", &self.rx.core.queue).finish()
    }
}

fn os(what: &str) -> impl Fn(std::io::Error) -> XdpError + '_ {
    move |e| {
        if e.raw_os_error() == Some(libc::EPERM) {
            XdpError::Permission(format!("{what}: {e}"))
        } else {
            XdpError::Load(format!("AF_XDP {what}: {e}"))
        }
    }
}

fn setsockopt<T>(fd: i32, opt: i32, v: &T) -> std::io::Result<()> {
    // SAFETY: `v` is a live value of the size given.
    let r = unsafe {
        libc::setsockopt(fd, libc::SOL_XDP, opt, v as *const T as *const libc::c_void, std::mem::size_of::<T>() as u32)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The kernel's counts for socket `fd` (`XDP_STATISTICS`): frames it
/// dropped on receive (no room on the RX ring, or invalid) and the times it
/// found the fill ring empty.
fn kernel_stats(fd: i32) -> Option<XskCounters> {
    // SAFETY: zeroed plain-old-data, filled by getsockopt.
    let mut s: libc::xdp_statistics = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_statistics>() as u32;
    // SAFETY: `s` has `len` bytes of room.
    let r = unsafe {
        libc::getsockopt(fd, libc::SOL_XDP, libc::XDP_STATISTICS, &mut s as *mut _ as *mut libc::c_void, &mut len)
    };
    (r == 0).then(|| XskCounters {
        rx_dropped: s.rx_dropped + s.rx_ring_full,
        rx_fill_empty: s.rx_fill_ring_empty_descs,
        ..XskCounters::default()
    })
}

/// Binds socket `raw` to `queue` of interface `ifindex`: zero-copy, copy
/// mode, or the first of the two the driver takes (`zero_copy` None).
fn bind(raw: i32, ifindex: u32, queue: u32, zero_copy: Option<bool>) -> std::io::Result<XskMode> {
    let tries: &[(u16, XskMode)] = match zero_copy {
        Some(true) => &[(libc::XDP_ZEROCOPY, XskMode::ZeroCopy)],
        Some(false) => &[(libc::XDP_COPY, XskMode::Copy)],
        None => &[(libc::XDP_ZEROCOPY, XskMode::ZeroCopy), (libc::XDP_COPY, XskMode::Copy)],
    };
    let mut last = std::io::Error::other("no mode tried");
    for &(flag, m) in tries {
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flag | libc::XDP_USE_NEED_WAKEUP,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: a sockaddr_xdp of its own size.
        let r = unsafe {
            libc::bind(raw, &sa as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_xdp>() as u32)
        };
        if r == 0 {
            return Ok(m);
        }
        last = std::io::Error::last_os_error();
    }
    Err(last)
}

/// The index of interface `iface` in this thread's namespace.
pub fn ifindex(iface: &str) -> Result<u32, XdpError> {
    let c = std::ffi::CString::new(iface).map_err(|_| XdpError::NoInterface(iface.to_string()))?;
    // SAFETY: a NUL-terminated name.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(XdpError::NoInterface(iface.to_string())),
        i => Ok(i),
    }
}

/// A new AF_XDP socket.
fn xdp_socket() -> Result<OwnedFd, XdpError> {
    // SAFETY: plain socket(2).
    let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        let e = std::io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EAFNOSUPPORT) {
            XdpError::Load("this kernel has no AF_XDP (CONFIG_XDP_SOCKETS)".into())
        } else {
            os("socket")(e)
        });
    }
    // SAFETY: a descriptor we own from here.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Where the kernel put the rings in the socket's mappings.
fn mmap_offsets(raw: libc::c_int) -> Result<libc::xdp_mmap_offsets, XdpError> {
    // SAFETY: zeroed plain-old-data, filled by getsockopt.
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as u32;
    // SAFETY: `off` has `len` bytes of room.
    let r = unsafe {
        libc::getsockopt(raw, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, &mut off as *mut _ as *mut libc::c_void, &mut len)
    };
    if r != 0 {
        return Err(os("ring offsets")(std::io::Error::last_os_error()));
    }
    Ok(off)
}

impl Xsk {
    /// Opens a socket on queue `queue` of `iface`: zero-copy if the driver
    /// can, else copy mode (`zero_copy: Some(true)` insists, `Some(false)`
    /// asks for copy mode).
    pub fn open(iface: &str, queue: u32, zero_copy: Option<bool>) -> Result<Xsk, XdpError> {
        let ifindex = ifindex(iface)?;
        let fd = xdp_socket()?;
        let raw = fd.as_raw_fd();
        let umem_len = (FRAMES * FRAME_SIZE) as usize;
        // SAFETY: an anonymous private mapping of our own.
        let umem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(os("UMEM mmap")(std::io::Error::last_os_error()));
        }
        // From here the core owns the descriptor and the UMEM (dropped in that order).
        let mut core = Core { fd, umem: umem as *mut u8, umem_len, mode: XskMode::Copy, queue };
        let reg = libc::xdp_umem_reg {
            addr: umem as u64,
            len: umem_len as u64,
            chunk_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(raw, libc::XDP_UMEM_REG, &reg).map_err(os("UMEM registration"))?;
        for opt in [libc::XDP_UMEM_FILL_RING, libc::XDP_UMEM_COMPLETION_RING, libc::XDP_RX_RING, libc::XDP_TX_RING] {
            setsockopt(raw, opt, &RING_SIZE).map_err(os("ring size"))?;
        }
        let off = mmap_offsets(raw)?;
        let d = std::mem::size_of::<libc::xdp_desc>();
        let fill = Ring::map(raw, &off.fr, libc::XDP_UMEM_PGOFF_FILL_RING, 8).map_err(os("fill ring mmap"))?;
        let comp =
            Ring::map(raw, &off.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING, 8).map_err(os("completion ring mmap"))?;
        let rx = Ring::map(raw, &off.rx, libc::XDP_PGOFF_RX_RING as u64, d).map_err(os("RX ring mmap"))?;
        let tx = Ring::map(raw, &off.tx, libc::XDP_PGOFF_TX_RING as u32 as u64, d).map_err(os("TX ring mmap"))?;
        // The first half of the frames to the fill ring, the rest free for sending.
        for i in 0..RING_SIZE {
            // SAFETY: a slot of the mapped fill ring; nobody else produces.
            unsafe { fill.slot::<u64>(i).write(u64::from(i * FRAME_SIZE)) };
        }
        fill.producer().store(RING_SIZE, Ordering::Release);
        let free = (RING_SIZE..FRAMES).rev().map(|i| u64::from(i * FRAME_SIZE)).collect();
        let mode = bind(raw, ifindex, queue, zero_copy).map_err(|e| XdpError::Attach {
            iface: iface.to_string(),
            mode: Mode::Native,
            why: format!("binding an AF_XDP socket to queue {queue} failed: {e}"),
        })?;
        core.mode = mode;
        let core = Arc::new(core);
        Ok(Xsk {
            rx: XskRx { core: core.clone(), fill, rx, rx_frames: 0 },
            tx: XskTx { core, comp, tx, free, pending: 0, tx_frames: 0, tx_full: 0, kicks: 0 },
        })
    }

    pub fn mode(&self) -> XskMode {
        self.rx.core.mode
    }

    /// What a loop waits on (readable when the RX ring holds frames).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.rx.fd()
    }

    /// The receiving half (to bind the steering program to).
    pub fn rx_half(&self) -> &XskRx {
        &self.rx
    }

    /// The receiving and the sending half, for two owners (threads).
    pub fn split(self) -> (XskRx, XskTx) {
        (self.rx, self.tx)
    }

    /// Counters, with the kernel's own drop counts.
    pub fn counters(&self) -> XskCounters {
        let mut c = self.rx.counters();
        let t = self.tx.counters();
        (c.tx_frames, c.tx_full, c.kicks) = (t.tx_frames, t.tx_full, t.kicks);
        c
    }

    /// See [`XskRx::recv`].
    pub fn recv(&mut self, f: impl FnMut(&mut [u8])) -> usize {
        self.rx.recv(f)
    }

    /// See [`XskTx::send`].
    pub fn send(&mut self, write: impl FnOnce(&mut [u8]) -> usize) -> bool {
        self.tx.send(write)
    }

    /// See [`XskTx::flush`].
    pub fn flush(&mut self) {
        self.tx.flush()
    }
}

impl XskRx {
    /// What a loop waits on (readable when the RX ring holds frames).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.core.fd.as_fd()
    }

    /// Frames read, and the kernel's receive drop counts (`XDP_STATISTICS`).
    pub fn counters(&self) -> XskCounters {
        let k = kernel_stats(self.core.fd.as_raw_fd()).unwrap_or_default();
        XskCounters { rx_frames: self.rx_frames, ..k }
    }

    /// Hands each received frame to `f` and gives its buffer back to the
    /// kernel; never waits. Returns how many frames.
    pub fn recv(&mut self, mut f: impl FnMut(&mut [u8])) -> usize {
        let prod = self.rx.producer().load(Ordering::Acquire);
        let cons = self.rx.consumer().load(Ordering::Relaxed);
        let n = prod.wrapping_sub(cons);
        if n == 0 {
            return 0;
        }
        let fill_at = self.fill.producer().load(Ordering::Relaxed);
        for k in 0..n {
            // SAFETY: an RX entry the kernel published (below `prod`).
            let d = unsafe { self.rx.slot::<libc::xdp_desc>(cons.wrapping_add(k)).read() };
            let len = (d.len as usize).min(FRAME_SIZE as usize);
            f(self.core.frame(d.addr, len));
            // Back to the fill ring: its frame's base (aligned mode).
            let base = d.addr & !u64::from(FRAME_SIZE - 1);
            // SAFETY: the fill ring has room for every frame we hold (RING_SIZE of them).
            unsafe { self.fill.slot::<u64>(fill_at.wrapping_add(k)).write(base) };
        }
        self.rx.consumer().store(cons.wrapping_add(n), Ordering::Release);
        self.fill.producer().store(fill_at.wrapping_add(n), Ordering::Release);
        if self.fill.needs_wakeup() {
            // SAFETY: a zero-length, non-blocking receive that only wakes the driver.
            unsafe {
                libc::recvfrom(
                    self.core.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
        self.rx_frames += u64::from(n);
        n as usize
    }
}

impl XskTx {
    pub fn counters(&self) -> XskCounters {
        XskCounters { tx_frames: self.tx_frames, tx_full: self.tx_full, kicks: self.kicks, ..XskCounters::default() }
    }

    /// Takes completed frames back into the free list.
    fn reclaim(&mut self) {
        let prod = self.comp.producer().load(Ordering::Acquire);
        let cons = self.comp.consumer().load(Ordering::Relaxed);
        let n = prod.wrapping_sub(cons);
        for k in 0..n {
            // SAFETY: a completion entry the kernel published.
            let a = unsafe { self.comp.slot::<u64>(cons.wrapping_add(k)).read() };
            self.free.push(a & !u64::from(FRAME_SIZE - 1));
        }
        if n > 0 {
            self.comp.consumer().store(cons.wrapping_add(n), Ordering::Release);
        }
    }

    /// Publishes the written TX descriptors and tells the kernel.
    pub fn flush(&mut self) {
        if self.pending > 0 {
            let p = self.tx.producer().load(Ordering::Relaxed);
            self.tx.producer().store(p.wrapping_add(self.pending), Ordering::Release);
            self.pending = 0;
        }
        if self.core.mode == XskMode::Copy || self.tx.needs_wakeup() {
            self.kicks += 1;
            // SAFETY: a zero-length, non-blocking send that starts transmission.
            unsafe {
                libc::sendto(self.core.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0)
            };
        }
        self.reclaim();
    }

    fn ring_room(&self) -> bool {
        let p = self.tx.producer().load(Ordering::Relaxed).wrapping_add(self.pending);
        p.wrapping_sub(self.tx.consumer().load(Ordering::Acquire)) < RING_SIZE
    }

    /// Room for one more TX descriptor and a free frame, reclaiming and
    /// telling the kernel once if needed.
    fn room(&mut self) -> bool {
        if !self.free.is_empty() && self.ring_room() {
            return true;
        }
        self.flush();
        !self.free.is_empty() && self.ring_room()
    }

    /// Sends one frame that `write` fills (returning its length; 0 sends
    /// nothing); false (counted) when the link is full. Frames go out in
    /// batches of [`TX_KICK_EVERY`]; call [`XskTx::flush`] at the end of a turn.
    pub fn send(&mut self, write: impl FnOnce(&mut [u8]) -> usize) -> bool {
        if !self.room() {
            self.tx_full += 1;
            return false;
        }
        let addr = self.free.pop().expect("room() found a free frame");
        let len = write(self.core.frame(addr, FRAME_SIZE as usize)).min(FRAME_SIZE as usize);
        if len == 0 {
            self.free.push(addr);
            return false;
        }
        let p = self.tx.producer().load(Ordering::Relaxed).wrapping_add(self.pending);
        let d = libc::xdp_desc { addr, len: len as u32, options: 0 };
        // SAFETY: a TX slot we own (room() checked the consumer).
        unsafe { self.tx.slot::<libc::xdp_desc>(p).write(d) };
        self.pending += 1;
        self.tx_frames += 1;
        if self.pending as usize >= TX_KICK_EVERY {
            self.flush();
        }
        true
    }
}

/// The XDP program that steers a UDP port to the AF_XDP sockets of an
/// interface; detached when dropped.
pub struct XskSteer {
    ebpf: Ebpf,
    pub mode: Mode,
}

impl std::fmt::Debug for XskSteer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskSteer").field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl XskSteer {
    /// Attaches to `iface` (native mode, or generic where `mode` says),
    /// steering UDP destination `port` to the sockets given to [`XskSteer::bind`].
    pub fn attach(iface: &str, port: u16, mode: Mode) -> Result<XskSteer, XdpError> {
        let mut ebpf = crate::open_object(OBJECT)?;
        crate::set_u32s(&mut ebpf, "ff_xsk_port", &[u32::from(port)])?;
        let mode = crate::attach_in(crate::xdp_program(&mut ebpf, "ff_xdp_xsk")?, iface, &[mode])?;
        Ok(XskSteer { ebpf, mode })
    }

    /// Sends the port's datagrams arriving on `rx`'s queue to it.
    pub fn bind(&mut self, rx: &XskRx) -> Result<(), XdpError> {
        let map = self.ebpf.map_mut("ff_xsks").ok_or_else(|| XdpError::Map("no map ff_xsks".into()))?;
        let mut m: XskMap<_> = XskMap::try_from(map).map_err(|e| XdpError::Map(e.to_string()))?;
        m.set(rx.core.queue, rx.core.fd.as_raw_fd(), 0).map_err(|e| XdpError::Map(e.to_string()))
    }

    /// (steered to a socket, to the port on a queue without one).
    pub fn counters(&self) -> Result<(u64, u64), XdpError> {
        let map = self.ebpf.map("ff_xsk_counters").ok_or_else(|| XdpError::Map("no map ff_xsk_counters".into()))?;
        let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(|e| XdpError::Map(e.to_string()))?;
        let get = |k: u32| arr.get(&k, 0).map(|v| v.iter().sum::<u64>()).map_err(|e| XdpError::Map(e.to_string()));
        Ok((get(0)?, get(1)?))
    }
}

/// A node's AF_XDP back-end on one interface: the steering program, the
/// socket's two halves as fairfeed-io's external back-end, and counters.
/// Datagrams to the node's port on queue 0 arrive through the socket. On an
/// interface with more receive queues, the port's datagrams that the NIC
/// hashes to another queue pass to the kernel stack (the steering program
/// has no socket there), and the receive half reads them from the node's
/// own UDP socket (`rx_via_kernel`): none is lost, those take the slower
/// path. Steering the port's flows to queue 0 (`ethtool -N IFACE flow-type
/// udp4 dst-port PORT action 0`) keeps every datagram on the fast path;
/// everything the node sends leaves as frames on the TX ring, but for a
/// next hop whose MAC the kernel has not resolved yet: that one datagram
/// goes through the node's own UDP socket (which makes the kernel resolve
/// it) and is counted.
pub struct NodeIo {
    pub recv: NodeRecv,
    pub send: NodeSend,
    pub stats: Arc<NodeStats>,
}

/// Counters of a node's AF_XDP back-end.
#[derive(Debug, Default)]
pub struct NodeStats {
    pub rx_frames: std::sync::atomic::AtomicU64,
    /// Frames that were not a whole UDP/IPv4 datagram (dropped).
    pub rx_malformed: std::sync::atomic::AtomicU64,
    pub tx_frames: std::sync::atomic::AtomicU64,
    /// Datagrams read from the node's UDP socket: they arrived on a receive
    /// queue without an AF_XDP socket (an interface with several).
    pub rx_via_kernel: std::sync::atomic::AtomicU64,
    /// Datagrams sent through the kernel socket: next hop not yet resolved.
    pub tx_via_kernel: std::sync::atomic::AtomicU64,
    /// Datagrams not sent: the TX ring full, a payload over a frame, or not IPv4.
    pub tx_dropped: std::sync::atomic::AtomicU64,
    pub kicks: std::sync::atomic::AtomicU64,
    /// The socket (a duplicate descriptor), for the kernel's own counts.
    socket: Option<OwnedFd>,
}

impl NodeStats {
    /// The counters as JSON (a node's `stat` and metrics).
    pub fn json(&self, mode: XskMode) -> serde_json::Value {
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let k = self.socket.as_ref().and_then(|fd| kernel_stats(fd.as_raw_fd())).unwrap_or_default();
        serde_json::json!({
            "rx_dropped_in_kernel": k.rx_dropped,
            "rx_fill_empty": k.rx_fill_empty,
            "mode": mode,
            "rx_frames": g(&self.rx_frames),
            "rx_malformed": g(&self.rx_malformed),
            "rx_via_kernel": g(&self.rx_via_kernel),
            "tx_frames": g(&self.tx_frames),
            "tx_via_kernel": g(&self.tx_via_kernel),
            "tx_dropped": g(&self.tx_dropped),
            "kicks": g(&self.kicks),
        })
    }
}

/// The receiving half of [`NodeIo`] (keeps the steering program attached).
pub struct NodeRecv {
    rx: XskRx,
    _steer: XskSteer,
    stats: Arc<NodeStats>,
    /// The node's socket's reader, on an interface with several receive queues.
    kernel: Option<Box<fairfeed_io::batch::BatchRecv>>,
    /// Calls since the node's socket was last read.
    since_kernel: u32,
}

/// With several receive queues, the node's socket is read at least every
/// this many calls while AF_XDP frames keep coming (and on every call that
/// finds none).
const KERNEL_READ_EVERY: u32 = 8;

/// Receive queues of `iface` in the calling thread's namespace (ethtool's
/// channels: receive-only plus combined; sysfs shows the mounting
/// process's namespace); `None` where the driver does not say.
pub fn rx_queues(iface: &str) -> Option<u32> {
    /// `struct ethtool_channels`.
    #[repr(C)]
    #[derive(Default)]
    struct Channels {
        cmd: u32,
        max_rx: u32,
        max_tx: u32,
        max_other: u32,
        max_combined: u32,
        rx_count: u32,
        tx_count: u32,
        other_count: u32,
        combined_count: u32,
    }
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    let name = iface.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return None;
    }
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    let mut ch = Channels { cmd: ETHTOOL_GCHANNELS, ..Channels::default() };
    // SAFETY: zeroed plain-old-data.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, &c) in req.ifr_name.iter_mut().zip(name) {
        *d = c as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&mut ch as *mut Channels).cast();
    // SAFETY: SIOCETHTOOL reads the name and the command, and writes `ch`,
    // which lives across the call.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    (r == 0).then(|| (ch.rx_count + ch.combined_count).max(1))
}

/// The sending half of [`NodeIo`].
pub struct NodeSend {
    tx: XskTx,
    headers: UdpHeaders,
    iface: String,
    macs: std::collections::HashMap<Ipv4Addr, [u8; 6]>,
    stats: Arc<NodeStats>,
}

// The steering program's handles are only dropped, never used across threads.
unsafe impl Send for NodeRecv {}

impl NodeIo {
    /// Attaches the steering program for `addr`'s port to `iface` (`mode`)
    /// and opens the socket on its queue 0 (zero-copy where the driver can).
    pub fn open(iface: &str, addr: SocketAddrV4, mode: Mode) -> Result<NodeIo, XdpError> {
        let xsk = Xsk::open(iface, 0, None)?;
        let mut steer = XskSteer::attach(iface, addr.port(), mode)?;
        steer.bind(xsk.rx_half())?;
        let headers = UdpHeaders { src_mac: mac_of(iface)?, src: addr };
        let (rx, tx) = xsk.split();
        let socket = rx.core.fd.try_clone().ok();
        let stats = Arc::new(NodeStats { socket, ..NodeStats::default() });
        // Kernel receive stamps for what takes the kernel's path (where the socket has them on).
        // A driver that does not say how many queues it has may have several.
        let kernel = (rx_queues(iface) != Some(1)).then(|| Box::new(fairfeed_io::batch::BatchRecv::new(true)));
        Ok(NodeIo {
            recv: NodeRecv { rx, _steer: steer, stats: stats.clone(), kernel, since_kernel: 0 },
            send: NodeSend { tx, headers, iface: iface.to_string(), macs: Default::default(), stats: stats.clone() },
            stats,
        })
    }

    pub fn mode(&self) -> XskMode {
        self.recv.rx.core.mode
    }
}

impl fairfeed_io::send::ExternalRecv for NodeRecv {
    fn recv_stamped(&mut self, sock: &std::net::UdpSocket, f: &mut dyn FnMut(&mut [u8], Option<u64>)) -> usize {
        let (mut good, mut bad) = (0usize, 0u64);
        self.rx.recv(|frame| match parse_udp(frame) {
            Ok((_, p)) => {
                good += 1;
                f(p, None)
            }
            Err(_) => bad += 1,
        });
        self.stats.rx_frames.fetch_add(good as u64 + bad, Ordering::Relaxed);
        if bad > 0 {
            self.stats.rx_malformed.fetch_add(bad, Ordering::Relaxed);
        }
        if let Some(k) = self.kernel.as_mut() {
            self.since_kernel += 1;
            if good == 0 || self.since_kernel >= KERNEL_READ_EVERY {
                self.since_kernel = 0;
                let n = k.recv_stamped(sock, |b, stamp| f(b, stamp));
                self.stats.rx_via_kernel.fetch_add(n as u64, Ordering::Relaxed);
                good += n;
            }
        }
        good
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.rx.fd()
    }

    fn reads_socket(&self) -> bool {
        self.kernel.is_some()
    }
}

impl NodeSend {
    /// The next hop's MAC for `ip`, from the kernel's tables (cached).
    fn mac(&mut self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        if let Some(m) = self.macs.get(&ip) {
            return Some(*m);
        }
        let (dev, hop) = crate::neigh::route(ip)?;
        if dev != self.iface {
            return None;
        }
        let m = crate::neigh::neighbour(hop, &self.iface)?;
        self.macs.insert(ip, m);
        Some(m)
    }
}

impl fairfeed_io::send::ExternalSend for NodeSend {
    fn send(
        &mut self,
        sock: &std::net::UdpSocket,
        items: &mut dyn Iterator<Item = (&[u8], std::net::SocketAddr)>,
    ) -> fairfeed_io::batch::Sent {
        let mut out = fairfeed_io::batch::Sent::default();
        let kicks = self.tx.kicks;
        for (bytes, to) in items {
            let std::net::SocketAddr::V4(to) = to else {
                out.failed += 1;
                self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let Some(mac) = self.mac(*to.ip()) else {
                // Not resolved yet: the kernel sends this one (and resolves the hop).
                match sock.send_to(bytes, to) {
                    Ok(_) => out.sent += 1,
                    Err(_) => out.failed += 1,
                }
                self.stats.tx_via_kernel.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let s = sum(bytes);
            let h = self.headers;
            if self.tx.send(|f| h.write(f, mac, to, bytes, s)) {
                out.sent += 1;
            } else {
                out.failed += 1;
                self.stats.tx_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.tx.flush();
        self.stats.tx_frames.store(self.tx.tx_frames, Ordering::Relaxed);
        self.stats.kicks.store(self.tx.kicks, Ordering::Relaxed);
        out.calls += self.tx.kicks - kicks;
        out
    }
}

/// The MAC address of `iface` in the calling thread's namespace
/// (`SIOCGIFHWADDR`; sysfs shows the mounting process's namespace).
pub fn mac_of(iface: &str) -> Result<[u8; 6], XdpError> {
    let none = || XdpError::NoInterface(iface.to_string());
    let name = iface.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(none());
    }
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|_| none())?;
    // SAFETY: zeroed plain-old-data.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, &c) in req.ifr_name.iter_mut().zip(name) {
        *d = c as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR reads the NUL-terminated name and writes the union.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) };
    if r != 0 {
        return Err(none());
    }
    // SAFETY: the union's hardware-address member, which the call filled.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (m, &d) in mac.iter_mut().zip(&data[..6]) {
        *m = d as u8;
    }
    Ok(mac)
}

/// Ones'-complement sum of `b` (RFC 1071), not yet folded.
pub fn sum(b: &[u8]) -> u32 {
    let mut s = 0u32;
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        s += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        s += u32::from(*last) << 8;
    }
    s
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The fixed part of a node's frames: its own MAC, address and port.
#[derive(Debug, Clone, Copy)]
pub struct UdpHeaders {
    pub src_mac: [u8; 6],
    pub src: SocketAddrV4,
}

impl UdpHeaders {
    /// Writes an Ethernet/IPv4/UDP frame of `payload` to `dst` (next hop
    /// `dst_mac`) into `frame`; `payload_sum` is [`sum`] of the payload.
    /// Returns the frame's length, 0 if the payload does not fit.
    pub fn write(
        &self,
        frame: &mut [u8],
        dst_mac: [u8; 6],
        dst: SocketAddrV4,
        payload: &[u8],
        payload_sum: u32,
    ) -> usize {
        let total = HEADERS + payload.len();
        if payload.len() > PAYLOAD_MAX || frame.len() < total {
            return 0;
        }
        frame[0..6].copy_from_slice(&dst_mac);
        frame[6..12].copy_from_slice(&self.src_mac);
        frame[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut frame[14..34];
        let ip_len = (20 + 8 + payload.len()) as u16;
        ip[0] = 0x45;
        ip[1] = 0;
        ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
        ip[4..6].copy_from_slice(&[0, 0]);
        ip[6..8].copy_from_slice(&[0x40, 0]); // don't fragment
        ip[8] = 64;
        ip[9] = 17;
        ip[10..12].copy_from_slice(&[0, 0]);
        ip[12..16].copy_from_slice(&self.src.ip().octets());
        ip[16..20].copy_from_slice(&dst.ip().octets());
        let c = !fold(sum(ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let udp_len = (8 + payload.len()) as u16;
        let u = &mut frame[34..42];
        u[0..2].copy_from_slice(&self.src.port().to_be_bytes());
        u[2..4].copy_from_slice(&dst.port().to_be_bytes());
        u[4..6].copy_from_slice(&udp_len.to_be_bytes());
        u[6..8].copy_from_slice(&[0, 0]);
        // Pseudo-header + UDP header + payload.
        let s = sum(&self.src.ip().octets())
            + sum(&dst.ip().octets())
            + 17
            + u32::from(udp_len)
            + sum(&frame[34..42])
            + payload_sum;
        let mut c = !fold(s);
        if c == 0 {
            c = 0xffff;
        }
        frame[40..42].copy_from_slice(&c.to_be_bytes());
        frame[42..total].copy_from_slice(payload);
        total
    }
}

/// Why a received frame was not a datagram for us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    Short,
    NotIpv4,
    NotUdp,
    Fragment,
    BadLength,
}

/// The UDP datagram in an Ethernet/IPv4 frame: its source and payload
/// (by the UDP length: short frames are padded to 60 bytes on the wire).
pub fn parse_udp(frame: &mut [u8]) -> Result<(SocketAddrV4, &mut [u8]), FrameError> {
    if frame.len() < HEADERS {
        return Err(FrameError::Short);
    }
    if frame[12..14] != [0x08, 0x00] || frame[14] >> 4 != 4 {
        return Err(FrameError::NotIpv4);
    }
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    if ihl < 20 || frame.len() < 14 + ihl + 8 {
        return Err(FrameError::Short);
    }
    if frame[23] != 17 {
        return Err(FrameError::NotUdp);
    }
    if u16::from_be_bytes([frame[20], frame[21]]) & 0x3fff != 0 {
        return Err(FrameError::Fragment);
    }
    let src_ip = Ipv4Addr::new(frame[26], frame[27], frame[28], frame[29]);
    let u = 14 + ihl;
    let src_port = u16::from_be_bytes([frame[u], frame[u + 1]]);
    let udp_len = usize::from(u16::from_be_bytes([frame[u + 4], frame[u + 5]]));
    if udp_len < 8 || u + udp_len > frame.len() {
        return Err(FrameError::BadLength);
    }
    Ok((SocketAddrV4::new(src_ip, src_port), &mut frame[u + 8..u + udp_len]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_with_valid_checksums() {
        let h = UdpHeaders { src_mac: [2, 0, 0, 0, 0, 1], src: "10.1.2.3:4000".parse().unwrap() };
        for n in [0usize, 1, 17, 18, 1400, PAYLOAD_MAX] {
            let payload: Vec<u8> = (0..n).map(|i| (i * 31 + 7) as u8).collect();
            let mut f = vec![0u8; FRAME_SIZE as usize];
            let dst: SocketAddrV4 = "10.9.8.7:26477".parse().unwrap();
            let len = h.write(&mut f, [2, 0, 0, 0, 0, 2], dst, &payload, sum(&payload));
            assert_eq!(len, HEADERS + n);
            // The IPv4 header sums to 0xffff; so do pseudo-header + UDP datagram.
            assert_eq!(fold(sum(&f[14..34])), 0xffff);
            let udp_len = (8 + n) as u32;
            let s = sum(&f[26..34]) + 17 + udp_len + sum(&f[34..len]);
            assert_eq!(fold(s), 0xffff, "UDP checksum, payload {n}");
            let (src, p) = parse_udp(&mut f[..len.max(60)]).unwrap();
            assert_eq!(src, h.src);
            assert_eq!(p, &payload[..]);
        }
        let mut big = vec![0u8; FRAME_SIZE as usize];
        assert_eq!(h.write(&mut big, [0; 6], "1.2.3.4:5".parse().unwrap(), &[0; PAYLOAD_MAX + 1], 0), 0);
    }

    #[test]
    fn parse_refuses_what_is_not_a_whole_udp_datagram() {
        let h = UdpHeaders { src_mac: [2, 0, 0, 0, 0, 1], src: "10.1.2.3:4000".parse().unwrap() };
        let mut f = vec![0u8; 200];
        let len = h.write(&mut f, [0; 6], "10.0.0.1:9".parse().unwrap(), &[1; 50], sum(&[1; 50]));
        assert_eq!(parse_udp(&mut f[..20]).unwrap_err(), FrameError::Short);
        let mut g = f.clone();
        g[12] = 0x86;
        assert_eq!(parse_udp(&mut g[..len]).unwrap_err(), FrameError::NotIpv4);
        let mut g = f.clone();
        g[23] = 6;
        assert_eq!(parse_udp(&mut g[..len]).unwrap_err(), FrameError::NotUdp);
        let mut g = f.clone();
        g[21] = 1;
        assert_eq!(parse_udp(&mut g[..len]).unwrap_err(), FrameError::Fragment);
        assert_eq!(parse_udp(&mut f[..len - 1]).unwrap_err(), FrameError::BadLength);
        // Every truncation and every single-byte corruption: an answer, never a panic.
        for cut in 0..len {
            let _ = parse_udp(&mut f.clone()[..cut]);
        }
        for i in 0..len {
            let mut g = f.clone();
            g[i] ^= 0xff;
            let _ = parse_udp(&mut g[..len]);
        }
    }
}
