//! Membership messages between tree nodes and the controller (the payload of
//! an overlay [`Kind::Membership`](fairfeed_wire::overlay::Kind::Membership) packet).
//!
//! A node started with `--controller` registers (its role, the id it wants
//! or any, its capacity), then sends a heartbeat every report interval with
//! the topology version it runs; the controller answers with the node's
//! **view** of the current version — its parent, children, hedge targets and
//! hedge parents, and the address of each — or a refusal. All of it rides in
//! the overlay header, so it is sealed with the tree key like data.
//!
//! ```text
//! Register   'R' incarnation:8 role:1 capacity:2 want_id:4 advertise:19
//! Heartbeat  'H' incarnation:8 id:4 version:8
//! Leave      'L' incarnation:8 id:4
//! Assign     'A' incarnation:8 id:4 version:8 tree:2 role:1 layer:1 parent:4
//!                fanout:2 hedge:1 depth:1 n_children:2 n_hedge_targets:2
//!                n_hedge_parents:2 n_peers:2, then the three id lists (4 each)
//!                and the peers (id:4 role:1 address:19)
//! Refuse     'X' incarnation:8 reason:1 retry_after_ms:4
//! address    family:1 (0 none, 4, 6) ip:16 (IPv4 in the first 4) port:2
//! ```
//!
//! The control plane allocates (views are lists), so this lives here and
//! not in the allocation-free `fairfeed-wire`. All integers big-endian. Lists are bounded ([`LINKS_MAX`], [`PEERS_MAX`]);
//! a count beyond them, a list running past the payload, an unknown type,
//! role, family or reason, and trailing bytes are typed errors.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use fairfeed_wire::error::{Error, Protocol};

/// `want_id` of a node that takes whatever id the controller gives.
pub const ANY_ID: u32 = u32::MAX;
/// `parent` of the sender (it has none).
pub const NO_PARENT: u32 = u32::MAX;
/// The overlay header's `origin` on what the controller sends.
pub const CONTROLLER_ORIGIN: u32 = u32::MAX - 1;
/// `layer` of a member the controller has not placed (a spare proxy, a
/// receiver waiting for room): it forwards and delivers nothing yet.
pub const UNPLACED: i8 = i8::MIN;
/// Most ids in one list of a view (children, hedge targets, hedge parents).
pub const LINKS_MAX: usize = 512;
/// Most peers (id and address) in one view.
pub const PEERS_MAX: usize = 1_024;
/// Bytes of an encoded address.
pub const ADDR_LEN: usize = 19;

const TYPE_REGISTER: u8 = b'R';
const TYPE_HEARTBEAT: u8 = b'H';
const TYPE_LEAVE: u8 = b'L';
const TYPE_ASSIGN: u8 = b'A';
const TYPE_REFUSE: u8 = b'X';

/// A member's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemberRole {
    /// The tree's root.
    Sender = 1,
    /// An inner node.
    Proxy = 2,
    /// A leaf.
    Receiver = 3,
}

impl MemberRole {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Sender),
            2 => Some(Self::Proxy),
            3 => Some(Self::Receiver),
            _ => None,
        }
    }
}

/// A node asks to join (or, with the same incarnation, asks again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Register {
    /// Random per process start: a restarted node is a new member.
    pub incarnation: u64,
    /// What it wants to be.
    pub role: MemberRole,
    /// Children it can feed (proxies; 0: the controller's fan-out).
    pub capacity: u16,
    /// The id it wants, or [`ANY_ID`].
    pub want_id: u32,
    /// Where it wants copies sent; `None`: where its registration came from.
    pub advertise: Option<SocketAddr>,
}

/// A member is alive and runs topology `version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Its registration's incarnation.
    pub incarnation: u64,
    /// Its id.
    pub id: u32,
    /// The topology version it runs.
    pub version: u64,
}

/// A member leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leave {
    /// Its registration's incarnation.
    pub incarnation: u64,
    /// Its id.
    pub id: u32,
}

