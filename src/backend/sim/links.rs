//! The link model: the shared resources of a simulated host and the paths transfers take through
//! them.
//!
//! A resource is anything with a rate that concurrent transfers share: a GPU's NVLink port in each
//! direction, a point-to-point NVLink bundle in each direction, a GPU's PCIe link up and down, a PCIe
//! switch's uplink, the CPU sockets' interconnect, a GPU's memory for local copies. A [`Path`] lists
//! the resources one transfer crosses, plus a cap of its own (an SM copy's efficiency, a PCIe path
//! class's P2P rate) and the latency it adds to the operation.

use super::faults;
use super::preset::Preset;
use crate::topology::network::FabricKind;
use crate::topology::Link;
use std::collections::BTreeMap;

pub(super) type ResourceId = usize;

/// GB/s (1e9 bytes per second) to bytes per microsecond.
pub(super) fn bytes_per_us(gbps: f64) -> f64 {
    gbps * 1e3
}

/// Where bytes live, as the link model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    Device(usize),
    /// Pinned host memory on this NUMA node; `None` means near whichever GPU touches it.
    Host(Option<i32>),
}

/// Where the chain of a dependent load (a pointer chase) is served from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chain {
    /// Its memory: nothing of it in the caches (the flushed pointer chase; a flag's round trip).
    InMemory,
    /// The caches, which hold it since it was last walked (pointer-chase-resident).
    Cached,
}

/// The resources a transfer crosses, its own rate cap and the latency it adds.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Path {
    pub resources: Vec<ResourceId>,
    /// Bytes per µs; infinite when only the resources limit the transfer.
    pub cap: f64,
    pub latency_us: f64,
    /// Where the transfer slows while other traffic runs beside it (each that applies multiplies
    /// its rate by its fraction).
    pub beside: Vec<Beside>,
}

/// A transfer that keeps only `fraction` of its narrowest resource's rate while another flow
/// crosses one of `busy`: a GPU's copy into host memory while the GPU sends over NVLink, or a
/// copy over a GPU's PCIe link while the link carries one the other way.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Beside {
    pub busy: Vec<ResourceId>,
    pub fraction: f64,
}

impl Path {
    fn new(resources: Vec<ResourceId>, cap: f64, latency_us: f64) -> Path {
        Path {
            resources,
            cap,
            latency_us,
            beside: Vec::new(),
        }
    }

    /// Widens this path to also cover `other`: every resource of both, the lower cap, the longer
    /// latency (a batch whose messages take different paths, as one flow).
    pub fn join(&mut self, other: Path) {
        for r in other.resources {
            if !self.resources.contains(&r) {
                self.resources.push(r);
            }
        }
        self.cap = self.cap.min(other.cap);
        self.latency_us = self.latency_us.max(other.latency_us);
        for b in other.beside {
            if !self.beside.contains(&b) {
                self.beside.push(b);
            }
        }
    }

    /// This path followed by `next` (a transfer that crosses both, as an SM kernel's loads then
    /// stores).
    fn then(mut self, next: Path) -> Path {
        self.resources.extend(next.resources);
        self.cap = self.cap.min(next.cap);
        self.latency_us += next.latency_us;
        self.beside.extend(next.beside);
        self
    }
}

/// How NVLink connects the GPUs.
enum NvLinks {
    None,
    /// Every GPU has one port into a switch, shared by all its peers: (egress, ingress) per GPU.
    Switch(Vec<(ResourceId, ResourceId)>),
    /// Direct bundles, one resource per direction of each linked pair.
    Bundles(BTreeMap<(usize, usize), ResourceId>),
}

/// Every ordered pair of GPUs an NVLink bundle joins, with its links that are up: only pairs
/// `links` names have one (without a switch), so these are found from its entries on each host, not
/// from every pair of GPUs (a million on 1024).
fn bundled_pairs(preset: &Preset) -> BTreeMap<(usize, usize), u32> {
    let per_host = preset.devices.len();
    let mut bundles = BTreeMap::new();
    for first in (0..preset.hosts).map(|host| host * per_host) {
        for entry in &preset.links {
            let [a, b] = entry.gpus.map(|local| first + local);
            for (src, dst) in [(a, b), (b, a)] {
                if let Link::NvLink(count) = preset.link(src, dst) {
                    bundles.insert((src, dst), count);
                }
            }
        }
    }
    bundles
}

