//! The discrete-event core: in-order streams of operations on a virtual GPU clock.
//!
//! Each stream runs one operation at a time. A copy first waits out its fixed latency (setup and
//! path), then becomes a flow whose rate comes from max-min fair sharing with every other flow in
//! flight; rates are recomputed whenever a flow starts or ends. The host side (the backend) only
//! enqueues operations that start at or after its own clock, and the simulation never runs past a
//! time the host has not reached unless the host blocks on it, so the simulation never rewinds.

use super::links::Path;
use super::memory::{Key, Store};
use super::sharing::{max_min_rates, Demand};
use crate::backend::BufferCopy;
use crate::{Error, Result};
use std::collections::{BTreeMap, VecDeque};

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
    /// Follows `steps` dependent loads through `chain`, then stores the index reached in `result`.
    Chase {
        chain: Key,
        steps: u32,
        result: Key,
        setup_us: f64,
        step_us: f64,
    },
    /// Blocks the stream until the gate opens (or its spin times out).
    Gate(usize),
    Record(usize),
    Wait(usize),
    /// One side of a ping-pong: both sides start together, then exchange `rounds` round trips.
    PingPong {
        rendezvous: u64,
        is_ping: bool,
        /// The flag this side stores into (on the other GPU).
        writes: Key,
        rounds: u32,
        one_way_us: f64,
        setup_us: f64,
    },
}

impl Work {
    /// The buffers this work touches (they cannot be freed while it is queued).
    pub fn buffers(&self) -> Vec<Key> {
        match self {
            Work::Copy { copies, .. } => copies.iter().flat_map(|c| [c.src, c.dst]).collect(),
            Work::Chase { chain, result, .. } => vec![*chain, *result],
            Work::PingPong { writes, .. } => vec![*writes],
            Work::Gate(_) | Work::Record(_) | Work::Wait(_) => Vec::new(),
        }
    }

    /// The same work with another fixed GPU overhead (a graph node's instead of a stream op's).
    pub fn with_setup(mut self, overhead_us: f64) -> Work {
        match &mut self {
            Work::Copy { setup_us, .. }
            | Work::Chase { setup_us, .. }
            | Work::PingPong { setup_us, .. } => *setup_us = overhead_us,
            Work::Gate(_) | Work::Record(_) | Work::Wait(_) => {}
        }
        self
    }
}

struct Op {
    ready_at: f64,
    work: Work,
}

enum Phase {
    /// Nothing moves until this time.
    Delay(f64),
    Flow {
        remaining: f64,
        rate: f64,
    },
    Gate(usize),
    /// Waiting for the other side of a ping-pong to start.
    Partner,
}

struct Running {
    work: Work,
    phase: Phase,
    /// The store's reader id of a copy operation's first copy (the others follow in order).
    op_id: u64,
    /// A store to make when the operation ends (a kernel's result or flag).
    store: Option<(Key, Vec<u8>)>,
}

struct Stream {
    queue: VecDeque<Op>,
    running: Option<Running>,
    /// When the stream last finished an operation.
    idle_since: f64,
}

struct Gate {
    started: Option<f64>,
    /// When the spinning kernel sees the flag (release time + one poll).
    opens_at: Option<f64>,
}

#[derive(Default)]
pub(super) struct Scheduler {
    now: f64,
    capacity: Vec<f64>,
    streams: Vec<Stream>,
    /// Streams with work queued or running, in index order: each step only looks at these.
    active: Vec<usize>,
    /// Completion time of each recorded event, once known.
    events: Vec<Option<f64>>,
    gates: Vec<Gate>,
    /// Ping-pong sides already started, waiting for their partner: the stream of each.
    rendezvous: BTreeMap<u64, usize>,
    rates_stale: bool,
    next_op_id: u64,
    /// A kernel fault (as CUDA's sticky errors), reported at the next synchronisation.
    fault: Option<String>,
}

