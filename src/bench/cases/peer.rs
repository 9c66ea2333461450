//! GPU-to-GPU bandwidth: copy engine or SM kernel, push or pull, one direction or both, and the
//! host-staged path used when P2P is off.

use super::{enable, no_p2p, Context, Outcome, TestCase};
use crate::backend::{CopyMethod, Memory};
use crate::bench::footprint::Footprint;
use crate::bench::result::{Place, Shape, Unit};
use crate::bench::timing::{measure, HopSpec, Lane, Sampling};
use crate::Result;

/// How a bandwidth test's bytes travel (the engine's routes are [`crate::engine::Route`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One peer copy by this method.
    Direct(CopyMethod),
    /// P2P disabled: device→pinned host on the source GPU's stream, then host→device on the
    /// destination's, chained with events chunk by chunk (p2pBandwidthLatencyTest's P2P=Disabled).
    Staged,
}

/// Which GPU initiates a direct copy (its context issues it): the source pushes, the destination
/// pulls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Initiator {
    /// The source GPU writes into the peer (push).
    Source,
    /// The destination GPU reads from the peer (pull).
    Destination,
}

/// A peer bandwidth test.
pub struct PeerCopy {
    name: String,
    transport: Transport,
    initiator: Initiator,
    bidirectional: bool,
}

impl PeerCopy {
    pub fn new(
        prefix: &str,
        transport: Transport,
        initiator: Initiator,
        bidirectional: bool,
    ) -> PeerCopy {
        let side = match (transport, initiator) {
            (Transport::Staged, _) => "",
            (_, Initiator::Source) => "-write",
            (_, Initiator::Destination) => "-read",
        };
        let both = if bidirectional { "-bidir" } else { "" };
        PeerCopy {
            name: format!("{prefix}{both}{side}"),
            transport,
            initiator,
            bidirectional,
        }
    }

    /// The GPUs whose streams carry a message `from` → `to`, first the one whose events time it.
    fn stream_devices(&self, from: usize, to: usize) -> Vec<usize> {
        match (self.transport, self.initiator) {
            (Transport::Direct(_), Initiator::Source) => vec![from],
            (Transport::Direct(_), Initiator::Destination) => vec![to],
            (Transport::Staged, _) => vec![from, to],
        }
    }

    /// Where each hop of a message to `to` lands, and by which method.
    fn hop_memories(&self, ctx: &Context<'_>, to: usize) -> Vec<(CopyMethod, Memory)> {
        match self.transport {
            Transport::Direct(method) => vec![(method, Memory::Device(to))],
            Transport::Staged => {
                let numa_node = ctx.topology().devices[to].numa_node;
                vec![
                    (CopyMethod::CopyEngine, Memory::PinnedHost { numa_node }),
                    (CopyMethod::CopyEngine, Memory::Device(to)),
                ]
            }
        }
    }

    /// The hops of a message to `to`, on `streams` (from [`Self::stream_devices`]).
    fn hops(
        &self,
        ctx: &Context<'_>,
        to: usize,
        streams: &[crate::backend::StreamId],
    ) -> Vec<HopSpec> {
        self.hop_memories(ctx, to)
            .into_iter()
            .zip(streams)
            .map(|((method, memory), &stream)| HopSpec {
                stream,
                method,
                memory,
            })
            .collect()
    }

    /// The buffers [`PeerCopy::lanes`] allocates for these directions.
    pub fn lanes_footprint(
        &self,
        ctx: &Context<'_>,
        directions: &[(usize, usize)],
        message: usize,
        sampling: &Sampling,
    ) -> Result<Footprint> {
        let mut footprint = Footprint::default();
        for &(from, to) in directions {
            let budget = ctx.buffer_budget(from)?.min(ctx.buffer_budget(to)?);
            let bytes = Lane::buffer_bytes(message, sampling, budget) as u64;
            footprint.add(Memory::Device(from), 1, bytes);
            for (_, memory) in self.hop_memories(ctx, to) {
                footprint.add(memory, 1, bytes);
            }
        }
        Ok(footprint)
    }

    /// Both directions of a bidirectional test.
    fn directions(&self, src: usize, dst: usize) -> Vec<(usize, usize)> {
        let mut directions = vec![(src, dst)];
        if self.bidirectional {
            directions.push((dst, src));
        }
        directions
    }
}

