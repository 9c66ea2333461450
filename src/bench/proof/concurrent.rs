//! Every GPU sending at once: the planner's picks under concurrent traffic, against each transfer
//! alone and against every strategy used for all of them.
//!
//! The planner plans one transfer at a time, as if it had the machine to itself. When every GPU
//! sends at once, a relay may cross a GPU that is busy with its own transfer, a split may share a
//! link with a neighbour's direct copy, and staging shares the host. This benchmark shows what that
//! costs: each transfer's GPU time alone and together, the aggregate bandwidth, and the regret of
//! the picks against the best single strategy used for every transfer.

use crate::bench::progress::Progress;
use crate::bench::stats::Stats;
use crate::bench::timing::{host_us, interleaved, interleaved_calls, Runs, Turn};
use crate::engine::planner::{ways_together, Together};
use crate::engine::{Buffer, Fabric, Strategy, Transfer, TransferBuilder};
use crate::pattern;
use crate::topology::Source;
use crate::{Error, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which transfers run at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traffic {
    /// GPU i sends to GPU (i + k) mod n, for every GPU i of the fabric at once.
    Shift(usize),
}

impl Traffic {
    /// `shift` (k = 1) or `shift:K`.
    pub fn parse(text: &str) -> Result<Traffic> {
        let bad = || {
            Error::usage(format!(
                "unknown traffic `{text}`: say `shift` (GPU i sends to GPU i+1) or `shift:K` \
                 (to GPU i+K), K ≥ 1"
            ))
        };
        match text.split_once(':') {
            None if text == "shift" => Ok(Traffic::Shift(1)),
            Some(("shift", k)) => match k.parse::<usize>() {
                Ok(k) if k >= 1 => Ok(Traffic::Shift(k)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }

    /// The (source, destination) pairs over `devices`, in device order.
    pub fn pairs(self, devices: &[usize]) -> Result<Vec<(usize, usize)>> {
        let Traffic::Shift(k) = self;
        let n = devices.len();
        // A shift is taken modulo the GPU count: a huge K must neither overflow nor be refused.
        if n < 2 || k % n == 0 {
            return Err(Error::usage(format!(
                "shift:{k} over {n} GPU{} sends every GPU to itself; concurrent traffic needs at \
                 least two GPUs and a shift that is not a multiple of their count",
                if n == 1 { "" } else { "s" }
            )));
        }
        Ok((0..n)
            .map(|i| (devices[i], devices[(i + k % n) % n]))
            .collect())
    }
}

/// One transfer of the traffic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Flow {
    pub src: usize,
    pub dst: usize,
    /// The planner's pick for it, planned as it runs: its host route priced both ways where
    /// another flow goes the opposite way through the host.
    pub pick: Strategy,
    /// Median GPU time of the pick with nothing else running.
    pub alone_us: f64,
    /// Median GPU time of the pick while every transfer runs; absent where a stop came first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub together_us: Option<f64>,
}

/// One way of running all the transfers at once: the planner's picks, or one strategy for all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Way {
    /// `None` for the planner's picks.
    pub strategy: Option<Strategy>,
    /// Median host time from the first submission until every transfer was seen complete.
    pub makespan_us: f64,
    /// All bytes moved over the makespan, GB/s: end to end, the CPU's queuing of every transfer
    /// included.
    pub gbps: f64,
}

/// What was measured; after a stop, only what was whole before it: the flows measured alone (each
/// verified), and the ways and together times only where every way was timed and verified.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub source: Source,
    pub bytes: u64,
    pub flows: Vec<Flow>,
    /// The picks first, then each strategy every flow can use; none after a stop.
    pub ways: Vec<Way>,
    /// Each flow's bytes over its GPU time alone, summed: what the links give without contention.
    pub alone_gbps: f64,
    /// Each flow's bytes over its GPU time while all run (the picks), summed.
    pub together_gbps: Option<f64>,
    /// picks' makespan / fastest way's makespan − 1.
    pub regret: Option<f64>,
}

/// Runs `pairs` at once, `bytes` each: alone, with the planner's picks, and with each strategy that
/// every pair can use; every byte verified after each flow alone and after each way. `progress`
/// hears of every run. A stop keeps what was whole before it (see [`Report`]).
pub fn run(
    fabric: &Fabric,
    pairs: &[(usize, usize)],
    bytes: u64,
    runs: Runs,
    progress: &dyn Progress,
) -> Result<Report> {
    if pairs.is_empty() || runs.runs == 0 {
        return Err(Error::usage(
            "concurrent traffic needs at least one transfer and one timed run",
        ));
    }
    super::within_one_host(fabric, pairs)?;
    let len = usize::try_from(bytes)
        .map_err(|_| Error::usage(format!("{bytes} bytes do not fit in this host's memory")))?;
    let picks = picks(fabric, pairs, bytes)?;
    check_footprint(fabric, pairs, bytes)?;
    let Some(flows) = crate::interrupt::unless_stopped(Flows::open(fabric, pairs, len, picks))?
    else {
        return Ok(Report::nothing(fabric, bytes));
    };
    let ways = ways(fabric, pairs, bytes);
    progress.start(
        "concurrent",
        pairs.len() as u64 * (interleaved_calls(runs, 1, Turn::SecondOfTwo) + 1)
            + interleaved_calls(runs, ways.len(), Turn::SecondOfTwo)
            + ways.len() as u64,
    );
    let alone = flows.alone(runs, progress)?;
    let together = if alone.len() == pairs.len() {
        crate::interrupt::unless_stopped(flows.together(&ways, runs, progress).and_then(|t| {
            flows.verify(&ways, progress)?;
            Ok(t)
        }))?
    } else {
        None
    };
    progress.finish();
    report(&flows, ways, alone, together)
}

impl Report {
    /// A run stopped before any flow was measured.
    fn nothing(fabric: &Fabric, bytes: u64) -> Report {
        Report {
            source: fabric.backend().source().clone(),
            bytes,
            flows: Vec::new(),
            ways: Vec::new(),
            alone_gbps: 0.0,
            together_gbps: None,
            regret: None,
        }
    }
}

/// Each pick as the flow runs: both ways where another flow goes the opposite way through the
/// host, as the fabric plans transfers submitted together.
fn picks(fabric: &Fabric, pairs: &[(usize, usize)], bytes: u64) -> Result<Vec<Strategy>> {
    let planner = fabric.planner();
    let ends: Vec<Together> = pairs
        .iter()
        .map(|&(src, dst)| (src, dst, bytes, None))
        .collect();
    let ways = ways_together(&ends, |src, dst, bytes, _, ways| {
        planner.plan_ways(src, dst, bytes, ways)
    });
    pairs
        .iter()
        .zip(&ways)
        .map(|(&(src, dst), &ways)| planner.plan_ways(src, dst, bytes, ways).map(|p| p.strategy))
        .collect()
}

/// Every transfer's buffers and staging at once; on the host, the checks' read-backs of one
/// transfer (its source and destination) and a poisoned destination.
fn check_footprint(fabric: &Fabric, pairs: &[(usize, usize)], bytes: u64) -> Result<()> {
    let mut footprint = super::Footprint::default();
    for &(src, dst) in pairs {
        footprint.add_all(&super::footprint(fabric, src, dst, bytes, 0));
    }
    footprint.add_host(bytes.saturating_mul(3));
    footprint.check(
        &**fabric.backend(),
        &format!(
            "concurrent traffic ({} transfers of {} at once)",
            pairs.len(),
            crate::units::format_bytes(bytes)
        ),
        "choose a smaller --size",
    )
}

/// The ways run together: the picks (`None`), then each strategy every pair can use.
fn ways(fabric: &Fabric, pairs: &[(usize, usize)], bytes: u64) -> Vec<Option<Strategy>> {
    let planner = fabric.planner();
    let uniform = Strategy::ALL.into_iter().filter(|&s| {
        pairs
            .iter()
            .all(|&(src, dst)| planner.plan_with(s, src, dst, bytes).is_ok())
    });
    std::iter::once(None).chain(uniform.map(Some)).collect()
}

/// Bytes poisoned or checked between two looks at the stop flag: a 256 MiB destination read back
/// and compared whole held a stop for a few tenths of a second (more on a loaded machine).
const CHECK_CHUNK: usize = 16 << 20;

/// The transfers of the traffic: their pairs, picks and buffers (each source filled with its own
/// pattern).
struct Flows<'f> {
    fabric: &'f Fabric,
    pairs: &'f [(usize, usize)],
    len: usize,
    picks: Vec<Strategy>,
    buffers: Vec<(Buffer, Buffer)>,
}

