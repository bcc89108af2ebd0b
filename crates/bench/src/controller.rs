//! The controller's scale (issue 43's targets): how long it takes to place
//! a tree of N receivers from their registrations and hand every member
//! its view, and how many joins a second it then takes — beside a
//! baseline measured in the same run: `fairfeed_tree::plan::plan` planning
//! the same shape in one call (no registrations, no views).

use std::net::SocketAddr;
use std::time::Instant;

use fairfeed_tree::controller::{Controller, ControllerConfig, MemberClient, MemberConfig};
use fairfeed_tree::membership::MemberRole;
use serde::Serialize;

/// What was measured.
#[derive(Debug, Clone, Serialize)]
pub struct ControllerScale {
    pub receivers: usize,
    pub proxies: usize,
    pub fanout: usize,
    /// Every registration handled and every view built and sealed, s.
    pub place_all_s: f64,
    pub views_sent: u64,
    /// The planner's one call for the same shape, s (the baseline).
    pub plan_baseline_s: f64,
    /// Joins of further receivers into the full tree, per second.
    pub joins_per_s: f64,
    pub joins_measured: usize,
}

fn register(c: &mut Controller, now: u64, id: u32, role: MemberRole) {
    let mut cl = MemberClient::new(
        MemberConfig {
            role,
            want_id: id,
            capacity: 0,
            advertise: None,
            incarnation: u64::from(id) + 1,
            heartbeat_ns: 10_000_000,
            register_retry_ns: 10_000_000,
        },
        None,
    );
    cl.handle_timeout(now);
    let from = SocketAddr::from(([10, (id >> 16) as u8, (id >> 8) as u8, id as u8], 9100));
    while let Some(b) = cl.poll_transmit() {
        c.handle_packet(now, from, &b);
    }
    while c.poll_transmit().is_some() {}
    while c.poll_event().is_some() {}
}

/// Places `receivers` receivers (and the proxies a tree of depth 3 needs,
/// fan-out the smallest F with F³ ≥ N) from registrations, then `joins` more.
pub fn controller_scale(receivers: usize, joins: usize) -> ControllerScale {
    let fanout = (1..).find(|f: &usize| f.saturating_pow(3) >= receivers).unwrap_or(1).max(2);
    let layer1 = receivers.div_ceil(fanout).max(1);
    let layer0 = layer1.div_ceil(fanout).max(1);
    let proxies = layer0 + layer1;
    let cfg = ControllerConfig {
        fanout,
        hedge: 1,
        proxy_layers: 2,
        members_max: fairfeed_tree::controller::MEMBERS_MAX,
        members_per_ip_max: 1_000_000,
        ..ControllerConfig::default()
    };
    let mut c = Controller::new(cfg, None).expect("a valid configuration");
    let now = 1_000_000_000;
    let t = Instant::now();
    register(&mut c, now, 0, MemberRole::Sender);
    for i in 0..proxies as u32 {
        register(&mut c, now, 1 + i, MemberRole::Proxy);
    }
    let first = 1 + proxies as u32;
    for i in 0..receivers as u32 {
        register(&mut c, now, first + i, MemberRole::Receiver);
    }
    let place_all_s = t.elapsed().as_secs_f64();
    let views_sent = c.stats.views_sent;
    let t = Instant::now();
    let req = fairfeed_tree::plan::PlanRequest {
        receivers,
        fanout: Some(fanout),
        depth: Some(3),
        hedge: 1,
        cost_model: None,
        trees: 1,
    };
    let _ = std::hint::black_box(fairfeed_tree::plan::plan(&req));
    let plan_baseline_s = t.elapsed().as_secs_f64();
    // Further joins (the tree is full at the planned shape: joiners wait or fill the proxies' room).
    let base = first + receivers as u32;
    let t = Instant::now();
    for i in 0..joins as u32 {
        register(&mut c, now, base + i, MemberRole::Receiver);
    }
    let joins_per_s = joins as f64 / t.elapsed().as_secs_f64().max(1e-9);
    ControllerScale {
        receivers,
        proxies,
        fanout,
        place_all_s,
        views_sent,
        plan_baseline_s,
        joins_per_s,
        joins_measured: joins,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_small_tree_is_placed_and_joins_are_counted() {
        let r = super::controller_scale(100, 20);
        assert_eq!((r.fanout, r.proxies), (5, 20 + 4));
        assert!(r.views_sent >= 125, "{r:?}");
        assert_eq!(r.joins_measured, 20);
    }
}
