//! A subscriber: counts what arrives on a subject (NATS wildcards allowed),
//! times each publication from the ingress time in the bridge's tag (the
//! payload's trailer, [`crate::tag`]), and detects gaps, duplicates and
//! reordering from its publication number and its number on its subject —
//! the broker's gaps — and, apart from them, the feed's own: the bridge's gap markers
//! (`<prefix>.<session>.control.gap`, see `route`), which it also listens
//! for when its subject does not cover them.

use crate::BridgeError;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::publish::wall_ns;

/// Publication numbers remembered for duplicate detection at most.
pub const SEEN_MAX: usize = 50_000_000;

/// Latency summary, ms.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LatencyMs {
    pub mean_ms: f64,
    pub min_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// What one subscriber saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SubscribeReport {
    pub publications: u64,
    pub messages: u64,
    pub distinct: u64,
    pub duplicates: u64,
    /// Publications missing inside the ranges seen, summed over subjects.
    pub missing: u64,
    /// Publications that arrived after a later one on their subject.
    pub reordered: u64,
    pub no_tag: u64,
    /// Gaps in the feed itself, before the bridge (gap markers received).
    pub feed_gaps: u64,
    /// Messages those gaps skipped.
    pub feed_gap_messages: u64,
    /// Errors a JetStream consumer reported and read past (it recreates
    /// itself where it can, e.g. after its stream's leader moved).
    pub consumer_errors: u64,
    /// The last of those errors, as the client worded it.
    pub last_consumer_error: Option<String>,
    pub latency: LatencyMs,
}

/// Running counts of one subscriber.
pub struct Tally {
    hist: Histogram<u64>,
    /// Publication numbers seen, one bit each (they count from 1, consecutively).
    seen: Vec<u64>,
    subjects: HashMap<String, (u64, u64)>,
    pub report: SubscribeReport,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            hist: Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid bounds"),
            seen: Vec::new(),
            subjects: HashMap::new(),
            report: SubscribeReport::default(),
        }
    }
}

/// Whether `subject` is a bridge's gap marker.
pub fn is_gap_marker(subject: &str) -> bool {
    subject.ends_with(".control.gap")
}

/// The gap markers' subject pattern under the bridge's `prefix`.
pub fn gap_subject(prefix: &str) -> String {
    format!("{prefix}.*.control.gap")
}

/// Whether two subject patterns (NATS wildcards: `*` one token, `>` the
/// rest) can match one subject.
pub fn overlap(a: &str, b: &str) -> bool {
    let (mut x, mut y) = (a.split('.'), b.split('.'));
    loop {
        match (x.next(), y.next()) {
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(p), Some(q)) if p == q || p == "*" || q == "*" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

impl Tally {
    /// Counts one publication received at `now_ns`; returns its latency in µs if tagged.
    pub fn record(&mut self, m: &async_nats::Message, now_ns: u64) -> Option<u64> {
        let r = &mut self.report;
        r.publications += 1;
        let Some((body, tag)) = crate::tag::split(&m.payload) else {
            r.messages += 1;
            r.no_tag += 1;
            r.distinct += 1;
            return None;
        };
        r.messages += u64::from(tag.count);
        let lat = now_ns.saturating_sub(tag.ingress_ns) / 1_000;
        let _ = self.hist.record(lat.clamp(1, 600_000_000));
        let lat = Some(lat);
        if tag.pub_seq < SEEN_MAX as u64 {
            let p = tag.pub_seq;
            let (word, bit) = ((p / 64) as usize, 1u64 << (p % 64));
            if word >= self.seen.len() {
                self.seen.resize((word + 1).next_power_of_two(), 0);
            }
            if self.seen[word] & bit != 0 {
                r.duplicates += 1;
                return lat;
            }
            self.seen[word] |= bit;
        }
        r.distinct += 1;
        if is_gap_marker(&m.subject) {
            r.feed_gaps += 1;
            r.feed_gap_messages += body.get(8..16).map_or(0, |b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])));
        }
        if let Some(s) = Some(tag.subject_seq).filter(|&s| s > 0) {
            // Looked up by &str: a String only for a subject's first publication.
            let e = match self.subjects.get_mut(m.subject.as_str()) {
                Some(e) => e,
                None => self.subjects.entry(m.subject.to_string()).or_insert((0, 0)),
            };
            if s < e.0 {
                r.reordered += 1;
            }
            e.0 = e.0.max(s);
            e.1 += 1;
        }
        lat
    }

    /// The summary, with `missing` from the per-subject ranges.
    pub fn finish(&mut self) -> SubscribeReport {
        let h = &self.hist;
        let ms = |us: u64| us as f64 / 1e3;
        self.report.missing = self.subjects.values().map(|(max, n)| max.saturating_sub(*n)).sum();
        if !h.is_empty() {
            self.report.latency = LatencyMs {
                mean_ms: h.mean() / 1e3,
                min_ms: ms(h.min()),
                p50_ms: ms(h.value_at_quantile(0.5)),
                p90_ms: ms(h.value_at_quantile(0.9)),
                p99_ms: ms(h.value_at_quantile(0.99)),
                max_ms: ms(h.max()),
            };
        }
        self.report.clone()
    }
}

