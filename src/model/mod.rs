//! The cost model: how long each hop of a transfer takes, as `α + bytes / β`.
//!
//! A transfer strategy is a chain (or several parallel chains) of hops: a peer copy, a copy into or
//! out of pinned host memory, a copy inside one GPU. Each hop costs a fixed latency `α` (issue,
//! launch, DMA setup) plus its bytes at a bandwidth `β`. The costs come from a measured
//! [`Profile`] where one exists for this host, otherwise from the topology ([`defaults`]) with
//! published figures. The planner in [`crate::engine`] composes hops into strategy predictions.

pub mod defaults;
pub mod profile;

pub use profile::Profile;

use crate::topology::{Link, Topology};
use crate::units::LARGEST_FIGURE;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

/// The cost of one hop: `alpha_us + bytes / beta`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Cost {
    /// Fixed latency per operation, in microseconds.
    pub alpha_us: f64,
    /// Bandwidth in GB/s (1e9 bytes per second).
    pub beta_gbps: f64,
}

impl Cost {
    /// Predicted time to move `bytes` in one operation, in microseconds.
    pub fn time_us(&self, bytes: u64) -> f64 {
        self.alpha_us + self.bytes_us(bytes)
    }

    /// The bandwidth term alone: `bytes / β`, in microseconds.
    pub fn bytes_us(&self, bytes: u64) -> f64 {
        // 1 GB/s = 1e9 B/s = 1e3 B/µs.
        bytes as f64 / (self.beta_gbps * 1e3)
    }

    /// Whether `0 ≤ α` and `0 < β`, both below what a measurement can give
    /// ([`LARGEST_FIGURE`]): what a profile must hold.
    pub fn is_valid(&self) -> bool {
        (0.0..LARGEST_FIGURE).contains(&self.alpha_us)
            && self.beta_gbps > 0.0
            && self.beta_gbps < LARGEST_FIGURE
    }
}

/// CPU time to queue work, in microseconds: the host cannot issue faster than this, so a
/// strategy of many small operations can be bound by it rather than by the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IssueCosts {
    /// One copy (copy engine).
    pub copy_us: f64,
    /// One kernel launch.
    pub kernel_us: f64,
    /// Recording an event, or making a stream wait for one.
    pub event_us: f64,
    /// Launching a captured graph.
    pub graph_us: f64,
}

impl IssueCosts {
    fn is_valid(&self) -> bool {
        [self.copy_us, self.kernel_us, self.event_us, self.graph_us]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0)
    }
}

/// How the host-staged route is priced beside a direct copy of the same split: its first hop
/// (device → host on the source, whose copy engines run the direct copy too) at a fraction of its
/// rate, and more per chunk and per transfer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BesideDirect {
    /// No measurement: [`defaults::BESIDE_DIRECT_RATE_FRACTION`] and
    /// [`defaults::BESIDE_DIRECT_CHUNK_US`], as the first split executor ran on the H200 pair (an
    /// estimate for any other host or executor).
    Estimate,
    /// Measured on the pair `on` (`tune`).
    Measured { pace: HostPace, on: (usize, usize) },
}

/// How the host route is priced while another transfer goes the opposite way through the host
/// at once (both ways between two GPUs): both its hops at a fraction of their rate one way.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BothWays {
    /// No measurement: [`defaults::HOST_BOTH_WAYS_FRACTION`], worked back from the H200 pair's
    /// both-ways splits (an estimate for any other host).
    Estimate,
    /// Measured on the pair `on` (`tune`).
    Measured { fraction: f64, on: (usize, usize) },
}

impl BothWays {
    /// The fraction the route's hops are priced with.
    pub fn fraction(self) -> f64 {
        match self {
            BothWays::Estimate => defaults::HOST_BOTH_WAYS_FRACTION,
            BothWays::Measured { fraction, .. } => fraction,
        }
    }
}

impl std::fmt::Display for BothWays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            BothWays::Estimate => "estimated, no measured profile figure".to_string(),
            BothWays::Measured { on, .. } => format!("measured on GPU {} ⇄ GPU {}", on.0, on.1),
        };
        write!(
            f,
            "both hops at {:.3} of their rate one way ({what})",
            self.fraction()
        )
    }
}

