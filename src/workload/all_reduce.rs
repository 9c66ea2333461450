//! The all-reduce (sum): peerlink's one-shot, two-shot and one-shot-packets kernels, and the kernel
//! its cost model picks at each size, against `ncclAllReduce` twice: plain NCCL on ordinary
//! buffers, and NCCL with symmetric windows — every rank's input and output from `ncclMemAlloc`,
//! registered once as two windows of the communicator (`ncclCommWindowRegister(…,
//! NCCL_WIN_COLL_SYMMETRIC)`, as nccl-tests `-R 2` does), where NCCL ≥ 2.27 runs its
//! symmetric-memory kernels. Where the loaded NCCL has no windows, or on the simulator (which has no
//! model of those kernels), one notice says why and that contender's rows are left out.
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

use super::kinds::{Contender, IssueMode, Workload};
use super::resources::{
    buffers_on, check_memory, enable_peers, footprint, ids, length, nccl, streams_on,
    within_one_host, Communicator,
};
use super::rows::{row, Measured, Row};
use super::settings::{Counts, Settings};
use super::timing::{measure, Operation};
use crate::backend::collective::{
    AllReduceKernel, CommId, DataType, Rank, Reduction, WindowId, MAX_RANKS,
};
use crate::backend::{Backend, BufferId, Nccl, Owned, StreamId};
use crate::bench::progress::Progress;
use crate::engine::all_reduce::price::{pick, takes, Placement};
use crate::engine::all_reduce::{LocalAllReduce, LocalRank};
use crate::model::CostModel;
use crate::units::format_bytes;
use crate::{Error, Result};
use std::sync::Arc;

/// Rank `rank`'s element `i`: a small integer, −8 to 8.
pub fn element(rank: usize, i: usize) -> i32 {
    ((i * 5 + rank * 3) % 17) as i32 - 8
}

/// `values` as `dtype` bytes, little-endian (exact in every type for these small integers).
pub fn encode(dtype: DataType, values: impl Iterator<Item = i32>, out: &mut Vec<u8>) {
    out.clear();
    for v in values {
        dtype.push_rounded(v as f32, out);
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

/// peerlink's all-reduce by one kernel, through the engine's.
struct PeerlinkAllReduce<'a> {
    reduce: &'a mut LocalAllReduce,
    kernel: AllReduceKernel,
    dtype: DataType,
    ranks: &'a [LocalRank],
    len: usize,
}

impl Operation for PeerlinkAllReduce<'_> {
    fn queue(&mut self, _step: u64) -> Result<()> {
        self.reduce.all_reduce_by(
            self.kernel,
            self.ranks,
            self.len,
            self.dtype,
            Reduction::Sum,
        )
    }
}

/// `ncclAllReduce` on ordinary buffers, or on buffers of symmetric windows.
struct NcclAllReduce<'a> {
    comm: &'a Communicator<'a>,
    dtype: DataType,
    ranks: &'a [Rank],
    len: usize,
    in_windows: bool,
}

impl Operation for NcclAllReduce<'_> {
    fn queue(&mut self, _step: u64) -> Result<()> {
        let (nccl, id) = (self.comm.nccl, self.comm.id);
        if self.in_windows {
            nccl.window_all_reduce(id, self.dtype, self.ranks, self.len)
        } else {
            nccl.all_reduce(id, self.dtype, self.ranks, self.len)
        }
    }
}

/// The notice for NCCL's rows with symmetric windows left out: `why` says why.
pub(crate) fn windows_left_out(why: &str) -> String {
    format!("{}'s rows are left out: {why}", Contender::NcclSymmetric)
}

/// Whether `nccl` has symmetric windows; where not, the notice saying why (NCCL's own absence
/// has its notice already).
fn symmetric_runs(nccl: Option<&dyn Nccl>, notices: &mut Vec<String>) -> bool {
    match nccl.map(|nccl| nccl.symmetric_windows()) {
        Some(Ok(())) => true,
        Some(Err(why)) => {
            notices.push(windows_left_out(&why));
            false
        }
        None => false,
    }
}

/// Every rank's input and output for NCCL with symmetric windows: `ncclMemAlloc` memory of the
/// sweep's largest size, registered once as two windows of the communicator (the inputs', the
/// outputs'), deregistered when dropped (before the buffers are freed and the communicator is
/// destroyed, which outlives this).
struct WindowBuffers<'b> {
    nccl: &'b dyn Nccl,
    windows: Vec<WindowId>,
    inputs: Vec<Owned<'b, BufferId>>,
    outputs: Vec<Owned<'b, BufferId>>,
}

