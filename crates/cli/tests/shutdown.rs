//! Goal: every long-running command stops on SIGTERM, exits 0 and still
//! writes its final report, and with `--log-format json` every line it
//! writes to stderr is one JSON object (issue 19, item 5).
//!
//! Method: each command started with `--log-format json` (the receiver with
//! `FAIRFEED_LOG_FORMAT=json` instead), stdout and stderr to files; once it
//! has run a moment the test sends SIGTERM, waits at most 15 s for exit 0,
//! parses every stderr line as JSON, and finds the final report: an event
//! `final report` whose `report` field is the command's counters as JSON
//! (tree nodes, live `arb`, `retransmit-server`, `subscribe`), or the report
//! on stdout (`exchange`, `bridge run`). Commands that need a NATS server run
//! where Debian's `nats-server` is installed.

#![allow(clippy::too_many_lines)] // scenario tests: one story, read top to bottom
mod common;
use common::*;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `args` with JSON logs, stdout and stderr into `dir/NAME.{out,err}`.
fn start(dir: &Path, name: &str, args: &[&str], env_json: bool) -> Child {
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).unwrap();
    let err = std::fs::File::create(dir.join(format!("{name}.err"))).unwrap();
    let mut c = Command::new(bin());
    c.args(args).stdout(Stdio::from(out)).stderr(Stdio::from(err));
    if env_json {
        c.env("FAIRFEED_LOG_FORMAT", "json");
    } else {
        c.args(["--log-format", "json"]);
    }
    c.spawn().unwrap()
}

