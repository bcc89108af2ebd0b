//! The OUCH 5.0 order gateway's session logic over SoupBinTCP — sans-IO.
//!
//! [`Gateway`] holds the users (from configuration), their sequenced-message
//! journals and the symbol table; a [`Conn`] is one TCP connection's state.
//! The shell feeds received bytes to [`Gateway::on_bytes`] (which yields
//! engine [`Command`]s and bytes to write back), engine [`Event`]s to
//! [`Gateway::on_event`] (which turns them into OUCH outbound messages,
//! journals them per user and says which connection gets which bytes), and
//! the clock to [`Gateway::on_tick`] (heartbeats both ways, idle timeout).
//!
//! Session rules (SoupBinTCP 4.x): the first packet must be a Login Request
//! with a configured username and password, else Login Rejected `A`; a
//! requested session other than ours is rejected `S`, as is a user already
//! logged in elsewhere. Login Accepted carries the sequence number of the
//! next message the client will get; a client asking for sequence number N
//! gets its journal replayed from N (0: from now on). Server heartbeats go out
//! after a second without other output; a client silent for
//! [`GatewayConfig::idle_timeout_ns`] is disconnected. A malformed or
//! out-of-protocol packet ends that connection, never another one; a valid
//! OUCH message with bad content gets an OUCH Rejected.

/// Keyed by what clients choose (their tokens): a fast hash, randomly seeded
/// per map so that no client can choose keys that collide (`foldhash`).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use fairfeed_wire::macros::Tail;
use fairfeed_wire::ouch::{inbound, outbound, Appendage, OuchPrice};
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr, REJECT_NOT_AUTHORIZED, REJECT_SESSION_NOT_AVAILABLE};
use fairfeed_wire::{Alpha, Stock};

use crate::engine::{CancelReason, Command, Event, NewOrder, Reject, Side, Tif};
use crate::sequencer::OrderStamps;
use crate::tokens::TokenIndex;

/// Bytes a connection may have buffered unparsed (a packet is at most 64 KiB).
pub const INBUF_MAX: usize = 1 << 17;
/// Sequenced messages kept per user for replay at most.
pub const JOURNAL_MAX: usize = 4_000_000;
/// Bytes of one outbound OUCH message at most (its appendage included).
const MESSAGE_MAX: usize = 256;
// A user's journal addresses its bytes with u32 offsets.
const _: () = assert!(JOURNAL_MAX * MESSAGE_MAX <= u32::MAX as usize);

/// Gateway settings.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GatewayConfig {
    /// Session name announced at login (up to 10 characters).
    pub session: String,
    /// (username, password) pairs; usernames up to 6 characters, passwords up to 10.
    pub users: Vec<(String, String)>,
    /// Symbols, locate 1 first.
    pub symbols: Vec<String>,
    /// A Server Heartbeat after this long without sending to a client, ns.
    pub heartbeat_ns: u64,
    /// A logged-in client silent this long is closed, ns.
    pub idle_timeout_ns: u64,
    /// A connection that has not logged in this long after it opened is
    /// closed (however much it trickles): a slot held without a login is
    /// freed quickly.
    #[serde(default = "default_login_timeout_ns")]
    pub login_timeout_ns: u64,
}

/// 5 s to log in.
pub const LOGIN_TIMEOUT_DEFAULT_NS: u64 = 5_000_000_000;

fn default_login_timeout_ns() -> u64 {
    LOGIN_TIMEOUT_DEFAULT_NS
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            session: "FFSESSION1".into(),
            users: vec![("FF0001".into(), "secret".into())],
            symbols: vec!["AAPL".into()],
            heartbeat_ns: 1_000_000_000,
            idle_timeout_ns: 15_000_000_000,
            login_timeout_ns: LOGIN_TIMEOUT_DEFAULT_NS,
        }
    }
}

