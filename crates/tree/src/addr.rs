//! Node addresses as a deployment writes them: `IP:PORT`, `[IPv6]:PORT` or
//! `NAME:PORT` (a DNS name — a Kubernetes Service, a Compose service, a
//! host in `/etc/hosts`). Parsing only: resolving a name is the shells' job
//! (`fairfeed_io::resolve`), at start-up and again while they run.

use std::net::{IpAddr, SocketAddr};

/// A host (an IP address or a DNS name) and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// An IP address or a DNS name.
    pub host: String,
    /// The port.
    pub port: u16,
}

/// Longest DNS name (RFC 1035: 253 characters in text form).
pub const NAME_MAX: usize = 253;

/// Why a text is not a `HOST:PORT` address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// No `:PORT` (or brackets that do not close).
    #[error("{0:?} is not HOST:PORT (e.g. 10.0.0.7:9100, [::1]:9100 or node-7.tree:9100)")]
    NotHostPort(String),
    /// The port is not a number in 0..=65535.
    #[error("{text:?}: port {port:?} is not a number in 0..=65535")]
    BadPort {
        /// The whole text.
        text: String,
        /// Its port part.
        port: String,
    },
    /// The host is neither an IP address nor a host name.
    #[error("{text:?}: {host:?} is neither an IP address nor a host name")]
    BadHost {
        /// The whole text.
        text: String,
        /// Its host part.
        host: String,
    },
    /// Port 0 (binds a random port; no one can send to it).
    #[error("{0:?}: port 0 is not an address anyone can send to (it binds a random port)")]
    PortZero(String),
}

impl HostPort {
    /// Parses `host:port`; the port must be 1..=65535 unless `any_port`
    /// (a listening address may ask for an ephemeral port with 0).
    pub fn parse(s: &str, any_port: bool) -> Result<HostPort, AddrError> {
        let s = s.trim();
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Self::checked(a.ip().to_string(), a.port(), s, any_port);
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(AddrError::NotHostPort(s.to_string()));
        };
        let port: u16 = port.parse().map_err(|_| AddrError::BadPort { text: s.to_string(), port: port.to_string() })?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.parse::<IpAddr>().is_err() && !is_dns_name(host) {
            return Err(AddrError::BadHost { text: s.to_string(), host: host.to_string() });
        }
        Self::checked(host.to_string(), port, s, any_port)
    }

    fn checked(host: String, port: u16, s: &str, any_port: bool) -> Result<HostPort, AddrError> {
        if port == 0 && !any_port {
            return Err(AddrError::PortZero(s.to_string()));
        }
        Ok(HostPort { host, port })
    }

    /// The address itself when the host is an IP address (no lookup needed).
    pub fn literal(&self) -> Option<SocketAddr> {
        self.host.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, self.port))
    }
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// RFC 1123 host name: dot-separated labels of letters, digits and hyphens,
/// 1–63 characters each, not starting or ending with a hyphen.
fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= NAME_MAX
        && s.trim_end_matches('.').split('.').all(|l| {
            (1..=63).contains(&l.len())
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_names_and_bad_ones() {
        let p = |s| HostPort::parse(s, false);
        assert_eq!(p("10.0.0.7:9100").unwrap().literal(), Some("10.0.0.7:9100".parse().unwrap()));
        assert_eq!(p("[::1]:9100").unwrap().to_string(), "[::1]:9100");
        let n = p("node-7.tree.svc.cluster.local:9100").unwrap();
        assert_eq!((n.host.as_str(), n.port, n.literal()), ("node-7.tree.svc.cluster.local", 9100, None));
        assert_eq!(p("localhost:19302").unwrap().to_string(), "localhost:19302");
        for bad in ["", "9100", "host:", "host:99999", "-bad:1", "a..b:1", "under_score:1", "x y:1", "127.0.0.1:-1"] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
        assert!(p("127.0.0.1:0").unwrap_err().to_string().contains("port 0"));
        assert_eq!(HostPort::parse("127.0.0.1:0", true).unwrap().port, 0);
    }
}
