use super::copy_engines::CopyEngines;
use super::pricing::pipeline_us;
use super::sharing::Lane;
use super::*;
use crate::backend::CopyMethod;
use crate::engine::plan::{BatchPlan, BatchStrategy, Plan, Route, Strategy, Ways};
use crate::model::test_support::{dgx1, nvlink_pair, nvswitch8, pcie_2socket};
use crate::model::{BesideDirect, Cost, Hop};

fn planner(topology: crate::topology::Topology) -> Planner {
    Planner::new(CostModel::from_topology(&topology))
}

const MIB: u64 = 1 << 20;

#[test]
fn gathered_messages_are_packed_aligned() {
    let (offsets, len) = packing(&[1, 16, 17, 3]);
    assert_eq!(offsets, vec![0, 16, 32, 64]);
    assert_eq!(len, 80);
}

#[test]
fn chunking_covers_the_transfer_with_aligned_chunks() {
    assert_eq!(chunking(10 * MIB, MIB), (MIB, 10));
    let (len, count) = chunking(10 * MIB + 1, MIB);
    assert_eq!(len % ALIGN, 0);
    assert!(len * count > 10 * MIB && len * (count - 1) <= 10 * MIB);
    assert_eq!(chunking(100, MIB), (100, 1));
    assert_eq!(chunking(5000, 4096), (4096, 2));
}

#[test]
fn pipeline_time_is_fill_plus_slowest_hop_per_chunk() {
    let fast = Cost {
        alpha_us: 1.0,
        beta_gbps: 2.0,
    };
    let slow = Cost {
        alpha_us: 1.0,
        beta_gbps: 1.0,
    };
    // 4 chunks of 1 MB: 1+500 (fast) then 4 × (1+1000) on the slow hop.
    let t = pipeline_us(0.0, 0.0, &[fast, slow], 4_000_000, 1_000_000);
    let chunk = 4_000_000u64.div_ceil(4).next_multiple_of(ALIGN);
    let (tf, ts) = (fast.time_us(chunk), slow.time_us(chunk));
    let last = 4_000_000 - 3 * chunk;
    assert!(
        (t - (tf + 3.0 * ts + slow.time_us(last))).abs() < 1e-6,
        "{t}"
    );
    // One chunk: both hops in turn.
    let one = pipeline_us(0.0, 0.0, &[fast, slow], 1000, 1000);
    assert!((one - fast.time_us(1000) - slow.time_us(1000)).abs() < 1e-9);
    // Tiny chunks are bound by the CPU queuing them.
    let issue_bound = pipeline_us(1.0, 50.0, &[fast, slow], 4096 * 100, 4096);
    assert!(issue_bound >= 99.0 * 50.0, "{issue_bound}");
    // Pipelining beats store-and-forward of the whole transfer.
    assert!(t < fast.time_us(4_000_000) + slow.time_us(4_000_000));
}

#[test]
fn split_shares_follow_bandwidth_and_finish_together() {
    let p = planner(dgx1());
    let plan = p.plan_with(Strategy::Split, 0, 5, 256 * MIB).unwrap();
    let share = |route| plan.paths.iter().find(|s| s.route == route).unwrap();
    // Both relays run at one NVLink's pace, the host at a PCIe Gen3 link's (~2.3x slower).
    let (via1, via4, host) = (
        share(Route::Relay(1)),
        share(Route::Relay(4)),
        share(Route::Host),
    );
    assert!(
        (via1.bytes as f64 / via4.bytes as f64 - 1.0).abs() < 0.05,
        "{plan:#?}"
    );
    let ratio = via1.bytes as f64 / host.bytes as f64;
    assert!((2.0..2.6).contains(&ratio), "{plan:#?}");
    // Within one chunk's time of each other (2 MiB on the host route: ~4%).
    for s in &plan.paths {
        assert!(s.predicted_us > 0.95 * plan.predicted_us, "{plan:#?}");
    }
    // A small transfer is not worth splitting three ways: the extra routes' queuing, start-up
    // and waits cost more than their bandwidth brings.
    if let Ok(small) = p.plan_with(Strategy::Split, 0, 5, 160 << 10) {
        assert!(small.paths.len() < 3, "{small:#?}");
    }
}

