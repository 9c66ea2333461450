//! The host's topology checked against what it should be, before any figure is compared: a
//! fault that removes a figure (P2P off, every NVLink of a GPU down) must fail the check, not
//! leave the figure out of it.
//!
//! Against the reference figures, every pair of GPUs of one kind must be joined by the link the
//! reference's pair figures hold for, with P2P. Against a baseline, the host must have the
//! baseline's GPUs, and P2P wherever the baseline measured a copy between two GPUs (a bench
//! document does not record NVLink counts: a link down shows as a slower figure instead).
//! Everything here is read from the backend's topology and from the baseline, never from how a
//! simulated host was made.

use super::reference::Reference;
use crate::bench::document::BenchDocument;
use crate::bench::result::Place;
use crate::topology::Topology;

/// The test whose figures between two GPUs say that the baseline's host had P2P there.
const P2P_TEST: &str = "ce-write";

/// Each way the pairs of `devices` differ from what their reference figures hold for; `kind_of`
/// gives a GPU's reference, if peerlink ships one.
pub(super) fn against_references<'r>(
    host: &Topology,
    devices: &[usize],
    kind_of: impl Fn(usize) -> Option<&'r Reference>,
) -> Vec<String> {
    let mut faults = Vec::new();
    for (i, &a) in devices.iter().enumerate() {
        for &b in &devices[i + 1..] {
            let Some(reference) = kind_of(a).filter(|&r| kind_of(b) == Some(r)) else {
                continue; // GPUs of two kinds: no reference holds for their pair.
            };
            let (there, back) = (host.pair(a, b), host.pair(b, a));
            let Some(pair) = there.or(back) else {
                faults.push(format!(
                    "the host reports no link between GPU {a} and GPU {b}, where two {} are \
                     joined by {} with P2P",
                    reference.gpu, reference.link
                ));
                continue;
            };
            if pair.link != reference.link {
                faults.push(format!(
                    "GPU {a} and GPU {b} are joined by {}, where two {} are joined by {} (the \
                     link their reference figures hold for)",
                    pair.link, reference.gpu, reference.link
                ));
            }
            if !(there.is_some_and(|p| p.p2p) && back.is_some_and(|p| p.p2p)) {
                faults.push(format!(
                    "no P2P between GPU {a} and GPU {b}, which two {} joined by {} have",
                    reference.gpu, reference.link
                ));
            }
        }
    }
    faults
}

/// Each way `host` differs from the host `baseline` (read from `name`) was measured on: fewer or
/// more GPUs, or no P2P on a pair of `devices` the baseline measured a copy on.
pub(super) fn against_baseline(
    host: &Topology,
    devices: &[usize],
    baseline: &BenchDocument,
    name: &str,
) -> Vec<String> {
    let mut faults = Vec::new();
    let (then, now) = (baseline.header.host_gpus.len(), host.devices.len());
    if then > 0 && then != now {
        let why = if now < then {
            " (a GPU fallen off the bus, or hidden from CUDA)"
        } else {
            ""
        };
        faults.push(format!(
            "this host has {now} GPUs, where the host of {name} had {then}{why}"
        ));
    }
    let Some(copies) = baseline.results.tests.iter().find(|t| t.name == P2P_TEST) else {
        return faults;
    };
    for cell in &copies.cells {
        let Place::Pair { src, dst } = cell.place else {
            continue;
        };
        let in_use = src != dst && devices.contains(&src) && devices.contains(&dst);
        if in_use && !host.pair(src, dst).is_some_and(|p| p.p2p) {
            faults.push(format!(
                "no P2P from GPU {src} to GPU {dst}, where {name} measured {P2P_TEST} at {:.1} \
                 GB/s",
                cell.value
            ));
        }
    }
    faults
}
