//! `bench` across processes: one process per GPU, as real jobs run (`peerlink launch -n N -- bench`,
//! torchrun, Slurm, mpirun on one host).
//!
//! Rank `r` owns GPU `LOCAL_RANK`. For each ordered pair of ranks, in the same order on every rank:
//! the owner allocates a buffer on its GPU and exports it ([`crate::backend::Sharing`]: a CUDA IPC
//! handle, or on the simulator a shared file whose descriptor travels over the group's Unix socket);
//! the writer imports it, times its copies into it as the single-process test does (held stream,
//! warm-up, GPU events) and checks every byte through its import; then the owner checks every byte
//! again in its own memory. Rank 0 gathers the figures into the one bench document.
//!
//! A rank that fails says why to the others through the group, and every rank stops: the one at
//! fault with its own error, the others with [`Error::Group`] naming it. A rank that dies or hangs
//! is the group's to detect (see [`crate::launch`]).

use super::cases::{enable, no_p2p, Context, Transport};
use super::progress::Progress;
use super::result::{BenchReport, Cell, NotMeasured, Place, TestResult};
use super::timing::{check_ranges, measure, HopSpec, Lane, Sampling};
use super::{find_test, sampling, Defaults, Options, Size, DEFAULT_TESTS};
use crate::backend::collective::BufferRange;
use crate::backend::{Backend, BufferId, CopyMethod, Memory, Owned, ShareDescriptor, SharedBuffer};
use crate::launch::Group;
use crate::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, OwnedFd};

/// The tests that run across processes, and how each writer's bytes travel into the memory of the
/// peer process, which it opened: pushed by one copy, or staged through pinned host memory (the
/// writer's process issues both hops, device→host on its GPU and host→device on the peer's GPU,
/// which it sees too).
pub const CROSS_PROCESS_TESTS: &[(&str, Transport)] = &[
    ("ce-write", Transport::Direct(CopyMethod::CopyEngine)),
    ("sm-write", Transport::Direct(CopyMethod::SmKernel)),
    ("staged", Transport::Staged),
];

/// What a rank hands the others at each step: its part, or why it failed.
#[derive(Serialize, Deserialize)]
enum Part<T> {
    Done(T),
    Failed(String),
}

/// Every rank's part of one step, in rank order. Where some rank failed, every rank stops: this
/// rank with its own error, the others with one naming the rank that failed.
fn exchange<T: Serialize + DeserializeOwned>(group: &Group, mine: Result<T>) -> Result<Vec<T>> {
    let part = match &mine {
        Ok(value) => Part::Done(value),
        Err(e) => Part::Failed(e.to_string()),
    };
    let encoded = serde_json::to_vec(&part).expect("parts serialise");
    let parts = group.all_gather(&encoded)?;
    mine?;
    let mut out = Vec::with_capacity(parts.len());
    for (rank, bytes) in parts.iter().enumerate() {
        let part: Part<T> = serde_json::from_slice(bytes).map_err(|e| {
            Error::Group(format!(
                "rank {rank} sent a part this rank cannot read ({e}): run one peerlink version \
                 on every rank"
            ))
        })?;
        match part {
            Part::Done(value) => out.push(value),
            Part::Failed(why) => {
                return Err(Error::Group(format!(
                    "rank {rank} failed, so this rank stops too: {why}"
                )))
            }
        }
    }
    Ok(out)
}

/// What the writer of a pair found.
#[derive(Serialize, Deserialize)]
enum Found {
    /// The figure, and where each message lies in the owner's buffer with its pattern's seed.
    Measured {
        cell: Cell,
        expected: Vec<(usize, usize, u64)>,
    },
    Skipped(String),
}

