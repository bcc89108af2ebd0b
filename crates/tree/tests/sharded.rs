//! Goal: a feed sharded over K trees reaches every receiver as one
//! MoldUDP64 session — every message once, each symbol's messages in feed
//! order, market-wide messages after everything sent before them and before
//! everything sent after — and where every message was on time, every
//! receiver's delivered stream is the same, byte for byte. Method: the
//! planner's K-tree topology, the node state machines, an in-memory network
//! in virtual time with seeded random link delays, losses and late spikes,
//! and a random feed of ITCH-shaped messages over random stock locates
//! (locate 0: market-wide).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use fairfeed_clock::ClockSync;
use fairfeed_tree::node::{DeadlineRule, Node, NodeConfig, ReleaseOrder, Transmit};
use fairfeed_tree::plan::{hedge_parents, plan, PlanRequest};
use fairfeed_tree::sharded::{node_of, ShardOptions};
use fairfeed_wire::moldudp64::{Packet, PacketBuilder, Session};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// (delivery time, tie-break, destination, bytes)
type InFlight = Reverse<(u64, u64, u32, Vec<u8>)>;

/// How links behave.
#[derive(Debug, Clone, Copy)]
struct Links {
    /// Share of copies lost.
    loss: f64,
    /// Share of copies delayed by `spike_ns` (late at the receivers).
    spike: f64,
    spike_ns: u64,
}

struct Net {
    now: u64,
    queue: BinaryHeap<InFlight>,
    order: u64,
    rng: ChaCha8Rng,
    links: Links,
}

struct Tx<'a>(&'a mut Net);

impl Transmit for Tx<'_> {
    fn send(&mut self, to: u32, bytes: &[u8]) {
        let n = &mut *self.0;
        if n.rng.gen_bool(n.links.loss) {
            return;
        }
        let mut d = n.rng.gen_range(20_000..60_000);
        if n.rng.gen_bool(n.links.spike) {
            d += n.links.spike_ns;
        }
        n.order += 1;
        n.queue.push(Reverse((n.now + d, n.order, to, bytes.to_vec())));
    }
}

/// One message of the feed: (stock locate, a unique body).
fn message(locate: u16, id: u32) -> Vec<u8> {
    let mut m = vec![b'A'; 12];
    m[1..3].copy_from_slice(&locate.to_be_bytes());
    m[3..7].copy_from_slice(&id.to_be_bytes());
    m
}

fn feed_packet(seq: u64, msgs: &[Vec<u8>]) -> Vec<u8> {
    let mut buf = vec![0; 1400];
    let mut b = PacketBuilder::new(&mut buf, Session::from_str_padded("NASDAQ01"), seq).unwrap();
    for m in msgs {
        b.push(m).unwrap();
    }
    let n = b.finish();
    buf.truncate(n);
    buf
}

/// What each receiver delivered: its packets, in order.
struct Run {
    delivered: BTreeMap<u32, Vec<Vec<u8>>>,
    /// The feed, in order: (locate, id).
    feed: Vec<(u16, u32)>,
    late: u64,
    gaps: u64,
    /// Receivers that gave up a gap or a barrier: a tree that lost its copy
    /// of a market-wide message cannot know it was there, and may deliver
    /// what came after it first.
    lossy: Vec<u32>,
    /// Receivers where every message was on time and nothing was lost.
    clean: Vec<u32>,
}

