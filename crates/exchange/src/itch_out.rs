//! The engine's events as NASDAQ TotalView-ITCH 5.0, packed into MoldUDP64
//! packets — sans-IO: the publisher's shell sends each finished packet on the
//! A and B lines and journals it for the retransmission server.
//!
//! Mapping: a resting order's shares joining the book → `A` Add Order; a
//! resting order executed → `E` Order Executed (the incoming side of a trade
//! is not shown, as on NASDAQ); shares canceled from a resting order → `X`
//! Order Cancel, or `D` Order Delete when none are left; a resting order
//! replaced in place → `U` Order Replace; a batch's call auction (ordering
//! `batch`) → `C` Order Executed With Price (non-printable) per fill of a
//! displayed resting order, then one `Q` Cross Trade (type `I`) with its
//! price and volume. Accepted, rejected and
//! immediate-or-cancel remainders never touched the book and publish nothing.
//! The day is framed by `S` System Events (O, S, Q at the open; M, E, C at the
//! close) and a `R` Stock Directory message per symbol.

use fairfeed_wire::itch::{
    AddOrderRepr, CrossTradeRepr, MessageRepr, OrderCancelRepr, OrderDeleteRepr, OrderExecutedRepr,
    OrderExecutedWithPriceRepr, OrderReplaceRepr, StockDirectoryRepr, SystemEventRepr, TradeRepr, MESSAGE_LEN_MAX,
};
use fairfeed_wire::moldudp64::{PacketBuilder, PacketRepr, Session, COUNT_END_OF_SESSION, PACKET_LEN_DEFAULT_MAX};
use fairfeed_wire::{Alpha, Price4, Stock, Timestamp48};

use crate::engine::{Event, Side};

/// Messages per packet at most (besides the byte limit).
pub const MESSAGES_PER_PACKET_MAX: u16 = 64;
/// Nanoseconds in a day: ITCH timestamps count from midnight.
const DAY_NS: u64 = 86_400_000_000_000;

/// Builds the day's MoldUDP64 packets of ITCH messages.
pub struct ItchWriter {
    session: Session,
    next_seq: u64,
    packet_len_max: usize,
    /// Stock names by locate (index = locate).
    names: Vec<Stock>,
    /// Messages of the packet being filled, back to back, and where each ends.
    pending: Vec<u8>,
    pending_ends: Vec<usize>,
    pending_bytes: usize,
    packets: Vec<Vec<u8>>,
    /// Buffers of sent packets, given back ([`ItchWriter::recycle`]) to be filled again.
    spare: Vec<Vec<u8>>,
    /// ITCH messages written.
    pub messages: u64,
}

/// Sent packets' buffers kept for reuse at most.
const SPARE_MAX: usize = 64;

impl ItchWriter {
    /// A writer for `session`, numbering messages from 1; `names[i]` is the
    /// symbol of locate `i + 1`.
    pub fn new(session: &str, names: &[String]) -> Self {
        ItchWriter {
            session: Session::from_str_padded(session),
            next_seq: 1,
            packet_len_max: PACKET_LEN_DEFAULT_MAX,
            names: names.iter().map(|n| Stock::from_str_padded(n)).collect(),
            pending: Vec::with_capacity(PACKET_LEN_DEFAULT_MAX),
            pending_ends: Vec::with_capacity(usize::from(MESSAGES_PER_PACKET_MAX)),
            pending_bytes: 0,
            packets: Vec::new(),
            spare: Vec::new(),
            messages: 0,
        }
    }