pub(super) struct LinkModel {
    capacity: Vec<f64>,
    memory: Vec<ResourceId>,
    pcie_up: Vec<ResourceId>,
    pcie_down: Vec<ResourceId>,
    /// Each GPU's switch uplink (towards the CPU, towards the GPUs), if it sits under a switch.
    switch: Vec<Option<(ResourceId, ResourceId)>>,
    nvlink: NvLinks,
    /// The sockets' interconnect, per host and ordered pair of NUMA nodes.
    sockets: BTreeMap<(usize, i32, i32), ResourceId>,
    numa: Vec<i32>,
    /// Each NIC's port, sending and receiving, by global NIC index.
    nics: Vec<(ResourceId, ResourceId)>,
    preset: Preset,
}

impl LinkModel {
    pub fn new(preset: &Preset) -> LinkModel {
        let n = preset.gpu_count();
        let mut capacity = Vec::new();
        let mut add = |gbps: f64| {
            capacity.push(bytes_per_us(gbps));
            capacity.len() - 1
        };
        let memory = (0..n).map(|_| add(preset.gpu.local_copy_gbps)).collect();
        // A link the faults trained below its maximum moves its share of the full rate.
        let host_gbps = |g: usize| {
            preset.pcie.host_gbps * faults::pcie_share(&preset.wiring(), preset.local(g))
        };
        let pcie_up = (0..n).map(|g| add(host_gbps(g))).collect();
        let pcie_down = (0..n).map(|g| add(host_gbps(g))).collect();
        let uplink = preset
            .pcie
            .switch_uplink_gbps
            .unwrap_or(preset.pcie.host_gbps);
        // A switch of one host is not the switch of the same name on another.
        let mut switches: BTreeMap<(usize, &str), (ResourceId, ResourceId)> = BTreeMap::new();
        let switch = (0..n)
            .map(|gpu| {
                preset.device(gpu).pcie_switch.as_deref().map(|name| {
                    *switches
                        .entry((preset.host_of(gpu), name))
                        .or_insert_with(|| (add(uplink), add(uplink)))
                })
            })
            .collect();
        let nvlink = match (&preset.nvlink, &preset.nvswitch) {
            (Some(nv), Some(_)) => {
                // Each GPU's port is as wide as its links that are up.
                let port = |g: usize| {
                    let up = faults::ports(&preset.wiring(), preset.local(g))
                        .iter()
                        .filter(|p| p.active)
                        .count();
                    up as f64 * nv.link_gbps * nv.efficiency
                };
                NvLinks::Switch((0..n).map(|g| (add(port(g)), add(port(g)))).collect())
            }
            (Some(nv), None) => {
                // Made in the order of the pairs, as every resource is numbered so.
                let bundles = bundled_pairs(preset)
                    .into_iter()
                    .map(|(pair, count)| (pair, add(count as f64 * nv.link_gbps * nv.efficiency)))
                    .collect();
                NvLinks::Bundles(bundles)
            }
            _ => NvLinks::None,
        };
        let numa: Vec<i32> = (0..n).map(|gpu| preset.device(gpu).numa_node).collect();
        let mut nodes = numa.clone();
        nodes.sort_unstable();
        nodes.dedup();
        let mut sockets = BTreeMap::new();
        for host in 0..preset.hosts {
            for &from in &nodes {
                for &to in nodes.iter().filter(|&&to| to != from) {
                    sockets.insert((host, from, to), add(preset.host.inter_socket_gbps));
                }
            }
        }
        let nic_rate = preset
            .network
            .as_ref()
            .map_or(0.0, |net| net.nic_gbps * net.efficiency);
        let nics = (0..preset.hosts * preset.nics.len())
            .map(|_| (add(nic_rate), add(nic_rate)))
            .collect();
        LinkModel {
            capacity,
            memory,
            pcie_up,
            pcie_down,
            switch,
            nvlink,
            sockets,
            numa,
            nics,
            preset: preset.clone(),
        }
    }

