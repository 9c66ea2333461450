//! The bench on simulated hosts: figures against the presets, verification, sweeps, explain.

use super::cases::latency;
use super::cases::{Context, Initiator, PeerCopy, Transport};
use super::result::{BenchReport, Place, TestResult};
use super::timing::measure;
use super::*;
use crate::backend::sim::SimBackend;
use crate::backend::CopyMethod;
use crate::pattern;

/// dgx-h100's copy-engine P2P figure: 18 links × 25 GB/s × 0.883 (the preset's sources).
const H100_CE_GBPS: f64 = 18.0 * 25.0 * 0.883;

fn sim(preset: &str) -> SimBackend {
    SimBackend::open(preset).unwrap()
}

fn bench(backend: &dyn Backend, options: Options) -> BenchReport {
    run(backend, &options, &progress::Silent).unwrap()
}

fn names(list: &[&str]) -> Option<Vec<String>> {
    Some(list.iter().map(|s| s.to_string()).collect())
}

fn only<'r>(report: &'r BenchReport, name: &str) -> &'r TestResult {
    report.tests.iter().find(|t| t.name == name).unwrap()
}

fn within(value: f64, target: f64, rel: f64) -> bool {
    (value - target).abs() <= rel * target
}

#[test]
fn ce_write_on_dgx_h100_matches_the_preset_on_every_pair() {
    let h100 = sim("dgx-h100");
    let report = bench(
        &h100,
        Options {
            tests: names(&["ce-write"]),
            size: Some(Size::Bytes(16 << 20)),
            ..Options::default()
        },
    );
    let t = only(&report, "ce-write");
    let m = t.matrix.as_ref().unwrap();
    for (src, row) in m.iter().enumerate() {
        for (dst, cell) in row.iter().enumerate() {
            if src == dst {
                assert!(cell.is_none());
                let reason = t.reason(Place::Pair { src, dst }).unwrap();
                assert!(reason.contains("same GPU"), "{reason}");
            } else {
                // At 16 MiB the per-copy overhead (α ≈ 2.8 µs) costs ~6% of the link's rate.
                let gbps = cell.unwrap();
                assert!(within(gbps, H100_CE_GBPS, 0.07), "{src}->{dst}: {gbps}");
                assert!(within(gbps, m[0][1].unwrap(), 1e-6), "NVSwitch pairs alike");
            }
        }
    }
    assert!(
        report.notes[0].contains("sim:dgx-h100"),
        "{}",
        report.notes[0]
    );
    assert!(report.notes[0].contains("SIMULATED"));
}

#[test]
fn a_sweep_rises_monotonically_toward_beta_and_the_fit_recovers_the_link() {
    let h100 = sim("dgx-h100");
    let report = bench(
        &h100,
        Options {
            devices: Some(vec![0, 1]),
            sizes: Some(crate::units::parse::parse_sizes("4B..64MiB").unwrap()),
            ..Options::default()
        },
    );
    assert!(report.tests.is_empty());
    assert_eq!(report.sweeps.len(), 2, "one sweep per ordered pair");
    let sweep = &report.sweeps[0];
    assert_eq!(
        (sweep.test.as_str(), sweep.src, sweep.dst),
        ("ce-write", 0, 1)
    );
    assert_eq!(sweep.points.len(), 25);
    for w in sweep.points.windows(2) {
        assert!(w[1].gbps > w[0].gbps, "{:?} then {:?}", w[0], w[1]);
        assert!(w[1].median_us >= w[0].median_us);
    }
    let fit = sweep.fit.unwrap();
    assert!(within(fit.beta_gbps, H100_CE_GBPS, 0.01), "{fit:?}");
    assert!(fit.alpha_us > 1.0 && fit.alpha_us < 5.0, "{fit:?}");
    let last = sweep.points.last().unwrap();
    assert!(last.gbps < fit.beta_gbps && last.gbps > 0.95 * fit.beta_gbps);
    // The 90% size is where the points cross 90% of β.
    let below: Vec<_> = sweep
        .points
        .iter()
        .filter(|p| (p.bytes as f64) < fit.ninety_beta_bytes)
        .collect();
    assert!(below.iter().all(|p| p.gbps < 0.9 * fit.beta_gbps));
}

