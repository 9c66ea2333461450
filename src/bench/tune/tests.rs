//! `tune` on the simulator, whose presets say exactly what a measurement must find.

use super::*;
use crate::backend::sim::{Preset, SimBackend};
use crate::bench::compare::compare;
use crate::bench::document::BenchDocument;
use crate::bench::progress::Silent;
use crate::bench::proof::document::RouteName;
use crate::model::CostModel;
use crate::topology::Link;
use std::sync::Arc;

/// `tune` on `sim`, which it shares with the engine it runs splits on.
fn tune_on(sim: &Arc<SimBackend>, options: &Options) -> Measurements {
    let shared: Arc<dyn crate::backend::Backend> = sim.clone();
    run(&shared, options, &Silent).unwrap()
}

fn tuned(
    preset: &str,
    devices: Option<Vec<usize>>,
    latencies: bool,
) -> (Arc<SimBackend>, Measurements) {
    let sim = Arc::new(SimBackend::open(preset).unwrap());
    let options = Options {
        devices,
        quick: true,
        latencies,
    };
    let m = tune_on(&sim, &options);
    (sim, m)
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

fn cost(m: &Measurements, hop: Hop) -> Cost {
    m.hops
        .iter()
        .find(|h| h.hop == hop)
        .and_then(HopSweep::cost)
        .unwrap_or_else(|| panic!("{hop:?} not measured"))
}

#[test]
fn dgx1_profile_fits_the_preset_link_model_and_matches_the_host() {
    // 0–1 and 1–3 are NV1, 0–3 is NV2 (docs/reference.md).
    let (sim, m) = tuned("dgx1-v100", Some(vec![0, 1, 3]), false);
    let preset = Preset::load("dgx1-v100").unwrap();
    let nv = preset.nvlink.as_ref().unwrap();
    let per_link = nv.link_gbps * nv.efficiency;
    let nv1 = cost(&m, Hop::PeerCe { src: 0, dst: 1 });
    let nv2 = cost(&m, Hop::PeerCe { src: 0, dst: 3 });
    assert!(close(nv1.beta_gbps, per_link, 1e-6), "{nv1:?}");
    assert!(close(nv2.beta_gbps / nv1.beta_gbps, 2.0, 1e-6), "{nv2:?}");
    // A copy's α is its setup plus the route's latency.
    assert!(close(
        nv1.alpha_us,
        preset.costs.copy_setup_us + nv.latency_us,
        1e-6
    ));
    let sm = cost(&m, Hop::PeerSm { src: 0, dst: 3 });
    assert!(close(
        sm.beta_gbps,
        nv2.beta_gbps * preset.gpu.sm_copy_efficiency,
        1e-6
    ));
    let local = cost(&m, Hop::Local { device: 3 });
    assert!(close(local.beta_gbps, preset.gpu.local_copy_gbps, 1e-6));
    assert!(close(local.alpha_us, preset.costs.copy_setup_us, 1e-6));
    // Host memory on either socket, for every selected GPU and no other.
    for node in [0, 1] {
        let h2d = cost(
            &m,
            Hop::HostToDevice {
                device: 1,
                node: Some(node),
            },
        );
        assert!(close(h2d.beta_gbps, preset.pcie.host_gbps, 1e-6), "{h2d:?}");
    }
    assert!(!m
        .hops
        .iter()
        .any(|h| matches!(h.hop, Hop::Local { device: 2 } | Hop::PeerCe { dst: 2, .. })));

    // The issue costs are the preset's CPU costs, and the graph node its GPU cost: a held window
    // keeps the launch out of the node time.
    let c = &preset.costs;
    assert!(
        close(m.issue.copy_us, c.copy_issue_us, 1e-9),
        "{:?}",
        m.issue
    );
    assert!(close(m.issue.kernel_us, c.kernel_issue_us, 1e-9));
    assert!(close(m.issue.event_us, c.event_issue_us, 1e-9));
    assert!(close(m.issue.graph_us, c.graph_issue_us, 1e-9));
    assert!(close(m.sync_us, c.sync_us, 1e-9));
    // On the simulator a marker's trip is the wake-up alone: nothing else to pick up or signal.
    assert!(close(m.receiver_us, c.sync_us, 1e-9), "{}", m.receiver_us);
    assert!(
        close(m.graph_node_us, c.graph_node_us, 1e-4),
        "{}",
        m.graph_node_us
    );
    // The simulator has no per-message cost in a batch kernel beyond the bytes.
    assert!(m.batch_message_us < 1e-3, "{}", m.batch_message_us);

    let profile = m.profile(sim.topology());
    profile.check_matches(sim.topology()).unwrap();
    assert_eq!(profile.issue, Some(m.issue));
    assert!(profile.measured_on.is_some());
    let model = CostModel::from_profile(sim.topology(), &profile).unwrap();
    assert_eq!(model.cost(Hop::PeerCe { src: 0, dst: 3 }), Some(nv2));
    assert_eq!(model.graph_node_us(), m.graph_node_us);
}

#[test]
fn one_gpu_measures_what_it_can_and_says_there_are_no_peer_pairs() {
    let (_, m) = tuned("pcie-2gpu-switch", Some(vec![1]), false);
    assert!(!m
        .hops
        .iter()
        .any(|h| matches!(h.hop, Hop::PeerCe { .. } | Hop::PeerSm { .. })));
    let kinds: Vec<Hop> = m.hops.iter().map(|h| h.hop).collect();
    assert_eq!(
        kinds,
        [
            Hop::HostToDevice {
                device: 1,
                node: Some(0)
            },
            Hop::DeviceToHost {
                device: 1,
                node: Some(0)
            },
            Hop::Local { device: 1 },
        ]
    );
    assert!(m.hops.iter().all(|h| h.sweep.fit.is_some()));
    assert!(
        m.notes.iter().any(|n| n.contains("no peer pairs")),
        "{:?}",
        m.notes
    );
    assert!(m.issue.copy_us > 0.0 && m.graph_node_us > 0.0);
}

#[test]
fn lone_operations_are_timed_for_both_methods_on_each_gpu_and_each_p2p_pair() {
    let (sim, m) = tuned("pcie-4gpu-2socket", None, false);
    let pairs: Vec<(usize, usize)> = m
        .lone
        .iter()
        .filter_map(|l| match l.hop {
            Hop::PeerCe { src, dst } => Some((src, dst)),
            _ => None,
        })
        .collect();
    // Each GPU to itself and the two PIX pairs; not the pairs across sockets (no P2P).
    assert_eq!(
        pairs,
        [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
            (2, 2),
            (2, 3),
            (3, 2),
            (3, 3)
        ]
    );
    // Both direct methods and a resident worker on each.
    assert_eq!(m.lone.len(), 3 * pairs.len());
    assert!(m
        .lone
        .iter()
        .any(|l| l.hop == Hop::Resident { src: 2, dst: 3 } && l.lone_us > 0.0));
    // The preset's lone copy: its issue, its setup, and the route's latency, nothing more.
    let local = m
        .lone
        .iter()
        .find(|l| l.hop == Hop::PeerCe { src: 0, dst: 0 })
        .unwrap();
    assert!(local.lone_us > 0.0 && local.lone_us < 10.0, "{local:?}");
    let over_pcie = m
        .lone
        .iter()
        .find(|l| l.hop == Hop::PeerCe { src: 0, dst: 1 })
        .unwrap();
    assert!(
        over_pcie.lone_us > local.lone_us,
        "{over_pcie:?} vs {local:?}"
    );
    // And the profile carries them to the planner's model.
    let topo = sim.topology();
    let model = CostModel::from_profile(topo, &m.profile(topo)).unwrap();
    let hop = Hop::PeerSm { src: 3, dst: 2 };
    let measured = m.lone.iter().find(|l| l.hop == hop).map(|l| l.lone_us);
    assert!(measured.is_some());
    assert_eq!(model.lone_us(hop), measured);
}

#[test]
fn pairs_without_p2p_are_named_not_measured() {
    // 0 and 5 sit on different sockets of a DGX-1 without NVLink between them.
    let (_, m) = tuned("dgx1-v100", Some(vec![0, 5]), false);
    assert!(!m.hops.iter().any(|h| matches!(h.hop, Hop::PeerCe { .. })));
    assert!(
        m.notes
            .iter()
            .any(|n| n.contains("no selected pair has P2P")),
        "{:?}",
        m.notes
    );
}

#[test]
fn the_exported_wake_up_is_the_receiver_side_not_a_sync_on_a_finished_event() {
    // On real GPUs the two differ by the GPU's pick-up and completion signal (H200: 5.1 µs for
    // an empty marker against 0.3 µs to return from a sync on a finished event), and the
    // simulator's sync_us follows the GPU's end, so it takes the marker's figure.
    let (sim, mut m) = tuned("pcie-2gpu-switch", None, false);
    m.receiver_us = 5.07;
    m.sync_us = 0.33;
    let exported = export::preset(&m, sim.topology(), "tuned").unwrap();
    assert_eq!(exported.costs.sync_us, 5.07);
    assert!(exported
        .sources
        .iter()
        .any(|s| s.contains("sync_us 5.07 µs")));
}

#[test]
fn exported_preset_reproduces_a_pcie_host() {
    let (sim, m) = tuned("pcie-4gpu-2socket", None, true);
    let original = Preset::load("pcie-4gpu-2socket").unwrap();
    let exported = export::preset(&m, sim.topology(), "tuned").unwrap();
    let (a, b) = (original.topology(), exported.topology());
    for (p, q) in a.pairs.iter().zip(&b.pairs) {
        assert_eq!((p.src, p.dst, p.link, p.p2p), (q.src, q.dst, q.link, q.p2p));
    }
    for (d, e) in a.devices.iter().zip(&b.devices) {
        assert_eq!((d.numa_node, &d.pci_bus_id), (e.numa_node, &e.pci_bus_id));
    }
    // GPUs under one switch in the original are under one switch in the copy.
    let switch = |p: &Preset, i: usize| p.devices[i].pcie_switch.clone();
    assert!(switch(&exported, 0).is_some());
    assert_eq!(switch(&exported, 0), switch(&exported, 1));
    assert_ne!(switch(&exported, 1), switch(&exported, 2));
    // Rates and overheads are the measured ones, which here are the original's.
    // Only the classes this host has: its pairs are PIX or SYS without P2P.
    let pix = original.pcie.p2p_gbps[&Link::Pix];
    assert_eq!(
        exported.pcie.p2p_gbps,
        std::collections::BTreeMap::from([(Link::Pix, pix)])
    );
    assert_eq!(exported.pcie.host_gbps, original.pcie.host_gbps);
    assert_eq!(exported.pcie.latency_us, original.pcie.latency_us);
    assert_eq!(exported.gpu.local_copy_gbps, original.gpu.local_copy_gbps);
    assert_eq!(
        exported.gpu.sm_copy_efficiency,
        original.gpu.sm_copy_efficiency
    );
    assert_eq!(exported.costs.copy_setup_us, original.costs.copy_setup_us);
    assert_eq!(
        exported.costs.kernel_setup_us,
        original.costs.kernel_setup_us
    );
    assert_eq!(exported.costs.graph_node_us, original.costs.graph_node_us);
    assert_eq!(exported.costs.sync_us, original.costs.sync_us);
    assert!(close(
        exported.pcie.load_latency_ns,
        original.pcie.load_latency_ns,
        1e-3
    ));
    assert!(exported.nvlink.is_none() && exported.nvswitch.is_none());
    assert!(exported.description.contains("SIMULATED"));
    assert!(exported.sources[0].starts_with(&format!(
        "measured by peerlink tune on {}, sim:pcie-4gpu-2socket",
        m.measured_on
    )));
}

#[test]
fn exported_nvswitch_host_keeps_its_switch_and_per_link_rate() {
    let (sim, m) = tuned("dgx-h100", Some(vec![0, 1]), false);
    let original = Preset::load("dgx-h100").unwrap();
    let exported = export::preset(&m, sim.topology(), "h100-tuned").unwrap();
    assert_eq!(exported.nvswitch, original.nvswitch);
    assert!(exported.links.is_empty());
    let (nv, was) = (
        exported.nvlink.as_ref().unwrap(),
        original.nvlink.as_ref().unwrap(),
    );
    assert!(close(
        nv.link_gbps * nv.efficiency,
        was.link_gbps * was.efficiency,
        1e-3
    ));
    assert!(close(nv.latency_us, was.latency_us, 1e-3));
    // Latencies were not asked for: they come from the fallback preset, and the sources say so.
    assert!(exported
        .sources
        .iter()
        .any(|s| s.contains("not measured, taken from the embedded dgx-h100 preset")));
    assert_eq!(exported.topology().pairs, original.topology().pairs);
}

/// Every figure of the default bench on `preset` against the same bench on the preset tune
/// exports from it (`tune --export-sim`, then `compare`): within 10%.
fn exported_bench_matches(preset: &str) {
    let (sim, m) = tuned(preset, None, true);
    let exported = SimBackend::from_preset(&export::preset(&m, sim.topology(), "tuned").unwrap());
    let bench = |backend: &dyn crate::backend::Backend| {
        let options = crate::bench::Options {
            size: Some(crate::bench::Size::Bytes(4 << 20)),
            ..Default::default()
        };
        let report = crate::bench::run(backend, &options, &Silent).unwrap();
        BenchDocument::new(backend.topology(), report)
    };
    let (was, now) = (bench(&*sim), bench(&exported));
    let c = compare(&was, &now, preset, "exported");
    assert!(c.unmatched.is_empty(), "{:?}", c.unmatched);
    let tests: std::collections::BTreeSet<&str> = c.pairs.iter().map(|p| p.test.as_str()).collect();
    for name in [
        "copy-latency",
        "issue-cost",
        "e2e-latency",
        "local",
        "ce-write",
        "ping-pong",
    ] {
        assert!(
            tests.iter().any(|t| t.starts_with(name)),
            "{name} not compared"
        );
    }
    for p in &c.pairs {
        assert!(
            (p.ratio - 1.0).abs() <= 0.10,
            "{preset}: {} {}: {} against {}",
            p.test,
            p.place,
            p.other,
            p.base
        );
    }
}

#[test]
fn the_exported_simulator_benches_within_ten_percent_of_its_host() {
    exported_bench_matches("h200-pair");
    exported_bench_matches("pcie-2gpu-switch");
}

#[test]
fn the_export_takes_the_small_copy_time_and_the_local_plateau_over_the_fits() {
    // As on the H200 pair: a 4 B copy over NVLink takes 2.27 µs while the sweeps' α is 2.75, and
    // local copies reach 2050 GB/s at 1 GiB while the fit over 4 KiB–32 MiB says 1887.
    let (sim, mut m) = tuned("h200-pair", None, true);
    let alpha = cost(&m, Hop::Local { device: 0 }).alpha_us;
    let l = m.latencies.as_mut().unwrap();
    l.nvlink.as_mut().unwrap().copy_us = 2.27;
    l.local.copy_us = 1.9;
    l.local_plateau.bytes = 1 << 30;
    l.local_plateau.median_us = alpha + (1u64 << 30) as f64 / 2050e3;
    let exported = export::preset(&m, sim.topology(), "tuned").unwrap();
    assert!(close(exported.gpu.local_copy_gbps, 2050.0, 1e-3));
    assert!(close(exported.costs.copy_setup_us, 1.9, 1e-2));
    let nv = exported.nvlink.unwrap();
    // setup + latency + 4 B at NVLink's rate = the measured 2.27 µs.
    assert!(close(
        exported.costs.copy_setup_us + nv.latency_us,
        2.27,
        1e-2
    ));
    assert!(exported
        .sources
        .iter()
        .any(|s| s.contains("copy-latency") && s.contains("1 GiB")));
}

#[test]
fn the_issue_cost_is_measured_on_a_peer_pair_as_the_bench_does() {
    let (_, m) = tuned("h200-pair", None, false);
    assert!(
        m.notes
            .iter()
            .any(|n| n.contains("from GPU 0 to GPU 1") && n.contains("issue-cost")),
        "{:?}",
        m.notes
    );
    let (_, one) = tuned("h200-pair", Some(vec![1]), false);
    assert!(one.notes.iter().any(|n| n.contains("from GPU 1 to GPU 1")));
}

#[test]
fn the_exported_simulator_reproduces_the_resident_pointer_chase() {
    // Resident figures far from both the flushed ones and the defaults (nvbandwidth's 826 ns over
    // NVLink, the flushed figure within a GPU): ignored anywhere along tune → export → bench, the
    // exported simulator would report one of those instead.
    let mut preset = Preset::load("h200-pair").unwrap();
    preset.gpu.resident_load_latency_ns = Some(250.0);
    preset
        .nvlink
        .as_mut()
        .expect("an NVLink pair")
        .resident_load_latency_ns = Some(500.0);
    let sim = Arc::new(SimBackend::from_preset(&preset));
    let options = Options {
        devices: None,
        quick: true,
        latencies: true,
    };
    let m = tune_on(&sim, &options);
    let l = m.latencies.expect("latencies measured");
    assert!(close(l.local.resident_load_ns, 250.0, 0.01), "{l:?}");
    let nvlink = l.nvlink.expect("the NVLink pair");
    assert!(close(nvlink.resident_load_ns, 500.0, 0.01), "{nvlink:?}");
    assert!(close(nvlink.load_ns, 1013.0, 0.01), "{nvlink:?}");

    let exported = export::preset(&m, sim.topology(), "tuned").unwrap();
    let nv = exported.nvlink.as_ref().unwrap();
    assert!(close(nv.resident_load_ns(), 500.0, 0.01), "{nv:?}");
    assert!(close(exported.gpu.resident_load_ns(), 250.0, 0.01));
    assert!(exported
        .sources
        .iter()
        .any(|s| s.contains("nvlink.resident_load_latency_ns")
            && s.contains("pointer-chase-resident")));

    let chases = |backend: &dyn crate::backend::Backend| {
        let options = crate::bench::Options {
            tests: Some(vec![
                "pointer-chase".into(),
                "pointer-chase-resident".into(),
            ]),
            ..Default::default()
        };
        let report = crate::bench::run(backend, &options, &Silent).unwrap();
        report
            .tests
            .iter()
            .map(|t| t.cells[0].value)
            .collect::<Vec<f64>>()
    };
    let (host, model) = (chases(&*sim), chases(&SimBackend::from_preset(&exported)));
    assert!(
        close(host[1], 500.0, 0.01),
        "the host's resident chase: {host:?}"
    );
    for (was, now) in host.iter().zip(&model) {
        assert!(
            close(*now, *was, 0.01),
            "{host:?} against the exported {model:?}"
        );
    }
}

#[test]
fn the_host_routes_pace_beside_nvlink_is_measured_and_the_split_then_ends_together() {
    use crate::bench::proof::sweep::BALANCE_TOLERANCE;
    use crate::engine::{Fabric, Strategy};
    let (sim, m) = tuned("h200-pair", None, false);
    let pairs: Vec<(usize, usize)> = m.splits.iter().map(|p| (p.src, p.dst)).collect();
    assert_eq!(pairs, vec![(0, 1), (1, 0)]);
    // The same host without the slowdown beside NVLink: the preset slows the host route's
    // device → host copies to 0.885 of their rate there, and the measured rate follows.
    let mut unslowed = Preset::load("h200-pair").unwrap();
    unslowed.gpu.host_copy_beside_peer = None;
    let alone = tune_on(
        &Arc::new(SimBackend::from_preset(&unslowed)),
        &Options {
            devices: None,
            quick: true,
            latencies: false,
        },
    );
    let host_end = |run: &beside::SplitRun| {
        let host = run.routes.iter().find(|r| r.route == RouteName::Host);
        (host.unwrap().bytes, host.unwrap().measured_us)
    };
    for (p, q) in m.splits.iter().zip(&alone.splits) {
        for (slowed, unslowed) in p.first.iter().zip(&q.first) {
            // The same split (both planned with the estimate), its host route slower beside NVLink.
            let ((bytes, slow_us), (same, fast_us)) = (host_end(slowed), host_end(unslowed));
            assert_eq!(bytes, same);
            assert!(slow_us > 1.05 * fast_us, "{p:#?} against {q:#?}");
        }
        // Planned with the estimate the routes end apart (the host route early: the estimate is
        // the real pair's, slower than the simulator's); planned with the measured figures they
        // end together, at both sizes. (Without the slowdown the simulator's host route runs
        // further from the model's — whose fixed costs per chunk and per transfer are the real
        // pair's — than the two figures can make up.)
        assert!(
            p.first.iter().all(|run| run.spread > BALANCE_TOLERANCE),
            "{p:#?}"
        );
        assert_eq!(p.check.len(), 2, "{p:#?}");
        assert!(
            p.check.iter().all(|run| run.spread <= BALANCE_TOLERANCE),
            "{p:#?}"
        );
    }
    // The profile keeps each pair's figures, and reads back as it was written.
    let profile = m.profile(sim.topology());
    let kept: Vec<(f64, f64)> = profile
        .beside_direct
        .iter()
        .map(|b| (b.rate_fraction, b.chunk_us))
        .collect();
    let measured: Vec<(f64, f64)> = m
        .splits
        .iter()
        .filter_map(|p| p.kept().map(|fit| (fit.rate_fraction, fit.chunk_us)))
        .collect();
    assert_eq!(kept, measured);
    assert_eq!(kept.len(), 2, "{m:#?}");
    // Nothing the profile keeps sits on a bound of the fit or beyond what is possible: the
    // simulator's host route runs faster than both figures can make the model's, so the fit of
    // the rate and a cost per transfer is kept.
    for b in &profile.beside_direct {
        assert!(
            b.rate_fraction <= 1.0
                && b.chunk_us.abs() < 0.99 * crate::model::profile::MAX_CHUNK_US
                && b.fixed_us.abs() < 0.99 * crate::model::profile::MAX_CHUNK_US,
            "{b:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    profile.save(&path).unwrap();
    assert_eq!(Profile::load(&path).unwrap(), profile);
    // A fabric planning from the profile divides a split of a size between the measured ones so
    // that its routes end together.
    let model = CostModel::from_profile(sim.topology(), &profile).unwrap();
    let shared: Arc<dyn crate::backend::Backend> = sim.clone();
    let fabric = Fabric::builder(shared).model(model).open().unwrap();
    let len = 96 << 20;
    let (from, to) = (fabric.alloc(0, len).unwrap(), fabric.alloc(1, len).unwrap());
    let t = fabric
        .transfer(from.all(), to.all())
        .strategy(Strategy::Split)
        .timed()
        .submit()
        .unwrap();
    let ends: Vec<f64> = t.route_ends().unwrap().iter().map(|e| e.end_us).collect();
    let spread = crate::bench::proof::sweep::route_spread(ends.clone()).unwrap();
    assert!(spread <= BALANCE_TOLERANCE, "{ends:?}");
}

/// Both GPUs of `sim` split `bytes` to each other at once (submitted together), planned from
/// `model`: each flow's GPU time and how far apart its routes ended. Every byte checked.
fn both_ways_splits(sim: &Arc<SimBackend>, model: CostModel, bytes: usize) -> Vec<(f64, f64)> {
    use crate::engine::{Fabric, Strategy};
    let backend: Arc<dyn crate::backend::Backend> = sim.clone();
    let fabric = Fabric::builder(backend).model(model).open().unwrap();
    let buffers: Vec<_> = [(0, 1), (1, 0)]
        .iter()
        .map(|&(a, b)| {
            let from = fabric.alloc(a, bytes).unwrap();
            let data = crate::pattern::bytes(a as u64, bytes);
            from.write(0, &data).unwrap();
            (from, fabric.alloc(b, bytes).unwrap(), data)
        })
        .collect();
    let transfers = fabric
        .submit_together(
            buffers
                .iter()
                .map(|(from, to, _)| {
                    fabric
                        .transfer(from.all(), to.all())
                        .strategy(Strategy::Split)
                        .timed()
                })
                .collect(),
        )
        .unwrap();
    let flows = transfers
        .iter()
        .map(|t| {
            let ends = t
                .route_ends()
                .unwrap()
                .iter()
                .map(|e| e.end_us)
                .collect::<Vec<_>>();
            let spread = crate::bench::proof::sweep::route_spread(ends).unwrap();
            (t.elapsed_us().unwrap(), spread)
        })
        .collect();
    for (from, to, data) in &buffers {
        assert_eq!(&to.to_vec().unwrap(), data, "GPU {}", from.device());
    }
    flows
}

#[test]
fn the_host_route_both_ways_is_measured_and_both_ways_splits_then_end_together() {
    use crate::bench::proof::sweep::BALANCE_TOLERANCE;
    let (sim, m) = tuned("h200-pair", None, false);
    let both = m.both_ways.as_ref().expect("the pair splits both ways");
    assert_eq!(both.pair, (0, 1));
    // The preset slows host copies both ways to 0.90 of their rate: the fit finds about that.
    let fraction = both.fraction.expect("a possible fraction");
    assert!((0.8..0.97).contains(&fraction), "{both:#?}");
    assert!(
        both.check.iter().all(|run| run.spread <= BALANCE_TOLERANCE),
        "{both:#?}"
    );
    // The exported simulator slows host copies both ways by the fitted fraction.
    let exported = export::preset(&m, sim.topology(), "tuned").unwrap();
    let exported_fraction = exported.pcie.both_ways_fraction.expect("exported");
    assert!(
        close(exported_fraction, fraction, 1e-3),
        "{exported_fraction}"
    );
    let profile = m.profile(sim.topology());
    for b in &profile.beside_direct {
        let kept = b.both_ways.as_ref().expect("both directions keep it");
        assert_eq!(kept.fraction, fraction);
        assert_eq!(kept.splits.len(), 2, "{b:?}");
    }
    // Planned with the one-way figures alone (both ways priced as one way), the host routes end
    // late; with the fitted fraction the routes end together and each flow is sooner.
    let with_fit = CostModel::from_profile(sim.topology(), &profile).unwrap();
    let one_way = with_fit
        .clone()
        .with_both_ways(0, 1, 1.0)
        .with_both_ways(1, 0, 1.0);
    let bytes = 96 << 20;
    let (late, together) = (
        both_ways_splits(&sim, one_way, bytes),
        both_ways_splits(&sim, with_fit, bytes),
    );
    let summed = |flows: &[(f64, f64)]| -> f64 {
        flows.iter().map(|(us, _)| bytes as f64 / (us * 1e3)).sum()
    };
    assert!(
        late.iter().all(|&(_, spread)| spread > BALANCE_TOLERANCE),
        "{late:?}"
    );
    assert!(
        together
            .iter()
            .all(|&(_, spread)| spread <= BALANCE_TOLERANCE),
        "{together:?}"
    );
    assert!(
        summed(&together) > summed(&late),
        "{together:?} against {late:?}"
    );
}
