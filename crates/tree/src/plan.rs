//! The tree planner: from N receivers, a fan-out F and depth D (or the paper's
//! heuristic, or a linear cost model) and a hedging factor H, the overlay
//! topology every node of a deployment reads.
//!
//! Layers follow Jasper's figure 3: the sender, proxy layers 0..D−2, and the
//! receivers as layer D−1. Layer j holds up to F^(j+1) proxies (fewer when N
//! needs fewer), each node's children are a contiguous block of the next layer
//! (child c of a layer of size s' under a layer of size s has parent
//! ⌊c·s/s'⌋, which is Jasper's ⌊c/F⌋ for full layers), and receivers are
//! spread evenly over the last proxy layer.
//!
//! **Sibling hedging:** a proxy at index p of its layer also sends to the
//! children of its H next siblings p+1..p+H (wrapping around the layer), so a
//! node below layer 0 hears from its parent and its parent's H previous
//! siblings — H+1 copies over distinct parents whenever the layer has H+1
//! nodes (Jasper's recursion L(S, P_i^n) = min_j …P^{n−1}_{⌊i/F⌋−j}…).
//! Each proxy sends at most F + H·F copies of a message.

use serde::{Deserialize, Serialize};

/// Receivers a plan may have (the simulator's scale target is 10,000).
pub const RECEIVERS_MAX: usize = 100_000;
/// Largest fan-out accepted: as many as receivers, since direct unicast (the
/// baseline) is a depth-1 tree whose sender fans out to every receiver.
pub const FANOUT_MAX: usize = RECEIVERS_MAX;
/// Deepest tree accepted (layers including the receivers).
pub const DEPTH_MAX: usize = 8;
/// Trees sharing the same receivers at most.
pub const TREES_MAX: usize = 64;

/// What to plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// Receivers N.
    pub receivers: usize,
    /// Fan-out F (`None`: chosen).
    pub fanout: Option<usize>,
    /// Depth D (`None`: chosen).
    pub depth: Option<usize>,
    /// Hedging H: each proxy also sends to the children of H siblings.
    pub hedge: usize,
    /// Choose D (and F) by a linear latency model instead of the heuristic.
    pub cost_model: Option<CostModel>,
    /// Trees sharing the receivers; symbols are sharded across them.
    pub trees: usize,
}

/// Jasper §4: each extra layer adds a hop (≈ 30 µs in their cloud), each extra
/// copy a proxy sends adds a serialization cost (≈ 2.7 µs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// One hop's latency, ns.
    pub hop_ns: f64,
    /// One extra copy's serialization cost, ns.
    pub copy_ns: f64,
}

impl CostModel {
    /// The paper's figures.
    pub const JASPER: CostModel = CostModel { hop_ns: 30_000.0, copy_ns: 2_700.0 };

    /// Estimated worst-case latency of a tree of depth `d` and fan-out `f`.
    pub fn estimate_ns(&self, d: usize, f: usize) -> f64 {
        d as f64 * (self.hop_ns + f as f64 * self.copy_ns)
    }
}

/// A node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The tree's root.
    Sender,
    /// An inner node.
    Proxy,
    /// A leaf (shared by every tree).
    Receiver,
}

/// One node of one tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Its id (the same in every tree for a receiver).
    pub id: u32,
    /// Its role.
    pub role: Role,
    /// −1 for the sender; 0.. for proxies; depth−1 for receivers.
    pub layer: i32,
    /// Index within its layer.
    pub index: u32,
    /// Its parent (`None` for the sender).
    pub parent: Option<u32>,
    /// Its children.
    pub children: Vec<u32>,
    /// The children of the H siblings this node hedges for.
    pub hedge_targets: Vec<u32>,
    /// Where the node listens (filled by deployments; `fairfeed demo` assigns loopback addresses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// Where the node answers `fairfeed stat` (its `--control`, when the
    /// command line gives none); `fairfeed stat --topology` asks every node here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<String>,
}

/// One tree: its sender and proxies; receivers are shared by all trees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tree {
    /// Its id (0..trees).
    pub id: u16,
    /// Its nodes.
    pub nodes: Vec<Node>,
}

/// The plan every node reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Receivers N.
    pub receivers: usize,
    /// Fan-out F.
    pub fanout: usize,
    /// Depth D.
    pub depth: usize,
    /// Hedging H.
    pub hedge: usize,
    /// How symbols map to trees: stock locate modulo the number of trees.
    pub sharding: String,
    /// Receiver node ids (the same in every tree).
    pub receiver_ids: Vec<u32>,
    /// The trees (one unless sharded).
    pub trees: Vec<Tree>,
}

/// Why a request cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError(pub String);

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlanError {}

fn err<T>(s: impl Into<String>) -> Result<T, PlanError> {
    Err(PlanError(s.into()))
}

/// Smallest f with f^d ≥ n.
fn fanout_for(n: usize, d: usize) -> usize {
    let mut f = (n as f64).powf(1.0 / d as f64).floor().max(1.0) as usize;
    while f.saturating_pow(d as u32) < n {
        f += 1;
    }
    f
}

