//! `peerlink explain --memory managed`: where the time of a read of managed memory across GPUs
//! goes — the kernel's launch, the page faults, the pages' move over the link, the read itself and
//! the receiver's wake-up — and what a prefetch or SetAccessedBy would save.
//!
//! The read is the bench's `managed-fault`: a copy kernel on `dst` reads a managed buffer whose
//! pages live on `src` (in host memory when `src == dst`), with no advice. The pages' move and the
//! read in place are each measured on their own (a prefetch alone, then the kernel alone); the
//! faults are what the first touch costs beyond them.

use super::{
    completion_costs, open, part, receiver_part, sweep_sizes, Completion, Explanation, Findings,
    Fix, Opening, Part,
};
use crate::backend::{Advice, Backend, Memory};
use crate::bench::cases::{enable, Buffers, Context, ManagedRead, ManagedReader, Policy, TestCase};
use crate::bench::progress::{Progress, Silent};
use crate::bench::result::Place;
use crate::bench::stats::Stats;
use crate::bench::sweep_pair;
use crate::bench::timing::{host_us, Runs};
use crate::pattern;
use crate::units::format_bytes;
use crate::Result;

/// Explains a read of `size` bytes of managed memory by GPU `dst`, its pages on GPU `src`.
pub fn run(
    backend: &dyn Backend,
    src: usize,
    dst: usize,
    size: u64,
    progress: &dyn Progress,
) -> Result<Explanation> {
    let Opening {
        defaults,
        mut ctx,
        mut notes,
    } = open(backend, src, dst)?;
    let place = Place::Pair { src, dst };
    let test = ManagedRead::new(Policy::FirstTouch);
    let sizes = sweep_sizes(size);
    check_peak(&ctx, &test, place, size)?;
    progress.start("explain", 5);
    let (route, mapping) = route_and_mapping(&ctx, src, dst);
    let (allocation, alloc_us) = allocation(backend, src, size)?;
    let mut buffers = Buffers::new(backend);
    let reader = ManagedReader::open(
        &mut ctx,
        &mut buffers,
        "explain (managed)",
        (src, dst),
        size as usize,
    )?;
    let runs = Runs {
        warmup: 1,
        runs: defaults.sampling.samples.max(3) as usize,
    };
    let mut reads = Reads::new(&reader, runs, ctx.next_seed());
    let (measured, launch) = reads.end_to_end(backend)?;
    progress.step();
    let gpu = reads.gpu_parts(dst, mapping.is_ok())?;
    progress.step();
    let completion = completion_costs(backend, reader.reader())?;
    progress.step();
    let origin = if src == dst {
        "host memory".to_string()
    } else {
        format!("GPU {src}")
    };
    let parts = gpu.parts(launch, &origin, dst, &completion);
    let fixes = gpu.fixes(alloc_us, &origin, dst, &mapping);
    progress.step();
    // The first touch's α–β over sizes: α its fixed costs, β the rate pages move on demand.
    let sweep = sweep_pair(&mut ctx, &test, place, &sizes, &Silent)?;
    progress.finish();
    notes.push(format!(
        "on demand, pages moved at β = {} (the α–β fit of the first touch over sizes), against \
         {:.1} GB/s for the prefetch alone",
        sweep.fit.map_or("(no fit)".to_string(), |f| format!(
            "{:.1} GB/s",
            f.beta_gbps
        )),
        crate::units::gbps(size, gpu.move_us)
    ));
    let findings = Findings {
        route,
        setup: vec![allocation],
        parts,
        measured,
        fit: sweep.fit,
        sweep,
        fixes,
        notes,
    };
    Ok(findings.explain(src, dst, size))
}

/// Refuses a size whose memory at its peak does not fit: the read explained, and the sweep's
/// largest.
fn check_peak(ctx: &Context<'_>, test: &ManagedRead, place: Place, size: u64) -> Result<()> {
    let largest = sweep_sizes(size).into_iter().max().unwrap_or(size);
    let mut footprint = test.footprint(ctx, place, size)?;
    footprint.add_all(&test.footprint(ctx, place, largest)?);
    footprint.check(
        ctx.backend,
        &format!("explaining {} of managed memory", format_bytes(size)),
        "choose a smaller --size",
    )
}

