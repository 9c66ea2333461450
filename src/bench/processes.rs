//! `bench` across processes: one process per GPU, as real jobs run (`peerlink launch -n N -- bench`,
//! torchrun, Slurm, mpirun on one host).
//!
//! Rank `r` owns GPU `LOCAL_RANK`. For each ordered pair of ranks, in the same order on every rank,
//! the rank that issues the copies (the source's for a write, the destination's for a read) opens
//! the other rank's buffer: the other rank allocates it on its GPU and exports it
//! ([`crate::backend::Sharing`]: a CUDA IPC handle, or on the simulator a shared file whose
//! descriptor travels over the group's Unix socket); the issuer imports it and times its copies as
//! the single-process test does (held stream, warm-up, GPU events), then checks every byte of the
//! destination. Where the destination was the other rank's (a write), that rank checks every byte
//! again in its own memory. Rank 0 gathers the figures into the one bench document.
//!
//! A rank that fails says why to the others through the group, and every rank stops: the one at
//! fault with its own error, the others with [`Error::Group`] naming it. A rank that dies or hangs
//! is the group's to detect (see [`crate::launch`]).

use super::cases::{enable, no_p2p, Context, Initiator, Transport};
use super::layout::{sharing_words, Ranks};
use super::progress::Progress;
use super::result::{BenchReport, Cell, NotMeasured, Place, TestResult};
use super::timing::{check_ranges, measure, Given, HopSpec, Lane, Sampling};
use super::{find_test, sampling, Defaults, Options, Size, DEFAULT_TESTS};
use crate::backend::collective::BufferRange;
use crate::backend::{Backend, BufferId, CopyMethod, Memory, Owned, SharedBuffer};
use crate::launch::agree::exchange;
use crate::launch::Group;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// The tests that run across processes, and how each moves its bytes between the two ranks' GPUs:
/// one copy issued by the source's rank into the destination's memory (a write) or by the
/// destination's rank from the source's memory (a read), or staged through pinned host memory (the
/// source's rank issues both hops, device→host on its GPU and host→device on the other GPU, which it
/// sees too).
pub const CROSS_PROCESS_TESTS: &[(&str, Transport, Initiator)] = &[
    (
        "ce-write",
        Transport::Direct(CopyMethod::CopyEngine),
        Initiator::Source,
    ),
    (
        "ce-read",
        Transport::Direct(CopyMethod::CopyEngine),
        Initiator::Destination,
    ),
    (
        "sm-write",
        Transport::Direct(CopyMethod::SmKernel),
        Initiator::Source,
    ),
    (
        "sm-read",
        Transport::Direct(CopyMethod::SmKernel),
        Initiator::Destination,
    ),
    ("staged", Transport::Staged, Initiator::Source),
];

/// A cross-process test as [`CROSS_PROCESS_TESTS`] lists it.
type CrossTest = (&'static str, Transport, Initiator);

/// What the issuer of a pair found.
#[derive(Serialize, Deserialize)]
enum Found {
    /// The figure, and where each message lies in the exporter's buffer with its pattern's seed
    /// (for a write; nothing to check there for a read).
    Measured {
        cell: Cell,
        expected: Vec<(usize, usize, u64)>,
    },
    Skipped(String),
}

/// The run's fixed choices, the same on every rank.
struct Run<'a> {
    backend: &'a dyn Backend,
    ranks: Ranks<'a>,
    sampling: Sampling,
    /// The smallest buffer budget of any rank: every rank sizes the same buffers.
    budget: u64,
}

/// Runs `bench` as this rank of `group`; rank 0 returns the report, the others `None`.
pub fn run(
    backend: &dyn Backend,
    group: &Group,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Option<BenchReport>> {
    let ranks = join(backend, group, options)?;
    let names: Vec<String> = match &options.tests {
        Some(names) => names.clone(),
        None => vec![DEFAULT_TESTS[0].to_string()],
    };
    let tests = names
        .iter()
        .map(|name| cross_process_test(name))
        .collect::<Result<Vec<_>>>()?;
    let defaults = Defaults::for_backend(backend);
    let (sampling, rotation_note) = sampling(options, &defaults)?;
    let mut ctx = Context::new(backend, vec![ranks.gpu()], sampling, 0);
    let budgets = exchange(group, ctx.buffer_budget(ranks.gpu()))?;
    let run = Run {
        backend,
        budget: budgets.into_iter().min().expect("a group has ranks"),
        ranks,
        sampling,
    };
    let progress = run.ranks.progress(progress);
    let size = options.size.unwrap_or(defaults.size);
    let mut results = Vec::with_capacity(tests.len());
    for cross in tests {
        results.push(run.test(&mut ctx, cross, size, &progress)?);
    }
    let Some(mut notes) = run.ranks.on_rank_zero(Vec::new) else {
        return Ok(None);
    };
    if backend.topology().is_simulated() {
        notes.push(format!(
            "SIMULATED host ({}): every figure comes from the preset's link model on each \
             process's own virtual clock, not from hardware; the bytes really cross between the \
             processes (a shared file) and are verified",
            backend.source()
        ));
    }
    notes.push(format!(
        "measured {}: the rank that issues the copies opens a buffer the other process exported \
         ({}); every byte of the destination checked, a write's again by its owner in its own \
         memory",
        run.ranks.note(),
        sharing_words(backend)
    ));
    notes.extend(defaults.note);
    notes.extend(rotation_note);
    let mut devices = run.ranks.gpus.clone();
    devices.sort_unstable();
    Ok(Some(BenchReport {
        devices,
        timing: sampling,
        notes,
        tests: results,
        sweeps: Vec::new(),
    }))
}

/// This rank of `group`, where a run across processes can do what `options` ask; else a usage
/// error, the same on every rank.
fn join<'g>(backend: &dyn Backend, group: &'g Group, options: &Options) -> Result<Ranks<'g>> {
    if options.sizes.is_some() {
        return Err(Error::usage(
            "--sizes: size sweeps run in one process; across processes bench measures one size \
             (--size)",
        ));
    }
    let alone = "run bench in one process";
    Ranks::join(backend, group, "bench", options.devices.is_some(), alone)
}

