//! The hosts and their NICs: which RDMA NICs each host has, how far each GPU is from each NIC (in
//! `nvidia-smi topo -m`'s vocabulary), each GPU's nearest NIC, and whether GPUDirect RDMA is
//! available. Filled from sysfs on a real host ([`super::nics`]) or from a simulator preset, where
//! several hosts may be described; GPU indices are global across hosts, each host's GPUs in a row.

use super::Link;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The hosts, their NICs and how the GPUs reach them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Network {
    /// Where the NICs were read: `sysfs` (this host's /sys), or `preset` (the simulator's).
    pub source: String,
    /// Every host, in GPU order: host 0 holds the first GPUs. A real host is one.
    pub hosts: Vec<Host>,
    /// Every RDMA NIC of every host, host by host.
    pub nics: Vec<Nic>,
    /// How each GPU reaches each NIC of its host, sorted by (gpu, nic).
    pub gpu_nics: Vec<GpuNic>,
    /// Each GPU's nearest NICs, sorted by GPU; absent for a GPU whose host has no NIC.
    pub nearest: Vec<NearestNic>,
    pub gpudirect: GpuDirect,
    /// How the hosts' NICs are connected (the simulator's network); absent on a real host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<Fabric>,
}

/// One host and what it holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Host {
    pub index: usize,
    /// The host's name (`hostname`), or `host<i>` on the simulator.
    pub name: String,
    /// Its GPUs, by global index.
    pub gpus: Vec<usize>,
    /// Its NICs, by index into `nics`.
    pub nics: Vec<usize>,
}

/// One RDMA NIC (an entry of /sys/class/infiniband).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Nic {
    pub index: usize,
    pub host: usize,
    /// The RDMA device's name: `mlx5_0`.
    pub name: String,
    /// PCI address of the NIC's function, `0000:1a:00.0`, where known.
    pub pci_bus_id: Option<String>,
    /// NUMA node of the NIC's PCIe root, where known.
    pub numa_node: Option<i32>,
    /// Network interfaces on the same PCI function (`ibp26s0`, `ens1f0np0`).
    pub netdevs: Vec<String>,
    /// `InfiniBand` or `Ethernet` (RoCE), of its first port, where known.
    pub link_layer: Option<String>,
    /// Its first port's rate in Gb/s as the NIC reports it (`400` for NDR), where known.
    pub rate_gbit: Option<f64>,
    /// Its first port's state (`ACTIVE`, `DOWN`), where known.
    pub state: Option<String>,
    /// The rail (leaf switch) the NIC is cabled to, in a rail-optimised network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail: Option<usize>,
}

/// How one GPU reaches one NIC of its host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GpuNic {
    pub gpu: usize,
    pub nic: usize,
    /// `PIX`, `PXB`, `PHB`, `NODE` or `SYS`.
    pub link: Link,
}

/// A GPU's nearest NICs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NearestNic {
    pub gpu: usize,
    /// Every NIC of its host at the best class, by index.
    pub nics: Vec<usize>,
    /// That class.
    pub link: Link,
    /// False where even the nearest NIC is across the CPU (`NODE`, `SYS`): GPUDirect RDMA's reads
    /// and writes would cross the CPU anyway, so it brings this GPU no benefit.
    pub gpudirect_benefit: bool,
}

/// Whether the NICs can read and write GPU memory directly (GPUDirect RDMA).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GpuDirect {
    /// Whether either way below is there; `null` where that could not be told.
    pub available: Option<bool>,
    /// The nvidia-peermem kernel module (or Mellanox's older nv_peer_mem) is loaded.
    pub peermem: Option<bool>,
    /// dma-buf: the NVIDIA open kernel module on a Linux kernel of 5.12 or later.
    pub dma_buf: Option<bool>,
    /// How this was decided, in words.
    pub how: String,
}

