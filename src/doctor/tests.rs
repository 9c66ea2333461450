//! The doctor's verdicts on simulated hosts: healthy presets pass, each fault a preset carries is
//! found by the check it belongs to, and the host's files (a fake tree) explain what they explain.

use super::*;
use crate::backend::sim::{preset_names, Preset, SimBackend};
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor")
}

/// A fixture preset (`tests/fixtures/doctor/<name>.json`).
fn fixture(name: &str) -> Preset {
    let path = fixtures().join(format!("{name}.json"));
    Preset::load(path.to_str().unwrap()).unwrap()
}

fn doctor(preset: &Preset, options: &Options) -> Report {
    run(&SimBackend::from_preset(preset), options).unwrap()
}

fn with_tree(devices: Option<Vec<usize>>) -> Options {
    Options {
        devices,
        host_root: Some(fixtures().join("host")),
    }
}

/// The checks that did not come out ok or info, as (check, subject, verdict).
fn findings(report: &Report) -> Vec<(String, String, Verdict)> {
    report
        .checks
        .iter()
        .filter(|c| c.verdict >= Verdict::Warn)
        .map(|c| (c.check.clone(), c.subject.clone(), c.verdict))
        .collect()
}

fn one<'a>(report: &'a Report, check: &str, subject: &str) -> &'a Check {
    let found: Vec<&Check> = report
        .checks
        .iter()
        .filter(|c| c.check == check && c.subject == subject)
        .collect();
    assert_eq!(found.len(), 1, "{check} {subject}: {:#?}", report.checks);
    found[0]
}

fn finding(check: &str, subject: &str, verdict: Verdict) -> (String, String, Verdict) {
    (check.to_string(), subject.to_string(), verdict)
}

#[test]
fn healthy_presets_fail_nothing() {
    let mut presets: Vec<Preset> = preset_names()
        .iter()
        .map(|name| Preset::load(name).unwrap())
        .collect();
    presets.push(fixture("healthy-nvlink"));
    for preset in &presets {
        let report = doctor(preset, &Options::default());
        assert!(
            !report.failed(),
            "{}: {:#?}",
            preset.name,
            findings(&report)
        );
        assert!(report.burst.is_ok(), "{}: {:?}", preset.name, report.burst);
    }
}

#[test]
fn every_kind_of_check_is_made_for_every_gpu_and_pair() {
    let report = doctor(&Preset::load("dgx1-v100").unwrap(), &Options::default());
    let count = |check: &str| report.checks.iter().filter(|c| c.check == check).count();
    assert_eq!(count("p2p"), 28);
    for check in GPU_CHECKS {
        assert_eq!(count(check), 8, "{check}");
    }
    assert_eq!(count("virtual-machine") + count("device-order"), 2);
    // The DGX-1's pairs across sockets have no P2P, as its drivers never route it there: a
    // warning with the reason, not a failure.
    let apart = one(&report, "p2p", "GPU 0 ↔ GPU 5");
    assert_eq!(apart.verdict, Verdict::Warn);
    assert!(
        apart.finding.contains("different CPU sockets"),
        "{}",
        apart.finding
    );
    assert!(apart.fix.as_deref().unwrap().contains("relay"), "{apart:?}");
    assert_eq!(one(&report, "p2p", "GPU 0 ↔ GPU 3").verdict, Verdict::Ok);
}

#[test]
fn a_pair_with_p2p_off_over_nvlink_fails() {
    let report = doctor(&fixture("p2p-off"), &Options::default());
    assert_eq!(
        findings(&report),
        [finding("p2p", "GPU 0 ↔ GPU 1", Verdict::Fail)]
    );
    let check = one(&report, "p2p", "GPU 0 ↔ GPU 1");
    assert!(
        check
            .finding
            .contains("off over NV18, where it should work"),
        "{check:?}"
    );
    assert!(
        check.evidence.iter().any(|e| e.contains("0→1 no; 1→0 no")),
        "{check:?}"
    );
    assert!(check.fix.is_some());
}

#[test]
fn a_pcie_link_trained_below_its_maximum_fails() {
    let report = doctor(&fixture("pcie-downgraded"), &Options::default());
    assert_eq!(
        findings(&report),
        [finding("pcie-link", "GPU 1", Verdict::Fail)]
    );
    let check = one(&report, "pcie-link", "GPU 1");
    assert!(
        check
            .finding
            .contains("Gen4 x8, below its maximum Gen5 x16"),
        "{check:?}"
    );
    assert!(
        check.evidence[0].contains("while the burst ran"),
        "{check:?}"
    );
    assert_eq!(one(&report, "pcie-link", "GPU 0").verdict, Verdict::Ok);
}