fn run(trees: usize, hedge: usize, receivers: usize, packets: usize, links: Links, seed: u64) -> Run {
    let topo = plan(&PlanRequest { receivers, fanout: Some(4), depth: None, hedge, cost_model: None, trees }).unwrap();
    let cfg = NodeConfig {
        report_interval_ns: 2_000_000,
        initial_owd_ns: 400_000,
        order: ReleaseOrder::Sequence { gap_wait_ns: 3_000_000 },
        ..NodeConfig::default()
    };
    let hp: Vec<_> = (0..trees).map(|k| hedge_parents(&topo, k)).collect();
    let mut ids: Vec<u32> = topo.trees.iter().flat_map(|t| t.nodes.iter().map(|n| n.id)).collect();
    ids.sort_unstable();
    ids.dedup();
    let opts = ShardOptions::default();
    // A fixed deadline (the paper's rule with a margin), so "on time" is the links' doing.
    let rule = DeadlineRule::Paper { margin_ns: 200_000 };
    let mut nodes: BTreeMap<u32, Node> =
        ids.iter().map(|&id| (id, node_of(&topo, id, cfg, rule, ClockSync::off(id), &hp, &opts).unwrap())).collect();
    let sender = fairfeed_tree::plan::sender_id(&topo).unwrap();
    let mut net = Net { now: 0, queue: BinaryHeap::new(), order: 0, rng: ChaCha8Rng::seed_from_u64(seed), links };
    let mut feed_rng = ChaCha8Rng::seed_from_u64(seed ^ 0xfeed);
    let mut feed = Vec::new();
    let mut delivered: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    let (mut sent, mut next_send, mut seq) = (0, 0u64, 1u64);
    let end = packets as u64 * 50_000 + 60_000_000;
    while net.now < end {
        let t_deliver = net.queue.peek().map_or(u64::MAX, |Reverse((t, ..))| *t);
        let t_send = if sent < packets { next_send } else { u64::MAX };
        let t = t_deliver.min(t_send).min(net.now + 10_000);
        net.now = t;
        if t == t_send {
            let p = next_packet(&mut feed_rng, &mut feed, &mut seq);
            send_feed(nodes.get_mut(&sender), t, &p, &mut net);
            sent += 1;
            next_send += 50_000;
        }
        while net.queue.peek().is_some_and(|Reverse((d, ..))| *d <= t) {
            let Reverse((_, _, to, mut bytes)) = net.queue.pop().unwrap();
            if let Some(node) = nodes.get_mut(&to) {
                node.handle_packet(t, &mut bytes, &mut Tx(&mut net));
            }
        }
        for (id, node) in &mut nodes {
            if node.next_timeout().is_some_and(|due| due <= t) {
                node.handle_timeout(t, &mut Tx(&mut net));
            }
            while let Some(m) = node.poll_release() {
                delivered.entry(*id).or_default().push(m.payload.to_vec());
            }
        }
    }
    outcome(&nodes, delivered, feed)
}

/// The feed's next packet: 1-5 messages on random stock locates (3 % market-wide).
fn next_packet(rng: &mut ChaCha8Rng, feed: &mut Vec<(u16, u32)>, seq: &mut u64) -> Vec<u8> {
    let msgs: Vec<Vec<u8>> = (0..rng.gen_range(1..6))
        .map(|_| {
            let locate = if rng.gen_bool(0.03) { 0 } else { rng.gen_range(1..30) };
            feed.push((locate, feed.len() as u32));
            message(locate, feed.len() as u32 - 1)
        })
        .collect();
    let p = feed_packet(*seq, &msgs);
    *seq += msgs.len() as u64;
    p
}

fn send_feed(sender: Option<&mut Node>, t: u64, p: &[u8], net: &mut Net) {
    match sender {
        Some(Node::ShardSender(s)) => {
            s.handle_feed(t, p, &mut Tx(net)).unwrap();
        }
        // One tree: the feed's packets go down it as they are.
        Some(Node::Sender(s)) => {
            s.handle_message(t, p, &mut Tx(net));
        }
        _ => panic!("no sender"),
    }
}

fn outcome(nodes: &BTreeMap<u32, Node>, delivered: BTreeMap<u32, Vec<Vec<u8>>>, feed: Vec<(u16, u32)>) -> Run {
    let (mut late, mut gaps, mut lossy, mut clean) = (0, 0, Vec::new(), Vec::new());
    for n in nodes.values() {
        let (s, timeouts) = match n {
            Node::ShardReceiver(r) => (r.stats(), r.merge_stats().barrier_timeouts),
            Node::Receiver(r) => (r.stats.clone(), 0),
            _ => continue,
        };
        late += s.late + s.held_by_gap;
        gaps += s.gaps;
        if s.gaps + timeouts > 0 {
            lossy.push(n.id());
        }
        if s.gaps + timeouts + s.late + s.held_by_gap == 0 {
            clean.push(n.id());
        }
    }
    Run { delivered, feed, late, gaps, lossy, clean }
}