/// Picks (depth, fan-out) for a request.
pub fn shape(req: &PlanRequest) -> Result<(usize, usize), PlanError> {
    let n = req.receivers;
    if n == 0 || n > RECEIVERS_MAX {
        return err(format!("--receivers must be 1..={RECEIVERS_MAX}, got {n}"));
    }
    // Checked before any search below: a depth of 0 never reaches N (it once spun for ever).
    if let Some(d) = req.depth.filter(|&d| d == 0 || d > DEPTH_MAX) {
        return err(format!("--depth must be 1..={DEPTH_MAX}, got {d}"));
    }
    if let Some(f) = req.fanout.filter(|&f| f == 0 || f > FANOUT_MAX) {
        return err(format!("--fanout must be 1..={FANOUT_MAX}, got {f}"));
    }
    if let Some(m) = req.cost_model {
        if !(m.hop_ns.is_finite() && m.hop_ns >= 0.0 && m.copy_ns.is_finite() && m.copy_ns >= 0.0) {
            return err(format!("cost model: hop and copy costs must be finite and not negative, got {m:?}"));
        }
    }
    let (d, f) = match (req.depth, req.fanout, req.cost_model) {
        (Some(d), Some(f), _) => (d, f),
        (Some(d), None, _) => (d, fanout_for(n, d)),
        (None, Some(f), _) => {
            if f < 2 && n > 1 {
                return err("--fanout must be at least 2 when --depth is not given");
            }
            let mut d = 1;
            while f.saturating_pow(d as u32) < n {
                d += 1;
            }
            (d, f)
        }
        (None, None, Some(m)) => (1..=DEPTH_MAX)
            .map(|d| (d, fanout_for(n, d)))
            .filter(|&(_, f)| f <= FANOUT_MAX.min(1_024))
            .min_by(|a, b| m.estimate_ns(a.0, a.1).total_cmp(&m.estimate_ns(b.0, b.1)))
            .unwrap_or((1, n)),
        // Jasper's heuristic: F = 10, D = ⌈log10 N⌉ (at least 1).
        (None, None, None) => {
            let mut d = 1;
            while 10usize.saturating_pow(d as u32) < n {
                d += 1;
            }
            (d, 10)
        }
    };
    if d == 0 || d > DEPTH_MAX {
        return err(format!("--depth must be 1..={DEPTH_MAX}, got {d}"));
    }
    if f == 0 || f > FANOUT_MAX {
        return err(format!("--fanout must be 1..={FANOUT_MAX}, got {f}"));
    }
    if f.saturating_pow(d as u32) < n {
        return err(format!(
            "a tree of fan-out {f} and depth {d} reaches {} receivers, fewer than {n}",
            f.pow(d as u32)
        ));
    }
    Ok((d, f))
}

/// Builds the topology.
/// One tree's nodes: the sender `sender`, proxy layers of `sizes` (ids
/// from `next_id` on) and the receivers, each child under the parent its
/// position maps to.
fn layers(sizes: &[usize], receiver_ids: &[u32], sender: u32, next_id: &mut u32) -> Vec<Node> {
    let n = receiver_ids.len();
    let mut nodes = vec![Node {
        id: sender,
        role: Role::Sender,
        layer: -1,
        index: 0,
        parent: None,
        children: vec![],
        hedge_targets: vec![],
        addr: None,
        control: None,
    }];
    // Layer ids: previous layer's ids, to link parents and children.
    let mut prev: Vec<u32> = vec![sender];
    let mut prev_node_idx: Vec<usize> = vec![0];
    for (j, layer_size) in sizes.iter().copied().chain(std::iter::once(n)).enumerate() {
        let is_receivers = j == sizes.len();
        let ids: Vec<u32> = if is_receivers {
            receiver_ids.to_vec()
        } else {
            let ids = (*next_id..*next_id + layer_size as u32).collect();
            *next_id += layer_size as u32;
            ids
        };
        let mut idxs = Vec::with_capacity(ids.len());
        for (c, &id) in ids.iter().enumerate() {
            let p = c * prev.len() / layer_size;
            nodes[prev_node_idx[p]].children.push(id);
            idxs.push(nodes.len());
            nodes.push(Node {
                id,
                role: if is_receivers { Role::Receiver } else { Role::Proxy },
                layer: j as i32,
                index: c as u32,
                parent: Some(prev[p]),
                children: vec![],
                hedge_targets: vec![],
                addr: None,
                control: None,
            });
        }
        prev = ids;
        prev_node_idx = idxs;
    }
    nodes
}

