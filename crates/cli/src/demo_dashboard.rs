//! `fairfeed demo --dashboard ADDR`: the live dashboard of `fairfeed
//! dashboard`, fed from the demo's own nodes. Every node of the run in
//! progress posts to its counters board (as a `--metrics` node does); once a
//! second a thread renders each board as the node's Prometheus metrics — the
//! same function a node's `/metrics` answers with — and hands them to the
//! dashboard's [`Poller`], so the page shows exactly what it would show
//! scraping a deployed tree.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use fairfeed_net::tree::agent::NodeBoard;
use fairfeed_ops::dashboard::{every_poll, unix_ms, Poller, Sample, Server, State};
use fairfeed_tree::plan::Topology;

/// The configuration running now.
struct Phase {
    title: String,
    poller: Poller,
    boards: HashMap<u32, Arc<NodeBoard>>,
}

/// The dashboard of a demo; it serves until dropped.
pub struct DemoDashboard {
    phase: Arc<Mutex<Option<Phase>>>,
    idle_title: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DemoDashboard {
    /// Serves the page at `listen`; until [`DemoDashboard::show`] it says `idle_title`.
    pub fn start(listen: SocketAddr, idle_title: &str) -> anyhow::Result<DemoDashboard> {
        let server = Server::start(listen).with_context(|| format!("serving the dashboard on {listen}"))?;
        let addr = server.addr();
        let phase: Arc<Mutex<Option<Phase>>> = Arc::default();
        let idle_title = Arc::new(Mutex::new(idle_title.to_string()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ph, idle, st) = (phase.clone(), idle_title.clone(), stop.clone());
        let thread = std::thread::Builder::new().name("dashboard".into()).spawn(move || {
            every_poll(&st, || {
                let mut g = ph.lock().unwrap_or_else(PoisonError::into_inner);
                let s = match g.as_mut() {
                    Some(p) => {
                        let scrapes = p.boards.iter().map(|(&id, b)| (id, Some(sample(b)))).collect();
                        let mut s = p.poller.update(scrapes, unix_ms());
                        s.title.clone_from(&p.title);
                        s
                    }
                    None => State {
                        title: idle.lock().unwrap_or_else(PoisonError::into_inner).clone(),
                        updated_unix_ms: unix_ms(),
                        ..State::default()
                    },
                };
                drop(g);
                server.show(&s);
            });
        })?;
        eprintln!("demo: dashboard at http://{addr}/ while the demo runs");
        Ok(DemoDashboard { phase, idle_title, stop, thread: Some(thread) })
    }

    /// From now on shows `topology`'s nodes, posting to the returned boards.
    pub fn show(&self, title: String, topology: &Topology) -> HashMap<u32, Arc<NodeBoard>> {
        let boards: HashMap<u32, Arc<NodeBoard>> = topology
            .trees
            .first()
            .map(|t| t.nodes.iter().map(|n| (n.id, NodeBoard::new())).collect())
            .unwrap_or_default();
        let p = Phase { title, poller: Poller::new(topology.clone()), boards: boards.clone() };
        *self.phase.lock().unwrap_or_else(PoisonError::into_inner) = Some(p);
        boards
    }

    /// Appends `note` to the title of what is shown (e.g. that the run ended).
    pub fn note(&self, note: &str) {
        if let Some(p) = self.phase.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            p.title = format!("{} — {note}", p.title);
        } else {
            *self.idle_title.lock().unwrap_or_else(PoisonError::into_inner) = note.to_string();
        }
    }
}

impl Drop for DemoDashboard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A node's board as the dashboard would scrape it (a node that has not
/// posted yet answers with nothing, not as down). The parts are copied out
/// under the board's lock and rendered after, so the node's agents are
/// never kept from posting while this renders.
fn sample(board: &NodeBoard) -> Sample {
    let mut e = fairfeed_ops::Exposition::new();
    crate::cmd_node::node_metrics(board, &mut e);
    Sample::parse(&e.render())
}
