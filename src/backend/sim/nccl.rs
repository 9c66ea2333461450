//! The simulator's model of NCCL: a ring all-reduce and point-to-point messages, timed with the
//! cost model NCCL's own tuner uses to pick a protocol, over the preset's links. Not a
//! measurement: every figure it produces is simulated, and the constants below are NCCL's public
//! model figures and public measurements, to be recalibrated against NCCL measured on an H200 pair.
//!
//! The tuner's shape (NCCL 2.30.7, `src/graph/tuning.cc`, `ncclTopoTuneModel` and
//! `ncclTopoGetAlgoTime`, read at commit 5067397c): a call of `n` bytes costs
//! `latency + n / (1000 × algBw)` µs, where for a ring all-reduce over `r` ranks on one node
//! `latency = baseLatency + 2(r − 1) × hwLatency` and `algBw = busBw × r / (2(r − 1))`; each
//! protocol (LL, LL128, Simple) has its own latencies and its own share of the bus bandwidth, and
//! NCCL picks the protocol with the least predicted time. On one node the tuner's tree never beats
//! the ring (a higher base latency and half the bandwidth), NVLS is off (NCCL_NVLS_ENABLE=0), so
//! only the ring is modelled. The model moves real bytes: the all-reduce writes real sums, a
//! send/recv copies its bytes.

use super::links::{LinkModel, Path};
use super::memory::Key;
use super::scheduler::{Collective, PlannedFlow, Results, Venue};
use crate::backend::collective::{DataType, PeerTransfer, Reduction};
use crate::backend::BufferCopy;

/// What `Nccl::describe` says of the model.
pub(super) const DESCRIPTION: &str =
    "simulated NCCL: ring cost model after NCCL's tuner (LL, LL128, Simple), not measured";

/// Why the simulator has no NCCL with symmetric windows: nothing measured to model it on.
pub(super) const NO_SYMMETRIC_MODEL: &str = "the simulator has no model of NCCL's symmetric \
    kernels (NCCL ≥ 2.27 with windows from ncclCommWindowRegister, nccl-tests -R 2): no run of \
    them between two GPUs has been measured to calibrate one, and the simulator invents no figures";

/// Why the model refuses a communicator across processes: it runs within one process.
pub(super) fn not_across_processes() -> crate::Error {
    crate::Error::usage(
        "NCCL across processes is not simulated: the simulator's model of NCCL runs within one \
         process (ncclCommInitAll); run the workload in one process for simulated NCCL figures, \
         or on GPUs for NCCL across processes",
    )
}

/// The hardware a ring step crosses, as NCCL's tuner tells them apart (`NCCL_HW_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hardware {
    NvLink,
    /// PCIe, or through host memory.
    Pcie,
    /// Through NICs and the network, between hosts.
    Net,
}

/// One of NCCL's protocols as its tuner models a ring on one node.
pub(super) struct Protocol {
    /// `baseLatencies[Ring]`, µs per call.
    base_us: f64,
    /// `hwLatencies[NVLINK][Ring]`, µs per ring step over NVLink.
    nvlink_step_us: f64,
    /// `hwLatencies[PCI][Ring]`, µs per ring step over PCIe (or through the host).
    pcie_step_us: f64,
    /// `hwLatencies[NET][Ring]`, µs per ring step through the network, before the network's own
    /// latency.
    net_step_us: f64,
    /// The share of the bus bandwidth the protocol's payload gets (LL sends a flag with every
    /// 4 bytes of data; LL128 one 8-byte flag per 128-byte line, modelled by NCCL as 0.92).
    bus_share: f64,
    /// The most the protocol reaches, GB/s (`llMaxBws[Hopper][one node]` for LL).
    max_gbps: f64,
    /// Whether NCCL enables it over PCIe hops (LL128 is enabled up to NVLink paths only).
    over_pcie: bool,
}

