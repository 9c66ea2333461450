//! The tests, one type per kind of test, and the registry that names them.
//!
//! Every test measures one place at a time — an ordered GPU pair or one GPU — through
//! [`TestCase::measure`], so the same code fills a matrix, a per-GPU list and a size sweep.

mod host;
pub(crate) mod latency;
mod managed;
mod peer;
mod resident;

pub use host::{Fan, FanDirection, HostCopy, HostDirection};
pub(crate) use latency::Buffers;
pub use latency::{ChaseChain, EndToEnd, PingPong, PointerChase, SmallCopy, SmallCopyFigure};
pub(crate) use managed::ManagedReader;
pub use managed::{ManagedRead, Policy};
pub use peer::{Initiator, PeerCopy, Transport};
pub use resident::{ResidentLatency, ResidentWrite, RESIDENT_LATENCY_BYTES};

use super::footprint::Footprint;
use super::result::{Place, Shape, TestInfo, Unit};
use super::stats::Stats;
use super::timing::{LaneLabel, Measurement, Sampling};
use crate::backend::{Backend, StreamId};
use crate::pattern::SplitMix;
use crate::topology::Topology;
use crate::Result;
use std::collections::HashMap;

/// What one place's measurement gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Measured {
        /// In the test's unit.
        value: f64,
        /// All directions together, for tests that run several at once.
        total: Option<f64>,
        /// The per-operation time behind `value`, µs.
        time_us: Stats,
        /// Something the reader should know about this place (peers left out of a fan…).
        note: Option<String>,
    },
    /// Not measured, with the reason (`no P2P: …`).
    Skipped(String),
}

/// A test: what it measures and how, one place at a time.
pub trait TestCase: Sync {
    fn name(&self) -> &str;
    fn unit(&self) -> Unit;
    fn shape(&self) -> Shape;
    /// What a figure is: read or write, which context issued it, one direction or both, GPU or CPU
    /// time.
    fn measures(&self) -> String;
    /// Bytes per message when the user asks for `requested` (latency tests use their own size).
    fn message_bytes(&self, requested: u64) -> u64 {
        requested
    }
    /// Bytes per message by default on real GPUs: where the test's figure reaches its plateau
    /// (see [`crate::bench::PLATEAU`]).
    fn plateau_bytes(&self) -> u64 {
        crate::bench::PLATEAU.host
    }
    /// Whether a message-size sweep of this test means something.
    fn sweeps(&self) -> bool {
        false
    }
    /// What measuring `place` at `bytes` holds in memory at its peak: its buffers (rotation
    /// included) and, where a message starts or ends in pinned host memory, the host's copy of it
    /// to fill or check (device memory is filled and checked on its GPU). The latency tests, whose
    /// buffers are small and of a fixed size, count none (the pointer chase checks its own;
    /// ping-pong counts its flags' allocations, a page each).
    fn footprint(&self, _ctx: &Context<'_>, _place: Place, _bytes: u64) -> Result<Footprint> {
        Ok(Footprint::default())
    }

