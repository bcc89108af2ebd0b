//! io_uring as a send back-end: a batch of `(bytes, address)` pairs becomes
//! one `IORING_OP_SENDMSG` submission per datagram, submitted together with
//! one `io_uring_enter(2)` that also waits for their completions — the same
//! contract as [`crate::batch::BatchSend`], so a shell can take either
//! ([`crate::send::SendPath`]).
//!
//! The kernel reads each message header, its iovec and its address from
//! memory this type owns, and the payload from the caller's buffer, after
//! `push` and before the completion: [`UringSend::send`] waits for every
//! completion of a batch before it returns, and nothing here moves while a
//! batch is in flight. That is the whole of the `unsafe` argument.
#![allow(unsafe_code)]

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use io_uring::{opcode, types, IoUring};

use crate::batch::Sent;

/// Datagrams per submission at most (and the ring's size).
pub const URING_BATCH_MAX: usize = 64;

/// A ring and the per-datagram headers it sends from.
pub struct UringSend {
    ring: IoUring,
    addrs: Box<[libc::sockaddr_in; URING_BATCH_MAX]>,
    iovs: Box<[libc::iovec; URING_BATCH_MAX]>,
    hdrs: Box<[libc::msghdr; URING_BATCH_MAX]>,
}

impl std::fmt::Debug for UringSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringSend").finish_non_exhaustive()
    }
}

fn sockaddr(a: std::net::SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
        sin_zero: [0; 8],
    }
}

impl UringSend {
    /// A ring of [`URING_BATCH_MAX`] entries; fails where the kernel has no
    /// io_uring (or it is disabled: `kernel.io_uring_disabled`).
    pub fn new() -> std::io::Result<UringSend> {
        let ring = IoUring::new(URING_BATCH_MAX as u32)?;
        // SAFETY: all-zero is a valid value of these plain C structs.
        let zero_hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        Ok(UringSend {
            ring,
            addrs: Box::new(
                [sockaddr(std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0)); URING_BATCH_MAX],
            ),
            iovs: Box::new([libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; URING_BATCH_MAX]),
            hdrs: Box::new([zero_hdr; URING_BATCH_MAX]),
        })
    }

    /// Sends each `(bytes, to)` pair, [`URING_BATCH_MAX`] per submission; IPv4
    /// only (others are counted failed). A datagram the socket refuses
    /// (`EAGAIN`: its buffer full) is counted failed, as with `sendmmsg`.
    pub fn send<'b>(&mut self, sock: &UdpSocket, items: impl IntoIterator<Item = (&'b [u8], SocketAddr)>) -> Sent {
        let mut out = Sent::default();
        let mut n = 0;
        for (bytes, to) in items {
            let SocketAddr::V4(v4) = to else {
                out.failed += 1;
                continue;
            };
            self.addrs[n] = sockaddr(v4);
            self.iovs[n] = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
            let h = &mut self.hdrs[n];
            h.msg_name = (&raw mut self.addrs[n]).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_iov = &raw mut self.iovs[n];
            h.msg_iovlen = 1;
            n += 1;
            if n == URING_BATCH_MAX {
                self.flush(sock, n, &mut out);
                n = 0;
            }
        }
        if n > 0 {
            self.flush(sock, n, &mut out);
        }
        out
    }

    fn flush(&mut self, sock: &UdpSocket, n: usize, out: &mut Sent) {
        let fd = types::Fd(sock.as_raw_fd());
        let mut pushed = 0;
        {
            let mut sq = self.ring.submission();
            for i in 0..n {
                let e = opcode::SendMsg::new(fd, &raw const self.hdrs[i]).build().user_data(i as u64);
                // SAFETY: the header, its iovec, its address and the payload
                // stay where they are until the completions are reaped below.
                if unsafe { sq.push(&e) }.is_err() {
                    break;
                }
                pushed += 1;
            }
        }
        out.failed += (n - pushed) as u64;
        if pushed == 0 {
            return;
        }
        out.calls += 1;
        let mut done = 0;
        while done < pushed {
            if let Err(e) = self.ring.submit_and_wait(pushed - done) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // The ring is broken: wait for nothing more, count the rest failed.
                out.failed += (pushed - done) as u64;
                return;
            }
            for c in self.ring.completion() {
                done += 1;
                if c.result() >= 0 {
                    out.sent += 1;
                } else {
                    out.failed += 1;
                }
            }
        }
    }
}

