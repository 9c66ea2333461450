//! Faults a simulated host can carry, so that `peerlink doctor`'s verdicts can be tested: a pair's
//! P2P switched off, a PCIe link trained below its maximum, NVLinks down, error counters that rise
//! with traffic, persistence mode off, clocks held back. MIG is a device's own field
//! (`devices[i].mig_enabled`).
//!
//! A fault changes what the simulated host does, not only what it reports: a pair with P2P off
//! stages its copies through host memory, a downgraded PCIe link moves host copies at its trained
//! rate, a dead NVLink leaves its bundle (or its GPU's switch port) one link narrower, and a rising
//! counter rises with the bytes that really crossed the GPU's links in virtual time.

use super::Simulator;
use crate::backend::health::{
    ClockEvents, Counter, GpuHealth, NvLinkPort, PcieLink, RawHealth, Reading,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the faults' rules need of the host they are part of (a preset's, [`Preset::wiring`]): how
/// many GPUs it has, the PCIe link each trained for, and how its NVLinks are wired. The faults
/// know no preset: the preset holds its faults.
///
/// [`Preset::wiring`]: super::Preset::wiring
pub struct Wiring<'a> {
    /// GPUs of one host.
    pub gpus: usize,
    /// The PCIe generation and lanes every GPU's link trains for, where the preset says.
    pub pcie: (Option<u32>, Option<u32>),
    /// NVLinks from each GPU into an NVSwitch, where the host has one.
    pub switch_links: Option<u32>,
    /// Direct NVLink bundles (unordered pairs of a host's GPUs, links), in the preset's order.
    pub bundles: Vec<([usize; 2], u32)>,
    pub faults: &'a Faults,
}

/// The faults of a preset (`faults` in the preset format); each list may be left out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Pairs of GPUs (unordered) whose P2P the driver reports unsupported, whatever links them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub p2p_off: Vec<[usize; 2]>,
    /// GPUs whose PCIe link trained below `pcie.generation` and `pcie.lanes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pcie_trained: Vec<PcieTrained>,
    /// NVLinks that are down, by GPU and link index (both ends of a direct link go down).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks_down: Vec<LinksDown>,
    /// Error counters that rise with the traffic through a GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rising_counters: Vec<RisingCounter>,
    /// GPUs whose persistence mode is off (it is on elsewhere).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub persistence_off: Vec<usize>,
    /// Clocks event reasons active on a GPU (NVML's, named as `peerlink doctor` names them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clock_events: Vec<GpuClockEvents>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PcieTrained {
    pub gpu: usize,
    /// The PCIe generation the link trained at.
    pub generation: u32,
    /// The lanes it trained with.
    pub lanes: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LinksDown {
    pub gpu: usize,
    /// Link indices, 0-based, in the order the GPU's links are laid out (see docs/sim-format.md).
    pub links: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RisingCounter {
    pub gpu: usize,
    pub counter: Counter,
    /// Counts added per GiB of traffic: over the GPU's NVLinks for the NVLink counters, through
    /// any of its links and its memory for `ecc-uncorrected`.
    pub per_gib: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuClockEvents {
    pub gpu: usize,
    /// Reason names: gpu-idle, applications-clocks, sw-power-cap, hw-slowdown, sync-boost,
    /// sw-thermal, hw-thermal, hw-power-brake, display-clocks.
    pub reasons: Vec<String>,
}

/// What the far end of a simulated NVLink port is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remote {
    /// The `index`-th link of the bundle to GPU `peer`.
    Gpu {
        peer: usize,
        index: u32,
    },
    Switch,
}

/// One NVLink port of a simulated GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Port {
    pub remote: Remote,
    pub active: bool,
}

impl Faults {
    pub fn is_empty(&self) -> bool {
        *self == Faults::default()
    }

    /// Whether the faults switch P2P off between `a` and `b`.
    pub fn p2p_off(&self, a: usize, b: usize) -> bool {
        self.p2p_off
            .iter()
            .any(|&[x, y]| (x, y) == (a, b) || (x, y) == (b, a))
    }