#[test]
fn nvswitch_pairs_never_relay_and_split_only_with_the_host() {
    // A relay would cross the same switch ports as the direct copy; the host route crosses
    // PCIe links of its own, and joins large transfers as on the NVLink pair.
    let p = planner(nvswitch8());
    for bytes in [1, 4096, MIB, 4 * MIB, 16 * MIB] {
        let plan = p.plan(0, 5, bytes).unwrap();
        assert_eq!(plan.strategy, Strategy::DirectCe, "{bytes}: {plan:?}");
    }
    for bytes in [256 * MIB, 1 << 30] {
        let plan = p.plan(0, 5, bytes).unwrap();
        let routes: Vec<Route> = plan.paths.iter().map(|s| s.route).collect();
        assert_eq!(
            routes,
            vec![Route::Direct(CopyMethod::CopyEngine), Route::Host],
            "{bytes}: {plan:?}"
        );
    }
}

/// The predicted time of `strategy` among a plan's alternatives.
fn alternative(plan: &Plan, strategy: Strategy) -> f64 {
    plan.alternatives
        .iter()
        .find(|(s, _)| *s == strategy)
        .unwrap_or_else(|| panic!("{strategy} is not among {plan:?}"))
        .1
}

#[test]
fn an_nvlink_pair_adds_the_host_route_to_large_transfers_only() {
    // 55 GB/s of PCIe per GPU beside 396 of NVLink, sharing no link and no copy engine: the
    // host route joins where it shortens the transfer by more than the model's margin, and
    // once it does, it does at every larger size.
    let p = planner(nvlink_pair());
    let picks: Vec<(u64, Plan)> = (12..=30)
        .map(|shift| (1u64 << shift, p.plan(0, 1, 1 << shift).unwrap()))
        .collect();
    let first_split = picks
        .iter()
        .position(|(_, plan)| plan.strategy == Strategy::Split)
        .expect("large transfers split");
    for (bytes, plan) in &picks[..first_split] {
        assert_eq!(plan.strategy, Strategy::DirectCe, "{bytes}: {plan:?}");
    }
    assert!(picks[first_split].0 >= 16 * MIB, "{:?}", picks[first_split]);
    for (bytes, plan) in &picks[first_split..] {
        assert_eq!(plan.strategy, Strategy::Split, "{bytes}: {plan:?}");
        let routes: Vec<Route> = plan.paths.iter().map(|s| s.route).collect();
        assert_eq!(
            routes,
            vec![Route::Direct(CopyMethod::CopyEngine), Route::Host]
        );
        let direct = alternative(plan, Strategy::DirectCe);
        assert!(
            plan.predicted_us * (1.0 + MODEL_MARGIN) < direct,
            "{plan:?}"
        );
        // The host carries what it moves beside the NVLink copy: a tenth at most.
        let host = plan.paths[1].bytes as f64 / *bytes as f64;
        assert!((0.03..0.1).contains(&host), "{bytes}: {plan:?}");
        // Both routes end together: the balance moves bytes in 4 KiB steps.
        let ends: Vec<f64> = plan.paths.iter().map(|s| s.predicted_us).collect();
        assert!((ends[0] - ends[1]).abs() < 1.0, "{bytes}: {plan:?}");
    }
    // At 256 MiB and above the pair is predicted at about 430 GB/s or more one way (NVLink
    // alone 393), with the host route priced as it went beside NVLink.
    for (bytes, plan) in &picks[picks.len() - 3..] {
        let gbps = *bytes as f64 / plan.predicted_us / 1e3;
        assert!(gbps >= 429.5, "{bytes}: {gbps:.1} GB/s, {plan:?}");
    }
}

#[test]
fn a_split_hands_the_host_route_few_large_chunks() {
    // Every chunk through the host costs ~10 µs beside NVLink (its copies' start-up and the
    // waits across the GPUs): a large share goes in chunks of MiBs, not hundreds of KiB.
    let p = planner(nvlink_pair());
    for bytes in [256 * MIB, 1 << 30] {
        let plan = p.plan_with(Strategy::Split, 0, 1, bytes).unwrap();
        assert!(plan.chunk_bytes >= 2 * MIB, "{plan:?}");
        let host = plan.paths.iter().find(|s| s.route == Route::Host).unwrap();
        assert!(chunking(host.bytes, plan.chunk_bytes).1 <= 32, "{plan:?}");
    }
}

