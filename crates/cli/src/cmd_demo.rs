//! `fairfeed demo`: a fair multicast tree on loopback, end to end, beside
//! direct unicast on the same machine in the same command.

use std::path::PathBuf;

use anyhow::Context;
use fairfeed_feed::gen::{GenConfig, Generator};
use fairfeed_net::tree_live::{run_cluster, ClusterConfig, ClusterResult};
use fairfeed_sim::model::LinkModel;
use fairfeed_sim::plot::cdf_svg;
use fairfeed_tree::node::{DeadlineRule, NodeConfig};
use fairfeed_tree::plan::{plan, PlanRequest};

#[derive(clap::Args)]
pub struct Args {
    /// Receivers (each a socket on its own 127.1.x.y address; the default suits a 2-core machine).
    #[arg(long, default_value_t = 16)]
    receivers: usize,
    /// Seconds of feed per configuration.
    #[arg(long, default_value_t = 5.0, value_parser = crate::fmt::seconds)]
    seconds: f64,
    /// Multicast messages (MoldUDP64 packets) per second.
    #[arg(long, default_value_t = 1_000.0, value_parser = crate::fmt::rate)]
    rate: f64,
    /// Hedging factor.
    #[arg(long, default_value_t = 1)]
    hedge: usize,
    /// Fan-out F of the tree: children per proxy (the depth follows from it and --receivers); 2..=64.
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=64))]
    fanout: usize,
    /// Feed the tree from this capture instead of a generated ITCH feed.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// The controller's target P(F) (0.5..=0.99999).
    #[arg(long, default_value_t = 0.99, value_parser = crate::fmt::target_pf)]
    target_pf: f64,
    /// Seed of every random draw (link delays, the generated feed).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the report goes.
    #[arg(long, default_value = "out/demo")]
    out: PathBuf,
    /// Also run seed 000's trading experiment: the first two and last two
    /// receivers trade on every message; the exchange takes the earliest
    /// order timestamp (at --tick-ns resolution, ties at random).
    #[arg(long)]
    trading: bool,
    /// The exchange's timestamp resolution for --trading, ns.
    #[arg(long, default_value_t = 1_000)]
    tick_ns: u64,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!((2..=1_000).contains(&a.receivers), "--receivers must be 2..=1,000 on loopback");
    anyhow::ensure!(a.seconds > 0.0 && a.seconds <= 600.0, "--seconds must be in (0, 600]");
    anyhow::ensure!(a.rate > 0.0 && a.rate <= 50_000.0, "--rate must be in (0, 50,000]");
    let payloads: Vec<Vec<u8>> = match &a.pcap {
        Some(p) => crate::fmt::read_capture(p, None)?.into_iter().map(|d| d.payload).collect(),
        None => {
            let messages = ((a.seconds * a.rate) as u64 * 5).max(2_000);
            let g = Generator::new(GenConfig { seed: a.seed, messages, symbols: 100, ..GenConfig::default() })?;
            g.map(|p| p.payload).collect()
        }
    };
    anyhow::ensure!(!payloads.is_empty(), "no packets to send");
    let tree = plan(&PlanRequest {
        receivers: a.receivers,
        fanout: Some(a.fanout),
        depth: None,
        hedge: a.hedge,
        cost_model: None,
        trees: 1,
    })
    .map_err(|e| anyhow::anyhow!("invalid tree: {e}"))?;
    let direct = plan(&PlanRequest {
        receivers: a.receivers,
        fanout: Some(a.receivers),
        depth: Some(1),
        hedge: 0,
        cost_model: None,
        trees: 1,
    })
    .map_err(|e| anyhow::anyhow!("invalid direct unicast: {e}"))?;
    let node = NodeConfig { report_interval_ns: 10_000_000, initial_owd_ns: 1_000_000, ..NodeConfig::default() };
    let warmup = ((a.seconds * a.rate) as u64 / 5).max(1);
    let base = ClusterConfig {
        seconds: a.seconds,
        rate_per_s: a.rate,
        link: LinkModel::CLOUD,
        node,
        rule: DeadlineRule::Quantile { target_pf: a.target_pf },
        seed: a.seed,
        warmup_messages: warmup,
        track: if a.trading { traders(&tree.receiver_ids).to_vec() } else { Vec::new() },
    };
    let pb = crate::fmt::progress(200, "tree + hedging + hold-and-release on loopback");
    let jasper = run_cluster(&tree, &base, &payloads, |f| pb.set_position((f * 100.0) as u64))?;
    pb.set_message("direct unicast on loopback");
    let du_cfg = ClusterConfig {
        node: NodeConfig { hold_and_release: false, ..node },
        track: if a.trading { traders(&direct.receiver_ids).to_vec() } else { Vec::new() },
        ..base.clone()
    };
    let du = run_cluster(&direct, &du_cfg, &payloads, |f| pb.set_position(100 + (f * 100.0) as u64))?;
    pb.finish_and_clear();
    report(&a, tree.depth, &jasper, &du)
}