/// The figures that price the host route beside a direct copy.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HostPace {
    /// The first hop's rate, as a fraction of its rate alone.
    pub rate_fraction: f64,
    /// Its extra cost per chunk, µs.
    pub chunk_us: f64,
    /// The route's extra time per transfer, µs (below 0 where its fixed costs are less than the
    /// model's defaults).
    pub fixed_us: f64,
}

/// How the direct copy-engine copy of a split is priced beside the host route, one way: its bytes
/// at a fraction of its hop's rate, and more per transfer. A hop's rate is fitted to copies of up
/// to tens of MiB, while a split's direct share is hundreds of MiB, where the H200 pair's NVLink ran
/// 1.2–1.5% faster than that fit (tune's splits, 2026-11-30, evening 2): priced at the fit, the
/// direct copy ended 7–36 µs before the host route, and the split waited for that.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DirectPace {
    /// The direct copy's rate, as a fraction of its hop's.
    pub rate_fraction: f64,
    /// Its extra time per transfer, µs.
    pub fixed_us: f64,
}

impl DirectPace {
    /// Without a measurement: as the hop alone.
    pub const AS_ITS_HOP: DirectPace = DirectPace {
        rate_fraction: 1.0,
        fixed_us: 0.0,
    };
}

impl std::fmt::Display for DirectPace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the direct copy at {:.3} of its rate, {:+.1} µs a transfer",
            self.rate_fraction, self.fixed_us
        )
    }
}

impl BesideDirect {
    /// The figures the route is priced with.
    pub fn figures(self) -> HostPace {
        match self {
            BesideDirect::Estimate => HostPace {
                rate_fraction: defaults::BESIDE_DIRECT_RATE_FRACTION,
                chunk_us: defaults::BESIDE_DIRECT_CHUNK_US,
                fixed_us: 0.0,
            },
            BesideDirect::Measured { pace, .. } => pace,
        }
    }
}

impl std::fmt::Display for HostPace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device → host at {:.3} of its rate, {:+.1} µs a chunk",
            self.rate_fraction, self.chunk_us
        )?;
        if self.fixed_us != 0.0 {
            write!(f, ", {:+.1} µs a transfer", self.fixed_us)?;
        }
        Ok(())
    }
}

impl std::fmt::Display for BesideDirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            BesideDirect::Estimate => "estimated, no measured profile figure".to_string(),
            BesideDirect::Measured { on, .. } => {
                format!("measured on GPU {} → GPU {}", on.0, on.1)
            }
        };
        write!(f, "{} ({what})", self.figures())
    }
}

/// One kind of operation between two places, the unit the model prices.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Hop {
    /// A copy-engine copy from `src`'s memory into `dst`'s, issued on `src` (push). Needs P2P.
    PeerCe { src: usize, dst: usize },
    /// An SM copy kernel on `src` storing into `dst`'s memory through the peer mapping. Needs P2P.
    PeerSm { src: usize, dst: usize },
    /// A copy-engine copy from `device` into pinned host memory on NUMA node `node`.
    DeviceToHost { device: usize, node: Option<i32> },
    /// A copy-engine copy from pinned host memory on NUMA node `node` into `device`.
    HostToDevice { device: usize, node: Option<i32> },
    /// A copy inside one GPU's memory (gathering small messages into one staging buffer).
    Local { device: usize },
    /// GPUDirect RDMA from `src`'s memory into `dst`'s on another host: `src`'s NIC reads the GPU,
    /// `dst`'s NIC writes it. Needs GPUDirect RDMA and a NIC on each host.
    NetRdma { src: usize, dst: usize },
    /// From host memory near `src`'s NIC to host memory near `dst`'s, on another host (a
    /// network route staged through host memory). Needs a NIC on each host.
    NetHost { src: usize, dst: usize },
    /// A transfer through a resident worker on `src` storing into `dst`'s memory (push), queued
    /// by the engine behind a doorbell and followed by a stream wait: `α` is a lone transfer's
    /// time from the call until the host sees it complete. Needs P2P.
    Resident { src: usize, dst: usize },
}

