//! The check's plan and verdicts on simulated hosts and doctored figures.

use super::*;
use crate::backend::sim::SimBackend;
use crate::bench::progress::Silent;
use crate::topology::Link;

/// A simulated host and a bench document of `tests` on its `devices` at `size` bytes.
fn host_and_bench(
    preset: &str,
    tests: &str,
    devices: &[usize],
    size: u64,
) -> (SimBackend, BenchDocument) {
    let backend = SimBackend::open(preset).unwrap();
    let options = bench::Options {
        tests: Some(tests.split(',').map(String::from).collect()),
        devices: Some(devices.to_vec()),
        size: Some(bench::Size::Bytes(size)),
        ..bench::Options::default()
    };
    let report = bench::run(&backend, &options, &Silent).unwrap();
    let doc = BenchDocument::new(backend.topology(), report);
    (backend, doc)
}

/// Check's tests in its order, each at its size in `sizes`.
fn checked_at(sizes: [u64; 5]) -> Vec<(String, u64)> {
    let names = CHECKED.iter().map(|c| c.test.to_string());
    names.zip(sizes).collect()
}

const ALL_CHECKED: &str = "ce-write,h2d,d2h,local,copy-latency";

/// `doc`'s tests with every figure of `test` at `place` (all places where `None`) times `factor`.
fn scaled(doc: &BenchDocument, test: &str, place: Option<Place>, factor: f64) -> Vec<TestResult> {
    let mut tests = doc.results.tests.clone();
    for t in tests.iter_mut().filter(|t| t.name == test) {
        for cell in t
            .cells
            .iter_mut()
            .filter(|c| place.is_none_or(|p| p == c.place))
        {
            cell.value *= factor;
        }
    }
    tests
}

#[test]
fn a_baseline_of_the_same_host_is_checked_at_its_sizes_and_passes_itself() {
    let (backend, baseline) = host_and_bench(
        "h200-pair",
        "ce-write,ce-read,h2d,d2h,local,copy-latency,issue-cost,ping-pong",
        &[0, 1],
        1 << 20,
    );
    let plan = Plan::against_baseline(backend.topology(), &[0, 1], &baseline, "base.json").unwrap();
    assert_eq!(
        plan.runs(),
        checked_at([1 << 20, 1 << 20, 1 << 20, 1 << 20, 4])
    );
    let not_checked: Vec<(&str, &str)> = plan
        .not_checked
        .iter()
        .map(|n| (n.test.as_str(), n.why.as_str()))
        .collect();
    assert_eq!(not_checked[0], ("ce-read", NOT_IN_SHORT_SET));
    assert!(not_checked[1].1.contains("host-clock"), "{not_checked:?}");
    assert_eq!(not_checked[2].0, "ping-pong");
    assert!(plan.not_compared.is_empty(), "{:?}", plan.not_compared);
    // Measured at 1 MiB, not the plateau: said, and measured alike.
    assert!(
        plan.notes[0].contains("ce-write at 1 MiB (its plateau: 512 MiB)"),
        "{:?}",
        plan.notes
    );
    let report = judge(&plan, &baseline.results.tests, DEFAULT_TOLERANCE_PCT);
    assert!(report.healthy && report.regressed.is_empty());
    assert_eq!(
        report.figures.len(),
        10,
        "2 pairs × 2 tests + 2 GPUs × 3 tests"
    );
    assert!(report
        .figures
        .iter()
        .all(|f| f.slower_pct == 0.0 && f.ratio == 1.0));
    assert_eq!(report.figures[8].tolerance_pct, 10.0, "copy-latency: twice");
    // The whole run, for real: the simulator repeats its own figures exactly.
    let run = run(&backend, &plan, DEFAULT_TOLERANCE_PCT, &Silent)
        .and_then(|kept| kept.into_result())
        .unwrap();
    assert!(run.healthy, "{:?}", run.regressions());
    assert_eq!(run.figures.len(), 10);
    assert!(run.wall_s > 0.0);
}

