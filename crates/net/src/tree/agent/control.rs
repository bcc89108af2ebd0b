//! A node's control side: when its agents stop ([`Life`]), what they post
//! to the node's counters board ([`TreePart`] on a
//! [`fairfeed_io::counters::Board`]), and the [`ControlAgent`] that answers
//! `stat` and `stop` on the control socket.
//!
//! Who may ask what ([`fairfeed_tree::operator`]): `stop` is obeyed only
//! sealed under the operator key; `stat` and `releases` are answered to
//! loopback or to sealed requests. Anything else is refused and counted
//! (`counters.control.auth`), with at most [`UNKNOWN_ANSWERS_PER_S`] short
//! refusals a second, never longer than the request that drew them.
//!
//! Aeron's conductor, small: the data-path agents never serialize a report
//! or touch the control socket. Each posts its own part of the report (node:
//! counters, state machine, histograms; feed; delivery) to the board every
//! [`fairfeed_io::counters::PUBLISH_INTERVAL`] and whenever the control agent asks
//! ([`Board::ask`]). The control agent answers once every part has caught
//! up, or after [`ANSWER_WAIT_NS`] with the parts it has, and runs on a
//! thread of its own that parks (it costs the data path nothing while nobody
//! asks). A metrics endpoint or a dashboard reads the same board
//! ([`report`]).

use std::collections::VecDeque;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fairfeed_io::agent::{Agent, Turn};
pub use fairfeed_io::counters::{Board, Hists, Poster};
use fairfeed_tree::operator::{Access, AuthCounters, OperatorKey, Verifier, NONCE_LEN};
use hdrhistogram::Histogram;

use super::{wall_ns, AgentReport};

/// A sealed command's nonce.
type Nonce = [u8; NONCE_LEN];
/// The longest a `stat` answer waits for the parts to catch up.
pub const ANSWER_WAIT_NS: u64 = 100_000_000;
/// `stat` requests waiting for their answer at most; more are dropped and counted.
pub const PENDING_MAX: usize = 64;
/// ... of which from one IP address at most (a second request from the same
/// socket while one waits is answered by the same answer).
pub const PENDING_PER_ADDRESS_MAX: usize = 4;
/// Answers to unknown commands per second at most (the rest are counted, not answered).
pub const UNKNOWN_ANSWERS_PER_S: u64 = 100;
/// `releases` answers (≈ 8 KiB each) per second at most, from all askers
/// together: a fleet view of a few hundred receivers pages through in
/// seconds, and a flood (or a spoofed source) gets at most ≈ 0.4 MB/s out.
pub const RELEASE_ANSWERS_PER_S: u64 = 50;
/// While a request waits, the control agent looks this often.
const PENDING_POLL_NS: u64 = 200_000;
/// A control request's size at most (longer ones are cut and refused).
const REQUEST_MAX: usize = 256;

/// When a node's agents stop: a signal, `stop` on the control socket, the
/// node's time limit, or the process finishing. Shared by every agent of
/// one node, wherever it runs.
#[derive(Debug)]
pub struct Life {
    signal: Arc<AtomicBool>,
    asked: AtomicBool,
    finished: AtomicBool,
    /// Wall ns at which the node's time is up (`u64::MAX`: never).
    end_wall_ns: u64,
}

impl Life {
    pub fn new(signal: Arc<AtomicBool>, started_ns: u64, max_seconds: Option<f64>) -> Self {
        let end_wall_ns = max_seconds.map_or(u64::MAX, |s| started_ns.saturating_add((s * 1e9) as u64));
        Life { signal, asked: AtomicBool::new(false), finished: AtomicBool::new(false), end_wall_ns }
    }

    /// Over at wall time `now`.
    pub fn over(&self, now: u64) -> bool {
        self.signal.load(Ordering::Relaxed)
            || self.asked.load(Ordering::Relaxed)
            || self.finished.load(Ordering::Relaxed)
            || now >= self.end_wall_ns
    }

