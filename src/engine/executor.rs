//! Executors: queue a plan's operations on the backend's streams, ordered by events, without
//! blocking the host.
//!
//! Every transfer starts and ends on its pair's *control* stream on the source GPU: the start event
//! is recorded there (after any dependencies), the other routes' streams wait for it, and the
//! control stream waits for each route's last event before recording the end. Start and end are
//! therefore on one GPU and time the whole transfer. A transfer ordered on the caller's streams
//! ([`super::TransferBuilder::on_streams`]) takes the issuing GPU's caller stream as its control
//! stream instead: the caller's other stream is crossed once each way (a mark the transfer waits
//! for, its end that stream waits for), as PyTorch orders a copy between GPUs.
//!
//! Pipelined routes (through pinned host memory, through a relay GPU) go through a *lane*: a staging
//! buffer of [`STAGING_SLOTS`] chunks of [`MAX_CHUNK`], allocated once per (pair, route) and reused,
//! and two streams, one per hop. The buffer holds as many slots as chunks of the transfer fit (more
//! for smaller chunks, so that the first hop runs further ahead). Chunk `k` fills slot `k mod slots`
//! on the first stream, and the second stream drains it once the fill's event fires; a fill waits
//! for the drain that last used its slot. These events only order work: they are marks, which a
//! GPU waits on sooner than on timed events. The lane remembers the event of its last drain, so the
//! next transfer through it does not overwrite a slot still being read. When a split runs several
//! routes, its direct copies are queued first (one call each, so that they start at once), then the
//! pipelines' chunks in turn.

use super::plan::{PathShare, Plan, Route, Strategy, Ways};
use super::planner::{chunking, MAX_CHUNK, STAGING_SLOTS};
use crate::backend::{
    Backend, BufferCopy, BufferId, CopyMethod, EventId, Memory, StreamId, WorkerConfig, WorkerId,
};
use crate::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Why a stream exists: streams are made once per (GPU, pair, role) and reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Role {
    /// Starts, ends and orders a pair's transfers; runs direct copies and batch kernels.
    Control,
    /// The first hop of a pipelined route (filling the staging slots).
    Fill(LaneKey),
    /// The second hop (draining them). Its own stream even where both hops run on one GPU (a
    /// GPU staging to itself through the host), so that fills and drains overlap.
    Drain(LaneKey),
    /// Scatters a gathered batch on the destination.
    Scatter,
    /// Captures graphs (never runs work itself, so that other submissions are not captured).
    Capture,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct StreamKey {
    pub device: usize,
    pub src: usize,
    pub dst: usize,
    pub role: Role,
}

/// A reusable staging area: a pipelined route of one pair, or a pair's batch gathering buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum LaneKey {
    Gather { src: usize, dst: usize },
    Host { src: usize, dst: usize },
    Relay { src: usize, dst: usize, via: usize },
}

/// Staging buffers and the event after their last use.
#[derive(Default)]
pub(super) struct Lane {
    /// Staging buffers, with their sizes (one for a route: the slots; two for gathering).
    pub staging: Vec<(BufferId, usize)>,
    /// Recorded after the lane's last use; the next use waits for it before touching the buffers.
    pub idle: Option<EventId>,
}

/// Per-fabric state shared by every handle: the backend, the planner, and what is made once.
pub(super) struct Shared {
    pub backend: Arc<dyn Backend>,
    pub planner: super::Planner,
    peers: Mutex<HashSet<(usize, usize)>>,
    streams: Mutex<SmallKeyMap<StreamKey, StreamId>>,
    lanes: Mutex<HashMap<LaneKey, Arc<Mutex<Lane>>>>,
    /// Held while a graph is captured: a stream that captures must see no other submission.
    capture: Mutex<()>,
    /// Plans already made, by (source, destination, bytes, forced strategy): workloads repeat
    /// sizes, and a split's plan costs tens of microseconds of CPU to make.
    plans: Mutex<SmallKeyMap<PlanKey, Arc<Plan>>>,
    /// Resident workers, where the fabric runs them.
    resident: Option<ResidentWorkers>,
}

/// A fabric's resident workers: one per source GPU, started on its first resident transfer,
/// stopped with the fabric.
pub(super) struct ResidentWorkers {
    /// Copy blocks each worker runs with.
    copy_blocks: u32,
    running: Mutex<SmallKeyMap<usize, WorkerId>>,
}

impl ResidentWorkers {
    pub fn new(copy_blocks: u32) -> Self {
        ResidentWorkers {
            copy_blocks,
            running: Mutex::default(),
        }
    }
}

