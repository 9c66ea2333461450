//! `peerlink topo`: the topology as `nvidia-smi topo -m`-style matrices.

use super::export::{Records, Tables};
use super::table::{matrix, plain};
use crate::document::topo::TopoDocument;
use crate::topology::nccl_view::NcclView;
use crate::topology::network::{FabricKind, Network};
use crate::topology::{runs_text, Device, Link, Pair, Warning};
use comfy_table::CellAlignment;
use std::fmt::Write;

impl Tables for TopoDocument {
    fn tables(&self) -> Vec<Records> {
        vec![
            Records::of("devices", &self.devices),
            Records::of("pairs", &self.pairs),
            Records::of("warnings", &self.warnings),
        ]
    }
}

/// The human-readable report, NCCL's view beside it where the document holds one.
pub fn text(doc: &TopoDocument) -> String {
    let mut out = super::opening(&doc.header.source);
    let _ = writeln!(
        out,
        "{} GPU{} ({}{})\n",
        doc.devices.len(),
        if doc.devices.len() == 1 { "" } else { "s" },
        doc.header.source,
        doc.header
            .driver_version
            .as_deref()
            .map(|v| format!(", driver {v}"))
            .unwrap_or_default()
    );
    let _ = writeln!(out, "{}\n", devices_table(&doc.devices));
    out.push_str(&matrices(doc));
    if let Some(net) = &doc.network {
        out.push_str(&network_text(net));
    }
    let _ = writeln!(out, "{}", legend(&doc.pairs));
    out.push_str(&warnings_text(&doc.warnings));
    if let Some(view) = &doc.nccl {
        out.push_str(&nccl_text(view));
    }
    out
}

/// The link and P2P matrices, row → column.
fn matrices(doc: &TopoDocument) -> String {
    let indices: Vec<usize> = doc.devices.iter().map(|d| d.index).collect();
    let links = matrix(&indices, false, |s, d| {
        doc.pair(s, d)
            .map_or_else(|| "?".to_string(), |p| p.link.to_string())
    });
    let p2p = matrix(&indices, false, |s, d| match doc.pair(s, d) {
        Some(p) if p.p2p => format!("OK/{}{}", p.perf_rank, if p.atomics { "/A" } else { "" }),
        Some(p) if p.link.crosses_hosts() => "-".to_string(),
        Some(_) => "NS".to_string(),
        None => "?".to_string(),
    });
    format!("Links\n{links}\n\nP2P access (row → column)\n{p2p}\n\n")
}

/// What is wrong, or that nothing is.
fn warnings_text(found: &[Warning]) -> String {
    if found.is_empty() {
        return "No problems found.\n".to_string();
    }
    let mut out = String::from("Warnings:\n");
    for w in found {
        let _ = writeln!(out, "  [{}] {}", w.code, w.message);
    }
    out
}

fn devices_table(devices: &[Device]) -> comfy_table::Table {
    let header = [
        "GPU",
        "Name",
        "PCI bus id",
        "NUMA",
        "CPU affinity",
        "Memory",
        "CC",
        "CEs",
        "MIG",
        "UUID",
    ];
    let mut table = plain(header.iter().map(|h| h.to_string()).collect());
    for d in devices {
        let numa = match d.numa_node {
            Some(n) => format!("{n} ({})", d.numa_source),
            None => "N/A".to_string(),
        };
        table.add_row(vec![
            d.index.to_string(),
            d.name.clone(),
            d.pci_bus_id.clone(),
            numa,
            d.cpu_affinity.clone().unwrap_or_else(|| "N/A".into()),
            format!("{:.0} GiB", d.memory_bytes as f64 / (1u64 << 30) as f64),
            d.compute_capability.clone(),
            d.copy_engines.to_string(),
            if d.mig_enabled { "on" } else { "off" }.to_string(),
            d.uuid.clone(),
        ]);
    }
    table
}

