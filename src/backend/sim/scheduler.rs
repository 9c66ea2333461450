//! The discrete-event core: in-order streams of operations on a virtual GPU clock.
//!
//! Each stream runs one operation at a time, as a few steps ([`Step`]): a fixed delay, a gate, a
//! meeting with the other ranks of work over several GPUs, or waiting for flows. A flow is bytes
//! crossing a path once a fixed latency has passed; its rate comes from max-min fair sharing with
//! every other flow in flight, recomputed whenever a flow starts or ends. A flow holds back the
//! streams whose work waits for it: a copy's own stream, or the ranks of a collective. The host
//! side (the backend) only enqueues operations that start at or after its own clock, and the
//! simulation never runs past a time the host has not reached unless the host blocks on it, so the
//! simulation never rewinds.

use super::links::Path;
use super::memory::{Key, Store};
use super::reduce;
use super::sharing::{max_min_rates, Demand};
use crate::backend::collective::{DataType, Reduction};
use crate::backend::BufferCopy;
use crate::{Error, Result};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// How long a held stream's spin kernel waits for its release before it gives up, in µs.
pub(super) const HOLD_TIMEOUT_US: f64 = 1e6;

/// Bytes below which a flow counts as finished (float rounding of `rate × time`).
const DONE_BYTES: f64 = 1e-3;

/// Work a stream can run.
#[derive(Clone, Debug)]
pub(super) enum Work {
    /// Moves bytes: fixed latency (`setup_us` + the path's latency), then one flow over `path`
    /// carrying every copy's bytes (one copy, or the messages of one batch kernel).
    Copy {
        copies: Vec<BufferCopy<Key>>,
        path: Path,
        setup_us: f64,
    },
    /// Moves pages of the managed buffer `buffer`: fixed latency (`setup_us`, its faults' cost,
    /// and the path's latency), then `bytes` as one flow over `path`. It writes nothing: the store
    /// holds every buffer's bytes once, wherever its pages live.
    Migrate {
        buffer: Key,
        bytes: usize,
        path: Path,
        setup_us: f64,
    },
    /// Follows `steps` dependent loads through `chain`, then stores the index reached in `result`.
    Chase {
        chain: Key,
        steps: u32,
        result: Key,
        setup_us: f64,
        step_us: f64,
    },
    /// A kernel that keeps its GPU busy for `duration_us` once launched.
    Busy {
        setup_us: f64,
        duration_us: f64,
    },
    /// Blocks the stream until the gate opens (or its spin times out).
    Gate(usize),
    Record(usize),
    Wait(usize),
    /// One side of a ping-pong (rank 0 pings): both sides meet, then exchange `rounds` round trips.
    PingPong {
        meeting: Meeting,
        /// The flag this side stores into (on the other GPU).
        writes: Key,
        rounds: u32,
        one_way_us: f64,
        setup_us: f64,
    },
    /// One rank's part of a collective.
    Part {
        collective: Arc<Collective>,
        rank: usize,
        setup_us: f64,
    },
}

/// Where the parts of work over several streams meet. Each rank's k-th arrival at a venue joins
/// the k-th gathering there, which goes on when every rank has arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Venue {
    /// One ping-pong's two sides, once.
    Once(u64),
    /// The flag blocks of peerlink's all-reduce, named by rank 0's. The kernels count their calls
    /// in the flags, so the k-th call of each rank meets the k-th of the others, whether it was
    /// queued directly or replayed from a graph.
    Flags(Key),
    /// An NCCL communicator, which counts its calls likewise.
    Comm(u64),
}

/// One rank's arrival at a venue.
#[derive(Clone, Copy, Debug)]
pub(super) struct Meeting {
    pub venue: Venue,
    pub rank: usize,
    pub ranks: usize,
}

/// Work of several ranks, each part on its own stream, that goes on together: once every rank's
/// part has arrived at the venue, the flows start (each after its own latency); each part then
/// waits for the flows that hold it, and ends `tail_us` later, writing its rank's results.
#[derive(Debug)]
pub(super) struct Collective {
    pub venue: Venue,
    pub ranks: usize,
    pub flows: Vec<PlannedFlow>,
    pub tail_us: f64,
    pub results: Results,
    /// Buffers the work uses besides its results' (peerlink's flag blocks).
    pub scratch: Vec<Key>,
    /// How long a part may wait at the meeting for the last rank before its kernel traps (a
    /// sticky fault, as on a GPU); `None`: as long as it takes.
    pub wait_limit_us: Option<f64>,
}

