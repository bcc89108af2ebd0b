//! A synthetic NASDAQ TotalView-ITCH 5.0 feed that looks like a real one.
//!
//! Every order event comes from a simulated limit order book per symbol, so the
//! stream is internally consistent: an execute, cancel, replace or delete always
//! names a live order with enough shares, and order references and match
//! numbers only grow. Around the books:
//!
//! - **Session shape**: start-of-messages and start-of-system-hours events, a
//!   stock directory and a trading action per symbol, MWCB decline levels and
//!   market-maker positions, market open; then the order flow; then end of
//!   market hours, end of system hours, end of messages, and a MoldUDP64
//!   end-of-session packet. Heartbeats fill gaps longer than a second.
//! - **Rate**: bursts of messages arrive as a Poisson process whose rate follows
//!   an intraday U-curve (peaks at open and close) around the mean rate
//!   `rate_msgs_per_s` (default: seed 001's 6,700 messages/s).
//! - **Packing and burstiness** (seed 001's characterization): each burst is one
//!   MoldUDP64 packet of 1 + Poisson(mean − 1) messages (mean ≈ 5), capped at
//!   1,400 bytes; messages in a burst mostly concern one symbol, and a new burst
//!   often revisits a recently active symbol, so same-symbol repeats mostly fall
//!   within a millisecond. Symbol popularity is Zipf-like.
//!
//! The generator is a pure iterator of packets: deterministic for a seed, no
//! clock, no I/O. ITCH message sizes are fixed by the specification, so the
//! mean message size is what the type mix makes it (~30 bytes), not seed 001's
//! 54 bytes, which belonged to a different protocol (Euronext XDP).

use std::collections::{HashSet, VecDeque};

use fairfeed_wire::itch::{self, MessageRepr};
use fairfeed_wire::moldudp64::{PacketBuilder, PacketRepr, Session, COUNT_END_OF_SESSION, PACKET_LEN_DEFAULT_MAX};
use fairfeed_wire::{Alpha, Price4, Price8, Stock, Timestamp48};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rand_distr::{Distribution, Exp, Poisson};

/// Live orders a symbol's book holds at most; at the limit the generator
/// removes orders instead of adding. Bounds memory at ~24 bytes × this × symbols.
pub const BOOK_ORDERS_MAX: usize = 4096;
/// Symbols a feed may have (stock locate codes are u16, 0 is market-wide).
pub const SYMBOLS_MAX: u32 = 65_535;
/// Recently active symbols a new burst may revisit.
const RECENT_SYMBOLS: usize = 8;
/// Idle time after which a heartbeat is sent, as real MoldUDP64 feeds do.
pub const HEARTBEAT_INTERVAL_NS: u64 = 1_000_000_000;
/// 09:30:00 Eastern, in nanoseconds since midnight.
pub const MARKET_OPEN_NS: u64 = 34_200_000_000_000;
/// Publisher latency between the last message's timestamp and the send.
const SEND_DELAY_NS: u64 = 2_000;
/// One cent in `Price4` units.
const TICK: u32 = 100;
/// S&P 500 reference value for the MWCB decline levels: $4,300 in `Price8` units.
const MWCB_REFERENCE: u64 = 430_000_000_000;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenConfig {
    pub seed: u64,
    /// Total ITCH messages, session events and directory included.
    pub messages: u64,
    pub symbols: u32,
    pub session: Session,
    /// Mean message rate over the session (messages per second).
    pub rate_msgs_per_s: f64,
    /// Mean messages per MoldUDP64 packet (≥ 1).
    pub msgs_per_packet_mean: f64,
    /// Largest MoldUDP64 packet (UDP payload) in bytes.
    pub packet_len_max: usize,
    /// ITCH timestamp of the market open.
    pub start_ns: u64,
    /// Chance that a message in a burst concerns the burst's symbol.
    pub same_symbol_in_burst: f64,
    /// Chance that a new burst revisits a recently active symbol.
    pub repeat_recent_symbol: f64,
    /// Also emit one message of each rare type (K O W h J N Y I Q B), so a
    /// feed exercises all 23 ITCH types.
    pub all_types: bool,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            seed: 1,
            messages: 100_000,
            symbols: 100,
            session: Session::from_str_padded("FAIRFEED01"),
            rate_msgs_per_s: 6_700.0,
            msgs_per_packet_mean: 5.05,
            packet_len_max: PACKET_LEN_DEFAULT_MAX,
            start_ns: MARKET_OPEN_NS,
            same_symbol_in_burst: 0.75,
            repeat_recent_symbol: 0.5,
            all_types: false,
        }
    }
}