/// A transfer as the plan cache knows it: source, destination, bytes, forced strategy, and whether
/// it runs both ways.
type PlanKey = (usize, usize, u64, Option<Strategy>, Ways);

/// The maps every transfer looks up (its plan, its stream), keyed by a few small integers. FxHash:
/// with the default SipHash the two lookups were a fifth of the engine's CPU time per transfer, and
/// these keys come from the engine itself, never from anyone who could choose them to collide.
type SmallKeyMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// Plans kept per fabric; the cache starts over when full.
const CACHED_PLANS: usize = 4096;

/// Locks a mutex, ignoring poisoning: the data behind these locks stays consistent even when a
/// holder panicked (every update is a single insert or assignment).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub fn new(
        backend: Arc<dyn Backend>,
        planner: super::Planner,
        resident: Option<ResidentWorkers>,
    ) -> Shared {
        Shared {
            backend,
            planner,
            peers: Mutex::default(),
            streams: Mutex::default(),
            lanes: Mutex::default(),
            capture: Mutex::default(),
            plans: Mutex::default(),
            resident,
        }
    }

    /// The resident worker of GPU `device`, started on first use.
    pub fn worker(&self, device: usize) -> Result<WorkerId> {
        let workers = self.resident.as_ref().ok_or_else(|| {
            Error::usage(
                "this fabric runs no resident workers: open it with FabricBuilder::resident",
            )
        })?;
        let mut running = lock(&workers.running);
        if let Some(&worker) = running.get(&device) {
            return Ok(worker);
        }
        let config = WorkerConfig {
            copy_blocks: workers.copy_blocks,
            ..WorkerConfig::on(device)
        };
        let worker = self.backend.resident().start_worker(&config)?;
        running.insert(device, worker);
        Ok(worker)
    }

    /// The plan for a transfer that another process's memory limits (see
    /// [`super::Fabric::import`]): `strategy` where given and `reaches` accepts it, else the
    /// planner's fastest strategy that `reaches` accepts.
    pub fn plan_reaching(
        &self,
        (src, dst, bytes): (usize, usize, u64),
        strategy: Option<Strategy>,
        ways: Ways,
        reaches: impl Fn(&Plan) -> bool,
    ) -> Result<Arc<Plan>> {
        let refused = |what: &str| {
            Error::usage(format!(
                "{what} reach another process's memory from GPU {src} to GPU {dst}: an import is \
                 reached only from the GPU it was imported for (a direct copy issued there, or, \
                 where it is imported for its own GPU, the host and relay routes that touch it \
                 there)"
            ))
        };
        if let Some(s) = strategy {
            let plan = self.plan(src, dst, bytes, Some(s), ways)?;
            return match reaches(&plan) {
                true => Ok(plan),
                false => Err(refused(&format!("{} cannot", s.name()))),
            };
        }
        let auto = self.plan(src, dst, bytes, None, ways)?;
        if reaches(&auto) {
            return Ok(auto);
        }
        // Alternatives are listed fastest first.
        for &(s, _) in &auto.alternatives {
            let plan = self.plan(src, dst, bytes, Some(s), ways)?;
            if reaches(&plan) {
                return Ok(plan);
            }
        }
        Err(refused("no strategy can"))
    }

    /// The planner's plan for a transfer (its pick, or `strategy` where given) that runs as
    /// `ways` says, made once per (pair, size, strategy, ways).
    pub fn plan(
        &self,
        src: usize,
        dst: usize,
        bytes: u64,
        strategy: Option<Strategy>,
        ways: Ways,
    ) -> Result<Arc<Plan>> {
        let key = (src, dst, bytes, strategy, ways);
        if let Some(plan) = lock(&self.plans).get(&key) {
            return Ok(plan.clone());
        }
        let plan = Arc::new(match strategy {
            Some(s) => self.planner.plan_with_ways(s, src, dst, bytes, ways)?,
            None => self.planner.plan_ways(src, dst, bytes, ways)?,
        });
        let mut plans = lock(&self.plans);
        if plans.len() >= CACHED_PLANS {
            plans.clear();
        }
        plans.insert(key, plan.clone());
        Ok(plan)
    }

    pub fn capture_lock(&self) -> &Mutex<()> {
        &self.capture
    }

    /// Lets `device` reach `peer`'s memory; asks the backend once per ordered pair.
    pub fn ensure_peer(&self, device: usize, peer: usize) -> Result<()> {
        if device == peer {
            return Ok(());
        }
        let mut peers = lock(&self.peers);
        if !peers.contains(&(device, peer)) {
            self.backend.enable_peer_access(device, peer)?;
            peers.insert((device, peer));
        }
        Ok(())
    }

    pub fn stream(&self, key: StreamKey) -> Result<StreamId> {
        let mut streams = lock(&self.streams);
        if let Some(&s) = streams.get(&key) {
            return Ok(s);
        }
        let s = self.backend.create_stream(key.device)?;
        streams.insert(key, s);
        Ok(s)
    }

    pub fn lane(&self, key: LaneKey) -> Arc<Mutex<Lane>> {
        lock(&self.lanes).entry(key).or_default().clone()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Nothing else holds the fabric now. The workers stop first (each finishes what it was
        // given; streams waiting on them go on); then wait for each lane's last use, free its
        // buffers; then the streams, whose queued work still runs.
        if let Some(workers) = &self.resident {
            for &worker in lock(&workers.running).values() {
                let _ = self.backend.resident().stop_worker(worker);
            }
        }
        for lane in lock(&self.lanes).values() {
            let lane = lock(lane);
            if let Some(idle) = lane.idle {
                let _ = self.backend.event_synchronize(idle);
                let _ = self.backend.destroy_event(idle);
            }
            for &(buffer, _) in &lane.staging {
                let _ = self.backend.free(buffer);
            }
        }
        for &stream in lock(&self.streams).values() {
            let _ = self.backend.destroy_stream(stream);
        }
    }
}

