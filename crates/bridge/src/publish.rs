//! The bridge's I/O shell: routed publications go through a bounded queue to a
//! publisher task on a small tokio runtime, which publishes them to NATS —
//! plainly (at most once) or into a JetStream stream (acknowledged, retried
//! until stored, deduplicated by `Nats-Msg-Id`, so a broker restart loses and
//! duplicates nothing).
//!
//! Every publication's payload ends with the 36-byte tag of [`crate::tag`]
//! (first MoldUDP64 sequence number, messages, the bridge's publication
//! number, its number on its subject, when the bridge received the packet —
//! the latency tag), written by the router. No NATS headers, but
//! `Nats-Msg-Id` for JetStream's deduplication.

use crate::BridgeError;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::HeaderMap;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::route::{Publication, RouteConfig, RouteStats, Router};

/// Publications queued between the feed and the broker, by default.
pub const BUFFER_DEFAULT: usize = 65_536;
/// `Auto` granularity batches once this many publications wait for the broker…
pub const AUTO_BATCH_ON: usize = 1_024;
/// … and goes back to one per message once no more than this many wait.
pub const AUTO_BATCH_OFF: usize = 64;

/// JetStream publications awaiting their acknowledgement at once, by default.
pub const IN_FLIGHT_DEFAULT: usize = 256;
/// A JetStream publication is retried this often at most (≈ 60 s of outage).
pub const RETRIES_MAX: u32 = 600;

/// What happens when the broker is slower than the feed and the queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    /// Drop the new publication and count it (the feed never waits).
    Drop,
    /// Wait for room (the feed's socket buffer absorbs, then the kernel drops).
    Block,
}

/// Where and how to publish.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    pub url: String,
    /// Publish into this JetStream stream (created over `<prefix>.>` if missing, file storage).
    pub jetstream: Option<String>,
    pub buffer: usize,
    pub overflow: Overflow,
    pub in_flight_max: usize,
    /// Credentials and TLS for the broker connection.
    pub security: crate::security::Security,
    /// Copies of the JetStream stream a cluster keeps (1..=5; 3 on a 3-node cluster).
    pub replicas: usize,
}

impl PublishConfig {
    pub fn new(url: &str) -> Self {
        PublishConfig {
            url: url.to_string(),
            jetstream: None,
            buffer: BUFFER_DEFAULT,
            overflow: Overflow::Drop,
            in_flight_max: IN_FLIGHT_DEFAULT,
            security: crate::security::Security::default(),
            replicas: 1,
        }
    }
}

/// Counters of the publishing side.
#[derive(Debug, Default)]
struct Shared {
    queued: AtomicU64,
    published: AtomicU64,
    dropped_overflow: AtomicU64,
    publish_errors: AtomicU64,
    retries: AtomicU64,
    acked: AtomicU64,
    acked_duplicate: AtomicU64,
    given_up: AtomicU64,
    disconnects: AtomicU64,
    queue_max_seen: AtomicUsize,
    /// Publications queued and not yet taken by the publisher.
    pending: AtomicUsize,
}

/// What the bridge did.
#[derive(Debug, Clone, Serialize)]
pub struct BridgeReport {
    pub route: RouteStats,
    pub queued: u64,
    pub published: u64,
    pub dropped_overflow: u64,
    pub publish_errors: u64,
    pub retries: u64,
    pub acked: u64,
    pub acked_duplicate: u64,
    pub given_up: u64,
    pub disconnects: u64,
    pub queue_max_seen: usize,
    /// CPU time of the publisher runtime's threads (publishing, the client's
    /// connection task, and the kernel's TCP sends), set by [`Bridge::finish`]
    /// once the queue is published.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publisher_cpu: Option<crate::cpu::ThreadsCpu>,
}

/// A queued publication (tagged by the router, with when its packet arrived).
type Item = Publication;

/// One packet's publications, queued together: one hand-off (and at most one
/// wake-up of the publisher) per packet, and the client writes them to the
/// broker together.
type Batch = Vec<Item>;

/// Publications of one packet held inline before they are queued.
const BATCH_CAPACITY: usize = 16;