    /// Asked to stop (on the control socket).
    pub fn ask_stop(&self) {
        self.asked.store(true, Ordering::Relaxed);
    }

    /// The process is done with the node: whatever still runs stops.
    pub fn finish(&self) {
        self.finished.store(true, Ordering::Relaxed);
    }

    pub fn end_wall_ns(&self) -> u64 {
        self.end_wall_ns
    }
}

/// A part of a node's report on its board ([`fairfeed_io::counters`]).
#[derive(Debug, Clone)]
pub enum TreePart {
    /// The node agent's report (its counters, its state machine's; without
    /// latency quantiles — readers compute those from the histograms, off
    /// the data path).
    Report(Box<AgentReport>),
    /// Another agent's counters, merged into the report's `counters`.
    Counters(serde_json::Value),
}

/// The board a node's agents post to.
pub type NodeBoard = Board<TreePart>;
/// One agent's handle on its node's board.
pub type NodePoster = Poster<TreePart>;

/// The node agent's part.
pub const NODE_PART: &str = "node";
/// A sender's feed agent's part.
pub const FEED_PART: &str = "feed";
/// A receiver's delivery agent's part.
pub const DELIVERY_PART: &str = "delivery";
/// The control agent's own counters and the node's extra counters.
pub const CONTROL_PART: &str = "control";

/// The node's report from the latest parts on its board (none before the
/// node's first post), with its histograms when `hists`.
pub fn report(board: &NodeBoard, hists: bool) -> Option<(AgentReport, Hists)> {
    board.read(|parts| {
        let node = parts.get(NODE_PART)?;
        let TreePart::Report(r) = &node.value else { return None };
        let extra = parts.iter().filter_map(|(_, p)| match &p.value {
            TreePart::Counters(v) => Some(v),
            TreePart::Report(_) => None,
        });
        let mut report = compose(r, extra);
        if report.role == "receiver" && !node.hists.is_empty() {
            report.latency = serde_json::Value::Object(
                node.hists.iter().map(|(name, h)| ((*name).to_string(), summary(h))).collect(),
            );
        }
        Some((report, if hists { node.hists.clone() } else { Vec::new() }))
    })
}

/// A latency histogram's count and quantiles (µs), as reports carry them.
pub fn summary(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({
        "count": h.len(),
        "p50_us": h.value_at_quantile(0.5) as f64 / 1e3,
        "p99_us": h.value_at_quantile(0.99) as f64 / 1e3,
        "p999_us": h.value_at_quantile(0.999) as f64 / 1e3,
        "max_us": h.max() as f64 / 1e3,
    })
}

