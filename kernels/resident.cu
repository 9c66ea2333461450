// The resident worker: one persistent kernel per worker that the host rings with transfers.
// Relies on copy.cu's copy_range_loading and CopyDescriptor and spin.cu's global_timer_ns (the
// kernels are compiled as one program).
//
// Memory (src/backend/cuda/resident.rs allocates it):
// - host, pinned and mapped: the control words, the ring and the doorbells;
// - device: the board (transfers handed from the dispatcher to the copy blocks), one progress word
//   per copy block, the quit word.
//
// The ring. Ticket t lives in slot t % ring_slots, as four u64 words; each word carries 32 bits of
// the descriptor in its low half and the tag of t's lap round the ring (t / ring_slots, mod
// 2^32 - 1, plus 1: never 0, so zeroed memory never passes for a descriptor) in its high half. The
// host writes each word with one 8-byte store; a word whose tag is not t's is from an earlier lap or
// not written yet. So the GPU reads a whole slot in one round trip, needing no sequence word first
// and no acquire between it and the payload (NCCL's LL protocol relies on the same 8-byte
// atomicity over PCIe). Words: src bits 0-31; dst bits 0-31; src bits 32-47 | dst bits 32-47 << 16;
// len (30 bits) | RESIDENT_GATED | RESIDENT_BATCH. A batch's src is a list of CopyDescriptor in
// pinned host memory and its len the number of messages.
//
// Block 0, warp 0 is the dispatcher. Each round it reads, in one PCIe round trip, the slots of the
// next 15 tickets (two lanes each, one load per lane; only the next one after a round that found
// nothing), the host's stop and heartbeat words (lanes 30 and 31), and the copy blocks' progress
// (device memory). It takes ready slots in ticket order: a gated transfer first waits for
// its doorbell (written by cuStreamWriteValue64 when the user's stream reaches it); a copy of at
// most RESIDENT_WARP_COPY_MAX bytes, or any transfer when there are no copy blocks, it moves itself
// with its 32 lanes; anything else it posts on the board. Then it publishes completion: every
// ticket before the first board entry not yet finished by every copy block is complete, and lane 0
// stores that count into the control word the host polls with a release at system scope, after a
// __syncwarp() that orders the other lanes' copies before it (the copy blocks fenced theirs before
// they raised their progress), so a host that sees the count sees the bytes.
//
// Copy blocks (blocks 1..) take every board entry in order, each moving its share (a copy split
// 16 bytes per thread over all of their threads; a run of a batch's messages per warp), then fence at
// system scope and raise their progress word. They take every entry already posted before they
// fence, so back-to-back transfers cost one fence per round, not one each, and transfers in flight
// together overlap.
//
// Stopping: the host sets the stop word; the dispatcher takes what the ring still holds (giving up
// on a doorbell that has not rung), waits for the copy blocks to finish the board, publishes, sets
// the quit word the copy blocks wait on, and records why it ended in the state word. The
// watchdog: the host's heartbeat thread raises the heartbeat word every few dozen ms; when the
// dispatcher sees it unchanged for watchdog_ns of %globaltimer, the host is gone or hung, and it
// stops as if asked.

constexpr unsigned int RESIDENT_THREADS = 512;
constexpr unsigned int RESIDENT_BOARD_SLOTS = 64;
// Slots a round reads at most: two lanes each, lanes 30 and 31 left for the host's words.
constexpr unsigned int RESIDENT_POLL_WINDOW_MAX = 15;
constexpr unsigned long long RESIDENT_WARP_COPY_MAX = 4096;
constexpr unsigned int RESIDENT_LEN_MASK = (1u << 30) - 1;
constexpr unsigned int RESIDENT_GATED = 1u << 30;
constexpr unsigned int RESIDENT_BATCH = 1u << 31;
// Control words (u64 indices): the GPU's on one cache line, the host's on the next.
constexpr unsigned int RESIDENT_COMPLETED = 0;
constexpr unsigned int RESIDENT_STATE = 1;
// The dispatcher's times (DispatcherTimes), written once at exit, on a line of their own.
constexpr unsigned int RESIDENT_RUN_NS = 16;
constexpr unsigned int RESIDENT_ROUNDS = 17;
constexpr unsigned int RESIDENT_POLL_NS = 18;
constexpr unsigned int RESIDENT_WORKING_ROUNDS = 19;
constexpr unsigned int RESIDENT_WORKING_POLL_NS = 20;
constexpr unsigned int RESIDENT_COPY_NS = 21;
constexpr unsigned int RESIDENT_PUBLISH_NS = 22;
constexpr unsigned int RESIDENT_STOP = 8;
constexpr unsigned int RESIDENT_HEARTBEAT = 9;
static_assert(RESIDENT_HEARTBEAT == RESIDENT_STOP + 1, "stop and heartbeat are read in one load");
// States.
constexpr unsigned long long RESIDENT_RUNNING = 1;
constexpr unsigned long long RESIDENT_STOPPED = 2;
constexpr unsigned long long RESIDENT_WATCHDOG = 3;

