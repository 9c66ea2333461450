//! What a measurement holds in memory at its peak, counted before it starts and checked against
//! what is free: each GPU's own memory, and the host's — pinned buffers, the host's copies of the
//! data it fills and checks, and on the simulator every GPU's memory too, which it keeps in host
//! memory. A run that cannot fit is refused before anything is allocated (a usage error, exit 2)
//! saying what it needs and what is free; an allocation that still fails while running is an
//! [`Error::OutOfMemory`] (exit 1).

use crate::backend::{host_memory, Backend, Memory};
use crate::units::format_bytes;
use crate::{Error, Result};
use std::collections::BTreeMap;

/// Bytes held at once, GPU by GPU and on the host. Sums saturate: a footprint past `u64::MAX` is
/// refused like any other too large.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    devices: BTreeMap<usize, u64>,
    host: u64,
}

impl Footprint {
    /// `count` buffers of `bytes` in `memory` (pinned host memory counts as the host's; managed
    /// memory as the GPU's it is allocated for: a test whose pages also land on another GPU counts
    /// them there too).
    pub fn add(&mut self, memory: Memory, count: u64, bytes: u64) {
        let total = count.saturating_mul(bytes);
        match memory {
            Memory::Device(d) | Memory::Managed(d) => {
                let held = self.devices.entry(d).or_default();
                *held = held.saturating_add(total);
            }
            Memory::PinnedHost { .. } => self.add_host(total),
        }
    }

    /// Host memory the run's own code holds: the data it fills buffers from, what it reads back.
    pub fn add_host(&mut self, bytes: u64) {
        self.host = self.host.saturating_add(bytes);
    }

    /// Both footprints held at once.
    pub fn add_all(&mut self, other: &Footprint) {
        for (&d, &bytes) in &other.devices {
            self.add(Memory::Device(d), 1, bytes);
        }
        self.add_host(other.host);
    }

    /// Bytes on GPU `device`.
    pub fn on_device(&self, device: usize) -> u64 {
        self.devices.get(&device).copied().unwrap_or(0)
    }

    /// Bytes of host memory, the simulated GPUs' left out.
    pub fn on_host(&self) -> u64 {
        self.host
    }

    /// Refuses what `backend` cannot hold now, as a usage error that says what `what` needs, what
    /// is free, and `fix`.
    pub fn check(&self, backend: &dyn Backend, what: &str, fix: &str) -> Result<()> {
        for (&device, &need) in &self.devices {
            let free = backend.free_memory(device)?;
            if need > free {
                return Err(Error::usage(format!(
                    "{what} needs {} on GPU {device}, which has {} free: {fix}",
                    format_bytes(need),
                    format_bytes(free)
                )));
            }
        }
        let simulated = backend.topology().is_simulated();
        let gpus = if simulated {
            self.devices
                .values()
                .fold(0u64, |sum, &b| sum.saturating_add(b))
        } else {
            0
        };
        let need = self.host.saturating_add(gpus);
        match host_memory::free() {
            Some(free) if need > free => {
                let held = if gpus > 0 {
                    format!(
                        " ({} of it the simulated GPUs' memory, which the simulator keeps in host \
                         memory)",
                        format_bytes(gpus)
                    )
                } else {
                    String::new()
                };
                Err(Error::usage(format!(
                    "{what} needs {} of host memory{held}, and the host has {} free: {fix}",
                    format_bytes(need),
                    format_bytes(free)
                )))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;

    #[test]
    fn buffers_add_up_by_place_and_saturate() {
        let mut f = Footprint::default();
        f.add(Memory::Device(1), 2, 100);
        f.add(Memory::PinnedHost { numa_node: None }, 1, 7);
        f.add_host(3);
        let mut g = Footprint::default();
        g.add(Memory::Device(1), 1, 5);
        g.add(Memory::Device(2), u64::MAX, 2);
        f.add_all(&g);
        assert_eq!(f.on_device(1), 205);
        assert_eq!(f.on_device(2), u64::MAX);
        assert_eq!(f.on_device(0), 0);
        assert_eq!(f.on_host(), 10);
    }

    #[test]
    fn a_gpu_too_small_is_named_with_what_it_has_free() {
        let sim = SimBackend::open("dgx-h100").unwrap();
        let mut f = Footprint::default();
        f.add(Memory::Device(3), 2, 60 << 30);
        let err = f
            .check(&sim, "test `local` at 60 GiB", "choose a smaller --size")
            .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert_eq!(
            err.to_string(),
            "test `local` at 60 GiB needs 120 GiB on GPU 3, which has 79.6 GiB free: choose a \
             smaller --size"
        );
    }

    #[test]
    fn the_simulator_counts_its_gpus_memory_as_the_hosts() {
        let Some(free) = host_memory::free() else {
            return; // not Linux: nothing to check against
        };
        let sim = SimBackend::open("dgx-h100").unwrap();
        // Half of the host's free memory on each of two simulated GPUs, and a little more.
        let mut f = Footprint::default();
        f.add(Memory::Device(0), 1, free / 2 + (64 << 20));
        f.add(Memory::Device(1), 1, free / 2 + (64 << 20));
        if f.on_device(0) > 80 << 30 {
            return; // a host larger than the simulated GPUs: they are the limit
        }
        let err = f.check(&sim, "this", "ask for less").unwrap_err();
        let text = err.to_string();
        assert_eq!(err.exit_code(), 2);
        assert!(text.contains("of host memory ("), "{text}");
        assert!(text.contains("the simulated GPUs' memory"), "{text}");
        assert!(text.ends_with(": ask for less"), "{text}");
        let mut fits = Footprint::default();
        fits.add(Memory::Device(0), 1, 1 << 20);
        fits.check(&sim, "this", "ask for less").unwrap();
    }
}
