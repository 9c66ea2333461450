//! The backend contract (tests/contract/suite.rs) on the simulator: hosts with eight GPUs over
//! NVSwitch, eight over an NVLink mesh with pairs that have no P2P, two under a PCIe switch, and
//! one. The same checks run on real GPUs from tests/gpu.rs.

#[macro_use]
#[path = "contract/suite.rs"]
mod contract;
#[macro_use]
#[path = "contract/sharing_between.rs"]
mod sharing_between;

use peerlink::backend::sim::{Preset, SimBackend};

mod dgx_h100 {
    contract_tests!(open = peerlink::backend::sim::SimBackend::open("dgx-h100").unwrap());
    sharing_between_backends_tests!(
        open = peerlink::backend::sim::SimBackend::open("dgx-h100").unwrap()
    );
}

mod dgx1_v100 {
    contract_tests!(open = peerlink::backend::sim::SimBackend::open("dgx1-v100").unwrap());
}

mod pcie_2gpu_switch {
    contract_tests!(open = peerlink::backend::sim::SimBackend::open("pcie-2gpu-switch").unwrap());
    sharing_between_backends_tests!(
        open = peerlink::backend::sim::SimBackend::open("pcie-2gpu-switch").unwrap()
    );
}

mod one_gpu {
    contract_tests!(open = super::one_gpu());
    sharing_between_backends_tests!(open = super::one_gpu());
}

/// A host with one GPU: every pair check meets GPU 0 as its own peer.
fn one_gpu() -> SimBackend {
    let mut preset = Preset::load("pcie-2gpu-switch").unwrap();
    preset.name = "one-gpu".into();
    preset.devices.truncate(1);
    SimBackend::from_preset(&preset)
}