/// A hop as a profile's reader names it: `peer-ce 0→1`, `device-to-host GPU 2 (NUMA 0)`.
impl std::fmt::Display for Hop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let node = |node: &Option<i32>| node.map_or(String::new(), |n| format!(" (NUMA {n})"));
        match self {
            Hop::PeerCe { src, dst } => write!(f, "the peer-ce hop {src}→{dst}"),
            Hop::PeerSm { src, dst } => write!(f, "the peer-sm hop {src}→{dst}"),
            Hop::DeviceToHost { device, node: n } => {
                write!(f, "the device-to-host hop of GPU {device}{}", node(n))
            }
            Hop::HostToDevice { device, node: n } => {
                write!(f, "the host-to-device hop of GPU {device}{}", node(n))
            }
            Hop::Local { device } => write!(f, "the local hop of GPU {device}"),
            Hop::NetRdma { src, dst } => write!(f, "the net-rdma hop {src}→{dst}"),
            Hop::NetHost { src, dst } => write!(f, "the net-host hop {src}→{dst}"),
            Hop::Resident { src, dst } => write!(f, "the resident hop {src}→{dst}"),
        }
    }
}

/// A shared piece of hardware whose bandwidth concurrent paths divide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// A point-to-point NVLink bundle between two GPUs, one direction.
    NvLink { src: usize, dst: usize },
    /// A GPU's NVSwitch port, sending.
    SwitchOut(usize),
    /// A GPU's NVSwitch port, receiving.
    SwitchIn(usize),
    /// A GPU's PCIe link towards the host (device → host direction).
    PcieUp(usize),
    /// A GPU's PCIe link from the host.
    PcieDown(usize),
}

/// Prices hops for one host: measured where a profile says, from the topology otherwise.
#[derive(Clone, Debug)]
pub struct CostModel {
    topology: Topology,
    costs: HashMap<Hop, Cost>,
    /// Extra time per message in one batched copy kernel (each message is a thread block).
    batch_message_us: f64,
    /// Time per copy node when a captured graph is replayed.
    graph_node_us: f64,
    issue: IssueCosts,
    /// Measured lone operations of direct hops (see [`CostModel::lone_us`]).
    lone: HashMap<Hop, f64>,
    /// The host route's measured pace beside a direct copy, per ordered pair (see
    /// [`CostModel::beside_direct`]).
    beside_direct: HashMap<(usize, usize), HostPace>,
    /// A split's direct copy's measured pace beside the host route, per ordered pair (see
    /// [`CostModel::direct_beside_host`]).
    direct_beside_host: HashMap<(usize, usize), DirectPace>,
    /// The host route's measured fraction both ways, per ordered pair (see
    /// [`CostModel::both_ways`]).
    both_ways: HashMap<(usize, usize), f64>,
    /// Where the figures came from, in words (shown by `plan`).
    origin: String,
    /// What each GPU's pairs add up to, made on first use (after a profile's costs are in).
    ports: OnceLock<Ports>,
}

/// The figure measured for `(src, dst)`, else the one measured for the host's first measured pair
/// (their copy engines and PCIe links alike), with the pair it was measured on.
fn measured_for<V: Copy>(
    figures: &HashMap<(usize, usize), V>,
    src: usize,
    dst: usize,
) -> Option<((usize, usize), V)> {
    figures
        .get_key_value(&(src, dst))
        .or_else(|| figures.iter().min_by_key(|(pair, _)| **pair))
        .map(|(&on, &value)| (on, value))
}

/// What each GPU's pairs add up to, from one pass over them: a planner asks per route, and a scan
/// of a 1000-GPU host's million pairs per question made planning one transfer take minutes.
#[derive(Clone, Debug)]
struct Ports {
    /// GPUs that reach their NVLink peers through an NVSwitch port ([`defaults::behind_switch`]).
    switched: HashSet<usize>,
    /// Per GPU, the fastest copy-engine rate of a pair it is in: what its switch port carries.
    best_peer_gbps: HashMap<usize, f64>,
}

