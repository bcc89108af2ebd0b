//! A sender's feed as an agent: hands each MoldUDP64 packet to the node at
//! its time, keeps the journal of what it handed, and answers retransmission
//! requests from it on a socket of its own.

use std::net::UdpSocket;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use fairfeed_arb::retransmit::{Journal, RetransmitServer, ServerConfig};
use fairfeed_clock::skew::Skew;
use fairfeed_io::agent::{Agent, Turn};
use serde_json::json;

use super::control::{Life, Poster};
use super::mailbox::Outgoing;
use super::{wall_ns, AgentError, SenderJob, TimeBase};
use crate::arb::live::bind_udp;

/// Packets handed to the node in one turn at most (the rest next turn).
const TURN_PACKETS_MAX: usize = 64;

/// The retransmission server a sender runs over its own journal.
struct Journaled {
    server: RetransmitServer,
    sock: UdpSocket,
    answers: u64,
    journal_errors: u64,
}

/// A sender's schedule: packet `k` is due at `t0 + k × gap` on the node's clock.
pub struct FeedAgent {
    job: SenderJob,
    t0: u64,
    gap_ns: u64,
    next: usize,
    last_sent_ns: u64,
    journal: Option<Journaled>,
    out: Outgoing<Vec<u8>>,
    /// Turns the node's queue was full.
    queue_full: u64,
    skew: Skew,
    time: TimeBase,
    life: Arc<Life>,
    poster: Option<Poster>,
    scratch: Vec<u8>,
}

impl FeedAgent {
    /// The feed of `job`, starting at wall time `now`, into `out`.
    pub fn new(
        job: &SenderJob,
        now: u64,
        out: Outgoing<Vec<u8>>,
        (skew, time): (Skew, TimeBase),
        life: Arc<Life>,
        poster: Option<Poster>,
    ) -> Result<Self, AgentError> {
        if job.rate_per_s.is_nan() || job.rate_per_s <= 0.0 {
            return Err(AgentError::Config("the sender's rate must be positive".into()));
        }
        let journal = match job.retransmit_listen {
            None => None,
            Some(a) => Some(Journaled {
                server: RetransmitServer::new(Journal::new(), ServerConfig::default()),
                sock: bind_udp(a, 1 << 20)
                    .map_err(|e| AgentError::Io(format!("binding the retransmission server to {a}"), e))?,
                answers: 0,
                journal_errors: 0,
            }),
        };
        let local = skew.local(time.at(now));
        Ok(FeedAgent {
            job: job.clone(),
            t0: local + job.start_delay_ns,
            gap_ns: (1e9 / job.rate_per_s) as u64,
            next: 0,
            last_sent_ns: local,
            journal,
            out,
            queue_full: 0,
            skew,
            time,
            life,
            poster,
            scratch: vec![0u8; 2048],
        })
    }

    fn local_at(&self, wall: u64) -> u64 {
        self.skew.local(self.time.at(wall))
    }

    fn wall_at_local(&self, local: u64) -> u64 {
        self.time.wall_at(self.skew.true_at(local))
    }

    /// Hands over the packets due at `local`; returns how many.
    fn hand_over(&mut self, local: u64) -> usize {
        let mut n = 0;
        while self.next < self.job.payloads.len() && local >= self.t0 + self.next as u64 * self.gap_ns {
            if n == TURN_PACKETS_MAX {
                break;
            }
            let p = &self.job.payloads[self.next];
            if self.out.push(p.clone()).is_err() {
                // The node is behind: try again next turn, in order.
                self.queue_full += 1;
                break;
            }
            if let Some(j) = &mut self.journal {
                if j.server.journal_mut().append_packet(p).is_err() {
                    j.journal_errors += 1;
                }
            }
            self.next += 1;
            self.last_sent_ns = local;
            n += 1;
        }
        if n > 0 {
            self.out.wake();
        }
        n
    }

    /// Answers retransmission requests; returns how many it read.
    fn serve(&mut self, now: u64) -> usize {
        let Some(j) = &mut self.journal else { return 0 };
        let mut out = [0u8; fairfeed_wire::moldudp64::PACKET_LEN_DEFAULT_MAX];
        let mut n = 0;
        while let Ok((len, from)) = j.sock.recv_from(&mut self.scratch) {
            n += 1;
            if let Some(k) = j.server.handle_request(now, from, &self.scratch[..len], &mut out) {
                if j.sock.send_to(&out[..k], from).is_ok() {
                    j.answers += 1;
                }
            }
        }
        n
    }

    fn all_handed(&self) -> bool {
        self.next >= self.job.payloads.len()
    }

    /// Its counters, as they go into the node's report.
    pub fn counters(&self) -> serde_json::Value {
        let mut c = json!({
            "feed_sent": self.next,
            "feed_total": self.job.payloads.len(),
            "feed_queue_full": self.queue_full,
        });
        if let Some(j) = &self.journal {
            c["retransmit_answers"] = j.answers.into();
            c["journal_errors"] = j.journal_errors.into();
            c["journal_evicted"] = j.server.journal().evicted().into();
            c["retransmit_server"] = serde_json::to_value(j.server.stats()).unwrap_or_default();
        }
        c
    }
}

impl Agent for FeedAgent {
    fn do_work(&mut self, now: u64, turn: Turn) -> usize {
        let local = self.local_at(now);
        let mut work = self.hand_over(local);
        if turn == Turn::All {
            work += self.serve(local);
        }
        if !self.out.is_closed() && self.all_handed() && local.saturating_sub(self.last_sent_ns) >= self.job.linger_ns {
            // Sent, and lingered for the last reports and retransmissions.
            self.out.close();
            work += 1;
        }
        if let Some(mut p) = self.poster.take() {
            p.post_due(now, || self.counters());
            self.poster = Some(p);
        }
        work
    }

    fn next_due(&self) -> u64 {
        let l = if self.all_handed() {
            self.last_sent_ns.saturating_add(self.job.linger_ns)
        } else {
            self.t0 + self.next as u64 * self.gap_ns
        };
        let due = if self.out.is_closed() { u64::MAX } else { self.wall_at_local(l) };
        due.min(self.poster.as_ref().map_or(u64::MAX, Poster::next_ns))
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds: Vec<BorrowedFd<'_>> = self.journal.iter().map(|j| j.sock.as_fd()).collect();
        fds.extend(self.poster.iter().map(Poster::fd));
        fds
    }

    fn is_done(&self) -> bool {
        self.out.is_closed() || self.life.over(wall_ns())
    }
}