/// The run's fixed choices, the same on every rank.
struct Run<'a> {
    backend: &'a dyn Backend,
    group: &'a Group,
    /// Each rank's GPU, in rank order.
    gpus: Vec<usize>,
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
    let me = group.identity();
    let world = me.world;
    let gpus: Vec<usize> = group
        .members()
        .iter()
        .map(|m| m.identity.local_rank)
        .collect();
    check_choices(backend, group, options, &gpus)?;
    let names: Vec<String> = match &options.tests {
        Some(names) => names.clone(),
        None => vec![DEFAULT_TESTS[0].to_string()],
    };
    let tests = names
        .iter()
        .map(|name| cross_process_test(name))
        .collect::<Result<Vec<_>>>()?;
    let defaults = Defaults::for_backend(backend);
    let sampling = sampling(options, &defaults)?;
    let mut ctx = Context::new(backend, vec![gpus[me.rank]], sampling, 0);
    let budgets = exchange(group, ctx.buffer_budget(gpus[me.rank]))?;
    let run = Run {
        backend,
        group,
        budget: budgets.into_iter().min().expect("a group has ranks"),
        gpus,
        sampling,
    };
    let mut results = Vec::with_capacity(tests.len());
    for (name, transport) in tests {
        let test = find_test(name).expect("cross-process tests are registered");
        let message = match options.size.unwrap_or(defaults.size) {
            Size::Bytes(bytes) => bytes,
            Size::Plateau => test.plateau_bytes(),
        };
        if me.rank == 0 {
            progress.start(name, (world * (world - 1)) as u64);
        }
        let started = backend.host_time_us();
        let (mut cells, mut not_measured) = (Vec::new(), Vec::new());
        for writer in 0..world {
            for owner in (0..world).filter(|&o| o != writer) {
                let place = Place::Pair {
                    src: run.gpus[writer],
                    dst: run.gpus[owner],
                };
                match run.pair(
                    &mut ctx,
                    (name, transport),
                    (writer, owner),
                    message as usize,
                )? {
                    Found::Measured { cell, .. } => cells.push(cell),
                    Found::Skipped(reason) => not_measured.push(NotMeasured { place, reason }),
                }
                if me.rank == 0 {
                    progress.step();
                }
            }
        }
        if me.rank == 0 {
            progress.finish();
        }
        let devices = backend.topology().devices.len();
        let mut result = TestResult::new(test.info(message), devices, cells, not_measured);
        result.wall_s = (backend.host_time_us() - started) / 1e6;
        results.push(result);
    }
    if me.rank != 0 {
        return Ok(None);
    }
    let mut notes = Vec::new();
    if backend.topology().is_simulated() {
        notes.push(format!(
            "SIMULATED host ({}): every figure comes from the preset's link model on each \
             process's own virtual clock, not from hardware; the bytes really cross between the \
             processes (a shared file) and are verified",
            backend.source()
        ));
    }
    notes.push(format!(
        "measured across {world} processes, one per GPU (rank r on GPU LOCAL_RANK: {}): each \
         writer pushes into a buffer the other process exported ({}), every byte checked by the \
         writer through its import and by the owner in its own memory",
        run.gpus
            .iter()
            .enumerate()
            .map(|(rank, gpu)| format!("rank {rank} → GPU {gpu}"))
            .collect::<Vec<_>>()
            .join(", "),
        if backend.topology().is_simulated() {
            "on the simulator, a shared file"
        } else {
            "a CUDA IPC handle"
        }
    ));
    notes.extend(defaults.note);
    let mut devices = run.gpus.clone();
    devices.sort_unstable();
    Ok(Some(BenchReport {
        devices,
        timing: sampling,
        notes,
        tests: results,
        sweeps: Vec::new(),
    }))
}

