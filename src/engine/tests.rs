//! The engine on the simulator: real bytes moved and checked, virtual time.

use super::*;
use crate::backend::sim::SimBackend;
use crate::backend::Backend;
use std::sync::Arc;

pub(super) fn fabric(preset: &str) -> Fabric {
    let backend: Arc<dyn Backend> = Arc::new(SimBackend::open(preset).unwrap());
    Fabric::open(backend).unwrap()
}

/// Bytes that differ at every offset and between seeds.
pub(super) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

const MIB: usize = 1 << 20;

#[test]
fn every_strategy_moves_every_byte_on_nvswitch() {
    let f = fabric("dgx-h100");
    let len = 9 * MIB + 123;
    let src = f.alloc(0, len + 7).unwrap();
    let data = pattern(len + 7, 1);
    src.write(0, &data).unwrap();
    for strategy in [Strategy::DirectCe, Strategy::DirectSm, Strategy::Staged, Strategy::Relay] {
        let dst = f.alloc(5, len + 100).unwrap();
        let t = f
            .transfer(src.range(7..len + 7), dst.range(50..len + 50))
            .strategy(strategy)
            .submit()
            .unwrap();
        t.wait().unwrap();
        let got = dst.to_vec().unwrap();
        assert!(got[50..len + 50] == data[7..len + 7], "{strategy}");
        assert!(got[..50].iter().all(|&b| b == 0), "{strategy} wrote before its range");
        assert!(got[len + 50..].iter().all(|&b| b == 0), "{strategy} wrote past its range");
        assert!(t.elapsed_us().unwrap() > 0.0);
    }
}