/// How the hosts' NICs are connected.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Fabric {
    pub kind: FabricKind,
    /// One message NIC to NIC through one switch, µs.
    pub latency_us: f64,
    /// Added between NICs of different rails (through the spine) in a rail-optimised network, µs.
    pub spine_latency_us: f64,
}

/// The shape of the network between the hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FabricKind {
    /// NIC `i` of every host on leaf switch `i`; other pairs go through the spine.
    Rail,
    /// Every NIC reaches every other through a non-blocking tree, at one latency.
    FatTree,
}

impl Network {
    /// A network whose nearest NICs follow from `gpu_nics`.
    pub fn new(
        source: &str,
        hosts: Vec<Host>,
        nics: Vec<Nic>,
        mut gpu_nics: Vec<GpuNic>,
        gpudirect: GpuDirect,
        fabric: Option<Fabric>,
    ) -> Network {
        gpu_nics.sort_by_key(|g| (g.gpu, g.nic));
        let nearest = nearest(&gpu_nics);
        Network {
            source: source.into(),
            hosts,
            nics,
            gpu_nics,
            nearest,
            gpudirect,
            fabric,
        }
    }

    /// The host of GPU `gpu`: 0 where no host lists it.
    pub fn host_of(&self, gpu: usize) -> usize {
        self.hosts
            .iter()
            .find(|h| h.gpus.contains(&gpu))
            .map_or(0, |h| h.index)
    }

    /// GPU `gpu`'s nearest NICs, or `None` where its host has none.
    pub fn nearest(&self, gpu: usize) -> Option<&NearestNic> {
        self.nearest.iter().find(|n| n.gpu == gpu)
    }

    /// The NIC GPU `gpu` sends and receives through: the first of its nearest.
    pub fn nic_of(&self, gpu: usize) -> Option<&Nic> {
        let index = *self.nearest(gpu)?.nics.first()?;
        self.nics.get(index)
    }

    /// How GPU `src` reaches GPU `dst` on another host, in words: each one's NIC, host and class
    /// (`GPU 2 → mlx5_0 of host0 (SYS) → mlx5_0 of host1 (SYS) → GPU 6`); `None` within a host or
    /// where a host has no NIC.
    pub fn route(&self, src: usize, dst: usize) -> Option<String> {
        if self.host_of(src) == self.host_of(dst) {
            return None;
        }
        let end = |gpu: usize| {
            let nic = self.nic_of(gpu)?;
            let host = self.hosts.get(nic.host).map_or("?", |h| h.name.as_str());
            let link = self.nearest(gpu)?.link;
            Some(format!("{} of {host} ({link})", nic.name))
        };
        Some(format!(
            "GPU {src} → {} → {} → GPU {dst}",
            end(src)?,
            end(dst)?
        ))
    }

    /// The same network with only the GPUs in `kept` (indexed by GPU).
    pub fn restricted_to(&self, kept: impl Fn(usize) -> bool) -> Network {
        Network {
            hosts: self
                .hosts
                .iter()
                .map(|h| Host {
                    gpus: h.gpus.iter().copied().filter(|&g| kept(g)).collect(),
                    ..h.clone()
                })
                .collect(),
            gpu_nics: self
                .gpu_nics
                .iter()
                .copied()
                .filter(|g| kept(g.gpu))
                .collect(),
            nearest: self
                .nearest
                .iter()
                .filter(|n| kept(n.gpu))
                .cloned()
                .collect(),
            ..self.clone()
        }
    }
}