/// Why a connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Bytes that are not SoupBinTCP, or a packet a client may not send now.
    Protocol(&'static str),
    /// Bad credentials, or a session not available.
    LoginRejected,
    /// The client logged out or closed the connection.
    Logout,
    /// Logged in and silent for `idle_timeout_ns`.
    IdleTimeout,
    /// Not logged in within `login_timeout_ns` of opening.
    LoginTimeout,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GatewayStats {
    /// Logins accepted.
    pub logins: u64,
    /// Logins refused.
    pub login_rejects: u64,
    /// OUCH messages from logged-in clients (orders, cancels, replaces).
    pub orders_in: u64,
    /// OUCH messages answered with a Rejected (unsupported, malformed, refused).
    pub ouch_rejects: u64,
    /// Connections closed for bytes that are not SoupBinTCP or not allowed now.
    pub protocol_closes: u64,
    /// Connections closed for silence (`idle_timeout_ns`).
    pub timeouts: u64,
    /// Sequenced messages sent again to a client logging back in.
    pub replayed: u64,
    /// Sequenced messages sent.
    pub sequenced_out: u64,
    /// Orders (or replacements) refused because their token is not above
    /// every token the user sent before (OUCH 5.0: day-unique and strictly
    /// increasing): a reuse, of a live order or of one that ended, or out of order.
    pub duplicate_tokens: u64,
    /// Enter or Replace orders refused for their minimum quantity (malformed,
    /// above the quantity, on an order that could rest, on a Replace).
    pub bad_min_qty: u64,
    /// Cancels of no live order, answered with a Cancel Reject.
    pub cancel_rejects: u64,
    /// Connections closed for not logging in within `login_timeout_ns`.
    pub login_timeouts: u64,
    /// Connections the shell refused at accept (no slot, or too many from one
    /// address not yet logged in).
    pub refused_connections: u64,
    /// Connections the shell closed because they would not read what they were sent.
    pub slow_reader_closes: u64,
    /// Connections the shell refused from an address that failed too many logins in the last second.
    pub login_rate_limited: u64,
    /// Connections not yet logged in that the shell closed to make room for
    /// a new one when every slot was taken (the oldest goes first).
    pub prelogin_evicted: u64,
    /// `accept` failures of the listener (out of file descriptors, say); the
    /// shell stops watching it for a while after each instead of retrying at once.
    pub accept_errors: u64,
}

/// One connection.
#[derive(Debug, Default)]
pub struct Conn {
    /// The user (index) once logged in.
    pub user: Option<u32>,
    inbuf: Vec<u8>,
    opened_ns: u64,
    last_rx_ns: u64,
    last_tx_ns: u64,
}

impl Conn {
    /// A connection opened at `now_ns` (wall ns), not logged in.
    pub fn new(now_ns: u64) -> Self {
        Conn { user: None, inbuf: Vec::with_capacity(4096), opened_ns: now_ns, last_rx_ns: now_ns, last_tx_ns: now_ns }
    }

    /// When it was opened (the gateway's clock).
    pub fn opened_ns(&self) -> u64 {
        self.opened_ns
    }
}

/// A user's sequenced messages, for SoupBinTCP's replay from a sequence
/// number: one buffer and the offset each message ends at (a heap
/// allocation per message cost more than matching the order did).
#[derive(Default)]
struct UserJournal {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl UserJournal {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn push(&mut self, m: &[u8]) {
        self.bytes.extend_from_slice(m);
        // JOURNAL_MAX messages of at most MESSAGE_MAX bytes: within u32.
        self.ends.push(u32::try_from(self.bytes.len()).expect("journal within 4 GiB"));
    }

    /// Messages from index `from` (0-based) on, oldest first.
    fn from(&self, from: usize) -> impl Iterator<Item = &[u8]> + '_ {
        let start = |i: usize| if i == 0 { 0 } else { self.ends[i - 1] as usize };
        (from..self.ends.len()).map(move |i| &self.bytes[start(i)..self.ends[i] as usize])
    }
}

struct User {
    name: Alpha<6>,
    password: Alpha<10>,
    journal: UserJournal,
    online: bool,
    /// One past the highest UserRefNum this user has sent, 0 before any
    /// (OUCH's Account Query answers it, at least 1, so a client that lost
    /// track can carry on); an Enter or Replace below it is refused.
    next_token: u32,
}

/// What the gateway keeps of a live order: where it routes, what its OUCH
/// echoes repeat (as the client entered it), and the shares still open (the
/// entry goes when they reach 0, so the map holds live orders only).
#[derive(Debug, Clone, Copy)]
struct LiveOrder {
    symbol: u16,
    /// `B`, `S`, `T` (short) or `U` (short exempt), as entered.
    side: u8,
    time_in_force: u8,
    display: u8,
    capacity: u8,
    iso: u8,
    cross_type: u8,
    cl_ord_id: Alpha<14>,
    open: u32,
    /// The minimum quantity entered (0: none), echoed in Order Accepted.
    min_qty: u32,
}

/// An appendage whose minimum-quantity option is malformed or given twice,
/// or whose options are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadMinQtyOption;

/// The minimum quantity an appendage asks for (0: none).
pub fn min_qty(appendage: &[u8]) -> Result<u32, BadMinQtyOption> {
    let mut found = None;
    for o in fairfeed_wire::ouch::options(appendage) {
        let (tag, value) = o.map_err(|_| BadMinQtyOption)?;
        if tag == fairfeed_wire::ouch::tag::MIN_QTY {
            let v: [u8; 4] = value.try_into().map_err(|_| BadMinQtyOption)?;
            if found.replace(u32::from_be_bytes(v)).is_some() {
                return Err(BadMinQtyOption);
            }
        }
    }
    Ok(found.unwrap_or(0))
}

/// The appendage echoing what the gateway accepted of a client's options.
fn echo_appendage(o: &LiveOrder) -> (u16, Appendage) {
    if o.min_qty == 0 {
        return (0, Appendage::EMPTY);
    }
    let mut b = [0u8; fairfeed_wire::ouch::APPENDAGE_LEN_MAX];
    let mut n = 0;
    let _ =
        fairfeed_wire::ouch::push_option(&mut b, &mut n, fairfeed_wire::ouch::tag::MIN_QTY, &o.min_qty.to_be_bytes());
    (n as u16, Appendage::from_slice(&b[..n]).unwrap_or(Appendage::EMPTY))
}

/// Nanoseconds since (UTC) midnight of `wall_ns`, nanoseconds since the Unix
/// epoch: the clock OUCH timestamps are on.
pub fn since_midnight(wall_ns: u64) -> u64 {
    wall_ns % 86_400_000_000_000
}

/// Users, journals, symbols.
pub struct Gateway {
    cfg: GatewayConfig,
    session: Alpha<10>,
    users: Vec<User>,
    symbols: HashMap<Stock, u16>,
    names: Vec<Stock>,
    /// (client, token) of live orders → routing and echo fields.
    orders: TokenIndex<LiveOrder>,
    /// Its counters.
    pub stats: GatewayStats,
    /// Bytes for one client's messages, reused across events.
    scratch: Vec<u8>,
}

fn pad_left(s: &str) -> Alpha<10> {
    let mut a = [b' '; 10];
    let b = s.as_bytes();
    let n = b.len().min(10);
    a[10 - n..].copy_from_slice(&b[..n]);
    Alpha(a)
}

fn write(out: &mut Vec<u8>, p: PacketRepr<'_>) {
    let start = out.len();
    out.resize(start + p.buffer_len(), 0);
    let _ = p.emit(&mut out[start..]);
}

/// OUCH Rejected reason codes (OUCH 5.0 uses two-byte codes; these are ours, documented).
pub fn reject_code(r: Reject) -> u16 {
    match r {
        Reject::UnknownSymbol => 1,
        Reject::BadQuantity => 2,
        Reject::BadPrice => 3,
        Reject::DuplicateToken => 4,
        Reject::UnknownOrder => 5,
        Reject::TooManyOrders => 6,
        Reject::TooManyLevels => 7,
        Reject::BadMinQty => 8,
    }
}

impl Gateway {
    /// A gateway serving `cfg`'s users and symbols.
    pub fn new(cfg: GatewayConfig) -> Self {
        let users = cfg
            .users
            .iter()
            .map(|(u, p)| User {
                name: Alpha::from_str_padded(u),
                password: Alpha::from_str_padded(p),
                journal: UserJournal::default(),
                online: false,
                next_token: 0,
            })
            .collect();
        let names: Vec<Stock> = cfg.symbols.iter().map(|s| Stock::from_str_padded(s)).collect();
        let symbols = names.iter().enumerate().map(|(i, s)| (*s, (i + 1) as u16)).collect();
        Gateway {
            session: pad_left(&cfg.session),
            cfg,
            users,
            symbols,
            names,
            orders: TokenIndex::default(),
            stats: GatewayStats::default(),
            scratch: Vec::with_capacity(512),
        }
    }

    /// What it serves.
    pub fn config(&self) -> &GatewayConfig {
        &self.cfg
    }

    /// The symbol of a client's live order (to route a cancel or replace to its engine shard).
    pub fn symbol_of(&self, client: u32, token: u32) -> Option<u16> {
        self.orders.get(client, token).map(|v| v.symbol)
    }

    /// Messages journaled for `user`.
    pub fn journal_len(&self, user: u32) -> usize {
        self.users.get(user as usize).map_or(0, |u| u.journal.len())
    }

    /// Bytes arrived on `conn`: commands for the engine go to `cmds`, bytes to
    /// write back to `out`. An error means: write `out`, then close.
    pub fn on_bytes(
        &mut self,
        conn: &mut Conn,
        now_ns: u64,
        bytes: &[u8],
        cmds: &mut impl FnMut(Command, OrderStamps),
        out: &mut Vec<u8>,
    ) -> Result<(), Close> {
        conn.last_rx_ns = now_ns;
        if conn.inbuf.len() + bytes.len() > INBUF_MAX {
            return self.protocol(conn, "input buffer overflow");
        }
        conn.inbuf.extend_from_slice(bytes);
        let mut used = 0;
        let buf = std::mem::take(&mut conn.inbuf);
        let result = loop {
            match split_packet(&buf[used..]) {
                Ok(None) => break Ok(()),
                // A login whose fields do not parse (a 20-digit sequence number,
                // letters in it) is answered, not dropped silently.
                Err(_) if conn.user.is_none() && buf.get(used + 2) == Some(&b'L') => {
                    self.stats.login_rejects += 1;
                    write(out, PacketRepr::LoginRejected { reason: REJECT_NOT_AUTHORIZED });
                    break Err(Close::LoginRejected);
                }
                Err(_) => break Err(Close::Protocol("malformed SoupBinTCP packet")),
                Ok(Some((p, n))) => {
                    used += n;
                    if let Err(c) = self.on_packet(conn, now_ns, p, cmds, out) {
                        break Err(c);
                    }
                }
            }
        };
        conn.inbuf = buf;
        conn.inbuf.drain(..used);
        if !out.is_empty() {
            conn.last_tx_ns = now_ns;
        }
        if let Err(c) = result {
            self.closed(conn, c);
        }
        result
    }

    fn protocol(&mut self, conn: &mut Conn, why: &'static str) -> Result<(), Close> {
        let c = Close::Protocol(why);
        self.closed(conn, c);
        Err(c)
    }

    /// Bookkeeping for a connection that ends (for any reason).
    pub fn closed(&mut self, conn: &mut Conn, why: Close) {
        match why {
            Close::Protocol(_) => self.stats.protocol_closes += 1,
            Close::IdleTimeout => self.stats.timeouts += 1,
            Close::LoginTimeout => self.stats.login_timeouts += 1,
            Close::LoginRejected | Close::Logout => {}
        }
        if let Some(u) = conn.user.take() {
            self.users[u as usize].online = false;
        }
    }

    fn on_packet(
        &mut self,
        conn: &mut Conn,
        now_ns: u64,
        p: PacketRepr<'_>,
        cmds: &mut impl FnMut(Command, OrderStamps),
        out: &mut Vec<u8>,
    ) -> Result<(), Close> {
        match (conn.user, p) {
            (None, PacketRepr::LoginRequest { username, password, session, sequence }) => {
                self.login(conn, (username, password, session, sequence), out)
            }
            (None, _) => Err(Close::Protocol("data before login")),
            (Some(_), PacketRepr::LoginRequest { .. }) => Err(Close::Protocol("second login")),
            (Some(_), PacketRepr::ClientHeartbeat | PacketRepr::Debug(_)) => Ok(()),
            (Some(_), PacketRepr::LogoutRequest) => Err(Close::Logout),
            (Some(u), PacketRepr::UnsequencedData(m)) => {
                self.on_ouch(u, now_ns, m, cmds, out);
                Ok(())
            }
            (Some(_), _) => Err(Close::Protocol("server-side packet from a client")),
        }
    }

    fn login(
        &mut self,
        conn: &mut Conn,
        (username, password, session, sequence): (Alpha<6>, Alpha<10>, Alpha<10>, u64),
        out: &mut Vec<u8>,
    ) -> Result<(), Close> {
        // SoupBinTCP: username and password are case-insensitive.
        let same = |a: &[u8], b: &[u8]| a.eq_ignore_ascii_case(b);
        let Some(u) = self.users.iter().position(|u| same(&u.name.0, &username.0) && same(&u.password.0, &password.0))
        else {
            self.stats.login_rejects += 1;
            write(out, PacketRepr::LoginRejected { reason: REJECT_NOT_AUTHORIZED });
            return Err(Close::LoginRejected);
        };
        // Blank asks for the current session; a name may come padded on either side.
        let wanted_session =
            session.0.iter().any(|&b| b != b' ') && session.0.trim_ascii() != self.session.0.trim_ascii();
        if wanted_session || self.users[u].online {
            self.stats.login_rejects += 1;
            write(out, PacketRepr::LoginRejected { reason: REJECT_SESSION_NOT_AVAILABLE });
            return Err(Close::LoginRejected);
        }
        let user = &mut self.users[u];
        let next = user.journal.len() as u64 + 1;
        let from = if sequence == 0 { next } else { sequence.min(next) };
        write(out, PacketRepr::LoginAccepted { session: self.session, sequence: from });
        for m in user.journal.from((from - 1) as usize) {
            write(out, PacketRepr::SequencedData(m));
            self.stats.replayed += 1;
        }
        user.online = true;
        conn.user = Some(u as u32);
        self.stats.logins += 1;
        Ok(())
    }

    fn on_ouch(
        &mut self,
        client: u32,
        now_ns: u64,
        m: &[u8],
        cmds: &mut impl FnMut(Command, OrderStamps),
        out: &mut Vec<u8>,
    ) {
        self.stats.orders_in += 1;
        let ts = since_midnight(now_ns);
        let parsed = inbound::Message::parse(m);
        let seen = match &parsed {
            Ok(inbound::Message::EnterOrder(o)) => o.user_ref_num(),
            Ok(inbound::Message::ReplaceOrder(r)) => r.user_ref_num(),
            _ => 0,
        };
        // Checked against the highest token before this one moves it.
        let fresh = self.users.get(client as usize).is_some_and(|u| seen >= u.next_token);
        if let Some(u) = self.users.get_mut(client as usize) {
            u.next_token = u.next_token.max(seen.saturating_add(1));
        }
        let r = match parsed {
            Ok(inbound::Message::EnterOrder(o)) if !fresh => self.stale_token(o.user_ref_num(), o.cl_ord_id()),
            Ok(inbound::Message::ReplaceOrder(r)) if !fresh => self.stale_token(r.user_ref_num(), r.cl_ord_id()),
            Ok(inbound::Message::EnterOrder(o)) => self.enter_order(client, &o, cmds),
            Ok(inbound::Message::CancelOrder(c)) => {
                let token = c.user_ref_num();
                if !self.orders.contains(client, token) {
                    // No live order by that token: OUCH's Cancel Reject, from here.
                    self.stats.cancel_rejects += 1;
                    let m = outbound::MessageRepr::CancelReject(outbound::CancelRejectRepr {
                        timestamp: ts,
                        user_ref_num: token,
                    });
                    self.sequence(client, m, Some(out));
                    return;
                }
                cmds(Command::Cancel { client, token, leave: c.quantity() }, OrderStamps::default());
                Ok(())
            }
            Ok(inbound::Message::ReplaceOrder(r)) => self.replace_order(client, &r, cmds),
            Ok(inbound::Message::AccountQuery(_)) => {
                let next = self.users.get(client as usize).map_or(1, |u| u.next_token.max(1));
                let m = outbound::MessageRepr::AccountQueryResponse(outbound::AccountQueryResponseRepr {
                    timestamp: ts,
                    next_user_ref_num: next,
                });
                self.sequence(client, m, Some(out));
                return;
            }
            // Valid OUCH we do not support (modify) or bad bytes: rejected.
            Ok(_) => Err((0, 11, Alpha::default())),
            Err(_) => Err((0, 12, Alpha::default())),
        };
        if let Err((token, code, cl_ord_id)) = r {
            self.stats.ouch_rejects += 1;
            let r = outbound::MessageRepr::Rejected(outbound::RejectedRepr {
                timestamp: ts,
                user_ref_num: token,
                reason: code,
                cl_ord_id,
            });
            self.sequence(client, r, Some(out));
        }
    }

    /// Refuses (counted) an Enter or Replace whose token is not above every
    /// token the user sent before: no engine sees it, and an order that
    /// holds the token keeps its routing.
    fn stale_token(&mut self, token: u32, cl: Alpha<14>) -> Result<(), (u32, u16, Alpha<14>)> {
        self.stats.duplicate_tokens += 1;
        Err((token, reject_code(Reject::DuplicateToken), cl))
    }

    /// An Enter Order: checked, remembered with its echo fields, handed on.
    /// Err: (token, reject code, ClOrdID) to answer with.
    fn enter_order(
        &mut self,
        client: u32,
        o: &inbound::EnterOrder,
        cmds: &mut impl FnMut(Command, OrderStamps),
    ) -> Result<(), (u32, u16, Alpha<14>)> {
        let (token, cl) = (o.user_ref_num(), o.cl_ord_id());
        let side = match o.side() {
            b'B' => Side::Buy,
            b'S' | b'T' | b'U' => Side::Sell,
            _ => return Err((token, 10, cl)),
        };
        let Some(&symbol) = self.symbols.get(&o.symbol()) else {
            return Err((token, reject_code(Reject::UnknownSymbol), cl));
        };
        let px = o.price().0;
        let market = px == 0x7FFF_FFFF_FFFF_FFFF_i64 || px == 0;
        let tif = if o.time_in_force() == b'3' { Tif::Ioc } else { Tif::Day };
        // A minimum: at most the order's quantity (the engine applies it on
        // entry, and to a day order while it rests).
        let min_qty = match min_qty(o.tail()) {
            Ok(m) if m <= o.quantity() => m,
            _ => {
                self.stats.bad_min_qty += 1;
                return Err((token, reject_code(Reject::BadMinQty), cl));
            }
        };
        let live = LiveOrder {
            symbol,
            side: o.side(),
            time_in_force: o.time_in_force(),
            display: o.display(),
            capacity: o.capacity(),
            iso: o.intermarket_sweep_eligibility(),
            cross_type: o.cross_type(),
            cl_ord_id: cl,
            open: o.quantity(),
            min_qty,
        };
        self.orders.insert(client, token, live);
        let price = if market { 0 } else { u32::try_from(px).unwrap_or(u32::MAX) };
        // Display `N`: a non-displayed order (kept off the ITCH feed).
        let hidden = o.display() == b'N';
        let new = NewOrder { client, token, symbol, side, price, qty: o.quantity(), tif, market, hidden, min_qty };
        cmds(Command::New(new), crate::sequencer::stamps(o.tail()));
        Ok(())
    }

    /// A Replace Order: the new token inherits the original's echo fields
    /// (with the replace's own time in force, display, ISO and ClOrdID).
    fn replace_order(
        &mut self,
        client: u32,
        r: &inbound::ReplaceOrder,
        cmds: &mut impl FnMut(Command, OrderStamps),
    ) -> Result<(), (u32, u16, Alpha<14>)> {
        let (token, cl) = (r.user_ref_num(), r.cl_ord_id());
        // A replacement keeps the original's minimum (capped at its
        // quantity); a Replace cannot set one.
        if min_qty(r.tail()) != Ok(0) {
            self.stats.bad_min_qty += 1;
            return Err((token, reject_code(Reject::BadMinQty), cl));
        }
        if let Some(&v) = self.orders.get(client, r.orig_user_ref_num()) {
            let live = LiveOrder {
                time_in_force: r.time_in_force(),
                display: r.display(),
                iso: r.intermarket_sweep_eligibility(),
                cl_ord_id: cl,
                open: r.quantity(),
                min_qty: v.min_qty.min(r.quantity()),
                ..v
            };
            self.orders.insert(client, token, live);
        }
        let price = u32::try_from(r.price().0).unwrap_or(u32::MAX);
        let cmd = Command::Replace { client, token: r.orig_user_ref_num(), new_token: token, price, qty: r.quantity() };
        cmds(cmd, crate::sequencer::stamps(r.tail()));
        Ok(())
    }

    /// Journals an outbound message for `client`; writes it to `out` (the
    /// client's connection, if online) as a sequenced data packet.
    fn sequence(&mut self, client: u32, m: outbound::MessageRepr, out: Option<&mut Vec<u8>>) {
        let mut b = [0u8; MESSAGE_MAX];
        let Ok(n) = m.emit(&mut b) else { return };
        let Some(user) = self.users.get_mut(client as usize) else { return };
        if user.journal.len() < JOURNAL_MAX {
            user.journal.push(&b[..n]);
        }
        self.stats.sequenced_out += 1;
        if let (Some(out), true) = (out, user.online) {
            write(out, PacketRepr::SequencedData(&b[..n]));
        }
    }

    /// Journals `m` for `client` and hands its bytes to `deliver` if the client is online.
    fn send(&mut self, client: u32, m: outbound::MessageRepr, deliver: &mut impl FnMut(u32, &[u8])) {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        self.sequence(client, m, Some(&mut buf));
        if !buf.is_empty() {
            deliver(client, &buf);
        }
        self.scratch = buf;
    }

    /// The OUCH symbol of engine symbol `symbol` (1-based).
    fn ouch_symbol(&self, symbol: u16) -> Alpha<8> {
        self.names.get(usize::from(symbol).wrapping_sub(1)).copied().unwrap_or_default()
    }

    /// What the gateway remembers of a client's order, or what an unknown one echoes.
    fn live(&self, client: u32, token: u32, symbol: u16, side: Side) -> LiveOrder {
        self.orders.get(client, token).copied().unwrap_or(LiveOrder {
            symbol,
            side: if side == Side::Buy { b'B' } else { b'S' },
            time_in_force: b'0',
            display: b'Y',
            capacity: b'A',
            iso: b'N',
            cross_type: b'N',
            cl_ord_id: Alpha::default(),
            open: 0,
            min_qty: 0,
        })
    }

    /// Order Accepted for an `Event::Accepted`: every field as the client entered it.
    fn accepted(&self, ts: u64, ev: &Event) -> Option<outbound::MessageRepr> {
        let Event::Accepted { client, token, ref_num, symbol, side, price, qty } = *ev else { return None };
        let o = self.live(client, token, symbol, side);
        let (appendage_length, appendage) = echo_appendage(&o);
        Some(outbound::MessageRepr::OrderAccepted(outbound::OrderAcceptedRepr {
            timestamp: ts,
            user_ref_num: token,
            side: o.side,
            quantity: qty,
            symbol: self.ouch_symbol(symbol),
            price: OuchPrice(i64::from(price)),
            time_in_force: o.time_in_force,
            display: o.display,
            order_reference_number: ref_num,
            capacity: o.capacity,
            intermarket_sweep_eligibility: o.iso,
            cross_type: o.cross_type,
            order_state: b'L',
            cl_ord_id: o.cl_ord_id,
            appendage_length,
            appendage,
        }))
    }

    /// Order Replaced for an `Event::Replaced`: the new token takes the old one's place.
    fn replaced(&mut self, ts: u64, ev: &Event) -> Option<outbound::MessageRepr> {
        let Event::Replaced { client, old_token, new_token, new_ref, symbol, price, qty, .. } = *ev else {
            return None;
        };
        let old = self.orders.remove(client, old_token);
        let o = self.orders.get(client, new_token).copied().or(old).unwrap_or(self.live(
            client,
            new_token,
            symbol,
            Side::Buy,
        ));
        self.orders.insert(client, new_token, LiveOrder { open: qty, ..o });
        // The minimum the replacement kept, as Order Accepted would echo it.
        let (appendage_length, appendage) = echo_appendage(&o);
        Some(outbound::MessageRepr::OrderReplaced(outbound::OrderReplacedRepr {
            timestamp: ts,
            orig_user_ref_num: old_token,
            user_ref_num: new_token,
            side: o.side,
            quantity: qty,
            symbol: self.ouch_symbol(symbol),
            price: OuchPrice(i64::from(price)),
            time_in_force: o.time_in_force,
            display: o.display,
            order_reference_number: new_ref,
            capacity: o.capacity,
            intermarket_sweep_eligibility: o.iso,
            cross_type: o.cross_type,
            order_state: b'L',
            cl_ord_id: o.cl_ord_id,
            appendage_length,
            appendage,
        }))
    }

    /// `qty` of a client's order traded or left; `left`: what stays open, when known.
    fn reduce(&mut self, client: u32, token: u32, qty: u32, left: Option<u32>) {
        if let Some(o) = self.orders.get_mut(client, token) {
            o.open = left.unwrap_or(o.open.saturating_sub(qty));
            if o.open == 0 {
                self.orders.remove(client, token);
            }
        }
    }

    /// The two Order Executed messages of an `Event::Executed` (maker, then
    /// taker), after taking the traded shares off both orders.
    fn executions(&mut self, ts: u64, ev: &Event) -> Vec<(u32, outbound::MessageRepr)> {
        let Event::Executed {
            price,
            qty,
            match_num,
            maker_client,
            maker_token,
            maker_left,
            taker_client,
            taker_token,
            ..
        } = *ev
        else {
            return Vec::new();
        };
        self.reduce(maker_client, maker_token, qty, Some(maker_left));
        self.reduce(taker_client, taker_token, qty, None);
        [(maker_client, maker_token, b'A'), (taker_client, taker_token, b'R')]
            .map(|(client, token, flag)| {
                let m = outbound::MessageRepr::OrderExecuted(outbound::OrderExecutedRepr {
                    timestamp: ts,
                    user_ref_num: token,
                    quantity: qty,
                    price: OuchPrice(i64::from(price)),
                    liquidity_flag: flag,
                    match_number: match_num,
                    appendage_length: 0,
                    appendage: Appendage::EMPTY,
                });
                (client, m)
            })
            .into()
    }

    /// Live orders the gateway keeps routing and echo fields for.
    pub fn live_orders(&self) -> usize {
        self.orders.len()
    }

    /// An engine event: the OUCH messages it means for each client involved,
    /// journaled, and handed to `deliver(client, bytes)` for online clients.
    pub fn on_event(&mut self, now_ns: u64, ev: &Event, deliver: &mut impl FnMut(u32, &[u8])) {
        let mut send = |g: &mut Gateway, client: u32, m: outbound::MessageRepr| g.send(client, m, deliver);
        let ts = since_midnight(now_ns);
        match *ev {
            Event::Accepted { client, .. } => {
                if let Some(m) = self.accepted(ts, ev) {
                    send(self, client, m);
                }
            }
            Event::Rejected { client, token, reason } => {
                self.stats.ouch_rejects += 1;
                let cl_ord_id = self.orders.get(client, token).map(|o| o.cl_ord_id).unwrap_or_default();
                // A duplicate token names someone else's live order: leave its routing alone.
                if reason != Reject::DuplicateToken {
                    self.orders.remove(client, token);
                }
                let m = outbound::MessageRepr::Rejected(outbound::RejectedRepr {
                    timestamp: ts,
                    user_ref_num: token,
                    reason: reject_code(reason),
                    cl_ord_id,
                });
                send(self, client, m);
            }
            Event::Executed { .. } => {
                for (client, m) in self.executions(ts, ev) {
                    send(self, client, m);
                }
            }
            Event::Canceled { client, token, qty, left, reason, .. } => {
                self.reduce(client, token, qty, Some(left));
                let code = match reason {
                    CancelReason::User => b'U',
                    CancelReason::ImmediateOrCancel => b'I',
                    CancelReason::Replaced => return, // the replacement's messages follow
                };
                let m = outbound::MessageRepr::OrderCanceled(outbound::OrderCanceledRepr {
                    timestamp: ts,
                    user_ref_num: token,
                    quantity: qty,
                    reason: code,
                });
                send(self, client, m);
            }
            Event::Replaced { client, .. } => {
                if let Some(m) = self.replaced(ts, ev) {
                    send(self, client, m);
                }
            }
            Event::Booked { .. } | Event::Cross { .. } => {}
        }
    }

    /// Heartbeats and the idle timeout: bytes to write, or close.
    pub fn on_tick(&mut self, conn: &mut Conn, now_ns: u64, out: &mut Vec<u8>) -> Result<(), Close> {
        if conn.user.is_none() && now_ns.saturating_sub(conn.opened_ns) > self.cfg.login_timeout_ns {
            self.closed(conn, Close::LoginTimeout);
            return Err(Close::LoginTimeout);
        }
        if now_ns.saturating_sub(conn.last_rx_ns) > self.cfg.idle_timeout_ns {
            self.closed(conn, Close::IdleTimeout);
            return Err(Close::IdleTimeout);
        }
        if conn.user.is_some() && now_ns.saturating_sub(conn.last_tx_ns) >= self.cfg.heartbeat_ns {
            write(out, PacketRepr::ServerHeartbeat);
            conn.last_tx_ns = now_ns;
        }
        Ok(())
    }

    /// Note that bytes were written to `conn` (resets its heartbeat timer).
    pub fn wrote(&self, conn: &mut Conn, now_ns: u64) {
        conn.last_tx_ns = now_ns;
    }
}
