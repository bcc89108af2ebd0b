//! The release point's order stamper (DBO, issue 44): a firm's program
//! sends its OUCH orders through the release point the exchange controls
//! (the receiver beside it, model 1; the gateway, model 2), which writes its
//! own **delivery clock** — the last data message it delivered and the time
//! since — into every Enter Order as appendage option 0xF1, replacing any
//! the firm wrote. Firms need not stamp anything, and cannot stamp for
//! themselves.
//!
//! Sans-IO: [`Stamper::handle_bytes`] takes the bytes the firm sent (any
//! split), appends what goes on to the exchange; every other SoupBinTCP
//! packet, and an Enter Order it cannot read, passes unchanged (the
//! exchange answers it). A partial packet waits for its rest — at most one
//! SoupBinTCP packet (65,537 bytes).

use fairfeed_wire::macros::Tail;
use fairfeed_wire::ouch::{inbound, push_option, Appendage, APPENDAGE_LEN_MAX};
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr};

use crate::ordering::DeliveryClock;
use crate::sequencer::{delivery_clock_appendage, TAG_DELIVERY_CLOCK};

/// Bytes of an unfinished packet held at most (a SoupBinTCP packet's largest).
pub const STAMP_PENDING_MAX: usize = 2 + u16::MAX as usize;

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StampStats {
    /// SoupBinTCP packets passed through.
    pub packets: u64,
    /// Enter Orders stamped.
    pub stamped: u64,
    /// Of them, ones that carried a delivery clock of the firm's own (replaced).
    pub replaced_own_clock: u64,
    /// Enter Orders with no data delivered yet to stamp (passed unstamped).
    pub before_any_data: u64,
    /// Enter Orders that could not be read or rewritten (passed unchanged).
    pub unreadable: u64,
    /// Bytes that did not frame as SoupBinTCP (the connection should close).
    pub malformed: u64,
}

/// A stream the stamper cannot frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the firm's bytes are not SoupBinTCP packets")]
pub struct NotSoupBinTcp;

/// One firm connection's stamper.
#[derive(Debug, Default)]
pub struct Stamper {
    pending: Vec<u8>,
    /// Its counters.
    pub stats: StampStats,
}

impl Stamper {
    /// `bytes` arrived from the firm; the clock is the release point's now
    /// (None: nothing delivered yet). What goes on to the exchange is
    /// appended to `out`. An error means the stream cannot be framed: close it.
    pub fn handle_bytes(
        &mut self,
        bytes: &[u8],
        clock: Option<DeliveryClock>,
        out: &mut Vec<u8>,
    ) -> Result<(), NotSoupBinTcp> {
        self.pending.extend_from_slice(bytes);
        let mut at = 0;
        loop {
            match split_packet(&self.pending[at..]) {
                Ok(Some((p, used))) => {
                    self.stats.packets += 1;
                    let raw = &self.pending[at..at + used];
                    match p {
                        PacketRepr::UnsequencedData(m) if m.first() == Some(&b'O') => {
                            stamp(m, raw, clock, &mut self.stats, out);
                        }
                        _ => out.extend_from_slice(raw),
                    }
                    at += used;
                }
                Ok(None) => break,
                Err(_) => {
                    self.stats.malformed += 1;
                    self.pending.clear();
                    return Err(NotSoupBinTcp);
                }
            }
        }
        self.pending.drain(..at);
        debug_assert!(self.pending.len() <= STAMP_PENDING_MAX);
        Ok(())
    }
}

