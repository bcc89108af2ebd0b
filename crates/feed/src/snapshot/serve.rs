//! The snapshot server's side of one SoupBinTCP connection, and who may
//! connect.
//!
//! A client logs in (`L`; username and password checked when the server has
//! them, any accepted otherwise), is sent the whole snapshot as it stands at
//! that instant ([`super::Snapshot`]: Login Accepted, the messages, End of
//! Snapshot, End of Session), and is closed once it has read it. A client
//! that does not log in within [`LOGIN_TIMEOUT_NS`], sends anything but a
//! login before it, sends more than [`PRELOGIN_BYTES_MAX`], or stops reading
//! for [`STALL_TIMEOUT_NS`] is closed with a typed reason; books that cannot
//! be served answer a login with Login Rejected `S` and the reason counted.
//! [`Admission`] bounds connections in all, per address, and logins per
//! address per second.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use fairfeed_wire::soupbintcp::{
    split_packet, PacketRepr as Soup, REJECT_NOT_AUTHORIZED, REJECT_SESSION_NOT_AVAILABLE,
};

use super::{push_frame, NotServing, Snapshot};

/// Time a client has to log in.
pub const LOGIN_TIMEOUT_NS: u64 = 5_000_000_000;
/// Time a client may leave unread bytes without reading any.
pub const STALL_TIMEOUT_NS: u64 = 10_000_000_000;
/// Bytes a client may send before its login is complete.
pub const PRELOGIN_BYTES_MAX: usize = 256;
/// Connections open at once, all addresses.
pub const CONNECTIONS_DEFAULT_MAX: usize = 256;
/// Connections open at once from one address.
pub const PER_ADDRESS_DEFAULT_MAX: usize = 4;
/// New connections per address per second.
pub const CONNECTS_PER_S_DEFAULT_MAX: u32 = 10;
/// Addresses whose rate the admission remembers at most.
const ADDRESSES_MAX: usize = 65_536;

/// Why a connection ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Close {
    #[error("the snapshot was sent")]
    Done,
    #[error("no login within {} s", LOGIN_TIMEOUT_NS / 1_000_000_000)]
    LoginTimeout,
    #[error("not SoupBinTCP: {0}")]
    Garbage(fairfeed_wire::Error),
    #[error("`{0}` packet where a login was expected")]
    Unexpected(char),
    #[error("more than {PRELOGIN_BYTES_MAX} bytes before a login")]
    Oversized,
    #[error("login rejected: bad username or password")]
    NotAuthorized,
    #[error("login rejected: {0}")]
    NotServing(NotServing),
    #[error("client stopped reading for {} s", STALL_TIMEOUT_NS / 1_000_000_000)]
    Stalled,
    #[error("client logged out")]
    Logout,
}

impl Close {
    /// A short stable name for counters.
    pub fn kind(&self) -> &'static str {
        match self {
            Close::Done => "done",
            Close::LoginTimeout => "login_timeout",
            Close::Garbage(_) => "garbage",
            Close::Unexpected(_) => "unexpected",
            Close::Oversized => "oversized",
            Close::NotAuthorized => "not_authorized",
            Close::NotServing(_) => "not_serving",
            Close::Stalled => "stalled",
            Close::Logout => "logout",
        }
    }
}

/// The username and password a server asks for (none: any login).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub user_pass: Option<(String, String)>,
}

impl Credentials {
    fn accept(&self, user: &[u8], pass: &[u8]) -> bool {
        match &self.user_pass {
            None => true,
            Some((u, p)) => user.trim_ascii() == u.as_bytes() && pass.trim_ascii() == p.as_bytes(),
        }
    }
}

/// What is left to write.
#[derive(Debug)]
enum Out {
    Nothing,
    Shared { bytes: Arc<[u8]>, at: usize },
    Owned { bytes: Vec<u8>, at: usize },
}

/// One client connection.
#[derive(Debug)]
pub struct ServerConn {
    opened_ns: u64,
    inbuf: Vec<u8>,
    out: Out,
    /// Decided: the connection ends (after `out` is written).
    closing: Option<Close>,
    logged_in: bool,
    last_write_ns: u64,
    /// Messages of the snapshot sent (for the shell's counters).
    pub snapshot_messages: usize,
}

