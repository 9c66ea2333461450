//! The resident worker on real GPUs: its memory, its launch, the host's side of the ring, and the
//! heartbeat. kernels/resident.cu explains the protocol and the GPU's side.
//!
//! Memory. One pinned, mapped host allocation (cuMemHostAlloc PORTABLE | DEVICEMAP, cached, not
//! write-combined) holds the control words, the ring and the doorbells. The host writes a
//! descriptor with four 8-byte stores that land in its own cache; the worker's next poll reads the
//! slot over PCIe, snooping the CPU's cache, in one round trip (1.19 µs for a dependent load through
//! pinned memory on an H200 host). The host polls the completion word in its cache, and misses only
//! when the GPU's store has invalidated the line: polling costs the host a cache hit, not a PCIe
//! read. Device memory that the host writes through a BAR mapping would spare the GPU its PCIe
//! read per poll, but the driver maps device memory for the CPU only with GDRCopy's kernel module,
//! which hosts rarely have; pinned host memory works everywhere. The board, the copy blocks'
//! progress and the quit word live in device memory: only the worker's own blocks touch them.
//!
//! Host side. A submission takes a ticket with one atomic add, waits for room only when the ring
//! may be full (the slot's previous ticket incomplete, known from the last completion value this
//! host saw), and writes the slot's four words (a release fence first, so that a batch's list is
//! written before the slot that names it). Nothing else: no lock, no driver call, except a stream
//! memory write for a doorbell. A heartbeat thread per worker raises the heartbeat word a few times
//! per watchdog period, and on Ctrl-C ([`crate::interrupt`]) asks the worker to stop.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;

use super::abi::Descriptor;
use super::abi::{
    slot_words, ResidentArgs, ADDRESS_BITS, BATCH, BOARD_ENTRY_BYTES, BOARD_SLOTS, COMPLETED,
    CONTROL_WORDS, GATED, HEARTBEAT, LEN_MASK, RUNNING, RUN_NS, SLOT_WORDS, STATE, STOP, STOPPED,
    WATCHDOG,
};
use super::batches::Block;
use super::driver::{self, failed, DeviceMemory, PinnedMemory};
use super::{lock, Buffer, Gpus, Stream};
use crate::backend::raw::{Batch, RawResident};
use crate::backend::resident::{DispatcherTimes, StopReport, WorkerConfig, WorkerExit};
use crate::backend::BufferCopy;
use crate::{interrupt, Error, Result};

/// The most bytes one slot moves: a longer copy takes several slots (and tickets), in order.
const MAX_PIECE: usize = 1 << 29;
const _: () = assert!(
    MAX_PIECE <= LEN_MASK as usize,
    "a piece's length fits a slot's length bits"
);
/// Messages of a batch longer than this go in slots of their own, moved by every copy block,
/// rather than by one warp each.
const BATCH_MESSAGE_MAX: usize = 64 * 1024;
/// How long `start_worker` waits for the kernel to run, and `stop_worker` for it to end.
const START_TIMEOUT: Duration = Duration::from_secs(10);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Spins of a host poll between checks that the worker's stream has not failed.
const SPINS_PER_STREAM_CHECK: u32 = 4096;
/// The heartbeat's longest period; a quarter of the watchdog's for one under 400 ms.
const HEARTBEAT_PERIOD: Duration = Duration::from_millis(100);

/// Fails unless a slot can carry `address`.
fn encodable(address: u64) -> Result<()> {
    if address >> ADDRESS_BITS == 0 {
        return Ok(());
    }
    Err(Error::Cuda {
        call: "resident submit".into(),
        message: format!(
            "address {address:#x} needs more than {ADDRESS_BITS} bits, which a ring slot cannot \
             carry; use copies (Backend::copy) on this host"
        ),
    })
}