/// A flow of a collective.
#[derive(Debug)]
pub(super) struct PlannedFlow {
    pub path: Path,
    pub bytes: usize,
    /// From the meeting until the bytes start to move.
    pub latency_us: f64,
    /// The ranks whose parts wait for it.
    pub holds: Vec<usize>,
}

/// What a collective writes.
#[derive(Debug)]
pub(super) enum Results {
    /// Every rank's output receives the element-wise reduction (`op`) of every rank's input
    /// (`len` bytes of each, as they were when the ranks met).
    Reduced {
        dtype: DataType,
        op: Reduction,
        inputs: Vec<Key>,
        outputs: Vec<Key>,
        len: usize,
    },
    /// Each copy lands when its receiving rank's part ends, with its source as it was when the
    /// ranks met.
    Copies(Vec<(usize, BufferCopy<Key>)>),
}

impl Collective {
    fn buffers(&self) -> Vec<Key> {
        let mut buffers = self.scratch.clone();
        match &self.results {
            Results::Reduced {
                inputs, outputs, ..
            } => buffers.extend(inputs.iter().chain(outputs)),
            Results::Copies(copies) => {
                buffers.extend(copies.iter().flat_map(|(_, c)| [c.src, c.dst]))
            }
        }
        buffers
    }
}

/// What a stream's work does next.
enum Step {
    /// A GPU overhead, then the work's own time.
    Delay {
        setup_us: f64,
        run_us: f64,
    },
    Gate(usize),
    Meet(Meeting),
    /// Waits for the flows that hold the work.
    Move,
}

impl Work {
    /// The buffers this work touches (they cannot be freed while it is queued).
    pub fn buffers(&self) -> Vec<Key> {
        match self {
            Work::Copy { copies, .. } => copies.iter().flat_map(|c| [c.src, c.dst]).collect(),
            Work::Migrate { buffer, .. } => vec![*buffer],
            Work::Chase { chain, result, .. } => vec![*chain, *result],
            Work::PingPong { writes, .. } => vec![*writes],
            Work::Part { collective, .. } => collective.buffers(),
            Work::Busy { .. } | Work::Gate(_) | Work::Record(_) | Work::Wait(_) => Vec::new(),
        }
    }

    /// The same work with another fixed GPU overhead (a graph node's instead of a stream op's).
    pub fn with_setup(mut self, overhead_us: f64) -> Work {
        match &mut self {
            Work::Copy { setup_us, .. }
            | Work::Migrate { setup_us, .. }
            | Work::Chase { setup_us, .. }
            | Work::Busy { setup_us, .. }
            | Work::PingPong { setup_us, .. }
            | Work::Part { setup_us, .. } => *setup_us = overhead_us,
            Work::Gate(_) | Work::Record(_) | Work::Wait(_) => {}
        }
        self
    }

    /// Step `i` of this work once it has started; `None` after the last.
    fn step(&self, i: usize) -> Option<Step> {
        let delay = |setup_us: f64, run_us: f64| Some(Step::Delay { setup_us, run_us });
        match (self, i) {
            (Work::Copy { .. } | Work::Migrate { .. }, 0) => Some(Step::Move),
            (
                Work::Chase {
                    steps,
                    setup_us,
                    step_us,
                    ..
                },
                0,
            ) => delay(*setup_us, *steps as f64 * step_us),
            (
                Work::Busy {
                    setup_us,
                    duration_us,
                },
                0,
            ) => delay(*setup_us, *duration_us),
            (Work::Gate(g), 0) => Some(Step::Gate(*g)),
            (Work::PingPong { meeting, .. }, 0) => Some(Step::Meet(*meeting)),
            (
                Work::PingPong {
                    meeting,
                    rounds,
                    one_way_us,
                    setup_us,
                    ..
                },
                1,
            ) => {
                // The ping side ends when its last answer arrives, the pong side when it sends it.
                let trips = 2.0 * *rounds as f64;
                let legs = if meeting.rank == 0 {
                    trips
                } else {
                    (trips - 1.0).max(0.0)
                };
                delay(*setup_us, legs * one_way_us)
            }
            (Work::Part { setup_us, .. }, 0) => delay(*setup_us, 0.0),
            (
                Work::Part {
                    collective, rank, ..
                },
                1,
            ) => Some(Step::Meet(Meeting {
                venue: collective.venue,
                rank: *rank,
                ranks: collective.ranks,
            })),
            (Work::Part { .. }, 2) => Some(Step::Move),
            (Work::Part { collective, .. }, 3) => delay(0.0, collective.tail_us),
            _ => None,
        }
    }
}

