//! Prometheus metrics from the counters every fairfeed command already
//! keeps. A command describes its state as JSON (the same object `fairfeed
//! stat` and `--stats-out` show); [`Exposition::json`] turns it into metric
//! families by a fixed naming rule, and [`Exposition::histogram`] adds HDR
//! histograms as Prometheus histograms. The text exposition format itself
//! is written by the `prometheus` crate's `TextEncoder`.
//!
//! Naming: `fairfeed_` + the JSON path joined by `_` (characters outside
//! `[a-zA-Z0-9_]` become `_`); values in nanoseconds (`…_ns`) or
//! microseconds (`…_us`) are converted to seconds (`…_seconds`). A value is
//! a gauge when its name is a level rather than a count ([`GAUGE_LEAVES`]:
//! OWD_G, margins, clock bounds and offsets, buffer depths, …; or a summary
//! statistic such as `p99_us`, [`SUMMARY_WORDS`]) and a counter (`…_total`)
//! otherwise. Booleans are 0/1 gauges; strings and
//! arrays are left out.

use std::collections::BTreeMap;

use prometheus::proto::{Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType};

/// Leaf names (the last path segment) whose values are levels (gauges),
/// not counts: what the tree's, the arbitrator's, the exchange's and the
/// bridge's statistics call a current value.
pub const GAUGE_LEAVES: &[&str] = &[
    "owd_g_ns",
    "margin_ns",
    "clock_bound_ns",
    "clock_unsynced",
    "children_silent",
    "estimate_ns",
    "samples",
    "offset_ns",
    "drift_ppm",
    "bound_ns",
    "hard_bound_ns",
    "residual_rms_ns",
    "peers",
    "peers_used",
    "synced",
    "over_limit",
    "last_update_ns",
    "asymmetric_edges",
    "contested",
    "offset_now_ns",
    "bound_now_ns",
    "injected_offset_ns",
    "true_ns",
    "uptime_s",
    "feed_total",
    "buffer_bytes",
    "buffer_messages",
    "buffer_packets",
    "buffer_packets_max_seen",
    "holes_open",
    "saturation",
    "message_rate_per_s",
    "count_window_fill_ns",
    "max_hold_ns",
    "max_count_msgs",
    "connections",
    "sessions_online",
    "in_flight",
    "subjects",
    "engines",
    "orders_live",
    "live_orders",
    "levels",
    "journal_bytes",
    "achieved_rate",
    "elapsed_s",
    "count",
    "open",
    "open_orders",
    "next_sequence",
    "joined_at_sequence",
    // The tree controller's (fairfeed controller --metrics).
    "members",
    "waiting",
    "overloaded",
    "version",
    "leading",
];

/// Words that make any leaf a level: summary statistics of a distribution.
pub const SUMMARY_WORDS: &[&str] = &["p50", "p90", "p95", "p99", "p999", "max", "min", "mean", "avg", "stddev"];

/// Families are capped so a hostile or runaway JSON cannot grow a scrape without bound.
pub const FAMILIES_MAX: usize = 4_096;

/// Histogram bucket bounds for latencies, seconds: 1 µs to 10 s, 1-2-5 steps.
pub const LATENCY_BUCKETS_S: &[f64] = &[
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0,
    5.0, 10.0,
];

/// One scrape's metric families, by name.
#[derive(Default)]
pub struct Exposition {
    families: BTreeMap<String, MetricFamily>,
}

