//! Batches of small messages between one pair of GPUs, and batches prepared once and run many
//! times.
//!
//! Thousands of small copies cost their issue, not their bytes. The planner picks among one copy
//! kernel for all of them (P2P); that kernel captured once as a graph and replayed (P2P); separate
//! copies; copy-engine copies queued in one driver call (cuMemcpyBatchAsync, P2P); the separate
//! copies captured once as a graph and replayed (P2P); or — for pairs without P2P — gathering them
//! into one staging buffer on the source with one kernel, moving that by the best single-transfer
//! plan, and scattering it on the destination with another kernel.

use super::executor::{
    self, control_key, issue_routes, lock, Issuer, LaneKey, Loc, LockedLanes, Role, StreamKey,
};
use super::fabric::{BufferState, Fabric, Planned, Span, Transfer};
use super::plan::{BatchPlan, BatchStrategy};
use super::planner::packing;
use crate::backend::{first_overlap, BufferCopy, CopyMethod, EventId, GraphId, Memory};
use crate::{Error, Result};
use std::sync::Arc;

/// A batch prepared once and run any number of times: validated, planned, and (for
/// [`BatchStrategy::Graph`] and [`BatchStrategy::KernelGraph`]) captured. It keeps its buffers
/// alive, and releases its graph when dropped.
///
/// Preparing and running cost CPU time per message on the path of every batch, so the messages are
/// kept as the backend's copy list, made once, and buffers are held once each rather than once per
/// message.
pub struct PreparedBatch {
    fabric: Arc<executor::Shared>,
    plan: BatchPlan,
    /// The messages, as direct copies from their source to their destination ranges.
    copies: Vec<BufferCopy>,
    /// Each buffer the messages touch, once, and whether the batch writes it: ordering against
    /// other transfers is per buffer, so a run checks and claims each once, not once per message.
    touched: Vec<(Arc<BufferState>, bool)>,
    /// Where each message sits in the gathering buffers (gather-scatter plans only).
    packed: Vec<u64>,
    /// Bytes in the gathering buffers, alignment gaps included.
    packed_len: usize,
    graph: Option<GraphId>,
}

impl Fabric {
    /// Copies every `(source, destination)` message of a batch between one pair of GPUs, by the
    /// batch strategy the model predicts fastest.
    pub fn copy_batch(&self, messages: &[(Span<'_>, Span<'_>)]) -> Result<Transfer> {
        self.prepare(messages, 1, None)?.run(&[])
    }

    /// Prepares a batch that will run about `repeats` times (a graph's capture pays off over
    /// them); run it with [`PreparedBatch::run`].
    pub fn prepare_batch(
        &self,
        messages: &[(Span<'_>, Span<'_>)],
        repeats: u32,
    ) -> Result<PreparedBatch> {
        self.prepare(messages, repeats, None)
    }

    /// Like [`Fabric::prepare_batch`], with this strategy instead of the planner's pick (refused where
    /// the pair cannot use it).
    pub fn prepare_batch_with(
        &self,
        messages: &[(Span<'_>, Span<'_>)],
        repeats: u32,
        strategy: BatchStrategy,
    ) -> Result<PreparedBatch> {
        self.prepare(messages, repeats, Some(strategy))
    }

    fn prepare(
        &self,
        messages: &[(Span<'_>, Span<'_>)],
        repeats: u32,
        strategy: Option<BatchStrategy>,
    ) -> Result<PreparedBatch> {
        let Some((first_src, first_dst)) = messages.first() else {
            return Err(Error::usage("a batch needs at least one message"));
        };
        let (a, b) = (first_src.buffer.device(), first_dst.buffer.device());
        let mut copies = Vec::with_capacity(messages.len());
        let mut touched: Vec<(Arc<BufferState>, bool)> = Vec::new();
        for (i, (src, dst)) in messages.iter().enumerate() {
            crate::interrupt::check_every(i)?;
            let len = self
                .check_pair(src, dst)
                .map_err(|e| Error::usage(format!("message {i} of the batch: {e}")))?;
            if (src.buffer.device(), dst.buffer.device()) != (a, b) {
                return Err(Error::usage(format!(
                    "a batch moves messages from one GPU to one GPU: message 0 goes from GPU {a} \
                     to GPU {b} but message {i} from GPU {} to GPU {}; submit one batch per pair",
                    src.buffer.device(),
                    dst.buffer.device()
                )));
            }
            note(&mut touched, &src.buffer.state, false);
            note(&mut touched, &dst.buffer.state, true);
            copies.push(BufferCopy {
                dst: dst.buffer.state.id,
                dst_offset: dst.range.start,
                src: src.buffer.state.id,
                src_offset: src.range.start,
                len,
            });
        }
        check_hazards(&copies)?;
        let sizes: Vec<u64> = copies.iter().map(|c| c.len as u64).collect();
        let plan = match strategy {
            None => self.planner().plan_batch(a, b, &sizes, repeats)?,
            Some(s) => self.planner().plan_batch_with(s, a, b, &sizes, repeats)?,
        };
        let (packed, packed_len) = if plan.strategy == BatchStrategy::GatherScatter {
            packing(&sizes)
        } else {
            (Vec::new(), 0)
        };
        let mut batch = PreparedBatch {
            fabric: self.shared().clone(),
            plan,
            copies,
            touched,
            packed,
            packed_len: packed_len as usize,
            graph: None,
        };
        if matches!(
            batch.plan.strategy,
            BatchStrategy::Graph | BatchStrategy::KernelGraph
        ) {
            batch.graph = Some(batch.capture()?);
        }
        Ok(batch)
    }
}

