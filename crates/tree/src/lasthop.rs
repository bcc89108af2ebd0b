//! The last hop of Jasper's deployment models 2 and 3 (seed 000 §8), sans-IO.
//!
//! In model 2 an exchange-controlled **gateway** is a tree receiver that
//! holds and releases, then forwards each released packet to its firms'
//! own hosts over one more hop; in model 3 the receiver VM releases into a
//! channel to the firm's **enclave**. Either way the hop after the release
//! point has a delay of its own, different per host, which the tree cannot
//! see — and unfairness the tree removed comes back on it.
//!
//! [`LastHop`] takes it out again: it probes each host (a [`probe`] the host
//! echoes), keeps each host's recent one-way delays (half the round trip,
//! measured on the gateway's own clock — a firm's host is not trusted to
//! stamp anything), and sends each released packet to host `h` at
//! `deadline − lead_h`, where `lead_h` is a quantile (the median by default)
//! of that host's delays. Packets then reach the hosts, not only the
//! gateway, at the deadline. [`LastHop::lead_max_ns`] is what the release
//! point must release ahead of the deadline and add to the delays it
//! reports up the tree (`Receiver::set_last_hop_ns`), so the sender's
//! deadline covers the last hop as well.
//!
//! Guarantees, and their limits:
//! - per host, packets leave in the order they were released (one queue, a
//!   cursor per host): a MoldUDP64 line stays in order on every host;
//! - a host's lead is at most [`LastHopConfig::lead_max_ns`] (counted in
//!   `capped` when its delays ask for more) and 0 until it has answered
//!   [`PROBES_MIN`] probes (counted as `unprobed` sends) — an unmodified
//!   ITCH consumer that answers nothing gets the packet at the deadline;
//! - a packet released after its send time for a host goes at once and is
//!   counted `late` with how late;
//! - at most [`PENDING_MAX`] packets wait; past that the oldest goes to
//!   every host at once (`pending_overflow`), never dropped.
//!
//! What a host can do against it: delay its echoes to look farther away
//! and be sent to earlier — by at most half the delay it adds and never by
//! more than `lead_max_ns`; each host's lead is reported, and the exchange's
//! cheat watch judges the firm's orders as for any receiver. Half the round
//! trip is the one-way delay only on a symmetric hop; an asymmetric one
//! leaves half the asymmetry as residual (reported by the process tests).

use std::collections::VecDeque;

use serde::Serialize;

/// Hosts one last hop serves at most.
pub const HOSTS_MAX: usize = 64;
/// Packets waiting for their send time at most (all hosts share them).
pub const PENDING_MAX: usize = 65_536;
/// One-way delays kept per host (the lead's quantile is taken over them).
pub const DELAY_WINDOW: usize = 512;
/// Echoes a host must have answered before its lead is used.
pub const PROBES_MIN: usize = 16;
/// Probes per host in flight at once (an echo must match one of them).
pub const OUTSTANDING_MAX: usize = 16;
/// The longest lead a host may get, ns (a hop slower than this is a misconfiguration).
pub const LEAD_LIMIT_NS: u64 = 100_000_000;
/// How often each host is probed by default, ns.
pub const PROBE_INTERVAL_DEFAULT_NS: u64 = 10_000_000;
/// A send this much after its aim counts as late, ns (timer precision).
pub const LATE_SLACK_NS: u64 = 20_000;

/// The probe a release point sends over its last hop, and the echo.
pub mod probe {
    /// Bytes of a probe or an echo.
    pub const LEN: usize = 16;
    /// The first four bytes ("FFLH": fairfeed last hop). A MoldUDP64 packet
    /// starts with a 10-byte session of printable characters, so "FFLH"
    /// followed by a kind byte below 0x20 is never one.
    pub const MAGIC: [u8; 4] = *b"FFLH";

