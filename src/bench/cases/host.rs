//! Per-GPU bandwidth: all peers into one GPU or one GPU into all peers at once, host↔device over
//! PCIe, and copies within one GPU.

use super::{enable, no_p2p, Context, Outcome, TestCase};
use crate::backend::{CopyMethod, Memory};
use crate::bench::footprint::Footprint;
use crate::bench::result::{Place, Shape, Unit};
use crate::bench::timing::{measure, HopSpec, Lane};
use crate::Result;

/// Which way a fan test's copies go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanDirection {
    /// Every peer writes into the GPU at once.
    AllToOne,
    /// The GPU writes into every peer at once.
    OneToAll,
}

/// All-to-one or one-to-all: the aggregate bandwidth one GPU sinks or sources.
pub struct Fan(pub FanDirection);

impl Fan {
    /// Each copy `(from, to)` between `gpu` and every other selected GPU.
    fn directions<'c>(
        &self,
        ctx: &'c Context<'_>,
        gpu: usize,
    ) -> impl Iterator<Item = (usize, usize)> + 'c {
        let direction = self.0;
        ctx.devices
            .iter()
            .filter(move |&&d| d != gpu)
            .map(move |&peer| match direction {
                FanDirection::AllToOne => (peer, gpu),
                FanDirection::OneToAll => (gpu, peer),
            })
    }
}

impl TestCase for Fan {
    fn name(&self) -> &str {
        match self.0 {
            FanDirection::AllToOne => "all-to-one",
            FanDirection::OneToAll => "one-to-all",
        }
    }

    fn unit(&self) -> Unit {
        Unit::Gbps
    }

    fn shape(&self) -> Shape {
        Shape::PerDevice
    }

    fn plateau_bytes(&self) -> u64 {
        crate::bench::PLATEAU.peer
    }

    fn measures(&self) -> String {
        let what = match self.0 {
            FanDirection::AllToOne => {
                "every P2P peer writes (push, copy engine, issued on the peer's stream) into this GPU"
            }
            FanDirection::OneToAll => {
                "this GPU writes (push, copy engine, one stream per peer) into every P2P peer"
            }
        };
        format!("{what}, all at once; aggregate GB/s over the whole window; GPU time")
    }

    fn footprint(&self, ctx: &Context<'_>, place: Place, bytes: u64) -> Result<Footprint> {
        let (gpu, _) = place.pair();
        let peers: Vec<(usize, usize)> = self
            .directions(ctx, gpu)
            .filter(|&(from, to)| no_p2p(ctx.topology(), from, to).is_none())
            .collect();
        let mut footprint = Footprint::default();
        if peers.is_empty() {
            return Ok(footprint);
        }
        let budget = ctx.buffer_budget(gpu)? / peers.len() as u64;
        let buffer = Lane::buffer_bytes(bytes as usize, &ctx.sampling, budget) as u64;
        for (from, to) in peers {
            footprint.add(Memory::Device(from), 1, buffer);
            footprint.add(Memory::Device(to), 1, buffer);
        }
        Ok(footprint)
    }

    fn measure(&self, ctx: &mut Context<'_>, place: Place, bytes: u64) -> Result<Outcome> {
        let (gpu, _) = place.pair();
        let mut peers = Vec::new();
        let mut left_out = Vec::new();
        for (from, to) in self.directions(ctx, gpu) {
            let peer = if from == gpu { to } else { from };
            match no_p2p(ctx.topology(), from, to).or_else(|| enable(ctx, from, to)) {
                None => peers.push((from, to)),
                Some(_) => left_out.push(peer),
            }
        }
        if peers.is_empty() {
            return Ok(Outcome::Skipped(if ctx.devices.len() < 2 {
                "needs at least two GPUs".to_string()
            } else {
                format!("no P2P: no selected GPU has P2P with GPU {gpu}")
            }));
        }
        let issuers: Vec<usize> = peers.iter().map(|&(from, _)| from).collect();
        let streams = ctx.streams(&issuers)?;
        let seed = ctx.next_seed();
        let budget = ctx.buffer_budget(gpu)? / peers.len() as u64;
        let sampling = ctx.sampling;
        let mut lanes = Vec::with_capacity(peers.len());
        for (&(from, to), stream) in peers.iter().zip(streams) {
            let hop = HopSpec {
                stream,
                method: CopyMethod::CopyEngine,
                memory: Memory::Device(to),
            };
            lanes.push(Lane::new(
                ctx.backend,
                Context::label(self.name(), from, to),
                Memory::Device(from),
                &[hop],
                bytes as usize,
                &sampling,
                budget,
            )?);
        }
        let m = measure(&mut lanes, &sampling, seed)?;
        Ok(Outcome::Measured {
            value: m.total_gbps(),
            total: None,
            time_us: m.round_us,
            note: (!left_out.is_empty()).then(|| {
                format!(
                    "GPU {gpu}: left out peers without P2P: {}",
                    left_out
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }),
        })
    }
}

/// Which way a host test's copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostDirection {
    HostToDevice,
    DeviceToHost,
    /// Device memory to device memory of the same GPU.
    Local,
}

