//! `fairfeed demo --dashboard ADDR`: the live dashboard of `fairfeed
//! dashboard`, fed from the demo's own nodes. Every node of the run in
//! progress publishes into a slot (as a `--metrics` node does); once a
//! second a thread renders each slot as the node's Prometheus metrics — the
//! same function a node's `/metrics` answers with — and hands them to the
//! dashboard's [`Poller`], so the page shows exactly what it would show
//! scraping a deployed tree.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use fairfeed_net::tree::agent::PublishSlot;
use fairfeed_ops::dashboard::{every_poll, unix_ms, Poller, Sample, Server, State};
use fairfeed_tree::plan::Topology;

/// The configuration running now.
struct Phase {
    title: String,
    poller: Poller,
    slots: HashMap<u32, PublishSlot>,
    /// Each node's last snapshot, taken out of its slot.
    last: HashMap<u32, PublishSlot>,
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
                        let scrapes =
                            p.slots.iter().map(|(&id, slot)| (id, Some(sample(id, slot, &mut p.last)))).collect();
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

    /// From now on shows `topology`'s nodes, publishing into the returned slots.
    pub fn show(&self, title: String, topology: &Topology) -> HashMap<u32, PublishSlot> {
        let slots: HashMap<u32, PublishSlot> = topology
            .trees
            .first()
            .map(|t| t.nodes.iter().map(|n| (n.id, PublishSlot::default())).collect())
            .unwrap_or_default();
        let p = Phase { title, poller: Poller::new(topology.clone()), slots: slots.clone(), last: HashMap::new() };
        *self.phase.lock().unwrap_or_else(PoisonError::into_inner) = Some(p);
        slots
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

/// A node's published slot as the dashboard would scrape it (a node that
/// has not published yet answers with nothing, not as down). The snapshot is
/// taken out of the slot under its lock and rendered from `last` (where the
/// previous one stays until a newer arrives), so the node, which never waits
/// for its slot, is not kept from publishing while this renders.
fn sample(id: u32, slot: &PublishSlot, last: &mut HashMap<u32, PublishSlot>) -> Sample {
    let fresh = std::mem::take(&mut *slot.lock().unwrap_or_else(PoisonError::into_inner));
    let kept = last.entry(id).or_default();
    if fresh.report.is_some() {
        *kept.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
    }
    let mut e = fairfeed_ops::Exposition::new();
    crate::cmd_node::node_metrics(kept, &mut e);
    Sample::parse(&e.render())
}
