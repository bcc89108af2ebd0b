//! The client side of authenticated control: one request datagram, sealed
//! under the operator key ([`fairfeed_tree::operator`]) with the wall clock
//! and a fresh random nonce, or — without a key — the plain command padded
//! so that a refusal from a node beyond loopback (never longer than the
//! request that drew it) still fits its reason.

use std::net::SocketAddr;

use fairfeed_tree::operator::OperatorKey;

/// Bytes a plain request is padded to (spaces; a control socket trims them).
pub const PLAIN_PAD: usize = 200;

/// The datagram that asks `cmd` of the control socket at `to`: sealed
/// under `key`, or plain and padded. Seal each send anew: a resent sealed
/// datagram is refused as a replay.
pub fn request(key: Option<&OperatorKey>, to: SocketAddr, cmd: &str) -> Vec<u8> {
    match key {
        Some(k) => k.seal(fairfeed_io::clock::wall_ns(), rand::random(), to, cmd).into_bytes(),
        None => {
            let mut b = cmd.trim().as_bytes().to_vec();
            if b.len() < PLAIN_PAD {
                b.resize(PLAIN_PAD, b' ');
            }
            b
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_tree::operator::{Access, Verifier};

    #[test]
    fn requests_are_admitted_sealed_once_each_or_plain_from_loopback() {
        let key = OperatorKey::new([4; 32]);
        let at: SocketAddr = "192.0.2.9:7000".parse().unwrap();
        let mut v = Verifier::new(Some(key.clone()), Some(at));
        let now = fairfeed_io::clock::wall_ns();
        let far = "192.0.2.1".parse().unwrap();
        let (a, b) = (request(Some(&key), at, "stop"), request(Some(&key), at, "stop"));
        assert_ne!(a, b, "a fresh nonce each time");
        for r in [&a, &b] {
            let t = String::from_utf8_lossy(r);
            assert_eq!(v.admit(now, &t, far, |_| Access::Change).map(|x| x.command), Ok("stop"));
        }
        let plain = request(None, at, "stat");
        assert_eq!(plain.len(), PLAIN_PAD);
        let t = String::from_utf8_lossy(&plain);
        let lo = "127.0.0.1".parse().unwrap();
        assert_eq!(v.admit(now, &t, lo, |_| Access::Read).map(|x| x.command), Ok("stat"));
    }
}