#[test]
fn dgx1_pairs_without_nvlink_are_na_with_a_reason_and_staged_figures_exist() {
    let v100 = sim("dgx1-v100");
    let report = bench(
        &v100,
        Options {
            tests: names(&["ce-write", "staged", "pointer-chase"]),
            size: Some(Size::Bytes(1 << 20)),
            ..Options::default()
        },
    );
    let topo = v100.topology();
    let ce = only(&report, "ce-write");
    let staged = only(&report, "staged");
    let chase = only(&report, "pointer-chase");
    for pair in &topo.pairs {
        let place = Place::Pair {
            src: pair.src,
            dst: pair.dst,
        };
        let staged_gbps = staged
            .cell(place)
            .expect("staging works on every pair")
            .value;
        if pair.link.is_nvlink() {
            let direct = ce.cell(place).unwrap().value;
            assert!(direct > staged_gbps, "{place:?}: NVLink beats staging");
        } else {
            for test in [ce, chase] {
                assert!(test.cell(place).is_none());
                let reason = test.reason(place).unwrap();
                assert!(reason.starts_with("no P2P over SYS"), "{reason}");
            }
            assert!(staged_gbps > 0.0);
        }
    }
    // Two NVLinks carry twice what one does.
    let nv1 = ce.cell(Place::Pair { src: 0, dst: 1 }).unwrap().value;
    let nv2 = ce.cell(Place::Pair { src: 0, dst: 3 }).unwrap().value;
    assert!(nv2 > 1.8 * nv1, "NV2 {nv2} vs NV1 {nv1}");
}

#[test]
fn every_default_test_fills_or_explains_every_cell() {
    let box4 = sim("pcie-4gpu-2socket");
    let report = bench(&box4, Options::default());
    assert_eq!(report.tests.len(), DEFAULT_TESTS.len());
    for t in &report.tests {
        let expected = match (&t.matrix, &t.values) {
            (Some(_), None) => 16,
            (None, Some(_)) => 4,
            _ => panic!("{} has neither a matrix nor values", t.name),
        };
        assert_eq!(
            t.cells.len() + t.not_measured.len(),
            expected,
            "{}: a silent gap",
            t.name
        );
        assert!(!t.cells.is_empty(), "{} measured nothing", t.name);
        assert!(t.cells.iter().all(|c| c.value > 0.0 && c.value.is_finite()));
    }
    let bidir = only(&report, "ce-bidir-write");
    let cell = bidir.cells.iter().find(|c| c.total.is_some()).unwrap();
    assert!(within(cell.total.unwrap(), 2.0 * cell.value, 0.01));
}

#[test]
fn both_pointer_chases_run_and_say_which_definition_they_are() {
    let pair = sim("h200-pair");
    let report = bench(
        &pair,
        Options {
            tests: names(&["pointer-chase", "pointer-chase-resident"]),
            ..Options::default()
        },
    );
    let (flushed, resident) = (
        only(&report, "pointer-chase"),
        only(&report, "pointer-chase-resident"),
    );
    assert!(flushed.measures.contains("flushed"), "{}", flushed.measures);
    assert!(resident.measures.contains("device_to_device_latency_sm"));
    assert!(resident.measures.contains("2 MiB") && resident.measures.contains("128 B"));
    // The flushed chase evicts its chain before each sample and loads from the peer's memory; the
    // resident one is walked once untimed and then served from the caches: the preset's two
    // NVLink figures.
    for (t, ns) in [(flushed, 1013.0), (resident, 871.0)] {
        assert_eq!(t.cells.len(), 2, "{}", t.name);
        for c in &t.cells {
            assert!(within(c.value, ns, 0.01), "{}: {}", t.name, c.value);
        }
    }
}

#[test]
fn one_gpu_is_its_own_peer() {
    let h100 = sim("dgx-h100");
    let report = bench(
        &h100,
        Options {
            tests: names(&["ce-write", "ping-pong", "pointer-chase"]),
            devices: Some(vec![3]),
            size: Some(Size::Bytes(1 << 20)),
            ..Options::default()
        },
    );
    for t in &report.tests {
        assert_eq!(t.cells.len(), 1, "{}", t.name);
        assert_eq!(t.cells[0].place, Place::Pair { src: 3, dst: 3 });
        assert!(t.not_measured.is_empty());
    }
    assert!(report.notes.iter().any(|n| n.contains("its own peer")));
}