/// A node this view links to, and where it listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its id.
    pub id: u32,
    /// Its role.
    pub role: MemberRole,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// One member's view of topology `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assign {
    /// The registration's incarnation (a view for an older process is ignored).
    pub incarnation: u64,
    /// The member's id (the one it asked for, or the one it was given).
    pub id: u32,
    /// The topology version.
    pub version: u64,
    /// The tree.
    pub tree: u16,
    /// Its role in it.
    pub role: MemberRole,
    /// −1 for the sender, 0.. for proxies, the last layer for receivers.
    pub layer: i8,
    /// [`NO_PARENT`] for the sender.
    pub parent: u32,
    /// The tree's fan-out F.
    pub fanout: u16,
    /// The tree's hedging H.
    pub hedge: u8,
    /// The tree's depth D.
    pub depth: u8,
    /// Its children.
    pub children: Vec<u32>,
    /// The children of the siblings it hedges for.
    pub hedge_targets: Vec<u32>,
    /// The nodes that send it hedged copies beside its parent.
    pub hedge_parents: Vec<u32>,
    /// Every node named above (and itself), with its address.
    pub peers: Vec<Peer>,
}

/// Why the controller refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// Declared dead lately: not re-admitted before the hold-down ends.
    HeldDown = 1,
    /// A heartbeat from no current member: register again.
    Unknown = 2,
    /// The id asked for belongs to a live member with another incarnation.
    IdTaken = 3,
    /// A second sender.
    SenderTaken = 4,
    /// The membership is at its limit.
    Full = 5,
    /// Another live member registered from this address.
    AddrTaken = 6,
}

impl RefuseReason {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::HeldDown),
            2 => Some(Self::Unknown),
            3 => Some(Self::IdTaken),
            4 => Some(Self::SenderTaken),
            5 => Some(Self::Full),
            6 => Some(Self::AddrTaken),
            _ => None,
        }
    }

    /// A short stable name (counters, log lines).
    pub fn name(self) -> &'static str {
        match self {
            Self::HeldDown => "held_down",
            Self::Unknown => "unknown",
            Self::IdTaken => "id_taken",
            Self::SenderTaken => "sender_taken",
            Self::Full => "full",
            Self::AddrTaken => "address_taken",
        }
    }
}

/// The controller will not take the node (now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refuse {
    /// The registration's incarnation.
    pub incarnation: u64,
    /// Why.
    pub reason: RefuseReason,
    /// Ask again after this long (0: do not).
    pub retry_after_ms: u32,
}

/// Any membership message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A node asks to join.
    Register(Register),
    /// A member is alive.
    Heartbeat(Heartbeat),
    /// A member leaves.
    Leave(Leave),
    /// The controller's view for a member.
    Assign(Assign),
    /// The controller will not take a node.
    Refuse(Refuse),
}

fn bad(reason: &'static str) -> Error {
    Error::Malformed { protocol: Protocol::Overlay, reason }
}

/// Reads fields off the front of a payload; every read is checked.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let end = self.at.checked_add(n).ok_or(Error::Overrun { needed: usize::MAX, available: self.b.len() })?;
        let s = self.b.get(self.at..end).ok_or(Error::Truncated { needed: end, available: self.b.len() })?;
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, Error> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, Error> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, Error> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }
    fn role(&mut self) -> Result<MemberRole, Error> {
        MemberRole::from_u8(self.u8()?).ok_or(bad("unknown role"))
    }
    fn addr(&mut self) -> Result<Option<SocketAddr>, Error> {
        let family = self.u8()?;
        let ip = self.take(16)?;
        let port = self.u16()?;
        let ip = match family {
            0 => return Ok(None),
            4 => IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
            6 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(ip);
                IpAddr::V6(Ipv6Addr::from(a))
            }
            _ => return Err(bad("unknown address family")),
        };
        Ok(Some(SocketAddr::new(ip, port)))
    }
    fn ids(&mut self, n: usize) -> Result<Vec<u32>, Error> {
        // The count is checked against the bytes left before anything is allocated.
        if n > LINKS_MAX {
            return Err(bad("id list longer than LINKS_MAX"));
        }
        self.need(n * 4)?;
        (0..n).map(|_| self.u32()).collect()
    }
    fn need(&self, n: usize) -> Result<(), Error> {
        let left = self.b.len() - self.at;
        if n > left {
            return Err(Error::Overrun { needed: self.at + n, available: self.b.len() });
        }
        Ok(())
    }
    fn end(&self) -> Result<(), Error> {
        match self.b.len() - self.at {
            0 => Ok(()),
            extra => Err(Error::TrailingBytes { protocol: Protocol::Overlay, extra }),
        }
    }
}