#[test]
fn the_staged_route_is_priced_as_the_h200_pair_ran_it() {
    // The staged strategy alone on the H200 pair (docs/reference.md), at the chunk sizes the
    // planner picks there: the model with the waits across GPUs lands within 5%.
    let p = planner(nvlink_pair());
    for (bytes, chunk, measured_us) in [
        (MIB, 512 << 10, 65.6),
        (4 * MIB, MIB, 144.1),
        (16 * MIB, 2 * MIB, 423.3),
        (256 * MIB, 4 * MIB, 5419.5),
        (1 << 30, 4 * MIB, 21342.0),
    ] {
        let plan = p.plan_with(Strategy::Staged, 0, 1, bytes).unwrap();
        assert_eq!(plan.chunk_bytes, chunk, "{bytes}: {plan:?}");
        let error = plan.predicted_us / measured_us - 1.0;
        assert!(
            error.abs() < 0.05,
            "{bytes}: {plan:?} against {measured_us} µs"
        );
    }
}

#[test]
fn the_host_route_beside_nvlink_is_priced_as_the_h200_pair_ran_it() {
    // The split as first run on the H200 pair (docs/reference.md): the host route carried
    // these shares in these chunks beside the NVLink copy and ended last, after the measured
    // time. Priced beside a direct copy, the model lands within 5% of each.
    let p = planner(nvlink_pair());
    let h = p.hops(Route::Host, 0, 1, Ways::One).unwrap();
    for (share, chunk, measured_us) in [
        (MIB, 256 << 10, 89.9),
        (6 * MIB, MIB, 236.1),
        (27 * MIB, MIB, 915.2),
        (56 * MIB, 2 * MIB, 1537.4),
        (116 * MIB, 2 * MIB, 3120.8),
    ] {
        let mut lane = Lane::new(Route::Host, &h, chunk);
        lane.beside_direct_copy(BesideDirect::Estimate);
        let predicted = h.pipelined_us(&lane.costs, h.issue_us, share, chunk);
        let error = predicted / measured_us - 1.0;
        assert!(
            error.abs() < 0.05,
            "{share}: {predicted:.1} against {measured_us} µs"
        );
        // Priced alone, the same chunks would be well under what was measured.
        let alone = h.pipelined_us(&h.costs, h.issue_us, share, chunk);
        assert!(alone < 0.9 * measured_us, "{share}: {alone:.1}");
    }
}

#[test]
fn a_split_is_priced_again_route_by_route_as_planned() {
    for (p, src, dst) in [(planner(nvlink_pair()), 0, 1), (planner(dgx1()), 0, 5)] {
        let plan = p.plan_with(Strategy::Split, src, dst, 256 * MIB).unwrap();
        let ends = p.route_ends_us(&plan, Ways::One).unwrap();
        let planned: Vec<f64> = plan.paths.iter().map(|s| s.predicted_us).collect();
        assert_eq!(ends, planned, "{plan:?}");
    }
}

#[test]
fn the_host_route_beside_a_direct_copy_is_priced_at_the_profiles_pace() {
    let topology = nvlink_pair();
    let host_share = |model: CostModel| {
        let plan = Planner::new(model)
            .plan_with(Strategy::Split, 0, 1, 256 * MIB)
            .unwrap();
        let host = plan.paths.iter().find(|s| s.route == Route::Host).unwrap();
        (host.bytes, plan)
    };
    let estimate = CostModel::from_topology(&topology);
    assert_eq!(estimate.beside_direct(0, 1), BesideDirect::Estimate);
    let mut profile = crate::model::Profile::for_host(&topology);
    profile.beside_direct = vec![crate::model::profile::BesideDirect {
        src: 0,
        dst: 1,
        rate_fraction: 1.0,
        chunk_us: 0.0,
        fixed_us: 0.0,
        direct_rate_fraction: 1.0,
        direct_fixed_us: 0.0,
        splits: Vec::new(),
        both_ways: None,
    }];
    let measured = CostModel::from_profile(&topology, &profile).unwrap();
    // The pair's own figure, and the other direction takes it for want of its own.
    for (src, dst) in [(0, 1), (1, 0)] {
        assert_eq!(
            measured.beside_direct(src, dst),
            BesideDirect::Measured {
                pace: crate::model::HostPace {
                    rate_fraction: 1.0,
                    chunk_us: 0.0,
                    fixed_us: 0.0,
                },
                on: (0, 1)
            }
        );
    }
    // Unslowed the host route carries more than the estimate (which slows it) lets it; slower,
    // less; and the model's host route ends where the plan says.
    let (at_estimate, _) = host_share(estimate.clone());
    let (alone, plan) = host_share(measured.clone());
    let slower = crate::model::HostPace {
        rate_fraction: 0.7,
        chunk_us: 5.0,
        fixed_us: 0.0,
    };
    let (slow, _) = host_share(measured.clone().with_beside_direct(0, 1, slower));
    assert!(
        alone > at_estimate && at_estimate > slow,
        "{alone} {at_estimate} {slow}"
    );
    let host = plan.paths.iter().find(|s| s.route == Route::Host).unwrap();
    let h = Planner::new(measured.clone())
        .hops(Route::Host, 0, 1, Ways::One)
        .unwrap();
    let mut lane = Lane::new(Route::Host, &h, plan.chunk_bytes);
    lane.beside_direct_copy(measured.beside_direct(0, 1));
    assert_eq!(
        lane.costs, h.costs,
        "unslowed, the route is priced as alone"
    );
    assert!(host.predicted_us > 0.95 * plan.predicted_us, "{plan:?}");
}