/// The lanes a submission uses, locked in one global order so that concurrent submissions cannot
/// deadlock.
pub(super) struct LockedLanes {
    keys: Vec<LaneKey>,
    arcs: Vec<Arc<Mutex<Lane>>>,
}

impl LockedLanes {
    pub fn new(shared: &Shared, mut keys: Vec<LaneKey>) -> LockedLanes {
        keys.sort_unstable();
        keys.dedup();
        let arcs = keys.iter().map(|&k| shared.lane(k)).collect();
        LockedLanes { keys, arcs }
    }

    pub fn guards(&self) -> HashMap<LaneKey, MutexGuard<'_, Lane>> {
        self.keys
            .iter()
            .zip(&self.arcs)
            .map(|(&k, a)| (k, lock(a)))
            .collect()
    }
}

/// Where a transfer's bytes start or land.
#[derive(Clone, Copy, Debug)]
pub(super) struct Loc {
    pub buffer: BufferId,
    pub offset: usize,
}

impl Loc {
    pub fn at(self, delta: usize) -> Loc {
        Loc {
            buffer: self.buffer,
            offset: self.offset + delta,
        }
    }
}

/// What a finished submission leaves: the events that bound it and every event it made.
pub(super) struct Completion {
    shared: Arc<Shared>,
    /// Recorded before the transfer's work where it was timed or runs on several streams.
    pub start: Option<EventId>,
    pub end: EventId,
    /// Where a timed split was asked for: when each route's last operation ended, each a timed
    /// event on the source GPU (as `start` is), so that an unbalanced split shows.
    pub route_ends: Vec<RouteMark>,
    events: Vec<EventId>,
    /// Set once the end event is known to have fired: later checks need no driver call.
    finished: AtomicBool,
}

/// A route of a split and the timed event recorded on the source GPU once its last operation
/// ended.
#[derive(Clone, Copy, Debug)]
pub(super) struct RouteMark {
    pub route: Route,
    pub bytes: u64,
    pub event: EventId,
}

impl Completion {
    pub fn backend(&self) -> &dyn Backend {
        &*self.shared.backend
    }

    pub fn is_done(&self) -> Result<bool> {
        if self.finished.load(Ordering::Acquire) {
            return Ok(true);
        }
        let done = self.shared.backend.event_done(self.end)?;
        self.finished.store(done, Ordering::Release);
        Ok(done)
    }

    /// Whether the work has finished; an unreadable event counts as finished (nothing can wait on
    /// it).
    pub fn fired(&self) -> bool {
        self.is_done().unwrap_or(true)
    }

    pub fn wait(&self) -> Result<()> {
        if !self.finished.load(Ordering::Acquire) {
            self.shared.backend.event_synchronize(self.end)?;
            self.finished.store(true, Ordering::Release);
        }
        Ok(())
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        // Without waiting: a stream already waiting on one of these events still waits for the
        // work it marked (the backend's contract), and no one else holds them.
        for &e in &self.events {
            let _ = self.shared.backend.destroy_event(e);
        }
    }
}