/// Sibling hedging, layer by layer over the `proxy_layers` proxy layers (the
/// sender has no siblings): each proxy also serves the children of its `h` next siblings.
fn hedge(nodes: &mut [Node], proxy_layers: usize, h: usize) {
    for layer in 0..proxy_layers as i32 {
        let members: Vec<usize> = (0..nodes.len()).filter(|&i| nodes[i].layer == layer).collect();
        let s = members.len();
        for (p, &i) in members.iter().enumerate() {
            let mut targets = Vec::new();
            for k in 1..=h.min(s.saturating_sub(1)) {
                let sib = members[(p + k) % s];
                targets.extend(nodes[sib].children.iter().copied());
            }
            nodes[i].hedge_targets = targets;
        }
    }
}

/// Plans the trees `req` asks for (F and D chosen where not given); a request no tree can meet is refused.
pub fn plan(req: &PlanRequest) -> Result<Topology, PlanError> {
    let (depth, fanout) = shape(req)?;
    let n = req.receivers;
    if req.trees == 0 || req.trees > TREES_MAX {
        return err(format!("--trees must be 1..={TREES_MAX}, got {}", req.trees));
    }
    if req.hedge > fanout.max(1) * 4 {
        return err(format!("--hedge {} is far beyond the fan-out {fanout}; use at most {}", req.hedge, fanout * 4));
    }
    // Proxy layer sizes: F^(j+1), capped so the last proxy layer has at most N nodes.
    let mut sizes: Vec<usize> = (0..depth - 1).map(|j| fanout.pow(j as u32 + 1)).collect();
    let mut cap = n;
    for s in sizes.iter_mut().rev() {
        *s = (*s).min(cap);
        cap = cap.div_ceil(fanout).max(1);
    }
    let receiver_ids: Vec<u32> = (0..n as u32).collect();
    // One sender for every tree (one feed in, K trees out), then each tree's proxies.
    let sender = n as u32;
    let mut next_id = sender + 1;
    let mut trees = Vec::with_capacity(req.trees);
    for t in 0..req.trees {
        let mut nodes = layers(&sizes, &receiver_ids, sender, &mut next_id);
        hedge(&mut nodes, sizes.len(), req.hedge);
        trees.push(Tree { id: t as u16, nodes });
    }
    let topo = Topology {
        receivers: n,
        fanout,
        depth,
        hedge: req.hedge,
        sharding: "stock_locate % trees; stock locate 0 on every tree".into(),
        receiver_ids,
        trees,
    };
    validate(&topo)?;
    Ok(topo)
}

/// The share of one send queue the busiest proxy, and the sender, spend
/// sending copies at `rate` messages per second in all (spread evenly over
/// the trees), `copy_ns` per copy: the sender's on one queue for all its
/// trees (`sender`) or on a queue per tree (`sender_per_tree`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Loads {
    /// Share of its queue the busiest proxy spends sending copies.
    pub proxy: f64,
    /// The sender's, every tree on one queue.
    pub sender: f64,
    /// The sender's busiest queue, a queue per tree.
    pub sender_per_tree: f64,
}

/// The queue shares (`Loads`) of topology `t` at `rate` messages per second, `copy_ns` per copy.
pub fn loads(t: &Topology, rate: f64, copy_ns: f64) -> Loads {
    let per_tree = rate / t.trees.len().max(1) as f64 * copy_ns * 1e-9;
    let copies = |n: &Node| (n.children.len() + n.hedge_targets.len()) as f64;
    let nodes = || t.trees.iter().flat_map(|tr| &tr.nodes);
    let proxy = nodes().filter(|n| n.role == Role::Proxy).map(copies).fold(0.0, f64::max);
    let sender: Vec<f64> = nodes().filter(|n| n.role == Role::Sender).map(copies).collect();
    Loads {
        proxy: proxy * per_tree,
        sender: sender.iter().sum::<f64>() * per_tree,
        sender_per_tree: sender.iter().copied().fold(0.0, f64::max) * per_tree,
    }
}

/// The fewest trees (of the shape `req` plans) that keep the busiest proxy
/// at or below `load_max` at `rate` messages per second in all, `copy_ns`
/// per copy. The sender's own load does not fall with more trees on one
/// send queue (see [`loads`]).
pub fn trees_for_rate(req: &PlanRequest, rate: f64, copy_ns: f64, load_max: f64) -> Result<usize, PlanError> {
    if !(rate.is_finite() && rate > 0.0 && copy_ns.is_finite() && copy_ns >= 0.0 && load_max > 0.0) {
        return err(format!("rate {rate}, copy cost {copy_ns} ns and load limit {load_max} must be positive"));
    }
    let one = plan(&PlanRequest { trees: 1, ..req.clone() })?;
    let k = (loads(&one, rate, copy_ns).proxy / load_max).ceil().max(1.0);
    if k > TREES_MAX as f64 {
        return err(format!(
            "{rate} msg/s needs {k} trees to keep each proxy at {load_max} load, more than {TREES_MAX}: a smaller fan-out \
             (--fanout) or a faster copy"
        ));
    }
    Ok(k as usize)
}

/// Tree of a symbol: stock locate modulo the number of trees.
pub fn tree_for_locate(locate: u16, trees: usize) -> usize {
    usize::from(locate) % trees.max(1)
}

