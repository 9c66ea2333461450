//! Managed memory on real GPUs (part of the `gpu` test binary): the bench's managed tests on the
//! first two GPUs and on GPU 0 alone (its pages then in host memory), every byte of every sample
//! verified by the tests themselves, and explain's split of a first touch. Each prints its figures
//! for BENCHMARKS.md.

use peerlink::backend::Backend;
use peerlink::bench::document::{BenchDocument, ExplainDocument};
use peerlink::bench::result::{BenchReport, Place};
use peerlink::bench::{explain, progress, Options, Size};
use peerlink::report;

const BANDWIDTH: [&str; 4] = [
    "managed-fault",
    "managed-accessed-by",
    "managed-prefetch",
    "managed-read-mostly",
];
const LATENCY: &str = "managed-fault-latency";
/// A thousand 64 KiB pages (the bench's default for these tests on GPUs).
const SIZE: u64 = 64 << 20;

/// Runs every managed test on `devices`, prints the report as `peerlink bench` does, and checks
/// that every place was measured with a figure.
fn bench(backend: &dyn Backend, devices: &[usize]) -> BenchReport {
    let options = Options {
        tests: Some(
            BANDWIDTH
                .iter()
                .chain([&LATENCY])
                .map(|t| t.to_string())
                .collect(),
        ),
        devices: Some(devices.to_vec()),
        size: Some(Size::Bytes(SIZE)),
        ..Options::default()
    };
    let found = peerlink::bench::run(backend, &options, &progress::Silent)
        .unwrap_or_else(|e| panic!("the managed tests on GPUs {devices:?} failed: {e}"));
    let doc = BenchDocument::new(backend.topology(), found.clone());
    println!("{}", report::bench::text(&doc));
    for test in &found.tests {
        for skipped in &test.not_measured {
            // The diagonal of several GPUs is left out, as in every matrix test (one GPU alone
            // reads from host memory), and so is a mapping across GPUs without P2P.
            let (src, dst) = skipped.place.pair();
            let p2p = backend.topology().pair(src, dst).is_some_and(|p| p.p2p);
            assert!(
                src == dst || (test.name == "managed-accessed-by" && !p2p),
                "{} left {:?} out: {}",
                test.name,
                skipped.place,
                skipped.reason
            );
        }
        for cell in &test.cells {
            assert!(
                cell.value.is_finite() && cell.value > 0.0,
                "{} {:?}: {}",
                test.name,
                cell.place,
                cell.value
            );
        }
    }
    found
}

fn gbps(report: &BenchReport, test: &str, place: Place) -> f64 {
    let t = report.tests.iter().find(|t| t.name == test).unwrap();
    t.cell(place)
        .unwrap_or_else(|| panic!("{test} measured nothing at {place:?}"))
        .value
}

#[test]
#[ignore = "needs a GPU"]
fn managed_tests_between_two_gpus_verify_every_byte_and_a_prefetch_beats_faulting() {
    let b = super::open();
    if b.topology().devices.len() < 2 {
        eprintln!("one GPU: nothing between GPUs to measure (the one-GPU test runs it alone)");
        return;
    }
    let report = bench(&b, &[0, 1]);
    for place in [
        Place::Pair { src: 0, dst: 1 },
        Place::Pair { src: 1, dst: 0 },
    ] {
        let fault = gbps(&report, "managed-fault", place);
        let prefetch = gbps(&report, "managed-prefetch", place);
        assert!(
            prefetch > fault,
            "{place:?}: a prefetch ({prefetch:.1} GB/s) should beat faulting ({fault:.1})"
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn managed_tests_on_one_gpu_read_pages_from_host_memory() {
    let b = super::open();
    let report = bench(&b, &[0]);
    let place = Place::Pair { src: 0, dst: 0 };
    let (fault, prefetch) = (
        gbps(&report, "managed-fault", place),
        gbps(&report, "managed-prefetch", place),
    );
    assert!(
        prefetch > fault,
        "prefetch {prefetch:.1} vs fault {fault:.1} GB/s"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn explain_splits_a_managed_first_touch_into_faults_migration_and_read() {
    let b = super::open();
    let dst = usize::from(b.topology().devices.len() > 1);
    let e = explain::run_managed(&b, 0, dst, SIZE, &progress::Silent)
        .unwrap_or_else(|e| panic!("explain --memory managed 0 -> {dst} failed: {e}"));
    let doc = ExplainDocument::new(b.topology(), e.clone());
    println!("{}", report::bench::explain_text(&doc));
    let names: Vec<&str> = e.parts.iter().map(|p| p.name.as_str()).collect();
    assert!(names.contains(&"page faults"), "{names:?}");
    assert!(e.parts.iter().all(|p| p.us.is_finite()), "{:?}", e.parts);
    assert!(e.measured_us > 0.0);
    let prefetch = e
        .fixes
        .iter()
        .find(|f| f.fix.contains("cuMemPrefetchAsync"));
    assert!(
        prefetch.is_some_and(|f| f.saves_us.is_finite()),
        "{:?}",
        e.fixes
    );
}