/// Queues one submission's work, keeping every event it makes. Dropped before
/// [`Issuer::finish`] (an error halfway), it waits for whatever it queued and frees the events.
pub(super) struct Issuer<'s> {
    pub shared: &'s Arc<Shared>,
    events: Vec<EventId>,
    touched: Vec<StreamId>,
    route_ends: Vec<RouteMark>,
    finished: bool,
}

impl<'s> Issuer<'s> {
    pub fn new(shared: &'s Arc<Shared>) -> Self {
        Issuer {
            shared,
            events: Vec::new(),
            touched: Vec::new(),
            route_ends: Vec::new(),
            finished: false,
        }
    }

    fn backend(&self) -> &dyn Backend {
        &*self.shared.backend
    }

    pub fn stream(&mut self, key: StreamKey) -> Result<StreamId> {
        let s = self.shared.stream(key)?;
        self.touch(s);
        Ok(s)
    }

    /// Notes a stream this submission queues work on, to be synchronised should it fail halfway.
    fn touch(&mut self, stream: StreamId) {
        if !self.touched.contains(&stream) {
            self.touched.push(stream);
        }
    }

    pub fn record(&mut self, stream: StreamId) -> Result<EventId> {
        let e = self.backend().record(stream)?;
        self.events.push(e);
        Ok(e)
    }

    /// Marks a point that only orders work (see [`Backend::mark`]), freed with this submission.
    pub fn mark(&mut self, stream: StreamId) -> Result<EventId> {
        let e = self.backend().mark(stream)?;
        self.events.push(e);
        Ok(e)
    }

    /// Marks a point that outlives this submission (a lane's idle event); its owner frees it.
    pub fn mark_kept(&mut self, stream: StreamId) -> Result<EventId> {
        self.backend().mark(stream)
    }

    /// Hands an event to this submission, to be freed when it completes.
    pub fn adopt(&mut self, event: EventId) {
        self.events.push(event);
    }

    /// Records on `stream` (of the source GPU) a timed event marking where `route`, carrying
    /// `bytes`, ends: queued right after the route's last operation there, or after a wait for it.
    fn time_route_end(&mut self, stream: StreamId, route: Route, bytes: u64) -> Result<()> {
        let event = self.record(stream)?;
        self.route_ends.push(RouteMark {
            route,
            bytes,
            event,
        });
        Ok(())
    }

    pub fn wait(&mut self, stream: StreamId, event: EventId) -> Result<()> {
        self.backend().wait(stream, event)
    }

    pub fn copy(&mut self, stream: StreamId, method: CopyMethod, copy: BufferCopy) -> Result<()> {
        self.backend().copy(stream, method, &copy)
    }

    pub fn copy_batch(&mut self, stream: StreamId, copies: &[BufferCopy]) -> Result<()> {
        self.backend().copy_batch(stream, copies)
    }

    pub fn memcpy_batch(&mut self, stream: StreamId, copies: &[BufferCopy]) -> Result<()> {
        self.backend().memcpy_batch(stream, copies)
    }

    /// Hands a batch to `worker` as one ticket (behind a doorbell on `stream` where `ordered`, else
    /// at once) and makes `stream` wait for it.
    pub fn resident_batch(
        &mut self,
        stream: StreamId,
        worker: WorkerId,
        copies: &[BufferCopy],
        ordered: bool,
    ) -> Result<()> {
        let resident = self.backend().resident();
        let ticket = if ordered {
            resident.submit_batch_after(worker, stream, copies)?
        } else {
            resident.submit_batch(worker, copies)?
        };
        resident.wait_on_stream(stream, ticket)
    }

    /// Hands `copy` to `worker` (behind a doorbell on `stream` where `ordered`, else at once) and
    /// makes `stream` wait for it.
    pub fn resident(
        &mut self,
        stream: StreamId,
        worker: WorkerId,
        copy: BufferCopy,
        ordered: bool,
    ) -> Result<()> {
        let resident = self.backend().resident();
        let ticket = if ordered {
            resident.submit_after(worker, stream, &copy)?
        } else {
            resident.submit(worker, &copy)?
        };
        resident.wait_on_stream(stream, ticket)
    }

    pub fn finish(mut self, start: Option<EventId>, end: EventId) -> Completion {
        self.finished = true;
        Completion {
            shared: self.shared.clone(),
            start,
            end,
            route_ends: std::mem::take(&mut self.route_ends),
            events: std::mem::take(&mut self.events),
            finished: AtomicBool::new(false),
        }
    }
}

