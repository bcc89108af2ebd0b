//! UDP sockets.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, Socket, Type};

/// Binds a UDP socket with a large receive buffer, non-blocking.
///
/// The kernel caps `SO_RCVBUF` at `net.core.rmem_max`; where it did, and the
/// process may (root or CAP_NET_ADMIN), `SO_RCVBUFFORCE` asks past the cap.
/// [`recv_buffer_size`] says what the socket got.
pub fn bind_udp(addr: SocketAddr, recv_buffer: usize) -> std::io::Result<UdpSocket> {
    let domain = if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    let _ = s.set_recv_buffer_size(recv_buffer);
    // The kernel reports twice what it granted (its bookkeeping overhead).
    if s.recv_buffer_size().unwrap_or(0) < recv_buffer.saturating_mul(2) {
        let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBufForce, &recv_buffer);
    }
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// The receive buffer the kernel granted `sock`, in bytes of payload it was
/// asked for (half what `SO_RCVBUF` reports).
pub fn recv_buffer_size(sock: &UdpSocket) -> std::io::Result<usize> {
    let n: usize = nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::RcvBuf)?;
    Ok(n / 2)
}

/// Datagrams the kernel dropped on `sock` since it was opened because its
/// receive buffer was full (the `drops` column of `/proc/net/udp{,6}` for
/// the socket's inode): the honest count of what a receiver that fell behind
/// lost before reading. `None` where the table cannot be read.
pub fn udp_drops(sock: &UdpSocket) -> Option<u64> {
    // The descriptor links to "socket:[INODE]".
    let link = std::fs::read_link(format!("/proc/self/fd/{}", sock.as_raw_fd())).ok()?;
    let inode: u64 = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()?;
    ["/proc/net/udp", "/proc/net/udp6"].iter().find_map(|p| drops_in(&std::fs::read_to_string(p).ok()?, inode))
}

/// The `drops` of the row with `inode` in a `/proc/net/udp` table.
fn drops_in(table: &str, inode: u64) -> Option<u64> {
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // sl local rem st tx:rx tr:tm retr uid timeout inode ref pointer drops
        (f.len() >= 13 && f[9].parse::<u64>().ok()? == inode).then(|| f[12].parse().ok())?
    })
}

/// The kernel's minimum round-trip time of a TCP connection, ns (Linux
/// `TCP_INFO.tcpi_min_rtt`, µs; None where the kernel gives none yet).
#[allow(unsafe_code)]
pub fn tcp_min_rtt_ns(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    use std::os::fd::AsRawFd;
    // struct tcp_info up to tcpi_min_rtt (offset 148, since Linux 4.10).
    const MIN_RTT_AT: usize = 148;
    let mut buf = [0u8; 256];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `buf` is writable for `len` bytes and the kernel writes at most that many.
    let rc = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, buf.as_mut_ptr().cast(), &mut len)
    };
    if rc != 0 || (len as usize) < MIN_RTT_AT + 4 {
        return None;
    }
    let us = u32::from_ne_bytes(buf[MIN_RTT_AT..MIN_RTT_AT + 4].try_into().ok()?);
    // The kernel's "no sample yet" is ~0U.
    (us != 0 && us != u32::MAX).then(|| u64::from(us) * 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_buffer_counts_its_drops_and_an_empty_one_none() {
        let rx = bind_udp("127.0.0.1:0".parse().unwrap(), 4096).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(udp_drops(&rx), Some(0));
        assert!(recv_buffer_size(&rx).unwrap() > 0);
        let to = rx.local_addr().unwrap();
        // Far more than a few KiB of buffer holds; nobody reads.
        for _ in 0..2_000 {
            tx.send_to(&[7u8; 512], to).unwrap();
        }
        let d = udp_drops(&rx).expect("the socket is in /proc/net/udp");
        assert!(d > 1_000, "{d} drops");
        let mut buf = [0u8; 1024];
        let mut read = 0;
        while rx.recv(&mut buf).is_ok() {
            read += 1;
        }
        assert_eq!(read + d, 2_000, "every datagram read or counted dropped");
    }

    #[test]
    fn drops_are_read_from_the_row_of_the_inode() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                 1: 0100007F:6977 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 17\n\
                 2: 0100007F:6978 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 99 2 0000000000000000 3\n";
        assert_eq!((drops_in(t, 4242), drops_in(t, 99), drops_in(t, 5)), (Some(17), Some(3), None));
    }
}
