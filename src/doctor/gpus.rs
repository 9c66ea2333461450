//! The checks of each GPU: its PCIe link (read while the burst ran: an idle link slows down on
//! purpose), its NVLinks, its error counters before and after the burst, MIG, persistence mode,
//! and what holds its clocks back.

use super::burst::Outcome;
use super::facts::HostFacts;
use super::{Check, Subject, Verdict};
use crate::backend::health::GpuHealth;
use crate::backend::health::{Counter, PcieLink, Reading};
use crate::topology::Topology;
use crate::units::format_bytes;

pub fn run(
    topology: &Topology,
    facts: &HostFacts,
    devices: &[usize],
    outcome: &Outcome,
) -> Vec<Check> {
    // The reading taken while the burst ran, else the one after it.
    let busy = |i: usize| -> &GpuHealth {
        outcome
            .during
            .as_ref()
            .map_or(&outcome.after[i], |during| &during[i])
    };
    let source = if topology.is_simulated() {
        "the simulated GPU (preset)"
    } else {
        "NVML"
    };
    let mut checks = Vec::new();
    let each = |check: &dyn Fn(usize, usize) -> Check| -> Vec<Check> {
        devices
            .iter()
            .enumerate()
            .map(|(i, &d)| check(i, d))
            .collect()
    };
    checks.extend(each(&|i, d| {
        pcie_link(
            d,
            &busy(i).pcie,
            &outcome.before[i].pcie,
            facts,
            source,
            outcome.during.is_some(),
        )
    }));
    checks.extend(each(&|i, d| nvlink(d, &outcome.after[i], source)));
    checks.extend(each(&|i, d| {
        counters(d, &outcome.before[i], &outcome.after[i], outcome, source)
    }));
    checks.extend(each(&|_, d| {
        mig(d, topology.devices[d].mig_enabled, source)
    }));
    checks.extend(each(&|i, d| {
        persistence(d, &outcome.after[i].persistence_mode, source)
    }));
    checks.extend(each(&|i, d| {
        clocks(d, busy(i), source, outcome.during.is_some())
    }));
    checks
}

const PCIE_FIX: &str = "reseat the GPU (and its riser or cable), check the slot's lane setting \
     and the firmware's PCIe speed setting, and compare `lspci -vvv`'s LnkSta with LnkCap; a link \
     that slows only while idle is power saving, not this";

fn pcie_link(
    gpu: usize,
    busy: &Reading<PcieLink>,
    idle: &Reading<PcieLink>,
    facts: &HostFacts,
    source: &str,
    under_load: bool,
) -> Check {
    let subject = Subject::Gpu(gpu);
    let when = if under_load {
        "while the burst ran"
    } else {
        "with no burst running"
    };
    let (link, mut evidence) = match busy {
        Ok(link) => (*link, vec![format!("{source} {when}: {link}")]),
        Err(why) => {
            let from_sysfs = facts.gpu(gpu).and_then(|g| g.link);
            match from_sysfs {
                Some(l) => {
                    let link = PcieLink {
                        generation: l.generation,
                        width: l.width,
                        max_generation: l.max_generation,
                        max_width: l.max_width,
                    };
                    let evidence = vec![
                        format!("{source}: {why}"),
                        format!(
                            "sysfs{} current/max_link_speed and _width {when}: {link}",
                            facts.under()
                        ),
                    ];
                    (link, evidence)
                }
                None => {
                    let sysfs = facts
                        .unread
                        .clone()
                        .unwrap_or_else(|| format!("no link files in sysfs{}", facts.under()));
                    return Check::new(
                        "pcie-link",
                        subject,
                        Verdict::Info,
                        "the PCIe link could not be read",
                    )
                    .evidence(format!("{source}: {why}"))
                    .evidence(sysfs);
                }
            }
        }
    };
    if let (Ok(idle), true) = (idle, under_load) {
        evidence.push(format!("{source} before the burst (idle): {idle}"));
    }
    if link.is_downgraded() {
        let mut check = Check::new(
            "pcie-link",
            subject,
            Verdict::Fail,
            format!(
                "the PCIe link runs at Gen{} x{}, below its maximum Gen{} x{}: host copies and \
                 P2P over PCIe get a fraction of the rate",
                link.generation, link.width, link.max_generation, link.max_width
            ),
        )
        .fix(PCIE_FIX);
        check.evidence = evidence;
        return check;
    }
    let mut check = Check::new(
        "pcie-link",
        subject,
        Verdict::Ok,
        format!(
            "the PCIe link runs at its maximum, Gen{} x{}",
            link.generation, link.width
        ),
    );
    check.evidence = evidence;
    check
}

