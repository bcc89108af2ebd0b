//! Inbound fairness (seed 000 appendix C, CloudEx): orders may carry their
//! sender's synchronized timestamp; the sequencer holds each order for a
//! short window after it arrives and hands orders to the engine in timestamp
//! order, so a client farther from the exchange is not penalized for the
//! extra network delay — up to the window. Orders without a timestamp are
//! stamped with their arrival time. A window of 0 is arrival order (off).
//!
//! Sans-IO: `push` with the arrival time, `pop_due` with the current time.
//! Bounded: beyond [`SEQUENCER_MAX`] held orders the earliest is released at
//! once (counted), so the window can never grow memory without limit.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::engine::Command;

/// Orders held at most.
pub const SEQUENCER_MAX: usize = 1 << 16;
/// OUCH 5.0 appendage tag carrying the client's timestamp (ns since the Unix
/// epoch, u64 big-endian): a private tag, outside the ones the spec assigns.
pub const TAG_CLIENT_TIMESTAMP: u8 = 0xF0;

/// The client timestamp in an OUCH 5.0 appendage, if present and well
/// formed (and the options before it are).
pub fn client_timestamp(appendage: &[u8]) -> Option<u64> {
    stamps(appendage).client_ns
}

/// OUCH 5.0 appendage tag carrying a DBO delivery clock
/// ([`crate::ordering::DeliveryClock`]): the data sequence number (u64) and
/// the response time in ns (i64), big-endian, 16 bytes. Private, like
/// [`TAG_CLIENT_TIMESTAMP`]; the release point (or the firm's gateway)
/// appends it.
pub const TAG_DELIVERY_CLOCK: u8 = 0xF1;

/// What an order's appendage says about when it was sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrderStamps {
    /// [`TAG_CLIENT_TIMESTAMP`].
    pub client_ns: Option<u64>,
    /// [`TAG_DELIVERY_CLOCK`].
    pub clock: Option<crate::ordering::DeliveryClock>,
}

/// Both stamps of an appendage; a malformed option ends the reading (what
/// came before it stands).
pub fn stamps(appendage: &[u8]) -> OrderStamps {
    let mut st = OrderStamps::default();
    for o in fairfeed_wire::ouch::options(appendage) {
        let Ok((tag, value)) = o else { break };
        match tag {
            TAG_CLIENT_TIMESTAMP => {
                if let Ok(v) = <[u8; 8]>::try_from(value) {
                    st.client_ns.get_or_insert(u64::from_be_bytes(v));
                }
            }
            TAG_DELIVERY_CLOCK if value.len() == 16 => {
                let (a, b) = value.split_at(8);
                let (Ok(a), Ok(b)) = (<[u8; 8]>::try_from(a), <[u8; 8]>::try_from(b)) else { continue };
                st.clock.get_or_insert(crate::ordering::DeliveryClock {
                    data_seq: u64::from_be_bytes(a),
                    response_ns: i64::from_be_bytes(b),
                });
            }
            _ => {}
        }
    }
    st
}

/// The appendage bytes carrying a delivery clock.
pub fn delivery_clock_appendage(c: crate::ordering::DeliveryClock) -> [u8; 18] {
    let mut a = [0u8; 18];
    a[0] = 17;
    a[1] = TAG_DELIVERY_CLOCK;
    a[2..10].copy_from_slice(&c.data_seq.to_be_bytes());
    a[10..].copy_from_slice(&c.response_ns.to_be_bytes());
    a
}