    /// Measures one place (a pair for matrix tests, a device for per-device tests) at `bytes`.
    fn measure(&self, ctx: &mut Context<'_>, place: Place, bytes: u64) -> Result<Outcome>;

    fn info(&self, requested: u64) -> TestInfo {
        TestInfo {
            name: self.name().to_string(),
            unit: self.unit(),
            shape: self.shape(),
            size_bytes: self.message_bytes(requested),
            measures: self.measures(),
        }
    }
}

/// Every test peerlink knows, in report order.
pub fn registry() -> Vec<Box<dyn TestCase>> {
    use crate::backend::CopyMethod::{CopyEngine, SmKernel};
    let mut tests: Vec<Box<dyn TestCase>> = Vec::new();
    for (route, prefix) in [
        (Transport::Direct(CopyEngine), "ce"),
        (Transport::Direct(SmKernel), "sm"),
    ] {
        for bidirectional in [false, true] {
            for initiator in [Initiator::Source, Initiator::Destination] {
                tests.push(Box::new(PeerCopy::new(
                    prefix,
                    route,
                    initiator,
                    bidirectional,
                )));
            }
        }
    }
    tests.push(Box::new(PeerCopy::new(
        "staged",
        Transport::Staged,
        Initiator::Source,
        false,
    )));
    tests.push(Box::new(PeerCopy::new(
        "staged",
        Transport::Staged,
        Initiator::Source,
        true,
    )));
    tests.push(Box::new(Fan(FanDirection::AllToOne)));
    tests.push(Box::new(Fan(FanDirection::OneToAll)));
    tests.push(Box::new(HostCopy::new(HostDirection::HostToDevice)));
    tests.push(Box::new(HostCopy::new(HostDirection::DeviceToHost)));
    tests.push(Box::new(HostCopy::new(HostDirection::Local)));
    tests.push(Box::new(SmallCopy(SmallCopyFigure::GpuTime)));
    tests.push(Box::new(SmallCopy(SmallCopyFigure::IssueCost)));
    tests.push(Box::new(EndToEnd));
    tests.push(Box::new(PointerChase(ChaseChain::Flushed)));
    tests.push(Box::new(PointerChase(ChaseChain::Resident)));
    tests.push(Box::new(PingPong));
    tests.push(Box::new(ResidentLatency));
    tests.push(Box::new(ResidentWrite));
    for policy in [
        Policy::FirstTouch,
        Policy::AccessedBy,
        Policy::Prefetch,
        Policy::ReadMostly,
    ] {
        tests.push(Box::new(ManagedRead::new(policy)));
    }
    tests.push(Box::new(ManagedRead::fault_latency()));
    tests
}

/// Everything a test needs while it runs: the backend, the choices, reusable streams (destroyed with
/// the context).
pub struct Context<'a> {
    pub backend: &'a dyn Backend,
    pub devices: Vec<usize>,
    pub sampling: Sampling,
    /// Samples of the cheap latency tests (copy-latency, issue-cost, e2e-latency, ping-pong), whose
    /// medians need more of them than a bandwidth's; `sampling.samples` unless set.
    pub latency_samples: u32,
    /// Bytes the pointer chase spreads its chain over (bigger than the caches on real GPUs).
    pub chase_region_bytes: u64,
    /// Streams made so far, per device; a measurement asks for the k-th of a device.
    streams: HashMap<usize, Vec<StreamId>>,
    /// The pointer-chase chain, built once per region size.
    chain: Option<(u64, std::sync::Arc<Vec<u8>>)>,
    seed: u64,
}

impl<'a> Context<'a> {
    pub fn new(
        backend: &'a dyn Backend,
        devices: Vec<usize>,
        sampling: Sampling,
        chase_region_bytes: u64,
    ) -> Context<'a> {
        Context {
            backend,
            devices,
            sampling,
            latency_samples: sampling.samples,
            chase_region_bytes,
            streams: HashMap::new(),
            chain: None,
            seed: 0,
        }
    }

    pub fn topology(&self) -> &'a Topology {
        self.backend.topology()
    }

    /// One stream per entry of `devices`, distinct even where a device repeats (the k-th
    /// occurrence of a device gets its k-th stream). Streams are made once and reused.
    pub fn streams(&mut self, devices: &[usize]) -> Result<Vec<StreamId>> {
        let mut used: HashMap<usize, usize> = HashMap::new();
        let mut out = Vec::with_capacity(devices.len());
        for &device in devices {
            let k = used.entry(device).or_default();
            let pool = self.streams.entry(device).or_default();
            if pool.len() <= *k {
                pool.push(self.backend.create_stream(device)?);
            }
            out.push(pool[*k]);
            *k += 1;
        }
        Ok(out)
    }

    /// A fresh seed for each measurement, so no two fill the same patterns.
    pub fn next_seed(&mut self) -> u64 {
        self.seed += 1;
        self.seed
    }

    /// How large one buffer may grow through rotation on `device` (a fraction of its free memory).
    pub fn buffer_budget(&self, device: usize) -> Result<u64> {
        Ok(self.backend.free_memory(device)? / 8)
    }

    /// The pointer-chase chain for the current region: u64 element indices forming one random cycle
    /// through nodes `CHASE_NODE_STRIDE` elements apart (each on its own cache lines), built once.
    pub fn chase_chain(&mut self) -> std::sync::Arc<Vec<u8>> {
        match &self.chain {
            Some((region, chain)) if *region == self.chase_region_bytes => chain.clone(),
            _ => {
                let chain = std::sync::Arc::new(build_chain(self.chase_region_bytes));
                self.chain = Some((self.chase_region_bytes, chain.clone()));
                chain
            }
        }
    }

    /// A lane label for errors.
    pub fn label(test: &str, src: usize, dst: usize) -> LaneLabel {
        LaneLabel {
            test: test.to_string(),
            src,
            dst,
        }
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        for &stream in self.streams.values().flatten() {
            // Work still queued runs to its end; nothing can report a failure from drop.
            let _ = self.backend.destroy_stream(stream);
        }
    }
}