fn put_addr(out: &mut Vec<u8>, a: Option<SocketAddr>) {
    let mut ip = [0u8; 16];
    let (family, port) = match a {
        None => (0, 0),
        Some(SocketAddr::V4(v)) => {
            ip[..4].copy_from_slice(&v.ip().octets());
            (4, v.port())
        }
        Some(SocketAddr::V6(v)) => {
            ip.copy_from_slice(&v.ip().octets());
            (6, v.port())
        }
    };
    out.push(family);
    out.extend_from_slice(&ip);
    out.extend_from_slice(&port.to_be_bytes());
}

impl Message {
    /// Decodes a membership payload (after the overlay header).
    pub fn parse(b: &[u8]) -> Result<Message, Error> {
        let mut r = Reader { b, at: 0 };
        let m = match r.u8()? {
            TYPE_REGISTER => Message::Register(Register {
                incarnation: r.u64()?,
                role: r.role()?,
                capacity: r.u16()?,
                want_id: r.u32()?,
                advertise: r.addr()?,
            }),
            TYPE_HEARTBEAT => Message::Heartbeat(Heartbeat { incarnation: r.u64()?, id: r.u32()?, version: r.u64()? }),
            TYPE_LEAVE => Message::Leave(Leave { incarnation: r.u64()?, id: r.u32()? }),
            TYPE_ASSIGN => Message::Assign(parse_assign(&mut r)?),
            TYPE_REFUSE => Message::Refuse(Refuse {
                incarnation: r.u64()?,
                reason: RefuseReason::from_u8(r.u8()?).ok_or(bad("unknown refusal reason"))?,
                retry_after_ms: r.u32()?,
            }),
            t => return Err(Error::UnknownType { protocol: Protocol::Overlay, msg_type: t }),
        };
        r.end()?;
        Ok(m)
    }

    /// Appends the encoded payload to `out`.
    ///
    /// # Panics
    /// On a view whose lists exceed [`LINKS_MAX`] or [`PEERS_MAX`] (the
    /// controller never builds one: it is a programming error).
    pub fn emit(&self, out: &mut Vec<u8>) {
        match self {
            Message::Register(m) => {
                out.push(TYPE_REGISTER);
                out.extend_from_slice(&m.incarnation.to_be_bytes());
                out.push(m.role as u8);
                out.extend_from_slice(&m.capacity.to_be_bytes());
                out.extend_from_slice(&m.want_id.to_be_bytes());
                put_addr(out, m.advertise);
            }
            Message::Heartbeat(m) => {
                out.push(TYPE_HEARTBEAT);
                out.extend_from_slice(&m.incarnation.to_be_bytes());
                out.extend_from_slice(&m.id.to_be_bytes());
                out.extend_from_slice(&m.version.to_be_bytes());
            }
            Message::Leave(m) => {
                out.push(TYPE_LEAVE);
                out.extend_from_slice(&m.incarnation.to_be_bytes());
                out.extend_from_slice(&m.id.to_be_bytes());
            }
            Message::Assign(m) => emit_assign(m, out),
            Message::Refuse(m) => {
                out.push(TYPE_REFUSE);
                out.extend_from_slice(&m.incarnation.to_be_bytes());
                out.push(m.reason as u8);
                out.extend_from_slice(&m.retry_after_ms.to_be_bytes());
            }
        }
    }

    /// The encoded payload.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.emit(&mut v);
        v
    }
}

