//! peerlink's all-reduce across simulator processes, one rank each
//! ([`RawCollectives::rank_all_reduce`](crate::backend::RawCollectives::rank_all_reduce)).
//!
//! Each process has its own simulator and virtual clock, so the ranks cannot meet on a shared
//! timeline as the ranks of one process do. They meet in real time instead, through their flag
//! blocks, which are shared files (exported by their owners, imported by the peers): when a rank's
//! part is queued, its process first runs its stream's earlier work (the host waits for it, so
//! the input is final) — for the packet kernel, which reads no peer's input, it then writes its
//! input into every peer's flag block, as the kernel's packets land there — raises its arrival
//! counter and waits for every peer's; then reads every rank's input (the packet kernel: its own
//! and what its peers wrote into its flag block), raises its counter of inputs read and waits for
//! the peers' (so nothing is overwritten while another still reads it), and writes the sum into
//! its own output. Its stream is then held for the part's simulated time, with the links to
//! itself, from the latest rank's arrival on: each rank writes its virtual arrival time beside
//! its counter (each process counts virtual time from its own start), and a bounded wait longer
//! than [`PEER_TIMEOUT_NS`] traps, as a GPU's kernel would. A wait with a release word has no
//! limit, in real time or virtual; once the word is raised, the part ends, its output unwritten.
//! Every figure is simulated; the sums are real.

