//! `workload` across processes: one process per GPU, as real jobs run (`peerlink launch -n N --
//! workload send-recv`, torchrun, Slurm, mpirun on one host).
//!
//! Rank `r` owns GPU `LOCAL_RANK` and the buffers there: the sources of the messages it sends and
//! the destinations of those it receives. Each receiver exports its destinations
//! ([`Fabric::export`]: a CUDA IPC handle, or on the simulator a shared file whose descriptor
//! travels over the group's Unix socket); each sender imports them for its own GPU (for the
//! destination's GPU where the two have no P2P, so that the engine stages through host memory) and
//! pushes into them with the engine. NCCL runs beside it through a communicator across processes:
//! rank 0 makes the unique id, [`Group::broadcast`] hands it to every rank, each joins with its one
//! GPU and issues its own sends and receives.
//!
//! Timed as in one process (primed, warm-up, back-to-back operations on the rank's held stream,
//! GPU events), each rank on its own GPU; the ranks meet at a barrier at the end of each phase's
//! queuing, so that their gates open together to within a control-message round trip. The time per
//! operation is the slowest rank's window; rank 0 gathers them and reports. After timing, each
//! owner poisons its destinations, the senders run once more, and each owner checks every byte in
//! its own memory. A rank that fails says why to the others through the group (see
//! [`crate::launch::agree`]).

use super::all_reduce;
use super::kinds::{Contender, IssueMode, ProcessLayout, Variant, Workload};
use super::resources::{length, Communicator};
use super::rows::{compare, row, Measured, Report, Row};
use super::send_recv::{flows, EngineFlows, Flow};
use super::settings::{Counts, Options, Settings};
use super::timing::{measure, Operation};
use crate::backend::collective::{
    AllReduceKernel, BufferRange, CommRank, DataType, PeerOp, Rank as CollectiveRank, Reduction,
    UniqueId,
};
use crate::backend::{Backend, BufferId, Owned, SharedBuffer, StreamId};
use crate::bench::layout::{sharing_words, Ranks};
use crate::bench::progress::Progress;
use crate::engine::all_reduce::price::{pick, Placement};
use crate::engine::all_reduce::GroupAllReduce;
use crate::engine::{Buffer, Fabric};
use crate::launch::agree::{agreed, exchange};
use crate::launch::Group;
use crate::pattern;
use crate::units::format_bytes;
use crate::{Error, Result};
use std::sync::Arc;

/// The workloads that run across processes.
pub const CROSS_PROCESS_WORKLOADS: [Workload; 2] = [Workload::AllReduce, Workload::SendRecv];