impl PeerCopy {
    /// Allocates one lane per direction `(from, to)`, each on its own streams. Peer access must
    /// already be enabled for direct routes.
    pub fn lanes<'b>(
        &self,
        ctx: &mut Context<'b>,
        directions: &[(usize, usize)],
        message: usize,
        sampling: &Sampling,
    ) -> Result<Vec<Lane<'b>>> {
        let lane_devices: Vec<usize> = directions
            .iter()
            .flat_map(|&(from, to)| self.stream_devices(from, to))
            .collect();
        let streams = ctx.streams(&lane_devices)?;
        let per_lane = streams.len() / directions.len();
        let mut lanes = Vec::with_capacity(directions.len());
        for (i, &(from, to)) in directions.iter().enumerate() {
            let hops = self.hops(ctx, to, &streams[i * per_lane..(i + 1) * per_lane]);
            let budget = ctx.buffer_budget(from)?.min(ctx.buffer_budget(to)?);
            lanes.push(Lane::new(
                ctx.backend,
                Context::label(&self.name, from, to),
                Memory::Device(from),
                &hops,
                message,
                sampling,
                budget,
            )?);
        }
        Ok(lanes)
    }
}

impl TestCase for PeerCopy {
    fn name(&self) -> &str {
        &self.name
    }

    fn unit(&self) -> Unit {
        Unit::Gbps
    }

    fn shape(&self) -> Shape {
        Shape::Matrix
    }

    fn sweeps(&self) -> bool {
        true
    }

    fn plateau_bytes(&self) -> u64 {
        match self.transport {
            Transport::Direct(_) => crate::bench::PLATEAU.peer,
            // Chunked in eighths however large: a larger message comes no closer to the link.
            Transport::Staged => crate::bench::PLATEAU.host,
        }
    }

    fn measures(&self) -> String {
        let how = match (self.transport, self.initiator) {
            (Transport::Direct(CopyMethod::CopyEngine), Initiator::Source) => {
                "write (push): copy engine, issued on the source GPU's stream"
            }
            (Transport::Direct(CopyMethod::CopyEngine), Initiator::Destination) => {
                "read (pull): copy engine, issued on the destination GPU's stream"
            }
            (Transport::Direct(CopyMethod::SmKernel), Initiator::Source) => {
                "write (push): copy kernel on the source GPU storing into the peer"
            }
            (Transport::Direct(CopyMethod::SmKernel), Initiator::Destination) => {
                "read (pull): copy kernel on the destination GPU loading from the peer"
            }
            (Transport::Staged, _) => {
                "P2P disabled, staged through pinned host memory: device→host on the source \
                 GPU's stream, then host→device on the destination's, chained with events"
            }
        };
        let directions = if self.bidirectional {
            "both directions at once: each cell is row→column while column→row runs; \
             total_matrix is both together"
        } else {
            "one direction (row → column)"
        };
        format!("{how}; {directions}; GPU time; GB/s = 1e9 bytes/s")
    }

    fn footprint(&self, ctx: &Context<'_>, place: Place, bytes: u64) -> Result<Footprint> {
        let (src, dst) = place.pair();
        // Both ends are device memory, filled and checked on their GPUs: no host copy.
        self.lanes_footprint(
            ctx,
            &self.directions(src, dst),
            bytes as usize,
            &ctx.sampling,
        )
    }

    fn measure(&self, ctx: &mut Context<'_>, place: Place, bytes: u64) -> Result<Outcome> {
        let (src, dst) = place.pair();
        let directions = self.directions(src, dst);
        // Check every direction before allocating anything.
        if let Transport::Direct(_) = self.transport {
            for &(from, to) in &directions {
                let issuing = match self.initiator {
                    Initiator::Source => from,
                    Initiator::Destination => to,
                };
                let peer = if issuing == from { to } else { from };
                if let Some(reason) =
                    no_p2p(ctx.topology(), issuing, peer).or_else(|| enable(ctx, issuing, peer))
                {
                    return Ok(Outcome::Skipped(reason));
                }
            }
        }
        let message = bytes as usize;
        let sampling = ctx.sampling;
        let seed = ctx.next_seed();
        let mut lanes = self.lanes(ctx, &directions, message, &sampling)?;
        let m = measure(&mut lanes, &sampling, seed)?;
        Ok(Outcome::Measured {
            value: m.lane_gbps(0, message),
            total: self.bidirectional.then(|| m.total_gbps()),
            time_us: m.lane_us[0],
            note: None,
        })
    }
}
