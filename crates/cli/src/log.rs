//! Logs: `tracing` events on stderr, as text (default) or one JSON object
//! per line (`--log-format json`, or `FAIRFEED_LOG_FORMAT=json`), filtered
//! by `FAIRFEED_LOG` (`tracing-subscriber`'s `EnvFilter` syntax, e.g.
//! `warn` or `fairfeed_net=debug`; default: fairfeed's events from `info`,
//! other crates' from `warn`). Long-running commands
//! log what they start, serve, change and report at exit through here, so a
//! deployment can ship stderr to a log pipeline as is. Bounded commands'
//! results (tables, reports, progress bars) stay plain output.

use std::sync::OnceLock;

/// How log events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event (time, level, message, fields).
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields.message`, other fields, `target`).
    Json,
}

static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Without `FAIRFEED_LOG`: fairfeed's own events from `info`, the libraries'
/// under it from `warn`, and none of the NATS client's (it logs every
/// reconnection attempt, at `error` when the server refuses the login; the
/// bridge and `subscribe` report the reason themselves, once).
/// A target matches by prefix, so `fairfeed` covers every `fairfeed_*` crate.
const DEFAULT_FILTER: &str = "warn,fairfeed=info,async_nats=off";

/// Installs the subscriber for this process; call once, before any event.
/// A `FAIRFEED_LOG` that is not a filter is an error (naming it).
pub fn init(format: LogFormat) -> anyhow::Result<()> {
    let _ = FORMAT.set(format);
    let filter = match std::env::var("FAIRFEED_LOG") {
        Ok(v) => tracing_subscriber::EnvFilter::try_new(&v).map_err(|e| {
            anyhow::anyhow!("FAIRFEED_LOG=`{v}` is not a log filter ({e}); e.g. `warn` or `fairfeed=debug`")
        })?,
        Err(_) => tracing_subscriber::EnvFilter::new(DEFAULT_FILTER),
    };
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => b.with_target(false).with_ansi(false).try_init(),
        LogFormat::Json => b.json().with_current_span(false).try_init(),
    };
    Ok(())
}

/// Whether events go out as JSON.
pub fn json() -> bool {
    FORMAT.get() == Some(&LogFormat::Json)
}

/// A command's final report (its counters at exit, also after SIGTERM):
/// pretty JSON on stderr in text mode (as `stat` shows it), one event with
/// the report as a compact JSON string in its `report` field in JSON mode.
pub fn final_report(what: &str, v: &impl serde::Serialize) {
    if json() {
        let text = serde_json::to_string(v).unwrap_or_default();
        tracing::info!(command = what, report = %text, "final report");
    } else {
        eprintln!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }
}
