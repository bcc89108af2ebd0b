//! Operating fairfeed: every long-running command's counters as Prometheus
//! metrics (`--metrics ADDR`, `GET /metrics`), served by a bounded HTTP
//! endpoint on a thread of its own.

pub mod controlled;
pub mod dashboard;
pub mod deploy;
pub mod http;
pub mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;

pub use http::{Endpoint, Limits};
pub use metrics::Exposition;

/// Serves `GET /metrics` at `addr`: each scrape calls `scrape` for the
/// current metrics (keep it quick: it runs on the endpoint's thread). The
/// endpoint's own counters are added as `fairfeed_metrics_http_*`.
pub fn serve_metrics(
    addr: SocketAddr,
    scrape: impl Fn(&mut Exposition) + Send + Sync + 'static,
) -> std::io::Result<Endpoint> {
    let stats: Arc<std::sync::OnceLock<Arc<http::EndpointStats>>> = Arc::default();
    let st = stats.clone();
    let handler: http::Handler = Arc::new(move |path| {
        if path != "/metrics" {
            return None;
        }
        let mut e = Exposition::new();
        scrape(&mut e);
        if let Some(s) = st.get() {
            use std::sync::atomic::Ordering::Relaxed;
            let help = "the metrics endpoint itself";
            e.counter("fairfeed_metrics_http_requests_total", help, &[], s.requests.load(Relaxed) as f64);
            e.counter("fairfeed_metrics_http_refused_total", help, &[], s.refused.load(Relaxed) as f64);
            e.counter("fairfeed_metrics_http_timed_out_total", help, &[], s.timed_out.load(Relaxed) as f64);
            e.counter("fairfeed_metrics_http_accept_errors_total", help, &[], s.accept_errors.load(Relaxed) as f64);
        }
        Some((200, metrics::CONTENT_TYPE, e.render()))
    });
    let ep = http::serve(addr, Limits::default(), handler)?;
    let _ = stats.set(ep.stats.clone());
    Ok(ep)
}