#[test]
fn a_slower_figure_regresses_beyond_its_tolerance_and_is_named() {
    let (backend, baseline) = host_and_bench("h200-pair", ALL_CHECKED, &[0, 1], 1 << 20);
    let plan = Plan::against_baseline(backend.topology(), &[0, 1], &baseline, "b.json").unwrap();
    let one_way = Some(Place::Pair { src: 1, dst: 0 });
    // 1→0's bandwidth 9.1% below the baseline's (the baseline 10% faster there).
    let report = judge(
        &plan,
        &scaled(&baseline, "ce-write", one_way, 1.0 / 1.1),
        5.0,
    );
    assert!(!report.healthy);
    assert_eq!(report.regressed, ["ce-write 1 MiB 1→0"]);
    assert_eq!(
        report.regressions(),
        ["ce-write 1 MiB 1→0 (9.1% slower; tolerance 5%)"]
    );
    // The tolerance is respected both ways.
    assert!(judge(&plan, &scaled(&baseline, "ce-write", one_way, 0.951), 5.0).healthy);
    assert!(!judge(&plan, &scaled(&baseline, "ce-write", one_way, 0.949), 5.0).healthy);
    assert!(judge(&plan, &scaled(&baseline, "ce-write", one_way, 0.85), 20.0).healthy);
    // Faster is never a regression, however far.
    assert!(judge(&plan, &scaled(&baseline, "ce-write", None, 3.0), 5.0).healthy);
    // A latency regresses upwards, at twice the tolerance: 9% longer passes, 11% does not.
    assert!(judge(&plan, &scaled(&baseline, "copy-latency", None, 1.09), 5.0).healthy);
    let report = judge(&plan, &scaled(&baseline, "copy-latency", None, 1.11), 5.0);
    assert_eq!(
        report.regressed,
        ["copy-latency 4 B 0→1", "copy-latency 4 B 1→0"]
    );
    assert!(judge(&plan, &scaled(&baseline, "copy-latency", None, 0.5), 5.0).healthy);
    // A per-GPU figure is named by its GPU.
    let gpu1 = Some(Place::Device { device: 1 });
    let report = judge(&plan, &scaled(&baseline, "d2h", gpu1, 0.5), 5.0);
    assert_eq!(report.regressed, ["d2h 1 MiB GPU 1"]);
}

#[test]
fn what_was_expected_and_not_measured_is_said_with_the_reason() {
    let (backend, baseline) = host_and_bench("h200-pair", ALL_CHECKED, &[0, 1], 1 << 20);
    let plan = Plan::against_baseline(backend.topology(), &[0, 1], &baseline, "b.json").unwrap();
    let mut measured = baseline.results.tests.clone();
    measured[0]
        .cells
        .retain(|c| c.place != Place::Pair { src: 1, dst: 0 });
    measured.retain(|t| t.name != "local");
    let report = judge(&plan, &measured, 5.0);
    assert!(report.healthy);
    assert_eq!(report.figures.len(), 7);
    assert!(report
        .not_compared
        .iter()
        .any(|n| n.starts_with("ce-write 1 MiB 1→0: not measured")));
    assert!(report
        .not_compared
        .iter()
        .any(|n| n.starts_with("local 1 MiB GPU 1: not measured")));
}

#[test]
fn a_baseline_of_another_kind_of_host_is_refused() {
    let (h200, baseline) = host_and_bench("h200-pair", "ce-write,h2d", &[0, 1], 1 << 20);
    let dgx = SimBackend::open("dgx-h100").unwrap();
    let err = Plan::against_baseline(dgx.topology(), &[0, 1], &baseline, "b.json").unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string()
            .contains("measured on `sim:h200-pair` and this host is `sim:dgx-h100`"),
        "{err}"
    );
    // Real GPUs against a simulator's figures.
    let mut real = h200.topology().clone();
    real.source = Source::Cuda;
    assert!(Plan::against_baseline(&real, &[0, 1], &baseline, "b.json").is_err());
    // The same preset name with other GPUs in it.
    let mut other_gpus = h200.topology().clone();
    other_gpus.devices[1].name = "NVIDIA H100 80GB HBM3".into();
    let err = Plan::against_baseline(&other_gpus, &[0, 1], &baseline, "b.json").unwrap_err();
    assert!(
        err.to_string()
            .contains("with NVIDIA H200 as GPU 1, and this host's GPU 1 is NVIDIA H100"),
        "{err}"
    );
    // A baseline that holds none of check's tests.
    let (_, latency) = host_and_bench("h200-pair", "ping-pong", &[0, 1], 1 << 20);
    let err = Plan::against_baseline(h200.topology(), &[0, 1], &latency, "l.json").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("l.json holds no figure of check's tests"),
        "{err}"
    );
}