/// Elements (u64) between two nodes of the pointer-chase chain.
pub const CHASE_NODE_STRIDE: usize = 64;

/// A random cyclic chain (Sattolo's algorithm: one cycle through every node) over `region` bytes.
fn build_chain(region: u64) -> Vec<u8> {
    let nodes = (region as usize / (8 * CHASE_NODE_STRIDE)).max(2);
    let mut order: Vec<usize> = (0..nodes).collect();
    let mut rng = SplitMix::new(0xc4a5e);
    for i in (1..nodes).rev() {
        let j = rng.below(i as u64) as usize;
        order.swap(i, j);
    }
    // order is a cyclic permutation: node n's successor is order[n].
    let mut chain = vec![0u8; nodes * CHASE_NODE_STRIDE * 8];
    for (node, &next) in order.iter().enumerate() {
        let at = node * CHASE_NODE_STRIDE * 8;
        chain[at..at + 8].copy_from_slice(&((next * CHASE_NODE_STRIDE) as u64).to_le_bytes());
    }
    chain
}

/// A chain over `region` bytes stepping `stride` bytes at a time from element 0 and back to it
/// (nvbandwidth's latency chain: each node names the one a stride further, the last the first).
pub fn strided_chain(region: u64, stride: u64) -> Vec<u8> {
    let step = (stride / 8).max(1) as usize;
    let nodes = (region as usize / (8 * step)).max(2);
    let mut chain = vec![0u8; nodes * step * 8];
    for node in 0..nodes {
        let next = ((node + 1) % nodes * step) as u64;
        let at = node * step * 8;
        chain[at..at + 8].copy_from_slice(&next.to_le_bytes());
    }
    chain
}

/// The element index reached after `steps` loads from element 0 of `chain`.
pub fn chase_on_host(chain: &[u8], steps: u32) -> u64 {
    let mut index = 0u64;
    for _ in 0..steps {
        let at = index as usize * 8;
        index = u64::from_le_bytes(chain[at..at + 8].try_into().expect("8 bytes"));
    }
    index
}

/// The figure of a single-lane bandwidth or time measurement.
pub(crate) fn lane_outcome(unit: Unit, m: &Measurement, message: usize) -> Outcome {
    Outcome::Measured {
        value: match unit {
            Unit::Gbps => m.lane_gbps(0, message),
            Unit::Micros => m.lane_us[0].median,
            Unit::Nanos => m.lane_us[0].median * 1e3,
        },
        total: None,
        time_us: m.lane_us[0],
        note: None,
    }
}

/// Why nothing between `src` and `dst` can be measured where they sit on different hosts (one
/// sentence for every such pair, so that a report lists them together).
pub(crate) fn other_host(topo: &Topology, src: usize, dst: usize) -> Option<String> {
    topo.crosses_hosts(src, dst).then(|| {
        "on different hosts: peerlink measures within one host (`peerlink plan` predicts the \
         routes between hosts)"
            .to_string()
    })
}