#[test]
fn the_cheap_latency_tests_take_their_own_samples_the_chase_the_bandwidths() {
    let h100 = sim("dgx-h100");
    let sampling = Sampling {
        samples: 3,
        ..Defaults::for_backend(&h100).sampling
    };
    let mut ctx = Context::new(&h100, vec![0, 1], sampling, 1 << 20);
    assert_eq!(
        ctx.latency_samples, 3,
        "as many as the bandwidths unless set"
    );
    ctx.latency_samples = LATENCY_SAMPLES;
    let place = Place::Pair { src: 0, dst: 1 };
    let samples = |ctx: &mut Context<'_>, test: &dyn TestCase| match test.measure(ctx, place, 4) {
        Ok(cases::Outcome::Measured { time_us, .. }) => time_us.samples,
        other => panic!("{}: {other:?}", test.name()),
    };
    use cases::{ChaseChain, EndToEnd, PingPong, PointerChase, SmallCopy, SmallCopyFigure};
    let n = LATENCY_SAMPLES as usize;
    assert_eq!(samples(&mut ctx, &SmallCopy(SmallCopyFigure::GpuTime)), n);
    assert_eq!(samples(&mut ctx, &SmallCopy(SmallCopyFigure::IssueCost)), n);
    assert_eq!(
        samples(&mut ctx, &EndToEnd),
        n * latency::END_TO_END_TRANSFERS as usize
    );
    assert_eq!(samples(&mut ctx, &PingPong), n);
    // Each of ping-pong's samples places its flags anew, and its note gives their range.
    match PingPong.measure(&mut ctx, place, 4) {
        Ok(cases::Outcome::Measured { note, time_us, .. }) => {
            let note = note.expect("a note on the placements");
            assert!(
                note.ends_with(&format!("over {n} placements of the flags")),
                "{note}"
            );
            let range = format!("GPU 0 → 1: {:.2}–{:.2} µs", time_us.min, time_us.max);
            assert!(note.starts_with(&range), "{note}");
        }
        other => panic!("ping-pong: {other:?}"),
    }
    // Its footprint is those placements' pages on both GPUs, at most 32 of them.
    for (samples, placements) in [(LATENCY_SAMPLES, n as u64), (1000, 32)] {
        ctx.latency_samples = samples;
        let mut want = crate::bench::footprint::Footprint::default();
        for gpu in [0, 1] {
            want.add(crate::backend::Memory::Device(gpu), placements, 2 << 20);
        }
        assert_eq!(
            PingPong.footprint(&ctx, place, 4).unwrap(),
            want,
            "{samples} samples"
        );
    }
    ctx.latency_samples = LATENCY_SAMPLES;
    assert_eq!(samples(&mut ctx, &PointerChase(ChaseChain::Flushed)), 3);
    // `bench --samples N` sets both.
    let report = bench(
        &h100,
        Options {
            tests: names(&["copy-latency", "ce-write"]),
            devices: Some(vec![0, 1]),
            size: Some(Size::Bytes(64 << 10)),
            samples: Some(2),
            ..Options::default()
        },
    );
    for t in &report.tests {
        assert!(t.cells.iter().all(|c| c.time_us.samples == 2), "{}", t.name);
    }
}

#[test]
fn corrupted_or_stale_destinations_fail_verification() {
    let h100 = sim("dgx-h100");
    let mut ctx = Context::new(
        &h100,
        vec![0, 2],
        Defaults::for_backend(&h100).sampling,
        1 << 20,
    );
    ctx.backend.enable_peer_access(0, 2).unwrap();
    let test = PeerCopy::new(
        "ce",
        Transport::Direct(CopyMethod::CopyEngine),
        Initiator::Source,
        false,
    );
    let sampling = ctx.sampling;
    let mut lanes = test.lanes(&mut ctx, &[(0, 2)], 4096, &sampling).unwrap();
    measure(&mut lanes, &sampling, 1).unwrap();

    // Corrupt one byte of the destination after sampling.
    let lane = &lanes[0];
    let mut byte = [0u8];
    h100.read(lane.destination(), 1000, &mut byte).unwrap();
    h100.write(lane.destination(), 1000, &[!byte[0]]).unwrap();
    let wrong = pattern::Mismatch {
        offset: 1000,
        expected: byte[0],
        found: !byte[0],
    };
    let err = lane.verify().unwrap_err();
    assert_eq!(
        err.to_string(),
        wrong.into_error("ce-write", 0, 2).to_string()
    );

    // Stale: new source data that was never copied.
    lanes[0].fill(99).unwrap();
    let err = lanes[0].verify().unwrap_err();
    assert_eq!(err.exit_code(), 1);
    assert!(err.to_string().contains("offset 0"), "{err}");
}

