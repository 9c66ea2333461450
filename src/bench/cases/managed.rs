//! Managed (unified) memory between GPUs, the route many multi-GPU codes take: a copy kernel on the
//! destination GPU reads a managed buffer whose pages live on the source GPU (with one GPU, in host
//! memory) — on first touch, faulting and moving every page; after cuMemAdvise(SetAccessedBy),
//! across the link with nothing moved; after cuMemPrefetchAsync, moved ahead at the link's rate;
//! and read-mostly, duplicated — and what one page's fault costs.
//!
//! Each sample writes a fresh pattern into the managed buffer, moves its pages back to the source
//! (a prefetch, untimed), then times the read behind a held stream and checks every byte it
//! delivered.

use super::latency::{Buffers, SMALL_MESSAGE};
use super::{enable, no_p2p, Context, Outcome, TestCase};
use crate::backend::{
    Advice, Backend, BufferCopy, BufferId, CopyMethod, Location, Memory, StreamId,
};
use crate::bench::footprint::Footprint;
use crate::bench::result::{Place, Shape, Unit};
use crate::bench::stats::Stats;
use crate::bench::timing::{held_gpu_us, Runs};
use crate::pattern::{self, first_mismatch};
use crate::Result;

/// What is done to the managed buffer before the destination GPU reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Nothing: every page faults on first touch and moves to the reader.
    FirstTouch,
    /// cuMemAdvise(SetAccessedBy, reader): the pages stay put, mapped for the reader.
    AccessedBy,
    /// cuMemPrefetchAsync to the reader, in the timed window, before the read.
    Prefetch,
    /// cuMemAdvise(SetReadMostly): a read duplicates the pages instead of moving them.
    ReadMostly,
}

/// A read of managed memory across GPUs under one [`Policy`]: its bandwidth, or (the first touch
/// of one page) its latency.
pub struct ManagedRead {
    policy: Policy,
    /// One small message's time in µs, instead of a bandwidth.
    latency: bool,
}

impl ManagedRead {
    /// The bandwidth of a read of managed memory under `policy`.
    pub fn new(policy: Policy) -> ManagedRead {
        ManagedRead {
            policy,
            latency: false,
        }
    }

    /// The time of the first touch of one page on the other GPU.
    pub fn fault_latency() -> ManagedRead {
        ManagedRead {
            policy: Policy::FirstTouch,
            latency: true,
        }
    }

    /// Where the pages live before each read: the source GPU, or host memory when the source is
    /// the reader itself.
    fn origin(src: usize, dst: usize) -> Location {
        if src == dst {
            Location::Host
        } else {
            Location::Device(src)
        }
    }
}

/// A managed buffer whose pages start on a source GPU (or in host memory) and the reader's own
/// memory that a copy kernel on the destination GPU reads it into: one measurement's buffers and
/// streams, for the bench's tests and `explain`.
pub(crate) struct ManagedReader<'b> {
    backend: &'b dyn Backend,
    test: String,
    src: usize,
    dst: usize,
    origin: Location,
    managed: BufferId,
    /// The reader's own memory, where the kernel copies the managed bytes.
    local: BufferId,
    bytes: usize,
    /// The reader's stream, whose events time the read.
    reader: StreamId,
    /// The stream that moves the pages back to their origin before each read.
    mover: StreamId,
}

/// GPU µs of one timed read, and for read-mostly of the read right after it.
struct Sample {
    first_us: f64,
    again_us: Option<f64>,
}