/// Why a configuration cannot be generated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GenError {
    #[error("--symbols must be between 1 and {SYMBOLS_MAX}, got {0}")]
    Symbols(u32),
    #[error("--messages must be at least {needed} for {symbols} symbols (session events and directory), got {got}")]
    TooFewMessages { needed: u64, symbols: u32, got: u64 },
    #[error("rate and messages per packet must be positive and finite")]
    Rate,
    #[error("packet size limit must be between 72 and 65507 bytes, got {0}")]
    PacketLen(usize),
}

/// One generated MoldUDP64 packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenPacket {
    /// Send time, nanoseconds since midnight.
    pub ts_ns: u64,
    pub payload: Vec<u8>,
}

/// Header fields of the message being built.
#[derive(Debug, Clone, Copy)]
struct Hdr {
    locate: u16,
    timestamp: Timestamp48,
}

/// Builds an ITCH value with the header from a [`Hdr`].
macro_rules! repr {
    ($h:expr, $repr:ident { $($f:ident: $v:expr),* $(,)? }) => {
        itch::$repr { stock_locate: $h.locate, tracking_number: 0, timestamp: $h.timestamp, $($f: $v),* }.into()
    };
}

#[derive(Debug, Clone, Copy)]
struct Order {
    order_ref: u64,
    side: u8,
    shares: u32,
    price: u32,
}

#[derive(Debug)]
struct Book {
    locate: u16,
    stock: Stock,
    mid: u32,
    orders: Vec<Order>,
}

/// The feed generator; iterate it for packets.
pub struct Generator {
    cfg: GenConfig,
    rng: ChaCha12Rng,
    books: Vec<Book>,
    popularity_cdf: Vec<f64>,
    recent: VecDeque<usize>,
    queue: VecDeque<MessageRepr>,
    flow_left: u64,
    closing_done: bool,
    eos_sent: bool,
    seq: u64,
    now_ns: u64,
    last_send_ns: u64,
    next_order_ref: u64,
    next_match: u64,
    flow_duration_ns: f64,
    burst_size: Poisson<f64>,
    packet_buf: Vec<u8>,
}

fn ticker_names(rng: &mut ChaCha12Rng, n: u32) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(n as usize);
    while out.len() < n as usize {
        let len = if out.len() < 26 * 26 { rng.gen_range(2..=4) } else { rng.gen_range(4..=7) };
        let s: String = (0..len).map(|_| char::from(b'A' + rng.gen_range(0..26u8))).collect();
        if seen.insert(s.clone()) {
            out.push(s);
        }
    }
    out
}

