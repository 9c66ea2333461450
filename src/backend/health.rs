//! What a GPU's management interface says about its health: the PCIe link it trained, its NVLinks,
//! its error counters, persistence mode and why its clocks are held back.
//!
//! `peerlink doctor` reads these through [`Health`], which both backends answer: real GPUs from
//! NVML (`backend/cuda/health.rs`), the simulator from its preset and the faults the preset carries
//! (`backend/sim/faults.rs`). Each fact is a [`Reading`]: the value, or the sentence saying why the
//! backend has none (NVML missing, a GPU that does not support the query), so that a check can say
//! what it could not see instead of guessing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A fact, or why the backend has no answer for it.
pub type Reading<T> = std::result::Result<T, String>;

/// The PCIe link a GPU trained, and the best its slot and the GPU allow together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PcieLink {
    /// PCIe generation now (1 to 6).
    pub generation: u32,
    /// Lanes now.
    pub width: u32,
    /// The highest generation this GPU and its slot allow (NVML's "max", not the GPU's own).
    pub max_generation: u32,
    pub max_width: u32,
}

impl PcieLink {
    /// Whether the link runs below what it could: a slower generation or fewer lanes.
    pub fn is_downgraded(&self) -> bool {
        self.generation < self.max_generation || self.width < self.max_width
    }
}

impl fmt::Display for PcieLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Gen{} x{} (max Gen{} x{})",
            self.generation, self.width, self.max_generation, self.max_width
        )
    }
}

/// One NVLink of a GPU: its index and whether it is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvLinkPort {
    pub link: u32,
    pub active: bool,
}

/// An error counter a GPU keeps, which healthy hardware leaves where it is.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Counter {
    /// NVLink data-link replays (a packet sent again after a bad CRC), over all links.
    NvlinkReplay,
    /// NVLink recoveries (a link retrained while up), over all links.
    NvlinkRecovery,
    /// NVLink CRC errors (flow-control and data flits), over all links.
    NvlinkCrc,
    /// Uncorrectable ECC errors in device memory since the driver loaded.
    EccUncorrected,
}

impl Counter {
    pub const ALL: [Counter; 4] = [
        Counter::NvlinkReplay,
        Counter::NvlinkRecovery,
        Counter::NvlinkCrc,
        Counter::EccUncorrected,
    ];

    /// The name documents and presets use (`nvlink-replay`).
    pub fn name(self) -> &'static str {
        match self {
            Counter::NvlinkReplay => "nvlink-replay",
            Counter::NvlinkRecovery => "nvlink-recovery",
            Counter::NvlinkCrc => "nvlink-crc",
            Counter::EccUncorrected => "ecc-uncorrected",
        }
    }

    /// Whether the counter belongs to the NVLinks (rather than the memory).
    pub fn is_nvlink(self) -> bool {
        self != Counter::EccUncorrected
    }
}

/// Why a GPU's clocks are held below their maximum: NVML's clocks event reasons, as bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockEvents(pub u64);

/// One clocks event reason: its NVML bit, the name presets and documents use, and whether it
/// means the GPU is slowed down against the user's will (heat, power, a hardware signal).
pub struct ClockEvent {
    pub bit: u64,
    pub name: &'static str,
    pub meaning: &'static str,
    pub slows_down: bool,
}

/// NVML's clocks event reasons (nvmlClocksEventReason*, formerly ClocksThrottleReason*).
pub const CLOCK_EVENTS: &[ClockEvent] = &[
    ClockEvent {
        bit: 0x1,
        name: "gpu-idle",
        meaning: "the GPU is idle",
        slows_down: false,
    },
    ClockEvent {
        bit: 0x2,
        name: "applications-clocks",
        meaning: "application clocks are set lower",
        slows_down: false,
    },
    ClockEvent {
        bit: 0x4,
        name: "sw-power-cap",
        meaning: "the power cap holds the clocks down",
        slows_down: true,
    },
    ClockEvent {
        bit: 0x8,
        name: "hw-slowdown",
        meaning: "hardware slowdown (heat or power brake signal)",
        slows_down: true,
    },
    ClockEvent {
        bit: 0x10,
        name: "sync-boost",
        meaning: "held to the clocks of its sync-boost group",
        slows_down: false,
    },
    ClockEvent {
        bit: 0x20,
        name: "sw-thermal",
        meaning: "the driver slows it down for heat",
        slows_down: true,
    },
    ClockEvent {
        bit: 0x40,
        name: "hw-thermal",
        meaning: "the hardware slows it down for heat",
        slows_down: true,
    },
    ClockEvent {
        bit: 0x80,
        name: "hw-power-brake",
        meaning: "an external power brake signal (the power supply)",
        slows_down: true,
    },
    ClockEvent {
        bit: 0x100,
        name: "display-clocks",
        meaning: "display clock settings",
        slows_down: false,
    },
];

impl ClockEvents {
    /// The reasons set, in NVML's order (unknown bits left out).
    pub fn events(self) -> impl Iterator<Item = &'static ClockEvent> {
        CLOCK_EVENTS.iter().filter(move |e| self.0 & e.bit != 0)
    }

    /// The reason named `name` (`sw-thermal`), for presets.
    pub fn named(name: &str) -> Option<&'static ClockEvent> {
        CLOCK_EVENTS.iter().find(|e| e.name == name)
    }
}

/// Everything [`Health`] says about one GPU at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuHealth {
    pub pcie: Reading<PcieLink>,
    /// Every NVLink the GPU has (an empty list: none).
    pub nvlinks: Reading<Vec<NvLinkPort>>,
    /// The GPU's error counters: `ecc-uncorrected`, and the NVLink ones where it has NVLinks.
    pub counters: BTreeMap<Counter, Reading<u64>>,
    pub persistence_mode: Reading<bool>,
    pub clock_events: Reading<ClockEvents>,
}

/// The health facts of a host's GPUs, read now (each call reads again: counters move).
pub trait Health {
    /// What the management interface says about `gpu` now. An index that is not a GPU of the host
    /// is a usage error.
    fn gpu_health(&self, gpu: usize) -> crate::Result<GpuHealth>;
}

/// [`Health`] below the checks: `gpu` exists.
pub trait RawHealth {
    fn gpu_health(&self, gpu: usize) -> GpuHealth;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_below_either_maximum_is_downgraded() {
        let link = |generation, width| PcieLink {
            generation,
            width,
            max_generation: 5,
            max_width: 16,
        };
        assert!(!link(5, 16).is_downgraded());
        assert!(link(4, 16).is_downgraded());
        assert!(link(5, 8).is_downgraded());
        assert_eq!(link(4, 8).to_string(), "Gen4 x8 (max Gen5 x16)");
    }

    #[test]
    fn clock_event_bits_name_their_reasons() {
        let names: Vec<&str> = ClockEvents(0x1 | 0x20 | 0x8000)
            .events()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["gpu-idle", "sw-thermal"]);
        assert!(ClockEvents::named("hw-thermal").unwrap().slows_down);
        assert!(!ClockEvents::named("gpu-idle").unwrap().slows_down);
        assert!(ClockEvents::named("cold").is_none());
    }

    #[test]
    fn counters_have_stable_names() {
        let names: Vec<&str> = Counter::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            [
                "nvlink-replay",
                "nvlink-recovery",
                "nvlink-crc",
                "ecc-uncorrected"
            ]
        );
        let json = serde_json::to_string(&Counter::NvlinkCrc).unwrap();
        assert_eq!(json, "\"nvlink-crc\"");
    }
}
