//! peerlink's state of one communicator it may serve, kept beside NCCL's own (keyed by the
//! `ncclComm_t`'s address): its rank, size and GPU as NCCL answers them, what its set-up decided,
//! the all-reduce its lone calls go through, and the caller's streams and buffers borrowed so far.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use peerlink::backend::collective::BufferRange;
use peerlink::backend::{Backend, BufferId, StreamId};
use peerlink::engine::all_reduce::{GroupAllReduce, LocalAllReduce, RankExchange, ThreadMeeting};
use peerlink::model::CostModel;

use super::lifeline::Lifeline;

/// Borrowed streams or buffers kept per communicator before they start over: a job that
/// all-reduces ever new buffers would grow the table without end.
const BORROWS_KEPT: usize = 64;

/// The ranks of one communicator that are threads of this process: their GPUs, where they
/// meet, and the all-reduce one thread driving all of them goes through (a group holding one
/// all-reduce per rank).
pub struct Clique {
    pub gpus: Vec<usize>,
    pub meeting: Arc<ThreadMeeting>,
    pub local: Mutex<LocalAllReduce>,
    /// One release word for every rank: an abort of any rank's communicator ends every rank's
    /// wait.
    pub lifeline: Arc<Lifeline>,
}

/// Who a served communicator's rank sums with.
#[derive(Clone)]
pub enum Peers {
    /// Nobody: one rank.
    Alone,
    /// The other ranks of its clique, threads of this process.
    Threads(Arc<Clique>),
    /// Ranks that are each a process of this host, met at the set-up (`Comm::reduce` made then).
    Processes,
}

/// What a communicator's set-up decided.
pub enum State {
    /// Not set up yet: at its first call that peerlink would serve.
    Pending,
    /// Every call forwarded, for the reason given (logged once).
    Forwarded(String),
    /// Served, with these peers.
    Served(Peers),
}

/// The all-reduce a communicator's lone calls go through, with the other ranks: threads of this
/// process (`ThreadRanks`) or processes (`ProcessRanks`).
pub type Reduce = GroupAllReduce<Box<dyn RankExchange + Send>>;

/// Joins the all-reduce of `ranks` with the others (a collective of every rank).
pub fn join_reduce(
    backend: &Arc<dyn Backend>,
    ranks: impl RankExchange + Send + 'static,
    model: &CostModel,
) -> peerlink::Result<Reduce> {
    GroupAllReduce::join(backend.clone(), Box::new(ranks), model.clone())
}

/// Where a call on `len` bytes at `address` (borrowed as `borrowed`) sums: the range of a window
/// `reduce` adopted that holds them all (in place there), else the borrowed buffer.
pub fn sum_range(reduce: &Reduce, address: u64, borrowed: BufferId, len: usize) -> BufferRange {
    reduce.symmetric_range(address, len).unwrap_or(BufferRange {
        buffer: borrowed,
        offset: 0,
        len,
    })
}

pub struct Comm {
    pub address: usize,
    pub rank: usize,
    pub ranks: usize,
    pub gpu: usize,
    /// This process's name for the communicator, told the other ranks at set-up.
    pub token: u64,
    pub state: State,
    /// The lone calls' all-reduce with the other ranks: with threads, joined at the first
    /// one; with processes, at the set-up.
    pub reduce: Option<Reduce>,
    /// What its kernels wait on, where it is served with other ranks (dropped after `reduce`).
    pub lifeline: Option<Arc<Lifeline>>,
    /// The symmetric windows `reduce` adopted: each `ncclWindow_t` and its memory's handle.
    pub windows: HashMap<usize, BufferId>,
    /// Its name on this host once set up: its rank 0's process and name for it, the same on
    /// every rank. Collective steps of several communicators at once take them in this order
    /// in every process, so that no two processes wait for each other crosswise.
    pub meeting_order: Option<(u64, u64)>,
    backend: Option<Arc<dyn Backend>>,
    streams: HashMap<u64, StreamId>,
    /// The stream handle of the last call: its all-reduce orders the next call after it, so it
    /// outlives a new start of the table.
    last_stream: Option<u64>,
    buffers: HashMap<(u64, usize), BufferId>,
}

