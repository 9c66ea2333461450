//! Host-clock measurements taken on every CPU in turn.
//!
//! The CPU's share of a small transfer (the driver's calls) does not run at one speed. On the H200
//! pair, a VM, a 4 B copy seen end to end took 9.6–9.8 µs on some CPUs and 10.4–10.9 µs on
//! others, the queuing call 1.65 against 2.45 µs, and which CPUs were slow changed from second to
//! second (BENCHMARKS.md, 2026-11-30 latenight, `scripts/experiments/e2e.cu`). A measurement that
//! stays where the scheduler put it sees one of the two and reports it: three `bench` processes
//! then disagreed by 12–16%. Pinned to each CPU in turn, a measurement sees both, every time, and
//! can report each CPU's figure and the fastest.

use crate::bench::stats::Stats;
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// CPUs visited at most: enough to meet both speeds on hosts of hundreds of CPUs, in milliseconds.
pub const MAX_CPUS_VISITED: usize = 64;

/// Runs `block` `blocks` times where the thread is, or, with `pin`, once on each CPU the thread
/// may run on (up to [`MAX_CPUS_VISITED`], spread evenly over them, and at least `blocks` times
/// round them), the thread kept on that CPU for the block. The thread's CPUs are put back after,
/// however it ends. Each result comes with the CPU it ran on (None where not pinned). Where the
/// thread's CPUs cannot be read or set (a sandbox), it runs unpinned.
pub fn on_each_cpu<T, E>(
    pin: bool,
    blocks: usize,
    mut block: impl FnMut() -> Result<T, E>,
) -> Result<Vec<(Option<usize>, T)>, E> {
    let visit = match (pin, Pinning::of_this_thread()) {
        (true, Some(pinning)) => pinning,
        _ => return (0..blocks).map(|_| Ok((None, block()?))).collect(),
    };
    let stops = visit.cpus.len().max(blocks);
    let mut results = Vec::with_capacity(stops);
    for i in 0..stops {
        let cpu = visit.cpus[i % visit.cpus.len()];
        let pinned = visit.pin(cpu);
        results.push((pinned.then_some(cpu), block()?));
    }
    Ok(results)
}

/// Host-clock times taken a sample per CPU ([`on_each_cpu`]): each sample's median, how far they
/// range, and every time.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuSpread {
    /// The lowest sample median: where the host ran the measured calls fastest.
    pub lowest: f64,
    /// The highest sample median.
    pub highest: f64,
    /// Distinct CPUs the samples were pinned to (0 where none was).
    pub cpus: usize,
    /// Every time of every sample.
    pub times: Vec<f64>,
}

impl CpuSpread {
    /// What a figure's reader needs beside the lowest: the range over CPUs, for `what` (`GPU 0 →
    /// 1`); None where the samples were not pinned.
    pub fn note(&self, what: &str) -> Option<String> {
        (self.cpus > 0).then(|| {
            format!(
                "{what}: medians {:.2}–{:.2} µs over {} CPUs (the lowest shown)",
                self.lowest, self.highest, self.cpus
            )
        })
    }
}

/// Takes `sample` (a run of host-clock times) on each CPU as [`on_each_cpu`] does (`pin`) or
/// `samples` times where the thread is, and sums them up; an error where a sample is empty or a
/// time not finite.
pub fn spread_over_cpus(
    pin: bool,
    samples: usize,
    sample: impl FnMut() -> crate::Result<Vec<f64>>,
) -> crate::Result<CpuSpread> {
    let taken = on_each_cpu(pin, samples, sample)?;
    let medians = taken
        .iter()
        .map(|(_, times)| Ok(Stats::of_times(times)?.median))
        .collect::<crate::Result<Vec<f64>>>()?;
    Ok(CpuSpread {
        lowest: medians.iter().copied().fold(f64::INFINITY, f64::min),
        highest: medians.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        cpus: {
            let mut pinned: Vec<usize> = taken.iter().filter_map(|(cpu, _)| *cpu).collect();
            pinned.sort_unstable();
            pinned.dedup();
            pinned.len()
        },
        times: taken.into_iter().flat_map(|(_, times)| times).collect(),
    })
}

/// The thread's CPUs when it was made, put back when it is dropped.
struct Pinning {
    previous: CpuSet,
    /// The CPUs to visit: the thread's, at most [`MAX_CPUS_VISITED`] spread evenly.
    cpus: Vec<usize>,
}

