//! A simulator preset calibrated from `tune`'s measurements (`peerlink tune --export-sim FILE`).
//!
//! The devices and links come from the topology; every rate and overhead the simulator's link
//! model uses comes from a measured figure, and the preset's `sources` say which. The simulator
//! prices a copy as setup + route latency + bytes / rate, so a small local copy's GPU time is the
//! copy setup, a host or peer copy's α less that setup is its route's latency, and a fitted β is
//! the rate of the narrowest resource the copy crossed. Where tune measured them (with
//! `--export-sim`), the figures the bench reports take precedence over the sweeps' fits: a 4 B
//! copy's GPU time (copy-latency) for the setup and the NVLink latency, and a local copy at the
//! bench's plateau size for the local rate, so that the simulator's bench matches the host's at
//! both ends. What `tune` did not measure (a pair class
//! absent from the selected GPUs, latencies not asked for) is taken from the embedded `dgx-h100`
//! preset and named as such.

use super::{Measurements, PairLatency, SMALL_BYTES};
use crate::backend::sim::preset::{
    Costs, DeviceSpec, GpuSpec, HostSpec, LinkSpec, ManagedSpec, NvLinkSpec, NvSwitchSpec,
    PcieSpec, Preset,
};
use crate::bench::stats::median;
use crate::model::{defaults, Cost, Hop};
use crate::topology::{Link, Topology};
use crate::Result;
use std::collections::BTreeMap;

/// The embedded preset whose figures stand in for what was not measured.
const FALLBACK: &str = "dgx-h100";

/// Refuses a topology of several hosts: an exported preset describes the one host tune measured.
pub fn one_host(topology: &Topology) -> Result<()> {
    match topology.network.as_ref().map_or(1, |n| n.hosts.len()) {
        1 => Ok(()),
        hosts => Err(crate::Error::usage(format!(
            "--export-sim writes a preset of one host, and this one has {hosts}: write a preset of \
             several hosts by hand (docs/sim-format.md)"
        ))),
    }
}

/// A preset named `name` for the host `topology` describes, calibrated from `m`. It is checked as
/// `--sim FILE` would check it.
pub fn preset(m: &Measurements, topology: &Topology, name: &str) -> Result<Preset> {
    one_host(topology)?;
    let mut c = Calibration::new(m, topology)?;
    let local = c.local_copies();
    let sm = c.sm_copies(local.gbps);
    let host_copy_beside_peer = c.host_beside_peer();
    let both_ways_fraction = c.both_ways_fraction();
    let host = HostCopies::of(m, topology);
    let pcie_host = c.pcie_host(&host, local.setup_us);
    let gpu_latency = c.gpu_latency();
    let pcie_latency = c.pcie_latency();
    let nvlink = c.nvlink(local.setup_us);
    let p2p_gbps = c.pcie_p2p_rates(pcie_host.gbps);
    let host_spec = c.host_spec(&host, local.setup_us);
    c.close_sources();
    let gpu = c.gpu_spec(&local, &sm, &gpu_latency, host_copy_beside_peer);
    let devices = c.device_specs(&gpu);
    let pcie = PcieSpec {
        host_gbps: pcie_host.gbps,
        switch_uplink_gbps: None,
        latency_us: pcie_host.latency_us,
        load_latency_ns: pcie_latency.load_ns,
        resident_load_latency_ns: pcie_latency.resident_load_ns,
        signal_us: pcie_latency.signal_us,
        p2p_gbps,
        generation: None,
        lanes: None,
        both_ways_fraction,
    };
    let (nvswitch, links) = fabric_links(topology);
    let preset = Preset {
        name: name.to_string(),
        description: format!(
            "{} × {} calibrated from measurements of {} by peerlink tune on {}. SIMULATED: the \
             figures drive a link model, they are not this host's hardware.",
            topology.devices.len(),
            gpu.name,
            m.source,
            m.measured_on
        ),
        sources: c.sources,
        gpu,
        devices,
        nvlink,
        nvswitch,
        links,
        pcie,
        host: host_spec,
        costs: issue_costs(m, local.setup_us, sm.kernel_setup_us),
        // One host; its NICs are not calibrated (tune measures within the host).
        hosts: 1,
        nics: Vec::new(),
        nic_links: Vec::new(),
        network: None,
        // tune does not measure managed memory's faults: the simulator's estimates stand.
        managed: ManagedSpec::default(),
        faults: Default::default(),
        partial: crate::interrupt::requested(),
    };
    checked(preset, name)
}

