//! Hop costs derived from the topology alone, for hosts without a measured profile.
//!
//! Every figure is a published or measured-here number (docs/reference.md); they are starting
//! points that a measured profile replaces. The topology says the link class, the NVLink count and
//! P2P yes/no; the PCIe generation and NVLink rate are inferred from the GPU architecture (compute
//! capability), which is how the hardware shipped.

use super::{Cost, Hop, IssueCosts};
use crate::topology::network::FabricKind;
use crate::topology::{Link, Topology};
use std::collections::{HashMap, HashSet};

/// NVLink 2, 3 and 4 carry 25 GB/s per link per direction (V100, A100, H100 datasheets);
/// NVLink 1 (P100) 20 GB/s.
fn nvlink_gbps_per_link(major: u32) -> f64 {
    if major >= 7 {
        25.0
    } else {
        20.0
    }
}

/// Copy engines reach ~88% of the NVLink line rate: 395 GB/s of 450 on H100 (nvbandwidth v0.10).
const NVLINK_CE_EFFICIENCY: f64 = 0.88;
/// An SM copy kernel reaches a little less than a copy engine over NVLink (nvbandwidth's SM tests).
const NVLINK_SM_EFFICIENCY: f64 = 0.82;
/// An SM copy kernel inside one GPU against a copy-engine copy there (measured on the lent H200,
/// BENCHMARKS.md run 1: 1789 vs 1938 GB/s at 64 MiB).
const LOCAL_SM_FRACTION: f64 = 0.92;

/// Host↔device bandwidth of a PCIe x16 link, by the generation the architecture shipped with:
/// Gen3 ~12 GB/s (V100), Gen4 ~25 GB/s (A100/A6000), Gen5 ~55 GB/s (H100/H200, measured 54.8 here).
fn pcie_host_gbps(major: u32) -> f64 {
    match major {
        0..=7 => 12.0,
        8 => 25.0,
        _ => 55.0,
    }
}

/// GPU↔GPU P2P over PCIe as a fraction of the host link, by how far the path goes: ~26 GB/s under
/// one Gen4 switch vs ~22 across host bridges (A6000), 39–51 vs 53–56 GB/s across NUMA nodes on Gen5.
fn pcie_p2p_fraction(link: Link) -> f64 {
    match link {
        Link::NvLink(_) | Link::Pix | Link::Pxb => 1.0,
        Link::Phb | Link::Node => 0.85,
        // NET has no P2P at all: `peer_gbps` answers before asking.
        Link::Sys | Link::Net => 0.8,
    }
}

/// RDMA writes reach about this share of a NIC's line rate: ~48 of 50 GB/s on 400 Gb/s NDR
/// (ib_write_bw, vendor material; an estimate here).
const RDMA_EFFICIENCY: f64 = 0.96;
/// A NIC that reports no rate is taken for 100 Gb/s (EDR, HDR100): an estimate.
const UNKNOWN_NIC_GBIT: f64 = 100.0;
/// NIC to NIC through one switch where no network is described (a real host): RDMA writes take
/// about 1–2 µs end to end on InfiniBand; an estimate.
pub const NETWORK_LATENCY_US: f64 = 2.0;
/// Posting one RDMA operation and the NIC's own start, before the wire: an estimate.
const RDMA_POST_US: f64 = 1.0;

/// GPUDirect RDMA's rate as a share of the NIC's, by how far the GPU is from its NIC: full under
/// one or several PCIe switches; half through a root complex; a quarter across host bridges or
/// sockets. Estimates from one public measurement: GPU reads through an EPYC root complex at 6.1
/// of 24.5 GB/s (stackoverflow 59277346, docs/reference.md); NCCL leaves GPUDirect RDMA off beyond
/// PXB by default for the same reason (`NCCL_NET_GDR_LEVEL`).
fn gpudirect_fraction(link: Link) -> f64 {
    match link {
        Link::NvLink(_) | Link::Pix | Link::Pxb => 1.0,
        Link::Phb => 0.5,
        Link::Node | Link::Sys | Link::Net => 0.25,
    }
}

/// Host memory on the other socket is reached over the CPUs' interconnect: ~80% of a local copy
/// (the same ratio as cross-NUMA PCIe P2P on Gen5 above).
const REMOTE_NUMA_FRACTION: f64 = 0.8;