/// SIGTERM, then at most 15 s for the exit status.
fn terminate(c: &mut Child) -> std::process::ExitStatus {
    let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
    let t0 = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > Duration::from_secs(15) {
            let _ = c.kill();
            panic!("did not stop within 15 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every stderr line of `name` as JSON (panics on one that is not).
fn events(dir: &Path, name: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: a stderr line is not JSON ({e}): {l}")))
        .collect()
}

/// The final report of `name`: from its `final report` event, or its stdout.
fn final_report(dir: &Path, name: &str) -> serde_json::Value {
    let ev = events(dir, name);
    for e in &ev {
        assert!(e["timestamp"].is_string() && e["level"].is_string(), "{name}: {e}");
    }
    if let Some(e) = ev.iter().find(|e| e["fields"]["message"] == "final report") {
        let r = e["fields"]["report"].as_str().unwrap_or_else(|| panic!("{name}: {e}"));
        return serde_json::from_str(r).unwrap_or_else(|err| panic!("{name}: report is not JSON ({err}): {r}"));
    }
    let out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{name}: no final report ({e}); stderr {ev:?}; stdout {out}"))
}

fn free_udp() -> String {
    free_addr(false).to_string()
}

fn free_tcp() -> String {
    free_addr(true).to_string()
}

#[test]
fn long_running_commands_stop_on_sigterm_report_and_log_json() {
    let d = tmp();
    let dir = d.path();
    let port = free_port(false);
    let topo = small_tree(dir, port);
    let key = dir.join("tree.key");
    std::fs::write(&key, "33".repeat(32)).unwrap();
    let (t, k) = (topo.to_str().unwrap(), key.to_str().unwrap());
    let pcap = dir.join("feed.pcap");
    let p = pcap.to_str().unwrap();
    fairfeed(&["gen", "--seed", "5", "--messages", "5000", "--symbols", "10", "--out", p]);
    // An exchange configuration: the example's, on a free port, without ITCH lines.
    let ex_port = free_tcp();
    let example = String::from_utf8_lossy(&fairfeed(&["exchange", "--example-config"]).stdout).into_owned();
    let example: Vec<String> = example
        .lines()
        .filter(|l| !l.starts_with("itch_a") && !l.starts_with("itch_b") && !l.starts_with("retransmit_listen"))
        .map(|l| if l.starts_with("listen =") { format!("listen = \"{ex_port}\"") } else { l.to_string() })
        .collect();
    let cfg = dir.join("exchange.toml");
    std::fs::write(&cfg, example.join("\n")).unwrap();
    let c = cfg.to_str().unwrap();
    let node =
        |role: &'static str, id: &'static str| [role, "--topology", t, "--id", id, "--key-file", k, "--idle", "park"];
    let (a, b, out, rs, dl) = (free_udp(), free_udp(), free_udp(), free_udp(), free_tcp());
    let mut procs: Vec<(&str, Child)> = vec![
        ("receiver", start(dir, "receiver", &node("receiver", "0"), true)),
        ("proxy", start(dir, "proxy", &node("proxy", "5"), false)),
        (
            "sender",
            start(
                dir,
                "sender",
                &[&node("sender", "4")[..], &["--rate", "200", "--feed-seconds", "60"]].concat(),
                false,
            ),
        ),
        ("arb", start(dir, "arb", &["arb", "--a", &a, "--b", &b, "--out-hr", &out, "--idle", "park"], false)),
        (
            "retransmit-server",
            start(dir, "retransmit-server", &["retransmit-server", "--journal", p, "--listen", &rs], false),
        ),
        ("exchange", start(dir, "exchange", &["exchange", "--config", c], false)),
        (
            "dashboard",
            start(dir, "dashboard", &["dashboard", "--topology", t, "--listen", &dl, "--metrics-port", "1"], false),
        ),
    ];
    let nats =
        have_tool("nats-server", &["--version"]).then(|| fairfeed_bridge::server::LocalServer::start(0, None).unwrap());
    if let Some(n) = &nats {
        let bl = free_udp();
        procs.push((
            "bridge run",
            start(dir, "bridge run", &["bridge", "run", "--listen", &bl, "--nats", &n.url], false),
        ));
        procs
            .push(("subscribe", start(dir, "subscribe", &["subscribe", "--nats", &n.url, "--subject", "ff.>"], false)));
    }
    std::thread::sleep(Duration::from_millis(2_500));

    for (name, mut child) in procs {
        let status = terminate(&mut child);
        assert!(status.success(), "{name} exits 0 on SIGTERM: {status:?}; stderr: {:?}", events(dir, name));
        if name == "dashboard" {
            assert!(!events(dir, name).is_empty(), "the dashboard logs where it serves");
            continue;
        }
        let r = final_report(dir, name);
        match name {
            "receiver" | "proxy" | "sender" => {
                assert!(r["counters"].is_object() && r["node"].is_object(), "{name}: {r}");
                let why = events(dir, name)
                    .iter()
                    .any(|e| e["fields"]["message"].as_str().is_some_and(|m| m.ends_with("stopped by a signal")));
                assert!(why, "{name} logs why it stopped");
            }
            "arb" => assert!(r["hr_packets"].is_u64(), "{r}"),
            "subscribe" => assert!(r["publications"].is_u64(), "{r}"),
            _ => assert!(r.as_object().is_some_and(|o| !o.is_empty()), "{name}: {r}"),
        }
    }
}

/// A log setting that is not one is refused before anything runs, naming the value.
#[test]
fn bad_log_settings_are_refused_naming_the_value() {
    for (var, value, named) in
        [("FAIRFEED_LOG", "fairfeed=[", "FAIRFEED_LOG=`fairfeed=[`"), ("FAIRFEED_LOG_FORMAT", "xml", "'xml'")]
    {
        let o = Command::new(bin())
            .args(["plan", "--receivers", "3", "--out", "/dev/null"])
            .env(var, value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{var}={value}: {err}");
        assert!(err.contains(named) && !err.contains("panicked"), "{var}={value}: {err}");
    }
    let o = Command::new(bin())
        .args(["plan", "--receivers", "3", "--out", "/dev/null", "--log-format", "yaml"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("'yaml'"));
}