/// Receives posted at once, each with a datagram buffer of its own.
pub const URING_RECV_SLOTS: usize = 32;
/// Control-message room per receive: one `SCM_TIMESTAMPNS` (a `timespec`).
const CMSG_ROOM: usize = 64;

/// A ring for receiving. Completions of receives are finished by task work
/// of the ring's thread; by default the kernel interrupts a thread busy in
/// user space to run it (measured: ≈ 21 µs late on a spinning loop).
/// Cooperatively it only raises a flag in the ring, which
/// [`run_task_work`] answers with one io_uring_enter(2).
fn recv_ring(entries: u32) -> std::io::Result<IoUring> {
    IoUring::builder().setup_coop_taskrun().setup_taskrun_flag().build(entries).or_else(|_| IoUring::new(entries))
}

/// With no completion waiting but task work pending, lets it run.
fn run_task_work(ring: &mut IoUring) {
    if ring.completion().is_empty() && ring.submission().taskrun() {
        let _ = ring.submit();
    }
}

/// io_uring as a receive back-end: [`URING_RECV_SLOTS`] `IORING_OP_RECVMSG`
/// operations stay posted on the socket, each into a buffer of its own; a
/// completion hands its datagram (and the kernel's receive stamp, when the
/// socket has them) to the caller, and the slot is posted again. The ring's
/// descriptor becomes readable when completions wait, so a loop parks on it
/// instead of the socket (which io_uring now reads).
///
/// Like [`UringSend`], every pointer the kernel holds points into boxes this
/// type owns, which never move; unlike a send, a posted receive outlives a
/// call, so dropping the receiver first cancels what is posted and waits for
/// the cancellations before the buffers go.
pub struct UringRecv {
    ring: IoUring,
    /// A descriptor of its own for the socket, open until the receives are cancelled.
    _sock: UdpSocket,
    fd: std::os::fd::RawFd,
    bufs: Box<[[u8; crate::batch::DATAGRAM_MAX]]>,
    addrs: Box<[libc::sockaddr_in; URING_RECV_SLOTS]>,
    iovs: Box<[libc::iovec; URING_RECV_SLOTS]>,
    cmsgs: Box<[[u64; CMSG_ROOM / 8]; URING_RECV_SLOTS]>,
    hdrs: Box<[libc::msghdr; URING_RECV_SLOTS]>,
    posted: usize,
}

impl std::fmt::Debug for UringRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringRecv").field("posted", &self.posted).finish_non_exhaustive()
    }
}

impl UringRecv {
    /// Posts the receives on `sock` (on a descriptor of its own).
    pub fn new(sock: &UdpSocket) -> std::io::Result<UringRecv> {
        let ring = recv_ring((2 * URING_RECV_SLOTS) as u32)?;
        // SAFETY: all-zero is a valid value of these plain C structs.
        let zero_hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        let zero_addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let sock = sock.try_clone()?;
        let mut r = UringRecv {
            ring,
            fd: sock.as_raw_fd(),
            _sock: sock,
            bufs: vec![[0u8; crate::batch::DATAGRAM_MAX]; URING_RECV_SLOTS].into_boxed_slice(),
            addrs: Box::new([zero_addr; URING_RECV_SLOTS]),
            iovs: Box::new([libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; URING_RECV_SLOTS]),
            cmsgs: Box::new([[0u64; CMSG_ROOM / 8]; URING_RECV_SLOTS]),
            hdrs: Box::new([zero_hdr; URING_RECV_SLOTS]),
            posted: 0,
        };
        for i in 0..URING_RECV_SLOTS {
            r.post(i)?;
        }
        r.ring.submit()?;
        Ok(r)
    }