struct Op {
    ready_at: f64,
    work: Work,
}

enum Phase {
    /// Nothing happens until this time.
    Until(f64),
    Gate(usize),
    /// At a venue, waiting for the other ranks.
    Meeting,
    /// Waiting for the flows that hold the work.
    Moving,
}

/// What work writes when it ends.
enum Write {
    /// A copy's destination receives the source bytes as they were when the store's reader
    /// `reader` began.
    Copy { reader: u64, copy: BufferCopy<Key> },
    /// A kernel's stores.
    Bytes {
        dst: Key,
        offset: usize,
        bytes: Arc<Vec<u8>>,
    },
}

struct Running {
    work: Work,
    phase: Phase,
    /// The step after the current one.
    next_step: usize,
    /// Flows still in flight that this work waits for.
    held_by: usize,
    writes: Vec<Write>,
}

/// Bytes crossing a path: nothing moves until `starts_at`, then `remaining` bytes at `rate`.
struct Flow {
    path: Path,
    starts_at: f64,
    started: bool,
    remaining: f64,
    rate: f64,
    /// Streams whose running work waits for this flow.
    holds: Vec<usize>,
}

struct Stream {
    queue: VecDeque<Op>,
    running: Option<Running>,
    /// When the stream last finished an operation.
    idle_since: f64,
}

#[derive(Default)]
struct Gate {
    started: Option<f64>,
    /// When the spinning kernel sees the flag (release time + one poll).
    opens_at: Option<f64>,
}

/// Events or gates, each in a slot that is reused once nothing names it any more: neither the host
/// (its handle) nor an operation queued or running (a record, a wait, a spin). Without reuse a long
/// run would grow by a slot per recorded event.
struct Slots<T> {
    /// Each slot's item and how many still name it.
    slots: Vec<(T, usize)>,
    free: Vec<usize>,
}

impl<T: Default> Slots<T> {
    /// A fresh slot, named by the host's handle.
    fn add(&mut self) -> usize {
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot].1 = 1;
                slot
            }
            None => {
                self.slots.push((T::default(), 1));
                self.slots.len() - 1
            }
        }
    }

    fn get(&self, slot: usize) -> &T {
        &self.slots[slot].0
    }

    fn get_mut(&mut self, slot: usize) -> &mut T {
        &mut self.slots[slot].0
    }

    /// One more name for the slot.
    fn retain(&mut self, slot: usize) {
        self.slots[slot].1 += 1;
    }

    /// One name fewer; the last one frees the slot.
    fn release(&mut self, slot: usize) {
        let (item, names) = &mut self.slots[slot];
        *names -= 1;
        if *names == 0 {
            *item = T::default();
            self.free.push(slot);
        }
    }

    /// Slots in use (for tests of the reuse).
    #[cfg(test)]
    fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

/// The arrivals at one venue.
#[derive(Default)]
struct VenueState {
    /// Parts of each rank that have arrived so far.
    arrived: Vec<u64>,
    /// Gatherings still waiting for some rank, by number: the stream of each rank present and
    /// when it arrived.
    open: BTreeMap<u64, Vec<Option<(usize, f64)>>>,
}

#[derive(Default)]
pub(super) struct Scheduler {
    now: f64,
    capacity: Vec<f64>,
    streams: Vec<Stream>,
    /// Streams with work queued or running, in index order: each step only looks at these.
    active: Vec<usize>,
    flows: Vec<Flow>,
    /// Completion time of each recorded event, once known.
    events: Slots<Option<f64>>,
    gates: Slots<Gate>,
    venues: BTreeMap<Venue, VenueState>,
    rates_stale: bool,
    next_reader: u64,
    /// A kernel fault (as CUDA's sticky errors), reported at the next synchronisation.
    fault: Option<String>,
    /// Bytes that crossed each resource so far (the simulated counters rise with them).
    moved: Vec<f64>,
}

impl Scheduler {
    pub fn new(capacity: Vec<f64>) -> Scheduler {
        Scheduler {
            moved: vec![0.0; capacity.len()],
            capacity,
            ..Scheduler::default()
        }
    }

    pub fn add_stream(&mut self) -> usize {
        self.streams.push(Stream {
            queue: VecDeque::new(),
            running: None,
            idle_since: 0.0,
        });
        self.streams.len() - 1
    }

    pub fn add_event(&mut self) -> usize {
        self.events.add()
    }