impl<'b> ManagedReader<'b> {
    /// Allocates (in `buffers`) `bytes` of managed memory for GPU `src` and as much of GPU `dst`'s
    /// memory; `test` names the measurement in a verification error.
    pub(crate) fn open(
        ctx: &mut Context<'b>,
        buffers: &mut Buffers<'b>,
        test: &str,
        (src, dst): (usize, usize),
        bytes: usize,
    ) -> Result<ManagedReader<'b>> {
        let streams = ctx.streams(&[dst, src])?;
        Ok(ManagedReader {
            backend: ctx.backend,
            test: test.to_string(),
            src,
            dst,
            origin: ManagedRead::origin(src, dst),
            managed: buffers.alloc(Memory::Managed(src), bytes)?,
            local: buffers.alloc(Memory::Device(dst), bytes)?,
            bytes,
            reader: streams[0],
            mover: if src == dst { streams[0] } else { streams[1] },
        })
    }

    /// The destination GPU's stream, which issues the reads.
    pub(crate) fn reader(&self) -> StreamId {
        self.reader
    }

    /// Applies `advice` to the managed buffer.
    pub(crate) fn advise(&self, advice: Advice) -> Result<()> {
        self.backend.managed().advise(self.managed, advice)
    }

    /// Writes the pattern for `seed`, then puts every page back where it starts (one copy, on the
    /// origin), with `policy`'s read-mostly advice in force.
    pub(crate) fn prepare(&self, seed: u64, policy: Policy) -> Result<()> {
        let b = self.backend;
        if policy == Policy::ReadMostly {
            self.advise(Advice::UnsetReadMostly)?;
        }
        b.write(self.managed, 0, &pattern::bytes(seed, self.bytes))?;
        b.managed()
            .prefetch(self.mover, self.managed, self.origin)?;
        b.synchronize(self.mover)?;
        if policy == Policy::ReadMostly {
            self.advise(Advice::SetReadMostly)?;
        }
        Ok(())
    }

    /// Queues the read on the reader's stream: the copy kernel, after a prefetch to the reader for
    /// [`Policy::Prefetch`].
    pub(crate) fn queue_read(&self, policy: Policy) -> Result<()> {
        let b = self.backend;
        if policy == Policy::Prefetch {
            self.queue_prefetch()?;
        }
        let copy = BufferCopy::from_start(self.managed, self.local, self.bytes);
        b.copy(self.reader, CopyMethod::SmKernel, &copy)
    }

    /// Queues the move of every page to the reader on its stream.
    pub(crate) fn queue_prefetch(&self) -> Result<()> {
        self.backend
            .managed()
            .prefetch(self.reader, self.managed, Location::Device(self.dst))
    }

    /// GPU µs of what `queue` puts on the reader's stream, queued behind a held stream.
    pub(crate) fn timed(&self, queue: impl FnOnce() -> Result<()>) -> Result<f64> {
        held_gpu_us(self.backend, self.reader, queue)
    }

    /// Checks every byte the read delivered against the pattern for `seed`.
    pub(crate) fn verify(&self, seed: u64) -> Result<()> {
        let mut got = vec![0; self.bytes];
        self.backend.read(self.local, 0, &mut got)?;
        match first_mismatch(seed, &got) {
            Some(m) => Err(m.into_error(self.test.as_str(), self.src, self.dst)),
            None => Ok(()),
        }
    }

    /// One sample: fresh bytes on the origin, the timed read, every byte checked.
    fn sample(&self, seed: u64, policy: Policy) -> Result<Sample> {
        self.prepare(seed, policy)?;
        let first_us = self.timed(|| self.queue_read(policy))?;
        self.verify(seed)?;
        let again_us = match policy {
            Policy::ReadMostly => {
                let us = self.timed(|| self.queue_read(policy))?;
                self.verify(seed)?;
                Some(us)
            }
            _ => None,
        };
        Ok(Sample { first_us, again_us })
    }
}

impl TestCase for ManagedRead {
    fn name(&self) -> &str {
        match (self.policy, self.latency) {
            (Policy::FirstTouch, true) => "managed-fault-latency",
            (Policy::FirstTouch, false) => "managed-fault",
            (Policy::AccessedBy, _) => "managed-accessed-by",
            (Policy::Prefetch, _) => "managed-prefetch",
            (Policy::ReadMostly, _) => "managed-read-mostly",
        }
    }

    fn unit(&self) -> Unit {
        if self.latency {
            Unit::Micros
        } else {
            Unit::Gbps
        }
    }

    fn shape(&self) -> Shape {
        Shape::Matrix
    }

    fn message_bytes(&self, requested: u64) -> u64 {
        if self.latency {
            SMALL_MESSAGE
        } else {
            requested
        }
    }

    /// 64 MiB: a thousand 64 KiB pages, where the per-page costs have long set the rate; more
    /// pages repeat them.
    fn plateau_bytes(&self) -> u64 {
        crate::bench::PLATEAU.host
    }

    fn sweeps(&self) -> bool {
        !self.latency
    }