impl Drop for Issuer<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        for &s in &self.touched {
            let _ = self.backend().synchronize(s);
        }
        for &e in &self.events {
            let _ = self.backend().destroy_event(e);
        }
    }
}

/// The lanes a plan's routes need.
pub(super) fn lanes_of(plan: &Plan) -> Vec<LaneKey> {
    let (src, dst) = (plan.src, plan.dst);
    plan.paths
        .iter()
        .filter_map(|p| match p.route {
            Route::Direct(_) | Route::Resident | Route::GpudirectRdma | Route::NetStaged => None,
            Route::Host => Some(LaneKey::Host { src, dst }),
            Route::Relay(via) => Some(LaneKey::Relay { src, dst, via }),
        })
        .collect()
}

/// One single-range transfer to queue: its plan, where its bytes are, what it waits for, and
/// whether its GPU time is wanted.
pub(super) struct Job<'p> {
    pub plan: &'p Plan,
    /// The GPU whose streams queue the transfer: the source's, or the destination's where it
    /// reads another process's memory imported for the destination.
    pub issuing: usize,
    pub src: Loc,
    pub dst: Loc,
    pub after: &'p [EventId],
    pub timed: bool,
    /// The caller's streams it is ordered on instead of the fabric's control stream.
    pub caller: Option<CallerStreams>,
}

/// A transfer queued on the caller's streams (see [`super::TransferBuilder::on_streams`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct CallerStreams {
    /// The issuing GPU's stream: it runs the transfer as its control stream.
    pub issuing: StreamId,
    /// The other GPU's stream (None where both ends name one stream): the transfer waits for a
    /// mark of its work so far, and it waits for the transfer's end.
    pub other: Option<StreamId>,
}

/// Queues a whole single-range transfer: waits for `after`, then the plan, followed by an end event
/// on the control stream. A start event goes first where the plan has pipelined routes (their
/// streams wait for it) or the caller wants the GPU time (`timed`).
pub(super) fn submit(shared: &Arc<Shared>, job: &Job<'_>) -> Result<Completion> {
    let mut done = submit_together(shared, std::slice::from_ref(job))?;
    Ok(done.pop().expect("one completion per job"))
}

/// Queues several transfers as [`submit`] does each, but interleaved: every transfer's direct
/// copies first, then every pipeline's first chunk, then the pipelines' chunks in turn across all
/// of them, so that none waits for the CPU to finish queuing another (each GPU sending at once, or
/// a split both ways between two GPUs). Jobs that would share a staging lane are queued one after
/// another.
pub(super) fn submit_together(shared: &Arc<Shared>, jobs: &[Job<'_>]) -> Result<Vec<Completion>> {
    let mut keys: Vec<LaneKey> = jobs.iter().flat_map(|j| lanes_of(j.plan)).collect();
    let total = keys.len();
    keys.sort_unstable();
    keys.dedup();
    if keys.len() < total {
        return jobs
            .iter()
            .map(|job| submit(shared, job))
            .collect::<Result<Vec<_>>>();
    }
    let lanes = LockedLanes::new(shared, keys);
    let mut guards = lanes.guards();
    let mut queuing: Vec<Option<Queuing<'_>>> = Vec::with_capacity(jobs.len());
    let mut done: Vec<Option<Completion>> = Vec::with_capacity(jobs.len());
    for job in jobs {
        let mut issuer = Issuer::new(shared);
        let plan = job.plan;
        let control = match job.caller {
            Some(caller) => {
                issuer.touch(caller.issuing);
                if let Some(other) = caller.other {
                    issuer.touch(other);
                    let earlier = issuer.mark(other)?;
                    issuer.wait(caller.issuing, earlier)?;
                }
                caller.issuing
            }
            None => issuer.stream(control_key(job.issuing, plan.src, plan.dst))?,
        };
        for &e in job.after {
            issuer.wait(control, e)?;
        }
        let pipelined = plan
            .paths
            .iter()
            .any(|p| !matches!(p.route, Route::Direct(_) | Route::Resident));
        let start = if job.timed || pipelined {
            Some(issuer.record(control)?)
        } else {
            None
        };
        // A timed split also times each route's end: what shows whether its bytes were divided
        // as the routes ran.
        let time_routes = job.timed && plan.paths.len() > 1;
        // On the caller's stream, the caller's earlier work there comes first too.
        let ordered = !job.after.is_empty() || job.caller.is_some();
        queue_direct(
            &mut issuer,
            plan,
            job.issuing,
            (job.src, job.dst),
            control,
            ordered,
            time_routes,
        )?;
        let q = Queuing {
            issuer,
            control,
            follower: job.caller.and_then(|c| c.other),
            start,
            pipelines: Vec::new(),
            time_routes,
        };
        // A transfer of direct copies and resident transfers only is queued whole: it ends at once.
        if pipelined {
            done.push(None);
            queuing.push(Some(q));
        } else {
            done.push(Some(q.finish(&mut guards)?));
            queuing.push(None);
        }
    }
    // Every transfer's direct copies are queued, so that none waits for another's pipelines to be
    // begun; now each pipeline's first chunk.
    for (q, job) in queuing.iter_mut().zip(jobs) {
        if let Some(q) = q {
            q.pipelines = begin_pipelines(
                &mut q.issuer,
                &mut guards,
                job.plan,
                job.src,
                job.dst,
                q.start,
            )?;
        }
    }
    // Chunks in turn across every transfer; each ends (its end event recorded) as soon as its own
    // last chunk is queued, so that its GPU time does not wait for the others' queuing.
    let mut busy = true;
    while busy {
        busy = false;
        for (slot, finished) in queuing.iter_mut().zip(&mut done) {
            let Some(q) = slot else { continue };
            if step_routes(&mut q.issuer, &mut q.pipelines)? {
                busy = true;
                continue;
            }
            let q = slot.take().expect("matched above");
            *finished = Some(q.finish(&mut guards)?);
        }
    }
    Ok(done
        .into_iter()
        .map(|d| d.expect("every transfer finished queuing"))
        .collect())
}

/// A transfer of [`submit_together`] whose chunks are still being queued.
struct Queuing<'s> {
    issuer: Issuer<'s>,
    control: StreamId,
    /// The caller's stream of the other GPU, which waits for the transfer's end.
    follower: Option<StreamId>,
    start: Option<EventId>,
    pipelines: Pipelines,
    /// Whether each route's end is timed.
    time_routes: bool,
}

