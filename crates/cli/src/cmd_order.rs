//! `fairfeed order`: send one order (or cancel, replace, query) to an OUCH 5.0
//! exchange by hand — `fairfeed order buy AAPL 100 @ 185.00` — over one
//! SoupBinTCP session: log in, send, print what the exchange answers, log out.
//! The bytes come from `fairfeed_exchange::client`; this is only the socket.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use fairfeed_exchange::client;
use fairfeed_wire::ouch::outbound::Message;
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr};
use serde_json::json;

/// Bytes of unread answers the tool holds at most (a session's history is
/// read in pieces; no single SoupBinTCP packet is larger than 64 KiB).
const READ_BUFFER: usize = 1 << 17;

#[derive(clap::Args)]
#[command(after_help = "Examples (against `fairfeed exchange` with its default configuration):\n  \
    fairfeed order buy AAPL 100 @ 185.00\n  fairfeed order sell AAPL 40 @ 185 --ioc\n  \
    fairfeed order cancel 1\n  fairfeed order replace 1 50 @ 184.50\n  fairfeed order history --json")]
pub struct Args {
    /// The exchange's OUCH 5.0 (SoupBinTCP) address.
    #[arg(long, global = true, default_value = "127.0.0.1:15000", value_parser = crate::fmt::dest_addr)]
    server: SocketAddr,
    /// SoupBinTCP username, 1–6 ASCII characters (the default exchange's user).
    #[arg(long, global = true, default_value = "FF0001", value_parser = username)]
    user: String,
    /// SoupBinTCP password, up to 10 ASCII characters.
    #[arg(long, global = true, default_value = "secret", value_parser = password)]
    password: String,
    /// After the answer, keep printing what arrives (executions) until this many ms pass in silence; 0..=1,000,000.
    #[arg(long, global = true, default_value_t = 200.0, value_parser = crate::fmt::ms)]
    wait_ms: f64,
    /// Give up when the exchange has not answered within this many ms; 1..=600,000.
    #[arg(long, global = true, default_value_t = 3_000.0, value_parser = timeout_ms)]
    timeout_ms: f64,
    /// One JSON object per message the exchange sent, instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Buy: `buy SYMBOL QTY [@] PRICE`.
    Buy(OrderArgs),
    /// Sell: `sell SYMBOL QTY [@] PRICE`.
    Sell(OrderArgs),
    /// Cancel order TOKEN (all of it, or down to --leave shares).
    Cancel {
        /// The order's token (UserRefNum), as `buy`/`sell` printed it.
        #[arg(allow_negative_numbers = true)]
        token: u32,
        /// Shares to leave open (0: cancel all).
        #[arg(long, default_value_t = 0)]
        leave: u32,
    },
    /// Replace order TOKEN by QTY shares at PRICE under a new token: `replace TOKEN QTY [@] PRICE`.
    Replace {
        /// The order's token (UserRefNum).
        #[arg(allow_negative_numbers = true)]
        token: u32,
        /// The new quantity, 1..=999,999,999 shares.
        #[arg(value_parser = clap::value_parser!(u32).range(1..=999_999_999), allow_negative_numbers = true)]
        qty: u32,
        /// `@ PRICE` or `PRICE`, in dollars with up to 4 decimals.
        #[arg(num_args = 1..=2, value_name = "[@] PRICE", allow_negative_numbers = true)]
        price: Vec<String>,
        /// The new token (default: the next free one, from an OUCH Account Query).
        #[arg(long)]
        new_token: Option<u32>,
    },
    /// Print every message of this user's session since it began.
    History,
    /// Print the next free token (OUCH Account Query).
    NextToken,
    /// Send a seeded flow of orders (buys and sells around a mid price, some
    /// resting, some trading) over one session, paced, and print a summary
    /// once every order is answered.
    Flow(FlowArgs),
}

#[derive(clap::Args)]
struct FlowArgs {
    /// Orders to send, 1..=1,000,000.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    orders: u32,
    /// Orders per second (the exchange's answers are read meanwhile).
    #[arg(long, default_value_t = 1_000.0, value_parser = crate::fmt::order_rate)]
    rate: f64,
    /// Seed: the same seed sends the same orders.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Symbols, comma-separated (as configured on the exchange).
    #[arg(long, value_delimiter = ',', default_value = "AAPL,MSFT,NVDA", value_parser = symbol)]
    symbols: Vec<String>,
    /// The mid price the orders are placed around, in dollars.
    #[arg(long, default_value = "185.00", allow_negative_numbers = true)]
    mid: String,
}

