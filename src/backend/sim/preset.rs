//! Simulator presets: a compact JSON description of a multi-GPU host, parsed and checked.
//!
//! A preset names the GPUs, how each pair is linked, and the figures the link model needs (rates,
//! latencies, CPU and GPU overheads). The format is documented in `docs/sim-format.md`; the embedded
//! presets live in `src/topology/presets/`, each with a `sources` list saying where its figures come
//! from. Everything a preset says is checked here, so that the simulator itself never meets a
//! nonsensical host.

use super::faults::{self, Faults, Wiring};
use crate::topology::network::{Fabric, FabricKind, GpuDirect, GpuNic, Host, Network, Nic};
use crate::topology::{Device, Link, Pair, PciAddress, Source, Topology, MAX_GPUS};
use crate::units::{shown_figure, LARGEST_FIGURE};
use crate::{Error, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

macro_rules! embedded {
    ($name:literal) => {
        (
            $name,
            include_str!(concat!("../../topology/presets/", $name, ".json")),
        )
    };
}

/// Embedded presets, by name.
const EMBEDDED: &[(&str, &str)] = &[
    embedded!("dgx-h100"),
    embedded!("dgx1-v100"),
    embedded!("pcie-4gpu-2socket"),
    embedded!("pcie-2gpu-switch"),
    embedded!("h200-pair"),
    embedded!("2x-dgx-h100"),
    embedded!("2x-pcie-4gpu-2socket"),
];

const EMBEDDED_NAMES: [&str; EMBEDDED.len()] = {
    let mut names = [""; EMBEDDED.len()];
    let mut i = 0;
    while i < EMBEDDED.len() {
        names[i] = EMBEDDED[i].0;
        i += 1;
    }
    names
};

/// Names of the embedded presets, for `--sim <name>` and listings.
pub fn preset_names() -> &'static [&'static str] {
    &EMBEDDED_NAMES
}

/// A simulated host. Rates are in GB/s (1e9 bytes per second, one direction), times in µs unless a
/// field name says `_ns`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// Short name, shown as `sim:<name>`.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Where each figure comes from (a measurement, a document, or "estimate: …").
    #[serde(default)]
    pub sources: Vec<String>,
    /// Defaults for every GPU; a device entry may override its name and memory.
    pub gpu: GpuSpec,
    /// One host's GPUs: with `hosts`, at most [`MAX_GPUS`] in all.
    #[serde(deserialize_with = "at_most_gpus")]
    #[schemars(length(min = 1, max = MAX_GPUS))]
    pub devices: Vec<DeviceSpec>,
    /// NVLink figures; required when any pair is linked by NVLink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<NvLinkSpec>,
    /// An NVSwitch fabric: every pair of GPUs is linked through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvswitch: Option<NvSwitchSpec>,
    /// Explicit pairs (unordered): NVLink bundles (`NV2`) or PCIe path classes (`PXB`) that differ
    /// from what the devices' switches and NUMA nodes imply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkSpec>,
    pub pcie: PcieSpec,
    pub host: HostSpec,
    pub costs: Costs,
    /// How many identical hosts (default 1). `devices`, `links`, `nics` and `nic_links` describe
    /// one of them; GPUs and NICs are numbered host by host.
    #[serde(default = "one_host", skip_serializing_if = "is_one_host")]
    pub hosts: usize,
    /// Each host's RDMA NICs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NicSpec>,
    /// GPU↔NIC paths (within one host) that differ from what their switches and NUMA nodes imply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nic_links: Vec<NicLinkSpec>,
    /// The network between the hosts' NICs; required with more than one host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    /// How managed memory's page faults are priced; the defaults of [`ManagedSpec`] when absent.
    #[serde(default, skip_serializing_if = "ManagedSpec::is_default")]
    pub managed: ManagedSpec,
    /// Faults the host carries, for `peerlink doctor` to find (none by default).
    #[serde(default, skip_serializing_if = "Faults::is_empty")]
    pub faults: Faults,
    /// Written by a `peerlink tune` that was interrupted: the figures it did not reach are the
    /// calibration's estimates. The simulator says so when it opens the preset.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

fn one_host() -> usize {
    1
}

fn is_one_host(hosts: &usize) -> bool {
    *hosts == 1
}

/// The most hosts a preset may describe.
pub const MAX_HOSTS: usize = 1024;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    pub name: String,
    pub memory_mib: u64,
    pub compute_capability: String,
    pub copy_engines: u32,
    /// Device-local copy rate, bytes copied once (not read + write).
    pub local_copy_gbps: f64,
    /// Fraction of a route's rate that an SM copy kernel reaches, relative to a copy engine.
    pub sm_copy_efficiency: f64,
    /// Round trip of one dependent load from the GPU's own memory.
    pub load_latency_ns: f64,
    /// The same load from a chain the caches hold (pointer-chase-resident); `load_latency_ns` when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_load_latency_ns: Option<f64>,
    /// One-way latency of a fenced store + flag seen by another kernel on the same GPU.
    pub signal_us: f64,
    /// The fraction of its rate a copy from this GPU into host memory keeps while the GPU also
    /// sends to a peer over NVLink (the host-staged route of a split beside its direct copy); 1
    /// (not slowed) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_copy_beside_peer: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    pub numa_node: i32,
    /// Defaults to `0000:<index+1>:00.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// GPUs naming the same switch are `PIX` to each other and share its uplink to the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_switch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_affinity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mig_enabled: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NvLinkSpec {
    /// Line rate of one link, one direction.
    pub link_gbps: f64,
    /// Fraction of the line rate a copy engine reaches (the resource capacity is rate × this).
    pub efficiency: f64,
    /// Extra per-copy latency of a copy over NVLink.
    pub latency_us: f64,
    /// Round trip of one dependent load from a peer's memory.
    pub load_latency_ns: f64,
    /// The same load from a chain the peer's caches hold (pointer-chase-resident); when absent,
    /// 826 ns (nvbandwidth's device_to_device_latency_sm on H100), or `load_latency_ns` where that
    /// is lower.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_load_latency_ns: Option<f64>,
    /// One-way latency of a fenced store + flag between two GPUs.
    pub signal_us: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NvSwitchSpec {
    /// NVLinks from each GPU into the switch fabric (shown as `NV<n>` for every pair).
    pub links_per_gpu: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub gpus: [usize; 2],
    pub link: Link,
}

/// One RDMA NIC of each host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NicSpec {
    /// The NUMA node of the NIC's PCIe root.
    pub numa_node: i32,
    /// GPUs naming the same switch are `PIX` to this NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_switch: Option<String>,
    /// Defaults to `mlx5_<index within the host>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
}

/// How one GPU reaches one NIC of its host, where the switches and NUMA nodes do not say it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NicLinkSpec {
    pub gpu: usize,
    pub nic: usize,
    /// `PIX`, `PXB`, `PHB`, `NODE` or `SYS`.
    pub link: Link,
}

/// The network between the hosts: every NIC's rate and how the NICs are cabled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// `rail`: NIC `i` of every host on leaf switch `i` (rail-optimised); `fat-tree`: any NIC to
    /// any NIC at one latency.
    pub fabric: FabricKind,
    /// Each NIC's line rate, per direction (400 Gb/s NDR = 50 GB/s).
    pub nic_gbps: f64,
    /// Fraction of the line rate RDMA transfers reach.
    pub efficiency: f64,
    /// One message NIC to NIC through one switch.
    pub latency_us: f64,
    /// `rail` only: added between NICs of different rails (through the spine).
    #[serde(default)]
    pub spine_latency_us: f64,
    /// Whether the NICs can reach GPU memory (nvidia-peermem or dma-buf); default true.
    #[serde(default = "gpudirect_default")]
    pub gpudirect: bool,
}

fn gpudirect_default() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PcieSpec {
    /// Each GPU's own PCIe link to its switch or root port, per direction (pinned host copies).
    pub host_gbps: f64,
    /// A PCIe switch's uplink to the CPU, per direction; defaults to `host_gbps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_uplink_gbps: Option<f64>,
    /// Extra per-copy latency of a copy over PCIe.
    pub latency_us: f64,
    /// Round trip of one dependent load over PCIe (a peer's or pinned host memory).
    pub load_latency_ns: f64,
    /// The same load from a chain the caches hold; `load_latency_ns` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_load_latency_ns: Option<f64>,
    /// One-way latency of a fenced store + flag between two GPUs over PCIe.
    pub signal_us: f64,
    /// P2P rate per path class (`PIX`, `PXB`, `PHB`, `NODE`, `SYS`); a class left out has no P2P.
    #[serde(default)]
    pub p2p_gbps: BTreeMap<Link, f64>,
    /// The PCIe generation every GPU's link trains at (1 to 6), where the preset says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
    /// The lanes of every GPU's link (1 to 32), where the preset says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<u32>,
    /// The fraction of its rate a copy between a GPU and host memory keeps while the GPU's PCIe
    /// link also carries a copy the other way (a split through the host both ways between two
    /// GPUs); 1 (not slowed) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub both_ways_fraction: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// The CPU sockets' interconnect, per direction.
    pub inter_socket_gbps: f64,
    /// Rate of a peer copy the driver stages through host memory (no P2P).
    pub staged_gbps: f64,
    /// Extra latency of a staged peer copy.
    pub staged_latency_us: f64,
}

