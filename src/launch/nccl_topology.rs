//! NCCL run for its own view of the host (`peerlink topo --nccl`): a communicator made over the
//! GPUs with `NCCL_TOPO_DUMP_FILE` set, whose dump [`NcclView::compare`] reads beside peerlink's
//! topology. Here, above the backend, because it makes an NCCL communicator through it; reading
//! the dump is the topology's ([`crate::topology::nccl_view`]).
//!
//! [`NcclView::compare`]: crate::topology::nccl_view::NcclView::compare

use crate::backend::Backend;
use crate::topology::nccl_view::read_dump;
use crate::{Error, Result};
use std::path::PathBuf;

/// Where NCCL writes its dump when peerlink runs it: the user's `NCCL_TOPO_DUMP_FILE` (kept), or
/// a temporary file (removed once read).
fn dump_file() -> (PathBuf, bool) {
    match std::env::var_os("NCCL_TOPO_DUMP_FILE") {
        Some(path) if !path.is_empty() => (PathBuf::from(path), true),
        _ => (
            std::env::temp_dir().join(format!("peerlink-nccl-topo-{}.xml", std::process::id())),
            false,
        ),
    }
}

/// Makes an NCCL communicator over `devices` with `NCCL_TOPO_DUMP_FILE` set, and returns the dump
/// NCCL wrote at its creation and the file it was written to.
pub fn run_nccl(backend: &dyn Backend, devices: &[usize]) -> Result<(String, PathBuf)> {
    if backend.topology().is_simulated() {
        return Err(Error::usage(
            "NCCL's own topology needs real GPUs: the simulator's NCCL is a model that reads no \
             hardware; compare a dump NCCL wrote elsewhere with --nccl-xml FILE",
        ));
    }
    let nccl = backend
        .collectives()
        .nccl()
        .map_err(|why| Error::usage(format!("NCCL's view needs NCCL: {why}")))?;
    let (file, keep) = dump_file();
    // NCCL reads the variable when it builds a communicator's topology (ncclTopoGetSystem).
    std::env::set_var("NCCL_TOPO_DUMP_FILE", &file);
    let made = nccl
        .communicator(devices)
        .and_then(|comm| nccl.destroy_communicator(comm));
    if !keep {
        std::env::remove_var("NCCL_TOPO_DUMP_FILE");
    }
    made?;
    let text = read_dump(&file)?;
    if !keep {
        // A temporary file; nothing is lost where it cannot be removed.
        let _ = std::fs::remove_file(&file);
    }
    Ok((text, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulator_cannot_run_nccl_for_its_view() {
        let backend = crate::backend::sim::SimBackend::open("dgx-h100").unwrap();
        let err = run_nccl(&backend, &[0, 1]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--nccl-xml"), "{err}");
    }
}