impl Generator {
    /// Builds a generator; checks the configuration first.
    pub fn new(cfg: GenConfig) -> Result<Self, GenError> {
        if cfg.symbols == 0 || cfg.symbols > SYMBOLS_MAX {
            return Err(GenError::Symbols(cfg.symbols));
        }
        let rate_ok = cfg.rate_msgs_per_s > 0.0 && cfg.rate_msgs_per_s.is_finite();
        let mpp_ok = cfg.msgs_per_packet_mean >= 1.0 && cfg.msgs_per_packet_mean.is_finite();
        if !rate_ok || !mpp_ok {
            return Err(GenError::Rate);
        }
        if !(72..=fairfeed_wire::moldudp64::PACKET_LEN_MAX).contains(&cfg.packet_len_max) {
            return Err(GenError::PacketLen(cfg.packet_len_max));
        }
        let mut rng = ChaCha12Rng::seed_from_u64(cfg.seed);
        let names = ticker_names(&mut rng, cfg.symbols);
        let books: Vec<Book> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                // Log-uniform prices from $5 to $500, on a cent grid.
                let dollars = (5f64.ln() + rng.gen::<f64>() * (100f64).ln()).exp();
                Book {
                    locate: (i + 1) as u16,
                    stock: Stock::from_str_padded(name),
                    mid: ((dollars * 100.0) as u32).max(1) * TICK,
                    orders: Vec::new(),
                }
            })
            .collect();
        // Zipf(1) popularity over a random permutation of symbols.
        let mut weights: Vec<f64> = (0..books.len()).map(|i| 1.0 / (i as f64 + 1.0)).collect();
        for i in (1..weights.len()).rev() {
            weights.swap(i, rng.gen_range(0..=i));
        }
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let popularity_cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        let burst_mean = cfg.msgs_per_packet_mean - 1.0;
        let burst_size = Poisson::new(burst_mean.max(1e-9)).map_err(|_| GenError::Rate)?;
        let mut g = Generator {
            rng,
            books,
            popularity_cdf,
            recent: VecDeque::with_capacity(RECENT_SYMBOLS),
            queue: VecDeque::new(),
            flow_left: 0,
            closing_done: false,
            eos_sent: false,
            seq: 1,
            now_ns: cfg.start_ns.saturating_sub(1_000_000),
            last_send_ns: 0,
            next_order_ref: 1,
            next_match: 1,
            flow_duration_ns: 0.0,
            burst_size,
            packet_buf: vec![0; cfg.packet_len_max],
            cfg,
        };
        g.queue_preamble();
        let closing = g.closing_len();
        let needed = g.queue.len() as u64 + closing;
        if g.cfg.messages < needed {
            return Err(GenError::TooFewMessages { needed, symbols: g.cfg.symbols, got: g.cfg.messages });
        }
        g.flow_left = g.cfg.messages - needed;
        g.flow_duration_ns = g.flow_left as f64 / g.cfg.rate_msgs_per_s * 1e9;
        Ok(g)
    }

    fn ts(&mut self) -> Timestamp48 {
        self.now_ns += 1 + self.rng.gen_range(20..400);
        Timestamp48(self.now_ns)
    }

    fn system_event(&mut self, code: u8) -> MessageRepr {
        let timestamp = self.ts();
        itch::SystemEventRepr { stock_locate: 0, tracking_number: 0, timestamp, event_code: code }.into()
    }

    fn queue_preamble(&mut self) {
        let m = self.system_event(b'O');
        self.queue.push_back(m);
        let m = self.system_event(b'S');
        self.queue.push_back(m);
        self.queue_directory();
        let timestamp = self.ts();
        self.queue.push_back(
            itch::MwcbDeclineLevelRepr {
                stock_locate: 0,
                tracking_number: 0,
                timestamp,
                level1: Price8(MWCB_REFERENCE * 93 / 100),
                level2: Price8(MWCB_REFERENCE * 87 / 100),
                level3: Price8(MWCB_REFERENCE * 80 / 100),
            }
            .into(),
        );
        self.queue_trading_states();
        if self.cfg.all_types {
            self.queue_rare_types();
        }
        self.now_ns = self.now_ns.max(self.cfg.start_ns);
        let m = self.system_event(b'Q');
        self.queue.push_back(m);
    }

    /// A Stock Directory message per symbol.
    fn queue_directory(&mut self) {
        for i in 0..self.books.len() {
            let (locate, stock) = (self.books[i].locate, self.books[i].stock);
            let timestamp = self.ts();
            let etp = self.rng.gen_bool(0.1);
            self.queue.push_back(
                itch::StockDirectoryRepr {
                    stock_locate: locate,
                    tracking_number: 0,
                    timestamp,
                    stock,
                    market_category: [b'Q', b'G', b'S', b'N', b'P'][i % 5],
                    financial_status_indicator: b'N',
                    round_lot_size: 100,
                    round_lots_only: b'N',
                    issue_classification: if etp { b'Q' } else { b'C' },
                    issue_sub_type: Alpha(if etp { *b"E " } else { *b"Z " }),
                    authenticity: b'P',
                    short_sale_threshold_indicator: b'N',
                    ipo_flag: b'N',
                    luld_reference_price_tier: if i % 3 == 0 { b'1' } else { b'2' },
                    etp_flag: if etp { b'Y' } else { b'N' },
                    etp_leverage_factor: 0,
                    inverse_indicator: b'N',
                }
                .into(),
            );
        }
    }

    /// Every symbol trading, and market makers on the first ten.
    fn queue_trading_states(&mut self) {
        for i in 0..self.books.len() {
            let (locate, stock) = (self.books[i].locate, self.books[i].stock);
            let timestamp = self.ts();
            self.queue.push_back(
                itch::StockTradingActionRepr {
                    stock_locate: locate,
                    tracking_number: 0,
                    timestamp,
                    stock,
                    trading_state: b'T',
                    reserved: b' ',
                    reason: Alpha(*b"    "),
                }
                .into(),
            );
            if i < 10 {
                let timestamp = self.ts();
                self.queue.push_back(
                    itch::MarketParticipantPositionRepr {
                        stock_locate: locate,
                        tracking_number: 0,
                        timestamp,
                        mpid: Alpha(*b"FFMM"),
                        stock,
                        primary_market_maker: b'N',
                        market_maker_mode: b'N',
                        market_participant_state: b'A',
                    }
                    .into(),
                );
            }
        }
    }

    /// One of each type a short feed would otherwise rarely show.
    fn queue_rare_types(&mut self) {
        let b = 0;
        let (locate, stock, mid) = (self.books[b].locate, self.books[b].stock, self.books[b].mid);
        let p = Price4(mid);
        macro_rules! push {
            ($repr:ident { $($f:ident: $v:expr),* $(,)? }) => {{
                let timestamp = self.ts();
                self.queue.push_back(itch::$repr { stock_locate: locate, tracking_number: 0, timestamp, $($f: $v),* }.into());
            }};
        }
        push!(IpoQuotingPeriodUpdateRepr {
            stock: stock,
            ipo_quotation_release_time: 34_200,
            ipo_quotation_release_qualifier: b'A',
            ipo_price: p
        });
        push!(DirectListingPriceDiscoveryRepr {
            stock: stock,
            open_eligibility_status: b'N',
            minimum_allowable_price: Price4(mid / 2),
            maximum_allowable_price: Price4(mid * 2),
            near_execution_price: p,
            near_execution_time: 0,
            lower_price_range_collar: Price4(mid - mid / 10),
            upper_price_range_collar: Price4(mid + mid / 10)
        });
        // Market-wide: locate 0, as the specification's MWCB messages carry.
        let timestamp = self.ts();
        self.queue.push_back(
            itch::MwcbStatusRepr { stock_locate: 0, tracking_number: 0, timestamp, breached_level: b'1' }.into(),
        );
        push!(OperationalHaltRepr { stock: stock, market_code: b'Q', operational_halt_action: b'T' });
        push!(LuldAuctionCollarRepr {
            stock: stock,
            auction_collar_reference_price: p,
            upper_auction_collar_price: Price4(mid + mid / 20),
            lower_auction_collar_price: Price4(mid - mid / 20),
            auction_collar_extension: 0
        });
        push!(RetailPriceImprovementRepr { stock: stock, interest_flag: b'B' });
        push!(RegShoRestrictionRepr { stock: stock, reg_sho_action: b'0' });
        push!(NoiiRepr {
            paired_shares: 10_000,
            imbalance_shares: 500,
            imbalance_direction: b'B',
            stock: stock,
            far_price: p,
            near_price: p,
            current_reference_price: p,
            cross_type: b'O',
            price_variation_indicator: b'L'
        });
        let match_number = self.next_match;
        self.next_match += 1;
        push!(CrossTradeRepr {
            shares: 10_000,
            stock: stock,
            cross_price: p,
            match_number: match_number,
            cross_type: b'O'
        });
        push!(BrokenTradeRepr { match_number: match_number });
    }

    fn closing_len(&self) -> u64 {
        3
    }

    fn queue_closing(&mut self) {
        for code in [b'M', b'E', b'C'] {
            let m = self.system_event(code);
            self.queue.push_back(m);
        }
        self.closing_done = true;
    }

    fn pick_symbol(&mut self) -> usize {
        let u: f64 = self.rng.gen();
        self.popularity_cdf.partition_point(|&c| c < u).min(self.books.len() - 1)
    }

    /// Intraday U-curve, normalized to mean 1 over the session.
    fn rate_shape(&self) -> f64 {
        const A: f64 = 3.0;
        const B: f64 = 2.0;
        const TAU: f64 = 0.05;
        let x =
            ((self.now_ns.saturating_sub(self.cfg.start_ns)) as f64 / self.flow_duration_ns.max(1.0)).clamp(0.0, 1.0);
        let norm = 1.0 + (A + B) * TAU * (1.0 - (-1.0 / TAU).exp());
        (1.0 + A * (-x / TAU).exp() + B * (-(1.0 - x) / TAU).exp()) / norm
    }

    fn shares(&mut self) -> u32 {
        if self.rng.gen_bool(0.1) {
            self.rng.gen_range(1..100)
        } else {
            100 * (1 + (self.rng.gen::<f64>().powi(3) * 20.0) as u32)
        }
    }

    fn new_order(&mut self, b: usize) -> Order {
        let side = if self.rng.gen_bool(0.5) { b'B' } else { b'S' };
        // Distance from the mid in ticks: mostly near the top of the book.
        let k = (self.rng.gen::<f64>().powi(2) * 12.0) as u32;
        let mid = self.books[b].mid;
        let price = if side == b'B' { mid.saturating_sub((k + 1) * TICK).max(TICK) } else { mid + (k + 1) * TICK };
        let order_ref = self.next_order_ref;
        self.next_order_ref += 1;
        Order { order_ref, side, shares: self.shares(), price }
    }

    /// Index of the order an execution takes: the first in time priority
    /// at the best price of a side (the other side when one is empty), as a
    /// marketable order meets the book on NASDAQ. (A best-of-a-few random
    /// pick executed orders out of priority: MeatPy, an independent book
    /// builder, counted 1,372 such in a 40,000-message feed.)
    fn front_of_book(&mut self, b: usize) -> usize {
        let orders = &self.books[b].orders;
        let want = if self.rng.gen_bool(0.5) { b'B' } else { b'S' };
        let side = if orders.iter().any(|o| o.side == want) { want } else { orders[0].side };
        // Best price first (highest bid, lowest offer), then the oldest reference.
        let key = |o: &Order| (if side == b'B' { u32::MAX - o.price } else { o.price }, o.order_ref);
        let (i, _) = orders
            .iter()
            .enumerate()
            .filter(|(_, o)| o.side == side)
            .min_by_key(|(_, o)| key(o))
            .expect("the side has an order");
        i
    }

    fn move_mid(&mut self, b: usize) {
        if self.rng.gen_bool(0.3) {
            let mid = &mut self.books[b].mid;
            if self.rng.gen_bool(0.5) {
                *mid += TICK;
            } else if *mid > 2 * TICK {
                *mid -= TICK;
            }
        }
    }

    /// One order-flow message for book `b`, applied to the book.
    fn flow_message(&mut self, b: usize) -> MessageRepr {
        let h = Hdr { locate: self.books[b].locate, timestamp: self.ts() };
        let n = self.books[b].orders.len();
        let mut r: f64 = self.rng.gen();
        if n == 0 {
            r = 0.0;
        } else if n >= BOOK_ORDERS_MAX {
            r = 0.5; // delete
        } else if n > 256 {
            r = 0.1 + r * 0.9; // fewer adds in a deep book
        }
        match r {
            r if r < 0.40 => self.add(b, h),
            r if r < 0.77 => self.delete(b, h),
            r if r < 0.82 => self.cancel(b, h),
            r if r < 0.90 => self.replace(b, h),
            r if r < 0.98 => self.execute(b, h),
            _ => self.hidden_trade(b, h),
        }
    }

    fn add(&mut self, b: usize, h: Hdr) -> MessageRepr {
        let o = self.new_order(b);
        let stock = self.books[b].stock;
        self.books[b].orders.push(o);
        if self.rng.gen_bool(0.08) {
            return repr!(
                h,
                AddOrderMpidRepr {
                    order_ref: o.order_ref,
                    side: o.side,
                    shares: o.shares,
                    stock: stock,
                    price: Price4(o.price),
                    attribution: Alpha(*b"FFMM")
                }
            );
        }
        repr!(
            h,
            AddOrderRepr {
                order_ref: o.order_ref,
                side: o.side,
                shares: o.shares,
                stock: stock,
                price: Price4(o.price)
            }
        )
    }

    fn delete(&mut self, b: usize, h: Hdr) -> MessageRepr {
        let i = self.rng.gen_range(0..self.books[b].orders.len());
        let o = self.books[b].orders.swap_remove(i);
        repr!(h, OrderDeleteRepr { order_ref: o.order_ref })
    }

    /// A partial cancel; an order of one share is deleted instead.
    fn cancel(&mut self, b: usize, h: Hdr) -> MessageRepr {
        let i = self.rng.gen_range(0..self.books[b].orders.len());
        let o = &mut self.books[b].orders[i];
        if o.shares > 1 {
            let cancelled = 1 + (o.shares - 1) / 2;
            o.shares -= cancelled;
            let order_ref = o.order_ref;
            return repr!(h, OrderCancelRepr { order_ref: order_ref, cancelled_shares: cancelled });
        }
        let o = self.books[b].orders.swap_remove(i);
        repr!(h, OrderDeleteRepr { order_ref: o.order_ref })
    }

    /// Moves an order one tick away, under a new reference, as `U` does.
    fn replace(&mut self, b: usize, h: Hdr) -> MessageRepr {
        let i = self.rng.gen_range(0..self.books[b].orders.len());
        let old = self.books[b].orders[i];
        let mut new = self.new_order(b);
        new.side = old.side;
        new.price = if old.side == b'B' { old.price.saturating_sub(TICK).max(TICK) } else { old.price + TICK };
        self.books[b].orders[i] = new;
        repr!(
            h,
            OrderReplaceRepr {
                original_order_ref: old.order_ref,
                new_order_ref: new.order_ref,
                shares: new.shares,
                price: Price4(new.price)
            }
        )
    }

    /// Executes (part of) an aggressive order, sometimes at a better price (`C`).
    fn execute(&mut self, b: usize, h: Hdr) -> MessageRepr {
        let i = self.front_of_book(b);
        let o = self.books[b].orders[i];
        let executed = if self.rng.gen_bool(0.5) { o.shares } else { o.shares.min(100 * self.rng.gen_range(1..=3)) };
        if executed == o.shares {
            self.books[b].orders.swap_remove(i);
        } else {
            self.books[b].orders[i].shares -= executed;
        }
        let match_number = self.next_match;
        self.next_match += 1;
        self.move_mid(b);
        if self.rng.gen_bool(0.12) {
            let px = if o.side == b'B' { o.price + TICK } else { o.price.saturating_sub(TICK).max(TICK) };
            return repr!(
                h,
                OrderExecutedWithPriceRepr {
                    order_ref: o.order_ref,
                    executed_shares: executed,
                    match_number: match_number,
                    printable: b'Y',
                    execution_price: Price4(px)
                }
            );
        }
        repr!(h, OrderExecutedRepr { order_ref: o.order_ref, executed_shares: executed, match_number: match_number })
    }

    /// A trade against a hidden order: the book shows nothing of it.
    fn hidden_trade(&mut self, b: usize, h: Hdr) -> MessageRepr {
        let match_number = self.next_match;
        self.next_match += 1;
        let side = if self.rng.gen_bool(0.5) { b'B' } else { b'S' };
        let shares = self.shares();
        let (stock, price) = (self.books[b].stock, Price4(self.books[b].mid));
        repr!(
            h,
            TradeRepr {
                order_ref: 0,
                side: side,
                shares: shares,
                stock: stock,
                price: price,
                match_number: match_number
            }
        )
    }

    fn note_recent(&mut self, b: usize) {
        if let Some(i) = self.recent.iter().position(|&x| x == b) {
            self.recent.remove(i);
        } else if self.recent.len() == RECENT_SYMBOLS {
            self.recent.pop_front();
        }
        self.recent.push_back(b);
    }

    /// Fills the packet with one burst of order flow.
    fn flow_burst(&mut self, builder: &mut PacketBuilder<'_>) {
        let want = (1 + self.burst_size.sample(&mut self.rng) as u64).min(self.flow_left);
        let first = if !self.recent.is_empty() && self.rng.gen_bool(self.cfg.repeat_recent_symbol) {
            // Most often the latest symbols: geometric from the back.
            let mut k = 0;
            while k + 1 < self.recent.len() && self.rng.gen_bool(0.5) {
                k += 1;
            }
            self.recent[self.recent.len() - 1 - k]
        } else {
            self.pick_symbol()
        };
        let mut b = first;
        for k in 0..want {
            if !builder.fits(itch::MESSAGE_LEN_MAX) {
                break;
            }
            if k > 0 && !self.rng.gen_bool(self.cfg.same_symbol_in_burst) {
                b = self.pick_symbol();
            }
            let m = self.flow_message(b);
            self.note_recent(b);
            let ok = builder.push_with(m.buffer_len(), |buf| {
                let _ = m.emit(buf);
            });
            debug_assert!(ok.is_ok());
            self.flow_left -= 1;
        }
    }

    fn send_time(&mut self) -> u64 {
        let t = (self.now_ns + SEND_DELAY_NS).max(self.last_send_ns);
        self.last_send_ns = t;
        t
    }

    fn finish_packet(&mut self, len: usize, count: u16) -> GenPacket {
        self.seq += u64::from(count);
        GenPacket { ts_ns: self.send_time(), payload: self.packet_buf[..len].to_vec() }
    }

    fn header_only(&mut self, count: u16, ts_ns: u64) -> GenPacket {
        let mut payload = vec![0; fairfeed_wire::moldudp64::HEADER_LEN];
        let _ = PacketRepr { session: self.cfg.session, sequence: self.seq, count }.emit(&mut payload);
        self.last_send_ns = ts_ns;
        GenPacket { ts_ns, payload }
    }
}