/// Managed (unified) memory: a GPU's first touch of a page that lives elsewhere costs `fault_us`,
/// then the page moves over the link at the link's rate. The defaults are estimates (see
/// `docs/sim-format.md`), to be replaced by what `bench --tests managed-fault,managed-fault-latency`
/// measures on a real host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManagedSpec {
    /// The unit pages fault and move in, KiB (4 to 2048).
    pub page_kib: u64,
    /// GPU time one page's fault costs before its bytes move (the driver servicing it), µs.
    pub fault_us: f64,
}

impl ManagedSpec {
    /// The page the defaults move: the GPU's smallest big page in NVIDIA's UVM driver
    /// (UVM_MIN_BIG_PAGE_SIZE, docs/reference.md).
    pub const DEFAULT_PAGE_KIB: u64 = 64;
    /// An estimate: no published per-page figure for Hopper's GPU-to-GPU fault migration was found.
    pub const DEFAULT_FAULT_US: f64 = 5.0;

    fn is_default(&self) -> bool {
        *self == ManagedSpec::default()
    }

    /// Bytes of one page.
    pub fn page_bytes(&self) -> usize {
        self.page_kib as usize * 1024
    }
}

impl Default for ManagedSpec {
    fn default() -> Self {
        ManagedSpec {
            page_kib: ManagedSpec::DEFAULT_PAGE_KIB,
            fault_us: ManagedSpec::DEFAULT_FAULT_US,
        }
    }
}

/// CPU costs (`*_issue_us`, `sync_us`: host clock) and GPU overheads (`*_setup_us`, `graph_node_us`:
/// GPU time per operation before its bytes move).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Costs {
    pub copy_issue_us: f64,
    pub kernel_issue_us: f64,
    pub event_issue_us: f64,
    pub graph_issue_us: f64,
    pub sync_us: f64,
    pub copy_setup_us: f64,
    pub kernel_setup_us: f64,
    pub graph_node_us: f64,
}

/// nvbandwidth's published latency of a dependent load over NVLink on H100 (its
/// `device_to_device_latency_sm`: a 2 MiB chain, one cache line a step, resident in the caches;
/// docs/reference.md): what a preset's NVLink without a `resident_load_latency_ns` takes.
pub const NVBANDWIDTH_H100_NVLINK_LOAD_NS: f64 = 826.0;

impl GpuSpec {
    /// A dependent load from the GPU's own memory through a chain its caches hold: the preset's
    /// figure, or the load from memory (no published figure to borrow).
    pub fn resident_load_ns(&self) -> f64 {
        self.resident_load_latency_ns
            .unwrap_or(self.load_latency_ns)
    }
}

impl NvLinkSpec {
    /// A dependent load from a peer through a chain the peer's caches hold: the preset's figure,
    /// else nvbandwidth's for H100 ([`NVBANDWIDTH_H100_NVLINK_LOAD_NS`]), or the load from memory
    /// where that is lower (a cached chain is never slower).
    pub fn resident_load_ns(&self) -> f64 {
        self.resident_load_latency_ns
            .unwrap_or(NVBANDWIDTH_H100_NVLINK_LOAD_NS.min(self.load_latency_ns))
    }
}

impl PcieSpec {
    /// A dependent load over PCIe through a chain the caches hold: the preset's figure, or the
    /// load from memory (no published figure to borrow).
    pub fn resident_load_ns(&self) -> f64 {
        self.resident_load_latency_ns
            .unwrap_or(self.load_latency_ns)
    }
}

impl Preset {
    /// Opens an embedded preset by name, or a JSON file when `spec` names an existing path or ends
    /// in `.json`.
    pub fn load(spec: &str) -> Result<Preset> {
        if spec.ends_with(".json") || Path::new(spec).exists() {
            let text = crate::files::read_text(Path::new(spec)).map_err(|why| Error::Preset {
                origin: spec.to_string(),
                message: format!("it {why}"),
            })?;
            return Preset::parse(&text, spec);
        }
        match EMBEDDED.iter().find(|(name, _)| *name == spec) {
            Some((name, text)) => Preset::parse(text, name),
            None => Err(Error::Preset {
                origin: format!("`{spec}`"),
                message: format!(
                    "unknown preset; the embedded presets are {} (or pass a path to a .json file)",
                    EMBEDDED_NAMES.join(", ")
                ),
            }),
        }
    }

