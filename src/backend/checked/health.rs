//! The checked layer's health readings: the GPU must exist, nothing else to check.

use super::Checked;
use crate::backend::health::{GpuHealth, Health, RawHealth};
use crate::backend::raw::RawCollectives;
use crate::Result;

impl<I: RawCollectives + RawHealth> Health for Checked<I> {
    fn gpu_health(&self, gpu: usize) -> Result<GpuHealth> {
        self.check_device(gpu)?;
        Ok(self.raw.gpu_health(gpu))
    }
}