    /// The ring's descriptor: readable when completions wait.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the ring's descriptor is open for as long as `self` (the borrow's lifetime).
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.ring.as_raw_fd()) }
    }

    fn post(&mut self, i: usize) -> std::io::Result<()> {
        self.iovs[i] = libc::iovec { iov_base: self.bufs[i].as_mut_ptr().cast(), iov_len: crate::batch::DATAGRAM_MAX };
        let h = &mut self.hdrs[i];
        h.msg_name = (&raw mut self.addrs[i]).cast();
        h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        h.msg_iov = &raw mut self.iovs[i];
        h.msg_iovlen = 1;
        h.msg_control = self.cmsgs[i].as_mut_ptr().cast();
        h.msg_controllen = CMSG_ROOM;
        h.msg_flags = 0;
        let e = opcode::RecvMsg::new(types::Fd(self.fd), &raw mut self.hdrs[i]).build().user_data(i as u64);
        // SAFETY: the header, iovec, address, control room and buffer of slot
        // `i` are boxed here and stay put until its completion is reaped (or
        // the receive is cancelled in `drop`).
        unsafe { self.ring.submission().push(&e) }
            .map_err(|_| std::io::Error::other("io_uring submission queue full"))?;
        self.posted += 1;
        Ok(())
    }

    /// The kernel's receive stamp in slot `i`'s control messages (CLOCK_REALTIME ns).
    fn stamp(&self, i: usize) -> Option<u64> {
        let h = &self.hdrs[i];
        // SAFETY: the kernel wrote `msg_controllen` bytes of well-formed
        // control messages into slot i's room; the CMSG_* macros walk them.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(h);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let t = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                    return Some(t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64);
                }
                c = libc::CMSG_NXTHDR(h, c);
            }
        }
        None
    }

    /// Hands every datagram completed so far to `f` (with its kernel receive
    /// stamp, when the socket has [`crate::batch::enable_rx_timestamps`]),
    /// posts their slots again, and returns how many there were. Never waits.
    pub fn recv_stamped(&mut self, mut f: impl FnMut(&mut [u8], Option<u64>)) -> usize {
        let mut done: [(usize, i32); URING_RECV_SLOTS] = [(0, 0); URING_RECV_SLOTS];
        let mut k = 0;
        run_task_work(&mut self.ring);
        for c in self.ring.completion() {
            if k < URING_RECV_SLOTS {
                done[k] = (c.user_data() as usize, c.result());
                k += 1;
            }
        }
        let mut n = 0;
        for &(i, res) in &done[..k] {
            self.posted -= 1;
            if i >= URING_RECV_SLOTS {
                continue;
            }
            if res >= 0 {
                let len = (res as usize).min(crate::batch::DATAGRAM_MAX);
                let stamp = self.stamp(i);
                f(&mut self.bufs[i][..len], stamp);
                n += 1;
            }
            let _ = self.post(i);
        }
        if k > 0 {
            let _ = self.ring.submit();
        }
        n
    }
}

impl Drop for UringRecv {
    fn drop(&mut self) {
        // Cancel every posted receive and wait for them all before the buffers go.
        let e =
            opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(self.fd)).all()).build().user_data(u64::MAX);
        // SAFETY: the cancel request carries no pointer.
        if unsafe { self.ring.submission().push(&e) }.is_err() {
            return;
        }
        let mut left = self.posted + 1;
        while left > 0 {
            if self.ring.submit_and_wait(1).is_err() {
                // Cannot wait: leak the buffers rather than free what the kernel may still write.
                std::mem::forget(std::mem::take(&mut self.bufs));
                return;
            }
            left -= self.ring.completion().count().min(left);
        }
    }
}

/// Buffers of the multishot receiver's provided-buffer ring (a power of two).
pub const MULTI_BUFS: u16 = 64;
const MULTI_GROUP: u16 = 0x0ff0;
const MULTI_USER: u64 = 1;
const CANCEL_USER: u64 = 2;
/// One provided buffer: the kernel's `io_uring_recvmsg_out` header, the
/// source address, the control room, the datagram.
const MULTI_BUF_SIZE: usize = 16 + std::mem::size_of::<libc::sockaddr_in>() + CMSG_ROOM + crate::batch::DATAGRAM_MAX;
const _: () = assert!(MULTI_BUFS.is_power_of_two());

/// Receives with one multishot `IORING_OP_RECVMSG` (Linux ≥ 6.0): the
/// kernel picks a buffer from a ring of [`MULTI_BUFS`] provided buffers for
/// each datagram and keeps the request armed, so nothing is re-posted per
/// datagram; a buffer goes back to the ring once its datagram is handed on.
/// [`crate::send::RecvPath`] takes it where the kernel has it, else
/// [`UringRecv`].
pub struct UringMultiRecv {
    ring: IoUring,
    _sock: UdpSocket,
    fd: std::os::fd::RawFd,
    /// The provided-buffer ring (page-aligned, shared with the kernel).
    bufring: *mut types::BufRingEntry,
    bufring_len: usize,
    bufs: Box<[u8]>,
    /// The template: name and control sizes the kernel lays each buffer out by.
    hdr: Box<libc::msghdr>,
    tail: u16,
    armed: bool,
}

