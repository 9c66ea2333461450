//! How the ranks of a [`super::GroupAllReduce`] meet to set up: [`RankExchange`]. Processes of a
//! [`Group`] meet over its sockets and share memory by file descriptors; ranks that are threads
//! of one process ([`ThreadRanks`], as an NCCL-API library serving communicators whose ranks one
//! process drives) meet in memory and use each other's buffers as they are.

use crate::backend::{Backend, BufferId, ShareDescriptor, SharedBuffer};
use crate::launch::agree::{agreed, exchange, one_gpu_each};
use crate::launch::{FailureWatch, Group};
use crate::{Error, Result};
use std::os::fd::AsFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// What the ranks of an all-reduce across ranks need of each other, besides the kernels' flags:
/// who they are, their GPUs, their agreement at each step and their buffers. Every rank calls
/// each method at the same step, as a collective.
pub trait RankExchange {
    /// This rank, 0 to the number of ranks − 1.
    fn rank(&self) -> usize;

    /// Each rank's GPU, in rank order, or why the ranks cannot run an all-reduce together (the
    /// same answer on every rank).
    fn gpus(&self, backend: &dyn Backend) -> Result<Vec<usize>>;

    /// `Ok` once every rank's `mine` is `Ok`; where one rank failed, every rank fails (this rank
    /// with its own error, the others naming it).
    fn agree(&self, mine: Result<()>) -> Result<()>;

    /// Every rank's `mine` (buffers of its GPU), in rank order: this rank's own, the others'
    /// reachable from this rank's `gpu`. Every rank passes as many buffers.
    fn share(
        &self,
        backend: &dyn Backend,
        gpu: usize,
        mine: &[BufferId],
    ) -> Result<Vec<Vec<BufferId>>>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;
}

/// `mine`, once every rank has succeeded too ([`RankExchange::agree`]).
pub(super) fn agreed_by<E: RankExchange + ?Sized, T>(ranks: &E, mine: Result<T>) -> Result<T> {
    let (value, outcome) = match mine {
        Ok(value) => (Some(value), Ok(())),
        Err(e) => (None, Err(e)),
    };
    ranks.agree(outcome)?;
    Ok(value.expect("agree returns this rank's own error"))
}

impl RankExchange for Group {
    fn rank(&self) -> usize {
        self.identity().rank
    }

    fn gpus(&self, backend: &dyn Backend) -> Result<Vec<usize>> {
        one_gpu_each(backend, self, "an all-reduce")
    }

    fn agree(&self, mine: Result<()>) -> Result<()> {
        agreed(self, mine)
    }

    fn share(
        &self,
        backend: &dyn Backend,
        gpu: usize,
        mine: &[BufferId],
    ) -> Result<Vec<Vec<BufferId>>> {
        share(backend, self, gpu, mine)
    }

    fn barrier(&self) -> Result<()> {
        Group::barrier(self)
    }
}

/// The processes of a [`Group`] on GPUs agreed another way than by `LOCAL_RANK`: an NCCL
/// communicator's, whose ranks each name their CUDA device (an NCCL-API library serving a job
/// of one process per GPU, as torchrun starts them).
pub struct ProcessRanks {
    group: Group,
    gpus: Vec<usize>,
}

impl ProcessRanks {
    /// `group`'s ranks on `gpus` (rank `r` on `gpus[r]`, one per rank, the same list on every
    /// rank); a usage error where the lengths differ.
    pub fn new(group: Group, gpus: Vec<usize>) -> Result<ProcessRanks> {
        if gpus.len() != group.members().len() {
            return Err(Error::usage(format!(
                "{} GPUs named for a group of {} processes: name one per rank",
                gpus.len(),
                group.members().len()
            )));
        }
        Ok(ProcessRanks { group, gpus })
    }

    /// What judges the group's ranks: a failure once one died or fell silent.
    pub fn watch(&self) -> FailureWatch {
        self.group.watch()
    }
}

impl RankExchange for ProcessRanks {
    fn rank(&self) -> usize {
        self.group.identity().rank
    }

    fn gpus(&self, _: &dyn Backend) -> Result<Vec<usize>> {
        Ok(self.gpus.clone())
    }

    fn agree(&self, mine: Result<()>) -> Result<()> {
        self.group.agree(mine)
    }

    fn share(
        &self,
        backend: &dyn Backend,
        gpu: usize,
        mine: &[BufferId],
    ) -> Result<Vec<Vec<BufferId>>> {
        self.group.share(backend, gpu, mine)
    }

    fn barrier(&self) -> Result<()> {
        Group::barrier(&self.group)
    }
}

