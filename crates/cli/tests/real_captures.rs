//! Goal: our decoder handles genuine NASDAQ, BX and PSX TotalView-ITCH 5.0
//! captures (../shared/data/itch50-real) with zero errors, and the values it
//! reads are the ones in the packets. Method: decode every capture with
//! `fairfeed decode --summary-json`; pin field values read off specific
//! captures (cross-checked by hand against tshark's MoldUDP64 dissector).

mod common;
use common::*;

#[test]
fn every_real_capture_decodes_without_errors() {
    let mut total_messages = 0;
    let mut types = std::collections::BTreeSet::new();
    for path in real_captures() {
        let s = json(&fairfeed(&["decode", path.to_str().unwrap(), "--summary-json"]));
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        assert_eq!(s["errors"], 0, "{name}: {s}");
        assert!(s["messages"].as_u64().unwrap() >= 1, "{name}: no messages");
        assert_eq!(s["skipped_frames"]["bad_frame"], 0, "{name}");
        total_messages += s["messages"].as_u64().unwrap();
        for t in s["types"].as_object().unwrap().keys() {
            types.insert(t.clone());
        }
    }
    assert!(total_messages >= 150, "only {total_messages} messages");
    // The collection covers these types; each decoded.
    for t in ["S", "H", "Y", "L", "J", "A", "F", "E", "C", "X", "D", "U", "P", "Q", "I", "N"] {
        assert!(types.contains(t), "type {t} not seen in real data");
    }
}