/// `m` in an overlay membership packet from `origin`, stamped `now` (the
/// sender's wall clock: seals are checked against the receiver's), number
/// `sequence`, sealed with `auth` where given.
pub fn packet(m: &Message, origin: u32, sequence: u64, now: u64, auth: Option<&crate::auth::Auth>) -> Vec<u8> {
    use fairfeed_wire::overlay::{HeaderRepr, Kind, HEADER_LEN};
    let payload = m.to_vec();
    let h = HeaderRepr {
        kind: Some(Kind::Membership),
        sequence,
        send_ns: now,
        origin,
        payload_len: payload.len() as u16,
        ..HeaderRepr::default()
    };
    let mut b = vec![0u8; HEADER_LEN];
    h.emit(&mut b).expect("a header fits");
    b.extend_from_slice(&payload);
    if let Some(a) = auth {
        a.seal(&mut b);
    }
    b
}

fn parse_assign(r: &mut Reader<'_>) -> Result<Assign, Error> {
    let (incarnation, id, version, tree) = (r.u64()?, r.u32()?, r.u64()?, r.u16()?);
    let role = r.role()?;
    let layer = r.u8()? as i8;
    let (parent, fanout, hedge, depth) = (r.u32()?, r.u16()?, r.u8()?, r.u8()?);
    let (nc, nh, np, npeers) = (r.u16()?, r.u16()?, r.u16()?, r.u16()?);
    let children = r.ids(usize::from(nc))?;
    let hedge_targets = r.ids(usize::from(nh))?;
    let hedge_parents = r.ids(usize::from(np))?;
    let npeers = usize::from(npeers);
    if npeers > PEERS_MAX {
        return Err(bad("peer list longer than PEERS_MAX"));
    }
    r.need(npeers * (5 + ADDR_LEN))?;
    let mut peers = Vec::with_capacity(npeers);
    for _ in 0..npeers {
        let (id, role) = (r.u32()?, r.role()?);
        let addr = r.addr()?.ok_or(bad("a peer without an address"))?;
        peers.push(Peer { id, role, addr });
    }
    Ok(Assign {
        incarnation,
        id,
        version,
        tree,
        role,
        layer,
        parent,
        fanout,
        hedge,
        depth,
        children,
        hedge_targets,
        hedge_parents,
        peers,
    })
}

