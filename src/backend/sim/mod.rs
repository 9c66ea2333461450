//! A simulated GPU host: real bytes in host memory, virtual and deterministic time.
//!
//! Buffers are `Vec<u8>`s and copies really copy, so chunking, offset and relay bugs show byte for
//! byte. Time is virtual: a host clock advances by each call's modelled CPU cost; GPU work runs on
//! in-order streams in a discrete-event simulation (module `scheduler`) whose copy rates come from
//! a link model (`links`) with max-min fair sharing (`sharing`). Figures come from a [`preset`].
//! Collectives meet across their ranks' streams and move their bytes as flows too: peerlink's
//! all-reduce kernels (`collective`) and a model of NCCL built on its tuner's figures (`nccl`);
//! their sums are real (`reduce`). Every figure this backend produces is simulated, and its source
//! says so (`sim:<preset>`).
//!
//! [`Simulator`] does the simulating; the [`Checked`] layer above it checks every argument, so
//! [`SimBackend`] is what callers open.

mod collective;
#[cfg(test)]
mod collective_tests;
mod links;
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

use super::{Batch, BufferCopy, Checked, CopyMethod, Memory, RawBackend, RawProbes};
use crate::topology::Topology;
use crate::{Error, Result};
use collective::RankPlan;
use links::{LinkModel, Place};
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
        Ok(Self::from_preset(&Preset::load(preset)?))
    }

    /// Opens the simulator on an already parsed preset.
    pub fn from_preset(preset: &Preset) -> Self {
        Checked::new(Simulator::new(preset))
    }

    /// The preset the simulator runs.
    pub fn preset(&self) -> &Preset {
        self.raw().links.preset()
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
pub struct Graph(Arc<Vec<Work>>);

struct State {
    host_us: f64,
    scheduler: Scheduler,
    store: Store,
    /// Work recorded instead of run, by the index of each stream that captures a graph.
    captures: BTreeMap<usize, Vec<Work>>,
    /// The last number given to a ping-pong's or a communicator's venue.
    venues: u64,
    /// Pairs whose peer access is enabled: copy engines between other pairs stage through host
    /// memory.
    peer_access: BTreeSet<(usize, usize)>,
    allocated: Vec<u64>,
}

impl State {
    /// A number for a new venue.
    fn next_venue(&mut self) -> u64 {
        self.venues += 1;
        self.venues
    }
}

impl Simulator {
    fn new(preset: &Preset) -> Self {
        let links = LinkModel::new(preset);
        let topology = preset.topology();
        let state = State {
            host_us: 0.0,
            scheduler: Scheduler::new(links.capacity().to_vec()),
            store: Store::new(),
            captures: BTreeMap::new(),
            venues: 0,
            peer_access: BTreeSet::new(),
            allocated: vec![0; preset.devices.len()],
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

    fn place(st: &State, buffer: Key) -> Place {
        match st.store.get(buffer).memory {
            Memory::Device(d) => Place::Device(d),
            Memory::PinnedHost { numa_node } => Place::Host(numa_node),
        }
    }

    /// The work of one copy issued on a stream of `gpu`, with its path through the links.
    fn plan_copy(&self, st: &State, gpu: usize, method: CopyMethod, copy: BufferCopy<Key>) -> Work {
        let costs = self.costs();
        let (from, to) = (Self::place(st, copy.src), Self::place(st, copy.dst));
        let (path, setup_us) = match method {
            CopyMethod::CopyEngine => {
                let reachable = |d: usize| d == gpu || st.peer_access.contains(&(gpu, d));
                let path = match (from, to) {
                    (Place::Device(a), Place::Device(b))
                        if a != b && !(reachable(a) && reachable(b)) =>
                    {
                        self.links.staged(a, b)
                    }
                    _ => self.links.direct(from, to, gpu),
                };
                (path, costs.copy_setup_us)
            }
            CopyMethod::SmKernel => (self.links.kernel(from, to, gpu), costs.kernel_setup_us),
        };
        Work::Copy {
            copies: vec![copy],
            path,
            setup_us,
        }
    }

    /// The work of one kernel on `gpu` moving every message of a batch (not empty): each message's
    /// path as an SM copy; messages that take different paths are modelled as one flow over all of
    /// them (pessimistic where they would not contend).
    fn plan_batch(&self, st: &State, gpu: usize, batch: &Batch<'_, Key>) -> Work {
        let mut copies = Vec::with_capacity(batch.len());
        let mut joined: Option<(links::Path, f64)> = None;
        for copy in batch.iter() {
            let copy = copy.map(|k| *k);
            let Work::Copy { path, setup_us, .. } =
                self.plan_copy(st, gpu, CopyMethod::SmKernel, copy)
            else {
                unreachable!("plan_copy plans copies")
            };
            copies.push(copy);
            match &mut joined {
                None => joined = Some((path, setup_us)),
                Some((all, _)) if *all != path => all.join(path),
                Some(_) => {}
            }
        }
        let (path, setup_us) = joined.expect("a checked batch is not empty");
        Work::Copy {
            copies,
            path,
            setup_us,
        }
    }

    /// Captures `work` if the stream is capturing; otherwise charges `issue_us` to the host and
    /// queues it.
    fn submit(st: &mut State, stream: &Stream, issue_us: f64, work: Work) {
        st.host_us += issue_us;
        if let Some(graph) = st.captures.get_mut(&stream.index) {
            graph.push(work);
            return;
        }
        st.store.retain(&work.buffers());
        let ready = st.host_us;
        st.scheduler.enqueue(stream.index, ready, work);
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
            let message = if preset.devices[device].mig_enabled || preset.devices[peer].mig_enabled
            {
                "MIG is enabled on one of them, and MIG instances cannot use P2P".to_string()
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
            Memory::Device(d) => {
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
        if let Memory::Device(d) = memory {
            st.allocated[d] += bytes as u64;
        }
        Ok(key)
    }

    fn free(&self, buffer: &Key) -> Result<()> {
        let mut st = self.lock();
        Self::catch_up(&mut st);
        let freed = st.store.remove(*buffer)?;
        if let Memory::Device(d) = freed.memory {
            st.allocated[d] -= freed.len() as u64;
        }
        Ok(())
    }

    fn write(&self, buffer: &Key, offset: usize, data: &[u8]) -> Result<()> {
        let mut st = self.lock();
        Self::catch_up(&mut st);
        st.store.write(*buffer, offset, data);
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
        let work = self.plan_copy(&st, stream.device, method, copy.map(|k| *k));
        let issue = match method {
            CopyMethod::CopyEngine => self.costs().copy_issue_us,
            CopyMethod::SmKernel => self.costs().kernel_issue_us,
        };
        Self::submit(&mut st, stream, issue, work);
        Ok(())
    }

    fn copy_batch(&self, stream: &Stream, batch: Batch<'_, Key>) -> Result<()> {
        let mut st = self.lock();
        let work = self.plan_batch(&st, stream.device, &batch);
        Self::submit(&mut st, stream, self.costs().kernel_issue_us, work);
        Ok(())
    }

    fn memcpy_batch(&self, stream: &Stream, batch: Batch<'_, Key>) -> Result<()> {
        let mut st = self.lock();
        // One driver call on real GPUs, but the lent H200 measured it no cheaper per copy than
        // separate copies (5.02 vs 5.15 µs per message), so each copy is priced as one.
        let issue = self.costs().copy_issue_us;
        for copy in batch.iter() {
            let work = self.plan_copy(&st, stream.device, CopyMethod::CopyEngine, copy.map(|k| *k));
            Self::submit(&mut st, stream, issue, work);
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

    fn end_capture(&self, stream: &Stream) -> Result<Graph> {
        let captured = self.lock().captures.remove(&stream.index);
        let work = captured.expect("the checked layer ends only captures it began");
        Ok(Graph(Arc::new(work)))
    }

    fn replay(&self, graph: &Graph, stream: &Stream) -> Result<()> {
        let mut st = self.lock();
        st.host_us += self.costs().graph_issue_us;
        let node_us = self.costs().graph_node_us;
        let ready = st.host_us;
        for work in graph.0.iter() {
            let work = work.clone().with_setup(node_us);
            st.store.retain(&work.buffers());
            st.scheduler.enqueue(stream.index, ready, work);
        }
        Ok(())
    }

    fn destroy_graph(&self, _graph: Graph) -> Result<()> {
        // Replays already queued hold their own copies of the work.
        Ok(())
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
        let place = Self::place(&st, *chain);
        let work = Work::Chase {
            chain: *chain,
            steps,
            result: *result,
            setup_us: self.costs().kernel_setup_us,
            step_us: self.links.load_latency_us(stream.device, place),
        };
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

impl RawCollectives for Simulator {
    type Comm = Comm;

    fn all_reduce(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        ranks: &[RawRank<'_, Self>],
        flags: &[&Key],
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
        let work = collective::all_reduce(&self.links, kernel, dtype, &plans, &flags, len);
        let streams: Vec<&Stream> = ranks.iter().map(|r| r.stream).collect();
        self.submit_parts(&streams, work);
        Ok(())
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
}

use crate::backend::collective::{AllReduceKernel, DataType, PeerTransfer};
use crate::backend::{RawCollectives, RawRank};