#[derive(clap::Args)]
struct OrderArgs {
    /// The symbol, 1–8 characters A–Z, 0–9, '.', '-' (as configured on the exchange).
    #[arg(value_parser = symbol)]
    symbol: String,
    /// Shares, 1..=999,999,999.
    #[arg(value_parser = clap::value_parser!(u32).range(1..=999_999_999), allow_negative_numbers = true)]
    qty: u32,
    /// `@ PRICE` or `PRICE`, in dollars with up to 4 decimals (e.g. `@ 185.00`).
    #[arg(num_args = 1..=2, value_name = "[@] PRICE", allow_negative_numbers = true)]
    price: Vec<String>,
    /// Immediate or cancel: what does not trade at once is canceled.
    #[arg(long)]
    ioc: bool,
    /// Not displayed: rests and trades, never shown on the ITCH feed.
    #[arg(long)]
    hidden: bool,
    /// Minimum quantity (OUCH option 3), 1..=999,999,999, at most the
    /// quantity: trade at least this many shares at once on entry, or none;
    /// a day order that could not then rests hidden and trades only with an
    /// incoming order of at least this many shares.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=999_999_999))]
    min_qty: Option<u32>,
    /// The order's token (UserRefNum; default: the next free one, from an OUCH Account Query).
    #[arg(long)]
    token: Option<u32>,
    /// A DBO delivery clock, `SEQ:NS` (OUCH appendage tag 0xF1): the last
    /// market-data sequence number delivered and the response time since it,
    /// ns (may be negative). What a release point stamps; for testing an
    /// exchange configured `ordering = "dbo"`.
    #[arg(long, value_parser = delivery_clock, allow_hyphen_values = true)]
    delivery_clock: Option<fairfeed_exchange::ordering::DeliveryClock>,
}

/// `SEQ:NS`, e.g. `1042:2500`.
fn delivery_clock(s: &str) -> Result<fairfeed_exchange::ordering::DeliveryClock, String> {
    let bad = || format!("{s:?} is not SEQ:NS (a data sequence number and a response time in ns, e.g. 1042:2500)");
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    let data_seq = a.parse::<u64>().map_err(|_| bad())?;
    let response_ns = b.parse::<i64>().map_err(|_| bad())?;
    Ok(fairfeed_exchange::ordering::DeliveryClock { data_seq, response_ns })
}

fn username(s: &str) -> Result<String, String> {
    if (1..=6).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a username (1–6 printable ASCII characters)"))
    }
}

fn password(s: &str) -> Result<String, String> {
    if s.len() <= 10 && s.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a password (up to 10 printable ASCII characters)"))
    }
}

fn timeout_ms(s: &str) -> Result<f64, String> {
    crate::fmt::f64_in(s, 1.0, 600_000.0, "ms")
}

fn symbol(s: &str) -> Result<String, String> {
    if (1..=8).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b"._-".contains(&b))
    {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a symbol (1–8 characters A–Z, 0–9, '.', '-', '_')"))
    }
}

/// `["@", "185.00"]`, `["185.00"]` or `["@185.00"]` → 1,850,000 (4 implied decimals).
fn price(words: &[String]) -> anyhow::Result<i64> {
    let joined = words.concat();
    let text = joined.strip_prefix('@').unwrap_or(&joined).trim();
    let bad = || anyhow::anyhow!("price {joined:?} is not a price in dollars (0.0001..=199999.9999, e.g. `@ 185.00`)");
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && frac.is_empty()
        || frac.len() > 4
        || !whole.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
        || whole.len() > 6
    {
        return Err(bad());
    }
    let whole: i64 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| bad())? };
    let frac: i64 = format!("{frac:0<4}").parse().map_err(|_| bad())?;
    let p = whole * 10_000 + frac;
    if !(1..=1_999_999_999).contains(&p) {
        return Err(bad());
    }
    Ok(p)
}

fn dollars(p: i64) -> String {
    format!("{}.{:04}", p / 10_000, p % 10_000)
}