/// Why a direct peer operation from `src`'s memory to `dst`'s cannot be measured, if it cannot.
pub(crate) fn no_p2p(topo: &Topology, src: usize, dst: usize) -> Option<String> {
    if src == dst {
        return None;
    }
    if let Some(why) = other_host(topo, src, dst) {
        return Some(why);
    }
    match topo.pair(src, dst) {
        Some(pair) if pair.p2p => None,
        Some(pair) => Some(format!(
            "no P2P over {} ({}): copies between these GPUs are staged through host memory (the \
             `staged` tests measure that)",
            pair.link,
            pair.link.meaning()
        )),
        None => Some(format!(
            "no P2P: the driver reports nothing about GPU {src} → GPU {dst}"
        )),
    }
}

/// Enables peer access for `device` to reach `peer`, or says why it could not.
pub fn enable(ctx: &Context<'_>, device: usize, peer: usize) -> Option<String> {
    if device == peer {
        return None;
    }
    ctx.backend
        .enable_peer_access(device, peer)
        .err()
        .map(|e| format!("no P2P: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chase_chain_is_one_cycle_through_every_node() {
        let chain = build_chain(64 * 1024);
        let nodes = chain.len() / (8 * CHASE_NODE_STRIDE);
        assert_eq!(nodes, 128);
        let mut seen = vec![false; nodes];
        let mut index = 0u64;
        for _ in 0..nodes {
            let node = index as usize / CHASE_NODE_STRIDE;
            assert!(
                !seen[node],
                "node {node} visited twice before the cycle closed"
            );
            seen[node] = true;
            let at = node * CHASE_NODE_STRIDE * 8;
            index = u64::from_le_bytes(chain[at..at + 8].try_into().unwrap());
        }
        assert_eq!(
            index, 0,
            "the chain returns to the start after visiting every node"
        );
        assert_eq!(chase_on_host(&chain, nodes as u32), 0);
        assert_ne!(chase_on_host(&chain, 1), 0);
    }

    #[test]
    fn the_strided_chain_steps_one_cache_line_at_a_time_and_closes() {
        let chain = strided_chain(64 * 1024, 128);
        assert_eq!(chain.len(), 64 * 1024);
        let nodes = 64 * 1024 / 128;
        // Element 0 → 16 → 32 …, and back to 0 after every node.
        assert_eq!(chase_on_host(&chain, 1), 16);
        assert_eq!(chase_on_host(&chain, 2), 32);
        assert_eq!(
            chase_on_host(&chain, nodes as u32 - 1),
            (nodes as u64 - 1) * 16
        );
        assert_eq!(chase_on_host(&chain, nodes as u32), 0);
    }

    #[test]
    fn each_bandwidth_test_defaults_to_its_kind_of_copys_plateau() {
        let plateau = |name: &str| {
            registry()
                .into_iter()
                .find(|t| t.name() == name)
                .unwrap()
                .plateau_bytes()
        };
        let p = crate::bench::PLATEAU;
        for name in [
            "ce-write",
            "ce-read",
            "ce-bidir-write",
            "sm-read",
            "all-to-one",
        ] {
            assert_eq!(plateau(name), p.peer, "{name}");
        }
        for name in ["h2d", "d2h", "staged", "staged-bidir"] {
            assert_eq!(plateau(name), p.host, "{name}");
        }
        assert_eq!(plateau("local"), p.local);
        assert_eq!(p.peer, 512 << 20, "nvbandwidth's default size");
    }

    #[test]
    fn registry_names_are_unique_and_each_test_says_what_it_measures() {
        let tests = registry();
        let mut names: Vec<&str> = tests.iter().map(|t| t.name()).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "duplicate test names");
        for t in &tests {
            assert!(!t.measures().is_empty(), "{}", t.name());
        }
    }
}