    pub fn event_time(&self, event: usize) -> Option<f64> {
        *self.events.get(event)
    }

    /// The host lets go of an event; its slot is reused once no queued work names it either.
    pub fn destroy_event(&mut self, event: usize) {
        self.events.release(event);
    }

    pub fn add_gate(&mut self) -> usize {
        self.gates.add()
    }

    /// The host releases a gate: it opens at `at`, and its slot is reused once the spin has ended.
    pub fn open_gate(&mut self, gate: usize, at: f64) {
        self.gates.get_mut(gate).opens_at.get_or_insert(at);
        self.gates.release(gate);
    }

    pub fn fault(&self) -> Option<&str> {
        self.fault.as_deref()
    }

    /// Queues work on a stream; it starts no earlier than `ready_at` (the host clock when issued).
    pub fn enqueue(&mut self, stream: usize, ready_at: f64, work: Work) {
        match work {
            Work::Record(e) | Work::Wait(e) => self.events.retain(e),
            Work::Gate(g) => self.gates.retain(g),
            _ => {}
        }
        self.streams[stream].queue.push_back(Op { ready_at, work });
        if let Err(at) = self.active.binary_search(&stream) {
            self.active.insert(at, stream);
        }
    }

    /// Simulates everything that happens up to time `t` (inclusive).
    /// After a stop request it stops at once: the work still queued is abandoned.
    pub fn advance_to(&mut self, t: f64, store: &mut Store) {
        while !crate::interrupt::requested() && self.step(t, store) {}
    }

    /// Simulates until `stream` has nothing left to do; returns when it became idle.
    pub fn run_until_idle(&mut self, stream: usize, store: &mut Store) -> Result<f64> {
        let idle = |e: &Scheduler| {
            let s = &e.streams[stream];
            s.running.is_none() && s.queue.is_empty()
        };
        self.run_until(store, idle)?;
        Ok(self.streams[stream].idle_since)
    }

    /// Simulates until `event` completes; returns its time.
    pub fn run_until_event(&mut self, event: usize, store: &mut Store) -> Result<f64> {
        self.run_until(store, |e| e.event_time(event).is_some())?;
        Ok(self.event_time(event).expect("run_until stopped on it"))
    }

    fn run_until(&mut self, store: &mut Store, done: impl Fn(&Scheduler) -> bool) -> Result<()> {
        loop {
            self.start_ready(store);
            if done(self) {
                return Ok(());
            }
            // A stop ends the wait at once: virtual time costs real time (a copy moves its
            // bytes), and a long queue takes seconds. What is queued stays there, abandoned.
            crate::interrupt::check()?;
            if !self.step(f64::INFINITY, store) {
                return Err(Error::InvalidHandle(
                    "the simulated streams wait on each other forever (a ping-pong or collective \
                     whose other ranks never arrive, or an event that is never reached); a real \
                     GPU would hang"
                        .into(),
                ));
            }
        }
    }

    /// Processes the next thing that happens, if it happens no later than `limit`; otherwise moves
    /// the clock to `limit` (when finite) and returns false.
    fn step(&mut self, limit: f64, store: &mut Store) -> bool {
        self.start_ready(store);
        if self.rates_stale {
            self.share_rates();
        }
        match self.next_time() {
            Some(t) if t <= limit => {
                self.advance_flows(t);
                self.finish_due(store);
                true
            }
            _ => {
                if limit.is_finite() && limit > self.now {
                    self.advance_flows(limit);
                }
                false
            }
        }
    }

    /// Starts the head operation of every idle stream whose turn has come, until nothing changes
    /// (an event recorded on one stream can release a wait on another).
    fn start_ready(&mut self, store: &mut Store) {
        loop {
            let mut progressed = false;
            for i in 0..self.active.len() {
                let s = self.active[i];
                while self.streams[s].running.is_none() {
                    let Some(head) = self.streams[s].queue.front() else {
                        break;
                    };
                    let blocked = match head.work {
                        Work::Wait(e) => self.event_time(e).is_none(),
                        _ => false,
                    };
                    if head.ready_at > self.now || blocked {
                        break;
                    }
                    let op = self.streams[s].queue.pop_front().expect("front exists");
                    self.start(s, op.work, store);
                    progressed = true;
                }
            }
            if !progressed {
                self.forget_idle();
                return;
            }
        }
    }

    /// Drops streams with nothing queued or running from the active list.
    fn forget_idle(&mut self) {
        let streams = &self.streams;
        self.active
            .retain(|&s| streams[s].running.is_some() || !streams[s].queue.is_empty());
    }

