//! The client side of authenticated control: one request datagram, sealed
//! under the operator key ([`fairfeed_tree::operator`]) with the wall clock
//! and a fresh random nonce, or — without a key — the plain command padded
//! so that a refusal from a node beyond loopback (never longer than the
//! request that drew it) still fits its reason; and the check of the answer
//! ([`answer`]): with a key, only an answer sealed to one of our requests.

use std::net::SocketAddr;

use fairfeed_tree::operator::{OperatorKey, NONCE_LEN};

/// Bytes a plain request is padded to (spaces; a control socket trims them).
pub const PLAIN_PAD: usize = 200;

/// A sealed request's nonce (its answer is sealed to it).
pub type Nonce = [u8; NONCE_LEN];

/// The datagram that asks `cmd` of the control socket at `to`: sealed
/// under `key` (with the nonce its answer will carry), or plain and padded.
/// Seal each send anew: a resent sealed datagram is refused as a replay.
pub fn request(key: Option<&OperatorKey>, to: SocketAddr, cmd: &str) -> (Vec<u8>, Option<Nonce>) {
    match key {
        Some(k) => {
            let nonce: Nonce = rand::random();
            (k.seal(fairfeed_io::clock::wall_ns(), nonce, to, cmd).into_bytes(), Some(nonce))
        }
        None => {
            let mut b = cmd.trim().as_bytes().to_vec();
            if b.len() < PLAIN_PAD {
                b.resize(PLAIN_PAD, b' ');
            }
            (b, None)
        }
    }
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The node refused the request (its refusal is not sealed: it may be forged too).
    #[error("refused (an unsealed answer): {0}")]
    Refused(String),
    /// Not sealed under the operator key: spoofed, or a node with another key.
    #[error("the answer is not sealed under the operator key (spoofed, or the node holds another key)")]
    Unsealed,
    /// Sealed, but to none of the requests sent (an old answer replayed).
    #[error("the answer is sealed to none of the requests sent")]
    NotOurs,
}

/// The body of `datagram` answering requests sealed with `sent` (with
/// `key`); without a key, the datagram as it is.
pub fn answer<'a>(key: Option<&OperatorKey>, sent: &[Nonce], datagram: &'a [u8]) -> Result<&'a [u8], AnswerError> {
    let Some(k) = key else { return Ok(datagram) };
    match k.open_reply(datagram) {
        Ok((n, body)) if sent.contains(&n) => Ok(body),
        Ok(_) => Err(AnswerError::NotOurs),
        Err(_) => {
            let text = String::from_utf8_lossy(datagram);
            if text.starts_with("refused") || text.starts_with("error") {
                Err(AnswerError::Refused(text.chars().take(200).collect()))
            } else {
                Err(AnswerError::Unsealed)
            }
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
        let ((a, na), (b, _)) = (request(Some(&key), at, "stop"), request(Some(&key), at, "stop"));
        assert_ne!(a, b, "a fresh nonce each time");
        for r in [&a, &b] {
            let t = String::from_utf8_lossy(r);
            assert_eq!(v.admit(now, &t, far, |_| Access::Change).map(|x| x.command), Ok("stop"));
        }
        // The answer to `a` is taken for `a` only; an unsealed one is not taken at all.
        let na = na.unwrap();
        let r = v.answer(Some(na), b"stopping");
        assert_eq!(answer(Some(&key), &[na], &r), Ok(&b"stopping"[..]));
        assert_eq!(answer(Some(&key), &[[0; 16]], &r), Err(AnswerError::NotOurs));
        assert_eq!(answer(Some(&key), &[na], b"stopping"), Err(AnswerError::Unsealed));
        assert!(matches!(answer(Some(&key), &[na], b"refused: stale"), Err(AnswerError::Refused(_))));
        assert_eq!(answer(None, &[], b"{}"), Ok(&b"{}"[..]));
        let (plain, _) = request(None, at, "stat");
        assert_eq!(plain.len(), PLAIN_PAD);
        let t = String::from_utf8_lossy(&plain);
        let lo = "127.0.0.1".parse().unwrap();
        assert_eq!(v.admit(now, &t, lo, |_| Access::Read).map(|x| x.command), Ok("stat"));
    }
}
