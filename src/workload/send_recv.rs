//! Messages between consecutive GPUs: the transfer engine against NCCL send/recv, one way (every
//! rank but the last sends to the next) and both ways at once (each pair of consecutive ranks
//! sends to each other), all flows at once.
//!
//! The engine runs each transfer as it plans it, on its own streams; the ranks' held streams start
//! them (each transfer waits for an event recorded there) and wait for the last of them, so the
//! window covers the engine's GPU time and none of the host's. A graph cannot capture the engine's
//! work (it runs on the engine's streams), so its rows are issued from the host in every mode.

use super::kinds::{Contender, IssueMode, Variant, Workload};
use super::resources::{
    check_memory, footprint, ids, length, nccl, streams_on, within_one_host, Communicator,
};
use super::rows::{row, Measured};
use super::settings::{Counts, Settings};
use super::timing::{measure, Operation};
use crate::backend::collective::{BufferRange, PeerTransfer};
use crate::backend::{Backend, EventId, StreamId};
use crate::bench::footprint::Footprint;
use crate::bench::progress::Progress;
use crate::engine::{Buffer, Fabric, Planned, Transfer};
use crate::pattern;
use crate::workload::rows::Row;
use crate::{Error, Result};
use std::sync::Arc;

/// Why the engine's rows stay in stream mode when graphs are asked for.
pub(super) const GRAPHS_NOTICE: &str = "the engine's rows are issued from the host in every mode: \
     its transfers run on the engine's own streams, which a graph of the ranks' streams cannot \
     capture";

/// One message's path: rank `from` sends its `src` to rank `to`'s `dst` (`from` and `to` index
/// the held streams of the process that queues it).
pub struct Flow {
    pub from: usize,
    pub to: usize,
    pub(super) src: Buffer,
    pub(super) dst: Buffer,
}

/// The (from, to) ranks of every flow of `variant` over `ranks` ranks.
pub fn flows(variant: Variant, ranks: usize) -> Vec<(usize, usize)> {
    let forward = (0..ranks - 1).map(|r| (r, r + 1));
    match variant {
        Variant::BothWays => forward.flat_map(|(a, b)| [(a, b), (b, a)]).collect(),
        _ => forward.collect(),
    }
}

/// Every flow's transfer through the engine, started from the held rank streams.
pub(super) struct EngineFlows<'a> {
    backend: &'a dyn Backend,
    fabric: &'a Fabric,
    flows: &'a [Flow],
    streams: &'a [StreamId],
    len: usize,
    /// Recorded on each sender's stream before the first transfers since the last join, which
    /// wait for it.
    go: Vec<EventId>,
    /// Each flow's latest transfer: the next of the flow follows it (the engine orders writes to
    /// one buffer), and the sender's stream waits for it at a join.
    last: Vec<Option<Transfer>>,
}

impl<'a> EngineFlows<'a> {
    /// `len` bytes of every one of `flows`, each started from its sender's stream in `streams`.
    pub(super) fn new(
        backend: &'a dyn Backend,
        fabric: &'a Fabric,
        flows: &'a [Flow],
        streams: &'a [StreamId],
        len: usize,
    ) -> EngineFlows<'a> {
        EngineFlows {
            backend,
            fabric,
            flows,
            streams,
            len,
            go: Vec::new(),
            last: flows.iter().map(|_| None).collect(),
        }
    }

    /// The strategy the engine ran each flow's latest transfer by, in flow order.
    pub(super) fn strategies(&self) -> Vec<String> {
        self.last
            .iter()
            .flatten()
            .map(|transfer| match transfer.planned() {
                Planned::Single(plan) => plan.strategy.to_string(),
                Planned::Batch(plan) => plan.strategy.to_string(),
            })
            .collect()
    }
}

impl Operation for EngineFlows<'_> {
    fn queue(&mut self, _step: u64) -> Result<()> {
        // Only a phase's first transfers wait for the held streams: each later one follows the
        // flow's previous transfer anyway (the engine orders writes to one buffer), and a wait is
        // GPU time of its own.
        let first = self.go.is_empty();
        if first {
            for flow in self.flows {
                self.go.push(self.backend.record(self.streams[flow.from])?);
            }
        }
        for (i, flow) in self.flows.iter().enumerate() {
            let mut transfer = self
                .fabric
                .transfer(flow.src.range(0..self.len), flow.dst.range(0..self.len));
            if first {
                transfer = transfer.after_event(self.go[i]);
            }
            self.last[i] = Some(transfer.submit()?);
        }
        Ok(())
    }

    fn join(&mut self) -> Result<()> {
        for (flow, last) in self.flows.iter().zip(&self.last) {
            if let Some(transfer) = last {
                self.backend
                    .wait(self.streams[flow.from], transfer.event())?;
            }
        }
        // The transfers already wait for them.
        for event in self.go.drain(..) {
            self.backend.destroy_event(event)?;
        }
        Ok(())
    }
}

