//! The host's facts the checks need, read once through [`Sysfs`]: where each GPU sits in the PCIe
//! tree, what the IOMMU does to it, the ACS of the bridges above it, and whether the host is a
//! virtual machine.

use super::host::{self, lspci_acs, Acs, Iommu, SysfsLink};
use crate::topology::sysfs::Sysfs;
use crate::topology::{PciAddress, Topology};
use std::collections::BTreeMap;

/// Where one GPU sits, as sysfs shows it.
#[derive(Clone, Debug, Default)]
pub struct GpuPlace {
    /// The host bridge (root complex) above it, `pci0000:00`.
    pub host_bridge: Option<String>,
    /// The bridges between the host bridge and the GPU, topmost first.
    pub chain: Option<Vec<PciAddress>>,
    /// What the IOMMU does to its DMA, and the evidence.
    pub iommu: Option<(Iommu, String)>,
    /// Its PCIe link as sysfs shows it.
    pub link: Option<SysfsLink>,
}

/// A bridge's ACS and where it was read.
#[derive(Clone, Debug)]
pub struct BridgeAcs {
    pub acs: Acs,
    pub source: &'static str,
}

/// What says whether the host is a virtual machine.
#[derive(Clone, Debug, Default)]
pub struct Vm {
    /// The CPU's `hypervisor` flag in /proc/cpuinfo.
    pub hypervisor_flag: Option<bool>,
    /// /sys/class/dmi/id/sys_vendor and product_name.
    pub vendor: Option<String>,
    pub product: Option<String>,
}

/// DMI vendor or product names of hypervisors (a cloud's bare-metal machines may carry the
/// cloud's vendor name too, so the CPU flag decides where it can be read).
const HYPERVISOR_NAMES: &[&str] = &[
    "QEMU",
    "KVM",
    "VMware",
    "VirtualBox",
    "innotek",
    "Xen",
    "HVM domU",
    "Virtual Machine",
    "Bochs",
    "Parallels",
    "OpenStack",
    "Google Compute Engine",
    "Cloud Hypervisor",
];

impl Vm {
    /// Whether the host is a virtual machine, where anything says.
    pub fn is_vm(&self) -> Option<bool> {
        if let Some(flag) = self.hypervisor_flag {
            return Some(flag);
        }
        let names = [&self.vendor, &self.product];
        let known = names.iter().any(|n| n.is_some());
        let named = names
            .iter()
            .flat_map(|n| n.as_deref())
            .any(|n| HYPERVISOR_NAMES.iter().any(|h| n.contains(h)));
        known.then_some(named)
    }

    /// The facts, one sentence each.
    pub fn evidence(&self) -> Vec<String> {
        let shown = |v: &Option<String>| v.clone().unwrap_or_else(|| "unreadable".into());
        let flag = match self.hypervisor_flag {
            Some(true) => "the `hypervisor` CPU flag is set",
            Some(false) => "no `hypervisor` CPU flag",
            None => "no CPU flags readable",
        };
        vec![
            format!("/proc/cpuinfo: {flag}"),
            format!(
                "/sys/class/dmi/id: sys_vendor `{}`, product_name `{}`",
                shown(&self.vendor),
                shown(&self.product)
            ),
        ]
    }
}

/// The host's facts about the GPUs in use.
#[derive(Clone, Debug, Default)]
pub struct HostFacts {
    /// Why the host's files were not read (a simulated host without `--root`).
    pub unread: Option<String>,
    /// The root they were read under, where it is not `/`.
    pub root_shown: Option<String>,
    /// By GPU index.
    pub gpus: BTreeMap<usize, GpuPlace>,
    /// Every bridge above the GPUs.
    pub bridges: BTreeMap<PciAddress, BridgeAcs>,
    pub vm: Vm,
}