#[test]
fn a_baseline_of_more_gpus_is_compared_on_the_gpus_in_use() {
    let (dgx, baseline) = host_and_bench("dgx-h100", "ce-write,h2d", &[0, 1, 2], 1 << 20);
    let plan = Plan::against_baseline(dgx.topology(), &[1, 2], &baseline, "b.json").unwrap();
    // ce-write 1→2 and 2→1, h2d on GPUs 1 and 2; 0's four pairs and its h2d are left.
    assert_eq!(plan.expected.len(), 4);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.starts_with("5 figures of b.json are of GPUs not in use")),
        "{:?}",
        plan.notes
    );
    // And a baseline of fewer GPUs leaves the others' places uncompared.
    let plan = Plan::against_baseline(dgx.topology(), &[0, 1, 2, 3], &baseline, "b.json").unwrap();
    assert!(
        plan.not_compared
            .contains(&"ce-write 1 MiB 0→3: not in b.json".to_string()),
        "{:?}",
        plan.not_compared
    );
    assert!(plan
        .not_compared
        .contains(&"h2d 1 MiB GPU 3: not in b.json".to_string()));
}

#[test]
fn known_gpus_are_checked_against_their_references_at_the_plateau() {
    let h200 = SimBackend::open("h200-pair").unwrap();
    let plan = Plan::against_references(h200.topology(), &[0, 1]).unwrap();
    assert_eq!(
        plan.against,
        Against::Reference {
            gpus: vec!["NVIDIA H200 (SXM)".into()]
        }
    );
    assert_eq!(
        plan.runs(),
        checked_at([512 << 20, 64 << 20, 64 << 20, 1 << 30, 4])
    );
    assert_eq!(plan.expected.len(), 10);
    assert!(plan.expected.iter().all(|e| e.reference.is_some()));
    // A simulated host is checked as the preset it is, and says so.
    assert!(
        plan.notes
            .iter()
            .any(|n| n.starts_with("SIMULATED host `h200-pair`")),
        "{:?}",
        plan.notes
    );
    // H100 SXM: published figures for ce-write, h2d and d2h only.
    let dgx = SimBackend::open("dgx-h100").unwrap();
    let plan = Plan::against_references(dgx.topology(), &[0, 1, 2]).unwrap();
    assert_eq!(plan.runs().len(), 3);
    assert_eq!(plan.expected.len(), 6 + 3 + 3);
    let left: Vec<&str> = plan.not_checked.iter().map(|n| n.test.as_str()).collect();
    assert_eq!(left, ["local", "copy-latency"]);
    assert!(plan.not_checked[0]
        .why
        .contains("no reference figure for NVIDIA H100 SXM"));
}

#[test]
fn a_pair_unlike_the_references_link_is_a_fault_and_its_figures_are_still_compared() {
    let mut host = SimBackend::open("h200-pair").unwrap().topology().clone();
    for pair in &mut host.pairs {
        pair.link = Link::NvLink(4);
    }
    let plan = Plan::against_references(&host, &[0, 1]).unwrap();
    assert_eq!(
        plan.expected.len(),
        10,
        "the pairs' figures are expected still"
    );
    assert!(plan.not_compared.is_empty(), "{:?}", plan.not_compared);
    assert_eq!(
        plan.faults,
        [
            "GPU 0 and GPU 1 are joined by NV4, where two NVIDIA H200 (SXM) are joined by NV18 \
          (the link their reference figures hold for)"
        ]
    );
    // Every figure as the reference has it: the topology alone fails the check.
    let report = judge(&plan, &reference_figures(&plan), 5.0);
    assert!(report.regressed.is_empty());
    assert!(!report.healthy);
    assert_eq!(report.faults, plan.faults);
    // P2P off, one way: a fault of its own.
    let mut host = SimBackend::open("h200-pair").unwrap().topology().clone();
    host.pairs[1].p2p = false;
    let plan = Plan::against_references(&host, &[0, 1]).unwrap();
    assert_eq!(
        plan.faults,
        ["no P2P between GPU 0 and GPU 1, which two NVIDIA H200 (SXM) joined by NV18 have"]
    );
    // One GPU: the pair tests have no reference (a GPU with itself), the per-GPU ones do.
    let host = SimBackend::open("h200-pair").unwrap().topology().clone();
    let plan = Plan::against_references(&host, &[1]).unwrap();
    assert_eq!(plan.expected.len(), 3);
    assert!(plan.faults.is_empty());
}

/// Every figure `plan` expects, measured exactly as expected.
fn reference_figures(plan: &Plan) -> Vec<TestResult> {
    let (_, doc) = host_and_bench("h200-pair", ALL_CHECKED, &[0, 1], 1 << 20);
    let mut tests = doc.results.tests;
    for t in &mut tests {
        let size = plan
            .runs
            .iter()
            .find(|(name, _)| *name == t.name)
            .unwrap()
            .1;
        t.size_bytes = size;
        for cell in &mut t.cells {
            let expected = plan
                .expected
                .iter()
                .find(|e| e.test == t.name && e.place == cell.place);
            cell.value = expected.unwrap().value;
        }
    }
    tests
}

