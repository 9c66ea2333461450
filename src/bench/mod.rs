//! Measuring: everything peerlink times, and the `bench` verb itself.
//!
//! One core that every measurement goes through:
//! - [`timing`]: how things are timed — windows of back-to-back operations behind a held stream
//!   (the bench's lanes), and runs one at a time with contenders taking turns; host clock or GPU
//!   events.
//! - [`stats`]: the one median, with the spread ([`crate::pattern`] is the one data pattern it
//!   moves). [`fit`]: `time = α + bytes/β` from a size sweep.
//! - [`footprint`]: what a run holds in memory, checked against what is free before it starts.
//!
//! What measures through it:
//! - `bench` (this module and [`cases`], one type per test), [`explain`] and [`tune`];
//! - [`proof`]: the transfer engine's choices measured against the alternatives (the engine in
//!   [`crate::engine`] only plans and moves data);
//! - [`crate::workload`]: the all-reduce, send-recv, pipeline and halo workloads, timed as
//!   nccl-tests times them: back-to-back operations between events on every rank's stream
//!   ([`timing::held_group_us`]).
//!
//! Everything here talks to a host only through [`Backend`], so all of it runs, and is tested, on
//! the simulator.

pub mod budget;
pub mod cases;
pub mod compare;
pub mod document;
pub mod explain;
pub mod fit;
pub mod footprint;
pub mod layout;
pub mod processes;
pub mod progress;
pub mod proof;
pub mod result;
pub mod stats;
pub mod timing;
pub mod tune;

use crate::backend::Backend;
use crate::units::format_bytes;
use crate::{Error, Result};
use cases::{registry, Context, Outcome, TestCase};
use layout::Layout;
use progress::Progress;
use result::{BenchReport, Cell, NotMeasured, Place, Shape, Sweep, SweepPoint, TestResult};
use timing::Sampling;

/// What `peerlink bench` runs when no test is named: the copy-engine matrices both ways and both
/// directions at once, the host links, local copies and every latency. The SM-kernel, staged and
/// fan tests (`--tests`) would more than double the time on an 8-GPU host.
pub const DEFAULT_TESTS: &[&str] = &[
    "ce-write",
    "ce-read",
    "ce-bidir-write",
    "h2d",
    "d2h",
    "local",
    "copy-latency",
    "issue-cost",
    "e2e-latency",
    "pointer-chase",
    "pointer-chase-resident",
    "ping-pong",
];

/// What `peerlink bench --sizes …` sweeps when no test is named.
pub const DEFAULT_SWEEP_TESTS: &[&str] = &["ce-write"];

/// Samples of the latency tests that cost little (copy-latency, issue-cost, e2e-latency,
/// ping-pong: a few ms per pair) on real GPUs. Three samples let one outlier move the median of
/// three `bench` runs by 50% (copy-latency on the H200 pair: one sample of 16.3 µs among 2.27);
/// the median of 21 needs eleven bad samples to move. Each test also throws its first sample (or
/// transfer, or short run) away, where first-use costs land.
pub const LATENCY_SAMPLES: u32 = 21;

/// Bytes per message by kind of copy, where a real GPU's figure comes within 1% of its plateau
/// (the median at 1 GiB, buffers rotated): what `bench` uses by default on GPUs and with
/// `--size plateau`. A copy costs `α + bytes/β`, so it runs at `1 / (1 + α·β/bytes)` of β.
pub const PLATEAU: PlateauSizes = PlateauSizes {
    // nvbandwidth's default. On the H200 pair ce-write ran at 388.3 GB/s at 64 MiB (−2%) and 396.4
    // at 512 MiB, a lone 256 MiB copy at 391.6 (−1.2%): more than α (2.46 µs × 392 GB/s, 0.4% of
    // 256 MiB) holds the mid sizes back.
    peer: 512 << 20,
    // Host links: α·β = 2.5 µs × 55 GB/s = 0.14 MB, 0.2% of 64 MiB (h2d 55.3 GB/s at 64 MiB
    // against 54.8–55.1 at 256 MiB on the H200); the staged route is chunked in eighths, which no
    // larger size improves.
    host: 64 << 20,
    // Copies within a GPU: α·β = 1.9 µs × 2050 GB/s = 3.9 MB, 0.36% of 1 GiB (the H200 pair's 64 MiB
    // ran at 1944 GB/s, 256 MiB copies at 2006–2096).
    local: 1 << 30,
};

