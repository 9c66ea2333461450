//! NCCL's own view of the host beside peerlink's: the topology NCCL writes when
//! `NCCL_TOPO_DUMP_FILE` is set at a communicator's creation, read back and compared GPU by NIC.
//!
//! The dump is NCCL's system XML (`src/graph/xml.cc`, `ncclTopoDumpXmlToFile`): `<system>` holds a
//! `<cpu numaid=…>` per NUMA node, under it `<pci busid=…>` nodes (the PCIe switches, each named by
//! its upstream port, then the devices), a device's node holding a `<gpu>` or a `<nic>` with one
//! `<net name=… speed=… gdr=…>` per port. NCCL's path classes are read off that tree with the same
//! rule as peerlink's ([`PciPlace`]); NCCL's tree has no host bridges, so its `PHB` is peerlink's
//! `PHB` or `NODE`, and those count as agreeing.

use super::pci::{PciAddress, PciPlace};
use super::{Link, Topology};
use crate::files;
use crate::{Error, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// NCCL's view of the host and where it differs from peerlink's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NcclView {
    /// Where the dump came from: the file read, or NCCL run by peerlink.
    pub source: String,
    /// The GPUs in NCCL's dump.
    pub gpus: Vec<NcclGpu>,
    /// The network ports in NCCL's dump (RDMA NICs, or the sockets it would fall back to).
    pub nics: Vec<NcclNic>,
    /// Every GPU ↔ NIC path of the dump, NCCL's class beside peerlink's.
    pub paths: Vec<NcclPath>,
    /// Where the two views differ, one sentence each; empty where they agree.
    pub disagreements: Vec<String>,
}

/// A GPU in NCCL's dump.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NcclGpu {
    /// As the dump writes it (`0000:1b:00.0`).
    pub pci_bus_id: String,
    /// peerlink's index of the same GPU (matched by PCI address), where it has it.
    pub index: Option<usize>,
    /// The NUMA node (`cpu numaid`) NCCL hangs it from.
    pub numa_node: Option<i32>,
    /// NCCL's `gdr` attribute: the GPU supports GPUDirect RDMA.
    pub gdr: Option<bool>,
}

/// A network port in NCCL's dump.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NcclNic {
    /// `mlx5_0`, or a socket interface such as `eth0`.
    pub name: String,
    /// The PCI device it sits on, where NCCL found one.
    pub pci_bus_id: Option<String>,
    pub numa_node: Option<i32>,
    /// NCCL's `speed`, Mb/s.
    pub speed_mbps: Option<f64>,
    /// NCCL's `gdr` attribute: the network plugin can reach GPU memory through this port.
    pub gdr: Option<bool>,
}

/// One GPU ↔ NIC path, both ways of seeing it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NcclPath {
    pub gpu: String,
    pub nic: String,
    /// NCCL's class: `PIX`, `PXB`, `PHB` or `SYS`.
    pub nccl: Link,
    /// peerlink's, where it knows both ends.
    pub peerlink: Option<Link>,
    pub agree: bool,
}

/// One element of the dump.
#[derive(Clone, Debug, Default, PartialEq)]
struct Element {
    name: String,
    attributes: Vec<(String, String)>,
    children: Vec<Element>,
}

impl Element {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn number<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        self.attribute(key)?.trim().parse().ok()
    }

    fn flag(&self, key: &str) -> Option<bool> {
        self.number::<i64>(key).map(|v| v != 0)
    }
}

/// Parses the element tree NCCL writes (no text content, no entities), or says where it breaks.
fn parse_xml(text: &str) -> std::result::Result<Element, String> {
    let mut stack: Vec<Element> = vec![Element::default()];
    let mut rest = text;
    while let Some(open) = rest.find('<') {
        let close = rest[open..]
            .find('>')
            .map(|c| open + c)
            .ok_or("a tag is not closed")?;
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if tag.starts_with('?') || tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let done = stack
                .pop()
                .filter(|e| e.name == name.trim())
                .ok_or_else(|| {
                    format!("`</{}>` closes an element that is not open", name.trim())
                })?;
            stack
                .last_mut()
                .ok_or("more elements closed than opened")?
                .children
                .push(done);
            continue;
        }
        let (body, empty) = match tag.strip_suffix('/') {
            Some(body) => (body, true),
            None => (tag, false),
        };
        let element = element(body)?;
        if empty {
            stack
                .last_mut()
                .expect("the document root stays")
                .children
                .push(element);
        } else {
            stack.push(element);
        }
    }
    if stack.len() != 1 {
        return Err(format!(
            "`<{}>` is never closed",
            stack.last().map_or("", |e| e.name.as_str())
        ));
    }
    stack
        .pop()
        .and_then(|root| root.children.into_iter().find(|e| e.name == "system"))
        .ok_or_else(|| "it has no <system> element".to_string())
}

