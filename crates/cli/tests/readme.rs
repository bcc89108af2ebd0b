//! Goal: the README's and docs/USAGE.md's examples work verbatim on a fresh
//! machine (issue 17).
//!
//! Method: every ```` ```sh ```` block of README.md and docs/USAGE.md
//! carries a marker comment on the line before it (README first, then
//! USAGE, all in one directory):
//! - `<!-- readme-test: in-usage -->` (README only): the same code as a
//!   block of docs/USAGE.md, which runs it — checked here, so the two
//!   cannot drift apart.
//! - `<!-- readme-test: run -->`: run by bash, verbatim, in README order, all
//!   in one temporary directory (with the repository's `docs/` linked in, so
//!   paths like `docs/models/…` resolve) and `fairfeed` first on the PATH;
//!   `set -euo pipefail`, so every command must succeed; whatever the block
//!   left running is killed at its end. Each block must finish within
//!   [`BLOCK_LIMIT`] ([`SLOW_BLOCK_LIMIT`] for slow ones run for real).
//! - `<!-- readme-test: run, needs nats-server -->`: the same, skipped
//!   (loudly) when the broker is not installed, unless FAIRFEED_REQUIRE_TOOLS=1.
//! - `<!-- readme-test: run, needs root -->`: the same, skipped unless run
//!   as root (network namespaces, eBPF).
//! - `<!-- readme-test: slow -->`: minutes-long runs; run with
//!   FAIRFEED_PARSE_ONLY=1, which makes every `fairfeed` invocation parse its
//!   flags and values and exit (so a renamed flag or a value out of range
//!   still fails here); run for real with FAIRFEED_README_SLOW=1.
//! - `<!-- readme-test: skip: why -->`: not run.
//!
//! A block without a marker fails the test, so a new example cannot slip in untested.

#![allow(clippy::too_many_lines)] // scenario tests: one story, read top to bottom
mod common;
use common::*;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a `run` block may take.
const BLOCK_LIMIT: Duration = Duration::from_secs(300);
/// Longest a `slow` block may take when run for real.
const SLOW_BLOCK_LIMIT: Duration = Duration::from_secs(3600);

struct Block {
    /// The file and the 1-based line of the opening fence.
    doc: &'static str,
    line: usize,
    marker: String,
    code: String,
}

/// The README's `sh` blocks with their markers.
fn blocks(doc: &'static str, readme: &str) -> Vec<Block> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() == "```sh" {
            let marker = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .and_then(|l| l.trim().strip_prefix("<!-- readme-test:"))
                .and_then(|l| l.strip_suffix("-->"))
                .map_or(String::new(), |m| m.trim().to_string());
            let start = i + 1;
            let mut end = start;
            while end < lines.len() && lines[end].trim_end() != "```" {
                end += 1;
            }
            out.push(Block { doc, line: i + 1, marker, code: lines[start..end].join("\n") });
            i = end;
        }
        i += 1;
    }
    out
}

/// Runs `code` with bash in `dir`; (exit code, how long, output tail). The
/// block runs in its own process group, killed whole at the end.
fn run_block(
    code: &str,
    dir: &Path,
    env: &[(&str, &str)],
    n: usize,
    limit: Duration,
) -> (Option<i32>, Duration, String) {
    let bin_dir = Path::new(bin()).parent().unwrap();
    let path = format!("{}:/usr/sbin:/usr/local/sbin:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let script = format!(
        "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true' EXIT\n{code}\n"
    );
    let log = dir.join(format!("block-{n}.log"));
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new("bash")
        .args(["-c", &script])
        .current_dir(dir)
        .env("PATH", path)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id();
    let t0 = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if t0.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Anything still running in the block's group (a daemon its trap missed) goes now.
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).stderr(Stdio::null()).status();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: Vec<String> = text.lines().rev().take(30).map(|l| l.chars().take(300).collect()).collect();
    (code, t0.elapsed(), tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
}