impl Comm {
    pub fn new(address: usize, (rank, ranks, gpu): (usize, usize, usize), token: u64) -> Comm {
        Comm {
            address,
            rank,
            ranks,
            gpu,
            token,
            state: State::Pending,
            reduce: None,
            lifeline: None,
            windows: HashMap::new(),
            meeting_order: None,
            backend: None,
            streams: HashMap::new(),
            last_stream: None,
            buffers: HashMap::new(),
        }
    }

    /// Why its calls can no longer be served, where they cannot: it was aborted, or a peer is
    /// lost (the release word is raised then).
    pub fn lost(&self) -> Option<String> {
        let lifeline = self.lifeline.as_ref()?;
        lifeline
            .lost_peer()
            .or_else(|| lifeline.is_released().then(|| "it was aborted".to_string()))
    }

    /// Who this rank reduces with, where it is served; `None` to forward.
    pub fn served_peers(&self) -> Option<Peers> {
        match &self.state {
            State::Served(peers) => Some(peers.clone()),
            State::Pending | State::Forwarded(_) => None,
        }
    }

    /// The caller's stream `handle` of this rank's GPU, borrowed once; where the table starts
    /// over, the stream of the call before is kept.
    pub fn stream(
        &mut self,
        backend: &Arc<dyn Backend>,
        handle: u64,
    ) -> peerlink::Result<StreamId> {
        self.backend.get_or_insert_with(|| backend.clone());
        let last = self.last_stream.replace(handle);
        if let Some(&stream) = self.streams.get(&handle) {
            return Ok(stream);
        }
        if self.streams.len() >= BORROWS_KEPT {
            let kept = last.and_then(|h| self.streams.remove_entry(&h));
            for (_, stream) in self.streams.drain() {
                let _ = backend.destroy_stream(stream);
            }
            self.streams.extend(kept);
        }
        let stream = backend.borrow_stream(self.gpu, handle)?;
        self.streams.insert(handle, stream);
        Ok(stream)
    }

    /// The caller's `len` bytes at `send` and at `recv` of this rank's GPU, each borrowed once
    /// (the same address and length give the same buffer: a sum in place names one). The table
    /// starts over before either is borrowed, never between: a call's two buffers stay live.
    pub fn buffers(
        &mut self,
        backend: &Arc<dyn Backend>,
        send: u64,
        recv: u64,
        len: usize,
    ) -> peerlink::Result<(BufferId, BufferId)> {
        self.backend.get_or_insert_with(|| backend.clone());
        if self.buffers.len() + 2 > BORROWS_KEPT {
            // Forgetting a borrowed buffer leaves the work queued on it to run.
            for (_, buffer) in self.buffers.drain() {
                let _ = backend.free(buffer);
            }
        }
        let mut borrow = |address: u64| -> peerlink::Result<BufferId> {
            if let Some(&buffer) = self.buffers.get(&(address, len)) {
                return Ok(buffer);
            }
            let buffer = backend.borrow_memory(self.gpu, address, len)?;
            self.buffers.insert((address, len), buffer);
            Ok(buffer)
        };
        Ok((borrow(send)?, borrow(recv)?))
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // An aborted communicator's ranks leave without meeting each other.
        if self.lifeline.as_ref().is_some_and(|l| l.is_released()) {
            if let Some(reduce) = &mut self.reduce {
                reduce.abandon();
            }
        }
        // The all-reduce first: it waits for its calls on the borrowed streams.
        self.reduce = None;
        if let Some(backend) = self.backend.take() {
            for (_, buffer) in self.buffers.drain() {
                let _ = backend.free(buffer);
            }
            for (_, stream) in self.streams.drain() {
                let _ = backend.destroy_stream(stream);
            }
        }
    }
}