impl CostModel {
    /// A model from the topology alone, with published figures (see [`defaults`]).
    pub fn from_topology(topology: &Topology) -> Self {
        CostModel {
            topology: topology.clone(),
            costs: HashMap::new(),
            batch_message_us: defaults::BATCH_MESSAGE_US,
            graph_node_us: defaults::GRAPH_NODE_US,
            issue: defaults::ISSUE,
            lone: HashMap::new(),
            beside_direct: HashMap::new(),
            direct_beside_host: HashMap::new(),
            both_ways: HashMap::new(),
            origin: "topology defaults (published figures; no measured profile)".into(),
            ports: OnceLock::new(),
        }
    }

    fn ports(&self) -> &Ports {
        self.ports.get_or_init(|| {
            let mut best_peer_gbps: HashMap<usize, f64> = HashMap::new();
            for p in &self.topology.pairs {
                if let Some(cost) = self.cost(Hop::PeerCe {
                    src: p.src,
                    dst: p.dst,
                }) {
                    for device in [p.src, p.dst] {
                        let best = best_peer_gbps.entry(device).or_default();
                        *best = best.max(cost.beta_gbps);
                    }
                }
            }
            Ports {
                switched: defaults::switched_devices(&self.topology),
                best_peer_gbps,
            }
        })
    }

    /// The model of the `peerlink tune` profile at `path` ([`Profile::load`],
    /// [`CostModel::from_profile`]), with the sentence for its reader where the profile is partial
    /// ([`Profile::partial_note`]): what `plan --profile` and the NCCL-API library both load.
    pub fn from_profile_file(
        topology: &Topology,
        path: &std::path::Path,
    ) -> crate::Result<(Self, Option<String>)> {
        let profile = Profile::load(path)?;
        let model = CostModel::from_profile(topology, &profile)?;
        Ok((model, profile.partial_note(path)))
    }

