//! A fair multicast tree as separate `fairfeed sender|proxy|receiver`
//! processes, optionally each in its own network namespace.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{bin, fairfeed, tmp};

#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: u32,
    pub role: String,
    pub parent: Option<u32>,
    pub layer: i64,
    pub addr: String,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub topo: PathBuf,
    pub key: PathBuf,
    pub nodes: Vec<NodeInfo>,
    pub procs: HashMap<u32, Child>,
    /// Network namespace per node id (None: everything on loopback).
    pub netns: Option<HashMap<u32, String>>,
}

impl Cluster {
    /// Plans `receivers` with fan-out and hedge; `plan_extra` adds addresses.
    pub fn plan(receivers: usize, fanout: usize, hedge: usize, plan_extra: &[String]) -> Cluster {
        let dir = tmp();
        let topo = dir.path().join("tree.toml");
        let key = dir.path().join("key.hex");
        std::fs::write(&key, "3f".repeat(32)).unwrap();
        let (r, f, h) = (receivers.to_string(), fanout.to_string(), hedge.to_string());
        let mut args: Vec<&str> =
            vec!["plan", "--receivers", &r, "--fanout", &f, "--hedge", &h, "--out", topo.to_str().unwrap()];
        args.extend(plan_extra.iter().map(String::as_str));
        fairfeed(&args);
        let t: toml::Value = toml::from_str(&std::fs::read_to_string(&topo).unwrap()).unwrap();
        // Every tree's nodes, each once (the sender and the receivers are in all trees).
        let mut seen = std::collections::HashSet::new();
        let nodes = t["trees"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|tr| tr["nodes"].as_array().unwrap())
            .filter(|n| seen.insert(n["id"].as_integer().unwrap()))
            .map(|n| NodeInfo {
                id: n["id"].as_integer().unwrap() as u32,
                role: n["role"].as_str().unwrap().to_string(),
                parent: n.get("parent").and_then(|p| p.as_integer()).map(|p| p as u32),
                layer: n["layer"].as_integer().unwrap(),
                addr: n.get("addr").and_then(|a| a.as_str()).unwrap_or_default().to_string(),
            })
            .collect();
        Cluster { dir, topo, key, nodes, procs: HashMap::new(), netns: None }
    }

    pub fn ids(&self, role: &str) -> Vec<u32> {
        self.nodes.iter().filter(|n| n.role == role).map(|n| n.id).collect()
    }

    pub fn node(&self, id: u32) -> &NodeInfo {
        self.nodes.iter().find(|n| n.id == id).unwrap()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts node `id` as `role` with the common flags plus `extra`.
    pub fn start(&mut self, id: u32, extra: &[String]) {
        let role = self.node(id).role.clone();
        let mut args: Vec<String> = vec![
            role.clone(),
            "--topology".into(),
            self.topo.display().to_string(),
            "--id".into(),
            id.to_string(),
            "--key-file".into(),
            self.key.display().to_string(),
            "--idle".into(),
            "park".into(),
            "--stats-out".into(),
            self.path(&format!("stats-{id}.json")).display().to_string(),
        ];
        if role == "receiver" {
            args.extend(["--log".into(), self.path(&format!("log-{id}.csv")).display().to_string()]);
        }
        args.extend(extra.iter().cloned());
        let mut cmd = match self.netns.as_ref().and_then(|m| m.get(&id)) {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin()]);
                c
            }
            None => Command::new(bin()),
        };
        let err = std::fs::File::create(self.path(&format!("stderr-{id}.txt"))).unwrap();
        let child = cmd.args(&args).stdout(Stdio::null()).stderr(err).spawn().expect("spawn node");
        self.procs.insert(id, child);
    }

    /// SIGKILL: a crash, no stats written.
    pub fn crash(&mut self, id: u32) {
        let mut c = self.procs.remove(&id).unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// Waits for node `id` to exit by itself (at most `limit`).
    pub fn wait(&mut self, id: u32, limit: Duration) {
        let c = self.procs.get_mut(&id).unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                assert!(s.success(), "node {id} failed: {}", self.stderr(id));
                self.procs.remove(&id);
                return;
            }
            assert!(t0.elapsed() < limit, "node {id} did not finish in {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM to every node still running; waits for their stats.
    pub fn stop_all(&mut self) {
        let ids: Vec<u32> = self.procs.keys().copied().collect();
        for id in &ids {
            let pid = self.procs[id].id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
        }
        for id in ids {
            self.wait(id, Duration::from_secs(10));
        }
    }

    pub fn stderr(&self, id: u32) -> String {
        std::fs::read_to_string(self.path(&format!("stderr-{id}.txt"))).unwrap_or_default()
    }

    pub fn stats(&self, id: u32) -> serde_json::Value {
        let p = self.path(&format!("stats-{id}.json"));
        let text =
            std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}; stderr: {}", p.display(), self.stderr(id)));
        serde_json::from_str(&text).unwrap()
    }

    /// The node's stats, if it wrote them (a crashed node did not).
    #[allow(dead_code)]
    pub fn try_stats(&self, id: u32) -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(self.path(&format!("stats-{id}.json"))).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// (sequence, release ns) per release of receiver `id`.
    pub fn releases(&self, id: u32) -> Vec<(u64, u64)> {
        let text = std::fs::read_to_string(self.path(&format!("log-{id}.csv"))).unwrap();
        text.lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f[0].parse().unwrap(), f[4].parse().unwrap())
            })
            .collect()
    }

    /// Receiver `id`'s release log: (sequence, the sender's deadline, release instant), ns.
    pub fn release_rows(&self, id: u32) -> Vec<(u64, u64, u64)> {
        let text = std::fs::read_to_string(self.path(&format!("log-{id}.csv"))).unwrap();
        text.lines()
            .skip(1)
            .map(|l| {
                let f: Vec<u64> = l.split(',').map(|x| x.parse().unwrap()).collect();
                (f[0], f[2], f[4])
            })
            .collect()
    }

    /// Rows of receiver `id` whose release came before their deadline.
    pub fn early_releases(&self, id: u32) -> usize {
        let text = std::fs::read_to_string(self.path(&format!("log-{id}.csv"))).unwrap();
        text.lines()
            .skip(1)
            .filter(|l| {
                let f: Vec<u64> = l.split(',').map(|x| x.parse().unwrap()).collect();
                f[4] < f[2]
            })
            .count()
    }

    /// Delivery window per message released by every receiver, ns, sorted.
    pub fn windows(&self) -> Vec<u64> {
        let rx = self.ids("receiver");
        let mut at: HashMap<u64, (u64, u64, usize)> = HashMap::new();
        for id in &rx {
            for (seq, t) in self.releases(*id) {
                let e = at.entry(seq).or_insert((u64::MAX, 0, 0));
                e.0 = e.0.min(t);
                e.1 = e.1.max(t);
                e.2 += 1;
            }
        }
        let mut w: Vec<u64> = at.values().filter(|e| e.2 == rx.len()).map(|e| e.1 - e.0).collect();
        w.sort_unstable();
        w
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.procs.values_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