constexpr unsigned int RESIDENT_FULL_WARP = 0xffffffffu;
// Board entries a copy block looks for at once.
constexpr unsigned int RESIDENT_LOOKAHEAD = 8;

struct ResidentArgs {
    unsigned long long ring;
    unsigned long long doorbells;
    unsigned long long control;
    unsigned long long board;
    unsigned long long progress;
    unsigned long long quit;
    unsigned long long ring_slots;
    unsigned long long watchdog_ns;
};

// A board entry, one 64-byte line: `seq` (1, 2, …) is stored last, with release semantics.
struct BoardEntry {
    unsigned long long seq;
    unsigned long long src;
    unsigned long long dst;
    unsigned long long len;
    unsigned long long batch;
    unsigned long long unused[3];
};

// A transfer as the dispatcher decoded it from its slot.
struct Transfer {
    unsigned long long src;
    unsigned long long dst;
    unsigned int len;
    unsigned int flags;
};

__device__ __forceinline__ unsigned long long load_acquire_gpu(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long load_acquire_sys(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release_gpu(unsigned long long *p, unsigned long long v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void store_release_sys(unsigned long long *p, unsigned long long v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Two adjacent u64 words (16-byte aligned) in one load; each word on its own is read whole.
__device__ __forceinline__ ulonglong2 load_volatile_pair(const unsigned long long *p) {
    ulonglong2 v;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_volatile(unsigned long long *p, unsigned long long v) {
    *(volatile unsigned long long *)p = v;
}

// The tag of ticket `ticket`'s lap round the ring.
__device__ __forceinline__ unsigned int lap_tag(unsigned long long ticket,
                                                unsigned long long ring_slots) {
    return (unsigned int)((ticket / ring_slots) % 0xffffffffull) + 1;
}

__device__ __forceinline__ bool tagged(unsigned long long word, unsigned int tag) {
    return (unsigned int)(word >> 32) == tag;
}

// Decodes a slot's four words read for `ticket`; false unless every word carries its tag.
__device__ bool decode_slot(ulonglong2 low, ulonglong2 high, unsigned long long ticket,
                            unsigned long long ring_slots, Transfer *t) {
    const unsigned int tag = lap_tag(ticket, ring_slots);
    if (!(tagged(low.x, tag) && tagged(low.y, tag) && tagged(high.x, tag) && tagged(high.y, tag))) {
        return false;
    }
    const unsigned int upper = (unsigned int)high.x;
    t->src = (unsigned int)low.x | (unsigned long long)(upper & 0xffffu) << 32;
    t->dst = (unsigned int)low.y | (unsigned long long)(upper >> 16) << 32;
    t->len = (unsigned int)high.y & RESIDENT_LEN_MASK;
    t->flags = (unsigned int)high.y & ~RESIDENT_LEN_MASK;
    return true;
}

// Descriptors a warp reads in one request: three u64 words each, 63 of the 64 that 32 lanes'
// 16-byte loads hold.
constexpr unsigned int RESIDENT_DESCRIPTORS_PER_LOAD = 21;

// Moves warp `warp` of `warps`'s share of the `count` messages listed at `list`: a run of
// consecutive messages, so that warps read different lines of the list (reads of one line of host
// memory are served one after another: eight warps polling one line took 8.4 µs a poll on the H200
// pair, against 1.2 for one; benchmarks/h200-x2/2026-11-30-late/call1). The run's descriptors
// come 21 at a time, a 16-byte load per lane in one round trip (__ldcv: the host rewrites the list
// for later batches); the whole warp moves each message.
__device__ void copy_messages(const CopyDescriptor *list, unsigned long long count,
                              unsigned long long warp, unsigned long long warps, unsigned int lane) {
    const unsigned long long share = (count + warps - 1) / warps;
    const unsigned long long first = warp * share;
    const unsigned long long end = min(count, first + share);
    const unsigned long long *words = (const unsigned long long *)list;
    for (unsigned long long at = first; at < end; at += RESIDENT_DESCRIPTORS_PER_LOAD) {
        // Message `at`'s words start at 3 * at; the loads start at the 16-byte boundary at or
        // before it. The list's block is 16-byte aligned and a multiple of 16 bytes long, so a
        // pair that starts inside the list ends inside the block.
        const unsigned long long aligned = (3 * at) & ~1ull;
        const unsigned int skew = (unsigned int)(3 * at - aligned);
        const unsigned int messages =
            (unsigned int)min((unsigned long long)RESIDENT_DESCRIPTORS_PER_LOAD, end - at);
        // Only the lanes holding this run's words load: others would read the next warps' lines.
        const unsigned long long mine = aligned + 2 * lane;
        ulonglong2 pair = {0, 0};
        if (2 * lane < skew + 3 * messages && mine < 3 * count) {
            pair = __ldcv((const ulonglong2 *)(words + mine));
        }
        // Word w of the run sits in lane w / 2, half w % 2.
        const auto word = [&](unsigned int w) {
            return __shfl_sync(RESIDENT_FULL_WARP, (w & 1) ? pair.y : pair.x, w / 2);
        };
        for (unsigned int j = 0; j < messages; ++j) {
            const unsigned int w = skew + 3 * j;
            const unsigned long long to = word(w);
            const unsigned long long from = word(w + 1);
            const unsigned long long bytes = word(w + 2);
            copy_range_loading<true>((unsigned char *)to, (const unsigned char *)from, bytes, lane,
                                     32);
        }
    }
}

// The lowest progress word of the copy blocks (board entries every one of them finished).
__device__ unsigned long long lowest_progress(const ResidentArgs &a, unsigned int copiers,
                                              unsigned int lane) {
    const unsigned long long *progress = (const unsigned long long *)a.progress;
    unsigned long long lowest = ~0ull;
    for (unsigned int c = lane; c < copiers; c += 32) {
        lowest = min(lowest, load_acquire_gpu(progress + c));
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        lowest = min(lowest, __shfl_xor_sync(RESIDENT_FULL_WARP, lowest, offset));
    }
    return lowest;
}

// The time by lane 0's clock, the same on every lane: decisions taken on it stay warp-uniform
// (lanes reading the timer a few ns apart could otherwise split the warp).
__device__ __forceinline__ unsigned long long warp_time_ns() {
    return __shfl_sync(RESIDENT_FULL_WARP, global_timer_ns(), 0);
}

// %globaltimer once `after` is known: an input operand the timer read waits for, so that it times
// the loads `after` was computed from rather than their issue.
__device__ __forceinline__ unsigned long long timer_after(unsigned long long after) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) : "l"(after));
    return now;
}

// Where the dispatcher's time goes, by lane 0's %globaltimer, summed over the worker's life and
// written to the control words at exit (RESIDENT_ROUNDS…): every round's poll (issue to the
// slots' and host words' arrival), and in rounds that took tickets, the copies' loads and issue,
// and the publication (the system-scope release waits for the copies' stores to land).
struct DispatcherTimes {
    unsigned long long started_at;
    unsigned long long rounds;
    unsigned long long poll_ns;
    unsigned long long working_rounds;
    unsigned long long working_poll_ns;
    unsigned long long copy_ns;
    unsigned long long publish_ns;
};

// The host's heartbeat as the dispatcher last saw it change.
struct Watchdog {
    unsigned long long heartbeat;
    unsigned long long heard_at;
    unsigned long long period_ns;

    // Notes the heartbeat just read; true once it has been silent for the period.
    __device__ bool silent(unsigned long long beat) {
        const unsigned long long now = warp_time_ns();
        if (beat != heartbeat) {
            heartbeat = beat;
            heard_at = now;
            return false;
        }
        return now - heard_at > period_ns;
    }
};

// Waits until the doorbell of `ticket` has rung; otherwise returns why the worker must stop
// instead (the host asked, or went silent).
__device__ unsigned long long await_doorbell(const ResidentArgs &a, unsigned long long ticket,
                                             Watchdog &watchdog, unsigned int lane) {
    const unsigned long long *doorbells = (const unsigned long long *)a.doorbells;
    const unsigned long long *control = (const unsigned long long *)a.control;
    for (;;) {
        unsigned long long bell = 0;
        ulonglong2 host = {0, 0};
        if (lane == 0) {
            bell = load_acquire_sys(doorbells + (ticket & (a.ring_slots - 1)));
        }
        if (lane == 1) {
            host = load_volatile_pair(control + RESIDENT_STOP);
        }
        bell = __shfl_sync(RESIDENT_FULL_WARP, bell, 0);
        const unsigned long long stop = __shfl_sync(RESIDENT_FULL_WARP, host.x, 1);
        const unsigned long long beat = __shfl_sync(RESIDENT_FULL_WARP, host.y, 1);
        if (bell >= ticket + 1) {
            return RESIDENT_RUNNING;
        }
        if (watchdog.silent(beat)) {
            return RESIDENT_WATCHDOG;
        }
        if (stop != 0) {
            return RESIDENT_STOPPED;
        }
    }
}

// Block 0, warp 0: reads the ring, moves small transfers, hands the rest to the copy blocks and
// publishes completion (see the top of this file).
__device__ void run_dispatcher(const ResidentArgs &a) {
    __shared__ unsigned long long ticket_of_entry[RESIDENT_BOARD_SLOTS];
    const unsigned int lane = threadIdx.x;
    const unsigned int copiers = gridDim.x - 1;
    unsigned long long *control = (unsigned long long *)a.control;
    BoardEntry *board = (BoardEntry *)a.board;
    const unsigned long long *ring = (const unsigned long long *)a.ring;

    unsigned long long next = 0;      // the next ticket to take
    unsigned long long posted = 0;    // board entries posted
    unsigned long long retired = 0;   // board entries every copy block finished
    unsigned long long published = 0; // tickets published complete
    Watchdog watchdog = {~0ull, warp_time_ns(), a.watchdog_ns};
    unsigned long long state = RESIDENT_RUNNING;
    // After a round that found nothing, read only the next slot: an idle worker keeps its PCIe
    // reads to one slot per round trip.
    unsigned int window = 1;

    if (lane == 0) {
        store_volatile(control + RESIDENT_STATE, RESIDENT_RUNNING);
        __threadfence_system();
    }
    DispatcherTimes times = {global_timer_ns(), 0, 0, 0, 0, 0, 0};
    while (state == RESIDENT_RUNNING) {
        // Every lane's read of ticket_of_entry last round is done before lane 0 writes it again.
        __syncwarp();
        const unsigned long long round_at = global_timer_ns();
        // One round trip: the window of slots, the host's words, the copy blocks' progress.
        const unsigned long long ticket = next + lane;
        // One load per lane: lanes 2k and 2k+1 read the halves of slot k, the lanes past the
        // window the host's stop and heartbeat words (one line, one request). One lane reading
        // both halves waited for the first before the second went out: two PCIe round trips a
        // poll (2.19 µs against 1.18 for one 16-byte load on the H200 pair,
        // scripts/experiments/poll.cu), where loads of separate lanes travel together.
        const unsigned long long *half =
            ring + ((next + lane / 2) & (a.ring_slots - 1)) * 4 + 2 * (lane % 2);
        const ulonglong2 got =
            load_volatile_pair(lane < 2 * window ? half : control + RESIDENT_STOP);
        // Slot k's halves, gathered into lane k.
        const unsigned int from = 2 * (lane % RESIDENT_POLL_WINDOW_MAX);
        const ulonglong2 low = {__shfl_sync(RESIDENT_FULL_WARP, got.x, from),
                                __shfl_sync(RESIDENT_FULL_WARP, got.y, from)};
        const ulonglong2 high = {__shfl_sync(RESIDENT_FULL_WARP, got.x, from + 1),
                                 __shfl_sync(RESIDENT_FULL_WARP, got.y, from + 1)};
        retired = copiers > 0 ? lowest_progress(a, copiers, lane) : posted;
        Transfer mine = {0, 0, 0, 0};
        const bool ready = lane < window && decode_slot(low, high, ticket, a.ring_slots, &mine);
        const unsigned long long stop = __shfl_sync(RESIDENT_FULL_WARP, got.x, 31);
        const unsigned long long beat = __shfl_sync(RESIDENT_FULL_WARP, got.y, 31);
        // Lane 31 never holds a slot, so the ready run ends by lane 31 at the latest.
        const unsigned int count = __ffs(~__ballot_sync(RESIDENT_FULL_WARP, ready)) - 1;
        const unsigned long long polled_at = timer_after(count + beat + stop + retired);

        for (unsigned int k = 0; k < count; ++k) {
            Transfer t;
            t.src = __shfl_sync(RESIDENT_FULL_WARP, mine.src, k);
            t.dst = __shfl_sync(RESIDENT_FULL_WARP, mine.dst, k);
            t.len = __shfl_sync(RESIDENT_FULL_WARP, mine.len, k);
            t.flags = __shfl_sync(RESIDENT_FULL_WARP, mine.flags, k);
            if (t.flags & RESIDENT_GATED) {
                state = await_doorbell(a, next, watchdog, lane);
                if (state != RESIDENT_RUNNING) {
                    break;
                }
            }
            const bool batch = (t.flags & RESIDENT_BATCH) != 0;
            if (copiers == 0 || (!batch && t.len <= RESIDENT_WARP_COPY_MAX)) {
                if (batch) {
                    copy_messages((const CopyDescriptor *)t.src, t.len, 0, 1, lane);
                } else {
                    copy_range_loading<true>((unsigned char *)t.dst, (const unsigned char *)t.src,
                                             t.len, lane, 32);
                }
            } else {
                while (posted - retired >= RESIDENT_BOARD_SLOTS) {
                    retired = lowest_progress(a, copiers, lane);
                }
                BoardEntry *entry = board + posted % RESIDENT_BOARD_SLOTS;
                if (lane == 0) {
                    entry->src = t.src;
                    entry->dst = t.dst;
                    entry->len = t.len;
                    entry->batch = batch;
                    ticket_of_entry[posted % RESIDENT_BOARD_SLOTS] = next;
                    store_release_gpu(&entry->seq, posted + 1);
                }
                ++posted;
            }
            ++next;
        }
        // Orders every lane's copies (and the board entries lane 0 read) before lane 0's release
        // below, which makes them visible at system scope before the count: one fence a round,
        // where a fence per lane and another before the store cost a PCIe flush each.
        __syncwarp();
        const unsigned long long copied_at = global_timer_ns();
        // Every ticket before the first unfinished board entry is complete.
        const unsigned long long complete =
            retired == posted ? next : ticket_of_entry[retired % RESIDENT_BOARD_SLOTS];
        if (complete > published) {
            if (lane == 0) {
                store_release_sys(control + RESIDENT_COMPLETED, complete);
            }
            published = complete;
        }
        ++times.rounds;
        times.poll_ns += polled_at - round_at;
        if (count > 0) {
            ++times.working_rounds;
            times.working_poll_ns += polled_at - round_at;
            times.copy_ns += copied_at - polled_at;
            times.publish_ns += global_timer_ns() - copied_at;
        }
        if (state == RESIDENT_RUNNING && watchdog.silent(beat)) {
            state = RESIDENT_WATCHDOG;
        }
        if (state == RESIDENT_RUNNING && stop != 0 && count == 0) {
            state = RESIDENT_STOPPED;
        }
        window = count > 0 ? RESIDENT_POLL_WINDOW_MAX : 1;
    }
    // Let the copy blocks finish the board, publish everything taken, and let them go.
    while (retired != posted) {
        retired = lowest_progress(a, copiers, lane);
    }
    if (lane == 0) {
        store_volatile(control + RESIDENT_RUN_NS, global_timer_ns() - times.started_at);
        store_volatile(control + RESIDENT_ROUNDS, times.rounds);
        store_volatile(control + RESIDENT_POLL_NS, times.poll_ns);
        store_volatile(control + RESIDENT_WORKING_ROUNDS, times.working_rounds);
        store_volatile(control + RESIDENT_WORKING_POLL_NS, times.working_poll_ns);
        store_volatile(control + RESIDENT_COPY_NS, times.copy_ns);
        store_volatile(control + RESIDENT_PUBLISH_NS, times.publish_ns);
        __threadfence_system();
        store_volatile(control + RESIDENT_COMPLETED, next);
        store_volatile((unsigned long long *)a.quit, 1);
        store_volatile(control + RESIDENT_STATE, state);
        __threadfence_system();
    }
}

// Blocks 1..: take every board entry in order, each moving its share (see the top of this file).
__device__ void run_copier(const ResidentArgs &a) {
    __shared__ unsigned long long ready;
    const unsigned int copier = blockIdx.x - 1;
    const unsigned int copiers = gridDim.x - 1;
    const unsigned int lane = threadIdx.x % 32;
    const unsigned int warp = threadIdx.x / 32;
    const unsigned int warps = blockDim.x / 32;
    const BoardEntry *board = (const BoardEntry *)a.board;
    unsigned long long *progress = (unsigned long long *)a.progress;
    unsigned long long done = 0;
    for (;;) {
        if (warp == 0) {
            // The run of entries after `done` already posted; 0 once the dispatcher says quit.
            unsigned long long count = 0;
            for (unsigned int idle = 0;; ++idle) {
                const unsigned long long wanted = done + 1 + lane;
                const bool posted =
                    lane < RESIDENT_LOOKAHEAD &&
                    load_acquire_gpu(&board[(wanted - 1) % RESIDENT_BOARD_SLOTS].seq) == wanted;
                count = __ffs(~__ballot_sync(RESIDENT_FULL_WARP, posted)) - 1;
                if (count > 0) {
                    break;
                }
                unsigned long long quit = 0;
                if (lane == 0) {
                    quit = *(volatile unsigned long long *)a.quit;
                }
                if (__shfl_sync(RESIDENT_FULL_WARP, quit, 0) != 0) {
                    break;
                }
                // Idle: give the SM's issue slots to the user's kernels.
                __nanosleep(idle < 64 ? 32 : 256);
            }
            if (lane == 0) {
                ready = count;
            }
        }
        __syncthreads();
        const unsigned long long count = ready;
        if (count == 0) {
            return;
        }
        for (unsigned long long e = 0; e < count; ++e) {
            const BoardEntry *entry = board + (done + e) % RESIDENT_BOARD_SLOTS;
            const unsigned long long src = __ldcg(&entry->src);
            const unsigned long long dst = __ldcg(&entry->dst);
            const unsigned long long len = __ldcg(&entry->len);
            if (__ldcg(&entry->batch) != 0) {
                copy_messages((const CopyDescriptor *)src, len, copier * warps + warp,
                              (unsigned long long)copiers * warps, lane);
            } else {
                copy_range_loading<true>((unsigned char *)dst, (const unsigned char *)src, len,
                                         (unsigned long long)copier * blockDim.x + threadIdx.x,
                                         (unsigned long long)copiers * blockDim.x);
            }
        }
        __threadfence_system();
        // Also keeps warp 0 from overwriting `ready` before every warp has read it.
        __syncthreads();
        done += count;
        if (threadIdx.x == 0) {
            store_release_gpu(progress + copier, done);
        }
    }
}

// One launch per worker, cooperative (every block resident at once): block 0 dispatches, the
// others copy.
extern "C" __global__ void __launch_bounds__(RESIDENT_THREADS, 1)
    resident_worker(const __grid_constant__ ResidentArgs args) {
    if (blockIdx.x > 0) {
        run_copier(args);
    } else if (threadIdx.x < 32) {
        run_dispatcher(args);
    }
}