/// Per way, the makespans of its timed runs; per flow, its GPU times in the picks' timed runs.
struct Timed {
    makespans: Vec<Vec<f64>>,
    flow_us: Vec<Vec<f64>>,
}

impl<'f> Flows<'f> {
    fn open(
        fabric: &'f Fabric,
        pairs: &'f [(usize, usize)],
        len: usize,
        picks: Vec<Strategy>,
    ) -> Result<Self> {
        let mut buffers = Vec::with_capacity(pairs.len());
        // Each pair's set-up takes a fraction of a second at 256 MiB: a stop is heard between
        // its steps.
        for (i, &(src, dst)) in pairs.iter().enumerate() {
            crate::interrupt::check()?;
            let (from, to) = (fabric.alloc(src, len)?, fabric.alloc(dst, len)?);
            let data = pattern::bytes(pattern::seed(&[len as u64, i as u64]), len);
            crate::interrupt::check()?;
            from.write(0, &data)?;
            buffers.push((from, to));
        }
        Ok(Flows {
            fabric,
            pairs,
            len,
            picks,
            buffers,
        })
    }

    fn transfer(&self, i: usize, strategy: Strategy) -> TransferBuilder<'_> {
        let (from, to) = &self.buffers[i];
        self.fabric
            .transfer(from.all(), to.all())
            .strategy(strategy)
            .timed()
    }

    /// Each flow's pick with nothing else running, one flow after another, each timed on the
    /// second of two runs as the ways are, then verified: its median GPU time. A stop keeps the
    /// flows finished before it.
    fn alone(&self, runs: Runs, progress: &dyn Progress) -> Result<Vec<f64>> {
        let mut medians = Vec::with_capacity(self.pairs.len());
        for i in 0..self.pairs.len() {
            let measured = (|| {
                let times = interleaved(runs, 1, Turn::SecondOfTwo, |_, _| {
                    let us = self.transfer(i, self.picks[i]).submit()?.elapsed_us();
                    progress.step();
                    us
                })?;
                self.poison(i)?;
                self.transfer(i, self.picks[i]).submit()?.wait()?;
                progress.step();
                self.check(i, self.picks[i])?;
                Ok(Stats::of_times(&times[0])?.median)
            })();
            match crate::interrupt::unless_stopped(measured)? {
                Some(median) => medians.push(median),
                None => break,
            }
        }
        Ok(medians)
    }

    /// Flow `i`'s destination filled with what no source holds.
    fn poison(&self, i: usize) -> Result<()> {
        let poison = vec![!(i as u8); CHECK_CHUNK.min(self.len)];
        self.chunks().try_for_each(|(at, len)| {
            crate::interrupt::check()?;
            self.buffers[i].1.write(at, &poison[..len])
        })
    }

    /// Every byte of flow `i`'s destination, moved with `strategy`, against its source.
    fn check(&self, i: usize, strategy: Strategy) -> Result<()> {
        let (from, to) = &self.buffers[i];
        let (src, dst) = self.pairs[i];
        let mut expected = vec![0; CHECK_CHUNK.min(self.len)];
        let mut found = expected.clone();
        self.chunks().try_for_each(|(at, len)| {
            crate::interrupt::check()?;
            from.read(at, &mut expected[..len])?;
            to.read(at, &mut found[..len])?;
            let test = format!("engine {strategy}");
            Error::check_bytes(test, src, dst, &expected[..len], &found[..len])
                .map_err(|e| e.shifted(at))
        })
    }

    /// The (offset, length) pieces a buffer is poisoned and checked in.
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.len)
            .step_by(CHECK_CHUNK)
            .map(|at| (at, CHECK_CHUNK.min(self.len - at)))
    }

    /// Every flow submitted together (their chunks interleaved, so that none waits for the CPU to
    /// queue another), then every one waited for: the finished transfers and the makespan.
    fn all_at_once(&self, way: Option<Strategy>) -> Result<(Vec<Transfer>, f64)> {
        host_us(&**self.fabric.backend(), || {
            let transfers = self.fabric.submit_together(
                (0..self.pairs.len())
                    .map(|i| self.transfer(i, way.unwrap_or(self.picks[i])))
                    .collect(),
            )?;
            for t in &transfers {
                t.wait()?;
            }
            Ok(transfers)
        })
    }

    /// Ways take turns round by round in a rotating order, each timed on the second of two runs,
    /// as the single-pair sweep does (drift and the previous way's wake fall on all). The flows'
    /// GPU times are read where they are reported: the picks' timed runs.
    fn together(
        &self,
        ways: &[Option<Strategy>],
        runs: Runs,
        progress: &dyn Progress,
    ) -> Result<Timed> {
        let timed_runs = interleaved(runs, ways.len(), Turn::SecondOfTwo, |at, timed| {
            let (transfers, makespan) = self.all_at_once(ways[at])?;
            progress.step();
            let flow_us = match ways[at] {
                None if timed => transfers
                    .iter()
                    .map(Transfer::elapsed_us)
                    .collect::<Result<Vec<f64>>>()?,
                _ => Vec::new(),
            };
            Ok((makespan, flow_us))
        })?;
        let makespans = timed_runs
            .iter()
            .map(|way| way.iter().map(|(makespan, _)| *makespan).collect())
            .collect();
        // Way 0 is the planner's picks.
        let flow_us = (0..self.pairs.len())
            .map(|flow| timed_runs[0].iter().map(|(_, us)| us[flow]).collect())
            .collect();
        Ok(Timed { makespans, flow_us })
    }

    /// Every way once more into poisoned destinations, every byte checked.
    fn verify(&self, ways: &[Option<Strategy>], progress: &dyn Progress) -> Result<()> {
        for &way in ways {
            (0..self.pairs.len()).try_for_each(|i| self.poison(i))?;
            self.all_at_once(way)?;
            progress.step();
            (0..self.pairs.len()).try_for_each(|i| self.check(i, way.unwrap_or(self.picks[i])))?;
        }
        Ok(())
    }
}

