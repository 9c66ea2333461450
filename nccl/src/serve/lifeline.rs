//! What a served communicator's waiting kernels hang on: its release word, and what tells that a
//! peer is lost.
//!
//! A served kernel waits for the other ranks' as long as they take, as NCCL's do (a rank busy for
//! minutes with a checkpoint is normal), never trapping after a deadline (that would poison the
//! job's CUDA context): it reads a release word in pinned host memory now and then
//! ([`Waiting::Released`]). As NCCL's abort flag, the word is raised by `ncclCommAbort`, and where
//! a peer is lost — for ranks that are processes, the launch group judged one dead or silent —
//! by whoever asks about the communicator next: `ncclCommGetAsyncError` (PyTorch's watchdog asks
//! it while a call is outstanding), a later call, or `ncclCommDestroy`. Those then answer
//! `ncclRemoteError` rather than wait forever. Nothing here holds the communicator's lock: on the
//! simulator a served call waits for its peers inside the call, holding it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use peerlink::backend::collective::{Waiting, RELEASE_WORD_BYTES};
use peerlink::backend::{Backend, BufferId, Memory};
use peerlink::launch::FailureWatch;

pub struct Lifeline {
    backend: Arc<dyn Backend>,
    word: BufferId,
    /// The launch group's judge of the peers, for ranks that are processes.
    peers: Option<FailureWatch>,
    raised: AtomicBool,
}

impl Lifeline {
    /// A lowered release word of pinned host memory, and the watch over the peers where they are
    /// processes.
    pub fn new(
        backend: &Arc<dyn Backend>,
        peers: Option<FailureWatch>,
    ) -> peerlink::Result<Arc<Lifeline>> {
        let memory = Memory::PinnedHost { numa_node: None };
        let word = backend.alloc(memory, RELEASE_WORD_BYTES)?;
        if let Err(e) = backend.write(word, 0, &[0; RELEASE_WORD_BYTES]) {
            let _ = backend.free(word);
            return Err(e);
        }
        Ok(Arc::new(Lifeline {
            backend: backend.clone(),
            word,
            peers,
            raised: AtomicBool::new(false),
        }))
    }

    /// How the communicator's kernels wait: until the peers come or the word is raised.
    pub fn waiting(&self) -> Waiting {
        Waiting::Released(self.word)
    }

    /// Raises the word: every kernel waiting on it ends, its results undefined; later calls of
    /// the communicator must not be served.
    pub fn release(&self) {
        if !self.raised.swap(true, Ordering::AcqRel) {
            // A pinned host write reaches no GPU queue: it cannot wait behind the kernels.
            let _ = self.backend.write(self.word, 0, &1u32.to_le_bytes());
        }
    }

    /// Whether the word was raised (an abort, a lost peer).
    pub fn is_released(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// Why a peer is lost, once the launch group judged one: the word is raised first.
    pub fn lost_peer(&self) -> Option<String> {
        let why = self.peers.as_ref()?.failed()?;
        self.release();
        Some(why)
    }
}

impl Drop for Lifeline {
    fn drop(&mut self) {
        let _ = self.backend.free(self.word);
    }
}
