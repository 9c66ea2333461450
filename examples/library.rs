//! The README's library example: move 16 MiB between two GPUs that have no P2P between them, and
//! let the engine pick the way.
//!
//! ```sh
//! cargo run --release --example library            # the simulated DGX-1 (no GPU needed)
//! cargo run --release --example library -- --gpu   # real GPUs 0 and 1
//! ```

use peerlink::backend::{cuda::CudaBackend, sim::SimBackend, Backend};
use peerlink::engine::{Fabric, Planned};
use std::sync::Arc;

fn main() -> peerlink::Result<()> {
    let on_gpus = std::env::args().any(|a| a == "--gpu");
    let (backend, src, dst): (Arc<dyn Backend>, usize, usize) = if on_gpus {
        (Arc::new(CudaBackend::open()?), 0, 1)
    } else {
        // GPUs 0 and 5 of a DGX-1 have no NVLink and no P2P between them.
        (Arc::new(SimBackend::open("dgx1-v100")?), 0, 5)
    };
    let fabric = Fabric::open(backend)?;
    let from = fabric.alloc(src, 16 << 20)?;
    let to = fabric.alloc(dst, 16 << 20)?;
    from.write(0, &vec![7; 16 << 20])?;

    let transfer = fabric.copy(from.all(), to.all())?; // planned and queued; returns at once
    transfer.wait()?;
    assert!(to.to_vec()?.iter().all(|&b| b == 7), "every byte arrived");

    if let Planned::Single(plan) = transfer.planned() {
        let simulated = fabric.backend().topology().is_simulated();
        println!(
            "GPU {src} → GPU {dst}, 16 MiB ({}{}): {} in {} path(s), predicted {:.1} µs",
            fabric.backend().source(),
            if simulated { ", SIMULATED" } else { "" },
            plan.strategy,
            plan.paths.len(),
            plan.predicted_us
        );
    }
    Ok(())
}
