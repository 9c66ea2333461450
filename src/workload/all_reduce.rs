//! The all-reduce (sum): peerlink's one-shot, two-shot and one-shot-packets kernels, and the kernel
//! its cost model picks at each size, against `ncclAllReduce`.
//!
//! Every kernel is measured at every size it takes (the packet kernel up to `PACKET_MAX_BYTES`, 256 KiB), so that the
//! pick can be checked: its row repeats the picked kernel's time, with the prediction and its
//! regret against the fastest kernel. peerlink's
//! kernels read and write peers' memory, so they need P2P between every two GPUs; where a pair has
//! none, their rows are left out and the notices say which pair.
//!
//! Inputs hold small integers (−8 to 8), whose sums over up to eight ranks are exact in f32 and in
//! bf16 whatever the order of the additions: the host's expectation is exact, and every byte of
//! every rank's output is compared with it.

use super::{
    buffers_on, enable_peers, ids, length, measure, nccl, row, streams_on, within_one_host,
    Communicator, Contender, Measured, Operation, Settings, Workload,
};
use crate::backend::collective::{
    AllReduceKernel, Collectives, DataType, Rank, FLAG_BYTES, MAX_RANKS,
};
use crate::backend::{Backend, BufferId, Owned};
use crate::bench::progress::Progress;
use crate::model::{CostModel, Hop};
use crate::units::format_bytes;
use crate::workload::Row;
use crate::{Error, Result};
use std::collections::HashMap;

/// A flag round trip between two GPUs' kernels: a store into a peer's memory seen by the peer and
/// answered (the H200 pair's GPU-initiated ping-pong: 0.70 µs one way, docs/reference.md). PCIe
/// pairs take longer; the cost model uses it only to rank the kernels, which pay it alike but for
/// how many exchanges each waits for.
pub const FLAG_ROUND_TRIP_US: f64 = 1.4;

/// Flag round trips a kernel waits for: one-shot meets its peers before reading and after (so
/// that no input is changed while read); two-shot once more between its reduce-scatter and
/// all-gather; the packet kernel meets no one and waits only for its peers' first packets, one
/// way.
fn flag_exchanges(kernel: AllReduceKernel) -> f64 {
    match kernel {
        AllReduceKernel::OneShot => 2.0,
        AllReduceKernel::TwoShot => 3.0,
        AllReduceKernel::OneShotPackets => 0.5,
    }
}

/// Bytes each directed pair (p → r) carries in one all-reduce of `bytes` over `ranks`: one-shot
/// reads every peer's whole input; two-shot reads a slice from each peer and writes a slice to it;
/// the packet kernel pushes every peer its whole input as packets, half of them data.
fn pair_bytes(kernel: AllReduceKernel, bytes: u64, ranks: usize) -> f64 {
    match kernel {
        AllReduceKernel::OneShot => bytes as f64,
        AllReduceKernel::TwoShot => 2.0 * bytes as f64 / ranks as f64,
        AllReduceKernel::OneShotPackets => 2.0 * bytes as f64,
    }
}

/// The cost model's time for `kernel` reducing `bytes` over `devices`, µs: a launch, its flag
/// exchanges, and its bytes through the busiest link (each directed pair at an SM kernel's rate,
/// and what every pair puts on a shared link or switch port together at that resource's rate).
/// `None` where a pair has no P2P.
pub fn predict(
    model: &CostModel,
    devices: &[usize],
    kernel: AllReduceKernel,
    bytes: u64,
) -> Option<f64> {
    let per_pair = pair_bytes(kernel, bytes, devices.len());
    let mut launch_us: f64 = 0.0;
    let mut link_us: f64 = 0.0;
    let mut shared: HashMap<crate::model::Resource, f64> = HashMap::new();
    for &r in devices {
        for &p in devices {
            if p == r {
                continue;
            }
            let hop = Hop::PeerSm { src: p, dst: r };
            let cost = model.cost(hop)?;
            launch_us = launch_us.max(cost.alpha_us);
            link_us = link_us.max(per_pair / cost.beta_gbps / 1e3);
            for resource in model.resources(hop) {
                *shared.entry(resource).or_default() += per_pair;
            }
        }
    }
    for (resource, load) in shared {
        link_us = link_us.max(load / model.capacity_gbps(resource) / 1e3);
    }
    Some(launch_us + flag_exchanges(kernel) * FLAG_ROUND_TRIP_US + link_us)
}

