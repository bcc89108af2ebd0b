//! Goal (issue 43, join): a receiver that starts while the market is open
//! hands its application books equal to those of a receiver that saw the
//! whole feed — a GLIMPSE-style snapshot first, then the live line from
//! where the snapshot ends, one MoldUDP64 line without a gap or a repeat.
//! And the snapshot server holds against clients that misbehave.
//! Method: a generated ITCH feed replayed live into a tree's sender and into
//! `fairfeed snapshot-server`; one receiver from the start, one started
//! seconds later with `--snapshot`; what each application received is
//! collected on a UDP socket and rebuilt into books with `fairfeed_feed::book`,
//! compared with the books of the whole capture.

mod common;
use common::cluster::Cluster;
use common::{app_books, bin, delivery_socket, fairfeed};
use fairfeed_feed::book::Books;
use fairfeed_wire::moldudp64::Packet;
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn capture_books(path: &std::path::Path) -> (Books, u64) {
    let mut b = Books::new();
    let mut n = 0;
    for d in fairfeed_feed::capture::read_datagrams(path, None).unwrap().0 {
        let p = Packet::new_checked(&d.payload[..]).unwrap();
        for m in p.messages() {
            b.apply(m.unwrap()).unwrap();
            n += 1;
        }
    }
    (b, n)
}

fn spawn(args: &[&str], stderr: &std::path::Path) -> Child {
    let err = std::fs::File::create(stderr).unwrap();
    Command::new(bin()).args(args).stdout(Stdio::null()).stderr(err).spawn().unwrap()
}