/// Checks a topology is one the nodes can run — whether `plan` made it or
/// a person edited it — and names the first fault: every tree has one
/// sender and unique node ids; every other node a parent that lists it as a
/// child, one layer up; copies flow only one layer down (so no packet can
/// loop), to nodes that exist, never to the sender; receivers are exactly
/// the topology's receivers, send nothing and hear from H + 1 parents where
/// the layer above allows; addresses are `HOST:PORT` with a real port, one
/// node each.
pub fn validate(t: &Topology) -> Result<(), PlanError> {
    use std::collections::HashSet;
    if t.trees.is_empty() {
        return err("the topology has no tree");
    }
    if t.trees.len() > TREES_MAX {
        return err(format!("{} trees, more than {TREES_MAX}", t.trees.len()));
    }
    if !(1..=DEPTH_MAX).contains(&t.depth) || t.fanout == 0 || t.fanout > FANOUT_MAX {
        return err(format!(
            "depth {} / fan-out {} out of range (1..={DEPTH_MAX} / 1..={FANOUT_MAX})",
            t.depth, t.fanout
        ));
    }
    let receivers: HashSet<u32> = t.receiver_ids.iter().copied().collect();
    if receivers.len() != t.receiver_ids.len() {
        return err("receiver_ids lists a receiver twice");
    }
    for tree in &t.trees {
        validate_tree(t, tree, &receivers)?;
    }
    validate_across(t)
}

/// What sharding needs of the trees together: ids 0..K in order, one sender
/// for all (it splits the one feed), and each proxy in one tree only (a
/// proxy process runs one tree).
fn validate_across(t: &Topology) -> Result<(), PlanError> {
    let mut sender = None;
    let mut proxies: std::collections::HashMap<u32, u16> = std::collections::HashMap::new();
    for (k, tree) in t.trees.iter().enumerate() {
        if usize::from(tree.id) != k {
            return err(format!("tree {} is entry {k} of [[trees]]; tree ids run 0, 1, … in order", tree.id));
        }
        for n in &tree.nodes {
            match n.role {
                Role::Sender => match sender {
                    None => sender = Some(n.id),
                    Some(s) if s != n.id => {
                        return err(format!(
                            "tree {k}'s sender is node {}, tree 0's is node {s}: one sender splits the feed over every tree",
                            n.id
                        ))
                    }
                    Some(_) => {}
                },
                Role::Proxy => {
                    if let Some(other) = proxies.insert(n.id, tree.id) {
                        return err(format!("node {} is a proxy of trees {other} and {k}; a proxy serves one tree", n.id));
                    }
                }
                Role::Receiver => {}
            }
        }
    }
    Ok(())
}

/// The topology's one sender (every tree's).
pub fn sender_id(t: &Topology) -> Option<u32> {
    t.trees.first()?.nodes.iter().find(|n| n.role == Role::Sender).map(|n| n.id)
}

/// Node `id`'s role and the trees it is in (its entry in each).
pub fn node_in_trees(t: &Topology, id: u32) -> Vec<(u16, &Node)> {
    t.trees.iter().filter_map(|tr| tr.nodes.iter().find(|n| n.id == id).map(|n| (tr.id, n))).collect()
}

/// What the per-node checks learn of a tree's edges.
#[derive(Default)]
struct Edges {
    /// Every copy a node sends: (from, to).
    sends: std::collections::HashSet<(u32, u32)>,
    /// Parent → child edges alone.
    children: std::collections::HashSet<(u32, u32)>,
    layer_size: std::collections::HashMap<i32, usize>,
}

fn validate_tree(t: &Topology, tree: &Tree, receivers: &std::collections::HashSet<u32>) -> Result<(), PlanError> {
    use std::collections::HashMap;
    let tid = tree.id;
    let mut by_id: HashMap<u32, &Node> = HashMap::with_capacity(tree.nodes.len());
    for n in &tree.nodes {
        if by_id.insert(n.id, n).is_some() {
            return err(format!("tree {tid}: node id {} appears twice", n.id));
        }
    }
    let senders: Vec<u32> = tree.nodes.iter().filter(|n| n.role == Role::Sender).map(|n| n.id).collect();
    match senders.as_slice() {
        [_] => {}
        [] => return err(format!("tree {tid}: no sender")),
        many => return err(format!("tree {tid}: {} senders (nodes {many:?}); a tree has one", many.len())),
    }
    let edges = check_nodes(t, tree, &by_id, receivers)?;
    check_parents(t, tree, &by_id, &edges)?;
    for &r in &t.receiver_ids {
        if !by_id.contains_key(&r) {
            return err(format!("tree {tid}: receiver {r} is not in the tree"));
        }
    }
    Ok(())
}

