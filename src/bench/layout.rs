//! Where a run's ranks live, the one parameter that tells `bench` and `workload` in one process
//! from across processes, and the harness every verb runs on across processes.
//!
//! nccl-tests lays its ranks out as `nProcs × nThreads × nGpus`; peerlink runs two of those
//! layouts: one process driving every GPU it is given (1 × 1 × N), and one process per GPU
//! (N × 1 × 1: `peerlink launch -n N`, torchrun, Slurm, mpirun on one host), each rank a member of
//! a launched [`Group`] (the tests run such ranks as threads of one process, one group member
//! each). Across processes every rank takes the same steps in the same order, and [`Ranks`] holds
//! the ones each verb takes alike: which GPU is whose, buffers handed from the rank that exports
//! them to the rank that imports them, progress shown once, a stop agreed by all, and the
//! document's note on the layout.

use super::progress::Progress;
use crate::backend::{Backend, ShareDescriptor, SharedBuffer};
use crate::launch::agree::{exchange, layout_text, one_gpu_each};
use crate::launch::Group;
use crate::{Error, Result};
use std::os::fd::{AsFd, OwnedFd};

/// How a run's ranks are laid out over processes and GPUs.
#[derive(Clone, Copy)]
pub enum Layout<'g> {
    /// This process drives every GPU it is given.
    OneProcess,
    /// This process is one rank of `group`, one GPU each: rank 0 reports what every rank measured.
    RankPerProcess(&'g Group),
}

impl<'g> Layout<'g> {
    /// The layout of a process that a launcher may have made one of a group: one process per GPU
    /// where the group has two ranks or more.
    pub fn of(group: Option<&'g Group>) -> Layout<'g> {
        match group {
            Some(group) if group.identity().world > 1 => Layout::RankPerProcess(group),
            _ => Layout::OneProcess,
        }
    }
}

/// This process's rank of a run laid out one process per GPU, and the steps every rank takes.
pub struct Ranks<'g> {
    pub group: &'g Group,
    /// Each rank's GPU (its `LOCAL_RANK`), in rank order.
    pub gpus: Vec<usize>,
}

impl<'g> Ranks<'g> {
    /// This rank of `group` running `verb` across processes, one GPU each; a usage error, the
    /// same on every rank, where the group cannot (see [`one_gpu_each`]) or `--devices` was given
    /// (each rank takes its `LOCAL_RANK`'s GPU; `alone` says how to run it in one process).
    pub fn join(
        backend: &dyn Backend,
        group: &'g Group,
        verb: &str,
        devices_given: bool,
        alone: &str,
    ) -> Result<Ranks<'g>> {
        if devices_given {
            return Err(Error::usage(format!(
                "--devices: across processes each rank uses the GPU of its LOCAL_RANK; leave \
                 --devices out (or {alone})"
            )));
        }
        let gpus = one_gpu_each(backend, group, verb)?;
        Ok(Ranks { group, gpus })
    }

    /// This rank.
    pub fn me(&self) -> usize {
        self.group.identity().rank
    }

    /// This rank's GPU.
    pub fn gpu(&self) -> usize {
        self.gpus[self.me()]
    }

    /// `progress` shown by rank 0 alone: one bar for the whole group.
    pub fn progress<'p>(&self, progress: &'p dyn Progress) -> RankZero<'p> {
        RankZero {
            progress,
            shown: self.me() == 0,
        }
    }

    /// `found` on rank 0, which reports for every rank; `None` on the others.
    pub fn on_rank_zero<T>(&self, found: impl FnOnce() -> T) -> Option<T> {
        (self.me() == 0).then(found)
    }

    /// Whether any rank was asked to stop: every rank then stops at the same step (a stop request
    /// reaches the ranks at different moments).
    pub fn stop_requested(&self) -> Result<bool> {
        let stop = exchange(self.group, Ok(crate::interrupt::requested()))?;
        Ok(stop.contains(&true))
    }

    /// Hands buffers over from the ranks that export them to the ranks that import them. Every
    /// rank passes the same `routes`, each `(exporter, importer)`, and its own `exports`, each
    /// with the index of its route; it gets back the buffers routed to it, each with its route's
    /// index, in route order, ready to import. An export that failed stops every rank.
    pub fn hand_over(
        &self,
        routes: &[(usize, usize)],
        exports: Result<Vec<(usize, SharedBuffer)>>,
    ) -> Result<Vec<(usize, SharedBuffer)>> {
        let me = self.me();
        let mut files: Vec<(usize, OwnedFd)> = Vec::new();
        let offers = exports.map(|exports| {
            let mut offers = Vec::with_capacity(exports.len());
            for (route, shared) in exports {
                files.extend(shared.fd.map(|fd| (route, fd)));
                offers.push((route, shared.descriptor));
            }
            offers
        });
        let offers: Vec<Vec<(usize, ShareDescriptor)>> = exchange(self.group, offers)?;
        let mut given = Vec::new();
        for (route, &(exporter, importer)) in routes.iter().enumerate() {
            let descriptor = offers[exporter]
                .iter()
                .find(|(offered, _)| *offered == route)
                .map(|(_, d)| d.clone())
                .expect("every exporter offers the buffer of each of its routes");
            let mut fd = None;
            if descriptor.has_fd {
                if me == exporter {
                    let (_, file) = files
                        .iter()
                        .find(|(offered, _)| *offered == route)
                        .expect("an export with a file has it here");
                    self.group.send_fds(importer, &[file.as_fd()])?;
                } else if me == importer {
                    fd = self.group.recv_fds(exporter, 1)?.pop();
                }
            }
            if me == importer {
                given.push((route, SharedBuffer { descriptor, fd }));
            }
        }
        Ok(given)
    }

    /// The document's note on the layout: "across 2 processes, one per GPU (rank r on GPU
    /// LOCAL_RANK: rank 0 → GPU 0, rank 1 → GPU 1)".
    pub fn note(&self) -> String {
        format!(
            "across {} processes, one per GPU (rank r on GPU LOCAL_RANK: {})",
            self.gpus.len(),
            layout_text(&self.gpus)
        )
    }
}