/// Runs `workload` as this rank of `group`; rank 0 returns the report, the others `None`.
pub fn run(
    backend: &Arc<dyn Backend>,
    group: &Group,
    workload: Workload,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Option<Report>> {
    if !CROSS_PROCESS_WORKLOADS.contains(&workload) {
        return Err(Error::usage(format!(
            "workload {workload} runs in one process; across processes: {} (run {workload} \
             without launch)",
            CROSS_PROCESS_WORKLOADS.map(Workload::name).join(", ")
        )));
    }
    let alone = "run the workload in one process";
    let given = options.devices.is_some();
    let ranks = Ranks::join(backend.as_ref(), group, "workload", given, alone)?;
    let gpus = ranks.gpus.clone();
    let per_rank = Options {
        devices: Some(gpus.clone()),
        ..options.clone()
    };
    let mut settings = Settings::resolve(backend.as_ref(), workload, &per_rank)?;
    let variants = options
        .directions
        .as_deref()
        .unwrap_or(&[Variant::OneWay, Variant::BothWays]);
    check_memory(backend.as_ref(), &ranks, workload, &settings, variants)?;
    let fabric = Fabric::builder(backend.clone()).devices(&gpus).open()?;
    let backend = backend.as_ref();
    let stream = Owned::new(backend, backend.create_stream(ranks.gpu())?);
    let comm = join_nccl(backend, group, ranks.gpu(), &mut settings.notices)?;
    if workload == Workload::AllReduce && comm.is_some() {
        settings
            .notices
            .push(all_reduce::windows_left_out(ACROSS_WINDOWS_LEFT_OUT));
    }
    if settings.issue.contains(&IssueMode::Graphs) {
        let notice = if workload == Workload::AllReduce {
            ACROSS_GRAPHS_NOTICE
        } else {
            super::send_recv::GRAPHS_NOTICE
        };
        settings.notices.push(notice.into());
    }
    let rank = Rank {
        backend,
        fabric: &fabric,
        ranks: &ranks,
        stream: *stream,
        comm: comm.as_ref(),
        settings: &settings,
    };
    let progress = ranks.progress(progress);
    let rows = if workload == Workload::AllReduce {
        rank.all_reduce_sweep(options.dtype.unwrap_or(DataType::F32), &progress)?
    } else {
        rank.send_recv_sweep(variants, &progress)?
    };
    let Some(mut rows) = ranks.on_rank_zero(|| rows) else {
        return Ok(None);
    };
    compare(&mut rows);
    let note = across_note(backend, workload, &ranks, comm.is_some());
    settings.notices.push(note);
    Ok(Some(Report {
        source: backend.source().clone(),
        workload,
        devices: gpus,
        process_layout: ProcessLayout::RankPerProcess,
        warmup: settings.warmup,
        timing: if workload == Workload::AllReduce {
            ACROSS_ALL_REDUCE_TIMING
        } else {
            super::timing::TIMING
        },
        rows,
        notices: settings.notices,
    }))
}

/// Refuses, before anything is allocated and on every rank alike, a sweep whose largest size does
/// not fit: each rank checks its own GPU and the host's memory for the whole group (the ranks'
/// host copies share one host, and on the simulator so do all their GPUs' memory), then every
/// rank returns the lowest rank's refusal, a usage error (exit 2) saying what is needed and free.
fn check_memory(
    backend: &dyn Backend,
    ranks: &Ranks,
    workload: Workload,
    settings: &Settings,
    variants: &[Variant],
) -> Result<()> {
    let world = ranks.gpus.len();
    let largest = settings.largest();
    // Rank r's buffers on its GPU: all-reduce's symmetric buffer; send-recv's sources and
    // destinations of the variant with the most there.
    let buffers = |rank: usize| {
        let ends = variants
            .iter()
            .map(|&v| super::send_recv::ends_on(v, world, rank));
        let count = match workload {
            Workload::AllReduce => 1,
            _ => ends.max().unwrap_or(0),
        };
        largest.saturating_mul(count)
    };
    // Per rank on the host: all-reduce's input, expected sum and read-back; send-recv's pattern
    // and read-back.
    let copies = if workload == Workload::AllReduce {
        3
    } else {
        2
    };
    let host = largest.saturating_mul(copies * world as u64);
    // A rank looks at its own GPU only (a look at another's would make a context there); on the
    // simulator it counts every rank's GPU, all of it host memory.
    let held = if backend.topology().is_simulated() {
        super::resources::footprint(&ranks.gpus, buffers, host)
    } else {
        super::resources::footprint(&[ranks.gpu()], |_| buffers(ranks.me()), host)
    };
    let what = format!(
        "workload {workload} at {} across {world} processes",
        format_bytes(largest)
    );
    let refused = match held.check(backend, &what, "choose a smaller --size or --max-size") {
        Ok(()) => Ok(None),
        Err(Error::Usage(why)) => Ok(Some(why)),
        Err(e) => Err(e),
    };
    let every = exchange(ranks.group, refused)?;
    match every.into_iter().flatten().next() {
        Some(why) => Err(Error::Usage(why)),
        None => Ok(()),
    }
}

/// How the all-reduce across processes is timed, in words: no gate holds a rank's stream (the
/// simulator's ranks meet as each queues its part, which a held stream would never let run).
const ACROSS_ALL_REDUCE_TIMING: &str = "on each rank's own GPU: primed operations waited for, \
    warm-up operations, then `iters` operations back to back between two GPU events on its stream \
    (queued as the host goes: the operations meet the other ranks' at every call, so the ranks run \
    in step); time per operation = the slowest rank's window / iters. After timing, each \
    contender ran once more on fresh inputs and every rank checked every element in its own memory";

/// Why NCCL with symmetric windows has no rows across processes (it has in one process).
const ACROSS_WINDOWS_LEFT_OUT: &str = "across processes the workload runs plain NCCL only for now \
     (run it in one process for NCCL with symmetric windows beside it)";

/// Why graphs mode times the all-reduce across processes from the host too.
const ACROSS_GRAPHS_NOTICE: &str = "the all-reduce across processes is issued from the host in \
     every mode: a rank's kernel captured into a graph would meet the other processes' only when \
     replayed";

/// The document's note on how the run spanned processes.
fn across_note(backend: &dyn Backend, workload: Workload, ranks: &Ranks, nccl: bool) -> String {
    let clocks = if backend.topology().is_simulated() {
        "; each process keeps its own virtual clock"
    } else {
        ""
    };
    let sharing = format!("{}{clocks}", sharing_words(backend));
    let how = if workload == Workload::AllReduce {
        format!(
            "the ranks share a flag block and a buffer each once ({sharing}) and each queues its \
             own kernel over every rank's; the buffer reduced is symmetric memory, which every \
             rank's kernel reaches (engine::all_reduce::GroupAllReduce::alloc_symmetric: packets \
             read it directly, two-shot sums in place, one-shot copies its input aside; NCCL \
             reduces the same buffer); every element checked by each rank in its own memory; each \
             rank times its own GPU (events around back-to-back operations, which meet at every \
             call), and the time per operation is the slowest rank's"
        )
    } else {
        format!(
            "each receiver exports its destinations ({sharing}), each sender imports them for its \
             own GPU and pushes into them with the engine; every byte checked by its owner in its \
             own memory; each rank times its own GPU, the ranks' gates open together to within a \
             barrier, and the time per operation is the slowest rank's"
        )
    };
    format!(
        "{}: {how}{}",
        ranks.note(),
        if nccl {
            "; NCCL through one communicator across the processes (ncclCommInitRank, the unique \
             id broadcast from rank 0)"
        } else {
            ""
        }
    )
}

/// This rank's part of an NCCL communicator across the group, made from rank 0's unique id; `None`
/// (with a notice saying why) where rank 0 has no NCCL or could not make an id.
fn join_nccl<'b>(
    backend: &'b dyn Backend,
    group: &Group,
    gpu: usize,
    notices: &mut Vec<String>,
) -> Result<Option<Communicator<'b>>> {
    let me = group.identity();
    let made = (me.rank == 0).then(|| {
        let id = match backend.collectives().nccl() {
            Ok(nccl) => nccl
                .unique_id()
                .map(|id| id.as_bytes().to_vec())
                .map_err(|e| e.to_string()),
            Err(why) => Err(why),
        };
        serde_json::to_vec(&id).expect("an id or a sentence serialises")
    });
    let sent = group.broadcast(0, made.as_deref())?;
    let id: std::result::Result<Vec<u8>, String> = serde_json::from_slice(&sent).map_err(|e| {
        Error::Group(format!(
            "rank 0 sent an NCCL id this rank cannot read ({e}): run one peerlink version on \
             every rank"
        ))
    })?;
    let id = match id {
        Ok(bytes) => UniqueId::from_bytes(&bytes)?,
        Err(why) => {
            notices.push(format!("NCCL's rows are left out: {why}"));
            return Ok(None);
        }
    };
    let joined = backend
        .collectives()
        .nccl()
        .map_err(|why| {
            Error::usage(format!(
                "rank 0 has NCCL but rank {} has none ({why}): give every rank the same NCCL",
                me.rank
            ))
        })
        .and_then(|nccl| {
            let rank = CommRank {
                rank: me.rank,
                world: me.world,
                device: gpu,
            };
            Ok(Communicator {
                nccl,
                id: nccl.join_communicator(&id, rank)?,
            })
        });
    agreed(group, joined).map(Some)
}