#[test]
fn a_figure_the_host_cannot_give_fails_the_check_and_a_stopped_one_does_not() {
    let (backend, baseline) = host_and_bench("h200-pair", ALL_CHECKED, &[0, 1], 1 << 20);
    let plan = Plan::against_baseline(backend.topology(), &[0, 1], &baseline, "b.json").unwrap();
    assert!(plan.faults.is_empty(), "{:?}", plan.faults);
    let mut measured = baseline.results.tests.clone();
    let no_p2p = Place::Pair { src: 1, dst: 0 };
    measured[0].cells.retain(|c| c.place != no_p2p);
    measured[0]
        .not_measured
        .push(crate::bench::result::NotMeasured {
            place: no_p2p,
            reason: "no P2P from GPU 1 to GPU 0".into(),
        });
    let report = judge(&plan, &measured, 5.0);
    assert!(!report.healthy);
    assert!(report.regressed.is_empty());
    assert_eq!(
        report.missing,
        [Missing {
            figure: "ce-write 1 MiB 1→0".into(),
            why: "no P2P from GPU 1 to GPU 0".into()
        }]
    );
    let what = report.what_failed(|l| l.join(", ")).unwrap();
    assert_eq!(what, "1 figure not measured: ce-write 1 MiB 1→0");
    // Stopped by a failure elsewhere: left out, said why, and no fault of the host's.
    measured[0].not_measured.last_mut().unwrap().reason = bench::STOPPED_BY_FAILURE.into();
    let report = judge(&plan, &measured, 5.0);
    assert!(report.healthy && !report.is_faulty());
    assert_eq!(report.not_compared.len(), 1);
}

#[test]
fn a_host_unlike_the_baselines_is_at_fault() {
    let (backend, baseline) = host_and_bench("h200-pair", ALL_CHECKED, &[0, 1], 1 << 20);
    let mut host = backend.topology().clone();
    for pair in &mut host.pairs {
        pair.p2p = false;
    }
    let plan = Plan::against_baseline(&host, &[0, 1], &baseline, "b.json").unwrap();
    assert_eq!(plan.faults.len(), 2, "{:?}", plan.faults);
    assert!(
        plan.faults[0].starts_with("no P2P from GPU 0 to GPU 1, where b.json measured ce-write at"),
        "{:?}",
        plan.faults
    );
    // A GPU fallen off the bus.
    let mut host = backend.topology().clone();
    host.devices.pop();
    let plan = Plan::against_baseline(&host, &[0], &baseline, "b.json").unwrap();
    assert_eq!(
        plan.faults,
        [
            "this host has 1 GPUs, where the host of b.json had 2 (a GPU fallen off the bus, or \
          hidden from CUDA)"
        ]
    );
}

#[test]
fn gpus_without_references_are_a_usage_error_that_names_them() {
    for preset in ["dgx1-v100", "pcie-2gpu-switch"] {
        let host = SimBackend::open(preset).unwrap();
        let devices: Vec<usize> = (0..host.topology().devices.len()).collect();
        let err = Plan::against_references(host.topology(), &devices).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(
            text.starts_with("peerlink ships no reference figures for "),
            "{text}"
        );
        assert!(text.contains(&host.topology().devices[0].name), "{text}");
        assert!(text.contains("give --baseline FILE"), "{text}");
    }
}

#[test]
fn the_fleet_estimate_is_the_default_bench_formula() {
    let (backend, baseline) = host_and_bench("h200-pair", "ce-write,h2d", &[0, 1], 1 << 20);
    let plan = Plan::against_baseline(backend.topology(), &[0, 1], &baseline, "b.json").unwrap();
    let mut measured = baseline.results.tests.clone();
    measured[0].wall_s = 1.0; // a matrix test: 2 ordered pairs here, 56 on eight GPUs
    measured[1].wall_s = 0.5; // a per-GPU test: 2 GPUs here, 8 there
    let report = judge(&plan, &measured, 5.0);
    assert_eq!(report.wall_s, 1.5);
    assert_eq!(report.fleet_gpus, 8);
    assert!(
        (report.fleet_wall_s - (28.0 + 2.0)).abs() < 1e-9,
        "{}",
        report.fleet_wall_s
    );
}