    fn measures(&self) -> String {
        let how = match (self.policy, self.latency) {
            (Policy::FirstTouch, true) => format!(
                "the first touch of one page: the kernel reads a {SMALL_MESSAGE} B buffer, its one \
                 page faulting and moving to the destination"
            ),
            (Policy::FirstTouch, false) => "no advice: every page faults on first touch and \
                                            moves to the destination"
                .to_string(),
            (Policy::AccessedBy, _) => "after cuMemAdvise(SetAccessedBy, destination): the pages \
                                        stay on the source, mapped for the destination, whose \
                                        kernel reads them across the link (no fault, no move)"
                .to_string(),
            (Policy::Prefetch, _) => "cuMemPrefetchAsync to the destination on its stream, then \
                                      the kernel, both in the window: the pages move ahead at \
                                      the link's rate and are read locally"
                .to_string(),
            (Policy::ReadMostly, _) => "after cuMemAdvise(SetReadMostly): the read faults and \
                                        duplicates every page onto the destination (the source \
                                        keeps its copy); the note gives the reads after it, \
                                        local"
                .to_string(),
        };
        let figure = if self.latency {
            "µs"
        } else {
            "GB/s = 1e9 bytes/s"
        };
        format!(
            "managed memory, read by a copy kernel on the destination (column) GPU into its own \
             memory from a managed buffer whose pages live on the source (row) GPU (with one GPU \
             selected, in host memory); {how}; each sample writes fresh bytes and moves the pages back \
             first (untimed), every byte verified; GPU time, {figure}"
        )
    }

    fn footprint(&self, _ctx: &Context<'_>, place: Place, bytes: u64) -> Result<Footprint> {
        let (src, dst) = place.pair();
        let mut footprint = Footprint::default();
        // The managed pages, where they start and on the reader (duplicated, under read-mostly),
        // and the reader's own copy.
        footprint.add(Memory::Managed(src), 1, bytes);
        match Self::origin(src, dst) {
            Location::Host => footprint.add_host(bytes),
            Location::Device(_) => footprint.add(Memory::Device(dst), 1, bytes),
        }
        footprint.add(Memory::Device(dst), 1, bytes);
        // The pattern written in, and the bytes read back.
        footprint.add_host(2 * bytes);
        Ok(footprint)
    }