/// Each GPU's nearest NICs, from its paths sorted by (gpu, nic).
fn nearest(gpu_nics: &[GpuNic]) -> Vec<NearestNic> {
    let mut out: Vec<NearestNic> = Vec::new();
    for path in gpu_nics {
        match out.last_mut() {
            Some(n) if n.gpu == path.gpu && path.link == n.link => n.nics.push(path.nic),
            Some(n) if n.gpu == path.gpu && path.link > n.link => {}
            Some(n) if n.gpu == path.gpu => {
                n.nics = vec![path.nic];
                n.link = path.link;
            }
            _ => out.push(NearestNic {
                gpu: path.gpu,
                nics: vec![path.nic],
                link: path.link,
                gpudirect_benefit: true,
            }),
        }
    }
    for n in &mut out {
        n.gpudirect_benefit = !n.link.crosses_cpu();
    }
    out
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A NIC with only the facts a preset gives.
    pub fn nic(index: usize, host: usize, numa: i32) -> Nic {
        Nic {
            index,
            host,
            name: format!("mlx5_{index}"),
            pci_bus_id: None,
            numa_node: Some(numa),
            netdevs: Vec::new(),
            link_layer: Some("InfiniBand".into()),
            rate_gbit: Some(400.0),
            state: Some("ACTIVE".into()),
            rail: None,
        }
    }

    /// GPUDirect RDMA through a loaded nvidia-peermem.
    pub fn peermem() -> GpuDirect {
        GpuDirect {
            available: Some(true),
            peermem: Some(true),
            dma_buf: None,
            how: "test".into(),
        }
    }

    /// One host whose GPUs reach its NICs as `links[gpu][nic]` says.
    pub fn one_host(links: &[&[Link]]) -> Network {
        let gpus = links.len();
        let nics = links.first().map_or(0, |row| row.len());
        let gpu_nics = links
            .iter()
            .enumerate()
            .flat_map(|(gpu, row)| {
                row.iter()
                    .enumerate()
                    .map(move |(nic, &link)| GpuNic { gpu, nic, link })
            })
            .collect();
        Network::new(
            "test",
            vec![Host {
                index: 0,
                name: "host0".into(),
                gpus: (0..gpus).collect(),
                nics: (0..nics).collect(),
            }],
            (0..nics).map(|i| nic(i, 0, 0)).collect(),
            gpu_nics,
            peermem(),
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn the_nearest_nics_are_those_at_the_best_class() {
        let net = one_host(&[
            &[Link::Pix, Link::Sys, Link::Pix],
            &[Link::Sys, Link::Node, Link::Node],
            &[Link::Sys, Link::Sys, Link::Phb],
        ]);
        let n0 = net.nearest(0).unwrap();
        assert_eq!((n0.nics.as_slice(), n0.link), (&[0, 2][..], Link::Pix));
        assert!(n0.gpudirect_benefit);
        let n1 = net.nearest(1).unwrap();
        assert_eq!((n1.nics.as_slice(), n1.link), (&[1, 2][..], Link::Node));
        assert!(!n1.gpudirect_benefit, "NODE crosses the CPU");
        let n2 = net.nearest(2).unwrap();
        assert_eq!((n2.nics.as_slice(), n2.link), (&[2][..], Link::Phb));
        assert!(n2.gpudirect_benefit, "PHB stays below the CPU interconnect");
        assert_eq!(net.nic_of(1).unwrap().index, 1);
        assert_eq!(net.route(0, 1), None, "one host");
    }

    #[test]
    fn a_gpu_whose_only_nic_is_on_the_other_socket_is_flagged() {
        let net = one_host(&[&[Link::Sys]]);
        assert!(!net.nearest(0).unwrap().gpudirect_benefit);
        let none = one_host(&[]);
        assert!(none.nearest(0).is_none());
        assert!(none.nic_of(0).is_none());
    }

    #[test]
    fn restriction_keeps_the_nics_and_drops_other_gpus() {
        let net = one_host(&[&[Link::Pix], &[Link::Sys]]);
        let only = net.restricted_to(|g| g == 1);
        assert_eq!(only.nics.len(), 1);
        assert_eq!(only.hosts[0].gpus, vec![1]);
        assert_eq!(only.gpu_nics.len(), 1);
        assert_eq!(only.nearest(1).unwrap().link, Link::Sys);
        assert!(only.nearest(0).is_none());
    }
}