impl Scheduler {
    pub fn new(capacity: Vec<f64>) -> Scheduler {
        Scheduler {
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
        self.events.push(None);
        self.events.len() - 1
    }

    pub fn event_time(&self, event: usize) -> Option<f64> {
        self.events[event]
    }

    pub fn add_gate(&mut self) -> usize {
        self.gates.push(Gate {
            started: None,
            opens_at: None,
        });
        self.gates.len() - 1
    }

    pub fn open_gate(&mut self, gate: usize, at: f64) {
        let g = &mut self.gates[gate];
        g.opens_at.get_or_insert(at);
    }

    pub fn fault(&self) -> Option<&str> {
        self.fault.as_deref()
    }

    /// Queues work on a stream; it starts no earlier than `ready_at` (the host clock when issued).
    pub fn enqueue(&mut self, stream: usize, ready_at: f64, work: Work) {
        self.streams[stream].queue.push_back(Op { ready_at, work });
        if let Err(at) = self.active.binary_search(&stream) {
            self.active.insert(at, stream);
        }
    }

    /// Simulates everything that happens up to time `t` (inclusive).
    pub fn advance_to(&mut self, t: f64, store: &mut Store) {
        while self.step(t, store) {}
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
        self.run_until(store, |e| e.events[event].is_some())?;
        Ok(self.events[event].expect("run_until stopped on it"))
    }

    fn run_until(&mut self, store: &mut Store, done: impl Fn(&Scheduler) -> bool) -> Result<()> {
        loop {
            self.start_ready(store);
            if done(self) {
                return Ok(());
            }
            if !self.step(f64::INFINITY, store) {
                return Err(Error::InvalidHandle(
                    "the simulated streams wait on each other forever (a ping-pong whose partner \
                     stream waits on it, or an event that is never reached); a real GPU would hang"
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
                        Work::Wait(e) => self.events[e].is_none(),
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

    fn start(&mut self, s: usize, work: Work, store: &mut Store) {
        let now = self.now;
        let phase = match &work {
            Work::Record(e) => {
                self.events[*e] = Some(now);
                self.streams[s].idle_since = now;
                return;
            }
            Work::Wait(_) => {
                self.streams[s].idle_since = now;
                return;
            }
            Work::Copy {
                copies,
                path,
                setup_us,
            } => {
                // One reader id per copy, so that each finds its own saved source bytes.
                for copy in copies {
                    self.next_op_id += 1;
                    store.begin_read(self.next_op_id, copy.src, copy.src_offset, copy.len);
                }
                Phase::Delay(now + setup_us + path.latency_us)
            }
            Work::Chase {
                steps,
                setup_us,
                step_us,
                ..
            } => Phase::Delay(now + setup_us + *steps as f64 * step_us),
            Work::Gate(g) => {
                self.gates[*g].started = Some(now);
                Phase::Gate(*g)
            }
            Work::PingPong { rendezvous, .. } => match self.rendezvous.remove(rendezvous) {
                None => {
                    self.rendezvous.insert(*rendezvous, s);
                    Phase::Partner
                }
                Some(partner) => {
                    // Both sides exchange from now on, when the later one has started.
                    if let Some(r) = &mut self.streams[partner].running {
                        r.phase = Phase::Delay(ping_pong_end_of(&r.work, now));
                    }
                    Phase::Delay(ping_pong_end_of(&work, now))
                }
            },
        };
        let store_on_end = match &work {
            Work::Chase {
                chain,
                steps,
                result,
                ..
            } => Some((
                *result,
                self.chase(store, *chain, *steps).to_le_bytes().to_vec(),
            )),
            Work::PingPong { writes, rounds, .. } => Some((*writes, rounds.to_le_bytes().to_vec())),
            _ => None,
        };
        let first_op_id = match &work {
            Work::Copy { copies, .. } => self.next_op_id + 1 - copies.len() as u64,
            _ => self.next_op_id,
        };
        self.streams[s].running = Some(Running {
            work,
            phase,
            op_id: first_op_id,
            store: store_on_end,
        });
    }

    /// Follows the chain of u64 indices from element 0; a wild index faults the kernel.
    fn chase(&mut self, store: &Store, chain: Key, steps: u32) -> u64 {
        let bytes = store.bytes(chain);
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

    /// Rates of all flows in flight, max-min fair.
    fn share_rates(&mut self) {
        let flows: Vec<usize> = self
            .active
            .iter()
            .copied()
            .filter(|&s| {
                matches!(
                    self.streams[s].running,
                    Some(Running {
                        phase: Phase::Flow { .. },
                        ..
                    })
                )
            })
            .collect();
        let demands: Vec<Demand<'_>> = flows
            .iter()
            .map(
                |&s| match &self.streams[s].running.as_ref().expect("flow").work {
                    Work::Copy { path, .. } => Demand {
                        resources: &path.resources,
                        cap: path.cap,
                    },
                    _ => unreachable!("only copies flow"),
                },
            )
            .collect();
        let rates = max_min_rates(&self.capacity, &demands);
        for (&s, new_rate) in flows.iter().zip(rates) {
            if let Some(Running {
                phase: Phase::Flow { rate, .. },
                ..
            }) = &mut self.streams[s].running
            {
                *rate = new_rate;
            }
        }
        self.rates_stale = false;
    }

    /// The earliest time something happens, if anything will.
    fn next_time(&self) -> Option<f64> {
        let mut next = f64::INFINITY;
        for s in self.active.iter().map(|&s| &self.streams[s]) {
            let t = match &s.running {
                Some(r) => match r.phase {
                    Phase::Delay(until) => until,
                    Phase::Flow { remaining, rate } => self.now + remaining / rate,
                    Phase::Gate(g) => self.gate_end(g),
                    Phase::Partner => f64::INFINITY,
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
        let g = &self.gates[gate];
        let started = g.started.expect("a running gate has started");
        let timeout = started + HOLD_TIMEOUT_US;
        g.opens_at
            .map_or(timeout, |open| open.max(started).min(timeout))
    }

    /// Moves the clock to `t`, moving every flow's bytes at its current rate.
    fn advance_flows(&mut self, t: f64) {
        let dt = t - self.now;
        for &s in &self.active {
            if let Some(Running {
                phase: Phase::Flow { remaining, rate },
                ..
            }) = &mut self.streams[s].running
            {
                *remaining -= *rate * dt;
            }
        }
        self.now = t;
    }

    /// Ends every phase that is due at the current time.
    fn finish_due(&mut self, store: &mut Store) {
        let now = self.now;
        for i in 0..self.active.len() {
            let s = self.active[i];
            let due = match &self.streams[s].running {
                None => false,
                Some(r) => match r.phase {
                    Phase::Delay(until) => until <= now,
                    // The second test guarantees progress when `now` is so large that the last
                    // bytes would take less than one unit in the last place.
                    Phase::Flow { remaining, rate } => {
                        remaining <= DONE_BYTES || now + remaining / rate <= now
                    }
                    Phase::Gate(g) => self.gate_end(g) <= now,
                    Phase::Partner => false,
                },
            };
            if !due {
                continue;
            }
            let r = self.streams[s].running.as_mut().expect("due work runs");
            if let (Phase::Delay(_), Work::Copy { copies, .. }) = (&r.phase, &r.work) {
                let bytes: usize = copies.iter().map(|c| c.len).sum();
                if bytes > 0 {
                    r.phase = Phase::Flow {
                        remaining: bytes as f64,
                        rate: 0.0,
                    };
                    self.rates_stale = true;
                    continue;
                }
            }
            if matches!(r.phase, Phase::Flow { .. }) {
                self.rates_stale = true;
            }
            let r = self.streams[s].running.take().expect("checked above");
            if let Work::Copy { copies, .. } = &r.work {
                for (op_id, copy) in (r.op_id..).zip(copies) {
                    store.finish_copy(op_id, copy);
                }
            }
            if let Some((buffer, bytes)) = &r.store {
                store.write(*buffer, 0, bytes);
            }
            store.release(&r.work.buffers());
            self.streams[s].idle_since = now;
        }
        self.forget_idle();
    }
}

/// When a ping-pong side that starts exchanging at `start` ends: the ping side after its last
/// answer arrives, the pong side after it sends the last answer.
fn ping_pong_end_of(work: &Work, start: f64) -> f64 {
    match work {
        Work::PingPong {
            is_ping,
            rounds,
            one_way_us,
            setup_us,
            ..
        } => {
            let trips = 2.0 * *rounds as f64;
            let legs = if *is_ping {
                trips
            } else {
                (trips - 1.0).max(0.0)
            };
            start + setup_us + legs * one_way_us
        }
        _ => unreachable!("only ping-pong sides have partners"),
    }
}