/// GPU time of one small copy-engine copy, back to back: 2.3–3.3 µs (p2pBandwidthLatencyTest, H100).
pub const COPY_ENGINE_ALPHA_US: f64 = 2.5;
/// A lone copy-engine copy of a few bytes ends later than a lone copy kernel: 0.41–0.46 µs on the lent
/// H200 (tune's lone 4 B copies, the two methods taking turns, three runs: BENCHMARKS.md runs 11–14),
/// while back to back the copy engine is the faster (its start-up overlaps the copy before it).
pub const COPY_ENGINE_START_US: f64 = 0.5;
/// A resident worker's transfer of a few bytes, from the call until the host sees it complete:
/// 6.98 µs median for 4 B GPU 0 → GPU 1 on the lent H200 pair, a VM (BENCHMARKS.md, 2026-11-30
/// night); the engine adds a doorbell and a stream wait. `tune` measures it into a profile.
pub const RESIDENT_ALPHA_US: f64 = 7.0;
/// GPU time a chunk of a pipeline costs beyond its copies' α + bytes/β when its two hops run on
/// different GPUs (each chunk's second copy waits for an event of the first's GPU, a reused slot's
/// fill for one of the second's): 4.3 µs. Derived from the staged strategy alone on the H200 pair
/// (docs/reference.md): 83.0–83.5 µs per 4 MiB chunk, 45.6 per 2 MiB, 26.0 per 1 MiB, 16.3 per
/// 512 KiB, against 78.9, 40.8, 21.7, 12.2 from the profile's host-copy fits.
pub const CROSS_GPU_CHUNK_US: f64 = 4.3;
/// GPU time a pipelined transfer takes beyond its chunks, their waits across GPUs and the CPU's
/// queuing: 9.3 µs, the median of what the staged strategy took beyond them on the H200 pair at
/// 1 MiB–1 GiB (7.5–16.8 µs; docs/reference.md). Likely the hand-offs from the control stream to
/// the route's streams and back, which the model does not price one by one.
pub const PIPELINE_FIXED_US: f64 = 9.3;
/// The host route's chunks went slower beside a direct copy of the same split on the H200 pair
/// (its device → host copies on the source GPU, whose copy engines also ran the NVLink copy): per
/// chunk 9.6 µs and its bytes at 48.7 GB/s, against 6.9 µs and 55 GB/s alone (docs/reference.md).
/// Without a measured profile figure the planner prices that hop with this fraction of its rate
/// and [`BESIDE_DIRECT_CHUNK_US`] more per chunk: an estimate (measured with the first split
/// executor, on one host), which `tune` replaces with the pace it measures
/// ([`super::profile::BesideDirect`]).
pub const BESIDE_DIRECT_RATE_FRACTION: f64 = 0.885;
/// See [`BESIDE_DIRECT_RATE_FRACTION`].
pub const BESIDE_DIRECT_CHUNK_US: f64 = 2.7;
/// The host route's hops while another transfer goes the opposite way through the host at once
/// (both GPUs' PCIe links carry copies both ways): this fraction of their rate one way. An
/// estimate worked back from the H200 pair's both-ways splits (call 4, 2026-11-30 night: each
/// flow's 1 GiB took 2723.6 / 2736.4 µs against its host route's 2462.9 / 2448.5 µs one way, the
/// pipeline's fill left aside), which `tune` replaces with the fraction it fits
/// ([`super::profile::BothWays`]).
pub const HOST_BOTH_WAYS_FRACTION: f64 = 0.90;
/// A copy kernel's launch, back to back: ~3 µs of GPU time.
pub const KERNEL_ALPHA_US: f64 = 3.0;
/// Per message inside one batched copy kernel: 0.015 µs (measured here, 1000 × 4 KiB gather kernel).
pub const BATCH_MESSAGE_US: f64 = 0.015;
/// Per copy node of a replayed graph: 0.81 µs (measured here, 1000 copies captured once, H200).
pub const GRAPH_NODE_US: f64 = 0.81;