/// The route's sentence, and whether GPU `dst` can map the pages where they live (a mapping across
/// GPUs needs P2P; without it the driver keeps the pages in host memory instead).
fn route_and_mapping(
    ctx: &Context<'_>,
    src: usize,
    dst: usize,
) -> (String, std::result::Result<(), String>) {
    if src == dst {
        return (
            format!(
                "managed memory: a copy kernel on GPU {dst} reads a managed buffer whose pages \
                 live in host memory (the CPU wrote them last), no advice: each page faults and \
                 moves over PCIe"
            ),
            Ok(()),
        );
    }
    let link = ctx.topology().pair(src, dst).map_or_else(
        || "the host's path".to_string(),
        |p| match p.p2p {
            true => format!("{} ({})", p.link, p.link.meaning()),
            false => "host memory (no P2P between them)".to_string(),
        },
    );
    (
        format!(
            "managed memory: a copy kernel on GPU {dst} reads a managed buffer whose pages \
             live on GPU {src} (which touched them last), no advice: each page faults and \
             moves over {link}"
        ),
        match enable(ctx, dst, src) {
            None => Ok(()),
            Some(reason) => Err(reason),
        },
    )
}

/// The host clock around allocating the managed buffer (its pages placed on `src`) and freeing it.
fn allocation(backend: &dyn Backend, src: usize, size: u64) -> Result<(Part, f64)> {
    let ((), alloc_us) = host_us(backend, || {
        let buffer = backend.alloc(Memory::Managed(src), size as usize)?;
        backend.free(buffer)
    })?;
    let setup = part(
        "managed allocation",
        alloc_us,
        format!(
            "host clock around allocating {} of managed memory for GPU {src}, its pages placed \
             there, and freeing it",
            format_bytes(size)
        ),
    );
    Ok((setup, alloc_us))
}

/// The read, run again and again on fresh data, each run verified.
struct Reads<'r, 'b> {
    reader: &'r ManagedReader<'b>,
    runs: Runs,
    first_seed: u64,
    sample: u64,
}

/// The GPU's part of the read, whole and in pieces (GPU µs, medians).
struct GpuParts {
    /// Every page faulting on the way.
    first_us: f64,
    /// After a prefetch to the reader.
    prefetched_us: f64,
    /// Through a SetAccessedBy mapping, where one can be made.
    accessed_us: Option<f64>,
    /// The pages' move alone (a prefetch), and the read of them in place after it.
    move_us: f64,
    read_us: f64,
}

impl<'r, 'b> Reads<'r, 'b> {
    fn new(reader: &'r ManagedReader<'b>, runs: Runs, first_seed: u64) -> Self {
        Reads {
            reader,
            runs,
            first_seed,
            sample: 0,
        }
    }

    fn fresh(&mut self) -> u64 {
        self.sample += 1;
        pattern::seed(&[self.first_seed, self.sample])
    }