impl Drop for PreparedBatch {
    fn drop(&mut self) {
        if let Some(graph) = self.graph {
            // Replays already queued still run; nothing can report a failure from drop.
            let _ = self.fabric.backend.destroy_graph(graph);
        }
    }
}

/// Adds `buffer` to a batch's distinct buffers (a destination counts as written). The last one
/// added is checked first: consecutive messages mostly name the same buffers.
fn note(touched: &mut Vec<(Arc<BufferState>, bool)>, buffer: &Arc<BufferState>, writes: bool) {
    match touched
        .iter_mut()
        .rev()
        .find(|(b, _)| Arc::ptr_eq(b, buffer))
    {
        Some((_, w)) => *w |= writes,
        None => touched.push((buffer.clone(), writes)),
    }
}

/// Refuses batches whose result would depend on the order of the messages: two destinations that
/// overlap, or a destination that overlaps another message's source.
fn check_hazards(copies: &[BufferCopy]) -> Result<()> {
    let span = |buffer, offset, len| (buffer, offset, offset + len);
    let all = copies
        .iter()
        .map(|c| span(c.src, c.src_offset, c.len))
        .chain(copies.iter().map(|c| span(c.dst, c.dst_offset, c.len)));
    // Most batches touch no byte twice, which one pass shows; where some ranges meet, the sort
    // below tells a clash from messages merely reading the same bytes.
    if first_overlap(all).is_none() {
        return Ok(());
    }
    // (buffer, start, end, is destination, message)
    let sources = copies
        .iter()
        .enumerate()
        .map(|(i, c)| (c.src, c.src_offset, c.src_offset + c.len, false, i));
    let destinations = copies
        .iter()
        .enumerate()
        .map(|(i, c)| (c.dst, c.dst_offset, c.dst_offset + c.len, true, i));
    let mut spans: Vec<_> = sources.chain(destinations).collect();
    spans.sort_by_key(|&(buffer, start, ..)| (buffer, start));
    let mut current = None;
    // Within one buffer: the furthest end of any span so far, and of any destination so far.
    let (mut any_end, mut dst_end) = ((0, 0), (0, 0)); // (end, message)
    for &(buffer, start, end, is_dst, i) in &spans {
        if current != Some(buffer) {
            current = Some(buffer);
            any_end = (0, 0);
            dst_end = (0, 0);
        }
        let clash = if is_dst && start < any_end.0 && any_end.1 != i {
            Some(any_end.1)
        } else if start < dst_end.0 && dst_end.1 != i {
            Some(dst_end.1)
        } else {
            None
        };
        if let Some(j) = clash {
            return Err(Error::usage(format!(
                "messages {} and {} of the batch overlap where one of them writes; the result \
                 would depend on their order, so give them disjoint ranges",
                j.min(i),
                j.max(i)
            )));
        }
        if end > any_end.0 {
            any_end = (end, i);
        }
        if is_dst && end > dst_end.0 {
            dst_end = (end, i);
        }
    }
    Ok(())
}

impl PreparedBatch {
    /// What the planner chose for this batch.
    pub fn plan(&self) -> &BatchPlan {
        &self.plan
    }

    /// Runs the batch once more, after `after` (earlier transfers) on the GPU; the host does not
    /// wait.
    pub fn run(&self, after: &[&Transfer]) -> Result<Transfer> {
        let mut deps: Vec<Arc<executor::Completion>> =
            after.iter().map(|t| t.done.clone()).collect();
        for (buffer, writes) in &self.touched {
            deps.extend(buffer.conflicts(*writes));
        }
        let mut events: Vec<EventId> = deps.iter().map(|c| c.end).collect();
        events.sort_unstable();
        events.dedup();
        let done = Arc::new(self.issue(&events)?);
        for (buffer, writes) in &self.touched {
            buffer.claim(&done, *writes);
        }
        Ok(Transfer {
            done,
            planned: Planned::Batch(self.plan.clone()),
        })
    }

    fn pair(&self) -> (usize, usize) {
        (self.plan.src, self.plan.dst)
    }

    /// Records the separate copies, or the one copy kernel, into a graph on a stream used for
    /// nothing else.
    fn capture(&self) -> Result<GraphId> {
        let (a, b) = self.pair();
        let shared = &self.fabric;
        shared.ensure_peer(a, b)?;
        let stream = shared.stream(StreamKey {
            device: a,
            src: a,
            dst: b,
            role: Role::Capture,
        })?;
        let _only_capture = lock(shared.capture_lock());
        shared.backend.begin_capture(stream)?;
        let recorded = if self.plan.strategy == BatchStrategy::KernelGraph {
            shared.backend.copy_batch(stream, &self.copies)
        } else {
            self.copies
                .iter()
                .try_for_each(|c| shared.backend.copy(stream, CopyMethod::CopyEngine, c))
        };
        // End the capture even when a copy failed, so that the stream is usable again.
        let graph = shared.backend.end_capture(stream);
        recorded?;
        graph
    }