/// Writes the Enter Order `m` (packet `raw`) to `out` with `clock` as its 0xF1 option.
fn stamp(m: &[u8], raw: &[u8], clock: Option<DeliveryClock>, st: &mut StampStats, out: &mut Vec<u8>) {
    let Some(clock) = clock else {
        st.before_any_data += 1;
        return out.extend_from_slice(raw);
    };
    let Ok(inbound::Message::EnterOrder(o)) = inbound::Message::parse(m) else {
        st.unreadable += 1;
        return out.extend_from_slice(raw);
    };
    let mut r = o.to_repr();
    let (mut app, mut n, mut own) = ([0u8; APPENDAGE_LEN_MAX], 0, false);
    for opt in fairfeed_wire::ouch::options(r.appendage.as_slice()) {
        match opt {
            Ok((TAG_DELIVERY_CLOCK, _)) => own = true,
            Ok((tag, value)) if push_option(&mut app, &mut n, tag, value).is_some() => {}
            _ => {
                st.unreadable += 1;
                return out.extend_from_slice(raw);
            }
        }
    }
    let t = delivery_clock_appendage(clock);
    let Some(appendage) = push_option(&mut app, &mut n, t[1], &t[2..]).and_then(|()| Appendage::from_slice(&app[..n]))
    else {
        st.unreadable += 1;
        return out.extend_from_slice(raw);
    };
    r.appendage_length = n as u16;
    r.appendage = appendage;
    let mut b = [0u8; 512];
    let Ok(len) = inbound::MessageRepr::EnterOrder(r).emit(&mut b) else {
        st.unreadable += 1;
        return out.extend_from_slice(raw);
    };
    st.stamped += 1;
    st.replaced_own_clock += u64::from(own);
    out.extend_from_slice(&((len + 1) as u16).to_be_bytes());
    out.push(b'U');
    out.extend_from_slice(&b[..len]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{self, Order};
    use crate::sequencer::stamps;
    use proptest::prelude::*;

    /// The Enter Orders' delivery clocks and the other packets' bytes, from a stream.
    fn read(stream: &[u8]) -> (Vec<Option<DeliveryClock>>, Vec<Vec<u8>>) {
        let (mut clocks, mut others, mut at) = (Vec::new(), Vec::new(), 0);
        while let Ok(Some((p, used))) = split_packet(&stream[at..]) {
            match p {
                PacketRepr::UnsequencedData(m) if m[0] == b'O' => {
                    let Ok(inbound::Message::EnterOrder(o)) = inbound::Message::parse(m) else { panic!("unreadable") };
                    clocks.push(stamps(o.to_repr().appendage.as_slice()).clock);
                }
                _ => others.push(stream[at..at + used].to_vec()),
            }
            at += used;
        }
        assert_eq!(at, stream.len(), "whole packets");
        (clocks, others)
    }

    proptest! {
        /// Any split of a session's bytes: every Enter Order comes out with
        /// the release point's clock (a firm's own replaced), its other
        /// options kept; every other packet comes out byte for byte.
        #[test]
        fn every_order_is_stamped_whatever_the_split(
            kinds in proptest::collection::vec((0u8..4, any::<bool>(), 0u32..5), 1..30),
            cuts in proptest::collection::vec(1usize..40, 1..50),
        ) {
            let mut input = Vec::new();
            client::login("FIRM", "pw", 0, &mut input);
            let mut want_others = vec![input.clone()];
            for (i, &(k, own, min)) in kinds.iter().enumerate() {
                let mut b = Vec::new();
                match k {
                    0 => client::cancel_order(i as u32, 0, &mut b),
                    1 => client::replace_order(i as u32, i as u32 + 100, 10, 10_000, &mut b),
                    _ => client::enter_order(&Order {
                        token: i as u32, side: b'B', qty: 10, symbol: "AAPL", price: 10_000,
                        clock: own.then_some(DeliveryClock { data_seq: 1, response_ns: -5 }),
                        stamp: (k == 3).then_some(77), min_qty: min, ..Default::default()
                    }, &mut b),
                }
                if k < 2 { want_others.push(b.clone()); }
                input.extend_from_slice(&b);
            }
            let clock = DeliveryClock { data_seq: 42, response_ns: 1_500 };
            let mut s = Stamper::default();
            let (mut out, mut at) = (Vec::new(), 0);
            for c in cuts.iter().cycle() {
                if at >= input.len() { break; }
                let end = (at + c).min(input.len());
                s.handle_bytes(&input[at..end], Some(clock), &mut out).unwrap();
                at = end;
            }
            let (clocks, others) = read(&out);
            let orders = kinds.iter().filter(|k| k.0 >= 2).count();
            prop_assert_eq!(clocks, vec![Some(clock); orders]);
            prop_assert_eq!(others, want_others);
            prop_assert_eq!(s.stats.stamped, orders as u64);
            prop_assert_eq!(s.stats.replaced_own_clock, kinds.iter().filter(|k| k.0 >= 2 && k.1).count() as u64);
        }
    }

    #[test]
    fn nothing_delivered_yet_passes_unstamped_and_garbage_is_refused() {
        let mut b = Vec::new();
        client::enter_order(
            &Order { token: 1, side: b'S', qty: 1, symbol: "AAPL", price: 1, ..Default::default() },
            &mut b,
        );
        let (mut s, mut out) = (Stamper::default(), Vec::new());
        s.handle_bytes(&b, None, &mut out).unwrap();
        assert_eq!((out, s.stats.before_any_data), (b, 1));
        assert_eq!(s.handle_bytes(&[0, 0, 1], None, &mut Vec::new()), Err(NotSoupBinTcp));
    }
}