/// `name key="value" …` as an element without children.
fn element(body: &str) -> std::result::Result<Element, String> {
    let body = body.trim();
    let (name, mut rest) = body.split_at(body.find(char::is_whitespace).unwrap_or(body.len()));
    let mut attributes = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (key, after) = rest
            .split_once("=\"")
            .ok_or_else(|| format!("`<{name}>` has an attribute without a quoted value"))?;
        let (value, after) = after
            .split_once('"')
            .ok_or_else(|| format!("`<{name}>` has an unterminated attribute `{}`", key.trim()))?;
        attributes.push((key.trim().to_string(), value.to_string()));
        rest = after;
    }
    if name.is_empty() {
        return Err("an element has no name".into());
    }
    Ok(Element {
        name: name.to_string(),
        attributes,
        children: Vec::new(),
    })
}

/// A device of the dump and where it hangs.
struct Placed<T> {
    what: T,
    place: PciPlace,
}

/// The GPUs and network ports of the dump, each with its place in NCCL's tree.
fn devices(system: &Element) -> (Vec<Placed<NcclGpu>>, Vec<Placed<NcclNic>>) {
    let (mut gpus, mut nics) = (Vec::new(), Vec::new());
    for cpu in system.children.iter().filter(|c| c.name == "cpu") {
        let numa = cpu.number::<i32>("numaid");
        walk(cpu, numa, &mut Vec::new(), None, &mut gpus, &mut nics);
    }
    (gpus, nics)
}

/// Collects the devices under `node`; `switches` are the `pci` nodes above it, `bus` the PCI
/// device `node` belongs to.
fn walk(
    node: &Element,
    numa: Option<i32>,
    switches: &mut Vec<PciAddress>,
    bus: Option<&str>,
    gpus: &mut Vec<Placed<NcclGpu>>,
    nics: &mut Vec<Placed<NcclNic>>,
) {
    let place = |switches: &[PciAddress]| PciPlace {
        root: None,
        numa_node: numa,
        switches: switches.to_vec(),
    };
    for child in &node.children {
        match child.name.as_str() {
            "pci" => {
                let busid = child.attribute("busid");
                // A pci node holding pci nodes is a switch; one holding a gpu or nic is a device.
                let is_switch = child.children.iter().any(|c| c.name == "pci");
                let address = busid.and_then(PciAddress::parse);
                if let (true, Some(address)) = (is_switch, address) {
                    switches.push(address);
                    walk(child, numa, switches, busid, gpus, nics);
                    switches.pop();
                } else {
                    walk(child, numa, switches, busid, gpus, nics);
                }
            }
            "gpu" => gpus.push(Placed {
                what: NcclGpu {
                    pci_bus_id: bus.unwrap_or_default().to_string(),
                    index: None,
                    numa_node: numa,
                    gdr: child.flag("gdr"),
                },
                place: place(switches),
            }),
            "nic" => {
                for net in child.children.iter().filter(|n| n.name == "net") {
                    nics.push(Placed {
                        what: NcclNic {
                            name: net.attribute("name").unwrap_or("?").to_string(),
                            pci_bus_id: bus.map(str::to_string),
                            numa_node: numa,
                            speed_mbps: net.number("speed"),
                            gdr: net.flag("gdr"),
                        },
                        place: place(switches),
                    });
                }
            }
            _ => {}
        }
    }
}