const NVLINK_FIX: &str = "check `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e`; on NVSwitch \
     systems that nvidia-fabricmanager runs and what `nvidia-smi -q` says of the fabric; reseat the \
     NVLink bridge, or have the board serviced. A GPU reset (`nvidia-smi -r`, nothing running) \
     retrains the links";

fn nvlink(gpu: usize, health: &GpuHealth, source: &str) -> Check {
    let subject = Subject::Gpu(gpu);
    let ports = match &health.nvlinks {
        Ok(ports) => ports,
        Err(why) => {
            return Check::new(
                "nvlink",
                subject,
                Verdict::Info,
                "the NVLinks could not be read",
            )
            .evidence(format!("{source}: {why}"))
        }
    };
    if ports.is_empty() {
        return Check::new("nvlink", subject, Verdict::Ok, "no NVLink on this GPU")
            .evidence(format!("{source}: no NVLink state for any link"));
    }
    let down: Vec<String> = ports
        .iter()
        .filter(|p| !p.active)
        .map(|p| p.link.to_string())
        .collect();
    let up = ports.len() - down.len();
    let evidence = format!(
        "{source}: {up} of {} links active{}",
        ports.len(),
        if down.is_empty() {
            String::new()
        } else {
            format!("; inactive: {}", down.join(", "))
        }
    );
    // Every link down is at least as bad as one down: a GPU whose fitted links all failed has lost
    // them all, whatever number of GPUs this run selected.
    let (verdict, finding) = if down.is_empty() {
        (Verdict::Ok, format!("all {} NVLinks are up", ports.len()))
    } else if up > 0 {
        (
            Verdict::Fail,
            format!(
                "NVLink {} down ({} of {}): traffic over its links runs that much slower",
                down.join(", "),
                down.len(),
                ports.len()
            ),
        )
    } else {
        (
            Verdict::Fail,
            format!(
                "none of its {} NVLinks is up: its P2P goes over PCIe, or not at all",
                ports.len()
            ),
        )
    };
    let check = Check::new("nvlink", subject, verdict, finding).evidence(evidence);
    if verdict == Verdict::Ok {
        check
    } else {
        check.fix(NVLINK_FIX)
    }
}

fn counters(
    gpu: usize,
    before: &GpuHealth,
    after: &GpuHealth,
    outcome: &Outcome,
    source: &str,
) -> Check {
    let subject = Subject::Gpu(gpu);
    let mut evidence = Vec::new();
    let mut rising = Vec::new();
    let mut unknown = Vec::new();
    let mut ecc_standing = 0;
    for counter in Counter::ALL {
        let (Some(first), Some(second)) =
            (before.counters.get(&counter), after.counters.get(&counter))
        else {
            continue;
        };
        match (first, second) {
            (Ok(first), Ok(second)) => {
                evidence.push(format!("{}: {first} → {second}", counter.name()));
                if second > first {
                    rising.push((counter, second - first));
                } else if counter == Counter::EccUncorrected {
                    ecc_standing = *second;
                }
            }
            (Err(why), _) | (_, Err(why)) => unknown.push(format!("{}: {why}", counter.name())),
        }
    }
    let interval = match &outcome.burst {
        Ok(b) => format!(
            "read {} apart by {source}, a burst of {} over each P2P pair and {} each way to \
             the host in between",
            crate::units::format_seconds(b.interval_s),
            format_bytes(b.bytes_per_pair),
            format_bytes(b.host_bytes_per_gpu)
        ),
        Err(why) => format!("read twice by {source} with no burst in between: {why}"),
    };
    evidence.insert(0, interval);
    evidence.extend(unknown.iter().cloned());
    let (verdict, finding, fix) = if !rising.is_empty() {
        let shown: Vec<String> = rising
            .iter()
            .map(|(c, by)| format!("{} rose by {by}", c.name()))
            .collect();
        let ecc = rising.iter().any(|(c, _)| *c == Counter::EccUncorrected);
        let fix = if ecc {
            "uncorrectable ECC errors during traffic: stop using the GPU, reset it (`nvidia-smi -r`, \
             nothing running) and have it serviced if they come back"
        } else {
            "errors that rise with traffic mean a marginal link: check `nvidia-smi nvlink -e`, reseat \
             the bridge or board, have it serviced; replays slow traffic down before links fail"
        };
        (
            Verdict::Fail,
            format!("{} during the burst", shown.join(", ")),
            Some(fix),
        )
    } else if ecc_standing > 0 {
        (
            Verdict::Warn,
            format!("{ecc_standing} uncorrectable ECC errors since the driver loaded (not rising)"),
            Some(
                "drain the GPU and reset it (`nvidia-smi -r`) so the bad memory is retired; have \
                 it serviced if the count comes back",
            ),
        )
    } else if evidence.len() == 1 + unknown.len() {
        (
            Verdict::Info,
            "no error counter could be read".to_string(),
            None,
        )
    } else if unknown.is_empty() {
        (Verdict::Ok, "no error counter moved".to_string(), None)
    } else {
        let finding = format!(
            "no error counter moved ({} could not be read)",
            unknown.len()
        );
        (Verdict::Ok, finding, None)
    };
    let mut check = Check::new("error-counters", subject, verdict, finding);
    check.evidence = evidence;
    check.fix = fix.map(str::to_string);
    check
}