impl Queuing<'_> {
    /// Makes the control stream wait for every route, then records the end (and makes the
    /// follower wait for it).
    fn finish(mut self, lanes: &mut HashMap<LaneKey, MutexGuard<'_, Lane>>) -> Result<Completion> {
        finish_routes(
            &mut self.issuer,
            lanes,
            self.pipelines,
            self.control,
            self.time_routes,
        )?;
        // Without a start event no GPU time can be asked of the transfer: its end only orders
        // work, and a stream waits on such an event sooner than on a timed one.
        let end = match self.start {
            Some(_) => self.issuer.record(self.control)?,
            None => self.issuer.mark(self.control)?,
        };
        if let Some(follower) = self.follower {
            self.issuer.wait(follower, end)?;
        }
        Ok(self.issuer.finish(self.start, end))
    }
}

/// The stream that orders a transfer between `src` and `dst`, on the `issuing` GPU.
pub(super) fn control_key(issuing: usize, src: usize, dst: usize) -> StreamKey {
    StreamKey {
        device: issuing,
        src,
        dst,
        role: Role::Control,
    }
}

/// Queues every route of `plan` after `start` (an event already recorded on `control`; pipelined
/// routes need one), and makes `control` wait until all of them are done.
pub(super) fn issue_routes(
    issuer: &mut Issuer<'_>,
    lanes: &mut HashMap<LaneKey, MutexGuard<'_, Lane>>,
    plan: &Plan,
    src: Loc,
    dst: Loc,
    control: StreamId,
    start: Option<EventId>,
) -> Result<()> {
    queue_direct(issuer, plan, plan.src, (src, dst), control, true, false)?;
    let mut pipelines = begin_pipelines(issuer, lanes, plan, src, dst, start)?;
    while step_routes(issuer, &mut pipelines)? {}
    finish_routes(issuer, lanes, pipelines, control, false)
}

/// The pipelined routes of a transfer being queued, a chunk at a time.
pub(super) type Pipelines = Vec<(LaneKey, Pipeline)>;