/// CPU cost of issuing work: ~1.9–2 µs per cudaMemcpyPeerAsync on bare metal
/// (p2pBandwidthLatencyTest "CPU latency"; 5.25 µs was measured on the lent H200 VM). Kernel, event
/// and graph launches are estimates of the same order.
pub const ISSUE: IssueCosts = IssueCosts {
    copy_us: 2.0,
    kernel_us: 2.5,
    event_us: 0.5,
    graph_us: 2.5,
};

/// Device-memory copy bandwidth (each byte read and written): about half the HBM datasheet
/// figure — measured 2006 GB/s on H200 here; V100 900, A100 1555, H100 3350 GB/s HBM.
fn local_copy_gbps(major: u32) -> f64 {
    match major {
        0..=6 => 360.0,
        7 => 450.0,
        8 => 780.0,
        _ => 1675.0,
    }
}

/// The most NVLinks one GPU has (H100: 18). A GPU whose pairs add up to more is behind an
/// NVSwitch: every pair goes through the same port, so its pairs share one port's bandwidth.
const MAX_NVLINKS_PER_GPU: u32 = 18;

/// Whether `device` reaches its NVLink peers through an NVSwitch (shared port) rather than
/// point-to-point links.
pub fn behind_switch(topology: &Topology, device: usize) -> bool {
    switched_devices(topology).contains(&device)
}

/// Every device [`behind_switch`], from one pass over the pairs.
pub fn switched_devices(topology: &Topology) -> HashSet<usize> {
    let mut links: HashMap<usize, u32> = HashMap::new();
    for p in &topology.pairs {
        if let Link::NvLink(n) = p.link {
            *links.entry(p.src).or_default() += n;
        }
    }
    links
        .into_iter()
        .filter(|&(_, count)| count > MAX_NVLINKS_PER_GPU)
        .map(|(device, _)| device)
        .collect()
}

/// The architecture's major version, from `major.minor`; 0 where unreadable (oldest figures).
fn major(topology: &Topology, device: usize) -> u32 {
    topology
        .devices
        .get(device)
        .and_then(|d| d.compute_capability.split('.').next()?.parse().ok())
        .unwrap_or(0)
}

/// The default cost of a hop, or `None` for a device that does not exist or a pair with no entry.
pub fn cost(topology: &Topology, hop: Hop) -> Option<Cost> {
    let n = topology.devices.len();
    let (alpha_us, beta_gbps) = match hop {
        Hop::PeerCe { src, dst } => (
            COPY_ENGINE_ALPHA_US,
            peer_gbps(topology, src, dst, NVLINK_CE_EFFICIENCY, 1.0)?,
        ),
        Hop::PeerSm { src, dst } => (
            KERNEL_ALPHA_US,
            peer_gbps(topology, src, dst, NVLINK_SM_EFFICIENCY, LOCAL_SM_FRACTION)?,
        ),
        // The same SM stores over the same links as a copy kernel (an estimate: a worker's share
        // of SMs may reach less).
        Hop::Resident { src, dst } => (
            RESIDENT_ALPHA_US,
            peer_gbps(topology, src, dst, NVLINK_SM_EFFICIENCY, LOCAL_SM_FRACTION)?,
        ),
        Hop::DeviceToHost { device, node } | Hop::HostToDevice { device, node } => {
            if device >= n {
                return None;
            }
            let local = node.is_none()
                || topology.devices[device].numa_node.is_none()
                || node == topology.devices[device].numa_node;
            let fraction = if local { 1.0 } else { REMOTE_NUMA_FRACTION };
            (
                COPY_ENGINE_ALPHA_US,
                pcie_host_gbps(major(topology, device)) * fraction,
            )
        }
        Hop::Local { device } => {
            if device >= n {
                return None;
            }
            (KERNEL_ALPHA_US, local_copy_gbps(major(topology, device)))
        }
        Hop::NetRdma { src, dst } => {
            let (alpha_us, nic_gbps) = network(topology, src, dst)?;
            let net = topology.network.as_ref()?;
            let far = |gpu: usize| net.nearest(gpu).map_or(Link::Sys, |n| n.link);
            let pcie = pcie_host_gbps(major(topology, src).min(major(topology, dst)));
            let fraction = gpudirect_fraction(far(src)).min(gpudirect_fraction(far(dst)));
            (alpha_us, nic_gbps.min(pcie) * fraction)
        }
        Hop::NetHost { src, dst } => network(topology, src, dst)?,
    };
    Some(Cost {
        alpha_us,
        beta_gbps,
    })
}