fn decode_json_lines(file: &str) -> Vec<serde_json::Value> {
    let path = real_data_dir().join(file);
    let out = fairfeed(&["decode", path.to_str().unwrap(), "--json"]);
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn multiple_packets_capture_has_the_known_values() {
    let file = "Nasdaq_Nasdaq.Equities.TotalView.Itch.v5.0_Multiple.Packets.pcap";
    let s = json(&fairfeed(&["decode", real_data_dir().join(file).to_str().unwrap(), "--summary-json"]));
    assert_eq!(s["packets"], 2);
    assert_eq!(s["messages"], 39);
    assert_eq!(s["sessions"]["000010059B"]["first_seq"], 14_764_496);
    assert_eq!(s["next_seq"], 19_009_155);
    let m = decode_json_lines(file);
    assert_eq!(m.len(), 39);
    assert_eq!(m[0]["type"], "D");
    assert_eq!(m[0]["order_ref"], 23_485_802);
    assert_eq!(m[0]["stock_locate"], 2737);
    assert_eq!(m[1]["seq"], 19_009_117);
    assert_eq!(m[1]["type"], "A");
    assert_eq!(m[1]["stock"], "META");
    assert_eq!(m[1]["price"], "80.5200");
    assert_eq!(m[1]["side"], "B");
    assert_eq!(m[1]["order_ref"], 7_942_047);
    assert_eq!(m[2]["price"], "357.3300");
    assert_eq!(m[2]["shares"], 100);
    assert_eq!(m[1]["timestamp"], 34_238_952_381_153u64);
}

#[test]
fn other_real_messages_have_the_known_values() {
    let m = decode_json_lines("Nasdaq_Nasdaq.Equities.TotalView.Itch.v5.0_NetOrderImbalanceIndicatorMessage.pcap");
    assert_eq!((m[0]["type"].as_str(), m[0]["stock"].as_str()), (Some("I"), Some("MDC")));
    assert_eq!(m[0]["far_price"], "46.4400");
    assert_eq!(m[0]["cross_type"], "O");
    let m = decode_json_lines("Nasdaq_Bx.Equities.TotalView.Itch.v5.0_OrderReplaceMessage.pcap");
    assert_eq!(m[0]["session"], "000010059D");
    assert_eq!(m[0]["seq"], 1_621_746);
    assert_eq!(m[0]["original_order_ref"], 2_589_422);
    assert_eq!(m[0]["new_order_ref"], 3_541_246);
    assert_eq!(m[0]["price"], "54.8800");
    let m = decode_json_lines("Nasdaq_Nasdaq.Equities.TotalView.Itch.v5.0.20230822_CrossTrade.pcap");
    assert_eq!(m[0]["stock"], "BAC-Q");
    assert_eq!(m[0]["match_number"], 255_550);
}

/// Issue 42: the sender's sharder on genuine NASDAQ/BX/PSX packets. Every
/// message of every capture reaches exactly its tree (stock locate % K) or,
/// with stock locate 0 (system events), every tree; each tree's MoldUDP64
/// session is gap-free from 1; each symbol's messages keep the capture's order
/// and bytes.
#[test]
fn real_captures_shard_over_trees_with_every_symbol_in_order() {
    use fairfeed_tree::shard::{Dest, ShardMap, Sharder};
    use fairfeed_wire::moldudp64::Packet;
    let k = 4;
    let mut s = Sharder::new(k, ShardMap::default()).unwrap();
    let (mut want, mut got) = (vec![Vec::new(); k], vec![Vec::new(); k]);
    let mut next = vec![1u64; k];
    let mut market_wide = 0;
    for path in real_captures() {
        let (datagrams, _) = fairfeed_feed::capture::read_datagrams(&path, None).unwrap();
        for d in datagrams {
            let Ok(p) = Packet::new_checked(&d.payload[..]) else { continue };
            for m in p.messages().map_while(Result::ok) {
                let locate = usize::from(u16::from_be_bytes([m[1], m[2]]));
                if locate == 0 {
                    market_wide += 1;
                    want.iter_mut().for_each(|w: &mut Vec<Vec<u8>>| w.push(m.to_vec()));
                } else {
                    want[locate % k].push(m.to_vec());
                }
            }
            s.split(&d.payload, |dest, b| {
                let t = usize::from(dest.tree());
                let q = Packet::new_checked(b).unwrap();
                assert_eq!(q.sequence(), next[t], "tree {t}'s session has a gap");
                next[t] = q.next_sequence();
                assert_eq!(matches!(dest, Dest::Every(_)), q.messages().any(|m| m.unwrap()[1..3] == [0, 0]));
                got[t].extend(q.messages().map(|m| m.unwrap().to_vec()));
            })
            .unwrap();
        }
    }
    assert_eq!(got, want);
    assert!(market_wide > 0, "the captures hold system events");
    assert!(
        got.iter().all(|g| g.len() > market_wide),
        "every tree carries symbols: {:?}",
        got.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert_eq!((s.stats.bad_packets, s.stats.bad_messages), (0, 0));
}

/// Goal (issue 43): the book keeper behind the snapshot service takes real
/// NASDAQ messages — every type — without a panic, keeps the standing state
/// they carry, counts the order messages whose orders it never saw (these
/// captures are fragments of a day, not its start), and a snapshot of what it
/// holds rebuilds the same books. A follower that joins one of these
/// sessions mid-way refuses to serve it.
#[test]
fn real_captures_build_books_whose_snapshot_rebuilds_them() {
    use fairfeed_feed::book::Books;
    use fairfeed_feed::snapshot::{Follower, NotServing, GAP_WAIT_DEFAULT_NS};
    use fairfeed_wire::moldudp64::Packet;
    let mut books = Books::new();
    let mut messages = 0;
    for path in real_captures() {
        let (datagrams, _) = fairfeed_feed::capture::read_datagrams(&path, None).unwrap();
        let mut f = Follower::new(GAP_WAIT_DEFAULT_NS, 1 << 20);
        for d in datagrams {
            f.on_packet(0, &d.payload);
            let Ok(p) = Packet::new_checked(&d.payload[..]) else { continue };
            for m in p.messages().map_while(Result::ok) {
                messages += 1;
                let _ = books.apply(m);
            }
        }
        if let Err(e) = f.standing() {
            assert!(matches!(e, NotServing::JoinedLate { .. }), "{}: {e}", path.display());
        }
    }
    let s = *books.stats();
    eprintln!("{messages} real messages: {s:?}, {} open orders", books.orders());
    assert_eq!(s.malformed, 0);
    assert!(s.adds > 0 && s.state > 0 && s.other > 0, "{s:?}");
    assert!(s.unknown_order > 0, "fragments reference orders added before the capture: {s:?}");
    assert!(!books.exact(), "books missing what came before are not exact");
    let mut rebuilt = Books::new();
    books.snapshot(&mut |m| rebuilt.apply(m).unwrap());
    assert_eq!(rebuilt.diff(&books), None);
}