impl NcclView {
    /// NCCL's dump `xml` (from `source`) beside `topology`'s host 0.
    pub fn compare(xml: &str, source: &str, topology: &Topology) -> Result<NcclView> {
        let system = parse_xml(xml).map_err(|why| {
            Error::usage(format!(
                "{source} is not an NCCL topology dump peerlink can read: {why}"
            ))
        })?;
        let (mut gpus, nics) = devices(&system);
        for g in &mut gpus {
            g.what.index = our_gpu(topology, &g.what.pci_bus_id);
        }
        let paths = gpu_nic_paths(topology, &gpus, &nics);
        let mut disagreements = gpu_disagreements(topology, &gpus);
        disagreements.extend(nic_disagreements(topology, &nics));
        disagreements.extend(path_disagreements(&gpus, &paths));
        disagreements.extend(gpudirect_disagreement(topology, &nics));
        Ok(NcclView {
            source: source.to_string(),
            gpus: gpus.into_iter().map(|g| g.what).collect(),
            nics: nics.into_iter().map(|n| n.what).collect(),
            paths,
            disagreements,
        })
    }
}

/// The index of host 0's GPU at PCI address `bus`, if peerlink has one there.
fn our_gpu(topology: &Topology, bus: &str) -> Option<usize> {
    let address = PciAddress::parse(bus)?;
    topology
        .devices
        .iter()
        .filter(|d| topology.host_of(d.index) == 0)
        .find(|d| PciAddress::parse(&d.pci_bus_id) == Some(address))
        .map(|d| d.index)
}

/// The index of host 0's RDMA NIC named `name`, if peerlink has one.
fn our_nic(topology: &Topology, name: &str) -> Option<usize> {
    topology
        .network
        .as_ref()?
        .nics
        .iter()
        .find(|n| n.host == 0 && n.name == name)
        .map(|n| n.index)
}

/// Every GPU ↔ NIC path of the dump, NCCL's class beside peerlink's where peerlink knows both ends.
fn gpu_nic_paths(
    topology: &Topology,
    gpus: &[Placed<NcclGpu>],
    nics: &[Placed<NcclNic>],
) -> Vec<NcclPath> {
    let ours = |gpu: Option<usize>, nic: &str| {
        let (gpu, nic) = gpu.zip(our_nic(topology, nic))?;
        let paths = &topology.network.as_ref()?.gpu_nics;
        paths
            .iter()
            .find(|p| p.gpu == gpu && p.nic == nic)
            .map(|p| p.link)
    };
    let mut paths = Vec::new();
    for g in gpus {
        for n in nics {
            let nccl = n.place.class_to(&g.place);
            let peerlink = ours(g.what.index, &n.what.name);
            paths.push(NcclPath {
                gpu: g.what.pci_bus_id.clone(),
                nic: n.what.name.clone(),
                nccl,
                peerlink,
                agree: peerlink.is_none_or(|ours| same_class(ours, nccl)),
            });
        }
    }
    paths
}

/// GPUs NCCL sees that peerlink does not, then host 0's GPUs NCCL's dump lacks.
fn gpu_disagreements(topology: &Topology, gpus: &[Placed<NcclGpu>]) -> Vec<String> {
    let unknown = gpus.iter().filter(|g| g.what.index.is_none()).map(|g| {
        format!(
            "NCCL sees a GPU at {} that peerlink does not",
            g.what.pci_bus_id
        )
    });
    let missing = topology
        .devices
        .iter()
        .filter(|d| topology.host_of(d.index) == 0)
        .filter(|d| !gpus.iter().any(|g| g.what.index == Some(d.index)))
        .map(|d| {
            format!(
                "NCCL's dump has no GPU {} ({}): NCCL ran over other GPUs, or the dump is of \
                 another host",
                d.index, d.pci_bus_id
            )
        });
    unknown.chain(missing).collect()
}

/// Ports NCCL uses that are no RDMA NIC here, then host 0's RDMA NICs NCCL does not use.
fn nic_disagreements(topology: &Topology, nics: &[Placed<NcclNic>]) -> Vec<String> {
    let unknown = nics
        .iter()
        .filter(|n| our_nic(topology, &n.what.name).is_none())
        .map(|n| {
            format!(
                "NCCL uses a network port {} that is no RDMA NIC here{}",
                n.what.name,
                if n.what.gdr == Some(true) {
                    ""
                } else {
                    " (a socket interface: NCCL's fallback, without GPUDirect RDMA)"
                }
            )
        });
    let unused = topology
        .network
        .iter()
        .flat_map(|net| net.nics.iter().filter(|n| n.host == 0))
        .filter(|nic| !nics.iter().any(|n| n.what.name == nic.name))
        .map(|nic| {
            format!(
                "NCCL does not use the RDMA NIC {}: its port is down, or NCCL_IB_HCA leaves \
                 it out",
                nic.name
            )
        });
    unknown.chain(unused).collect()
}

