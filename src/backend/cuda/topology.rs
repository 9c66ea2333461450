//! Reads the host's topology once, at open: the driver for what CUDA sees, NVML for links, NUMA,
//! CPU affinity and MIG, sysfs where NVML has no answer.
//!
//! NVML missing does not fail: the driver's facts are filled in and a notice says what is missing.

use std::collections::{HashMap, HashSet};

use cudarc::driver::sys::{CUdevice_P2PAttribute, CUdevice_attribute};
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::driver::{self, Gpu};
use crate::topology::{nics, sysfs::Sysfs, Device, Link, Pair, PciAddress, Source, Topology};
use crate::Result;

/// The numbers set in an NVML bitmask (bit 0 of word 0 is number 0).
fn set_bits(words: &[u64]) -> impl Iterator<Item = usize> + '_ {
    words.iter().enumerate().flat_map(|(word, &bits)| {
        (0..64)
            .filter(move |bit| bits & (1u64 << bit) != 0)
            .map(move |bit| word * 64 + bit)
    })
}

/// A CPU bitmask (NVML's words, CPU 0 in bit 0 of word 0) as a list like `0-15,32-47`.
pub(super) fn cpu_list(words: &[u64]) -> Option<String> {
    crate::topology::runs_text(set_bits(words))
}

/// The one NUMA node set in a node mask; none if the mask names no node or several.
fn single_node(words: &[u64]) -> Option<i32> {
    let mut nodes = set_bits(words);
    match (nodes.next(), nodes.next()) {
        (Some(node), None) => i32::try_from(node).ok(),
        _ => None,
    }
}

/// NVML's common-ancestor level in nvidia-smi's vocabulary.
fn link_from_level(level: TopologyLevel) -> Link {
    match level {
        TopologyLevel::Internal | TopologyLevel::Single => Link::Pix,
        TopologyLevel::Multiple => Link::Pxb,
        TopologyLevel::HostBridge => Link::Phb,
        TopologyLevel::Node => Link::Node,
        TopologyLevel::System => Link::Sys,
    }
}