    /// Parses and checks a preset; `origin` names it in error messages (a path or a preset name).
    pub fn parse(text: &str, origin: &str) -> Result<Preset> {
        let preset: Preset = serde_json::from_str(text).map_err(|e| Error::Preset {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        preset.validate().map_err(|message| Error::Preset {
            origin: origin.to_string(),
            message,
        })?;
        Ok(preset)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("`name` is empty".into());
        }
        if self.devices.is_empty() {
            return Err("`devices` is empty: a host needs at least one GPU".into());
        }
        let gpus = self.hosts.saturating_mul(self.devices.len());
        if gpus > MAX_GPUS {
            return Err(format!(
                "`hosts` × `devices` is {gpus} GPUs; a preset describes at most {MAX_GPUS} GPUs \
                 in all"
            ));
        }
        self.validate_texts()?;
        self.validate_gpu()?;
        self.validate_devices()?;
        self.validate_bus_ids()?;
        self.validate_nvlink()?;
        self.validate_nvswitch()?;
        self.validate_links()?;
        self.check_nvlinks_per_gpu()?;
        self.validate_pcie()?;
        self.validate_host_and_costs()?;
        self.validate_managed()?;
        self.faults.validate(&self.wiring())?;
        self.validate_hosts()
    }

    /// Every text a preset gives: no longer than its bound, without a control character or a
    /// bidirectional override (each is printed; see [`crate::echo`]), and in its form where it
    /// has one (a compute capability, a CPU list).
    fn validate_texts(&self) -> std::result::Result<(), String> {
        text("name", &self.name, NAME_CHARS)?;
        text("description", &self.description, NOTE_CHARS)?;
        for (i, source) in self.sources.iter().enumerate() {
            text(&format!("sources[{i}]"), source, NOTE_CHARS)?;
        }
        text("gpu.name", &self.gpu.name, GPU_NAME_CHARS)?;
        if !is_compute_capability(&self.gpu.compute_capability) {
            return Err(
                "gpu.compute_capability is not `major.minor` (two numbers, as `9.0`)".into(),
            );
        }
        for (i, d) in self.devices.iter().enumerate() {
            let field = |name: &str| format!("devices[{i}].{name}");
            optional_text(&field("name"), &d.name, GPU_NAME_CHARS)?;
            optional_text(&field("pcie_switch"), &d.pcie_switch, NAME_CHARS)?;
            if let Some(cpus) = &d.cpu_affinity {
                if !is_cpu_list(cpus) {
                    return Err(format!(
                        "{} is not a list of CPUs (as `0-47,96-143`, at most {NOTE_CHARS} \
                         characters)",
                        field("cpu_affinity")
                    ));
                }
            }
        }
        for (i, nic) in self.nics.iter().enumerate() {
            optional_text(&format!("nics[{i}].name"), &nic.name, NAME_CHARS)?;
            optional_text(
                &format!("nics[{i}].pcie_switch"),
                &nic.pcie_switch,
                NAME_CHARS,
            )?;
        }
        Ok(())
    }

    /// Every PCI bus id in the form `DDDD:BB:DD.F` (or NVML's eight-digit domain), and no two
    /// devices of a host (GPUs, with their default ids, and NICs) at one address.
    fn validate_bus_ids(&self) -> std::result::Result<(), String> {
        let gpus = (0..self.devices.len()).map(|i| (format!("devices[{i}]"), self.bus_id(i)));
        let nics = self.nics.iter().enumerate().filter_map(|(i, nic)| {
            let id = nic.pci_bus_id.clone()?;
            Some((format!("nics[{i}]"), id))
        });
        let mut seen = BTreeMap::new();
        for (what, id) in gpus.chain(nics) {
            let Some(address) = strict_bus_id(&id) else {
                return Err(format!(
                    "{what}.pci_bus_id is not a PCI bus id of the form DDDD:BB:DD.F (hex \
                     domain, bus, device up to 1F, function 0 to 7), as `0000:18:00.0`"
                ));
            };
            if let Some(first) = seen.insert(address, what.clone()) {
                return Err(format!(
                    "{what}.pci_bus_id is {id}, the address of {first} as well: two devices of a \
                     host never share one"
                ));
            }
        }
        Ok(())
    }

    /// The PCI bus id of the host's GPU `local`: the preset's, else `0000:<local+1>:00.0` (the
    /// next domain past bus FF).
    fn bus_id(&self, local: usize) -> String {
        match &self.devices[local].pci_bus_id {
            Some(id) => id.clone(),
            None => format!("{:04X}:{:02X}:00.0", (local + 1) >> 8, (local + 1) & 0xFF),
        }
    }

    /// The GPU model's figures.
    fn validate_gpu(&self) -> std::result::Result<(), String> {
        let g = &self.gpu;
        memory("gpu.memory_mib", g.memory_mib)?;
        if g.copy_engines > MOST_COPY_ENGINES {
            return Err(format!(
                "gpu.copy_engines is {}; a GPU has at most {MOST_COPY_ENGINES} (H100 reports 3 \
                 asynchronous engines)",
                g.copy_engines
            ));
        }
        rate("gpu.local_copy_gbps", g.local_copy_gbps)?;
        fraction("gpu.sm_copy_efficiency", g.sm_copy_efficiency)?;
        positive("gpu.load_latency_ns", g.load_latency_ns)?;
        if let Some(ns) = g.resident_load_latency_ns {
            positive("gpu.resident_load_latency_ns", ns)?;
        }
        if let Some(share) = g.host_copy_beside_peer {
            fraction("gpu.host_copy_beside_peer", share)?;
        }
        positive("gpu.signal_us", g.signal_us)?;
        Ok(())
    }

    /// Each device's NUMA node and memory.
    fn validate_devices(&self) -> std::result::Result<(), String> {
        for (i, d) in self.devices.iter().enumerate() {
            numa_node(&format!("devices[{i}].numa_node"), d.numa_node)?;
            if let Some(m) = d.memory_mib {
                memory(&format!("devices[{i}].memory_mib"), m)?;
            }
        }
        Ok(())
    }

    /// The NVLink section's figures, where there is one.
    fn validate_nvlink(&self) -> std::result::Result<(), String> {
        if let Some(nv) = &self.nvlink {
            rate("nvlink.link_gbps", nv.link_gbps)?;
            fraction("nvlink.efficiency", nv.efficiency)?;
            not_negative("nvlink.latency_us", nv.latency_us)?;
            positive("nvlink.load_latency_ns", nv.load_latency_ns)?;
            if let Some(ns) = nv.resident_load_latency_ns {
                positive("nvlink.resident_load_latency_ns", ns)?;
            }
            positive("nvlink.signal_us", nv.signal_us)?;
        }
        Ok(())
    }

    /// The NVSwitch section: links per GPU, and what it cannot be combined with.
    fn validate_nvswitch(&self) -> std::result::Result<(), String> {
        if let Some(sw) = &self.nvswitch {
            if sw.links_per_gpu == 0 {
                return Err("nvswitch.links_per_gpu must be at least 1".into());
            }
            if self.nvlink.is_none() {
                return Err("`nvswitch` needs an `nvlink` section with the link figures".into());
            }
            if !self.links.is_empty() {
                return Err(
                    "`links` cannot be combined with `nvswitch`: every pair already \
                            talks through the switch"
                        .into(),
                );
            }
        }
        Ok(())
    }

    /// `links`: pairs of existing, distinct GPUs, each once, within the host, NVLink only with its figures.
    fn validate_links(&self) -> std::result::Result<(), String> {
        let n = self.devices.len();
        let mut seen = BTreeMap::new();
        for (i, l) in self.links.iter().enumerate() {
            let [a, b] = l.gpus;
            if a >= n || b >= n {
                return Err(format!(
                    "links[{i}] names GPU {} but there are only {n} devices (0..={})",
                    a.max(b),
                    n - 1
                ));
            }
            if a == b {
                return Err(format!("links[{i}] links GPU {a} to itself"));
            }
            if let Some(first) = seen.insert((a.min(b), a.max(b)), i) {
                return Err(format!(
                    "links[{i}] lists the pair {a}↔{b} again (first at links[{first}])"
                ));
            }
            if l.link.crosses_hosts() {
                return Err(format!(
                    "links[{i}] is NET, which joins GPUs of different hosts; `links` names pairs \
                     within one host"
                ));
            }
            if l.link.is_nvlink() && self.nvlink.is_none() {
                return Err(format!(
                    "links[{i}] is {} but there is no `nvlink` section with the link figures",
                    l.link
                ));
            }
        }
        Ok(())
    }

    /// The PCIe section's figures, classes, generation and lanes.
    fn validate_pcie(&self) -> std::result::Result<(), String> {
        let p = &self.pcie;
        rate("pcie.host_gbps", p.host_gbps)?;
        if let Some(up) = p.switch_uplink_gbps {
            rate("pcie.switch_uplink_gbps", up)?;
        }
        not_negative("pcie.latency_us", p.latency_us)?;
        positive("pcie.load_latency_ns", p.load_latency_ns)?;
        if let Some(ns) = p.resident_load_latency_ns {
            positive("pcie.resident_load_latency_ns", ns)?;
        }
        positive("pcie.signal_us", p.signal_us)?;
        if let Some(share) = p.both_ways_fraction {
            fraction("pcie.both_ways_fraction", share)?;
        }
        for (class, gbps) in &p.p2p_gbps {
            if !class.is_pcie() {
                let kind = if class.is_nvlink() {
                    "an NVLink class"
                } else {
                    "which joins hosts"
                };
                return Err(format!(
                    "pcie.p2p_gbps has `{class}`, {kind}; use PIX, PXB, PHB, NODE or SYS"
                ));
            }
            rate(&format!("pcie.p2p_gbps.{class}"), *gbps)?;
        }
        if let Some(generation) = p.generation.filter(|g| !(1..=6).contains(g)) {
            return Err(format!("pcie.generation must be 1 to 6, not {generation}"));
        }
        if let Some(lanes) = p.lanes.filter(|l| !(1..=32).contains(l)) {
            return Err(format!("pcie.lanes must be 1 to 32, not {lanes}"));
        }
        Ok(())
    }

    /// The host's socket and staging figures, and the issue and setup costs.
    fn validate_host_and_costs(&self) -> std::result::Result<(), String> {
        let h = &self.host;
        rate("host.inter_socket_gbps", h.inter_socket_gbps)?;
        rate("host.staged_gbps", h.staged_gbps)?;
        not_negative("host.staged_latency_us", h.staged_latency_us)?;
        let c = &self.costs;
        for (field, v) in [
            ("copy_issue_us", c.copy_issue_us),
            ("kernel_issue_us", c.kernel_issue_us),
            ("event_issue_us", c.event_issue_us),
            ("graph_issue_us", c.graph_issue_us),
            ("sync_us", c.sync_us),
            ("copy_setup_us", c.copy_setup_us),
            ("kernel_setup_us", c.kernel_setup_us),
            ("graph_node_us", c.graph_node_us),
        ] {
            not_negative(&format!("costs.{field}"), v)?;
        }
        Ok(())
    }

    /// Managed memory's page size and fault cost.
    fn validate_managed(&self) -> std::result::Result<(), String> {
        let m = &self.managed;
        if !(4..=2048).contains(&m.page_kib) {
            return Err(format!(
                "managed.page_kib must be between 4 and 2048 (4 KiB to 2 MiB), not {}",
                m.page_kib
            ));
        }
        not_negative("managed.fault_us", m.fault_us)?;
        Ok(())
    }

    /// Checks `hosts`, `nics`, `nic_links` and `network`.
    fn validate_hosts(&self) -> std::result::Result<(), String> {
        if !(1..=MAX_HOSTS).contains(&self.hosts) {
            return Err(format!(
                "hosts must be 1 to {MAX_HOSTS}, not {}",
                self.hosts
            ));
        }
        if self.hosts > 1 && self.network.is_none() {
            return Err(format!(
                "`hosts` is {} but there is no `network` section saying how their NICs are \
                 connected",
                self.hosts
            ));
        }
        if self.network.is_some() && self.nics.is_empty() {
            return Err("`network` needs `nics`: the RDMA NICs of each host".into());
        }
        for (i, nic) in self.nics.iter().enumerate() {
            numa_node(&format!("nics[{i}].numa_node"), nic.numa_node)?;
        }
        let (gpus, nics) = (self.devices.len(), self.nics.len());
        let mut seen = BTreeMap::new();
        for (i, l) in self.nic_links.iter().enumerate() {
            if l.gpu >= gpus {
                return Err(format!(
                    "nic_links[{i}] names GPU {} but each host has {gpus} (0..={})",
                    l.gpu,
                    gpus - 1
                ));
            }
            if l.nic >= nics {
                return Err(format!(
                    "nic_links[{i}] names NIC {} but each host has {nics}",
                    l.nic
                ));
            }
            if !l.link.is_pcie() {
                return Err(format!(
                    "nic_links[{i}] is {}; a GPU reaches a NIC over PCIe: PIX, PXB, PHB, NODE or \
                     SYS",
                    l.link
                ));
            }
            if let Some(first) = seen.insert((l.gpu, l.nic), i) {
                return Err(format!(
                    "nic_links[{i}] lists GPU {} and NIC {} again (first at nic_links[{first}])",
                    l.gpu, l.nic
                ));
            }
        }
        if let Some(net) = &self.network {
            rate("network.nic_gbps", net.nic_gbps)?;
            fraction("network.efficiency", net.efficiency)?;
            not_negative("network.latency_us", net.latency_us)?;
            not_negative("network.spine_latency_us", net.spine_latency_us)?;
        }
        Ok(())
    }

    /// Refuses a GPU with more NVLinks than [`MOST_NVLINKS_PER_GPU`]: each is a port the simulated
    /// GPU reports, one by one, as NVML does.
    fn check_nvlinks_per_gpu(&self) -> std::result::Result<(), String> {
        let mut links = vec![0u64; self.devices.len()];
        match &self.nvswitch {
            Some(sw) => links.fill(u64::from(sw.links_per_gpu)),
            None => {
                for entry in &self.links {
                    if let Link::NvLink(n) = entry.link {
                        for g in entry.gpus {
                            links[g] += u64::from(n);
                        }
                    }
                }
            }
        }
        match links.iter().position(|&n| n > MOST_NVLINKS_PER_GPU) {
            Some(g) => Err(format!(
                "GPU {g} has {} NVLinks; a GPU has at most {MOST_NVLINKS_PER_GPU} (NVML counts 18 \
                 at most today)",
                links[g]
            )),
            None => Ok(()),
        }
    }

    /// Every GPU of every host.
    pub fn gpu_count(&self) -> usize {
        self.hosts * self.devices.len()
    }

    /// The host GPU `gpu` (a global index) sits on.
    pub fn host_of(&self, gpu: usize) -> usize {
        gpu / self.devices.len()
    }

    /// GPU `gpu` (a global index) as its host numbers it: what `devices`, `links` and `faults`
    /// name it, every host being the one they describe.
    pub fn local(&self, gpu: usize) -> usize {
        gpu % self.devices.len()
    }

    /// What the faults' rules need of this host ([`Wiring`]).
    pub fn wiring(&self) -> Wiring<'_> {
        let bundles = self.links.iter().filter_map(|entry| match entry.link {
            Link::NvLink(count) => Some((entry.gpus, count)),
            _ => None,
        });
        Wiring {
            gpus: self.devices.len(),
            pcie: (self.pcie.generation, self.pcie.lanes),
            switch_links: self.nvswitch.as_ref().map(|s| s.links_per_gpu),
            bundles: bundles.collect(),
            faults: &self.faults,
        }
    }