/// The first two and the last two receivers.
fn traders(ids: &[u32]) -> [u32; 4] {
    let n = ids.len();
    [ids[0], ids[1.min(n - 1)], ids[n.saturating_sub(2)], ids[n - 1]]
}

/// Profit shares: per message, the trader with the earliest release (stamped
/// at `tick` resolution) wins; ties at random. Returns shares, opportunities, ties.
fn shares(r: &ClusterResult, ids: &[u32], warmup: u64, tick: u64, seed: u64) -> ([f64; 4], u64, u64) {
    use rand::{Rng, SeedableRng};
    let t = traders(ids);
    let mut at: std::collections::BTreeMap<u64, [Option<u64>; 4]> = std::collections::BTreeMap::new();
    for &(rx, seq, ns) in &r.tracked {
        if seq <= warmup {
            continue;
        }
        if let Some(k) = t.iter().position(|&x| x == rx) {
            at.entry(seq).or_insert([None; 4])[k] = Some(ns / tick.max(1));
        }
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (mut wins, mut ties) = ([0u64; 4], 0u64);
    for s in at.values() {
        let Some(best) = s.iter().flatten().min().copied() else { continue };
        let k: Vec<usize> = (0..4).filter(|&i| s[i] == Some(best)).collect();
        ties += u64::from(k.len() > 1);
        wins[k[rng.gen_range(0..k.len())]] += 1;
    }
    let total: u64 = wins.iter().sum();
    (wins.map(|w| if total > 0 { w as f64 / total as f64 } else { 0.0 }), total, ties)
}

fn report(a: &Args, depth: usize, j: &ClusterResult, du: &ClusterResult) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut v = serde_json::to_value(j)?;
    let mut trading_md = String::new();
    if a.trading {
        let warmup = ((a.seconds * a.rate) as u64 / 5).max(1);
        let ids: Vec<u32> = (0..j.receivers as u32).collect();
        let (js, jn, jt) = shares(j, &ids, warmup, a.tick_ns, a.seed);
        let (ds, dn, dt) = shares(du, &ids, warmup, a.tick_ns, a.seed);
        v["trading"] = serde_json::json!({
            "traders": traders(&ids),
            "tick_ns": a.tick_ns,
            "tree_shares": js, "tree_opportunities": jn, "tree_ties": jt,
            "du_shares": ds, "du_opportunities": dn, "du_ties": dt,
        });
        let pct = |s: [f64; 4]| s.map(|x| format!("{:.2}%", x * 100.0)).join(" | ");
        trading_md = format!(
            "\n## Trading (seed 000 §9.4): share of profit\n\nTraders: receivers {:?}; the earliest order timestamp wins, \
             stamped at {} ns resolution (ties at random).\n\n| | P1 | P2 | P3 | P4 | opportunities | ties |\n|---|---|---|---|---|---|---|\n\
             | tree + hedging + hold-and-release | {} | {jn} | {jt} |\n| direct unicast | {} | {dn} | {dt} |\n",
            traders(&ids),
            a.tick_ns,
            pct(js),
            pct(ds)
        );
    }
    v["du_oml_p50_us"] = du.oml_p50_us.into();
    v["du_oml_p99_us"] = du.oml_p99_us.into();
    v["du_dws_p50_us"] = du.dws_p50_us.into();
    v["du_lost"] = du.lost.into();
    v["hedge"] = a.hedge.into();
    v["fanout"] = a.fanout.into();
    v["depth"] = depth.into();
    v["seconds"] = a.seconds.into();
    v["rate_per_s"] = a.rate.into();
    std::fs::write(a.out.join("summary.json"), serde_json::to_string_pretty(&v)?)?;
    let md = format!(
        "# fairfeed demo: {} receivers on loopback, F = {}, D = {depth}, H = {}\n\n\
         {} s at {} messages/s per configuration; emulated cloud links (median hop 25 µs, 2.7 µs per copy); \
         the deadline controller aims at P(F) {}.\n\n\
         | | tree + hedging + hold-and-release | direct unicast |\n|---|---|---|\n\
         | messages counted | {} | {} |\n| deliveries lost | {} | {} |\n\
         | OML p50 / p99 µs | {:.1} / {:.1} | {:.1} / {:.1} |\n\
         | delivery window p50 / p99 µs | {:.2} / {:.2} | {:.1} / {:.1} |\n\
         | P(F) at 1 µs | {:.3} | {:.3} |\n| late deliveries | {:.4} | – |\n| mean hold µs | {:.1} | – |\n\
         | release − deadline p50 / p99 ns | {} / {} | – |\n\n\
         Per-link latency (copies arriving at receivers, by links crossed):\n\n{}\n\n\
         All nodes share one thread and one clock here: the receivers of a message are released back to back \
         at its deadline (from a rotating first receiver, so none is systematically first), so the delivery window \
         is mostly that loop (about 0.1 µs per receiver) — on separate hosts it would be their clocks' error instead. Links are emulated in user space (no netem here).\n\n\
         Plots: `oml_cdf`, `dws_cdf`, `hold_cdf` (.png and .svg; the PNGs are in `report.html`).\n",
        j.receivers,
        a.fanout,
        a.hedge,
        a.seconds,
        a.rate,
        a.target_pf,
        j.messages,
        du.messages,
        j.lost,
        du.lost,
        j.oml_p50_us,
        j.oml_p99_us,
        du.oml_p50_us,
        du.oml_p99_us,
        j.dws_p50_us,
        j.dws_p99_us,
        du.dws_p50_us,
        du.dws_p99_us,
        j.pf_1us,
        du.pf_1us,
        j.late_fraction,
        j.hold_mean_us,
        j.release_error_p50_ns,
        j.release_error_p99_ns,
        path_table(j, du),
    );
    let md = md + &trading_md;
    std::fs::write(a.out.join("report.md"), &md)?;
    print!("{md}");
    let names = ["tree + hedging + hold-and-release", "direct unicast"];
    let oml = vec![(names[0].to_string(), j.oml_us.clone()), (names[1].to_string(), du.oml_us.clone())];
    let dws = vec![(names[0].to_string(), j.dws_us.clone()), (names[1].to_string(), du.dws_us.clone())];
    let hold = vec![(names[0].to_string(), j.hold_us.clone())];
    for (file, title, x, series) in [
        ("oml_cdf.svg", "Overall multicast latency on loopback", "OML (µs)", &oml),
        ("dws_cdf.svg", "Delivery window on loopback", "delivery window (µs)", &dws),
        ("hold_cdf.svg", "Hold time at receivers (on-time messages)", "hold (µs)", &hold),
    ] {
        for f in [file.to_string(), file.replace(".svg", ".png")] {
            if let Err(e) = cdf_svg(&a.out.join(&f), title, x, series, 0.995) {
                eprintln!("demo: could not draw {f}: {e}");
            }
        }
    }
    std::fs::write(a.out.join("report.html"), html(&md))?;
    eprintln!("demo: report in {} (and report.html)", a.out.join("report.md").display());
    Ok(())
}

