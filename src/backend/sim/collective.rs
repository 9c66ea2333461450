//! peerlink's all-reduce kernels on the simulated links.
//!
//! Every rank's kernel launches on its own stream and spins until every other rank's kernel runs
//! (the ranks meet at their flag blocks); then, after a flag exchange, the bytes move as flows over
//! the links, sharing them max-min with everything else in flight, at an SM kernel's share of each
//! path's rate; a second flag exchange ends the call (the packet kernel has neither exchange: its
//! data is its signal). The sums written are real. Every figure is simulated from the preset.

use super::links::{Chain, LinkModel, Place};
use super::memory::Key;
use super::scheduler::{Collective, PlannedFlow, Results, Venue};
use crate::backend::collective::{AllReduceKernel, DataType, Reduction, PEER_TIMEOUT_NS};

/// One rank of a collective, as the simulator plans it: its GPU and buffers.
pub(super) struct RankPlan {
    pub device: usize,
    pub input: Key,
    pub output: Key,
}

/// peerlink's all-reduce (`op`) of `len` bytes over `ranks` (distinct GPUs with P2P).
///
/// The fixed costs: a flag exchange before the data moves and one after (the slowest pair's
/// one-way signal each), one remote load's round trip before the first bytes arrive, and for
/// two-shot a second round trip: the fence after its remote stores waits for them to land. The
/// data: one-shot, each rank reads every peer's whole input; two-shot, rank `r` reads slice `r`
/// of every peer's input and writes its sum into slice `r` of every peer's output, the reads and
/// writes of a rank overlapping as the kernel pipelines them. Every rank waits for every flow: the
/// closing flag exchange is a barrier. The packet kernel has no barrier: each rank pushes twice its
/// input's bytes (packets are half data) to every peer, the first bytes landing one one-way signal
/// after the launch, and each rank waits only for the packets pushed to it. (The ranks still start
/// together here, as the others do: a rank's packets cannot all arrive before its peers run.)
/// One rank's kernel copies its input to its output within its GPU. A `bounded` wait traps where
/// a rank waits for the last one longer than [`PEER_TIMEOUT_NS`].
#[allow(clippy::too_many_arguments)] // as `RawCollectives::all_reduce`
pub(super) fn all_reduce(
    links: &LinkModel,
    kernel: AllReduceKernel,
    dtype: DataType,
    op: Reduction,
    ranks: &[RankPlan],
    flags: &[Key],
    bounded: bool,
    len: usize,
) -> Collective {
    let n = ranks.len();
    let pairs: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
        .collect();
    let slowest = |cost: &dyn Fn(usize, usize) -> f64| {
        pairs
            .iter()
            .map(|&(i, j)| cost(ranks[i].device, ranks[j].device))
            .fold(0.0, f64::max)
    };
    let signal_us = slowest(&|a, b| links.signal_us(a, b));
    let round_trip_us =
        slowest(&|a, b| links.load_latency_us(a, Place::Device(b), Chain::InMemory));
    let everyone: Vec<usize> = (0..n).collect();
    let path = |from: usize, to: usize, by: usize| {
        links.kernel(
            Place::Device(ranks[from].device),
            Place::Device(ranks[to].device),
            ranks[by].device,
        )
    };
    let flow = |from: usize, to: usize, by: usize, bytes: usize| PlannedFlow {
        path: path(from, to, by),
        bytes,
        latency_us: signal_us + round_trip_us,
        holds: everyone.clone(),
    };
    let (flows, tail_us) = match kernel {
        // One rank meets no one: its kernel reads its input and writes its output, a copy
        // within its GPU.
        _ if n == 1 => (vec![flow(0, 0, 0, len)], 0.0),
        AllReduceKernel::OneShot => {
            let reads = pairs.iter().map(|&(i, j)| flow(j, i, i, len)).collect();
            (reads, signal_us)
        }
        AllReduceKernel::TwoShot => {
            let slice = |r: usize| slice_bytes(len, dtype, n, r);
            let reads = pairs.iter().map(|&(i, j)| flow(j, i, i, slice(i)));
            let writes = pairs.iter().map(|&(i, j)| flow(i, j, i, slice(i)));
            (reads.chain(writes).collect(), round_trip_us + signal_us)
        }
        AllReduceKernel::OneShotPackets => {
            // Rank i pushes packets (twice its input's bytes) to rank j, the first arriving one
            // signal after the launch; only j waits for them, and nothing after.
            let pushes = pairs.iter().map(|&(i, j)| PlannedFlow {
                path: path(i, j, i),
                bytes: 2 * len,
                latency_us: signal_us,
                holds: vec![j],
            });
            (pushes.collect(), 0.0)
        }
    };
    Collective {
        venue: Venue::Flags(flags[0]),
        ranks: n,
        flows,
        tail_us,
        results: Results::Reduced {
            dtype,
            op,
            inputs: ranks.iter().map(|r| r.input).collect(),
            outputs: ranks.iter().map(|r| r.output).collect(),
            len,
        },
        scratch: flags.to_vec(),
        wait_limit_us: bounded.then_some(PEER_TIMEOUT_NS as f64 / 1e3),
    }
}

/// Bytes of rank `r`'s slice when `len` bytes of `dtype` are split into `n` slices of whole
/// elements, as even as they go.
fn slice_bytes(len: usize, dtype: DataType, n: usize, r: usize) -> usize {
    let elements = len / dtype.size();
    let start = |r: usize| r * elements / n;
    (start(r + 1) - start(r)) * dtype.size()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_buffer_in_whole_elements() {
        for (len, dtype, n) in [
            (8, DataType::F32, 8),
            (1 << 20, DataType::Bf16, 3),
            (6, DataType::Bf16, 2),
        ] {
            let slices: Vec<usize> = (0..n).map(|r| slice_bytes(len, dtype, n, r)).collect();
            assert_eq!(slices.iter().sum::<usize>(), len, "{slices:?}");
            assert!(slices.iter().all(|s| s % dtype.size() == 0), "{slices:?}");
            let (min, max) = (slices.iter().min().unwrap(), slices.iter().max().unwrap());
            assert!(max - min <= dtype.size(), "{slices:?}");
        }
    }
}
