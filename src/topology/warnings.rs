//! What is wrong with a topology, in sentences a user can act on.

use super::{Link, Topology};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One problem found in a topology.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Warning {
    /// A stable code for scripts: `no-p2p`, `p2p-across-sockets`, `mig-enabled`, `device-order`,
    /// `nic-across-cpu`, `no-gpudirect-rdma`.
    pub code: String,
    /// The GPUs concerned.
    pub devices: Vec<usize>,
    pub message: String,
}

/// Every warning for a topology, most serious first.
pub fn warnings(topo: &Topology) -> Vec<Warning> {
    let mut out = Vec::new();
    no_p2p(topo, &mut out);
    p2p_across_sockets(topo, &mut out);
    mig(topo, &mut out);
    nic_across_cpu(topo, &mut out);
    no_gpudirect(topo, &mut out);
    device_order(topo, &mut out);
    out
}

/// Unordered pairs `a < b` for which `keep` holds in at least one direction.
fn unordered_pairs(topo: &Topology, keep: impl Fn(&super::Pair) -> bool) -> Vec<(usize, usize)> {
    let mut pairs: Vec<(usize, usize)> = topo
        .pairs
        .iter()
        .filter(|p| keep(p))
        .map(|p| (p.src.min(p.dst), p.src.max(p.dst)))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    pairs
}

