//! A sender's snapshot service as an agent of its own (`sender
//! --snapshot-listen`): the feed agent hands it a copy of every packet it
//! sends down the tree through a mailbox, so building a large snapshot
//! (≈ 78 ms per million open orders) never holds up the feed. A full
//! mailbox drops the copy and counts it; the books then see a gap and, if
//! it is not filled, stop being served — visible, never wrong.

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use fairfeed_io::agent::{Agent, Turn};

use super::control::Life;
use super::{wall_ns, AgentError};
use crate::snapshot::{ServiceConfig, SnapshotService};
use fairfeed_io::counters::Poster;
use fairfeed_io::mailbox::Incoming;

/// Copies of sent packets waiting for the snapshot agent, at most.
pub const SNAPSHOT_MAILBOX_CAPACITY: usize = 65_536;

/// Serves snapshots of what the sender sends.
pub struct SnapshotAgent {
    service: SnapshotService,
    inbox: Incoming<Vec<u8>>,
    life: Arc<Life>,
    /// Where its report goes (the feed agent puts it in the node's counters).
    poster: Poster,
    batch: Vec<Vec<u8>>,
}

impl SnapshotAgent {
    pub fn new(
        cfg: &ServiceConfig,
        inbox: Incoming<Vec<u8>>,
        life: Arc<Life>,
        poster: Poster,
    ) -> Result<Self, AgentError> {
        let service = SnapshotService::new(cfg)
            .map_err(|e| AgentError::Io(format!("binding the snapshot service to {}", cfg.listen), e))?;
        Ok(Self { service, inbox, life, poster, batch: Vec::new() })
    }

    /// Where snapshots are served.
    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        self.service.local_addr().ok()
    }

    /// Publishes its report now (at the end of a run).
    pub fn publish_now(&self) {
        self.poster.post(serde_json::to_value(self.service.report()).unwrap_or_default(), Vec::new());
    }
}

impl Agent for SnapshotAgent {
    fn role(&self) -> &'static str {
        "snapshots"
    }

    fn on_close(&mut self, _now: u64) {
        self.publish_now();
    }

    fn do_work(&mut self, now: u64, _turn: Turn) -> usize {
        let mut batch = std::mem::take(&mut self.batch);
        let mut work = self.inbox.drain(|p| batch.push(p));
        for p in batch.drain(..) {
            self.service.take_packet(now, &p);
        }
        self.batch = batch;
        work += self.service.service(now);
        if !self.inbox.arm() {
            work += 1;
        }
        if self.poster.due(now) {
            self.publish_now();
        }
        work
    }

    fn next_due(&self) -> u64 {
        if !self.inbox.is_empty() {
            return 0;
        }
        self.service.next_due().min(self.poster.next_ns())
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds = vec![self.inbox.fd()];
        fds.extend(self.service.fds());
        fds
    }

    fn is_done(&self) -> bool {
        self.life.over(wall_ns())
    }
}