    /// A probe's kind.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        /// Sent by the release point.
        Probe = 1,
        /// Returned by the host.
        Echo = 2,
    }

    /// Why bytes are not a probe.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
    pub enum Error {
        /// Not LEN bytes.
        #[error("{0} bytes, a probe has {LEN}")]
        Length(usize),
        /// Not a last-hop probe.
        #[error("not a last-hop probe (magic)")]
        Magic,
        /// An unknown kind byte.
        #[error("unknown probe kind {0}")]
        Kind(u8),
    }

    /// A probe, read in place.
    #[derive(Debug, Clone, Copy)]
    pub struct View<'a>(&'a [u8; LEN]);

    impl<'a> View<'a> {
        /// Reads a probe in place.
        pub fn parse(b: &'a [u8]) -> Result<Self, Error> {
            let b: &[u8; LEN] = b.try_into().map_err(|_| Error::Length(b.len()))?;
            if b[..4] != MAGIC {
                return Err(Error::Magic);
            }
            match b[4] {
                1 | 2 => Ok(View(b)),
                k => Err(Error::Kind(k)),
            }
        }

        /// Probe or echo.
        pub fn kind(&self) -> Kind {
            if self.0[4] == 1 {
                Kind::Probe
            } else {
                Kind::Echo
            }
        }

        /// Its nonce.
        pub fn nonce(&self) -> u64 {
            let mut n = [0u8; 8];
            n.copy_from_slice(&self.0[8..16]);
            u64::from_be_bytes(n)
        }
    }

    /// Writes a probe or an echo.
    pub fn emit(kind: Kind, nonce: u64) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = kind as u8;
        b[8..].copy_from_slice(&nonce.to_be_bytes());
        b
    }

    /// Whether `b` starts like a probe (the host tells probes from data by it).
    pub fn looks_like(b: &[u8]) -> bool {
        b.len() >= 5 && b[..4] == MAGIC && b[4] < 0x20
    }

    /// The echo a host sends for probe `b` (None: `b` is no probe).
    pub fn echo(b: &[u8]) -> Option<[u8; LEN]> {
        let v = View::parse(b).ok()?;
        (v.kind() == Kind::Probe).then(|| emit(Kind::Echo, v.nonce()))
    }
}

/// A data packet with its deadline in front, for hosts that hold to it
/// (`fairfeed firm-host --hold`): "FFLD", 4 reserved bytes, the deadline
/// (u64, big-endian ns on the wall clock), then the MoldUDP64 packet.
pub mod framed {
    /// Bytes in front of the packet.
    pub const HEADER_LEN: usize = 16;
    /// The first four bytes.
    pub const MAGIC: [u8; 4] = *b"FFLD";

    /// Writes `payload` framed with `deadline_ns` into `out` (cleared first).
    pub fn emit(deadline_ns: u64, payload: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&deadline_ns.to_be_bytes());
        out.extend_from_slice(payload);
    }

    /// (deadline, packet) of a framed datagram; None: not framed.
    pub fn parse(b: &[u8]) -> Option<(u64, &[u8])> {
        if b.len() < HEADER_LEN || b[..4] != MAGIC {
            return None;
        }
        let mut d = [0u8; 8];
        d.copy_from_slice(&b[8..16]);
        Some((u64::from_be_bytes(d), &b[HEADER_LEN..]))
    }
}

/// A last hop's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LastHopConfig {
    /// Hosts, 1..=[`HOSTS_MAX`]; the shell maps index ↔ address.
    pub hosts: usize,
    /// Send to each host early by its lead (off: every host at the deadline).
    pub compensate: bool,
    /// How often each host is probed, ns.
    pub probe_interval_ns: u64,
    /// The quantile of a host's delays its lead is (0.5: the median).
    pub lead_quantile: f64,
    /// The longest lead a host gets, ns (≤ [`LEAD_LIMIT_NS`]).
    pub lead_max_ns: u64,
    /// Keys the probes' nonces (the shell draws it at random).
    pub secret: u64,
    /// The hosts hold each packet to its deadline themselves (framed with
    /// it): every host is then sent to at once, at `deadline − the largest
    /// lead` (the release), so no host's copy waits on a timer here.
    pub hosts_hold: bool,
}