fn describe(pairs: &[(usize, usize)]) -> String {
    pairs
        .iter()
        .map(|(a, b)| format!("{a}↔{b}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn devices_of(pairs: &[(usize, usize)]) -> Vec<usize> {
    let mut d: Vec<usize> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// Why a pair of GPUs has no P2P, as far as the topology tells: the one sentence for each reason,
/// which `topo`'s warnings and `doctor`'s P2P check both print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoP2p {
    /// MIG is enabled on one of the two GPUs.
    Mig,
    /// The pair crosses the CPU sockets (`SYS`).
    Sockets,
    /// Any other path the driver refuses.
    Driver,
}

impl NoP2p {
    /// Why `pair` has no P2P, or `None` where it has (or where it joins two hosts: NICs join
    /// them, there is no P2P to miss).
    pub fn of(topo: &Topology, pair: &super::Pair) -> Option<NoP2p> {
        let mig_on = |i: usize| topo.devices.get(i).is_some_and(|d| d.mig_enabled);
        if pair.p2p || pair.link.crosses_hosts() {
            None
        } else if mig_on(pair.src) || mig_on(pair.dst) {
            Some(NoP2p::Mig)
        } else if pair.link == Link::Sys {
            Some(NoP2p::Sockets)
        } else {
            Some(NoP2p::Driver)
        }
    }

    /// Why there is no P2P, in the words every output uses: the end of a sentence that first
    /// says what is so of the pair (`MIG is enabled on GPU 1, and …`).
    pub fn why(self) -> &'static str {
        match self {
            NoP2p::Mig => "MIG instances cannot use P2P",
            NoP2p::Sockets => {
                "the driver does not route P2P across the socket interconnect; transfers are \
                 staged through host memory"
            }
            NoP2p::Driver => {
                "the driver reports P2P unsupported on this path (often an IOMMU or PCIe ACS \
                 setting, or a virtual machine that hides the PCIe topology); transfers are \
                 staged through host memory"
            }
        }
    }
}

/// A warning's sentence for pairs without P2P for `reason`.
fn no_p2p_sentence(reason: NoP2p) -> String {
    match reason {
        NoP2p::Mig => format!("MIG is enabled on one of the GPUs, and {}", reason.why()),
        NoP2p::Sockets => format!(
            "they sit under different CPU sockets (root complexes), and {} — put communicating \
             ranks on GPUs of one socket, or use a relay GPU that has NVLink to both",
            reason.why()
        ),
        NoP2p::Driver => reason.why().to_string(),
    }
}

fn no_p2p(topo: &Topology, out: &mut Vec<Warning>) {
    for reason in [NoP2p::Mig, NoP2p::Sockets, NoP2p::Driver] {
        let pairs = unordered_pairs(topo, |p| NoP2p::of(topo, p) == Some(reason));
        if pairs.is_empty() {
            continue;
        }
        out.push(Warning {
            code: "no-p2p".into(),
            devices: devices_of(&pairs),
            message: format!(
                "{} pair{} without P2P ({}): {}",
                pairs.len(),
                if pairs.len() == 1 { "" } else { "s" },
                describe(&pairs),
                no_p2p_sentence(reason)
            ),
        });
    }
}

fn p2p_across_sockets(topo: &Topology, out: &mut Vec<Warning>) {
    let pairs = unordered_pairs(topo, |p| p.p2p && p.link == Link::Sys);
    if pairs.is_empty() {
        return;
    }
    out.push(Warning {
        code: "p2p-across-sockets".into(),
        devices: devices_of(&pairs),
        message: format!(
            "P2P over PCIe crosses the CPU sockets for {} ({} pair{}): expect lower bandwidth and \
             higher latency than between GPUs of one NUMA node",
            describe(&pairs),
            pairs.len(),
            if pairs.len() == 1 { "" } else { "s" }
        ),
    });
}

fn mig(topo: &Topology, out: &mut Vec<Warning>) {
    let devices: Vec<usize> = topo
        .devices
        .iter()
        .filter(|d| d.mig_enabled)
        .map(|d| d.index)
        .collect();
    if devices.is_empty() {
        return;
    }
    out.push(Warning {
        code: "mig-enabled".into(),
        message: format!(
            "MIG mode is enabled on GPU {}: MIG instances cannot use P2P or NVLink to other GPUs",
            devices
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        devices,
    });
}

fn nic_across_cpu(topo: &Topology, out: &mut Vec<Warning>) {
    let Some(net) = &topo.network else { return };
    let far: Vec<&super::network::NearestNic> = net
        .nearest
        .iter()
        .filter(|n| !n.gpudirect_benefit)
        .collect();
    if far.is_empty() {
        return;
    }
    let mut classes: Vec<String> = far.iter().map(|n| n.link.to_string()).collect();
    classes.sort();
    classes.dedup();
    let devices: Vec<usize> = far.iter().map(|n| n.gpu).collect();
    out.push(Warning {
        code: "nic-across-cpu".into(),
        message: format!(
            "the nearest RDMA NIC of GPU {} is across the CPU ({}): GPUDirect RDMA brings them no \
             benefit (NCCL leaves it off beyond PXB) and their traffic between hosts crosses the \
             CPU — put the ranks that talk across hosts on GPUs near a NIC, or add a NIC near these",
            join(&devices),
            classes.join(", ")
        ),
        devices,
    });
}

fn no_gpudirect(topo: &Topology, out: &mut Vec<Warning>) {
    let Some(net) = &topo.network else { return };
    if net.nics.is_empty() || net.gpudirect.available != Some(false) {
        return;
    }
    out.push(Warning {
        code: "no-gpudirect-rdma".into(),
        devices: topo.devices.iter().map(|d| d.index).collect(),
        message: format!(
            "RDMA NICs are there but GPUDirect RDMA is not ({}): load nvidia-peermem (modprobe \
             nvidia-peermem), or use the NVIDIA open kernel module on Linux 5.12 or later for \
             dma-buf; until then NCCL stages traffic between hosts through host memory",
            net.gpudirect.how
        ),
    });
}

/// `0, 2, 5`.
fn join(devices: &[usize]) -> String {
    devices
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn device_order(topo: &Topology, out: &mut Vec<Warning>) {
    // Each host numbers its own GPUs: the order is compared within a host.
    let in_pci_order = topo.devices.windows(2).all(|w| {
        topo.host_of(w[0].index) != topo.host_of(w[1].index)
            || w[0].pci_bus_id.to_ascii_lowercase() <= w[1].pci_bus_id.to_ascii_lowercase()
    });
    if in_pci_order {
        return;
    }
    let how = match &topo.visible_devices {
        Some(v) => format!("CUDA_VISIBLE_DEVICES={v} lists them out of PCI order"),
        None => "CUDA numbers them fastest-first (set CUDA_DEVICE_ORDER=PCI_BUS_ID)".to_string(),
    };
    out.push(Warning {
        code: "device-order".into(),
        devices: topo.devices.iter().map(|d| d.index).collect(),
        message: format!(
            "GPU indices here are not in PCI bus order, so they differ from nvidia-smi's: {how}; \
             match GPUs by PCI bus id or UUID"
        ),
    });
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    fn topo(devices: Vec<super::super::Device>, pairs: Vec<super::super::Pair>) -> Topology {
        Topology {
            source: crate::topology::Source::Sim("test".into()),
            driver_version: None,
            cuda_version: None,
            visible_devices: None,
            devices,
            pairs,
            network: None,
        }
    }

    fn two_socket() -> Topology {
        topo(
            vec![
                device(0, Some(0), "0000:18:00.0"),
                device(1, Some(1), "0000:98:00.0"),
            ],
            vec![pair(0, 1, Link::Sys, false), pair(1, 0, Link::Sys, false)],
        )
    }

    #[test]
    fn cross_socket_pair_without_p2p_names_the_sockets() {
        let w = warnings(&two_socket());
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].code, "no-p2p");
        assert_eq!(w[0].devices, vec![0, 1]);
        assert!(w[0].message.contains("0↔1"), "{}", w[0].message);
        assert!(w[0].message.contains("CPU sockets"), "{}", w[0].message);
    }

    #[test]
    fn p2p_across_sockets_is_flagged_when_enabled() {
        let mut t = two_socket();
        for p in &mut t.pairs {
            p.p2p = true;
        }
        let w = warnings(&t);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].code, "p2p-across-sockets");
    }

    #[test]
    fn mig_explains_missing_p2p() {
        let mut t = two_socket();
        t.devices[1].mig_enabled = true;
        let codes: Vec<String> = warnings(&t).into_iter().map(|w| w.code).collect();
        assert_eq!(codes, vec!["no-p2p", "mig-enabled"]);
        assert!(warnings(&t)[0].message.contains("MIG"));
    }

    #[test]
    fn gpus_far_from_every_nic_and_missing_gpudirect_are_named() {
        use crate::topology::network::test_support::one_host;
        let mut t = two_socket();
        t.network = Some(one_host(&[&[Link::Pix], &[Link::Sys]]));
        let found = warnings(&t);
        let far = found.iter().find(|w| w.code == "nic-across-cpu").unwrap();
        assert_eq!(far.devices, vec![1]);
        assert!(
            far.message.contains("GPU 1 is across the CPU (SYS)"),
            "{}",
            far.message
        );
        assert!(!found.iter().any(|w| w.code == "no-gpudirect-rdma"));
        t.network.as_mut().unwrap().gpudirect.available = Some(false);
        let found = warnings(&t);
        let none = found
            .iter()
            .find(|w| w.code == "no-gpudirect-rdma")
            .unwrap();
        assert!(none.message.contains("nvidia-peermem"), "{}", none.message);
    }

    #[test]
    fn gpus_of_different_hosts_are_no_missing_p2p() {
        let mut t = two_socket();
        for p in &mut t.pairs {
            p.link = Link::Net;
        }
        assert!(warnings(&t).is_empty(), "{:?}", warnings(&t));
    }

    #[test]
    fn device_order_differs_from_pci_order() {
        let mut t = topo(
            vec![
                device(0, Some(0), "0000:98:00.0"),
                device(1, Some(0), "0000:18:00.0"),
            ],
            vec![
                pair(0, 1, Link::NvLink(18), true),
                pair(1, 0, Link::NvLink(18), true),
            ],
        );
        t.visible_devices = Some("1,0".into());
        let w = warnings(&t);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].code, "device-order");
        assert!(w[0].message.contains("CUDA_VISIBLE_DEVICES=1,0"));
    }

    #[test]
    fn healthy_nvswitch_host_has_no_warnings() {
        let t = topo(
            vec![
                device(0, Some(0), "0000:18:00.0"),
                device(1, Some(0), "0000:2a:00.0"),
            ],
            vec![
                pair(0, 1, Link::NvLink(18), true),
                pair(1, 0, Link::NvLink(18), true),
            ],
        );
        assert!(warnings(&t).is_empty());
    }
}
