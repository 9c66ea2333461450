//! Health facts of real GPUs, from NVML (through nvml-wrapper's safe calls): the PCIe link trained
//! and its maximum, NVLink states, NVLink error and ECC counters, persistence mode and the clocks
//! event reasons. Every fact NVML cannot give is a sentence saying why, never a guess.
//!
//! The NVML calls sit behind [`Queries`], one method per call, so that what is made of their
//! answers (links that do not exist, counters kept per GPU or per link) is tested with canned
//! answers on machines without NVML.

use std::collections::BTreeMap;

use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
};
use nvml_wrapper::{Device, Nvml};

use crate::backend::health::{
    ClockEvents, Counter, GpuHealth, NvLinkPort, PcieLink, RawHealth, Reading,
};

/// NVML's limit on NVLinks per GPU (NVML_NVLINK_MAX_LINKS).
const MAX_NVLINKS: u32 = 18;

/// NVML, opened once, and each GPU's PCI bus id in CUDA order.
pub(super) struct NvmlHealth {
    nvml: Reading<Nvml>,
    bus_ids: Vec<String>,
}

impl NvmlHealth {
    /// `bus_ids`: NVML's spelling of each GPU's PCI bus id, in CUDA order.
    pub(super) fn open(bus_ids: Vec<String>) -> NvmlHealth {
        NvmlHealth {
            nvml: Nvml::init().map_err(|e| format!("NVML is unavailable ({e})")),
            bus_ids,
        }
    }
}

type Answer<T> = std::result::Result<T, NvmlError>;

/// The NVML calls health is read from, for one GPU.
trait Queries {
    /// Current and maximum generation and width: nvmlDeviceGetCurrPcieLinkGeneration,
    /// …Width, nvmlDeviceGetMaxPcieLinkGeneration, …Width.
    fn pcie(&self) -> [Answer<u32>; 4];
    /// nvmlDeviceGetNvLinkState.
    fn nvlink_active(&self, link: u32) -> Answer<bool>;
    /// nvmlDeviceGetNvLinkErrorCounter.
    fn nvlink_errors(&self, link: u32, counter: ErrorCounter) -> Answer<u64>;
    /// nvmlDeviceGetFieldValues for per-GPU totals: those NVML answered, by field id.
    fn totals(&self, fields: &[u32]) -> BTreeMap<u32, u64>;
    /// nvmlDeviceGetTotalEccErrors, uncorrected, volatile (since the driver loaded).
    fn ecc_uncorrected(&self) -> Answer<u64>;
    /// nvmlDeviceGetPersistenceMode.
    fn persistence(&self) -> Answer<bool>;
    /// nvmlDeviceGetCurrentClocksEventReasons, as bits.
    fn clock_events(&self) -> Answer<u64>;
}

fn sample_u64(value: SampleValue) -> Option<u64> {
    match value {
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(_) => None,
    }
}

impl Queries for Device<'_> {
    fn pcie(&self) -> [Answer<u32>; 4] {
        [
            self.current_pcie_link_gen(),
            self.current_pcie_link_width(),
            self.max_pcie_link_gen(),
            self.max_pcie_link_width(),
        ]
    }

    fn nvlink_active(&self, link: u32) -> Answer<bool> {
        self.link_wrapper_for(link).is_active()
    }

    fn nvlink_errors(&self, link: u32, counter: ErrorCounter) -> Answer<u64> {
        self.link_wrapper_for(link).error_counter(counter)
    }

    fn totals(&self, fields: &[u32]) -> BTreeMap<u32, u64> {
        let ids: Vec<FieldId> = fields.iter().map(|&id| FieldId(id)).collect();
        let Ok(samples) = self.field_values_for(&ids) else {
            return BTreeMap::new();
        };
        fields
            .iter()
            .zip(samples)
            .filter_map(|(&id, sample)| Some((id, sample_u64(sample.ok()?.value.ok()?)?)))
            .collect()
    }

    fn ecc_uncorrected(&self) -> Answer<u64> {
        self.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
    }

    fn persistence(&self) -> Answer<bool> {
        self.is_in_persistent_mode()
    }

    fn clock_events(&self) -> Answer<u64> {
        self.current_throttle_reasons()
            .map(|reasons| reasons.bits())
    }
}

/// Why NVML gave no answer, in words.
fn unknown(error: NvmlError) -> String {
    match error {
        NvmlError::NotSupported => "NVML: not supported on this GPU".to_string(),
        other => format!("NVML: {other}"),
    }
}

fn pcie_link(gpu: &impl Queries) -> Reading<PcieLink> {
    let [generation, width, max_generation, max_width] = gpu.pcie();
    Ok(PcieLink {
        generation: generation.map_err(unknown)?,
        width: width.map_err(unknown)?,
        max_generation: max_generation.map_err(unknown)?,
        max_width: max_width.map_err(unknown)?,
    })
}