/// The host memory the worker shares with its kernel and its heartbeat thread.
struct HostWords {
    memory: PinnedMemory,
    ring_slots: usize,
    /// Tells the heartbeat thread to end.
    halt: AtomicBool,
    /// Set when the heartbeat thread stopped the worker for Ctrl-C.
    interrupted: AtomicBool,
}

impl HostWords {
    fn words(ring_slots: usize) -> usize {
        CONTROL_WORDS + ring_slots * (SLOT_WORDS + 1)
    }

    fn control(&self, word: usize) -> &AtomicU64 {
        self.memory.word(word)
    }

    fn slot_word(&self, ticket: u64, word: usize) -> &AtomicU64 {
        let slot = ticket as usize & (self.ring_slots - 1);
        self.memory.word(CONTROL_WORDS + slot * SLOT_WORDS + word)
    }

    fn word_address(&self, word: usize) -> u64 {
        self.memory.address() + 8 * word as u64
    }

    fn doorbell_address(&self, ticket: u64) -> u64 {
        let slot = ticket as usize & (self.ring_slots - 1);
        self.word_address(CONTROL_WORDS + self.ring_slots * SLOT_WORDS + slot)
    }
}

/// A running worker (see the module documentation).
pub struct Worker {
    device: usize,
    ring_slots: u64,
    watchdog_ms: u64,
    stream: Arc<CudaStream>,
    host: Arc<HostWords>,
    /// Freed with the worker, after its kernel has ended (`Drop` stops it first).
    _board: DeviceMemory,
    next_ticket: AtomicU64,
    /// The highest completion count this host has read: below it, no poll is needed.
    seen_completed: AtomicU64,
    /// Set by the stop: submissions are refused from then on.
    closed: AtomicBool,
    /// Batch lists and the ticket that reads each, oldest first.
    batch_lists: Mutex<VecDeque<(u64, Block)>>,
    heartbeat: Mutex<Option<JoinHandle<()>>>,
    report: Mutex<Option<StopReport>>,
}

fn stopped() -> Error {
    Error::usage("this resident worker was stopped: start another to submit more transfers")
}

/// Raises the heartbeat word every `period` until told to halt; on Ctrl-C, asks the worker to stop.
fn beat(host: Arc<HostWords>, period: Duration) {
    let mut beat = 0u64;
    while !host.halt.load(Ordering::Acquire) {
        beat += 1;
        host.control(HEARTBEAT).store(beat, Ordering::Relaxed);
        if interrupt::requested() && !host.interrupted.swap(true, Ordering::Relaxed) {
            host.control(STOP).store(1, Ordering::Release);
        }
        std::thread::park_timeout(period);
    }
}

impl Worker {
    fn state(&self) -> u64 {
        self.host.control(STATE).load(Ordering::Acquire)
    }

    /// The completion count: tickets below it are complete.
    fn completed(&self) -> u64 {
        let completed = self.host.control(COMPLETED).load(Ordering::Acquire);
        self.seen_completed.fetch_max(completed, Ordering::Relaxed);
        completed
    }

    /// Why `ticket` will never complete, the worker having ended in `state`.
    fn abandoned(&self, ticket: u64, state: u64) -> Error {
        match state {
            WATCHDOG => Error::Cuda {
                call: "resident worker".into(),
                message: format!(
                    "ticket {ticket} was abandoned: the worker's watchdog stopped it after the \
                     host's heartbeat was silent for {} ms (a stopped or hung process); start \
                     another, with a longer watchdog if the host is slow",
                    self.watchdog_ms
                ),
            },
            _ => Error::usage(format!(
                "ticket {ticket} was abandoned: its worker stopped before it (a doorbell that \
                 never rang holds back every later transfer)"
            )),
        }
    }

