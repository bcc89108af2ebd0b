//! Goal: an attacker who can send datagrams to every port of a running
//! tree — control sockets, overlay data, the sender's retransmission server —
//! stops nothing, reconfigures nothing and costs no message, and every
//! attempt is counted (docs/SECURITY.md; issue 45's targets).
//! Method: `fairfeed bench attack --json`: a hedged tree of node processes
//! (authenticated overlay, control sockets with an operator key) carries a
//! feed clean, then again under the campaign (unsealed, wrongly sealed,
//! malformed, stale and replayed control commands; junk on every port; bare
//! retransmission requests); both runs' counters and fleet views compared.

mod common;

fn n(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn an_attack_campaign_on_a_running_tree_stops_nothing_changes_nothing_and_loses_nothing() {
    let out = common::fairfeed(&[
        "bench",
        "attack",
        "--receivers",
        "4",
        "--rate",
        "1000",
        "--seconds",
        "3",
        "--port",
        "9460",
        "--json",
    ]);
    let r = common::json(&out);
    let (clean, hit) = (&r["clean"], &r["attacked"]);
    eprintln!("{}", serde_json::to_string_pretty(&r).unwrap());
    for run in [clean, hit] {
        assert_eq!(n(&run["lost"]), 0, "{run}");
        assert_eq!(run["stopped"], serde_json::json!([]), "{run}");
        // Only the operator's own sealed requests were admitted.
        assert!(n(&run["sealed_accepted"]) <= n(&run["operator_requests"]), "{run}");
        // Every metrics endpoint still served another address.
        assert_eq!(run["metrics_answered"], run["metrics_nodes"], "{run}");
    }
    // Authentic packets captured 10 s ago and replayed: refused as replays at every node.
    assert!(n(&hit["data_replays_refused"]) >= 7 * 40, "{hit}");
    assert!(n(&hit["campaign"]["metrics_connections"]) >= 7 * 8, "the slowloris held connections: {hit}");
    let c = &hit["campaign"];
    assert!(n(&c["rounds"]) >= 50 && n(&c["control_datagrams"]) > 2_000, "{c}");
    let refused = &hit["control_refused"];
    for k in ["unauthenticated", "bad_mac", "malformed", "stale", "replayed", "other_address"] {
        assert!(n(&refused[k]) >= 40, "{k}: {refused}");
    }
    // Every datagram to a data port refused and counted (a kernel drop on a loaded host aside).
    let (sent, refused) = (n(&c["data_datagrams"]), n(&hit["data_refused"]));
    assert!(refused <= sent && refused * 100 >= sent * 99, "{refused} of {sent} refused: {hit}");
    // Reflection: the attacker drew no more bytes than it sent, and the server counted it so.
    assert!(n(&c["retransmit_bytes_back"]) <= n(&c["retransmit_bytes_in"]), "{c}");
    let rs = &hit["retransmit"];
    assert!(n(&rs["challenges"]) > 0 && n(&rs["bytes_out_unverified"]) <= n(&rs["bytes_in"]), "{rs}");
    // The clean run drew nothing of the kind.
    assert_eq!(n(&clean["control_refused"]["unauthenticated"]), 0, "{clean}");
}
