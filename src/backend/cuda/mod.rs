//! Placeholder, replaced by the real cuda backend.
#![allow(unused)]
use super::*;
use crate::Error;

pub struct CudaBackend;

impl CudaBackend {
    pub fn open() -> Result<Self> {
        Err(Error::NoGpu("cuda backend not yet implemented".into()))
    }
}

impl Backend for CudaBackend {
    fn source(&self) -> &str {
        "stub"
    }
    fn topology(&self) -> &Topology {
        unimplemented!()
    }
    fn enable_peer_access(&self, _device: usize, _peer: usize) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn free_memory(&self, _device: usize) -> Result<u64> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn alloc(&self, _memory: Memory, _bytes: usize) -> Result<BufferId> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn free(&self, _buffer: BufferId) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn len(&self, _buffer: BufferId) -> Result<usize> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn write(&self, _buffer: BufferId, _offset: usize, _data: &[u8]) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn read(&self, _buffer: BufferId, _offset: usize, _out: &mut [u8]) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn create_stream(&self, _device: usize) -> Result<StreamId> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn copy(&self, _stream: StreamId, _method: CopyMethod, _copy: &Copy) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn record(&self, _stream: StreamId) -> Result<EventId> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn wait(&self, _stream: StreamId, _event: EventId) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn event_done(&self, _event: EventId) -> Result<bool> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn event_synchronize(&self, _event: EventId) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn elapsed_us(&self, _start: EventId, _end: EventId) -> Result<f64> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn destroy_event(&self, _event: EventId) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn synchronize(&self, _stream: StreamId) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn host_time_us(&self) -> f64 {
        0.0
    }
    fn hold(&self, _stream: StreamId) -> Result<GateId> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn release(&self, _gate: GateId) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn begin_capture(&self, _stream: StreamId) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn end_capture(&self, _stream: StreamId) -> Result<GraphId> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn replay(&self, _graph: GraphId, _stream: StreamId) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn pointer_chase(
        &self,
        _stream: StreamId,
        _chain: BufferId,
        _steps: u32,
        _result: BufferId,
    ) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn ping_pong(
        &self,
        _ping: StreamId,
        _pong: StreamId,
        _ping_flag: BufferId,
        _pong_flag: BufferId,
        _rounds: u32,
    ) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
    fn copy_batch(&self, _stream: StreamId, _copies: &[Copy]) -> Result<()> {
        Err(Error::InvalidHandle("cuda: not yet implemented".into()))
    }
}