impl Iterator for Generator {
    type Item = GenPacket;

    fn next(&mut self) -> Option<GenPacket> {
        if self.queue.is_empty() && self.flow_left == 0 && !self.closing_done {
            self.queue_closing();
        }
        if self.queue.is_empty() && self.flow_left == 0 {
            if self.eos_sent {
                return None;
            }
            self.eos_sent = true;
            let t = self.last_send_ns + 1_000;
            return Some(self.header_only(COUNT_END_OF_SESSION, t));
        }
        let (session, seq) = (self.cfg.session, self.seq);
        let mut buf = std::mem::take(&mut self.packet_buf);
        let mut builder = PacketBuilder::new(&mut buf, session, seq).ok()?;
        if !self.queue.is_empty() {
            // Session events and directory: packed tightly, as real feeds do.
            while let Some(m) = self.queue.front() {
                let m = *m;
                if builder
                    .push_with(m.buffer_len(), |b| {
                        let _ = m.emit(b);
                    })
                    .is_err()
                {
                    break;
                }
                self.queue.pop_front();
            }
        } else {
            let mean_gap_ns = self.cfg.msgs_per_packet_mean / (self.cfg.rate_msgs_per_s * self.rate_shape()) * 1e9;
            let gap = Exp::new(1.0 / mean_gap_ns).map(|e| e.sample(&mut self.rng)).unwrap_or(mean_gap_ns);
            let next_ns = self.now_ns + gap as u64;
            if next_ns > self.last_send_ns + HEARTBEAT_INTERVAL_NS && self.last_send_ns > 0 {
                // Idle: a heartbeat now, the burst later.
                self.packet_buf = buf;
                let t = self.last_send_ns + HEARTBEAT_INTERVAL_NS;
                self.now_ns = t;
                return Some(self.header_only(0, t));
            }
            self.now_ns = next_ns;
            self.flow_burst(&mut builder);
        }
        let count = builder.count();
        let len = builder.finish();
        self.packet_buf = buf;
        Some(self.finish_packet(len, count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_wire::itch::Message;
    use fairfeed_wire::moldudp64::Packet;
    use std::collections::HashMap;

    fn gen(messages: u64, seed: u64, all_types: bool) -> Vec<GenPacket> {
        Generator::new(GenConfig { messages, seed, symbols: 20, all_types, ..Default::default() }).unwrap().collect()
    }

    /// Replays the stream against our own book model: every reference is to a
    /// live order, every execution or cancel has the shares it claims.
    #[test]
    fn stream_is_internally_consistent() {
        let packets = gen(50_000, 7, true);
        let mut live: HashMap<u64, u32> = HashMap::new();
        let mut total = 0u64;
        let mut expect_seq = 1;
        let mut last_ts = 0;
        for p in &packets {
            let pk = Packet::new_checked(&p.payload[..]).unwrap();
            assert_eq!(pk.sequence(), expect_seq);
            expect_seq = pk.next_sequence();
            assert!(p.payload.len() <= 1400);
            assert!(p.ts_ns >= last_ts);
            last_ts = p.ts_ns;
            for b in pk.messages() {
                total += 1;
                match Message::parse(b.unwrap()).unwrap() {
                    Message::AddOrder(m) => {
                        assert!(live.insert(m.order_ref(), m.shares()).is_none())
                    }
                    Message::AddOrderMpid(m) => {
                        assert!(live.insert(m.order_ref(), m.shares()).is_none())
                    }
                    Message::OrderDelete(m) => assert!(live.remove(&m.order_ref()).is_some()),
                    Message::OrderCancel(m) => {
                        let s = live.get_mut(&m.order_ref()).expect("cancel of a live order");
                        assert!(*s > m.cancelled_shares());
                        *s -= m.cancelled_shares();
                    }
                    Message::OrderExecuted(m) => exec(&mut live, m.order_ref(), m.executed_shares()),
                    Message::OrderExecutedWithPrice(m) => exec(&mut live, m.order_ref(), m.executed_shares()),
                    Message::OrderReplace(m) => {
                        assert!(live.remove(&m.original_order_ref()).is_some());
                        assert!(live.insert(m.new_order_ref(), m.shares()).is_none());
                    }
                    _ => {}
                }
            }
        }
        assert_eq!(total, 50_000);
        assert!(Packet::new_checked(&packets.last().unwrap().payload[..]).unwrap().is_end_of_session());
    }

    fn exec(live: &mut HashMap<u64, u32>, r: u64, n: u32) {
        let s = live.get_mut(&r).expect("execution of a live order");
        assert!(*s >= n);
        *s -= n;
        if *s == 0 {
            live.remove(&r);
        }
    }

    #[test]
    fn same_seed_same_feed_other_seed_other_feed() {
        assert_eq!(gen(5_000, 3, false), gen(5_000, 3, false));
        assert_ne!(gen(5_000, 3, false), gen(5_000, 4, false));
    }

    #[test]
    fn all_types_flag_covers_the_spec() {
        let mut seen = HashSet::new();
        for p in gen(20_000, 1, true) {
            for b in Packet::new_checked(&p.payload[..]).unwrap().messages() {
                seen.insert(b.unwrap()[0]);
            }
        }
        for &t in itch::TYPES {
            assert!(seen.contains(&t), "type {} missing", t as char);
        }
    }

    #[test]
    fn too_few_messages_is_a_clear_error() {
        let e = Generator::new(GenConfig { messages: 10, symbols: 20, ..Default::default() }).err().unwrap();
        assert!(matches!(e, GenError::TooFewMessages { .. }));
        assert_eq!(Generator::new(GenConfig { symbols: 0, ..Default::default() }).err(), Some(GenError::Symbols(0)));
    }
}