    fn running(&mut self, s: usize) -> &mut Running {
        self.streams[s]
            .running
            .as_mut()
            .expect("the stream runs work")
    }

    /// Registers a copy's read of its source, which the store keeps as it is now.
    fn begin_read(&mut self, store: &mut Store, copy: &BufferCopy<Key>) -> Write {
        self.next_reader += 1;
        store.begin_read(self.next_reader, copy.src, copy.src_offset, copy.len);
        Write::Copy {
            reader: self.next_reader,
            copy: *copy,
        }
    }

    fn start(&mut self, s: usize, work: Work, store: &mut Store) {
        let now = self.now;
        let mut writes = Vec::new();
        let mut held_by = 0;
        match &work {
            Work::Record(e) => *self.events.get_mut(*e) = Some(now),
            Work::Copy {
                copies,
                path,
                setup_us,
            } => {
                writes = copies.iter().map(|c| self.begin_read(store, c)).collect();
                let bytes = copies.iter().map(|c| c.len).sum();
                held_by = self.start_flow(s, path, bytes, *setup_us);
            }
            Work::Migrate {
                bytes,
                path,
                setup_us,
                ..
            } => held_by = self.start_flow(s, path, *bytes, *setup_us),
            Work::Chase {
                chain,
                steps,
                result,
                ..
            } => {
                let index = self.chase(store, *chain, *steps);
                writes.push(Write::bytes(*result, index.to_le_bytes().to_vec()));
            }
            Work::PingPong {
                writes: flag,
                rounds,
                ..
            } => writes.push(Write::bytes(*flag, rounds.to_le_bytes().to_vec())),
            Work::Busy { .. } | Work::Gate(_) | Work::Wait(_) | Work::Part { .. } => {}
        }
        self.streams[s].running = Some(Running {
            work,
            phase: Phase::Until(now),
            next_step: 0,
            held_by,
            writes,
        });
        self.enter_next_step(s, store);
    }

    /// Starts the flow of stream `s`'s work: `bytes` over `path` after `setup_us` and the path's
    /// latency. Returns how many flows now hold the work (one).
    fn start_flow(&mut self, s: usize, path: &Path, bytes: usize, setup_us: f64) -> usize {
        let starts_at = self.now + setup_us + path.latency_us;
        self.flows
            .push(Flow::new(path.clone(), bytes, starts_at, vec![s]));
        1
    }

    /// Moves a stream's running work on to its next step, or ends it after its last.
    fn enter_next_step(&mut self, s: usize, store: &mut Store) {
        let now = self.now;
        let r = self.running(s);
        let step = r.work.step(r.next_step);
        r.next_step += 1;
        match step {
            None => self.finish(s, store),
            Some(Step::Delay { setup_us, run_us }) => {
                r.phase = Phase::Until(now + setup_us + run_us)
            }
            Some(Step::Move) => r.phase = Phase::Moving,
            Some(Step::Gate(g)) => {
                r.phase = Phase::Gate(g);
                self.gates.get_mut(g).started = Some(now);
            }
            Some(Step::Meet(meeting)) => {
                r.phase = Phase::Meeting;
                self.arrive(s, meeting, store);
            }
        }
    }

    /// A part arrives at its venue; the last rank to arrive moves its whole gathering on.
    fn arrive(&mut self, s: usize, meeting: Meeting, store: &mut Store) {
        let venue = self.venues.entry(meeting.venue).or_default();
        let slots = meeting.ranks.max(meeting.rank + 1);
        if venue.arrived.len() < slots {
            venue.arrived.resize(slots, 0);
        }
        let gathering = venue.arrived[meeting.rank];
        venue.arrived[meeting.rank] += 1;
        let present = venue
            .open
            .entry(gathering)
            .or_insert_with(|| vec![None; slots]);
        if present.len() < slots {
            present.resize(slots, None);
        }
        present[meeting.rank] = Some((s, self.now));
        if present.iter().filter(|p| p.is_some()).count() < meeting.ranks {
            return;
        }
        let arrivals: Vec<(usize, f64)> = venue
            .open
            .remove(&gathering)
            .expect("found above")
            .into_iter()
            .flatten()
            .collect();
        let members: Vec<usize> = arrivals.iter().map(|&(s, _)| s).collect();
        // With no gathering open, every rank has arrived equally often: counting afresh pairs the
        // next arrivals the same way, and a long run keeps no state per venue it has used.
        if venue.open.is_empty() {
            self.venues.remove(&meeting.venue);
        }
        if let Work::Part { collective, .. } = &self.running(members[0]).work {
            let collective = Arc::clone(collective);
            self.trap_late_meeting(&collective, &arrivals);
            self.start_collective(&collective, &members, store);
        }
        for m in members {
            self.enter_next_step(m, store);
        }
    }

