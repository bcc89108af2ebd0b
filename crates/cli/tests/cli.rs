//! Goal: the `fairfeed` subcommands do what their help says, end to end, on
//! files and on loopback UDP. Method: run the built binary on generated feeds
//! and check outputs against each other and against the library's oracles.

#![allow(clippy::too_many_lines)] // scenario tests: one story, read top to bottom
mod common;
use common::*;
use std::collections::HashSet;
use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

fn gen(dir: &std::path::Path, name: &str, extra: &[&str]) -> std::path::PathBuf {
    let out = dir.join(name);
    let mut args = vec!["gen", "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    fairfeed(&args);
    out
}

#[test]
fn gen_is_deterministic_per_seed() {
    let d = tmp();
    let a = gen(d.path(), "a.pcap", &["--seed", "9", "--messages", "20000", "--symbols", "30"]);
    let b = gen(d.path(), "b.pcap", &["--seed", "9", "--messages", "20000", "--symbols", "30"]);
    let c = gen(d.path(), "c.pcap", &["--seed", "10", "--messages", "20000", "--symbols", "30"]);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap());
}

#[test]
fn decode_summary_has_the_documented_fields() {
    let d = tmp();
    let f = gen(d.path(), "f.pcap", &["--messages", "12345", "--symbols", "10", "--port", "30001"]);
    let s = json(&fairfeed(&["decode", f.to_str().unwrap(), "--summary-json"]));
    for k in ["packets", "messages", "types", "first_seq", "next_seq", "gaps", "errors"] {
        assert!(s.get(k).is_some(), "summary lacks {k}: {s}");
    }
    assert_eq!(s["messages"], 12345);
    assert_eq!(s["first_seq"], 1);
    assert_eq!(s["next_seq"], 12346);
    assert_eq!(s["gaps"], 0);
    assert_eq!(s["errors"], 0);
    let sum: u64 = s["types"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(sum, 12345);
    // The port filter applies; nothing on that port is said in one line (and
    // is not a success), after the summary that shows what was skipped.
    let o =
        Command::new(bin()).args(["decode", f.to_str().unwrap(), "--summary-json", "--port", "1"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let none = json(&o);
    assert_eq!(none["packets"], 0);
    assert_eq!(none["skipped_frames"]["other_port"], s["packets"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no UDP datagrams on port 1") && err.trim().lines().count() == 1, "{err}");
}

#[test]
fn ab_lines_carry_the_requested_impairments() {
    let d = tmp();
    let (a, b) = (d.path().join("a.pcap"), d.path().join("b.pcap"));
    let clean = gen(
        d.path(),
        "clean.pcap",
        &[
            "--messages",
            "100000",
            "--symbols",
            "50",
            "--a-out",
            a.to_str().unwrap(),
            "--b-out",
            b.to_str().unwrap(),
            "--loss-a",
            "0.01",
            "--loss-b",
            "0.02",
            "--dup-a",
            "0.01",
            "--reorder-b",
            "0.01",
            "--json",
        ],
    );
    let c = json(&fairfeed(&["decode", clean.to_str().unwrap(), "--summary-json"]));
    let sa = json(&fairfeed(&["decode", a.to_str().unwrap(), "--summary-json"]));
    let sb = json(&fairfeed(&["decode", b.to_str().unwrap(), "--summary-json"]));
    let n = c["packets"].as_f64().unwrap();
    let missing_share =
        |s: &serde_json::Value| s["missing_messages"].as_f64().unwrap() / c["messages"].as_f64().unwrap();
    assert!(sa["gaps"].as_u64().unwrap() > 0 && sb["gaps"].as_u64().unwrap() > 0);
    assert!((missing_share(&sa) - 0.01).abs() < 0.005, "A missing {}", missing_share(&sa));
    assert!(sa["duplicate_packets"].as_f64().unwrap() / n > 0.005, "A duplicates");
    assert_eq!(sa["errors"], 0);
    assert_eq!(sb["errors"], 0);
    // Every payload on either line is a clean packet, and together the lines
    // cover almost all of the clean feed (a packet is lost on both with p = 0.0002).
    let payloads = |p: &std::path::Path| -> HashSet<Vec<u8>> {
        fairfeed_feed::capture::read_datagrams(p, None).unwrap().0.into_iter().map(|d| d.payload).collect()
    };
    let (pc, pa, pb) = (payloads(&clean), payloads(&a), payloads(&b));
    assert!(pa.is_subset(&pc) && pb.is_subset(&pc));
    let covered = pa.union(&pb).count() as f64 / pc.len() as f64;
    assert!(covered > 0.998, "A ∪ B covers {covered}");
}

#[test]
fn stats_characterizes_like_seed_001() {
    let d = tmp();
    let f = gen(d.path(), "f.pcap", &["--messages", "200000", "--symbols", "200"]);
    let s = json(&fairfeed(&["stats", f.to_str().unwrap(), "--json"]));
    assert_eq!(s["messages"], 200000);
    let mpp = s["msgs_per_packet"]["mean"].as_f64().unwrap();
    assert!((4.5..5.6).contains(&mpp), "messages per packet {mpp}");
    assert!(s["packet_bytes"]["max"].as_u64().unwrap() <= 1400);
    let rate = s["mean_messages_per_s"].as_f64().unwrap();
    assert!((5000.0..9000.0).contains(&rate), "rate {rate}");
    let within = |bound: u64| {
        s["same_symbol_cdf"].as_array().unwrap().iter().find(|p| p[0] == bound).unwrap()[1].as_f64().unwrap()
    };
    assert!(within(1_000_000) > 0.6, "same symbol within 1 ms: {}", within(1_000_000));
    assert!(within(10_000_000) > 0.75, "same symbol within 10 ms: {}", within(10_000_000));
    // The peak second is busier than the mean (intraday curve).
    assert!(s["peak_messages"]["messages"].as_f64().unwrap() > 1.5 * rate);
}

#[test]
fn replay_delivers_every_payload_to_loopback() {
    let d = tmp();
    let f = gen(d.path(), "f.pcap", &["--messages", "10000", "--symbols", "20"]);
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket2::SockRef::from(&rx).set_recv_buffer_size(8 << 20).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let to = rx.local_addr().unwrap().to_string();
    let want: Vec<Vec<u8>> =
        fairfeed_feed::capture::read_datagrams(&f, None).unwrap().0.into_iter().map(|d| d.payload).collect();
    let child = Command::new(bin())
        .args(["replay", f.to_str().unwrap(), "--to", &to, "--rate", "20000", "--json"])
        .output()
        .unwrap();
    assert!(child.status.success(), "{}", String::from_utf8_lossy(&child.stderr));
    let report: serde_json::Value = serde_json::from_slice(&child.stdout).unwrap();
    assert_eq!(report["packets"].as_u64().unwrap() as usize, want.len());
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    while got.len() < want.len() {
        let Ok(n) = rx.recv(&mut buf) else { break };
        got.push(buf[..n].to_vec());
    }
    assert_eq!(got, want, "loopback delivered {} of {}", got.len(), want.len());
    let rate = report["achieved_pps"].as_f64().unwrap();
    assert!(rate > 15_000.0 && rate < 25_000.0, "paced rate {rate}");
}

#[test]
fn bad_input_gives_a_clear_error_not_a_panic() {
    let d = tmp();
    let junk = d.path().join("junk.pcap");
    std::fs::write(&junk, b"this is not a capture at all").unwrap();
    for args in [
        vec!["decode", junk.to_str().unwrap()],
        vec!["stats", junk.to_str().unwrap()],
        vec!["gen", "--messages", "5", "--out", d.path().join("x.pcap").to_str().unwrap()],
        vec!["decode", "/nonexistent/file.pcap"],
    ] {
        let out = Command::new(bin()).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("fairfeed: error:"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A value out of range is refused while parsing the command line (clap's exit status 2).
    let y = d.path().join("y.pcap");
    let out = Command::new(bin())
        .args(["gen", "--loss-a", "2", "--a-out", "a.pcap", "--out", y.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--loss-a") && err.contains("out of range") && !err.contains("panicked"), "{err}");
    // A negative value is a value, not an unknown flag ("unexpected argument '-0' found" before).
    let out = Command::new(bin()).args(["gen", "--loss-a", "-0.5", "--out", y.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("-0.5 is out of range"), "{err}");
    // A delay that would overflow once in ns.
    let out = Command::new(bin())
        .args(["sender", "--topology", "t.toml", "--id", "0", "--start-delay-ms", "18446744073709551615"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // An empty file and a missing one: one clear line each, the OS error once.
    let empty = d.path().join("empty.pcap");
    std::fs::write(&empty, b"").unwrap();
    let out = Command::new(bin()).args(["decode", empty.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("0 bytes: too short") && !err.contains("fill whole buffer"), "{err}");
    let out = Command::new(bin()).args(["decode", "/nonexistent/file.pcap"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
}

#[test]
fn truncated_capture_keeps_the_good_packets() {
    let d = tmp();
    let f = gen(d.path(), "f.pcap", &["--messages", "5000", "--symbols", "10"]);
    let mut bytes = std::fs::read(&f).unwrap();
    let full = json(&fairfeed(&["decode", f.to_str().unwrap(), "--summary-json"]));
    bytes.truncate(bytes.len() - 50);
    let cut = d.path().join("cut.pcap");
    std::fs::write(&cut, &bytes).unwrap();
    let out = Command::new(bin()).args(["decode", cut.to_str().unwrap(), "--summary-json"]).output().unwrap();
    // A torn last record: the good packets are summarized, then the error is reported.
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("fairfeed: error:") && !err.contains("panicked"), "{err}");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["packets"].as_u64().unwrap(), full["packets"].as_u64().unwrap() - 1);
    assert_eq!(s["errors"], 0);
    assert!(s["capture_error"].is_string());
    assert!(err.contains("damaged record") && !err.contains("not a pcap"), "{err}");
    // Commands that send or merge a capture use what came before the damage and say where
    // (they once refused the whole file as "not a pcap or pcapng file").
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = rx.local_addr().unwrap().to_string();
    let out = Command::new(bin())
        .args(["replay", cut.to_str().unwrap(), "--to", &to, "--rate", "50000", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("damaged after") && err.contains("truncated"), "{err}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["packets"].as_u64().unwrap(), full["packets"].as_u64().unwrap() - 1);
}

#[test]
fn plan_writes_a_valid_topology_and_refuses_impossible_ones() {
    let d = tmp();
    let (toml_path, dot) = (d.path().join("t.toml"), d.path().join("t.dot"));
    fairfeed(&[
        "plan",
        "--receivers",
        "100",
        "--hedge",
        "1",
        "--out",
        toml_path.to_str().unwrap(),
        "--dot",
        dot.to_str().unwrap(),
    ]);
    let t: toml::Value = toml::from_str(&std::fs::read_to_string(&toml_path).unwrap()).unwrap();
    assert_eq!(t["fanout"].as_integer(), Some(10));
    assert_eq!(t["depth"].as_integer(), Some(2));
    let nodes = t["trees"][0]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1 + 10 + 100);
    assert!(std::fs::read_to_string(&dot).unwrap().contains("style=dotted"));
    let out = Command::new(bin())
        .args([
            "plan",
            "--receivers",
            "100",
            "--fanout",
            "3",
            "--depth",
            "2",
            "--out",
            d.path().join("x.toml").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fewer than 100"));
}

/// Issue 42's interface: `--trees K` shards the tree schemes' messages over K
/// trees; rows say `trees` and the aggregate `rate`; a bad K is refused at parse time.
#[test]
fn sim_fairness_shards_over_trees() {
    let d = tmp();
    let out = d.path().join("fair");
    let o = out.to_str().unwrap();
    fairfeed(&[
        "sim",
        "experiment",
        "fairness",
        "--receivers",
        "40",
        "--trees",
        "3",
        "--rate",
        "9000",
        "--messages",
        "1500",
        "--schemes",
        "direct-unicast,jasper+controller",
        "--out",
        o,
    ]);
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let by = |s: &str| rows.as_array().unwrap().iter().find(|r| r["scheme"] == s).unwrap().clone();
    let (du, j) = (by("direct-unicast"), by("jasper+controller"));
    assert_eq!((du["trees"].as_u64(), j["trees"].as_u64()), (Some(1), Some(3)));
    assert_eq!(j["rate"].as_f64(), Some(9000.0));
    assert_eq!((j["lost_deliveries"].as_u64(), j["repeated_deliveries"].as_u64()), (Some(0), Some(0)));
    assert!(std::fs::read_to_string(out.join("summary.md")).unwrap().contains("over 3 trees"));
    for bad in ["0", "65", "x"] {
        let r =
            Command::new(bin()).args(["sim", "experiment", "fairness", "--trees", bad, "--out", o]).output().unwrap();
        assert_eq!(r.status.code(), Some(2), "--trees {bad}");
        assert!(String::from_utf8_lossy(&r.stderr).contains("--trees"), "--trees {bad}");
    }
}

/// Issue 42: the planner sizes K from a rate (the fewest trees that keep
/// each proxy's send queue at half load) and says what the sender carries.
#[test]
fn plan_sizes_the_trees_for_a_rate() {
    let d = tmp();
    let t = d.path().join("t.toml");
    let out =
        fairfeed(&["plan", "--receivers", "1000", "--hedge", "2", "--rate", "20000", "--out", t.to_str().unwrap()]);
    let topo: toml::Value = toml::from_str(&std::fs::read_to_string(&t).unwrap()).unwrap();
    // 30 copies × 2.7 µs × 20,000/K ≤ 0.5 → K = 4.
    assert_eq!(topo["trees"].as_array().unwrap().len(), 4);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("over 4 tree(s)") && err.contains("a queue per tree"), "{err}");
    for bad in [&["--rate", "0"][..], &["--rate", "5000", "--trees", "2"], &["--load-max", "0.5"]] {
        let mut args = vec!["plan", "--receivers", "10", "--out", t.to_str().unwrap()];
        args.extend_from_slice(bad);
        let r = Command::new(bin()).args(&args).output().unwrap();
        assert_eq!(r.status.code(), Some(2), "{bad:?}");
    }
}

/// Issue 42's interface: the demo over K trees reports `trees` and each
/// receiver's delivered stream's SHA-256 (the merged MoldUDP64 session).
#[test]
fn demo_shards_over_trees_and_fingerprints_what_each_receiver_delivered() {
    let d = tmp();
    let out = d.path().join("demo");
    fairfeed(&["demo", "--receivers", "6", "--trees", "3", "--seconds", "1", "--out", out.to_str().unwrap()]);
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["trees"], 3);
    assert_eq!(s["lost"], 0, "{s}");
    let hashes = s["delivered_sha256"].as_array().unwrap();
    assert_eq!(hashes.len(), 6);
    assert!(hashes.iter().all(|h| h.as_str().is_some_and(|h| h.len() == 64)));
    let distinct: std::collections::HashSet<_> = hashes.iter().collect();
    assert_eq!(s["delivered_identical"].as_bool(), Some(distinct.len() == 1));
    assert_eq!(s["delivered_streams"].as_u64(), Some(distinct.len() as u64));
    // Where nothing came late, every receiver delivered the same bytes.
    assert_eq!(s["delivered_on_time_identical"].as_bool(), Some(true), "{s}");
    assert!(s["barriers"].as_u64().is_some());
    let per_tree = s["per_tree"].as_array().unwrap();
    assert_eq!(per_tree.len(), 3);
    assert!(per_tree.iter().all(|t| t["messages"].as_u64() > Some(0) && t["lost"] == 0), "{per_tree:?}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("sharded over 3 trees") && report.contains("What each receiver delivered"));
    assert_eq!(fairfeed_sim::experiment::md_table_faults(&report), vec![], "{report}");
}

#[test]
fn sim_fairness_writes_the_documented_rows() {
    let d = tmp();
    let model = d.path().join("model.toml");
    std::fs::write(
        &model,
        "[link]\nkind = \"uniform\"\nmin_us = 10\nmax_us = 50\ncopy_us = 1.0\n[clock]\noffset_us = 0.02\n",
    )
    .unwrap();
    let out = d.path().join("fair");
    fairfeed(&[
        "sim",
        "experiment",
        "fairness",
        "--receivers",
        "40",
        "--seed",
        "3",
        "--out",
        out.to_str().unwrap(),
        "--messages",
        "2000",
        "--latency-model",
        model.to_str().unwrap(),
    ]);
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    let schemes: Vec<&str> = rows.iter().map(|r| r["scheme"].as_str().unwrap()).collect();
    assert_eq!(
        schemes,
        ["direct-unicast", "cloudex", "tree", "tree+hedging", "jasper", "jasper+late-controller", "jasper+controller"]
    );
    for r in rows {
        for k in [
            "receivers",
            "hedge",
            "oml_p50_us",
            "oml_p99_us",
            "dws_p50_us",
            "dws_p99_us",
            "pf_0us",
            "pf_1us",
            "hold_mean_us",
            "late_fraction",
        ] {
            assert!(r.get(k).is_some_and(|v| !v.is_null()), "{} lacks {k}", r["scheme"]);
        }
        assert_eq!(r["receivers"], 40);
    }
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("| jasper |"));
    // Every table's rows have its header's columns (the delimiter row had one too many).
    assert_eq!(fairfeed_sim::experiment::md_table_faults(&md), vec![], "{md}");
    let bad = Command::new(bin())
        .args(["sim", "experiment", "fairness", "--receivers", "0", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    // Refused at parse time (clap's usage error).
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn sim_clock_writes_the_documented_fields_and_sync_shrinks_the_window() {
    let d = tmp();
    let out = d.path().join("clock");
    fairfeed(&[
        "sim",
        "experiment",
        "clock",
        "--receivers",
        "30",
        "--seed",
        "2",
        "--seconds",
        "1",
        "--target-pf",
        "0.95",
        "--out",
        out.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    for k in [
        "sync_error_p50_ns",
        "sync_error_p99_ns",
        "sync_error_max_ns",
        "converged_s",
        "probe_share",
        "bound_coverage",
        "unsynced_share",
        "pf_1us",
        "pf_5us",
        "pf_10us",
        "pf_1us_all",
        "pf_5us_all",
        "pf_10us_all",
        "fair_window_us",
        "fair_window_all_us",
    ] {
        assert!(v.get(k).is_some(), "summary lacks {k}: {v}");
    }
    // The feed's controller aimed where it was told.
    assert_eq!(v["target_pf"].as_f64(), Some(0.95), "{v}");
    // Raw clocks are ±10 ms apart; synchronized, the median node is within a microsecond.
    assert!(v["sync_error_p50_ns"].as_f64().unwrap() < 1_000.0, "{v}");
    assert!(v["probe_share"].as_f64().unwrap() > 0.0);
    assert!(out.join("error.svg").exists());
    // Fairness rows with NTP-class clocks, without and with sync.
    let window = |sync: &str| {
        let o = d.path().join(format!("fair-{sync}"));
        fairfeed(&[
            "sim",
            "experiment",
            "fairness",
            "--receivers",
            "20",
            "--messages",
            "1000",
            "--clock",
            "ntp",
            "--sync",
            sync,
            "--out",
            o.to_str().unwrap(),
        ]);
        let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(o.join("summary.json")).unwrap()).unwrap();
        let row = rows.as_array().unwrap().iter().find(|r| r["scheme"] == "jasper+controller").unwrap().clone();
        row["dws_p50_us"].as_f64().unwrap()
    };
    let (off, on) = (window("off"), window("on"));
    assert!(off > 1_000.0 && on < off / 100.0, "delivery window p50: {off} µs without sync, {on} µs with");
    for bad in [["--receivers", "0"], ["--seconds", "-1"], ["--rate", "NaN"], ["--target-pf", "1"]] {
        let o = Command::new(bin())
            .args(["sim", "experiment", "clock", "--out", out.to_str().unwrap()])
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
        assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    }
}

#[test]
fn demo_refuses_a_bad_dilation_at_parse_time() {
    // `--dilation` takes `auto` or a number, so the generated numeric matrix skips it.
    for bad in ["-1", "0", "0.5", "NaN", "inf", "1e300", "65", "abc", ""] {
        let o = Command::new(bin()).args(["demo", "--dilation", bad, "--out", "/nonexistent/x"]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "--dilation {bad:?}: {err}");
        assert!(err.contains("--dilation") && !err.contains("panicked"), "{err}");
    }
}

/// Goal (issue 44): `fairfeed demo --model 2|3` reports the fairness at
/// the firms' programs behind gateways or in enclaves, on the tree's real
/// releases with the last hop drawn. Method: two short demos; the summary's
/// `last_hop` and the report's section; --enclave-hold-q without model 3 is
/// refused in one line.
#[test]
fn demo_models_2_and_3_report_fairness_at_the_firms_programs() {
    let d = tmp();
    for (model, extra) in [("2", &[][..]), ("3", &["--enclave-hold-q", "0.999"][..])] {
        let out = d.path().join(format!("demo{model}"));
        let mut args =
            vec!["demo", "--receivers", "8", "--seconds", "1", "--model", model, "--out", out.to_str().unwrap()];
        args.extend(extra);
        fairfeed(&args);
        let s: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
        let h = &s["last_hop"];
        assert_eq!(h["model"].as_u64(), model.parse().ok(), "{h}");
        assert!(h["messages"].as_u64().unwrap() >= 500, "{h}");
        let (p50, p99, budget) = (
            h["window_p50_us"].as_f64().unwrap(),
            h["window_p99_us"].as_f64().unwrap(),
            h["budget_us"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p99 >= p50 && budget > 5.0, "{h}");
        // The firms' programs get each message after the receivers release it, by about the budget.
        assert!(h["added_p50_us"].as_f64().unwrap() > budget / 2.0, "{h}");
        let sh: f64 = h["shares"]["shares"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).sum();
        assert!((sh - 1.0).abs() < 1e-6, "{h}");
        let report = std::fs::read_to_string(out.join("report.md")).unwrap();
        assert!(report.contains(&format!("The firms' programs (model {model})")), "{report}");
        assert_eq!(fairfeed_sim::experiment::md_table_faults(&report), vec![], "{report}");
    }
    let o = Command::new(bin())
        .args(["demo", "--model", "2", "--enclave-hold-q", "0.99", "--out", d.path().join("x").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--model 3") && err.trim().lines().count() == 1, "{err}");
}

#[test]
fn demo_runs_a_fair_tree_on_loopback() {
    let d = tmp();
    let out = d.path().join("demo");
    fairfeed(&["demo", "--receivers", "8", "--seconds", "1", "--out", out.to_str().unwrap()]);
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    for k in [
        "receivers",
        "messages",
        "lost",
        "oml_p50_us",
        "dws_p50_us",
        "pf_1us",
        "pf_paper",
        "late_fraction",
        "du_oml_p50_us",
        "link_oneway_p50_us",
        "link_model_p50_us",
        "dilation",
        "warnings",
    ] {
        assert!(s.get(k).is_some_and(|v| !v.is_null()), "summary lacks {k}: {s}");
    }
    assert_eq!(s["receivers"], 8);
    assert!(s["messages"].as_u64().unwrap() >= 500, "at least 1,000 sent, 60 % counted: {s}");
    assert_eq!(s["lost"], 0, "loopback without emulated loss loses nothing");
    assert_eq!(s["du_lost"], 0);
    // Hold-and-release narrows the delivery window far below direct unicast's.
    assert!(s["dws_p50_us"].as_f64().unwrap() < s["du_dws_p50_us"].as_f64().unwrap() / 4.0, "{s}");
    // The emulated links behave as the model says (loosely: a loaded test machine lags).
    let (m, model) = (s["link_oneway_p50_us"].as_f64().unwrap(), s["link_model_p50_us"].as_f64().unwrap());
    assert!(model > 20.0 && m >= model - 0.5 && m < model + 20.0, "link one-way {m} µs against the model's {model} µs");
    // Every receiver got most messages on time by its own clock.
    assert!(s["pf_paper"].as_f64().unwrap() > 0.8, "{s}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert_eq!(fairfeed_sim::experiment::md_table_faults(&report), vec![], "{report}");
    for needle in ["direct unicast", "What the measures mean", "warm-up", "Time dilation"] {
        assert!(report.contains(needle), "report lacks {needle}");
    }
    // Plots as PNG (real images, text drawn with the embedded font) for the HTML report, and SVG.
    for f in ["oml_cdf", "dws_cdf", "hold_cdf"] {
        let png = std::fs::read(out.join(format!("{f}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{f}.png is a PNG");
        assert!(png.len() > 10_000, "{f}.png has content");
        assert!(std::fs::read_to_string(out.join(format!("{f}.svg"))).unwrap().contains("<svg"));
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<th>") && !html.contains("|---"), "report.html renders its tables");
    // Where the one thread's time went, by the agents' roles.
    assert!(html.contains("<td>receiver</td>") && html.contains("<td>sender</td>"), "the runner's time by role");
    assert!(std::fs::read_to_string(out.join("report.html")).unwrap().contains("oml_cdf.png"));
    // The trading experiment (always on): four traders' profit shares in both schemes, each summing to 1.
    for k in ["tree_shares", "du_shares"] {
        let v: Vec<f64> = s["trading"][k].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(v.len(), 4);
        assert!((v.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{k}: {v:?}");
    }
    let du: Vec<f64> = s["trading"]["du_shares"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert!(du[2] + du[3] < 0.2, "direct unicast favours the first receivers: {du:?}");
    // Four equal traders on the fair tree: 25 ± 3 % each (issue 39: it read 22 / 7 / 13 / 58 %).
    let tree: Vec<f64> = s["trading"]["tree_shares"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert!(tree.iter().all(|&x| (x - 0.25).abs() <= 0.03), "the fair tree is fair to its traders: {tree:?}");
    assert_eq!(s["trading"]["tree_ci95"].as_array().map(Vec::len), Some(4), "the report carries the intervals");
}

#[test]
fn bench_proxy_hop_reports_against_a_same_run_baseline() {
    let out = fairfeed(&["bench", "proxy-hop", "--samples", "500", "--json"]);
    let r = json(&out);
    for k in ["proxy_hop_p50_us", "baseline_oneway_p50_us", "ratio"] {
        assert!(r[k].as_f64().is_some(), "{k} missing: {r}");
    }
    assert!(r["baseline_oneway_p50_us"].as_f64().unwrap() > 0.0);
    assert_eq!(r["via_proxy"]["samples"].as_u64(), Some(500), "every packet came through the proxy");
}

#[test]
fn bench_proxy_pps_runs_the_proxy_on_each_user_space_back_end() {
    for io in ["udp", "uring"] {
        let out = fairfeed(&[
            "bench",
            "proxy-pps",
            "--io",
            io,
            "--fanout",
            "4",
            "--rounds",
            "1",
            "--round-seconds",
            "0.3",
            "--json",
        ]);
        let r = json(&out);
        assert_eq!(r["io"], io, "{r}");
        for k in ["proxy_pps", "baseline_pps", "ratio"] {
            assert!(r[k].as_f64().is_some_and(|v| v > 0.0), "{io}: {k}: {r}");
        }
    }
}

#[test]
fn clock_sync_over_real_sockets_and_its_flags() {
    // Node agents on loopback with injected ±10 ms offsets and ±100 ppm drifts.
    let out = Command::new(bin())
        .args(["bench", "clock-sync", "--nodes", "5", "--warmup", "8", "--seconds", "2", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in ["error_p50_ns", "error_p99_ns", "error_max_ns", "nodes"] {
        assert!(v.get(k).is_some(), "lacks {k}: {v}");
    }
    assert!(v["samples"].as_u64().unwrap() > 0, "{v}");
    // Raw clocks are up to 20 ms apart; synchronized, the median node is within 100 µs.
    assert!(v["error_p50_ns"].as_f64().unwrap() < 100_000.0, "{v}");
    assert!(v["synced_share"].as_f64().unwrap() > 0.5, "{v}");
    // Two of the nodes' clocks step 1 ms back mid-run, the size told as a
    // host tells its own: they stay synchronized, nowhere near 1 ms off
    // (untold, they sat 1 ms off or unsynchronized: docs/results/clock.md).
    let out = Command::new(bin())
        .args(["bench", "clock-sync", "--nodes", "5", "--warmup", "8", "--seconds", "2", "--json"])
        .args(["--step-share", "0.5", "--step-ns", "-1000000"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stepped"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v["stepped_synced_share"].as_f64(), Some(1.0), "{v}");
    assert!(v["stepped_error_max_ns"].as_f64().unwrap() < 100_000.0, "{v}");
    for bad in [
        vec!["bench", "clock-sync", "--nodes", "2"],
        vec!["bench", "clock-sync", "--seconds", "NaN"],
        vec!["bench", "clock-sync", "--step-ns", "1000"],
        vec!["bench", "clock-sync", "--step-share", "2", "--step-ns", "1000"],
        vec!["receiver", "--topology", "t.toml", "--id", "0", "--clock-step-ns", "1000"],
        vec!["receiver", "--topology", "t.toml", "--id", "0", "--clock-step-after-ms", "10"],
        vec!["receiver", "--topology", "t.toml", "--id", "0", "--clock-drift-ppm", "5000"],
        vec!["receiver", "--topology", "t.toml", "--id", "0", "--clock", "atomic"],
        vec!["sender", "--topology", "t.toml", "--id", "0", "--initial-owd-us", "0"],
        vec!["sender", "--topology", "t.toml", "--id", "0", "--initial-owd-us", "18446744073709551615"],
    ] {
        let o = Command::new(bin()).args(&bad).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
        assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    }
}

#[test]
fn sim_experiments_refuse_bad_numbers_at_parse_time() {
    // Each once panicked inside the simulator (issue 17).
    let d = tmp();
    let out = d.path().join("x");
    for exp in ["fairness", "hedging", "crash", "table1", "trading"] {
        for bad in [
            ["--messages", "0"],
            ["--messages", "20000000"],
            ["--rate", "0"],
            ["--rate=-5", "--seed=1"],
            ["--rate", "NaN"],
        ] {
            let o = Command::new(bin())
                .args(["sim", "experiment", exp, "--out", out.to_str().unwrap()])
                .args(bad)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{exp} {bad:?}: {err}");
            assert!(!err.contains("panicked") && err.lines().next().is_some_and(|l| l.starts_with("error:")), "{err}");
        }
    }
    let o = Command::new(bin())
        .args(["sim", "experiment", "fairness", "--receivers", "0", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    // Targets, shares, rate lists and scheme names too.
    for (exp, bad) in [
        ("fairness", &["--target-pf", "1"][..]),
        ("fairness", &["--target-pf", "0.2"][..]),
        ("fairness", &["--schemes", "tree,nosuch"][..]),
        ("calibration", &["--targets", "0.9,1.5"][..]),
        ("calibration", &["--rates", "1000,0"][..]),
        ("calibration", &["--messages", "0"][..]),
        ("regime", &["--slow-share", "2"][..]),
        ("regime", &["--target-pf", "NaN"][..]),
        ("regime", &["--seconds", "0"][..]),
        ("trading", &["--model", "4"][..]),
        ("trading", &["--ordering", "random"][..]),
        ("trading", &["--cheat-us", "-1"][..]),
        ("trading", &["--batch-us", "0"][..]),
        ("trading", &["--slow-path-us", "NaN"][..]),
        ("trading", &["--enclave-hold-q", "1"][..]),
    ] {
        let o = Command::new(bin())
            .args(["sim", "experiment", exp, "--out", out.to_str().unwrap()])
            .args(bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{exp} {bad:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // A model file with a misspelt key is refused, naming the file.
    let m = d.path().join("typo.toml");
    std::fs::write(&m, "[link]\nmedian = 30\n").unwrap();
    let o = Command::new(bin())
        .args(["sim", "experiment", "hedging", "--out", out.to_str().unwrap(), "--latency-model", m.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("typo.toml") && err.contains("median"), "{err}");
}

#[test]
fn every_experiment_takes_a_latency_model_draws_plots_and_calibration_meets_its_targets() {
    let d = tmp();
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/models");
    let slow = models.join("slow-hosts.toml");
    for (exp, extra) in [
        ("fairness", &["--receivers", "20", "--messages", "400", "--schemes", "jasper,jasper+controller"][..]),
        ("hedging", &["--receivers", "20", "--messages", "400"][..]),
        ("crash", &["--receivers", "20", "--messages", "400"][..]),
        ("trading", &["--receivers", "8", "--messages", "400"][..]),
        ("table1", &["--messages", "100"][..]),
        ("clock", &["--receivers", "10", "--seconds", "0.2"][..]),
        ("regime", &["--receivers", "20", "--seconds", "0.4"][..]),
    ] {
        let out = d.path().join(exp);
        let o = Command::new(bin())
            .args(["sim", "experiment", exp, "--out", out.to_str().unwrap(), "--latency-model", slow.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{exp}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(out.join("summary.json").exists(), "{exp}");
        // The README promises plots from every experiment.
        let svgs =
            std::fs::read_dir(&out).unwrap().filter(|e| e.as_ref().unwrap().path().extension() == Some("svg".as_ref()));
        assert!(svgs.count() > 0, "{exp} draws at least one SVG");
    }
    let out = d.path().join("calibration");
    fairfeed(&[
        "sim",
        "experiment",
        "calibration",
        "--receivers",
        "20",
        "--messages",
        "6000",
        "--rates",
        "1000",
        "--targets",
        "0.9,0.99",
        "--out",
        out.to_str().unwrap(),
    ]);
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 6, "tree+hedging, paper, and two rules × two targets");
    for r in rows.iter().filter(|r| r["rule"] == "controller") {
        let miss = r["miss_ratio"].as_f64().unwrap();
        assert!((0.25..=2.5).contains(&miss), "{r}");
    }
    assert!(out.join("calibration.svg").exists());
}

/// Address space a command of the bad-input matrix may use (KiB for
/// `ulimit -v`): beyond it an allocation fails and the command aborts, which
/// the matrix reports (a bench once grew to 4.7 GB on `--rate 1e12`).
const MATRIX_MEMORY_KIB: u64 = 4 << 20;

/// Runs `fairfeed args…` with a time limit and [`MATRIX_MEMORY_KIB`]; (exit
/// code, stderr). `None` code: killed at the limit (or by a signal).
fn run_limited(args: &[String], limit: std::time::Duration) -> (Option<i32>, String) {
    let mut child = Command::new("bash")
        .args(["-c", &format!("ulimit -v {MATRIX_MEMORY_KIB} && exec \"$0\" \"$@\""), bin()])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (status.code(), err);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return (None, String::new());
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn every_numeric_flag_refuses_bad_numbers_at_parse_time() {
    // The flags come from the clap definitions themselves (`fairfeed cli-spec`),
    // so a new flag is covered the day it is added.
    let o = Command::new(bin()).arg("cli-spec").output().unwrap();
    assert!(o.status.success());
    let spec: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    // Flags whose negative values mean something.
    let signed_floats = ["--clock-drift-ppm"];
    let mut checked = 0;
    let mut failures = Vec::new();
    for e in &spec {
        let flag = e["flag"].as_str().unwrap();
        let kind = e["kind"].as_str().unwrap();
        let bads: &[&str] = match kind {
            "float" if signed_floats.contains(&flag) => &["NaN", "inf", "1e300", "-1e300"],
            "float" => &["NaN", "inf", "1e300", "-1"],
            "unsigned" => &["-1", "NaN", "1e300", "1.5"],
            "signed" => &["NaN", "1e300", "1.5"],
            _ => continue,
        };
        let path: Vec<String> = e["path"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect();
        for bad in bads {
            let mut args = path.clone();
            args.push(format!("{flag}={bad}"));
            let (code, err) = run_limited(&args, std::time::Duration::from_secs(10));
            checked += 1;
            let first = err.lines().next().unwrap_or("");
            // The first line names the value (not, say, a missing required argument).
            let ok = code == Some(2)
                && first.starts_with("error:")
                && first.contains(bad)
                && err.contains(flag)
                && !err.contains("panicked");
            if !ok {
                failures.push(format!("{} {flag}={bad}: exit {code:?}: {first}", path.join(" ")));
            }
        }
    }
    assert!(checked > 200, "only {checked} checks: is cli-spec listing the flags?");
    assert!(failures.is_empty(), "{} of {checked} bad numbers got through:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_address_flag_takes_host_port_and_refuses_bad_ones_at_parse_time() {
    // Every flag that takes an address (`fairfeed cli-spec` kind "address")
    // goes through the one HOST:PORT parser that takes host names (issue 39):
    // its refusals name the value and say what an address looks like.
    let o = Command::new(bin()).arg("cli-spec").output().unwrap();
    let spec: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let (mut checked, mut failures) = (0, Vec::new());
    for e in spec.iter().filter(|e| e["kind"] == "address") {
        let flag = e["flag"].as_str().unwrap();
        let path: Vec<String> = e["path"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect();
        for (bad, says) in [("nonsense", "is not HOST:PORT"), ("127.0.0.1:99999", "is not a number in 0..=65535")] {
            let mut args = path.clone();
            args.push(format!("{flag}={bad}"));
            let (code, err) = run_limited(&args, std::time::Duration::from_secs(10));
            checked += 1;
            let first = err.lines().next().unwrap_or("");
            if !(code == Some(2) && first.contains(bad) && first.contains(says) && !err.contains("panicked")) {
                failures.push(format!("{} {flag}={bad}: exit {code:?}: {first}", path.join(" ")));
            }
        }
    }
    assert!(checked > 40, "only {checked} checks: is cli-spec listing the address flags?");
    assert!(failures.is_empty(), "{} of {checked} bad addresses:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn bad_exchange_configs_are_refused_before_anything_starts() {
    // Each once started a gateway with a panicked engine behind it, or was accepted as is (issue 17).
    let d = tmp();
    let o = Command::new(bin()).args(["exchange", "--example-config"]).output().unwrap();
    let base = String::from_utf8(o.stdout).unwrap();
    assert!(base.contains("orders = 1048576"));
    for (from, to, names) in [
        ("orders = 1048576", "orders = 0", "limits.orders"),
        ("orders = 1048576", "orders = 4294967295", "limits.orders"),
        ("levels = 4096", "levels = 0", "limits.levels"),
        ("engines = 1", "engines = 0", "engines"),
        ("\"NVDA\"]", "\"AAPL\"]", "appears twice"),
        ("\"NVDA\"]", "\"SIXTEENCHARSYMBL\"]", "SIXTEENCHARSYMBL"),
        ("session = \"FFSESSION1\"", "session = \"SEVENTEENCHARNAME\"", "gateway.session"),
        ("[[\"FF0001\", \"secret\"]]", "[[\"TOOLONGUSER\", \"secret\"]]", "gateway.users"),
        // Issue 44's orderings: dbo needs its bound, batch its interval.
        ("ordering = \"fifo\"", "ordering = \"dbo\"", "dbo_bound_ns"),
        ("ordering = \"fifo\"", "ordering = \"batch\"", "batch_us"),
        ("batch_us = 0", "batch_us = 100", "batch_us is set"),
        // The cheat watch: its records need the operator key, and the key file must be one.
        ("ordering = \"fifo\"", "ordering = \"fifo\"\ndeadlines_listen = \"127.0.0.1:0\"", "set operator_key_file"),
        (
            "ordering = \"fifo\"",
            "ordering = \"fifo\"\ndeadlines_listen = \"127.0.0.1:0\"\noperator_key_file = \"missing.hex\"",
            "missing.hex",
        ),
        ("ordering = \"fifo\"", "ordering = \"fifo\"\ndeadlines_listen = \"nonsense\"", "invalid socket address"),
        ("ordering = \"fifo\"", "ordering = \"random\"", "unknown variant `random`"),
        ("dbo_bound_ns = 0", "dbo_bound_ns = 5000", "dbo_bound_ns"),
    ] {
        let p = d.path().join("x.toml");
        std::fs::write(&p, base.replace(from, to)).unwrap();
        let (code, err) = run_limited(
            &["exchange".into(), "--config".into(), p.to_str().unwrap().into(), "--seconds".into(), "1".into()],
            std::time::Duration::from_secs(10),
        );
        assert_eq!(code, Some(1), "{to}: {err}");
        assert!(err.contains(names) && !err.contains("panicked"), "{to}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

/// Deadline records speak for one tree's sequence numbers and are sealed
/// under the operator key: a sharded sender, or one without the key, is
/// refused in one line before anything is sent.
#[test]
fn deadline_records_need_one_tree_and_the_operator_key() {
    let d = tmp();
    let topo = common::small_tree_with(d.path(), 9850, &["--trees", "2"]);
    let key = d.path().join("key.hex");
    let op = d.path().join("op.hex");
    std::fs::write(&key, "3f".repeat(32)).unwrap();
    std::fs::write(&op, "5a".repeat(32)).unwrap();
    let base = ["sender", "--topology", topo.to_str().unwrap(), "--id", "4", "--key-file", key.to_str().unwrap()];
    let (code, err) = run_limited(
        &[&base[..], &["--deadlines-to", "127.0.0.1:9", "--operator-key-file", op.to_str().unwrap()]]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
        std::time::Duration::from_secs(20),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("a sharded sender has several") && !err.contains("panicked"), "{err}");
    let (code, err) = run_limited(
        &[&base[..], &["--deadlines-to", "127.0.0.1:9"]].concat().iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        std::time::Duration::from_secs(20),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--operator-key-file"), "{err}");
}

#[test]
fn subscribe_without_a_server_gives_up_with_a_clear_error() {
    // It once printed nothing and never returned (issue 17).
    let port = free_port(true);
    let url = format!("nats://127.0.0.1:{port}");
    let t0 = std::time::Instant::now();
    let (code, err) = run_limited(
        &["subscribe".into(), "--nats".into(), url.clone(), "--seconds".into(), "1".into()],
        std::time::Duration::from_secs(20),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no NATS connection to") && err.contains(&url), "{err}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn replay_to_nothing_fails_and_says_why_and_decode_flags_do_not_cancel_out() {
    // Replay once reported "N send errors" and exited 0 (issue 17).
    let d = tmp();
    let pcap = gen(d.path(), "r.pcap", &["--messages", "500"]);
    let port = free_port(false);
    let to = format!("127.0.0.1:{port}");
    let (code, err) = run_limited(
        &["replay".into(), pcap.to_str().unwrap().into(), "--to".into(), to.clone(), "--rate".into(), "5000".into()],
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("sends failed") && err.contains(&to), "{err}");
    // `decode --quiet --json` once printed nothing at all: now refused.
    let (code, err) = run_limited(
        &["decode".into(), pcap.to_str().unwrap().into(), "--quiet".into(), "--json".into()],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(2), "{err}");
    // The summary says when its gap list is cut short.
    let o = Command::new(bin()).args(["decode", pcap.to_str().unwrap(), "--summary-json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["gap_list_truncated"], false);
}

#[test]
fn arb_refuses_a_capture_of_another_protocol() {
    // It once merged nothing, said "0 high-reliability packets" and exited 0 (issue 17).
    let d = tmp();
    let pcap = gen(d.path(), "m.pcap", &["--messages", "500"]);
    let out = d.path().join("o.pcap");
    let (code, err) = run_limited(
        &[
            "arb".into(),
            "--a-pcap".into(),
            pcap.to_str().unwrap().into(),
            "--out".into(),
            out.to_str().unwrap().into(),
            "--protocol".into(),
            "xdp".into(),
        ],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("parse as --protocol xdp"), "{err}");
}

#[test]
fn bridge_refuses_subjects_nats_would_refuse() {
    // `--prefix 'a b.>*'` was accepted, every publish failed silently, exit 0 (issue 17).
    for bad in ["a b.>*", "ff..itch", ".ff", "ff.*", "ff.>", ""] {
        let (code, err) = run_limited(
            &["bridge".into(), "run".into(), "--prefix".into(), bad.into(), "--seconds".into(), "1".into()],
            Duration::from_secs(10),
        );
        assert_eq!(code, Some(2), "{bad:?}: {err}");
        assert!(err.contains("--prefix") && !err.contains("panicked"), "{bad:?}: {err}");
    }
}

#[test]
fn every_flag_says_what_it_is() {
    // 44 flags once had no description at all (`--seed`, `--out`, `--json`, `--nats`, …; issue 17).
    let o = Command::new(bin()).arg("cli-spec").output().unwrap();
    let spec: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let bare: Vec<String> = spec
        .iter()
        .filter(|f| f["help"].as_str().is_none_or(|h| h.trim().is_empty()))
        .filter(|f| f["kind"] != "command" || f["path"].as_array().is_some_and(|p| !p.is_empty()))
        .filter(|f| !["--help", "--version"].contains(&f["flag"].as_str().unwrap_or("")))
        .map(|f| format!("{} {}", f["path"], f["flag"]))
        .collect();
    assert!(spec.len() > 200, "{} flags", spec.len());
    assert!(bare.is_empty(), "flags without a description: {bare:?}");
}

/// A small simulation reading its link model from `{F}`, writing into `out`.
fn sim_with_model(out: &str) -> Vec<&str> {
    vec![
        "sim",
        "experiment",
        "fairness",
        "--receivers",
        "10",
        "--messages",
        "100",
        "--latency-model",
        "{F}",
        "--out",
        out,
    ]
}

#[test]
fn every_file_input_refuses_bad_files_in_one_line() {
    // The bad-input matrix for files (issue 17): each command that reads a
    // file, given a missing, an empty, a random, a truncated-header pcap and a cut pcapng one.
    let d = tmp();
    let missing = d.path().join("missing.bin");
    let empty = d.path().join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    let random = d.path().join("random.bin");
    std::fs::write(&random, (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect::<Vec<u8>>())
        .unwrap();
    let header = d.path().join("header.pcap");
    std::fs::write(&header, [0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4]).unwrap();
    // A pcapng section header block cut off after its byte-order magic.
    let pcapng = d.path().join("cut.pcapng");
    std::fs::write(&pcapng, [0x0a, 0x0d, 0x0d, 0x0a, 0x1c, 0, 0, 0, 0x4d, 0x3c, 0x2b, 0x1a, 1, 0]).unwrap();
    let out = d.path().join("o");
    let o = out.to_str().unwrap();
    let port = free_addr(false).to_string();
    // A valid sharded topology and shard map, for the files a node of several trees reads.
    let sharded = d.path().join("sharded.toml");
    let st = sharded.to_str().unwrap();
    fairfeed(&["plan", "--receivers", "4", "--fanout", "2", "--trees", "2", "--loopback-port", "9370", "--out", st]);
    let map = d.path().join("map.txt");
    std::fs::write(&map, "AAPL 1\n").unwrap();
    let m = map.to_str().unwrap();
    let one = d.path().join("one.toml");
    let ot = one.to_str().unwrap();
    fairfeed(&["plan", "--receivers", "2", "--fanout", "2", "--loopback-port", "9380", "--out", ot]);
    let commands: Vec<Vec<&str>> = vec![
        vec!["receiver", "--topology", ot, "--id", "0", "--snapshot", "127.0.0.1:9", "--snapshot-password-file", "{F}"],
        vec![
            "snapshot-server",
            "--listen",
            "127.0.0.1:0",
            "--feed",
            "127.0.0.1:0",
            "--user",
            "u",
            "--password-file",
            "{F}",
        ],
        vec!["sender", "--topology", st, "--id", "4", "--shard-map", "{F}"],
        vec!["receiver", "--topology", st, "--id", "0", "--shard-map", "{F}"],
        vec!["receiver", "--topology", st, "--id", "0", "--shard-map", m, "--symbols", "{F}"],
        vec!["decode", "{F}"],
        vec!["stats", "{F}"],
        vec!["replay", "{F}", "--to", &port],
        vec!["arb", "--a-pcap", "{F}", "--out", o],
        vec!["demo", "--pcap", "{F}", "--seconds", "1", "--out", o],
        vec!["sender", "--topology", "{F}", "--id", "0"],
        vec!["receiver", "--topology", "{F}", "--id", "1"],
        vec!["retransmit-server", "--journal", "{F}", "--listen", "127.0.0.1:0", "--max-seconds", "1"],
        vec!["exchange", "--config", "{F}", "--seconds", "1"],
        sim_with_model(o),
        vec!["bench", "churn", "--nodes", "8", "--seeds", "1", "--feed-seconds", "0.2", "--latency-model", "{F}"],
        vec!["dashboard", "--topology", "{F}", "--listen", "127.0.0.1:0"],
        vec!["proxy", "--topology", "{F}", "--id", "1"],
        vec!["stat", "--topology", "{F}"],
        vec!["stat", "127.0.0.1:9", "--key-file", "{F}"],
        vec!["control", "127.0.0.1:9", "--key-file", "{F}", "stats"],
        vec!["arb", "--a", "127.0.0.1:0", "--out-hr", &port, "--control", "127.0.0.1:0", "--operator-key-file", "{F}"],
    ];
    for cmd in &commands {
        for f in [&missing, &empty, &random, &header, &pcapng] {
            let args: Vec<String> = cmd
                .iter()
                .map(|a| if *a == "{F}" { f.to_str().unwrap().to_string() } else { (*a).to_string() })
                .collect();
            let (code, err) = run_limited(&args, Duration::from_secs(20));
            let what = format!("{args:?}");
            assert!(code.is_some(), "{what}: no exit within 20 s");
            assert!(matches!(code, Some(1 | 2)), "{what}: exit {code:?}: {err}");
            assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{what}: {err}");
            let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
            let errors = lines.iter().filter(|l| l.contains("error")).count();
            assert_eq!(errors, 1, "{what}: one error line, got: {err}");
        }
    }
}

/// The subcommand paths `fairfeed cli-spec` lists (every one, nested ones too).
fn command_paths() -> Vec<Vec<String>> {
    let o = Command::new(bin()).arg("cli-spec").output().unwrap();
    let spec: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    spec.iter()
        .filter(|e| e["kind"] == "command")
        .map(|e| e["path"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect())
        .collect()
}

#[test]
fn every_subcommand_refuses_an_unknown_flag_in_one_line() {
    let paths = command_paths();
    assert!(paths.len() > 40, "{} commands", paths.len());
    let mut failures = Vec::new();
    for path in &paths {
        let mut args = path.clone();
        args.push("--no-such-flag=1".into());
        let (code, err) = run_limited(&args, Duration::from_secs(10));
        let first = err.lines().next().unwrap_or("");
        if code != Some(2)
            || !first.starts_with("error:")
            || !first.contains("--no-such-flag")
            || err.contains("panicked")
        {
            failures.push(format!("{}: exit {code:?}: {first}", path.join(" ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn malformed_configs_are_refused_in_one_line_naming_the_file() {
    // Syntax errors, wrong types and misspelt keys in every configuration a
    // command reads (topology TOML and JSON, exchange TOML, link models).
    let d = tmp();
    let write = |name: &str, text: &str| {
        let p = d.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let files = [
        write("syntax.toml", "receivers = [1, 2\n[tree\n"),
        write("types.toml", "listen = 5\nengines = \"two\"\nreceivers = \"many\"\n[hop]\nbase_us = \"fast\"\n"),
        write("keys.toml", "recievers = 3\n[hops]\nbase = 1\n"),
        write("syntax.json", "{\"nodes\": [1, 2,"),
        write("types.json", "{\"nodes\": \"none\", \"receivers\": -1}"),
    ];
    let out = d.path().join("o");
    let o = out.to_str().unwrap();
    let commands: Vec<Vec<&str>> = vec![
        vec!["sender", "--topology", "{F}", "--id", "0"],
        vec!["proxy", "--topology", "{F}", "--id", "1"],
        vec!["receiver", "--topology", "{F}", "--id", "1"],
        vec!["exchange", "--config", "{F}", "--seconds", "1"],
        sim_with_model(o),
        vec!["bench", "churn", "--nodes", "8", "--seeds", "1", "--feed-seconds", "0.2", "--latency-model", "{F}"],
        vec!["dashboard", "--topology", "{F}", "--listen", "127.0.0.1:0"],
        vec![
            "sim",
            "experiment",
            "clock",
            "--receivers",
            "10",
            "--seconds",
            "0.1",
            "--latency-model",
            "{F}",
            "--out",
            o,
        ],
    ];
    let mut failures = Vec::new();
    for cmd in &commands {
        for f in &files {
            let args: Vec<String> =
                cmd.iter().map(|a| if *a == "{F}" { f.clone() } else { (*a).to_string() }).collect();
            let (code, err) = run_limited(&args, Duration::from_secs(20));
            let name = std::path::Path::new(f).file_name().unwrap().to_str().unwrap();
            let one_line = err.trim().lines().count() == 1;
            if !matches!(code, Some(1 | 2)) || !one_line || !err.contains(name) || err.contains("panicked") {
                failures.push(format!("{args:?}: exit {code:?}: {err}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The bridge's file flags (secrets, certificates, the baseline client): a
/// missing file is one line naming it, at once — not a connection timeout
/// later, nor a whole benchmark run first.
#[test]
fn missing_bridge_files_are_named_in_one_line_at_once() {
    let nats = "nats://127.0.0.1:1";
    for (args, named) in [
        (
            vec!["subscribe", "--nats", nats, "--nats-user", "u", "--nats-password-file", "/nonexistent/pw"],
            "/nonexistent/pw",
        ),
        (vec!["subscribe", "--nats", nats, "--nats-ca", "/nonexistent/ca.pem"], "/nonexistent/ca.pem"),
        (vec!["subscribe", "--nats", nats, "--nats-nkey-file", "/nonexistent/seed"], "/nonexistent/seed"),
        (
            vec!["bridge", "run", "--listen", "127.0.0.1:0", "--nats", nats, "--nats-token-file", "/nonexistent/tok"],
            "/nonexistent/tok",
        ),
        (vec!["bridge", "bench", "--seconds", "1", "--baseline", "/nonexistent/natsbase"], "/nonexistent/natsbase"),
    ] {
        let t0 = std::time::Instant::now();
        let o = Command::new(bin()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(named) && err.trim().lines().count() == 1 && !err.contains("panicked"), "{args:?}: {err}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(3), "{args:?}: {:?}", t0.elapsed());
    }
}

#[test]
fn unreachable_servers_are_reported_in_one_line_within_their_timeout() {
    // A port nothing listens on (TCP and UDP): each client gives up in time and says where it tried.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        a.to_string()
    };
    let nats = format!("nats://{closed}");
    let cases: Vec<(Vec<&str>, u64)> = vec![
        (vec!["stat", &closed], 5),
        (vec!["stat", &closed, "--timeout-ms", "200"], 5),
        (vec!["control", &closed, "stats"], 5),
        (vec!["order", "--server", &closed, "buy", "AAPL", "1", "@", "1"], 5),
        (vec!["subscribe", "--nats", &nats, "--seconds", "1"], 5),
        (vec!["bridge", "run", "--listen", "127.0.0.1:0", "--nats", &nats], 20),
    ];
    for (args, limit) in cases {
        let args: Vec<String> = args.iter().map(|a| (*a).to_string()).collect();
        let (code, err) = run_limited(&args, Duration::from_secs(limit));
        assert_eq!(code, Some(1), "{args:?} within {limit} s: {err}");
        assert!(err.contains(closed.as_str()) && err.trim().lines().count() == 1, "{args:?}: {err}");
        assert!(!err.contains("(os error 11)"), "{args:?}: a timeout is not 'resource temporarily unavailable': {err}");
    }
}

#[test]
fn zero_for_any_numeric_flag_is_refused_at_parse_time_or_runs_without_panic() {
    // Zero is where divisions by zero and empty ranges hide (`--messages 0`
    // and `--rate 0` once panicked). Each numeric flag gets 0 on its own:
    // either parsing refuses it (exit 2, one line naming the flag and the
    // value) or the command, run for real for a few seconds, neither panics
    // nor refuses the flag itself after parsing (ranges belong in the clap
    // definitions, checked once).
    let o = Command::new(bin()).arg("cli-spec").output().unwrap();
    let spec: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let d = tmp();
    let mut failures = Vec::new();
    let mut accepted = 0;
    for e in spec.iter().filter(|e| ["float", "unsigned", "signed"].contains(&e["kind"].as_str().unwrap())) {
        let flag = e["flag"].as_str().unwrap();
        let mut args: Vec<String> =
            e["path"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect();
        args.push(format!("{flag}=0"));
        let parsed = Command::new(bin()).args(&args).env("FAIRFEED_PARSE_ONLY", "1").output().unwrap();
        let err = String::from_utf8_lossy(&parsed.stderr);
        let first = err.lines().next().unwrap_or("");
        match parsed.status.code() {
            Some(0) => {}
            Some(2)
                if first.starts_with("error:")
                    && (first.contains("'0'") || first.contains(" 0 "))
                    && err.contains(flag) =>
            {
                continue;
            }
            // Refused for another reason (a required argument missing): nothing more to learn.
            Some(2) if first.contains("required arguments") || first.contains("requires a subcommand") => continue,
            c => {
                failures.push(format!("{}: parse exit {c:?}: {first}", args.join(" ")));
                continue;
            }
        }
        accepted += 1;
        let mut child = Command::new(bin())
            .args(&args)
            .current_dir(d.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let refused_late = out.status.code() == Some(1) && err.lines().any(|l| l.contains("error") && l.contains(flag));
        if err.contains("panicked") || refused_late {
            failures.push(format!("{}: exit {:?}: {}", args.join(" "), out.status.code(), err.trim()));
        }
    }
    assert!(accepted > 10, "only {accepted} zeros accepted: is the matrix running?");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn trading_with_untrusted_receivers_writes_the_interface_summary() {
    // Issue 44's interface: per-firm profit shares, P(F) at the point of
    // release to the firms, OML, and for a cheater when it was flagged.
    let d = tmp();
    let out = d.path().join("t");
    let o = Command::new(bin())
        .args(["sim", "experiment", "trading", "--receivers", "20", "--messages", "2000", "--model", "1"])
        .args(["--ordering", "dbo", "--cheat-us", "5", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let firms = s["firms"].as_array().unwrap();
    assert_eq!(firms.len(), 4);
    let total: f64 = firms.iter().map(|f| f["profit_share"].as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-6, "{total}");
    for k in ["pf_1us", "pf_5us", "oml_p50_us"] {
        assert!(s[k].as_f64().is_some(), "{k}");
    }
    let flagged = s["cheater_flagged_after_orders"].as_u64().expect("the cheater is flagged");
    assert!(flagged <= 1_000, "{flagged}");
    assert_eq!(s["false_flags"], 0);
    assert!(std::fs::read_to_string(out.join("summary.md")).unwrap().contains("(cheats)"));
    // A cheat needs the firm's own receiver: models 2 and 3 refuse it in one line.
    let o = Command::new(bin())
        .args(["sim", "experiment", "trading", "--receivers", "20", "--model", "3", "--cheat-us", "5"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--cheat-us needs --model 1") && err.lines().count() == 1, "{err}");
    // More releases than the simulator keeps: refused, not measured in part.
    let o = Command::new(bin())
        .args(["sim", "experiment", "trading", "--receivers", "2000", "--messages", "6000", "--model", "1"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("over the 10000000 releases") && err.lines().count() == 1, "{err}");
}