    fn measure(&self, ctx: &mut Context<'_>, place: Place, bytes: u64) -> Result<Outcome> {
        let (src, dst) = place.pair();
        if self.policy == Policy::AccessedBy {
            // A mapping across GPUs needs P2P; without it the driver keeps the pages in host memory.
            if let Some(reason) = no_p2p(ctx.topology(), dst, src).or_else(|| enable(ctx, dst, src))
            {
                return Ok(Outcome::Skipped(reason));
            }
        }
        let origin = Self::origin(src, dst);
        let mut buffers = Buffers::new(ctx.backend);
        let read = ManagedReader::open(ctx, &mut buffers, self.name(), (src, dst), bytes as usize)?;
        if self.policy == Policy::AccessedBy {
            read.advise(Advice::SetAccessedBy(dst))?;
        }
        let samples = if self.latency {
            ctx.latency_samples
        } else {
            ctx.sampling.samples
        };
        // One sample first, thrown away: the kernel's first launch and module load.
        let runs = Runs {
            warmup: 1,
            runs: samples as usize,
        };
        let test_seed = ctx.next_seed();
        let mut sample = 0u64;
        let all = runs.collect(|| {
            sample += 1;
            read.sample(pattern::seed(&[test_seed, sample]), self.policy)
        })?;
        let first = Stats::of_times(&all.iter().map(|s| s.first_us).collect::<Vec<_>>())?;
        let again: Vec<f64> = all.iter().filter_map(|s| s.again_us).collect();
        let note = if again.is_empty() {
            None
        } else {
            let again = Stats::of_times(&again)?;
            Some(format!(
                "{origin} → GPU {dst}: reads after the first, the pages duplicated: {:.1} GB/s \
                 ({:.2} µs)",
                crate::units::gbps(bytes, again.median),
                again.median
            ))
        };
        Ok(Outcome::Measured {
            value: if self.latency {
                first.median
            } else {
                crate::units::gbps(bytes, first.median)
            },
            total: None,
            time_us: first,
            note,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::sim::{Preset, SimBackend};
    use crate::backend::Backend;
    use crate::bench::result::{BenchReport, Place, TestResult};
    use crate::bench::{progress, run, Options, Size};

    const MIB8: u64 = 8 << 20;
    const ALL: [&str; 5] = [
        "managed-fault",
        "managed-accessed-by",
        "managed-prefetch",
        "managed-read-mostly",
        "managed-fault-latency",
    ];

    fn bench(backend: &dyn Backend, tests: &[&str], devices: &[usize], bytes: u64) -> BenchReport {
        let options = Options {
            tests: Some(tests.iter().map(|t| t.to_string()).collect()),
            devices: Some(devices.to_vec()),
            size: Some(Size::Bytes(bytes)),
            ..Options::default()
        };
        run(backend, &options, &progress::Silent).unwrap()
    }

    fn test<'r>(report: &'r BenchReport, name: &str) -> &'r TestResult {
        report.tests.iter().find(|t| t.name == name).unwrap()
    }

    /// GPU µs of one operation of `name` at `place`.
    fn us(report: &BenchReport, name: &str, place: Place) -> f64 {
        test(report, name).cell(place).unwrap().time_us.median
    }

    /// The figure of `name` at `place`, in the test's unit.
    fn value(report: &BenchReport, name: &str, place: Place) -> f64 {
        test(report, name).cell(place).unwrap().value
    }

    fn h200_with_fault_us(fault_us: f64) -> SimBackend {
        let mut preset = Preset::load("h200-pair").unwrap();
        preset.managed.fault_us = fault_us;
        SimBackend::from_preset(&preset)
    }

    #[test]
    fn across_nvlink_the_figures_are_the_models_and_the_first_touch_pays_every_page_fault() {
        let sim = SimBackend::open("h200-pair").unwrap();
        let p = sim.preset().clone();
        let mut tests = ALL.to_vec();
        tests.extend(["ce-write", "sm-read"]);
        let report = bench(&sim, &tests, &[0, 1], MIB8);
        for name in ALL {
            let t = test(&report, name);
            assert_eq!(t.cells.len(), 2, "{name}: both directions measured");
            assert!(t.measures.contains("every byte verified"), "{name}");
        }
        let pair = Place::Pair { src: 0, dst: 1 };
        let pages = (MIB8 as usize).div_ceil(p.managed.page_bytes()) as f64;
        let link_gbps =
            18.0 * p.nvlink.as_ref().unwrap().link_gbps * p.nvlink.as_ref().unwrap().efficiency;
        let local_sm_gbps = p.gpu.local_copy_gbps * p.gpu.sm_copy_efficiency;
        let bytes = MIB8 as f64;
        // Prefetched: the pages cross the link at its rate, then the kernel reads them locally.
        let prefetched = us(&report, "managed-prefetch", pair);
        let moved_then_read = p.costs.copy_setup_us
            + p.nvlink.as_ref().unwrap().latency_us
            + bytes / (link_gbps * 1e3)
            + p.costs.kernel_setup_us
            + bytes / (local_sm_gbps * 1e3);
        assert!(
            (prefetched - moved_then_read).abs() < 0.02 * moved_then_read,
            "prefetched {prefetched} µs, model {moved_then_read}"
        );
        let prefetch_gbps = value(&report, "managed-prefetch", pair);
        let ce = value(&report, "ce-write", pair);
        assert!(
            prefetch_gbps > 0.75 * ce && prefetch_gbps < ce,
            "{prefetch_gbps} vs {ce}"
        );
        // The first touch moves the same bytes over the same link, and pays each page's fault on
        // top: were the faults not priced, the two would be within the prefetch's setup.
        let first = us(&report, "managed-fault", pair);
        let faults = pages * p.managed.fault_us;
        let extra = first - prefetched;
        assert!(
            (extra - (faults - p.costs.copy_setup_us)).abs() < 0.01 * faults,
            "first touch {first} µs, prefetched {prefetched}: {extra} more, {pages} faults of {} µs",
            p.managed.fault_us
        );
        // Read-mostly duplicates at the first touch's cost, and then reads locally.
        let read_mostly = test(&report, "managed-read-mostly");
        assert!((us(&report, "managed-read-mostly", pair) - first).abs() < 1e-6 * first);
        let again = &read_mostly.notes[0];
        assert!(
            again.starts_with("GPU 0 → GPU 1: reads after the first"),
            "{again}"
        );
        let again_us: f64 = again
            .rsplit('(')
            .next()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let local_read = p.costs.kernel_setup_us + bytes / (local_sm_gbps * 1e3);
        assert!(
            (again_us - local_read).abs() < 0.02 * local_read,
            "{again}: model {local_read}"
        );
        // Mapped for the reader, the pages are read across the link as a kernel reads a peer.
        let accessed = value(&report, "managed-accessed-by", pair);
        let sm_read = value(&report, "sm-read", pair);
        assert!(
            (accessed - sm_read).abs() < 0.01 * sm_read,
            "{accessed} vs {sm_read}"
        );
        // One page's fault: the fault, the kernel's launch and the link's latency.
        let latency = value(&report, "managed-fault-latency", pair);
        assert!(
            latency > p.managed.fault_us && latency < p.managed.fault_us + 3.0,
            "{latency} µs"
        );
    }

    #[test]
    fn the_fault_cost_scales_with_the_presets_figure_and_nothing_else_does() {
        let tests = ["managed-fault", "managed-prefetch", "managed-accessed-by"];
        let pair = Place::Pair { src: 1, dst: 0 };
        let cheap = bench(&h200_with_fault_us(2.0), &tests, &[0, 1], MIB8);
        let dear = bench(&h200_with_fault_us(4.0), &tests, &[0, 1], MIB8);
        let fault_part =
            |r: &BenchReport| us(r, "managed-fault", pair) - us(r, "managed-prefetch", pair);
        let (cheap_part, dear_part) = (fault_part(&cheap), fault_part(&dear));
        // 128 pages: 2 µs each, then 4 µs each (less the prefetch's own setup either way).
        assert!(
            (dear_part - cheap_part - 128.0 * 2.0).abs() < 1.0,
            "{cheap_part} {dear_part}"
        );
        for name in ["managed-prefetch", "managed-accessed-by"] {
            assert_eq!(us(&cheap, name, pair), us(&dear, name, pair), "{name}");
        }
    }

    #[test]
    fn with_one_gpu_the_pages_come_from_host_memory_at_the_pcie_rate() {
        let sim = SimBackend::open("h200-pair").unwrap();
        let p = sim.preset().clone();
        let report = bench(
            &sim,
            &["managed-fault", "managed-prefetch", "h2d"],
            &[1],
            MIB8,
        );
        let place = Place::Pair { src: 1, dst: 1 };
        let h2d = value(&report, "h2d", Place::Device { device: 1 });
        let prefetch = value(&report, "managed-prefetch", place);
        assert!(
            prefetch > 0.9 * h2d && prefetch < h2d,
            "{prefetch} vs h2d {h2d}"
        );
        let extra = us(&report, "managed-fault", place) - us(&report, "managed-prefetch", place);
        let faults = 128.0 * p.managed.fault_us;
        assert!(
            (extra - faults).abs() < 0.02 * faults,
            "{extra} vs {faults}"
        );
    }

    #[test]
    fn without_p2p_pages_move_through_host_memory_and_no_mapping_is_measured() {
        let sim = SimBackend::open("dgx1-v100").unwrap();
        let (linked, unlinked) = (
            Place::Pair { src: 0, dst: 3 },
            Place::Pair { src: 0, dst: 5 },
        );
        let report = bench(
            &sim,
            &["managed-fault", "managed-accessed-by", "managed-prefetch"],
            &[0, 3, 5],
            MIB8,
        );
        let reason = test(&report, "managed-accessed-by")
            .reason(unlinked)
            .unwrap();
        assert!(reason.starts_with("no P2P over SYS"), "{reason}");
        for name in ["managed-fault", "managed-prefetch"] {
            let t = test(&report, name);
            let (nvlink, staged) = (
                t.cell(linked).unwrap().value,
                t.cell(unlinked).unwrap().value,
            );
            assert!(
                staged < nvlink,
                "{name}: staged {staged} vs NVLink {nvlink}"
            );
        }
    }

    #[test]
    fn a_test_that_would_not_fit_in_a_gpus_free_memory_is_refused_before_it_runs() {
        let mut preset = Preset::load("h200-pair").unwrap();
        preset.gpu.memory_mib = 64;
        let sim = SimBackend::from_preset(&preset);
        let options = Options {
            tests: Some(vec!["managed-fault".into()]),
            size: Some(Size::Bytes(40 << 20)),
            ..Options::default()
        };
        let err = run(&sim, &options, &progress::Silent).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        assert!(
            err.to_string().contains("test `managed-fault` at 40 MiB"),
            "{err}"
        );
    }
}