/// The kernel the cost model picks for `bytes` among those that take it (the earlier in
/// `AllReduceKernel::ALL` on a tie) and its predicted time; `None` where a pair has no P2P.
pub fn pick(model: &CostModel, devices: &[usize], bytes: u64) -> Option<(AllReduceKernel, f64)> {
    pick_by(bytes, |kernel| predict(model, devices, kernel, bytes))
}

/// [`pick`] for a sum into the inputs themselves (PyTorch's `all_reduce_`): a kernel that cannot
/// reduce in place first copies each rank's input aside, and that copy is priced too (at 1 GiB
/// on the H200 pair it made the one-shot kernel 17% slower than the two-shot, which the plain
/// pick, ignoring it, preferred).
pub fn pick_in_place(
    model: &CostModel,
    devices: &[usize],
    bytes: u64,
) -> Option<(AllReduceKernel, f64)> {
    pick_with_copies(model, devices, bytes, copies_in_place)
}

/// The copies aside a sum into the inputs themselves makes: one where the kernel cannot reduce in
/// place, none where it can.
fn copies_in_place(kernel: AllReduceKernel) -> u32 {
    u32::from(!kernel.in_place())
}

/// [`pick`] for a sum into each process's own buffer when the ranks are processes
/// ([`crate::engine::GroupAllReduce`]): the peers reach only memory shared with them, so a kernel
/// that reads the peers' inputs (one-shot, two-shot) first copies the rank's buffer into its
/// shared one, and two-shot, which also writes the peers' outputs, copies the sum back; the packet
/// kernel reads only its own buffer and copies nothing. `symmetric` memory, which every rank
/// reaches, is summed in place as within one process ([`pick_in_place`]): two-shot copies nothing
/// and only one-shot copies its input aside. The copies are priced.
pub fn pick_across_processes(
    model: &CostModel,
    devices: &[usize],
    bytes: u64,
    symmetric: bool,
) -> Option<(AllReduceKernel, f64)> {
    pick_with_copies(model, devices, bytes, |kernel| {
        copies_across_processes(kernel, symmetric)
    })
}

/// The local copies one call of `kernel` makes across processes, in `symmetric` memory or not
/// (see [`pick_across_processes`]).
pub fn copies_across_processes(kernel: AllReduceKernel, symmetric: bool) -> u32 {
    if symmetric {
        return copies_in_place(kernel);
    }
    match kernel {
        AllReduceKernel::OneShotPackets => 0,
        AllReduceKernel::OneShot => 1,
        AllReduceKernel::TwoShot => 2,
    }
}

/// [`pick`] with `copies(kernel)` local copies of the buffer on every rank priced on top of the
/// kernel (the slowest GPU's copy each).
fn pick_with_copies(
    model: &CostModel,
    devices: &[usize],
    bytes: u64,
    copies: impl Fn(AllReduceKernel) -> u32,
) -> Option<(AllReduceKernel, f64)> {
    pick_by(bytes, |kernel| {
        let reduce_us = predict(model, devices, kernel, bytes)?;
        let count = copies(kernel);
        if count == 0 {
            return Some(reduce_us);
        }
        let copy_us = devices
            .iter()
            .map(|&device| model.cost(Hop::Local { device }).map(|c| c.time_us(bytes)))
            .try_fold(0.0_f64, |slowest, us| Some(slowest.max(us?)))?;
        Some(f64::from(count) * copy_us + reduce_us)
    })
}

/// The kernel whose `predicted` time is least among those that take `bytes` (the earlier in
/// `AllReduceKernel::ALL` on a tie); `None` where a prediction is `None`.
fn pick_by(
    bytes: u64,
    predicted: impl Fn(AllReduceKernel) -> Option<f64>,
) -> Option<(AllReduceKernel, f64)> {
    let mut best: Option<(AllReduceKernel, f64)> = None;
    for kernel in AllReduceKernel::ALL
        .into_iter()
        .filter(|k| takes(*k, bytes))
    {
        let us = predicted(kernel)?;
        if best.is_none_or(|(_, b)| us < b) {
            best = Some((kernel, us));
        }
    }
    best
}

/// Whether `kernel` takes an all-reduce of `bytes`.
fn takes(kernel: AllReduceKernel, bytes: u64) -> bool {
    usize::try_from(bytes).is_ok_and(|len| len <= kernel.max_len())
}

/// Rank `rank`'s element `i`: a small integer, −8 to 8.
pub fn element(rank: usize, i: usize) -> i32 {
    ((i * 5 + rank * 3) % 17) as i32 - 8
}