/// This rank's fixed choices.
struct Rank<'a> {
    backend: &'a dyn Backend,
    fabric: &'a Fabric,
    ranks: &'a Ranks<'a>,
    /// This rank's held stream, on its GPU.
    stream: StreamId,
    comm: Option<&'a Communicator<'a>>,
    settings: &'a Settings,
}

/// This rank's buffers for one variant's flows.
struct Ends {
    /// Every flow's (sender, receiver) ranks.
    flows: Vec<(usize, usize)>,
    /// The flows this rank sends: its source here and the receiver's destination imported
    /// (`from` 0: this process's one stream).
    sends: Vec<Flow>,
    /// The index in `flows` of each of `sends`.
    sending: Vec<usize>,
    /// The destinations of the flows this rank receives, each with its index in `flows`.
    receives: Vec<(usize, Buffer)>,
}

impl Ends {
    /// Closes this rank's imports, then, once every rank has, frees its exported destinations:
    /// an exporter keeps its memory until every importer has let go of it.
    fn close(self, group: &Group) -> Result<()> {
        drop(self.sends);
        group.barrier()?;
        drop(self.receives);
        Ok(())
    }
}

impl Rank<'_> {
    fn me(&self) -> usize {
        self.ranks.me()
    }

    fn group(&self) -> &Group {
        self.ranks.group
    }

    /// Each rank's GPU, in rank order.
    fn gpus(&self) -> &[usize] {
        &self.ranks.gpus
    }

    /// The all-reduce's rows at every size, in symmetric memory.
    fn all_reduce_sweep(&self, dtype: DataType, progress: &dyn Progress) -> Result<Vec<Row>> {
        let sizes = &self.settings.sizes;
        all_reduce::check_sizes(sizes, dtype)?;
        progress.start("all-reduce", sizes.len() as u64);
        let model = self.fabric.planner().model().clone();
        let mut reduce = GroupAllReduce::join(self.fabric.backend().clone(), self.group(), model)?;
        // The engine's memory for the purpose, as a job keeps its gradients in it: no copies.
        let buffer = reduce.alloc_symmetric(length(self.settings.largest())?)?;
        let mut rows = Vec::new();
        for bytes in sizes.iter().copied() {
            if self.stopping()? {
                break;
            }
            match dropped_on_a_stop(self.all_reduce_size(&mut reduce, buffer, dtype, bytes))? {
                Some(found) => rows.extend(found),
                None => break,
            }
            progress.step();
        }
        progress.finish();
        Ok(rows)
    }

    /// Whether any rank was asked to stop (every rank then stops at this step); a peer already
    /// gone after a stop counts as one.
    fn stopping(&self) -> Result<bool> {
        match self.ranks.stop_requested() {
            Err(Error::Group(_)) if crate::interrupt::requested() => Ok(true),
            other => other,
        }
    }

    /// send-recv's rows for every variant at every size.
    fn send_recv_sweep(&self, variants: &[Variant], progress: &dyn Progress) -> Result<Vec<Row>> {
        let sizes = &self.settings.sizes;
        progress.start("send-recv", (variants.len() * sizes.len()) as u64);
        let mut rows = Vec::new();
        'variants: for &variant in variants {
            if self.stopping()? {
                break;
            }
            let ends = self.open_ends(variant)?;
            for bytes in sizes.iter().copied() {
                if self.stopping()? {
                    break;
                }
                match dropped_on_a_stop(self.size(&ends, variant, bytes))? {
                    Some(found) => rows.extend(found),
                    // The ranks stopped at different steps: no barrier closes the ends (the
                    // backend keeps memory that abandoned work may touch to the process's end).
                    None => break 'variants,
                }
                progress.step();
            }
            ends.close(self.group())?;
        }
        progress.finish();
        Ok(rows)
    }

    /// The all-reduce of `bytes` from the start of `buffer` (this rank's symmetric memory):
    /// peerlink's kernels (each that takes the size, and the cost model's pick) and NCCL's, each
    /// timed on this rank's GPU and checked in its own memory.
    fn all_reduce_size(
        &self,
        reduce: &mut GroupAllReduce<&Group>,
        buffer: BufferId,
        dtype: DataType,
        bytes: u64,
    ) -> Result<Vec<Row>> {
        let (b, me, n) = (self.backend, self.me(), self.gpus().len());
        let len = length(bytes)?;
        let elements = len / dtype.size();
        let range = BufferRange {
            buffer,
            offset: 0,
            len,
        };
        let mut mine = Vec::new();
        all_reduce::encode(
            dtype,
            (0..elements).map(|i| all_reduce::element(me, i)),
            &mut mine,
        );
        let want = all_reduce::expected(dtype, n, elements);
        let counts = self.settings.counts(bytes);
        let stream = self.stream;
        let measured = |contender, algorithm: &str, op: &mut dyn FnMut() -> Result<()>| {
            let time_us = self.time_in_step(counts, op)?;
            b.write(buffer, 0, &mine)?;
            op()?;
            b.synchronize(stream)?;
            let mut found = vec![0; len];
            b.read(buffer, 0, &mut found)?;
            let what = format!("all-reduce {algorithm} {dtype} {}", format_bytes(bytes));
            let gpu = self.gpus()[me];
            agreed(
                self.group(),
                Error::check_bytes(&what, gpu, gpu, &want, &found),
            )?;
            let m = Measured::on_stream(bytes, contender, algorithm, counts.iters, time_us);
            Ok::<_, Error>(row(
                Workload::AllReduce,
                n,
                self.settings.simulated,
                Some(dtype),
                m,
            ))
        };
        let mut rows = Vec::new();
        for kernel in AllReduceKernel::ALL
            .into_iter()
            .filter(|k| len <= k.max_len())
        {
            let mut op = || reduce.all_reduce_by(kernel, range, stream, dtype, Reduction::Sum);
            rows.push(measured(Contender::Peerlink, kernel.name(), &mut op)?);
        }
        let model = self.fabric.planner().model();
        let picked = pick(model, self.gpus(), bytes, Placement::Symmetric);
        rows.extend(all_reduce::pick_row(&rows, picked));
        if let Some(comm) = self.comm {
            let rank = [CollectiveRank {
                stream,
                input: buffer,
                output: buffer,
            }];
            let mut op = || comm.nccl.all_reduce(comm.id, dtype, &rank, len);
            rows.push(measured(Contender::Nccl, "ncclAllReduce", &mut op)?);
        }
        Ok(rows)
    }

    /// GPU µs per operation of `op` on this rank's stream, the slowest rank's: primed (waited
    /// for), warmed up, then `counts.iters` back to back between two events. No gate holds the
    /// stream: the operations meet the other ranks' at every call, so the ranks run in step.
    fn time_in_step(&self, counts: Counts, op: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let b = self.backend;
        (0..counts.prime.max(1)).try_for_each(|_| op())?;
        b.synchronize(self.stream)?;
        (0..counts.warmup).try_for_each(|_| op())?;
        let start = Owned::new(b, b.record(self.stream)?);
        (0..counts.iters).try_for_each(|_| op())?;
        let end = Owned::new(b, b.record(self.stream)?);
        b.synchronize(self.stream)?;
        let us = b.elapsed_us(*start, *end)? / f64::from(counts.iters);
        let every = exchange(self.group(), Ok(us))?;
        Ok(every.into_iter().fold(0.0, f64::max))
    }

    /// Allocates this rank's sources and destinations for `variant` (the sweep's largest size),
    /// exports the destinations and imports the other ranks' for the flows this rank sends.
    fn open_ends(&self, variant: Variant) -> Result<Ends> {
        let me = self.me();
        let largest = length(self.settings.largest())?;
        let flows = flows(variant, self.gpus().len());
        let mut receives = Vec::new();
        let exports = (|| {
            let mut exports = Vec::new();
            for (i, _) in flows.iter().enumerate().filter(|(_, f)| f.1 == me) {
                let buffer = self.fabric.alloc(self.gpus()[me], largest)?;
                exports.push((i, self.fabric.export(&buffer)?));
                receives.push((i, buffer));
            }
            Ok(exports)
        })();
        // Each receiver exports its destination; the sender imports it.
        let routes: Vec<(usize, usize)> = flows.iter().map(|&(from, to)| (to, from)).collect();
        let given = self.ranks.hand_over(&routes, exports)?;
        let imported = given
            .into_iter()
            .map(|(i, shared)| Ok((self.send_end(shared, self.gpus()[flows[i].1], largest)?, i)))
            .collect::<Result<Vec<_>>>();
        let (sends, sending) = agreed(self.group(), imported)?.into_iter().unzip();
        Ok(Ends {
            flows,
            sends,
            sending,
            receives,
        })
    }

    /// A flow this rank sends: a source on its GPU, the receiver's destination imported for the
    /// GPU whose work reaches it.
    fn send_end(&self, shared: SharedBuffer, to_gpu: usize, largest: usize) -> Result<Flow> {
        let gpu = self.gpus()[self.me()];
        let p2p = self
            .backend
            .topology()
            .pair(gpu, to_gpu)
            .is_some_and(|p| p.p2p);
        // Without P2P only the destination's own GPU reaches it, through host memory.
        let reaching = if p2p { gpu } else { to_gpu };
        Ok(Flow {
            from: 0,
            to: 0,
            src: self.fabric.alloc(gpu, largest)?,
            dst: self.fabric.import(shared, reaching)?,
        })
    }

    /// Every contender at `bytes`, every byte checked by its receiver: the rows on rank 0, none
    /// on the others.
    fn size(&self, ends: &Ends, variant: Variant, bytes: u64) -> Result<Vec<Row>> {
        let len = length(bytes)?;
        let data = |i: usize| pattern::bytes(pattern::seed(&[bytes, i as u64]), len);
        let written = ends
            .sends
            .iter()
            .zip(&ends.sending)
            .try_for_each(|(flow, &i)| flow.src.write(0, &data(i)));
        agreed(self.group(), written)?;
        let poison = || {
            let mine = ends.receives.iter().try_for_each(|(i, dst)| {
                dst.write(0, &data(*i).iter().map(|b| !b).collect::<Vec<u8>>())
            });
            agreed(self.group(), mine)
        };
        let check = |what: &str| {
            // Every sender has waited for its last operation once every rank is here.
            self.group().barrier()?;
            let mut found = vec![0; len];
            let mine = ends.receives.iter().try_for_each(|(i, dst)| {
                dst.read(0, &mut found)?;
                let (from, _) = ends.flows[*i];
                Error::check_bytes(
                    format!("send-recv {variant} {what} (checked by the receiver)"),
                    self.gpus()[from],
                    dst.device(),
                    &data(*i),
                    &found,
                )
            });
            agreed(self.group(), mine)
        };
        let counts = self.settings.counts(bytes);
        let streams = [self.stream];
        let mut rows = Vec::new();
        let mut add = |contender, algorithm, issue, windows: Vec<f64>| {
            let m = Measured {
                variant: Some(variant),
                bytes,
                contender,
                algorithm,
                issue,
                iters: counts.iters,
                time_us: windows.into_iter().fold(0.0, f64::max),
            };
            let (world, simulated) = (self.gpus().len(), self.settings.simulated);
            rows.push(row(Workload::SendRecv, world, simulated, None, m));
        };

        let mut engine = EngineFlows::new(self.backend, self.fabric, &ends.sends, &streams, len);
        let mut together = Together {
            op: &mut engine,
            group: self.group(),
        };
        let us = measure(
            self.backend,
            &streams,
            IssueMode::Stream,
            counts,
            &mut together,
            poison,
            || check("engine"),
        )?;
        let found = exchange(self.group(), Ok((us, engine.strategies())))?;
        let mut names: Vec<String> = Vec::new();
        for name in found.iter().flat_map(|(_, names)| names) {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        let windows = found.into_iter().map(|(us, _)| us).collect();
        let algorithm = format!("engine {}", names.join("/"));
        add(Contender::Peerlink, algorithm, IssueMode::Stream, windows);

        if let Some(comm) = self.comm {
            let mut op = NcclRank {
                comm,
                stream: self.stream,
                ops: self.nccl_ops(ends, len),
            };
            let mut together = Together {
                op: &mut op,
                group: self.group(),
            };
            for &issue in &self.settings.issue {
                let algorithm = "ncclSend/ncclRecv".to_string();
                let us = measure(
                    self.backend,
                    &streams,
                    issue,
                    counts,
                    &mut together,
                    poison,
                    || check(&algorithm),
                )?;
                add(
                    Contender::Nccl,
                    algorithm,
                    issue,
                    exchange(self.group(), Ok(us))?,
                );
            }
        }
        Ok(if self.me() == 0 { rows } else { Vec::new() })
    }

    /// This rank's sends and receives of every flow, in flow order (the order its peers issue
    /// theirs in).
    fn nccl_ops(&self, ends: &Ends, len: usize) -> Vec<PeerOp> {
        let me = self.me();
        let range = |buffer: &Buffer| BufferRange {
            buffer: buffer.backend_id(),
            offset: 0,
            len,
        };
        let mut ops = Vec::new();
        for (i, &(from, to)) in ends.flows.iter().enumerate() {
            if from == me {
                let at = ends
                    .sending
                    .iter()
                    .position(|&k| k == i)
                    .expect("sent here");
                ops.push(PeerOp::Send {
                    to,
                    src: range(&ends.sends[at].src),
                });
            }
            if to == me {
                let (_, dst) = ends
                    .receives
                    .iter()
                    .find(|(k, _)| *k == i)
                    .expect("received here");
                ops.push(PeerOp::Recv {
                    from,
                    dst: range(dst),
                });
            }
        }
        ops
    }
}

