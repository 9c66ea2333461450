//! The bench on simulated hosts: figures against the presets, verification, sweeps, explain.

use super::cases::Context;
use super::result::{BenchReport, Place, TestResult};
use super::*;
use crate::backend::sim::SimBackend;

fn sim(preset: &str) -> SimBackend {
    SimBackend::open(preset).unwrap()
}

fn bench(backend: &dyn Backend, options: Options) -> BenchReport {
    run(backend, &options, &progress::Silent).unwrap()
}

fn tests(names: &[&str]) -> Option<Vec<String>> {
    Some(names.iter().map(|s| s.to_string()).collect())
}

fn only<'r>(report: &'r BenchReport, name: &str) -> &'r TestResult {
    report.tests.iter().find(|t| t.name == name).unwrap()
}

#[test]
fn ce_write_on_dgx_h100_matches_the_preset_on_every_pair() {
    let h100 = sim("dgx-h100");
    let started = std::time::Instant::now();
    let report = bench(
        &h100,
        Options {
            tests: tests(&["ce-write"]),
            ..Options::default()
        },
    );
    eprintln!("took {:?}", started.elapsed());
    let t = only(&report, "ce-write");
    let m = t.matrix.as_ref().unwrap();
    for src in 0..8 {
        for dst in 0..8 {
            if src == dst {
                assert!(m[src][dst].is_none());
                assert!(t
                    .reason(Place::Pair { src, dst })
                    .unwrap()
                    .contains("same GPU"));
            } else {
                let gbps = m[src][dst].unwrap();
                assert!(
                    (gbps - 397.35).abs() / 397.35 < 0.03,
                    "{src}->{dst}: {gbps}"
                );
            }
        }
    }
}

#[test]
fn timing_probe() {
    let h100 = sim("dgx-h100");
    for (size, samples) in [(4u64 << 20, 1), (16 << 20, 1), (64 << 20, 1)] {
        let started = std::time::Instant::now();
        let report = bench(
            &h100,
            Options {
                tests: tests(&["ce-write"]),
                size: Some(size),
                samples: Some(samples),
                ..Options::default()
            },
        );
        eprintln!(
            "{size} x{samples}: {:?} {:?}",
            started.elapsed(),
            only(&report, "ce-write").matrix.as_ref().unwrap()[0][1]
        );
    }
    for name in DEFAULT_TESTS {
        let started = std::time::Instant::now();
        bench(
            &h100,
            Options {
                tests: tests(&[name]),
                size: Some(4 << 20),
                samples: Some(1),
                ..Options::default()
            },
        );
        eprintln!("{name}: {:?}", started.elapsed());
    }
}