    /// The sequence number the next message gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn stock(&self, locate: u16) -> Stock {
        self.names.get(usize::from(locate).wrapping_sub(1)).copied().unwrap_or_default()
    }

    fn push(&mut self, m: MessageRepr) {
        let mut b = [0u8; MESSAGE_LEN_MAX];
        let Ok(n) = m.emit(&mut b) else { return };
        if self.pending_bytes + 2 + n + 20 > self.packet_len_max
            || self.pending_ends.len() >= usize::from(MESSAGES_PER_PACKET_MAX)
        {
            self.flush();
        }
        self.pending.extend_from_slice(&b[..n]);
        self.pending_ends.push(self.pending.len());
        self.pending_bytes += 2 + n;
        self.messages += 1;
    }

    /// Closes the packet being filled (if any) so it can be sent.
    pub fn flush(&mut self) {
        if self.pending_ends.is_empty() {
            return;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.resize(self.packet_len_max, 0);
        let Ok(mut b) = PacketBuilder::new(&mut buf, self.session, self.next_seq) else { return };
        let (mut n, mut start) = (0u64, 0);
        for &end in &self.pending_ends {
            if b.push(&self.pending[start..end]).is_err() {
                break;
            }
            start = end;
            n += 1;
        }
        let len = b.finish();
        buf.truncate(len);
        self.next_seq += n;
        self.pending.clear();
        self.pending_ends.clear();
        self.pending_bytes = 0;
        self.packets.push(buf);
    }

    /// Gives back packets taken with [`ItchWriter::take_packets`] once sent:
    /// their buffers are filled again rather than allocated anew.
    pub fn recycle(&mut self, packets: impl IntoIterator<Item = Vec<u8>>) {
        for p in packets {
            if self.spare.len() >= SPARE_MAX {
                break;
            }
            self.spare.push(p);
        }
    }

    /// Finished packets, oldest first.
    pub fn take_packets(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.packets)
    }

    fn ts(now_ns: u64) -> Timestamp48 {
        Timestamp48(now_ns % DAY_NS)
    }

    fn system(&mut self, now_ns: u64, code: u8) {
        self.push(MessageRepr::SystemEvent(SystemEventRepr {
            stock_locate: 0,
            tracking_number: 0,
            timestamp: Self::ts(now_ns),
            event_code: code,
        }));
    }

    /// Start of messages, the stock directory, start of system and market hours.
    pub fn open(&mut self, now_ns: u64) {
        self.system(now_ns, b'O');
        for i in 0..self.names.len() {
            let d = StockDirectoryRepr {
                stock_locate: (i + 1) as u16,
                tracking_number: 0,
                timestamp: Self::ts(now_ns),
                stock: self.names[i],
                market_category: b'Q',
                financial_status_indicator: b'N',
                round_lot_size: 100,
                round_lots_only: b'N',
                issue_classification: b'C',
                issue_sub_type: Alpha(*b"Z "),
                authenticity: b'P',
                short_sale_threshold_indicator: b'N',
                ipo_flag: b'N',
                luld_reference_price_tier: b'1',
                etp_flag: b'N',
                etp_leverage_factor: 0,
                inverse_indicator: b'N',
            };
            self.push(MessageRepr::StockDirectory(d));
        }
        self.system(now_ns, b'S');
        self.system(now_ns, b'Q');
        self.flush();
    }

    /// End of market hours, end of system hours, end of messages; then the
    /// MoldUDP64 end-of-session packet.
    pub fn close(&mut self, now_ns: u64) {
        for c in [b'M', b'E', b'C'] {
            self.system(now_ns, c);
        }
        self.flush();
        let mut eos = vec![0u8; 20];
        let r = PacketRepr { session: self.session, sequence: self.next_seq, count: COUNT_END_OF_SESSION };
        if r.emit(&mut eos).is_ok() {
            self.packets.push(eos);
        }
    }

    /// A MoldUDP64 heartbeat: no messages, the sequence number the next one
    /// will get — so a receiver of a quiet line learns whether it lost the
    /// last packet before the quiet spell. Not journaled (nothing to retransmit).
    pub fn heartbeat(&self) -> Vec<u8> {
        let mut hb = vec![0u8; 20];
        let r = PacketRepr { session: self.session, sequence: self.next_seq, count: 0 };
        if r.emit(&mut hb).is_err() {
            hb.clear();
        }
        hb
    }

    /// A call auction's messages: a displayed resting order's fill as Order
    /// Executed With Price (non-printable, at the clearing price); the other
    /// fills show only in the Cross Trade that closes the auction.
    fn auction(&self, ts: Timestamp48, ev: &Event) -> Option<MessageRepr> {
        Some(match *ev {
            Event::Executed { maker_hidden: true, .. } => return None,
            Event::Executed { symbol, match_num, qty, price, maker_ref, .. } => {
                MessageRepr::OrderExecutedWithPrice(OrderExecutedWithPriceRepr {
                    stock_locate: symbol,
                    tracking_number: 0,
                    timestamp: ts,
                    order_ref: maker_ref,
                    executed_shares: qty,
                    match_number: match_num,
                    printable: b'N',
                    execution_price: Price4(price),
                })
            }
            Event::Cross { symbol, match_num, price, qty } => MessageRepr::CrossTrade(CrossTradeRepr {
                stock_locate: symbol,
                tracking_number: 0,
                timestamp: ts,
                shares: qty,
                stock: self.stock(symbol),
                cross_price: Price4(price),
                match_number: match_num,
                cross_type: b'I',
            }),
            _ => return None,
        })
    }

    /// Adds the messages `ev` calls for.
    pub fn on_event(&mut self, now_ns: u64, ev: &Event) {
        let ts = Self::ts(now_ns);
        let m = match *ev {
            // A hidden order never appears: not when it rests, changes or leaves.
            Event::Booked { hidden: true, .. }
            | Event::Canceled { hidden: true, .. }
            | Event::Replaced { hidden: true, .. } => return,
            Event::Booked { ref_num, symbol, side, price, qty, .. } => MessageRepr::AddOrder(AddOrderRepr {
                stock_locate: symbol,
                tracking_number: 0,
                timestamp: ts,
                order_ref: ref_num,
                side: if side == Side::Buy { b'B' } else { b'S' },
                shares: qty,
                stock: self.stock(symbol),
                price: Price4(price),
            }),
            Event::Executed { auction: true, .. } | Event::Cross { .. } => {
                return self.auction(ts, ev).into_iter().for_each(|m| self.push(m))
            }
            // Its executions are anonymous Trade messages (order reference 0,
            // as NASDAQ sends them), the side being the resting order's.
            Event::Executed { symbol, match_num, qty, price, taker_side, maker_hidden: true, .. } => {
                MessageRepr::Trade(TradeRepr {
                    stock_locate: symbol,
                    tracking_number: 0,
                    timestamp: ts,
                    order_ref: 0,
                    side: if taker_side == Side::Buy { b'S' } else { b'B' },
                    shares: qty,
                    stock: self.stock(symbol),
                    price: Price4(price),
                    match_number: match_num,
                })
            }
            Event::Executed { symbol, match_num, qty, maker_ref, .. } => {
                MessageRepr::OrderExecuted(OrderExecutedRepr {
                    stock_locate: symbol,
                    tracking_number: 0,
                    timestamp: ts,
                    order_ref: maker_ref,
                    executed_shares: qty,
                    match_number: match_num,
                })
            }
            Event::Canceled { ref_num, symbol, qty, left, booked: true, .. } if left > 0 => {
                MessageRepr::OrderCancel(OrderCancelRepr {
                    stock_locate: symbol,
                    tracking_number: 0,
                    timestamp: ts,
                    order_ref: ref_num,
                    cancelled_shares: qty,
                })
            }
            Event::Canceled { ref_num, symbol, booked: true, .. } => MessageRepr::OrderDelete(OrderDeleteRepr {
                stock_locate: symbol,
                tracking_number: 0,
                timestamp: ts,
                order_ref: ref_num,
            }),
            Event::Replaced { old_ref, new_ref, symbol, price, qty, .. } => {
                MessageRepr::OrderReplace(OrderReplaceRepr {
                    stock_locate: symbol,
                    tracking_number: 0,
                    timestamp: ts,
                    original_order_ref: old_ref,
                    new_order_ref: new_ref,
                    shares: qty,
                    price: Price4(price),
                })
            }
            Event::Canceled { .. } | Event::Accepted { .. } | Event::Rejected { .. } => return,
        };
        self.push(m);
    }
}