#[test]
fn both_ways_the_host_route_carries_fewer_bytes_and_only_opposite_transfers_are_priced_so() {
    let p = planner(nvlink_pair());
    let host_bytes = |plan: &Plan| {
        plan.paths
            .iter()
            .find(|s| s.route == Route::Host)
            .map_or(0, |s| s.bytes)
    };
    for bytes in [256 * MIB, 1 << 30] {
        let one = p.plan_ways(0, 1, bytes, Ways::One).unwrap();
        let both = p.plan_ways(0, 1, bytes, Ways::Both).unwrap();
        // Still worth splitting (both GPUs' links slowed to 0.90 still add bandwidth beside
        // NVLink), with fewer bytes through the host, and predicted slower than one way.
        assert_eq!(both.strategy, Strategy::Split, "{both:?}");
        assert!(host_bytes(&both) < host_bytes(&one), "{one:?} {both:?}");
        let ratio = host_bytes(&both) as f64 / host_bytes(&one) as f64;
        assert!((0.8..0.97).contains(&ratio), "{ratio}");
        assert!(both.predicted_us > one.predicted_us);
        // Never slower than NVLink alone by the model's own prediction.
        assert!(both.predicted_us < alternative(&both, Strategy::DirectCe));
    }
    // Only a transfer with an opposite one that takes the host route is priced both ways.
    let plan = |src, dst, bytes, _, ways| p.plan_ways(src, dst, bytes, ways);
    let big = 256 * MIB;
    assert_eq!(
        ways_together(&[(0, 1, big, None), (1, 0, big, None)], plan),
        [Ways::Both, Ways::Both]
    );
    assert_eq!(
        ways_together(&[(0, 1, big, None), (1, 0, 4096, None)], plan),
        [Ways::One, Ways::Both]
    );
    assert_eq!(
        ways_together(&[(0, 1, big, None), (0, 1, big, None)], plan),
        [Ways::One, Ways::One]
    );
}

#[test]
fn a_split_needs_a_free_copy_engine_for_every_route() {
    // With one copy engine per GPU the host route's device → host copy would queue behind the
    // direct copy on the source: no split.
    let mut topology = nvlink_pair();
    for d in &mut topology.devices {
        d.copy_engines = 1;
    }
    let p = planner(topology);
    let plan = p.plan(0, 1, 1 << 30).unwrap();
    assert_eq!(plan.strategy, Strategy::DirectCe, "{plan:?}");
    let mut engines = CopyEngines::of(&nvlink_pair());
    assert!(engines.take(Route::Direct(CopyMethod::CopyEngine), 0, 1));
    assert!(engines.take(Route::Host, 0, 1));
    // The other direction fits too, in the three engines of each GPU; then none is left.
    assert!(engines.take(Route::Direct(CopyMethod::CopyEngine), 1, 0));
    assert!(engines.take(Route::Host, 1, 0));
    assert!(!engines.take(Route::Direct(CopyMethod::CopyEngine), 0, 1));
    assert!(!engines.take(Route::Relay(1), 0, 1));
    // A copy kernel needs none.
    assert!(engines.take(Route::Direct(CopyMethod::SmKernel), 0, 1));
}