impl ServerConn {
    pub fn new(now: u64) -> Self {
        Self {
            opened_ns: now,
            inbuf: Vec::new(),
            out: Out::Nothing,
            closing: None,
            logged_in: false,
            last_write_ns: now,
            snapshot_messages: 0,
        }
    }

    /// Takes bytes the client sent. `snapshot` is asked once, at login.
    /// `Err` ends the connection at once (nothing more is written).
    pub fn on_bytes(
        &mut self,
        now: u64,
        b: &[u8],
        creds: &Credentials,
        snapshot: &mut impl FnMut() -> Result<Snapshot, NotServing>,
    ) -> Result<(), Close> {
        if self.closing.is_some() {
            return Ok(());
        }
        if self.logged_in {
            return self.after_login(b);
        }
        if self.inbuf.len() + b.len() > PRELOGIN_BYTES_MAX {
            return Err(Close::Oversized);
        }
        self.inbuf.extend_from_slice(b);
        let (p, used) = match split_packet(&self.inbuf) {
            Ok(Some(x)) => x,
            Ok(None) => return Ok(()),
            Err(e) => return Err(Close::Garbage(e)),
        };
        match p {
            Soup::LoginRequest { username, password, .. } => {
                let ok = creds.accept(&username.0, &password.0);
                self.inbuf.drain(..used);
                self.login(now, ok, snapshot);
                let rest = std::mem::take(&mut self.inbuf);
                self.after_login(&rest)
            }
            Soup::ClientHeartbeat => {
                self.inbuf.drain(..used);
                Ok(())
            }
            other => Err(Close::Unexpected(other_type(&other))),
        }
    }

    fn login(&mut self, now: u64, ok: bool, snapshot: &mut impl FnMut() -> Result<Snapshot, NotServing>) {
        self.last_write_ns = now;
        if !ok {
            self.reject(REJECT_NOT_AUTHORIZED, Close::NotAuthorized);
            return;
        }
        match snapshot() {
            Ok(s) => {
                self.logged_in = true;
                self.snapshot_messages = s.messages;
                self.out = Out::Shared { bytes: s.frames, at: 0 };
                self.closing = Some(Close::Done);
            }
            Err(why) => self.reject(REJECT_SESSION_NOT_AVAILABLE, Close::NotServing(why)),
        }
    }

    fn reject(&mut self, reason: u8, why: Close) {
        let mut bytes = Vec::new();
        push_frame(&mut bytes, Soup::LoginRejected { reason });
        self.out = Out::Owned { bytes, at: 0 };
        self.closing = Some(why);
    }

    /// After login a client may only heartbeat or log out (input is parsed, not kept).
    fn after_login(&mut self, b: &[u8]) -> Result<(), Close> {
        if b.is_empty() {
            return Ok(());
        }
        self.inbuf.extend_from_slice(b);
        loop {
            match split_packet(&self.inbuf) {
                Ok(Some((Soup::ClientHeartbeat, used))) => drop(self.inbuf.drain(..used)),
                Ok(Some((Soup::LogoutRequest, _))) => return Err(Close::Logout),
                Ok(Some((other, _))) => return Err(Close::Unexpected(other_type(&other))),
                Ok(None) if self.inbuf.len() > PRELOGIN_BYTES_MAX => return Err(Close::Oversized),
                Ok(None) => return Ok(()),
                Err(e) => return Err(Close::Garbage(e)),
            }
        }
    }

    /// Bytes waiting to be written.
    pub fn unsent(&self) -> &[u8] {
        match &self.out {
            Out::Nothing => &[],
            Out::Shared { bytes, at } => &bytes[*at..],
            Out::Owned { bytes, at } => &bytes[*at..],
        }
    }

    /// `n` bytes of [`Self::unsent`] were written at `now`.
    pub fn wrote(&mut self, n: usize, now: u64) {
        if n == 0 {
            return;
        }
        self.last_write_ns = now;
        match &mut self.out {
            Out::Nothing => debug_assert!(false, "wrote with nothing to write"),
            Out::Shared { at, bytes } => *at = (*at + n).min(bytes.len()),
            Out::Owned { at, bytes } => *at = (*at + n).min(bytes.len()),
        }
    }

