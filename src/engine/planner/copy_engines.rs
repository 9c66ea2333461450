//! Copy-engine accounting: the engines each GPU has left for the routes of one split.

use crate::backend::CopyMethod;
use crate::engine::plan::Route;
use std::collections::HashMap;

/// The copy engines each GPU has left for the routes of one split. Routes running at once on one
/// GPU need an engine each, or their copies queue behind one another: an H200 has 3, so a direct
/// copy (one engine on the source) and the host-staged route (one on the source for device → host,
/// one on the destination for host → device) fit, both ways at once too.
pub(super) struct CopyEngines(HashMap<usize, u32>);

impl CopyEngines {
    pub(super) fn of(topology: &crate::topology::Topology) -> CopyEngines {
        CopyEngines(
            topology
                .devices
                .iter()
                .enumerate()
                .map(|(gpu, d)| (gpu, d.copy_engines.max(1)))
                .collect(),
        )
    }

    /// The GPUs whose copy engines a route of a transfer from `src` to `dst` runs on, one entry per
    /// engine: a direct copy on the source; a pipeline's first hop on the source and its second on
    /// the relay, or through the host on the destination (as the executor issues them).
    fn needed(route: Route, src: usize, dst: usize) -> Vec<usize> {
        match route {
            Route::Direct(CopyMethod::CopyEngine) => vec![src],
            Route::Direct(CopyMethod::SmKernel) | Route::Resident => Vec::new(),
            Route::Host | Route::NetStaged => vec![src, dst],
            Route::Relay(via) => vec![src, via],
            // The NICs move the bytes.
            Route::GpudirectRdma => Vec::new(),
        }
    }

    /// Takes the engines `route` needs, or leaves everything as it was and says no.
    pub(super) fn take(&mut self, route: Route, src: usize, dst: usize) -> bool {
        let needed = Self::needed(route, src, dst);
        let fits = needed.iter().all(|gpu| {
            let wanted = needed.iter().filter(|&g| g == gpu).count() as u32;
            self.0.get(gpu).copied().unwrap_or(0) >= wanted
        });
        if fits {
            for gpu in needed {
                *self.0.get_mut(&gpu).expect("checked above") -= 1;
            }
        }
        fits
    }
}