/// The paths whose classes differ, one sentence each.
fn path_disagreements(gpus: &[Placed<NcclGpu>], paths: &[NcclPath]) -> Vec<String> {
    paths
        .iter()
        .filter(|p| !p.agree)
        .map(|p| {
            let index = gpus.iter().find(|g| g.what.pci_bus_id == p.gpu);
            format!(
                "GPU {}({}) ↔ {}: NCCL sees {}, peerlink {}",
                index
                    .and_then(|g| g.what.index)
                    .map_or(String::new(), |i| format!("{i} ")),
                p.gpu,
                p.nic,
                p.nccl,
                p.peerlink.map_or("nothing".into(), |l| l.to_string())
            )
        })
        .collect()
}

/// Where NCCL and peerlink differ on GPUDirect RDMA: only where both sides have RDMA NICs (a
/// socket interface never reaches GPU memory).
fn gpudirect_disagreement(topology: &Topology, nics: &[Placed<NcclNic>]) -> Option<String> {
    let net = topology
        .network
        .as_ref()
        .filter(|net| !net.nics.is_empty())?;
    let nccl_gdr = nics.iter().any(|n| n.what.gdr == Some(true));
    (net.gpudirect.available == Some(!nccl_gdr) && !nics.is_empty()).then(|| {
        format!(
            "GPUDirect RDMA: NCCL's network {} reach GPU memory, peerlink finds it {} ({})",
            if nccl_gdr { "can" } else { "cannot" },
            if nccl_gdr { "unavailable" } else { "available" },
            net.gpudirect.how
        )
    })
}

/// Whether peerlink's class and NCCL's say the same: NCCL has no `NODE`, it calls that `PHB`.
fn same_class(peerlink: Link, nccl: Link) -> bool {
    peerlink == nccl || (peerlink == Link::Node && nccl == Link::Phb)
}