/// What the exchange's reject codes mean (see `fairfeed_exchange::gateway::reject_code`).
fn reject_reason(code: u16) -> &'static str {
    match code {
        1 => "unknown symbol",
        2 => "bad quantity",
        3 => "bad price",
        4 => "token not above every token sent before (OUCH 5.0: day-unique, increasing)",
        5 => "no such order",
        6 => "too many orders",
        7 => "too many price levels",
        8 => "bad minimum quantity (at most the quantity, not on a replace)",
        10 => "bad side",
        11 => "message not supported",
        12 => "malformed message",
        _ => "unknown reason",
    }
}

/// One SoupBinTCP session to the exchange.
struct Session {
    stream: TcpStream,
    buf: Vec<u8>,
    have: usize,
    timeout: Duration,
}

/// A packet from the exchange, owned.
enum Got {
    Accepted,
    LoginRejected(u8),
    Data(Vec<u8>),
    Heartbeat,
}

impl Session {
    fn open(a: &Args) -> anyhow::Result<Session> {
        let timeout = Duration::from_secs_f64(a.timeout_ms / 1e3);
        let stream = TcpStream::connect_timeout(&a.server, timeout)
            .with_context(|| format!("connecting to the exchange at {}", a.server))?;
        stream.set_nodelay(true)?;
        Ok(Session { stream, buf: vec![0; READ_BUFFER], have: 0, timeout })
    }

    fn send(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.stream.write_all(bytes).context("sending to the exchange")
    }

