//! Fuzz target: arbitrary bytes into the snapshot service — as feed datagrams
//! into the follower, as a client's bytes into a server connection, as a
//! server's bytes into a joiner, and as live packets into that joiner.
//! Nothing may panic; a follower that serves has a snapshot that parses as
//! SoupBinTCP, has no more messages than the feed it stands for, and
//! rebuilds the same books in empty ones.
#![no_main]
use fairfeed_feed::book::Books;
use fairfeed_feed::snapshot::join::{Joiner, Stream};
use fairfeed_feed::snapshot::serve::{Credentials, ServerConn};
use fairfeed_feed::snapshot::Follower;
use fairfeed_wire::soupbintcp::{split_packet, PacketRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut f = Follower::new(1_000_000, 1 << 16);
    let mut j = Joiner::new(0, "", "");
    j.login(0);
    let mut conn = ServerConn::new(0);
    let creds = Credentials::default();
    let (mut i, mut now) = (0usize, 0u64);
    while i + 3 <= data.len() {
        let sel = data[i];
        let len = usize::from(u16::from_be_bytes([data[i + 1], data[i + 2]]) % 1_500);
        i += 3;
        let chunk = &data[i..(i + len).min(data.len())];
        i += chunk.len();
        now += 100_000;
        match sel % 4 {
            0 => f.on_packet(now, chunk),
            1 => {
                let _ = conn.on_bytes(now, chunk, &creds, &mut || f.snapshot());
                let n = conn.unsent().len() / 2;
                conn.wrote(n, now);
            }
            2 => {
                if j.on_stream(now, chunk, &mut |_| {}) == Stream::Finished {
                    j = Joiner::new(now, "", "");
                    j.login(now);
                }
            }
            _ => j.on_live(now, chunk, &mut |_| {}),
        }
        f.on_tick(now);
        let _ = conn.on_tick(now);
        j.on_tick(now);
    }
    let next = f.next_sequence();
    if let Ok(s) = f.snapshot() {
        assert!(s.messages as u64 <= next - 1);
        let mut rebuilt = Books::new();
        let mut rest = &s.frames[..];
        while !rest.is_empty() {
            let (p, used) = split_packet(rest).expect("a snapshot parses").expect("whole packets");
            if let PacketRepr::SequencedData(m) = p {
                if m[0] != b'G' {
                    rebuilt.apply(m).expect("a snapshot message applies");
                }
            }
            rest = &rest[used..];
        }
        assert_eq!(rebuilt.diff(f.books()), None);
    }
});