/// A receiver's delivered messages as (locate, id), checking the session is
/// one gap-free line (what was lost skipped in the numbering).
fn messages_of(packets: &[Vec<u8>]) -> Vec<(u16, u32)> {
    let mut out = Vec::new();
    let mut next = 1;
    for p in packets {
        let p = Packet::new_checked(&p[..]).unwrap();
        assert!(matches!(p.session().as_str(), Some("NASDAQ0MRG" | "NASDAQ01")), "{:?}", p.session());
        assert!(p.sequence() >= next, "numbering went back: {} after {next}", p.sequence());
        next = p.next_sequence();
        for m in p.messages() {
            let m = m.unwrap();
            out.push((u16::from_be_bytes([m[1], m[2]]), u32::from_be_bytes([m[3], m[4], m[5], m[6]])));
        }
    }
    out
}

/// Every receiver: each message at most once, each symbol in feed order,
/// market-wide messages after all before them and before all after them
/// (where the receiver lost nothing for good).
fn check(r: &Run, complete: bool) {
    assert!(!r.delivered.is_empty());
    for (id, packets) in &r.delivered {
        let got = messages_of(packets);
        let mut seen = vec![false; r.feed.len()];
        for &(_, m) in &got {
            assert!(!std::mem::replace(&mut seen[m as usize], true), "receiver {id}: message {m} twice");
        }
        if complete {
            assert_eq!(got.len(), r.feed.len(), "receiver {id} missed messages");
        }
        let mut last: HashMap<u16, u32> = HashMap::new();
        for &(locate, m) in got.iter().filter(|(l, _)| *l != 0) {
            if let Some(prev) = last.insert(locate, m) {
                assert!(prev < m, "receiver {id}: symbol {locate} out of order ({prev} then {m})");
            }
        }
        if !r.lossy.contains(id) {
            for (i, &(locate, m)) in got.iter().enumerate() {
                if locate == 0 {
                    assert!(
                        got[..i].iter().all(|&(_, x)| x < m),
                        "receiver {id}: a message sent after {m} came before it"
                    );
                    assert!(
                        got[i + 1..].iter().all(|&(_, x)| x > m),
                        "receiver {id}: a message sent before {m} came after it"
                    );
                }
            }
        }
    }
}

#[test]
fn on_time_feeds_are_the_same_byte_for_byte_at_every_receiver() {
    for trees in [1, 2, 4, 8] {
        let links = Links { loss: 0.0, spike: 0.0, spike_ns: 0 };
        let r = run(trees, 1, 24, 400, links, 7);
        check(&r, true);
        assert_eq!(r.late, 0);
        let first = r.delivered.values().next().unwrap();
        if trees > 1 {
            assert!(r.delivered.values().all(|d| d == first), "{trees} trees: receivers' streams differ");
        }
        assert_eq!(r.delivered.len(), 24);
    }
}

#[test]
fn hedging_covers_lost_copies_on_every_tree() {
    let links = Links { loss: 0.02, spike: 0.0, spike_ns: 0 };
    let r = run(4, 2, 24, 400, links, 11);
    check(&r, false);
    assert_eq!(r.gaps, 0, "two hedged paths per receiver cover 2 % loss");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Losses, late copies and lost paths in any mix: never a message
    /// twice, never a symbol out of order, never a barrier crossed.
    #[test]
    fn any_mix_of_loss_and_lateness_keeps_each_symbol_in_order(
        trees in 1usize..7,
        hedge in 0usize..2,
        loss in 0.0f64..0.08,
        spike in 0.0f64..0.05,
        seed in 0u64..1_000,
    ) {
        let r = run(trees, hedge, 12, 150, Links { loss, spike, spike_ns: 700_000 }, seed);
        check(&r, false);
        // Receivers where everything was on time delivered the same stream.
        // A receiver that lost the feed's last packets on every path saw no
        // gap (nothing came after them to show one) and nothing late, yet
        // missed them: it is not one of these (seed 94 at one tree found
        // it). On the live path the sender's heartbeats reveal such a loss.
        let whole = |d: &&Vec<Vec<u8>>| messages_of(d).len() == r.feed.len();
        let clean: Vec<&Vec<Vec<u8>>> = r.clean.iter().filter_map(|id| r.delivered.get(id)).filter(whole).collect();
        for d in &clean {
            prop_assert!(*d == clean[0], "two receivers with every message on time differ");
        }
    }
}

