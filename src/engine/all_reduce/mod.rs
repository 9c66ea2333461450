//! peerlink's all-reduce (sum or average), the one home every caller uses (the `workload` verb,
//! the Python extension, an NCCL-API library): its cost model and the pick among its kernels
//! ([`price`]), and the calls — within one process over several GPUs ([`LocalAllReduce`]), and
//! with one rank per process ([`GroupAllReduce`]) — with what they work through: flag blocks, the
//! picks kept, scratch or shared buffers, the in-place rules and the order of calls.
//!
//! A caller gives each rank's memory (buffers, or a range of them across processes), the element
//! type, the [`Reduction`](crate::backend::collective::Reduction) and the stream to order on, and
//! gets the result queued there and the kernel picked; the kernels sum, and scale each sum once
//! for an average. `backend::collective` queues a kernel; this module decides which, and prepares
//! what it reads.

mod buffers;
mod exchange;
mod group;
mod local;
pub mod price;

pub use exchange::{ProcessRanks, RankExchange, ThreadMeeting, ThreadRanks};
pub use group::{GroupAllReduce, INITIAL_SHARED_BYTES};
pub use local::{LocalAllReduce, LocalRank};
pub use price::Placement;

#[cfg(test)]
mod tests;
