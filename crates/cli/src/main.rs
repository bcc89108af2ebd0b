//! `fairfeed` — one binary, one subcommand per job; each subcommand is a thin
//! shell over the library crates.

use clap::{Parser, Subcommand};

mod cmd_arb;
mod cmd_bench;
mod cmd_bridge;
mod cmd_capture;
mod cmd_controller;
mod cmd_dashboard;
mod cmd_decode;
mod cmd_demo;
mod cmd_exchange;
mod cmd_gen;
mod cmd_host;
mod cmd_node;
mod cmd_order;
mod cmd_plan;
mod cmd_replay;
mod cmd_sim;
mod cmd_snapshot;
mod cmd_stats;
mod demo_dashboard;
mod demo_report;
mod fmt;
mod log;

/// fairfeed: fair, fast market-data dissemination.
///
/// Generate, inspect and replay NASDAQ TotalView-ITCH 5.0 feeds over MoldUDP64.
#[derive(Parser)]
#[command(name = "fairfeed", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log events (what long-running commands start, serve, change and report at exit) as `text` or
    /// one JSON object per line; the filter is FAIRFEED_LOG (e.g. `warn`; default: fairfeed's events from `info`, other crates' from `warn`).
    #[arg(long, global = true, value_enum, default_value = "text", env = "FAIRFEED_LOG_FORMAT")]
    log_format: log::LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a realistic synthetic ITCH 5.0 feed (and optional impaired A/B lines) as pcap.
    Gen(cmd_gen::Args),
    /// Print a capture's MoldUDP64 packets and ITCH messages, with sequence tracking.
    Decode(cmd_decode::Args),
    /// Characterize a capture's workload: rates, packing, sizes, peaks, symbol burstiness.
    Stats(cmd_stats::Args),
    /// Send a capture's UDP payloads to an address with its own pacing or a fixed rate.
    Replay(cmd_replay::Args),
    /// Record the UDP datagrams arriving at an address as a pcap (what an application there would read).
    Capture(cmd_capture::Args),
    /// Merge redundant A/B lines: low-latency and high-reliability outputs, on captures or live UDP.
    Arb(Box<cmd_arb::Args>),
    /// Serve MoldUDP64 retransmission requests from a capture of the clean feed.
    RetransmitServer(cmd_arb::ServerArgs),
    /// Send a command to a running arbitrator's control socket and print the reply.
    Control(cmd_arb::ControlArgs),
    /// Follow an ITCH feed's books and serve GLIMPSE-style snapshots of them (late joiners start from one).
    SnapshotServer(cmd_snapshot::Args),
    /// Run a fair multicast tree on loopback beside direct unicast and report fairness and latency.
    Demo(Box<cmd_demo::Args>),
    /// Place nodes started with --controller at run time: joins, repair of dead proxies, hold-down.
    Controller(cmd_controller::Args),
    /// Run the sender of a fair multicast tree (one node per process).
    Sender(Box<cmd_node::SenderArgs>),
    /// Run a proxy of a fair multicast tree.
    Proxy(Box<cmd_node::ProxyArgs>),
    /// Run a receiver of a fair multicast tree; deliver to a local UDP port.
    Receiver(Box<cmd_node::ReceiverArgs>),
    /// The far end of a receiver's last hop (models 2, 3): a firm's host or enclave; echo probes, deliver, log arrivals.
    FirmHost(cmd_host::Args),
    /// Serve a live web page of a running tree: its shape, each node's health, fairness, latency CDFs.
    Dashboard(cmd_dashboard::Args),
    /// Print a running node's counters and histograms (from its --control address).
    Stat(cmd_node::StatArgs),
    /// Plan a fair multicast tree (fan-out, depth, sibling hedging) as TOML/JSON and DOT.
    Plan(cmd_plan::Args),
    /// Experiments in the deterministic simulator (fair multicast tree).
    #[command(subcommand)]
    Sim(cmd_sim::Sim),
    /// The exchange: matching engine, OUCH 5.0 gateway on SoupBinTCP, ITCH 5.0 on A/B lines; and its bench.
    Exchange(Box<cmd_exchange::Args>),
    /// Send an order to an OUCH 5.0 exchange by hand (buy, sell, cancel, replace) and print the answers.
    Order(Box<cmd_order::Args>),
    /// The arbitrated feed into NATS by service or symbol (seed 001 with a real broker).
    #[command(subcommand)]
    Bridge(cmd_bridge::BridgeCmd),
    /// Subscribe to the bridge's subjects: count, time from the bridge's tag, detect gaps.
    Subscribe(cmd_bridge::SubscribeArgs),
    /// End-to-end benchmarks, each with a baseline measured in the same run.
    #[command(subcommand)]
    Bench(cmd_bench::Bench),
    /// Every subcommand's flags and their value types, as JSON (for the bad-input tests).
    #[command(hide = true)]
    CliSpec,
}