    /// Faults the GPUs, as a kernel's trap does, where a rank of `c` waited at its meeting for
    /// longer than the collective's wait limit (`arrivals`: each rank's stream and arrival time).
    fn trap_late_meeting(&mut self, c: &Collective, arrivals: &[(usize, f64)]) {
        let Some(limit_us) = c.wait_limit_us else {
            return;
        };
        let first = arrivals
            .iter()
            .map(|&(_, at)| at)
            .fold(f64::INFINITY, f64::min);
        self.trap_if_late(self.now - first, limit_us);
    }

    /// Faults the GPUs, as an all-reduce kernel's trap does, where it waited `waited_us` for a
    /// peer, longer than `limit_us`.
    pub fn trap_if_late(&mut self, waited_us: f64, limit_us: f64) {
        if waited_us > limit_us {
            self.fault.get_or_insert_with(|| {
                format!(
                    "an all-reduce kernel waited {:.1} s for a peer's kernel, longer than its \
                     {:.0} s limit, and trapped (simulated; a GPU's context reports this error \
                     to every later call): wait without a limit, with a release word the host \
                     raises where a peer is lost",
                    waited_us / 1e6,
                    limit_us / 1e6
                )
            });
        }
    }

    /// Starts a collective whose ranks (`members[rank]` is each one's stream) have all met: its
    /// flows, and its results as the buffers are now.
    fn start_collective(&mut self, c: &Collective, members: &[usize], store: &mut Store) {
        let now = self.now;
        for f in &c.flows {
            let holds: Vec<usize> = f.holds.iter().map(|&rank| members[rank]).collect();
            for &s in &holds {
                self.running(s).held_by += 1;
            }
            let starts_at = now + f.latency_us;
            self.flows
                .push(Flow::new(f.path.clone(), f.bytes, starts_at, holds));
        }
        match &c.results {
            Results::Reduced {
                dtype,
                op,
                inputs,
                outputs,
                len,
            } => {
                let inputs: Vec<_> = inputs.iter().map(|&k| store.bytes(k, 0, *len)).collect();
                let inputs: Vec<&[u8]> = inputs.iter().map(|bytes| &bytes[..]).collect();
                let sum = Arc::new(reduce::reduce(*dtype, *op, &inputs));
                for (&s, &output) in members.iter().zip(outputs) {
                    let bytes = Arc::clone(&sum);
                    self.running(s).writes.push(Write::Bytes {
                        dst: output,
                        offset: 0,
                        bytes,
                    });
                }
            }
            Results::Copies(copies) => {
                for (rank, copy) in copies {
                    let write = self.begin_read(store, copy);
                    self.running(members[*rank]).writes.push(write);
                }
            }
        }
    }

    /// Ends a stream's running work: its writes land and its buffers are released.
    fn finish(&mut self, s: usize, store: &mut Store) {
        let r = self.streams[s]
            .running
            .take()
            .expect("the stream runs work");
        for write in r.writes {
            match write {
                Write::Copy { reader, copy } => store.finish_copy(reader, &copy),
                Write::Bytes { dst, offset, bytes } => store.write(dst, offset, &bytes),
            }
        }
        store.release(&r.work.buffers());
        match r.work {
            Work::Record(e) | Work::Wait(e) => self.events.release(e),
            Work::Gate(g) => self.gates.release(g),
            _ => {}
        }
        self.streams[s].idle_since = self.now;
    }

    /// Follows the chain of u64 indices from element 0; a wild index faults the kernel.
    fn chase(&mut self, store: &Store, chain: Key, steps: u32) -> u64 {
        let bytes = store.bytes(chain, 0, store.get(chain).len());
        let elements = bytes.len() / 8;
        let entry = |i: usize| {
            let at = i * 8;
            u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
        };
        // On a chain walked more often than it has elements, skip whole laps of its cycle.
        let mut first_visit = if steps as usize > elements {
            vec![u32::MAX; elements]
        } else {
            Vec::new()
        };
        let mut index = 0usize;
        let mut step = 0u32;
        while step < steps {
            if let Some(seen) = first_visit.get_mut(index) {
                if *seen != u32::MAX {
                    let lap = step - *seen;
                    step = steps - (steps - step) % lap;
                    first_visit = Vec::new();
                    continue;
                }
                *seen = step;
            }
            let next = entry(index);
            if next >= elements as u64 {
                self.fault.get_or_insert_with(|| {
                    format!(
                        "pointer chase: element {index} of the chain holds {next}, outside its \
                         {elements} elements (a real kernel would fault with an illegal address)"
                    )
                });
                return index as u64;
            }
            index = next as usize;
            step += 1;
        }
        index as u64
    }