/// One RDMA transfer between the NICs of `src` and `dst` (different hosts): its α (posting it,
/// then the network's latency, through the spine between rails) and the NICs' rate, GB/s.
fn network(topology: &Topology, src: usize, dst: usize) -> Option<(f64, f64)> {
    let net = topology.network.as_ref()?;
    let (a, b) = (net.nic_of(src)?, net.nic_of(dst)?);
    if a.host == b.host {
        return None;
    }
    let gbps =
        |nic: &crate::topology::network::Nic| nic.rate_gbit.unwrap_or(UNKNOWN_NIC_GBIT) / 8.0;
    let latency_us = match &net.fabric {
        Some(f) if f.kind == FabricKind::Rail && a.rail != b.rail => {
            f.latency_us + f.spine_latency_us
        }
        Some(f) => f.latency_us,
        None => NETWORK_LATENCY_US,
    };
    Some((
        RDMA_POST_US + latency_us,
        gbps(a).min(gbps(b)) * RDMA_EFFICIENCY,
    ))
}

/// A direct copy's rate between two GPUs; a GPU to itself is a local copy at `local_fraction` of
/// the copy engine's local rate.
fn peer_gbps(
    topology: &Topology,
    src: usize,
    dst: usize,
    nvlink_efficiency: f64,
    local_fraction: f64,
) -> Option<f64> {
    if src == dst {
        topology.devices.get(src)?;
        return Some(local_copy_gbps(major(topology, src)) * local_fraction);
    }
    let link = topology.pair(src, dst)?.link;
    if link.crosses_hosts() {
        return None;
    }
    let slower = major(topology, src).min(major(topology, dst));
    Some(match link {
        Link::NvLink(count) => count as f64 * nvlink_gbps_per_link(slower) * nvlink_efficiency,
        pcie => pcie_host_gbps(slower) * pcie_p2p_fraction(pcie),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn nvlink_bandwidth_scales_with_link_count() {
        let t = dgx1();
        let one = cost(&t, Hop::PeerCe { src: 0, dst: 1 }).unwrap();
        let two = cost(&t, Hop::PeerCe { src: 0, dst: 3 }).unwrap();
        assert!((two.beta_gbps / one.beta_gbps - 2.0).abs() < 1e-9);
        // V100 NVLink 2: 25 GB/s per link at copy-engine efficiency.
        assert!((one.beta_gbps - 22.0).abs() < 1e-9);
        let sm = cost(&t, Hop::PeerSm { src: 0, dst: 1 }).unwrap();
        assert!(sm.beta_gbps < one.beta_gbps);
    }

    #[test]
    fn h100_nvswitch_pair_matches_published_copy_engine_figure() {
        let c = cost(&nvswitch8(), Hop::PeerCe { src: 0, dst: 7 }).unwrap();
        // nvbandwidth v0.10: 395–397 GB/s one direction.
        assert!((c.beta_gbps - 396.0).abs() < 5.0, "{c:?}");
    }

    #[test]
    fn remote_host_memory_is_slower_than_local() {
        let t = pcie_2socket();
        let local = cost(
            &t,
            Hop::HostToDevice {
                device: 2,
                node: Some(1),
            },
        )
        .unwrap();
        let remote = cost(
            &t,
            Hop::HostToDevice {
                device: 2,
                node: Some(0),
            },
        )
        .unwrap();
        assert!(remote.beta_gbps < local.beta_gbps);
        assert_eq!(local.beta_gbps, 25.0);
    }

    #[test]
    fn switch_is_detected_from_link_counts() {
        assert!(behind_switch(&nvswitch8(), 0));
        assert!(!behind_switch(&dgx1(), 0));
        assert!(!behind_switch(&pcie_2socket(), 0));
    }

    #[test]
    fn unknown_devices_have_no_cost() {
        assert!(cost(&dgx1(), Hop::Local { device: 8 }).is_none());
        assert!(cost(
            &dgx1(),
            Hop::DeviceToHost {
                device: 9,
                node: None
            }
        )
        .is_none());
    }
}