// The raw pointer is our own mapping, used by the owning thread only.
unsafe impl Send for UringMultiRecv {}

impl std::fmt::Debug for UringMultiRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringMultiRecv").field("armed", &self.armed).finish_non_exhaustive()
    }
}

impl UringMultiRecv {
    /// Registers the buffer ring and arms the receive on `sock` (a descriptor
    /// of its own); fails where the kernel has no multishot receive.
    pub fn new(sock: &UdpSocket) -> std::io::Result<UringMultiRecv> {
        let ring = recv_ring(2 * u32::from(MULTI_BUFS))?;
        let bufring_len = 4096usize.max(usize::from(MULTI_BUFS) * std::mem::size_of::<types::BufRingEntry>());
        // SAFETY: an anonymous private mapping of our own (page-aligned, as the kernel requires).
        let mem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bufring_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mem == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: all-zero is a valid msghdr.
        let mut hdr: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        hdr.msg_controllen = CMSG_ROOM;
        let sock = sock.try_clone()?;
        let mut r = UringMultiRecv {
            ring,
            fd: sock.as_raw_fd(),
            _sock: sock,
            bufring: mem.cast(),
            bufring_len,
            bufs: vec![0u8; usize::from(MULTI_BUFS) * MULTI_BUF_SIZE].into_boxed_slice(),
            hdr,
            tail: 0,
            armed: false,
        };
        // SAFETY: the ring memory is page-aligned, zeroed, MULTI_BUFS entries, and outlives the registration.
        unsafe { r.ring.submitter().register_buf_ring_with_flags(r.bufring as u64, MULTI_BUFS, MULTI_GROUP, 0) }?;
        for bid in 0..MULTI_BUFS {
            r.give_back(bid);
        }
        r.publish();
        r.arm()?;
        r.ring.submit()?;
        Ok(r)
    }

    /// Puts buffer `bid` on the ring (published by [`Self::publish`]).
    fn give_back(&mut self, bid: u16) {
        let i = usize::from(self.tail & (MULTI_BUFS - 1));
        let addr = self.bufs[usize::from(bid) * MULTI_BUF_SIZE..].as_mut_ptr() as u64;
        // SAFETY: entry `i` of our ring mapping; the kernel reads entries only up to the published tail.
        let e = unsafe { &mut *self.bufring.add(i) };
        e.set_addr(addr);
        e.set_len(MULTI_BUF_SIZE as u32);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&self) {
        // SAFETY: the tail field of the ring's first entry, 2-byte aligned, in our mapping.
        let tail = unsafe { &*(types::BufRingEntry::tail(self.bufring).cast::<std::sync::atomic::AtomicU16>()) };
        tail.store(self.tail, std::sync::atomic::Ordering::Release);
    }

    fn arm(&mut self) -> std::io::Result<()> {
        let e = opcode::RecvMsgMulti::new(types::Fd(self.fd), &raw const *self.hdr, MULTI_GROUP)
            .build()
            .user_data(MULTI_USER);
        // SAFETY: the template header is boxed and lives as long as the request (cancelled in drop).
        unsafe { self.ring.submission().push(&e) }
            .map_err(|_| std::io::Error::other("io_uring submission queue full"))?;
        self.armed = true;
        Ok(())
    }