    /// Capacity of every resource, bytes per µs, indexed by [`ResourceId`].
    pub fn capacity(&self) -> &[f64] {
        &self.capacity
    }

    pub fn preset(&self) -> &Preset {
        &self.preset
    }

    pub fn numa_nodes(&self) -> Vec<i32> {
        let mut nodes = self.numa.clone();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// How distinct GPUs `a` and `b` are linked.
    pub fn link(&self, a: usize, b: usize) -> Link {
        self.preset.link(a, b)
    }

    /// The resources of GPU `gpu`'s NVLinks: its switch port both ways, or every bundle it is an
    /// end of.
    pub fn nvlink_resources(&self, gpu: usize) -> Vec<ResourceId> {
        match &self.nvlink {
            NvLinks::None => Vec::new(),
            NvLinks::Switch(ports) => vec![ports[gpu].0, ports[gpu].1],
            NvLinks::Bundles(bundles) => bundles
                .iter()
                .filter(|((a, b), _)| *a == gpu || *b == gpu)
                .map(|(_, &r)| r)
                .collect(),
        }
    }

    /// Every resource traffic through GPU `gpu` crosses: its memory, its PCIe link both ways and
    /// its NVLinks.
    pub fn gpu_resources(&self, gpu: usize) -> Vec<ResourceId> {
        let mut resources = vec![self.memory[gpu], self.pcie_up[gpu], self.pcie_down[gpu]];
        resources.extend(self.nvlink_resources(gpu));
        resources
    }

    /// A copy inside one GPU's memory.
    pub fn local(&self, gpu: usize) -> Path {
        Path::new(vec![self.memory[gpu]], f64::INFINITY, 0.0)
    }

    /// The interconnect of `gpu`'s host from NUMA node `from` to `to`, where they differ.
    fn socket(&self, gpu: usize, from: i32, to: i32) -> Option<ResourceId> {
        let host = self.preset.host_of(gpu);
        self.sockets.get(&(host, from, to)).copied()
    }

    /// From `gpu` up to pinned host memory on `node` (`None`: the GPU's own node).
    fn host_up(&self, gpu: usize, node: Option<i32>) -> Path {
        let node = node.unwrap_or(self.numa[gpu]);
        let mut r = vec![self.pcie_up[gpu]];
        r.extend(self.switch[gpu].map(|(up, _)| up));
        r.extend(self.socket(gpu, self.numa[gpu], node));
        let mut path = Path::new(r, f64::INFINITY, self.preset.pcie.latency_us);
        let sending = self.nvlink_out(gpu);
        path.beside = self
            .preset
            .gpu
            .host_copy_beside_peer
            .filter(|_| !sending.is_empty())
            .map(|fraction| Beside {
                busy: sending,
                fraction,
            })
            .into_iter()
            .chain(self.both_ways(self.pcie_down[gpu]))
            .collect();
        path
    }

    /// The slowdown of a copy over a GPU's PCIe link while `other_way` (the link's other
    /// direction) carries a copy too, where the preset has one.
    fn both_ways(&self, other_way: ResourceId) -> Option<Beside> {
        self.preset.pcie.both_ways_fraction.map(|fraction| Beside {
            busy: vec![other_way],
            fraction,
        })
    }

    /// The resources only what `gpu` sends over NVLink crosses: its switch port out, or its
    /// bundles towards each peer.
    fn nvlink_out(&self, gpu: usize) -> Vec<ResourceId> {
        match &self.nvlink {
            NvLinks::None => Vec::new(),
            NvLinks::Switch(ports) => vec![ports[gpu].0],
            NvLinks::Bundles(bundles) => bundles
                .iter()
                .filter(|((a, _), _)| *a == gpu)
                .map(|(_, &r)| r)
                .collect(),
        }
    }

    /// From pinned host memory on `node` down to `gpu`.
    fn host_down(&self, node: Option<i32>, gpu: usize) -> Path {
        let node = node.unwrap_or(self.numa[gpu]);
        let mut r: Vec<ResourceId> = self.socket(gpu, node, self.numa[gpu]).into_iter().collect();
        r.extend(self.switch[gpu].map(|(_, down)| down));
        r.push(self.pcie_down[gpu]);
        let mut path = Path::new(r, f64::INFINITY, self.preset.pcie.latency_us);
        path.beside.extend(self.both_ways(self.pcie_up[gpu]));
        path
    }

    /// A direct P2P transfer from GPU `a` to GPU `b` (the pair must offer P2P).
    pub fn peer(&self, a: usize, b: usize) -> Path {
        match (self.link(a, b), &self.nvlink) {
            (Link::NvLink(_), NvLinks::Switch(ports)) => Path::new(
                vec![ports[a].0, ports[b].1],
                f64::INFINITY,
                self.nvlink_latency(),
            ),
            (Link::NvLink(_), NvLinks::Bundles(bundles)) => {
                Path::new(vec![bundles[&(a, b)]], f64::INFINITY, self.nvlink_latency())
            }
            (class, _) => {
                let cap = self.preset.pcie.p2p_gbps.get(&class).copied();
                let mut r = vec![self.pcie_up[a]];
                if self.switch[a] != self.switch[b] || self.switch[a].is_none() {
                    r.extend(self.switch[a].map(|(up, _)| up));
                    r.extend(self.socket(a, self.numa[a], self.numa[b]));
                    r.extend(self.switch[b].map(|(_, down)| down));
                }
                r.push(self.pcie_down[b]);
                Path::new(
                    r,
                    cap.map_or(f64::INFINITY, bytes_per_us),
                    self.preset.pcie.latency_us,
                )
            }
        }
    }

    /// Whether GPUs `a` and `b` sit on different hosts.
    pub fn crosses_hosts(&self, a: usize, b: usize) -> bool {
        self.preset.host_of(a) != self.preset.host_of(b)
    }

    /// What NCCL's bytes cross from GPU `a` to GPU `b` on another host: out through `a`'s NIC
    /// and in through `b`'s, straight between GPU memory and NIC where GPUDirect RDMA applies
    /// (NCCL's default `NCCL_NET_GDR_LEVEL`: the NIC at most `PXB` away), otherwise through host
    /// memory on the NIC's NUMA node; `None` where a host has no NIC.
    pub fn network(&self, a: usize, b: usize) -> Option<Path> {
        let net = self.preset.network.as_ref()?;
        let ((nic_a, link_a), (nic_b, link_b)) = (self.preset.nic_of(a)?, self.preset.nic_of(b)?);
        let direct = |link: Link| net.gpudirect && link <= Link::Pxb;
        let nic_numa = |nic: usize| self.preset.nics[nic % self.preset.nics.len()].numa_node;
        let out = if direct(link_a) {
            let mut r = vec![self.pcie_up[a]];
            if link_a != Link::Pix {
                r.extend(self.switch[a].map(|(up, _)| up));
            }
            Path::new(r, f64::INFINITY, 0.0)
        } else {
            self.host_up(a, Some(nic_numa(nic_a)))
        };
        let into = if direct(link_b) {
            let mut r: Vec<ResourceId> = Vec::new();
            if link_b != Link::Pix {
                r.extend(self.switch[b].map(|(_, down)| down));
            }
            r.push(self.pcie_down[b]);
            Path::new(r, f64::INFINITY, 0.0)
        } else {
            self.host_down(Some(nic_numa(nic_b)), b)
        };
        let rail = |nic: usize| nic % self.preset.nics.len();
        let spine = net.fabric == FabricKind::Rail && rail(nic_a) != rail(nic_b);
        let wire = Path::new(
            vec![self.nics[nic_a].0, self.nics[nic_b].1],
            f64::INFINITY,
            net.latency_us + if spine { net.spine_latency_us } else { 0.0 },
        );
        Some(out.then(wire).then(into))
    }

    /// A peer copy the driver stages through host memory (near `a`), for pairs without P2P.
    pub fn staged(&self, a: usize, b: usize) -> Path {
        let host = &self.preset.host;
        let mut path = self
            .host_up(a, None)
            .then(self.host_down(Some(self.numa[a]), b));
        path.cap = bytes_per_us(host.staged_gbps);
        path.latency_us = host.staged_latency_us;
        path
    }

    /// The direct way from one place to another, using P2P between GPUs (the caller has checked
    /// that it is allowed). `via` is the GPU whose PCIe link a host-to-host transfer crosses.
    pub fn direct(&self, from: Place, to: Place, via: usize) -> Path {
        match (from, to) {
            (Place::Device(a), Place::Device(b)) if a == b => self.local(a),
            (Place::Device(a), Place::Device(b)) => self.peer(a, b),
            (Place::Device(a), Place::Host(node)) => self.host_up(a, node),
            (Place::Host(node), Place::Device(b)) => self.host_down(node, b),
            (Place::Host(src), Place::Host(dst)) => {
                self.host_down(src, via).then(self.host_up(via, dst))
            }
        }
    }

    /// What a kernel on `gpu` crosses to load from `from` and store to `to`: the way in, then the
    /// way out; a copy inside the GPU's own memory when both are local.
    pub fn through_gpu(&self, from: Place, to: Place, gpu: usize) -> Path {
        let here = Place::Device(gpu);
        let leg = |a: Place, b: Place| (a != b).then(|| self.direct(a, b, gpu));
        match (leg(from, here), leg(here, to)) {
            (None, None) => self.local(gpu),
            (Some(r), None) | (None, Some(r)) => r,
            (Some(a), Some(b)) => a.then(b),
        }
    }

    /// What an SM kernel on `gpu` crosses to load from `from` and store to `to`, capped at the
    /// share of the path's rate that such a kernel reaches.
    pub fn kernel(&self, from: Place, to: Place, gpu: usize) -> Path {
        let mut path = self.through_gpu(from, to, gpu);
        path.cap = self.bottleneck(&path) * self.preset.gpu.sm_copy_efficiency;
        path
    }

    /// The lowest capacity along a path, bytes per µs.
    pub fn bottleneck(&self, path: &Path) -> f64 {
        path.resources
            .iter()
            .map(|&r| self.capacity[r])
            .fold(path.cap, f64::min)
    }

    fn nvlink_latency(&self) -> f64 {
        self.preset.nvlink.as_ref().map_or(0.0, |nv| nv.latency_us)
    }

    /// Round trip of one dependent load by `gpu` from `place`, in µs, the chain served from
    /// `chain`.
    pub fn load_latency_us(&self, gpu: usize, place: Place, chain: Chain) -> f64 {
        let p = &self.preset;
        let pcie = (p.pcie.load_latency_ns, p.pcie.resident_load_ns());
        let (in_memory, cached) = match place {
            Place::Device(d) if d == gpu => (p.gpu.load_latency_ns, p.gpu.resident_load_ns()),
            Place::Device(d) => match (self.link(gpu, d), &p.nvlink) {
                (Link::NvLink(_), Some(nv)) => (nv.load_latency_ns, nv.resident_load_ns()),
                _ => pcie,
            },
            Place::Host(_) => pcie,
        };
        let ns = match chain {
            Chain::InMemory => in_memory,
            Chain::Cached => cached,
        };
        ns / 1e3
    }

    /// One-way latency of a fenced store + flag from a kernel on `a` to a kernel on `b`, in µs.
    pub fn signal_us(&self, a: usize, b: usize) -> f64 {
        let p = &self.preset;
        if a == b {
            return p.gpu.signal_us;
        }
        match (self.link(a, b), &p.nvlink) {
            (Link::NvLink(_), Some(nv)) => nv.signal_us,
            _ => p.pcie.signal_us,
        }
    }
}