/// The preset as a person reads it, checked as `--sim FILE` would check it. Four significant
/// digits: the figures' own precision, and a file a person can read and edit.
fn checked(preset: Preset, name: &str) -> Result<Preset> {
    let mut value = serde_json::to_value(&preset).expect("a preset always serialises");
    round_floats(&mut value);
    Preset::parse(&value.to_string(), name)
}

/// The CPU's and the GPU's fixed costs per operation, as measured.
fn issue_costs(m: &Measurements, copy_setup_us: f64, kernel_setup_us: f64) -> Costs {
    Costs {
        copy_issue_us: m.issue.copy_us,
        kernel_issue_us: m.issue.kernel_us,
        event_issue_us: m.issue.event_us,
        graph_issue_us: m.issue.graph_us,
        sync_us: m.receiver_us,
        copy_setup_us,
        kernel_setup_us,
        graph_node_us: m.graph_node_us,
    }
}

/// Through an NVSwitch, its links per GPU and no pair links; else every pair's link.
fn fabric_links(topology: &Topology) -> (Option<NvSwitchSpec>, Vec<LinkSpec>) {
    let nvswitch = switch_links(topology).map(|links_per_gpu| NvSwitchSpec { links_per_gpu });
    let links = if nvswitch.is_some() {
        Vec::new()
    } else {
        topology
            .pairs
            .iter()
            .filter(|p| p.src < p.dst)
            .map(|p| LinkSpec {
                gpus: [p.src, p.dst],
                link: p.link,
            })
            .collect()
    };
    (nvswitch, links)
}

/// Rounds every non-integer number in `value` to four significant digits.
fn round_floats(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().expect("an f64");
            if let Some(r) = serde_json::Number::from_f64(significant(x, 4)) {
                *n = r;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(round_floats),
        Value::Object(fields) => fields.values_mut().for_each(round_floats),
        _ => {}
    }
}