/// How the ranks' buffers reach each other, in the documents' words.
pub fn sharing_words(backend: &dyn Backend) -> &'static str {
    if backend.topology().is_simulated() {
        "on the simulator, a shared file"
    } else {
        "a CUDA IPC handle"
    }
}

/// A progress shown by one rank of a group alone (see [`Ranks::progress`]).
pub struct RankZero<'p> {
    progress: &'p dyn Progress,
    shown: bool,
}

impl Progress for RankZero<'_> {
    fn start(&self, stage: &str, steps: u64) {
        if self.shown {
            self.progress.start(stage, steps);
        }
    }

    fn step(&self) {
        if self.shown {
            self.progress.step();
        }
    }

    fn finish(&self) {
        if self.shown {
            self.progress.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::backend::Memory;
    use crate::launch::tests::{on_ranks, rendezvous};

    #[test]
    fn buffers_handed_round_a_ring_reach_their_importers_with_the_exporters_bytes() {
        const WORLD: usize = 3;
        let found = on_ranks(WORLD, &rendezvous(20_000), |group| {
            let backend = SimBackend::open("dgx-h100").unwrap();
            let ranks = Ranks::join(&backend, &group, "the test", false, "").unwrap();
            let me = ranks.me();
            // Rank r exports to rank r + 1: every rank both exports and imports.
            let routes: Vec<(usize, usize)> = (0..WORLD).map(|r| (r, (r + 1) % WORLD)).collect();
            let mine = backend.alloc(Memory::Device(ranks.gpu()), 64).unwrap();
            backend.write(mine, 0, &[me as u8 + 1; 64]).unwrap();
            let exports = backend
                .sharing()
                .export(mine)
                .map(|shared| vec![(me, shared)]);
            let given = ranks.hand_over(&routes, exports).unwrap();
            let routed: Vec<usize> = given.iter().map(|(route, _)| *route).collect();
            let (_, shared) = given.into_iter().next().unwrap();
            let theirs = backend.sharing().import(shared, ranks.gpu()).unwrap();
            let mut read = vec![0; 64];
            backend.read(theirs, 0, &mut read).unwrap();
            backend.free(theirs).unwrap();
            // The exporter keeps its memory until its importer has read it.
            group.barrier().unwrap();
            (routed, read)
        });
        for (rank, (routed, read)) in found.into_iter().enumerate() {
            let exporter = (rank + WORLD - 1) % WORLD;
            assert_eq!(routed, [exporter], "rank {rank}");
            assert_eq!(read, [exporter as u8 + 1; 64], "rank {rank}");
        }
    }

    #[test]
    fn a_group_of_one_runs_in_one_process_and_progress_shows_on_rank_zero_alone() {
        let layouts = on_ranks(1, &rendezvous(5_000), |group| {
            matches!(Layout::of(Some(&group)), Layout::OneProcess)
        });
        assert_eq!(layouts, [true]);
        assert!(matches!(Layout::of(None), Layout::OneProcess));
        let shown = on_ranks(2, &rendezvous(20_000), |group| {
            let backend = SimBackend::open("pcie-2gpu-switch").unwrap();
            let ranks = Ranks::join(&backend, &group, "the test", false, "").unwrap();
            let counted = Counted::default();
            let progress = ranks.progress(&counted);
            progress.start("stage", 2);
            progress.step();
            progress.finish();
            let calls = *counted.0.lock().unwrap();
            (
                matches!(Layout::of(Some(&group)), Layout::RankPerProcess(_)),
                calls,
            )
        });
        assert_eq!(shown, [(true, 3), (true, 0)]);
    }

    #[test]
    fn devices_given_across_processes_are_refused_saying_how_to_run_alone() {
        let refused = on_ranks(2, &rendezvous(20_000), |group| {
            let backend = SimBackend::open("pcie-2gpu-switch").unwrap();
            match Ranks::join(&backend, &group, "bench", true, "run bench in one process") {
                Err(Error::Usage(why)) => why,
                _ => panic!("--devices is refused across processes"),
            }
        });
        for why in refused {
            assert!(why.ends_with("(or run bench in one process)"), "{why}");
        }
    }

    /// Counts the calls a progress gets.
    #[derive(Default)]
    struct Counted(std::sync::Mutex<u32>);

    impl Progress for Counted {
        fn start(&self, _stage: &str, _steps: u64) {
            *self.0.lock().unwrap() += 1;
        }
        fn step(&self) {
            *self.0.lock().unwrap() += 1;
        }
        fn finish(&self) {
            *self.0.lock().unwrap() += 1;
        }
    }
}