fn mig(gpu: usize, enabled: bool, source: &str) -> Check {
    let subject = Subject::Gpu(gpu);
    let evidence = format!(
        "{source}: MIG mode {}",
        if enabled {
            "enabled"
        } else {
            "disabled or not supported"
        }
    );
    if !enabled {
        return Check::new("mig", subject, Verdict::Ok, "MIG is off").evidence(evidence);
    }
    Check::new(
        "mig",
        subject,
        Verdict::Warn,
        "MIG is enabled: its instances cannot use P2P or NVLink with other GPUs",
    )
    .evidence(evidence)
    .fix(format!(
        "if this GPU must talk to others, turn MIG off as root with nothing running on it \
         (`nvidia-smi -i {gpu} -mig 0`, then reset the GPU); peerlink never changes it"
    ))
}

fn persistence(gpu: usize, mode: &Reading<bool>, source: &str) -> Check {
    let subject = Subject::Gpu(gpu);
    match mode {
        Ok(true) => Check::new(
            "persistence",
            subject,
            Verdict::Ok,
            "persistence mode is on",
        )
        .evidence(format!("{source}: persistence mode on")),
        Ok(false) => Check::new(
            "persistence",
            subject,
            Verdict::Warn,
            "persistence mode is off: the driver tears the GPU's state down whenever no process \
             holds it, so every run pays its initialisation again",
        )
        .evidence(format!("{source}: persistence mode off"))
        .fix(
            "run nvidia-persistenced (NVIDIA's recommended way), or as root `nvidia-smi -pm 1`; \
             peerlink never changes it",
        ),
        Err(why) => Check::new(
            "persistence",
            subject,
            Verdict::Info,
            "persistence mode could not be read",
        )
        .evidence(format!("{source}: {why}")),
    }
}

fn clocks(gpu: usize, health: &GpuHealth, source: &str, under_load: bool) -> Check {
    let subject = Subject::Gpu(gpu);
    let when = if under_load {
        "while the burst ran"
    } else {
        "with no burst running"
    };
    let events = match &health.clock_events {
        Ok(events) => *events,
        Err(why) => {
            return Check::new(
                "clocks",
                subject,
                Verdict::Info,
                "the clocks' state could not be read",
            )
            .evidence(format!("{source}: {why}"))
        }
    };
    let all: Vec<String> = events
        .events()
        .map(|e| format!("{} ({})", e.name, e.meaning))
        .collect();
    let evidence = format!(
        "{source} clocks event reasons {when}: {}",
        if all.is_empty() {
            "none".to_string()
        } else {
            all.join(", ")
        }
    );
    let slowing: Vec<String> = events
        .events()
        .filter(|e| e.slows_down)
        .map(|e| format!("{} ({})", e.name, e.meaning))
        .collect();
    if slowing.is_empty() {
        return Check::new(
            "clocks",
            subject,
            Verdict::Ok,
            "nothing holds the clocks back",
        )
        .evidence(evidence);
    }
    Check::new(
        "clocks",
        subject,
        Verdict::Warn,
        format!("the clocks are held back: {}", slowing.join(", ")),
    )
    .evidence(evidence)
    .fix(
        "for heat, check the cooling and `nvidia-smi -q -d TEMPERATURE,PERFORMANCE`; for the \
         power cap, `nvidia-smi -q -d POWER`; a power brake comes from the power supply; \
         peerlink never changes clocks or power",
    )
}