/// When a subscription stops.
#[derive(Debug, Clone, Default)]
pub struct StopWhen {
    /// After this many publications.
    pub publications: Option<u64>,
    /// After this long.
    pub after: Option<Duration>,
    /// After nothing arrived for this long (once something has).
    pub idle: Option<Duration>,
    /// Once this is set (a SIGTERM handler); looked at least every 200 ms.
    pub flag: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// What to subscribe to.
#[derive(Debug, Clone)]
pub struct SubscribeConfig {
    pub url: String,
    pub subject: String,
    /// Read this JetStream stream from its start instead of live core NATS.
    pub jetstream: Option<String>,
    pub stop: StopWhen,
    /// Also listen for the bridge's gap markers here (live core NATS, when
    /// `subject` does not cover them), e.g. [`gap_subject`]`("ff.itch")`.
    pub gaps: Option<String>,
    /// Credentials and TLS for the broker connection.
    pub security: crate::security::Security,
}

fn done(t: &Tally, stop: &StopWhen, started: Instant) -> bool {
    stop.publications.is_some_and(|n| t.report.publications >= n)
        || stop.after.is_some_and(|d| started.elapsed() >= d)
        || stop.flag.as_ref().is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed))
}

/// Errors a JetStream consumer reported, and the last of them.
#[derive(Default)]
struct ConsumerErrors {
    count: u64,
    /// Errors since the last message.
    run: u32,
    last: Option<String>,
}

/// The next message of an ordered consumer. An error item is not the end: the
/// consumer recreates itself from the last stream sequence it delivered (a
/// leader election, missed heartbeats), so errors are counted and read past,
/// up to a run of [`CONSUMER_ERRORS_MAX`] with no message between them.
async fn next_message<S, E>(msgs: &mut S, errors: &mut ConsumerErrors) -> Option<async_nats::Message>
where
    S: futures::Stream<Item = Result<jetstream::Message, E>> + Unpin,
    E: std::fmt::Display,
{
    loop {
        match msgs.next().await? {
            Ok(m) => {
                errors.run = 0;
                return Some(m.message);
            }
            Err(e) => {
                errors.count += 1;
                errors.run += 1;
                errors.last = Some(e.to_string());
                if errors.run >= CONSUMER_ERRORS_MAX {
                    return None;
                }
            }
        }
    }
}

/// Consecutive JetStream consumer errors read past before a subscription ends.
pub const CONSUMER_ERRORS_MAX: u32 = 20;

/// How long a subscriber waits for its server at most (less with a shorter `stop.after`).
pub const CONNECT_WAIT_MAX: Duration = Duration::from_secs(10);