/// Shares `mine` (this rank's buffers, memory of `gpu`) with every rank of `group`: returns each
/// rank's, in rank order, this rank's own and the others' imported for `gpu`. Every rank calls it
/// with as many buffers; where one fails, all do.
fn share(
    backend: &dyn Backend,
    group: &Group,
    gpu: usize,
    mine: &[BufferId],
) -> Result<Vec<Vec<BufferId>>> {
    let me = group.identity().rank;
    let exported = mine
        .iter()
        .map(|&b| backend.sharing().export(b))
        .collect::<Result<Vec<SharedBuffer>>>();
    let (descriptors, files) = match exported {
        Ok(shared) => {
            let (descriptors, files): (Vec<ShareDescriptor>, Vec<_>) =
                shared.into_iter().map(|s| (s.descriptor, s.fd)).unzip();
            (Ok(descriptors), files)
        }
        Err(e) => (Err(e), Vec::new()),
    };
    let every: Vec<Vec<ShareDescriptor>> = exchange(group, descriptors)?;
    let mut imported: Vec<Vec<BufferId>> = Vec::with_capacity(every.len());
    let mut failed = Ok(());
    for (owner, theirs) in every.into_iter().enumerate() {
        if owner == me {
            let fds: Vec<_> = files.iter().flatten().map(|f| f.as_fd()).collect();
            if !fds.is_empty() {
                for peer in (0..group.members().len()).filter(|&p| p != me) {
                    group.send_fds(peer, &fds)?;
                }
            }
            imported.push(mine.to_vec());
            continue;
        }
        let count = theirs.iter().filter(|d| d.has_fd).count();
        let mut fds = if count > 0 {
            group.recv_fds(owner, count)?.into_iter()
        } else {
            Vec::new().into_iter()
        };
        let mut buffers = Vec::with_capacity(theirs.len());
        for descriptor in theirs {
            let fd = if descriptor.has_fd { fds.next() } else { None };
            if failed.is_ok() {
                match backend
                    .sharing()
                    .import(SharedBuffer { descriptor, fd }, gpu)
                {
                    Ok(buffer) => buffers.push(buffer),
                    Err(e) => failed = Err(e),
                }
            }
        }
        imported.push(buffers);
    }
    if let Err(e) = agreed(group, failed) {
        for (_, buffers) in imported.iter().enumerate().filter(|&(o, _)| o != me) {
            for &b in buffers {
                let _ = backend.free(b);
            }
        }
        return Err(e);
    }
    Ok(imported)
}

/// A reference to ranks, or a box of them (`GroupAllReduce<Box<dyn RankExchange + Send>>`, as a
/// library holding communicators of thread ranks and of process ranks keeps them), is the ranks.
impl<P> RankExchange for P
where
    P: std::ops::Deref,
    P::Target: RankExchange,
{
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn gpus(&self, backend: &dyn Backend) -> Result<Vec<usize>> {
        (**self).gpus(backend)
    }
    fn agree(&self, mine: Result<()>) -> Result<()> {
        (**self).agree(mine)
    }
    fn share(
        &self,
        backend: &dyn Backend,
        gpu: usize,
        mine: &[BufferId],
    ) -> Result<Vec<Vec<BufferId>>> {
        (**self).share(backend, gpu, mine)
    }
    fn barrier(&self) -> Result<()> {
        (**self).barrier()
    }
}

/// How long a thread rank waits for the others at one step before it fails (a rank that never
/// comes: a caller that broke the collective order).
const THREAD_MEETING_TIMEOUT: Duration = Duration::from_secs(60);

/// What a rank left for the others at one step: its outcome, or its buffers (unified address,
/// bytes) for the peers to borrow.
#[derive(Clone, Debug)]
enum Left {
    Outcome(std::result::Result<(), String>),
    Buffers(Vec<(u64, usize)>),
    Arrived,
}

/// One step at a time: what the ranks left so far, how many have, and the last step's parts
/// (kept until every rank of that step has read them: none can finish the next step before).
#[derive(Debug)]
struct Board {
    step: u64,
    parts: Vec<Option<Left>>,
    arrived: usize,
    last: Vec<Left>,
}

/// Where the thread ranks of one all-reduce meet, shared by all of them ([`ThreadRanks::new`]).
#[derive(Debug)]
pub struct ThreadMeeting {
    board: Mutex<Board>,
    changed: Condvar,
    gpus: Vec<usize>,
}

impl ThreadMeeting {
    /// A meeting for ranks on `gpus` (rank `i` on `gpus[i]`).
    pub fn new(gpus: &[usize]) -> Arc<ThreadMeeting> {
        Arc::new(ThreadMeeting {
            board: Mutex::new(Board {
                step: 0,
                parts: vec![None; gpus.len()],
                arrived: 0,
                last: Vec::new(),
            }),
            changed: Condvar::new(),
            gpus: gpus.to_vec(),
        })
    }
}

/// A rank of an all-reduce whose ranks are threads of this process, one GPU each: they meet in
/// memory ([`ThreadMeeting`]) and borrow each other's buffers by their unified addresses (peer
/// access enabled), so each rank frees only handles of its own.
#[derive(Debug)]
pub struct ThreadRanks {
    meeting: Arc<ThreadMeeting>,
    rank: usize,
}

