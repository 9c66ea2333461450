//! The engine on the simulator: real bytes moved and checked, virtual time.

use super::*;
use crate::backend::sim::SimBackend;
use crate::backend::Backend;
use std::sync::Arc;

pub(super) fn fabric(preset: &str) -> Fabric {
    let backend: Arc<dyn Backend> = Arc::new(SimBackend::open(preset).unwrap());
    Fabric::open(backend).unwrap()
}

use super::benchmark::pattern;

const MIB: usize = 1 << 20;

#[test]
fn every_strategy_moves_every_byte_on_nvswitch() {
    let f = fabric("dgx-h100");
    let len = 9 * MIB + 123;
    let src = f.alloc(0, len + 7).unwrap();
    let data = pattern(len + 7, 1);
    src.write(0, &data).unwrap();
    for strategy in [
        Strategy::DirectCe,
        Strategy::DirectSm,
        Strategy::Staged,
        Strategy::Relay,
    ] {
        let dst = f.alloc(5, len + 100).unwrap();
        let t = f
            .transfer(src.range(7..len + 7), dst.range(50..len + 50))
            .strategy(strategy)
            .submit()
            .unwrap();
        t.wait().unwrap();
        let got = dst.to_vec().unwrap();
        assert!(got[50..len + 50] == data[7..len + 7], "{strategy}");
        assert!(
            got[..50].iter().all(|&b| b == 0),
            "{strategy} wrote before its range"
        );
        assert!(
            got[len + 50..].iter().all(|&b| b == 0),
            "{strategy} wrote past its range"
        );
        assert!(t.elapsed_us().unwrap() > 0.0);
    }
}

#[test]
#[ignore = "exploration: prints the sweep"]
fn print_sweeps() {
    for (preset, pairs) in [
        ("dgx1-v100", vec![(0, 5), (0, 1), (0, 3)]),
        ("pcie-4gpu-2socket", vec![(0, 3), (0, 1)]),
        ("dgx-h100", vec![(0, 5)]),
        ("pcie-2gpu-switch", vec![(0, 1)]),
    ] {
        let f = fabric(preset);
        for (a, b) in pairs {
            let sizes: Vec<u64> = (0..8)
                .map(|i| 1u64 << (10 + 3 * i))
                .filter(|&s| s <= 64 << 20)
                .collect();
            let r = benchmark::run(&f, a, b, &sizes, benchmark::Options::default()).unwrap();
            for p in &r.points {
                println!(
                    "{preset} {a}->{b} {:>9} pick {:<9} best {:<9} regret {:.3}",
                    p.bytes,
                    p.pick.name(),
                    p.best.name(),
                    p.regret
                );
                for t in &p.timings {
                    println!(
                        "      {:<9} chunk {:>8} pred {:>10.1} meas {:>10.1}",
                        t.strategy.name(),
                        t.chunk_bytes,
                        t.predicted_us,
                        t.measured_us
                    );
                }
            }
        }
    }
}