impl<'b> WindowBuffers<'b> {
    fn open(
        backend: &'b dyn Backend,
        nccl: &'b dyn Nccl,
        comm: CommId,
        devices: &[usize],
        bytes: usize,
    ) -> Result<WindowBuffers<'b>> {
        let alloc = || -> Result<Vec<Owned<'b, BufferId>>> {
            devices
                .iter()
                .map(|&d| Ok(Owned::new(backend, nccl.alloc_window_memory(d, bytes)?)))
                .collect()
        };
        let mut buffers = WindowBuffers {
            nccl,
            windows: Vec::new(),
            inputs: alloc()?,
            outputs: alloc()?,
        };
        for side in [ids(&buffers.inputs), ids(&buffers.outputs)] {
            let window = nccl.register_window(comm, &side)?;
            buffers.windows.push(window);
        }
        Ok(buffers)
    }
}

impl Drop for WindowBuffers<'_> {
    fn drop(&mut self) {
        // Nothing can report a failure from drop; the work queued on the windows has been waited
        // for (every measurement ends synchronized).
        for &window in &self.windows {
            let _ = self.nccl.deregister_window(window);
        }
    }
}

/// Whether peerlink's kernels can run over `devices` (peer access enabled between every two);
/// where not, a notice saying why.
fn peerlink_runs(
    backend: &dyn Backend,
    devices: &[usize],
    notices: &mut Vec<String>,
) -> Result<bool> {
    if let Some(notice) =
        within_one_host(backend.topology(), devices, "peerlink's all-reduce kernels")
    {
        notices.push(notice);
        return Ok(false);
    }
    if devices.len() > MAX_RANKS {
        notices.push(format!(
            "peerlink's all-reduce serves at most {MAX_RANKS} GPUs ({} selected): its rows are \
             left out; choose fewer with --devices",
            devices.len()
        ));
        return Ok(false);
    }
    if let Some(&(a, b)) = enable_peers(backend, devices)?.first() {
        notices.push(format!(
            "no P2P between GPUs {a} and {b}: peerlink's all-reduce needs P2P between every two \
             GPUs, so its rows are left out"
        ));
        return Ok(false);
    }
    Ok(true)
}

