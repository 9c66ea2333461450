//! `peerlink topo`: the topology as `nvidia-smi topo -m`-style matrices.

use super::table::{matrix, plain};
use crate::topology::{warnings, Link, Topology};
use std::fmt::Write;

/// The human-readable report.
pub fn text(topo: &Topology, selected: &[usize]) -> String {
    let topo = topo.restricted_to(selected);
    let mut out = super::opening(&topo.source);
    let _ = writeln!(
        out,
        "{} GPU{} ({}{})\n",
        topo.devices.len(),
        if topo.devices.len() == 1 { "" } else { "s" },
        topo.source,
        topo.driver_version
            .as_deref()
            .map(|v| format!(", driver {v}"))
            .unwrap_or_default()
    );
    let _ = writeln!(out, "{}\n", devices_table(&topo));

    let indices: Vec<usize> = topo.devices.iter().map(|d| d.index).collect();
    let links = matrix(&indices, false, |s, d| {
        topo.pair(s, d)
            .map_or_else(|| "?".to_string(), |p| p.link.to_string())
    });
    let _ = writeln!(out, "Links\n{links}\n");

    let p2p = matrix(&indices, false, |s, d| match topo.pair(s, d) {
        Some(p) if p.p2p => format!("OK/{}{}", p.perf_rank, if p.atomics { "/A" } else { "" }),
        Some(_) => "NS".to_string(),
        None => "?".to_string(),
    });
    let _ = writeln!(out, "P2P access (row → column)\n{p2p}\n");
    let _ = writeln!(out, "{}", legend(&topo));

    let found = warnings(&topo);
    if found.is_empty() {
        let _ = writeln!(out, "No problems found.");
    } else {
        let _ = writeln!(out, "Warnings:");
        for w in found {
            let _ = writeln!(out, "  [{}] {}", w.code, w.message);
        }
    }
    out
}

fn devices_table(topo: &Topology) -> comfy_table::Table {
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
    for d in &topo.devices {
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

/// Explains the link classes that appear, and the P2P cell format.
fn legend(topo: &Topology) -> String {
    let mut seen: Vec<Link> = topo.pairs.iter().map(|p| p.link).collect();
    seen.sort();
    seen.dedup();
    let mut out = String::from("Legend:\n  X    = self\n");
    if seen.iter().any(|l| l.is_nvlink()) {
        let _ = writeln!(
            out,
            "  NV#  = NVLink with # bonded links (direct, or through NVSwitch)"
        );
    }
    for link in seen.into_iter().filter(|l| !l.is_nvlink()) {
        let _ = writeln!(out, "  {:<4} = {}", link.to_string(), link.meaning());
    }
    out.push_str(
        "  OK/r/A = P2P supported, performance rank r (lower is better), A = native atomics\n  \
         NS     = P2P not supported (copies are staged through host memory)\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::test_support::three_gpus;

    #[test]
    fn text_shows_matrix_legend_banner_and_warnings() {
        let text = text(&three_gpus(), &[0, 1, 2]);
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

    #[test]
    fn real_host_has_no_banner() {
        let mut t = three_gpus();
        t.source = crate::topology::Source::Cuda;
        assert!(!text(&t, &[0, 1, 2]).contains("SIMULATED"));
    }
}
