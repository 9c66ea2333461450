//! `libpeerlink_nccl.so`: a library with NCCL's C API that stands in front of the real NCCL, so that
//! unchanged jobs (torch.distributed, vLLM, nccl-tests: anything that calls NCCL's C API) reach
//! peerlink through it. It serves `ncclAllReduce` with peerlink's kernels where asked ([`serve`])
//! and forwards every other call to the real NCCL, untouched: communicators stay NCCL's own
//! `ncclComm_t` (peerlink's state of one is kept beside it), and results come back as NCCL gives
//! them.
//!
//! It exports every symbol NCCL 2.28.9's `libnccl.so.2` exports, so it works preloaded
//! (`LD_PRELOAD`), loaded by path (vLLM's `VLLM_NCCL_SO_PATH`), and first on `LD_LIBRARY_PATH` as
//! `libnccl.so.2`. Loading it does nothing; the real NCCL is found at the first call
//! ([`resolve`]) and never in this library itself.
//!
//! The unsafe code is in [`ffi`] alone (the C exports, `dlopen` and `dlsym`); what decides — the
//! switches, the order of the search, the statistics and the log — is safe Rust.

pub mod exports;
pub mod ffi;
pub mod log;
pub mod resolve;
pub mod serve;
pub mod stats;
pub mod switches;