// LL, LL128 and Simple: the shape and the per-step latencies are NCCL 2.30.7's tuner
// (`ncclTunerConstantsDefaults` and the "model refinements" of `ncclTopoTuneModel`,
// src/graph/tuning.cc); the base latencies and the bus efficiency are calibrated against NCCL 2.28.3
// measured on two H200s over NVLink (2026-11-30, `peerlink workload all-reduce` and `send-recv`,
// benchmarks/h200-x2/workload/), where the tuner's own figures were 20–42% off:
// - LL: 6.55 µs per 4 B all-reduce on 2 ranks = the simulator's 1.5 µs kernel setup + base + 2
//   steps of 0.6, so base 3.85 (the tuner's 6.6 includes a launch the simulator charges apart).
// - Simple: from 16 MiB to 1 GiB the all-reduce runs at 30.4 µs + bytes / 330.6 GB/s; 30.4 = 1.5 +
//   base + 2 steps of 3.4, so base 22.1 (the tuner's 8.4 leaves out the ring's pipeline fill).
// - LL128 keeps the tuner's figures: at 4 and 16 MiB it lands within 10% of what was measured.
// - The network steps are the tuner's `hwLatencies[NET][Ring]` as they are: nothing was measured
//   across hosts.

pub(super) static LL: Protocol = Protocol {
    base_us: 3.85,
    nvlink_step_us: 0.6,
    pcie_step_us: 1.0,
    net_step_us: 2.7,
    bus_share: 0.5,
    max_gbps: 141.0,
    over_pcie: true,
};

pub(super) static LL128: Protocol = Protocol {
    base_us: 14.0,
    nvlink_step_us: 1.9,
    pcie_step_us: 2.5,
    net_step_us: 4.0,
    bus_share: 0.92,
    max_gbps: f64::INFINITY,
    over_pcie: false,
};

pub(super) static SIMPLE: Protocol = Protocol {
    base_us: 22.1,
    nvlink_step_us: 3.4,
    pcie_step_us: 5.7,
    net_step_us: 14.0,
    bus_share: 1.0,
    max_gbps: f64::INFINITY,
    over_pcie: true,
};

/// The protocols the tuner chooses among for a ring.
static PROTOCOLS: [&Protocol; 3] = [&LL, &LL128, &SIMPLE];

/// NCCL's bus bandwidth as a share of what a copy engine reaches on the same path: NCCL 2.28.3's
/// all-reduce on the H200 pair approaches 330.6 GB/s of bus bandwidth where ce-write reaches 396.4
/// (0.834). (NCCL's own model of H100 NVLink, 18 links of 20.6 GB/s, would say 0.933.)
pub(super) const BUS_EFFICIENCY: f64 = 0.834;

/// Point-to-point messages in Simple: no ring to fill, so a lower latency than the all-reduce's
/// and a higher share of the link. On the H200 pair NCCL's one-way send/recv from 1 MiB to 256 MiB
/// fits 9.1 µs + bytes / 357 GB/s (0.90 of ce-write's 396.4); 9.1 = 1.5 µs kernel setup + 7.6.
pub(super) const P2P_SIMPLE: Protocol = Protocol {
    base_us: 4.2,
    nvlink_step_us: 3.4,
    pcie_step_us: 5.7,
    net_step_us: 14.0,
    bus_share: 0.90 / BUS_EFFICIENCY,
    max_gbps: f64::INFINITY,
    over_pcie: true,
};

/// A simulated communicator: its number and its GPUs, rank by rank.
pub struct Comm {
    id: u64,
    devices: Vec<usize>,
}

impl Comm {
    pub(super) fn new(id: u64, devices: &[usize]) -> Comm {
        Comm {
            id,
            devices: devices.to_vec(),
        }
    }
}