#[test]
fn a_dead_nvlink_fails_on_both_of_its_ends() {
    let report = doctor(&fixture("nvlink-down"), &Options::default());
    assert_eq!(
        findings(&report),
        [
            finding("nvlink", "GPU 0", Verdict::Fail),
            finding("nvlink", "GPU 1", Verdict::Fail)
        ]
    );
    let check = one(&report, "nvlink", "GPU 0");
    assert!(
        check.finding.starts_with("NVLink 3 down (1 of 18)"),
        "{check:?}"
    );
    // The pair still has P2P, over the 17 links left.
    let pair = one(&report, "p2p", "GPU 0 ↔ GPU 1");
    assert!(pair.finding.contains("NV17"), "{pair:?}");
}

#[test]
fn counters_rising_with_traffic_fail_and_say_by_how_much() {
    let report = doctor(&fixture("rising-counters"), &Options::default());
    assert_eq!(
        findings(&report),
        [finding("error-counters", "GPU 1", Verdict::Fail)]
    );
    let check = one(&report, "error-counters", "GPU 1");
    // 4 MiB out and 4 MiB in over GPU 1's NVLinks, at 4096 per GiB.
    assert_eq!(check.finding, "nvlink-replay rose by 32 during the burst");
    assert!(
        check.evidence.iter().any(|e| e == "nvlink-replay: 0 → 32"),
        "{check:?}"
    );
    assert!(check.evidence[0].contains("apart"), "{check:?}");
}

#[test]
fn counters_rise_only_with_traffic_over_their_links() {
    // GPU 1 alone: the burst crosses its PCIe link, not its NVLinks.
    let report = doctor(
        &fixture("rising-counters"),
        &Options {
            devices: Some(vec![1]),
            host_root: None,
        },
    );
    assert!(findings(&report).is_empty(), "{:#?}", findings(&report));
    let check = one(&report, "error-counters", "GPU 1");
    assert_eq!(check.finding, "no error counter moved");

    // ECC errors rise with any traffic through the GPU.
    let mut preset = fixture("rising-counters");
    preset.faults.rising_counters[0].counter = crate::backend::health::Counter::EccUncorrected;
    let report = doctor(
        &preset,
        &Options {
            devices: Some(vec![1]),
            host_root: None,
        },
    );
    let check = one(&report, "error-counters", "GPU 1");
    assert_eq!(check.verdict, Verdict::Fail);
    assert!(
        check.finding.starts_with("ecc-uncorrected rose by"),
        "{check:?}"
    );
    assert!(check.fix.as_deref().unwrap().contains("ECC"), "{check:?}");
}

#[test]
fn mig_warns_and_explains_the_missing_p2p_without_failing() {
    let report = doctor(&fixture("mig-on"), &Options::default());
    assert!(!report.failed());
    assert_eq!(
        findings(&report),
        [
            finding("p2p", "GPU 0 ↔ GPU 1", Verdict::Warn),
            finding("mig", "GPU 1", Verdict::Warn)
        ]
    );
    assert!(one(&report, "p2p", "GPU 0 ↔ GPU 1")
        .finding
        .contains("MIG is enabled on GPU 1"));
    assert!(one(&report, "mig", "GPU 1")
        .fix
        .as_deref()
        .unwrap()
        .contains("nvidia-smi -i 1 -mig 0"));
}

#[test]
fn persistence_off_and_thermal_slowdown_warn() {
    let report = doctor(&fixture("slow-clocks"), &Options::default());
    assert!(!report.failed());
    assert_eq!(
        findings(&report),
        [
            finding("persistence", "GPU 0", Verdict::Warn),
            finding("clocks", "GPU 1", Verdict::Warn)
        ]
    );
    let clocks = one(&report, "clocks", "GPU 1");
    assert!(clocks.finding.contains("sw-thermal"), "{clocks:?}");
    // An idle GPU's reason is shown, and is no slowdown.
    assert!(!clocks.finding.contains("gpu-idle"), "{clocks:?}");
    assert!(clocks.evidence[0].contains("gpu-idle"), "{clocks:?}");
}