fn term(c: &mut Child) {
    let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
    let t0 = Instant::now();
    while c.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "did not stop at SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_receiver_started_mid_feed_delivers_the_whole_feeds_books() {
    let mut c = Cluster::plan(2, 2, 1, &["--loopback-port".into(), "9710".into()]);
    let feed = c.path("feed.pcap");
    fairfeed(&["gen", "--messages", "40000", "--symbols", "40", "--all-types", "--out", feed.to_str().unwrap()]);
    let (want, messages) = capture_books(&feed);
    let (snap_addr, snap_feed, sender_in) = ("127.0.0.1:9718", "127.0.0.1:9719", "127.0.0.1:9717");
    let snap_err = c.path("snapshot-server.txt");
    let mut server = spawn(&["snapshot-server", "--listen", snap_addr, "--feed", snap_feed], &snap_err);

    let stop = Arc::new(AtomicBool::new(false));
    let [early, late] = c.ids("receiver")[..] else { panic!("two receivers") };
    let common = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["--link", "cloud", "--seconds", "40"].iter().map(|s| s.to_string()).collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let (sock, to) = delivery_socket();
    let early_got = common::collect_datagrams(sock, stop.clone());
    c.start(early, &common(&["--deliver", &to]));
    for id in c.ids("proxy") {
        c.start(id, &common(&[]));
    }
    let sender = c.ids("sender")[0];
    c.start(sender, &common(&["--listen", sender_in]));
    std::thread::sleep(Duration::from_millis(1_500));
    let mut replay = Command::new(bin())
        .args(["replay", feed.to_str().unwrap(), "--to", sender_in, "--and", feed.to_str().unwrap()])
        .args(["--and-to", snap_feed])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Seconds into the feed (~6 s at the generator's 6,700 msg/s), the late receiver joins.
    std::thread::sleep(Duration::from_millis(2_500));
    let (sock, to) = delivery_socket();
    let late_got = common::collect_datagrams(sock, stop.clone());
    c.start(late, &common(&["--deliver", &to, "--snapshot", snap_addr]));
    assert!(replay.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(2_000));
    c.stop_all();
    term(&mut server);
    stop.store(true, Ordering::Relaxed);

    let (early_books, first, end) = app_books(&early_got.join().unwrap());
    assert_eq!((first, end - 1), (1, messages), "the early receiver delivers the whole session");
    assert_eq!(early_books.diff(&want), None);
    let late_packets = late_got.join().unwrap();
    let (late_books, first, end) = app_books(&late_packets);
    let s = c.stats(late);
    let join = &s["counters"]["join"];
    eprintln!("late receiver: line {first}..{end}, join {join}");
    assert_eq!(join["joined"], true, "{join}");
    let at = join["joined_at_sequence"].as_u64().unwrap();
    assert!(at > 1_000, "the late receiver joined at {at}: not late");
    assert_eq!(first, at - join["snapshot_messages"].as_u64().unwrap(), "the snapshot is numbered up to the join");
    assert_eq!(end - 1, messages, "and the live line runs to the feed's end");
    assert_eq!(late_books.diff(&want), None, "the late receiver's books are the whole feed's");
    let report = std::fs::read_to_string(&snap_err).unwrap();
    assert!(report.contains("\"snapshots_sent\": 1"), "{report}");
    meatpy_agrees(&c, &feed, &late_packets, &want);
}

/// Writes the messages of MoldUDP64 packets as a NASDAQ binary ITCH file
/// (each message after its 2-byte length).
fn itch_file(packets: impl IntoIterator<Item = Vec<u8>>, path: &std::path::Path) {
    let mut out = Vec::new();
    for p in packets {
        for m in Packet::new_checked(&p[..]).unwrap().messages() {
            let m = m.unwrap();
            out.extend_from_slice(&u16::try_from(m.len()).unwrap().to_be_bytes());
            out.extend_from_slice(m);
        }
    }
    std::fs::write(path, out).unwrap();
}

/// An order-book builder nobody here wrote (PyPI's MeatPy) rebuilds the
/// busiest stocks' books from the whole feed and from what the joiner's
/// application got (snapshot, then live): they must agree with each other,
/// order by order in queue priority, and with fairfeed's books.
fn meatpy_agrees(c: &Cluster, feed: &std::path::Path, joined: &[Vec<u8>], want: &Books) {
    if !common::have_tool("python3", &["-c", "import meatpy.itch50"]) {
        return;
    }
    let (whole_itch, joined_itch) = (c.path("whole.itch"), c.path("joined.itch"));
    let datagrams = fairfeed_feed::capture::read_datagrams(feed, None).unwrap().0;
    itch_file(datagrams.into_iter().map(|d| d.payload.to_vec()), &whole_itch);
    itch_file(joined.iter().cloned(), &joined_itch);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/meatpy_books.py");
    let o = Command::new("python3")
        .args([script, whole_itch.to_str().unwrap(), joined_itch.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let r: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("MeatPy's report ({e}): {err}"));
    eprintln!("MeatPy: equal {}, out of priority {}, skipped {}", r["equal"], r["out_of_priority"], r["skipped_whole"]);
    assert!(
        o.status.success() && r["equal"] == true,
        "MeatPy: snapshot + live differ from the whole feed: {}",
        r["first_difference"]
    );
    // MeatPy checks that each execution takes the first order in time
    // priority at the best price: the generator's feed does (the whole
    // feed), and so do the snapshot's Add Orders, priority for priority
    // (the joined line).
    assert_eq!(r["out_of_priority"], serde_json::json!({"whole": 0, "joined": 0}), "executions out of priority");
    let stocks = r["stocks"].as_object().unwrap();
    assert!(!stocks.is_empty());
    let mut orders = 0;
    for (locate, sides) in stocks {
        let locate: u16 = locate.parse().unwrap();
        for (side, key) in [(b'B', "bids"), (b'S', "asks")] {
            let ours: Vec<(u32, Vec<(u64, u32)>)> = want.queues(locate, side);
            let theirs: Vec<(u32, Vec<(u64, u32)>)> = serde_json::from_value(sides[key].clone()).unwrap();
            orders += theirs.iter().map(|(_, q)| q.len()).sum::<usize>();
            assert_eq!(ours, theirs, "stock {locate} {key}: fairfeed's books against MeatPy's");
        }
    }
    assert!(orders > 0, "MeatPy's books hold no order: nothing was compared");
}

/// The same join against the sender's own snapshot service (`sender
/// --snapshot-listen`): the books of exactly what went down the tree, its
/// generated feed here, no second copy of the feed needed.
#[test]
fn a_late_receiver_joins_from_the_senders_own_snapshots() {
    let mut c = Cluster::plan(2, 2, 1, &["--loopback-port".into(), "9730".into()]);
    let snap = "127.0.0.1:9738";
    let stop = Arc::new(AtomicBool::new(false));
    let [early, late] = c.ids("receiver")[..] else { panic!("two receivers") };
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["--link", "cloud", "--seconds", "30"].iter().map(|s| s.to_string()).collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let (sock, to) = delivery_socket();
    let early_got = common::collect_datagrams(sock, stop.clone());
    c.start(early, &args(&["--deliver", &to]));
    for id in c.ids("proxy") {
        c.start(id, &args(&[]));
    }
    let sender = c.ids("sender")[0];
    let feed = ["--rate", "1500", "--feed-seconds", "6", "--start-delay-ms", "700", "--linger-ms", "1500"];
    let mut sa: Vec<String> = feed.iter().map(|s| s.to_string()).collect();
    sa.extend(["--link".into(), "cloud".into(), "--snapshot-listen".into(), snap.into()]);
    c.start(sender, &sa);
    std::thread::sleep(Duration::from_millis(3_000));
    let (sock, to) = delivery_socket();
    let late_got = common::collect_datagrams(sock, stop.clone());
    c.start(late, &args(&["--deliver", &to, "--snapshot", snap]));
    c.wait(sender, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    c.stop_all();
    stop.store(true, Ordering::Relaxed);
    let (want, first, end) = app_books(&early_got.join().unwrap());
    assert_eq!(first, 1);
    let (got, first, late_end) = app_books(&late_got.join().unwrap());
    let join = &c.stats(late)["counters"]["join"];
    eprintln!("late receiver: line {first}..{late_end}, join {join}");
    assert_eq!(join["joined"], true, "{join}");
    assert!(join["joined_at_sequence"].as_u64().unwrap() > 1_000, "{join}");
    assert_eq!(late_end, end, "both lines end at the feed's end");
    assert_eq!(got.diff(&want), None, "the late receiver's books are the early one's");
    // One snapshot per attempt: a snapshot that ends before the live line
    // the joiner holds (the sender built it a moment too early on a busy
    // host) is asked for again at once, never patched over.
    let attempts = join["attempts"].as_u64().unwrap();
    assert!((1..=3).contains(&attempts), "{join}");
    let served = &c.stats(sender)["counters"]["snapshot"];
    assert_eq!(served["snapshots_sent"], attempts, "{served}");
    assert_eq!(served["serving"], true, "{served}");
    assert_eq!(served["copies_dropped"], 0, "{served}");
}

#[test]
fn the_snapshot_server_shrugs_off_misbehaving_clients_and_refuses_stale_books() {
    let dir = common::tmp();
    let err = dir.path().join("server.txt");
    let (listen, feed) = ("127.0.0.1:9728", "127.0.0.1:9729");
    let mut server = spawn(
        &["snapshot-server", "--listen", listen, "--feed", feed, "--per-address-max", "2", "--connects-per-s", "50"],
        &err,
    );
    let t0 = Instant::now();
    let connect = || loop {
        match TcpStream::connect(listen) {
            Ok(s) => return s,
            Err(_) if t0.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("no snapshot server: {e}"),
        }
    };
    // Two idle connections hold this address's share; a third is refused (closed at once).
    let idle = [connect(), connect()];
    let mut third = connect();
    third.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(third.read(&mut [0u8; 16]).unwrap_or(0), 0, "a third connection from one address is closed");
    drop(idle);
    std::thread::sleep(Duration::from_millis(100));
    // Garbage is answered by closing.
    let mut g = connect();
    g.write_all(&[0, 0, 0xff, 0xff]).unwrap();
    g.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(g.read(&mut [0u8; 16]).unwrap_or(0), 0);
    // No feed yet: a login is answered with Login Rejected 'S' (session not available).
    let mut l = connect();
    let mut login = Vec::new();
    fairfeed_feed::snapshot::push_frame(
        &mut login,
        fairfeed_wire::soupbintcp::PacketRepr::LoginRequest {
            username: fairfeed_wire::Alpha::from_str_padded(""),
            password: fairfeed_wire::Alpha::from_str_padded(""),
            session: fairfeed_wire::Alpha([b' '; 10]),
            sequence: 1,
        },
    );
    l.write_all(&login).unwrap();
    l.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    let n = l.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], &[0, 2, b'J', b'S']);
    // A feed joined mid-session is never served.
    let mut pkt = [0u8; 20];
    pkt[..10].copy_from_slice(b"LATE000001");
    pkt[17] = 50;
    UdpSocket::bind("127.0.0.1:0").unwrap().send_to(&pkt, feed).unwrap();
    // Let the server read it (it wakes on the datagram) before it is stopped.
    std::thread::sleep(Duration::from_millis(500));
    term(&mut server);
    let report = std::fs::read_to_string(&err).unwrap();
    assert!(report.contains("\"per_address\": 1"), "{report}");
    assert!(report.contains("\"garbage\": 1"), "{report}");
    assert!(report.contains("\"not_serving\": 1"), "{report}");
    assert!(report.contains("not at 1: the books lack what came before"), "{report}");
}