/// The way NCCL's bytes go from GPU `a` to GPU `b`: through the NICs where they sit on different
/// hosts, P2P where the pair has it (NCCL enables its own access), else through host memory as its
/// shared-memory transport does.
fn hop(links: &LinkModel, a: usize, b: usize) -> (Path, Hardware) {
    if links.crosses_hosts(a, b) {
        let path = links
            .network(a, b)
            .expect("a preset of several hosts has NICs (checked when it was read)");
        return (path, Hardware::Net);
    }
    if !links.preset().p2p(a, b) {
        (links.staged(a, b), Hardware::Pcie)
    } else if links.link(a, b).is_nvlink() {
        (links.peer(a, b), Hardware::NvLink)
    } else {
        (links.peer(a, b), Hardware::Pcie)
    }
}

/// NCCL's rings over `devices`, rank by rank: on one host one ring through every rank in order.
/// Across hosts one ring per channel, visiting the hosts in turn: channel `c` enters the first host
/// at its `c`-th rank and walks its ranks forward, the next host backward from where the last one
/// left, and so on, so that every crossing joins GPUs of the same local rank (the same rail, as
/// NCCL arranges with PXN) and each channel leaves a host through another GPU's NIC. As many
/// channels as the host with the fewest NICs under its ranks has.
fn rings(links: &LinkModel, devices: &[usize]) -> Vec<Vec<usize>> {
    let preset = links.preset();
    let mut hosts: Vec<(usize, Vec<usize>)> = Vec::new();
    for &d in devices {
        let host = preset.host_of(d);
        match hosts.iter_mut().find(|(h, _)| *h == host) {
            Some((_, gpus)) => gpus.push(d),
            None => hosts.push((host, vec![d])),
        }
    }
    if hosts.len() == 1 {
        return vec![devices.to_vec()];
    }
    let channels = hosts
        .iter()
        .map(|(_, gpus)| {
            let mut nics: Vec<usize> = gpus
                .iter()
                .filter_map(|&g| preset.nic_of(g))
                .map(|n| n.0)
                .collect();
            nics.sort_unstable();
            nics.dedup();
            nics.len().min(gpus.len())
        })
        .min()
        .unwrap_or(1)
        .max(1);
    (0..channels)
        .map(|c| {
            hosts
                .iter()
                .enumerate()
                .flat_map(|(k, (_, gpus))| {
                    let g = gpus.len();
                    (0..g).map(move |i| {
                        if k % 2 == 0 {
                            gpus[(c + i) % g]
                        } else {
                            gpus[(c + g - 1 - i % g) % g]
                        }
                    })
                })
                .collect()
        })
        .collect()
}

/// What a ring's steps cross, as NCCL's tuner prices them.
pub(super) struct RingSteps {
    /// The hardware of the steps within a host: NVLink only where every one is.
    pub intra: Hardware,
    /// Steps through the network: `2(hosts − 1)` for an all-reduce.
    pub inter: usize,
    /// The network's own latency, added to each of those steps.
    pub net_latency_us: f64,
}

impl RingSteps {
    /// The steps of a ring on one host.
    #[cfg(test)]
    pub(super) fn within(intra: Hardware) -> RingSteps {
        RingSteps {
            intra,
            inter: 0,
            net_latency_us: 0.0,
        }
    }
}

impl Protocol {
    /// The per-call latency before any step.
    #[cfg(test)]
    pub(super) fn base_us(&self) -> f64 {
        self.base_us
    }

    fn step_us(&self, hardware: Hardware) -> f64 {
        match hardware {
            Hardware::NvLink => self.nvlink_step_us,
            Hardware::Pcie => self.pcie_step_us,
            Hardware::Net => self.net_step_us,
        }
    }

    /// The protocol's bus bandwidth over paths whose slowest rate is `bottleneck` (bytes per µs).
    fn bus(&self, bottleneck: f64) -> f64 {
        (bottleneck * BUS_EFFICIENCY * self.bus_share).min(self.max_gbps * 1e3)
    }