/// The node's report with other agents' counters merged into its `counters`.
pub fn compose<'a>(node: &AgentReport, extra: impl IntoIterator<Item = &'a serde_json::Value>) -> AgentReport {
    let mut r = node.clone();
    for v in extra {
        if let (Some(into), Some(from)) = (r.counters.as_object_mut(), v.as_object()) {
            into.extend(from.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    r
}

/// Counters of the control side.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct ControlStats {
    pub requests: u64,
    /// `stat` requests dropped: [`PENDING_MAX`] were waiting, or
    /// `PENDING_PER_ADDRESS_MAX` from the same address.
    pub dropped: u64,
    /// `stat` requests from a socket whose request was already waiting.
    pub coalesced: u64,
    /// Answers sent before every part had caught up.
    pub stale_answers: u64,
    pub unknown: u64,
    /// Commands admitted and refused by the operator-key check.
    pub auth: AuthCounters,
}

/// Answers `stat` and `stop` on the control socket from the node's board,
/// and posts its own counters there.
pub struct ControlAgent {
    sock: Option<UdpSocket>,
    board: Arc<NodeBoard>,
    life: Arc<Life>,
    /// Its own part (its counters and the node's extra counters).
    poster: NodePoster,
    /// Requests waiting for the parts: who asked, the generation, until
    /// when, and the nonce it was sealed with (its answer is sealed to it).
    pending: VecDeque<(SocketAddr, u64, u64, Option<Nonce>)>,
    /// The nonce of the sealed command being carried out (answers are sealed to it).
    current: Option<Nonce>,
    /// Unknown-command answers in the current second: (second, count).
    unknown_answers: (u64, u64),
    pub stats: ControlStats,
    extra: Vec<super::ExtraCounters>,
    /// A receiver's recent releases (`releases FROM`).
    releases: Option<Arc<super::releases::ReleaseLog>>,
    /// `releases` answers in the current second: (second, count).
    release_answers: (u64, u64),
    /// Checks each command against the operator key.
    verifier: Verifier,
    /// The node's tree keys (`reload-keys` asks their watch to read the file now).
    keys: Option<Arc<super::keys::KeyCell>>,
}

/// What a node's control command does: `stop` and `reload-keys` change; `stat`, `releases`
/// and unknown commands (answered "unknown") only read. A command added
/// here that changes anything must be listed as a change.
fn access(cmd: &str) -> Access {
    match cmd.split_whitespace().next() {
        Some("stop" | "reload-keys") => Access::Change,
        _ => Access::Read,
    }
}

impl ControlAgent {
    /// The control agent of the node whose board is `board` (it posts there
    /// as `CONTROL_PART`), answering on `sock` where there is one.
    pub fn new(
        sock: Option<UdpSocket>,
        board: &Arc<NodeBoard>,
        life: Arc<Life>,
    ) -> Result<Self, fairfeed_io::counters::BoardError> {
        Ok(ControlAgent {
            sock,
            board: board.clone(),
            life,
            poster: board.poster(CONTROL_PART)?,
            pending: VecDeque::with_capacity(PENDING_MAX),
            current: None,
            unknown_answers: (0, 0),
            stats: ControlStats::default(),
            extra: Vec::new(),
            releases: None,
            release_answers: (0, 0),
            verifier: Verifier::new(None, None),
            keys: None,
        })
    }

    /// Answers `reload-keys` for these keys.
    pub fn with_keys(mut self, keys: Option<Arc<super::keys::KeyCell>>) -> Self {
        self.keys = keys;
        self
    }

    /// Obeys commands sealed under `key` (without one, only loopback queries are answered).
    pub fn with_operator(mut self, key: Option<OperatorKey>) -> Self {
        let local = self.sock.as_ref().and_then(|s| s.local_addr().ok());
        self.verifier = Verifier::new(key, local);
        self
    }

    /// Answers `releases FROM` from `log` (a receiver's).
    pub fn with_releases(mut self, log: Option<Arc<super::releases::ReleaseLog>>) -> Self {
        self.releases = log;
        self
    }

    /// The address it answers on (its port, where `--control` asked for port 0).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.sock.as_ref().and_then(|s| s.local_addr().ok())
    }

    /// Shows `extra` with the node's counters.
    pub fn with_extra(mut self, extra: Vec<super::ExtraCounters>) -> Self {
        self.extra = extra;
        self
    }

    /// Posts its own part: its counters and the node's extra counters.
    pub fn post(&self) {
        self.poster.post(self.own(), Vec::new());
    }

    fn own(&self) -> TreePart {
        let mut c = serde_json::json!({ "control": self.stats });
        for e in &self.extra {
            c[e.name] = (e.read)();
        }
        TreePart::Counters(c)
    }

    /// Takes a `stat` request from `from` (bounded per address and in all).
    fn ask(&mut self, from: SocketAddr, now: u64) {
        if self.pending.iter().any(|p| p.0 == from) {
            self.stats.coalesced += 1;
            return;
        }
        let same_ip = self.pending.iter().filter(|p| p.0.ip() == from.ip()).count();
        if self.pending.len() >= PENDING_MAX || same_ip >= PENDING_PER_ADDRESS_MAX {
            self.stats.dropped += 1;
            return;
        }
        let g = self.board.ask();
        self.pending.push_back((from, g, now + ANSWER_WAIT_NS, self.current));
    }

    /// Whether an unknown command may be answered now (at most
    /// [`UNKNOWN_ANSWERS_PER_S`] a second).
    fn may_answer_unknown(&mut self, now: u64) -> bool {
        let second = now / 1_000_000_000;
        if self.unknown_answers.0 != second {
            self.unknown_answers = (second, 0);
        }
        self.unknown_answers.1 += 1;
        self.unknown_answers.1 <= UNKNOWN_ANSWERS_PER_S
    }

    fn read_requests(&mut self, now: u64) -> usize {
        let mut buf = [0u8; REQUEST_MAX];
        let mut n = 0;
        while let Some(Ok((len, from))) = self.sock.as_ref().map(|s| s.recv_from(&mut buf)) {
            n += 1;
            self.stats.requests += 1;
            let text = String::from_utf8_lossy(&buf[..len]);
            let admitted = self.verifier.admit(fairfeed_io::clock::wall_ns(), &text, from.ip(), access);
            self.stats.auth = self.verifier.counters;
            match admitted {
                Ok(a) => {
                    self.current = a.sealed;
                    self.obey(a.command, from, now);
                    self.current = None;
                }
                Err(e) => {
                    tracing::debug!(%from, "control: refused {:?}: {e}", text.chars().take(32).collect::<String>());
                    self.refuse(&format!("refused: {e}"), len, from, now);
                }
            }
        }
        n
    }

    /// Carries out an admitted command.
    fn obey(&mut self, cmd: &str, from: SocketAddr, now: u64) {
        match cmd {
            "stat" => self.ask(from, now),
            "stop" => {
                tracing::warn!(%from, "control: stop (sealed under the operator key)");
                self.life.ask_stop();
                self.reply(b"stopping", from);
            }
            cmd if cmd.starts_with("releases") => self.releases(cmd, from, now),
            "reload-keys" => match &self.keys {
                Some(k) => {
                    k.ask_reload();
                    tracing::info!(%from, "control: reload-keys (sealed under the operator key)");
                    self.reply(b"reloading the key file", from);
                }
                None => self.reply(b"error: this node reads no key file (--key-file)", from),
            },
            other => {
                self.stats.unknown += 1;
                let cmd: String = other.chars().take(32).collect();
                self.refuse(
                    &format!("unknown command {cmd:?}; try stat, releases FROM, stop or reload-keys"),
                    usize::MAX,
                    from,
                    now,
                );
            }
        }
    }

    /// A short refusal, at most [`UNKNOWN_ANSWERS_PER_S`] a second and,
    /// beyond loopback, never longer than the `asked` bytes that drew it (a
    /// spoofed source gets no more than it sent; `fairfeed stat` pads its
    /// requests to read the whole reason).
    fn refuse(&mut self, why: &str, asked: usize, from: SocketAddr, now: u64) {
        if self.may_answer_unknown(now) {
            let b = why.as_bytes();
            let n = if from.ip().is_loopback() { b.len() } else { b.len().min(asked) };
            self.reply(&b[..n], from);
        }
    }

    /// `releases FROM`: a page of a receiver's recent releases (bounded in
    /// size, and to [`RELEASE_ANSWERS_PER_S`] answers a second in all).
    fn releases(&mut self, cmd: &str, from: SocketAddr, now: u64) {
        let second = now / 1_000_000_000;
        if self.release_answers.0 != second {
            self.release_answers = (second, 0);
        }
        self.release_answers.1 += 1;
        if self.release_answers.1 > RELEASE_ANSWERS_PER_S {
            self.stats.dropped += 1;
            return;
        }
        let body = match (&self.releases, cmd.split_whitespace().nth(1).map(str::parse::<u64>)) {
            (None, _) => r#"{"error":"only a receiver keeps releases"}"#.to_string(),
            (Some(log), Some(Ok(s))) => log.page(s, super::releases::RELEASES_PER_ANSWER).to_string(),
            (Some(_), _) => r#"{"error":"usage: releases FROM (a sequence number)"}"#.to_string(),
        };
        self.reply(body.as_bytes(), from);
    }

    /// Sends `body` to `to`, sealed to the command being answered if it came sealed.
    fn reply(&self, body: &[u8], to: SocketAddr) {
        if let Some(s) = &self.sock {
            let _ = s.send_to(&self.verifier.answer(self.current, body), to);
        }
    }

    fn answer(&mut self, now: u64) -> usize {
        if self.pending.is_empty() {
            return 0;
        }
        // Its own part is always fresh: it is the one that asked.
        self.post();
        let mut n = 0;
        while let Some(&(to, g, until, nonce)) = self.pending.front() {
            let ready = self.board.caught_up(g);
            if !ready && now < until {
                break;
            }
            self.stats.stale_answers += u64::from(!ready);
            let body = report(&self.board, false).map_or_else(
                || r#"{"error":"the node has not started yet"}"#.to_string(),
                |(r, _)| serde_json::to_string(&r).unwrap_or_default(),
            );
            self.current = nonce;
            self.reply(body.as_bytes(), to);
            self.current = None;
            self.pending.pop_front();
            n += 1;
        }
        n
    }
}

impl Agent for ControlAgent {
    fn role(&self) -> &'static str {
        "control"
    }

    /// Its last counters stand where readers look.
    fn on_close(&mut self, _now: u64) {
        self.poster.post_final(self.own(), Vec::new());
    }

    fn do_work(&mut self, now: u64, turn: Turn) -> usize {
        let mut work = 0;
        if turn == Turn::All {
            work += self.read_requests(now);
        }
        work += self.answer(now);
        if self.poster.due(now) {
            self.post();
            work += 1;
        }
        work
    }

    fn next_due(&self) -> u64 {
        let mut due = self.poster.next_ns();
        if !self.pending.is_empty() {
            due = due.min(wall_ns() + PENDING_POLL_NS);
        }
        due
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        self.sock.iter().map(AsFd::as_fd).collect()
    }

    fn is_done(&self) -> bool {
        self.life.over(wall_ns())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample_report() -> AgentReport {
        AgentReport {
            id: 3,
            role: "receiver".into(),
            addr: "127.0.0.1:1".into(),
            uptime_s: 1.0,
            counters: serde_json::json!({ "packets_in": 5 }),
            node: serde_json::json!({}),
            latency: serde_json::json!({}),
            tuning: Vec::new(),
            rows: Vec::new(),
        }
    }

    fn client(ip: &str) -> UdpSocket {
        let s = UdpSocket::bind(format!("{ip}:0")).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        s
    }

    #[test]
    fn answers_are_bounded_per_address_and_a_flooder_cannot_crowd_out_another_client() {
        let board = NodeBoard::new();
        let (mut node, mut feed) = (board.poster(NODE_PART).unwrap(), board.poster(FEED_PART).unwrap());
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_nonblocking(true).unwrap();
        let to = sock.local_addr().unwrap();
        let life = Arc::new(Life::new(Arc::new(AtomicBool::new(false)), wall_ns(), None));
        let mut ctl = ControlAgent::new(Some(sock), &board, life.clone()).unwrap();
        // One flooding socket (coalesced), more sockets from its IP (bounded), a second client elsewhere.
        let flooder = client("127.0.0.1");
        for _ in 0..10 {
            flooder.send_to(b"stat", to).unwrap();
        }
        let more: Vec<UdpSocket> = (0..6).map(|_| client("127.0.0.1")).collect();
        for s in &more {
            s.send_to(b"stat", to).unwrap();
        }
        let other = client("127.0.0.2");
        other.send_to(b"stat", to).unwrap();
        flooder.send_to(&[0xff; 400], to).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let now = wall_ns();
        ctl.do_work(now, Turn::All);
        assert_eq!(ctl.stats.coalesced, 9);
        assert_eq!(ctl.stats.dropped, 3, "4 waiting per address: the flooder and 3 more");
        assert_eq!(ctl.stats.unknown, 1);
        assert_eq!(ctl.pending.len(), 5);
        // Nothing is answered until every part caught up (or the wait is over).
        assert!(node.due(now), "asked");
        node.post(TreePart::Report(Box::new(sample_report())), Vec::new());
        ctl.do_work(now, Turn::Timers);
        assert_eq!(ctl.pending.len(), 5, "the feed's part is not fresh yet");
        assert!(feed.due(now), "asked");
        feed.post(TreePart::Counters(serde_json::json!({ "feed_sent": 7 })), Vec::new());
        ctl.do_work(now, Turn::Timers);
        assert!(ctl.pending.is_empty());
        let mut buf = [0u8; 4096];
        let n = other.recv(&mut buf).expect("the other client is answered");
        let v: serde_json::Value = serde_json::from_slice(&buf[..n]).unwrap();
        assert_eq!(v["counters"]["packets_in"], 5);
        assert_eq!(v["counters"]["feed_sent"], 7, "parts merged");
        assert_eq!(v["counters"]["control"]["coalesced"], 9);
        // A request unanswered by the parts is answered with what there is after the wait.
        other.send_to(b"stat", to).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        ctl.do_work(now, Turn::All);
        ctl.do_work(now + ANSWER_WAIT_NS, Turn::Timers);
        assert_eq!(ctl.stats.stale_answers, 1);
        assert!(other.recv(&mut buf).is_ok());
        // `stop` needs a seal: without one it is refused and the node lives.
        other.send_to(b"stop", to).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        ctl.do_work(now, Turn::All);
        assert!(!life.over(now));
        let n = other.recv(&mut buf).expect("refused, with the reason");
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("refused: not authenticated"));
        assert_eq!(ctl.stats.auth.unauthenticated, 1);
    }

    #[test]
    fn stop_is_obeyed_only_sealed_under_the_operator_key_and_only_once() {
        let board = NodeBoard::new();
        let _node = board.poster(NODE_PART).unwrap();
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_nonblocking(true).unwrap();
        let to = sock.local_addr().unwrap();
        let life = Arc::new(Life::new(Arc::new(AtomicBool::new(false)), wall_ns(), None));
        let key = OperatorKey::new([3; 32]);
        let mut ctl = ControlAgent::new(Some(sock), &board, life.clone()).unwrap().with_operator(Some(key.clone()));
        let c = client("127.0.0.1");
        let mut buf = [0u8; 512];
        let mut send = |b: &[u8]| {
            c.send_to(b, to).unwrap();
            std::thread::sleep(Duration::from_millis(10));
            ctl.do_work(wall_ns(), Turn::All);
            let n = c.recv(&mut buf).map_or(0, |n| n);
            (String::from_utf8_lossy(&buf[..n]).into_owned(), ctl.stats.auth)
        };
        let wrong = OperatorKey::new([4; 32]).seal(wall_ns(), [1; 16], to, "stop");
        assert!(send(wrong.as_bytes()).0.contains("wrong MAC"));
        let stale = key.seal(wall_ns() - 60_000_000_000, [2; 16], to, "stop");
        assert!(send(stale.as_bytes()).0.contains("stale"));
        let elsewhere = key.seal(wall_ns(), [4; 16], "127.0.0.1:1".parse().unwrap(), "stop");
        assert!(send(elsewhere.as_bytes()).0.contains("another control address"));
        assert!(!life.over(wall_ns()), "refused commands change nothing");
        let good = key.seal(wall_ns(), [3; 16], to, "stop");
        let (reply, auth) = send(good.as_bytes());
        // The answer is sealed to the command's nonce.
        assert_eq!(key.open_reply(reply.as_bytes()), Ok(([3; 16], &b"stopping"[..])), "{reply}");
        assert!(life.over(wall_ns()));
        let (reply, auth2) = send(good.as_bytes());
        assert!(reply.contains("replayed"), "{reply}");
        assert_eq!((auth.sealed, auth.bad_mac, auth.stale, auth2.replayed), (1, 1, 1, 1));
    }
}
