//! How long `bench` takes, and how a run on a few GPUs extrapolates to more.
//!
//! A test measures its places one after another — every ordered pair of GPUs for a matrix test
//! (n(n−1) of them on n GPUs), every GPU for a per-GPU test (n) — and one place costs about the same
//! on any host with the same GPUs and links. So, per test,
//!
//! ```text
//! wall(n GPUs) = places(n) × per place
//! per place    = samples × (warm-up + timed operations) × bytes / GB/s   the copies
//!              + lanes × bytes / check rate     filling the sources, checking the destinations
//!              + samples × sample overhead      holding, releasing, synchronising the streams
//!              + place overhead                 allocating and freeing the buffers
//! total(n)     = Σ wall(n) over the tests + start-up(n)
//! ```
//!
//! The check rate is that of one pass of filling a message and checking it: on the GPU for device
//! memory ([`crate::backend::Patterns`], at the memory's speed: a 512 MiB message in about a
//! millisecond), on the host for pinned memory (generating, writing, reading back and checking:
//! 3.8 GB/s on the H200 pair, 0.14 s of ce-read's 0.22 s per 512 MiB place before the GPU took it
//! over).
//! Every test of a `bench --json` document carries its `wall_s`, measured on the backend's host
//! clock, so a run on two GPUs (two ordered pairs) gives the per-place cost of each test and
//! [`extrapolate_s`] the time on eight (56 ordered pairs). Start-up is what the process spends
//! outside the tests (opening the backend: CUDA initialisation, per GPU, and, before the first
//! test, a stream and the kernels on each GPU; scale it by the GPUs). What a test still pays once
//! (building the pointer chase's chain, mapping the host's scratch memory) is multiplied with its
//! places, so the extrapolation errs long.

use super::result::Shape;

/// The places a test of `shape` measures on `gpus` GPUs.
pub fn places(shape: Shape, gpus: usize) -> usize {
    match shape {
        Shape::Matrix => gpus * gpus.saturating_sub(1),
        Shape::PerDevice => gpus,
    }
}

/// A test's wall time on `gpus` GPUs from `wall_s` measured on `measured_gpus` of the same kind.
/// One GPU measures a matrix test on itself (one place), as two would on each ordered pair.
pub fn extrapolate_s(shape: Shape, wall_s: f64, measured_gpus: usize, gpus: usize) -> f64 {
    let measured = places(shape, measured_gpus).max(1);
    wall_s / measured as f64 * places(shape, gpus) as f64
}

/// What one place of a test costs, from first principles (see the module's formula).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlaceCost {
    pub samples: u32,
    /// Warm-up and timed operations per sample.
    pub operations: u32,
    /// Messages moving at once (2 for a bidirectional test).
    pub lanes: u32,
    pub bytes: u64,
    /// Each lane's copy rate, GB/s.
    pub gbps: f64,
    /// One pass of filling a message and checking it, GB/s: the GPU's for device memory, the
    /// host's (generate, write, read back, check) where a lane starts or ends in pinned memory.
    pub check_gbps: f64,
    /// Holding, releasing and synchronising the streams, per sample.
    pub sample_overhead_s: f64,
    /// Allocating and freeing the place's buffers, and whatever else a place pays once.
    pub place_overhead_s: f64,
}

