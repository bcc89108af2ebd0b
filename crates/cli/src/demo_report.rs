//! The `fairfeed demo` report: Markdown whose first screen answers "is the
//! tree fair, and what does fairness cost", then how it was run, how faithful
//! the emulation was, and what every measure means; HTML from the same text
//! with a real Markdown renderer.

use fairfeed_net::tree::demo::{Calibration, ClusterResult};

/// What the report needs besides the two results.
pub struct Facts {
    pub receivers: usize,
    pub fanout: usize,
    pub depth: usize,
    pub hedge: usize,
    pub seconds: f64,
    pub rate: f64,
    pub target_pf: f64,
    pub tick_ns: u64,
    pub cal: Calibration,
    /// Copies one message costs in the fair tree.
    pub copies: u64,
    pub traders: [u32; 4],
    /// Dilations at which the host fell behind during the warm-up (the run started again with more).
    pub fell_behind_at: Vec<f64>,
    /// The trading race for the tree, then direct unicast.
    pub shares: [fairfeed_sim::experiment::RaceShares; 2],
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// Four shares with their 95 % intervals: `25 ± 1 / 24 ± 2 / … %`.
fn shares(r: &fairfeed_sim::experiment::RaceShares) -> String {
    (0..4).map(|k| format!("{:.0} ± {:.0}", r.shares[k] * 100.0, r.ci95[k] * 100.0)).collect::<Vec<_>>().join(" / ")
        + " %"
}

/// Two standard errors of a share `p` measured over `n` messages.
fn noise(p: f64, n: u64) -> f64 {
    2.0 * (p * (1.0 - p)).max(1.0 / n.max(1) as f64).sqrt() / (n.max(1) as f64).sqrt()
}

/// One sentence: fair or not, and at what latency.
fn verdict(f: &Facts, j: &ClusterResult, du: &ClusterResult) -> String {
    let (p, e) = (j.pf_paper, noise(j.pf_paper, j.messages));
    let measured =
        format!("{} (± {:.1} points) of messages reached every receiver by their deadline", pct(p), e * 100.0);
    let fair = if p >= f.target_pf {
        format!("**Fair**: {measured} (target {}).", pct(f.target_pf))
    } else if p + e >= f.target_pf {
        format!(
            "**Fair within the measurement's noise**: {measured} (target {}; more --seconds narrows it).",
            pct(f.target_pf)
        )
    } else {
        format!("**Short of its target**: {measured} (target {}).", pct(f.target_pf))
    };
    let ratio = j.oml_p50_us / du.oml_p50_us.max(1e-9);
    let cost = if ratio <= 1.0 {
        format!(
            "Fairness costs no latency here: the last receiver gets a message after {:.0} µs (median), {:.2}× direct unicast's {:.0} µs.",
            j.oml_p50_us, ratio, du.oml_p50_us
        )
    } else {
        format!(
            "The price: the last receiver gets a message after {:.0} µs (median), {:.2}× direct unicast's {:.0} µs.",
            j.oml_p50_us, ratio, du.oml_p50_us
        )
    };
    format!("{fair} {cost}")
}

fn headline(f: &Facts, j: &ClusterResult, du: &ClusterResult) -> String {
    let [js, ds] = &f.shares;
    let (jn, dn) = (js.races, ds.races);
    format!(
        "| | fair tree | direct unicast | better |\n|---|---|---|---|\n\
         | P(F), paper rule: messages every receiver got by its deadline | {} ± {:.1} | – | higher |\n\
         | P(F) at 1 µs: messages delivered to all within 1 µs | {} | {} | higher |\n\
         | delivery window p50 / p99 (µs) | {:.3} / {:.3} | {:.1} / {:.1} | lower |\n\
         | OML, send → last receiver, p50 / p99 (µs) | {:.1} / {:.1} | {:.1} / {:.1} | lower |\n\
         | trading profit shares ± 95 % interval, 4 equal traders ({jn} / {dn} races) | {} | {} | 25 % each |\n\
         | deliveries lost | {} | {} | 0 |\n",
        pct(j.pf_paper),
        noise(j.pf_paper, j.messages) * 100.0,
        pct(j.pf_1us),
        pct(du.pf_1us),
        j.dws_p50_us,
        j.dws_p99_us,
        du.dws_p50_us,
        du.dws_p99_us,
        j.oml_p50_us,
        j.oml_p99_us,
        du.oml_p50_us,
        du.oml_p99_us,
        shares(js),
        shares(ds),
        j.lost,
        du.lost,
    )
}

fn how_run(f: &Facts, j: &ClusterResult, du: &ClusterResult) -> String {
    format!(
        "## How it was run\n\n\
         One process, one thread, one loopback socket per node (127.1.x.y): every node is the agent that \
         `fairfeed sender|proxy|receiver` runs as a process, all driven by one runner on one thread; every copy \
         between nodes is a real UDP datagram through the kernel. The cloud is emulated: each copy waits in a user-space queue for its sender's \
         per-copy cost (2.7 µs) and a hop delay drawn from the calibrated cloud model (lognormal, median 25 µs, \
         one spike of ≈ 300 µs in 10,000); every node reads its own clock, off true time by up to ±20 ns \
         (Huygens-class sync). The fair tree has F = {}, D = {}, H = {} ({} copies per message); direct unicast sends \
         {} copies from the sender. The deadline controller aims at P(F) {}.\n\n\
         **Time dilation {}×.** One thread does the kernel work of every host one after the other (a loopback \
         datagram costs {:.2} µs here; one message is {} datagrams through the tree), where real hosts work side by side. So emulated \
         time runs {}× slower than the host clock: each emulated host gets {}× this core, and every figure above is \
         on the emulated clock. Each configuration sent {} messages at {} per emulated second ({:.1} host seconds; \
         --seconds {} asked for at least that long); the first {} of each ({:.0} %) are warm-up, while the controller \
         learns the delays, and are left out.\n",
        f.fanout,
        f.depth,
        f.hedge,
        f.copies,
        f.receivers,
        pct(f.target_pf),
        f.cal.dilation,
        f.cal.datagram_ns / 1e3,
        f.copies,
        f.cal.dilation,
        f.cal.dilation,
        j.messages + j.warmup_messages,
        f.rate,
        j.host_seconds,
        f.seconds,
        j.warmup_messages,
        j.warmup_messages as f64 * 100.0 / (j.messages + j.warmup_messages).max(1) as f64,
    ) + &format!(
        "\n| emulation fidelity | fair tree | direct unicast |\n|---|---|---|\n\
         | one copy node → node, measured p50 / p99 (µs) | {:.1} / {:.1} | {:.1} / {:.1} |\n\
         | the model's for the same copies p50 / p99 (µs) | {:.1} / {:.1} | {:.1} / {:.1} |\n\
         | measured − model p50 / p99 (µs) | {:.2} / {:.2} | {:.2} / {:.2} |\n\
         | copies more than 5 µs behind the model | {} | {} |\n\
         | host seconds | {:.1} | {:.1} |\n",
        j.link_oneway_p50_us,
        j.link_oneway_p99_us,
        du.link_oneway_p50_us,
        du.link_oneway_p99_us,
        j.link_model_p50_us,
        j.link_model_p99_us,
        du.link_model_p50_us,
        du.link_model_p99_us,
        j.link_lag_p50_us,
        j.link_lag_p99_us,
        du.link_lag_p50_us,
        du.link_lag_p99_us,
        pct(j.link_lag_share),
        pct(du.link_lag_share),
        j.host_seconds,
        du.host_seconds,
    )
}

fn details(j: &ClusterResult) -> String {
    format!(
        "## The fair tree in detail\n\n\
         | | |\n|---|---|\n\
         | late deliveries (released on arrival, after the deadline) | {} |\n\
         | mean hold before release (µs) | {:.1} |\n\
         | deadline offset at the end, OWD_G + margin (µs) | {:.1} |\n\
         | release − deadline on the receiver's clock, p50 / p99 (ns) | {} / {} |\n\
         | the same on the host clock, p99 (ns, undilated) | {} |\n\
         | delivery window on the host clock, p50 / p99 (µs, undilated) | {:.2} / {:.2} |\n\n\
         The host-clock window is this machine's, not the cloud's: one thread turns the receivers' agents one \
         after another, earliest deadline first (≈ {:.2} µs of host time each here: a median window of {:.0} µs \
         over {} receivers), so on the emulated clock the window is that cost divided by the dilation, not the \
         clocks' error. On separate hosts each would release at its own deadline, and the window would be their \
         clocks' error (±20 ns here). The runner took {} turns, {} of them over 10 µs (a batch of sends, or the \
         thread losing its core).\n",
        pct(j.late_fraction),
        j.hold_mean_us,
        j.deadline_offset_us,
        j.release_error_p50_ns,
        j.release_error_p99_ns,
        j.host_release_error_p99_ns,
        j.host_dws_p50_us,
        j.host_dws_p99_us,
        j.host_dws_p50_us / j.receivers.max(1) as f64,
        j.host_dws_p50_us,
        j.receivers,
        j.runner.turns,
        j.runner.slow_turns,
    ) + &runner_roles(&j.runner)
}

/// Where the one thread's time went, by the agents' roles.
fn runner_roles(r: &fairfeed_io::agent::RunStats) -> String {
    if r.roles.is_empty() {
        return String::new();
    }
    let mut t = String::from(
        "\nThe fair tree's runner by role (host time in turns that did work):\n\n\
         | role | agents | turns | busy turns | host ms | share | turns over 10 µs | longest turn µs |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let total = r.roles.iter().map(|x| x.work_ns).sum::<u64>().max(1) as f64;
    for x in &r.roles {
        t += &format!(
            "| {} | {} | {} | {} | {:.1} | {:.1} % | {} | {:.1} |\n",
            x.role,
            x.agents,
            x.turns,
            x.busy_turns,
            x.work_ns as f64 / 1e6,
            x.work_ns as f64 * 100.0 / total,
            x.slow_turns,
            x.longest_turn_ns as f64 / 1e3
        );
    }
    t
}

const DEFINITIONS: &str = "## What the measures mean\n\n\
- **OML** (overall multicast latency): from the sender handing a message to the tree until the *last* receiver \
releases it. Lower is better; it is what fairness costs.\n\
- **Delivery window**: last release minus first release of one message over all receivers, on true (emulated) \
time. 0 is perfectly fair; direct unicast's is the spread of its paths.\n\
- **P(F), paper rule** (Jasper §9): the share of messages that every receiver had by the deadline the sender put \
on it, so each released it exactly at the deadline on its own clock. Higher is better; the controller aims at \
the target.\n\
- **P(F) at 1 µs**: the share of messages whose delivery window is at most 1 µs.\n\
- **Hold**: how long a receiver keeps a message before its deadline. **Late**: arrived after its deadline, \
released on arrival.\n\
- **Trading profit shares** (Jasper §9.4): four equally fast traders (the first two and last two receivers) \
answer every message the moment their receiver releases it — when it fell due on the receiver's own clock, as on \
a host of its own, not when this demo's one thread reached it — stamping the order with their own clock at the \
tick resolution; the exchange takes the earliest stamp, and a tie among k traders gives each 1/k (its expected \
value). ± is the 95 % interval over the races. Fair delivery gives each 25 %.\n\
- **Emulation fidelity**: each copy's one-way latency from being handed to the emulated link until the next node \
reads it, against what the model drew for that copy. Close means the figures are the model's cloud, not this \
machine's load.\n";

fn paths(j: &ClusterResult, du: &ClusterResult) -> String {
    let mut t = String::from(
        "## Latency by path length\n\nCopies arriving at receivers, by links crossed (µs):\n\n\
         | | links | copies | one-way p50 / p99 | per link p50 |\n|---|---|---|---|---|\n",
    );
    for (name, r) in [("fair tree", j), ("direct unicast", du)] {
        for p in &r.paths {
            t += &format!(
                "| {name} | {} | {} | {:.1} / {:.1} | {:.1} |\n",
                p.links, p.copies, p.p50_us, p.p99_us, p.per_link_p50_us
            );
        }
    }
    t
}

/// The whole report.
pub fn markdown(f: &Facts, j: &ClusterResult, du: &ClusterResult, warnings: &[String]) -> String {
    let mut md = format!(
        "# fairfeed demo: is the tree fair, and what does fairness cost?\n\n\
         {} receivers on loopback, a fair multicast tree (Jasper: F = {}, D = {}, sibling hedging H = {}, \
         hold-and-release with the deadline controller) beside direct unicast, same feed, same emulated cloud.\n\n{}\n\n",
        f.receivers,
        f.fanout,
        f.depth,
        f.hedge,
        verdict(f, j, du)
    );
    for w in warnings {
        md += &format!("> **Warning:** {w}\n\n");
    }
    md += &headline(f, j, du);
    md += "\n![OML: send to last receiver](oml_cdf.png)\n\n![Delivery window](dws_cdf.png)\n\n";
    md += &how_run(f, j, du);
    if !f.fell_behind_at.is_empty() {
        md += &format!(
            "\nThe calibration fell short: at {} dilation this host fell behind the emulation during the warm-up (more \
             than 5 % of copies over 5 µs late), so the run was stopped and started again with more; the figures are \
             from the run at {}×.\n",
            f.fell_behind_at.iter().map(|k| format!("{k}×")).collect::<Vec<_>>().join(", then "),
            f.cal.dilation
        );
    }
    md += "\n";
    md += &details(j);
    md += &sharding(j, du);
    md += &format!(
        "\n## Trading\n\nTraders: receivers {:?}; timestamps at {} ns; races {} (tree) and {} (direct unicast), ties {} and {}.\n\n\
         ![Hold time](hold_cdf.png)\n\n",
        f.traders, f.tick_ns, f.shares[0].races, f.shares[1].races, f.shares[0].ties, f.shares[1].ties
    );
    md += DEFINITIONS;
    md += "\n";
    md += &paths(j, du);
    md
}

/// Over several trees: each tree's figures, and whether the receivers' merged
/// feeds were the same (nothing on one tree but the streams' agreement).
fn sharding(j: &ClusterResult, du: &ClusterResult) -> String {
    let same = |r: &ClusterResult| {
        if r.delivered_identical {
            "every receiver delivered the same bytes".to_string()
        } else {
            format!(
                "{} different streams among {} receivers; the {} receivers at which nothing came late after the \
                 warm-up delivered {}",
                r.delivered_streams,
                r.receivers,
                r.delivered_on_time_receivers,
                if r.delivered_on_time_identical { "the same bytes" } else { "different bytes" }
            )
        }
    };
    let mut md = format!(
        "\n## What each receiver delivered\n\nFair tree: {}; direct unicast: {} (SHA-256 of each stream in \
         summary.json, `delivered_sha256`).\n",
        same(j),
        same(du)
    );
    if j.per_tree.is_empty() {
        return md;
    }
    md += &format!(
        "\nThe feed was sharded over {} trees by stock locate (market-wide messages on every tree, delivered once: {} \
         barriers, {} given up after the wait). Each receiver merged them into one MoldUDP64 session. Per tree:\n\n\
         | tree | messages | lost | OML p50 µs | OML p99 µs | P(F) paper |\n|---|---|---|---|---|---|\n",
        j.trees, j.barriers, j.barrier_timeouts
    );
    for t in &j.per_tree {
        md += &format!(
            "| {} | {} | {} | {:.1} | {:.1} | {} |\n",
            t.tree,
            t.messages,
            t.lost,
            t.oml_p50_us,
            t.oml_p99_us,
            pct(t.pf_paper)
        );
    }
    md
}

/// The report as a self-contained page (the plots beside it as PNGs).
pub fn html(md: &str) -> String {
    use pulldown_cmark::{html::push_html, Options, Parser};
    let mut body = String::new();
    push_html(&mut body, Parser::new_ext(md, Options::ENABLE_TABLES));
    format!(
        "<!doctype html><html lang=en><meta charset=utf-8><title>fairfeed demo</title>\
         <style>body{{font-family:sans-serif;max-width:62em;margin:2em auto;line-height:1.4}}\
         td,th{{border:1px solid #ccc;padding:2px 8px}}table{{border-collapse:collapse;margin:1em 0}}\
         blockquote{{background:#fff3cd;border-left:4px solid #e0a800;margin:1em 0;padding:.3em 1em}}\
         img{{max-width:100%}}</style>\n{body}</html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::html;

    #[test]
    fn tables_render_as_one_table_with_a_header() {
        let h = html("| a | b |\n|---|---|\n| 1 | `x` |\n");
        assert_eq!(h.matches("<table>").count(), 1, "{h}");
        assert!(h.contains("<th>a</th>") && h.contains("<td>1</td>") && h.contains("<code>x</code>"), "{h}");
        assert!(!h.contains("|---|"), "{h}");
    }
}