/// Every link NVML knows a state for; a link index the GPU does not have answers NotSupported or
/// InvalidArg, and is left out.
fn nvlinks(gpu: &impl Queries) -> Reading<Vec<NvLinkPort>> {
    let mut ports = Vec::new();
    for link in 0..MAX_NVLINKS {
        match gpu.nvlink_active(link) {
            Ok(active) => ports.push(NvLinkPort { link, active }),
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
            Err(other) => return Err(unknown(other)),
        }
    }
    Ok(ports)
}

/// One NVLink counter: NVML's per-GPU totals where it keeps them all (`fields`, summed), else the
/// sum over the GPU's links of the per-link counters that answer (older GPUs), else why none does.
fn nvlink_counter(
    gpu: &impl Queries,
    ports: &[NvLinkPort],
    totals: &BTreeMap<u32, u64>,
    fields: &[u32],
    per_link: &[ErrorCounter],
) -> Reading<u64> {
    let known: Vec<u64> = fields
        .iter()
        .filter_map(|f| totals.get(f).copied())
        .collect();
    if known.len() == fields.len() {
        return Ok(known.iter().sum());
    }
    let mut sum = None;
    let mut why = String::from("NVML keeps no such counter for this GPU");
    for port in ports {
        for &counter in per_link {
            match gpu.nvlink_errors(port.link, counter) {
                Ok(count) => *sum.get_or_insert(0) += count,
                Err(error) => why = unknown(error),
            }
        }
    }
    sum.ok_or(why)
}

/// The NVLink counters: which per-GPU totals (field ids) make each, and which per-link counters
/// stand in where NVML keeps no total.
const NVLINK_COUNTERS: [(Counter, &[u32], &[ErrorCounter]); 3] = [
    (
        Counter::NvlinkReplay,
        &[NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL],
        &[ErrorCounter::DlReplay],
    ),
    (
        Counter::NvlinkRecovery,
        &[NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL],
        &[ErrorCounter::DlRecovery],
    ),
    (
        Counter::NvlinkCrc,
        &[
            NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        ],
        &[ErrorCounter::DlCrcFlit, ErrorCounter::DlCrcData],
    ),
];

fn counters(
    gpu: &impl Queries,
    nvlinks: &Reading<Vec<NvLinkPort>>,
) -> BTreeMap<Counter, Reading<u64>> {
    let mut out = BTreeMap::from([(
        Counter::EccUncorrected,
        gpu.ecc_uncorrected().map_err(unknown),
    )]);
    match nvlinks {
        Ok(ports) if ports.is_empty() => {}
        Ok(ports) => {
            let fields: Vec<u32> = NVLINK_COUNTERS
                .iter()
                .flat_map(|(_, fields, _)| fields.iter().copied())
                .collect();
            let totals = gpu.totals(&fields);
            for (counter, fields, per_link) in NVLINK_COUNTERS {
                out.insert(
                    counter,
                    nvlink_counter(gpu, ports, &totals, fields, per_link),
                );
            }
        }
        Err(why) => {
            for (counter, _, _) in NVLINK_COUNTERS {
                out.insert(counter, Err(why.clone()));
            }
        }
    }
    out
}

/// What NVML says about one GPU.
fn read(gpu: &impl Queries) -> GpuHealth {
    let nvlinks = nvlinks(gpu);
    GpuHealth {
        pcie: pcie_link(gpu),
        counters: counters(gpu, &nvlinks),
        nvlinks,
        persistence_mode: gpu.persistence().map_err(unknown),
        clock_events: gpu.clock_events().map(ClockEvents).map_err(unknown),
    }
}

/// Every fact unknown, for the same reason.
fn all_unknown(why: String) -> GpuHealth {
    GpuHealth {
        pcie: Err(why.clone()),
        nvlinks: Err(why.clone()),
        counters: Counter::ALL
            .iter()
            .map(|&c| (c, Err(why.clone())))
            .collect(),
        persistence_mode: Err(why.clone()),
        clock_events: Err(why),
    }
}