/// NVLinks between two GPUs, from the remote end of each active link of each.
///
/// Direct links name the peer GPU's PCI address. Links to an NVSwitch name something that is not a
/// GPU; two GPUs reach each other through every switch both are linked to, with as many links as
/// the less-linked side has to it (8× H100 with 18 links each to the same switches: `NV18`, as
/// `nvidia-smi topo -m` shows).
pub(super) fn nvlink_count(
    src_remotes: &[PciAddress],
    dst: PciAddress,
    dst_remotes: &[PciAddress],
    gpus: &HashSet<PciAddress>,
) -> u32 {
    let direct = src_remotes.iter().filter(|&&r| r == dst).count() as u32;
    if direct > 0 {
        return direct;
    }
    let switch_links = |remotes: &[PciAddress]| {
        let mut counts: HashMap<PciAddress, u32> = HashMap::new();
        for r in remotes.iter().filter(|r| !gpus.contains(r)) {
            *counts.entry(*r).or_default() += 1;
        }
        counts
    };
    let (from_src, from_dst) = (switch_links(src_remotes), switch_links(dst_remotes));
    from_src
        .iter()
        .filter_map(|(switch, &n)| from_dst.get(switch).map(|&m| n.min(m)))
        .sum()
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, nvidia-smi's spelling of a device UUID.
pub(super) fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The NUMA node sysfs reports for a PCI device; -1 there means the kernel does not know.
fn sysfs_numa_node(address: PciAddress) -> Option<i32> {
    let file = format!("sys/bus/pci/devices/{}/numa_node", address.sysfs_form());
    let node: i32 = Sysfs::system().read(&file)?.parse().ok()?;
    (node >= 0).then_some(node)
}

/// Words of CPU mask to ask NVML for: enough for 4096 CPUs.
const CPU_MASK_WORDS: usize = 64;

/// NVML_AFFINITY_SCOPE_NODE: ask for NUMA nodes (not sockets) in affinity queries.
const AFFINITY_SCOPE_NODE: u32 = 0;

/// NVML's limit on NVLinks per GPU (NVML_NVLINK_MAX_LINKS).
const MAX_NVLINKS: u32 = 18;

/// What NVML adds about one device.
#[derive(Default)]
struct NvmlFacts {
    uuid: Option<String>,
    numa_node: Option<i32>,
    /// The NUMA node of the memory NVML calls close to the GPU (nvidia-smi's "NUMA Affinity").
    memory_node: Option<i32>,
    cpu_affinity: Option<String>,
    mig_enabled: bool,
    /// Remote ends of the active NVLinks.
    nvlink_remotes: Vec<PciAddress>,
}

fn nvml_facts(nvml: &Nvml, address: PciAddress) -> std::result::Result<NvmlFacts, NvmlError> {
    let device = nvml.device_by_pci_bus_id(address.nvml_form())?;
    let numa_node = device
        .numa_node_id()
        .ok()
        .and_then(|n| i32::try_from(n).ok());
    let memory_node = device
        .memory_affinity(CPU_MASK_WORDS, AFFINITY_SCOPE_NODE)
        .ok()
        .and_then(|words| single_node(&words));
    let cpu_affinity = device
        .cpu_affinity(CPU_MASK_WORDS)
        .ok()
        .and_then(|words| cpu_list(&words));
    let mig_enabled = match device.mig_mode() {
        Ok(mode) => mode.current == 1,
        Err(_) => false, // NotSupported: no MIG on this GPU
    };
    let nvlink_remotes = (0..MAX_NVLINKS)
        .filter_map(|link| {
            let link = device.link_wrapper_for(link);
            if !link.is_active().ok()? {
                return None;
            }
            PciAddress::parse(&link.remote_pci_info().ok()?.bus_id)
        })
        .collect();
    Ok(NvmlFacts {
        uuid: device.uuid().ok(),
        numa_node,
        memory_node,
        cpu_affinity,
        mig_enabled,
        nvlink_remotes,
    })
}

/// The topology of `gpus` (asked of the driver without a context), and notices about what could
/// not be found out.
pub(super) fn discover(gpus: &[Gpu]) -> Result<(Topology, Vec<String>)> {
    let mut notices = Vec::new();
    let nvml = match Nvml::init() {
        Ok(nvml) => Some(nvml),
        Err(error) => {
            notices.push(format!(
                "NVML is unavailable ({error}): no NVLink detection, no driver version, no CPU \
                 affinity or MIG mode; NUMA nodes come from sysfs and PCIe link classes are guessed \
                 from them (SYS across nodes, NODE within one)"
            ));
            None
        }
    };

    let mut devices = Vec::with_capacity(gpus.len());
    let mut addresses = Vec::with_capacity(gpus.len());
    let mut remotes = Vec::with_capacity(gpus.len());
    for (index, &gpu) in gpus.iter().enumerate() {
        let raw_bus_id = gpu.pci_bus_id()?;
        let address = PciAddress::parse(&raw_bus_id).ok_or_else(|| crate::Error::Cuda {
            call: "cuDeviceGetPCIBusId".into(),
            message: format!("GPU {index} has a PCI bus id peerlink cannot read: `{raw_bus_id}`"),
        })?;
        let facts = match &nvml {
            Some(nvml) => nvml_facts(nvml, address).unwrap_or_else(|error| {
                notices.push(format!(
                    "NVML has no answer for GPU {index} ({}): {error}",
                    address.nvml_form()
                ));
                NvmlFacts::default()
            }),
            None => NvmlFacts::default(),
        };
        // NVML's own answer, else the kernel's, else the node of the memory NVML calls close.
        let (numa_node, numa_source) = match (facts.numa_node, sysfs_numa_node(address)) {
            (Some(node), _) => (Some(node), "nvml"),
            (None, Some(node)) => (Some(node), "sysfs"),
            (None, None) => match facts.memory_node {
                Some(node) => (Some(node), "nvml"),
                None => (None, "unknown"),
            },
        };
        let uuid = match facts.uuid {
            Some(uuid) => uuid,
            None => {
                let raw = gpu.uuid()?;
                format_uuid(&raw.bytes.map(|b| b as u8))
            }
        };
        let major =
            gpu.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            gpu.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let copy_engines =
            gpu.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)?;
        devices.push(Device {
            index,
            name: gpu.name()?,
            uuid,
            pci_bus_id: address.nvml_form(),
            numa_node,
            numa_source: numa_source.into(),
            cpu_affinity: facts.cpu_affinity,
            memory_bytes: gpu.total_memory()? as u64,
            compute_capability: format!("{major}.{minor}"),
            copy_engines: copy_engines.max(0) as u32,
            mig_enabled: facts.mig_enabled,
        });
        addresses.push(address);
        remotes.push(facts.nvlink_remotes);
    }

    // Every GPU NVML knows, visible to CUDA or not: an NVLink to anything else is a switch.
    let nvml_gpus: HashSet<PciAddress> = nvml
        .as_ref()
        .and_then(|nvml| {
            let count = nvml.device_count().ok()?;
            Some(
                (0..count)
                    .filter_map(|i| nvml.device_by_index(i).ok()?.pci_info().ok())
                    .filter_map(|info| PciAddress::parse(&info.bus_id))
                    .collect(),
            )
        })
        .unwrap_or_else(|| addresses.iter().copied().collect());

    let mut pairs = Vec::new();
    for src in 0..gpus.len() {
        for dst in (0..gpus.len()).filter(|&dst| dst != src) {
            let nvlinks = nvlink_count(&remotes[src], addresses[dst], &remotes[dst], &nvml_gpus);
            let link = if nvlinks > 0 {
                Link::NvLink(nvlinks)
            } else {
                pcie_link(
                    nvml.as_ref(),
                    addresses[src],
                    addresses[dst],
                    &devices,
                    src,
                    dst,
                )
            };
            pairs.push(pair(gpus, src, dst, link)?);
        }
    }

    let topology = Topology {
        source: Source::Cuda,
        driver_version: nvml.as_ref().and_then(|n| n.sys_driver_version().ok()),
        cuda_version: driver::driver_version().ok().map(driver::version_text),
        visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        network: Some(nics::discover(&Sysfs::system(), &devices)),
        devices,
        pairs,
    };
    Ok((topology, notices))
}