struct NcclFlows<'a> {
    comm: &'a Communicator<'a>,
    streams: &'a [StreamId],
    transfers: Vec<PeerTransfer>,
}

impl Operation for NcclFlows<'_> {
    fn queue(&mut self, _step: u64) -> Result<()> {
        self.comm
            .nccl
            .send_recv(self.comm.id, self.streams, &self.transfers)
    }
}

/// The engine's strategy for each flow at `bytes`, each named once.
fn engine_strategies(fabric: &Fabric, flows: &[Flow], bytes: u64) -> Result<String> {
    let mut names: Vec<String> = Vec::new();
    for flow in flows {
        let plan = fabric
            .planner()
            .plan(flow.src.device(), flow.dst.device(), bytes)?;
        let name = plan.strategy.to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(format!("engine {}", names.join("/")))
}

/// Runs the send-recv sweep for each of `variants`.
pub fn run(
    backend: &Arc<dyn Backend>,
    settings: &mut Settings,
    variants: &[Variant],
    progress: &dyn Progress,
) -> Result<Vec<Row>> {
    let devices = settings.devices.clone();
    for &variant in variants {
        check_memory(
            backend.as_ref(),
            Workload::SendRecv,
            settings,
            &flows_footprint(&devices, variant, settings.largest()),
        )?;
    }
    let fabric = Fabric::builder(backend.clone()).devices(&devices).open()?;
    let backend = backend.as_ref();
    let streams = streams_on(backend, &devices)?;
    let stream_ids = ids(&streams);
    let largest = length(settings.largest())?;
    let comm = nccl(backend, &mut settings.notices)
        .map(|nccl| Communicator::new(nccl, &devices))
        .transpose()?;
    let across = within_one_host(backend.topology(), &devices, "the engine's transfers");
    let engine_rows = across.is_none();
    settings.notices.extend(across);
    if engine_rows && settings.issue.contains(&IssueMode::Graphs) {
        settings.notices.push(GRAPHS_NOTICE.into());
    }
    let sweep = SendRecv {
        backend,
        fabric: &fabric,
        ranks: devices.len(),
        streams: &stream_ids,
        comm: comm.as_ref(),
        engine_rows,
        issue: &settings.issue,
        simulated: settings.simulated,
    };
    let mut rows = Vec::new();
    progress.start("send-recv", (variants.len() * settings.sizes.len()) as u64);
    for &variant in variants
        .iter()
        .take_while(|_| !crate::interrupt::requested())
    {
        let flows = open_flows(&fabric, &devices, variant, largest)?;
        for bytes in settings.sizes_to_run() {
            let size = || -> Result<Vec<_>> {
                let messages = Messages::write(&flows, variant, bytes, settings.counts(bytes))?;
                let mut found: Vec<_> = sweep.engine_row(&messages)?.into_iter().collect();
                found.extend(sweep.nccl_rows(&messages)?);
                Ok(found)
            };
            match crate::interrupt::unless_stopped(size())? {
                Some(found) => rows.extend(found),
                None => break,
            }
            progress.step();
        }
    }
    progress.finish();
    Ok(rows)
}

/// What the flows of `variant` hold at `largest`: a source and a destination buffer per flow, on
/// its two GPUs, and the host's pattern and read-back.
fn flows_footprint(devices: &[usize], variant: Variant, largest: u64) -> Footprint {
    let ends = |rank: usize| largest.saturating_mul(ends_on(variant, devices.len(), rank));
    footprint(devices, ends, largest.saturating_mul(2))
}

/// How many buffers the flows of `variant` over `ranks` GPUs hold on `rank`'s: a source for each
/// flow it sends, a destination for each it receives.
pub(super) fn ends_on(variant: Variant, ranks: usize, rank: usize) -> u64 {
    let flows = flows(variant, ranks);
    let ends = flows.iter().filter(|&&(from, _)| from == rank).count()
        + flows.iter().filter(|&&(_, to)| to == rank).count();
    ends as u64
}

/// Every flow of `variant` between the GPUs, its buffers `largest` bytes long.
fn open_flows(
    fabric: &Fabric,
    devices: &[usize],
    variant: Variant,
    largest: usize,
) -> Result<Vec<Flow>> {
    flows(variant, devices.len())
        .into_iter()
        .map(|(from, to)| {
            Ok(Flow {
                from,
                to,
                src: fabric.alloc(devices[from], largest)?,
                dst: fabric.alloc(devices[to], largest)?,
            })
        })
        .collect()
}

/// The GPUs' fabric, streams and NCCL's communicator, ready to time one size after another.
struct SendRecv<'a> {
    backend: &'a dyn Backend,
    fabric: &'a Fabric,
    ranks: usize,
    streams: &'a [StreamId],
    comm: Option<&'a Communicator<'a>>,
    /// Whether the engine's transfers can run here (all on one host).
    engine_rows: bool,
    issue: &'a [IssueMode],
    simulated: bool,
}