impl Default for LastHopConfig {
    fn default() -> Self {
        LastHopConfig {
            hosts: 1,
            compensate: true,
            probe_interval_ns: PROBE_INTERVAL_DEFAULT_NS,
            lead_quantile: 0.5,
            lead_max_ns: 10_000_000,
            secret: 0,
            hosts_hold: false,
        }
    }
}

/// A bad [`LastHopConfig`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A host count outside 1..=HOSTS_MAX.
    #[error("{0} hosts: a last hop serves 1..={HOSTS_MAX}")]
    Hosts(usize),
    /// A lead quantile outside (0, 1).
    #[error("lead quantile {0}: give one in (0, 1)")]
    Quantile(f64),
    /// A lead limit above LEAD_LIMIT_NS.
    #[error("lead limit {0} ns: at most {LEAD_LIMIT_NS}")]
    LeadMax(u64),
    /// A probe interval outside 1 µs to 10 s.
    #[error("probe interval {0} ns: give 1 µs to 10 s")]
    ProbeInterval(u64),
}

/// One host's counters and its current lead.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HostStats {
    /// Packets sent to it.
    pub sent: u64,
    /// Sent more than [`LATE_SLACK_NS`] after their aim (released too late for it).
    pub late: u64,
    /// ... and by how much at most, ns.
    pub late_max_ns: u64,
    /// Sent while it had not yet answered [`PROBES_MIN`] probes (lead 0).
    pub unprobed: u64,
    /// Probes sent to it.
    pub probes: u64,
    /// Echoes it returned.
    pub echoes: u64,
    /// Echoes matching no probe in flight (forged, duplicated or too late).
    pub stray_echoes: u64,
    /// Its lead now, ns, and the least one-way delay seen.
    pub lead_ns: u64,
    /// The least one-way delay seen, ns.
    pub delay_min_ns: u64,
    /// Times its delays asked for more than the lead limit.
    pub capped: u64,
}

/// The last hop's counters.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LastHopStats {
    /// Packets released to the hop.
    pub released: u64,
    /// Packets sent to every host at once because PENDING_MAX were waiting (never dropped).
    pub pending_overflow: u64,
    /// Packets from the hop that were no echo.
    pub bad_packets: u64,
    /// The largest lead of any host now, ns.
    pub lead_max_ns: u64,
    /// Each host's counters.
    pub hosts: Vec<HostStats>,
}

/// What the last hop sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out<'a> {
    /// A probe for `host`.
    Probe {
        /// The host.
        host: usize,
        /// The probe's bytes.
        bytes: [u8; probe::LEN],
    },
    /// A packet for `host`, due there at `deadline_ns`.
    Data {
        /// The host.
        host: usize,
        /// When it is due there, ns.
        deadline_ns: u64,
        /// The packet.
        payload: &'a [u8],
    },
}

struct Host {
    /// Absolute index of the next packet it gets.
    cursor: u64,
    delays: VecDeque<u64>,
    /// (nonce, sent) of probes in flight, oldest first.
    outstanding: VecDeque<(u64, u64)>,
    lead_ns: u64,
    stats: HostStats,
}

struct Pending {
    deadline_ns: u64,
    payload: Vec<u8>,
}

/// The last hop (see the module docs).
pub struct LastHop {
    cfg: LastHopConfig,
    hosts: Vec<Host>,
    pending: VecDeque<Pending>,
    /// Absolute index of `pending[0]`.
    base: u64,
    next_probe_ns: u64,
    probe_count: u64,
    released: u64,
    pending_overflow: u64,
    bad_packets: u64,
    /// The largest lead (kept as the hosts' leads change).
    lead_max: u64,
}