    /// The ring's descriptor: readable when completions wait.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the ring's descriptor is open for as long as `self`.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.ring.as_raw_fd()) }
    }

    /// Hands every datagram received so far to `f` with its kernel stamp
    /// (when the socket has them enabled); never waits.
    pub fn recv_stamped(&mut self, mut f: impl FnMut(&mut [u8], Option<u64>)) -> usize {
        run_task_work(&mut self.ring);
        let mut done: [(u64, i32, u32); MULTI_BUFS as usize] = [(0, 0, 0); MULTI_BUFS as usize];
        let mut k = 0;
        let mut cq = self.ring.completion();
        // Take no more than there is room for: the rest stay queued for the next call.
        while k < done.len() {
            let Some(c) = cq.next() else { break };
            done[k] = (c.user_data(), c.result(), c.flags());
            k += 1;
        }
        drop(cq);
        let mut n = 0;
        let mut returned = false;
        for &(user, res, flags) in &done[..k] {
            if user != MULTI_USER {
                continue;
            }
            if !io_uring::cqueue::more(flags) {
                self.armed = false;
            }
            let Some(bid) = io_uring::cqueue::buffer_select(flags) else { continue };
            if res >= 0 && bid < MULTI_BUFS {
                let start = usize::from(bid) * MULTI_BUF_SIZE;
                let len = (res as usize).min(MULTI_BUF_SIZE);
                let (off, plen, stamp) = match types::RecvMsgOut::parse(&self.bufs[start..start + len], &self.hdr) {
                    Ok(out) if !out.is_payload_truncated() => {
                        let off = 16 + self.hdr.msg_namelen as usize + self.hdr.msg_controllen;
                        (off, out.payload_data().len(), timestamp_ns(out.control_data()))
                    }
                    _ => (0, 0, None),
                };
                if plen > 0 || off > 0 {
                    f(&mut self.bufs[start + off..start + off + plen], stamp);
                    n += 1;
                }
            }
            self.give_back(bid);
            returned = true;
        }
        if returned {
            self.publish();
        }
        if !self.armed && self.arm().is_ok() {
            let _ = self.ring.submit();
        }
        n
    }
}

/// The `SCM_TIMESTAMPNS` stamp among `control` messages (CLOCK_REALTIME ns).
fn timestamp_ns(control: &[u8]) -> Option<u64> {
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let mut at = 0;
    while at + hdr <= control.len() {
        // SAFETY: `hdr` bytes are in bounds; read unaligned.
        let c: libc::cmsghdr = unsafe { std::ptr::read_unaligned(control[at..].as_ptr().cast()) };
        let len = c.cmsg_len as usize;
        if len < hdr || at + len > control.len() {
            return None;
        }
        if c.cmsg_level == libc::SOL_SOCKET && c.cmsg_type == libc::SCM_TIMESTAMPNS && len >= hdr + 16 {
            // SAFETY: 16 bytes of timespec are in bounds (checked); read unaligned.
            let ts: libc::timespec = unsafe { std::ptr::read_unaligned(control[at + hdr..].as_ptr().cast()) };
            return u64::try_from(ts.tv_sec).ok().map(|s| s * 1_000_000_000 + ts.tv_nsec as u64);
        }
        at += (len + 7) & !7;
    }
    None
}