/// A size's rows, or `None` where a stop cut it short, as in one process: that size is dropped and
/// the sizes before it are kept. The ranks hear a stop at different moments, so after one a rank
/// may find a peer gone mid-size (the group fails): that ends the sweep here too.
fn dropped_on_a_stop(outcome: Result<Vec<Row>>) -> Result<Option<Vec<Row>>> {
    match outcome {
        Err(Error::Group(_)) if crate::interrupt::requested() => Ok(None),
        other => crate::interrupt::unless_stopped(other),
    }
}

/// An operation whose every rank meets the others at the end of each phase's queuing: held
/// streams are then released together, to within a control-message round trip.
struct Together<'a> {
    op: &'a mut dyn Operation,
    group: &'a Group,
}

impl Operation for Together<'_> {
    fn queue(&mut self, step: u64) -> Result<()> {
        self.op.queue(step)
    }

    fn join(&mut self) -> Result<()> {
        self.op.join()?;
        self.group.barrier()
    }
}

/// This rank's side of every flow through NCCL: its sends and its receives, in flow order.
struct NcclRank<'a> {
    comm: &'a Communicator<'a>,
    stream: StreamId,
    ops: Vec<PeerOp>,
}

impl Operation for NcclRank<'_> {
    fn queue(&mut self, _step: u64) -> Result<()> {
        self.comm
            .nccl
            .rank_send_recv(self.comm.id, self.stream, &self.ops)
    }
}