#[test]
fn a_corrupted_copy_is_caught_in_any_rotation_slot_on_the_gpu_and_on_the_host() {
    use crate::backend::Memory;
    use timing::{HopSpec, Lane};
    let h100 = sim("dgx-h100");
    h100.enable_peer_access(0, 2).unwrap();
    let sampling = Sampling {
        warmup: 1,
        iterations: 3,
        samples: 2,
        rotation_bytes: 64 << 10,
    };
    let message = 4096 + 3;
    let stream = h100.create_stream(0).unwrap();
    let pinned = Memory::PinnedHost { numa_node: None };
    // Checked on GPU 2 (device memory), then on the host (pinned memory).
    for (dst, memory) in [(2, Memory::Device(2)), (0, pinned)] {
        let hop = HopSpec {
            stream,
            method: CopyMethod::CopyEngine,
            memory,
        };
        let label = Context::label("ce-write", 0, dst);
        let mut lanes = [Lane::new(
            &h100,
            label,
            Memory::Device(0),
            &[hop],
            message,
            &sampling,
            1 << 30,
        )
        .unwrap()];
        assert_eq!(lanes[0].slots(), 4, "every operation in its own slot");
        measure(&mut lanes, &sampling, 5).unwrap();
        let lane = &lanes[0];
        let stride = h100.len(lane.destination()).unwrap() / lane.slots();
        for (slot, at) in [(0, 0), (2, 77), (3, message - 1)] {
            let offset = slot * stride + at;
            let mut byte = [0u8];
            h100.read(lane.destination(), offset, &mut byte).unwrap();
            h100.write(lane.destination(), offset, &[byte[0] ^ 0x10])
                .unwrap();
            let wrong = pattern::Mismatch {
                offset: at,
                expected: byte[0],
                found: byte[0] ^ 0x10,
            };
            let want = wrong.into_error("ce-write", 0, dst).to_string();
            let err = lane.verify().unwrap_err();
            assert_eq!(err.to_string(), want, "{memory:?} slot {slot}");
            h100.write(lane.destination(), offset, &byte).unwrap();
            lane.verify().unwrap();
        }
    }
}

#[test]
fn first_use_holds_and_releases_one_stream_per_gpu_for_the_tests() {
    let h100 = sim("dgx-h100");
    let sampling = Defaults::for_backend(&h100).sampling;
    let mut ctx = Context::new(&h100, vec![0, 2, 5], sampling, 1 << 20);
    let before = h100.host_time_us();
    first_use(&mut ctx).unwrap();
    // Each GPU's gate was released at once: one left held would keep its stream, and the
    // synchronisation after it, waiting for its timeout (a second of the virtual clock).
    assert!(h100.host_time_us() - before < 300.0);
    let made = h100.create_stream(0).unwrap();
    // The streams were the context's: the tests get them back rather than new ones.
    let streams = ctx.streams(&[0, 2, 5]).unwrap();
    assert!(streams.iter().all(|s| s.0 < made.0), "{streams:?} {made:?}");
}

#[test]
fn staged_lanes_deliver_every_byte_across_chunks_and_rotation() {
    let box4 = sim("pcie-4gpu-2socket");
    let sampling = timing::Sampling {
        warmup: 2,
        iterations: 3,
        samples: 2,
        rotation_bytes: 64 << 20,
    };
    let mut ctx = Context::new(&box4, vec![0, 3], sampling, 1 << 20);
    let test = PeerCopy::new("staged", Transport::Staged, Initiator::Source, true);
    // 5 MiB + 3 bytes: several staging chunks, the last one short; both directions at once.
    let mut lanes = test
        .lanes(&mut ctx, &[(0, 3), (3, 0)], (5 << 20) + 3, &sampling)
        .unwrap();
    assert!(lanes[0].slots() > 1, "rotation over several slots");
    let m = measure(&mut lanes, &sampling, 7).unwrap();
    assert_eq!(m.lane_us.len(), 2);
    assert_eq!(m.lane_us[0].samples, 2);
    for lane in &lanes {
        lane.verify().unwrap();
    }
}

#[test]
fn a_rotation_past_the_simulators_cap_is_bounded_and_said() {
    let h100 = sim("dgx-h100");
    let report = bench(
        &h100,
        Options {
            tests: names(&["ce-write"]),
            devices: Some(vec![0, 1]),
            rotation: Some(1 << 40),
            iterations: Some(1001),
            ..Options::default()
        },
    );
    assert_eq!(report.timing.rotation_bytes, SIM_ROTATION_CAP);
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("--rotation 1 TiB bounded to 16 MiB")),
        "{:?}",
        report.notes
    );
    let within_cap = bench(
        &h100,
        Options {
            tests: names(&["ce-write"]),
            devices: Some(vec![0, 1]),
            rotation: Some(SIM_ROTATION_CAP),
            ..Options::default()
        },
    );
    assert_eq!(within_cap.timing.rotation_bytes, SIM_ROTATION_CAP);
    assert!(!within_cap.notes.iter().any(|n| n.contains("bounded")));
}

