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

    pub(super) fn pick_batch(
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
        let count = sizes.len() as f64;
        let per_message = self.model.batch_message_us();
        let issue = self.model.issue();
        // One kernel moving every message: launch, then a block per message, then the bytes.
        let kernel = |hop: Hop| {
            self.model
                .cost(hop)
                .map(|c| issue.kernel_us + c.alpha_us + count * per_message + c.bytes_us(total))
        };
        let mut options: Vec<(BatchStrategy, f64, Option<Plan>)> = Vec::new();

        // A GPU is its own peer: within one GPU the kernel and the copies stay in its memory.
        if let Some(time) = kernel(Hop::PeerSm { src, dst }) {
            options.push((BatchStrategy::Kernel, time, None));
            // Captured once (what queuing the kernel costs), then a graph launch and one graph node
            // per run instead of the kernel's launch.
            let replay = time - issue.kernel_us + issue.graph_us + self.model.graph_node_us();
            options.push((
                BatchStrategy::KernelGraph,
                replay + issue.kernel_us / f64::from(repeats.max(1)),
                None,
            ));
        }
        if let (true, Some(lone), Some(cost)) = (
            self.resident,
            self.model.lone_us(Hop::Resident { src, dst }),
            self.model.cost(Hop::Resident { src, dst }),
        ) {
            // One ticket: a lone transfer's time, its messages at the batch kernel's pace (a warp
            // each, the worker's blocks sharing them out), then the bytes.
            let time = lone + count * per_message + cost.bytes_us(total);
            options.push((BatchStrategy::Resident, time, None));
        }
        if let Some(ce) = self.model.cost(Hop::PeerCe { src, dst }) {
            // Back-to-back copies on one stream: paced by the CPU queuing them or by the GPU
            // running them, whichever is slower.
            let each = ce.time_us(total / sizes.len() as u64);
            let separate = issue.copy_us + (count - 1.0) * each.max(issue.copy_us) + each;
            options.push((BatchStrategy::Separate, separate, None));
            // One driver call, but measured on the lent H200 no cheaper per copy to queue than
            // separate copies (5.02 vs 5.15 µs per message, docs/reference.md): priced alike,
            // after them, so that a tie goes to the plainer way.
            options.push((BatchStrategy::MemcpyBatch, separate, None));
            // Capturing costs what queuing the copies once does; a replay is one launch and a
            // graph node per copy.
            let replay = issue.graph_us + count * self.model.graph_node_us() + ce.bytes_us(total);
            let capture = count * issue.copy_us;
            options.push((
                BatchStrategy::Graph,
                replay + capture / f64::from(repeats.max(1)),
                None,
            ));
        }
        if src != dst {
            let middle = self.plan(src, dst, packing(sizes).1)?;
            let gather = kernel(Hop::Local { device: src });
            let scatter = kernel(Hop::Local { device: dst });
            if let (Some(g), Some(s)) = (gather, scatter) {
                // Two more events order the scatter after the middle transfer.
                let order = 2.0 * issue.event_us;
                options.push((
                    BatchStrategy::GatherScatter,
                    g + middle.predicted_us + order + s,
                    Some(middle),
                ));
            }
        }
        options.sort_by(|a, b| a.1.total_cmp(&b.1));
        let chosen = match wanted {
            None => 0,
            Some(strategy) => options
                .iter()
                .position(|o| o.0 == strategy)
                .ok_or_else(|| {
                    Error::usage(if strategy == BatchStrategy::Resident && !self.resident {
                        "the resident batch strategy needs resident workers: open the fabric \
                         with FabricBuilder::resident (on the command line, plan --resident)"
                            .to_string()
                    } else if src == dst {
                        format!(
                            "{strategy} is for two GPUs; within GPU {src} a batch needs no staging"
                        )
                    } else {
                        format!(
                            "the {strategy} batch strategy needs P2P access from GPU {src} to GPU \
                             {dst}, which this host does not offer; use gather-scatter"
                        )
                    })
                })?,
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
}
