//! Batches of small messages: each way to move them priced, the fastest picked.

use super::{packing, Planner};
use crate::engine::plan::{BatchPlan, BatchStrategy, Plan};
use crate::model::Hop;
use crate::{Error, Result};

impl Planner {
    /// The fastest way to move a batch of small messages (their sizes in `sizes`) from `src` to
    /// `dst`, when the same batch will run `repeats` times (a graph's capture is spread over them).
    pub fn plan_batch(
        &self,
        src: usize,
        dst: usize,
        sizes: &[u64],
        repeats: u32,
    ) -> Result<BatchPlan> {
        self.pick_batch(None, src, dst, sizes, repeats)
    }

    /// The plan for a batch by `strategy`, or an error saying why this pair cannot use it.
    pub fn plan_batch_with(
        &self,
        strategy: BatchStrategy,
        src: usize,
        dst: usize,
        sizes: &[u64],
        repeats: u32,
    ) -> Result<BatchPlan> {
        self.pick_batch(Some(strategy), src, dst, sizes, repeats)
    }

    fn pick_batch(
        &self,
        wanted: Option<BatchStrategy>,
        src: usize,
        dst: usize,
        sizes: &[u64],
        repeats: u32,
    ) -> Result<BatchPlan> {
        if sizes.is_empty() {
            return Err(Error::usage("a batch needs at least one message"));
        }
        if let Some(i) = sizes.iter().position(|&s| s == 0) {
            return Err(Error::usage(format!(
                "message {i} of the batch has 0 bytes; every message needs at least 1 byte"
            )));
        }
        let total: u64 = sizes.iter().sum();
        self.check(src, dst, total)?;
        let batch = Batch {
            src,
            dst,
            sizes,
            total,
            repeats,
        };
        let mut options = self.kernel_options(&batch);
        options.extend(self.resident_option(&batch));
        options.extend(self.copy_options(&batch));
        options.extend(self.gather_scatter_option(&batch)?);
        options.sort_by(|a, b| a.1.total_cmp(&b.1));
        let chosen = match wanted {
            None => 0,
            Some(strategy) => options
                .iter()
                .position(|o| o.0 == strategy)
                .ok_or_else(|| self.batch_refusal(strategy, src, dst))?,
        };
        let (strategy, predicted_us, middle) = options.remove(chosen);
        Ok(BatchPlan {
            src,
            dst,
            strategy,
            middle,
            predicted_us,
            alternatives: options.iter().map(|(s, t, _)| (*s, *t)).collect(),
        })
    }

    /// One kernel moving every message over `hop`: launch, then a block per message, then the
    /// bytes.
    fn batch_kernel_us(&self, hop: Hop, batch: &Batch<'_>) -> Option<f64> {
        let per_message = self.model.batch_message_us();
        let count = batch.sizes.len() as f64;
        self.model.cost(hop).map(|c| {
            self.model.issue().kernel_us
                + c.alpha_us
                + count * per_message
                + c.bytes_us(batch.total)
        })
    }

    /// The batch kernel, launched or replayed from a graph. A GPU is its own peer: within one GPU
    /// the kernel and the copies stay in its memory.
    fn kernel_options(&self, batch: &Batch<'_>) -> Vec<BatchOption> {
        let (src, dst) = (batch.src, batch.dst);
        let Some(time) = self.batch_kernel_us(Hop::PeerSm { src, dst }, batch) else {
            return Vec::new();
        };
        let issue = self.model.issue();
        // Captured once (what queuing the kernel costs), then a graph launch and one graph node
        // per run instead of the kernel's launch.
        let replay = time - issue.kernel_us + issue.graph_us + self.model.graph_node_us();
        vec![
            (BatchStrategy::Kernel, time, None),
            (
                BatchStrategy::KernelGraph,
                replay + issue.kernel_us / f64::from(batch.repeats.max(1)),
                None,
            ),
        ]
    }

