//! The checks of the host: whether it is a virtual machine and what that costs each transfer, and
//! whether CUDA numbers the GPUs in PCI bus order.

use super::facts::HostFacts;
use super::{Check, Subject, Verdict};
use crate::backend::Backend;
use crate::bench::{self, progress::Silent};
use crate::topology::{warnings, Topology};
use crate::Result;

/// The CPU time to queue one peer copy on bare metal, µs: the "CPU latency" of CUDA's
/// p2pBandwidthLatencyTest with P2P on, 1.76–2.16 µs between four NVLink GPUs (docs/reference.md,
/// NVIDIA/cuda-samples#230).
pub const PUBLISHED_ISSUE_US: f64 = 2.0;

pub fn run(backend: &dyn Backend, facts: &HostFacts, devices: &[usize]) -> Result<Vec<Check>> {
    Ok(vec![
        virtual_machine(backend, facts, devices)?,
        device_order(&backend.topology().restricted_to(devices)),
    ])
}

fn virtual_machine(backend: &dyn Backend, facts: &HostFacts, devices: &[usize]) -> Result<Check> {
    let subject = Subject::Host;
    if let Some(why) = &facts.unread {
        return Ok(Check::new(
            "virtual-machine",
            subject,
            Verdict::Info,
            "whether the host is a virtual machine was not read",
        )
        .evidence(why.clone()));
    }
    let mut check = match facts.vm.is_vm() {
        Some(false) => Check::new("virtual-machine", subject, Verdict::Ok, "bare metal"),
        None => Check::new(
            "virtual-machine",
            subject,
            Verdict::Info,
            "whether the host is a virtual machine could not be told",
        ),
        Some(true) => {
            let (finding, evidence) = issue_cost(backend, devices)?;
            Check::new("virtual-machine", subject, Verdict::Info, finding)
                .evidence(evidence)
                .fix(
                    "where the CPU's cost per transfer matters (many small transfers), batch them \
                     or replay them from a CUDA graph (`peerlink plan --messages` shows the gain), \
                     or run on bare metal",
                )
        }
    };
    let mut evidence = facts.vm.evidence();
    evidence.append(&mut check.evidence);
    check.evidence = evidence;
    Ok(check)
}

/// The finding of a virtual machine, with the issue cost measured here against the published
/// bare-metal figure, and the measurement's evidence.
fn issue_cost(backend: &dyn Backend, devices: &[usize]) -> Result<(String, String)> {
    let topology = backend.topology();
    let pair = devices
        .iter()
        .flat_map(|&a| devices.iter().map(move |&b| (a, b)))
        .find(|&(a, b)| topology.pair(a, b).is_some_and(|p| p.p2p));
    let (src, dst) = pair.unwrap_or((devices[0], devices[0]));
    let options = bench::Options {
        tests: Some(vec!["issue-cost".into()]),
        devices: Some(if src == dst {
            vec![src]
        } else {
            vec![src, dst]
        }),
        ..bench::Options::default()
    };
    let report = bench::run(backend, &options, &Silent)?;
    let cell = report
        .tests
        .first()
        .and_then(|t| t.cells.iter().find(|c| c.place.pair() == (src, dst)));
    let label = if topology.is_simulated() {
        "simulated"
    } else {
        "measured"
    };
    Ok(match cell {
        Some(cell) => (
            format!(
                "a virtual machine: queuing a copy costs the CPU {:.2} µs here ({label}), {:.1}× \
                 the ~{PUBLISHED_ISSUE_US} µs published on bare metal",
                cell.value,
                cell.value / PUBLISHED_ISSUE_US
            ),
            format!(
                "bench's issue-cost, GPU {src} → GPU {dst}: median {:.2} µs per copy call, {} \
                 sample{} (min {:.2}, p99 {:.2}); published: p2pBandwidthLatencyTest's CPU \
                 latency, 1.76–2.16 µs (docs/reference.md)",
                cell.value,
                cell.time_us.samples,
                if cell.time_us.samples == 1 { "" } else { "s" },
                cell.time_us.min,
                cell.time_us.p99
            ),
        ),
        None => (
            "a virtual machine (its cost per copy could not be measured)".to_string(),
            format!("bench's issue-cost measured nothing on GPU {src} → GPU {dst}"),
        ),
    })
}

fn device_order(topology: &Topology) -> Check {
    let order: Vec<String> = topology
        .devices
        .iter()
        .map(|d| format!("GPU {} {}", d.index, d.pci_bus_id))
        .collect();
    let evidence = [
        format!("CUDA order: {}", order.join(", ")),
        format!(
            "CUDA_VISIBLE_DEVICES: {}",
            topology.visible_devices.as_deref().unwrap_or("unset")
        ),
    ];
    let out_of_order = warnings(topology)
        .into_iter()
        .find(|w| w.code == "device-order");
    let check = match out_of_order {
        Some(warning) => Check::new(
            "device-order",
            Subject::Host,
            Verdict::Warn,
            warning.message,
        )
        .fix(
            "set CUDA_DEVICE_ORDER=PCI_BUS_ID and list CUDA_VISIBLE_DEVICES in PCI order, or \
                 match GPUs by UUID or PCI bus id, not by index",
        ),
        None => Check::new(
            "device-order",
            Subject::Host,
            Verdict::Ok,
            "CUDA numbers the GPUs in PCI bus order, as nvidia-smi does",
        ),
    };
    evidence.into_iter().fold(check, Check::evidence)
}