    /// Bytes on the wire per byte of payload: the protocol's flags and NCCL's overheads take
    /// their share of the links, so that messages sharing a link share it as NCCL's do.
    fn wire_factor(&self) -> f64 {
        1.0 / (BUS_EFFICIENCY * self.bus_share)
    }

    /// A flow carrying `payload` bytes with this protocol over `path`, no faster than `bottleneck`
    /// (bytes per µs, the slowest hop of its ring) nor the protocol's own limit.
    fn flow(
        &self,
        mut path: Path,
        payload: usize,
        bottleneck: f64,
        latency_us: f64,
        holds: Vec<usize>,
    ) -> PlannedFlow {
        let wire = self.wire_factor();
        path.cap = bottleneck.min(self.max_gbps * 1e3 * wire);
        PlannedFlow {
            path,
            bytes: (payload as f64 * wire).round() as usize,
            latency_us,
            holds,
        }
    }
}

/// The protocol NCCL's tuner picks for a ring all-reduce of `len` bytes over `ranks` ranks whose
/// steps are `steps` and whose rings together carry `bottleneck` bytes per µs at their slowest hop,
/// and its predicted latency (µs).
pub(super) fn ring_protocol(
    len: usize,
    ranks: usize,
    bottleneck: f64,
    steps: &RingSteps,
) -> (&'static Protocol, f64) {
    let all = 2.0 * (ranks as f64 - 1.0);
    let inter = steps.inter as f64;
    let latency = |p: &Protocol| {
        p.base_us
            + (all - inter) * p.step_us(steps.intra)
            + inter * (p.step_us(Hardware::Net) + steps.net_latency_us)
    };
    let time = |p: &Protocol| {
        let alg_bw = p.bus(bottleneck) * ranks as f64 / all;
        latency(p) + len as f64 / alg_bw
    };
    let nvlink_only = steps.intra == Hardware::NvLink && steps.inter == 0;
    let p = PROTOCOLS
        .into_iter()
        .filter(|p| nvlink_only || p.over_pcie)
        .min_by(|a, b| time(a).total_cmp(&time(b)))
        .expect("Simple is always enabled");
    (p, latency(p))
}

/// `ncclAllReduce` (sum) of `len` bytes: `ranks[i]` is (input, output) of the communicator's rank
/// `i`. Rings ([`rings`]): rank `i` sends to the next, `2(r − 1)/r` of the buffer over the call
/// (shared by the rings), at the chosen protocol's bus bandwidth (its wire bytes at the slowest
/// hop's rate), every rank held until every ring is done.
pub(super) fn all_reduce(
    links: &LinkModel,
    comm: &Comm,
    dtype: DataType,
    ranks: &[(Key, Key)],
    len: usize,
) -> Collective {
    let n = comm.devices.len();
    let everyone: Vec<usize> = (0..n).collect();
    let flows = if n == 1 {
        // One rank: NCCL copies the input to the output (nothing moves in place).
        let (input, output) = ranks[0];
        let bytes = if input == output { 0 } else { len };
        let path = links.local(comm.devices[0]);
        vec![PlannedFlow {
            path,
            bytes,
            latency_us: 0.0,
            holds: everyone,
        }]
    } else {
        let rings = rings(links, &comm.devices);
        let hops: Vec<(Path, Hardware)> = rings
            .iter()
            .flat_map(|ring| (0..n).map(move |i| hop(links, ring[i], ring[(i + 1) % n])))
            .collect();
        let bottleneck = hops
            .iter()
            .map(|(path, _)| links.bottleneck(path))
            .fold(f64::INFINITY, f64::min);
        let within = |hw: &Hardware| *hw != Hardware::Net;
        let hosts = rings[0]
            .windows(2)
            .filter(|w| links.crosses_hosts(w[0], w[1]))
            .count()
            + 1;
        let steps = RingSteps {
            intra: if hops
                .iter()
                .filter(|(_, hw)| within(hw))
                .all(|(_, hw)| *hw == Hardware::NvLink)
            {
                Hardware::NvLink
            } else {
                Hardware::Pcie
            },
            inter: 2 * (hosts - 1),
            net_latency_us: hops
                .iter()
                .filter(|(_, hw)| !within(hw))
                .map(|(path, _)| path.latency_us)
                .fold(0.0, f64::max),
        };
        let channels = rings.len();
        let (protocol, latency_us) = ring_protocol(len, n, bottleneck * channels as f64, &steps);
        let payload = (len * 2 * (n - 1) / n).div_ceil(channels);
        hops.into_iter()
            .map(|(path, _)| protocol.flow(path, payload, bottleneck, latency_us, everyone.clone()))
            .collect()
    };
    Collective {
        venue: Venue::Comm(comm.id),
        ranks: n,
        flows,
        tail_us: 0.0,
        results: Results::Reduced {
            dtype,
            op: Reduction::Sum,
            inputs: ranks.iter().map(|r| r.0).collect(),
            outputs: ranks.iter().map(|r| r.1).collect(),
            len,
        },
        wait_limit_us: None,
        scratch: Vec::new(),
    }
}