/// Refuses, on every rank alike, what a run across processes cannot do.
fn check_choices(
    backend: &dyn Backend,
    group: &Group,
    options: &Options,
    gpus: &[usize],
) -> Result<()> {
    if options.sizes.is_some() {
        return Err(Error::usage(
            "--sizes: size sweeps run in one process; across processes bench measures one size \
             (--size)",
        ));
    }
    if options.devices.is_some() {
        return Err(Error::usage(
            "--devices: across processes each rank uses the GPU of its LOCAL_RANK; leave \
             --devices out (or run bench in one process)",
        ));
    }
    let world = gpus.len();
    if world < 2 {
        return Err(Error::usage(
            "bench across processes needs at least 2 ranks: launch it with -n 2 or more",
        ));
    }
    if let Some(far) = (0..world).find(|&r| !group.same_host(r)) {
        return Err(Error::usage(format!(
            "rank {far} runs on another host: bench pairs processes of one host (CUDA IPC); \
             between hosts NCCL carries the data (`peerlink workload`)"
        )));
    }
    let count = backend.topology().devices.len();
    if let Some(rank) = (0..world).find(|&r| gpus[r] >= count) {
        return Err(Error::usage(format!(
            "rank {rank} has LOCAL_RANK {} but this host has {count} GPUs: launch at most one \
             process per GPU",
            gpus[rank]
        )));
    }
    if let Some(rank) = (1..world).find(|&r| gpus[..r].contains(&gpus[r])) {
        return Err(Error::usage(format!(
            "rank {rank} shares GPU {} with another rank: bench across processes takes one \
             process per GPU",
            gpus[rank]
        )));
    }
    Ok(())
}

/// The cross-process test named `name`, or a usage error naming those there are.
fn cross_process_test(name: &str) -> Result<(&'static str, Transport)> {
    CROSS_PROCESS_TESTS
        .iter()
        .find(|(known, _)| *known == name)
        .copied()
        .ok_or_else(|| {
            let known: Vec<&str> = CROSS_PROCESS_TESTS.iter().map(|(n, _)| *n).collect();
            Error::usage(format!(
                "test `{name}` does not run across processes; those that do: {} (the others run \
                 in one process: `peerlink bench` without launch)",
                known.join(", ")
            ))
        })
}