    /// Why the connection ended when the client closed it (or the socket
    /// failed): a client that read the whole snapshot up to End of Snapshot
    /// and left without waiting for End of Session got what it came for.
    pub fn on_peer_closed(&self) -> Close {
        const END_OF_SESSION_FRAME: usize = 3;
        match (&self.closing, self.unsent().len()) {
            (Some(c), 0) => c.clone(),
            (Some(Close::Done), n) if n <= END_OF_SESSION_FRAME => Close::Done,
            _ => Close::Logout,
        }
    }

    /// The connection's end, once decided and everything is written.
    pub fn finished(&self) -> Option<&Close> {
        self.closing.as_ref().filter(|_| self.unsent().is_empty())
    }

    /// Timeouts at `now`.
    pub fn on_tick(&mut self, now: u64) -> Result<(), Close> {
        if self.closing.is_none() && !self.logged_in && now >= self.opened_ns + LOGIN_TIMEOUT_NS {
            return Err(Close::LoginTimeout);
        }
        if !self.unsent().is_empty() && now >= self.last_write_ns + STALL_TIMEOUT_NS {
            return Err(Close::Stalled);
        }
        Ok(())
    }

    /// When [`Self::on_tick`] next has something to decide.
    pub fn next_due(&self) -> u64 {
        if !self.unsent().is_empty() {
            self.last_write_ns + STALL_TIMEOUT_NS
        } else if self.closing.is_none() && !self.logged_in {
            self.opened_ns + LOGIN_TIMEOUT_NS
        } else {
            u64::MAX
        }
    }
}

fn other_type(p: &Soup<'_>) -> char {
    match p {
        Soup::Debug(_) => '+',
        Soup::LoginAccepted { .. } => 'A',
        Soup::LoginRejected { .. } => 'J',
        Soup::SequencedData(_) => 'S',
        Soup::ServerHeartbeat => 'H',
        Soup::EndOfSession => 'Z',
        Soup::LoginRequest { .. } => 'L',
        Soup::UnsequencedData(_) => 'U',
        Soup::ClientHeartbeat => 'R',
        Soup::LogoutRequest => 'O',
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{0} connections open, the limit")]
    Full(usize),
    #[error("{0} connections open from this address, the limit")]
    PerAddress(usize),
    #[error("more than {0} connections per second from this address")]
    Rate(u32),
}

impl Refused {
    pub fn kind(&self) -> &'static str {
        match self {
            Refused::Full(_) => "full",
            Refused::PerAddress(_) => "per_address",
            Refused::Rate(_) => "rate",
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct PerAddress {
    open: usize,
    window_start_ns: u64,
    in_window: u32,
}

/// Who may connect: connections in all and per address, and new
/// connections per address per second.
#[derive(Debug)]
pub struct Admission {
    max: usize,
    per_address_max: usize,
    per_s_max: u32,
    open: usize,
    by_address: HashMap<IpAddr, PerAddress>,
}

impl Admission {
    pub fn new(max: usize, per_address_max: usize, per_s_max: u32) -> Self {
        assert!(max > 0 && per_address_max > 0 && per_s_max > 0, "admission limits must be positive");
        Self { max, per_address_max, per_s_max, open: 0, by_address: HashMap::new() }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open
    }

    /// Admits a connection from `ip` at `now`, or says why not.
    pub fn admit(&mut self, ip: IpAddr, now: u64) -> Result<(), Refused> {
        if self.open >= self.max {
            return Err(Refused::Full(self.max));
        }
        if self.by_address.len() >= ADDRESSES_MAX {
            self.by_address.retain(|_, a| a.open > 0 || now < a.window_start_ns + 1_000_000_000);
        }
        let a = self.by_address.entry(ip).or_default();
        if now >= a.window_start_ns + 1_000_000_000 {
            a.window_start_ns = now;
            a.in_window = 0;
        }
        if a.open >= self.per_address_max {
            return Err(Refused::PerAddress(self.per_address_max));
        }
        if a.in_window >= self.per_s_max {
            return Err(Refused::Rate(self.per_s_max));
        }
        a.in_window += 1;
        a.open += 1;
        self.open += 1;
        Ok(())
    }

    /// A connection admitted from `ip` closed.
    pub fn release(&mut self, ip: IpAddr) {
        if let Some(a) = self.by_address.get_mut(&ip) {
            debug_assert!(a.open > 0);
            a.open = a.open.saturating_sub(1);
            self.open = self.open.saturating_sub(1);
        }
    }
}