/// The PCIe path class: NVML's common ancestor, or a guess from NUMA nodes without NVML.
fn pcie_link(
    nvml: Option<&Nvml>,
    src: PciAddress,
    dst: PciAddress,
    devices: &[Device],
    src_index: usize,
    dst_index: usize,
) -> Link {
    let from_nvml = nvml.and_then(|nvml| {
        let a = nvml.device_by_pci_bus_id(src.nvml_form()).ok()?;
        let b = nvml.device_by_pci_bus_id(dst.nvml_form()).ok()?;
        a.topology_common_ancestor(b).ok()
    });
    match from_nvml {
        Some(level) => link_from_level(level),
        None => match (devices[src_index].numa_node, devices[dst_index].numa_node) {
            (Some(a), Some(b)) if a != b => Link::Sys,
            _ => Link::Node,
        },
    }
}

/// What the driver says about the ordered pair `src → dst`.
fn pair(gpus: &[Gpu], src: usize, dst: usize, link: Link) -> Result<Pair> {
    let (a, b) = (gpus[src], gpus[dst]);
    let p2p = a.can_access_peer(b)?;
    let attribute = |which| a.p2p_attribute(b, which);
    let (perf_rank, atomics, array_access) = if p2p {
        (
            attribute(CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
            attribute(CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
            attribute(CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED)?
                != 0,
        )
    } else {
        (0, false, false)
    };
    Ok(Pair {
        src,
        dst,
        link,
        p2p,
        perf_rank,
        atomics,
        array_access,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> PciAddress {
        PciAddress::parse(text).unwrap()
    }

    #[test]
    fn cpu_masks_become_range_lists() {
        assert_eq!(cpu_list(&[0xffff, 0]), Some("0-15".into()));
        // CPUs 0-15 and 32-47 (second socket's first half), plus CPU 64 in the next word.
        let mask = 0x0000_ffff_0000_ffff_u64;
        assert_eq!(cpu_list(&[mask, 1]), Some("0-15,32-47,64".into()));
        // A run that crosses a word boundary stays one range.
        assert_eq!(cpu_list(&[1 << 63, 1]), Some("63-64".into()));
        assert_eq!(cpu_list(&[0, 0]), None);
    }

    #[test]
    fn a_node_mask_names_one_node_or_none() {
        assert_eq!(single_node(&[0b1, 0]), Some(0));
        assert_eq!(single_node(&[0, 0b100]), Some(66));
        assert_eq!(single_node(&[0b11]), None);
        assert_eq!(single_node(&[0, 0]), None);
    }

    #[test]
    fn nvml_levels_map_onto_nvidia_smi_vocabulary() {
        assert_eq!(link_from_level(TopologyLevel::Single), Link::Pix);
        assert_eq!(link_from_level(TopologyLevel::Multiple), Link::Pxb);
        assert_eq!(link_from_level(TopologyLevel::HostBridge), Link::Phb);
        assert_eq!(link_from_level(TopologyLevel::Node), Link::Node);
        assert_eq!(link_from_level(TopologyLevel::System), Link::Sys);
    }

    #[test]
    fn direct_nvlinks_are_counted_per_peer() {
        // DGX-1 style: GPU A has two links to B and one to C.
        let (a, b, c) = (
            addr("0000:06:00.0"),
            addr("0000:07:00.0"),
            addr("0000:0a:00.0"),
        );
        let gpus: HashSet<_> = [a, b, c].into();
        let a_remotes = [b, b, c];
        assert_eq!(nvlink_count(&a_remotes, b, &[a, a], &gpus), 2);
        assert_eq!(nvlink_count(&a_remotes, c, &[a], &gpus), 1);
        assert_eq!(nvlink_count(&[b, b], c, &[], &gpus), 0);
    }

    #[test]
    fn nvswitch_links_connect_gpus_sharing_the_switches() {
        // HGX H100 style: each GPU has 5+4+4+5 links to the same four switches.
        let (a, b) = (addr("0000:18:00.0"), addr("0000:2a:00.0"));
        let switches: Vec<PciAddress> = (1..=4).map(|i| addr(&format!("0000:0{i}:00.0"))).collect();
        let remotes: Vec<PciAddress> = switches
            .iter()
            .zip([5, 4, 4, 5])
            .flat_map(|(s, n)| std::iter::repeat_n(*s, n))
            .collect();
        let gpus: HashSet<_> = [a, b].into();
        assert_eq!(nvlink_count(&remotes, b, &remotes, &gpus), 18);
        // A GPU whose links go to other switches shares nothing.
        let elsewhere = [addr("0000:09:00.0")];
        assert_eq!(nvlink_count(&remotes, b, &elsewhere, &gpus), 0);
    }

    #[test]
    fn uuids_use_nvidia_smi_spelling() {
        let bytes: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(
            format_uuid(&bytes),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
    }
}
