//! Two network namespaces joined by a veth pair, made and removed by the
//! caller (tests and benchmarks): a real link with a real driver (veth
//! supports native XDP) that touches nothing outside the machine.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The names of a link: namespaces `ns[0]`, `ns[1]`, each holding one end
/// of a veth pair (`ifaces[i]`, address `addrs[i]`/30).
#[derive(Debug, Clone)]
pub struct Link {
    pub ns: [String; 2],
    pub ifaces: [String; 2],
    pub addrs: [Ipv4Addr; 2],
}

/// A [`Link`] this process made, both ends up; removed when dropped.
#[derive(Debug)]
pub struct VethPair {
    link: Link,
}

fn ip(args: &[&str]) -> std::io::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run `ip` (iproute2): {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl VethPair {
    /// Makes the pair; names carry the process id and a counter, so tests
    /// running side by side never meet. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN).
    pub fn create() -> std::io::Result<VethPair> {
        VethPair::with_queues(1)
    }

    /// As [`VethPair::create`], each end with `queues` receive and transmit
    /// queues (veth hands a datagram to the peer's queue its sender picked).
    pub fn with_queues(queues: u32) -> std::io::Result<VethPair> {
        assert!((1..=64).contains(&queues), "1 to 64 queues");
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("ffx{pid}-{n}");
        let v = Link {
            ns: [format!("{tag}-a"), format!("{tag}-b")],
            ifaces: ["ffxa".to_string(), "ffxb".to_string()],
            addrs: [Ipv4Addr::new(10, 251, (n % 250) as u8, 1), Ipv4Addr::new(10, 251, (n % 250) as u8, 2)],
        };
        let mut made = VethPair { link: v.clone() };
        made.link.ns = [String::new(), String::new()];
        for (i, ns) in v.ns.iter().enumerate() {
            ip(&["netns", "add", ns])?;
            // From here on, dropping `made` removes what was made.
            made.link.ns[i] = ns.clone();
        }
        let q = queues.to_string();
        let mut args = vec!["-n", &v.ns[0], "link", "add", &v.ifaces[0]];
        let multi = ["numtxqueues", &q, "numrxqueues", &q];
        if queues > 1 {
            args.extend(multi);
        }
        args.extend(["type", "veth", "peer", "name", &v.ifaces[1]]);
        if queues > 1 {
            args.extend(multi);
        }
        args.extend(["netns", &v.ns[1]]);
        ip(&args)?;
        for i in 0..2 {
            let cidr = format!("{}/30", v.addrs[i]);
            ip(&["-n", &v.ns[i], "addr", "add", &cidr, "dev", &v.ifaces[i]])?;
            ip(&["-n", &v.ns[i], "link", "set", &v.ifaces[i], "up"])?;
            ip(&["-n", &v.ns[i], "link", "set", "lo", "up"])?;
        }
        Ok(made)
    }

    /// The link's names.
    pub fn link(&self) -> &Link {
        &self.link
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for ns in self.link.ns.iter().filter(|n| !n.is_empty()) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// Moves the calling thread into network namespace `ns` (made by `ip netns
/// add`): sockets it opens and interfaces it names are then that namespace's.
pub fn enter(ns: &str) -> std::io::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}"))?;
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
}