    /// What the preset says of GPU `gpu` (a global index): its host's entry for it.
    pub fn device(&self, gpu: usize) -> &DeviceSpec {
        &self.devices[self.local(gpu)]
    }

    /// How GPU `gpu` reaches NIC `nic` (global indices; the same host): an explicit entry, or the
    /// path their switches and NUMA nodes imply.
    pub fn nic_link(&self, gpu: usize, nic: usize) -> Link {
        let (g, n) = (self.local(gpu), nic % self.nics.len());
        if let Some(l) = self.nic_links.iter().find(|l| (l.gpu, l.nic) == (g, n)) {
            return l.link;
        }
        let (gpu, nic) = (&self.devices[g], &self.nics[n]);
        if gpu.numa_node != nic.numa_node {
            Link::Sys
        } else if gpu.pcie_switch.is_some() && gpu.pcie_switch == nic.pcie_switch {
            Link::Pix
        } else {
            Link::Node
        }
    }

    /// The NIC GPU `gpu` sends and receives through (the nearest of its host, the first at a
    /// tie), as a global index, and how the GPU reaches it; `None` without NICs.
    pub fn nic_of(&self, gpu: usize) -> Option<(usize, Link)> {
        let first = self.host_of(gpu) * self.nics.len();
        (first..first + self.nics.len())
            .map(|nic| (nic, self.nic_link(gpu, nic)))
            .min_by_key(|&(nic, link)| (link, nic))
    }

    /// How GPUs `a` and `b` (distinct) are linked: an explicit entry, the NVSwitch, or the PCIe path
    /// implied by their switches and NUMA nodes. NVLinks the faults put down do not count, and a
    /// pair left with none talks over PCIe.
    pub fn link(&self, a: usize, b: usize) -> Link {
        if self.host_of(a) != self.host_of(b) {
            return Link::Net;
        }
        let (a, b) = (self.local(a), self.local(b));
        let explicit = self
            .links
            .iter()
            .find(|l| l.gpus == [a, b] || l.gpus == [b, a])
            .map(|l| l.link);
        let nvlink = match (&self.nvswitch, explicit) {
            (Some(sw), _) => Some(Link::NvLink(sw.links_per_gpu)),
            (None, Some(Link::NvLink(n))) => Some(Link::NvLink(n)),
            (None, Some(pcie)) => return pcie,
            (None, None) => None,
        };
        match nvlink {
            Some(link) if self.faults.nvlinks_down.is_empty() => return link,
            Some(_) => match faults::active_links(&self.wiring(), a, b) {
                0 => {}
                active => return Link::NvLink(active),
            },
            None => {}
        }
        let (da, db) = (&self.devices[a], &self.devices[b]);
        if da.numa_node != db.numa_node {
            Link::Sys
        } else if da.pcie_switch.is_some() && da.pcie_switch == db.pcie_switch {
            Link::Pix
        } else {
            Link::Node
        }
    }

    /// Whether the driver offers P2P between `a` and `b` (distinct).
    pub fn p2p(&self, a: usize, b: usize) -> bool {
        if self.device(a).mig_enabled
            || self.device(b).mig_enabled
            || self.faults.p2p_off(self.local(a), self.local(b))
        {
            return false;
        }
        match self.link(a, b) {
            Link::NvLink(_) => true,
            Link::Net => false,
            class => self.pcie.p2p_gbps.contains_key(&class),
        }
    }

    pub fn device_memory_bytes(&self, device: usize) -> u64 {
        self.device(device)
            .memory_mib
            .unwrap_or(self.gpu.memory_mib)
            << 20
    }

    /// The topology this preset describes, every pair of its GPUs listed.
    pub fn topology(&self) -> Topology {
        self.topology_among(None)
    }

    /// The topology this preset describes, listing every GPU and the pairs among those `in_use`
    /// (every pair where `None`): the pairs grow with the square of the GPUs, so a run over a few
    /// GPUs of a large preset holds only theirs. A GPU in `in_use` that the preset lacks is left
    /// out (choosing GPUs refuses it later, with its sentence).
    pub fn topology_among(&self, in_use: Option<&[usize]>) -> Topology {
        let gpus = self.gpus_among(in_use);
        let mut pairs = Vec::with_capacity(gpus.len() * gpus.len().saturating_sub(1));
        for &src in &gpus {
            for &dst in gpus.iter().filter(|&&d| d != src) {
                pairs.push(self.pair(src, dst));
            }
        }
        Topology {
            source: Source::Sim(self.name.clone()),
            driver_version: None,
            cuda_version: None,
            visible_devices: None,
            devices: (0..self.gpu_count())
                .map(|i| self.device_entry(i))
                .collect(),
            pairs,
            network: self.network(),
        }
    }

    /// The GPUs of `in_use` this preset has, in order, once each; all of them where `None`.
    fn gpus_among(&self, in_use: Option<&[usize]>) -> Vec<usize> {
        let n = self.gpu_count();
        let mut gpus: Vec<usize> = match in_use {
            None => (0..n).collect(),
            Some(list) => list.iter().copied().filter(|&g| g < n).collect(),
        };
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }

    /// GPU `index` as the topology lists it.
    fn device_entry(&self, index: usize) -> Device {
        let d = self.device(index);
        Device {
            index,
            name: d.name.clone().unwrap_or_else(|| self.gpu.name.clone()),
            uuid: format!("GPU-sim-{}-{index}", self.name),
            // Every host has its GPUs at the same addresses.
            pci_bus_id: self.bus_id(self.local(index)),
            numa_node: Some(d.numa_node),
            numa_source: "preset".into(),
            cpu_affinity: d.cpu_affinity.clone(),
            memory_bytes: self.device_memory_bytes(index),
            compute_capability: self.gpu.compute_capability.clone(),
            copy_engines: self.gpu.copy_engines,
            mig_enabled: d.mig_enabled,
        }
    }

    /// What the driver would say of the ordered pair `src`, `dst` (distinct).
    fn pair(&self, src: usize, dst: usize) -> Pair {
        let link = self.link(src, dst);
        let p2p = self.p2p(src, dst);
        Pair {
            src,
            dst,
            link,
            p2p,
            perf_rank: if p2p { perf_rank(link) } else { 0 },
            atomics: p2p && link.is_nvlink(),
            array_access: p2p,
        }
    }

    /// The hosts and NICs this preset describes; `None` where it has no NICs.
    fn network(&self) -> Option<Network> {
        if self.nics.is_empty() {
            return None;
        }
        let (per_host, nics_per_host) = (self.devices.len(), self.nics.len());
        let hosts = (0..self.hosts)
            .map(|h| Host {
                index: h,
                name: format!("host{h}"),
                gpus: (h * per_host..(h + 1) * per_host).collect(),
                nics: (h * nics_per_host..(h + 1) * nics_per_host).collect(),
            })
            .collect();
        let nics = (0..self.hosts * nics_per_host)
            .map(|index| {
                let (local, spec) = (index % nics_per_host, &self.nics[index % nics_per_host]);
                Nic {
                    index,
                    host: index / nics_per_host,
                    name: spec.name.clone().unwrap_or_else(|| format!("mlx5_{local}")),
                    pci_bus_id: spec.pci_bus_id.clone(),
                    numa_node: Some(spec.numa_node),
                    netdevs: Vec::new(),
                    link_layer: Some("InfiniBand".into()),
                    rate_gbit: self.network.as_ref().map(|n| n.nic_gbps * 8.0),
                    state: Some("ACTIVE".into()),
                    rail: Some(local),
                }
            })
            .collect();
        let gpu_nics = (0..self.gpu_count())
            .flat_map(|gpu| {
                let first = self.host_of(gpu) * nics_per_host;
                (first..first + nics_per_host).map(move |nic| GpuNic {
                    gpu,
                    nic,
                    link: self.nic_link(gpu, nic),
                })
            })
            .collect();
        let available = self.network.as_ref().is_none_or(|n| n.gpudirect);
        let gpudirect = GpuDirect {
            available: Some(available),
            peermem: None,
            dma_buf: None,
            how: format!(
                "the preset's network says GPUDirect RDMA is {}",
                if available {
                    "available"
                } else {
                    "unavailable"
                }
            ),
        };
        let fabric = self.network.as_ref().map(|n| Fabric {
            kind: n.fabric,
            latency_us: n.latency_us,
            spine_latency_us: n.spine_latency_us,
        });
        Some(Network::new(
            "preset", hosts, nics, gpu_nics, gpudirect, fabric,
        ))
    }
}

/// The most NVLinks a simulated GPU may have: NVML's limit is 18 per GPU (NVML_NVLINK_MAX_LINKS);
/// room for later generations, and a bound on the ports a simulated GPU lists.
pub const MOST_NVLINKS_PER_GPU: u64 = 64;

/// The most copy engines a simulated GPU may have: GPUs report a handful (H100 and H200: 3
/// asynchronous engines; the most physical ones on any NVIDIA GPU are under twenty).
pub const MOST_COPY_ENGINES: u32 = 64;

/// The longest preset name (shown as `sim:<name>` and in every simulated GPU's UUID), PCIe switch
/// name and NIC name, in characters.
pub const NAME_CHARS: usize = 64;

/// The longest GPU name, in characters: NVML's buffer for one holds 96 bytes
/// (NVML_DEVICE_NAME_V2_BUFFER_SIZE).
pub const GPU_NAME_CHARS: usize = 96;

/// The longest description, source line or CPU list, in characters.
pub const NOTE_CHARS: usize = 4096;

/// The most NUMA nodes a host has: Linux allows 1024 at most (CONFIG_NODES_SHIFT 10).
pub const NUMA_NODES: i32 = 1024;

/// The slowest and the fastest rate a preset may give, GB/s: 1 kB/s (anything slower moves no
/// message in a run's lifetime) to 1 PB/s (some five hundred times NVLink 5's 1.8 TB/s per GPU).
pub const RATES_GBPS: (f64, f64) = (1e-6, 1e6);

/// The most memory one GPU may have, MiB: 16 TiB (the largest GPUs have under 300 GB).
pub const MOST_MEMORY_MIB: u64 = 16 << 20;

/// Reads `devices`, refusing more than [`MAX_GPUS`] entries before they are made: a preset of a
/// million GPUs is refused without holding a million of anything.
fn at_most_gpus<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<DeviceSpec>, D::Error> {
    struct AtMost;
    impl<'de> serde::de::Visitor<'de> for AtMost {
        type Value = Vec<DeviceSpec>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a list of at most {MAX_GPUS} GPUs")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut devices = Vec::new();
            while let Some(device) = seq.next_element()? {
                if devices.len() == MAX_GPUS {
                    return Err(serde::de::Error::custom(format!(
                        "`devices` lists more than {MAX_GPUS} GPUs, the most a preset describes"
                    )));
                }
                devices.push(device);
            }
            Ok(devices)
        }
    }
    d.deserialize_seq(AtMost)
}

/// A text field: at most `chars` characters, none of them a control character or a bidirectional
/// override. The message says where, never what (the text would be printed raw).
fn text(field: &str, value: &str, chars: usize) -> std::result::Result<(), String> {
    let length = value.chars().count();
    if length > chars {
        return Err(format!(
            "{field} is {length} characters long; it may have {chars} at most"
        ));
    }
    match value
        .chars()
        .position(|c| c.is_control() || crate::echo::is_unsafe(c))
    {
        None => Ok(()),
        Some(at) => Err(format!(
            "{field} holds a control character or a bidirectional override (U+{:04X}, character \
             {}), which a terminal would obey: take it out",
            value.chars().nth(at).map_or(0, u32::from),
            at + 1
        )),
    }
}

fn optional_text(
    field: &str,
    value: &Option<String>,
    chars: usize,
) -> std::result::Result<(), String> {
    value.as_deref().map_or(Ok(()), |v| text(field, v, chars))
}

/// `major.minor`, each one or two digits.
fn is_compute_capability(text: &str) -> bool {
    let digits = |s: &str| (1..=2).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    text.split_once('.')
        .is_some_and(|(major, minor)| digits(major) && digits(minor))
}

/// A Linux CPU list (`0-47,96-143`): ranges and single CPUs, comma-separated.
fn is_cpu_list(text: &str) -> bool {
    let number = |s: &str| (1..=5).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    text.len() <= NOTE_CHARS
        && text.split(',').all(|part| match part.split_once('-') {
            Some((first, last)) => number(first) && number(last),
            None => number(part),
        })
}