/// `values` as `dtype` bytes, little-endian (a bf16 is an f32's upper half, exact for these).
pub fn encode(dtype: DataType, values: impl Iterator<Item = i32>, out: &mut Vec<u8>) {
    out.clear();
    for v in values {
        let bits = (v as f32).to_bits();
        match dtype {
            DataType::F32 => out.extend_from_slice(&bits.to_le_bytes()),
            DataType::Bf16 => out.extend_from_slice(&((bits >> 16) as u16).to_le_bytes()),
        }
    }
}

/// What every rank's output must hold after an all-reduce of `elements` over `ranks`.
pub fn expected(dtype: DataType, ranks: usize, elements: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(elements * dtype.size());
    encode(
        dtype,
        (0..elements).map(|i| (0..ranks).map(|r| element(r, i)).sum()),
        &mut out,
    );
    out
}

/// Checks every rank's output against `expected`: the first wrong byte as
/// [`Error::Verification`].
pub fn check_outputs(
    backend: &dyn Backend,
    what: &str,
    devices: &[usize],
    outputs: &[BufferId],
    expected: &[u8],
) -> Result<()> {
    let mut found = vec![0; expected.len()];
    for (&device, &output) in devices.iter().zip(outputs) {
        backend.read(output, 0, &mut found)?;
        Error::check_bytes(what, device, device, expected, &found)?;
    }
    Ok(())
}

struct PeerlinkAllReduce<'a> {
    collectives: &'a dyn Collectives,
    kernel: AllReduceKernel,
    dtype: DataType,
    ranks: &'a [Rank],
    flags: &'a [BufferId],
    len: usize,
}

impl Operation for PeerlinkAllReduce<'_> {
    fn queue(&mut self, _step: u64) -> Result<()> {
        self.collectives
            .all_reduce(self.kernel, self.dtype, self.ranks, self.flags, self.len)
    }
}

struct NcclAllReduce<'a> {
    comm: &'a Communicator<'a>,
    dtype: DataType,
    ranks: &'a [Rank],
    len: usize,
}

impl Operation for NcclAllReduce<'_> {
    fn queue(&mut self, _step: u64) -> Result<()> {
        self.comm
            .nccl
            .all_reduce(self.comm.id, self.dtype, self.ranks, self.len)
    }
}

/// peerlink's flag blocks (zeroed), or `None` with a notice saying why its kernels cannot run here.
fn peerlink_flags<'b>(
    backend: &'b dyn Backend,
    devices: &[usize],
    notices: &mut Vec<String>,
) -> Result<Option<Vec<Owned<'b, BufferId>>>> {
    if let Some(notice) =
        within_one_host(backend.topology(), devices, "peerlink's all-reduce kernels")
    {
        notices.push(notice);
        return Ok(None);
    }
    if devices.len() > MAX_RANKS {
        notices.push(format!(
            "peerlink's all-reduce serves at most {MAX_RANKS} GPUs ({} selected): its rows are \
             left out; choose fewer with --devices",
            devices.len()
        ));
        return Ok(None);
    }
    if let Some(&(a, b)) = enable_peers(backend, devices)?.first() {
        notices.push(format!(
            "no P2P between GPUs {a} and {b}: peerlink's all-reduce needs P2P between every two \
             GPUs, so its rows are left out"
        ));
        return Ok(None);
    }
    let flags = buffers_on(backend, devices, FLAG_BYTES)?;
    let zeros = vec![0; FLAG_BYTES];
    for flag in &flags {
        backend.write(**flag, 0, &zeros)?;
    }
    Ok(Some(flags))
}

/// Fails unless every size of the sweep is a whole number of `dtype` elements: checked before
/// anything runs, in one process or across processes.
pub(crate) fn check_sizes(sizes: &[u64], dtype: DataType) -> Result<()> {
    match sizes.iter().find(|&&s| s % dtype.size() as u64 != 0) {
        Some(bad) => Err(Error::usage(format!(
            "all-reduce sizes are whole {dtype} elements: {bad} bytes is not a multiple of {}",
            dtype.size()
        ))),
        None => Ok(()),
    }
}

