//! Where a copy must be addressed on the wire: the next hop's MAC for each
//! IPv4 target, from the kernel's own routing and neighbour tables (of the
//! calling thread's network namespace). The TC replicator writes it into
//! each copy, so targets on the link itself (each with its own MAC) and
//! targets behind a router (the router's MAC) both receive theirs.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

/// Why a target's next-hop MAC address is not known.
#[derive(Debug, thiserror::Error)]
pub enum NeighError {
    #[error("no route to {0}")]
    NoRoute(std::net::Ipv4Addr),
    #[error("{target} is reached through {dev}, not {iface}")]
    OtherInterface { target: std::net::Ipv4Addr, dev: String, iface: String },
    #[error("{0}")]
    Socket(std::io::Error),
    #[error("no neighbour entry for {hops} on {iface}")]
    Unresolved { hops: String, iface: String },
}

/// How long [`next_hop_macs`] waits for the kernel to resolve a neighbour.
pub const RESOLVE_WAIT: Duration = Duration::from_secs(2);
/// UDP discard port: the empty datagram that makes the kernel ask (ARP) goes here.
const DISCARD_PORT: u16 = 9;

fn hex_ip(s: &str) -> Option<Ipv4Addr> {
    // /proc/net/route writes addresses as the u32 in host (little-endian) order.
    u32::from_str_radix(s, 16).ok().map(|v| Ipv4Addr::from(v.to_le_bytes()))
}

/// The route the kernel would take to `ip`: (interface, next hop), from
/// /proc/net/route (longest prefix; the next hop is the gateway, or `ip`
/// itself on the link).
pub fn route(ip: Ipv4Addr) -> Option<(String, Ipv4Addr)> {
    route_in(&std::fs::read_to_string("/proc/thread-self/net/route").ok()?, ip)
}

fn route_in(text: &str, ip: Ipv4Addr) -> Option<(String, Ipv4Addr)> {
    let mut best: Option<(u32, String, Ipv4Addr)> = None;
    for l in text.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let (Some(dst), Some(gw), Some(mask)) = (hex_ip(f[1]), hex_ip(f[2]), hex_ip(f[7])) else { continue };
        let m = u32::from(mask);
        if u32::from(ip) & m != u32::from(dst) & m {
            continue;
        }
        let hop = if gw.is_unspecified() { ip } else { gw };
        if best.as_ref().is_none_or(|b| m.count_ones() > b.0) {
            best = Some((m.count_ones(), f[0].to_string(), hop));
        }
    }
    best.map(|(_, i, h)| (i, h))
}

/// The interface that holds address `ip` in the calling thread's namespace
/// (`getifaddrs`), if any.
pub fn iface_with(ip: Ipv4Addr) -> Option<String> {
    nix::ifaddrs::getifaddrs().ok()?.find_map(|a| {
        let sin = a.address?.as_sockaddr_in().copied()?;
        (sin.ip() == ip).then(|| a.interface_name.clone())
    })
}

/// The MAC the neighbour table holds for `ip` on `iface`, when complete.
pub fn neighbour(ip: Ipv4Addr, iface: &str) -> Option<[u8; 6]> {
    neighbour_in(&std::fs::read_to_string("/proc/thread-self/net/arp").ok()?, ip, iface)
}

fn neighbour_in(text: &str, ip: Ipv4Addr, iface: &str) -> Option<[u8; 6]> {
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || f[0].parse::<Ipv4Addr>().ok()? != ip || f[5] != iface || f[2] != "0x2" {
            return None;
        }
        let mut mac = [0u8; 6];
        let parts: Vec<&str> = f[3].split(':').collect();
        if parts.len() != 6 {
            return None;
        }
        for (m, p) in mac.iter_mut().zip(parts) {
            *m = u8::from_str_radix(p, 16).ok()?;
        }
        Some(mac)
    })
}

/// Each target's next-hop MAC on `iface`; asks the kernel to resolve the
/// ones it does not know (an empty datagram to the target's discard port)
/// and waits up to [`RESOLVE_WAIT`]. Errors name a target routed by another
/// interface or left unresolved.
pub fn next_hop_macs(iface: &str, targets: &[SocketAddrV4]) -> Result<Vec<[u8; 6]>, NeighError> {
    let mut hops = Vec::with_capacity(targets.len());
    for t in targets {
        let (dev, hop) = route(*t.ip()).ok_or(NeighError::NoRoute(*t.ip()))?;
        if dev != iface {
            return Err(NeighError::OtherInterface { target: *t.ip(), dev, iface: iface.to_string() });
        }
        hops.push(hop);
    }
    let probe = UdpSocket::bind("0.0.0.0:0").map_err(NeighError::Socket)?;
    let until = Instant::now() + RESOLVE_WAIT;
    loop {
        let macs: Vec<Option<[u8; 6]>> = hops.iter().map(|&h| neighbour(h, iface)).collect();
        if macs.iter().all(Option::is_some) {
            return Ok(macs.into_iter().flatten().collect());
        }
        if Instant::now() >= until {
            let missing: Vec<String> =
                hops.iter().zip(&macs).filter(|(_, m)| m.is_none()).map(|(h, _)| h.to_string()).collect();
            return Err(NeighError::Unresolved { hops: missing.join(", "), iface: iface.to_string() });
        }
        for (t, m) in targets.iter().zip(&macs) {
            if m.is_none() {
                let _ = probe.send_to(&[], SocketAddrV4::new(*t.ip(), DISCARD_PORT));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTES: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
        eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
        veth1\t0000E70A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";

    #[test]
    fn the_longest_prefix_wins_and_off_link_targets_go_to_the_gateway() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(route_in(ROUTES, ip("10.231.0.5")), Some(("veth1".into(), ip("10.231.0.5"))));
        assert_eq!(route_in(ROUTES, ip("192.0.2.7")), Some(("eth0".into(), ip("192.0.2.7"))));
        assert_eq!(route_in(ROUTES, ip("203.0.113.9")), Some(("eth0".into(), ip("192.0.2.1"))));
        assert_eq!(route_in("Iface\tDestination\n", ip("10.0.0.1")), None);
    }

    #[test]
    fn only_complete_entries_on_the_interface_count() {
        let arp = "IP address       HW type     Flags       HW address            Mask     Device\n\
            192.0.2.1        0x1         0x2         02:fc:00:00:00:05     *        eth0\n\
            10.231.0.3       0x1         0x0         00:00:00:00:00:00     *        veth1\n\
            10.231.0.4       0x1         0x2         9a:bc:de:f0:12:34     *        veth1\n";
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(neighbour_in(arp, ip("192.0.2.1"), "eth0"), Some([2, 0xfc, 0, 0, 0, 5]));
        assert_eq!(neighbour_in(arp, ip("192.0.2.1"), "veth1"), None, "another interface");
        assert_eq!(neighbour_in(arp, ip("10.231.0.3"), "veth1"), None, "incomplete");
        assert_eq!(neighbour_in(arp, ip("10.231.0.4"), "veth1"), Some([0x9a, 0xbc, 0xde, 0xf0, 0x12, 0x34]));
    }
}