impl HostFacts {
    /// Reads what the checks need about `devices` of `topology`; `files` `None` reads nothing.
    pub fn read(files: Option<Sysfs>, topology: &Topology, devices: &[usize]) -> HostFacts {
        let Some(files) = files else {
            return HostFacts {
                unread: Some("a simulated host has no sysfs of its own".into()),
                ..HostFacts::default()
            };
        };
        let root_shown =
            (files.root() != std::path::Path::new("/")).then(|| files.root().display().to_string());
        let mut gpus = BTreeMap::new();
        for &d in devices {
            let Some(address) = PciAddress::parse(&topology.devices[d].pci_bus_id) else {
                gpus.insert(d, GpuPlace::default());
                continue;
            };
            let upstream = host::upstream(&files, address);
            gpus.insert(
                d,
                GpuPlace {
                    host_bridge: upstream.as_ref().map(|(h, _)| h.clone()),
                    chain: upstream.map(|(_, chain)| chain),
                    iommu: host::iommu(&files, address),
                    link: host::link(&files, address),
                },
            );
        }
        let mut bridges = BTreeMap::new();
        let mut lspci: Option<Vec<(PciAddress, host::AcsControl)>> = None;
        for bridge in gpus.values().flat_map(|g| g.chain.iter().flatten()) {
            if bridges.contains_key(bridge) {
                continue;
            }
            let from_sysfs = host::acs(&files, *bridge);
            let read = match from_sysfs {
                Acs::Unreadable(why) => {
                    let listed = lspci.get_or_insert_with(|| {
                        files.lspci().map(|t| lspci_acs(&t)).unwrap_or_default()
                    });
                    match listed.iter().find(|(a, _)| a == bridge) {
                        Some(&(_, control)) => BridgeAcs {
                            acs: Acs::Control(control),
                            source: "lspci -vvv",
                        },
                        None => BridgeAcs {
                            acs: Acs::Unreadable(format!(
                                "{why}; lspci -vvv shows no ACSCtl for it"
                            )),
                            source: "sysfs",
                        },
                    }
                }
                acs => BridgeAcs {
                    acs,
                    source: "sysfs config space",
                },
            };
            bridges.insert(*bridge, read);
        }
        let (vendor, product) = host::dmi(&files);
        HostFacts {
            unread: None,
            root_shown,
            gpus,
            bridges,
            vm: Vm {
                hypervisor_flag: host::hypervisor_flag(&files),
                vendor,
                product,
            },
        }
    }

    pub fn gpu(&self, device: usize) -> Option<&GpuPlace> {
        self.gpus.get(&device)
    }

    /// The bridges P2P traffic between GPUs `a` and `b` crosses: those below the deepest bridge
    /// above both (all of them where the GPUs sit under different host bridges). `None` where a
    /// GPU's place is unknown.
    pub fn bridges_between(&self, a: usize, b: usize) -> Option<Vec<PciAddress>> {
        let (pa, pb) = (self.gpu(a)?, self.gpu(b)?);
        let (ca, cb) = (pa.chain.as_ref()?, pb.chain.as_ref()?);
        let shared = if pa.host_bridge == pb.host_bridge {
            ca.iter().zip(cb).take_while(|(x, y)| x == y).count()
        } else {
            0
        };
        let mut below: Vec<PciAddress> =
            ca[shared..].iter().chain(&cb[shared..]).copied().collect();
        below.dedup();
        Some(below)
    }

    /// Bridges between `a` and `b` whose ACS redirects peer traffic to the root complex.
    pub fn redirecting(&self, a: usize, b: usize) -> Vec<(PciAddress, &BridgeAcs)> {
        self.bridges_between(a, b)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|bridge| {
                let acs = self.bridges.get(&bridge)?;
                matches!(&acs.acs, Acs::Control(c) if c.redirects()).then_some((bridge, acs))
            })
            .collect()
    }

    /// Where the files were read, for evidence: "" on the host itself, " (under ROOT)" elsewhere.
    pub fn under(&self) -> String {
        self.root_shown
            .as_ref()
            .map(|root| format!(" (under {root})"))
            .unwrap_or_default()
    }
}