/// Each node's role, layer, copies and address on its own.
fn check_nodes(
    t: &Topology,
    tree: &Tree,
    by_id: &std::collections::HashMap<u32, &Node>,
    receivers: &std::collections::HashSet<u32>,
) -> Result<Edges, PlanError> {
    let tid = tree.id;
    let mut addrs: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
    let mut e = Edges::default();
    for n in &tree.nodes {
        *e.layer_size.entry(n.layer).or_default() += 1;
        if (n.role == Role::Receiver) != receivers.contains(&n.id) {
            return err(format!("tree {tid}: node {} is a {:?} but receiver_ids says otherwise", n.id, n.role));
        }
        if (n.role == Role::Sender) != (n.layer == -1) {
            return err(format!(
                "tree {tid}: node {} is a {:?} on layer {} (the sender alone is on layer -1)",
                n.id, n.role, n.layer
            ));
        }
        if n.role == Role::Receiver && !(n.children.is_empty() && n.hedge_targets.is_empty()) {
            return err(format!("tree {tid}: receiver {} sends copies; receivers send none", n.id));
        }
        let sends = n.children.len() + n.hedge_targets.len();
        if sends > t.fanout + t.hedge * t.fanout {
            return err(format!("tree {tid}: node {} sends {sends} copies, more than F + H·F", n.id));
        }
        e.children.extend(n.children.iter().map(|&c| (n.id, c)));
        for &c in n.children.iter().chain(&n.hedge_targets) {
            let Some(to) = by_id.get(&c) else {
                return err(format!("tree {tid}: node {} sends to unknown node {c}", n.id));
            };
            if to.layer != n.layer + 1 {
                // Copies only flow down one layer: no packet can come back to a node it left.
                return err(format!(
                    "tree {tid}: node {} (layer {}) sends to node {c} (layer {}): copies go one layer down, never \
                     sideways, up or back (a cycle would loop packets)",
                    n.id, n.layer, to.layer
                ));
            }
            if !e.sends.insert((n.id, c)) {
                return err(format!("tree {tid}: node {} sends to node {c} twice", n.id));
            }
        }
        for (what, a) in [("address", &n.addr), ("control address", &n.control)] {
            let Some(a) = a else { continue };
            let hp = crate::addr::HostPort::parse(a, false)
                .map_err(|e| PlanError(format!("tree {tid}: node {}'s {what}: {e}", n.id)))?;
            if let Some(other) = addrs.insert(hp.to_string(), n.id) {
                return err(format!("tree {tid}: nodes {other} and {} share the address {hp}", n.id));
            }
        }
    }
    Ok(e)
}

/// Every node but the sender has a parent that lists it, and hears from H + 1
/// parents where the layer above allows.
fn check_parents(
    t: &Topology,
    tree: &Tree,
    by_id: &std::collections::HashMap<u32, &Node>,
    e: &Edges,
) -> Result<(), PlanError> {
    let tid = tree.id;
    for n in tree.nodes.iter().filter(|n| n.role != Role::Sender) {
        let Some(p) = n.parent else {
            return err(format!("tree {tid}: {:?} {} has no parent", n.role, n.id));
        };
        let Some(parent) = by_id.get(&p).copied() else {
            return err(format!("tree {tid}: node {}'s parent {p} is not in the tree", n.id));
        };
        if parent.id == n.id || !e.children.contains(&(p, n.id)) {
            return err(format!("tree {tid}: node {}'s parent {p} does not list it as a child", n.id));
        }
    }
    let mut senders_of: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    for &(_, to) in &e.sends {
        *senders_of.entry(to).or_default() += 1;
    }
    for n in tree.nodes.iter().filter(|n| n.layer > 0) {
        let layer_above = e.layer_size.get(&(n.layer - 1)).copied().unwrap_or(0);
        let want = (t.hedge + 1).min(layer_above);
        let got = senders_of.get(&n.id).copied().unwrap_or(0);
        if got < want {
            return err(format!("tree {tid}: node {} hears from {got} parents, expected {want}", n.id));
        }
    }
    Ok(())
}

/// Graphviz DOT of one tree: layers on ranks in index order, solid edges to
/// children, dotted hedging edges (which do not move the layout).
pub fn to_dot(t: &Topology, tree: usize) -> String {
    let mut s = String::from("digraph fairfeed {\n  rankdir=TB; ordering=out; nodesep=0.15;\n  node [shape=circle, fontsize=9, width=0.4, fixedsize=true];\n");
    let Some(tr) = t.trees.get(tree) else { return s + "}\n" };
    let max_layer = tr.nodes.iter().map(|n| n.layer).max().unwrap_or(-1);
    for layer in -1..=max_layer {
        let mut members: Vec<&Node> = tr.nodes.iter().filter(|n| n.layer == layer).collect();
        members.sort_by_key(|n| n.index);
        s.push_str("  { rank=same;");
        for n in &members {
            let (shape, label) = match n.role {
                Role::Sender => ("doublecircle", "S".to_string()),
                Role::Proxy => ("circle", format!("P{}.{}", n.layer, n.index)),
                Role::Receiver => ("box", format!("R{}", n.index)),
            };
            s.push_str(&format!(" n{} [shape={shape}, label=\"{label}\"];", n.id));
        }
        s.push_str(" }\n");
        // Invisible edges keep each layer in index order.
        for w in members.windows(2) {
            s.push_str(&format!("  n{} -> n{} [style=invis];\n", w[0].id, w[1].id));
        }
    }
    for n in &tr.nodes {
        for c in &n.children {
            s.push_str(&format!("  n{} -> n{};\n", n.id, c));
        }
        for c in &n.hedge_targets {
            s.push_str(&format!("  n{} -> n{} [style=dotted, color=gray50, constraint=false];\n", n.id, c));
        }
    }
    s.push_str("}\n");
    s
}