/// The text of a dump NCCL wrote, or a sentence saying why it cannot be read.
/// Read as every input file is ([`files::read_text`]: a regular file, size-capped).
pub fn read_dump(file: &Path) -> Result<String> {
    files::read_text(file).map_err(|why| {
        Error::usage(format!(
            "NCCL's topology dump {} {why}; NCCL writes it when a communicator is made with \
             NCCL_TOPO_DUMP_FILE set",
            file.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::Preset;

    const DUMP: &str = include_str!("../../tests/fixtures/nccl/dgx-h100-topo.xml");

    fn view() -> NcclView {
        let host = Preset::load("2x-dgx-h100").unwrap().topology();
        NcclView::compare(DUMP, "dgx-h100-topo.xml", &host).unwrap()
    }

    #[test]
    fn the_dump_is_read_into_gpus_and_ports_with_nccls_classes() {
        let v = view();
        assert_eq!(v.gpus.len(), 8);
        assert_eq!(v.gpus[0].pci_bus_id, "0000:1b:00.0");
        assert_eq!(v.gpus[0].index, Some(0));
        assert_eq!(v.gpus[0].gdr, Some(true));
        assert_eq!(v.gpus[7].numa_node, Some(1));
        let names: Vec<&str> = v.nics.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names.len(), 7, "{names:?}");
        assert!(!names.contains(&"mlx5_7"), "{names:?}");
        let mlx5_0 = v.nics.iter().find(|n| n.name == "mlx5_0").unwrap();
        assert_eq!(mlx5_0.speed_mbps, Some(400000.0));
        assert_eq!(mlx5_0.pci_bus_id.as_deref(), Some("0000:1a:00.0"));
        let path = |gpu: &str, nic: &str| {
            v.paths
                .iter()
                .find(|p| p.gpu == gpu && p.nic == nic)
                .unwrap()
                .clone()
        };
        // Under one switch; under the same socket's other switch (NCCL's PHB, peerlink's NODE:
        // agreed); across sockets.
        let same = path("0000:1b:00.0", "mlx5_0");
        assert_eq!(
            (same.nccl, same.peerlink, same.agree),
            (Link::Pix, Some(Link::Pix), true)
        );
        let node = path("0000:1b:00.0", "mlx5_1");
        assert_eq!(
            (node.nccl, node.peerlink, node.agree),
            (Link::Phb, Some(Link::Node), true)
        );
        let sys = path("0000:1b:00.0", "mlx5_6");
        assert_eq!((sys.nccl, sys.agree), (Link::Sys, true));
    }

    #[test]
    fn disagreements_are_named_one_sentence_each() {
        let v = view();
        // The canned dump moves mlx5_3 under GPU 2's switch and leaves mlx5_7 out.
        assert_eq!(v.disagreements.len(), 3, "{:#?}", v.disagreements);
        assert!(
            v.disagreements
                .iter()
                .any(|d| d.starts_with("NCCL does not use the RDMA NIC mlx5_7")),
            "{:#?}",
            v.disagreements
        );
        assert!(
            v.disagreements
                .iter()
                .any(|d| d == "GPU 3 (0000:61:00.0) ↔ mlx5_3: NCCL sees PHB, peerlink PIX"),
            "{:#?}",
            v.disagreements
        );
        assert!(
            v.disagreements
                .iter()
                .any(|d| d == "GPU 2 (0000:52:00.0) ↔ mlx5_3: NCCL sees PIX, peerlink NODE"),
            "{:#?}",
            v.disagreements
        );
    }

    #[test]
    fn nccl_without_gpudirect_and_a_socket_fallback_are_named() {
        let host = Preset::load("2x-dgx-h100").unwrap().topology();
        let no_gdr = DUMP.replace("gdr=\"1\"/>", "gdr=\"0\"/>");
        let v = NcclView::compare(&no_gdr, "x.xml", &host).unwrap();
        assert!(
            v.disagreements
                .iter()
                .any(|d| d.starts_with("GPUDirect RDMA: NCCL's network cannot reach GPU memory")),
            "{:#?}",
            v.disagreements
        );
        // A virtual interface hangs from the CPU: no PCI place, NCCL's fallback to sockets.
        let socket = DUMP.replacen(
            "<cpu host_hash=\"0x9e1b2f7c4d5a6b38\" numaid=\"0\"",
            "<cpu numaid=\"0\"><nic><net name=\"eth0\" dev=\"0\" speed=\"10000\" gdr=\"0\"/></nic></cpu>\n  <cpu host_hash=\"0x9e1b2f7c4d5a6b38\" numaid=\"0\"",
            1,
        );
        let v = NcclView::compare(&socket, "x.xml", &host).unwrap();
        let eth0 = v.nics.iter().find(|n| n.name == "eth0").unwrap();
        assert_eq!(
            (eth0.pci_bus_id.as_deref(), eth0.speed_mbps),
            (None, Some(10000.0))
        );
        assert!(
            v.disagreements
                .iter()
                .any(|d| d.contains("eth0") && d.contains("a socket interface")),
            "{:#?}",
            v.disagreements
        );
    }

    #[test]
    fn a_dump_of_another_host_disagrees_on_every_gpu() {
        let host = Preset::load("dgx1-v100").unwrap().topology();
        let v = NcclView::compare(DUMP, "x.xml", &host).unwrap();
        assert!(v.gpus.iter().all(|g| g.index.is_none()));
        assert!(v.disagreements.len() >= 16, "{:#?}", v.disagreements);
    }

    #[test]
    fn broken_xml_is_refused_with_where_it_breaks() {
        let host = Preset::load("dgx-h100").unwrap().topology();
        for (text, needle) in [
            ("<system><cpu numaid=\"0\"></system>", "closes an element"),
            ("<system><cpu numaid=\"0\">", "never closed"),
            ("<cpu/>", "no <system>"),
            ("<system><pci busid=0000></pci></system>", "quoted value"),
        ] {
            let err = NcclView::compare(text, "bad.xml", &host).unwrap_err();
            assert_eq!(err.exit_code(), 2);
            assert!(err.to_string().contains(needle), "{err}");
            assert!(err.to_string().contains("bad.xml"), "{err}");
        }
    }
}