#[test]
fn the_host_tree_explains_p2p_off_under_a_switch() {
    let report = doctor(&fixture("pcie-p2p-off"), &with_tree(None));
    let check = one(&report, "p2p", "GPU 0 ↔ GPU 1");
    assert_eq!(check.verdict, Verdict::Fail);
    for why in [
        "off over PIX, where it should work",
        "the IOMMU translates their DMA",
        "ACS on 0000:02:08.0 redirects",
        "virtual machine",
    ] {
        assert!(check.finding.contains(why), "{why}: {}", check.finding);
    }
    assert!(
        check.evidence.iter().any(|e| e.contains("DMA-FQ")),
        "{check:?}"
    );
    assert!(
        check
            .evidence
            .iter()
            .any(|e| e.contains("ReqRedir+") && e.contains("lspci")),
        "{check:?}"
    );
    let fix = check.fix.as_deref().unwrap();
    assert!(fix.contains("iommu=pt") && fix.contains("setpci"), "{fix}");
}

#[test]
fn p2p_that_works_through_a_translating_iommu_and_acs_redirect_warns() {
    let mut preset = fixture("pcie-p2p-off");
    preset.faults = Default::default();
    let report = doctor(&preset, &with_tree(None));
    let check = one(&report, "p2p", "GPU 0 ↔ GPU 1");
    assert_eq!(check.verdict, Verdict::Warn, "{check:?}");
    assert!(
        check.finding.starts_with("P2P is on over PIX, but"),
        "{check:?}"
    );
    // Without the tree nothing is known of the host, and nothing is claimed.
    let report = doctor(&preset, &Options::default());
    let check = one(&report, "p2p", "GPU 0 ↔ GPU 1");
    assert_eq!(check.verdict, Verdict::Ok);
    assert!(
        check.evidence.iter().any(|e| e.contains("were not read")),
        "{check:?}"
    );
}

#[test]
fn the_host_tree_tells_a_virtual_machine_and_its_issue_cost() {
    let report = doctor(&fixture("healthy-nvlink"), &with_tree(None));
    let vm = one(&report, "virtual-machine", "host");
    assert_eq!(vm.verdict, Verdict::Info);
    // The preset's copy_issue_us, 2.1 µs, against the published 2 µs.
    assert!(
        vm.finding.contains("2.10 µs here (simulated), 1.1×"),
        "{}",
        vm.finding
    );
    assert!(vm.evidence.iter().any(|e| e.contains("QEMU")), "{vm:?}");
    let unread = doctor(&fixture("healthy-nvlink"), &Options::default());
    assert!(one(&unread, "virtual-machine", "host").evidence[0].contains("no sysfs"));
}

#[test]
fn sysfs_gives_the_pcie_link_where_the_gpu_does_not() {
    let mut preset = fixture("pcie-p2p-off");
    preset.pcie.generation = None;
    preset.pcie.lanes = None;
    preset.faults = Default::default();
    let without = doctor(&preset, &Options::default());
    assert_eq!(one(&without, "pcie-link", "GPU 0").verdict, Verdict::Info);
    let with = doctor(&preset, &with_tree(None));
    let check = one(&with, "pcie-link", "GPU 0");
    assert_eq!(check.verdict, Verdict::Ok, "{check:?}");
    assert!(
        check.evidence.iter().any(|e| e.starts_with("sysfs")),
        "{check:?}"
    );
}

#[test]
fn devices_limit_the_checks_to_those_gpus() {
    let report = doctor(
        &fixture("nvlink-down"),
        &Options {
            devices: Some(vec![1]),
            host_root: None,
        },
    );
    assert_eq!(report.devices, [1]);
    assert!(report
        .checks
        .iter()
        .all(|c| c.devices.iter().all(|&d| d == 1)));
    assert!(report.checks.iter().all(|c| c.check != "p2p"));
    assert_eq!(report.burst.as_ref().unwrap().pairs.len(), 0);
    let bad = run(
        &SimBackend::from_preset(&fixture("nvlink-down")),
        &Options {
            devices: Some(vec![4]),
            host_root: None,
        },
    );
    assert_eq!(bad.unwrap_err().exit_code(), 2);
}

#[test]
fn gpus_out_of_pci_order_warn() {
    let mut preset = fixture("healthy-nvlink");
    preset.devices.swap(0, 1);
    let report = doctor(&preset, &Options::default());
    let order = one(&report, "device-order", "host");
    assert_eq!(order.verdict, Verdict::Warn);
    assert!(order
        .fix
        .as_deref()
        .unwrap()
        .contains("CUDA_DEVICE_ORDER=PCI_BUS_ID"));
}
