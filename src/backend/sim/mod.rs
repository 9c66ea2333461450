//! A simulated GPU host: real bytes in host memory, virtual and deterministic time.
//!
//! Buffers are `Vec<u8>`s and copies really copy, so chunking, offset and relay bugs show byte for
//! byte. Time is virtual: a host clock advances by each call's modelled CPU cost; GPU work runs on
//! in-order streams in a discrete-event simulation (module `scheduler`) whose copy rates come from
//! a link model (`links`) with max-min fair sharing (`sharing`); pointer chases walk chains that
//! the caches may hold (`caches`). Figures come from a [`preset`].
//! Collectives meet across their ranks' streams and move their bytes as flows too: peerlink's
//! all-reduce kernels (`collective`) and a model of NCCL built on its tuner's figures (`nccl`);
//! their sums are real (`reduce`). Every figure this backend produces is simulated, and its source
//! says so (`sim:<preset>`).
//!
//! [`Simulator`] does the simulating; the [`Checked`] layer above it checks every argument, so
//! [`SimBackend`] is what callers open.

mod across;
mod caches;
mod collective;
#[cfg(test)]
mod collective_tests;
pub mod faults;
mod ipc;
mod links;
mod managed;
mod memory;
mod nccl;
pub mod preset;
mod reduce;
mod resident;
mod scheduler;
mod sharing;
#[cfg(test)]
mod tests;

pub use preset::{preset_names, Preset};

use super::collective::BufferRange;
use super::{
    Advice, Batch, BufferCopy, Checked, CopyMethod, Location, Memory, RawBackend, RawManaged,
    RawPatterns, RawProbes,
};
use crate::pattern::{self, Mismatch};
use crate::topology::Topology;
use crate::{Error, Result};
use caches::Caches;
use collective::RankPlan;
use links::{Chain, LinkModel, Path, Place};
use managed::{ManagedPages, Move};
use memory::{Key, Store};
use nccl::Comm;
use scheduler::{Collective, Meeting, Scheduler, Venue, Work};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The simulated backend, as callers open it.
pub type SimBackend = Checked<Simulator>;

impl SimBackend {
    /// Opens the simulator on an embedded preset name, or on a preset JSON file when `preset`
    /// names an existing file or ends in `.json`.
    pub fn open(preset: &str) -> Result<Self> {
        Self::open_among(preset, None)
    }

    /// [`SimBackend::open`] for a run over the GPUs `in_use` alone (every GPU where `None`): its
    /// topology lists every GPU, and the pairs among those in use only.
    pub fn open_among(preset: &str, in_use: Option<&[usize]>) -> Result<Self> {
        Ok(Self::from_preset_among(&Preset::load(preset)?, in_use))
    }

    /// Opens the simulator on an already parsed preset.
    pub fn from_preset(preset: &Preset) -> Self {
        Self::from_preset_among(preset, None)
    }

    /// [`SimBackend::from_preset`] for a run over the GPUs `in_use` alone (every GPU where `None`).
    pub fn from_preset_among(preset: &Preset, in_use: Option<&[usize]>) -> Self {
        Checked::new(Simulator::new(preset, in_use))
    }

    /// The preset the simulator runs.
    pub fn preset(&self) -> &Preset {
        self.raw().links.preset()
    }

    /// Bytes of host memory the simulator's buffers hold now: zero once every buffer a run
    /// allocated is freed.
    pub fn held_host_bytes(&self) -> u64 {
        self.raw().lock().store.held()
    }
}

/// A simulated host's work, below the checks.
pub struct Simulator {
    topology: Topology,
    links: LinkModel,
    state: Mutex<State>,
}

/// A simulated stream: the scheduler's stream and the GPU it belongs to.
#[derive(Clone, Copy, Debug)]
pub struct Stream {
    index: usize,
    device: usize,
}

/// A captured graph: the work its replays queue.
#[derive(Clone)]
pub struct Graph(Arc<Vec<Node>>);

/// One node of a captured graph.
enum Node {
    /// Work a replay queues.
    Work(Work),
    /// A rank's part of an all-reduce across processes, which a replay runs as a call does: the
    /// host meets the other ranks' processes ([`across`]).
    Across(Arc<across::AcrossPart>),
}