#[test]
fn bad_input_is_a_usage_error() {
    let h100 = sim("dgx-h100");
    let usage = |options: Options| {
        let err = run(&h100, &options, &progress::Silent).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        err.to_string()
    };
    let unknown = usage(Options {
        tests: names(&["ce-write", "warp-drive"]),
        ..Options::default()
    });
    assert!(
        unknown.contains("warp-drive") && unknown.contains("pointer-chase"),
        "{unknown}"
    );
    let too_big = usage(Options {
        size: Some(Size::Bytes(1 << 40)),
        ..Options::default()
    });
    assert!(
        too_big.contains("which has") && too_big.contains("free: choose a smaller --size"),
        "{too_big}"
    );
    let gpu = usage(Options {
        devices: Some(vec![8]),
        ..Options::default()
    });
    assert!(gpu.contains("GPU 8 does not exist"), "{gpu}");
    usage(Options {
        iterations: Some(0),
        ..Options::default()
    });
    let no_sweep = usage(Options {
        tests: names(&["ping-pong"]),
        sizes: Some(vec![4, 8]),
        ..Options::default()
    });
    assert!(no_sweep.contains("no size sweep"), "{no_sweep}");
}

#[test]
fn explain_parts_add_up_on_direct_and_staged_pairs() {
    for (preset, src, dst, size) in [
        ("dgx-h100", 0, 5, 4096),
        ("dgx-h100", 2, 2, 1 << 20),
        ("pcie-4gpu-2socket", 0, 3, 64 << 10),
    ] {
        let backend = sim(preset);
        let e = explain::run(&backend, src, dst, size, &progress::Silent).unwrap();
        assert!(e.adds_up_within_10_percent, "{preset} {src}->{dst}: {e:#?}");
        let sum: f64 = e.parts.iter().map(|p| p.us).sum();
        assert!(within(sum, e.sum_us, 1e-9));
        assert!(within(e.measured_us, e.sum_us, 0.10));
        let names: Vec<&str> = e.parts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["launch overhead", "link transfer", "receiver side"]);
        assert!(e.fixes.iter().all(|f| f.saves_us.is_finite()));
        assert!(e.fit.is_some());
        assert_eq!(e.route.starts_with("no P2P"), preset.starts_with("pcie"));
    }
}

#[test]
fn explain_rejects_gpus_out_of_range() {
    let h100 = sim("dgx-h100");
    let err = explain::run(&h100, 0, 9, 4, &progress::Silent).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("--dst"), "{err}");
}

/// `ce-write` that fails from its second place on, as a transfer that fails verification would.
struct FailsAfterOne {
    inner: Box<dyn TestCase>,
    measured: std::sync::atomic::AtomicUsize,
}

impl TestCase for FailsAfterOne {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn unit(&self) -> result::Unit {
        self.inner.unit()
    }
    fn shape(&self) -> Shape {
        self.inner.shape()
    }
    fn measures(&self) -> String {
        self.inner.measures()
    }
    fn measure(&self, ctx: &mut Context<'_>, place: Place, bytes: u64) -> Result<Outcome> {
        use std::sync::atomic::Ordering;
        if self.measured.fetch_add(1, Ordering::SeqCst) > 0 {
            return Err(Error::Cuda {
                call: "cuMemcpyAsync (made up)".into(),
                message: "the test's failure".into(),
            });
        }
        self.inner.measure(ctx, place, bytes)
    }
}

#[test]
fn a_failure_part_way_keeps_the_places_measured_before_it() {
    let h100 = sim("dgx-h100");
    let sampling = Defaults::for_backend(&h100).sampling;
    let mut ctx = Context::new(&h100, vec![0, 1, 2], sampling, 1 << 20);
    let test = FailsAfterOne {
        inner: find_test("ce-write").unwrap(),
        measured: Default::default(),
    };
    let kept = run_test(&mut ctx, &test, 1 << 20, &progress::Silent);
    let failure = kept.failure.expect("the second place failed").to_string();
    assert!(failure.contains("the test's failure"), "{failure}");
    let result = kept.found;
    assert_eq!(result.cells.len(), 1, "the first pair is kept");
    assert_eq!(
        result.cell(Place::Pair { src: 0, dst: 1 }).unwrap().place,
        Place::Pair { src: 0, dst: 1 }
    );
    let failed = result.reason(Place::Pair { src: 0, dst: 2 }).unwrap();
    assert!(
        failed.starts_with("failed: ") && failed.contains("the test's failure"),
        "{failed}"
    );
    // Every later pair says why it was not measured.
    assert_eq!(
        result.reason(Place::Pair { src: 2, dst: 1 }),
        Some(STOPPED_BY_FAILURE)
    );
}
