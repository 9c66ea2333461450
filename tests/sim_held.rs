//! The simulator holds host memory only for the buffers a run holds (issue 34, class 2): every verb
//! frees what it allocated, so verbs run back to back on one simulated host leave nothing held,
//! and a long run never runs out of "free" memory that its earlier tests already gave back.

use peerlink::backend::sim::SimBackend;
use peerlink::backend::Backend;
use peerlink::bench::progress::Silent;
use peerlink::bench::{self, explain};
use peerlink::check::{self, Plan};
use peerlink::workload;
use peerlink::workload::kinds::Workload;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn bench_options(tests: &str, size: u64) -> bench::Options {
    bench::Options {
        tests: Some(tests.split(',').map(String::from).collect()),
        size: Some(bench::Size::Bytes(size)),
        ..bench::Options::default()
    }
}

#[test]
fn verbs_run_back_to_back_leave_no_simulated_buffer_held() {
    let sim = Arc::new(SimBackend::open("h200-pair").unwrap());
    let held = || sim.held_host_bytes();
    assert_eq!(held(), 0);

    // Five tests at 64 MiB in one run: each frees its buffers before the next allocates.
    let five = "ce-write,ce-read,h2d,d2h,local";
    bench::run(&*sim, &bench_options(five, 64 * MIB), &Silent).unwrap();
    assert_eq!(held(), 0, "after bench of {five}");
    bench::run(&*sim, &bench::Options::default(), &Silent).unwrap();
    assert_eq!(held(), 0, "after the default bench");

    let plan = Plan::against_references(sim.topology(), &[0, 1]).unwrap();
    check::run(&*sim, &plan, check::DEFAULT_TOLERANCE_PCT, &Silent)
        .and_then(|kept| kept.into_result())
        .unwrap();
    assert_eq!(held(), 0, "after check");

    explain::run(&*sim, 0, 1, 16 * MIB, &Silent).unwrap();
    assert_eq!(held(), 0, "after explain");

    let shared: Arc<dyn Backend> = sim.clone();
    for load in Workload::ALL {
        let options = workload::settings::Options {
            sizes: Some(vec![MIB, 8 * MIB]),
            ..workload::settings::Options::default()
        };
        workload::run(&shared, load, &options, &Silent).unwrap();
        assert_eq!(held(), 0, "after workload {load:?}");
    }
}