/// The nodes that hedge for each node of tree `tree` (send it copies beside its parent).
pub fn hedge_parents(t: &Topology, tree: usize) -> std::collections::BTreeMap<u32, Vec<u32>> {
    let mut out: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    if let Some(tr) = t.trees.get(tree) {
        for n in &tr.nodes {
            for &h in &n.hedge_targets {
                out.entry(h).or_default().push(n.id);
            }
        }
    }
    out
}

/// The clock-synchronization probe graph of tree `tree`: every node's peers
/// (its parent, the proxies that hedge for it, `random` random nodes of the
/// tree; symmetric). A pure function of the topology and `seed`, so every node
/// process computes the same graph from the topology file.
pub fn probe_graph(t: &Topology, tree: usize, random: usize, seed: u64) -> std::collections::BTreeMap<u32, Vec<u32>> {
    fairfeed_clock::graph::peers(&probe_members(t, tree), random, seed)
}

/// Every node's probe peers with how often each edge is probed (see
/// [`fairfeed_clock::graph::strides`]): what [`fairfeed_clock::ClockSync::set_strides`] takes.
pub fn probe_strides(
    t: &Topology,
    tree: usize,
    graph: &std::collections::BTreeMap<u32, Vec<u32>>,
    budget: usize,
) -> std::collections::BTreeMap<u32, Vec<(u32, u32)>> {
    fairfeed_clock::graph::strides(&probe_members(t, tree), graph, budget)
}

/// Every node's parent edges (and the reference's children's sibling
/// edges) with the pairs per interval each is probed (see
/// [`fairfeed_clock::graph::rates`]): what [`fairfeed_clock::ClockSync::set_rates`] takes.
pub fn probe_rates(t: &Topology, tree: usize, rate_max: u32) -> std::collections::BTreeMap<u32, Vec<(u32, u32)>> {
    fairfeed_clock::graph::rates(&probe_members(t, tree), rate_max)
}

/// Every node's probe peers, strides and rates over all the trees: on one
/// tree what [`probe_graph`], [`probe_strides`] and [`probe_rates`] give;
/// over several, tree 0's for the receivers (a host has one clock, synchronized
/// on one tree's edges) and each further tree's for its proxies and the
/// sender among themselves — so the sender answers every tree's proxies and
/// receivers probe no more than on one tree.
pub struct ProbePlan {
    /// Each node's probe peers.
    pub peers: std::collections::BTreeMap<u32, Vec<u32>>,
    /// Each node's peers with how often each edge is probed.
    pub strides: std::collections::BTreeMap<u32, Vec<(u32, u32)>>,
    /// Each node's parent edges with the pairs per interval each is probed.
    pub rates: std::collections::BTreeMap<u32, Vec<(u32, u32)>>,
}

/// The probe plan of topology `t`: `random` random peers per node (from
/// `seed`), random edges probed so a receiver stays near `budget` peers'
/// worth, at most `rate_max` pairs per interval on a parent edge.
pub fn probe_plan(t: &Topology, random: usize, seed: u64, budget: usize, rate_max: u32) -> ProbePlan {
    let mut plan = ProbePlan { peers: Default::default(), strides: Default::default(), rates: Default::default() };
    for tree in 0..t.trees.len() {
        let members = probe_members(t, tree);
        let g = fairfeed_clock::graph::peers(&members, random, seed ^ tree as u64);
        let strides = fairfeed_clock::graph::strides(&members, &g, budget);
        let rates = fairfeed_clock::graph::rates(&members, rate_max);
        for (id, v) in g {
            plan.peers.entry(id).or_default().extend(v);
        }
        for (id, v) in strides {
            plan.strides.entry(id).or_default().extend(v);
        }
        for (id, v) in rates {
            plan.rates.entry(id).or_default().extend(v);
        }
    }
    for v in plan.peers.values_mut() {
        v.sort_unstable();
        v.dedup();
    }
    plan
}