#[test]
fn resident_is_offered_only_with_workers_and_wins_only_small_transfers() {
    let topology = nvlink_pair();
    let without = planner(topology.clone());
    for bytes in [4, MIB, 256 * MIB] {
        let plan = without.plan(0, 1, bytes).unwrap();
        assert!(plan
            .alternatives
            .iter()
            .all(|(s, _)| *s != Strategy::Resident));
        let unusable = without.unusable(0, 1, bytes).unwrap();
        assert!(
            unusable.iter().all(|(s, _)| *s != Strategy::Resident),
            "{unusable:?}"
        );
    }
    let refused = without.plan_with(Strategy::Resident, 0, 1, 4).unwrap_err();
    assert!(refused.to_string().contains("plan --resident"), "{refused}");
    let with = planner(topology).with_resident();
    assert!(with.offers_resident());
    // Unmeasured, a worker costs what it took on the lent H200 pair (7 µs from the call until
    // the host sees a few bytes arrive), which a copy does not lose to.
    assert_ne!(with.plan(0, 1, 4).unwrap().strategy, Strategy::Resident);
    // Large transfers are planned as without workers (the copy engine, which holds no SMs and
    // is faster per byte, alone or in a split).
    assert_eq!(
        with.plan(0, 1, 256 * MIB).unwrap().strategy,
        without.plan(0, 1, 256 * MIB).unwrap().strategy
    );
    let forced = with.plan_with(Strategy::Resident, 0, 1, 256 * MIB).unwrap();
    assert_eq!(forced.paths[0].route, Route::Resident);
    // A measured profile moves the boundary: a fast worker wins small transfers, a slow one
    // loses even those.
    let measured = |alpha_us: f64| {
        let mut profile = crate::model::Profile::for_host(&nvlink_pair());
        profile.hops = vec![crate::model::profile::Measured {
            hop: Hop::Resident { src: 0, dst: 1 },
            cost: crate::model::Cost {
                alpha_us,
                beta_gbps: 100.0,
            },
        }];
        let model = CostModel::from_profile(&nvlink_pair(), &profile).unwrap();
        Planner::new(model).with_resident()
    };
    let fast = measured(1.0);
    assert_eq!(fast.plan(0, 1, 4).unwrap().strategy, Strategy::Resident);
    assert_ne!(
        fast.plan(0, 1, 256 * MIB).unwrap().strategy,
        Strategy::Resident
    );
    assert_ne!(
        measured(50.0).plan(0, 1, 4).unwrap().strategy,
        Strategy::Resident
    );
}

#[test]
fn measured_lone_operations_decide_small_direct_transfers() {
    // As on the lent H200: a lone small copy kernel done sooner than a copy-engine copy, but
    // the copy engine the faster per byte.
    let topology = nvswitch8();
    let mut profile = crate::model::Profile::for_host(&topology);
    profile.lone = vec![
        crate::model::profile::Lone {
            hop: Hop::PeerCe { src: 0, dst: 5 },
            lone_us: 7.2,
        },
        crate::model::profile::Lone {
            hop: Hop::PeerSm { src: 0, dst: 5 },
            lone_us: 6.6,
        },
    ];
    let p = Planner::new(CostModel::from_profile(&topology, &profile).unwrap());
    let at = |bytes| p.plan(0, 5, bytes).unwrap();
    assert_eq!(at(4).strategy, Strategy::DirectSm);
    assert!((at(4).predicted_us - 6.6).abs() < 0.01, "{:?}", at(4));
    assert_eq!(at(64 * 1024).strategy, Strategy::DirectSm);
    assert_eq!(at(4 << 20).strategy, Strategy::DirectCe);
    // Pairs without a measurement keep the estimate: issue, α, the copy engine's start-up.
    assert_eq!(
        at(4).predicted_us,
        p.plan_with(Strategy::DirectSm, 0, 5, 4)
            .unwrap()
            .predicted_us
    );
    let other = p.plan(1, 2, 4).unwrap();
    assert_eq!(
        other.strategy,
        planner(nvswitch8()).plan(1, 2, 4).unwrap().strategy
    );
    assert_eq!(
        other.predicted_us,
        planner(nvswitch8()).plan(1, 2, 4).unwrap().predicted_us
    );
}