/// Queues `plan`'s direct copies and resident transfers on `control`: one call each, they run from
/// the transfer's start whatever the plan's order, before any pipeline's chunks are queued.
/// `ordered`: work queued on `control` before must be done first (a resident transfer then waits
/// for its doorbell there; without, the worker takes it at once). `time_routes`: each is followed
/// by a timed event, its end.
fn queue_direct(
    issuer: &mut Issuer<'_>,
    plan: &Plan,
    issuing: usize,
    (src, dst): (Loc, Loc),
    control: StreamId,
    ordered: bool,
    time_routes: bool,
) -> Result<()> {
    for share in &plan.paths {
        if !matches!(share.route, Route::Direct(_) | Route::Resident) {
            continue;
        }
        let peer = if issuing == plan.src {
            plan.dst
        } else {
            plan.src
        };
        issuer.shared.ensure_peer(issuing, peer)?;
        let copy = BufferCopy {
            dst: dst.buffer,
            dst_offset: dst.offset + share.offset as usize,
            src: src.buffer,
            src_offset: src.offset + share.offset as usize,
            len: share.bytes as usize,
        };
        match share.route {
            Route::Direct(method) => issuer.copy(control, method, copy)?,
            // The control stream goes on once it is complete; where it must first finish what it
            // holds (the transfer's dependencies), it rings the worker's doorbell.
            _ => {
                let worker = issuer.shared.worker(plan.src)?;
                issuer.resident(control, worker, copy, ordered)?;
            }
        }
        if time_routes {
            issuer.time_route_end(control, share.route, share.bytes)?;
        }
    }
    Ok(())
}

/// Begins each pipelined route of `plan` after `start` (an event already recorded on the control
/// stream) with its first chunk, and returns the pipelines whose other chunks are still to queue.
fn begin_pipelines(
    issuer: &mut Issuer<'_>,
    lanes: &mut HashMap<LaneKey, MutexGuard<'_, Lane>>,
    plan: &Plan,
    src: Loc,
    dst: Loc,
    start: Option<EventId>,
) -> Result<Pipelines> {
    let mut pipelines = Vec::new();
    for share in &plan.paths {
        match share.route {
            Route::Direct(_) | Route::Resident => continue,
            Route::GpudirectRdma | Route::NetStaged => {
                return Err(super::plan::between_hosts(plan.src, plan.dst));
            }
            Route::Host | Route::Relay(_) => {}
        }
        let (from, to) = (src.at(share.offset as usize), dst.at(share.offset as usize));
        let key = lanes_of_route(plan, share.route);
        let lane = lanes
            .get_mut(&key)
            .expect("every lane of the plan is locked");
        let start = start.ok_or_else(|| {
            Error::InvalidHandle(
                "internal: a pipelined route was queued without a start event".into(),
            )
        })?;
        let mut pipeline = Pipeline::begin(issuer, lane, key, plan, share, from, to, start)?;
        // Its first chunk goes now, before the next route is begun.
        pipeline.step(issuer)?;
        pipelines.push((key, pipeline));
    }
    Ok(pipelines)
}

/// Queues the next chunk of each pipeline in turn, so that the routes run side by side; false once
/// every chunk is queued.
fn step_routes(issuer: &mut Issuer<'_>, pipelines: &mut Pipelines) -> Result<bool> {
    let mut busy = false;
    for (_, p) in pipelines {
        busy |= p.step(issuer)?;
    }
    Ok(busy)
}

/// Hands each lane its new idle event and makes `control` wait for every route; where
/// `time_routes`, times each route's end too.
fn finish_routes(
    issuer: &mut Issuer<'_>,
    lanes: &mut HashMap<LaneKey, MutexGuard<'_, Lane>>,
    pipelines: Pipelines,
    control: StreamId,
    time_routes: bool,
) -> Result<()> {
    for (key, p) in pipelines {
        let lane = lanes
            .get_mut(&key)
            .expect("every lane of the plan is locked");
        let (first, route, bytes) = (p.first, p.route, p.len as u64);
        let last = p.finish(issuer, lane)?;
        if time_routes {
            // The last drain may run on another GPU, and a timed event is read against the start
            // on the source: the fill stream there (whose next use waits for this drain anyway)
            // waits for it and records the end. The control stream waits for the drain itself,
            // not for that record: waiting for the record put the transfer's end 4–9 µs after its
            // last route's on the H200 pair (256 MiB: 0.7–1.4% of the split's time), so the two
            // streams, released by one event, may record a few µs apart either way.
            issuer.wait(first, last)?;
            issuer.time_route_end(first, route, bytes)?;
        }
        issuer.wait(control, last)?;
    }
    Ok(())
}

fn lanes_of_route(plan: &Plan, route: Route) -> LaneKey {
    let (src, dst) = (plan.src, plan.dst);
    match route {
        Route::Host => LaneKey::Host { src, dst },
        Route::Relay(via) => LaneKey::Relay { src, dst, via },
        Route::Direct(_) | Route::Resident | Route::GpudirectRdma | Route::NetStaged => {
            unreachable!("only pipelines within one host have a lane")
        }
    }
}