/// The hosts, their RDMA NICs, how each GPU reaches them, and GPUDirect RDMA.
fn network_text(net: &Network) -> String {
    let mut out = String::new();
    if net.hosts.len() > 1 {
        let _ = writeln!(out, "Hosts: {}\n", hosts_line(net));
    }
    if net.nics.is_empty() {
        let _ = writeln!(
            out,
            "RDMA NICs: no RDMA NIC found (/sys/class/infiniband is empty): between hosts NCCL \
             would fall back to TCP sockets, without GPUDirect RDMA\n"
        );
        return out;
    }
    let _ = writeln!(out, "RDMA NICs ({})\n{}\n", net.source, nics_table(net));
    let _ = writeln!(
        out,
        "GPU ↔ NIC (- : another host's NIC)\n{}\n",
        gpu_nic_table(net)
    );
    let _ = writeln!(out, "{}\n", nearest_table(net));
    out.push_str(&gpudirect_lines(net));
    out.push('\n');
    out
}

/// Each host with its GPUs and NICs.
fn hosts_line(net: &Network) -> String {
    let hosts: Vec<String> = net
        .hosts
        .iter()
        .map(|h| {
            format!(
                "{} (GPUs {}, NICs {})",
                h.name,
                list(&h.gpus),
                list(&h.nics)
            )
        })
        .collect();
    hosts.join("; ")
}

/// A row per RDMA NIC: where it sits and what its port says.
fn nics_table(net: &Network) -> comfy_table::Table {
    let shown = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut nics = plain(
        [
            "NIC",
            "Host",
            "Name",
            "PCI bus id",
            "NUMA",
            "Netdev",
            "Link",
            "Rate",
            "State",
            "Rail",
        ]
        .map(String::from)
        .to_vec(),
    );
    for nic in &net.nics {
        nics.add_row(vec![
            format!("NIC{}", nic.index),
            net.hosts
                .get(nic.host)
                .map_or_else(|| nic.host.to_string(), |h| h.name.clone()),
            nic.name.clone(),
            shown(&nic.pci_bus_id),
            shown(&nic.numa_node.map(|n| n.to_string())),
            if nic.netdevs.is_empty() {
                "-".into()
            } else {
                nic.netdevs.join(",")
            },
            shown(&nic.link_layer),
            shown(&nic.rate_gbit.map(|r| format!("{r} Gb/s"))),
            shown(&nic.state),
            shown(&nic.rail.map(|r| r.to_string())),
        ]);
    }
    nics
}

/// The path class from every GPU to every NIC.
fn gpu_nic_table(net: &Network) -> comfy_table::Table {
    let gpus: Vec<usize> = net.hosts.iter().flat_map(|h| h.gpus.clone()).collect();
    let mut header = vec![String::new()];
    header.extend(net.nics.iter().map(|n| format!("NIC{}", n.index)));
    let mut paths = plain(header);
    for &gpu in &gpus {
        let mut row = vec![format!("GPU{gpu}")];
        row.extend(net.nics.iter().map(|nic| {
            net.gpu_nics
                .iter()
                .find(|p| p.gpu == gpu && p.nic == nic.index)
                .map_or_else(|| "-".to_string(), |p| p.link.to_string())
        }));
        paths.add_row(row);
    }
    for column in paths.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    paths
}

/// Each GPU's nearest NICs, and whether GPUDirect RDMA through them pays.
fn nearest_table(net: &Network) -> comfy_table::Table {
    let mut nearest = plain(
        ["GPU", "Nearest NIC", "Path", "GPUDirect RDMA worth it"]
            .map(String::from)
            .to_vec(),
    );
    for n in &net.nearest {
        let names: Vec<String> = n
            .nics
            .iter()
            .filter_map(|&i| net.nics.get(i))
            .map(|nic| nic.name.clone())
            .collect();
        nearest.add_row(vec![
            n.gpu.to_string(),
            names.join(", "),
            n.link.to_string(),
            if n.gpudirect_benefit {
                "yes".into()
            } else {
                "no: the nearest NIC is across the CPU".into()
            },
        ]);
    }
    nearest
}