/// SplitMix64: a probe's nonce from the secret and its number.
fn nonce(secret: u64, n: u64) -> u64 {
    let mut z = secret.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl LastHop {
    /// A last hop with `cfg` (refused when out of range).
    pub fn new(cfg: LastHopConfig) -> Result<Self, ConfigError> {
        if cfg.hosts == 0 || cfg.hosts > HOSTS_MAX {
            return Err(ConfigError::Hosts(cfg.hosts));
        }
        if !(cfg.lead_quantile > 0.0 && cfg.lead_quantile < 1.0) {
            return Err(ConfigError::Quantile(cfg.lead_quantile));
        }
        if cfg.lead_max_ns > LEAD_LIMIT_NS {
            return Err(ConfigError::LeadMax(cfg.lead_max_ns));
        }
        if !(1_000..=10_000_000_000).contains(&cfg.probe_interval_ns) {
            return Err(ConfigError::ProbeInterval(cfg.probe_interval_ns));
        }
        let hosts = (0..cfg.hosts)
            .map(|_| Host {
                cursor: 0,
                delays: VecDeque::with_capacity(DELAY_WINDOW),
                outstanding: VecDeque::with_capacity(OUTSTANDING_MAX),
                lead_ns: 0,
                stats: HostStats::default(),
            })
            .collect();
        Ok(LastHop {
            cfg,
            hosts,
            pending: VecDeque::new(),
            base: 0,
            next_probe_ns: 0,
            probe_count: 0,
            released: 0,
            pending_overflow: 0,
            bad_packets: 0,
            lead_max: 0,
        })
    }

    /// Its settings.
    pub fn config(&self) -> &LastHopConfig {
        &self.cfg
    }

    /// Host `h`'s lead now, ns: how long before the deadline its packets leave.
    pub fn lead_ns(&self, h: usize) -> u64 {
        self.hosts.get(h).map_or(0, |x| x.lead_ns)
    }

    /// The largest lead: how far ahead of each deadline the release point
    /// must release, and what it adds to the delays it reports.
    pub fn lead_max_ns(&self) -> u64 {
        self.lead_max
    }

    /// How long before a deadline host `h`'s copy leaves.
    fn lead_of(&self, h: &Host) -> u64 {
        if self.cfg.hosts_hold {
            self.lead_max
        } else {
            h.lead_ns
        }
    }

    /// A packet released with deadline `deadline_ns` (the time the hosts
    /// should have it; the shell's clock, like `now`).
    pub fn on_release(&mut self, now: u64, deadline_ns: u64, payload: &[u8], out: &mut impl FnMut(Out<'_>)) {
        if self.pending.len() >= PENDING_MAX {
            self.pending_overflow += 1;
            self.flush_oldest(now, out);
        }
        self.released += 1;
        self.pending.push_back(Pending { deadline_ns, payload: payload.to_vec() });
        self.send_due(now, out);
    }

    /// Sends the oldest waiting packet to every host that has not had it.
    fn flush_oldest(&mut self, now: u64, out: &mut impl FnMut(Out<'_>)) {
        let base = self.base;
        let hold = self.cfg.hosts_hold.then_some(self.lead_max);
        if let Some(p) = self.pending.front() {
            for (i, h) in self.hosts.iter_mut().enumerate() {
                if h.cursor == base {
                    let lead = hold.unwrap_or(h.lead_ns);
                    Self::count_send(h, now, p.deadline_ns.saturating_sub(lead), self.cfg.compensate);
                    out(Out::Data { host: i, deadline_ns: p.deadline_ns, payload: &p.payload });
                    h.cursor += 1;
                }
            }
        }
        self.trim();
    }

    /// Counts a send to `h` at `now` meant for `aim`.
    fn count_send(h: &mut Host, now: u64, aim: u64, compensate: bool) {
        h.stats.sent += 1;
        if compensate && h.stats.echoes < PROBES_MIN as u64 {
            h.stats.unprobed += 1;
        }
        let late = now.saturating_sub(aim);
        if late > LATE_SLACK_NS {
            h.stats.late += 1;
            h.stats.late_max_ns = h.stats.late_max_ns.max(late);
        }
    }

    /// Drops the packets every host has had.
    fn trim(&mut self) {
        let least = self.hosts.iter().map(|h| h.cursor).min().unwrap_or(self.base);
        while self.base < least && self.pending.pop_front().is_some() {
            self.base += 1;
        }
    }

    /// Sends what is due at `now`: packets whose time has come, and probes.
    /// Returns how many it sent.
    pub fn send_due(&mut self, now: u64, out: &mut impl FnMut(Out<'_>)) -> usize {
        let mut n = 0;
        let hold = self.cfg.hosts_hold.then_some(self.lead_max);
        for (i, h) in self.hosts.iter_mut().enumerate() {
            let lead = hold.unwrap_or(h.lead_ns);
            while let Some(p) = usize::try_from(h.cursor - self.base).ok().and_then(|k| self.pending.get(k)) {
                let aim = p.deadline_ns.saturating_sub(lead);
                if aim > now {
                    break;
                }
                Self::count_send(h, now, aim, self.cfg.compensate);
                out(Out::Data { host: i, deadline_ns: p.deadline_ns, payload: &p.payload });
                h.cursor += 1;
                n += 1;
            }
        }
        self.trim();
        if self.cfg.compensate && now >= self.next_probe_ns {
            self.next_probe_ns = now + self.cfg.probe_interval_ns;
            for (i, h) in self.hosts.iter_mut().enumerate() {
                let k = nonce(self.cfg.secret, self.probe_count);
                self.probe_count += 1;
                if h.outstanding.len() >= OUTSTANDING_MAX {
                    h.outstanding.pop_front();
                }
                h.outstanding.push_back((k, now));
                h.stats.probes += 1;
                out(Out::Probe { host: i, bytes: probe::emit(probe::Kind::Probe, k) });
                n += 1;
            }
        }
        n
    }

    /// A packet from host `host` over the hop: its echo.
    pub fn on_packet(&mut self, now: u64, host: usize, bytes: &[u8]) {
        let Some(h) = self.hosts.get_mut(host) else {
            self.bad_packets += 1;
            return;
        };
        let nonce = match probe::View::parse(bytes) {
            Ok(v) if v.kind() == probe::Kind::Echo => v.nonce(),
            _ => {
                self.bad_packets += 1;
                return;
            }
        };
        let Some(k) = h.outstanding.iter().position(|&(n, _)| n == nonce) else {
            h.stats.stray_echoes += 1;
            return;
        };
        let (_, sent) = h.outstanding[k];
        // Older probes than this one are lost or reordered: forget them.
        h.outstanding.drain(..=k);
        h.stats.echoes += 1;
        let delay = now.saturating_sub(sent) / 2;
        if h.delays.len() == DELAY_WINDOW {
            h.delays.pop_front();
        }
        h.delays.push_back(delay);
        h.stats.delay_min_ns = if h.stats.echoes == 1 { delay } else { h.stats.delay_min_ns.min(delay) };
        if h.delays.len() >= PROBES_MIN {
            let mut v: Vec<u64> = h.delays.iter().copied().collect();
            let i = ((v.len() - 1) as f64 * self.cfg.lead_quantile).round() as usize;
            let (_, q, _) = v.select_nth_unstable(i);
            let want = *q;
            if want > self.cfg.lead_max_ns {
                h.stats.capped += 1;
            }
            h.lead_ns = want.min(self.cfg.lead_max_ns);
            self.lead_max = self.hosts.iter().map(|h| h.lead_ns).max().unwrap_or(0);
        }
    }

    /// The earliest time something is due: a host's next packet or the next probe.
    pub fn next_timeout(&self) -> Option<u64> {
        let data = self
            .hosts
            .iter()
            .filter_map(|h| {
                let p = self.pending.get(usize::try_from(h.cursor - self.base).ok()?)?;
                Some(p.deadline_ns.saturating_sub(self.lead_of(h)))
            })
            .min();
        let probe = self.cfg.compensate.then_some(self.next_probe_ns);
        match (data, probe) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Packets waiting for some host.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Its counters now.
    pub fn stats(&self) -> LastHopStats {
        LastHopStats {
            released: self.released,
            pending_overflow: self.pending_overflow,
            bad_packets: self.bad_packets,
            lead_max_ns: self.lead_max_ns(),
            hosts: self.hosts.iter().map(|h| HostStats { lead_ns: h.lead_ns, ..h.stats.clone() }).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Drives a last hop against hosts at fixed one-way delays; returns when
    /// each host got each packet (index by release), and the hop.
    fn run(delays: &[u64], compensate: bool, packets: u64) -> (Vec<Vec<u64>>, LastHop) {
        run_with(delays, LastHopConfig { compensate, ..LastHopConfig::default() }, packets)
    }

    fn run_with(delays: &[u64], cfg: LastHopConfig, packets: u64) -> (Vec<Vec<u64>>, LastHop) {
        let cfg = LastHopConfig { hosts: delays.len(), secret: 7, ..cfg };
        let mut hop = LastHop::new(cfg).unwrap();
        let mut got = vec![Vec::new(); delays.len()];
        // Echoes in flight: (arrival at the gateway, host, bytes).
        let mut echoes: Vec<(u64, usize, [u8; probe::LEN])> = Vec::new();
        let mut now = 0u64;
        let start = 1_000_000_000; // a second of probing first
        let mut next_packet = start;
        let mut k = 0u64;
        while k < packets || hop.pending() > 0 {
            let mut sent = Vec::new();
            if now >= next_packet && k < packets {
                let payload = k.to_be_bytes();
                hop.on_release(now, now + 2_000_000, &payload, &mut |o| sent.push(own(o)));
                k += 1;
                next_packet += 100_000;
            }
            hop.send_due(now, &mut |o| sent.push(own(o)));
            for (h, bytes) in sent {
                match bytes {
                    Ok(b) => echoes.push((now + 2 * delays[h], h, probe::echo(&b).unwrap())),
                    Err(_) => got[h].push(now + delays[h]),
                }
            }
            echoes.retain(|&(at, h, b)| {
                if at <= now {
                    hop.on_packet(now, h, &b);
                    false
                } else {
                    true
                }
            });
            now += 1_000;
        }
        (got, hop)
    }

    /// An [`Out`] as (host, Ok(probe) | Err(payload)).
    fn own(o: Out<'_>) -> (usize, Result<[u8; probe::LEN], Vec<u8>>) {
        match o {
            Out::Probe { host, bytes } => (host, Ok(bytes)),
            Out::Data { host, payload, .. } => (host, Err(payload.to_vec())),
        }
    }

    #[test]
    fn compensation_brings_hosts_at_different_distances_together() {
        let delays = [10_000, 200_000, 500_000];
        let (got, hop) = run(&delays, true, 200);
        for (h, (g, d)) in got.iter().zip(delays).enumerate() {
            assert_eq!(g.len(), 200);
            assert_eq!(hop.lead_ns(h), d, "host {h}'s lead is its delay");
        }
        assert_eq!(hop.lead_max_ns(), 500_000);
        for k in 0..200 {
            let (lo, hi) = got.iter().fold((u64::MAX, 0), |(a, b), g| (a.min(g[k]), b.max(g[k])));
            assert!(hi - lo <= 1_000, "packet {k}: hosts {lo}..{hi} (the test's 1-µs step)");
        }
        let s = hop.stats();
        assert!(s.hosts.iter().all(|h| h.late == 0 && h.unprobed == 0 && h.stray_echoes == 0), "{s:?}");
    }

    /// Hosts that hold get every copy at once, the largest lead early:
    /// each arrives before its deadline, by that lead less its own delay.
    #[test]
    fn hosts_that_hold_are_sent_to_at_once_the_largest_lead_early() {
        let delays = [10_000, 500_000];
        let (got, hop) = run_with(&delays, LastHopConfig { hosts_hold: true, ..LastHopConfig::default() }, 50);
        assert_eq!(hop.lead_max_ns(), 500_000);
        assert_eq!(got[0].len(), 50);
        for (near, far) in got[0].iter().zip(&got[1]) {
            assert_eq!(far - near, 490_000, "sent together, so apart by their delays");
        }
        assert!(hop.stats().hosts.iter().all(|h| h.late == 0), "{:?}", hop.stats());
    }

    #[test]
    fn without_compensation_the_hop_s_spread_remains() {
        let (got, hop) = run(&[10_000, 500_000], false, 50);
        assert!(got[1].iter().zip(&got[0]).all(|(b, a)| b - a == 490_000));
        assert_eq!(hop.stats().hosts[0].probes, 0, "no probes without compensation");
    }

    #[test]
    fn a_host_that_answers_nothing_gets_the_packet_at_the_deadline() {
        let mut hop = LastHop::new(LastHopConfig { hosts: 1, ..LastHopConfig::default() }).unwrap();
        let mut sent = Vec::new();
        hop.on_release(0, 5_000, b"x", &mut |o| sent.push(own(o)));
        hop.send_due(4_999, &mut |o| sent.push(own(o)));
        assert!(sent.iter().all(|s| s.1.is_ok()), "only the probe before the deadline");
        assert_eq!(hop.next_timeout(), Some(5_000));
        hop.send_due(5_000, &mut |o| sent.push(own(o)));
        assert_eq!(sent.last().unwrap(), &(0, Err(b"x".to_vec())));
        assert_eq!(hop.stats().hosts[0].unprobed, 1);
    }

    #[test]
    fn forged_and_stray_echoes_change_nothing() {
        let mut hop = LastHop::new(LastHopConfig { hosts: 2, secret: 99, ..LastHopConfig::default() }).unwrap();
        let mut sent = Vec::new();
        hop.send_due(0, &mut |o| sent.push(own(o)));
        // A guessed nonce, an echo for another host's probe, a probe, junk, a host out of range.
        hop.on_packet(10, 0, &probe::emit(probe::Kind::Echo, 12345));
        let other = probe::echo(sent[1].1.as_ref().unwrap()).unwrap();
        hop.on_packet(10, 0, &other);
        hop.on_packet(10, 0, &probe::emit(probe::Kind::Probe, 1));
        hop.on_packet(10, 0, b"junk");
        hop.on_packet(10, 9, &other);
        let s = hop.stats();
        assert_eq!((s.hosts[0].stray_echoes, s.hosts[0].echoes, s.bad_packets), (2, 0, 3));
        // The genuine echo, once; its replay is stray.
        let mine = probe::echo(sent[0].1.as_ref().unwrap()).unwrap();
        hop.on_packet(20, 0, &mine);
        hop.on_packet(20, 0, &mine);
        assert_eq!((hop.stats().hosts[0].echoes, hop.stats().hosts[0].stray_echoes), (1, 3));
    }

    #[test]
    fn a_lead_is_capped_and_counted() {
        let cfg = LastHopConfig { hosts: 1, lead_max_ns: 50_000, ..LastHopConfig::default() };
        let mut hop = LastHop::new(cfg).unwrap();
        for i in 0..PROBES_MIN as u64 {
            let mut sent = Vec::new();
            let t = i * 20_000_000;
            hop.send_due(t, &mut |o| sent.push(own(o)));
            hop.on_packet(t + 400_000, 0, &probe::echo(sent[0].1.as_ref().unwrap()).unwrap());
        }
        assert_eq!(hop.lead_ns(0), 50_000);
        assert_eq!(hop.stats().hosts[0].capped, 1);
    }

    #[test]
    fn a_full_queue_sends_its_oldest_early_and_loses_nothing() {
        let mut hop = LastHop::new(LastHopConfig { hosts: 2, compensate: false, ..LastHopConfig::default() }).unwrap();
        let mut got = [0usize; 2];
        for k in 0..(PENDING_MAX + 10) as u64 {
            hop.on_release(0, 1_000_000, &k.to_be_bytes(), &mut |o| {
                if let Out::Data { host, .. } = o {
                    got[host] += 1;
                }
            });
        }
        assert_eq!(got, [10, 10]);
        assert_eq!(hop.stats().pending_overflow, 10);
        hop.send_due(1_000_000, &mut |o| {
            if let Out::Data { host, .. } = o {
                got[host] += 1;
            }
        });
        assert_eq!(got, [PENDING_MAX + 10; 2]);
        assert_eq!(hop.pending(), 0);
    }

    #[test]
    fn bad_configs_are_refused() {
        let ok = LastHopConfig::default();
        assert!(LastHop::new(LastHopConfig { hosts: 0, ..ok }).is_err());
        assert!(LastHop::new(LastHopConfig { hosts: HOSTS_MAX + 1, ..ok }).is_err());
        assert!(LastHop::new(LastHopConfig { lead_quantile: 1.0, ..ok }).is_err());
        assert!(LastHop::new(LastHopConfig { lead_max_ns: LEAD_LIMIT_NS + 1, ..ok }).is_err());
        assert!(LastHop::new(LastHopConfig { probe_interval_ns: 0, ..ok }).is_err());
    }

    proptest! {
        #[test]
        fn framed_packets_round_trip(deadline in any::<u64>(), payload in proptest::collection::vec(any::<u8>(), 0..64), junk in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut b = Vec::new();
            framed::emit(deadline, &payload, &mut b);
            prop_assert_eq!(framed::parse(&b), Some((deadline, &payload[..])));
            prop_assert!(!probe::looks_like(&b), "a framed packet is no probe");
            if junk.get(..4) != Some(&framed::MAGIC[..]) {
                prop_assert_eq!(framed::parse(&junk), None);
            }
        }

        #[test]
        fn probes_round_trip_and_junk_is_refused(kind in 1u8..=2, n in any::<u64>(), junk in proptest::collection::vec(any::<u8>(), 0..40)) {
            let k = if kind == 1 { probe::Kind::Probe } else { probe::Kind::Echo };
            let b = probe::emit(k, n);
            let v = probe::View::parse(&b).unwrap();
            prop_assert_eq!((v.kind(), v.nonce()), (k, n));
            prop_assert!(probe::looks_like(&b));
            // Anything else parses only if it is a probe's shape (bytes 5..8 are reserved).
            if let Ok(v) = probe::View::parse(&junk) {
                let b = probe::emit(v.kind(), v.nonce());
                prop_assert_eq!((&b[..5], &b[8..]), (&junk[..5], &junk[8..]));
            }
        }

        /// Whatever the leads and release times, every host gets every
        /// packet exactly once and in release order.
        #[test]
        fn every_host_gets_every_packet_once_in_order(
            delays in proptest::collection::vec(0u64..2_000_000, 1..6),
            gaps in proptest::collection::vec(0u64..300_000, 1..200),
            hold in 0u64..3_000_000,
        ) {
            let cfg = LastHopConfig { hosts: delays.len(), secret: 3, ..LastHopConfig::default() };
            let mut hop = LastHop::new(cfg).unwrap();
            let mut got: Vec<Vec<u64>> = vec![Vec::new(); delays.len()];
            let mut echoes: Vec<(u64, usize, [u8; probe::LEN])> = Vec::new();
            let mut now = 0u64;
            let rec = |o: Out<'_>, now: u64, got: &mut Vec<Vec<u64>>, echoes: &mut Vec<(u64, usize, [u8; probe::LEN])>| match o {
                Out::Probe { host, bytes } => echoes.push((now + 2 * delays[host], host, probe::echo(&bytes).unwrap())),
                Out::Data { host, payload, .. } => got[host].push(u64::from_be_bytes(payload.try_into().unwrap())),
            };
            for (k, g) in gaps.iter().enumerate() {
                now += g;
                hop.on_release(now, now + hold, &(k as u64).to_be_bytes(), &mut |o| rec(o, now, &mut got, &mut echoes));
                echoes.retain(|&(at, h, b)| if at <= now { hop.on_packet(now, h, &b); false } else { true });
                while let Some(t) = hop.next_timeout().filter(|&t| t <= now) {
                    let _ = t;
                    hop.send_due(now, &mut |o| rec(o, now, &mut got, &mut echoes));
                }
            }
            now += 10_000_000_000;
            hop.send_due(now, &mut |o| rec(o, now, &mut got, &mut echoes));
            let want: Vec<u64> = (0..gaps.len() as u64).collect();
            for g in &got {
                prop_assert_eq!(g, &want);
            }
            prop_assert_eq!(hop.pending(), 0);
        }
    }
}