use super::collective::{self, RankPlan};
use super::links::LinkModel;
use super::memory::Key;
use super::scheduler::{Collective, Work};
use super::sharing::{max_min_rates, Demand};
use super::{reduce, Node, Simulator, Stream};
use crate::backend::collective::{
    AllReduceKernel, DataType, Reduction, Waiting, FLAG_BYTES, MAX_RANKS, PACKET_MAX_BYTES,
    PEER_TIMEOUT_NS,
};
use crate::backend::{RawBackend, RawRankBuffers};
use crate::{Error, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a bounded wait lasts in real time for the other processes' parts before it fails, as a
/// GPU's kernel traps when a peer never comes.
const MEETING_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a flag block keeps the simulator's two counters (u64, little-endian): the calls a rank
/// has arrived at, and the calls whose inputs it has read; then the virtual time (µs, f64) of the
/// rank's latest arrival.
const ARRIVED_AT: usize = 0;
const READ_AT: usize = 8;
const ARRIVAL_US_AT: usize = 16;

/// How a meeting of the ranks ended.
#[derive(PartialEq)]
enum Met {
    /// Every peer came.
    All,
    /// The host raised the release word first.
    Released,
}
/// Where the packet kernel's data from sender `r` lands in a flag block: `PACKETS_AT + r ×
/// PACKET_MAX_BYTES` (the kernels' receive area, after their 64 KiB of counters).
const PACKETS_AT: usize = 64 * 1024;
const _: () = assert!(PACKETS_AT + MAX_RANKS * PACKET_MAX_BYTES <= FLAG_BYTES);

/// One rank's part of an all-reduce across processes, every buffer by its key: queued at once,
/// or captured into a graph, whose every replay runs it as a call would (the host meets the
/// other processes then).
pub(super) struct AcrossPart {
    kernel: AllReduceKernel,
    dtype: DataType,
    op: Reduction,
    rank: usize,
    ranks: Vec<PartBuffers>,
    release: Waiting<Key>,
    len: usize,
}

/// One rank's buffers of an [`AcrossPart`] (as `RawRankBuffers`).
struct PartBuffers {
    device: usize,
    input: Key,
    output: Key,
    input_offset: usize,
    output_offset: usize,
    flags: Key,
}

impl Simulator {
    /// `RawCollectives::rank_all_reduce` on the simulator (see the module's introduction): run
    /// now, or captured where the stream captures a graph.
    #[allow(clippy::too_many_arguments)] // as `RawCollectives::rank_all_reduce`
    pub(super) fn part_across_processes(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        op: Reduction,
        rank: usize,
        stream: &Stream,
        ranks: &[RawRankBuffers<'_, Self>],
        waiting: Waiting<&Key>,
        len: usize,
    ) -> Result<()> {
        let part = AcrossPart {
            kernel,
            dtype,
            op,
            rank,
            ranks: ranks
                .iter()
                .map(|r| PartBuffers {
                    device: r.device,
                    input: *r.input,
                    output: *r.output,
                    input_offset: r.input_offset,
                    output_offset: r.output_offset,
                    flags: *r.flags,
                })
                .collect(),
            release: waiting.map(|&word| word),
            len,
        };
        if let Some(graph) = self.lock().captures.get_mut(&stream.index) {
            graph.push(Node::Across(Arc::new(part)));
            return Ok(());
        }
        self.run_part(&part, stream)
    }

    /// Runs `part` on `stream`: its earlier work first, then the meeting with the other ranks.
    pub(super) fn run_part(&self, part: &AcrossPart, stream: &Stream) -> Result<()> {
        let AcrossPart {
            kernel,
            dtype,
            op,
            rank,
            ref ranks,
            release,
            len,
        } = *part;
        self.synchronize(stream)?;
        let flags: Vec<Key> = ranks.iter().map(|r| r.flags).collect();
        let packets = kernel == AllReduceKernel::OneShotPackets;
        let slot = |sender: usize| PACKETS_AT + sender * PACKET_MAX_BYTES;
        if packets {
            let mut st = self.lock();
            Self::catch_up(&mut st);
            let mine = st
                .store
                .bytes(ranks[rank].input, ranks[rank].input_offset, len)
                .into_owned();
            for (_, &theirs) in flags.iter().enumerate().filter(|&(peer, _)| peer != rank) {
                st.store.write(theirs, slot(rank), &mine);
            }
        }
        let call = self.counter(flags[rank], ARRIVED_AT) + 1;
        let arrived_us = self.lock().host_us;
        self.lock()
            .store
            .write(flags[rank], ARRIVAL_US_AT, &arrived_us.to_le_bytes());
        if self.meet(&flags, rank, ARRIVED_AT, call, release, "arrive at")? == Met::Released {
            return Ok(());
        }
        let waited_us = self.latest_arrival_us(&flags) - arrived_us;
        if release == Waiting::Bounded {
            let limit_us = PEER_TIMEOUT_NS as f64 / 1e3;
            self.lock().scheduler.trap_if_late(waited_us, limit_us);
        }
        let inputs: Vec<Vec<u8>> = {
            let mut st = self.lock();
            Self::catch_up(&mut st);
            (0..ranks.len())
                .map(|r| {
                    let (buffer, at) = if packets && r != rank {
                        (flags[rank], slot(r))
                    } else {
                        (ranks[r].input, ranks[r].input_offset)
                    };
                    st.store.bytes(buffer, at, len).into_owned()
                })
                .collect()
        };
        if self.meet(&flags, rank, READ_AT, call, release, "read the inputs of")? == Met::Released {
            return Ok(());
        }
        let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let sum = reduce::reduce(dtype, op, &views);
        let plans: Vec<RankPlan> = ranks
            .iter()
            .map(|r| RankPlan {
                device: r.device,
                input: r.input,
                output: r.output,
            })
            .collect();
        let bounded = release == Waiting::Bounded;
        let part =
            collective::all_reduce(&self.links, kernel, dtype, op, &plans, &flags, bounded, len);
        let work = Work::Busy {
            setup_us: self.costs().kernel_setup_us,
            duration_us: waited_us.max(0.0) + part_alone_us(&self.links, &part, rank),
        };
        let mut st = self.lock();
        st.store
            .write(ranks[rank].output, ranks[rank].output_offset, &sum);
        Self::submit(&mut st, stream, self.costs().kernel_issue_us, work);
        Ok(())
    }

    /// The counter at `at` of a flag block.
    fn counter(&self, flags: Key, at: usize) -> u64 {
        let mut word = [0; 8];
        self.lock().store.read(flags, at, &mut word);
        u64::from_le_bytes(word)
    }

    /// The latest virtual arrival time any rank wrote into its flag block.
    fn latest_arrival_us(&self, flags: &[Key]) -> f64 {
        let st = self.lock();
        flags
            .iter()
            .map(|&block| {
                let mut word = [0; 8];
                st.store.read(block, ARRIVAL_US_AT, &mut word);
                f64::from_le_bytes(word)
            })
            .fold(0.0, f64::max)
    }

    /// Raises this rank's counter at `at` to `call`, then waits until every peer's has reached
    /// it: with a release word (`release`), until the host raises it, however long that takes;
    /// without, at most [`MEETING_TIMEOUT`].
    fn meet(
        &self,
        flags: &[Key],
        rank: usize,
        at: usize,
        call: u64,
        release: Waiting<Key>,
        what: &str,
    ) -> Result<Met> {
        self.lock()
            .store
            .write(flags[rank], at, &call.to_le_bytes());
        let started = Instant::now();
        for (peer, &theirs) in flags.iter().enumerate().filter(|&(peer, _)| peer != rank) {
            while self.counter(theirs, at) < call {
                match release {
                    Waiting::Released(word) if self.raised(word) => return Ok(Met::Released),
                    Waiting::Bounded if started.elapsed() > MEETING_TIMEOUT => {
                        return Err(Error::Cuda {
                            call: "all-reduce across processes (simulated)".into(),
                            message: format!(
                                "rank {rank} waited {} s for rank {peer} to {what} call {call} \
                                 and it never did: every rank's process must queue the same \
                                 all-reduces, in the same order",
                                MEETING_TIMEOUT.as_secs()
                            ),
                        });
                    }
                    _ => std::thread::sleep(Duration::from_micros(50)),
                }
            }
        }
        Ok(Met::All)
    }

    /// Whether the host raised the release word in `word`'s first four bytes.
    fn raised(&self, word: Key) -> bool {
        let mut bytes = [0; 4];
        self.lock().store.read(word, 0, &mut bytes);
        u32::from_le_bytes(bytes) != 0
    }
}

/// How long rank `rank`'s part of `collective` takes on links it has to itself: its flows' rates
/// shared max-min among the collective's own flows as they start, each flow's latency and bytes
/// at that rate, the slowest that holds the rank, then the tail.
pub(super) fn part_alone_us(links: &LinkModel, collective: &Collective, rank: usize) -> f64 {
    let demands: Vec<Demand<'_>> = collective
        .flows
        .iter()
        .map(|f| Demand {
            resources: &f.path.resources,
            cap: f.path.cap,
        })
        .collect();
    let rates = max_min_rates(links.capacity(), &demands);
    let flows_us = collective
        .flows
        .iter()
        .zip(rates)
        .filter(|(f, _)| f.holds.contains(&rank))
        .map(|(f, rate)| f.latency_us + f.bytes as f64 / rate)
        .fold(0.0, f64::max);
    flows_us + collective.tail_us
}
