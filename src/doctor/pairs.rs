//! The P2P check of each pair of GPUs: on or off, and where it is off, why — MIG, the CPU sockets
//! or root complexes between them, the IOMMU translating their DMA, ACS redirecting their traffic
//! up to the root complex, a virtual machine — with the evidence for each reason and its fix.

use super::burst::Outcome;
use super::facts::HostFacts;
use super::host::{Acs, Iommu};
use super::{Check, Subject, Verdict};
use crate::topology::{Link, Pair, Topology};
use crate::units::format_bytes;

pub fn run(
    topology: &Topology,
    facts: &HostFacts,
    devices: &[usize],
    outcome: &Outcome,
) -> Vec<Check> {
    let mut checks = Vec::new();
    for (i, &a) in devices.iter().enumerate() {
        for &b in &devices[i + 1..] {
            let (a, b) = (a.min(b), a.max(b));
            if let (Some(ab), Some(ba)) = (topology.pair(a, b), topology.pair(b, a)) {
                checks.push(pair_check(topology, facts, outcome, ab, ba));
            }
        }
    }
    checks
}

/// Something between two GPUs that keeps P2P off or slow: the evidence, the reason, the fix.
struct Cause {
    evidence: String,
    reason: String,
    fix: &'static str,
}

const IOMMU_FIX: &str = "let the IOMMU pass GPU traffic through: boot with `iommu=pt` (beside \
     `intel_iommu=on` or `amd_iommu=on`), or turn VT-d / AMD-Vi off in the firmware if nothing needs it";
const ACS_FIX: &str = "turn ACS redirect off on those bridges: the firmware's ACS option, or at \
     boot as root `setpci -s <bridge> ECAP_ACS+0x6.w=0000` for each (NVIDIA's and NCCL's \
     troubleshooting guides ask the same)";
const VM_FIX: &str = "ask for the GPUs to be passed through together with the PCIe switch or \
     NVLink between them (a hypervisor that hides it reports no P2P), or use a bare-metal host";
const APART_FIX: &str = "put ranks that talk to each other on GPUs under one CPU socket or root \
     complex, or relay through a GPU linked to both; peerlink's engine stages or relays these copies \
     itself (`peerlink plan` shows how)";
const UNKNOWN_FIX: &str = "compare with `nvidia-smi topo -p2p r`, and look for the driver's \
     reason in the kernel log (`dmesg | grep -i -e nvrm -e iommu -e aer`)";

/// What on the host could keep P2P between `a` and `b` off or slow, with the evidence.
fn causes(topology: &Topology, facts: &HostFacts, a: usize, b: usize) -> Vec<Cause> {
    let mut found = Vec::new();
    let link = topology.pair(a, b).map(|p| p.link);
    if link == Some(Link::Sys) {
        found.push(Cause {
            evidence: "the topology's link is SYS: the CPU sockets' interconnect".into(),
            reason: "they sit under different CPU sockets".into(),
            fix: APART_FIX,
        });
    }
    let bridges = |d: usize| facts.gpu(d).and_then(|g| g.host_bridge.clone());
    if let (Some(x), Some(y)) = (bridges(a), bridges(b)) {
        if x != y && link != Some(Link::Sys) {
            found.push(Cause {
                evidence: format!(
                    "sysfs{}: GPU {a} under {x}, GPU {b} under {y}",
                    facts.under()
                ),
                reason: "they sit under different PCIe root complexes".into(),
                fix: APART_FIX,
            });
        }
    }
    if link.is_some_and(Link::is_nvlink) {
        // The IOMMU and ACS govern PCIe traffic; NVLink does not cross them.
        return found;
    }
    let translated: Vec<String> = [a, b]
        .into_iter()
        .filter_map(|d| match facts.gpu(d).and_then(|g| g.iommu.clone()) {
            Some((Iommu::Translating, evidence)) => Some(format!("GPU {d}: {evidence}")),
            _ => None,
        })
        .collect();
    if !translated.is_empty() {
        found.push(Cause {
            evidence: format!("{}{}", translated.join("; "), facts.under()),
            reason: "the IOMMU translates their DMA (no passthrough)".into(),
            fix: IOMMU_FIX,
        });
    }
    let redirecting = facts.redirecting(a, b);
    if !redirecting.is_empty() {
        let shown: Vec<String> = redirecting
            .iter()
            .map(|(bridge, acs)| match &acs.acs {
                Acs::Control(c) => {
                    format!("{} {} ({})", bridge.sysfs_form(), c.describe(), acs.source)
                }
                _ => bridge.sysfs_form(),
            })
            .collect();
        let names: Vec<String> = redirecting.iter().map(|(b, _)| b.sysfs_form()).collect();
        found.push(Cause {
            evidence: format!("ACS{}: {}", facts.under(), shown.join("; ")),
            reason: format!(
                "ACS on {} redirects their peer traffic up to the root complex",
                names.join(", ")
            ),
            fix: ACS_FIX,
        });
    }
    if facts.vm.is_vm() == Some(true) {
        found.push(Cause {
            evidence: facts.vm.evidence().join("; "),
            reason: "the host is a virtual machine".into(),
            fix: VM_FIX,
        });
    }
    found
}