/// The appendage bytes carrying `ts`.
pub fn timestamp_appendage(ts: u64) -> [u8; 10] {
    let mut a = [0u8; 10];
    a[0] = 9;
    a[1] = TAG_CLIENT_TIMESTAMP;
    a[2..].copy_from_slice(&ts.to_be_bytes());
    a
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SequencerStats {
    /// Orders taken into the window.
    pub held: u64,
    /// Orders released ahead of an earlier arrival (the window changed the order).
    pub reordered: u64,
    /// Orders released early because the buffer was full ([`SEQUENCER_MAX`]).
    pub overflow: u64,
    /// Orders stamped later than the window allows (their timestamp is older than
    /// what was already released): released at once, in arrival order.
    pub too_late: u64,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    stamp: u64,
    arrival_order: u64,
    arrival_ns: u64,
    cmd: CmdKey,
}

#[derive(Debug, PartialEq, Eq)]
struct CmdKey(Command);

impl PartialOrd for CmdKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CmdKey {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// Orders by client timestamp within a window.
pub struct Sequencer {
    window_ns: u64,
    heap: BinaryHeap<Reverse<Held>>,
    arrivals: u64,
    last_released_stamp: u64,
    last_released_order: u64,
    /// Its counters.
    pub stats: SequencerStats,
}

impl Sequencer {
    /// A sequencer with a window of `window_ns` (0: arrival order, nothing held).
    pub fn new(window_ns: u64) -> Self {
        Sequencer {
            window_ns,
            heap: BinaryHeap::new(),
            arrivals: 0,
            last_released_stamp: 0,
            last_released_order: 0,
            stats: SequencerStats::default(),
        }
    }

    /// Its window, ns.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// An order arrived at `now_ns`, stamped `client_ns` by its sender (None: unstamped).
    pub fn push(&mut self, cmd: Command, client_ns: Option<u64>, now_ns: u64) {
        self.arrivals += 1;
        let mut stamp = client_ns.unwrap_or(now_ns).min(now_ns);
        if stamp < self.last_released_stamp {
            self.stats.too_late += 1;
            stamp = self.last_released_stamp;
        }
        self.stats.held += 1;
        self.heap.push(Reverse(Held { stamp, arrival_order: self.arrivals, arrival_ns: now_ns, cmd: CmdKey(cmd) }));
    }

    /// The next order due at `now_ns`: the earliest-stamped one, once the
    /// earliest-arrived held order has waited its window (or the buffer is full).
    pub fn pop_due(&mut self, now_ns: u64) -> Option<Command> {
        let full = self.heap.len() > SEQUENCER_MAX;
        let Reverse(top) = self.heap.peek()?;
        // Anything stamped at or before now − window can no longer be overtaken.
        if !full
            && top.stamp.saturating_add(self.window_ns) > now_ns
            && top.arrival_ns.saturating_add(self.window_ns) > now_ns
        {
            return None;
        }
        let Reverse(h) = self.heap.pop()?;
        if full {
            self.stats.overflow += 1;
        }
        if h.arrival_order < self.last_released_order {
            self.stats.reordered += 1;
        }
        self.last_released_order = self.last_released_order.max(h.arrival_order);
        self.last_released_stamp = self.last_released_stamp.max(h.stamp);
        Some(h.cmd.0)
    }

    /// When the next order falls due (for a shell's timer), if any is held.
    pub fn next_due(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse(h)| h.stamp.min(h.arrival_ns).saturating_add(self.window_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{NewOrder, Side, Tif};

    fn order(client: u32) -> Command {
        Command::New(NewOrder {
            client,
            token: 1,
            symbol: 1,
            side: Side::Buy,
            price: 100,
            qty: 1,
            tif: Tif::Day,
            market: false,
            hidden: false,
            min_qty: 0,
        })
    }

    fn client_of(c: Command) -> u32 {
        match c {
            Command::New(o) => o.client,
            _ => 0,
        }
    }

    #[test]
    fn a_farther_client_with_an_earlier_stamp_goes_first_within_the_window() {
        let mut s = Sequencer::new(50_000);
        // Near client stamps at 1,010 µs and arrives at 1,015 µs; far client
        // stamped earlier (1,000 µs) but its order needs 40 µs to arrive.
        s.push(order(1), Some(1_010_000), 1_015_000);
        assert_eq!(s.pop_due(1_020_000), None, "held for the window");
        s.push(order(2), Some(1_000_000), 1_040_000);
        assert_eq!(s.pop_due(1_049_999), None);
        assert_eq!(s.pop_due(1_050_000).map(client_of), Some(2), "the earlier stamp wins");
        assert_eq!(s.pop_due(1_060_000).map(client_of), Some(1));
        assert_eq!(s.stats.reordered, 1);
    }

    #[test]
    fn window_zero_is_arrival_order_and_stamps_cannot_jump_the_queue_after_release() {
        let mut s = Sequencer::new(0);
        s.push(order(1), Some(500), 1_000);
        s.push(order(2), Some(100), 1_001);
        assert_eq!(s.pop_due(1_001).map(client_of), Some(2), "both due; earliest stamp first");
        let mut s = Sequencer::new(10);
        s.push(order(1), None, 1_000);
        assert_eq!(s.pop_due(1_010).map(client_of), Some(1));
        s.push(order(2), Some(5), 1_011);
        assert_eq!(s.stats.too_late, 1, "a stamp older than what was released is clamped");
        assert_eq!(s.pop_due(1_011).map(client_of), Some(2));
        // Stamps in the future are clamped to the arrival.
        s.push(order(3), Some(u64::MAX), 2_000);
        assert_eq!(s.next_due(), Some(2_010));
    }

    #[test]
    fn delivery_clocks_parse_beside_timestamps_and_bad_ones_are_ignored() {
        use crate::ordering::DeliveryClock;
        let c = DeliveryClock { data_seq: 42, response_ns: -1_500 };
        let mut a = delivery_clock_appendage(c).to_vec();
        a.extend_from_slice(&timestamp_appendage(7));
        assert_eq!(stamps(&a), OrderStamps { client_ns: Some(7), clock: Some(c) });
        assert_eq!(stamps(&a[..10]).clock, None, "cut short");
        let mut short = delivery_clock_appendage(c);
        short[0] = 9; // a 8-byte value: not a clock
        assert_eq!(stamps(&short[..10]).clock, None);
        assert_eq!(stamps(&[]), OrderStamps::default());
    }

    #[test]
    fn appendage_timestamps_parse_and_bad_ones_are_ignored() {
        let a = timestamp_appendage(123_456_789);
        assert_eq!(client_timestamp(&a), Some(123_456_789));
        let mut two = vec![3u8, 0x01, 0xAA, 0xBB];
        two.extend_from_slice(&a);
        assert_eq!(client_timestamp(&two), Some(123_456_789), "after another option");
        assert_eq!(client_timestamp(&[9, 0xF0, 1, 2]), None, "cut short");
        assert_eq!(client_timestamp(&[0]), None);
        assert_eq!(client_timestamp(&[]), None);
    }
}