/// Host↔device over PCIe with pinned memory on the GPU's NUMA node (or a named one), or a copy
/// within one GPU.
pub struct HostCopy {
    pub direction: HostDirection,
    /// NUMA node of the pinned host memory; `None`: the GPU's own node.
    pub host_node: Option<i32>,
}

impl HostCopy {
    /// The test with pinned host memory on the GPU's own NUMA node.
    pub fn new(direction: HostDirection) -> HostCopy {
        HostCopy {
            direction,
            host_node: None,
        }
    }

    /// The test with pinned host memory on NUMA node `node`, near the GPU or not (what a copy to
    /// or from the other socket's memory costs).
    pub fn on_node(direction: HostDirection, node: i32) -> HostCopy {
        HostCopy {
            direction,
            host_node: Some(node),
        }
    }
}

impl HostCopy {
    /// The source's and the destination's memory on `gpu`'s side.
    fn memories(&self, ctx: &Context<'_>, gpu: usize) -> [Memory; 2] {
        let host = Memory::PinnedHost {
            numa_node: self.host_node.or(ctx.topology().devices[gpu].numa_node),
        };
        match self.direction {
            HostDirection::HostToDevice => [host, Memory::Device(gpu)],
            HostDirection::DeviceToHost => [Memory::Device(gpu), host],
            HostDirection::Local => [Memory::Device(gpu), Memory::Device(gpu)],
        }
    }
}

impl TestCase for HostCopy {
    fn name(&self) -> &str {
        match self.direction {
            HostDirection::HostToDevice => "h2d",
            HostDirection::DeviceToHost => "d2h",
            HostDirection::Local => "local",
        }
    }

    fn unit(&self) -> Unit {
        Unit::Gbps
    }

    fn shape(&self) -> Shape {
        Shape::PerDevice
    }

    fn plateau_bytes(&self) -> u64 {
        match self.direction {
            HostDirection::Local => crate::bench::PLATEAU.local,
            HostDirection::HostToDevice | HostDirection::DeviceToHost => crate::bench::PLATEAU.host,
        }
    }

    fn measures(&self) -> String {
        let node = match self.host_node {
            None => "preferring the GPU's NUMA node".to_string(),
            Some(node) => format!("preferring NUMA node {node}"),
        };
        match self.direction {
            HostDirection::HostToDevice => format!(
                "host→device: pinned host memory {node}, copy engine, issued on the GPU's stream; \
                 GPU time"
            ),
            HostDirection::DeviceToHost => format!(
                "device→host: into pinned host memory {node}, copy engine, issued on the GPU's \
                 stream; GPU time"
            ),
            HostDirection::Local => "device-local copy within the GPU's memory, copy engine; bytes \
                                     counted once (the memory reads and writes each of them); GPU time"
                .to_string(),
        }
    }

    fn footprint(&self, ctx: &Context<'_>, place: Place, bytes: u64) -> Result<Footprint> {
        let (gpu, _) = place.pair();
        let buffer =
            Lane::buffer_bytes(bytes as usize, &ctx.sampling, ctx.buffer_budget(gpu)?) as u64;
        let mut footprint = Footprint::default();
        let memories = self.memories(ctx, gpu);
        for memory in memories {
            footprint.add(memory, 1, buffer);
        }
        if memories
            .iter()
            .any(|m| matches!(m, Memory::PinnedHost { .. }))
        {
            // The host fills or checks the message at the pinned end.
            footprint.add_host(bytes);
        }
        Ok(footprint)
    }

    fn measure(&self, ctx: &mut Context<'_>, place: Place, bytes: u64) -> Result<Outcome> {
        let (gpu, _) = place.pair();
        let [source, destination] = self.memories(ctx, gpu);
        let stream = ctx.streams(&[gpu])?[0];
        let seed = ctx.next_seed();
        let sampling = ctx.sampling;
        let hop = HopSpec {
            stream,
            method: CopyMethod::CopyEngine,
            memory: destination,
        };
        let mut lanes = [Lane::new(
            ctx.backend,
            Context::label(self.name(), gpu, gpu),
            source,
            &[hop],
            bytes as usize,
            &sampling,
            ctx.buffer_budget(gpu)?,
        )?];
        let m = measure(&mut lanes, &sampling, seed)?;
        Ok(super::lane_outcome(self.unit(), &m, bytes as usize))
    }
}