/// A receiver of several trees passes over the trees with nothing due when
/// its timer fires (their state is not even read): the trees that then get
/// no data must still report every interval, and every message must still
/// be released at its deadline, whichever tree it came on.
#[test]
fn quiet_trees_still_report_every_interval_and_release_on_time() {
    let trees = 3;
    let topo = plan(&PlanRequest { receivers: 2, fanout: Some(4), depth: None, hedge: 0, cost_model: None, trees })
        .expect("plan");
    let cfg = NodeConfig { report_interval_ns: 1_000_000, initial_owd_ns: 100_000, ..NodeConfig::default() };
    let hp: Vec<_> = (0..trees).map(|k| hedge_parents(&topo, k)).collect();
    // Links take 20-60 µs: a 50-µs margin over the reported delays keeps every copy on time.
    let rule = DeadlineRule::Paper { margin_ns: 50_000 };
    let opts = ShardOptions::default();
    let build = |id| node_of(&topo, id, cfg, rule, ClockSync::off(id), &hp, &opts).expect("node");
    let sender_id = fairfeed_tree::plan::sender_id(&topo).expect("a sender");
    let rx_id = topo.trees[0].nodes.iter().find(|n| n.role == fairfeed_tree::plan::Role::Receiver).expect("rx").id;
    let mut nodes: BTreeMap<u32, Node> = [(sender_id, build(sender_id)), (rx_id, build(rx_id))].into();
    let links = Links { loss: 0.0, spike: 0.0, spike_ns: 0 };
    let mut net = Net { now: 0, queue: BinaryHeap::new(), order: 0, rng: ChaCha8Rng::seed_from_u64(7), links };
    let (step, quiet_from, end) = (10_000u64, 5_000_000u64, 20_000_000u64);
    let (mut seq, mut id) = (1u64, 0u32);
    let mut reports_after_quiet = [0u32; 3];
    let mut delivered = Vec::new();
    for t in (0..=end).step_by(step as usize) {
        net.now = t;
        if t % 50_000 == 0 && t + 2_000_000 < end {
            // Locates 1, 2, 3 ride trees 1, 2, 0; once quiet, only locate 3 (tree 0).
            let locates: &[u16] = if t < quiet_from { &[1, 2, 3] } else { &[3] };
            let msgs: Vec<Vec<u8>> = locates.iter().map(|&l| (message(l, id), id += 1).0).collect();
            send_feed(nodes.get_mut(&sender_id), t, &feed_packet(seq, &msgs), &mut net);
            seq += msgs.len() as u64;
        }
        while net.queue.peek().is_some_and(|Reverse((d, ..))| *d <= t) {
            let Reverse((_, _, to, mut bytes)) = net.queue.pop().expect("peeked");
            let report = fairfeed_wire::overlay::HeaderRepr::parse(&bytes)
                .is_ok_and(|(h, _)| h.kind == Some(fairfeed_wire::overlay::Kind::Report));
            if report && to == sender_id && t >= quiet_from + cfg.report_interval_ns + 100_000 {
                let tree = fairfeed_wire::overlay::HeaderRepr::parse(&bytes).expect("parsed").0.tree;
                reports_after_quiet[usize::from(tree)] += 1;
            }
            if let Some(node) = nodes.get_mut(&to) {
                node.handle_packet(t, &mut bytes, &mut Tx(&mut net));
            }
        }
        for node in nodes.values_mut() {
            if node.next_timeout().is_some_and(|due| due <= t) {
                node.handle_timeout(t, &mut Tx(&mut net));
            }
        }
        while let Some(m) = nodes.get_mut(&rx_id).and_then(Node::poll_release) {
            assert!(!m.late, "nothing arrives late");
            assert!(m.deadline_ns <= t && t < m.deadline_ns + step, "released at {t}, deadline {}", m.deadline_ns);
            delivered.push(m.payload.to_vec());
        }
    }
    let got = messages_of(&delivered);
    assert_eq!(got.len(), id as usize, "every message once");
    // At least 13 of the 14 whole intervals after the quiet trees' last data: a report each, on every tree.
    for (tree, n) in reports_after_quiet.iter().enumerate() {
        assert!(*n >= 13, "tree {tree} sent {n} reports in 14 intervals");
    }
}