fn sanitize(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

fn labels(l: &[(&str, &str)]) -> Vec<LabelPair> {
    l.iter()
        .map(|(k, v)| LabelPair { name: Some(sanitize(k)), value: Some((*v).to_string()), ..Default::default() })
        .collect()
}

/// Is the value at `path` a level (gauge)?
pub fn is_gauge(path: &[&str]) -> bool {
    let Some(leaf) = path.last() else { return false };
    GAUGE_LEAVES.contains(leaf) || leaf.split('_').any(|w| SUMMARY_WORDS.contains(&w))
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, name: &str, help: &str, t: MetricType, m: Metric) {
        if !self.families.contains_key(name) && self.families.len() >= FAMILIES_MAX {
            return;
        }
        let f = self.families.entry(name.to_string()).or_insert_with(|| {
            let mut f =
                MetricFamily { name: Some(name.to_string()), help: Some(help.to_string()), ..Default::default() };
            f.set_field_type(t);
            f
        });
        // One family, one type: a clash (same name as another type) keeps the first.
        if f.type_.map(|t2| t2.enum_value_or_default()) == Some(t) {
            f.metric.push(m);
        }
    }

    /// A counter (`name` should end in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, l: &[(&str, &str)], v: f64) {
        let m = Metric {
            label: labels(l),
            counter: Counter { value: Some(v), ..Default::default() }.into(),
            ..Default::default()
        };
        self.push(name, help, MetricType::COUNTER, m);
    }

    /// A gauge.
    pub fn gauge(&mut self, name: &str, help: &str, l: &[(&str, &str)], v: f64) {
        let m = Metric {
            label: labels(l),
            gauge: Gauge { value: Some(v), ..Default::default() }.into(),
            ..Default::default()
        };
        self.push(name, help, MetricType::GAUGE, m);
    }

    /// An HDR histogram of values in `unit_s` seconds each (1e-9 for
    /// nanoseconds) as a Prometheus histogram over `bounds` (seconds).
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        l: &[(&str, &str)],
        h: &hdrhistogram::Histogram<u64>,
        unit_s: f64,
        bounds: &[f64],
    ) {
        let bucket = bounds
            .iter()
            .map(|&b| {
                // Values at or below the bound: HDR counts up to the highest equivalent value.
                let limit = (b / unit_s).floor() as u64;
                let n = if limit >= h.max() { h.len() } else { h.count_between(0, limit) };
                Bucket { cumulative_count: Some(n), upper_bound: Some(b), ..Default::default() }
            })
            .collect();
        let sum = h.mean() * h.len() as f64 * unit_s;
        let hist = Histogram { sample_count: Some(h.len()), sample_sum: Some(sum), bucket, ..Default::default() };
        let m = Metric { label: labels(l), histogram: hist.into(), ..Default::default() };
        self.push(name, help, MetricType::HISTOGRAM, m);
    }

    /// Every number (and boolean) in `v`, named `prefix` + its path, as
    /// gauges or counters by the module's rule; `help` says where it comes from.
    pub fn json(&mut self, prefix: &str, v: &serde_json::Value, l: &[(&str, &str)], help: &str) {
        let mut path = Vec::new();
        self.walk(prefix, v, l, help, &mut path);
    }

    fn walk<'a>(
        &mut self,
        prefix: &str,
        v: &'a serde_json::Value,
        l: &[(&str, &str)],
        help: &str,
        path: &mut Vec<&'a str>,
    ) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, x) in map {
                    path.push(k);
                    self.walk(prefix, x, l, help, path);
                    path.pop();
                }
            }
            serde_json::Value::Number(n) => {
                let Some(x) = n.as_f64() else { return };
                self.value(prefix, path, x, l, help);
            }
            serde_json::Value::Bool(b) => {
                let name = sanitize(&format!("{prefix}_{}", path.join("_")));
                self.gauge(&name, help, l, f64::from(u8::from(*b)));
            }
            _ => {}
        }
    }

    fn value(&mut self, prefix: &str, path: &[&str], x: f64, l: &[(&str, &str)], help: &str) {
        let mut joined = path.join("_");
        let mut x = x;
        for (suffix, scale) in [("_ns", 1e-9), ("_us", 1e-6), ("_ms", 1e-3), ("_s", 1.0)] {
            if let Some(stem) = joined.strip_suffix(suffix) {
                joined = format!("{stem}_seconds");
                x *= scale;
                break;
            }
        }
        let base = sanitize(&format!("{prefix}_{joined}"));
        if is_gauge(path) {
            // `_total` is for counters (a gauge such as `feed_total`, the packets a feed has, says `_all`).
            let name = base.strip_suffix("_total").map_or(base.clone(), |stem| format!("{stem}_all"));
            self.gauge(&name, help, l, x);
        } else {
            self.counter(&format!("{base}_total"), help, l, x);
        }
    }

    /// The text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let families: Vec<MetricFamily> = self.families.values().cloned().collect();
        let mut out = String::new();
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
            // Only a malformed family can fail; say so in the scrape rather than serve half of it.
            return format!("# fairfeed: could not encode the metrics: {e}\n");
        }
        out
    }
}

/// The content type of [`Exposition::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_becomes_counters_gauges_and_seconds() {
        let v = serde_json::json!({
            "counters": {"packets_in": 10, "send_failed": 0},
            "node": {"owd_g_ns": 250_000, "late": 3, "auth": {"bad_tag": 1}, "clock": {"synced": true}},
            "role": "receiver",
        });
        let mut e = Exposition::new();
        e.json("fairfeed", &v, &[("node", "3"), ("role", "receiver")], "from the node's stats");
        let text = e.render();
        assert!(text.contains("# TYPE fairfeed_counters_packets_in_total counter"), "{text}");
        assert!(text.contains("fairfeed_counters_packets_in_total{node=\"3\",role=\"receiver\"} 10"), "{text}");
        assert!(text.contains("# TYPE fairfeed_node_owd_g_seconds gauge"), "{text}");
        assert!(text.contains("fairfeed_node_owd_g_seconds{node=\"3\",role=\"receiver\"} 0.00025"), "{text}");
        assert!(text.contains("fairfeed_node_auth_bad_tag_total"), "{text}");
        assert!(text.contains("fairfeed_node_clock_synced{node=\"3\",role=\"receiver\"} 1"), "{text}");
        assert!(!text.contains("role_"), "strings are not metrics: {text}");
        let mut e = Exposition::new();
        e.json("fairfeed", &serde_json::json!({"feed_total": 3}), &[], "h");
        assert!(e.render().contains("fairfeed_feed_all 3"), "a gauge never ends in _total");
    }

    #[test]
    fn histograms_are_cumulative_in_seconds() {
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for ns in [500, 1_500, 1_500, 40_000, 3_000_000] {
            h.record(ns).unwrap();
        }
        let mut e = Exposition::new();
        e.histogram("fairfeed_owd_seconds", "one-way delay", &[], &h, 1e-9, LATENCY_BUCKETS_S);
        let text = e.render();
        assert!(text.contains("fairfeed_owd_seconds_bucket{le=\"0.000001\"} 1"), "{text}");
        assert!(text.contains("fairfeed_owd_seconds_bucket{le=\"0.000002\"} 3"), "{text}");
        assert!(text.contains("fairfeed_owd_seconds_bucket{le=\"0.00005\"} 4"), "{text}");
        assert!(text.contains("fairfeed_owd_seconds_bucket{le=\"+Inf\"} 5"), "{text}");
        assert!(text.contains("fairfeed_owd_seconds_count 5"), "{text}");
    }

    #[test]
    fn families_are_capped() {
        let mut e = Exposition::new();
        for i in 0..FAMILIES_MAX + 10 {
            e.counter(&format!("fairfeed_x{i}_total"), "h", &[], 1.0);
        }
        assert_eq!(e.families.len(), FAMILIES_MAX);
    }
}
