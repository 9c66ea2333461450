//! `peerlink doctor` on real GPUs: every GPU's health read through NVML, the burst run for at
//! least its second, every check made with its evidence, and the document valid against its
//! schema. Whether the machine is healthy is what it records, not what it asserts; what it
//! asserts is that the readings agree with each other and with the topology.

use peerlink::backend::health::Counter;
use peerlink::backend::Backend;
use peerlink::doctor::document::DoctorDocument;
use peerlink::doctor::{run, Options, Verdict, GPU_CHECKS};
use peerlink::report::schemas::published;

#[test]
#[ignore = "needs a GPU"]
fn doctor_reads_this_machine_and_its_readings_agree() {
    let backend = super::open();
    let topology = backend.topology();
    let gpus = topology.devices.len();
    let mut first = Vec::new();
    for gpu in 0..gpus {
        let health = backend.health().gpu_health(gpu).unwrap();
        first.push(health.counters.clone());
        println!("GPU {gpu}: {health:?}");
        if let Ok(link) = &health.pcie {
            assert!((1..=6).contains(&link.generation), "{link:?}");
            assert!([1, 2, 4, 8, 16, 32].contains(&link.max_width), "{link:?}");
        }
        if let Ok(ports) = &health.nvlinks {
            assert!(ports.len() <= 18, "{ports:?}");
            // A GPU the topology links by NVLink has that many links up at least.
            let most = topology
                .pairs
                .iter()
                .filter(|p| p.src == gpu)
                .filter_map(|p| match p.link {
                    peerlink::topology::Link::NvLink(n) => Some(n as usize),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            assert!(
                ports.iter().filter(|p| p.active).count() >= most,
                "{ports:?}"
            );
        }
    }
    assert!(backend.health().gpu_health(gpus).is_err());

    let report = run(
        &backend,
        &Options::default(),
        &peerlink::bench::progress::Silent,
    )
    .unwrap();
    let doc = DoctorDocument::new(topology, report.clone());
    println!("{}", peerlink::report::doctor::text(&doc));
    let burst = report.burst.as_ref().expect("a burst ran");
    assert!(burst.interval_s >= 1.0, "{burst:?}");
    let p2p_pairs = topology.pairs.iter().filter(|p| p.p2p).count();
    assert_eq!(burst.pairs.len(), p2p_pairs, "{burst:?}");
    for check in GPU_CHECKS {
        let made = report.checks.iter().filter(|c| c.check == check).count();
        assert_eq!(made, gpus, "{check}");
    }
    assert_eq!(
        report.checks.iter().filter(|c| c.check == "p2p").count(),
        gpus * (gpus - 1) / 2
    );
    for check in &report.checks {
        assert!(!check.evidence.is_empty(), "{check:?}");
        if check.verdict >= Verdict::Warn {
            assert!(check.fix.is_some(), "{check:?}");
        }
    }
    // Counters only ever go up.
    for (gpu, before) in first.iter().enumerate() {
        let after = backend.health().gpu_health(gpu).unwrap().counters;
        for counter in Counter::ALL {
            if let (Some(Ok(then)), Some(Ok(now))) = (before.get(&counter), after.get(&counter)) {
                println!("GPU {gpu} {}: {then} → {now}", counter.name());
                assert!(now >= then, "GPU {gpu} {}: {then} → {now}", counter.name());
            }
        }
    }
    let schema = published()
        .into_iter()
        .find(|p| p.file == "peerlink.doctor-1.schema.json")
        .unwrap();
    let value = serde_json::to_value(&doc).unwrap();
    let validator = jsonschema::validator_for(&schema.schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}