/// Plateau sizes by kind of copy (see [`PLATEAU`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlateauSizes {
    /// Copies between two GPUs (and fans of them).
    pub peer: u64,
    /// Copies between a GPU and pinned host memory, and copies staged through it.
    pub host: u64,
    /// Copies within one GPU.
    pub local: u64,
}

/// Bytes per message the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// The same for every test.
    Bytes(u64),
    /// Each test at its plateau size ([`PLATEAU`]), on the simulator too (to compare with a GPU).
    Plateau,
}

impl Size {
    /// `bench --size`: a size, or `plateau`.
    pub fn parse(text: &str) -> Result<Size> {
        if text == "plateau" {
            return Ok(Size::Plateau);
        }
        crate::units::parse::parse_size(text)
            .map(Size::Bytes)
            .map_err(|e| {
                Error::usage(format!(
                    "{e}; or `plateau` for each test at its plateau size"
                ))
            })
    }
}

/// `bench --rotation`: a size, or 0 for one buffer.
pub fn parse_rotation(text: &str) -> Result<u64> {
    if text.trim() == "0" {
        return Ok(0);
    }
    crate::units::parse::parse_size(text)
}

/// The user's choices; `None` means the default for the backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    pub tests: Option<Vec<String>>,
    pub devices: Option<Vec<usize>>,
    /// Bytes per message for bandwidth tests.
    pub size: Option<Size>,
    pub samples: Option<u32>,
    pub iterations: Option<u32>,
    /// Untimed operations before each sample's window.
    pub warmup: Option<u32>,
    /// Bytes each lane rotates its operations over (0: one buffer), so that a cache cannot serve
    /// them.
    pub rotation: Option<u64>,
    /// Message sizes to sweep; when set, the run is a sweep.
    pub sizes: Option<Vec<u64>>,
}

/// Defaults that depend on whether the host is simulated.
#[derive(Clone, Debug, PartialEq)]
pub struct Defaults {
    pub size: Size,
    pub sampling: Sampling,
    /// Samples of copy-latency, issue-cost, e2e-latency and ping-pong (see [`LATENCY_SAMPLES`]).
    pub latency_samples: u32,
    pub chase_region_bytes: u64,
    /// The most bytes `--rotation` may span per buffer (`None`: only the GPU's memory bounds it).
    pub rotation_cap: Option<u64>,
    /// What differs from the real-GPU defaults, and why.
    pub note: Option<String>,
}

/// The simulator's bound on `--rotation`: it models no caches, so rotating measures nothing more
/// there, and every slot is host memory it fills on the CPU (a 1 TiB rotation asked of an 8-GPU
/// preset held 4 GB and ran for 200 s). 16 MiB still gives the default 8 MiB message two slots,
/// so the rotation itself stays exercised and verified.
pub const SIM_ROTATION_CAP: u64 = 16 << 20;

impl Defaults {
    /// On real GPUs each test at its plateau size ([`PLATEAU`]) and nvbandwidth's counts (4
    /// warm-up and 16 timed operations, 3 samples). The simulator copies real bytes on the CPU,
    /// models no caches and repeats its virtual time exactly, so there: 8 MiB messages, 1 warm-up
    /// and 2 timed operations, one sample, no buffer rotation and a small pointer-chase region —
    /// and the report says so.
    pub fn for_backend(backend: &dyn Backend) -> Defaults {
        if backend.topology().is_simulated() {
            Defaults {
                size: Size::Bytes(8 << 20),
                sampling: Sampling {
                    warmup: 1,
                    iterations: 2,
                    samples: 1,
                    rotation_bytes: 0,
                },
                latency_samples: 1,
                chase_region_bytes: 1 << 20,
                rotation_cap: Some(SIM_ROTATION_CAP),
                note: Some(
                    "simulator defaults: 8 MiB messages (not each test's plateau size, 64 MiB \
                     to 1 GiB), 1 warm-up and 2 timed operations (not 4 and 16), 1 sample (its \
                     virtual time repeats exactly), no buffer rotation (it models no caches), \
                     because it copies every byte for real on the CPU; at 8 MiB the per-copy \
                     overhead α still shows, so --size plateau comes closer to the link's rate \
                     (and compares with a GPU's default bench)"
                        .to_string(),
                ),
            }
        } else {
            Defaults {
                size: Size::Plateau,
                sampling: Sampling {
                    warmup: 4,
                    iterations: 16,
                    samples: 3,
                    // A 64 MiB message already overflows the H200's 60 MB L2; smaller ones rotate.
                    rotation_bytes: 64 << 20,
                },
                latency_samples: LATENCY_SAMPLES,
                chase_region_bytes: 256 << 20,
                rotation_cap: None,
                note: None,
            }
        }
    }
}