/// One size of one variant: every flow's message written into its source.
struct Messages<'a> {
    flows: &'a [Flow],
    variant: Variant,
    bytes: u64,
    len: usize,
    counts: Counts,
    data: Vec<Vec<u8>>,
}

impl<'a> Messages<'a> {
    fn write(flows: &'a [Flow], variant: Variant, bytes: u64, counts: Counts) -> Result<Self> {
        let len = length(bytes)?;
        let data: Vec<Vec<u8>> = (0..flows.len())
            .map(|i| pattern::bytes(pattern::seed(&[bytes, i as u64]), len))
            .collect();
        for (flow, data) in flows.iter().zip(&data) {
            flow.src.write(0, data)?;
        }
        Ok(Messages {
            flows,
            variant,
            bytes,
            len,
            counts,
            data,
        })
    }

    fn poison(&self) -> Result<()> {
        self.flows
            .iter()
            .zip(&self.data)
            .try_for_each(|(flow, data)| {
                flow.dst
                    .write(0, &data.iter().map(|b| !b).collect::<Vec<u8>>())
            })
    }

    fn check(&self, what: &str) -> Result<()> {
        let mut found = vec![0; self.len];
        self.flows
            .iter()
            .zip(&self.data)
            .try_for_each(|(flow, data)| {
                flow.dst.read(0, &mut found)?;
                Error::check_bytes(
                    format!("send-recv {} {what}", self.variant),
                    flow.src.device(),
                    flow.dst.device(),
                    data,
                    &found,
                )
            })
    }

    fn measured(
        &self,
        contender: Contender,
        algorithm: String,
        issue: IssueMode,
        time_us: f64,
    ) -> Measured {
        Measured {
            variant: Some(self.variant),
            bytes: self.bytes,
            contender,
            algorithm,
            issue,
            iters: self.counts.iters,
            time_us,
        }
    }
}

impl SendRecv<'_> {
    fn row(&self, m: Measured) -> Row {
        row(Workload::SendRecv, self.ranks, self.simulated, None, m)
    }

    /// The engine's row, issued from the host, where the engine's transfers can run.
    fn engine_row(&self, messages: &Messages<'_>) -> Result<Option<Row>> {
        if !self.engine_rows {
            return Ok(None);
        }
        let backend = self.backend;
        let algorithm = engine_strategies(self.fabric, messages.flows, messages.bytes)?;
        let mut engine = EngineFlows::new(
            backend,
            self.fabric,
            messages.flows,
            self.streams,
            messages.len,
        );
        let time_us = measure(
            backend,
            self.streams,
            IssueMode::Stream,
            messages.counts,
            &mut engine,
            || messages.poison(),
            || messages.check(&algorithm),
        )?;
        drop(engine);
        let m = messages.measured(Contender::Peerlink, algorithm, IssueMode::Stream, time_us);
        Ok(Some(self.row(m)))
    }

    /// NCCL's rows, one per issue mode, where NCCL is there.
    fn nccl_rows(&self, messages: &Messages<'_>) -> Result<Vec<Row>> {
        let Some(comm) = self.comm else {
            return Ok(Vec::new());
        };
        let len = messages.len;
        let transfers = messages
            .flows
            .iter()
            .map(|f| PeerTransfer {
                from: f.from,
                to: f.to,
                src: BufferRange {
                    buffer: f.src.backend_id(),
                    offset: 0,
                    len,
                },
                dst: BufferRange {
                    buffer: f.dst.backend_id(),
                    offset: 0,
                    len,
                },
            })
            .collect();
        let mut op = NcclFlows {
            comm,
            streams: self.streams,
            transfers,
        };
        let mut rows = Vec::new();
        for &issue in self.issue {
            let algorithm = "ncclSend/ncclRecv".to_string();
            let time_us = measure(
                self.backend,
                self.streams,
                issue,
                messages.counts,
                &mut op,
                || messages.poison(),
                || messages.check(&algorithm),
            )?;
            let m = messages.measured(Contender::Nccl, algorithm, issue, time_us);
            rows.push(self.row(m));
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_run_between_consecutive_ranks() {
        assert_eq!(flows(Variant::OneWay, 2), [(0, 1)]);
        assert_eq!(flows(Variant::BothWays, 2), [(0, 1), (1, 0)]);
        assert_eq!(flows(Variant::OneWay, 4), [(0, 1), (1, 2), (2, 3)]);
        assert_eq!(
            flows(Variant::BothWays, 3),
            [(0, 1), (1, 0), (1, 2), (2, 1)]
        );
    }
}