/// One pipelined route of one transfer, queued a chunk at a time.
pub(super) struct Pipeline {
    route: Route,
    first: StreamId,
    second: StreamId,
    staging: BufferId,
    from: Loc,
    to: Loc,
    len: usize,
    chunk: usize,
    chunks: usize,
    /// Chunks the staging buffer holds at once.
    slots: usize,
    next: usize,
    /// The drain event of each chunk queued so far.
    drained: Vec<EventId>,
}

impl Pipeline {
    #[allow(clippy::too_many_arguments)]
    fn begin(
        issuer: &mut Issuer<'_>,
        lane: &mut Lane,
        key: LaneKey,
        plan: &Plan,
        share: &PathShare,
        from: Loc,
        to: Loc,
        start: EventId,
    ) -> Result<Pipeline> {
        let len = share.bytes as usize;
        let shared = issuer.shared;
        let (first_gpu, second_gpu, memory) = match key {
            LaneKey::Host { src, dst } => {
                let node = shared.planner.model().numa_node(src);
                (src, dst, Memory::PinnedHost { numa_node: node })
            }
            LaneKey::Relay { src, dst, via } => {
                shared.ensure_peer(src, via)?;
                shared.ensure_peer(via, dst)?;
                (src, via, Memory::Device(via))
            }
            LaneKey::Gather { .. } => unreachable!("gather lanes carry no pipeline"),
        };
        let staging_len = STAGING_SLOTS * MAX_CHUNK as usize;
        if lane.staging.is_empty() {
            let buffer = shared.backend.alloc(memory, staging_len)?;
            lane.staging.push((buffer, staging_len));
        }
        let hop = |device, role| StreamKey {
            device,
            src: plan.src,
            dst: plan.dst,
            role,
        };
        let first = issuer.stream(hop(first_gpu, Role::Fill(key)))?;
        let second = issuer.stream(hop(second_gpu, Role::Drain(key)))?;
        issuer.wait(first, start)?;
        if let Some(idle) = lane.idle {
            issuer.wait(first, idle)?;
        }
        let (chunk, chunks) = chunking(len as u64, plan.chunk_bytes.min(MAX_CHUNK));
        let chunk = chunk as usize;
        Ok(Pipeline {
            route: share.route,
            first,
            second,
            staging: lane.staging[0].0,
            from,
            to,
            len,
            chunk,
            chunks: chunks as usize,
            slots: staging_len / chunk,
            next: 0,
            drained: Vec::new(),
        })
    }

    /// Queues the next chunk; false when every chunk is queued.
    fn step(&mut self, issuer: &mut Issuer<'_>) -> Result<bool> {
        let k = self.next;
        if k == self.chunks {
            return Ok(false);
        }
        let offset = k * self.chunk;
        let len = self.chunk.min(self.len - offset);
        let slot = (k % self.slots) * self.chunk;
        if k >= self.slots {
            issuer.wait(self.first, self.drained[k - self.slots])?;
        }
        let fill = BufferCopy {
            dst: self.staging,
            dst_offset: slot,
            src: self.from.buffer,
            src_offset: self.from.offset + offset,
            len,
        };
        issuer.copy(self.first, CopyMethod::CopyEngine, fill)?;
        let filled = issuer.mark(self.first)?;
        issuer.wait(self.second, filled)?;
        let drain = BufferCopy {
            dst: self.to.buffer,
            dst_offset: self.to.offset + offset,
            src: self.staging,
            src_offset: slot,
            len,
        };
        issuer.copy(self.second, CopyMethod::CopyEngine, drain)?;
        let drained = if k + 1 == self.chunks {
            // The last drain is the lane's new idle event: the lane owns it.
            issuer.mark_kept(self.second)?
        } else {
            issuer.mark(self.second)?
        };
        self.drained.push(drained);
        self.next += 1;
        Ok(true)
    }

    /// Hands the lane its new idle event and returns it (the route's last event).
    fn finish(self, issuer: &mut Issuer<'_>, lane: &mut Lane) -> Result<EventId> {
        let last = *self
            .drained
            .last()
            .expect("a route carries at least one chunk");
        if let Some(old) = lane.idle.replace(last) {
            // The first fill waited on it; it can go once this transfer is done.
            issuer.adopt(old);
        }
        Ok(last)
    }
}