/// The pick's row among one issue mode's kernel `rows` at a size: the picked kernel's
/// measurement again, with the cost model's prediction and its regret against the fastest kernel;
/// `None` where the model has no pick.
pub(crate) fn pick_row(rows: &[Row], picked: Option<(AllReduceKernel, f64)>) -> Option<Row> {
    let (kernel, predicted_us) = picked?;
    let fastest = rows.iter().map(|r| r.time_us).fold(f64::INFINITY, f64::min);
    let mut row = rows
        .iter()
        .find(|r| r.algorithm == kernel.name())
        .expect("the pick is among the kernels measured")
        .clone();
    row.contender = Contender::PeerlinkPick;
    row.predicted_us = Some(predicted_us);
    row.regret = Some(row.time_us / fastest - 1.0);
    Some(row)
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

/// Runs the all-reduce sweep: at each size, every rank's input written, then per issue mode
/// peerlink's kernels and the pick's row, and NCCL.
pub fn run(
    backend: &Arc<dyn Backend>,
    settings: &mut Settings,
    dtype: Option<DataType>,
    progress: &dyn Progress,
) -> Result<Vec<Row>> {
    let dtype = dtype.unwrap_or(DataType::F32);
    check_sizes(&settings.sizes, dtype)?;
    let b = backend.as_ref();
    let largest = settings.largest();
    // Inputs and outputs, and as many again in NCCL's windows where they run.
    let with_windows = b
        .collectives()
        .nccl()
        .is_ok_and(|nccl| nccl.symmetric_windows().is_ok());
    let per_gpu = largest.saturating_mul(if with_windows { 4 } else { 2 });
    let held = footprint(&settings.devices, |_| per_gpu, largest.saturating_mul(3));
    check_memory(b, Workload::AllReduce, settings, &held)?;
    let mut ranks = Ranks::open(b, settings, dtype)?;
    let model = CostModel::from_topology(b.topology());
    let mut peerlink = peerlink_runs(b, &settings.devices, &mut settings.notices)?
        .then(|| LocalAllReduce::new(backend.clone(), model.clone(), &settings.devices));
    let nccl = nccl(b, &mut settings.notices);
    let comm = nccl
        .map(|nccl| Communicator::new(nccl, &settings.devices))
        .transpose()?;
    let windows = match (&comm, symmetric_runs(nccl, &mut settings.notices)) {
        (Some(comm), true) => Some(WindowBuffers::open(
            b,
            comm.nccl,
            comm.id,
            &settings.devices,
            length(largest)?,
        )?),
        _ => None,
    };
    ranks.windows = windows.as_ref();
    let mut rows = Vec::new();
    progress.start("all-reduce", settings.sizes.len() as u64);
    for bytes in settings.sizes_to_run() {
        let mut size = || -> Result<Vec<Row>> {
            let at = ranks.fill(settings, bytes)?;
            let mut found = Vec::new();
            for &issue in &settings.issue {
                if let Some(reduce) = &mut peerlink {
                    let kernels = ranks.peerlink_rows(reduce, &at, issue)?;
                    let picked = pick(&model, &settings.devices, bytes, Placement::Beside);
                    let picked = pick_row(&kernels, picked);
                    found.extend(kernels.into_iter().chain(picked));
                }
                if let Some(comm) = &comm {
                    found.push(ranks.nccl_row(comm, &at, issue, false)?);
                    if ranks.windows.is_some() {
                        found.push(ranks.nccl_row(comm, &at, issue, true)?);
                    }
                }
            }
            Ok(found)
        };
        // A stop part-way through a size drops that size, keeping the sizes before it.
        match crate::interrupt::unless_stopped(size())? {
            Some(found) => rows.extend(found),
            None => break,
        }
        progress.step();
    }
    progress.finish();
    Ok(rows)
}

/// Every rank's stream, input and output (the sweep's largest size), NCCL's windows where they
/// run, and what each row of the sweep is measured with.
struct Ranks<'b, 'w> {
    backend: &'b dyn Backend,
    devices: Vec<usize>,
    dtype: DataType,
    simulated: bool,
    streams: Vec<Owned<'b, StreamId>>,
    inputs: Vec<Owned<'b, BufferId>>,
    outputs: Vec<Owned<'b, BufferId>>,
    windows: Option<&'w WindowBuffers<'b>>,
}

/// One size of the sweep: its bytes, the counts of a window, and what every output must hold.
struct AtSize {
    bytes: u64,
    len: usize,
    counts: Counts,
    want: Vec<u8>,
}

impl<'b, 'w> Ranks<'b, 'w> {
    fn open(
        backend: &'b dyn Backend,
        settings: &Settings,
        dtype: DataType,
    ) -> Result<Ranks<'b, 'w>> {
        let devices = settings.devices.clone();
        let largest = length(settings.largest())?;
        Ok(Ranks {
            backend,
            dtype,
            simulated: settings.simulated,
            streams: streams_on(backend, &devices)?,
            inputs: buffers_on(backend, &devices, largest)?,
            outputs: buffers_on(backend, &devices, largest)?,
            windows: None,
            devices,
        })
    }

    /// Writes every rank's input at `bytes` (in NCCL's windows too, where they run).
    fn fill(&self, settings: &Settings, bytes: u64) -> Result<AtSize> {
        let len = length(bytes)?;
        let elements = len / self.dtype.size();
        let mut scratch = Vec::new();
        let windowed = self.windows.map(|w| ids(&w.inputs));
        for (r, input) in self.inputs.iter().enumerate() {
            encode(
                self.dtype,
                (0..elements).map(|i| element(r, i)),
                &mut scratch,
            );
            self.backend.write(**input, 0, &scratch)?;
            if let Some(inputs) = &windowed {
                self.backend.write(inputs[r], 0, &scratch)?;
            }
        }
        Ok(AtSize {
            bytes,
            len,
            counts: settings.counts(bytes),
            want: expected(self.dtype, self.devices.len(), elements),
        })
    }

    /// A row of every peerlink kernel that takes the size, through the engine's all-reduce.
    fn peerlink_rows(
        &self,
        reduce: &mut LocalAllReduce,
        at: &AtSize,
        issue: IssueMode,
    ) -> Result<Vec<Row>> {
        let ranks: Vec<LocalRank> = (0..self.devices.len())
            .map(|r| LocalRank {
                device: self.devices[r],
                stream: *self.streams[r],
                input: *self.inputs[r],
                output: *self.outputs[r],
            })
            .collect();
        AllReduceKernel::ALL
            .into_iter()
            .filter(|&k| takes(k, at.bytes))
            .map(|kernel| {
                let mut op = PeerlinkAllReduce {
                    reduce: &mut *reduce,
                    kernel,
                    dtype: self.dtype,
                    ranks: &ranks,
                    len: at.len,
                };
                self.measured(
                    at,
                    (Contender::Peerlink, kernel.name().into()),
                    issue,
                    &ids(&self.outputs),
                    &mut op,
                )
            })
            .collect()
    }

    /// NCCL's row: plain, or on the buffers of its symmetric windows (`in_windows`, which
    /// [`Ranks::windows`] holds then).
    fn nccl_row(
        &self,
        comm: &Communicator<'_>,
        at: &AtSize,
        issue: IssueMode,
        in_windows: bool,
    ) -> Result<Row> {
        let (inputs, outputs, contender) = match self.windows.filter(|_| in_windows) {
            Some(w) => (ids(&w.inputs), ids(&w.outputs), Contender::NcclSymmetric),
            None => (ids(&self.inputs), ids(&self.outputs), Contender::Nccl),
        };
        let ranks: Vec<Rank> = (0..self.devices.len())
            .map(|r| Rank {
                stream: *self.streams[r],
                input: inputs[r],
                output: outputs[r],
            })
            .collect();
        let mut op = NcclAllReduce {
            comm,
            dtype: self.dtype,
            ranks: &ranks,
            len: at.len,
            in_windows: contender == Contender::NcclSymmetric,
        };
        let named = (contender, "ncclAllReduce".into());
        self.measured(at, named, issue, &outputs, &mut op)
    }

    /// `op` (the contender and its algorithm: `named`) timed, then run once more into poisoned
    /// `outputs`, every byte checked: its row.
    fn measured(
        &self,
        at: &AtSize,
        named: (Contender, String),
        issue: IssueMode,
        outputs: &[BufferId],
        op: &mut dyn Operation,
    ) -> Result<Row> {
        let (b, dtype) = (self.backend, self.dtype);
        let (contender, algorithm) = named;
        let poison = || {
            let nan = vec![0xff; at.len];
            outputs.iter().try_for_each(|&o| b.write(o, 0, &nan))
        };
        let by = match contender {
            Contender::NcclSymmetric => format!("{algorithm} in symmetric windows"),
            _ => algorithm.clone(),
        };
        let what = format!("all-reduce {by} {dtype} {}", format_bytes(at.bytes));
        let check = || check_outputs(b, &what, &self.devices, outputs, &at.want);
        let time_us = measure(b, &ids(&self.streams), issue, at.counts, op, poison, check)?;
        let m = Measured {
            variant: None,
            bytes: at.bytes,
            contender,
            algorithm,
            issue,
            iters: at.counts.iters,
            time_us,
        };
        let n = self.devices.len();
        Ok(row(Workload::AllReduce, n, self.simulated, Some(dtype), m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::bench::progress::Silent;
    use crate::workload::Options;

    #[test]
    fn the_simulator_leaves_nccl_with_symmetric_windows_out_with_one_note() {
        let backend: Arc<dyn Backend> = Arc::new(SimBackend::open("pcie-2gpu-switch").unwrap());
        let options = Options {
            sizes: Some(vec![4, 4096]),
            ..Options::default()
        };
        let mut settings =
            Settings::resolve(backend.as_ref(), Workload::AllReduce, &options).unwrap();
        let rows = run(&backend, &mut settings, None, &Silent).unwrap();
        assert!(rows.iter().any(|r| r.contender == Contender::Nccl));
        assert!(!rows.iter().any(|r| r.contender == Contender::NcclSymmetric));
        let notes: Vec<&String> = settings
            .notices
            .iter()
            .filter(|n| n.contains("symmetric"))
            .collect();
        assert_eq!(
            notes,
            [
                "NCCL (symmetric windows)'s rows are left out: the simulator has no model of \
                 NCCL's symmetric kernels (NCCL ≥ 2.27 with windows from ncclCommWindowRegister, \
                 nccl-tests -R 2): no run of them between two GPUs has been measured to calibrate \
                 one, and the simulator invents no figures"
            ]
        );
    }

    #[test]
    fn symmetric_windows_run_only_where_nccl_has_them_and_a_missing_nccl_says_nothing_more() {
        let backend = SimBackend::open("pcie-2gpu-switch").unwrap();
        let mut notices = Vec::new();
        assert!(!symmetric_runs(None, &mut notices));
        assert!(notices.is_empty(), "{notices:?}");
        let nccl = backend.collectives().nccl().unwrap();
        assert!(!symmetric_runs(Some(nccl), &mut notices));
        assert_eq!(notices.len(), 1);
        // And the backend refuses its memory, saying why.
        let refused = nccl.alloc_window_memory(0, 4096).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("no model of NCCL's symmetric kernels"),
            "{refused}"
        );
    }

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
}
