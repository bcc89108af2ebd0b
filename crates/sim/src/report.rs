//! Experiments' summaries as text: Markdown reports and CSV series. Pure
//! functions of a run's summary — the CLI writes the files and draws the
//! plots.

use crate::engine::ClockSample;
use crate::experiment::{ClockConfig, ClockSummary, FairnessConfig, HedgingRow};

/// The clock experiment's report: the model it ran on and the table of figures.
pub fn clock_markdown(c: &ClockConfig, r: &ClockSummary, wall_s: f64) -> String {
    format!("{}{}", clock_model_md(c, r), clock_table_md(r, wall_s))
}

/// `error.csv`: the sync error over time.
pub fn clock_series_csv(series: &[ClockSample]) -> String {
    let mut csv = String::from("time_s,p50_ns,p99_ns,max_ns,worst_node,over_limit,outside_bound\n");
    for x in series {
        csv.push_str(&format!(
            "{:.3},{:.1},{:.1},{:.1},{},{},{}\n",
            x.time_s, x.p50_ns, x.p99_ns, x.max_ns, x.worst_node, x.over_limit, x.outside_bound
        ));
    }
    csv
}

/// The hedging experiment's report (Jasper figures 8 and 9's table).
pub fn hedging_markdown(c: &FairnessConfig, rows: &[HedgingRow]) -> String {
    let (receivers, seed, messages, rate) = (c.receivers, c.seed, c.messages, c.rate_per_s);
    let mut md = format!(
        "# Hedging (Jasper figures 8 and 9), N = {receivers}, seed {seed}, {messages} messages at {rate} msg/s, no holding\n\n\
         | H | OML p50 µs | OML p99 µs | DWS p50 µs | DWS p99 µs | receivers' median p50 OWD µs | receivers' median p99 OWD µs | events | events/s |\n\
         |---|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {:.2} M |\n",
            r.hedge,
            r.oml_p50_us,
            r.oml_p99_us,
            r.dws_p50_us,
            r.dws_p99_us,
            r.receiver_owd_p50_median_us,
            r.receiver_owd_p99_median_us,
            r.events,
            r.events_per_s / 1e6
        ));
    }
    md
}

/// Says, in the report, that the engine had to move node timers on (a node
/// bug that once hung the simulator); empty when none.
fn stall_note(stalls: u64) -> String {
    if stalls == 0 {
        return String::new();
    }
    format!(
        " **{stalls} node timers kept coming due at the instant they fired and were moved on by 1 µs \
         (a node bug: please report it with this command).**"
    )
}

/// The clock report's opening: the model it ran on.
fn clock_model_md(c: &ClockConfig, r: &ClockSummary) -> String {
    format!(
        "# Clock synchronization, N = {} receivers ({} nodes), seed {}\n\n\
         Raw clocks: ±{} µs offsets, ±{} ppm drift, {} ns mean timestamp noise; links: floor {} µs \
         ({:.0} % unqueued), {:.1} % of directed links {} µs longer one way. Sync warm-up {} s, then \
         {} s of feed at {} msg/s (Jasper + controller). Each node probes its parents and {} random peers; \
         an edge to a parent up to {} pairs per interval.\n\n",
        r.receivers,
        r.nodes,
        r.seed,
        c.model.clock.offset_us,
        c.model.clock.drift_ppm,
        c.model.clock.timestamp_noise_ns,
        c.model.link.floor_us,
        c.model.link.unqueued * 100.0,
        c.model.link.asymmetric_share * 100.0,
        c.model.link.asymmetric_us,
        r.warmup_s,
        r.feed_seconds,
        c.rate_per_s,
        c.sync.random_peers,
        c.sync.cfg.rate_max,
    )
}

/// The clock report's table of figures.
fn clock_table_md(r: &ClockSummary, wall: f64) -> String {
    let k = &r.clock;
    format!(
        "| measure | value |\n|---|---|\n\
         | sync error p50 (ns) | {:.0} |\n| sync error p99 (ns) | {:.0} |\n| sync error max (ns) | {:.0} |\n\
         | converged (s) | {} |\n| bound covers the true error | {:.1} % |\n\
         | probe share of packets during the feed (mean node / worst receiver / worst proxy / sender) | {:.3} % / {:.3} % / {:.3} % / {:.3} % |\n\
         | probes sent per node per s | {:.1} |\n| pure pairs | {:.1} % |\n\
         | asymmetric links in the probe graph / flaggings | {} / {} |\n\
         | nodes contested at the end / updates bounded by an unsettled dispute's hull | {} / {} |\n\
         | clock steps detected | {} |\n\
         | releases while over the bound limit (share of all releases) | {} ({:.4} %) |\n\
         | feed: P(F@1µs) (target) / DWS p99 µs / late share / OML p50 µs / lost | {:.4} ({}) / {:.2} / {:.5} / {:.1} / {} |\n\
         | feed: P(F@5µs) / P(F@10µs) | {:.4} / {:.4} |\n\
         | feed, every receiver (synchronized or not): P(F@1µs) / P(F@5µs) / P(F@10µs) | {:.4} / {:.4} / {:.4} |\n\
         | feed: smallest window fair at the target, synchronized receivers / all (µs) | {:.2} / {:.2} |\n\n\
         {} events in {wall:.1} s.{}\n",
        k.sync_error_p50_ns,
        k.sync_error_p99_ns,
        k.sync_error_max_ns,
        k.converged_s.map_or("never".to_string(), |s| format!("{s:.1}")),
        k.bound_coverage * 100.0,
        k.probe_share * 100.0,
        k.probe_share_max * 100.0,
        k.probe_share_max_proxy * 100.0,
        k.probe_share_sender * 100.0,
        k.probes_sent_per_node_s,
        k.pure_fraction * 100.0,
        k.asymmetric_links,
        k.asymmetric_flagged,
        k.contested_nodes,
        k.unresolved_disputes,
        k.steps_detected,
        k.unsynced_releases,
        k.unsynced_share * 100.0,
        r.pf_1us,
        r.target_pf,
        r.dws_p99_us,
        r.late_fraction,
        r.oml_p50_us,
        r.lost_deliveries,
        r.pf_5us,
        r.pf_10us,
        r.pf_1us_all,
        r.pf_5us_all,
        r.pf_10us_all,
        r.fair_window_us,
        r.fair_window_all_us,
        r.events,
        stall_note(r.timer_stalls),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_series_has_a_header_and_one_row_per_sample_and_stalls_are_said() {
        let s = ClockSample {
            time_s: 0.1,
            p50_ns: 12.0,
            p99_ns: 80.5,
            max_ns: 130.0,
            worst_node: 7,
            over_limit: 2,
            outside_bound: 0,
        };
        let csv = clock_series_csv(&[s, ClockSample { time_s: 0.2, ..s }]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].split(',').count(), lines[1].split(',').count());
        assert_eq!(lines[1], "0.100,12.0,80.5,130.0,7,2,0");
        assert!(stall_note(0).is_empty());
        assert!(stall_note(3).contains("3 node timers"));
    }
}