impl Pinning {
    fn of_this_thread() -> Option<Pinning> {
        let previous = sched_getaffinity(None).ok()?;
        let allowed: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&c| previous.is_set(c))
            .collect();
        if allowed.is_empty() {
            return None;
        }
        let step = allowed.len().div_ceil(MAX_CPUS_VISITED);
        let cpus = allowed.into_iter().step_by(step).collect();
        Some(Pinning { previous, cpus })
    }

    /// Keeps the thread on `cpu`; false where that was refused (it then runs where it is).
    fn pin(&self, cpu: usize) -> bool {
        let mut one = CpuSet::new();
        one.set(cpu);
        sched_setaffinity(None, &one).is_ok()
    }
}

impl Drop for Pinning {
    fn drop(&mut self) {
        // Where it cannot be put back the thread stays on one CPU: slower later work, never wrong.
        let _ = sched_setaffinity(None, &self.previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::thread::sched_getcpu;

    fn allowed() -> Vec<usize> {
        let set = sched_getaffinity(None).unwrap();
        (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
    }

    #[test]
    fn each_cpu_is_visited_pinned_and_the_thread_put_back_after() {
        let before = allowed();
        let seen = on_each_cpu(true, 1, || Ok::<_, ()>((sched_getcpu(), allowed()))).unwrap();
        let visited: Vec<usize> = seen.iter().filter_map(|(cpu, _)| *cpu).collect();
        if before.len() <= MAX_CPUS_VISITED {
            assert_eq!(visited, before, "one block on each of the thread's CPUs");
        } else {
            assert!(visited.len() <= MAX_CPUS_VISITED && visited.len() * 2 > MAX_CPUS_VISITED);
        }
        for (cpu, (ran_on, allowed_there)) in &seen {
            let cpu = cpu.expect("pinned");
            assert_eq!(*ran_on, cpu, "the block ran on the CPU it was pinned to");
            assert_eq!(allowed_there, &vec![cpu], "and could run nowhere else");
        }
        assert_eq!(allowed(), before, "the thread's CPUs are put back");
    }

    #[test]
    fn more_blocks_than_cpus_go_round_them_and_unpinned_blocks_stay_put() {
        let cpus = allowed();
        let blocks = Pinning::of_this_thread().unwrap().cpus.len() + 3;
        let seen = on_each_cpu(true, blocks, || Ok::<_, ()>(())).unwrap();
        assert_eq!(seen.len(), blocks);
        assert_eq!(
            seen[blocks - 3].0,
            seen[0].0,
            "round again from the first CPU"
        );
        let unpinned = on_each_cpu(false, 2, || Ok::<_, ()>(allowed())).unwrap();
        assert_eq!(unpinned.len(), 2);
        assert!(unpinned
            .iter()
            .all(|(cpu, set)| cpu.is_none() && *set == cpus));
    }

    #[test]
    fn the_spread_reports_the_fastest_cpus_median_and_keeps_every_time() {
        let cpus = allowed();
        let fast = cpus[0];
        // The first CPU runs the "calls" at 10 µs, every other at 11 (median of 10, 10, 30).
        let spread = spread_over_cpus(true, 1, || {
            let base = if sched_getcpu() == fast { 10.0 } else { 11.0 };
            Ok(vec![base, base, 30.0])
        })
        .unwrap();
        let visited = Pinning::of_this_thread().unwrap().cpus.len();
        assert_eq!(spread.cpus, visited);
        assert_eq!(spread.lowest, 10.0);
        assert_eq!(spread.highest, if visited > 1 { 11.0 } else { 10.0 });
        assert_eq!(spread.times.len(), 3 * visited);
        // Unpinned: the samples asked for, no CPU named.
        assert_eq!(
            spread.note("GPU 0 → 1").unwrap(),
            format!(
                "GPU 0 → 1: medians 10.00–{:.2} µs over {visited} CPUs (the lowest shown)",
                spread.highest
            )
        );
        // More samples than CPUs go round them; the note counts each CPU once.
        let round = spread_over_cpus(true, visited + 3, || Ok(vec![5.0])).unwrap();
        assert_eq!((round.cpus, round.times.len()), (visited, visited + 3));
        let unpinned = spread_over_cpus(false, 4, || Ok(vec![5.0])).unwrap();
        assert_eq!((unpinned.cpus, unpinned.times.len()), (0, 4));
        assert_eq!(unpinned.note("GPU 0 → 1"), None);
        assert!(spread_over_cpus(false, 1, || Ok(vec![])).is_err());
    }

    #[test]
    fn an_error_ends_the_tour_and_still_puts_the_thread_back() {
        let before = allowed();
        let mut calls = 0;
        let failed = on_each_cpu(true, 4, || {
            calls += 1;
            if calls == 2 {
                Err("stop")
            } else {
                Ok(())
            }
        });
        assert_eq!(failed.unwrap_err(), "stop");
        assert_eq!(calls, 2);
        assert_eq!(allowed(), before);
    }
}