struct State {
    host_us: f64,
    scheduler: Scheduler,
    store: Store,
    /// The pointer-chase chains the caches hold.
    caches: Caches,
    /// Work recorded instead of run, by the index of each stream that captures a graph.
    captures: BTreeMap<usize, Vec<Node>>,
    /// The last number given to a ping-pong's or a communicator's venue.
    venues: u64,
    /// Pairs whose peer access is enabled: copy engines between other pairs stage through host
    /// memory.
    peer_access: BTreeSet<(usize, usize)>,
    allocated: Vec<u64>,
    /// The scheduler's stream of each borrowed (GPU, CUDA stream handle).
    borrowed_streams: BTreeMap<(usize, u64), usize>,
    /// Where the pages of each managed buffer live, and its advice.
    managed: ManagedPages,
}

impl State {
    /// A number for a new venue.
    fn next_venue(&mut self) -> u64 {
        self.venues += 1;
        self.venues
    }
}

impl Simulator {
    fn new(preset: &Preset, in_use: Option<&[usize]>) -> Self {
        let links = LinkModel::new(preset);
        let topology = preset.topology_among(in_use);
        let state = State {
            host_us: 0.0,
            scheduler: Scheduler::new(links.capacity().to_vec()),
            store: Store::new(),
            caches: Caches::default(),
            captures: BTreeMap::new(),
            venues: 0,
            peer_access: BTreeSet::new(),
            allocated: vec![0; preset.gpu_count()],
            borrowed_streams: BTreeMap::new(),
            managed: ManagedPages::new(preset.managed.page_bytes()),
        };
        Simulator {
            topology,
            links,
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a simulator bug; the state is still the best there is.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn costs(&self) -> &preset::Costs {
        &self.links.preset().costs
    }

    /// Where a kernel or copy on `gpu` finds `buffer`: its memory, or for managed memory the place
    /// of its first page (its own GPU's copy where it has one).
    fn place(st: &State, buffer: Key, gpu: usize) -> Place {
        match st.store.get(buffer).memory {
            Memory::Device(d) => Place::Device(d),
            Memory::PinnedHost { numa_node } => Place::Host(numa_node),
            Memory::Managed(_) => at(st.managed.first_page_for(buffer, gpu)),
        }
    }

    /// Where a copy issued on `gpu` by `method` finds `len` bytes of `buffer` at `offset` (reading
    /// them, or with `write` writing them), and the page moves managed memory needs first: a kernel
    /// faults pages it lacks over to its GPU, unless advice keeps them where they are; a copy
    /// engine reaches them where they live. Other memory moves nothing and lies in one place.
    fn reach(
        &self,
        st: &mut State,
        gpu: usize,
        method: CopyMethod,
        (buffer, offset, len): (Key, usize, usize),
        write: bool,
    ) -> (Vec<Work>, Vec<Place>) {
        if !st.managed.contains(buffer) {
            return (Vec::new(), vec![Self::place(st, buffer, gpu)]);
        }
        let (moves, mut places) = match method {
            CopyMethod::SmKernel => {
                let preset = self.links.preset();
                let reachable = |location| match location {
                    Location::Host => true,
                    Location::Device(d) => d == gpu || preset.p2p(gpu, d),
                };
                let touch = st
                    .managed
                    .kernel_touch(buffer, offset, len, gpu, write, reachable);
                (touch.moves, touch.served_from)
            }
            CopyMethod::CopyEngine => (
                Vec::new(),
                st.managed.served_to_copy_engine(buffer, offset, len, gpu),
            ),
        };
        if places.is_empty() {
            places.push(st.managed.first_page_for(buffer, gpu));
        }
        let fault_us = self.links.preset().managed.fault_us;
        let work = self.migrations(buffer, &moves, Location::Device(gpu), |m| {
            m.faults as f64 * fault_us
        });
        (work, places.into_iter().map(at).collect())
    }

    /// The work of moving pages of `buffer` (`moves`) to `to`, each after `setup_us` of it.
    fn migrations(
        &self,
        buffer: Key,
        moves: &[Move],
        to: Location,
        setup_us: impl Fn(&Move) -> f64,
    ) -> Vec<Work> {
        moves
            .iter()
            .map(|m| Work::Migrate {
                buffer,
                bytes: m.bytes,
                path: self.migration_path(m.from, to),
                setup_us: setup_us(m),
            })
            .collect()
    }

    /// The way pages move from one place to another: over P2P between GPUs that have it, staged
    /// through host memory between GPUs that do not, over PCIe to and from host memory.
    fn migration_path(&self, from: Location, to: Location) -> Path {
        match (from, to) {
            (Location::Device(a), Location::Device(b))
                if a != b && !self.links.preset().p2p(a, b) =>
            {
                self.links.staged(a, b)
            }
            _ => {
                // Pages never move from host memory to host memory (a prefetch skips those already
                // there), so a GPU is always one end.
                let via = match (from, to) {
                    (Location::Device(d), _) | (_, Location::Device(d)) => d,
                    _ => 0,
                };
                self.links.direct(at(from), at(to), via)
            }
        }
    }

    /// The path of a copy issued on `gpu` from `from` to `to`. A copy engine stages between two
    /// GPUs through host memory unless the issuing GPU reaches both: its own memory, a peer it
    /// enabled, or (`managed`: source, destination) a managed buffer's pages on a P2P peer, which
    /// the driver maps.
    fn route(
        &self,
        st: &State,
        gpu: usize,
        method: CopyMethod,
        (from, to): (Place, Place),
        managed: (bool, bool),
    ) -> Path {
        match method {
            CopyMethod::CopyEngine => {
                let preset = self.links.preset();
                let reachable = |d: usize, managed: bool| {
                    d == gpu
                        || st.peer_access.contains(&(gpu, d))
                        || (managed && preset.p2p(gpu, d))
                };
                match (from, to) {
                    (Place::Device(a), Place::Device(b))
                        if a != b && !(reachable(a, managed.0) && reachable(b, managed.1)) =>
                    {
                        self.links.staged(a, b)
                    }
                    _ => self.links.direct(from, to, gpu),
                }
            }
            CopyMethod::SmKernel => self.links.kernel(from, to, gpu),
        }
    }

    /// Refuses a copy issued on `gpu` that would reach another host's GPU memory: one process
    /// reaches no other host's memory.
    fn within_host(&self, st: &State, gpu: usize, copy: &BufferCopy<&Key>) -> Result<()> {
        for &buffer in [copy.src, copy.dst] {
            if let Memory::Device(other) = st.store.get(buffer).memory {
                if self.links.crosses_hosts(gpu, other) {
                    return Err(Error::usage(format!(
                        "GPU {gpu} and GPU {other} are on different simulated hosts: no copy \
                         reaches another host's memory; between hosts NCCL carries the data \
                         (`peerlink workload`), and `peerlink plan` predicts the network's routes"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The work of one kernel on `gpu` moving every message of a batch (not empty): the page
    /// moves its managed memory needs first, then each message's path as an SM copy; messages that
    /// take different paths are modelled as one flow over all of them (pessimistic where they
    /// would not contend).
    /// A stop is heard every few thousand messages (a million take seconds to plan).
    fn plan_batch(
        &self,
        st: &mut State,
        gpu: usize,
        batch: &Batch<'_, Key>,
    ) -> Result<(Vec<Work>, Work)> {
        let mut copies = Vec::with_capacity(batch.len());
        let mut moves = Vec::new();
        let mut joined: Option<(links::Path, f64)> = None;
        for (i, copy) in batch.iter().enumerate() {
            crate::interrupt::check_every(i)?;
            let copy = copy.map(|k| *k);
            let (copy_moves, planned) = self.plan_copy(st, gpu, CopyMethod::SmKernel, copy);
            let Work::Copy { path, setup_us, .. } = planned else {
                unreachable!("plan_copy plans copies")
            };
            moves.extend(copy_moves);
            copies.push(copy);
            match &mut joined {
                None => joined = Some((path, setup_us)),
                Some((all, _)) if *all != path => all.join(path),
                Some(_) => {}
            }
        }
        let (path, setup_us) = joined.expect("a checked batch is not empty");
        let work = Work::Copy {
            copies,
            path,
            setup_us,
        };
        Ok((moves, work))
    }

    /// The work of one copy issued on a stream of `gpu`: the page moves its managed memory needs
    /// first (none for other memory), then the copy, with its path through the links.
    fn plan_copy(
        &self,
        st: &mut State,
        gpu: usize,
        method: CopyMethod,
        copy: BufferCopy<Key>,
    ) -> (Vec<Work>, Work) {
        let (mut moves, sources) = self.reach(
            st,
            gpu,
            method,
            (copy.src, copy.src_offset, copy.len),
            false,
        );
        let (dst_moves, destinations) =
            self.reach(st, gpu, method, (copy.dst, copy.dst_offset, copy.len), true);
        moves.extend(dst_moves);
        let costs = self.costs();
        let managed = (st.managed.contains(copy.src), st.managed.contains(copy.dst));
        let mut path: Option<Path> = None;
        for &from in &sources {
            for &to in &destinations {
                let leg = self.route(st, gpu, method, (from, to), managed);
                match &mut path {
                    None => path = Some(leg),
                    Some(all) if *all != leg => all.join(leg),
                    Some(_) => {}
                }
            }
        }
        let setup_us = match method {
            CopyMethod::CopyEngine => costs.copy_setup_us,
            CopyMethod::SmKernel => costs.kernel_setup_us,
        };
        let work = Work::Copy {
            copies: vec![copy],
            path: path.expect("a copy's range lies in at least one place"),
            setup_us,
        };
        (moves, work)
    }

    /// Captures `work` if the stream is capturing; otherwise charges `issue_us` to the host and
    /// queues it.
    fn submit(st: &mut State, stream: &Stream, issue_us: f64, work: Work) {
        st.host_us += issue_us;
        if let Some(graph) = st.captures.get_mut(&stream.index) {
            graph.push(Node::Work(work));
            return;
        }
        st.store.retain(&work.buffers());
        st.caches.queued(&work, &st.store);
        let ready = st.host_us;
        st.scheduler.enqueue(stream.index, ready, work);
    }

    /// Submits one call's work, in order, for its `issue_us` (the first piece pays it: the page
    /// moves a copy needs start no earlier than the copy's own call).
    fn submit_all(
        st: &mut State,
        stream: &Stream,
        issue_us: f64,
        work: impl IntoIterator<Item = Work>,
    ) {
        let mut issue = issue_us;
        for piece in work {
            Self::submit(st, stream, issue, piece);
            issue = 0.0;
        }
    }

    /// Queues each rank's part of a collective on its stream (`streams[rank]`), one kernel launch
    /// each.
    fn submit_parts(&self, streams: &[&Stream], collective: Collective) {
        let collective = Arc::new(collective);
        let mut st = self.lock();
        for (rank, stream) in streams.iter().enumerate() {
            let work = Work::Part {
                collective: Arc::clone(&collective),
                rank,
                setup_us: self.costs().kernel_setup_us,
            };
            Self::submit(&mut st, stream, self.costs().kernel_issue_us, work);
        }
    }

    /// Runs the simulation up to the host clock, so that the state reflects "now".
    fn catch_up(st: &mut State) {
        let State {
            scheduler,
            store,
            host_us,
            ..
        } = st;
        scheduler.advance_to(*host_us, store);
    }

    /// Host blocked until `t`, then pays the wake-up cost; reports a kernel fault if one happened.
    fn block_until(&self, st: &mut State, t: f64) -> Result<()> {
        st.host_us = st.host_us.max(t) + self.costs().sync_us;
        match st.scheduler.fault() {
            Some(fault) => Err(Error::Cuda {
                call: "synchronize (simulated)".into(),
                message: fault.to_string(),
            }),
            None => Ok(()),
        }
    }
}

impl RawBackend for Simulator {
    type Buffer = Key;
    type Stream = Stream;
    /// The scheduler's event slot.
    type Event = usize;
    /// The scheduler's gate.
    type Gate = usize;
    type Graph = Graph;
    type Worker = resident::Worker;

    fn stop_worker(&self, worker: &Self::Worker) -> Result<super::resident::StopReport> {
        self.stop_resident(worker)
    }

    fn notices(&self) -> Vec<String> {
        let preset = self.links.preset();
        preset
            .partial
            .then(|| {
                format!(
                    "simulator preset `{}` is partial: the `peerlink tune` that wrote it was \
                     interrupted, so the figures it did not measure are estimates",
                    preset.name
                )
            })
            .into_iter()
            .collect()
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    fn enable_peer_access(&self, device: usize, peer: usize) -> Result<()> {
        let pair = self
            .topology
            .pair(device, peer)
            .expect("every ordered pair of distinct devices is listed");
        if !pair.p2p {
            let preset = self.links.preset();
            let message = if pair.link.crosses_hosts() {
                "they sit on different hosts (NET): only NICs join them; NCCL carries data \
                 between hosts"
                    .to_string()
            } else if preset.device(device).mig_enabled || preset.device(peer).mig_enabled {
                "MIG is enabled on one of them, and MIG instances cannot use P2P".to_string()
            } else if preset.faults.p2p_off(device, peer) {
                "the preset's faults switch P2P off between them (faults.p2p_off); copy-engine \
                 copies between them are staged through host memory"
                    .to_string()
            } else if pair.link.crosses_sockets() {
                "they sit under different CPU sockets (SYS) and this host offers no P2P across \
                 them; copy-engine copies between them are staged through host memory"
                    .to_string()
            } else {
                format!(
                    "this host offers no P2P over their {} path; copy-engine copies between them \
                     are staged through host memory",
                    pair.link
                )
            };
            return Err(Error::PeerAccess {
                src: device,
                dst: peer,
                message,
            });
        }
        self.lock().peer_access.insert((device, peer));
        Ok(())
    }

    fn free_memory(&self, device: usize) -> Result<u64> {
        let total = self.topology.devices[device].memory_bytes;
        Ok(total - self.lock().allocated[device])
    }

    fn alloc(&self, memory: Memory, bytes: usize) -> Result<Key> {
        let mut st = self.lock();
        match memory {
            Memory::Device(d) | Memory::Managed(d) => {
                if let Memory::Managed(_) = memory {
                    ManagedPages::check_gpus(self.topology.devices.len())?;
                }
                let free = self.topology.devices[d].memory_bytes - st.allocated[d];
                if bytes as u64 > free {
                    return Err(Error::Cuda {
                        call: "cuMemAlloc (simulated)".into(),
                        message: format!(
                            "out of memory: {bytes} bytes asked on GPU {d}, which has {free} free"
                        ),
                    });
                }
            }
            Memory::PinnedHost {
                numa_node: Some(node),
            } => {
                let nodes = self.links.numa_nodes();
                if !nodes.contains(&node) {
                    return Err(Error::usage(format!(
                        "NUMA node {node} does not exist on this simulated host (nodes {nodes:?})"
                    )));
                }
            }
            Memory::PinnedHost { numa_node: None } => {}
        }
        let key = st.store.insert(memory, bytes)?;
        match memory {
            Memory::Device(d) => st.allocated[d] += bytes as u64,
            // Counted against the GPU it was allocated for, wherever its pages go.
            Memory::Managed(d) => {
                st.allocated[d] += bytes as u64;
                st.managed.insert(key, bytes, Location::Device(d));
            }
            Memory::PinnedHost { .. } => {}
        }
        Ok(key)
    }

    fn free(&self, buffer: &Key) -> Result<()> {
        let mut st = self.lock();
        if st.store.forget_borrowed(*buffer) {
            return Ok(());
        }
        Self::catch_up(&mut st);
        let freed = st.store.remove(*buffer)?;
        st.caches.freed(*buffer);
        match freed.memory {
            Memory::Device(d) | Memory::Managed(d) if !freed.imported => {
                st.allocated[d] -= freed.len() as u64
            }
            _ => {}
        }
        st.managed.remove(*buffer);
        Ok(())
    }

    fn write(&self, buffer: &Key, offset: usize, data: &[u8]) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        Self::catch_up(st);
        st.store.write(*buffer, offset, data);
        st.caches.host_wrote(*buffer, data.len(), &st.store);
        Ok(())
    }

    fn read(&self, buffer: &Key, offset: usize, out: &mut [u8]) -> Result<()> {
        let mut st = self.lock();
        Self::catch_up(&mut st);
        st.store.read(*buffer, offset, out);
        Ok(())
    }

    fn create_stream(&self, device: usize) -> Result<Stream> {
        let index = self.lock().scheduler.add_stream();
        Ok(Stream { index, device })
    }

    fn destroy_stream(&self, _stream: Stream) -> Result<()> {
        // The scheduler's stream keeps running what was queued on it, like a destroyed CUDA
        // stream; nothing can queue more.
        Ok(())
    }

    fn copy(&self, stream: &Stream, method: CopyMethod, copy: BufferCopy<&Key>) -> Result<()> {
        let mut st = self.lock();
        self.within_host(&st, stream.device, &copy)?;
        let (moves, work) = self.plan_copy(&mut st, stream.device, method, copy.map(|k| *k));
        let issue = match method {
            CopyMethod::CopyEngine => self.costs().copy_issue_us,
            CopyMethod::SmKernel => self.costs().kernel_issue_us,
        };
        Self::submit_all(&mut st, stream, issue, moves.into_iter().chain([work]));
        Ok(())
    }

    fn copy_batch(&self, stream: &Stream, batch: Batch<'_, Key>) -> Result<()> {
        let mut st = self.lock();
        for (i, copy) in batch.iter().enumerate() {
            crate::interrupt::check_every(i)?;
            self.within_host(&st, stream.device, &copy)?;
        }
        let (moves, work) = self.plan_batch(&mut st, stream.device, &batch)?;
        let issue = self.costs().kernel_issue_us;
        Self::submit_all(&mut st, stream, issue, moves.into_iter().chain([work]));
        Ok(())
    }

    fn memcpy_batch(&self, stream: &Stream, batch: Batch<'_, Key>) -> Result<()> {
        let mut st = self.lock();
        // Every copy checked before any is queued: a refused one queues none.
        for (i, copy) in batch.iter().enumerate() {
            crate::interrupt::check_every(i)?;
            self.within_host(&st, stream.device, &copy)?;
        }
        // One driver call on real GPUs, but the lent H200 measured it no cheaper per copy than
        // separate copies (5.02 vs 5.15 µs per message), so each copy is priced as one.
        let issue = self.costs().copy_issue_us;
        for (i, copy) in batch.iter().enumerate() {
            crate::interrupt::check_every(i)?;
            let copy = copy.map(|k| *k);
            let (moves, work) =
                self.plan_copy(&mut st, stream.device, CopyMethod::CopyEngine, copy);
            Self::submit_all(&mut st, stream, issue, moves.into_iter().chain([work]));
        }
        Ok(())
    }

    fn record(&self, stream: &Stream) -> Result<usize> {
        let mut st = self.lock();
        let slot = st.scheduler.add_event();
        Self::submit(
            &mut st,
            stream,
            self.costs().event_issue_us,
            Work::Record(slot),
        );
        Ok(slot)
    }

    fn wait(&self, stream: &Stream, event: &usize) -> Result<()> {
        let mut st = self.lock();
        Self::submit(
            &mut st,
            stream,
            self.costs().event_issue_us,
            Work::Wait(*event),
        );
        Ok(())
    }

    fn event_done(&self, event: &usize) -> Result<bool> {
        let mut st = self.lock();
        Self::catch_up(&mut st);
        Ok(st.scheduler.event_time(*event).is_some())
    }

    fn event_synchronize(&self, event: &usize) -> Result<()> {
        let mut st = self.lock();
        let State {
            scheduler, store, ..
        } = &mut *st;
        let t = scheduler.run_until_event(*event, store)?;
        self.block_until(&mut st, t)
    }

    fn elapsed_us(&self, start: &usize, end: &usize) -> Result<Option<f64>> {
        let mut st = self.lock();
        Self::catch_up(&mut st);
        Ok(
            match (
                st.scheduler.event_time(*start),
                st.scheduler.event_time(*end),
            ) {
                (Some(t0), Some(t1)) => Some(t1 - t0),
                _ => None,
            },
        )
    }

    fn destroy_event(&self, event: usize) -> Result<()> {
        // A wait still queued on the event keeps its slot until it has run.
        self.lock().scheduler.destroy_event(event);
        Ok(())
    }

    fn synchronize(&self, stream: &Stream) -> Result<()> {
        let mut st = self.lock();
        let State {
            scheduler, store, ..
        } = &mut *st;
        let t = scheduler.run_until_idle(stream.index, store)?;
        self.block_until(&mut st, t)
    }

    fn host_time_us(&self) -> f64 {
        self.lock().host_us
    }

    fn hold(&self, stream: &Stream) -> Result<usize> {
        let mut st = self.lock();
        let gate = st.scheduler.add_gate();
        Self::submit(
            &mut st,
            stream,
            self.costs().kernel_issue_us,
            Work::Gate(gate),
        );
        Ok(gate)
    }

    fn release(&self, gate: usize) -> Result<()> {
        let mut st = self.lock();
        // The spinning kernel sees the flag one load of pinned host memory later.
        let poll_us = self.links.preset().pcie.load_latency_ns / 1e3;
        let at = st.host_us + poll_us;
        st.scheduler.open_gate(gate, at);
        Ok(())
    }

    fn begin_capture(&self, stream: &Stream) -> Result<()> {
        self.lock().captures.insert(stream.index, Vec::new());
        Ok(())
    }

    fn is_capturing(&self, stream: &Stream) -> Result<bool> {
        // A borrowed stream is one simulated stream per handle: a capture begun through one
        // handle captures the work queued through every other.
        Ok(self.lock().captures.contains_key(&stream.index))
    }

    fn end_capture(&self, stream: &Stream) -> Result<Graph> {
        let captured = self.lock().captures.remove(&stream.index);
        let work = captured.expect("the checked layer ends only captures it began");
        Ok(Graph(Arc::new(work)))
    }

    fn replay(&self, graph: &Graph, stream: &Stream) -> Result<()> {
        let mut guard = self.lock();
        guard.host_us += self.costs().graph_issue_us;
        let node_us = self.costs().graph_node_us;
        for node in graph.0.iter() {
            match node {
                Node::Work(work) => {
                    let st = &mut *guard;
                    let work = work.clone().with_setup(node_us);
                    st.store.retain(&work.buffers());
                    st.caches.queued(&work, &st.store);
                    let ready = st.host_us;
                    st.scheduler.enqueue(stream.index, ready, work);
                }
                Node::Across(part) => {
                    // The host meets the other processes, as at a call: not under the lock.
                    drop(guard);
                    self.run_part(part, stream)?;
                    guard = self.lock();
                }
            }
        }
        Ok(())
    }

    fn destroy_graph(&self, _graph: Graph) -> Result<()> {
        // Replays already queued hold their own copies of the work.
        Ok(())
    }

    fn borrow_memory(&self, device: usize, address: u64, bytes: usize) -> Result<Key> {
        self.lock().store.borrow(device, address, bytes)
    }

    fn borrow_stream(&self, device: usize, handle: u64) -> Result<Stream> {
        // The simulator has no CUDA streams: each handle names one simulated stream of its GPU,
        // made at its first borrow, so that the work of one handle stays in order.
        let mut st = self.lock();
        if let Some(&index) = st.borrowed_streams.get(&(device, handle)) {
            return Ok(Stream { index, device });
        }
        let index = st.scheduler.add_stream();
        st.borrowed_streams.insert((device, handle), index);
        Ok(Stream { index, device })
    }
}

impl RawProbes for Simulator {
    fn pointer_chase(
        &self,
        stream: &Stream,
        chain: &Key,
        _elements: u64,
        steps: u32,
        result: &Key,
    ) -> Result<()> {
        let mut st = self.lock();
        let place = Self::place(&st, *chain, stream.device);
        let served = match st.caches.holds(*chain) {
            true => Chain::Cached,
            false => Chain::InMemory,
        };
        let work = Work::Chase {
            chain: *chain,
            steps,
            result: *result,
            setup_us: self.costs().kernel_setup_us,
            step_us: self.links.load_latency_us(stream.device, place, served),
        };
        if !st.captures.contains_key(&stream.index) {
            let State { caches, store, .. } = &mut *st;
            caches.walked(*chain, store);
        }
        Self::submit(&mut st, stream, self.costs().kernel_issue_us, work);
        Ok(())
    }

    fn ping_pong(
        &self,
        ping: &Stream,
        pong: &Stream,
        ping_flag: &Key,
        pong_flag: &Key,
        rounds: u32,
    ) -> Result<()> {
        let mut st = self.lock();
        let venue = Venue::Once(st.next_venue());
        let one_way_us = self.links.signal_us(ping.device, pong.device);
        let setup_us = self.costs().kernel_setup_us;
        let issue = self.costs().kernel_issue_us;
        for (rank, (stream, writes)) in [(ping, *pong_flag), (pong, *ping_flag)]
            .into_iter()
            .enumerate()
        {
            let work = Work::PingPong {
                meeting: Meeting {
                    venue,
                    rank,
                    ranks: 2,
                },
                writes,
                rounds,
                one_way_us,
                setup_us,
            };
            Self::submit(&mut st, stream, issue, work);
        }
        Ok(())
    }
}

impl RawManaged for Simulator {
    fn advise(&self, buffer: &Key, advice: Advice) -> Result<()> {
        let mut st = self.lock();
        // Work already queued decided its pages when it was queued (see `managed`).
        st.managed.advise(*buffer, advice);
        Ok(())
    }

    fn prefetch(&self, stream: &Stream, buffer: &Key, to: Location) -> Result<()> {
        let mut st = self.lock();
        let moves = st.managed.prefetch(*buffer, to);
        let setup_us = self.costs().copy_setup_us;
        let work = self.migrations(*buffer, &moves, to, |_| setup_us);
        // One driver call, whatever it moves (nothing, where every page is there already).
        st.host_us += self.costs().copy_issue_us;
        Self::submit_all(&mut st, stream, 0.0, work);
        Ok(())
    }
}

/// The pattern calls on the simulator's bytes, with the host's own generator and check. Like
/// `write` and `read` (filling and checking), they cost nothing on the virtual clocks: they are no
/// stream work, run outside every timed window, and so change no simulated figure.
impl RawPatterns for Simulator {
    fn fill(&self, range: BufferRange<&Key>, seed: u64) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        Self::catch_up(st);
        st.store
            .write_with(*range.buffer, range.offset, range.len, |bytes| {
                pattern::fill(seed, bytes)
            });
        st.caches.host_wrote(*range.buffer, range.len, &st.store);
        Ok(())
    }

    fn first_mismatch(&self, range: BufferRange<&Key>, seed: u64) -> Result<Option<Mismatch>> {
        let mut st = self.lock();
        Self::catch_up(&mut st);
        let bytes = st.store.bytes(*range.buffer, range.offset, range.len);
        Ok(pattern::first_mismatch(seed, &bytes))
    }
}

impl RawCollectives for Simulator {
    type Comm = Comm;
    /// No window is ever registered: the simulator has no model of NCCL's symmetric kernels.
    type Window = std::convert::Infallible;

    fn all_reduce(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        op: Reduction,
        ranks: &[RawRank<'_, Self>],
        flags: &[&Key],
        waiting: Waiting<&Key>,
        len: usize,
    ) -> Result<()> {
        let plans: Vec<RankPlan> = ranks
            .iter()
            .map(|r| RankPlan {
                device: r.stream.device,
                input: *r.input,
                output: *r.output,
            })
            .collect();
        let flags: Vec<Key> = flags.iter().map(|&&k| k).collect();
        // Every rank is queued here at once, so a rank is late only by the work before it on its
        // stream, which the simulation runs in virtual time: a release word (raised in real time)
        // is not read, and only a bounded wait has a limit.
        let bounded = waiting == Waiting::Bounded;
        let work =
            collective::all_reduce(&self.links, kernel, dtype, op, &plans, &flags, bounded, len);
        let streams: Vec<&Stream> = ranks.iter().map(|r| r.stream).collect();
        self.submit_parts(&streams, work);
        Ok(())
    }

    fn rank_all_reduce(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        op: Reduction,
        rank: usize,
        stream: &Stream,
        ranks: &[RawRankBuffers<'_, Self>],
        waiting: Waiting<&Key>,
        len: usize,
    ) -> Result<()> {
        self.part_across_processes(kernel, dtype, op, rank, stream, ranks, waiting, len)
    }

    fn busy(&self, stream: &Stream, duration_us: f64) -> Result<()> {
        let work = Work::Busy {
            setup_us: self.costs().kernel_setup_us,
            duration_us,
        };
        Self::submit(&mut self.lock(), stream, self.costs().kernel_issue_us, work);
        Ok(())
    }

    fn nccl_open(&self) -> std::result::Result<String, String> {
        Ok(nccl::DESCRIPTION.into())
    }

    fn nccl_communicator(&self, devices: &[usize]) -> Result<Comm> {
        Ok(Comm::new(self.lock().next_venue(), devices))
    }

    fn nccl_destroy(&self, _comm: Comm) -> Result<()> {
        // Calls already queued hold what they need of it.
        Ok(())
    }

    fn nccl_all_reduce(
        &self,
        comm: &Comm,
        dtype: DataType,
        ranks: &[RawRank<'_, Self>],
        len: usize,
    ) -> Result<()> {
        let buffers: Vec<(Key, Key)> = ranks.iter().map(|r| (*r.input, *r.output)).collect();
        let work = nccl::all_reduce(&self.links, comm, dtype, &buffers, len);
        let streams: Vec<&Stream> = ranks.iter().map(|r| r.stream).collect();
        self.submit_parts(&streams, work);
        Ok(())
    }

    fn nccl_send_recv(
        &self,
        comm: &Comm,
        streams: &[&Stream],
        transfers: &[PeerTransfer<&Key>],
    ) -> Result<()> {
        let transfers: Vec<PeerTransfer<Key>> = transfers.iter().map(|t| t.map(|&k| k)).collect();
        let work = nccl::send_recv(&self.links, comm, &transfers);
        self.submit_parts(streams, work);
        Ok(())
    }

    fn nccl_unique_id(&self) -> Result<UniqueId> {
        Err(nccl::not_across_processes())
    }

    fn nccl_join(&self, _id: &UniqueId, _rank: CommRank) -> Result<Comm> {
        Err(nccl::not_across_processes())
    }

    fn nccl_rank_send_recv(
        &self,
        _comm: &Comm,
        _stream: &Stream,
        _ops: &[PeerOp<&Key>],
    ) -> Result<()> {
        Err(nccl::not_across_processes())
    }

    fn nccl_symmetric(&self) -> std::result::Result<(), String> {
        Err(nccl::NO_SYMMETRIC_MODEL.into())
    }

    fn nccl_alloc(&self, _device: usize, _bytes: usize) -> Result<Key> {
        Err(Error::usage(nccl::NO_SYMMETRIC_MODEL))
    }

    fn nccl_register_window(
        &self,
        _comm: &Comm,
        _buffers: &[&Key],
        _bytes: usize,
    ) -> Result<Self::Window> {
        Err(Error::usage(nccl::NO_SYMMETRIC_MODEL))
    }

    fn nccl_deregister_window(&self, _comm: &Comm, window: Self::Window) -> Result<()> {
        match window {}
    }
}

/// Where the link model finds a place of managed pages (host memory near whichever GPU touches it).
fn at(location: Location) -> Place {
    match location {
        Location::Device(d) => Place::Device(d),
        Location::Host => Place::Host(None),
    }
}

use crate::backend::collective::{
    AllReduceKernel, CommRank, DataType, PeerOp, PeerTransfer, Reduction, UniqueId, Waiting,
};
use crate::backend::{RawCollectives, RawRank, RawRankBuffers};