    /// One ticket to a resident worker, where workers run: a lone transfer's time, its messages at
    /// the batch kernel's pace (a warp each, the worker's blocks sharing them out), then the bytes.
    fn resident_option(&self, batch: &Batch<'_>) -> Option<BatchOption> {
        let hop = Hop::Resident {
            src: batch.src,
            dst: batch.dst,
        };
        if !self.resident {
            return None;
        }
        let (lone, cost) = (self.model.lone_us(hop)?, self.model.cost(hop)?);
        let count = batch.sizes.len() as f64;
        let time = lone + count * self.model.batch_message_us() + cost.bytes_us(batch.total);
        Some((BatchStrategy::Resident, time, None))
    }

    /// Copy-engine copies: back to back, in one driver call, or replayed from a graph.
    fn copy_options(&self, batch: &Batch<'_>) -> Vec<BatchOption> {
        let (src, dst, total) = (batch.src, batch.dst, batch.total);
        let Some(ce) = self.model.cost(Hop::PeerCe { src, dst }) else {
            return Vec::new();
        };
        let issue = self.model.issue();
        let count = batch.sizes.len() as f64;
        // Back-to-back copies on one stream: paced by the CPU queuing them or by the GPU running
        // them, whichever is slower.
        let each = ce.time_us(total / batch.sizes.len() as u64);
        let separate = issue.copy_us + (count - 1.0) * each.max(issue.copy_us) + each;
        // Capturing costs what queuing the copies once does; a replay is one launch and a graph
        // node per copy.
        let replay = issue.graph_us + count * self.model.graph_node_us() + ce.bytes_us(total);
        let capture = count * issue.copy_us;
        vec![
            (BatchStrategy::Separate, separate, None),
            // One driver call, but measured on the lent H200 no cheaper per copy to queue than
            // separate copies (5.02 vs 5.15 µs per message, docs/reference.md): priced alike,
            // after them, so that a tie goes to the plainer way.
            (BatchStrategy::MemcpyBatch, separate, None),
            (
                BatchStrategy::Graph,
                replay + capture / f64::from(batch.repeats.max(1)),
                None,
            ),
        ]
    }

    /// Between two GPUs: gathered by a kernel on the source, moved as one transfer (planned), and
    /// scattered by a kernel on the destination.
    fn gather_scatter_option(&self, batch: &Batch<'_>) -> Result<Option<BatchOption>> {
        let (src, dst) = (batch.src, batch.dst);
        if src == dst {
            return Ok(None);
        }
        let middle = self.plan(src, dst, packing(batch.sizes).1)?;
        let gather = self.batch_kernel_us(Hop::Local { device: src }, batch);
        let scatter = self.batch_kernel_us(Hop::Local { device: dst }, batch);
        let (Some(g), Some(s)) = (gather, scatter) else {
            return Ok(None);
        };
        // Two more events order the scatter after the middle transfer.
        let order = 2.0 * self.model.issue().event_us;
        let time = g + middle.predicted_us + order + s;
        Ok(Some((BatchStrategy::GatherScatter, time, Some(middle))))
    }

    /// Why the batch cannot move by `strategy` from `src` to `dst`.
    fn batch_refusal(&self, strategy: BatchStrategy, src: usize, dst: usize) -> Error {
        Error::usage(if strategy == BatchStrategy::Resident && !self.resident {
            "the resident batch strategy needs resident workers: open the fabric with \
             FabricBuilder::resident (on the command line, plan --resident)"
                .to_string()
        } else if src == dst {
            format!("{strategy} is for two GPUs; within GPU {src} a batch needs no staging")
        } else {
            format!(
                "the {strategy} batch strategy needs P2P access from GPU {src} to GPU {dst}, \
                 which this host does not offer; use gather-scatter"
            )
        })
    }
}

/// One way of moving a batch: its strategy, its predicted time, and the plan of the transfer in
/// its middle (gather-scatter's).
type BatchOption = (BatchStrategy, f64, Option<Plan>);

/// A batch being priced.
struct Batch<'s> {
    src: usize,
    dst: usize,
    sizes: &'s [u64],
    total: u64,
    repeats: u32,
}