/// A PCI address written `DDDD:BB:DD.F` (a four- or eight-digit hex domain, as the driver and
/// NVML write it), device 00 to 1F, function 0 to 7.
fn strict_bus_id(text: &str) -> Option<PciAddress> {
    let hex = |s: &str, lengths: &[usize]| {
        lengths.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let mut parts = text.split(':');
    let (domain, bus, rest) = (parts.next()?, parts.next()?, parts.next()?);
    let (device, function) = rest.split_once('.')?;
    let formed = parts.next().is_none()
        && hex(domain, &[4, 8])
        && hex(bus, &[2])
        && hex(device, &[2])
        && u8::from_str_radix(device, 16).is_ok_and(|d| d <= 0x1F)
        && matches!(function, "0" | "1" | "2" | "3" | "4" | "5" | "6" | "7");
    formed.then(|| PciAddress::parse(text)).flatten()
}

fn numa_node(field: &str, node: i32) -> std::result::Result<(), String> {
    match node {
        n if n < 0 => Err(format!("{field} is negative")),
        n if n >= NUMA_NODES => Err(format!(
            "{field} is {n}; Linux numbers NUMA nodes 0 to {}",
            NUMA_NODES - 1
        )),
        _ => Ok(()),
    }
}

/// A GPU's memory: 1 MiB to [`MOST_MEMORY_MIB`].
fn memory(field: &str, mib: u64) -> std::result::Result<(), String> {
    match (1..=MOST_MEMORY_MIB).contains(&mib) {
        true => Ok(()),
        false => Err(format!(
            "{field} must be 1 to {MOST_MEMORY_MIB} MiB (16 TiB), not {mib}"
        )),
    }
}

/// A rate in GB/s: finite, within [`RATES_GBPS`].
fn rate(field: &str, gbps: f64) -> std::result::Result<(), String> {
    let (slowest, fastest) = RATES_GBPS;
    match gbps.is_finite() && (slowest..=fastest).contains(&gbps) {
        true => Ok(()),
        false => Err(format!(
            "{field} must be a rate from {slowest:e} to {fastest:e} GB/s (1 kB/s to 1 PB/s), not {}",
            shown_figure(gbps)
        )),
    }
}

/// Lower is better, as CUDA's performance rank: NVLink first, then PCIe by distance.
fn perf_rank(link: Link) -> i32 {
    match link {
        Link::NvLink(_) => 1,
        Link::Pix => 2,
        Link::Pxb => 3,
        Link::Phb => 4,
        Link::Node => 5,
        Link::Sys => 6,
        Link::Net => 0,
    }
}

// Every figure of a preset stays below `LARGEST_FIGURE` (1e12: eleven days in µs, a million TiB in
// MiB), so that none overflows the clocks or a byte count computed from it; a positive one stays at
// or above its inverse, so that no time divided by it (a rate of 5e-324 GB/s) becomes infinite.
fn positive(field: &str, v: f64) -> std::result::Result<(), String> {
    let smallest = 1.0 / LARGEST_FIGURE;
    if v.is_finite() && v >= smallest && v < LARGEST_FIGURE {
        Ok(())
    } else {
        Err(format!(
            "{field} must be a positive number from {smallest:e} to below {LARGEST_FIGURE:e}, not {}",
            shown_figure(v)
        ))
    }
}

fn not_negative(field: &str, v: f64) -> std::result::Result<(), String> {
    if v.is_finite() && (0.0..LARGEST_FIGURE).contains(&v) {
        Ok(())
    } else {
        Err(format!(
            "{field} must be zero or more, and below {LARGEST_FIGURE:e}, not {}",
            shown_figure(v)
        ))
    }
}

fn fraction(field: &str, v: f64) -> std::result::Result<(), String> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(format!("{field} must be in (0, 1], not {v}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100_text() -> &'static str {
        EMBEDDED[0].1
    }

    /// The dgx-h100 preset with one edit made to its JSON value.
    fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Preset> {
        let mut value: serde_json::Value = serde_json::from_str(h100_text()).unwrap();
        edit(&mut value);
        Preset::parse(&value.to_string(), "test.json")
    }

    fn message(r: Result<Preset>) -> String {
        let err = r.unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        assert!(matches!(err, Error::Preset { .. }), "{err:?}");
        err.to_string()
    }

    #[test]
    fn gpu_count_is_capped_while_reading_and_across_hosts() {
        let gpus = |n: usize| serde_json::json!(vec![serde_json::json!({"numa_node": 0}); n]);
        let m = message(edited(|v| v["devices"] = gpus(MAX_GPUS + 1)));
        assert!(m.contains("more than 1024 GPUs"), "{m}");
        let m = message(edited(|v| v["hosts"] = 129.into()));
        assert!(
            m.contains("1032 GPUs; a preset describes at most 1024"),
            "{m}"
        );
        let most = edited(|v| v["devices"] = gpus(MAX_GPUS)).unwrap();
        let topology = most.topology();
        assert_eq!(topology.devices.len(), MAX_GPUS);
        // Past bus FF the default ids go on in the next domain, each once.
        assert_eq!(topology.devices[255].pci_bus_id, "0001:00:00.0");
        assert_eq!(topology.devices[1023].pci_bus_id, "0004:00:00.0");
    }

    #[test]
    fn every_field_has_its_form_and_range() {
        let refused = [
            (
                json_edit(|v| v["gpu"]["copy_engines"] = 1_000_000_000.into()),
                "gpu.copy_engines is 1000000000",
            ),
            (
                json_edit(|v| v["devices"][0]["pci_bus_id"] = "zzzz".into()),
                "devices[0].pci_bus_id is not a PCI bus id",
            ),
            (
                json_edit(|v| v["devices"][0]["pci_bus_id"] = "0000:18:20.0".into()),
                "device up to 1F",
            ),
            (
                json_edit(|v| v["devices"][1]["pci_bus_id"] = "0000:1b:00.0".into()),
                "the address of devices[0] as well",
            ),
            (
                json_edit(|v| v["name"] = "x".repeat(1 << 20).into()),
                "name is 1048576 characters long",
            ),
            (
                json_edit(|v| v["name"] = "\u{1b}[2Jx".into()),
                "name holds a control character",
            ),
            (
                json_edit(|v| v["gpu"]["name"] = "H100\u{202e}".into()),
                "U+202E",
            ),
            (
                json_edit(|v| v["devices"][2]["name"] = "a\nb".into()),
                "devices[2].name holds",
            ),
            (
                json_edit(|v| v["gpu"]["compute_capability"] = "nine".into()),
                "major.minor",
            ),
            (
                json_edit(|v| v["devices"][0]["cpu_affinity"] = "all".into()),
                "not a list of CPUs",
            ),
            (
                json_edit(|v| v["devices"][0]["numa_node"] = 5000.into()),
                "NUMA nodes 0 to 1023",
            ),
            (
                json_edit(|v| v["nvlink"]["link_gbps"] = 1e-300.into()),
                "1 kB/s to 1 PB/s",
            ),
            (
                json_edit(|v| v["pcie"]["host_gbps"] = 1e9.into()),
                "pcie.host_gbps must be a rate",
            ),
            (
                json_edit(|v| v["gpu"]["memory_mib"] = (1u64 << 40).into()),
                "16 TiB",
            ),
        ];
        for (edit, says) in refused {
            let m = message(edited(edit));
            assert!(m.contains(says), "{says}: {m}");
            assert!(!m.contains('\u{1b}') && !m.contains('\u{202e}'), "{m:?}");
        }
        let fine = edited(|v| {
            v["devices"][0]["pci_bus_id"] = "00000000:1B:00.0".into();
            v["devices"][0]["cpu_affinity"] = "0-55,112-167".into();
            v["gpu"]["name"] = "NVIDIA H100 80GB HBM3 — Zürich".into();
        });
        assert!(fine.is_ok(), "{fine:?}");
    }

    fn json_edit(edit: fn(&mut serde_json::Value)) -> fn(&mut serde_json::Value) {
        edit
    }

    /// A small mesh preset: `links` entries as (a, b, "NV1") over 4 GPUs without a switch.
    fn mesh(links: &[(usize, usize, &str)]) -> Result<Preset> {
        edited(|v| {
            v["nvswitch"] = serde_json::Value::Null;
            v.as_object_mut().unwrap().remove("nvswitch");
            v["devices"] = serde_json::json!([
                {"numa_node": 0}, {"numa_node": 0}, {"numa_node": 1}, {"numa_node": 1}
            ]);
            v["links"] = links
                .iter()
                .map(|(a, b, l)| serde_json::json!({"gpus": [a, b], "link": l}))
                .collect();
        })
    }

    #[test]
    fn every_embedded_preset_loads_with_its_own_name_and_cites_sources() {
        assert_eq!(
            preset_names(),
            [
                "dgx-h100",
                "dgx1-v100",
                "pcie-4gpu-2socket",
                "pcie-2gpu-switch",
                "h200-pair",
                "2x-dgx-h100",
                "2x-pcie-4gpu-2socket"
            ]
        );
        for name in preset_names() {
            let p = Preset::load(name).unwrap();
            assert_eq!(&p.name, name);
            assert!(p.sources.len() >= 3, "{name} cites too little");
            assert!(p.description.contains("SIMULATED"), "{name}");
            let t = p.topology();
            assert_eq!(t.source.to_string(), format!("sim:{name}"));
            let n = t.devices.len();
            assert_eq!(t.pairs.len(), n * (n - 1));
            assert!(t
                .pairs
                .windows(2)
                .all(|w| (w[0].src, w[0].dst) < (w[1].src, w[1].dst)));
        }
    }

    #[test]
    fn dgx_h100_is_nv18_everywhere_with_two_numa_nodes() {
        let t = Preset::load("dgx-h100").unwrap().topology();
        assert!(t
            .pairs
            .iter()
            .all(|p| p.link == Link::NvLink(18) && p.p2p && p.atomics && p.perf_rank == 1));
        let numa: Vec<_> = t.devices.iter().map(|d| d.numa_node.unwrap()).collect();
        assert_eq!(numa, [0, 0, 0, 0, 1, 1, 1, 1]);
        assert_eq!(t.devices[0].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(t.devices[0].numa_source, "preset");
        assert_eq!(t.devices[0].memory_bytes, 81559 << 20);
    }

    #[test]
    fn dgx1_v100_topology_is_the_published_matrix() {
        // docs/reference.md, the commonly published `nvidia-smi topo -m` of a DGX-1.
        const MATRIX: &str = "
            X   NV1  NV1  NV2  NV2  SYS  SYS  SYS
           NV1   X   NV2  NV1  SYS  NV2  SYS  SYS
           NV1  NV2   X   NV2  SYS  SYS  NV1  SYS
           NV2  NV1  NV2   X   SYS  SYS  SYS  NV1
           NV2  SYS  SYS  SYS   X   NV1  NV1  NV2
           SYS  NV2  SYS  SYS  NV1   X   NV2  NV1
           SYS  SYS  NV1  SYS  NV1  NV2   X   NV2
           SYS  SYS  SYS  NV1  NV2  NV1  NV2   X";
        let t = Preset::load("dgx1-v100").unwrap().topology();
        for (src, row) in MATRIX.trim().lines().enumerate() {
            for (dst, cell) in row.split_whitespace().enumerate() {
                let Some(pair) = t.pair(src, dst) else {
                    assert_eq!(cell, "X");
                    continue;
                };
                assert_eq!(pair.link.to_string(), cell, "GPU{src}->GPU{dst}");
                assert_eq!(pair.p2p, cell != "SYS", "GPU{src}->GPU{dst}");
                assert_eq!(pair.atomics, cell != "SYS");
                assert_eq!(pair.perf_rank == 0, cell == "SYS");
            }
        }
    }

    #[test]
    fn pcie_4gpu_2socket_has_p2p_inside_a_switch_and_none_across_sockets() {
        let t = Preset::load("pcie-4gpu-2socket").unwrap().topology();
        for p in &t.pairs {
            let same_socket = (p.src < 2) == (p.dst < 2);
            if same_socket {
                assert_eq!(
                    (p.link, p.p2p, p.atomics),
                    (Link::Pix, true, false),
                    "{p:?}"
                );
            } else {
                assert_eq!((p.link, p.p2p, p.perf_rank), (Link::Sys, false, 0), "{p:?}");
            }
        }
        let two = Preset::load("pcie-2gpu-switch").unwrap().topology();
        assert_eq!(two.pair(0, 1).unwrap().link, Link::Pix);
        assert!(two.pair(1, 0).unwrap().p2p);
    }

    #[test]
    fn h200_pair_is_two_gpus_over_nv18_without_a_switch() {
        let p = Preset::load("h200-pair").unwrap();
        assert!(p.nvswitch.is_none(), "the two GPUs own their 18 links");
        let t = p.topology();
        assert_eq!(t.devices.len(), 2);
        for pair in &t.pairs {
            assert_eq!((pair.link, pair.p2p), (Link::NvLink(18), true), "{pair:?}");
        }
        assert_eq!(t.devices[1].copy_engines, 3);
        // 18 links at the measured copy-engine rate (396.4 GB/s at 512 MiB).
        let nv = p.nvlink.unwrap();
        assert!((18.0 * nv.link_gbps * nv.efficiency - 396.4).abs() < 0.5);
    }

    #[test]
    fn a_mesh_preset_without_switch_or_link_falls_back_to_pcie_classes() {
        let p = mesh(&[(0, 1, "NV2")]).unwrap();
        assert_eq!(p.link(1, 0), Link::NvLink(2));
        assert_eq!(p.link(2, 3), Link::Node);
        assert_eq!(p.link(0, 2), Link::Sys);
        assert!(!p.p2p(2, 3), "dgx-h100 lists no PCIe P2P class");
    }

    #[test]
    fn a_topology_among_some_gpus_lists_every_gpu_and_their_pairs_alone() {
        let p = Preset::load("2x-dgx-h100").unwrap();
        let whole = p.topology();
        // In any order, repeated, or past the host's GPUs: the pairs of those it has.
        let some = p.topology_among(Some(&[9, 2, 9, 99]));
        assert_eq!(some.devices, whole.devices);
        assert_eq!(some.network, whole.network);
        assert_eq!(some.pairs, whole.restricted_to(&[2, 9]).pairs);
        assert_eq!(p.topology_among(None), whole);
    }

    #[test]
    fn two_dgx_h100_hosts_number_their_gpus_and_nics_host_by_host() {
        let p = Preset::load("2x-dgx-h100").unwrap();
        assert_eq!((p.hosts, p.gpu_count()), (2, 16));
        let t = p.topology();
        assert_eq!(t.devices.len(), 16);
        assert_eq!(t.pairs.len(), 16 * 15);
        // NV18 within a host, NET between hosts, never P2P across.
        assert_eq!(t.pair(0, 7).unwrap().link, Link::NvLink(18));
        assert_eq!(t.pair(8, 15).unwrap().link, Link::NvLink(18));
        let across = t.pair(3, 12).unwrap();
        assert_eq!(
            (across.link, across.p2p, across.perf_rank),
            (Link::Net, false, 0)
        );
        // Every host has its GPUs at the same addresses.
        assert_eq!(t.devices[8].pci_bus_id, t.devices[0].pci_bus_id);
        assert_eq!(t.devices[12].numa_node, Some(1));
        let net = t.network.as_ref().unwrap();
        assert_eq!(net.source, "preset");
        assert_eq!(net.hosts[1].gpus, (8..16).collect::<Vec<_>>());
        assert_eq!(net.hosts[1].nics, (8..16).collect::<Vec<_>>());
        assert_eq!(net.nics.len(), 16);
        assert_eq!(net.nics[9].name, "mlx5_1");
        assert_eq!(net.nics[9].rail, Some(1));
        assert_eq!(net.nics[9].rate_gbit, Some(400.0));
        // One NIC per GPU under its switch: PIX; the others of its socket NODE, of the other SYS.
        for gpu in 0..16 {
            let nearest = net.nearest(gpu).unwrap();
            assert_eq!(nearest.nics, vec![gpu], "GPU {gpu}");
            assert_eq!(nearest.link, Link::Pix);
            assert!(nearest.gpudirect_benefit);
        }
        let link = |gpu, nic| {
            net.gpu_nics
                .iter()
                .find(|g| (g.gpu, g.nic) == (gpu, nic))
                .unwrap()
                .link
        };
        assert_eq!(link(9, 10), Link::Node);
        assert_eq!(link(9, 14), Link::Sys);
        assert!(!net
            .gpu_nics
            .iter()
            .any(|g| t.host_of(g.gpu) != net.nics[g.nic].host));
        assert_eq!(net.gpudirect.available, Some(true));
        let fabric = net.fabric.as_ref().unwrap();
        assert_eq!(fabric.kind, crate::topology::network::FabricKind::Rail);
    }

    #[test]
    fn a_gpu_on_the_other_socket_than_the_only_nic_is_sys_to_it() {
        let t = Preset::load("2x-pcie-4gpu-2socket").unwrap().topology();
        let net = t.network.unwrap();
        let far = net.nearest(6).unwrap();
        assert_eq!((far.nics.as_slice(), far.link), (&[1][..], Link::Sys));
        assert!(!far.gpudirect_benefit);
        assert_eq!(net.nearest(5).unwrap().link, Link::Pix);
    }

    #[test]
    fn nic_links_override_what_the_switches_imply() {
        let p = edited(|v| {
            v["nics"] = serde_json::json!([{"numa_node": 0}, {"numa_node": 1}]);
            v["nic_links"] = serde_json::json!([{"gpu": 1, "nic": 0, "link": "PXB"}]);
        })
        .unwrap();
        assert_eq!(p.nic_link(1, 0), Link::Pxb);
        assert_eq!(p.nic_link(0, 0), Link::Node);
        assert_eq!(p.nic_link(0, 1), Link::Sys);
        assert_eq!(p.nic_of(1), Some((0, Link::Pxb)));
        // One host with NICs and no network: NICs shown, nothing between hosts.
        let net = p.topology().network.unwrap();
        assert_eq!(net.hosts.len(), 1);
        assert!(net.fabric.is_none());
        assert_eq!(net.nics[1].rate_gbit, None);
    }

    #[test]
    fn hosts_nics_and_networks_that_cannot_be_are_refused() {
        let network = serde_json::json!({
            "fabric": "fat-tree", "nic_gbps": 25, "efficiency": 0.9, "latency_us": 2
        });
        let nics = serde_json::json!([{"numa_node": 0}]);
        let m = message(edited(|v| v["hosts"] = 2.into()));
        assert!(m.contains("no `network` section"), "{m}");
        let m = message(edited(|v| v["network"] = network.clone()));
        assert!(m.contains("`network` needs `nics`"), "{m}");
        let m = message(edited(|v| v["hosts"] = 0.into()));
        assert!(m.contains("hosts must be 1 to 1024, not 0"), "{m}");
        let m = message(edited(|v| {
            v["nics"] = nics.clone();
            v["nic_links"] = serde_json::json!([{"gpu": 8, "nic": 0, "link": "PIX"}]);
        }));
        assert!(
            m.contains("nic_links[0] names GPU 8 but each host has 8"),
            "{m}"
        );
        let m = message(edited(|v| {
            v["nics"] = nics.clone();
            v["nic_links"] = serde_json::json!([{"gpu": 0, "nic": 0, "link": "NV2"}]);
        }));
        assert!(m.contains("over PCIe"), "{m}");
        let m = message(edited(|v| {
            v["nics"] = nics.clone();
            v["network"] = network.clone();
            v["network"]["efficiency"] = 2.into();
        }));
        assert!(m.contains("network.efficiency must be in (0, 1]"), "{m}");
        let m = message(edited(|v| {
            v["pcie"]["p2p_gbps"] = serde_json::json!({"NET": 5})
        }));
        assert!(m.contains("which joins hosts"), "{m}");
        let m = message(mesh(&[(0, 1, "NET")]));
        assert!(m.contains("links[0] is NET"), "{m}");
        let m = message(edited(|v| {
            v["nics"] = nics.clone();
            v["network"] = network.clone();
            v["network"]["fabric"] = "torus".into();
        }));
        assert!(m.contains("unknown variant `torus`"), "{m}");
    }

    #[test]
    fn invalid_json_reports_line_and_column() {
        let text = "{\n  \"name\": \"x\",\n  oops\n}";
        let m = message(Preset::parse(text, "mine.json"));
        assert!(m.contains("mine.json"), "{m}");
        assert!(m.contains("line 3 column 3"), "{m}");
    }

    #[test]
    fn unknown_and_missing_fields_are_named() {
        let m = message(edited(|v| v["gpu"]["bandwidth"] = 1.into()));
        assert!(m.contains("unknown field `bandwidth`"), "{m}");
        let m = message(edited(|v| {
            v["costs"].as_object_mut().unwrap().remove("sync_us");
        }));
        assert!(m.contains("missing field `sync_us`"), "{m}");
    }

    #[test]
    fn a_link_to_a_device_that_does_not_exist_is_refused() {
        let m = message(mesh(&[(0, 7, "NV1")]));
        assert!(
            m.contains("links[0] names GPU 7 but there are only 4 devices"),
            "{m}"
        );
    }

    #[test]
    fn self_links_and_pairs_listed_twice_are_refused() {
        let m = message(mesh(&[(2, 2, "NV1")]));
        assert!(m.contains("links GPU 2 to itself"), "{m}");
        let m = message(mesh(&[(0, 1, "NV1"), (1, 0, "NV2")]));
        assert!(
            m.contains("lists the pair 1↔0 again (first at links[0])"),
            "{m}"
        );
    }

    #[test]
    fn zero_negative_and_out_of_range_figures_are_refused() {
        let m = message(edited(|v| v["pcie"]["host_gbps"] = 0.0.into()));
        assert!(m.contains("pcie.host_gbps must be a rate"), "{m}");
        let m = message(edited(|v| v["nvlink"]["link_gbps"] = (-25.0).into()));
        assert!(
            m.contains(
                "nvlink.link_gbps must be a rate from 1e-6 to 1e6 GB/s (1 kB/s to 1 PB/s), not -25"
            ),
            "{m}"
        );
        let m = message(edited(|v| v["gpu"]["load_latency_ns"] = 0.0.into()));
        assert!(
            m.contains("gpu.load_latency_ns must be a positive number from 1e-12 to below 1e12"),
            "{m}"
        );
        let m = message(edited(|v| v["nvlink"]["efficiency"] = 1.5.into()));
        assert!(m.contains("nvlink.efficiency must be in (0, 1]"), "{m}");
        let m = message(edited(|v| v["costs"]["sync_us"] = (-1.0).into()));
        assert!(m.contains("costs.sync_us must be zero or more"), "{m}");
        let m = message(edited(|v| v["costs"]["copy_issue_us"] = 1e308.into()));
        assert!(
            m.contains("costs.copy_issue_us must be zero or more, and below 1e12, not 1e308"),
            "{m}"
        );
        let m = message(edited(|v| {
            v["pcie"]["p2p_gbps"] = serde_json::json!({"PIX": 0})
        }));
        assert!(m.contains("pcie.p2p_gbps.PIX must be a rate"), "{m}");
        let m = message(edited(|v| {
            v["pcie"]["p2p_gbps"] = serde_json::json!({"NV2": 5})
        }));
        assert!(m.contains("an NVLink class"), "{m}");
        let m = message(edited(|v| v["devices"] = serde_json::json!([])));
        assert!(m.contains("`devices` is empty"), "{m}");
    }

    #[test]
    fn a_gpu_with_more_nvlinks_than_any_has_is_refused() {
        let m = message(edited(|v| {
            v["nvswitch"]["links_per_gpu"] = 4_000_000_000u32.into()
        }));
        assert!(
            m.contains("GPU 0 has 4000000000 NVLinks; a GPU has at most 64"),
            "{m}"
        );
        let m = message(mesh(&[(0, 1, "NV40"), (1, 2, "NV40")]));
        assert!(m.contains("GPU 1 has 80 NVLinks"), "{m}");
        assert!(mesh(&[(0, 1, "NV32"), (1, 2, "NV32")]).is_ok());
    }

    #[test]
    fn nvlink_pairs_need_nvlink_figures_and_a_switch_excludes_links() {
        let m = message(mesh(&[(0, 1, "NV1")]).and_then(|p| {
            let mut v = serde_json::to_value(p).unwrap();
            v.as_object_mut().unwrap().remove("nvlink");
            Preset::parse(&v.to_string(), "t")
        }));
        assert!(m.contains("no `nvlink` section"), "{m}");
        let m = message(edited(|v| {
            v["links"] = serde_json::json!([{"gpus": [0, 1], "link": "NV2"}]);
        }));
        assert!(m.contains("cannot be combined with `nvswitch`"), "{m}");
        let m = message(edited(|v| {
            v["links"] = serde_json::json!([{"gpus": [0, 1], "link": "QPI"}])
        }));
        assert!(m.contains("unknown link `QPI`"), "{m}");
    }

    #[test]
    fn unknown_preset_names_the_known_ones_and_missing_file_says_so() {
        let m = message(Preset::load("dgx-b200"));
        for name in preset_names() {
            assert!(m.contains(name), "{m}");
        }
        let m = message(Preset::load("/nonexistent/dir/my.json"));
        assert!(
            m.contains("/nonexistent/dir/my.json: it does not exist"),
            "{m}"
        );
    }

    #[test]
    fn the_documented_example_parses_and_links_as_described() {
        let doc = include_str!("../../../docs/sim-format.md");
        let start = doc.find("```json\n").expect("the doc has a JSON example") + 8;
        let end = start + doc[start..].find("```").unwrap();
        let p = Preset::parse(&doc[start..end], "docs/sim-format.md").unwrap();
        let t = p.topology();
        assert_eq!(t.pair(0, 1).unwrap().link, Link::NvLink(2));
        assert!(t.pair(1, 0).unwrap().p2p);
        assert_eq!(t.pair(0, 2).unwrap().link, Link::Sys);
        assert!(!t.pair(2, 1).unwrap().p2p);
        assert_eq!(t.devices[2].pci_bus_id, "0000:81:00.0");
        assert_eq!(t.devices[1].pci_bus_id, "0000:02:00.0");
    }

    #[test]
    fn a_preset_file_round_trips_through_serde() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host");
        let original = Preset::load("dgx1-v100").unwrap();
        std::fs::write(&path, serde_json::to_string_pretty(&original).unwrap()).unwrap();
        // An existing file is read even without a .json suffix.
        let back = Preset::load(path.to_str().unwrap()).unwrap();
        assert_eq!(back, original);
    }
}
