//! peerlink's all-reduce over P2P, queued on every rank's stream, and the busy kernel: their
//! arguments, grid sizes and the flag layout the kernels share (sources in kernels/collective.cu,
//! whose header explains the protocol).

use std::sync::Arc;

use super::abi::{
    AllReduceArgs, ALL_REDUCE_BLOCKS_PER_SM, ALL_REDUCE_MAX_BLOCKS, ALL_REDUCE_THREADS,
};
use super::{Buffer, Gpus, Stream};
use crate::backend::collective::{
    AllReduceKernel, DataType, Reduction, Waiting, PACKET_MAX_BYTES, PEER_TIMEOUT_NS,
};
use crate::backend::{RawRank, RawRankBuffers};
use crate::{Error, Result};

/// Blocks of one all-reduce launch, the same on every rank: one per `ALL_REDUCE_THREADS` 16-byte
/// vectors a rank reduces (the whole buffer for one-shot, its slice of it for two-shot), so small
/// buffers meet their peers with few blocks, up to every resident slot of the smallest GPU for
/// large ones, and never more than the flag layout holds. The packet kernel gives each thread one
/// 4-byte word, always the same one, so that a word's packets always carry the same block's
/// epoch: one block per `ALL_REDUCE_THREADS` words, never capped (at most 128, for
/// `PACKET_MAX_BYTES`).
pub(super) fn all_reduce_blocks(
    kernel: AllReduceKernel,
    ranks: usize,
    len: usize,
    sm_count: u32,
) -> u32 {
    let vectors = len.div_ceil(16);
    let per_rank = match kernel {
        AllReduceKernel::OneShot => vectors,
        AllReduceKernel::TwoShot => vectors.div_ceil(ranks.max(1)),
        AllReduceKernel::OneShotPackets => {
            // The checked layer keeps `len` within the receive area; the clamp keeps it so here.
            let words = len.min(PACKET_MAX_BYTES).div_ceil(4);
            return words.div_ceil(ALL_REDUCE_THREADS as usize).max(1) as u32;
        }
    };
    let wanted = per_rank.div_ceil(ALL_REDUCE_THREADS as usize).max(1);
    let resident = (sm_count.max(1) * ALL_REDUCE_BLOCKS_PER_SM).min(ALL_REDUCE_MAX_BLOCKS);
    wanted.min(resident as usize) as u32
}