impl Run<'_> {
    /// One ordered pair of ranks: the owner exports, the writer measures into its import, the
    /// owner checks. Every rank takes each step.
    fn pair(
        &self,
        ctx: &mut Context<'_>,
        test: (&str, Transport),
        (writer, owner): (usize, usize),
        message: usize,
    ) -> Result<Found> {
        let rank = self.group.identity().rank;
        let bytes = Lane::buffer_bytes(message, &self.sampling, self.budget);
        // The owner's buffer lives until the writer has closed its import and the owner has
        // checked it.
        let mut owned: Option<Owned<'_, BufferId>> = None;
        let mut file: Option<OwnedFd> = None;
        let offer = if rank == owner {
            let memory = Memory::Device(self.gpus[owner]);
            self.backend.alloc(memory, bytes).and_then(|id| {
                let id = owned.insert(Owned::new(self.backend, id));
                let shared = self.backend.sharing().export(**id)?;
                file = shared.fd;
                Ok(Some(shared.descriptor))
            })
        } else {
            Ok(None)
        };
        let descriptor: Option<ShareDescriptor> = exchange(self.group, offer)?.swap_remove(owner);
        let descriptor = descriptor.expect("the owner offers its buffer");
        if descriptor.has_fd {
            if rank == owner {
                let fd = file.as_ref().expect("the export has its file");
                self.group.send_fds(writer, &[fd.as_fd()])?;
            } else if rank == writer {
                file = self.group.recv_fds(owner, 1)?.pop();
            }
        }
        let found = if rank == writer {
            let shared = SharedBuffer {
                descriptor,
                fd: file.take(),
            };
            self.write(ctx, test, (writer, owner), message, shared)
                .map(Some)
        } else {
            Ok(None)
        };
        let found = exchange(self.group, found)?
            .swap_remove(writer)
            .expect("the writer reports");
        let verdict = match (&found, &owned) {
            (Found::Measured { expected, .. }, Some(id)) => {
                self.check_owned(**id, test.0, (writer, owner), expected)
            }
            _ => Ok(()),
        };
        exchange(self.group, verdict)?;
        if let Some(id) = owned {
            id.release()?;
        }
        Ok(found)
    }

    /// The writer's part: import the owner's buffer and time copies into it.
    fn write(
        &self,
        ctx: &mut Context<'_>,
        (name, transport): (&str, Transport),
        (writer, owner): (usize, usize),
        message: usize,
        shared: SharedBuffer,
    ) -> Result<Found> {
        let (from, to) = (self.gpus[writer], self.gpus[owner]);
        let hops = match transport {
            Transport::Direct(method) => {
                let refused = no_p2p(ctx.topology(), from, to).or_else(|| enable(ctx, from, to));
                if let Some(reason) = refused {
                    return Ok(Found::Skipped(reason));
                }
                vec![HopSpec {
                    stream: ctx.streams(&[from])?[0],
                    method,
                    memory: Memory::Device(to),
                }]
            }
            Transport::Staged => {
                let streams = ctx.streams(&[from, to])?;
                let numa_node = ctx.topology().devices[to].numa_node;
                let hop = |stream, memory| HopSpec {
                    stream,
                    method: CopyMethod::CopyEngine,
                    memory,
                };
                vec![
                    hop(streams[0], Memory::PinnedHost { numa_node }),
                    hop(streams[1], Memory::Device(to)),
                ]
            }
        };
        let imported = self.backend.sharing().import(shared)?;
        let mut lanes = vec![Lane::into_destination(
            self.backend,
            Context::label(name, from, to),
            Memory::Device(from),
            &hops,
            (message, &self.sampling, self.budget),
            imported,
        )?];
        let seed = ctx.next_seed();
        let m = measure(&mut lanes, &self.sampling, seed)?;
        let expected = lanes[0]
            .expected()
            .into_iter()
            .map(|(range, seed)| (range.offset, range.len, seed))
            .collect();
        let cell = Cell {
            place: Place::Pair { src: from, dst: to },
            value: m.lane_gbps(0, message),
            total: None,
            time_us: m.lane_us[0],
        };
        Ok(Found::Measured { cell, expected })
    }

    /// The owner's check of every byte the writer says it wrote, in its own memory.
    fn check_owned(
        &self,
        buffer: BufferId,
        test: &str,
        (writer, owner): (usize, usize),
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
        let (src, dst) = (self.gpus[writer], self.gpus[owner]);
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
    use crate::launch::{Identity, Rendezvous};
    use std::net::TcpListener;
    use std::time::Duration;

    /// Runs `body` on every rank of a group of `world` threads on 127.0.0.1; what each returned.
    fn on_ranks<T: Send + 'static>(
        world: usize,
        body: impl Fn(Group) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let rendezvous = Rendezvous {
            addr: ([127, 0, 0, 1], port).into(),
            timeout: Duration::from_secs(20),
        };
        let threads: Vec<_> = (0..world)
            .map(|rank| {
                let (rendezvous, body) = (rendezvous.clone(), body.clone());
                std::thread::spawn(move || {
                    let identity = Identity {
                        rank,
                        world,
                        local_rank: rank,
                        local_world: world,
                    };
                    body(Group::join(identity, &rendezvous).unwrap())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn a_failing_rank_stops_every_rank_and_the_others_name_it() {
        let results = on_ranks(3, |group| {
            let mine = match group.identity().rank {
                1 => Err(Error::usage("rank one's own trouble")),
                rank => Ok(rank),
            };
            exchange(&group, mine).map_err(|e| (e.exit_code(), e.to_string()))
        });
        let (code, own) = results[1].clone().unwrap_err();
        assert_eq!((code, own.as_str()), (2, "rank one's own trouble"));
        for rank in [0, 2] {
            let (code, said) = results[rank].clone().unwrap_err();
            assert_eq!(code, crate::launch::GROUP_FAILED, "{said}");
            assert!(
                said.contains("rank 1") && said.contains("own trouble"),
                "{said}"
            );
        }
    }

    #[test]
    fn ranks_as_threads_measure_every_pair_and_only_rank_0_reports() {
        let reports = on_ranks(2, |group| {
            let backend = SimBackend::open("pcie-2gpu-switch").unwrap();
            let options = Options {
                tests: Some(vec!["ce-write".into(), "staged".into()]),
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
        let Err(Error::Usage(why)) = cross_process_test("ce-read") else {
            panic!("ce-read runs in one process only")
        };
        assert!(why.contains("ce-write, sm-write, staged"), "{why}");
    }
}