fn path_table(j: &ClusterResult, du: &ClusterResult) -> String {
    let mut t = String::from("| | links | copies | one-way p50 / p99 µs | per link p50 µs |\n|---|---|---|---|---|\n");
    for (name, r) in [("tree", j), ("direct unicast", du)] {
        for p in &r.paths {
            t += &format!(
                "| {name} | {} | {} | {:.1} / {:.1} | {:.1} |\n",
                p.links, p.copies, p.p50_us, p.p99_us, p.per_link_p50_us
            );
        }
    }
    t.trim_end().to_string()
}

/// The Markdown report as a self-contained page with the plots inline.
fn html(md: &str) -> String {
    let mut body = String::new();
    let mut in_table = false;
    for line in md.lines() {
        let esc = line.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        if let Some(rest) = line.strip_prefix("| ") {
            if line.starts_with("|---") {
                continue;
            }
            if !in_table {
                body += "<table>";
                in_table = true;
            }
            let cells: Vec<&str> = rest.trim_end_matches('|').split('|').map(str::trim).collect();
            body += "<tr>";
            for c in cells {
                body += &format!("<td>{}</td>", c.replace('&', "&amp;").replace('<', "&lt;"));
            }
            body += "</tr>";
            continue;
        }
        if in_table {
            body += "</table>";
            in_table = false;
        }
        if let Some(h) = line.strip_prefix("# ") {
            body += &format!("<h1>{}</h1>", h.replace('&', "&amp;").replace('<', "&lt;"));
        } else if !line.is_empty() {
            body += &format!("<p>{esc}</p>");
        }
    }
    if in_table {
        body += "</table>";
    }
    format!(
        "<!doctype html><meta charset=utf-8><title>fairfeed demo</title>\
         <style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}td{{border:1px solid #ccc;padding:2px 8px}}\
         table{{border-collapse:collapse;margin:1em 0}}</style>{body}\
         <img src=oml_cdf.png width=640><img src=dws_cdf.png width=640><img src=hold_cdf.png width=640>"
    )
}