/// The test cases named by `names`, or a usage error listing the known ones.
pub fn select_tests(names: &[String]) -> Result<Vec<Box<dyn TestCase>>> {
    let mut all = registry();
    let known: Vec<String> = all.iter().map(|t| t.name().to_string()).collect();
    let mut chosen = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let Some(at) = all.iter().position(|t| t.name() == name.as_str()) else {
            if names[..i].contains(name) {
                return Err(Error::usage(format!(
                    "test `{name}` is named twice in --tests: name each test once"
                )));
            }
            return Err(Error::usage(format!(
                "unknown test `{name}`; known tests: {}",
                known.join(", ")
            )));
        };
        chosen.push(all.remove(at));
    }
    if chosen.is_empty() {
        return Err(Error::usage(format!(
            "no test named; known tests: {}",
            known.join(", ")
        )));
    }
    Ok(chosen)
}

/// The test named `name`, if there is one.
pub fn find_test(name: &str) -> Option<Box<dyn TestCase>> {
    registry().into_iter().find(|t| t.name() == name)
}

/// What a run measured, and the failure that stopped it part-way if one did: like a stop request
/// ([`crate::interrupt`]), a failure while measuring keeps every figure measured before it.
#[derive(Debug)]
pub struct Kept<T> {
    pub found: T,
    pub failure: Option<Error>,
}

impl<T> Kept<T> {
    /// What was measured, with nothing failed.
    pub fn whole(found: T) -> Kept<T> {
        Kept {
            found,
            failure: None,
        }
    }

    /// What was measured, or the failure that stopped the run.
    pub fn into_result(self) -> Result<T> {
        match self.failure {
            Some(failure) => Err(failure),
            None => Ok(self.found),
        }
    }
}

/// Why a place was not measured after a failure stopped the run.
pub const STOPPED_BY_FAILURE: &str =
    "not measured: the run stopped at the failure named beside an earlier figure";

/// Runs `peerlink bench`: the named (or default) tests, or size sweeps when `options.sizes` is set.
pub fn run(
    backend: &dyn Backend,
    options: &Options,
    progress: &dyn Progress,
) -> Result<BenchReport> {
    run_keeping(backend, options, progress)?.into_result()
}

