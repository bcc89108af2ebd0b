//! The live exchange's cheat watch (issue 44): the sender's deadline records
//! come in on a UDP socket (`deadlines_listen`, sealed under the operator
//! key), each user's order path is measured from its session's TCP
//! minimum round-trip time, and every order carrying a DBO delivery clock
//! (OUCH appendage tag 0xF1) is judged by `fairfeed_exchange::cheat`: did it
//! arrive earlier than the deadline of the data it answers, plus the
//! response time it states, plus the path's floor, allows?
//!
//! - **What it trusts.** Deadlines only from sealed records (the sender is
//!   the operator's). The path floor from the kernel's TCP round-trip
//!   measurement, halved: a firm can slow its acknowledgements and make the
//!   floor later (which only makes its own early orders show more), not
//!   earlier. The response time is the firm's own word; a firm that
//!   overstates it only ranks itself later under DBO.
//! - **What it cannot judge.** An order without a delivery clock (which
//!   data does it answer?) or for data the book does not hold (counted).
//! - **Clocks.** Deadlines are on the sender's synchronized clock, arrivals
//!   on the exchange's wall clock: the two must be synchronized (one host,
//!   or the tree's clock sync reaching the exchange's host); an offset
//!   between them shows up as lead and is the operator's to remove.
//!
//! Sans-IO: the gateway loop hands it datagrams, orders and RTT readings.

use fairfeed_exchange::cheat::{CheatDetector, CheatParams, FirmWatch};
use fairfeed_exchange::ordering::DeliveryClock;
use fairfeed_tree::deadlines::{parse, DeadlineBook, RecordError};
use fairfeed_tree::operator::OperatorKey;

/// Counters of the watch.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct WatchStats {
    pub datagrams: u64,
    pub refused_not_records: u64,
    pub refused_malformed: u64,
    pub refused_bad_tag: u64,
    pub orders_judged: u64,
    /// Orders without a delivery clock (nothing to judge them against).
    pub orders_unstamped: u64,
    /// Orders whose data sequence the book does not hold (not yet, or long gone).
    pub orders_unknown_data: u64,
    pub rtt_samples: u64,
    /// Firms flagged so far.
    pub flagged: u64,
}

/// One user's line in the report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UserWatch {
    pub user: String,
    #[serde(flatten)]
    pub watch: FirmWatch,
}

pub struct CheatWatch {
    key: OperatorKey,
    book: DeadlineBook,
    detector: CheatDetector,
    users: Vec<String>,
    pub stats: WatchStats,
}

impl CheatWatch {
    pub fn new(key: OperatorKey, users: Vec<String>) -> Self {
        CheatWatch {
            key,
            book: DeadlineBook::default(),
            detector: CheatDetector::new(CheatParams::default(), users.len()),
            users,
            stats: WatchStats::default(),
        }
    }

    /// A datagram arrived on the deadlines socket.
    pub fn on_datagram(&mut self, bytes: &[u8]) {
        self.stats.datagrams += 1;
        match parse(&self.key, bytes) {
            Ok(rs) => rs.into_iter().for_each(|r| self.book.insert(r)),
            Err(RecordError::NotRecords) => self.stats.refused_not_records += 1,
            Err(RecordError::Malformed) => self.stats.refused_malformed += 1,
            Err(RecordError::BadTag) => self.stats.refused_bad_tag += 1,
        }
    }

    /// User `user`'s session measured a minimum round trip of `rtt_ns`.
    pub fn on_rtt(&mut self, user: usize, rtt_ns: u64) {
        self.stats.rtt_samples += 1;
        self.detector.handle_path_sample(user, rtt_ns / 2);
    }

    /// An order from `user` arrived at `now_ns` (wall clock) with its
    /// delivery clock, if any. Returns true when it flags the user.
    pub fn on_order(&mut self, user: usize, clock: Option<DeliveryClock>, now_ns: u64) -> bool {
        let Some(c) = clock else {
            self.stats.orders_unstamped += 1;
            return false;
        };
        let Some(deadline) = self.book.get(c.data_seq) else {
            self.stats.orders_unknown_data += 1;
            return false;
        };
        self.stats.orders_judged += 1;
        let flagged = self.detector.handle_order(user, deadline, now_ns, Some(c.response_ns));
        self.stats.flagged += u64::from(flagged);
        flagged
    }

    /// Users flagged, by name.
    pub fn flagged(&self) -> Vec<String> {
        self.detector.flagged().filter_map(|u| self.users.get(u).cloned()).collect()
    }

    /// The counters, what the deadline book holds and each user's watch.
    pub fn report(&self) -> serde_json::Value {
        let users: Vec<UserWatch> = (0..self.users.len())
            .filter_map(|u| self.detector.firm(u).map(|w| UserWatch { user: self.users[u].clone(), watch: *w }))
            .collect();
        serde_json::json!({
            "stats": self.stats,
            "deadlines": { "records": self.book.records, "messages": self.book.messages,
                           "repeated": self.book.repeated, "too_old": self.book.too_old },
            "flagged": self.flagged(),
            "users": users,
        })
    }
}

pub use fairfeed_io::socket::tcp_min_rtt_ns;

#[cfg(test)]
mod tests {
    use super::*;
    use fairfeed_tree::deadlines::{Record, RecordWriter};

    #[test]
    fn sealed_deadlines_judge_orders_and_forged_ones_are_refused() {
        let key = OperatorKey::new([5; 32]);
        let mut w = CheatWatch::new(key.clone(), vec!["A".into(), "B".into()]);
        let mut rw = RecordWriter::new(key);
        rw.push(Record { first: 1, messages: 10, deadline_ns: 1_000_000 });
        let d = rw.flush().unwrap();
        let mut forged = d.clone();
        forged[8] ^= 1;
        w.on_datagram(&forged);
        w.on_datagram(b"hello");
        w.on_datagram(&d);
        assert_eq!((w.stats.refused_bad_tag, w.stats.refused_not_records), (1, 1));
        for u in 0..2 {
            w.on_rtt(u, 40_000);
        }
        // A answers data 5 at the deadline + 2 µs + its 20-µs path; B 50 µs before the deadline.
        let clock = Some(DeliveryClock { data_seq: 5, response_ns: 2_000 });
        for _ in 0..5 {
            assert!(!w.on_order(0, clock, 1_000_000 + 2_000 + 25_000));
            w.on_order(1, clock, 1_000_000 - 50_000 + 2_000 + 20_000);
        }
        assert_eq!(w.flagged(), vec!["B".to_string()]);
        assert!(!w.on_order(0, None, 0));
        assert!(!w.on_order(0, Some(DeliveryClock { data_seq: 99, response_ns: 0 }), 0));
        assert_eq!((w.stats.orders_unstamped, w.stats.orders_unknown_data, w.stats.orders_judged), (1, 1, 10));
        let r = w.report();
        assert_eq!(r["users"][1]["user"], "B");
        assert!(r["users"][1]["flagged_after"].as_u64().is_some());
    }

    #[test]
    fn a_loopback_connection_reports_its_minimum_round_trip() {
        use std::io::{Read, Write};
        use std::os::fd::AsFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        for _ in 0..10 {
            c.write_all(b"ping").unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).unwrap();
            s.write_all(b"pong").unwrap();
            c.read_exact(&mut b).unwrap();
        }
        let rtt = tcp_min_rtt_ns(s.as_fd()).expect("Linux reports tcpi_min_rtt");
        assert!((1_000..100_000_000).contains(&rtt), "{rtt} ns");
    }
}