    /// The next packet, or `None` when `until` passes first.
    fn next(&mut self, until: Instant) -> anyhow::Result<Option<Got>> {
        loop {
            match split_packet(&self.buf[..self.have]) {
                Ok(Some((p, used))) => {
                    let got = match p {
                        PacketRepr::LoginAccepted { .. } => Got::Accepted,
                        PacketRepr::LoginRejected { reason } => Got::LoginRejected(reason),
                        PacketRepr::SequencedData(m) => Got::Data(m.to_vec()),
                        PacketRepr::EndOfSession => bail!("the exchange ended the session"),
                        _ => Got::Heartbeat,
                    };
                    self.buf.copy_within(used..self.have, 0);
                    self.have -= used;
                    return Ok(Some(got));
                }
                Ok(None) => {}
                Err(e) => bail!("the exchange sent bytes that are not SoupBinTCP: {e}"),
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            match self.stream.read(&mut self.buf[self.have..]) {
                Ok(0) => bail!("the exchange closed the connection"),
                Ok(n) => self.have += n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(e).context("reading from the exchange"),
            }
        }
    }

    fn login(&mut self, a: &Args, from_sequence: u64) -> anyhow::Result<()> {
        let mut b = Vec::new();
        client::login(&a.user, &a.password, from_sequence, &mut b);
        self.send(&b)?;
        let until = Instant::now() + self.timeout;
        loop {
            match self.next(until)? {
                Some(Got::Accepted) => return Ok(()),
                Some(Got::LoginRejected(r)) => bail!(
                    "login as {:?} refused: {}",
                    a.user,
                    if r == b'A' {
                        "not authorized (user or password)"
                    } else {
                        "session not available (already logged in?)"
                    }
                ),
                Some(_) => {}
                None => bail!("the exchange at {} did not answer the login within {:?}", a.server, self.timeout),
            }
        }
    }
}

/// What one outbound message says, as text and as JSON.
struct Said {
    text: String,
    json: serde_json::Value,
}

fn describe(m: &[u8]) -> Said {
    let s = |v: &[u8]| String::from_utf8_lossy(v).trim().to_string();
    let c = |b: u8| char::from(b).to_string();
    let (text, json) = match Message::parse(m) {
        Ok(Message::OrderAccepted(o)) => {
            // The minimum quantity the exchange echoed (OUCH option 3), if any.
            let min = fairfeed_exchange::gateway::min_qty(o.tail()).ok().filter(|&m| m > 0);
            (
                format!(
                    "accepted   token {} {} {} {} @ {} ref {} {}{}",
                    o.user_ref_num(),
                    if o.side() == b'B' { "BUY" } else { "SELL" },
                    o.quantity(),
                    s(&o.symbol().0),
                    dollars(o.price().0),
                    o.order_reference_number(),
                    if o.order_state() == b'L' { "live" } else { "dead" },
                    min.map_or(String::new(), |m| format!(" min {m}"))
                ),
                json!({"type": "accepted", "token": o.user_ref_num(), "side": c(o.side()), "qty": o.quantity(),
                       "symbol": s(&o.symbol().0), "price": dollars(o.price().0),
                       "order_ref": o.order_reference_number(), "state": c(o.order_state()), "min_qty": min}),
            )
        }
        Ok(Message::OrderExecuted(e)) => (
            format!(
                "executed   token {} {} @ {} match {} liquidity {}",
                e.user_ref_num(),
                e.quantity(),
                dollars(e.price().0),
                e.match_number(),
                c(e.liquidity_flag())
            ),
            json!({"type": "executed", "token": e.user_ref_num(), "qty": e.quantity(), "price": dollars(e.price().0),
                   "match": e.match_number(), "liquidity": c(e.liquidity_flag())}),
        ),
        Ok(Message::OrderCanceled(x)) => (
            format!("canceled   token {} {} shares, reason {}", x.user_ref_num(), x.quantity(), c(x.reason())),
            json!({"type": "canceled", "token": x.user_ref_num(), "qty": x.quantity(), "reason": c(x.reason())}),
        ),
        Ok(Message::OrderReplaced(r)) => (
            format!(
                "replaced   token {} → {} {} @ {} ref {}",
                r.orig_user_ref_num(),
                r.user_ref_num(),
                r.quantity(),
                dollars(r.price().0),
                r.order_reference_number()
            ),
            json!({"type": "replaced", "token": r.orig_user_ref_num(), "new_token": r.user_ref_num(),
                   "qty": r.quantity(), "price": dollars(r.price().0), "order_ref": r.order_reference_number()}),
        ),
        Ok(Message::Rejected(r)) => (
            format!("rejected   token {}: {} (code {})", r.user_ref_num(), reject_reason(r.reason()), r.reason()),
            json!({"type": "rejected", "token": r.user_ref_num(), "code": r.reason(), "reason": reject_reason(r.reason())}),
        ),
        Ok(Message::CancelReject(r)) => (
            format!("cancel-rejected token {}: no live order by that token", r.user_ref_num()),
            json!({"type": "cancel_reject", "token": r.user_ref_num()}),
        ),
        Ok(Message::AccountQueryResponse(q)) => (
            format!("next token {}", q.next_user_ref_num()),
            json!({"type": "next_token", "token": q.next_user_ref_num()}),
        ),
        Ok(Message::SystemEvent(e)) => {
            (format!("system     {}", c(e.event_code())), json!({"type": "system", "event": c(e.event_code())}))
        }
        Ok(other) => (format!("{other:?}"), json!({"type": "other", "text": format!("{other:?}")})),
        Err(e) => (format!("undecodable: {e}"), json!({"type": "undecodable", "error": e.to_string()})),
    };
    Said { text, json }
}

/// Is `m` the exchange's final word on `token` for this action? `Some(true)`: done; `Some(false)`: refused.
fn verdict(m: &[u8], action: &Action, token: u32) -> Option<bool> {
    match (Message::parse(m).ok()?, action) {
        (Message::Rejected(r), _) if r.user_ref_num() == token || r.user_ref_num() == 0 => Some(false),
        (Message::OrderAccepted(o), Action::Buy(_) | Action::Sell(_)) if o.user_ref_num() == token => Some(true),
        (Message::OrderCanceled(c), Action::Cancel { .. }) if c.user_ref_num() == token => Some(true),
        (Message::CancelReject(c), Action::Cancel { .. }) if c.user_ref_num() == token => Some(false),
        (Message::OrderReplaced(r), Action::Replace { .. }) if r.orig_user_ref_num() == token => Some(true),
        (Message::AccountQueryResponse(_), Action::NextToken) => Some(true),
        _ => None,
    }
}

/// The request `a` asks for, into `b`; returns the order token its answer names.
fn build_request(a: &Args, s: &mut Session, px: Option<i64>, b: &mut Vec<u8>) -> anyhow::Result<u32> {
    Ok(match &a.action {
        Action::Buy(o) | Action::Sell(o) => {
            let token = match o.token {
                Some(t) => t,
                None => next_token(s)?,
            };
            let side = if matches!(a.action, Action::Buy(_)) { b'B' } else { b'S' };
            let order = client::Order {
                token,
                side,
                qty: o.qty,
                symbol: &o.symbol,
                price: px.unwrap_or_default(),
                ioc: o.ioc,
                hidden: o.hidden,
                stamp: None,
                clock: o.delivery_clock,
                min_qty: o.min_qty.unwrap_or(0),
            };
            client::enter_order(&order, b);
            token
        }
        Action::Cancel { token, leave } => {
            client::cancel_order(*token, *leave, b);
            *token
        }
        Action::Replace { token, qty, new_token, .. } => {
            let new = match new_token {
                Some(t) => *t,
                None => next_token(s)?,
            };
            client::replace_order(*token, new, *qty, px.unwrap_or_default(), b);
            *token
        }
        Action::NextToken => {
            client::account_query(b);
            0
        }
        Action::History | Action::Flow(_) => 0,
    })
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Action::Flow(f) = &a.action {
        return run_flow(&a, f);
    }
    // Everything a user can get wrong is checked before connecting.
    let px = match &a.action {
        Action::Buy(o) | Action::Sell(o) => Some(price(&o.price)?),
        Action::Replace { price: p, .. } => Some(price(p)?),
        _ => None,
    };
    let mut s = Session::open(&a)?;
    s.login(&a, if matches!(a.action, Action::History) { 1 } else { 0 })?;
    let mut out = std::io::stdout().lock();
    let mut print = |m: &[u8]| -> anyhow::Result<()> {
        let said = describe(m);
        if a.json {
            writeln!(out, "{}", said.json)?;
        } else {
            writeln!(out, "{}", said.text)?;
        }
        Ok(())
    };
    let mut b = Vec::new();
    let token = build_request(&a, &mut s, px, &mut b)?;
    s.send(&b)?;
    let wait = Duration::from_secs_f64(a.wait_ms / 1e3);
    let mut verdict_seen: Option<bool> = if matches!(a.action, Action::History) { Some(true) } else { None };
    let mut until =
        Instant::now() + if verdict_seen.is_some() { wait.max(Duration::from_millis(50)) } else { s.timeout };
    while let Some(got) = s.next(until)? {
        let Got::Data(m) = got else { continue };
        print(&m)?;
        if verdict_seen.is_none() {
            verdict_seen = verdict(&m, &a.action, token);
        }
        if verdict_seen.is_some() {
            // After the answer, whatever follows it closely (executions, the
            // IOC remainder's cancel) belongs to it too.
            until = Instant::now() + wait;
        }
    }
    let mut bye = Vec::new();
    client::logout(&mut bye);
    let _ = s.send(&bye);
    match verdict_seen {
        Some(true) => Ok(()),
        Some(false) => bail!("the exchange refused it (see above)"),
        None => bail!("the exchange did not answer within {:?}", s.timeout),
    }
}

/// What a flow's orders came to.
#[derive(Debug, Default, serde::Serialize)]
struct FlowSummary {
    sent: u64,
    accepted: u64,
    rejected: u64,
    executions: u64,
    executed_shares: u64,
    /// Orders with no answer when the flow gave up waiting.
    unanswered: u64,
    seconds: f64,
}

impl FlowSummary {
    fn count(&mut self, m: &[u8], first: u32, last: u32) {
        let mine = |t: u32| (first..=last).contains(&t);
        match Message::parse(m) {
            Ok(Message::OrderAccepted(o)) if mine(o.user_ref_num()) => self.accepted += 1,
            Ok(Message::Rejected(r)) if mine(r.user_ref_num()) => self.rejected += 1,
            Ok(Message::OrderExecuted(e)) if mine(e.user_ref_num()) => {
                self.executions += 1;
                self.executed_shares += u64::from(e.quantity());
            }
            _ => {}
        }
    }
}

/// `order flow`: the seeded orders, paced, over one session.
fn run_flow(a: &Args, f: &FlowArgs) -> anyhow::Result<()> {
    let mid = price(std::slice::from_ref(&f.mid))?;
    anyhow::ensure!(
        mid > client::FLOW_SPREAD_TICKS * 100,
        "--mid {} is too low for a flow that strays {} cents from it",
        f.mid,
        client::FLOW_SPREAD_TICKS
    );
    let orders = client::flow(f.seed, f.orders as usize, f.symbols.len(), mid);
    let mut s = Session::open(a)?;
    s.login(a, 0)?;
    let first = next_token(&mut s)?;
    let start = Instant::now();
    let gap = Duration::from_secs_f64(1.0 / f.rate);
    let mut sum = FlowSummary::default();
    let last = first + orders.len() as u32 - 1;
    let mut b = Vec::new();
    for (k, o) in orders.iter().enumerate() {
        let token = first + k as u32;
        b.clear();
        let order = client::Order {
            token,
            side: o.side,
            qty: o.qty,
            symbol: &f.symbols[o.symbol],
            price: o.price,
            ioc: false,
            hidden: false,
            stamp: None,
            clock: None,
            min_qty: 0,
        };
        client::enter_order(&order, &mut b);
        s.send(&b)?;
        sum.sent += 1;
        // Read the answers that came until the next order is due.
        let due = start + gap * (k as u32 + 1);
        while let Some(got) = s.next(due)? {
            if let Got::Data(m) = got {
                sum.count(&m, first, last);
            }
        }
    }
    drain_answers(a, &mut s, &mut sum, (first, last))?;
    sum.unanswered = sum.sent - sum.accepted - sum.rejected;
    sum.seconds = start.elapsed().as_secs_f64();
    let mut bye = Vec::new();
    client::logout(&mut bye);
    let _ = s.send(&bye);
    if a.json {
        println!("{}", serde_json::to_string(&sum)?);
    } else {
        println!(
            "flow: {} orders sent (tokens {first}..={last}) in {:.2} s: {} accepted, {} rejected, {} executions ({} shares), {} unanswered",
            sum.sent, sum.seconds, sum.accepted, sum.rejected, sum.executions, sum.executed_shares, sum.unanswered
        );
    }
    anyhow::ensure!(sum.unanswered == 0, "{} orders were not answered within {:?}", sum.unanswered, s.timeout);
    Ok(())
}

/// Every order answered (accepted or rejected), then what trades follow
/// closely (until `--wait-ms` passes without one).
fn drain_answers(a: &Args, s: &mut Session, sum: &mut FlowSummary, (first, last): (u32, u32)) -> anyhow::Result<()> {
    let until = Instant::now() + s.timeout;
    while sum.accepted + sum.rejected < sum.sent {
        match s.next(until)? {
            Some(Got::Data(m)) => sum.count(&m, first, last),
            Some(_) => {}
            None => break,
        }
    }
    let wait = Duration::from_secs_f64(a.wait_ms / 1e3);
    let mut quiet = Instant::now() + wait;
    while let Some(got) = s.next(quiet)? {
        if let Got::Data(m) = got {
            sum.count(&m, first, last);
            quiet = Instant::now() + wait;
        }
    }
    Ok(())
}

/// Asks the exchange for the next free token.
fn next_token(s: &mut Session) -> anyhow::Result<u32> {
    let mut b = Vec::new();
    client::account_query(&mut b);
    s.send(&b)?;
    let until = Instant::now() + s.timeout;
    while let Some(got) = s.next(until)? {
        if let Got::Data(m) = got {
            if let Ok(Message::AccountQueryResponse(q)) = Message::parse(&m) {
                return Ok(q.next_user_ref_num());
            }
        }
    }
    bail!("the exchange did not answer the account query within {:?} (give --token)", s.timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(words: &[&str]) -> anyhow::Result<i64> {
        price(&words.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn prices_read_as_dollars_with_four_decimals() {
        assert_eq!(p(&["@", "185.00"]).unwrap(), 1_850_000);
        assert_eq!(p(&["185"]).unwrap(), 1_850_000);
        assert_eq!(p(&["@185.5"]).unwrap(), 1_855_000);
        assert_eq!(p(&[".0001"]).unwrap(), 1);
        assert_eq!(p(&["199999.9999"]).unwrap(), 1_999_999_999);
        for bad in [&["@"][..], &["0"], &["-1"], &["1.00001"], &["abc"], &["1e3"], &["200000"], &["@", "NaN"], &["."]] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}
