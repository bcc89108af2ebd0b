//! A small HTTP/1.1 endpoint for operators (`/metrics`), built on hyper, on a
//! thread of its own with a single-threaded tokio runtime, so it never
//! touches the data path's threads. It assumes hostile clients: at most
//! [`Limits::connections`] connections at once and
//! [`Limits::per_address`] from one address (more are closed at once,
//! counted), a deadline for the request head and for the whole connection,
//! no keep-alive, and GET only. Answers are computed by the caller's
//! handler, which must be quick (it runs on the endpoint's thread).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

/// What one endpoint lets clients hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once, from everyone.
    pub connections: usize,
    /// Connections open at once from one IP address.
    pub per_address: usize,
    /// Time to send the request head.
    pub head_timeout: Duration,
    /// Time a connection may last in all.
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 64,
            per_address: 8,
            head_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(10),
        }
    }
}

/// What the endpoint did.
#[derive(Debug, Default)]
pub struct EndpointStats {
    pub requests: AtomicU64,
    /// Connections closed at accept: over the total or the per-address limit.
    pub refused: AtomicU64,
    /// Connections that ran out of time (slow or silent clients).
    pub timed_out: AtomicU64,
    /// `accept` failures (out of file descriptors, say): each waits
    /// [`ACCEPT_RETRY`] before the next try.
    pub accept_errors: AtomicU64,
}

/// How long the endpoint waits after a failed `accept` before it tries
/// again: a listener whose pending connection cannot be taken (no file
/// descriptor left) is ready at once, and retrying at once would spin.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// How often an idle endpoint looks whether it was dropped.
const STOP_CHECK: Duration = Duration::from_millis(250);

/// An answer: status, content type, body.
pub type Answer = (u16, &'static str, String);

/// Computes the answer to `GET path`; `None`: 404.
pub type Handler = Arc<dyn Fn(&str) -> Option<Answer> + Send + Sync>;

/// A running endpoint; dropping it stops it.
pub struct Endpoint {
    pub addr: SocketAddr,
    pub stats: Arc<EndpointStats>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop with a connection of our own.
        let _ = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Binds `addr` (now, so a bad address fails before anything else starts)
/// and serves `handler` on a thread of its own.
pub fn serve(addr: SocketAddr, limits: Limits, handler: Handler) -> std::io::Result<Endpoint> {
    assert!(limits.connections > 0 && limits.per_address > 0, "endpoint limits must be positive");
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    let stats = Arc::new(EndpointStats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (st, sp) = (stats.clone(), stop.clone());
    let thread = std::thread::Builder::new().name("metrics-http".into()).spawn(move || {
        rt.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else { return };
            accept_loop(listener, limits, handler, st, sp).await;
        });
    })?;
    Ok(Endpoint { addr, stats, stop, thread: Some(thread) })
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    limits: Limits,
    handler: Handler,
    stats: Arc<EndpointStats>,
    stop: Arc<AtomicBool>,
) {
    let open: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    loop {
        // Dropping the endpoint wakes this with a connection of its own; the
        // timeout is for when that cannot be made (no descriptor left).
        let accepted = tokio::time::timeout(STOP_CHECK, listener.accept()).await;
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(accepted) = accepted else { continue };
        let Ok((stream, peer)) = accepted else {
            stats.accept_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(ACCEPT_RETRY).await;
            continue;
        };
        {
            let mut m = open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let total: usize = m.values().sum();
            let mine = m.get(&peer.ip()).copied().unwrap_or(0);
            if total >= limits.connections || mine >= limits.per_address {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                continue; // dropping the stream closes it
            }
            *m.entry(peer.ip()).or_default() += 1;
        }
        let (handler, stats, open) = (handler.clone(), stats.clone(), open.clone());
        tokio::task::spawn(async move {
            let svc = service_fn(|req: Request<Incoming>| {
                let handler = handler.clone();
                stats.requests.fetch_add(1, Ordering::Relaxed);
                async move { Ok::<_, Infallible>(answer(&req, &handler)) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.head_timeout)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), svc);
            match tokio::time::timeout(limits.connection_timeout, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_timeout() => {
                    stats.timed_out.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(_)) => {}
                Err(_) => {
                    stats.timed_out.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut m = open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = m.get_mut(&peer.ip()) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&peer.ip());
                }
            }
        });
    }
}

fn answer(req: &Request<Incoming>, handler: &Handler) -> Response<Full<Bytes>> {
    let (status, ctype, body) = if req.method() != Method::GET && req.method() != Method::HEAD {
        (405, "text/plain; charset=utf-8", "GET only\n".to_string())
    } else {
        handler(req.uri().path()).unwrap_or((404, "text/plain; charset=utf-8", "not found; try /metrics\n".into()))
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn answers_gets_and_bounds_what_clients_hold() {
        let handler: Handler =
            Arc::new(|p| (p == "/metrics").then(|| (200, "text/plain", "fairfeed_up 1\n".to_string())));
        let limits =
            Limits { connections: 4, per_address: 2, head_timeout: Duration::from_millis(300), ..Limits::default() };
        let ep = serve("127.0.0.1:0".parse().unwrap(), limits, handler).unwrap();
        let ok = get(ep.addr, "/metrics");
        assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("fairfeed_up 1\n"), "{ok}");
        assert!(get(ep.addr, "/nope").starts_with("HTTP/1.1 404"));
        // Two silent connections from one address hold its share; a third is closed at once.
        let _a = std::net::TcpStream::connect(ep.addr).unwrap();
        let _b = std::net::TcpStream::connect(ep.addr).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let mut c = std::net::TcpStream::connect(ep.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "closed without an answer");
        assert!(ep.stats.refused.load(Ordering::Relaxed) >= 1);
        // The silent ones time out, and the address may connect again.
        std::thread::sleep(Duration::from_millis(800));
        assert!(ep.stats.timed_out.load(Ordering::Relaxed) >= 2, "{:?}", ep.stats);
        assert!(get(ep.addr, "/metrics").starts_with("HTTP/1.1 200"));
    }
}