/// The report: each way's makespan and rate, each flow alone and together, and the picks' regret;
/// after a stop, the flows measured alone (`alone` may be shorter than the flows) and no `together`.
fn report(
    flows: &Flows<'_>,
    ways: Vec<Option<Strategy>>,
    alone: Vec<f64>,
    together: Option<Timed>,
) -> Result<Report> {
    let bytes = flows.len as u64;
    let total_bytes = bytes as f64 * flows.pairs.len() as f64;
    let (makespans, flow_us) = match together {
        Some(t) => (t.makespans, t.flow_us.into_iter().map(Some).collect()),
        None => (Vec::new(), vec![None; alone.len()]),
    };
    let ways: Vec<Way> = ways
        .into_iter()
        .zip(makespans)
        .map(|(strategy, times)| {
            let makespan_us = Stats::of_times(&times)?.median;
            Ok(Way {
                strategy,
                makespan_us,
                gbps: total_bytes / (makespan_us * 1e3),
            })
        })
        .collect::<Result<_>>()?;
    let flows_out: Vec<Flow> = flows
        .pairs
        .iter()
        .zip(&flows.picks)
        .zip(alone.iter().zip(flow_us))
        .map(|((&(src, dst), &pick), (&alone_us, times))| {
            Ok(Flow {
                src,
                dst,
                pick,
                alone_us,
                together_us: times
                    .map(|t: Vec<f64>| Stats::of_times(&t).map(|s| s.median))
                    .transpose()?,
            })
        })
        .collect::<Result<_>>()?;
    let rate = |us: f64| bytes as f64 / (us * 1e3);
    let alone_gbps = flows_out.iter().map(|f| rate(f.alone_us)).sum();
    let together_gbps = flows_out
        .iter()
        .map(|f| f.together_us.map(rate))
        .sum::<Option<f64>>()
        .filter(|_| !ways.is_empty());
    let best = ways
        .iter()
        .map(|w| w.makespan_us)
        .fold(f64::INFINITY, f64::min);
    let regret = ways.first().map(|picks| picks.makespan_us / best - 1.0);
    Ok(Report {
        source: flows.fabric.backend().source().clone(),
        bytes,
        flows: flows_out,
        ways,
        alone_gbps,
        together_gbps,
        regret,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::progress::Silent;
    use crate::bench::proof::runs_for;
    use crate::engine::tests::fabric;

    const MIB: u64 = 1 << 20;

    fn shifted(preset: &str, bytes: u64) -> Report {
        let f = fabric(preset);
        let pairs = Traffic::Shift(1).pairs(f.devices()).unwrap();
        run(&f, &pairs, bytes, runs_for(f.backend().as_ref()), &Silent).unwrap()
    }

    #[test]
    fn nvswitch_hosts_send_all_at_once_as_fast_as_alone() {
        // Each GPU sends once and receives once through its own switch port: nothing is shared.
        let r = shifted("dgx-h100", 4 * MIB);
        assert_eq!(r.flows.len(), 8);
        for f in &r.flows {
            assert!(
                matches!(f.pick, Strategy::DirectCe | Strategy::DirectSm),
                "{f:?}"
            );
            assert!(f.together_us.unwrap() < 1.05 * f.alone_us, "{f:?}");
        }
        assert!(r.together_gbps.unwrap() > 0.95 * r.alone_gbps, "{r:#?}");
        assert!(r.regret.unwrap() <= 0.05, "{r:#?}");
        // The picks, then every strategy all eight pairs can use.
        let strategies: Vec<_> = r.ways.iter().map(|w| w.strategy).collect();
        assert_eq!(strategies[0], None);
        assert!(strategies.contains(&Some(Strategy::DirectCe)));
        assert!(strategies.contains(&Some(Strategy::Staged)));
    }

    #[test]
    fn dgx1_relays_meet_other_traffic_and_the_report_says_what_it_costs() {
        // Large enough that the transfers overlap (their chunks' queuing takes CPU time).
        let r = shifted("dgx1-v100", 16 * MIB);
        // 3 → 4 and 7 → 0 have no NVLink: the planner routes them around, through busy GPUs.
        for (src, dst) in [(3, 4), (7, 0)] {
            let f = r
                .flows
                .iter()
                .find(|f| (f.src, f.dst) == (src, dst))
                .unwrap();
            assert!(matches!(f.pick, Strategy::Relay | Strategy::Split), "{f:?}");
        }
        // No direct strategy works for every pair, so the picks compete with staging for all.
        let strategies: Vec<_> = r.ways.iter().map(|w| w.strategy).collect();
        assert!(
            !strategies.contains(&Some(Strategy::DirectCe)),
            "{strategies:?}"
        );
        assert!(strategies.contains(&Some(Strategy::Staged)));
        assert!(r.regret.is_some_and(|r| r >= 0.0 && r.is_finite()));
        // Relays cross links that other flows use: some flows slow down, none speeds up.
        for f in &r.flows {
            assert!(f.together_us.unwrap() >= 0.99 * f.alone_us, "{f:?}");
        }
        assert!(
            r.flows
                .iter()
                .any(|f| f.together_us.unwrap() > 1.2 * f.alone_us),
            "{r:#?}"
        );
        assert!(r.together_gbps.unwrap() < r.alone_gbps, "{r:#?}");
        let staged = r
            .ways
            .iter()
            .find(|w| w.strategy == Some(Strategy::Staged))
            .unwrap();
        assert!(r.ways[0].makespan_us < staged.makespan_us, "{r:#?}");
    }

    #[test]
    fn a_shift_larger_than_any_gpu_count_wraps_without_overflow() {
        let huge = Traffic::parse(&format!("shift:{}", usize::MAX)).unwrap();
        let devices = [0, 1, 2, 3];
        // usize::MAX ≡ 3 (mod 4): every GPU sends to the one before it.
        assert_eq!(
            huge.pairs(&devices).unwrap(),
            vec![(0, 3), (1, 0), (2, 1), (3, 2)]
        );
    }

    #[test]
    fn traffic_is_parsed_and_shifts_every_gpu() {
        assert_eq!(Traffic::parse("shift").unwrap(), Traffic::Shift(1));
        assert_eq!(Traffic::parse("shift:3").unwrap(), Traffic::Shift(3));
        for bad in ["", "ring", "shift:", "shift:0", "shift:x", "shift:-1"] {
            assert!(Traffic::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Traffic::Shift(1).pairs(&[0, 1, 2]).unwrap(),
            [(0, 1), (1, 2), (2, 0)]
        );
        assert_eq!(
            Traffic::Shift(2).pairs(&[1, 3, 5, 7]).unwrap(),
            [(1, 5), (3, 7), (5, 1), (7, 3)]
        );
        assert!(Traffic::Shift(1).pairs(&[0]).is_err());
        assert!(Traffic::Shift(4).pairs(&[0, 1, 2, 3]).is_err());
    }
}