#[test]
fn a_batch_run_many_times_replays_its_kernel_from_a_graph() {
    // CPU costs as measured on the lent H200 (tune, BENCHMARKS.md run 4): a graph launch is a
    // third of a kernel launch there.
    let topology = nvswitch8();
    let mut profile = crate::model::Profile::for_host(&topology);
    profile.issue = Some(crate::model::IssueCosts {
        copy_us: 6.05,
        kernel_us: 6.02,
        event_us: 0.98,
        graph_us: 2.10,
    });
    let p = Planner::new(CostModel::from_profile(&topology, &profile).unwrap());
    let sizes = vec![4096; 1000];
    // Once: capturing costs what launching does, so the kernel is launched.
    assert_eq!(
        p.plan_batch(0, 5, &sizes, 1).unwrap().strategy,
        BatchStrategy::Kernel
    );
    // A thousand times: a graph launch and one node beat a kernel launch each run.
    let many = p.plan_batch(0, 5, &sizes, 1000).unwrap();
    assert_eq!(many.strategy, BatchStrategy::KernelGraph);
    let kernel = many
        .alternatives
        .iter()
        .find(|(s, _)| *s == BatchStrategy::Kernel)
        .unwrap()
        .1;
    assert!(many.predicted_us < kernel, "{many:?}");
}

