//! What a multi-GPU host looks like: its devices, how each ordered pair is linked, and what is wrong.
//!
//! The types here are plain data, filled either by the CUDA backend (from the driver and NVML) or by
//! the simulator (from a preset). The link vocabulary is `nvidia-smi topo -m`'s, so that a user can
//! put the two side by side.

mod link;
pub mod nccl_view;
pub mod network;
pub mod nics;
pub mod pci;
mod source;
pub mod sysfs;
mod warnings;

pub use link::Link;
pub use network::Network;
pub use pci::PciAddress;
pub use source::Source;
pub use warnings::{warnings, NoP2p, Warning};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most GPUs one topology holds, all hosts of a simulator preset together (documented in
/// `docs/sim-format.md`). `topo` lists every ordered pair, so what it prints grows with the
/// square of the GPUs: 1024 keeps that near a million pairs (well under a GiB), and covers the
/// largest NVLink domains built (72 GPUs) and planning presets of 128 eight-GPU hosts. A preset
/// with more is refused while it is read, before anything is made from it.
pub const MAX_GPUS: usize = 1024;

/// One GPU as the host presents it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Device {
    /// CUDA device ordinal (after CUDA_VISIBLE_DEVICES).
    pub index: usize,
    pub name: String,
    pub uuid: String,
    /// PCI bus id in NVML's and `nvidia-smi -q`'s form, `00000000:18:00.0`.
    pub pci_bus_id: String,
    /// NUMA node of the GPU's PCIe root, where known.
    pub numa_node: Option<i32>,
    /// Where `numa_node` came from: `nvml`, `sysfs`, `preset` or `unknown`.
    pub numa_source: String,
    /// CPUs near the GPU, as a list like `0-47,96-143`, where known.
    pub cpu_affinity: Option<String>,
    pub memory_bytes: u64,
    /// Compute capability as `major.minor`.
    pub compute_capability: String,
    /// Asynchronous copy engines (CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT).
    pub copy_engines: u32,
    /// Whether MIG mode is enabled (P2P is not available to MIG instances).
    pub mig_enabled: bool,
}

/// What the driver says about one ordered pair of distinct GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Pair {
    pub src: usize,
    pub dst: usize,
    /// How the two are connected, in nvidia-smi's vocabulary.
    pub link: Link,
    /// cuDeviceCanAccessPeer(src, dst).
    pub p2p: bool,
    /// CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: lower is better; 0 where P2P is impossible.
    pub perf_rank: i32,
    /// CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED.
    pub atomics: bool,
    /// CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED.
    pub array_access: bool,
}

/// The whole host: devices and every ordered pair of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Topology {
    /// Real GPUs, or the simulator and its preset.
    pub source: Source,
    /// Driver version as NVML reports it, where known.
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports, `major.minor`, where known.
    #[serde(default)]
    pub cuda_version: Option<String>,
    /// The value of CUDA_VISIBLE_DEVICES when the topology was read, if set.
    pub visible_devices: Option<String>,
    pub devices: Vec<Device>,
    /// One entry per ordered pair `src != dst` of the GPUs in use, sorted by (src, dst): of
    /// every GPU, unless the host was opened for a run over a few (a simulator opened for
    /// `--devices` lists their pairs alone, its pairs growing with the square of the GPUs).
    pub pairs: Vec<Pair>,
    /// The hosts, their RDMA NICs and how the GPUs reach them; absent where nothing was read
    /// (a simulator preset without NICs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
}

/// The sentence every check of a GPU index says where GPU `gpu` is not one of a host's `count`,
/// or `None` where it exists.
pub fn missing_gpu(gpu: usize, count: usize) -> Option<String> {
    (gpu >= count).then(|| {
        format!(
            "GPU {gpu} does not exist; this host has {count} GPU{} (0..={})",
            if count == 1 { "" } else { "s" },
            count.saturating_sub(1)
        )
    })
}

/// Indices as a short list of runs, `0-15,32-47,64`, in the order given; `None` for none. (CPU
/// lists as the kernel and NVML print them, and a host's GPUs and NICs.)
pub fn runs_text(indices: impl IntoIterator<Item = usize>) -> Option<String> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for i in indices {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == i => *end = i,
            _ => runs.push((i, i)),
        }
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(","))
}

/// Bad usage: GPU `gpu` is not among the GPUs in use (`--devices`).
pub fn not_in_use(gpu: usize, in_use: &[usize]) -> crate::Error {
    let list: Vec<String> = in_use.iter().map(usize::to_string).collect();
    crate::Error::usage(format!(
        "GPU {gpu} is not one of the GPUs in use ({})",
        list.join(", ")
    ))
}

/// The entry of `pairs` for an ordered pair of distinct devices.
pub fn pair_in(pairs: &[Pair], src: usize, dst: usize) -> Option<&Pair> {
    if src == dst {
        return None;
    }
    // Pairs are kept sorted, so a lookup is a binary search (a 1000-GPU host has a million
    // pairs, and its table looks each up); a list built out of order is still searched whole.
    match pairs.binary_search_by(|p| (p.src, p.dst).cmp(&(src, dst))) {
        Ok(at) => Some(&pairs[at]),
        Err(_) => pairs.iter().find(|p| p.src == src && p.dst == dst),
    }
}

impl Topology {
    /// The entry for an ordered pair of distinct devices.
    pub fn pair(&self, src: usize, dst: usize) -> Option<&Pair> {
        pair_in(&self.pairs, src, dst)
    }