/// The evidence about the host that could not be read, for a pair over PCIe.
fn unread(facts: &HostFacts, a: usize, b: usize) -> Vec<String> {
    if let Some(why) = &facts.unread {
        return vec![format!("the host's files were not read: {why}")];
    }
    let mut out = Vec::new();
    for d in [a, b] {
        if facts.gpu(d).is_none_or(|g| g.iommu.is_none()) {
            out.push(format!("GPU {d}: no IOMMU state in sysfs{}", facts.under()));
        }
    }
    for bridge in facts.bridges_between(a, b).unwrap_or_default() {
        if let Some(Acs::Unreadable(why)) = facts.bridges.get(&bridge).map(|x| &x.acs) {
            out.push(format!("ACS of {} not read: {why}", bridge.sysfs_form()));
        }
    }
    out
}

fn direction(p: &Pair) -> String {
    if p.p2p {
        format!(
            "{}→{} yes (performance rank {}{})",
            p.src,
            p.dst,
            p.perf_rank,
            if p.atomics { ", native atomics" } else { "" }
        )
    } else {
        format!("{}→{} no", p.src, p.dst)
    }
}

fn pair_check(
    topology: &Topology,
    facts: &HostFacts,
    outcome: &Outcome,
    ab: &Pair,
    ba: &Pair,
) -> Check {
    let (a, b, link) = (ab.src, ab.dst, ab.link);
    let subject = Subject::Pair(a, b);
    let mut evidence = vec![
        format!("link {link}: {}", link.meaning()),
        format!("the driver's P2P: {}; {}", direction(ab), direction(ba)),
    ];
    if let Ok(burst) = &outcome.burst {
        let moved = [[a, b], [b, a]]
            .iter()
            .filter(|p| burst.pairs.contains(p))
            .count();
        if moved > 0 {
            evidence.push(format!(
                "the burst moved {} over it in {} direction{} with peer access on",
                format_bytes(burst.bytes_per_pair),
                moved,
                if moved == 1 { "" } else { "s" }
            ));
        }
    }
    let with = |mut check: Check, more: &[String]| {
        check.evidence = evidence.iter().chain(more).cloned().collect();
        check
    };
    let refused: Vec<String> = outcome
        .refused
        .iter()
        .filter(|(s, d, _)| (*s, *d) == (a, b) || (*s, *d) == (b, a))
        .map(|(s, d, why)| format!("enabling peer access {s}→{d} failed: {why}"))
        .collect();
    if !refused.is_empty() {
        let check = Check::new(
            "p2p",
            subject,
            Verdict::Fail,
            "the driver reports P2P, but refuses to enable peer access",
        );
        return with(check, &refused).fix(UNKNOWN_FIX);
    }
    let causes = causes(topology, facts, a, b);
    let cause_evidence: Vec<String> = causes.iter().map(|c| c.evidence.clone()).collect();
    if ab.p2p && ba.p2p {
        // On, but IOMMU translation or ACS redirect on the way: slower, and prone to hang.
        let in_the_way: Vec<&Cause> = causes
            .iter()
            .filter(|c| c.fix == IOMMU_FIX || c.fix == ACS_FIX)
            .collect();
        if in_the_way.is_empty() {
            let mut check = Check::new(
                "p2p",
                subject,
                Verdict::Ok,
                format!("P2P is on both ways over {link}"),
            );
            check = with(check, &cause_evidence);
            if !link.is_nvlink() {
                check.evidence.extend(unread(facts, a, b));
            }
            return check;
        }
        let reasons: Vec<&str> = in_the_way.iter().map(|c| c.reason.as_str()).collect();
        let fixes: Vec<&str> = in_the_way.iter().map(|c| c.fix).collect();
        let check = Check::new(
            "p2p",
            subject,
            Verdict::Warn,
            format!(
                "P2P is on over {link}, but {}: its traffic is slowed, and may hang",
                reasons.join(", and ")
            ),
        );
        return with(check, &cause_evidence).fix(dedup(fixes).join("; "));
    }
    let mig: Vec<usize> = [a, b]
        .into_iter()
        .filter(|&d| topology.devices[d].mig_enabled)
        .collect();
    if !mig.is_empty() {
        let shown: Vec<String> = mig.iter().map(|d| format!("GPU {d}")).collect();
        let check = Check::new(
            "p2p",
            subject,
            Verdict::Warn,
            format!(
                "no P2P: MIG is enabled on {}, and MIG instances cannot use P2P",
                shown.join(" and ")
            ),
        );
        return with(check, &[]).fix(
            "if these GPUs must talk to each other, turn MIG off on them (see the `mig` check)",
        );
    }
    // Over NVLink, a switch or one root complex P2P should work; across root complexes and
    // sockets most platforms' drivers do not offer it.
    let expected = matches!(link, Link::NvLink(_) | Link::Pix | Link::Pxb | Link::Phb);
    let apart = causes.iter().any(|c| c.fix == APART_FIX);
    let reasons: Vec<&str> = causes.iter().map(|c| c.reason.as_str()).collect();
    let mut more = cause_evidence.clone();
    if !link.is_nvlink() {
        more.extend(unread(facts, a, b));
    }
    if expected && !apart {
        let why = if reasons.is_empty() {
            "the driver gives no reason peerlink can see".to_string()
        } else {
            reasons.join(", and ")
        };
        let fixes: Vec<&str> = causes.iter().map(|c| c.fix).collect();
        let fix = if fixes.is_empty() {
            UNKNOWN_FIX.to_string()
        } else {
            dedup(fixes).join("; ")
        };
        let check = Check::new(
            "p2p",
            subject,
            Verdict::Fail,
            format!("P2P is off over {link}, where it should work: {why}; copies are staged through host memory"),
        );
        return with(check, &more).fix(fix);
    }
    let check = Check::new(
        "p2p",
        subject,
        Verdict::Warn,
        format!(
            "no P2P over {link}: {}; the driver does not route P2P there on most hosts, so copies \
             are staged through host memory",
            if reasons.is_empty() {
                "across PCIe root complexes".to_string()
            } else {
                reasons.join(", and ")
            }
        ),
    );
    with(check, &more).fix(APART_FIX)
}

/// The fixes, each once, in order.
fn dedup(fixes: Vec<&str>) -> Vec<&str> {
    let mut seen = Vec::new();
    for fix in fixes {
        if !seen.contains(&fix) {
            seen.push(fix);
        }
    }
    seen
}