/// Connects as `cfg` says and waits for the connection (at most
/// [`CONNECT_WAIT_MAX`], less with a shorter `stop.after`): the client
/// retries in the background (the server may start just after us), but a
/// server that never answers must not keep us waiting for ever.
async fn connect(cfg: &SubscribeConfig) -> Result<async_nats::Client, BridgeError> {
    let last = crate::security::LastError::default();
    let l = last.clone();
    let o =
        async_nats::ConnectOptions::new().retry_on_initial_connect().max_reconnects(None).event_callback(move |e| {
            l.note(&e);
            async {}
        });
    let client = cfg
        .security
        .apply(o)
        .await?
        .connect(crate::security::servers(&cfg.url)?)
        .await
        .map_err(|e| BridgeError::Connect(format!("connecting to {}: {e}", cfg.url)))?;
    let limit = cfg.stop.after.unwrap_or(CONNECT_WAIT_MAX).min(CONNECT_WAIT_MAX);
    let connected = async {
        while client.connection_state() != async_nats::connection::State::Connected {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(limit, connected).await.is_err() {
        let why = crate::security::diagnose(&cfg.url, &cfg.security).await;
        return Err(BridgeError::Connect(format!(
            "no NATS connection to {} within {:.1} s{}",
            cfg.url,
            limit.as_secs_f64(),
            why.map_or_else(|| last.suffix(), |w| format!(" (last error: {w})"))
        )));
    }
    Ok(client)
}

/// The subject, and the gap reports' subject where the first does not cover it.
async fn core_subscription(
    client: &async_nats::Client,
    cfg: &SubscribeConfig,
) -> Result<impl futures::Stream<Item = async_nats::Message> + Unpin, BridgeError> {
    let sub = client.subscribe(cfg.subject.clone()).await.map_err(|e| BridgeError::Nats(e.to_string()))?;
    let extra = match cfg.gaps.as_deref().filter(|g| !overlap(&cfg.subject, g)) {
        Some(g) => Some(client.subscribe(g.to_string()).await.map_err(|e| BridgeError::Nats(e.to_string()))?),
        None => None,
    };
    Ok(futures::stream::select(sub, futures::stream::iter(extra).flatten()))
}

/// Subscribes and counts until `cfg.stop`; `each` sees every publication and
/// its latency (µs). Returns the summary and the latency histogram (µs).
pub async fn subscribe(
    cfg: &SubscribeConfig,
    ready: Option<tokio::sync::oneshot::Sender<()>>,
    mut each: impl FnMut(&async_nats::Message, Option<u64>),
) -> Result<(SubscribeReport, Histogram<u64>), BridgeError> {
    let client = connect(cfg).await?;
    let mut t = Tally::default();
    let started = Instant::now();
    let wait = cfg.stop.idle.unwrap_or(Duration::from_millis(200)).min(Duration::from_millis(200));
    let mut last = Instant::now();
    // One timer for the whole subscription, re-armed only when it fires: a
    // timeout per message cost a timer-wheel insert and removal each.
    let tick = tokio::time::sleep(wait);
    tokio::pin!(tick);
    macro_rules! pump {
        ($next:expr) => {
            loop {
                if done(&t, &cfg.stop, started) {
                    break;
                }
                tokio::select! {
                    biased;
                    m = $next => match m {
                        Some(m) => {
                            let lat = t.record(&m, wall_ns());
                            each(&m, lat);
                            last = Instant::now();
                        }
                        None => break,
                    },
                    () = &mut tick => {
                        if cfg.stop.idle.is_some_and(|d| t.report.publications > 0 && last.elapsed() >= d) {
                            break;
                        }
                        tick.as_mut().reset(tokio::time::Instant::now() + wait);
                    }
                }
            }
        };
    }
    match &cfg.jetstream {
        None => {
            let mut sub = core_subscription(&client, cfg).await?;
            client.flush().await.map_err(|e| BridgeError::Nats(e.to_string()))?;
            if let Some(r) = ready {
                let _ = r.send(());
            }
            pump!(sub.next());
        }
        Some(name) => {
            let js = jetstream::new(client.clone());
            let stream = js.get_stream(name).await.map_err(|e| BridgeError::Nats(format!("stream {name}: {e}")))?;
            let consumer = stream
                .create_consumer(jetstream::consumer::pull::OrderedConfig {
                    filter_subject: cfg.subject.clone(),
                    deliver_policy: jetstream::consumer::DeliverPolicy::All,
                    ..Default::default()
                })
                .await
                .map_err(|e| BridgeError::Nats(format!("consumer on {name}: {e}")))?;
            let mut msgs = consumer.messages().await.map_err(|e| BridgeError::Nats(e.to_string()))?;
            if let Some(r) = ready {
                let _ = r.send(());
            }
            let mut errors = ConsumerErrors::default();
            pump!(next_message(&mut msgs, &mut errors));
            (t.report.consumer_errors, t.report.last_consumer_error) = (errors.count, errors.last);
        }
    }
    let r = t.finish();
    Ok((r, t.hist))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_patterns_overlap_as_nats_matches_them() {
        let g = gap_subject("ff.itch");
        for (s, want) in [
            ("ff.itch.>", true),
            ("ff.>", true),
            (">", true),
            ("ff.itch.*.*.*", true),
            ("ff.itch.FAIRFEED01.control.gap", true),
            ("ff.itch.*.control.>", true),
            ("ff.itch.*.*.A", false),
            ("ff.itch.*.AAPL.>", false),
            ("ff.itch.*.control", false),
            ("ff.itch.*.control.gap.x", false),
            ("other.>", false),
        ] {
            assert_eq!(overlap(s, &g), want, "{s}");
            assert_eq!(overlap(&g, s), want, "{s} (symmetric)");
        }
        assert!(is_gap_marker("ff.itch.S.control.gap") && !is_gap_marker("ff.itch.S.control.eos"));
    }
}