/// Whether GPUDirect RDMA is available, and the network's shape where known.
fn gpudirect_lines(net: &Network) -> String {
    let available = match net.gpudirect.available {
        Some(true) => "available",
        Some(false) => "unavailable",
        None => "unknown",
    };
    let mut out = format!("GPUDirect RDMA: {available} ({})\n", net.gpudirect.how);
    if let Some(f) = &net.fabric {
        let shape = match f.kind {
            FabricKind::Rail => format!(
                "rail-optimised (NIC i of every host on leaf switch i), NIC to NIC {} µs, {} µs \
                 more between rails through the spine",
                f.latency_us, f.spine_latency_us
            ),
            FabricKind::FatTree => format!("fat tree, NIC to NIC {} µs", f.latency_us),
        };
        let _ = writeln!(out, "Network: {shape}");
    }
    out
}

/// NCCL's view of the GPU ↔ NIC paths beside peerlink's, and where they differ.
fn nccl_text(view: &NcclView) -> String {
    let mut out = format!("\nNCCL's view ({})\n", view.source);
    let mut header = vec![String::new()];
    header.extend(view.nics.iter().map(|n| n.name.clone()));
    let mut paths = plain(header);
    for gpu in &view.gpus {
        let mut row = vec![gpu
            .index
            .map_or_else(|| gpu.pci_bus_id.clone(), |i| format!("GPU{i}"))];
        row.extend(view.nics.iter().map(|nic| {
            let path = view
                .paths
                .iter()
                .find(|p| p.gpu == gpu.pci_bus_id && p.nic == nic.name);
            match path {
                Some(p) if !p.agree => format!(
                    "{}≠{}",
                    p.nccl,
                    p.peerlink.map_or("-".into(), |l| l.to_string())
                ),
                Some(p) => p.nccl.to_string(),
                None => "-".into(),
            }
        }));
        paths.add_row(row);
    }
    for column in paths.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(
        out,
        "{paths}\n  (NCCL's class; A≠B where NCCL sees A and peerlink B; NCCL's PHB covers \
         peerlink's NODE: it has no host bridges)\n"
    );
    if view.disagreements.is_empty() {
        let _ = writeln!(out, "NCCL's view agrees with peerlink's.");
    } else {
        let _ = writeln!(out, "Where NCCL's view differs:");
        for d in &view.disagreements {
            let _ = writeln!(out, "  {d}");
        }
    }
    out
}

/// `0-7`, `0,2,5`: indices as a short list.
fn list(indices: &[usize]) -> String {
    runs_text(indices.iter().copied()).unwrap_or_else(|| "none".into())
}