/// Runs `peerlink bench` laid out as `layout` says: in this process ([`run_keeping`]), or as this
/// rank of a group, one GPU each ([`processes::run`]), where rank 0 returns what every rank
/// measured and the others `None`.
pub fn run_laid_out(
    layout: Layout<'_>,
    backend: &dyn Backend,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Option<Kept<BenchReport>>> {
    match layout {
        Layout::OneProcess => run_keeping(backend, options, progress).map(Some),
        Layout::RankPerProcess(group) => {
            Ok(processes::run(backend, group, options, progress)?.map(Kept::whole))
        }
    }
}

/// [`run`], keeping what was measured before a failure while measuring; a usage error, found before
/// anything is measured, is the `Err`.
pub fn run_keeping(
    backend: &dyn Backend,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Kept<BenchReport>> {
    let topo = backend.topology();
    let devices = topo.select(options.devices.as_deref())?;
    let defaults = Defaults::for_backend(backend);
    let (sampling, rotation_note) = sampling(options, &defaults)?;
    let sweeping = options.sizes.is_some();
    let names: Vec<String> = match &options.tests {
        Some(names) => names.clone(),
        None if sweeping => DEFAULT_SWEEP_TESTS.iter().map(|s| s.to_string()).collect(),
        None => DEFAULT_TESTS.iter().map(|s| s.to_string()).collect(),
    };
    let tests = select_tests(&names)?;
    let size = options.size.unwrap_or(defaults.size);
    let size_of = |test: &dyn TestCase| match size {
        Size::Bytes(bytes) => bytes,
        Size::Plateau => test.plateau_bytes(),
    };
    let sizes = options.sizes.clone().unwrap_or_default();
    if sweeping && sizes.is_empty() {
        return Err(Error::usage("--sizes names no size"));
    }

    let mut notes = Vec::new();
    if topo.is_simulated() {
        notes.push(format!(
            "SIMULATED host ({}): every figure comes from the preset's link model on a virtual \
             clock, not from hardware; the bytes are really copied and verified",
            backend.source()
        ));
    }
    notes.extend(defaults.note.clone());
    notes.extend(rotation_note);
    if let [only] = devices[..] {
        notes.push(format!(
            "one GPU selected: GPU {only} is its own peer, so its pair tests measure ({only},{only}) \
             — on real hardware a device-local copy through the same peer-copy API"
        ));
    }
    let mut ctx = Context::new(
        backend,
        devices.clone(),
        sampling,
        defaults.chase_region_bytes,
    );
    // --samples sets every test's samples; by default the cheap latency tests take more.
    ctx.latency_samples = options.samples.unwrap_or(defaults.latency_samples);
    let mut report = BenchReport {
        devices: devices.clone(),
        timing: sampling,
        notes,
        tests: Vec::new(),
        sweeps: Vec::new(),
    };
    if !topo.is_simulated() {
        first_use(&mut ctx)?;
    }
    if sweeping {
        for test in &tests {
            if !test.sweeps() || test.shape() != Shape::Matrix {
                return Err(Error::usage(format!(
                    "test `{}` has no size sweep (it measures at one fixed size); sweepable tests: {}",
                    test.name(),
                    registry()
                        .iter()
                        .filter(|t| t.sweeps())
                        .map(|t| t.name().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        let largest = sizes.iter().copied().max().unwrap_or(0);
        check_footprints(&ctx, &tests, |_| largest)?;
        for test in tests.iter().take_while(|_| !crate::interrupt::requested()) {
            let swept = sweep(&mut ctx, test.as_ref(), &sizes, progress);
            report.sweeps.extend(swept.found);
            if swept.failure.is_some() {
                return Ok(Kept {
                    found: report,
                    failure: swept.failure,
                });
            }
        }
    } else {
        check_footprints(&ctx, &tests, size_of)?;
        for test in tests.iter().take_while(|_| !crate::interrupt::requested()) {
            let started = backend.host_time_us();
            let mut kept = run_test(&mut ctx, test.as_ref(), size_of(test.as_ref()), progress);
            kept.found.wall_s = (backend.host_time_us() - started) / 1e6;
            report.tests.push(kept.found);
            if kept.failure.is_some() {
                return Ok(Kept {
                    found: report,
                    failure: kept.failure,
                });
            }
        }
    }
    Ok(Kept::whole(report))
}

/// The sampling the user's options ask for, each count checked, the backend's defaults for the
/// rest; and a note when the rotation asked for was bounded ([`Defaults::rotation_cap`]).
fn sampling(options: &Options, defaults: &Defaults) -> Result<(Sampling, Option<String>)> {
    let asked = options.rotation.unwrap_or(defaults.sampling.rotation_bytes);
    let (rotation_bytes, note) = match defaults.rotation_cap {
        Some(cap) if asked > cap => (
            cap,
            Some(format!(
                "--rotation {} bounded to {} per buffer on the simulator: it models no caches, \
                 and each slot is host memory it fills on the CPU",
                crate::units::format_bytes(asked),
                crate::units::format_bytes(cap)
            )),
        ),
        _ => (asked, None),
    };
    let sampling = Sampling {
        iterations: counted(options.iterations, "--iterations", 1, MAX_ITERATIONS)?
            .unwrap_or(defaults.sampling.iterations),
        samples: counted(options.samples, "--samples", 1, MAX_SAMPLES)?
            .unwrap_or(defaults.sampling.samples),
        warmup: counted(options.warmup, "--warmup", 0, MAX_ITERATIONS)?
            .unwrap_or(defaults.sampling.warmup),
        rotation_bytes,
    };
    Ok((sampling, note))
}

/// Pays the run's first-use costs on every selected GPU before the first test's clock starts: a
/// stream, and the kernels compiled (about 0.2 s, once per architecture) and loaded (per GPU). They
/// come once per run, where the extrapolation to more GPUs ([`budget`]) would multiply them with
/// the first test's places (on the H200 pair ce-write, first, took 0.38 s more than ce-read). The
/// simulator has no first use to pay.
fn first_use(ctx: &mut Context<'_>) -> Result<()> {
    let devices = ctx.devices.clone();
    for stream in ctx.streams(&devices)? {
        let gate = ctx.backend.hold(stream)?;
        ctx.backend.release(gate)?;
        ctx.backend.synchronize(stream)?;
    }
    Ok(())
}

/// Why a place was not measured after a stop was requested ([`crate::interrupt`]).
pub const INTERRUPTED: &str = "interrupted: the run was stopped before this was measured";

/// The most samples per measurement: each keeps its times until the median is taken, and a
/// thousand already pin a median far below any run-to-run drift.
pub const MAX_SAMPLES: u32 = 1000;

/// The most operations in one timed window (and untimed warm-up ones): each is queued behind a
/// held stream before any runs, and the host keeps each one's record until the window ends.
pub const MAX_ITERATIONS: u32 = 100_000;

/// A count the user gave, checked against its range (`None`: the default).
pub(crate) fn counted(
    value: Option<u32>,
    flag: &str,
    least: u32,
    most: u32,
) -> Result<Option<u32>> {
    match value {
        Some(v) if v < least => Err(Error::usage(format!("{flag} must be at least {least}"))),
        Some(v) if v > most => Err(Error::usage(format!(
            "{flag} {v} is more than peerlink takes ({most}): ask for at most {most}"
        ))),
        other => Ok(other),
    }
}

/// Refuses, before anything is measured, a test that would not fit in memory at some place, at
/// the size `bytes_of` gives it.
fn check_footprints(
    ctx: &Context<'_>,
    tests: &[Box<dyn TestCase>],
    bytes_of: impl Fn(&dyn TestCase) -> u64,
) -> Result<()> {
    for test in tests {
        let bytes = test.message_bytes(bytes_of(test.as_ref()));
        for place in places(test.shape(), &ctx.devices).0 {
            let at = match place {
                Place::Pair { src, dst } => format!("GPU {src} → GPU {dst}"),
                Place::Device { device } => format!("GPU {device}"),
            };
            let what = format!("test `{}` at {} ({at})", test.name(), format_bytes(bytes));
            test.footprint(ctx, place, bytes)?.check(
                ctx.backend,
                &what,
                "choose a smaller --size",
            )?;
        }
    }
    Ok(())
}

/// A usage error when a message of `bytes` cannot fit in a selected GPU's free memory.
pub fn check_fits(backend: &dyn Backend, devices: &[usize], bytes: u64) -> Result<()> {
    for &device in devices {
        let free = backend.free_memory(device)?;
        if bytes > free {
            return Err(Error::usage(format!(
                "size {} is larger than GPU {device}'s free memory ({}): choose a smaller --size",
                format_bytes(bytes),
                format_bytes(free)
            )));
        }
    }
    Ok(())
}

/// The places a test measures on `devices`, and those it leaves out with a reason.
pub(crate) fn places(shape: Shape, devices: &[usize]) -> (Vec<Place>, Vec<NotMeasured>) {
    match shape {
        Shape::PerDevice => (
            devices
                .iter()
                .map(|&device| Place::Device { device })
                .collect(),
            Vec::new(),
        ),
        Shape::Matrix if devices.len() == 1 => (
            vec![Place::Pair {
                src: devices[0],
                dst: devices[0],
            }],
            Vec::new(),
        ),
        Shape::Matrix => {
            let mut measured = Vec::new();
            let mut skipped = Vec::new();
            for &src in devices {
                for &dst in devices {
                    let place = Place::Pair { src, dst };
                    if src == dst {
                        skipped.push(NotMeasured {
                            place,
                            reason: "same GPU: the `local` test measures copies within one GPU"
                                .to_string(),
                        });
                    } else {
                        measured.push(place);
                    }
                }
            }
            (measured, skipped)
        }
    }
}

/// Runs one test over every place at `bytes` per message; a failure at a place ends the test
/// there, keeping the places measured before it.
pub fn run_test(
    ctx: &mut Context<'_>,
    test: &dyn TestCase,
    bytes: u64,
    progress: &dyn Progress,
) -> Kept<TestResult> {
    let (todo, mut not_measured) = places(test.shape(), &ctx.devices);
    let bytes = test.message_bytes(bytes);
    let mut cells = Vec::new();
    let mut notes = Vec::new();
    let mut failure: Option<Error> = None;
    progress.start(test.name(), todo.len() as u64);
    for place in todo {
        let stopped = match &failure {
            Some(_) => Some(STOPPED_BY_FAILURE),
            None => crate::interrupt::requested().then_some(INTERRUPTED),
        };
        if let Some(reason) = stopped {
            not_measured.push(NotMeasured {
                place,
                reason: reason.to_string(),
            });
            continue;
        }
        let outcome = match test.measure(ctx, place, bytes) {
            Ok(outcome) => outcome,
            // Stopped part-way: this place is dropped, the ones before it kept.
            Err(Error::Interrupted) => {
                let reason = INTERRUPTED.to_string();
                not_measured.push(NotMeasured { place, reason });
                continue;
            }
            Err(e) => {
                let reason = format!("failed: {e}");
                not_measured.push(NotMeasured { place, reason });
                failure = Some(e);
                continue;
            }
        };
        match outcome {
            Outcome::Measured {
                value,
                total,
                time_us,
                note,
            } => {
                cells.push(Cell {
                    place,
                    value,
                    total,
                    time_us,
                });
                notes.extend(note);
            }
            Outcome::Skipped(reason) => not_measured.push(NotMeasured { place, reason }),
        }
        progress.step();
    }
    progress.finish();
    let devices = ctx.topology().devices.len();
    let mut result = TestResult::new(test.info(bytes), devices, cells, not_measured);
    result.notes = notes;
    Kept {
        found: result,
        failure,
    }
}

/// Sweeps one test over `sizes` on every pair, fitting α and β per pair; a failure ends the
/// sweeps there, keeping the pairs swept before it.
pub fn sweep(
    ctx: &mut Context<'_>,
    test: &dyn TestCase,
    sizes: &[u64],
    progress: &dyn Progress,
) -> Kept<Vec<Sweep>> {
    let (pairs, _) = places(Shape::Matrix, &ctx.devices);
    let mut kept = Kept::whole(Vec::with_capacity(pairs.len()));
    progress.start(
        &format!("{} sweep", test.name()),
        (pairs.len() * sizes.len()) as u64,
    );
    for place in pairs {
        if crate::interrupt::requested() {
            break;
        }
        match sweep_pair(ctx, test, place, sizes, progress) {
            Ok(swept) => kept.found.push(swept),
            Err(e) => {
                kept.failure = Some(e);
                break;
            }
        }
    }
    progress.finish();
    kept
}

/// Sweeps one test over `sizes` on one pair and fits α and β; stops at the first size that cannot be
/// measured (a pair without P2P cannot be measured at any size).
pub fn sweep_pair(
    ctx: &mut Context<'_>,
    test: &dyn TestCase,
    place: Place,
    sizes: &[u64],
    progress: &dyn Progress,
) -> Result<Sweep> {
    let (src, dst) = place.pair();
    let mut points = Vec::with_capacity(sizes.len());
    let mut not_measured = None;
    for &bytes in sizes {
        if crate::interrupt::requested() {
            not_measured = Some(INTERRUPTED.to_string());
            break;
        }
        let outcome = match test.measure(ctx, place, bytes) {
            Err(Error::Interrupted) => Outcome::Skipped(INTERRUPTED.to_string()),
            other => other?,
        };
        match outcome {
            Outcome::Measured { time_us, .. } => points.push(SweepPoint {
                bytes,
                median_us: time_us.median,
                p99_us: time_us.p99,
                gbps: crate::units::gbps(bytes, time_us.median),
            }),
            Outcome::Skipped(reason) => {
                not_measured = Some(reason);
                break;
            }
        }
        progress.step();
    }
    let fit = fit::fit(
        &points
            .iter()
            .map(|p| (p.bytes, p.median_us))
            .collect::<Vec<_>>(),
    );
    Ok(Sweep {
        test: test.name().to_string(),
        src,
        dst,
        measures: test.measures(),
        points,
        fit,
        not_measured,
    })
}
#[cfg(test)]
mod sim_tests;