/// Runs the all-reduce sweep.
pub fn run(
    backend: &dyn Backend,
    settings: &mut Settings,
    dtype: Option<DataType>,
    progress: &dyn Progress,
) -> Result<Vec<Row>> {
    let dtype = dtype.unwrap_or(DataType::F32);
    check_sizes(&settings.sizes, dtype)?;
    let devices = settings.devices.clone();
    let n = devices.len();
    let streams = streams_on(backend, &devices)?;
    let largest = length(settings.largest())?;
    let inputs = buffers_on(backend, &devices, largest)?;
    let outputs = buffers_on(backend, &devices, largest)?;
    let ranks: Vec<Rank> = (0..n)
        .map(|r| Rank {
            stream: *streams[r],
            input: *inputs[r],
            output: *outputs[r],
        })
        .collect();
    let flags = peerlink_flags(backend, &devices, &mut settings.notices)?;
    let comm = nccl(backend, &mut settings.notices)
        .map(|nccl| Communicator::new(nccl, &devices))
        .transpose()?;
    let model = CostModel::from_topology(backend.topology());
    let (stream_ids, output_ids) = (ids(&streams), ids(&outputs));
    let mut rows = Vec::new();
    let mut scratch = Vec::new();
    progress.start("all-reduce", settings.sizes.len() as u64);
    for bytes in settings.sizes_to_run() {
        let len = length(bytes)?;
        let elements = len / dtype.size();
        for (r, input) in inputs.iter().enumerate() {
            encode(dtype, (0..elements).map(|i| element(r, i)), &mut scratch);
            backend.write(**input, 0, &scratch)?;
        }
        let want = expected(dtype, n, elements);
        let poison = || {
            let nan = vec![0xff; len];
            output_ids
                .iter()
                .try_for_each(|&o| backend.write(o, 0, &nan))
        };
        let counts = settings.counts(bytes);
        let measured = |contender, algorithm: String, issue, op: &mut dyn Operation| {
            let what = format!("all-reduce {algorithm} {dtype} {}", format_bytes(bytes));
            let time_us = measure(backend, &stream_ids, issue, counts, op, poison, || {
                check_outputs(backend, &what, &devices, &output_ids, &want)
            })?;
            Ok::<_, Error>(Measured {
                variant: None,
                bytes,
                contender,
                algorithm,
                issue,
                iters: counts.iters,
                time_us,
            })
        };
        for &issue in &settings.issue {
            if let Some(flags) = &flags {
                let flags = ids(flags);
                let mut times = Vec::with_capacity(AllReduceKernel::ALL.len());
                for kernel in AllReduceKernel::ALL
                    .into_iter()
                    .filter(|&k| takes(k, bytes))
                {
                    let mut op = PeerlinkAllReduce {
                        collectives: backend.collectives(),
                        kernel,
                        dtype,
                        ranks: &ranks,
                        flags: &flags,
                        len,
                    };
                    let m = measured(Contender::Peerlink, kernel.name().into(), issue, &mut op)?;
                    times.push((kernel, m.time_us));
                    rows.push(row(
                        Workload::AllReduce,
                        n,
                        settings.simulated,
                        Some(dtype),
                        m,
                    ));
                }
                if let Some((kernel, predicted_us)) = pick(&model, &devices, bytes) {
                    let (_, time_us) = *times
                        .iter()
                        .find(|&&(k, _)| k == kernel)
                        .expect("the pick is among the kernels measured");
                    let fastest = times.iter().map(|&(_, t)| t).fold(f64::INFINITY, f64::min);
                    let m = Measured {
                        variant: None,
                        bytes,
                        contender: Contender::PeerlinkPick,
                        algorithm: kernel.name().into(),
                        issue,
                        iters: counts.iters,
                        time_us,
                    };
                    let mut picked =
                        row(Workload::AllReduce, n, settings.simulated, Some(dtype), m);
                    picked.predicted_us = Some(predicted_us);
                    picked.regret = Some(time_us / fastest - 1.0);
                    rows.push(picked);
                }
            }
            if let Some(comm) = &comm {
                let mut op = NcclAllReduce {
                    comm,
                    dtype,
                    ranks: &ranks,
                    len,
                };
                let m = measured(Contender::Nccl, "ncclAllReduce".into(), issue, &mut op)?;
                rows.push(row(
                    Workload::AllReduce,
                    n,
                    settings.simulated,
                    Some(dtype),
                    m,
                ));
            }
        }
        progress.step();
    }
    progress.finish();
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::collective::PACKET_MAX_BYTES;
    use crate::model::test_support::{dgx1, nvswitch8};

    #[test]
    fn sums_of_the_pattern_are_exact_in_both_types() {
        for ranks in 2..=MAX_RANKS {
            let bf16 = expected(DataType::Bf16, ranks, 100);
            let f32s = expected(DataType::F32, ranks, 100);
            for i in 0..100 {
                let sum: i32 = (0..ranks).map(|r| element(r, i)).sum();
                assert!(sum.abs() <= 64, "{sum}");
                let b = u16::from_le_bytes([bf16[2 * i], bf16[2 * i + 1]]);
                assert_eq!(f32::from_bits(u32::from(b) << 16), sum as f32);
                let f = f32::from_le_bytes(f32s[4 * i..4 * i + 4].try_into().unwrap());
                assert_eq!(f, sum as f32);
            }
        }
        // Ranks hold different values, so that a kernel that skipped a peer would be caught.
        assert_ne!(element(0, 0), element(1, 0));
    }

    #[test]
    fn packets_are_picked_for_small_buffers_and_two_shot_for_large_on_eight_gpus() {
        let model = CostModel::from_topology(&nvswitch8());
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(
            pick(&model, &all, 4 << 10).unwrap().0,
            AllReduceKernel::OneShotPackets
        );
        assert_eq!(
            pick(&model, &all, 256 << 20).unwrap().0,
            AllReduceKernel::TwoShot
        );
        // The predictions grow with the size, and the pick is the cheapest kernel that takes it.
        for bytes in [4, 64 << 10, (64 << 10) + 4, 64 << 20] {
            let (kernel, us) = pick(&model, &all, bytes).unwrap();
            for other in AllReduceKernel::ALL
                .into_iter()
                .filter(|&k| takes(k, bytes))
            {
                assert!(
                    predict(&model, &all, other, bytes).unwrap() >= us,
                    "{bytes}: {kernel:?}"
                );
            }
        }
        for kernel in AllReduceKernel::ALL {
            assert!(
                predict(&model, &all, kernel, 64 << 10).unwrap()
                    > predict(&model, &all, kernel, 4).unwrap()
            );
        }
    }

    #[test]
    fn two_gpus_take_packets_up_to_their_limit_then_one_shot_wins_on_flags() {
        let model = CostModel::from_topology(&nvswitch8());
        let limit = PACKET_MAX_BYTES as u64;
        for (bytes, want) in [
            (4, AllReduceKernel::OneShotPackets),
            (limit, AllReduceKernel::OneShotPackets),
            (limit + 4, AllReduceKernel::OneShot),
            (1 << 20, AllReduceKernel::OneShot),
            (1 << 30, AllReduceKernel::OneShot),
        ] {
            let (kernel, _) = pick(&model, &[0, 1], bytes).unwrap();
            assert_eq!(kernel, want, "{bytes}");
        }
        // At 4 bytes the packet kernel saves one and a half flag round trips.
        let saved = predict(&model, &[0, 1], AllReduceKernel::OneShot, 4).unwrap()
            - predict(&model, &[0, 1], AllReduceKernel::OneShotPackets, 4).unwrap();
        assert!((saved - 1.5 * FLAG_ROUND_TRIP_US).abs() < 0.01, "{saved}");
    }

    #[test]
    fn in_place_the_one_shot_kernels_copy_aside_is_priced_and_two_shot_wins_large_pairs() {
        let model = CostModel::from_topology(&nvswitch8());
        let pair = [0, 1];
        let gib = 1 << 30;
        // Beside other buffers one-shot wins a pair (one flag exchange fewer, the same bytes)...
        assert_eq!(
            pick(&model, &pair, gib).unwrap().0,
            AllReduceKernel::OneShot
        );
        // ...in place it must first copy its input aside, which two-shot need not.
        let (kernel, us) = pick_in_place(&model, &pair, gib).unwrap();
        assert_eq!(kernel, AllReduceKernel::TwoShot);
        assert_eq!(
            us,
            predict(&model, &pair, AllReduceKernel::TwoShot, gib).unwrap()
        );
        let copy_us = model.cost(Hop::Local { device: 0 }).unwrap().time_us(gib);
        let one_shot_us = predict(&model, &pair, AllReduceKernel::OneShot, gib).unwrap();
        assert!(
            one_shot_us + copy_us > us,
            "{one_shot_us} + {copy_us} against {us}"
        );
        // Small sums stay with the packet kernel, which reduces in place.
        assert_eq!(
            pick_in_place(&model, &pair, 4096).unwrap().0,
            AllReduceKernel::OneShotPackets
        );
        assert!(pick_in_place(&CostModel::from_topology(&dgx1()), &[0, 5], 4096).is_none());
    }

    #[test]
    fn a_pair_without_p2p_has_no_prediction() {
        let model = CostModel::from_topology(&dgx1());
        // GPUs 0 and 5 of a DGX-1 have no NVLink and no P2P.
        assert!(pick(&model, &[0, 5], 4096).is_none());
        assert!(pick(&model, &[0, 1, 2, 3], 4096).is_some());
    }
}