    fn issue(&self, after: &[EventId]) -> Result<executor::Completion> {
        let (a, b) = self.pair();
        let shared = &self.fabric;
        let middle_lanes = self.plan.middle.as_ref().map(executor::lanes_of);
        let mut keys = middle_lanes.unwrap_or_default();
        if self.plan.strategy == BatchStrategy::GatherScatter {
            keys.push(LaneKey::Gather { src: a, dst: b });
        }
        let lanes = LockedLanes::new(shared, keys);
        let mut guards = lanes.guards();
        let mut issuer = Issuer::new(shared);
        let control = issuer.stream(control_key(a, a, b))?;
        for &e in after {
            issuer.wait(control, e)?;
        }
        let start = issuer.record(control)?;
        match self.plan.strategy {
            BatchStrategy::Kernel => {
                shared.ensure_peer(a, b)?;
                issuer.copy_batch(control, &self.copies)?;
            }
            BatchStrategy::MemcpyBatch => {
                shared.ensure_peer(a, b)?;
                issuer.memcpy_batch(control, &self.copies)?;
            }
            BatchStrategy::Separate => {
                shared.ensure_peer(a, b)?;
                for copy in &self.copies {
                    issuer.copy(control, CopyMethod::CopyEngine, *copy)?;
                }
            }
            BatchStrategy::Graph | BatchStrategy::KernelGraph => {
                let graph = self.graph.expect("captured when the batch was prepared");
                shared.backend.replay(graph, control)?;
            }
            BatchStrategy::Resident => {
                shared.ensure_peer(a, b)?;
                let worker = shared.worker(a)?;
                issuer.resident_batch(control, worker, &self.copies, !after.is_empty())?;
            }
            BatchStrategy::GatherScatter => {
                let middle = self
                    .plan
                    .middle
                    .as_ref()
                    .expect("gathering has a middle plan");
                let key = LaneKey::Gather { src: a, dst: b };
                let mut gather = guards.remove(&key).expect("locked above");
                let (packed_src, packed_dst) = self.staging(&mut gather)?;
                if let Some(idle) = gather.idle {
                    issuer.wait(control, idle)?;
                }
                let gathered: Vec<BufferCopy> = self
                    .copies
                    .iter()
                    .zip(&self.packed)
                    .map(|(c, &at)| BufferCopy {
                        dst: packed_src,
                        dst_offset: at as usize,
                        ..*c
                    })
                    .collect();
                issuer.copy_batch(control, &gathered)?;
                let ready = issuer.record(control)?;
                let (from, to) = (
                    Loc {
                        buffer: packed_src,
                        offset: 0,
                    },
                    Loc {
                        buffer: packed_dst,
                        offset: 0,
                    },
                );
                issue_routes(
                    &mut issuer,
                    &mut guards,
                    middle,
                    from,
                    to,
                    control,
                    Some(ready),
                )?;
                let moved = issuer.record(control)?;
                let scatter = issuer.stream(StreamKey {
                    device: b,
                    src: a,
                    dst: b,
                    role: Role::Scatter,
                })?;
                issuer.wait(scatter, moved)?;
                let scattered: Vec<BufferCopy> = self
                    .copies
                    .iter()
                    .zip(&self.packed)
                    .map(|(c, &at)| BufferCopy {
                        src: packed_dst,
                        src_offset: at as usize,
                        ..*c
                    })
                    .collect();
                issuer.copy_batch(scatter, &scattered)?;
                let idle = issuer.mark_kept(scatter)?;
                if let Some(old) = gather.idle.replace(idle) {
                    issuer.adopt(old);
                }
                issuer.wait(control, idle)?;
            }
        }
        let end = issuer.record(control)?;
        Ok(issuer.finish(Some(start), end))
    }

    /// The gathering buffers (source side, destination side), grown to hold this batch. Growing
    /// waits for the buffers' last use before freeing them.
    fn staging(
        &self,
        lane: &mut executor::Lane,
    ) -> Result<(crate::backend::BufferId, crate::backend::BufferId)> {
        let (a, b) = self.pair();
        let backend = &self.fabric.backend;
        let fits = lane.staging.len() == 2 && lane.staging[0].1 >= self.packed_len;
        if !fits {
            if let Some(idle) = lane.idle.take() {
                backend.event_synchronize(idle)?;
                backend.destroy_event(idle)?;
            }
            for (buffer, _) in lane.staging.drain(..) {
                backend.free(buffer)?;
            }
            for device in [a, b] {
                let buffer = backend.alloc(Memory::Device(device), self.packed_len)?;
                lane.staging.push((buffer, self.packed_len));
            }
        }
        Ok((lane.staging[0].0, lane.staging[1].0))
    }
}
