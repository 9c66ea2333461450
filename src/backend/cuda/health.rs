//! Health facts of real GPUs, from NVML (through nvml-wrapper's safe calls): the PCIe link trained
//! and its maximum, NVLink states, NVLink error and ECC counters, persistence mode and the clocks
//! event reasons. Every fact NVML cannot give is a sentence saying why, never a guess.

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

/// Why NVML gave no answer, in words.
fn unknown(error: NvmlError) -> String {
    match error {
        NvmlError::NotSupported => "NVML: not supported on this GPU".to_string(),
        other => format!("NVML: {other}"),
    }
}

fn pcie_link(device: &Device) -> Reading<PcieLink> {
    Ok(PcieLink {
        generation: device.current_pcie_link_gen().map_err(unknown)?,
        width: device.current_pcie_link_width().map_err(unknown)?,
        max_generation: device.max_pcie_link_gen().map_err(unknown)?,
        max_width: device.max_pcie_link_width().map_err(unknown)?,
    })
}

/// Every link NVML knows a state for; a link index the GPU does not have answers NotSupported or
/// InvalidArg, and is left out.
fn nvlinks(device: &Device) -> Reading<Vec<NvLinkPort>> {
    let mut ports = Vec::new();
    for link in 0..MAX_NVLINKS {
        match device.link_wrapper_for(link).is_active() {
            Ok(active) => ports.push(NvLinkPort { link, active }),
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
            Err(other) => return Err(unknown(other)),
        }
    }
    Ok(ports)
}

fn sample_u64(value: SampleValue) -> Option<u64> {
    match value {
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(_) => None,
    }
}

/// The per-GPU totals NVML keeps as field values, by field id (those it could read).
fn field_totals(device: &Device, ids: &[u32]) -> BTreeMap<u32, u64> {
    let fields: Vec<FieldId> = ids.iter().map(|&id| FieldId(id)).collect();
    let Ok(samples) = device.field_values_for(&fields) else {
        return BTreeMap::new();
    };
    ids.iter()
        .zip(samples)
        .filter_map(|(&id, sample)| Some((id, sample_u64(sample.ok()?.value.ok()?)?)))
        .collect()
}

/// One NVLink counter: NVML's per-GPU total where it keeps one, else the sum over the links that
/// answer NVML's per-link counter (older GPUs), else why neither answers.
fn nvlink_counter(
    device: &Device,
    ports: &[NvLinkPort],
    totals: &BTreeMap<u32, u64>,
    fields: &[u32],
    per_link: &[ErrorCounter],
) -> Reading<u64> {
    let known: Vec<u64> = fields.iter().filter_map(|f| totals.get(f).copied()).collect();
    if known.len() == fields.len() {
        return Ok(known.iter().sum());
    }
    let mut sum = None;
    let mut why = String::from("NVML has no NVLink counter for this GPU");
    for port in ports {
        for &counter in per_link {
            match device.link_wrapper_for(port.link).error_counter(counter) {
                Ok(count) => *sum.get_or_insert(0) += count,
                Err(error) => why = unknown(error),
            }
        }
    }
    sum.ok_or(why)
}

fn counters(device: &Device, ports: &Reading<Vec<NvLinkPort>>) -> BTreeMap<Counter, Reading<u64>> {
    let ecc = device
        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        .map_err(unknown);
    let ports = match ports {
        Ok(ports) if !ports.is_empty() => ports.as_slice(),
        Ok(_) => return BTreeMap::from([(Counter::EccUncorrected, ecc)]),
        Err(why) => {
            let mut out: BTreeMap<Counter, Reading<u64>> = Counter::ALL
                .iter()
                .map(|&c| (c, Err(why.clone())))
                .collect();
            out.insert(Counter::EccUncorrected, ecc);
            return out;
        }
    };
    let totals = field_totals(
        device,
        &[
            NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
            NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
            NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        ],
    );
    let counter = |fields: &[u32], per_link: &[ErrorCounter]| {
        nvlink_counter(device, ports, &totals, fields, per_link)
    };
    BTreeMap::from([
        (
            Counter::NvlinkReplay,
            counter(
                &[NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL],
                &[ErrorCounter::DlReplay],
            ),
        ),
        (
            Counter::NvlinkRecovery,
            counter(
                &[NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL],
                &[ErrorCounter::DlRecovery],
            ),
        ),
        (
            Counter::NvlinkCrc,
            counter(
                &[
                    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
                    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
                ],
                &[ErrorCounter::DlCrcFlit, ErrorCounter::DlCrcData],
            ),
        ),
        (Counter::EccUncorrected, ecc),
    ])
}

/// Every fact unknown, for the same reason.
fn all_unknown(why: String) -> GpuHealth {
    GpuHealth {
        pcie: Err(why.clone()),
        nvlinks: Err(why.clone()),
        counters: Counter::ALL.iter().map(|&c| (c, Err(why.clone()))).collect(),
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
        let device = match nvml.device_by_pci_bus_id(health.bus_ids[gpu].as_str()) {
            Ok(device) => device,
            Err(error) => return all_unknown(unknown(error)),
        };
        let nvlinks = nvlinks(&device);
        GpuHealth {
            pcie: pcie_link(&device),
            counters: counters(&device, &nvlinks),
            nvlinks,
            persistence_mode: device.is_in_persistent_mode().map_err(unknown),
            clock_events: device
                .current_throttle_reasons()
                .map(|reasons| ClockEvents(reasons.bits()))
                .map_err(unknown),
        }
    }
}