/// One entry per subcommand (kind `command`) and per flag: the subcommand
/// path, the flag and its value type (`switch`, `float`, `signed`,
/// `unsigned` or `other`), and its help line.
fn cli_spec() -> anyhow::Result<()> {
    use clap::CommandFactory;
    use std::any::TypeId;
    fn walk(c: &clap::Command, path: &mut Vec<String>, out: &mut Vec<serde_json::Value>) {
        let about = c.get_about().map(|h| h.to_string()).unwrap_or_default();
        out.push(serde_json::json!({ "path": path, "flag": "", "kind": "command", "help": about }));
        for s in c.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            path.push(s.get_name().to_string());
            walk(s, path, out);
            path.pop();
        }
        for a in c.get_arguments() {
            let Some(long) = a.get_long() else { continue };
            let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            if !a.get_action().takes_values() {
                let flag = format!("--{long}");
                out.push(serde_json::json!({ "path": path, "flag": flag, "kind": "switch", "help": help }));
                continue;
            }
            let t = a.get_value_parser().type_id();
            let kind = if t == TypeId::of::<f64>() {
                "float"
            } else if t == TypeId::of::<i64>() || t == TypeId::of::<i32>() {
                "signed"
            } else if [
                TypeId::of::<u64>(),
                TypeId::of::<usize>(),
                TypeId::of::<u32>(),
                TypeId::of::<u16>(),
                TypeId::of::<u8>(),
            ]
            .iter()
            .any(|x| t == *x)
            {
                "unsigned"
            } else if t == TypeId::of::<std::net::SocketAddr>() {
                "address"
            } else {
                "other"
            };
            out.push(serde_json::json!({ "path": path, "flag": format!("--{long}"), "kind": kind, "help": help }));
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), &mut Vec::new(), &mut out);
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// Every option that takes a value accepts one starting with '-' as a number
/// (`--loss-a -0.5` gets "out of range", not "unexpected argument '-0'").
fn negatives_are_values(c: clap::Command) -> clap::Command {
    let c = c.mut_args(|a| {
        if a.get_action().takes_values() && !a.is_positional() {
            a.allow_negative_numbers(true)
        } else {
            a
        }
    });
    let names: Vec<String> = c.get_subcommands().map(|s| s.get_name().to_string()).collect();
    names.iter().fold(c, |c, n| c.mut_subcommand(n, negatives_are_values))
}

fn main() {
    use clap::{CommandFactory, FromArgMatches};
    let matches = negatives_are_values(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The README test checks the examples it does not run (minutes-long
    // benchmarks) this way: every flag and value parsed, nothing run.
    if std::env::var_os("FAIRFEED_PARSE_ONLY").is_some_and(|v| v == "1") {
        return;
    }
    if let Err(e) = log::init(cli.log_format) {
        eprintln!("fairfeed: error: {e:#}");
        std::process::exit(2);
    }
    let result = match cli.command {
        Command::Gen(a) => cmd_gen::run(a),
        Command::Decode(a) => cmd_decode::run(a),
        Command::Stats(a) => cmd_stats::run(a),
        Command::Replay(a) => cmd_replay::run(a),
        Command::Capture(a) => cmd_capture::run(a),
        Command::Arb(a) => cmd_arb::run(*a),
        Command::RetransmitServer(a) => cmd_arb::run_server(a),
        Command::SnapshotServer(a) => cmd_snapshot::run(a),
        Command::Control(a) => cmd_arb::run_control(a),
        Command::Bench(b) => cmd_bench::run(b),
        Command::Bridge(c) => cmd_bridge::run(c),
        Command::Exchange(a) => cmd_exchange::run(*a),
        Command::Order(a) => cmd_order::run(*a),
        Command::Subscribe(a) => cmd_bridge::run_subscribe(a),
        Command::Plan(a) => cmd_plan::run(a),
        Command::Controller(a) => cmd_controller::run_controller(a),
        Command::Sender(a) => cmd_node::run_sender(*a),
        Command::Proxy(a) => cmd_node::run_proxy(*a),
        Command::Receiver(a) => cmd_node::run_receiver(*a),
        Command::FirmHost(a) => cmd_host::run(a),
        Command::Stat(a) => cmd_node::run_stat(a),
        Command::Dashboard(a) => cmd_dashboard::run(a),
        Command::Demo(a) => cmd_demo::run(*a),
        Command::Sim(s) => cmd_sim::run(s),
        Command::CliSpec => cli_spec(),
    };
    if let Err(e) = result {
        if log::json() {
            tracing::error!(error = %format!("{e:#}"), "fairfeed: error: {e:#}");
        } else {
            eprintln!("fairfeed: error: {e:#}");
        }
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    /// clap's own consistency checks over every subcommand (two flags of one
    /// name, a `requires` naming nothing, …): release builds skip them.
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        fn walk(c: &clap::Command, path: &str) {
            let mut seen = std::collections::HashSet::new();
            for a in c.get_arguments() {
                if let Some(l) = a.get_long() {
                    assert!(seen.insert(l), "{path}: two flags named --{l}");
                }
            }
            for s in c.get_subcommands() {
                walk(s, &format!("{path} {}", s.get_name()));
            }
        }
        let c = super::Cli::command();
        walk(&c, "fairfeed");
        // clap's own checks, where the build has debug assertions (release builds skip them).
        c.debug_assert();
    }
}
