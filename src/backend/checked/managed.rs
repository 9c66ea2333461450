//! Checks of managed memory's advice and prefetches: the buffer is managed memory, every GPU named
//! exists, and a prefetch is not queued on a capturing stream.

use super::{Checked, State};
use crate::backend::raw::{RawCollectives, RawManaged};
use crate::backend::{Advice, BufferId, Location, Managed, Memory, StreamId};
use crate::{Error, Result};

impl<I: RawCollectives + RawManaged> Checked<I> {
    /// The implementation's object of a managed buffer, or a usage error saying what it is instead.
    fn managed_buffer(st: &State<I>, buffer: BufferId, call: &str) -> Result<I::Buffer> {
        let entry = st.buffers.get(buffer.0)?;
        match entry.memory {
            Memory::Managed(_) => Ok(entry.raw.clone()),
            other => Err(Error::usage(format!(
                "{call}: {buffer} is {other}, not managed memory: advice and prefetches apply \
                 only to buffers allocated as Memory::Managed"
            ))),
        }
    }
}

impl<I: RawCollectives + RawManaged> Managed for Checked<I> {
    fn advise(&self, buffer: BufferId, advice: Advice) -> Result<()> {
        if let Advice::SetAccessedBy(device) | Advice::UnsetAccessedBy(device) = advice {
            self.check_device(device)?;
        }
        let raw = Self::managed_buffer(&self.lock(), buffer, "advise")?;
        self.raw.advise(&raw, advice)
    }

    fn prefetch(&self, stream: StreamId, buffer: BufferId, to: Location) -> Result<()> {
        if let Location::Device(device) = to {
            self.check_device(device)?;
        }
        let (raw_stream, raw_buffer) = {
            let st = self.lock();
            let (_, raw_stream) = self.idle_stream(&st, stream, "a prefetch")?;
            (raw_stream, Self::managed_buffer(&st, buffer, "prefetch")?)
        };
        self.raw.prefetch(&raw_stream, &raw_buffer, to)
    }
}