fn emit_assign(m: &Assign, out: &mut Vec<u8>) {
    for l in [&m.children, &m.hedge_targets, &m.hedge_parents] {
        assert!(l.len() <= LINKS_MAX, "a view's id list is at most LINKS_MAX long");
    }
    assert!(m.peers.len() <= PEERS_MAX, "a view names at most PEERS_MAX peers");
    out.push(TYPE_ASSIGN);
    out.extend_from_slice(&m.incarnation.to_be_bytes());
    out.extend_from_slice(&m.id.to_be_bytes());
    out.extend_from_slice(&m.version.to_be_bytes());
    out.extend_from_slice(&m.tree.to_be_bytes());
    out.push(m.role as u8);
    out.push(m.layer as u8);
    out.extend_from_slice(&m.parent.to_be_bytes());
    out.extend_from_slice(&m.fanout.to_be_bytes());
    out.push(m.hedge);
    out.push(m.depth);
    for n in [m.children.len(), m.hedge_targets.len(), m.hedge_parents.len(), m.peers.len()] {
        out.extend_from_slice(&(n as u16).to_be_bytes());
    }
    for l in [&m.children, &m.hedge_targets, &m.hedge_parents] {
        for id in l.iter() {
            out.extend_from_slice(&id.to_be_bytes());
        }
    }
    for p in &m.peers {
        out.extend_from_slice(&p.id.to_be_bytes());
        out.push(p.role as u8);
        put_addr(out, Some(p.addr));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn role() -> impl Strategy<Value = MemberRole> {
        prop_oneof![Just(MemberRole::Sender), Just(MemberRole::Proxy), Just(MemberRole::Receiver)]
    }

    fn addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
            (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((Ipv6Addr::from(ip), p))),
        ]
    }

    fn message() -> impl Strategy<Value = Message> {
        let ids = || proptest::collection::vec(any::<u32>(), 0..20);
        let peer = (any::<u32>(), role(), addr()).prop_map(|(id, role, addr)| Peer { id, role, addr });
        prop_oneof![
            (any::<u64>(), role(), any::<u16>(), any::<u32>(), proptest::option::of(addr())).prop_map(
                |(incarnation, role, capacity, want_id, advertise)| Message::Register(Register {
                    incarnation,
                    role,
                    capacity,
                    want_id,
                    advertise
                })
            ),
            (any::<u64>(), any::<u32>(), any::<u64>())
                .prop_map(|(incarnation, id, version)| Message::Heartbeat(Heartbeat { incarnation, id, version })),
            (any::<u64>(), any::<u32>()).prop_map(|(incarnation, id)| Message::Leave(Leave { incarnation, id })),
            (
                (any::<u64>(), any::<u32>(), any::<u64>(), any::<u16>(), role(), any::<i8>(), any::<u32>()),
                (any::<u16>(), any::<u8>(), any::<u8>(), ids(), ids(), ids()),
                proptest::collection::vec(peer, 0..20)
            )
                .prop_map(
                    |(
                        (incarnation, id, version, tree, role, layer, parent),
                        (fanout, hedge, depth, children, hedge_targets, hedge_parents),
                        peers,
                    )| {
                        Message::Assign(Assign {
                            incarnation,
                            id,
                            version,
                            tree,
                            role,
                            layer,
                            parent,
                            fanout,
                            hedge,
                            depth,
                            children,
                            hedge_targets,
                            hedge_parents,
                            peers,
                        })
                    }
                ),
            (any::<u64>(), 1u8..=6, any::<u32>()).prop_map(|(incarnation, r, retry_after_ms)| {
                Message::Refuse(Refuse { incarnation, reason: RefuseReason::from_u8(r).unwrap(), retry_after_ms })
            }),
        ]
    }

    proptest! {
        #[test]
        fn every_message_round_trips(m in message()) {
            let b = m.to_vec();
            prop_assert_eq!(Message::parse(&b), Ok(m));
        }

        #[test]
        fn every_prefix_and_extension_is_a_typed_error(m in message(), extra in 1usize..8) {
            let b = m.to_vec();
            for cut in 0..b.len() {
                prop_assert!(Message::parse(&b[..cut]).is_err());
            }
            let mut longer = b.clone();
            longer.extend(std::iter::repeat_n(0u8, extra));
            prop_assert!(
                matches!(Message::parse(&longer), Err(Error::TrailingBytes { .. })),
                "trailing bytes are refused"
            );
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Message::parse(&b);
        }
    }

    #[test]
    fn counts_beyond_the_limits_or_the_payload_are_refused_before_allocating() {
        let m = Message::Assign(Assign {
            incarnation: 1,
            id: 2,
            version: 3,
            tree: 0,
            role: MemberRole::Proxy,
            layer: 0,
            parent: 9,
            fanout: 4,
            hedge: 1,
            depth: 2,
            children: vec![1, 2],
            hedge_targets: vec![],
            hedge_parents: vec![],
            peers: vec![],
        });
        let mut b = m.to_vec();
        // n_children sits after the fixed fields: type 1 + 8 + 4 + 8 + 2 + 1 + 1 + 4 + 2 + 1 + 1 = 33.
        b[33..35].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(Message::parse(&b), Err(Error::Malformed { reason: "id list longer than LINKS_MAX", .. })));
        b[33..35].copy_from_slice(&100u16.to_be_bytes());
        assert!(matches!(Message::parse(&b), Err(Error::Overrun { .. })));
        let bad_role = {
            let mut v = Message::Heartbeat(Heartbeat { incarnation: 1, id: 1, version: 1 }).to_vec();
            v[0] = b'Q';
            v
        };
        assert!(matches!(Message::parse(&bad_role), Err(Error::UnknownType { msg_type: b'Q', .. })));
    }
}