impl RawHealth for super::Gpus {
    fn gpu_health(&self, gpu: usize) -> GpuHealth {
        let health = &self.health;
        let nvml = match &health.nvml {
            Ok(nvml) => nvml,
            Err(why) => return all_unknown(why.clone()),
        };
        match nvml.device_by_pci_bus_id(health.bus_ids[gpu].as_str()) {
            Ok(device) => read(&device),
            Err(error) => all_unknown(unknown(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVML's answers for one GPU, as a test writes them.
    struct Canned {
        pcie: [Answer<u32>; 4],
        /// One entry per link index NVML knows; the rest answer NotSupported.
        links: Vec<bool>,
        per_link: Answer<u64>,
        totals: BTreeMap<u32, u64>,
        ecc: Answer<u64>,
        persistence: Answer<bool>,
        clocks: Answer<u64>,
    }

    fn copy<T: Copy>(answer: &Answer<T>) -> Answer<T> {
        match answer {
            Ok(v) => Ok(*v),
            Err(NvmlError::NotSupported) => Err(NvmlError::NotSupported),
            Err(_) => Err(NvmlError::Unknown),
        }
    }

    impl Queries for Canned {
        fn pcie(&self) -> [Answer<u32>; 4] {
            [0, 1, 2, 3].map(|i| copy(&self.pcie[i]))
        }
        fn nvlink_active(&self, link: u32) -> Answer<bool> {
            self.links
                .get(link as usize)
                .copied()
                .ok_or(NvmlError::NotSupported)
        }
        fn nvlink_errors(&self, _link: u32, _counter: ErrorCounter) -> Answer<u64> {
            copy(&self.per_link)
        }
        fn totals(&self, fields: &[u32]) -> BTreeMap<u32, u64> {
            fields
                .iter()
                .filter_map(|f| Some((*f, *self.totals.get(f)?)))
                .collect()
        }
        fn ecc_uncorrected(&self) -> Answer<u64> {
            copy(&self.ecc)
        }
        fn persistence(&self) -> Answer<bool> {
            copy(&self.persistence)
        }
        fn clock_events(&self) -> Answer<u64> {
            copy(&self.clocks)
        }
    }

    /// An H100 SXM as NVML answers it: Gen5 x16, 18 NVLinks up, totals kept per GPU.
    fn h100() -> Canned {
        Canned {
            pcie: [Ok(5), Ok(16), Ok(5), Ok(16)],
            links: vec![true; 18],
            per_link: Err(NvmlError::NotSupported),
            totals: [
                (NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, 3),
                (NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, 0),
                (NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 5),
                (NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, 2),
            ]
            .into(),
            ecc: Ok(0),
            persistence: Ok(true),
            clocks: Ok(0x1),
        }
    }

    #[test]
    fn a_healthy_gpu_reads_as_nvml_answers() {
        let health = read(&h100());
        assert_eq!(
            health.pcie,
            Ok(PcieLink {
                generation: 5,
                width: 16,
                max_generation: 5,
                max_width: 16
            })
        );
        let ports = health.nvlinks.unwrap();
        assert_eq!(ports.len(), 18);
        assert!(ports.iter().all(|p| p.active));
        assert_eq!(health.counters[&Counter::NvlinkReplay], Ok(3));
        assert_eq!(health.counters[&Counter::NvlinkRecovery], Ok(0));
        assert_eq!(health.counters[&Counter::NvlinkCrc], Ok(7), "flit + data");
        assert_eq!(health.counters[&Counter::EccUncorrected], Ok(0));
        assert_eq!(health.persistence_mode, Ok(true));
        assert_eq!(health.clock_events, Ok(ClockEvents(0x1)));
    }

    #[test]
    fn links_the_gpu_lacks_are_left_out_and_a_down_link_shows() {
        let mut gpu = h100();
        gpu.links = vec![true, true, false, true];
        let ports = nvlinks(&gpu).unwrap();
        assert_eq!(ports.len(), 4);
        assert_eq!(
            ports[2],
            NvLinkPort {
                link: 2,
                active: false
            }
        );
        // A GPU without NVLink: no links, and no NVLink counters either.
        gpu.links = Vec::new();
        let health = read(&gpu);
        assert_eq!(health.nvlinks, Ok(Vec::new()));
        assert_eq!(
            health.counters.keys().copied().collect::<Vec<_>>(),
            [Counter::EccUncorrected]
        );
    }

    #[test]
    fn without_totals_the_per_link_counters_are_summed() {
        let mut gpu = h100();
        gpu.links = vec![true; 4];
        gpu.totals.clear();
        gpu.per_link = Ok(2);
        let health = read(&gpu);
        assert_eq!(
            health.counters[&Counter::NvlinkReplay],
            Ok(8),
            "4 links × 2"
        );
        assert_eq!(
            health.counters[&Counter::NvlinkCrc],
            Ok(16),
            "4 links × (flit 2 + data 2)"
        );
        // Neither kind answers: the reason, not a zero.
        gpu.per_link = Err(NvmlError::NotSupported);
        let health = read(&gpu);
        assert_eq!(
            health.counters[&Counter::NvlinkReplay],
            Err("NVML: not supported on this GPU".to_string())
        );
    }

    #[test]
    fn unanswered_queries_say_why() {
        let mut gpu = h100();
        gpu.pcie[2] = Err(NvmlError::NotSupported);
        gpu.ecc = Err(NvmlError::NotSupported);
        gpu.persistence = Err(NvmlError::Unknown);
        let health = read(&gpu);
        assert_eq!(
            health.pcie,
            Err("NVML: not supported on this GPU".to_string())
        );
        assert!(health.counters[&Counter::EccUncorrected].is_err());
        assert!(health.persistence_mode.unwrap_err().starts_with("NVML: "));
        let none = all_unknown("NVML is unavailable (no library)".into());
        assert_eq!(none.counters.len(), Counter::ALL.len());
        assert!(none.nvlinks.is_err());
    }
}
