//! Peer access: the one place that enables it, and the driver's refusals in words.

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaContext, DriverError};

use super::driver;
use crate::topology::Topology;
use crate::{Error, Result};

/// Lets work issued on `device` reach `peer`'s memory (two distinct GPUs; the checked layer asks
/// once per pair).
pub(super) fn enable(
    ctx: &CudaContext,
    peer_ctx: &CudaContext,
    topology: &Topology,
    device: usize,
    peer: usize,
) -> Result<()> {
    driver::enable_peer_access(ctx, peer_ctx).map_err(|code| explain(topology, device, peer, code))
}

/// The driver's refusal in words, with what to do about it.
fn explain(topology: &Topology, device: usize, peer: usize, code: CUresult) -> Error {
    let link = topology
        .pair(device, peer)
        .map(|p| format!(" (link {})", p.link))
        .unwrap_or_default();
    let message = match code {
        CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => format!(
            "the driver reports P2P unsupported between them{link}: transfers between these GPUs \
             must be staged through host memory (often an IOMMU/ACS setting, a VM, or GPUs under \
             different CPU sockets); see `peerlink topo`"
        ),
        CUresult::CUDA_ERROR_TOO_MANY_PEERS => format!(
            "GPU {device} already has as many peers enabled as its hardware allows (8 on most \
             GPUs){link}: use fewer GPUs at once, or relay through a GPU that already has access"
        ),
        other => driver::cuda_error("cuCtxEnablePeerAccess", DriverError(other)).to_string(),
    };
    Error::PeerAccess {
        src: device,
        dst: peer,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Device, Link, Pair};

    fn topology_with(link: Link) -> Topology {
        let device = |index| Device {
            index,
            name: "GPU".into(),
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
            numa_node: Some(index as i32),
            numa_source: "sysfs".into(),
            cpu_affinity: None,
            memory_bytes: 1 << 30,
            compute_capability: "9.0".into(),
            copy_engines: 3,
            mig_enabled: false,
        };
        let pair = |src, dst| Pair {
            src,
            dst,
            link,
            p2p: false,
            perf_rank: 0,
            atomics: false,
            array_access: false,
        };
        Topology {
            source: crate::topology::Source::Cuda,
            driver_version: None,
            cuda_version: None,
            visible_devices: None,
            devices: vec![device(0), device(1)],
            pairs: vec![pair(0, 1), pair(1, 0)],
            network: None,
        }
    }

    #[test]
    fn unsupported_pairs_say_why_and_what_to_do() {
        let topo = topology_with(Link::Sys);
        let error = explain(&topo, 0, 1, CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        let text = error.to_string();
        assert!(
            matches!(error, Error::PeerAccess { src: 0, dst: 1, .. }),
            "{text}"
        );
        assert!(text.contains("link SYS"), "{text}");
        assert!(text.contains("staged through host memory"), "{text}");
    }

    #[test]
    fn too_many_peers_says_to_use_fewer() {
        let topo = topology_with(Link::NvLink(18));
        let text = explain(&topo, 1, 0, CUresult::CUDA_ERROR_TOO_MANY_PEERS).to_string();
        assert!(text.contains("GPU 1 already has as many peers"), "{text}");
        assert!(text.contains("fewer GPUs"), "{text}");
    }
}