/// The bridge: router in the caller's thread, publisher on its own runtime.
pub struct Bridge {
    router: Router,
    tx: Option<mpsc::Sender<Batch>>,
    cfg: PublishConfig,
    shared: Arc<Shared>,
    rt: tokio::runtime::Runtime,
    task: Option<tokio::task::JoinHandle<()>>,
    /// `Auto` granularity: batching now (see [`AUTO_BATCH_ON`]).
    batching: bool,
}

/// A prefix every subject may start with: non-empty dot-separated tokens of
/// printable ASCII, no wildcards (the router adds only sanitized tokens).
pub fn valid_prefix(p: &str) -> bool {
    !p.is_empty()
        && p.split('.').all(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic() && b != b'*' && b != b'>'))
}

/// CLOCK_REALTIME in ns.
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// JetStream's only header: the id it deduplicates re-sent publications by.
fn message_id(p: &Publication) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(async_nats::header::NATS_MESSAGE_ID, format!("{}:{}:{}", p.seq, p.count, p.subject).as_str());
    h
}

/// The servers of `url` (defined with the rest of the connection's
/// settings, [`crate::security::servers`]).
pub use crate::security::servers;

async fn connect(
    url: &str,
    security: &crate::security::Security,
    shared: Arc<Shared>,
    last: crate::security::LastError,
) -> Result<async_nats::Client, BridgeError> {
    let o = async_nats::ConnectOptions::new()
        // The router makes every subject from a checked prefix and sanitized
        // tokens (`Bridge::start`, `route::token`): the client's own check of
        // each publication's subject is work done twice.
        .skip_subject_validation(true)
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(|n| Duration::from_millis((20 * n as u64).min(500)))
        .event_callback(move |e| {
            let s = shared.clone();
            last.note(&e);
            async move {
                if matches!(e, async_nats::Event::Disconnected) {
                    s.disconnects.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    security
        .apply(o)
        .await?
        .connect(servers(url)?)
        .await
        .map_err(|e| BridgeError::Connect(format!("connecting to {url}: {e}")))
}

/// Batches taken from the queue at once: everything waiting is handed to the
/// client before this task yields, so its connection writes it in one go.
const TAKE_MAX: usize = 64;

async fn publish_core(client: async_nats::Client, mut rx: mpsc::Receiver<Batch>, s: Arc<Shared>) {
    let mut batches = Vec::with_capacity(TAKE_MAX);
    while rx.recv_many(&mut batches, TAKE_MAX).await > 0 {
        for batch in batches.drain(..) {
            s.pending.fetch_sub(batch.len(), Ordering::Relaxed);
            for p in batch {
                match client.publish(p.subject, p.payload).await {
                    Ok(()) => s.published.fetch_add(1, Ordering::Relaxed),
                    Err(_) => s.publish_errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }
    }
    let _ = client.flush().await;
}

type Ack = std::pin::Pin<Box<dyn std::future::Future<Output = (Item, u32, Result<bool, BridgeError>)> + Send>>;

/// Sends one publication to JetStream — in the caller's order: the send is
/// awaited here, one after another — and returns the wait for its
/// acknowledgement, which may overlap the others'.
async fn send_js(js: &jetstream::Context, item: Item, attempt: u32) -> Ack {
    let h = message_id(&item);
    match js.publish_with_headers(item.subject.clone(), h, item.payload.clone()).await {
        Ok(ack) => Box::pin(async move {
            let r = match ack.await {
                Ok(a) => Ok(a.duplicate),
                Err(e) => Err(BridgeError::Nats(e.to_string())),
            };
            (item, attempt, r)
        }),
        Err(e) => Box::pin(std::future::ready((item, attempt, Err(BridgeError::Nats(e.to_string()))))),
    }
}

/// When a failed publication is sent again.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// JetStream publishing: sends go out in queue order (so the stream stores
/// each subject's publications in publication order), up to `in_flight_max`
/// acknowledgements are awaited at once, and a publication whose
/// acknowledgement failed is sent again after [`RETRY_AFTER`] (same
/// `Nats-Msg-Id`: stored at most once), before anything newer. Only such a
/// retry can land behind a later publication of its subject (counted in
/// `retries`; a subscriber counts it as reordered).
async fn publish_js(js: jetstream::Context, mut rx: mpsc::Receiver<Batch>, s: Arc<Shared>, in_flight_max: usize) {
    let mut pending: FuturesUnordered<Ack> = FuturesUnordered::new();
    // Taken from the queue, not yet sent (in queue order).
    let mut taken: std::collections::VecDeque<Item> = std::collections::VecDeque::new();
    let mut retry: std::collections::VecDeque<(tokio::time::Instant, Item, u32)> = std::collections::VecDeque::new();
    let mut open = true;
    while open || !pending.is_empty() || !retry.is_empty() || !taken.is_empty() {
        let room = pending.len() < in_flight_max;
        let due = retry.front().map(|r| r.0);
        tokio::select! {
            biased;
            () = async { tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)).await }, if room && due.is_some() => {
                if let Some((_, item, attempt)) = retry.pop_front() {
                    let ack = send_js(&js, item, attempt).await;
                    pending.push(ack);
                }
            }
            Some((item, attempt, r)) = pending.next(), if !pending.is_empty() => match r {
                Ok(dup) => {
                    s.acked.fetch_add(1, Ordering::Relaxed);
                    if dup {
                        s.acked_duplicate.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(_) if attempt < RETRIES_MAX => {
                    s.publish_errors.fetch_add(1, Ordering::Relaxed);
                    s.retries.fetch_add(1, Ordering::Relaxed);
                    retry.push_back((tokio::time::Instant::now() + RETRY_AFTER, item, attempt + 1));
                }
                Err(_) => {
                    s.publish_errors.fetch_add(1, Ordering::Relaxed);
                    s.given_up.fetch_add(1, Ordering::Relaxed);
                }
            },
            () = std::future::ready(()), if room && retry.is_empty() && !taken.is_empty() => {
                if let Some(item) = taken.pop_front() {
                    let ack = send_js(&js, item, 0).await;
                    pending.push(ack);
                    s.published.fetch_add(1, Ordering::Relaxed);
                }
            }
            batch = rx.recv(), if open && room && retry.is_empty() && taken.is_empty() => match batch {
                Some(batch) => {
                    s.pending.fetch_sub(batch.len(), Ordering::Relaxed);
                    taken.extend(batch);
                }
                None => open = false,
            },
        }
    }
}

impl Bridge {
    /// Connects (retrying until the broker answers), creates the JetStream
    /// stream if asked, and starts the publisher.
    pub fn start(route: RouteConfig, cfg: PublishConfig) -> Result<Bridge, BridgeError> {
        assert!(cfg.buffer > 0 && cfg.in_flight_max > 0, "queue and in-flight limits must be positive");
        assert!((1..=5).contains(&cfg.replicas), "JetStream keeps 1 to 5 replicas");
        if !valid_prefix(&route.prefix) {
            return Err(BridgeError::Config(format!(
                "subject prefix {:?}: dot-separated tokens of printable ASCII without '*', '>' or spaces",
                route.prefix
            )));
        }
        let rt = crate::cpu::named_runtime(1, crate::cpu::PUBLISHER_THREAD)?;
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel::<Batch>(cfg.buffer);
        let prefix = route.prefix.clone();
        let task = rt.block_on(async {
            // Connecting retries in the background; a flush is a round trip, so
            // publishing starts on a live connection rather than into a backlog.
            let last = crate::security::LastError::default();
            let attempt = tokio::time::timeout(Duration::from_secs(10), async {
                let c = connect(&cfg.url, &cfg.security, shared.clone(), last.clone()).await?;
                c.flush().await.map_err(|e| BridgeError::Connect(format!("first round trip to {}: {e}", cfg.url)))?;
                Ok::<_, BridgeError>(c)
            })
            .await;
            let client = match attempt {
                Ok(c) => c?,
                Err(_) => {
                    let why = crate::security::diagnose(&cfg.url, &cfg.security).await;
                    let why = why.map_or_else(|| last.suffix(), |w| format!(" (last error: {w})"));
                    return Err(BridgeError::Connect(format!("no NATS connection to {} within 10 s{why}", cfg.url)));
                }
            };
            let s = shared.clone();
            Ok::<_, BridgeError>(match &cfg.jetstream {
                None => tokio::spawn(publish_core(client, rx, s)),
                Some(name) => {
                    let js = jetstream::new(client);
                    js.get_or_create_stream(jetstream::stream::Config {
                        name: name.clone(),
                        subjects: vec![format!("{prefix}.>")],
                        storage: jetstream::stream::StorageType::File,
                        duplicate_window: Duration::from_secs(120),
                        num_replicas: cfg.replicas,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| BridgeError::Connect(format!("creating JetStream stream {name}: {e}")))?;
                    tokio::spawn(publish_js(js, rx, s, cfg.in_flight_max))
                }
            })
        })?;
        Ok(Bridge { router: Router::new(route), tx: Some(tx), cfg, shared, rt, task: Some(task), batching: false })
    }

    /// Routes one MoldUDP64 packet that arrived at `ingress_ns` and queues its
    /// publications, together. The queue holds at most `buffer` publications:
    /// with [`Overflow::Drop`] a packet whose publications do not fit is
    /// dropped whole and counted; with [`Overflow::Block`] the caller waits.
    pub fn handle_packet(&mut self, packet: &[u8], ingress_ns: u64) {
        let Some(tx) = &self.tx else { return };
        let s = &self.shared;
        if self.router.config().granularity == crate::route::Granularity::Auto {
            let depth = s.pending.load(Ordering::Relaxed);
            let on = if self.batching { depth > AUTO_BATCH_OFF } else { depth >= AUTO_BATCH_ON.min(self.cfg.buffer) };
            self.batching = on;
            self.router.set_batching(on);
        }
        let mut batch: Batch = Vec::with_capacity(BATCH_CAPACITY);
        self.router.route(packet, ingress_ns, |p| batch.push(p));
        let n = batch.len();
        if n == 0 {
            return;
        }
        let limit = self.cfg.buffer.max(n);
        let ok = match self.cfg.overflow {
            Overflow::Drop => {
                let before = s.pending.fetch_add(n, Ordering::Relaxed);
                let ok = before + n <= limit && tx.try_send(batch).is_ok();
                if !ok {
                    s.pending.fetch_sub(n, Ordering::Relaxed);
                }
                ok
            }
            Overflow::Block => {
                while s.pending.load(Ordering::Relaxed) + n > limit && !tx.is_closed() {
                    std::thread::sleep(Duration::from_micros(50));
                }
                s.pending.fetch_add(n, Ordering::Relaxed);
                let ok = tx.blocking_send(batch).is_ok();
                if !ok {
                    s.pending.fetch_sub(n, Ordering::Relaxed);
                }
                ok
            }
        };
        s.queue_max_seen.fetch_max(s.pending.load(Ordering::Relaxed), Ordering::Relaxed);
        if ok {
            s.queued.fetch_add(n as u64, Ordering::Relaxed);
        } else {
            s.dropped_overflow.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The counters so far.
    pub fn report(&self) -> BridgeReport {
        let s = &self.shared;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BridgeReport {
            route: self.router.stats.clone(),
            queued: l(&s.queued),
            published: l(&s.published),
            dropped_overflow: l(&s.dropped_overflow),
            publish_errors: l(&s.publish_errors),
            retries: l(&s.retries),
            acked: l(&s.acked),
            acked_duplicate: l(&s.acked_duplicate),
            given_up: l(&s.given_up),
            disconnects: l(&s.disconnects),
            queue_max_seen: s.queue_max_seen.load(Ordering::Relaxed),
            publisher_cpu: None,
        }
    }

    /// Publishes what is queued (waiting at most `limit`), then stops.
    pub fn finish(mut self, limit: Duration) -> BridgeReport {
        self.tx = None;
        if let Some(t) = self.task.take() {
            let _ = self.rt.block_on(async { tokio::time::timeout(limit, t).await });
        }
        // Read while the runtime's threads still live (they go with `self`).
        // Another bridge in the same process would be counted too.
        BridgeReport { publisher_cpu: crate::cpu::threads_cpu(crate::cpu::PUBLISHER_THREAD), ..self.report() }
    }
}
