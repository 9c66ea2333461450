//! The host's free memory as Linux counts it: what the simulator may still take for its buffers (it
//! keeps every simulated GPU's memory in host memory), and what a measurement's pinned buffers and
//! host-side working copies may take on a real host.

/// The most kept back from what Linux reports available: for what a run holds besides its buffers
/// (descriptors, reports, the allocator's slack) and for the rest of the system. A host with little
/// available keeps back a sixteenth of it instead, so that small allocations still go through.
pub const MARGIN: u64 = 1 << 30;

/// Bytes of host memory this process may still take: `MemAvailable` of /proc/meminfo less a margin
/// ([`MARGIN`] at most). `None` where the kernel does not say (not Linux): then nothing is checked
/// against it.
pub fn free() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    available(&meminfo).map(|bytes| bytes - (bytes / 16).min(MARGIN))
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))?;
    let mut words = line.split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then(|| kib.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:         1000 kB\n\
                       MemAvailable:   22000000 kB\nBuffers:           10 kB\n";
        assert_eq!(available(meminfo), Some(22_000_000 * 1024));
        assert_eq!(available("MemTotal: 5 kB\n"), None);
        assert_eq!(available("MemAvailable: lots\n"), None);
    }

    #[test]
    fn this_host_says_what_is_free() {
        if cfg!(target_os = "linux") {
            assert!(free().is_some());
        }
    }
}