impl Drop for UringMultiRecv {
    fn drop(&mut self) {
        // Cancel the armed receive and wait until the kernel is done with the buffers.
        let e = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(self.fd)).all())
            .build()
            .user_data(CANCEL_USER);
        // SAFETY: the cancel request carries no pointer.
        let pushed = unsafe { self.ring.submission().push(&e) }.is_ok();
        let (mut cancelled, mut tries) = (!pushed, 0);
        let ts = types::Timespec::new().nsec(10_000_000);
        let args = types::SubmitArgs::new().timespec(&ts);
        while (self.armed || !cancelled) && tries < 100 {
            tries += 1;
            // Waits at most 10 ms a time (a second in all).
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIME) || e.raw_os_error() == Some(libc::EINTR) => {}
                Err(_) => break,
            }
            for c in self.ring.completion() {
                match c.user_data() {
                    CANCEL_USER => cancelled = true,
                    MULTI_USER if !io_uring::cqueue::more(c.flags()) => self.armed = false,
                    _ => {}
                }
            }
        }
        if self.armed {
            // Not confirmed: leak the buffers and the ring rather than free what the kernel may still write.
            std::mem::forget(std::mem::take(&mut self.bufs));
            return;
        }
        let _ = self.ring.submitter().unregister_buf_ring(MULTI_GROUP);
        // SAFETY: our mapping, no longer registered.
        unsafe { libc::munmap(self.bufring.cast(), self.bufring_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket as the nodes have it: non-blocking, kernel stamps on.
    fn stamped_socket() -> UdpSocket {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        crate::batch::enable_rx_timestamps(&rx).unwrap();
        rx
    }

    /// Sends five bursts of `burst` datagrams to `rx`, reading after each
    /// with `recv`; every one must arrive once, with a kernel stamp.
    fn bursts_arrive_once_stamped(
        rx: &UdpSocket,
        burst: u8,
        mut recv: impl FnMut(&mut dyn FnMut(&mut [u8], Option<u64>)),
    ) {
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let mut got: Vec<(Vec<u8>, Option<u64>)> = Vec::new();
        let t0 = crate::clock::wall_ns();
        for b in 0..5u8 {
            for i in 0..burst {
                tx.send_to(&[b, i, 7, 7], to).unwrap();
            }
            let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while got.len() < usize::from(b + 1) * usize::from(burst) && std::time::Instant::now() < until {
                recv(&mut |d, s| got.push((d.to_vec(), s)));
            }
        }
        assert_eq!(got.len(), 5 * usize::from(burst));
        let mut seen: Vec<(u8, u8)> = got.iter().map(|(d, _)| (d[0], d[1])).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..5).flat_map(|b| (0..burst).map(move |i| (b, i))).collect::<Vec<_>>());
        assert!(got.iter().all(|(d, s)| d.len() == 4 && s.is_some_and(|s| s >= t0)), "every datagram stamped");
    }

    /// After the receiver is gone, the socket reads as before.
    fn socket_reads_normally(rx: &UdpSocket) {
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(b"after", rx.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 16];
        rx.set_nonblocking(false).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(1))).unwrap();
        assert_eq!(rx.recv(&mut buf).unwrap(), 5, "the socket reads normally again");
    }

    #[test]
    fn posted_receives_deliver_every_datagram_with_its_kernel_stamp_and_drop_cleanly() {
        let rx = stamped_socket();
        let Ok(mut r) = UringRecv::new(&rx) else {
            eprintln!("SKIPPED: no io_uring on this kernel");
            return;
        };
        // More than the posted slots, in bursts, so slots are posted again.
        bursts_arrive_once_stamped(&rx, 20, |f| {
            r.recv_stamped(f);
        });
        drop(r); // cancels the posted receives and waits for them
        socket_reads_normally(&rx);
    }

    #[test]
    fn multishot_receive_delivers_every_datagram_with_its_kernel_stamp_and_drops_cleanly() {
        let rx = stamped_socket();
        let Ok(mut r) = UringMultiRecv::new(&rx) else {
            eprintln!("SKIPPED: no multishot receive on this kernel");
            return;
        };
        // More than the buffers, in bursts, so buffers go round the ring.
        bursts_arrive_once_stamped(&rx, 40, |f| {
            r.recv_stamped(f);
        });
        // More at once than there are buffers: the kernel ends the request
        // (no buffer left), the datagrams wait in the socket, and the
        // re-armed request takes them all.
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..150u8 {
            tx.send_to(&[9, i, 7, 7], rx.local_addr().unwrap()).unwrap();
        }
        let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let mut more: Vec<u8> = Vec::new();
        while more.len() < 150 && std::time::Instant::now() < until {
            r.recv_stamped(|b, _| more.push(b[1]));
        }
        more.sort_unstable();
        assert_eq!(more, (0..150).collect::<Vec<u8>>(), "none lost past the buffer ring");
        drop(r); // cancels the armed receive and waits for it
        socket_reads_normally(&rx);
    }

    #[test]
    fn a_batch_reaches_every_socket_once_and_refusals_are_counted() {
        let Ok(mut u) = UringSend::new() else {
            eprintln!("SKIPPED: no io_uring on this kernel");
            return;
        };
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let rx: Vec<UdpSocket> = (0..3).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        let to: Vec<SocketAddr> = rx.iter().map(|s| s.local_addr().unwrap()).collect();
        let payloads: Vec<Vec<u8>> = (0..150u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        let items = payloads.iter().enumerate().map(|(i, p)| (&p[..], to[i % 3]));
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        let s = u.send(&tx, items.chain([(&payloads[0][..], v6)]));
        assert_eq!((s.sent, s.failed), (150, 1));
        assert_eq!(s.calls, 3, "64 + 64 + 22 datagrams");
        for (k, r) in rx.iter().enumerate() {
            r.set_read_timeout(Some(std::time::Duration::from_secs(1))).unwrap();
            let mut buf = [0u8; 512];
            for i in (k..150).step_by(3) {
                let n = r.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], &payloads[i][..], "socket {k}, datagram {i}, in order");
            }
        }
    }
}