/// A group of `ncclSend`/`ncclRecv`: each message a flow from its sender's GPU to its receiver's,
/// after its protocol's base latency and one step (the tuner has no point-to-point model: LL or
/// [`P2P_SIMPLE`], whichever predicts less, as measured NCCL went LL up to 256 KiB and Simple from
/// 1 MiB), at that protocol's bus bandwidth; it holds its sender and its receiver, and lands when
/// the receiver's part ends.
pub(super) fn send_recv(
    links: &LinkModel,
    comm: &Comm,
    transfers: &[PeerTransfer<Key>],
) -> Collective {
    let flows = transfers
        .iter()
        .map(|t| {
            let (path, hardware) = hop(links, comm.devices[t.from], comm.devices[t.to]);
            let bottleneck = links.bottleneck(&path);
            // Across hosts the network's own latency comes on top of the step.
            let wire_us = if hardware == Hardware::Net {
                path.latency_us
            } else {
                0.0
            };
            let latency = |p: &Protocol| p.base_us + p.step_us(hardware) + wire_us;
            let time = |p: &Protocol| latency(p) + t.src.len as f64 / p.bus(bottleneck);
            let protocol = [&LL, &P2P_SIMPLE]
                .into_iter()
                .min_by(|a, b| time(a).total_cmp(&time(b)))
                .expect("two protocols");
            let latency_us = latency(protocol);
            protocol.flow(path, t.src.len, bottleneck, latency_us, vec![t.from, t.to])
        })
        .collect();
    let copies = transfers
        .iter()
        .map(|t| {
            let copy = BufferCopy {
                dst: t.dst.buffer,
                dst_offset: t.dst.offset,
                src: t.src.buffer,
                src_offset: t.src.offset,
                len: t.src.len,
            };
            (t.to, copy)
        })
        .collect();
    Collective {
        venue: Venue::Comm(comm.id),
        ranks: comm.devices.len(),
        flows,
        tail_us: 0.0,
        results: Results::Copies(copies),
        scratch: Vec::new(),
        wait_limit_us: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// H100 NVLink as NCCL models it: 18 links of 20.6 GB/s, in bytes per µs.
    const H100_BUS: f64 = 18.0 * 20.6e3 / BUS_EFFICIENCY;

    /// The protocol's name, for assertions.
    fn name(p: &Protocol) -> &'static str {
        let names = [(&LL, "LL"), (&LL128, "LL128"), (&SIMPLE, "Simple")];
        names
            .iter()
            .find(|(q, _)| std::ptr::eq(*q, p))
            .expect("one of the three")
            .1
    }

    #[test]
    fn the_tuner_picks_ll_for_small_buffers_and_simple_for_large_ones() {
        let nvlink = RingSteps::within(Hardware::NvLink);
        let pick = |len, ranks| name(ring_protocol(len, ranks, H100_BUS, &nvlink).0);
        assert_eq!(pick(8, 2), "LL");
        assert_eq!(pick(64 << 10, 8), "LL");
        assert_eq!(pick(1 << 30, 2), "Simple");
        assert_eq!(pick(1 << 30, 8), "Simple");
        // Over PCIe LL128 is off, so nothing but LL and Simple.
        for len in [8, 1 << 16, 1 << 20, 1 << 26] {
            let pcie = RingSteps::within(Hardware::Pcie);
            assert_ne!(name(ring_protocol(len, 4, 50e3, &pcie).0), "LL128");
        }
    }

    #[test]
    fn ll128_wins_between_ll_and_simple_on_eight_nvlink_ranks() {
        let names: Vec<&str> = (10..31)
            .map(|shift| {
                let nvlink = RingSteps::within(Hardware::NvLink);
                name(ring_protocol(1 << shift, 8, H100_BUS, &nvlink).0)
            })
            .collect();
        assert!(names.contains(&"LL128"), "{names:?}");
        let first = |n: &str| names.iter().position(|x| *x == n).unwrap();
        assert!(
            first("LL") < first("LL128") && first("LL128") < first("Simple"),
            "{names:?}"
        );
    }

    #[test]
    fn across_hosts_each_channel_leaves_through_its_own_nic_on_its_rail() {
        let preset = crate::backend::sim::Preset::load("2x-dgx-h100").unwrap();
        let links = LinkModel::new(&preset);
        let devices: Vec<usize> = (0..16).collect();
        let channels = rings(&links, &devices);
        assert_eq!(channels.len(), 8, "a ring per NIC");
        let mut out_nics = Vec::new();
        for ring in &channels {
            let mut sorted = ring.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, devices, "every rank once: {ring:?}");
            assert!(ring[..8].iter().all(|&g| g < 8), "host 0 first: {ring:?}");
            for i in 0..16 {
                let (a, b) = (ring[i], ring[(i + 1) % 16]);
                if links.crosses_hosts(a, b) {
                    assert_eq!(a % 8, b % 8, "the same rail: {ring:?}");
                    out_nics.push(preset.nic_of(a).unwrap().0);
                }
            }
        }
        out_nics.sort_unstable();
        assert_eq!(
            out_nics,
            (0..16).collect::<Vec<_>>(),
            "every NIC sends for one ring"
        );
        // One NIC per host: one ring; one host: the ranks in order.
        let one_nic = crate::backend::sim::Preset::load("2x-pcie-4gpu-2socket").unwrap();
        let ring = rings(&LinkModel::new(&one_nic), &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(ring, vec![vec![0, 1, 2, 3, 7, 6, 5, 4]]);
        assert_eq!(rings(&links, &[3, 1, 2]), vec![vec![3, 1, 2]]);
    }

    #[test]
    fn latency_grows_with_the_ring() {
        let nvlink = RingSteps::within(Hardware::NvLink);
        let latency = |ranks| ring_protocol(8, ranks, H100_BUS, &nvlink).1;
        assert!((latency(2) - (LL.base_us + 2.0 * 0.6)).abs() < 1e-9);
        assert!(latency(2) < latency(4) && latency(4) < latency(8));
        // Two hosts of eight: 2 of the 30 steps cross the network, at NET's step and the
        // network's own latency.
        let two_hosts = RingSteps {
            intra: Hardware::NvLink,
            inter: 2,
            net_latency_us: 2.0,
        };
        let (protocol, across) = ring_protocol(8, 16, H100_BUS, &two_hosts);
        assert_eq!(name(protocol), "LL");
        assert!((across - (LL.base_us + 28.0 * 0.6 + 2.0 * (2.7 + 2.0))).abs() < 1e-9);
    }
}
