//! UDP sockets.

use std::net::{SocketAddr, UdpSocket};

use socket2::{Domain, Protocol, Socket, Type};

/// Binds a UDP socket with a large receive buffer, non-blocking.
pub fn bind_udp(addr: SocketAddr, recv_buffer: usize) -> std::io::Result<UdpSocket> {
    let domain = if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    let _ = s.set_recv_buffer_size(recv_buffer);
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}