/// Explains the link classes that appear, and the P2P cell format.
fn legend(pairs: &[Pair]) -> String {
    let mut seen: Vec<Link> = pairs.iter().map(|p| p.link).collect();
    seen.sort();
    seen.dedup();
    let mut out = String::from("Legend:\n  X    = self\n");
    if seen.iter().any(|l| l.is_nvlink()) {
        let _ = writeln!(
            out,
            "  NV#  = NVLink with # bonded links (direct, or through NVSwitch)"
        );
    }
    for &link in seen.iter().filter(|l| !l.is_nvlink()) {
        let _ = writeln!(out, "  {:<4} = {}", link.to_string(), link.meaning());
    }
    out.push_str(
        "  OK/r/A = P2P supported, performance rank r (lower is better), A = native atomics\n  \
         NS     = P2P not supported (copies are staged through host memory)\n",
    );
    if seen.contains(&Link::Net) {
        out.push_str("  -      = another host: no P2P, only the network\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::nics::test_support::FakeSysfs;
    use crate::topology::test_support::three_gpus;
    use crate::topology::Topology;

    #[test]
    fn text_shows_matrix_legend_banner_and_warnings() {
        let text = text(&TopoDocument::new(&three_gpus(), &[0, 1, 2]));
        assert!(text.starts_with("*** SIMULATED host `test`"), "{text}");
        let links_row = text
            .lines()
            .skip_while(|l| !l.starts_with("Links"))
            .skip(2)
            .find(|l| l.trim_start().starts_with("GPU0 "))
            .unwrap();
        let cells: Vec<&str> = links_row.split_whitespace().collect();
        assert_eq!(cells, ["GPU0", "X", "NV2", "SYS"]);
        assert!(text.contains("OK/1/A"), "{text}");
        assert!(text.contains("NS"), "{text}");
        assert!(
            text.contains("SYS  = PCIe across the CPU sockets"),
            "{text}"
        );
        assert!(text.contains("[no-p2p]"), "{text}");
        assert_eq!(
            text.matches("NVLink with").count(),
            1,
            "one legend line for NV#: {text}"
        );
    }

    /// Three GPUs on a fake host whose sysfs holds `nics` (name, PCI path) and the GPUs at the
    /// three test GPUs' bus ids: 0 and 1 under one switch of socket 0, 2 on socket 1.
    fn on_fake_host(nics: &[(&str, &str, i32)]) -> Topology {
        let fake = FakeSysfs::new();
        let switch = "pci0000:00/0000:00:01.0/0000:17:00.0";
        fake.pci(&format!("{switch}/0000:18:00.0/0000:19:00.0"), 0)
            .pci(&format!("{switch}/0000:18:01.0/0000:1a:00.0"), 0)
            .pci("pci0000:80/0000:80:01.0/0000:98:00.0", 1);
        for (name, path, numa) in nics {
            fake.pci(path, *numa)
                .nic(name, path, "200 Gb/sec (4X HDR)", &format!("ib{name}"));
        }
        let mut topo = three_gpus();
        for (d, bus) in topo.devices.iter_mut().zip(["19", "1a", "98"]) {
            d.pci_bus_id = format!("00000000:{bus}:00.0");
        }
        topo.source = crate::topology::Source::Cuda;
        topo.network = Some(crate::topology::nics::discover(
            &fake.sysfs(),
            &topo.devices,
        ));
        topo
    }

    #[test]
    fn a_host_without_rdma_nics_says_so_plainly() {
        let text = text(&TopoDocument::new(&on_fake_host(&[]), &[0, 1, 2]));
        assert!(text.contains("no RDMA NIC found"), "{text}");
        assert!(!text.contains("Hosts:"), "one host needs no list: {text}");
        let doc = serde_json::to_value(crate::document::topo::TopoDocument::new(
            &on_fake_host(&[]),
            &[0, 1, 2],
        ))
        .unwrap();
        assert_eq!(doc["network"]["nics"], serde_json::json!([]));
        assert_eq!(doc["network"]["source"], "sysfs");
    }

    #[test]
    fn nics_show_with_each_gpus_class_and_the_far_gpus_flagged() {
        let topo = on_fake_host(&[(
            "mlx5_0",
            "pci0000:00/0000:00:01.0/0000:17:00.0/0000:18:02.0/0000:1b:00.0",
            0,
        )]);
        let text = text(&TopoDocument::new(&topo, &[0, 1, 2]));
        assert!(text.contains("RDMA NICs (sysfs)"), "{text}");
        assert!(
            text.contains("mlx5_0") && text.contains("200 Gb/s"),
            "{text}"
        );
        assert!(text.contains("ibmlx5_0"), "the netdev: {text}");
        let row = |gpu: &str| {
            text.lines()
                .skip_while(|l| !l.starts_with("GPU ↔ NIC"))
                .find(|l| l.trim_start().starts_with(gpu))
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(row("GPU0"), ["GPU0", "PIX"]);
        assert_eq!(row("GPU2"), ["GPU2", "SYS"]);
        assert!(
            text.contains("no: the nearest NIC is across the CPU"),
            "{text}"
        );
        assert!(text.contains("[nic-across-cpu]"), "{text}");
        assert!(text.contains("GPUDirect RDMA: "), "{text}");
        // Only the GPUs asked for.
        let only = crate::document::topo::TopoDocument::new(&topo, &[2]);
        let net = only.network.unwrap();
        assert_eq!(net.nearest.len(), 1);
        assert_eq!(net.nearest[0].gpu, 2);
    }

    #[test]
    fn real_host_has_no_banner() {
        let mut t = three_gpus();
        t.source = crate::topology::Source::Cuda;
        assert!(!text(&TopoDocument::new(&t, &[0, 1, 2])).contains("SIMULATED"));
    }
}