    /// A model from a measured profile, refused with a sentence if it was measured on another
    /// host or driver. Hops the profile does not cover fall back to the topology defaults.
    pub fn from_profile(topology: &Topology, profile: &Profile) -> crate::Result<Self> {
        profile.check_matches(topology)?;
        let mut model = CostModel::from_topology(topology);
        model.costs = profile.hops.iter().map(|m| (m.hop, m.cost)).collect();
        if let Some(per_message) = profile.batch_message_us {
            model.batch_message_us = per_message;
        }
        if let Some(per_node) = profile.graph_node_us {
            model.graph_node_us = per_node;
        }
        if let Some(issue) = profile.issue {
            model.issue = issue;
        }
        model.lone = profile.lone.iter().map(|l| (l.hop, l.lone_us)).collect();
        // Each measured pair prices both routes of its split: the host route beside the direct
        // copy, and the direct copy beside it.
        (model.beside_direct, model.direct_beside_host) = profile
            .beside_direct
            .iter()
            .map(|b| {
                let host = HostPace {
                    rate_fraction: b.rate_fraction,
                    chunk_us: b.chunk_us,
                    fixed_us: b.fixed_us,
                };
                let direct = DirectPace {
                    rate_fraction: b.direct_rate_fraction,
                    fixed_us: b.direct_fixed_us,
                };
                (((b.src, b.dst), host), ((b.src, b.dst), direct))
            })
            .unzip();
        model.both_ways = profile
            .beside_direct
            .iter()
            .filter_map(|b| Some(((b.src, b.dst), b.both_ways.as_ref()?.fraction)))
            .collect();
        model.origin = format!("measured profile ({})", profile.describe());
        Ok(model)
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Where the figures came from, in words.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    pub fn batch_message_us(&self) -> f64 {
        self.batch_message_us
    }

    pub fn graph_node_us(&self) -> f64 {
        self.graph_node_us
    }

    /// How long one direct operation of a few bytes takes on its own, from the moment it is queued
    /// to its end (the CPU's queuing included); `None` for other hops and impossible ones. Lone
    /// transfers pay a start-up that back-to-back ones (and so a hop's α) hide, and it differs
    /// between the copy engine and a copy kernel. Measured where a profile says; otherwise the
    /// issue cost plus α, plus the copy engine's later start ([`defaults::COPY_ENGINE_START_US`]).
    pub fn lone_us(&self, hop: Hop) -> Option<f64> {
        let queued = match hop {
            Hop::PeerCe { .. } => self.issue.copy_us + defaults::COPY_ENGINE_START_US,
            Hop::PeerSm { .. } => self.issue.kernel_us,
            // Its α already runs from the call to the host seeing it complete.
            Hop::Resident { .. } => 0.0,
            _ => return None,
        };
        let cost = self.cost(hop)?;
        Some(
            self.lone
                .get(&hop)
                .copied()
                .unwrap_or(queued + cost.alpha_us),
        )
    }

    /// How the host-staged route from `src` to `dst` is priced while a direct copy-engine copy
    /// runs beside it (a split): as measured for the pair; else as measured for another pair of
    /// this host (their copy engines and PCIe links alike); else the estimate.
    pub fn beside_direct(&self, src: usize, dst: usize) -> BesideDirect {
        measured_for(&self.beside_direct, src, dst).map_or(BesideDirect::Estimate, |(on, pace)| {
            BesideDirect::Measured { pace, on }
        })
    }

    /// How the direct copy-engine copy of a split from `src` to `dst` is priced beside the host
    /// route, one way: as measured for the pair, or for another pair of this host; else as its
    /// hop alone.
    pub fn direct_beside_host(&self, src: usize, dst: usize) -> DirectPace {
        measured_for(&self.direct_beside_host, src, dst).map_or(DirectPace::AS_ITS_HOP, |(_, p)| p)
    }

    /// How the host route from `src` to `dst` is priced while another transfer goes the opposite
    /// way through the host at once: as measured for the pair; else as measured for another pair
    /// of this host; else the estimate.
    pub fn both_ways(&self, src: usize, dst: usize) -> BothWays {
        measured_for(&self.both_ways, src, dst).map_or(BothWays::Estimate, |(on, fraction)| {
            BothWays::Measured { fraction, on }
        })
    }

    /// The same model with the host route from `src` to `dst` priced both ways at `fraction`
    /// (what `tune` tries while it fits it).
    pub fn with_both_ways(mut self, src: usize, dst: usize, fraction: f64) -> Self {
        self.both_ways.insert((src, dst), fraction);
        self
    }

    /// The same model with the host route from `src` to `dst` priced beside a direct copy with
    /// `pace` (what `tune` tries while it fits it).
    pub fn with_beside_direct(mut self, src: usize, dst: usize, pace: HostPace) -> Self {
        self.beside_direct.insert((src, dst), pace);
        self
    }

    /// The same model with a split's direct copy from `src` to `dst` priced beside the host route
    /// with `pace` (what `tune` tries while it fits it).
    pub fn with_direct_beside_host(mut self, src: usize, dst: usize, pace: DirectPace) -> Self {
        self.direct_beside_host.insert((src, dst), pace);
        self
    }

    /// What queuing work costs the CPU.
    pub fn issue(&self) -> IssueCosts {
        self.issue
    }

    /// Whether peer copies from `src` to `dst` are possible (the driver reports P2P access).
    /// Whether kernels and copies on `src` can reach `dst`'s memory directly. A GPU is its own peer.
    pub fn has_p2p(&self, src: usize, dst: usize) -> bool {
        if src == dst {
            return src < self.topology.devices.len();
        }
        self.topology.pair(src, dst).is_some_and(|p| p.p2p)
    }

    /// The NUMA node of a device's PCIe root, where known.
    pub fn numa_node(&self, device: usize) -> Option<i32> {
        self.topology.devices.get(device).and_then(|d| d.numa_node)
    }

    /// The cost of one hop, or `None` where the hop is impossible (a peer copy without P2P, a
    /// device that does not exist).
    pub fn cost(&self, hop: Hop) -> Option<Cost> {
        if !self.hop_is_possible(hop) {
            return None;
        }
        self.costs
            .get(&hop)
            .copied()
            .or_else(|| defaults::cost(&self.topology, hop))
    }

    fn hop_is_possible(&self, hop: Hop) -> bool {
        let n = self.topology.devices.len();
        match hop {
            Hop::PeerCe { src, dst } | Hop::PeerSm { src, dst } | Hop::Resident { src, dst } => {
                self.has_p2p(src, dst)
            }
            Hop::DeviceToHost { device, .. }
            | Hop::HostToDevice { device, .. }
            | Hop::Local { device } => device < n,
            Hop::NetRdma { src, dst } => {
                self.reaches_network(src, dst)
                    && self
                        .topology
                        .network
                        .as_ref()
                        .is_some_and(|net| net.gpudirect.available != Some(false))
            }
            Hop::NetHost { src, dst } => self.reaches_network(src, dst),
        }
    }

    /// Whether GPUs `src` and `dst` sit on different hosts and each has a NIC.
    fn reaches_network(&self, src: usize, dst: usize) -> bool {
        let n = self.topology.devices.len();
        let Some(net) = &self.topology.network else {
            return false;
        };
        src < n
            && dst < n
            && self.topology.crosses_hosts(src, dst)
            && net.nic_of(src).is_some()
            && net.nic_of(dst).is_some()
    }

    /// The NUMA node of the NIC `gpu` sends and receives through, where known.
    pub fn nic_numa_node(&self, gpu: usize) -> Option<i32> {
        self.topology.network.as_ref()?.nic_of(gpu)?.numa_node
    }

    /// The shared hardware a hop's bytes cross, so that concurrent paths divide it.
    pub fn resources(&self, hop: Hop) -> Vec<Resource> {
        match hop {
            // A GPU's copy to itself stays in its own memory, which no other route crosses.
            Hop::PeerCe { src, dst } | Hop::PeerSm { src, dst } | Hop::Resident { src, dst }
                if src == dst =>
            {
                Vec::new()
            }
            Hop::PeerCe { src, dst } | Hop::PeerSm { src, dst } | Hop::Resident { src, dst } => {
                match self.topology.pair(src, dst).map(|p| p.link) {
                    Some(Link::NvLink(_)) if self.ports().switched.contains(&src) => {
                        vec![Resource::SwitchOut(src), Resource::SwitchIn(dst)]
                    }
                    Some(Link::NvLink(_)) => vec![Resource::NvLink { src, dst }],
                    _ => vec![Resource::PcieUp(src), Resource::PcieDown(dst)],
                }
            }
            Hop::DeviceToHost { device, .. } => vec![Resource::PcieUp(device)],
            Hop::HostToDevice { device, .. } => vec![Resource::PcieDown(device)],
            Hop::Local { .. } => Vec::new(),
            // The planner splits no transfer across hosts: of the network's hardware only the
            // GPUs' own links are named.
            Hop::NetRdma { src, dst } => vec![Resource::PcieUp(src), Resource::PcieDown(dst)],
            Hop::NetHost { .. } => Vec::new(),
        }
    }

    /// The bandwidth of a shared resource, in GB/s.
    pub fn capacity_gbps(&self, resource: Resource) -> f64 {
        let best_peer = |device: usize| {
            self.ports()
                .best_peer_gbps
                .get(&device)
                .copied()
                .unwrap_or(0.0)
        };
        let host = |hop: Hop| self.cost(hop).map_or(0.0, |c| c.beta_gbps);
        match resource {
            Resource::NvLink { src, dst } => self
                .cost(Hop::PeerCe { src, dst })
                .map_or(0.0, |c| c.beta_gbps),
            Resource::SwitchOut(d) | Resource::SwitchIn(d) => best_peer(d),
            Resource::PcieUp(d) => host(Hop::DeviceToHost {
                device: d,
                node: self.numa_node(d),
            }),
            Resource::PcieDown(d) => host(Hop::HostToDevice {
                device: d,
                node: self.numa_node(d),
            }),
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use crate::topology::test_support::{device, pair};
    use crate::topology::{Link, Topology};

    /// A host from a link matrix (`None` on the diagonal); P2P wherever the link is not `SYS`.
    pub fn topology(cc: &str, numa: &[i32], links: &[&[&str]]) -> Topology {
        let n = links.len();
        let mut devices: Vec<_> = (0..n)
            .map(|i| device(i, Some(numa[i]), &format!("0000:{:02x}:00.0", 0x18 + i)))
            .collect();
        for d in &mut devices {
            d.compute_capability = cc.into();
        }
        let mut pairs = Vec::new();
        for (s, row) in links.iter().enumerate() {
            for (d, text) in row.iter().enumerate() {
                if s != d {
                    let link: Link = text.parse().unwrap();
                    pairs.push(pair(s, d, link, link != Link::Sys));
                }
            }
        }
        Topology {
            source: crate::topology::Source::Sim("test".into()),
            driver_version: Some("999.1".into()),
            cuda_version: None,
            visible_devices: None,
            devices,
            pairs,
            network: None,
        }
    }

    /// DGX-1's hybrid cube-mesh (docs/reference.md).
    pub fn dgx1() -> Topology {
        topology(
            "7.0",
            &[0, 0, 0, 0, 1, 1, 1, 1],
            &[
                &["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"],
                &["NV1", "X", "NV2", "NV1", "SYS", "NV2", "SYS", "SYS"],
                &["NV1", "NV2", "X", "NV2", "SYS", "SYS", "NV1", "SYS"],
                &["NV2", "NV1", "NV2", "X", "SYS", "SYS", "SYS", "NV1"],
                &["NV2", "SYS", "SYS", "SYS", "X", "NV1", "NV1", "NV2"],
                &["SYS", "NV2", "SYS", "SYS", "NV1", "X", "NV2", "NV1"],
                &["SYS", "SYS", "NV1", "SYS", "NV1", "NV2", "X", "NV2"],
                &["SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", "X"],
            ],
        )
    }

    /// Eight GPUs, every pair NV18 through NVSwitch.
    pub fn nvswitch8() -> Topology {
        let row = |i: usize| -> Vec<&'static str> {
            (0..8).map(|j| if i == j { "X" } else { "NV18" }).collect()
        };
        let rows: Vec<Vec<&str>> = (0..8).map(row).collect();
        let refs: Vec<&[&str]> = rows.iter().map(Vec::as_slice).collect();
        topology("9.0", &[0, 0, 0, 0, 1, 1, 1, 1], &refs)
    }

    /// Two Hopper GPUs joined by their 18 NVLinks, no switch between them (the H200 pair).
    pub fn nvlink_pair() -> Topology {
        topology("9.0", &[0, 0], &[&["X", "NV18"], &["NV18", "X"]])
    }

    /// Four GPUs: two under a PCIe switch on each of two sockets, no P2P across sockets.
    pub fn pcie_2socket() -> Topology {
        topology(
            "8.6",
            &[0, 0, 1, 1],
            &[
                &["X", "PIX", "SYS", "SYS"],
                &["PIX", "X", "SYS", "SYS"],
                &["SYS", "SYS", "X", "PIX"],
                &["SYS", "SYS", "PIX", "X"],
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn a_lone_direct_operation_is_measured_or_issue_plus_alpha_and_start_up() {
        let topology = pcie_2socket();
        let model = CostModel::from_topology(&topology);
        let (ce, sm) = (
            Hop::PeerCe { src: 0, dst: 1 },
            Hop::PeerSm { src: 0, dst: 1 },
        );
        let issue = model.issue();
        let expect_ce =
            issue.copy_us + defaults::COPY_ENGINE_START_US + model.cost(ce).unwrap().alpha_us;
        assert_eq!(model.lone_us(ce), Some(expect_ce));
        assert_eq!(
            model.lone_us(sm),
            Some(issue.kernel_us + model.cost(sm).unwrap().alpha_us)
        );
        // Not a direct hop, or no P2P (across the sockets): nothing to say.
        assert_eq!(model.lone_us(Hop::Local { device: 0 }), None);
        assert_eq!(model.lone_us(Hop::PeerCe { src: 0, dst: 3 }), None);
        // A profile's measurement wins.
        let mut profile = Profile::for_host(&topology);
        profile.lone = vec![profile::Lone {
            hop: sm,
            lone_us: 4.25,
        }];
        let measured = CostModel::from_profile(&topology, &profile).unwrap();
        assert_eq!(measured.lone_us(sm), Some(4.25));
        assert_eq!(measured.lone_us(ce), Some(expect_ce));
    }

    #[test]
    fn cost_is_latency_plus_bytes_over_bandwidth() {
        let c = Cost {
            alpha_us: 2.0,
            beta_gbps: 10.0,
        };
        // 1 MB at 10 GB/s = 100 µs.
        assert!((c.time_us(1_000_000) - 102.0).abs() < 1e-9);
        assert!(c.is_valid());
        assert!(!Cost {
            alpha_us: -1.0,
            beta_gbps: 1.0
        }
        .is_valid());
        assert!(!Cost {
            alpha_us: 1.0,
            beta_gbps: 0.0
        }
        .is_valid());
        for (alpha_us, beta_gbps) in [
            (1.0, 1e308),
            (1e300, 1.0),
            (f64::NAN, 1.0),
            (1.0, f64::INFINITY),
        ] {
            assert!(
                !Cost {
                    alpha_us,
                    beta_gbps
                }
                .is_valid(),
                "{alpha_us} {beta_gbps}"
            );
        }
    }

    #[test]
    fn a_gpu_is_its_own_peer_at_its_local_copy_rate() {
        let model = CostModel::from_topology(&dgx1());
        let ce = model.cost(Hop::PeerCe { src: 2, dst: 2 }).unwrap();
        let local = model.cost(Hop::Local { device: 2 }).unwrap();
        assert_eq!(ce.beta_gbps, local.beta_gbps);
        let sm = model.cost(Hop::PeerSm { src: 2, dst: 2 }).unwrap();
        assert!(sm.beta_gbps < ce.beta_gbps);
        assert!(model.resources(Hop::PeerCe { src: 2, dst: 2 }).is_empty());
    }

    #[test]
    fn peer_hops_need_p2p() {
        let model = CostModel::from_topology(&dgx1());
        assert!(model.cost(Hop::PeerCe { src: 0, dst: 1 }).is_some());
        assert!(model.cost(Hop::PeerCe { src: 0, dst: 5 }).is_none());
        assert!(model.cost(Hop::PeerCe { src: 8, dst: 8 }).is_none());
        assert!(model.cost(Hop::Local { device: 8 }).is_none());
        assert!(model
            .cost(Hop::DeviceToHost {
                device: 0,
                node: Some(0)
            })
            .is_some());
    }

    #[test]
    fn switch_ports_are_shared_but_point_to_point_links_are_not() {
        let switch = CostModel::from_topology(&nvswitch8());
        assert_eq!(
            switch.resources(Hop::PeerCe { src: 0, dst: 1 }),
            vec![Resource::SwitchOut(0), Resource::SwitchIn(1)]
        );
        let mesh = CostModel::from_topology(&dgx1());
        assert_eq!(
            mesh.resources(Hop::PeerCe { src: 0, dst: 3 }),
            vec![Resource::NvLink { src: 0, dst: 3 }]
        );
        let pcie = CostModel::from_topology(&pcie_2socket());
        assert_eq!(
            pcie.resources(Hop::PeerCe { src: 0, dst: 1 }),
            vec![Resource::PcieUp(0), Resource::PcieDown(1)]
        );
        // A switch port carries as much as the best pair through it.
        let port = switch.capacity_gbps(Resource::SwitchOut(0));
        let pair = switch
            .cost(Hop::PeerCe { src: 0, dst: 1 })
            .unwrap()
            .beta_gbps;
        assert_eq!(port, pair);
    }
}