/// The cross-process test named `name`, or a usage error naming those there are.
fn cross_process_test(name: &str) -> Result<CrossTest> {
    CROSS_PROCESS_TESTS
        .iter()
        .find(|(known, ..)| *known == name)
        .copied()
        .ok_or_else(|| {
            let known: Vec<&str> = CROSS_PROCESS_TESTS.iter().map(|(n, ..)| *n).collect();
            Error::usage(format!(
                "test `{name}` does not run across processes; those that do: {} (the others run \
                 in one process: `peerlink bench` without launch)",
                known.join(", ")
            ))
        })
}

impl Run<'_> {
    /// One test over every ordered pair of ranks.
    fn test(
        &self,
        ctx: &mut Context<'_>,
        cross: CrossTest,
        size: Size,
        progress: &dyn Progress,
    ) -> Result<TestResult> {
        let (name, world) = (cross.0, self.ranks.gpus.len());
        let test = find_test(name).expect("cross-process tests are registered");
        let message = match size {
            Size::Bytes(bytes) => bytes,
            Size::Plateau => test.plateau_bytes(),
        };
        progress.start(name, (world * (world - 1)) as u64);
        let started = self.backend.host_time_us();
        let (mut cells, mut not_measured) = (Vec::new(), Vec::new());
        for src in 0..world {
            for dst in (0..world).filter(|&d| d != src) {
                let place = Place::Pair {
                    src: self.ranks.gpus[src],
                    dst: self.ranks.gpus[dst],
                };
                match self.pair(ctx, cross, (src, dst), message as usize)? {
                    Found::Measured { cell, .. } => cells.push(cell),
                    Found::Skipped(reason) => not_measured.push(NotMeasured { place, reason }),
                }
                progress.step();
            }
        }
        progress.finish();
        let devices = self.backend.topology().devices.len();
        let mut result = TestResult::new(test.info(message), devices, cells, not_measured);
        result.wall_s = (self.backend.host_time_us() - started) / 1e6;
        Ok(result)
    }

    /// One ordered pair of ranks, `src` → `dst`: the exporter offers its buffer, the issuer
    /// measures through its import, the exporter checks what landed in its memory. Every rank takes
    /// each step.
    fn pair(
        &self,
        ctx: &mut Context<'_>,
        test: CrossTest,
        (src, dst): (usize, usize),
        message: usize,
    ) -> Result<Found> {
        let (issuer, exporter) = match test.2 {
            Initiator::Source => (src, dst),
            Initiator::Destination => (dst, src),
        };
        let (group, rank) = (self.ranks.group, self.ranks.me());
        let bytes = Lane::buffer_bytes(message, &self.sampling, self.budget);
        // The exporter's buffer lives until the issuer has closed its import and the exporter
        // has checked it.
        let mut owned: Option<Owned<'_, BufferId>> = None;
        let export = if rank == exporter {
            let memory = Memory::Device(self.ranks.gpus[exporter]);
            self.backend.alloc(memory, bytes).and_then(|id| {
                let id = owned.insert(Owned::new(self.backend, id));
                Ok(vec![(0, self.backend.sharing().export(**id)?)])
            })
        } else {
            Ok(Vec::new())
        };
        let given = self.ranks.hand_over(&[(exporter, issuer)], export)?;
        let found = match given.into_iter().next() {
            Some((_, shared)) => self.issue(ctx, test, (src, dst), message, shared).map(Some),
            None => Ok(None),
        };
        let found = exchange(group, found)?
            .swap_remove(issuer)
            .expect("the issuer reports");
        let verdict = match (&found, &owned) {
            (Found::Measured { expected, .. }, Some(id)) => {
                self.check_owned(**id, test.0, (src, dst), expected)
            }
            _ => Ok(()),
        };
        exchange(group, verdict)?;
        if let Some(id) = owned {
            id.release()?;
        }
        Ok(found)
    }

    /// The issuer's part: import the other rank's buffer (the destination of a write, the source
    /// of a read) and time copies into or out of it.
    fn issue(
        &self,
        ctx: &mut Context<'_>,
        (name, transport, initiator): CrossTest,
        (src, dst): (usize, usize),
        message: usize,
        shared: SharedBuffer,
    ) -> Result<Found> {
        let (from, to) = (self.ranks.gpus[src], self.ranks.gpus[dst]);
        // The import is mapped for the GPU whose hop touches it: the issuing GPU of a direct
        // copy; the memory's own GPU for a staged one (its host-to-device or device-to-host hop).
        let owner = match initiator {
            Initiator::Source => to,
            Initiator::Destination => from,
        };
        let (hops, reaching) = match transport {
            Transport::Direct(method) => {
                let (issuing, peer) = match initiator {
                    Initiator::Source => (from, to),
                    Initiator::Destination => (to, from),
                };
                let refused =
                    no_p2p(ctx.topology(), issuing, peer).or_else(|| enable(ctx, issuing, peer));
                if let Some(reason) = refused {
                    return Ok(Found::Skipped(reason));
                }
                let hop = HopSpec {
                    stream: ctx.streams(&[issuing])?[0],
                    method,
                    memory: Memory::Device(to),
                };
                (vec![hop], issuing)
            }
            Transport::Staged => {
                let streams = ctx.streams(&[from, to])?;
                let numa_node = ctx.topology().devices[to].numa_node;
                let hop = |stream, memory| HopSpec {
                    stream,
                    method: CopyMethod::CopyEngine,
                    memory,
                };
                let hops = vec![
                    hop(streams[0], Memory::PinnedHost { numa_node }),
                    hop(streams[1], Memory::Device(to)),
                ];
                (hops, owner)
            }
        };
        let imported = self.backend.sharing().import(shared, reaching)?;
        let given = match initiator {
            Initiator::Source => Given::Destination(imported),
            Initiator::Destination => Given::Source(imported),
        };
        let mut lanes = vec![Lane::with_given(
            self.backend,
            Context::label(name, from, to),
            Memory::Device(from),
            &hops,
            (message, &self.sampling, self.budget),
            given,
        )?];
        let seed = ctx.next_seed();
        let m = measure(&mut lanes, &self.sampling, seed)?;
        // The exporter holds a write's destination: it checks it again. A read's landed here.
        let expected = match given {
            Given::Destination(_) => lanes[0]
                .expected()
                .into_iter()
                .map(|(range, seed)| (range.offset, range.len, seed))
                .collect(),
            Given::Source(_) => Vec::new(),
        };
        let cell = Cell {
            place: Place::Pair { src: from, dst: to },
            value: m.lane_gbps(0, message),
            total: None,
            time_us: m.lane_us[0],
        };
        Ok(Found::Measured { cell, expected })
    }

    /// The exporter's check of every byte the issuer says it wrote, in its own memory.
    fn check_owned(
        &self,
        buffer: BufferId,
        test: &str,
        (src, dst): (usize, usize),
        expected: &[(usize, usize, u64)],
    ) -> Result<()> {
        let ranges: Vec<(BufferRange, u64)> = expected
            .iter()
            .map(|&(offset, len, seed)| {
                (
                    BufferRange {
                        buffer,
                        offset,
                        len,
                    },
                    seed,
                )
            })
            .collect();
        let (src, dst) = (self.ranks.gpus[src], self.ranks.gpus[dst]);
        match check_ranges(self.backend, Memory::Device(dst), &ranges)? {
            Some(m) => Err(m.into_error(format!("{test} (seen by the owner)"), src, dst)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::bench::progress::Silent;
    use crate::launch::tests::{on_ranks, rendezvous};

    #[test]
    fn ranks_as_threads_measure_every_pair_and_only_rank_0_reports() {
        let reports = on_ranks(2, &rendezvous(20_000), |group| {
            let backend = SimBackend::open("pcie-2gpu-switch").unwrap();
            let options = Options {
                tests: Some(vec!["ce-write".into(), "sm-read".into(), "staged".into()]),
                size: Some(Size::Bytes(1 << 20)),
                ..Options::default()
            };
            run(&backend, &group, &options, &Silent).unwrap()
        });
        assert!(reports[1].is_none());
        let report = reports[0].as_ref().unwrap();
        assert_eq!(report.devices, [0, 1]);
        for test in &report.tests {
            let places: Vec<Place> = test.cells.iter().map(|c| c.place).collect();
            let pairs = [
                Place::Pair { src: 0, dst: 1 },
                Place::Pair { src: 1, dst: 0 },
            ];
            assert_eq!(places, pairs, "{}", test.name);
            assert!(test.cells.iter().all(|c| c.value > 0.0));
        }
    }

    #[test]
    fn a_test_that_does_not_cross_processes_is_refused_naming_those_that_do() {
        let Err(Error::Usage(why)) = cross_process_test("ce-bidir-write") else {
            panic!("ce-bidir-write runs in one process only")
        };
        assert!(
            why.contains("ce-write, ce-read, sm-write, sm-read, staged"),
            "{why}"
        );
    }
}