    fn links_down(&self, gpu: usize) -> impl Iterator<Item = u32> + '_ {
        self.nvlinks_down
            .iter()
            .filter(move |d| d.gpu == gpu)
            .flat_map(|d| d.links.iter().copied())
    }

    /// Checks the faults against the preset they are part of.
    pub(super) fn validate(&self, wiring: &Wiring<'_>) -> std::result::Result<(), String> {
        let n = wiring.gpus;
        let gpu = |field: String, g: usize| match crate::topology::missing_gpu(g, n) {
            Some(missing) => Err(format!("{field}: {missing}")),
            None => Ok(()),
        };
        for (i, &[a, b]) in self.p2p_off.iter().enumerate() {
            gpu(format!("faults.p2p_off[{i}]"), a)?;
            gpu(format!("faults.p2p_off[{i}]"), b)?;
            if a == b {
                return Err(format!("faults.p2p_off[{i}] pairs GPU {a} with itself"));
            }
        }
        for (i, t) in self.pcie_trained.iter().enumerate() {
            let field = format!("faults.pcie_trained[{i}]");
            gpu(field.clone(), t.gpu)?;
            let (Some(max_generation), Some(max_lanes)) = wiring.pcie else {
                return Err(format!(
                    "{field} needs `pcie.generation` and `pcie.lanes`: the link it trained below"
                ));
            };
            if !(1..=max_generation).contains(&t.generation) {
                return Err(format!(
                    "{field}.generation must be 1 to pcie.generation ({max_generation}), not {}",
                    t.generation
                ));
            }
            if !(1..=max_lanes).contains(&t.lanes) {
                return Err(format!(
                    "{field}.lanes must be 1 to pcie.lanes ({max_lanes}), not {}",
                    t.lanes
                ));
            }
        }
        for (i, down) in self.nvlinks_down.iter().enumerate() {
            let field = format!("faults.nvlinks_down[{i}]");
            gpu(field.clone(), down.gpu)?;
            let links = ports(wiring, down.gpu).len();
            if let Some(bad) = down.links.iter().find(|&&l| l as usize >= links) {
                return Err(format!(
                    "{field} names link {bad} but GPU {} has {links} NVLink{}",
                    down.gpu,
                    if links == 1 { "" } else { "s" }
                ));
            }
        }
        for (i, rising) in self.rising_counters.iter().enumerate() {
            let field = format!("faults.rising_counters[{i}]");
            gpu(field.clone(), rising.gpu)?;
            if !(rising.per_gib.is_finite() && rising.per_gib > 0.0 && rising.per_gib < 1e12) {
                return Err(format!(
                    "{field}.per_gib must be a positive number below 1e12, not {}",
                    rising.per_gib
                ));
            }
        }
        for (i, &g) in self.persistence_off.iter().enumerate() {
            gpu(format!("faults.persistence_off[{i}]"), g)?;
        }
        for (i, events) in self.clock_events.iter().enumerate() {
            let field = format!("faults.clock_events[{i}]");
            gpu(field.clone(), events.gpu)?;
            if let Some(unknown) = events
                .reasons
                .iter()
                .find(|r| ClockEvents::named(r).is_none())
            {
                let known: Vec<&str> = crate::backend::health::CLOCK_EVENTS
                    .iter()
                    .map(|e| e.name)
                    .collect();
                return Err(format!(
                    "{field} names the reason `{unknown}`; known reasons: {}",
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// The NVLink ports of GPU `gpu`, in link-index order: with an NVSwitch `links_per_gpu` ports
/// into it; otherwise, for each `links` entry naming the GPU with `NV<n>`, in the entry's order,
/// `n` ports to that peer. A port is down where the faults say so at either end.
pub fn ports(wiring: &Wiring<'_>, gpu: usize) -> Vec<Port> {
    let mut ports = layout(wiring, gpu);
    let faults = wiring.faults;
    let down_here: Vec<u32> = faults.links_down(gpu).collect();
    for (link, port) in ports.iter_mut().enumerate() {
        port.active = !down_here.contains(&(link as u32))
            && match port.remote {
                // The far end of a direct link: the same link of the bundle, seen from the peer.
                Remote::Gpu { peer, index } => {
                    let theirs = layout(wiring, peer)
                        .iter()
                        .position(|p| p.remote == Remote::Gpu { peer: gpu, index });
                    theirs.is_none_or(|at| !faults.links_down(peer).any(|l| l as usize == at))
                }
                Remote::Switch => true,
            };
    }
    ports
}

/// The ports of GPU `gpu` with every link up.
fn layout(wiring: &Wiring<'_>, gpu: usize) -> Vec<Port> {
    let up = |remote| Port {
        remote,
        active: true,
    };
    if let Some(links) = wiring.switch_links {
        return (0..links).map(|_| up(Remote::Switch)).collect();
    }
    let mut ports = Vec::new();
    for &([a, b], count) in &wiring.bundles {
        let peer = match gpu {
            g if g == a => b,
            g if g == b => a,
            _ => continue,
        };
        ports.extend((0..count).map(|index| up(Remote::Gpu { peer, index })));
    }
    ports
}

/// Active NVLinks between distinct GPUs `a` and `b` under the preset's faults: the bundle's links
/// whose ends are both up, or, through a switch, the fewer of the two GPUs' active ports.
pub fn active_links(wiring: &Wiring<'_>, a: usize, b: usize) -> u32 {
    let from_a = ports(wiring, a);
    if wiring.switch_links.is_some() {
        let active = |ports: &[Port]| ports.iter().filter(|p| p.active).count() as u32;
        return active(&from_a).min(active(&ports(wiring, b)));
    }
    from_a
        .iter()
        .filter(|p| p.active && matches!(p.remote, Remote::Gpu { peer, .. } if peer == b))
        .count() as u32
}

/// Data rate of one PCIe lane of each generation after line encoding, Gb/s (8b/10b for Gen1–2,
/// 128b/130b for Gen3–5, FLIT for Gen6): what a downgraded link's share of its rate is taken from.
fn lane_gbits(generation: u32) -> f64 {
    match generation {
        1 => 2.0,
        2 => 4.0,
        3 => 7.877,
        4 => 15.754,
        5 => 31.508,
        _ => 63.0,
    }
}

/// The share of its full rate GPU `gpu`'s PCIe link runs at (1 unless the faults downgrade it).
pub fn pcie_share(wiring: &Wiring<'_>, gpu: usize) -> f64 {
    match (trained(wiring.faults, gpu), wiring.pcie) {
        (Some(t), (Some(generation), Some(lanes))) => {
            (lane_gbits(t.generation) * t.lanes as f64) / (lane_gbits(generation) * lanes as f64)
        }
        _ => 1.0,
    }
}

fn trained(faults: &Faults, gpu: usize) -> Option<&PcieTrained> {
    faults.pcie_trained.iter().find(|t| t.gpu == gpu)
}

const GIB: f64 = (1u64 << 30) as f64;

impl RawHealth for Simulator {
    fn gpu_health(&self, gpu: usize) -> GpuHealth {
        let preset = self.links.preset();
        let faults = &preset.faults;
        // The faults name GPUs as their host numbers them.
        let local = preset.local(gpu);
        let pcie = match (preset.pcie.generation, preset.pcie.lanes) {
            (Some(max_generation), Some(max_width)) => {
                let now = trained(faults, local);
                Ok(PcieLink {
                    generation: now.map_or(max_generation, |t| t.generation),
                    width: now.map_or(max_width, |t| t.lanes),
                    max_generation,
                    max_width,
                })
            }
            _ => Err("the preset gives no `pcie.generation` and `pcie.lanes`".to_string()),
        };
        let ports = ports(&preset.wiring(), local);
        let nvlinks = ports
            .iter()
            .enumerate()
            .map(|(link, p)| NvLinkPort {
                link: link as u32,
                active: p.active,
            })
            .collect();
        let mut st = self.lock();
        Self::catch_up(&mut st);
        let counters = Counter::ALL
            .iter()
            .filter(|c| !(c.is_nvlink() && ports.is_empty()))
            .map(|&counter| {
                let resources = if counter.is_nvlink() {
                    self.links.nvlink_resources(gpu)
                } else {
                    self.links.gpu_resources(gpu)
                };
                let gib: f64 = resources
                    .iter()
                    .map(|&r| st.scheduler.moved(r))
                    .sum::<f64>()
                    / GIB;
                let rate: f64 = faults
                    .rising_counters
                    .iter()
                    .filter(|c| c.gpu == local && c.counter == counter)
                    .map(|c| c.per_gib)
                    .sum();
                let count: Reading<u64> = Ok((rate * gib).floor() as u64);
                (counter, count)
            })
            .collect::<BTreeMap<_, _>>();
        let reasons = faults
            .clock_events
            .iter()
            .filter(|e| e.gpu == local)
            .flat_map(|e| &e.reasons)
            .filter_map(|name| ClockEvents::named(name))
            .fold(0, |bits, e| bits | e.bit);
        GpuHealth {
            pcie,
            nvlinks: Ok(nvlinks),
            counters,
            persistence_mode: Ok(!faults.persistence_off.contains(&local)),
            clock_events: Ok(ClockEvents(reasons)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{Preset, SimBackend};
    use crate::backend::{Backend, BufferCopy, CopyMethod, Memory};
    use crate::topology::Link;

    fn preset(name: &str) -> Preset {
        Preset::load(name).unwrap()
    }

    /// `name` with `faults` (JSON) put in, parsed and checked as a file would be.
    fn with_faults(name: &str, faults: serde_json::Value) -> crate::Result<Preset> {
        let mut value = serde_json::to_value(preset(name)).unwrap();
        value["faults"] = faults;
        Preset::parse(&value.to_string(), "faulty.json")
    }

    fn refusal(name: &str, faults: serde_json::Value) -> String {
        let err = with_faults(name, faults).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        err.to_string()
    }

    #[test]
    fn faults_that_name_what_does_not_exist_are_refused() {
        use serde_json::json;
        let m = refusal("h200-pair", json!({"p2p_off": [[0, 2]]}));
        assert!(m.contains("faults.p2p_off[0]: GPU 2 does not exist"), "{m}");
        let m = refusal("h200-pair", json!({"p2p_off": [[1, 1]]}));
        assert!(m.contains("pairs GPU 1 with itself"), "{m}");
        let m = refusal(
            "h200-pair",
            json!({"nvlinks_down": [{"gpu": 0, "links": [18]}]}),
        );
        assert!(m.contains("names link 18 but GPU 0 has 18 NVLinks"), "{m}");
        let m = refusal(
            "h200-pair",
            json!({"pcie_trained": [{"gpu": 0, "generation": 6, "lanes": 16}]}),
        );
        assert!(
            m.contains("generation must be 1 to pcie.generation (5)"),
            "{m}"
        );
        let m = refusal(
            "h200-pair",
            json!({"rising_counters": [{"gpu": 0, "counter": "nvlink-crc", "per_gib": 0}]}),
        );
        assert!(m.contains("per_gib must be a positive number"), "{m}");
        let m = refusal(
            "h200-pair",
            json!({"rising_counters": [{"gpu": 0, "counter": "parity", "per_gib": 1}]}),
        );
        assert!(m.contains("unknown variant `parity`"), "{m}");
        let m = refusal(
            "h200-pair",
            json!({"clock_events": [{"gpu": 1, "reasons": ["too-hot"]}]}),
        );
        assert!(m.contains("`too-hot`; known reasons: gpu-idle"), "{m}");
        let m = refusal("h200-pair", json!({"persistence_off": [3]}));
        assert!(m.contains("faults.persistence_off[0]: GPU 3"), "{m}");
        let m = refusal("h200-pair", json!({"fans": []}));
        assert!(m.contains("unknown field `fans`"), "{m}");
        let mut no_generation = preset("h200-pair");
        no_generation.pcie.generation = None;
        let mut value = serde_json::to_value(no_generation).unwrap();
        value["faults"] = json!({"pcie_trained": [{"gpu": 0, "generation": 4, "lanes": 16}]});
        let err = Preset::parse(&value.to_string(), "x").unwrap_err();
        assert!(err.to_string().contains("needs `pcie.generation`"), "{err}");
    }

    #[test]
    fn the_documented_faults_apply_to_a_two_gpu_preset() {
        let doc = include_str!("../../../docs/sim-format.md");
        let start = doc.find("\"faults\": {").expect("the doc shows faults") + "\"faults\": ".len();
        let end = start + doc[start..].find("\n}").unwrap() + 2;
        let faults: serde_json::Value = serde_json::from_str(&doc[start..end]).unwrap();
        let p = with_faults("h200-pair", faults).unwrap();
        assert!(!p.p2p(0, 1));
        assert_eq!(p.link(0, 1), Link::NvLink(17));
        assert!((pcie_share(&p.wiring(), 1) - 0.25).abs() < 1e-9);
    }

    #[test]
    fn a_preset_without_faults_writes_none() {
        let text = serde_json::to_string(&preset("dgx-h100")).unwrap();
        assert!(!text.contains("faults"), "{text}");
        assert!(preset("dgx-h100").faults.is_empty());
    }

    #[test]
    fn ports_are_laid_out_bundle_by_bundle_and_die_at_both_ends() {
        // DGX-1: GPU 0 has NV1 to 1, NV1 to 2, NV2 to 3, NV2 to 4 in the preset's order.
        let dgx1 = preset("dgx1-v100");
        let ports = super::ports(&dgx1.wiring(), 0);
        assert_eq!(ports.len(), 6);
        assert!(ports.iter().all(|p| p.active));
        let to_3 = ports
            .iter()
            .position(|p| p.remote == Remote::Gpu { peer: 3, index: 0 })
            .unwrap();
        let mut broken = dgx1.clone();
        broken.faults.nvlinks_down = vec![LinksDown {
            gpu: 0,
            links: vec![to_3 as u32],
        }];
        assert_eq!(broken.link(0, 3), Link::NvLink(1));
        assert_eq!(broken.link(3, 0), Link::NvLink(1));
        let theirs = super::ports(&broken.wiring(), 3);
        assert_eq!(theirs.iter().filter(|p| !p.active).count(), 1);
        // Both links of a bundle down: the pair falls back to PCIe, and P2P with it.
        broken.faults.nvlinks_down[0].links.push(to_3 as u32 + 1);
        assert_eq!(broken.link(0, 3), Link::Node);
        assert!(!broken.p2p(0, 3));
    }

    #[test]
    fn through_a_switch_a_gpu_with_a_dead_link_has_a_narrower_port() {
        let mut dgx = preset("dgx-h100");
        dgx.faults.nvlinks_down = vec![LinksDown {
            gpu: 2,
            links: vec![0, 17],
        }];
        assert_eq!(dgx.link(2, 5), Link::NvLink(16));
        assert_eq!(dgx.link(5, 2), Link::NvLink(16));
        assert_eq!(dgx.link(0, 1), Link::NvLink(18));
        let sim = SimBackend::from_preset(&dgx);
        let health = crate::backend::Health::gpu_health(sim.health(), 2).unwrap();
        let ports = health.nvlinks.unwrap();
        assert_eq!(ports.iter().filter(|p| !p.active).count(), 2);
        assert_eq!(
            crate::backend::Health::gpu_health(sim.health(), 5)
                .unwrap()
                .nvlinks
                .unwrap()
                .iter()
                .filter(|p| p.active)
                .count(),
            18
        );
    }

    /// GPU time of one 64 MiB copy from pinned host memory to `gpu`, µs.
    fn h2d_us(preset: &Preset, gpu: usize) -> f64 {
        let sim = SimBackend::from_preset(preset);
        let len = 64 << 20;
        let host = sim
            .alloc(Memory::PinnedHost { numa_node: None }, len)
            .unwrap();
        let device = sim.alloc(Memory::Device(gpu), len).unwrap();
        let stream = sim.create_stream(gpu).unwrap();
        let start = sim.record(stream).unwrap();
        let copy = BufferCopy::from_start(host, device, len);
        sim.copy(stream, CopyMethod::CopyEngine, &copy).unwrap();
        let end = sim.record(stream).unwrap();
        sim.synchronize(stream).unwrap();
        sim.elapsed_us(start, end).unwrap()
    }

    #[test]
    fn a_downgraded_link_moves_host_copies_at_its_trained_rate() {
        let mut slow = preset("h200-pair");
        slow.faults.pcie_trained = vec![PcieTrained {
            gpu: 1,
            generation: 4,
            lanes: 8,
        }];
        assert_eq!(pcie_share(&slow.wiring(), 0), 1.0);
        assert!((pcie_share(&slow.wiring(), 1) - 0.25).abs() < 1e-9);
        let (fast_us, slow_us) = (h2d_us(&slow, 0), h2d_us(&slow, 1));
        // 64 MiB at 55.2 GB/s against a quarter of it, each plus the same few µs of overhead.
        assert!(
            slow_us > 3.9 * fast_us && slow_us < 4.0 * fast_us,
            "{fast_us} {slow_us}"
        );
        let health =
            crate::backend::Health::gpu_health(SimBackend::from_preset(&slow).health(), 1).unwrap();
        assert_eq!(health.pcie.unwrap().to_string(), "Gen4 x8 (max Gen5 x16)");
    }

    #[test]
    fn p2p_off_stages_the_pairs_copies() {
        let mut off = preset("h200-pair");
        off.faults.p2p_off = vec![[1, 0]];
        let sim = SimBackend::from_preset(&off);
        assert!(!sim.topology().pair(0, 1).unwrap().p2p);
        let err = sim.enable_peer_access(0, 1).unwrap_err();
        assert!(err.to_string().contains("faults"), "{err}");
    }
}