#[test]
fn dgx1_pairs_without_nvlink_relay_or_split_and_beat_staging() {
    let p = planner(dgx1());
    for bytes in [MIB, 16 * MIB, 256 * MIB] {
        let plan = p.plan(0, 5, bytes).unwrap();
        assert!(
            matches!(plan.strategy, Strategy::Relay | Strategy::Split),
            "{bytes}: {plan:?}"
        );
        let staged = plan
            .alternatives
            .iter()
            .find(|(s, _)| *s == Strategy::Staged)
            .unwrap()
            .1;
        assert!(plan.predicted_us < staged, "{plan:?}");
    }
    // Large transfers use both relays (via GPU 1 and GPU 4) at once.
    let big = p.plan(0, 5, 256 * MIB).unwrap();
    assert_eq!(big.strategy, Strategy::Split);
    let relays: Vec<_> = big
        .paths
        .iter()
        .filter_map(|s| match s.route {
            Route::Relay(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(relays.len(), 2, "{big:?}");
}

#[test]
fn pcie_pairs_across_sockets_are_staged() {
    let p = planner(pcie_2socket());
    for bytes in [4096, MIB, 64 * MIB] {
        let plan = p.plan(0, 3, bytes).unwrap();
        assert_eq!(plan.strategy, Strategy::Staged, "{bytes}: {plan:?}");
    }
    // Inside one switch P2P works and wins.
    assert_eq!(p.plan(0, 1, MIB).unwrap().strategy, Strategy::DirectCe);
}

#[test]
fn a_plan_covers_every_byte_once_and_lists_the_alternatives() {
    let p = planner(dgx1()).with_resident();
    let bytes = 100 * MIB + 12345;
    for strategy in Strategy::ALL {
        let plan = p.plan_with(strategy, 0, 1, bytes).unwrap();
        assert_eq!(plan.strategy, strategy);
        let mut offset = 0;
        for share in &plan.paths {
            assert_eq!(share.offset, offset);
            offset += share.bytes;
        }
        assert_eq!(offset, bytes);
        assert_eq!(plan.alternatives.len(), Strategy::ALL.len() - 1);
        assert!(plan.alternatives.windows(2).all(|w| w[0].1 <= w[1].1));
        assert!(plan.chunk_bytes <= bytes);
    }
    let best = p.plan(0, 1, bytes).unwrap();
    assert!(best
        .alternatives
        .iter()
        .all(|(_, t)| *t >= best.predicted_us));
}

#[test]
fn the_planner_chooses_the_chunk_size() {
    let p = planner(pcie_2socket());
    let small = p.plan_with(Strategy::Staged, 0, 3, 64 << 10).unwrap();
    let large = p.plan_with(Strategy::Staged, 0, 3, 256 * MIB).unwrap();
    assert_eq!(
        small.chunk_bytes,
        64 << 10,
        "one chunk for a small transfer"
    );
    assert!(large.chunk_bytes > 64 << 10, "{large:?}");
    assert!(large.chunk_bytes <= MAX_CHUNK);
    // Pipelined staging beats copying everything to the host and then everything back.
    let m = p.model();
    let d2h = m
        .cost(Hop::DeviceToHost {
            device: 0,
            node: Some(0),
        })
        .unwrap();
    let h2d = m
        .cost(Hop::HostToDevice {
            device: 3,
            node: Some(0),
        })
        .unwrap();
    assert!(large.predicted_us < d2h.time_us(256 * MIB) + h2d.time_us(256 * MIB));
}

#[test]
fn a_restricted_planner_relays_only_through_its_gpus() {
    let p = Planner::for_devices(CostModel::from_topology(&dgx1()), &[0, 1, 5]);
    let plan = p.plan_with(Strategy::Relay, 0, 5, 64 * MIB).unwrap();
    assert_eq!(plan.paths[0].route, Route::Relay(1), "GPU 4 is not in use");
    let err = p.plan(0, 4, MIB).unwrap_err();
    assert!(
        err.to_string().contains("not one of the GPUs in use"),
        "{err}"
    );
}

#[test]
fn unusable_strategies_come_with_their_reason() {
    let p = planner(pcie_2socket());
    let unusable = p.unusable(0, 3, MIB).unwrap();
    let names: Vec<_> = unusable.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        names,
        vec![
            Strategy::DirectCe,
            Strategy::DirectSm,
            Strategy::Relay,
            Strategy::Split
        ]
    );
    assert!(unusable[0].1.contains("P2P"), "{unusable:?}");
    assert!(p
        .unusable(0, 1, MIB)
        .unwrap()
        .iter()
        .all(|(s, _)| *s != Strategy::DirectCe));
}

#[test]
fn impossible_strategies_and_bad_input_are_refused_with_a_sentence() {
    let p = planner(pcie_2socket());
    let err = p.plan_with(Strategy::DirectCe, 0, 3, MIB).unwrap_err();
    assert!(err.to_string().contains("SYS"), "{err}");
    let err = p.plan_with(Strategy::Relay, 0, 3, MIB).unwrap_err();
    assert!(err.to_string().contains("third GPU"), "{err}");
    for (src, dst, bytes, needle) in [
        (0, 9, MIB, "GPU 9 does not exist"),
        (4, 0, MIB, "GPU 4 does not exist"),
        (0, 1, 0, "0 bytes"),
    ] {
        let err = p.plan(src, dst, bytes).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains(needle), "{err}");
    }
}

fn preset_planner(name: &str) -> Planner {
    planner(crate::backend::sim::Preset::load(name).unwrap().topology())
}

#[test]
fn between_hosts_a_nic_next_to_the_gpu_carries_it_by_gpudirect_rdma() {
    let p = preset_planner("2x-dgx-h100");
    for bytes in [4, 4096, MIB, 64 * MIB, 1 << 30] {
        let plan = p.plan(0, 8, bytes).unwrap();
        assert_eq!(plan.strategy, Strategy::GpudirectRdma, "{bytes}: {plan:?}");
        assert_eq!(plan.paths[0].route, Route::GpudirectRdma);
        assert_eq!(plan.alternatives.len(), 1, "{plan:?}");
        assert_eq!(plan.alternatives[0].0, Strategy::NetStaged);
    }
    // 400 Gb/s at the RDMA efficiency, behind a 1 µs post and 1.5 µs of network.
    let big = p.plan(3, 11, 1 << 30).unwrap();
    let gbps = (1u64 << 30) as f64 / big.predicted_us / 1e3;
    assert!((45.0..48.1).contains(&gbps), "{gbps} GB/s");
    // Across rails the spine adds its latency.
    let same_rail = p.plan(3, 11, 4).unwrap().predicted_us;
    let other_rail = p.plan(3, 12, 4).unwrap().predicted_us;
    assert!(
        (other_rail - same_rail - 0.5).abs() < 1e-9,
        "{same_rail} {other_rail}"
    );
}

#[test]
fn a_gpu_whose_nearest_nic_is_across_the_sockets_stages_large_transfers() {
    let p = preset_planner("2x-pcie-4gpu-2socket");
    let big = p.plan(2, 6, 64 * MIB).unwrap();
    assert_eq!(big.strategy, Strategy::NetStaged, "{big:?}");
    assert_eq!(big.paths[0].route, Route::NetStaged);
    assert!(big.chunk_bytes < 64 * MIB, "pipelined: {big:?}");
    let rdma = big.alternatives[0];
    assert_eq!(rdma.0, Strategy::GpudirectRdma);
    assert!(rdma.1 > 2.0 * big.predicted_us, "{big:?}");
    // A few bytes: one RDMA operation beats three staged hops.
    assert_eq!(
        p.plan(2, 6, 4096).unwrap().strategy,
        Strategy::GpudirectRdma
    );
    // GPUs next to the NIC keep GPUDirect RDMA at every size.
    assert_eq!(
        p.plan(0, 5, 64 * MIB).unwrap().strategy,
        Strategy::GpudirectRdma
    );
}

#[test]
fn without_gpudirect_rdma_only_the_staged_network_route_is_left() {
    let mut topology = crate::backend::sim::Preset::load("2x-dgx-h100")
        .unwrap()
        .topology();
    topology.network.as_mut().unwrap().gpudirect.available = Some(false);
    let p = planner(topology);
    let plan = p.plan(0, 8, MIB).unwrap();
    assert_eq!(plan.strategy, Strategy::NetStaged);
    assert!(plan.alternatives.is_empty());
    let unusable = p.unusable(0, 8, MIB).unwrap();
    assert_eq!(unusable.len(), 1, "{unusable:?}");
    assert_eq!(unusable[0].0, Strategy::GpudirectRdma);
    assert!(unusable[0].1.contains("nvidia-peermem"), "{unusable:?}");
}

#[test]
fn each_strategy_serves_its_side_of_the_network() {
    let p = preset_planner("2x-dgx-h100");
    let err = p.plan_with(Strategy::DirectCe, 0, 8, MIB).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("different hosts"), "{err}");
    let err = p.plan_with(Strategy::GpudirectRdma, 0, 1, MIB).unwrap_err();
    assert!(err.to_string().contains("are on one"), "{err}");
    // Within a host nothing changes: the network's strategies are not listed as unusable.
    let within = p.unusable(0, 1, MIB).unwrap();
    assert!(within.iter().all(|(s, _)| !s.crosses_hosts()), "{within:?}");
    assert!(p.unusable(0, 8, MIB).unwrap().is_empty());
    assert_eq!(p.plan(0, 1, MIB).unwrap().strategy, Strategy::DirectCe);
    assert_eq!(
        "net-staged".parse::<Strategy>().unwrap(),
        Strategy::NetStaged
    );
    // A batch between hosts is gathered and sent as one network transfer.
    let batch = p.plan_batch(0, 8, &[256; 100], 1).unwrap();
    assert_eq!(batch.strategy, BatchStrategy::GatherScatter);
    assert_eq!(batch.middle.unwrap().strategy, Strategy::GpudirectRdma);
}