    /// Runs `timed` on the reader prepared for a first touch, run after run on fresh data, each
    /// run verified: its two figures, as two lists.
    fn first_touches(
        &mut self,
        mut timed: impl FnMut(&ManagedReader<'b>) -> Result<(f64, f64)>,
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        let (reader, runs) = (self.reader, self.runs);
        let figures = runs.collect(|| {
            let seed = self.fresh();
            reader.prepare(seed, Policy::FirstTouch)?;
            let figures = timed(reader)?;
            reader.verify(seed)?;
            Ok(figures)
        })?;
        Ok(figures.into_iter().unzip())
    }

    /// End to end on the host clock: the kernel's call until the host saw it finish, every page
    /// faulting on the way; and the call's own time (the launch overhead).
    fn end_to_end(&mut self, backend: &dyn Backend) -> Result<(Stats, f64)> {
        let (totals, calls) = self.first_touches(|reader| {
            let ((call_us, done), total_us) = host_us(backend, || {
                let ((), call_us) = host_us(backend, || reader.queue_read(Policy::FirstTouch))?;
                let done = backend.record(reader.reader())?;
                backend.event_synchronize(done)?;
                Ok((call_us, done))
            })?;
            backend.destroy_event(done)?;
            Ok((total_us, call_us))
        })?;
        Ok((Stats::of_times(&totals)?, Stats::of_times(&calls)?.median))
    }

    /// The GPU time of a read under `policy`, behind a held stream.
    fn gpu_us(&mut self, policy: Policy) -> Result<f64> {
        let reader = self.reader;
        let runs = self.runs;
        runs.stats(|| {
            let seed = self.fresh();
            reader.prepare(seed, policy)?;
            let us = reader.timed(|| reader.queue_read(policy))?;
            reader.verify(seed)?;
            Ok(us)
        })
        .map(|s| s.median)
    }

    /// The GPU's part whole under each policy, then the pages' move and the read in place, each
    /// behind a held stream; through a mapping for `dst` only where `mapped`.
    fn gpu_parts(&mut self, dst: usize, mapped: bool) -> Result<GpuParts> {
        let first_us = self.gpu_us(Policy::FirstTouch)?;
        let prefetched_us = self.gpu_us(Policy::Prefetch)?;
        let accessed_us = if mapped {
            self.reader.advise(Advice::SetAccessedBy(dst))?;
            let us = self.gpu_us(Policy::AccessedBy);
            self.reader.advise(Advice::UnsetAccessedBy(dst))?;
            Some(us?)
        } else {
            None
        };
        let (moves, reads) = self.first_touches(|reader| {
            let move_us = reader.timed(|| reader.queue_prefetch())?;
            let read_us = reader.timed(|| reader.queue_read(Policy::FirstTouch))?;
            Ok((move_us, read_us))
        })?;
        Ok(GpuParts {
            first_us,
            prefetched_us,
            accessed_us,
            move_us: Stats::of_times(&moves)?.median,
            read_us: Stats::of_times(&reads)?.median,
        })
    }
}

impl GpuParts {
    /// The parts of the read: the launch, the faults (what the first touch costs beyond the
    /// pages' move and the read in place), the move, the read, the receiver.
    fn parts(&self, launch: f64, origin: &str, dst: usize, completion: &Completion) -> Vec<Part> {
        let GpuParts {
            first_us,
            move_us,
            read_us,
            ..
        } = *self;
        vec![
            part(
                "launch overhead",
                launch,
                "CPU issue cost: host clock in the call that queues the copy kernel, in the reads \
                 timed end to end",
            ),
            part(
                "page faults",
                first_us - move_us - read_us,
                format!(
                    "GPU time of the first touch ({first_us:.2} µs, every page on {origin}) less \
                     the pages' move ({move_us:.2}) and the kernel's read of them in place \
                     ({read_us:.2}): what servicing the faults adds, inferred from the three \
                     measurements"
                ),
            ),
            part(
                "page migration",
                move_us,
                format!(
                    "GPU time of cuMemPrefetchAsync moving every page from {origin} to GPU {dst}, \
                     alone: the bytes any move of the pages carries, at the link's rate"
                ),
            ),
            part(
                "kernel read",
                read_us,
                format!(
                    "GPU time of the copy kernel reading the buffer once its pages are on GPU \
                     {dst} (after the prefetch)"
                ),
            ),
            receiver_part(completion),
        ]
    }