    /// Rates of all flows in flight, max-min fair; a flow that slows beside other traffic
    /// ([`super::links::Beside`]) is capped while that traffic moves (by the product of the
    /// fractions of every slowdown whose traffic moves).
    fn share_rates(&mut self) {
        let moving = |f: &&Flow| f.started;
        let crossed: std::collections::HashSet<usize> = self
            .flows
            .iter()
            .filter(moving)
            .flat_map(|f| f.path.resources.iter().copied())
            .collect();
        let capacity = &self.capacity;
        let cap = |path: &Path| {
            let fraction: f64 = path
                .beside
                .iter()
                .filter(|beside| beside.busy.iter().any(|r| crossed.contains(r)))
                .map(|beside| beside.fraction)
                .product();
            if fraction >= 1.0 {
                return path.cap;
            }
            let narrowest = path
                .resources
                .iter()
                .map(|&r| capacity[r])
                .fold(path.cap, f64::min);
            path.cap.min(fraction * narrowest)
        };
        let demands: Vec<Demand<'_>> = self
            .flows
            .iter()
            .filter(moving)
            .map(|f| Demand {
                resources: &f.path.resources,
                cap: cap(&f.path),
            })
            .collect();
        let rates = max_min_rates(&self.capacity, &demands);
        for (flow, rate) in self.flows.iter_mut().filter(|f| f.started).zip(rates) {
            flow.rate = rate;
        }
        self.rates_stale = false;
    }

    /// The earliest time something happens, if anything will.
    fn next_time(&self) -> Option<f64> {
        let mut next = f64::INFINITY;
        for f in &self.flows {
            next = next.min(f.next_event(self.now));
        }
        for s in self.active.iter().map(|&s| &self.streams[s]) {
            let t = match &s.running {
                Some(r) => match r.phase {
                    Phase::Until(until) => until,
                    Phase::Gate(g) => self.gate_end(g),
                    Phase::Moving if r.held_by == 0 => self.now,
                    Phase::Moving | Phase::Meeting => f64::INFINITY,
                },
                None => match s.queue.front() {
                    Some(op) if op.ready_at > self.now => op.ready_at,
                    _ => f64::INFINITY,
                },
            };
            next = next.min(t);
        }
        next.is_finite().then_some(next)
    }

    fn gate_end(&self, gate: usize) -> f64 {
        let g = self.gates.get(gate);
        let started = g.started.expect("a running gate has started");
        let timeout = started + HOLD_TIMEOUT_US;
        g.opens_at
            .map_or(timeout, |open| open.max(started).min(timeout))
    }

    /// Moves the clock to `t`, moving every flow's bytes at its current rate.
    fn advance_flows(&mut self, t: f64) {
        let dt = t - self.now;
        for f in self.flows.iter_mut().filter(|f| f.started) {
            let bytes = f.rate * dt;
            f.remaining -= bytes;
            for &r in &f.path.resources {
                self.moved[r] += bytes;
            }
        }
        self.now = t;
    }

    /// Bytes that crossed resource `r` up to the scheduler's present.
    pub fn moved(&self, r: usize) -> f64 {
        self.moved[r]
    }

    /// Starts and ends every flow due at the current time, then moves on every stream whose step
    /// is over.
    fn finish_due(&mut self, store: &mut Store) {
        let now = self.now;
        let mut released = Vec::new();
        let mut changed = false;
        self.flows.retain_mut(|f| {
            if !f.started && f.starts_at <= now {
                f.started = true;
                changed = true;
            }
            if f.started && f.is_done(now) {
                released.append(&mut f.holds);
                changed = true;
                return false;
            }
            true
        });
        self.rates_stale |= changed;
        for s in released {
            self.running(s).held_by -= 1;
        }
        for i in 0..self.active.len() {
            // Finishing a copy moves its bytes (256 MiB take a tenth of a second): after a stop
            // request the streams left stay due, consistent, and nothing waits for them.
            if crate::interrupt::requested() {
                break;
            }
            let s = self.active[i];
            let due = match &self.streams[s].running {
                None => false,
                Some(r) => match r.phase {
                    Phase::Until(until) => until <= now,
                    Phase::Gate(g) => self.gate_end(g) <= now,
                    Phase::Moving => r.held_by == 0,
                    Phase::Meeting => false,
                },
            };
            if due {
                self.enter_next_step(s, store);
            }
        }
        self.forget_idle();
    }
}

