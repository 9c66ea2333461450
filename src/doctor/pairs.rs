//! The P2P check of each pair of GPUs: on or off, and where it is off, why — MIG, the CPU sockets
//! or root complexes between them, the IOMMU translating their DMA, ACS redirecting their traffic
//! up to the root complex, a virtual machine — with the evidence for each reason and its fix.

use super::burst::Outcome;
use super::facts::HostFacts;
use super::host::{Acs, Iommu};
use super::{Check, Subject, Verdict};
use crate::topology::{Link, NoP2p, Pair, Topology};
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
            // GPUs of different hosts have no P2P to check: their NICs join them (`topo`).
            if topology.crosses_hosts(a, b) {
                continue;
            }
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

/// One pair's check, in steps: the driver refusing peer access; P2P on (perhaps slowed); MIG or
/// the sockets keeping it off, as the topology says ([`NoP2p`]); otherwise off where it should or
/// need not work, with what the host's files show.
fn pair_check(
    topology: &Topology,
    facts: &HostFacts,
    outcome: &Outcome,
    ab: &Pair,
    ba: &Pair,
) -> Check {
    let pair = PairFindings::new(outcome, ab, ba);
    if let Some(check) = pair.refused(outcome) {
        return check;
    }
    let causes = causes(topology, facts, pair.a, pair.b);
    if ab.p2p && ba.p2p {
        return pair.on(facts, &causes);
    }
    match [ab, ba].iter().find_map(|p| NoP2p::of(topology, p)) {
        Some(NoP2p::Mig) => pair.off_for_mig(topology),
        _ => pair.off(facts, &causes),
    }
}

/// What every finding of a pair starts from: the pair, its link, and the evidence common to all.
struct PairFindings {
    a: usize,
    b: usize,
    link: Link,
    evidence: Vec<String>,
}

impl PairFindings {
    /// The link, the driver's P2P both ways, and what the burst moved over the pair.
    fn new(outcome: &Outcome, ab: &Pair, ba: &Pair) -> PairFindings {
        let (a, b, link) = (ab.src, ab.dst, ab.link);
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
        PairFindings {
            a,
            b,
            link,
            evidence,
        }
    }

    /// The check, with the common evidence and then `more`.
    fn check(&self, verdict: Verdict, finding: impl Into<String>, more: &[String]) -> Check {
        let mut check = Check::new("p2p", Subject::Pair(self.a, self.b), verdict, finding);
        check.evidence = self.evidence.iter().chain(more).cloned().collect();
        check
    }

    /// A failure where the driver reports P2P but refused to enable peer access.
    fn refused(&self, outcome: &Outcome) -> Option<Check> {
        let (a, b) = (self.a, self.b);
        let refused: Vec<String> = outcome
            .refused
            .iter()
            .filter(|(s, d, _)| (*s, *d) == (a, b) || (*s, *d) == (b, a))
            .map(|(s, d, why)| format!("enabling peer access {s}→{d} failed: {why}"))
            .collect();
        (!refused.is_empty()).then(|| {
            self.check(
                Verdict::Fail,
                "the driver reports P2P, but refuses to enable peer access",
                &refused,
            )
            .fix(UNKNOWN_FIX)
        })
    }

    /// P2P on both ways: ok, or a warning where IOMMU translation or ACS redirect is on the way
    /// (slower, and prone to hang).
    fn on(&self, facts: &HostFacts, causes: &[Cause]) -> Check {
        let link = self.link;
        let cause_evidence: Vec<String> = causes.iter().map(|c| c.evidence.clone()).collect();
        let in_the_way: Vec<&Cause> = causes
            .iter()
            .filter(|c| c.fix == IOMMU_FIX || c.fix == ACS_FIX)
            .collect();
        if in_the_way.is_empty() {
            let mut check = self.check(
                Verdict::Ok,
                format!("P2P is on both ways over {link}"),
                &cause_evidence,
            );
            if !link.is_nvlink() {
                check.evidence.extend(unread(facts, self.a, self.b));
            }
            return check;
        }
        let reasons: Vec<&str> = in_the_way.iter().map(|c| c.reason.as_str()).collect();
        let fixes: Vec<&str> = in_the_way.iter().map(|c| c.fix).collect();
        self.check(
            Verdict::Warn,
            format!(
                "P2P is on over {link}, but {}: its traffic is slowed, and may hang",
                reasons.join(", and ")
            ),
            &cause_evidence,
        )
        .fix(dedup(fixes).join("; "))
    }

    /// P2P off because MIG is enabled on one of the GPUs or both.
    fn off_for_mig(&self, topology: &Topology) -> Check {
        let shown: Vec<String> = [self.a, self.b]
            .into_iter()
            .filter(|&d| topology.devices[d].mig_enabled)
            .map(|d| format!("GPU {d}"))
            .collect();
        self.check(
            Verdict::Warn,
            format!(
                "no P2P: MIG is enabled on {}, and {}",
                shown.join(" and "),
                NoP2p::Mig.why()
            ),
            &[],
        )
        .fix("if these GPUs must talk to each other, turn MIG off on them (see the `mig` check)")
    }

    /// P2P off for another reason: a failure over NVLink, a switch or one root complex, where P2P
    /// should work; a warning across root complexes and sockets, where most platforms' drivers
    /// do not offer it.
    fn off(&self, facts: &HostFacts, causes: &[Cause]) -> Check {
        let link = self.link;
        let expected = matches!(link, Link::NvLink(_) | Link::Pix | Link::Pxb | Link::Phb);
        let apart = causes.iter().any(|c| c.fix == APART_FIX);
        let reasons: Vec<&str> = causes.iter().map(|c| c.reason.as_str()).collect();
        let mut more: Vec<String> = causes.iter().map(|c| c.evidence.clone()).collect();
        if !link.is_nvlink() {
            more.extend(unread(facts, self.a, self.b));
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
            let finding = format!(
                "P2P is off over {link}, where it should work: {why}; copies are staged through \
                 host memory"
            );
            return self.check(Verdict::Fail, finding, &more).fix(fix);
        }
        let finding = if link == Link::Sys {
            format!(
                "no P2P over {link}: {}, and {}",
                reasons.join(", and "),
                NoP2p::Sockets.why()
            )
        } else {
            format!(
                "no P2P over {link}: {}; the driver does not route P2P there on most hosts, so \
                 copies are staged through host memory",
                if reasons.is_empty() {
                    "across PCIe root complexes".to_string()
                } else {
                    reasons.join(", and ")
                }
            )
        };
        self.check(Verdict::Warn, finding, &more).fix(APART_FIX)
    }
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