    /// The host GPU `gpu` sits on (0 on a topology of one host).
    pub fn host_of(&self, gpu: usize) -> usize {
        self.network.as_ref().map_or(0, |n| n.host_of(gpu))
    }

    /// Whether GPUs `a` and `b` sit on different hosts.
    pub fn crosses_hosts(&self, a: usize, b: usize) -> bool {
        self.network.is_some() && self.host_of(a) != self.host_of(b)
    }

    /// Whether this topology came from the simulator.
    pub fn is_simulated(&self) -> bool {
        self.source.is_simulated()
    }

    /// The same host with only the devices in `selected` (indices) and the pairs between them.
    pub fn restricted_to(&self, selected: &[usize]) -> Topology {
        // A mask, not a search of `selected` per pair: a 1000-GPU host has a million pairs.
        let count = self
            .devices
            .len()
            .max(selected.iter().max().map_or(0, |&m| m + 1));
        let mut kept = vec![false; count];
        for &i in selected {
            kept[i] = true;
        }
        let keep = |i: &usize| kept.get(*i).copied().unwrap_or(false);
        Topology {
            devices: self
                .devices
                .iter()
                .filter(|d| keep(&d.index))
                .cloned()
                .collect(),
            pairs: self
                .pairs
                .iter()
                .filter(|p| keep(&p.src) && keep(&p.dst))
                .cloned()
                .collect(),
            network: self.network.as_ref().map(|n| n.restricted_to(|g| keep(&g))),
            // Field by field: a clone of the whole would copy every pair first.
            source: self.source.clone(),
            driver_version: self.driver_version.clone(),
            cuda_version: self.cuda_version.clone(),
            visible_devices: self.visible_devices.clone(),
        }
    }

    /// Checks a user's device list against the host and returns it, or all devices when `None`.
    pub fn select(&self, devices: Option<&[usize]>) -> crate::Result<Vec<usize>> {
        let n = self.devices.len();
        match devices {
            None => Ok((0..n).collect()),
            Some(list) => {
                if list.is_empty() {
                    return Err(crate::Error::usage("--devices names no device"));
                }
                if let Some(missing) = list.iter().find_map(|&d| missing_gpu(d, n)) {
                    return Err(crate::Error::usage(format!("--devices: {missing}")));
                }
                let mut seen = list.to_vec();
                seen.sort_unstable();
                seen.dedup();
                if seen.len() != list.len() {
                    return Err(crate::Error::usage("--devices names a GPU twice"));
                }
                Ok(list.to_vec())
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A device with plausible fields, for tests.
    pub fn device(index: usize, numa: Option<i32>, bus: &str) -> Device {
        Device {
            index,
            name: "Test GPU".into(),
            uuid: format!("GPU-test-{index}"),
            pci_bus_id: bus.into(),
            numa_node: numa,
            numa_source: "preset".into(),
            cpu_affinity: None,
            memory_bytes: 80 << 30,
            compute_capability: "9.0".into(),
            copy_engines: 3,
            mig_enabled: false,
        }
    }

    /// Two GPUs bonded by NV2 on one socket and a third on the other socket, `sim:test`.
    pub fn three_gpus() -> Topology {
        Topology {
            source: Source::Sim("test".into()),
            driver_version: Some("580.159.04".into()),
            cuda_version: Some("13.0".into()),
            visible_devices: None,
            devices: vec![
                device(0, Some(0), "0000:18:00.0"),
                device(1, Some(0), "0000:2a:00.0"),
                device(2, Some(1), "0000:98:00.0"),
            ],
            pairs: vec![
                pair(0, 1, Link::NvLink(2), true),
                pair(0, 2, Link::Sys, false),
                pair(1, 0, Link::NvLink(2), true),
                pair(1, 2, Link::Sys, false),
                pair(2, 0, Link::Sys, false),
                pair(2, 1, Link::Sys, false),
            ],
            network: None,
        }
    }

    pub fn pair(src: usize, dst: usize, link: Link, p2p: bool) -> Pair {
        Pair {
            src,
            dst,
            link,
            p2p,
            perf_rank: if p2p { 1 } else { 0 },
            atomics: p2p,
            array_access: p2p,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    fn two_gpus() -> Topology {
        Topology {
            source: Source::Sim("test".into()),
            driver_version: None,
            cuda_version: None,
            visible_devices: None,
            devices: vec![
                device(0, Some(0), "0000:18:00.0"),
                device(1, Some(0), "0000:2a:00.0"),
            ],
            pairs: vec![
                pair(0, 1, Link::NvLink(18), true),
                pair(1, 0, Link::NvLink(18), true),
            ],
            network: None,
        }
    }

    #[test]
    fn select_defaults_to_all_and_rejects_out_of_range() {
        let t = two_gpus();
        assert_eq!(t.select(None).unwrap(), vec![0, 1]);
        assert_eq!(t.select(Some(&[1])).unwrap(), vec![1]);
        let err = t.select(Some(&[2])).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("GPU 2 does not exist"), "{err}");
        assert!(t.select(Some(&[0, 0])).is_err());
        assert!(t.select(Some(&[])).is_err());
    }

    #[test]
    fn pair_lookup_is_ordered() {
        let t = two_gpus();
        assert_eq!(t.pair(0, 1).unwrap().dst, 1);
        assert!(t.pair(0, 0).is_none());
        assert!(t.is_simulated());
    }
}