impl ThreadRanks {
    /// Rank `rank` of the ranks meeting at `meeting`.
    pub fn new(meeting: Arc<ThreadMeeting>, rank: usize) -> ThreadRanks {
        ThreadRanks { meeting, rank }
    }

    /// Leaves `mine` for this step, waits for every rank's, and returns them in rank order.
    fn meet(&self, mine: Left) -> Result<Vec<Left>> {
        let poisoned = || Error::Group("a thread rank panicked while meeting".into());
        let mut board = self.meeting.board.lock().map_err(|_| poisoned())?;
        let step = board.step;
        board.parts[self.rank] = Some(mine);
        board.arrived += 1;
        if board.arrived == board.parts.len() {
            board.last = board
                .parts
                .iter_mut()
                .map(|p| p.take().unwrap_or(Left::Arrived))
                .collect();
            board.arrived = 0;
            board.step += 1;
            self.meeting.changed.notify_all();
            return Ok(board.last.clone());
        }
        let (board, waited) = self
            .meeting
            .changed
            .wait_timeout_while(board, THREAD_MEETING_TIMEOUT, |b| b.step == step)
            .map_err(|_| poisoned())?;
        if waited.timed_out() {
            return Err(Error::Group(format!(
                "rank {} waited {} s for the other ranks at a set-up step: every rank must make \
                 the same calls in the same order",
                self.rank,
                THREAD_MEETING_TIMEOUT.as_secs()
            )));
        }
        Ok(board.last.clone())
    }
}

impl RankExchange for ThreadRanks {
    fn rank(&self) -> usize {
        self.rank
    }

    fn gpus(&self, backend: &dyn Backend) -> Result<Vec<usize>> {
        let gpus = &self.meeting.gpus;
        let count = backend.topology().devices.len();
        if let Some(gpu) = gpus.iter().find(|&&g| g >= count) {
            return Err(Error::usage(format!(
                "a rank is on GPU {gpu} but this process sees {count} GPU(s)"
            )));
        }
        if gpus.is_empty() {
            return Err(Error::usage(
                "an all-reduce across ranks needs at least one rank",
            ));
        }
        for (i, gpu) in gpus.iter().enumerate() {
            if gpus[..i].contains(gpu) {
                return Err(Error::usage(format!(
                    "two ranks are on GPU {gpu}: peerlink's all-reduce takes one rank per GPU"
                )));
            }
        }
        Ok(gpus.clone())
    }

    fn agree(&self, mine: Result<()>) -> Result<()> {
        let left = Left::Outcome(mine.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        let parts = self.meet(left)?;
        mine?;
        for (rank, part) in parts.into_iter().enumerate() {
            if let Left::Outcome(Err(why)) = part {
                return Err(Error::Group(format!(
                    "rank {rank} failed, so this rank stops too: {why}"
                )));
            }
        }
        Ok(())
    }

    fn share(
        &self,
        backend: &dyn Backend,
        gpu: usize,
        mine: &[BufferId],
    ) -> Result<Vec<Vec<BufferId>>> {
        let gpus = &self.meeting.gpus;
        let described = gpus
            .iter()
            .try_for_each(|&peer| backend.enable_peer_access(gpu, peer))
            .and_then(|()| {
                mine.iter()
                    .map(|&b| Ok((backend.sharing().device_address(b)?, backend.len(b)?)))
                    .collect::<Result<Vec<_>>>()
            });
        let described = agreed_by(self, described)?;
        let parts = self.meet(Left::Buffers(described))?;
        let mut every = Vec::with_capacity(parts.len());
        let mut failed = Ok(());
        for (owner, part) in parts.into_iter().enumerate() {
            if owner == self.rank {
                every.push(mine.to_vec());
                continue;
            }
            let Left::Buffers(theirs) = part else {
                every.push(Vec::new());
                continue;
            };
            let mut borrowed = Vec::with_capacity(theirs.len());
            for (address, len) in theirs {
                match backend.borrow_memory(gpus[owner], address, len) {
                    Ok(buffer) if failed.is_ok() => borrowed.push(buffer),
                    Ok(buffer) => {
                        let _ = backend.free(buffer);
                    }
                    Err(e) => failed = failed.and(Err(e)),
                }
            }
            every.push(borrowed);
        }
        if let Err(e) = agreed_by(self, failed) {
            for (_, buffers) in every.iter().enumerate().filter(|&(o, _)| o != self.rank) {
                for &b in buffers {
                    let _ = backend.free(b);
                }
            }
            return Err(e);
        }
        Ok(every)
    }

    fn barrier(&self) -> Result<()> {
        self.meet(Left::Arrived).map(|_| ())
    }
}