impl PlaceCost {
    /// Seconds for one place.
    pub fn seconds(&self) -> f64 {
        let copies = f64::from(self.samples) * f64::from(self.operations) * self.bytes as f64
            / (self.gbps * 1e9);
        let checks = f64::from(self.lanes) * self.bytes as f64 / (self.check_gbps * 1e9);
        copies + checks + f64::from(self.samples) * self.sample_overhead_s + self.place_overhead_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::PLATEAU;

    #[test]
    fn places_grow_with_ordered_pairs_or_gpus() {
        assert_eq!(places(Shape::Matrix, 2), 2);
        assert_eq!(places(Shape::Matrix, 8), 56);
        assert_eq!(places(Shape::PerDevice, 8), 8);
        assert_eq!(places(Shape::Matrix, 1), 0);
        // 2 GPUs to 8: 28 times the pairs, 4 times the GPUs.
        assert_eq!(extrapolate_s(Shape::Matrix, 1.5, 2, 8), 42.0);
        assert_eq!(extrapolate_s(Shape::PerDevice, 1.5, 2, 8), 6.0);
        assert_eq!(extrapolate_s(Shape::Matrix, 0.5, 1, 8), 28.0);
    }

    #[test]
    fn each_plateau_size_reaches_99_percent_of_the_rate_by_the_alpha_beta_model() {
        // α (µs) and β (GB/s) seen on the H200s: peer copies, host links, local copies.
        for (bytes, alpha_us, beta_gbps) in [
            (PLATEAU.peer, 2.46, 396.4),
            (PLATEAU.host, 2.5, 55.3),
            (PLATEAU.local, 1.9, 2096.0),
        ] {
            let fraction = 1.0 / (1.0 + alpha_us * beta_gbps * 1e3 / bytes as f64);
            assert!(fraction > 0.995, "{bytes}: {fraction}");
        }
        // The old 64 MiB default left a local copy 5% short.
        assert!(1.0 / (1.0 + 1.9 * 2096.0 * 1e3 / f64::from(64u32 << 20)) < 0.95);
    }

    /// The default bench on eight H200s by the formula, from what the H200 pair measured
    /// (`benchmarks/h200-x2/bench*.json`): each latency test's `wall_s` per place (they fill and
    /// check 4 B, or their own small buffers), the copy rates, and ce-read's 0.22 s per 512 MiB
    /// place, 0.14 s of it the host's fill and check (3.8 GB/s). ce-write, the first test, took
    /// 0.38 s more: kernels compiled and loaded, the host's scratch memory mapped, once per run
    /// but multiplied by its 28. With the host filling and checking device memory the formula
    /// gives the 70–78 s measured; with the GPUs doing it, and the first use paid before the
    /// first test, about half a minute.
    #[test]
    fn the_default_bench_on_eight_h200s_fits_in_a_minute_once_the_gpus_check_the_bytes() {
        let pairs = places(Shape::Matrix, 8) as f64;
        let gpus = places(Shape::PerDevice, 8) as f64;
        // copy-latency, issue-cost, e2e-latency, pointer-chase, -resident, ping-pong: s per place;
        // e2e-latency's 0.028 s was one sample after another on one CPU (see below).
        let latency = |e2e_s: f64| pairs * (0.027 + 0.025 + e2e_s + 0.141 + 0.04 + 0.026);
        let host_check_gbps = 3.8;
        let total = |device_check_gbps: f64, first_use_s: f64, e2e_s: f64| {
            let place = |lanes: u32, bytes: u64, gbps: f64, check_gbps: f64| PlaceCost {
                samples: 3,
                operations: 20,
                lanes,
                bytes,
                gbps,
                check_gbps,
                sample_overhead_s: 1e-3,
                place_overhead_s: 5e-3,
            };
            let device = |lanes, bytes, gbps| place(lanes, bytes, gbps, device_check_gbps);
            let bandwidth = pairs * device(1, PLATEAU.peer, 396.0).seconds() // ce-write
                + pairs * device(1, PLATEAU.peer, 394.0).seconds() // ce-read
                + pairs * device(2, PLATEAU.peer, 391.0).seconds() // ce-bidir-write
                // h2d and d2h: one end pinned, filled or checked on the host.
                + 2.0 * gpus * place(1, PLATEAU.host, 55.0, host_check_gbps).seconds()
                + gpus * device(1, PLATEAU.local, 2130.0).seconds(); // local
            bandwidth + latency(e2e_s) + pairs / 2.0 * first_use_s
        };
        let on_the_host = total(host_check_gbps, 0.38, 0.028);
        assert!(
            (66.0..82.0).contains(&on_the_host),
            "{on_the_host:.1} s: the pair measured 70–78 s"
        );
        // One pass over 512 MiB on an H200 (4.8 TB/s HBM3e) takes well under a millisecond, the
        // kernel launches and synchronisations around it some tens of µs: 500 GB/s errs long.
        let on_the_gpus = total(500.0, 0.0, 0.028);
        assert!(on_the_gpus < 40.0, "{on_the_gpus:.1} s");
        // Even were the first use still inside the first test.
        assert!(total(500.0, 0.38, 0.028) < 50.0);
        // e2e-latency now takes a sample on each CPU the thread may run on: 0.071 s for the pair's
        // two places over 32 CPUs (2026-11-30 latenight), so 0.071 s a place where it visits its
        // most, 64.
        assert!(total(500.0, 0.38, 0.071) < 52.0);
    }
}