    /// Allocating once, a prefetch, and SetAccessedBy (or why it cannot map the pages here).
    fn fixes(
        &self,
        alloc_us: f64,
        origin: &str,
        dst: usize,
        mapping: &std::result::Result<(), String>,
    ) -> Vec<Fix> {
        let GpuParts {
            first_us,
            prefetched_us,
            read_us,
            ..
        } = *self;
        let accessed_by = match (self.accessed_us, mapping) {
            (Some(accessed_us), _) => Fix {
                part: "page faults".into(),
                fix: format!(
                    "cuMemAdvise(SetAccessedBy, {dst}): the pages stay on {origin}, mapped for GPU \
                     {dst}, whose kernel reads them across the link"
                ),
                saves_us: first_us - accessed_us,
                computed_from: format!(
                    "first touch {first_us:.2} µs − read through the mapping {accessed_us:.2} µs \
                     (GPU time, both measured); every later read crosses the link again \
                     ({accessed_us:.2} µs each), where a prefetched buffer's later reads stay \
                     local ({read_us:.2} µs)"
                ),
            },
            (None, Err(reason)) => Fix {
                part: "page faults".into(),
                fix: format!(
                    "cuMemAdvise(SetAccessedBy, {dst}) cannot map the pages here: {reason}"
                ),
                saves_us: 0.0,
                computed_from: "nothing to compare: no mapping across these GPUs".into(),
            },
            (None, Ok(())) => unreachable!("a mapping that worked was measured"),
        };
        vec![
            Fix {
                part: "setup".into(),
                fix: "allocate the managed buffer once at startup and reuse it".into(),
                saves_us: alloc_us,
                computed_from: "the managed allocation, saved once".into(),
            },
            Fix {
                part: "page faults".into(),
                fix: format!(
                    "prefetch the buffer to GPU {dst} on its stream before the kernel \
                     (cuMemPrefetchAsync): the pages move at the link's rate, without faults"
                ),
                saves_us: first_us - prefetched_us,
                computed_from: format!(
                    "first touch {first_us:.2} µs − prefetch then read {prefetched_us:.2} µs (GPU \
                     time, both measured)"
                ),
            },
            accessed_by,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{Preset, SimBackend};

    fn part_us(e: &Explanation, name: &str) -> f64 {
        e.parts.iter().find(|p| p.name == name).unwrap().us
    }

    #[test]
    fn across_nvlink_the_faults_are_the_models_and_both_fixes_save_them() {
        let sim = SimBackend::open("h200-pair").unwrap();
        let p = sim.preset().clone();
        let e = run(&sim, 0, 1, 4 << 20, &Silent).unwrap();
        let names: Vec<&str> = e.parts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "launch overhead",
                "page faults",
                "page migration",
                "kernel read",
                "receiver side"
            ]
        );
        assert!(e.adds_up_within_10_percent, "{e:#?}");
        assert!(e.route.contains("pages live on GPU 0"), "{}", e.route);
        // 64 pages of 64 KiB, each fault priced at the preset's figure.
        let faults = 64.0 * p.managed.fault_us;
        let found = part_us(&e, "page faults");
        assert!(
            (found - faults).abs() < 0.02 * faults,
            "{found} vs {faults}"
        );
        assert!(found > 0.8 * e.measured_us, "the faults dominate: {e:#?}");
        let fixes: Vec<&Fix> = e.fixes.iter().filter(|f| f.part == "page faults").collect();
        assert_eq!(fixes.len(), 2);
        assert!(fixes[0].fix.contains("cuMemPrefetchAsync"));
        assert!(fixes[1].fix.contains("SetAccessedBy"));
        for fix in fixes {
            assert!(fix.saves_us > 0.9 * faults, "{fix:?}");
        }
        let fit = e.fit.unwrap();
        assert!(fit.beta_gbps < 20.0, "on-demand β {fit:?}");
    }

    #[test]
    fn without_p2p_no_mapping_is_offered_and_with_one_gpu_the_pages_come_from_the_host() {
        let v100 = SimBackend::open("dgx1-v100").unwrap();
        let e = run(&v100, 0, 5, 1 << 20, &Silent).unwrap();
        assert!(e.route.contains("no P2P"), "{}", e.route);
        let mapping = e
            .fixes
            .iter()
            .find(|f| f.fix.contains("SetAccessedBy"))
            .unwrap();
        assert_eq!(mapping.saves_us, 0.0);
        assert!(mapping.fix.contains("cannot map"), "{}", mapping.fix);
        assert!(e.adds_up_within_10_percent, "{e:#?}");

        let one = SimBackend::open("h200-pair").unwrap();
        let e = run(&one, 1, 1, 1 << 20, &Silent).unwrap();
        assert!(e.route.contains("host memory"), "{}", e.route);
        assert!(part_us(&e, "page faults") > 0.0);
        assert!(e.adds_up_within_10_percent, "{e:#?}");
    }

    #[test]
    fn a_host_without_fault_costs_shows_no_fault_part() {
        let mut preset = Preset::load("h200-pair").unwrap();
        preset.managed.fault_us = 0.0;
        let e = run(&SimBackend::from_preset(&preset), 0, 1, 4 << 20, &Silent).unwrap();
        // What is left is the prefetch's own setup, which a fault-driven move does not pay.
        let left = part_us(&e, "page faults");
        assert!(left.abs() <= preset.costs.copy_setup_us + 0.01, "{e:#?}");
    }
}