    /// Polls the completion count until `done` says so; fails once the worker has ended or its
    /// stream has failed without getting there.
    fn poll_until(&self, ticket: u64, done: impl Fn(u64) -> bool) -> Result<()> {
        let mut spins = 0u32;
        loop {
            if done(self.completed()) {
                return Ok(());
            }
            let state = self.state();
            if state != RUNNING {
                // The kernel publishes its last count before its state.
                return match done(self.completed()) {
                    true => Ok(()),
                    false => Err(self.abandoned(ticket, state)),
                };
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(SPINS_PER_STREAM_CHECK)
                && driver::stream_finished(&self.stream)?
            {
                return Err(self.abandoned(ticket, self.state()));
            }
            std::hint::spin_loop();
        }
    }

    /// Takes the next ticket, once its slot is free (the ticket a lap earlier is complete).
    fn take_ticket(&self) -> Result<u64> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(stopped());
        }
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let room = |completed: u64| ticket < completed + self.ring_slots;
        if !room(self.seen_completed.load(Ordering::Relaxed)) {
            self.poll_until(ticket, room)?;
        }
        Ok(ticket)
    }

    /// Writes `ticket`'s slot: from here the worker may take it.
    fn publish(&self, ticket: u64, src: u64, dst: u64, len_flags: u32) {
        let words = slot_words(ticket, self.ring_slots, src, dst, len_flags);
        // Whatever the slot names (a batch's list) is written before the slot.
        fence(Ordering::Release);
        for (i, word) in words.into_iter().enumerate() {
            self.host
                .slot_word(ticket, i)
                .store(word, Ordering::Relaxed);
        }
    }

    /// Queues `gate`'s doorbell for `ticket` where there is a gate, and returns the flag its slot
    /// carries. On a failure the slot is filled with nothing: the ticket is taken, and later ones
    /// must still run.
    fn doorbell(&self, gpus: &Gpus, gate: Option<&CudaStream>, ticket: u64) -> Result<u32> {
        let Some(stream) = gate else {
            return Ok(0);
        };
        let rung = driver::write_value(stream, self.host.doorbell_address(ticket), ticket + 1);
        gpus.count(|c| &c.memory_ops);
        match rung {
            Ok(()) => Ok(GATED),
            Err(error) => {
                self.publish(ticket, 0, 0, 0);
                Err(error)
            }
        }
    }

    /// Submits a copy between unified addresses in slots of at most [`MAX_PIECE`] bytes (one
    /// slot moving nothing for 0 bytes); the first waits for a doorbell that `gate` rings when
    /// its earlier work is done. Returns the last slot's ticket.
    fn submit_copy(
        &self,
        gpus: &Gpus,
        dst: u64,
        src: u64,
        len: usize,
        gate: Option<&CudaStream>,
    ) -> Result<u64> {
        encodable(src.saturating_add(len as u64))?;
        encodable(dst.saturating_add(len as u64))?;
        let mut at = 0;
        loop {
            let piece = (len - at).min(MAX_PIECE);
            let ticket = self.take_ticket()?;
            let flags = match at {
                0 => self.doorbell(gpus, gate, ticket)?,
                _ => 0,
            };
            let offset = at as u64;
            self.publish(ticket, src + offset, dst + offset, piece as u32 | flags);
            at += piece;
            if at >= len {
                return Ok(ticket);
            }
        }
    }

    /// Submits a batch: messages over [`BATCH_MESSAGE_MAX`] in slots of their own, the others in
    /// lists (one slot moving nothing for an empty batch); the first slot waits for `gate`'s
    /// doorbell, and the others follow it in ring order. Returns the last slot's ticket.
    fn submit_batch(
        &self,
        gpus: &Gpus,
        batch: Batch<'_, Arc<Buffer>>,
        mut gate: Option<&CudaStream>,
    ) -> Result<u64> {
        let mut last = None;
        let mut small = Vec::with_capacity(batch.len());
        for copy in batch.iter().filter(|c| c.len > 0) {
            let (dst, src) = super::addresses(&copy);
            if copy.len > BATCH_MESSAGE_MAX {
                last = Some(self.submit_copy(gpus, dst, src, copy.len, gate.take())?);
            } else {
                encodable(src.max(dst) + copy.len as u64)?;
                small.push(Descriptor {
                    dst,
                    src,
                    len: copy.len as u64,
                });
            }
        }
        match (small.is_empty(), last) {
            (false, _) => self.submit_lists(gpus, &small, gate),
            (true, Some(ticket)) => Ok(ticket),
            (true, None) => self.submit_copy(gpus, 0, 0, 0, gate),
        }
    }

    /// Gives the batch lists of complete tickets back to the pool.
    fn reclaim_lists(&self, gpus: &Gpus) {
        let completed = self.seen_completed.load(Ordering::Relaxed);
        let mut lists = lock(&self.batch_lists);
        while lists.front().is_some_and(|(ticket, _)| *ticket < completed) {
            let (_, block) = lists.pop_front().expect("checked above");
            gpus.descriptors.give_back(block);
        }
    }

    /// Submits small messages (none empty) as batch slots, their lists in pinned memory, the first
    /// behind `gate`'s doorbell where given; returns the last slot's ticket.
    fn submit_lists(
        &self,
        gpus: &Gpus,
        messages: &[Descriptor],
        mut gate: Option<&CudaStream>,
    ) -> Result<u64> {
        self.reclaim_lists(gpus);
        let ctx = gpus.context(self.device)?;
        let mut last = None;
        for chunk in messages.chunks(LEN_MASK as usize) {
            let mut block = gpus.descriptors.take(ctx, chunk.len())?;
            block.descriptors_mut(chunk.len()).copy_from_slice(chunk);
            let list = block.address();
            let ticket = match encodable(list).and_then(|()| self.take_ticket()) {
                Ok(ticket) => ticket,
                Err(error) => {
                    gpus.descriptors.give_back(block);
                    return Err(error);
                }
            };
            let flags = match self.doorbell(gpus, gate.take(), ticket) {
                Ok(flags) => flags,
                Err(error) => {
                    gpus.descriptors.give_back(block);
                    return Err(error);
                }
            };
            self.publish(ticket, list, 0, chunk.len() as u32 | BATCH | flags);
            lock(&self.batch_lists).push_back((ticket, block));
            last = Some(ticket);
        }
        Ok(last.expect("at least one message"))
    }

    /// Stops the kernel (see the module documentation of `backend::resident`) and waits for it.
    fn stop(&self) -> Result<StopReport> {
        let mut report = lock(&self.report);
        if let Some(done) = *report {
            return Ok(done);
        }
        self.closed.store(true, Ordering::Relaxed);
        self.host.control(STOP).store(1, Ordering::Release);
        let asked = Instant::now();
        while self.state() == RUNNING && !driver::stream_finished(&self.stream)? {
            if asked.elapsed() > STOP_TIMEOUT {
                return Err(Error::Cuda {
                    call: "resident worker".into(),
                    message: format!(
                        "the worker on GPU {} did not stop within {} s of being asked; its kernel \
                         still holds its SMs until the process exits",
                        self.device,
                        STOP_TIMEOUT.as_secs()
                    ),
                });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        self.stream
            .synchronize()
            .map_err(failed("cuStreamSynchronize"))?;
        self.halt_heartbeat();
        let exit = match self.state() {
            WATCHDOG => WorkerExit::Watchdog,
            STOPPED if self.host.interrupted.load(Ordering::Relaxed) => WorkerExit::Interrupted,
            STOPPED => WorkerExit::Stopped,
            other => {
                return Err(Error::Cuda {
                    call: "resident worker".into(),
                    message: format!(
                        "the worker's kernel on GPU {} ended without saying why (state {other})",
                        self.device
                    ),
                })
            }
        };
        // The kernel has ended: its last stores are visible.
        let times: Vec<u64> = (RUN_NS..RUN_NS + 7)
            .map(|w| self.host.control(w).load(Ordering::Acquire))
            .collect();
        let done = StopReport {
            submitted: self.next_ticket.load(Ordering::Relaxed),
            completed: self.completed(),
            exit,
            dispatcher: Some(DispatcherTimes {
                run_ns: times[0],
                rounds: times[1],
                poll_ns: times[2],
                working_rounds: times[3],
                working_poll_ns: times[4],
                copy_ns: times[5],
                publish_ns: times[6],
            }),
        };
        *report = Some(done);
        Ok(done)
    }

    fn halt_heartbeat(&self) {
        self.host.halt.store(true, Ordering::Release);
        if let Some(thread) = lock(&self.heartbeat).take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Its memory goes with the fields, after the kernel has ended. A failure to stop leaves
        // the kernel to the watchdog (the heartbeat ends below) and the process's end.
        let _ = self.stop();
        self.halt_heartbeat();
    }
}

/// Starts a worker (the checked layer checked the GPU and the configuration's ranges).
fn start(gpus: &Gpus, config: &WorkerConfig) -> Result<Worker> {
    let device = config.device;
    let ctx = gpus.context(device)?;
    let kernels = gpus.kernels(device)?;
    if config.copy_blocks >= kernels.sm_count {
        return Err(Error::usage(format!(
            "a worker with {} copy blocks needs {} SMs (one more for its dispatcher), and GPU \
             {device} has {}: ask for at most {} copy blocks",
            config.copy_blocks,
            config.copy_blocks + 1,
            kernels.sm_count,
            kernels.sm_count - 1
        )));
    }
    let ring_slots = config.ring_slots as usize;
    let words = HostWords::words(ring_slots);
    let memory = PinnedMemory::new(ctx, words * 8)?;
    memory.write_at(0, &vec![0; words * 8]);
    let progress_offset = BOARD_SLOTS * BOARD_ENTRY_BYTES;
    let quit_offset = progress_offset + 8 * config.copy_blocks as usize;
    let board_bytes = quit_offset + 8;
    let board = DeviceMemory::new(ctx, board_bytes)?;
    driver::copy_to_device_and_wait(
        gpus.io_stream(device)?,
        board.address(),
        &vec![0; board_bytes],
    )?;
    gpus.count(|c| &c.copies);
    let host = Arc::new(HostWords {
        memory,
        ring_slots,
        halt: AtomicBool::new(false),
        interrupted: AtomicBool::new(false),
    });
    let stream = ctx.new_stream().map_err(failed("cuStreamCreate"))?;
    // A batch list in the pool before the launch: a first small batch then allocates nothing on
    // its way, and compute-sanitizer's memcheck, which judges a kernel by the allocations that
    // existed at its launch, sees the list the worker reads.
    gpus.descriptors.give_back(gpus.descriptors.take(ctx, 1)?);
    let args = ResidentArgs {
        ring: host.word_address(CONTROL_WORDS),
        doorbells: host.word_address(CONTROL_WORDS + ring_slots * SLOT_WORDS),
        control: host.word_address(0),
        board: board.address(),
        progress: board.address() + progress_offset as u64,
        quit: board.address() + quit_offset as u64,
        ring_slots: ring_slots as u64,
        watchdog_ns: config.watchdog_ms * 1_000_000,
    };
    kernels.resident(&stream, &args, config.copy_blocks + 1)?;
    gpus.count(|c| &c.launches);
    let worker = Worker {
        device,
        ring_slots: ring_slots as u64,
        watchdog_ms: config.watchdog_ms,
        stream,
        host,
        _board: board,
        next_ticket: AtomicU64::new(0),
        seen_completed: AtomicU64::new(0),
        closed: AtomicBool::new(false),
        batch_lists: Mutex::new(VecDeque::new()),
        heartbeat: Mutex::new(None),
        report: Mutex::new(None),
    };
    // From here a failure drops the worker, which stops its kernel.
    let period = HEARTBEAT_PERIOD.min(Duration::from_millis(config.watchdog_ms) / 4);
    let beating = Arc::clone(&worker.host);
    let heartbeat = std::thread::Builder::new()
        .name(format!("peerlink-resident-{device}"))
        .spawn(move || beat(beating, period))
        .map_err(|e| Error::Cuda {
            call: "resident worker".into(),
            message: format!("its heartbeat thread did not start: {e}"),
        })?;
    *lock(&worker.heartbeat) = Some(heartbeat);
    // Return once the kernel runs, so that a launch that cannot start says so here.
    let launched = Instant::now();
    while worker.state() != RUNNING {
        if driver::stream_finished(&worker.stream)? || launched.elapsed() > START_TIMEOUT {
            return Err(Error::Cuda {
                call: "resident worker".into(),
                message: format!(
                    "the worker's kernel did not start on GPU {device} within {} s: other work \
                     holds the SMs it needs ({} blocks at once); try fewer copy blocks, or start \
                     it before that work",
                    START_TIMEOUT.as_secs(),
                    config.copy_blocks + 1
                ),
            });
        }
        std::thread::sleep(Duration::from_micros(20));
    }
    Ok(worker)
}

impl Gpus {
    /// [`RawBackend::stop_worker`].
    pub(super) fn stop_resident(&self, worker: &Worker) -> Result<StopReport> {
        let report = worker.stop()?;
        // No kernel reads the lists any more.
        for (_, block) in lock(&worker.batch_lists).drain(..) {
            self.descriptors.give_back(block);
        }
        Ok(report)
    }
}

impl RawResident for Gpus {
    fn start_worker(&self, config: &WorkerConfig) -> Result<Worker> {
        start(self, config)
    }

    fn submit(&self, worker: &Worker, copy: BufferCopy<&Arc<Buffer>>) -> Result<u64> {
        let (dst, src) = super::addresses(&copy);
        worker.submit_copy(self, dst, src, copy.len, None)
    }

    fn submit_batch(&self, worker: &Worker, batch: Batch<'_, Arc<Buffer>>) -> Result<u64> {
        worker.submit_batch(self, batch, None)
    }

    fn submit_batch_after(
        &self,
        worker: &Worker,
        stream: &Arc<Stream>,
        batch: Batch<'_, Arc<Buffer>>,
    ) -> Result<u64> {
        worker.submit_batch(self, batch, Some(&stream.stream))
    }

    fn submit_after(
        &self,
        worker: &Worker,
        stream: &Arc<Stream>,
        copy: BufferCopy<&Arc<Buffer>>,
    ) -> Result<u64> {
        let (dst, src) = super::addresses(&copy);
        worker.submit_copy(self, dst, src, copy.len, Some(&stream.stream))
    }

    fn wait_on_stream(&self, stream: &Arc<Stream>, worker: &Worker, ticket: u64) -> Result<()> {
        let completed = worker.host.word_address(COMPLETED);
        let queued = driver::wait_value_at_least(&stream.stream, completed, ticket + 1);
        self.count(|c| &c.memory_ops);
        queued
    }

    fn submitted(&self, worker: &Worker) -> u64 {
        worker.next_ticket.load(Ordering::Relaxed)
    }

    fn is_complete(&self, worker: &Worker, ticket: u64) -> Result<bool> {
        if ticket < worker.seen_completed.load(Ordering::Relaxed) {
            return Ok(true);
        }
        // The state first: once the kernel has ended, the count read after it is its last.
        let state = worker.state();
        if ticket < worker.completed() {
            return Ok(true);
        }
        match state {
            RUNNING => Ok(false),
            ended => Err(worker.abandoned(ticket, ended)),
        }
    }

    fn wait_for(&self, worker: &Worker, ticket: u64) -> Result<()> {
        worker.poll_until(ticket, |completed| ticket < completed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_beyond_48_bits_are_refused() {
        assert!(encodable((1 << 48) - 1).is_ok());
        let error = encodable(1 << 48).unwrap_err().to_string();
        assert!(error.contains("48 bits"), "{error}");
    }
}