#[test]
fn readme_examples_run_verbatim() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let usage = std::fs::read_to_string(root.join("docs/USAGE.md")).unwrap();
    let usage_blocks = blocks("docs/USAGE.md", &usage);
    let mut all = blocks("README.md", &readme);
    assert!(all.len() >= 6, "found {} sh blocks in the README", all.len());
    for b in all.iter().filter(|b| b.marker == "in-usage") {
        assert!(
            usage_blocks.iter().any(|u| u.code == b.code && u.marker != "in-usage"),
            "README line {}: marked in-usage, but docs/USAGE.md has no block with the same code",
            b.line
        );
    }
    all.extend(usage_blocks);
    assert!(all.len() >= 20, "found {} sh blocks", all.len());
    let unmarked: Vec<String> =
        all.iter().filter(|b| b.marker.is_empty()).map(|b| format!("{}:{}", b.doc, b.line)).collect();
    assert!(unmarked.is_empty(), "sh blocks without a readme-test marker: {unmarked:?}");
    let d = tmp();
    std::os::unix::fs::symlink(root.join("docs").canonicalize().unwrap(), d.path().join("docs")).unwrap();
    let slow_for_real = std::env::var("FAIRFEED_README_SLOW").as_deref() == Ok("1");
    let (mut ran, mut broker) = (0, false);
    for (n, b) in all.iter().enumerate() {
        let env: &[(&str, &str)] = match b.marker.as_str() {
            "run" => &[],
            "run, needs nats-server" => {
                if !have_tool("nats-server", &["--version"]) {
                    continue;
                }
                broker = true;
                &[]
            }
            "run, needs root" => {
                let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0");
                if !root {
                    eprintln!("{} block at line {} skipped: it needs root", b.doc, b.line);
                    continue;
                }
                &[]
            }
            "slow" if slow_for_real => &[],
            "slow" => &[("FAIRFEED_PARSE_ONLY", "1")],
            m if m.starts_with("skip:") => continue,
            "in-usage" if b.doc == "README.md" => continue,
            m => panic!("{} line {}: unknown readme-test marker {m:?}", b.doc, b.line),
        };
        let limit = if b.marker == "slow" && slow_for_real { SLOW_BLOCK_LIMIT } else { BLOCK_LIMIT };
        let (code, took, tail) = run_block(&b.code, d.path(), env, n, limit);
        eprintln!("{} block at line {} ({}): exit {code:?} in {:.1} s", b.doc, b.line, b.marker, took.as_secs_f64());
        assert_eq!(code, Some(0), "{} block at line {} ({}) failed; its output ends:\n{tail}", b.doc, b.line, b.marker);
        ran += 1;
    }
    assert!(ran >= 7, "only {ran} blocks ran");
    // What the blocks promise they leave behind.
    for f in
        ["feed.pcap", "merged.pcap", "stats.json", "tree.toml", "r0.json", "exchange.toml", "out/fair100/summary.json"]
    {
        assert!(d.path().join(f).exists(), "the docs' examples should have written {f}");
    }
    if broker {
        let sub = std::fs::read_to_string(d.path().join("tqyv.txt")).unwrap();
        assert!(sub.lines().filter(|l| l.contains("TQYV")).count() > 10, "the subscriber saw the symbol: {sub}");
        // Every TQYV message of the feed reached the subscriber: count them in
        // the feed itself (by the stock locate its directory message gives).
        let json = Command::new(env!("CARGO_BIN_EXE_fairfeed"))
            .args(["decode", "feed.pcap", "--json"])
            .current_dir(d.path())
            .output()
            .unwrap();
        let msgs: Vec<serde_json::Value> =
            json.stdout.split(|b| *b == b'\n').filter_map(|l| serde_json::from_slice(l).ok()).collect();
        let locate = msgs
            .iter()
            .find(|m| m["type"] == "R" && m["stock"].as_str().map(str::trim) == Some("TQYV"))
            .and_then(|m| m["stock_locate"].as_u64())
            .expect("TQYV's directory message");
        let want = msgs.iter().filter(|m| m["stock_locate"].as_u64() == Some(locate)).count();
        let log = std::fs::read_to_string(d.path().join("tqyv.log")).unwrap();
        assert!(
            log.contains(&format!("({want} messages)"))
                && log.contains(" 0 missing (broker)")
                && log.contains("feed gaps 0 ")
                && log.contains(" 0 duplicates"),
            "the subscriber should have every one of the feed's {want} TQYV messages, none missing: {log}"
        );
    }
}

#[test]
fn parse_only_still_refuses_bad_values() {
    // The slow blocks are checked with FAIRFEED_PARSE_ONLY=1: that must catch what parsing catches.
    let ok =
        Command::new(bin()).args(["bench", "proxy-hop", "--json"]).env("FAIRFEED_PARSE_ONLY", "1").output().unwrap();
    assert!(ok.status.success() && ok.stdout.is_empty(), "parsed, nothing run");
    let bad = Command::new(bin())
        .args(["bench", "proxy-hop", "--no-such-flag"])
        .env("FAIRFEED_PARSE_ONLY", "1")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
