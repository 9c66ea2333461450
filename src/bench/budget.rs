//! How long `bench` takes, and how a run on a few GPUs extrapolates to more.
//!
//! A test measures its places one after another — every ordered pair of GPUs for a matrix test
//! (n(n−1) of them on n GPUs), every GPU for a per-GPU test (n) — and one place costs about the same
//! on any host with the same GPUs and links. So, per test,
//!
//! ```text
//! wall(n GPUs) = places(n) × per place
//! per place    = samples × (warm-up + timed operations) × lanes × bytes / GB/s   the copies
//!              + lanes × bytes / host rate          filling the sources, checking the destinations
//!              + samples × sample overhead          holding, releasing, synchronising the streams
//! ```
//!
//! where the host rate is that of one pass of generating, writing, reading back and checking the
//! bytes. Every test of a `bench --json` document carries its `wall_s`, measured on the backend's
//! host clock, so a run on two GPUs (two ordered pairs) gives the per-place cost of each test and
//! [`extrapolate_s`] the time on eight (56 ordered pairs); add the backend's start-up (CUDA
//! initialisation, per GPU), which does not grow with the places.

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
    /// One pass of filling and checking on the host (generate, write, read back, check), GB/s.
    pub host_gbps: f64,
    /// Holding, releasing and synchronising the streams, per sample.
    pub sample_overhead_s: f64,
}

impl PlaceCost {
    /// Seconds for one place.
    pub fn seconds(&self) -> f64 {
        let copies = f64::from(self.samples) * f64::from(self.operations) * self.bytes as f64
            / (self.gbps * 1e9);
        let host = f64::from(self.lanes) * self.bytes as f64 / (self.host_gbps * 1e9);
        copies + host + f64::from(self.samples) * self.sample_overhead_s
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

    /// The default bench on eight H200s by the formula, with the H200 pair's copy rates and
    /// assumed host costs (a 4 GB/s pass of generating, writing, reading back and checking, 1 ms
    /// per sample to hold, release and synchronise, and the latency tests' few milliseconds per
    /// pair): under a minute. The lead replaces the assumptions with each test's measured `wall_s`.
    #[test]
    fn the_default_bench_on_eight_h200s_fits_in_a_minute_by_the_formula() {
        let place = |lanes: u32, bytes: u64, gbps: f64| PlaceCost {
            samples: 3,
            operations: 20,
            lanes,
            bytes,
            gbps,
            host_gbps: 4.0,
            sample_overhead_s: 1e-3,
        };
        let pairs = places(Shape::Matrix, 8) as f64;
        let gpus = places(Shape::PerDevice, 8) as f64;
        let bandwidth = pairs * place(1, PLATEAU.peer, 396.0).seconds() // ce-write
            + pairs * place(1, PLATEAU.peer, 380.0).seconds() // ce-read
            + pairs * place(2, PLATEAU.peer, 384.0).seconds() // ce-bidir-write
            + 2.0 * gpus * place(1, PLATEAU.host, 55.0).seconds() // h2d, d2h
            + gpus * place(1, PLATEAU.local, 2050.0).seconds(); // local
                                                                // copy-latency, issue-cost, e2e-latency, ping-pong, both pointer chases: per pair.
        let latency = pairs * (0.01 + 0.01 + 0.006 + 0.035 + 0.06 + 0.04);
        let total = bandwidth + latency;
        assert!(total < 60.0, "{total:.1} s ({bandwidth:.1} s bandwidth)");
    }
}