/// `x` rounded to `digits` significant digits.
fn significant(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(digits - 1 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// A preset's figures being calibrated: where each came from, measured (`sources`) or borrowed from
/// the fallback (`borrowed`), in the order the preset lists them.
struct Calibration<'a> {
    m: &'a Measurements,
    topology: &'a Topology,
    fallback: Preset,
    sources: Vec<String>,
    borrowed: Vec<String>,
}

/// A copy within one GPU: its rate and its setup (the GPU time of a small one).
struct LocalCopies {
    gbps: f64,
    setup_us: f64,
}

/// An SM copy kernel within one GPU: its rate over the copy engine's, and its setup.
struct SmCopies {
    efficiency: f64,
    kernel_setup_us: f64,
}

/// Host copies over PCIe: their rate and their latency beyond the copy setup.
struct PcieHost {
    gbps: f64,
    latency_us: f64,
}

/// A section's load and signal latencies, as a preset holds them.
struct Latency {
    load_ns: f64,
    /// `None`: the section's default (see `resident_load_ns` of the preset's specs).
    resident_load_ns: Option<f64>,
    signal_us: f64,
}

impl Latency {
    fn of(load_ns: f64, resident_load_ns: Option<f64>, signal_us: f64) -> Latency {
        Latency {
            load_ns,
            resident_load_ns,
            signal_us,
        }
    }
}

impl<'a> Calibration<'a> {
    /// The fallback preset loaded and the first source, which names the run.
    fn new(m: &'a Measurements, topology: &'a Topology) -> Result<Self> {
        let source = format!(
            "measured by peerlink tune on {}, {} (driver {}): GPUs {}",
            m.measured_on,
            m.source,
            topology.driver_version.as_deref().unwrap_or("unknown"),
            m.devices
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(Calibration {
            m,
            topology,
            fallback: Preset::load(FALLBACK)?,
            sources: vec![source],
            borrowed: Vec::new(),
        })
    }

    /// The local copy's rate and setup. The bench reports a copy's rate at its plateau size and a
    /// small copy's GPU time, so the simulator takes those where tune measured them: the sweeps'
    /// α–β fit (4 KiB–32 MiB) left the H200's local copies 7% below their plateau and a 4 B peer
    /// copy 21% above its time.
    fn local_copies(&mut self) -> LocalCopies {
        let m = self.m;
        let locals = m.costs(|h| matches!(h, Hop::Local { .. }));
        let fitted_setup_us = finite_median(locals.iter().map(|(_, c)| c.alpha_us));
        let fitted_local_gbps = finite_median(locals.iter().map(|(_, c)| c.beta_gbps));
        if fitted_local_gbps.is_none() {
            self.borrowed
                .push("gpu.local_copy_gbps, costs.copy_setup_us".into());
        }
        let plateau_gbps = m.latencies.and_then(|l| {
            let p = l.local_plateau;
            let fixed_us = fitted_setup_us.unwrap_or(0.0);
            (p.median_us > fixed_us).then(|| p.bytes as f64 / ((p.median_us - fixed_us) * 1e3))
        });
        let gbps = plateau_gbps
            .or(fitted_local_gbps)
            .unwrap_or(self.fallback.gpu.local_copy_gbps);
        let small_copy_setup_us = m
            .latencies
            .map(|l| (l.local.copy_us - bytes_us(SMALL_BYTES, gbps)).max(0.0));
        let setup_us = small_copy_setup_us
            .or(fitted_setup_us)
            .unwrap_or(self.fallback.costs.copy_setup_us);
        self.sources.push(match (plateau_gbps, m.latencies) {
            (Some(_), Some(l)) => format!(
                "gpu.local_copy_gbps {gbps:.1}: back-to-back copies of {} within GPU {} \
                 (the bench's plateau size), less the fitted α; costs.copy_setup_us \
                 {setup_us:.2}: GPU time per back-to-back {SMALL_BYTES} B copy within GPU {} \
                 (the bench's copy-latency)",
                crate::units::format_bytes(l.local_plateau.bytes),
                l.local_plateau.device,
                l.local.src
            ),
            _ => format!(
                "gpu.local_copy_gbps {gbps:.1}, costs.copy_setup_us {setup_us:.2}: β \
                 and α of the local copy-engine sweeps (median over GPUs)"
            ),
        });
        LocalCopies { gbps, setup_us }
    }

    /// The SM copy kernel's efficiency beside the local copy engine's rate, and its setup.
    fn sm_copies(&mut self, local_copy_gbps: f64) -> SmCopies {
        let sm_local = self.m.sm_local.fit;
        let efficiency = sm_local
            .map(|f| (f.beta_gbps / local_copy_gbps).min(1.0))
            .unwrap_or(self.fallback.gpu.sm_copy_efficiency);
        let kernel_setup_us = sm_local
            .map(|f| f.alpha_us)
            .unwrap_or(self.fallback.costs.kernel_setup_us);
        match sm_local {
            Some(_) => self.sources.push(format!(
                "gpu.sm_copy_efficiency {efficiency:.3}, costs.kernel_setup_us \
                 {kernel_setup_us:.2}: an SM copy kernel within GPU {} (its β over the local copy \
                 engine's; its α)",
                self.m.sm_local.src
            )),
            None => self
                .borrowed
                .push("gpu.sm_copy_efficiency, costs.kernel_setup_us".into()),
        }
        SmCopies {
            efficiency,
            kernel_setup_us,
        }
    }

    /// The fitted rate of the host route's first hop beside a direct copy stands for the
    /// simulator's slowdown of copies into host memory beside NVLink (its per-chunk cost is the
    /// model's, which the simulator has no figure for).
    fn host_beside_peer(&mut self) -> Option<f64> {
        let beside = self
            .m
            .splits
            .iter()
            .find_map(|fit| Some((fit, fit.kept()?.rate_fraction)))
            .filter(|&(_, fraction)| fraction < 1.0);
        if let Some((fit, fraction)) = beside {
            self.sources.push(format!(
                "gpu.host_copy_beside_peer {fraction:.3}: the host route's device → host rate \
                 beside a direct copy, fitted to splits on GPU {} → GPU {}",
                fit.src, fit.dst
            ));
        }
        beside.map(|(_, fraction)| fraction)
    }

    /// The host route's fraction both ways stands for the simulator's slowdown of host copies over
    /// a PCIe link that carries copies the other way.
    fn both_ways_fraction(&mut self) -> Option<f64> {
        let both_ways = self
            .m
            .both_ways
            .as_ref()
            .and_then(|fit| Some((fit.pair, fit.fraction?)))
            .filter(|&(_, fraction)| fraction < 1.0);
        if let Some(((a, b), fraction)) = both_ways {
            self.sources.push(format!(
                "pcie.both_ways_fraction {fraction:.3}: the host route's rate both ways over one \
                 way, fitted to splits of GPU {a} → GPU {b} and back run at once"
            ));
        }
        both_ways.map(|(_, fraction)| fraction)
    }

    /// Host copies with the memory on the GPU's own node: their rate, and their α beyond the copy
    /// setup as the PCIe latency.
    fn pcie_host(&mut self, host: &HostCopies, copy_setup_us: f64) -> PcieHost {
        let latency_us = (host.local_alpha_us.unwrap_or(copy_setup_us) - copy_setup_us).max(0.0);
        let gbps = host.local_gbps.unwrap_or(self.fallback.pcie.host_gbps);
        match host.local_gbps {
            Some(_) => self.sources.push(format!(
                "pcie.host_gbps {gbps:.1}, pcie.latency_us {latency_us:.2}: host↔device \
                 sweeps with pinned memory on the GPU's NUMA node (median β; median α less the \
                 copy setup)"
            )),
            None => self.borrowed.push("pcie.host_gbps, pcie.latency_us".into()),
        }
        PcieHost { gbps, latency_us }
    }

    fn gpu_latency(&mut self) -> Latency {
        let f = &self.fallback.gpu;
        let fallback = Latency::of(f.load_latency_ns, f.resident_load_latency_ns, f.signal_us);
        self.latency("gpu", self.m.latencies.map(|l| l.local), fallback)
    }

    fn pcie_latency(&mut self) -> Latency {
        let f = &self.fallback.pcie;
        let fallback = Latency::of(f.load_latency_ns, f.resident_load_latency_ns, f.signal_us);
        self.latency("pcie", self.m.latencies.and_then(|l| l.pcie), fallback)
    }

    /// The `section`'s load latencies (ns: caches flushed, and through a chain they hold) and
    /// signal latency (µs): measured on a pair, or the fallback's.
    fn latency(
        &mut self,
        section: &str,
        measured: Option<PairLatency>,
        fallback: Latency,
    ) -> Latency {
        let fields = format!(
            "{section}.load_latency_ns, {section}.resident_load_latency_ns, {section}.signal_us"
        );
        match measured {
            Some(l) => {
                self.sources.push(format!(
                    "{fields} {:.0} ns, {:.0} ns, {:.2} µs: pointer chase (caches flushed), \
                     pointer-chase-resident and half a ping-pong from GPU {} to GPU {}",
                    l.load_ns, l.resident_load_ns, l.signal_us, l.src, l.dst
                ));
                Latency::of(l.load_ns, Some(l.resident_load_ns), l.signal_us)
            }
            None => {
                self.borrowed.push(fields);
                fallback
            }
        }
    }

    /// NVLink's section, where the host has NVLink pairs: the rate per link, the latency of a
    /// small copy beyond the copy setup, and the load and signal latencies.
    fn nvlink(&mut self, copy_setup_us: f64) -> Option<NvLinkSpec> {
        let (m, topology) = (self.m, self.topology);
        if !topology.pairs.iter().any(|p| p.link.is_nvlink()) {
            return None;
        }
        let nv_fallback = self.fallback.nvlink.clone().expect("dgx-h100 has NVLink");
        let measured: Vec<(u32, Cost)> = m
            .costs(|h| matches!(h, Hop::PeerCe { .. }))
            .into_iter()
            .filter_map(|(hop, cost)| match (hop, peer_link(topology, hop)) {
                (_, Some(Link::NvLink(n))) if n > 0 => Some((n, cost)),
                _ => None,
            })
            .collect();
        let per_link = finite_median(measured.iter().map(|(n, c)| c.beta_gbps / f64::from(*n)));
        let small = small_nvlink_copy_us(m, topology, per_link);
        let alpha = small.or(finite_median(measured.iter().map(|(_, c)| c.alpha_us)));
        let fallback = Latency::of(
            nv_fallback.load_latency_ns,
            nv_fallback.resident_load_latency_ns,
            nv_fallback.signal_us,
        );
        let latency = self.latency("nvlink", m.latencies.and_then(|l| l.nvlink), fallback);
        let spec = NvLinkSpec {
            link_gbps: per_link.unwrap_or(nv_fallback.link_gbps * nv_fallback.efficiency),
            efficiency: 1.0,
            latency_us: alpha.map_or(nv_fallback.latency_us, |a| (a - copy_setup_us).max(0.0)),
            load_latency_ns: latency.load_ns,
            resident_load_latency_ns: latency.resident_load_ns,
            signal_us: latency.signal_us,
        };
        match per_link {
            Some(rate) => self.sources.push(format!(
                "nvlink.link_gbps {rate:.2} with efficiency 1: copy-engine β per link (median over \
                 {} NVLink pairs of β / link count; the efficiency is already in it); \
                 nvlink.latency_us {:.2}: {} less the copy setup",
                measured.len(),
                spec.latency_us,
                if small.is_some() {
                    "the GPU time of a back-to-back 4 B copy over NVLink (the bench's copy-latency)"
                } else {
                    "their median α"
                }
            )),
            None => self.borrowed.push(
                "nvlink.link_gbps (line rate × efficiency), nvlink.latency_us: no NVLink pair \
                 measured"
                    .into(),
            ),
        }
        Some(spec)
    }

    /// P2P rate per PCIe class that has P2P in the topology: the median copy-engine β of the
    /// measured pairs of that class, or the host link's rate where none was measured.
    fn pcie_p2p_rates(&mut self, host_gbps: f64) -> BTreeMap<Link, f64> {
        let (m, topology) = (self.m, self.topology);
        let mut rates = BTreeMap::new();
        let mut classes: Vec<Link> = topology
            .pairs
            .iter()
            .filter(|p| p.p2p && !p.link.is_nvlink())
            .map(|p| p.link)
            .collect();
        classes.sort_unstable();
        classes.dedup();
        for class in classes {
            let measured = m.costs(|h| {
                matches!(h, Hop::PeerCe { .. }) && peer_link(topology, h) == Some(class)
            });
            let rate = finite_median(measured.iter().map(|(_, c)| c.beta_gbps));
            match rate {
                Some(r) => self.sources.push(format!(
                    "pcie.p2p_gbps.{class} {r:.1}: copy-engine β of {} {class} pair{} with P2P \
                     (median)",
                    measured.len(),
                    if measured.len() == 1 { "" } else { "s" }
                )),
                None => self.borrowed.push(format!(
                    "pcie.p2p_gbps.{class}: no {class} pair measured, set to the host link's rate"
                )),
            }
            if topology.pairs.iter().any(|p| p.link == class && !p.p2p) {
                self.sources.push(format!(
                    "{class}: some pairs of this class have P2P and some do not; the simulator \
                     gives P2P to every {class} pair"
                ));
            }
            rates.insert(class, rate.unwrap_or(host_gbps));
        }
        rates
    }

    /// The host section: the rate across the sockets, and the driver's staged copies.
    fn host_spec(&mut self, host: &HostCopies, copy_setup_us: f64) -> HostSpec {
        let fallback = &self.fallback.host;
        let inter_socket_gbps = host.remote_gbps.unwrap_or(fallback.inter_socket_gbps);
        match host.remote_gbps {
            Some(rate) => self.sources.push(format!(
                "host.inter_socket_gbps {rate:.1}: host↔device with pinned memory on the other \
                 NUMA node (median β, one GPU at a time: a lower bound on the interconnect)"
            )),
            None => self
                .borrowed
                .push("host.inter_socket_gbps (one NUMA node: unused)".into()),
        }
        let staged_gbps = host.staged_gbps.unwrap_or(fallback.staged_gbps);
        let staged_latency_us = host
            .staged_alpha_us
            .map_or(fallback.staged_latency_us, |a| (a - copy_setup_us).max(0.0));
        match host.staged_gbps {
            Some(_) => self.sources.push(format!(
                "host.staged_gbps {staged_gbps:.1}, staged_latency_us {staged_latency_us:.2}: \
                 derived from the measured host hops, not measured as such: a copy the driver \
                 stages through host memory moves at the slower of device→host and host→device \
                 and pays both α"
            )),
            None => self
                .borrowed
                .push("host.staged_gbps, host.staged_latency_us".into()),
        }
        HostSpec {
            inter_socket_gbps,
            staged_gbps,
            staged_latency_us,
        }
    }

    /// The sources' closing lines: the measured fixed costs, then what was borrowed.
    fn close_sources(&mut self) {
        let m = self.m;
        self.sources.push(format!(
            "costs: CPU time to queue a copy {:.2} µs, a kernel {:.2}, an event {:.2}, a graph \
             {:.2}; sync_us {:.2} µs: from queuing an empty marker on an idle stream until the \
             host saw it done (the GPU's pick-up, its completion signal, the host's wake-up; a \
             blocking synchronisation on an event already done takes {:.2}); GPU time per \
             replayed graph node {:.3} µs (measured)",
            m.issue.copy_us,
            m.issue.kernel_us,
            m.issue.event_us,
            m.issue.graph_us,
            m.receiver_us,
            m.sync_us,
            m.graph_node_us
        ));
        if !self.borrowed.is_empty() {
            self.sources.push(format!(
                "not measured, taken from the embedded {FALLBACK} preset (published figures): {}",
                self.borrowed.join("; ")
            ));
        }
    }

    /// The GPU section, from the first GPU measured.
    fn gpu_spec(
        &self,
        local: &LocalCopies,
        sm: &SmCopies,
        latency: &Latency,
        host_copy_beside_peer: Option<f64>,
    ) -> GpuSpec {
        let first = &self.topology.devices[self.m.devices[0]];
        GpuSpec {
            name: first.name.clone(),
            memory_mib: first.memory_bytes >> 20,
            compute_capability: first.compute_capability.clone(),
            copy_engines: first.copy_engines,
            local_copy_gbps: local.gbps,
            sm_copy_efficiency: sm.efficiency,
            load_latency_ns: latency.load_ns,
            resident_load_latency_ns: latency.resident_load_ns,
            signal_us: latency.signal_us,
            host_copy_beside_peer,
        }
    }

    /// Every GPU of the host, naming what differs from `gpu`.
    fn device_specs(&mut self, gpu: &GpuSpec) -> Vec<DeviceSpec> {
        let topology = self.topology;
        let switches = pcie_switches(topology);
        let devices = topology
            .devices
            .iter()
            .zip(switches)
            .map(|(d, pcie_switch)| DeviceSpec {
                numa_node: d.numa_node.unwrap_or(0),
                pci_bus_id: Some(d.pci_bus_id.clone()),
                pcie_switch,
                cpu_affinity: d.cpu_affinity.clone(),
                name: (d.name != gpu.name).then(|| d.name.clone()),
                memory_mib: (d.memory_bytes >> 20 != gpu.memory_mib)
                    .then_some(d.memory_bytes >> 20),
                mig_enabled: d.mig_enabled,
            })
            .collect();
        if topology.devices.iter().any(|d| d.numa_node.is_none()) {
            self.sources
                .push("devices: NUMA node unknown for some GPUs, set to 0".into());
        }
        devices
    }
}

/// A small copy's GPU time over NVLink, measured, less its bytes at the fitted rate per link.
fn small_nvlink_copy_us(
    m: &Measurements,
    topology: &Topology,
    per_link: Option<f64>,
) -> Option<f64> {
    let p = m.latencies.and_then(|l| l.nvlink)?;
    let links = match topology.pair(p.src, p.dst).map(|q| q.link) {
        Some(Link::NvLink(n)) => f64::from(n),
        _ => return None,
    };
    let rate = per_link.map_or(0.0, |r| r * links);
    Some(p.copy_us - bytes_us(SMALL_BYTES, rate))
}

/// µs that `bytes` take at `gbps` (none at an unknown rate).
fn bytes_us(bytes: usize, gbps: f64) -> f64 {
    if gbps > 0.0 {
        bytes as f64 / (gbps * 1e3)
    } else {
        0.0
    }
}

/// The median of the finite ones of some figures, `None` when there are none.
fn finite_median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let finite: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    median(&finite)
}

fn peer_link(topology: &Topology, hop: Hop) -> Option<Link> {
    match hop {
        Hop::PeerCe { src, dst } | Hop::PeerSm { src, dst } => {
            topology.pair(src, dst).map(|p| p.link)
        }
        _ => None,
    }
}

/// The host-copy figures of the preset, from the measured host hops.
struct HostCopies {
    /// Median β and α of host copies with the memory on the GPU's own node.
    local_gbps: Option<f64>,
    local_alpha_us: Option<f64>,
    /// Median β of host copies with the memory on another node.
    remote_gbps: Option<f64>,
    /// The slower direction's median β, and the sum of both directions' median α.
    staged_gbps: Option<f64>,
    staged_alpha_us: Option<f64>,
}

impl HostCopies {
    fn of(m: &Measurements, topology: &Topology) -> HostCopies {
        let near = |device: usize, node: Option<i32>| {
            node.is_none() || node == topology.devices[device].numa_node
        };
        let local = m.costs(|h| match h {
            Hop::DeviceToHost { device, node } | Hop::HostToDevice { device, node } => {
                near(device, node)
            }
            _ => false,
        });
        let remote = m.costs(|h| match h {
            Hop::DeviceToHost { device, node } | Hop::HostToDevice { device, node } => {
                !near(device, node)
            }
            _ => false,
        });
        let direction = |up: bool| -> Vec<Cost> {
            local
                .iter()
                .filter(|(h, _)| matches!(h, Hop::DeviceToHost { .. }) == up)
                .map(|(_, c)| *c)
                .collect()
        };
        let (up, down) = (direction(true), direction(false));
        let beta = |costs: &[Cost]| finite_median(costs.iter().map(|c| c.beta_gbps));
        let alpha = |costs: &[Cost]| finite_median(costs.iter().map(|c| c.alpha_us));
        HostCopies {
            local_gbps: finite_median(local.iter().map(|(_, c)| c.beta_gbps)),
            local_alpha_us: finite_median(local.iter().map(|(_, c)| c.alpha_us)),
            remote_gbps: finite_median(remote.iter().map(|(_, c)| c.beta_gbps)),
            staged_gbps: beta(&up).zip(beta(&down)).map(|(u, d)| u.min(d)),
            staged_alpha_us: alpha(&up).zip(alpha(&down)).map(|(u, d)| u + d),
        }
    }
}

/// `Some(n)` where every pair is `NV<n>` through an NVSwitch (each GPU's port is shared by all its
/// peers), as the cost model sees it.
fn switch_links(topology: &Topology) -> Option<u32> {
    let first = topology.pairs.first()?.link;
    let Link::NvLink(n) = first else { return None };
    let uniform = topology.pairs.iter().all(|p| p.link == first);
    (uniform && defaults::behind_switch(topology, 0)).then_some(n)
}

/// A PCIe switch name per GPU: GPUs that are `PIX` to each other sit under one switch.
fn pcie_switches(topology: &Topology) -> Vec<Option<String>> {
    let n = topology.devices.len();
    let mut group: Vec<usize> = (0..n).collect();
    for p in topology.pairs.iter().filter(|p| p.link == Link::Pix) {
        let (a, b) = (group[p.src], group[p.dst]);
        for g in group.iter_mut().filter(|g| **g == b) {
            *g = a;
        }
    }
    (0..n)
        .map(|i| {
            let shared = group.iter().filter(|&&g| g == group[i]).count() > 1;
            shared.then(|| format!("switch{}", group[i]))
        })
        .collect()
}