impl Flow {
    fn new(path: Path, bytes: usize, starts_at: f64, holds: Vec<usize>) -> Flow {
        Flow {
            path,
            starts_at,
            started: false,
            remaining: bytes as f64,
            rate: 0.0,
            holds,
        }
    }

    /// Whether the flow's bytes are in. The second test guarantees progress when `now` is so large
    /// that the last bytes would take less than one unit in the last place.
    fn is_done(&self, now: f64) -> bool {
        self.remaining <= DONE_BYTES || now + self.remaining / self.rate <= now
    }

    /// When the flow next starts or ends.
    fn next_event(&self, now: f64) -> f64 {
        if !self.started {
            self.starts_at
        } else if self.remaining <= DONE_BYTES {
            now
        } else {
            now + self.remaining / self.rate
        }
    }
}

impl Write {
    fn bytes(dst: Key, bytes: Vec<u8>) -> Write {
        Write::Bytes {
            dst,
            offset: 0,
            bytes: Arc::new(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Memory;

    #[test]
    fn event_slots_are_reused_once_recorded_and_destroyed() {
        let (mut s, mut store) = (Scheduler::new(Vec::new()), Store::new());
        let stream = s.add_stream();
        for _ in 0..1000 {
            let e = s.add_event();
            s.enqueue(stream, s.now, Work::Record(e));
            s.destroy_event(e);
            s.run_until_idle(stream, &mut store).unwrap();
        }
        assert_eq!(s.events.live(), 0);
        assert_eq!(s.events.slots.len(), 1, "one slot, used a thousand times");
    }

    #[test]
    fn a_destroyed_event_keeps_its_slot_while_work_still_names_it() {
        let (mut s, mut store) = (Scheduler::new(Vec::new()), Store::new());
        let (recorder, waiter) = (s.add_stream(), s.add_stream());
        let e = s.add_event();
        s.enqueue(recorder, 5.0, Work::Record(e));
        s.enqueue(waiter, 0.0, Work::Wait(e));
        s.destroy_event(e);
        s.advance_to(1.0, &mut store);
        let next = s.add_event();
        assert_ne!(next, e, "the record and the wait still name the slot");
        s.run_until_idle(waiter, &mut store).unwrap();
        assert_eq!(s.event_time(next), None, "a fresh slot is not recorded");
        assert_eq!(s.events.live(), 1, "only the fresh event");
    }

    #[test]
    fn a_gate_slot_is_reused_after_its_release_and_its_spin() {
        let (mut s, mut store) = (Scheduler::new(Vec::new()), Store::new());
        let stream = s.add_stream();
        let g = s.add_gate();
        s.enqueue(stream, 0.0, Work::Gate(g));
        s.advance_to(1.0, &mut store);
        s.open_gate(g, 2.0);
        assert_eq!(s.gates.live(), 1, "the spin still runs");
        s.run_until_idle(stream, &mut store).unwrap();
        assert_eq!(s.gates.live(), 0);
        assert_eq!(s.add_gate(), g);
    }

    #[test]
    fn a_venue_is_forgotten_once_no_gathering_is_open() {
        let (mut s, mut store) = (Scheduler::new(Vec::new()), Store::new());
        let streams = [s.add_stream(), s.add_stream()];
        let flags = [
            store.insert(Memory::Device(0), 4).unwrap(),
            store.insert(Memory::Device(1), 4).unwrap(),
        ];
        for round in 0..3 {
            for rank in 0..2 {
                let work = Work::PingPong {
                    meeting: Meeting {
                        venue: Venue::Comm(7),
                        rank,
                        ranks: 2,
                    },
                    writes: flags[1 - rank],
                    rounds: 1,
                    one_way_us: 1.0,
                    setup_us: 0.0,
                };
                store.retain(&work.buffers());
                s.enqueue(streams[rank], f64::from(round), work);
            }
        }
        s.run_until_idle(streams[0], &mut store).unwrap();
        s.run_until_idle(streams[1], &mut store).unwrap();
        assert!(s.venues.is_empty(), "every gathering met");
    }
}