fn probe_members(t: &Topology, tree: usize) -> Vec<fairfeed_clock::graph::Member> {
    let Some(tr) = t.trees.get(tree) else { return Vec::new() };
    // Beyond tree 0, receivers take no part (they synchronize on tree 0).
    let nodes = || tr.nodes.iter().filter(move |n| tree == 0 || n.role != Role::Receiver);
    let mut parents: std::collections::BTreeMap<u32, Vec<u32>> =
        nodes().map(|n| (n.id, n.parent.into_iter().collect())).collect();
    for n in nodes() {
        for &h in &n.hedge_targets {
            if let Some(p) = parents.get_mut(&h) {
                p.push(n.id);
            }
        }
    }
    parents.into_iter().map(|(id, parents)| fairfeed_clock::graph::Member { id, parents }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(n: usize, h: usize) -> PlanRequest {
        PlanRequest { receivers: n, fanout: None, depth: None, hedge: h, cost_model: None, trees: 1 }
    }

    /// A hand-edited topology with each fault the nodes must refuse on load.
    #[test]
    fn validation_names_each_fault_of_an_edited_topology() {
        let good = plan(&PlanRequest { fanout: Some(2), ..req(4, 1) }).unwrap();
        assert_eq!(validate(&good), Ok(()));
        let proxies: Vec<u32> = good.trees[0].nodes.iter().filter(|n| n.role == Role::Proxy).map(|n| n.id).collect();
        let fault = |f: &dyn Fn(&mut Topology)| {
            let mut t = good.clone();
            f(&mut t);
            validate(&t).unwrap_err().0
        };
        fn node(t: &mut Topology, id: u32) -> &mut Node {
            t.trees[0].nodes.iter_mut().find(|n| n.id == id).unwrap()
        }
        let (p0, p1) = (proxies[0], proxies[1]);
        // Two proxies sending to each other: a packet storm.
        let e = fault(&|t| {
            node(t, p0).hedge_targets[0] = p1;
            node(t, p1).hedge_targets[0] = p0;
        });
        assert!(e.contains("one layer down"), "{e}");
        let e = fault(&|t| t.trees[0].nodes[1].id = t.trees[0].nodes[0].id);
        assert!(e.contains("appears twice"), "{e}");
        let e = fault(&|t| node(t, 0).parent = None);
        assert!(e.contains("has no parent"), "{e}");
        let e = fault(&|t| node(t, 0).addr = Some("127.0.0.1:0".into()));
        assert!(e.contains("port 0"), "{e}");
        let e = fault(&|t| {
            node(t, 0).addr = Some("10.0.0.1:9100".into());
            node(t, 1).addr = Some("10.0.0.1:9100".into());
        });
        assert!(e.contains("share the address"), "{e}");
        let e = fault(&|t| node(t, 0).addr = Some("not an address".into()));
        assert!(e.contains("HOST:PORT"), "{e}");
        let e = fault(&|t| t.trees[0].nodes.retain(|n| n.role != Role::Sender));
        assert!(e.contains("no sender"), "{e}");
        let e = fault(&|t| node(t, 0).children.push(1));
        assert!(e.contains("receivers send none"), "{e}");
        let e = fault(&|t| t.trees.clear());
        assert!(e.contains("no tree"), "{e}");
        // Host names are addresses too.
        let mut named = good.clone();
        for n in &mut named.trees[0].nodes {
            n.addr = Some(format!("node-{}.tree.svc:9100", n.id));
        }
        assert_eq!(validate(&named), Ok(()));
    }

    #[test]
    fn heuristic_matches_jasper() {
        assert_eq!(shape(&req(10, 0)), Ok((1, 10)));
        assert_eq!(shape(&req(100, 0)), Ok((2, 10)));
        assert_eq!(shape(&req(1000, 0)), Ok((3, 10)));
        assert_eq!(shape(&req(5000, 0)), Ok((4, 10)));
    }

    #[test]
    fn cost_model_picks_table_1_optima() {
        // Jasper's table 1: best <D, F> is <1,10> for N=10, <2,10> for N=100, <3,10> for N=1000.
        for (n, want) in [(10, (1, 10)), (100, (2, 10)), (1000, (3, 10))] {
            let r = PlanRequest { cost_model: Some(CostModel::JASPER), ..req(n, 0) };
            assert_eq!(shape(&r), Ok(want), "N={n}");
        }
    }

    #[test]
    fn figure_3_tree_with_sibling_hedging() {
        let r = PlanRequest { fanout: Some(3), depth: Some(3), ..req(27, 1) };
        let t = plan(&r).unwrap();
        let tree = &t.trees[0];
        let layer = |l: i32| tree.nodes.iter().filter(|n| n.layer == l).count();
        assert_eq!((layer(-1), layer(0), layer(1), layer(2)), (1, 3, 9, 27));
        // P^0_0 sends to its children (P^1_0..2) and to P^0_1's children (P^1_3..5).
        let p00 = tree.nodes.iter().find(|n| n.layer == 0 && n.index == 0).unwrap();
        let idx = |ids: &[u32]| -> Vec<u32> {
            ids.iter().map(|id| tree.nodes.iter().find(|n| n.id == *id).unwrap().index).collect()
        };
        assert_eq!(idx(&p00.children), [0, 1, 2]);
        assert_eq!(idx(&p00.hedge_targets), [3, 4, 5]);
        // The last sibling wraps around to the first.
        let p02 = tree.nodes.iter().find(|n| n.layer == 0 && n.index == 2).unwrap();
        assert_eq!(idx(&p02.hedge_targets), [0, 1, 2]);
    }

    #[test]
    fn uneven_receivers_are_spread_and_reachable() {
        for n in [1, 7, 99, 101, 1234, 5000] {
            for h in [0, 1, 2] {
                let t = plan(&req(n, h)).unwrap_or_else(|e| panic!("N={n} H={h}: {e}"));
                let last: Vec<&Node> = t.trees[0]
                    .nodes
                    .iter()
                    .filter(|x| x.role == Role::Proxy && x.layer == t.depth as i32 - 2)
                    .collect();
                if !last.is_empty() {
                    let counts: Vec<usize> = last.iter().map(|p| p.children.len()).collect();
                    let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                    assert!(hi - lo <= 1, "N={n}: uneven spread {lo}..{hi}");
                }
            }
        }
    }

    #[test]
    fn invalid_requests_are_refused_clearly() {
        let e = plan(&PlanRequest { fanout: Some(3), depth: Some(2), ..req(100, 0) }).unwrap_err();
        assert!(e.0.contains("fewer than 100"), "{e}");
        assert!(plan(&req(0, 0)).is_err());
        assert!(plan(&PlanRequest { trees: 0, ..req(10, 0) }).is_err());
        // Depth 0 once spun for ever, with or without a fan-out or the cost model.
        let cost = Some(CostModel { hop_ns: 30_000.0, copy_ns: 2_700.0 });
        for r in [
            PlanRequest { depth: Some(0), ..req(10, 0) },
            PlanRequest { depth: Some(0), cost_model: cost, ..req(10, 0) },
            PlanRequest { depth: Some(0), fanout: Some(3), ..req(10, 0) },
            PlanRequest { depth: Some(DEPTH_MAX + 1), ..req(10, 0) },
            PlanRequest { fanout: Some(0), ..req(10, 0) },
        ] {
            let e = plan(&r).unwrap_err();
            assert!(e.0.contains("--depth") || e.0.contains("--fanout"), "{e}");
        }
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let m = Some(CostModel { hop_ns: bad, copy_ns: 2_700.0 });
            assert!(plan(&PlanRequest { cost_model: m, ..req(10, 0) }).is_err(), "{bad}");
            let m = Some(CostModel { hop_ns: 30_000.0, copy_ns: bad });
            assert!(plan(&PlanRequest { cost_model: m, ..req(10, 0) }).is_err(), "{bad}");
        }
    }

    #[test]
    fn several_trees_share_receivers() {
        let t = plan(&PlanRequest { trees: 3, ..req(100, 1) }).unwrap();
        assert_eq!(t.trees.len(), 3);
        let proxies: std::collections::HashSet<u32> =
            t.trees.iter().flat_map(|tr| tr.nodes.iter().filter(|n| n.role != Role::Receiver).map(|n| n.id)).collect();
        assert_eq!(proxies.len(), 1 + 3 * 10, "one sender for all trees, and 10 proxies each");
        assert_eq!(tree_for_locate(7, 3), 1);
        assert_eq!(node_in_trees(&t, sender_id(&t).unwrap()).len(), 3);
        assert_eq!(node_in_trees(&t, 0).len(), 3, "a receiver is in every tree");
        // Sizing K from a rate: 10×2 with H = 1 → the busiest proxy sends 20 copies.
        let r = req(100, 1);
        assert_eq!(trees_for_rate(&r, 5_000.0, 2_700.0, 0.5), Ok(1));
        assert_eq!(trees_for_rate(&r, 20_000.0, 2_700.0, 0.5), Ok(3), "20 × 2.7 µs × 20,000 / 0.5 = 2.16");
        let k3 = plan(&PlanRequest { trees: 3, ..r.clone() }).unwrap();
        let l = loads(&k3, 20_000.0, 2_700.0);
        assert!(l.proxy <= 0.5 && (l.sender - 0.54).abs() < 1e-9 && (l.sender_per_tree - 0.18).abs() < 1e-9, "{l:?}");
        assert!(trees_for_rate(&r, 1e7, 2_700.0, 0.5).unwrap_err().0.contains("more than 64"));
        // Each tree's sender must be the same node, and a proxy may serve one tree.
        let mut two = t.clone();
        two.trees[1].nodes[0].id = 9_999;
        let kids: Vec<u32> = two.trees[1].nodes[0].children.clone();
        for n in &mut two.trees[1].nodes {
            if kids.contains(&n.id) {
                n.parent = Some(9_999);
            }
        }
        assert!(validate(&two).unwrap_err().0.contains("one sender splits the feed"), "{:?}", validate(&two));
        let mut shared = t.clone();
        shared.trees[2] = Tree { id: 2, ..shared.trees[1].clone() };
        assert!(validate(&shared).unwrap_err().0.contains("a proxy serves one tree"));
        let mut order = t.clone();
        order.trees.swap(0, 1);
        assert!(validate(&order).unwrap_err().0.contains("in order"));
    }
}
