//! `peerlink topo --json`: the `peerlink.topo/1` document.

use super::{impl_document, Document, Header};
use crate::topology::nccl_view::NcclView;
use crate::topology::{warnings, Device, Network, Pair, Topology, Warning};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The GPUs asked for, how each ordered pair of them is linked, and what is wrong. The driver's
/// version is the header's `driver_version`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TopoDocument {
    #[serde(flatten)]
    pub header: Header,
    /// The value of CUDA_VISIBLE_DEVICES when the topology was read, if set.
    pub visible_devices: Option<String>,
    /// The GPUs asked for (`--devices`, all by default).
    pub devices: Vec<Device>,
    /// One entry per ordered pair of them, `src != dst`, sorted by (src, dst).
    pub pairs: Vec<Pair>,
    /// The hosts, their RDMA NICs (none: `nics` is empty), how these GPUs reach them, and
    /// GPUDirect RDMA; absent where nothing was read (a simulator preset without NICs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// What is wrong with these GPUs' links, most serious first.
    pub warnings: Vec<Warning>,
    /// NCCL's own view of the GPU ↔ NIC paths beside peerlink's (`--nccl`, `--nccl-xml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<NcclView>,
}

impl_document!(TopoDocument, "peerlink.topo/1");

impl TopoDocument {
    /// The entry for an ordered pair of distinct devices among these.
    pub fn pair(&self, src: usize, dst: usize) -> Option<&Pair> {
        crate::topology::pair_in(&self.pairs, src, dst)
    }

    /// The document for the devices in `selected` (indices into `host.devices`).
    pub fn new(host: &Topology, selected: &[usize]) -> TopoDocument {
        let topo = host.restricted_to(selected);
        TopoDocument {
            header: Header::new(Self::SCHEMA, host),
            warnings: warnings(&topo),
            visible_devices: topo.visible_devices,
            devices: topo.devices,
            pairs: topo.pairs,
            network: topo.network,
            nccl: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::test_support::three_gpus;
    use crate::topology::Link;

    #[test]
    fn json_follows_the_contract() {
        let doc = serde_json::to_value(TopoDocument::new(&three_gpus(), &[0, 1, 2])).unwrap();
        assert_eq!(doc["schema"], TopoDocument::SCHEMA);
        assert_eq!(doc["source"], "sim:test");
        assert_eq!(doc["driver_version"], "580.159.04");
        assert_eq!(doc["cuda_version"], "13.0");
        let devices = doc["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 3);
        for key in ["index", "name", "pci_bus_id", "numa_node"] {
            assert!(devices[0].get(key).is_some(), "device lacks {key}");
        }
        let pairs = doc["pairs"].as_array().unwrap();
        assert_eq!(pairs.len(), 6);
        assert_eq!(pairs[0]["link"], "NV2");
        assert_eq!(pairs[1]["link"], "SYS");
        assert_eq!(pairs[1]["p2p"], false);
        for key in ["src", "dst", "link", "p2p", "perf_rank", "atomics"] {
            assert!(pairs[0].get(key).is_some(), "pair lacks {key}");
        }
        assert_eq!(doc["warnings"][0]["code"], "no-p2p");
    }

    #[test]
    fn selection_keeps_only_pairs_inside_it_and_the_header_every_gpu() {
        let doc = TopoDocument::new(&three_gpus(), &[0, 2]);
        assert_eq!(doc.devices.len(), 2);
        assert_eq!(doc.pairs.len(), 2);
        assert!(doc.pairs.iter().all(|p| p.link == Link::Sys));
        assert_eq!(doc.header.host_gpus.len(), 3);
        let back: TopoDocument = super::super::read(&super::super::to_json(&doc)).unwrap();
        assert_eq!(back, doc);
    }
}
