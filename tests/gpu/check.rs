//! `peerlink check` on real GPUs: against a baseline taken moments before, healthy twice; against
//! the same baseline made 10% faster, every bandwidth figure regressed.

use super::common::made_faster;
use peerlink::backend::Backend;
use peerlink::bench::document::BenchDocument;
use peerlink::bench::result::Unit;
use peerlink::bench::{self, progress::Silent};
use peerlink::check::{self, Plan, CHECKED, DEFAULT_TOLERANCE_PCT};

#[test]
#[ignore = "needs a GPU"]
fn a_fresh_baseline_passes_and_one_made_10_percent_faster_fails() {
    let b = super::open();
    // Two GPUs at most: the pair is what check is timed on.
    let devices: Vec<usize> = (0..b.topology().devices.len()).take(2).collect();
    let options = bench::Options {
        tests: Some(CHECKED.iter().map(|c| c.test.to_string()).collect()),
        devices: Some(devices.clone()),
        ..bench::Options::default()
    };
    let baseline = BenchDocument::new(b.topology(), bench::run(&b, &options, &Silent).unwrap());
    let plan = Plan::against_baseline(b.topology(), &devices, &baseline, "fresh.json").unwrap();
    for run in 1..=2 {
        let found = check::run(&b, &plan, DEFAULT_TOLERANCE_PCT, &Silent)
            .and_then(|kept| kept.into_result())
            .unwrap();
        eprintln!(
            "run {run}: {} figures, tests {:.2} s on {} GPUs, {:.0} s on {} by the formula",
            found.figures.len(),
            found.wall_s,
            devices.len(),
            found.fleet_wall_s,
            found.fleet_gpus
        );
        for f in &found.figures {
            eprintln!(
                "  {} {:+.2}% (tolerance {}%)",
                f.name(),
                f.slower_pct,
                f.tolerance_pct
            );
        }
        assert!(found.healthy, "a false alarm: {:?}", found.regressions());
        assert_eq!(found.figures.len(), plan_figures(&devices));
    }
    let mut doc = serde_json::to_value(&baseline).unwrap();
    made_faster(&mut doc, 10.0);
    let faster: BenchDocument = serde_json::from_value(doc).unwrap();
    let plan = Plan::against_baseline(b.topology(), &devices, &faster, "faster.json").unwrap();
    let found = check::run(&b, &plan, DEFAULT_TOLERANCE_PCT, &Silent)
        .and_then(|kept| kept.into_result())
        .unwrap();
    eprintln!("against 10% faster: {:?}", found.regressions());
    assert!(!found.healthy);
    // 9.1% short of every bandwidth the baseline holds: each is named.
    for f in found.figures.iter().filter(|f| f.unit == Unit::Gbps) {
        assert!(f.regressed, "{} passed a baseline 10% faster", f.name());
    }
}

/// The figures check compares on `devices`: ce-write and copy-latency per ordered pair (a GPU with
/// itself on one GPU), h2d, d2h and local per GPU.
fn plan_figures(devices: &[usize]) -> usize {
    let pairs = (devices.len() * (devices.len() - 1)).max(1);
    2 * pairs + 3 * devices.len()
}
