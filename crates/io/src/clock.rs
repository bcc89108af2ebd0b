//! Clocks.

/// CLOCK_REALTIME in ns since the Unix epoch (what PTP/chrony discipline, and
/// what the kernel stamps received datagrams with); 0 before 1970.
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}