/// Queues `kernel` on every rank's stream (arguments as `RawCollectives::all_reduce` promises).
/// Every GPU's kernels are loaded before the first launch, so a setup failure queues nothing.
#[allow(clippy::too_many_arguments)] // as `RawCollectives::all_reduce`
pub(super) fn all_reduce(
    gpus: &Gpus,
    kernel: AllReduceKernel,
    dtype: DataType,
    op: Reduction,
    ranks: &[RawRank<'_, Gpus>],
    flags: &[&Arc<Buffer>],
    waiting: Waiting<&Arc<Buffer>>,
    len: usize,
) -> Result<()> {
    let kernels = ranks
        .iter()
        .map(|rank| gpus.kernels(rank.stream.device))
        .collect::<Result<Vec<_>>>()?;
    let devices = ranks.iter().map(|rank| rank.stream.device);
    let blocks = launch_blocks(gpus, kernel, devices, len)?;
    let inputs: Vec<u64> = ranks.iter().map(|rank| rank.input.address()).collect();
    let outputs: Vec<u64> = ranks.iter().map(|rank| rank.output.address()).collect();
    let flags: Vec<u64> = flags.iter().map(|flag| flag.address()).collect();
    let elements = (len / dtype.size()) as u64;
    let waiting = waiting.map(|word| word.address());
    let shared = AllReduceArgs::shared(&inputs, &outputs, &flags, elements, op, waiting);
    for (index, (rank, kernels)) in ranks.iter().zip(&kernels).enumerate() {
        let args = shared.for_rank(index);
        gpus.count(|c| &c.launches);
        kernels
            .all_reduce(&rank.stream.stream, kernel, dtype, &args, blocks)
            .map_err(|error| lost_rank(error, index, waiting))?;
    }
    Ok(())
}

/// Queues rank `rank`'s kernel on `stream`, over every rank's buffers (arguments as
/// `RawCollectives::rank_all_reduce` promises): the other ranks' processes queue theirs, each
/// sizing the grid as this one does, by the smallest of the ranks' GPUs.
#[allow(clippy::too_many_arguments)] // as `RawCollectives::rank_all_reduce`
pub(super) fn rank_all_reduce(
    gpus: &Gpus,
    kernel: AllReduceKernel,
    dtype: DataType,
    op: Reduction,
    rank: usize,
    stream: &Stream,
    ranks: &[RawRankBuffers<'_, Gpus>],
    waiting: Waiting<&Arc<Buffer>>,
    len: usize,
) -> Result<()> {
    let kernels = gpus.kernels(stream.device)?;
    let blocks = launch_blocks(gpus, kernel, ranks.iter().map(|r| r.device), len)?;
    let at = |buffer: &Buffer, offset: usize| buffer.address() + offset as u64;
    let inputs: Vec<u64> = ranks.iter().map(|r| at(r.input, r.input_offset)).collect();
    let outputs: Vec<u64> = ranks
        .iter()
        .map(|r| at(r.output, r.output_offset))
        .collect();
    let flags: Vec<u64> = ranks.iter().map(|r| r.flags.address()).collect();
    let elements = (len / dtype.size()) as u64;
    let waiting = waiting.map(|word| word.address());
    let args =
        AllReduceArgs::shared(&inputs, &outputs, &flags, elements, op, waiting).for_rank(rank);
    gpus.count(|c| &c.launches);
    kernels.all_reduce(&stream.stream, kernel, dtype, &args, blocks)
}

/// Blocks of one launch on every rank's GPU (`devices`, [`all_reduce_blocks`]), sized by the
/// smallest; refused where the packet kernel's blocks, which wait for their counterparts on the
/// peers, would not all be resident at once on every GPU.
fn launch_blocks(
    gpus: &Gpus,
    kernel: AllReduceKernel,
    devices: impl ExactSizeIterator<Item = usize>,
    len: usize,
) -> Result<u32> {
    let ranks = devices.len();
    let sm_count = devices.map(|d| gpus.sm_counts[d]).min().unwrap_or(1);
    let blocks = all_reduce_blocks(kernel, ranks, len, sm_count);
    let resident = sm_count * ALL_REDUCE_BLOCKS_PER_SM;
    if kernel == AllReduceKernel::OneShotPackets && blocks > resident {
        return Err(Error::usage(format!(
            "the one-shot-packets all-reduce of {len} bytes needs {blocks} blocks resident at \
             once, and the smallest of these GPUs holds {resident}: use it for at most {} bytes, \
             or one-shot",
            resident as usize * ALL_REDUCE_THREADS as usize * 4
        )));
    }
    Ok(blocks)
}

/// A launch that failed after earlier ranks were queued: they will wait for this one in vain,
/// as `waiting` lets them.
fn lost_rank(error: Error, rank: usize, waiting: Waiting<u64>) -> Error {
    let until = match waiting {
        Waiting::Released(_) => "until their release word is raised".to_string(),
        Waiting::Bounded => format!(
            "and stop their GPUs with an error after {} s",
            PEER_TIMEOUT_NS / 1_000_000_000
        ),
    };
    match error {
        Error::Cuda { call, message } if rank > 0 => Error::Cuda {
            call,
            message: format!(
                "{message} (rank {rank}; ranks 0 to {} are queued and will wait for it {until})",
                rank - 1,
            ),
        },
        other => other,
    }
}

/// Queues the busy kernel for `duration_us` (finite, ≥ 0) of GPU time.
pub(super) fn busy(gpus: &Gpus, stream: &Stream, duration_us: f64) -> Result<()> {
    gpus.count(|c| &c.launches);
    gpus.kernels(stream.device)?
        .busy(&stream.stream, busy_ns(duration_us))
}

/// Microseconds as the kernel's nanoseconds, rounded (saturating past u64's range).
fn busy_ns(duration_us: f64) -> u64 {
    (duration_us * 1000.0).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::collective::FLAG_BYTES;
    use crate::backend::cuda::abi::{FLAG_BYTES_USED, PACKET_AREA_BYTES, PACKET_AREA_OFFSET};

    #[test]
    fn flag_layout_fits_the_flag_block() {
        // Also asserted at compile time; here the sum is spelled out: 512 blocks × (1 counter + 2 phases × 8 ranks) u32 words.
        assert_eq!(FLAG_BYTES_USED, 34_816);
        assert!(all_reduce_blocks(AllReduceKernel::OneShot, 2, 1 << 30, 10_000) <= 512);
        // Then the receive area: 2 parities × 8 senders × 64 Ki words × 8-byte packets = 8 MiB,
        // right after the 64 KiB of flags, filling the block.
        assert_eq!(PACKET_AREA_BYTES, 8 << 20);
        assert_eq!(PACKET_AREA_OFFSET + PACKET_AREA_BYTES, FLAG_BYTES);
    }

    #[test]
    fn packet_words_map_to_fixed_blocks_within_the_receive_area() {
        let packets = |len, sms| all_reduce_blocks(AllReduceKernel::OneShotPackets, 2, len, sms);
        assert_eq!(packets(4, 132), 1);
        assert_eq!(packets(2, 132), 1);
        assert_eq!(packets(512 * 4, 132), 1);
        assert_eq!(packets(512 * 4 + 2, 132), 2);
        // Never capped by the SMs (the word-to-block map must not change with the GPU's load).
        assert_eq!(packets(PACKET_MAX_BYTES, 8), 128);
        assert_eq!(
            packets(PACKET_MAX_BYTES, 132) as usize * ALL_REDUCE_THREADS as usize,
            PACKET_MAX_BYTES / 4
        );
    }

    #[test]
    fn small_buffers_meet_with_one_block_and_large_ones_fill_the_gpu() {
        let h200_sms = 132;
        let one_shot =
            |ranks, len| all_reduce_blocks(AllReduceKernel::OneShot, ranks, len, h200_sms);
        let two_shot =
            |ranks, len| all_reduce_blocks(AllReduceKernel::TwoShot, ranks, len, h200_sms);
        assert_eq!(one_shot(2, 4), 1);
        assert_eq!(one_shot(8, 512 * 16), 1);
        assert_eq!(one_shot(8, 512 * 16 + 1), 2);
        assert_eq!(one_shot(2, 1 << 20), 128);
        assert_eq!(one_shot(2, 64 << 20), 264);
        // Two-shot: each rank reduces one slice.
        assert_eq!(two_shot(2, 1 << 20), 64);
        assert_eq!(two_shot(8, 1 << 20), 16);
        assert_eq!(two_shot(8, 64 << 20), 264);
        // The flag layout caps a GPU with more SMs than it holds blocks for.
        assert_eq!(one_shot(2, 1 << 30).max(two_shot(2, 1 << 30)), 264);
        assert_eq!(
            all_reduce_blocks(AllReduceKernel::OneShot, 2, 1 << 30, 400),
            ALL_REDUCE_MAX_BLOCKS
        );
        assert_eq!(all_reduce_blocks(AllReduceKernel::TwoShot, 0, 0, 0), 1);
    }

    #[test]
    fn busy_durations_round_to_nanoseconds() {
        assert_eq!(busy_ns(0.0), 0);
        assert_eq!(busy_ns(100.0), 100_000);
        assert_eq!(busy_ns(0.0004), 0);
        assert_eq!(busy_ns(1.0006), 1_001);
        assert_eq!(busy_ns(1e30), u64::MAX);
    }

    #[test]
    fn a_lost_rank_says_who_waits_for_it() {
        let failed = || Error::Cuda {
            call: "cuLaunchKernel".into(),
            message: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES".into(),
        };
        let first = lost_rank(failed(), 0, Waiting::Bounded).to_string();
        assert!(!first.contains("queued"), "{first}");
        let third = lost_rank(failed(), 2, Waiting::Bounded).to_string();
        assert!(third.contains("rank 2; ranks 0 to 1 are queued"), "{third}");
        assert!(third.contains("after 10 s"), "{third}");
        let released = lost_rank(failed(), 1, Waiting::Released(0x1000)).to_string();
        assert!(
            released.contains("until their release word is raised"),
            "{released}"
        );
    }
}