#[test]
fn small_message_batches_use_one_kernel_or_gather_without_p2p() {
    let sizes = vec![256u64; 1000];
    let nv = planner(nvswitch8());
    let plan = nv.plan_batch(0, 1, &sizes, 1).unwrap();
    assert_eq!(plan.strategy, BatchStrategy::Kernel, "{plan:?}");
    let pcie = planner(pcie_2socket());
    let plan = pcie.plan_batch(0, 3, &sizes, 1).unwrap();
    assert_eq!(plan.strategy, BatchStrategy::GatherScatter, "{plan:?}");
    // 1000 messages of 256 bytes, packed back to back (256 is a multiple of the alignment).
    assert_eq!(plan.middle.as_ref().unwrap().bytes, 256_000);
    assert!(
        plan.alternatives.is_empty(),
        "only gathering works without P2P"
    );
    // A graph's capture pays off over repeats.
    let once = nv.plan_batch(0, 1, &sizes, 1).unwrap();
    let many = nv.plan_batch(0, 1, &sizes, 1000).unwrap();
    let graph = |p: &BatchPlan| {
        p.alternatives
            .iter()
            .find(|a| a.0 == BatchStrategy::Graph)
            .unwrap()
            .1
    };
    assert!(graph(&many) < graph(&once));
    assert!(nv.plan_batch(0, 1, &[], 1).is_err());
    assert!(nv.plan_batch(0, 1, &[4, 0], 1).is_err());
}
