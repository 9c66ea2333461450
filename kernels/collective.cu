// peerlink's all-reduce (sum or average) over 2 to MAX_RANKS GPUs, f32, bf16 and f16, and the busy
// kernel that stands in for a model's compute. Relies on global_timer_ns() from spin.cu (one
// program).
//
// Every rank launches the same grid on its own GPU with the same arguments but its own `rank`. In
// the one-shot and two-shot kernels, each block of one rank meets the block of the same index on
// every peer twice, through flags (the packet kernel, further down, meets no one):
//
// - START: every peer's kernel has started, so the work queued before it on its stream (which wrote
//   its input, or still read its output) is done;
// - END: every peer's block is done reading my input (one-shot) or writing my output (two-shot),
//   so the work queued after my kernel may touch my buffers. A grid's blocks cover every block
//   index on every rank, so when all my blocks have met, every peer's blocks have.
//
// Flag block of each rank (FLAG_BYTES, zeroed once by the caller, then only the kernels write it),
// in 32-bit words:
//
//   [0, ALL_REDUCE_MAX_BLOCKS)    counter[block]: operations block `block` of this rank has run
//   ALL_REDUCE_MAX_BLOCKS + (phase * ALL_REDUCE_MAX_BLOCKS + block) * MAX_RANKS + from
//                                 slot: the epoch rank `from`'s block `block` reached in `phase`
//
// and from byte PACKET_AREA_OFFSET (64 KiB) on, the packet kernel's receive area (see below).
//
// A block's epoch is its counter + 1; the counter is stored back at the end. Every rank runs the same
// grids in the same order, so the counters of one block index agree on every rank, and a slot only
// ever rises: no reset pass, and a captured graph replays as the calls would run. A peer is never
// more than the epoch ahead in one slot (it cannot leave END before I arrive, nor finish a packet
// call before I send my packets, which I do only after my call before), so waiting for equality is
// exact, even after the counter wraps.
//
// Waiting for peers: with a release word (args.release, pinned host memory), for as long as they
// take, as NCCL waits (a rank may be minutes late with a checkpoint); every RELEASE_POLL_SPINS
// spins the word is read, and once the host raised it (a peer died, the communicator was aborted)
// every wait ends as if answered: the kernel finishes, its results undefined. Without one, a wait
// longer than args.timeout_ns traps.

constexpr unsigned int MAX_RANKS = 8;
constexpr unsigned int ALL_REDUCE_THREADS = 512;
constexpr unsigned int ALL_REDUCE_MAX_BLOCKS = 512;
// Blocks resident on one SM at once (the launch bounds keep registers low enough for them).
constexpr unsigned int ALL_REDUCE_BLOCKS_PER_SM = 2;
constexpr unsigned int START_PHASE = 0;
constexpr unsigned int END_PHASE = 1;

// The kernels' arguments, passed by value; laid out as the host's AllReduceArgs (little-endian u64
// addresses, then u64 counts, then u32s and the f32 scale, no padding).
//
// `scale` multiplies every f32 sum once, just before its rounding to the element type: 1 for a sum
// (exact, so sums keep their bits), the f32 nearest 1/ranks for an average (NCCL's ncclAvg).
struct AllReduceArgs {
    unsigned long long inputs[MAX_RANKS];
    unsigned long long outputs[MAX_RANKS];
    unsigned long long flags[MAX_RANKS];
    unsigned long long release;
    unsigned long long elements;
    unsigned long long timeout_ns;
    unsigned int rank;
    unsigned int ranks;
    float scale;
    unsigned int padding;
};

__device__ __forceinline__ unsigned int *flag_slot(unsigned long long flags, unsigned int phase,
                                                   unsigned int block, unsigned int from) {
    return (unsigned int *)flags + ALL_REDUCE_MAX_BLOCKS +
           (phase * ALL_REDUCE_MAX_BLOCKS + block) * MAX_RANKS + from;
}

// System scope: the flag crosses GPUs. The release makes the writes before it (this block's, through
// the barrier before it) visible to whoever acquires the value.
__device__ __forceinline__ void store_release(unsigned int *slot, unsigned int value) {
    asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(slot), "r"(value) : "memory");
}

__device__ __forceinline__ unsigned int load_acquire(const unsigned int *slot) {
    unsigned int value;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(value) : "l"(slot) : "memory");
    return value;
}

// How often a wait reads the release word: each read crosses PCIe (about a microsecond), so a
// wait answered within a few thousand spins never pays for one.
constexpr unsigned int RELEASE_POLL_SPINS = 1024;

// Spins until `ready()` answers true, or until the host raises the release word, or traps after
// args.timeout_ns where there is none (the context then reports an error instead of the GPU
// hanging on a peer that never arrives: its launch failed, or its stream is held too long).
template <typename Ready>
__device__ __forceinline__ void spin_until(Ready ready, const AllReduceArgs &args) {
    if (ready()) {
        return;
    }
    const volatile unsigned int *release = (const volatile unsigned int *)args.release;
    const unsigned long long start = global_timer_ns();
    for (unsigned int spins = 1; !ready(); ++spins) {
        if (release != nullptr) {
            if (spins % RELEASE_POLL_SPINS == 0 && *release != 0) {
                return;
            }
        } else if (global_timer_ns() - start > args.timeout_ns) {
            __trap();
        }
    }
}

// Spins until `slot` holds `epoch`.
__device__ void wait_for(const unsigned int *slot, unsigned int epoch, const AllReduceArgs &args) {
    spin_until([&] { return load_acquire(slot) == epoch; }, args);
}

// Tells this block's counterpart on every peer that this rank reached `epoch` in `phase`, and waits
// until each of them has told this rank the same: thread p speaks with peer p.
__device__ __forceinline__ void meet_peers(const AllReduceArgs &args, unsigned int phase,
                                           unsigned int epoch) {
    const unsigned int peer = threadIdx.x;
    if (peer < args.ranks && peer != args.rank) {
        store_release(flag_slot(args.flags[peer], phase, blockIdx.x, args.rank), epoch);
        wait_for(flag_slot(args.flags[args.rank], phase, blockIdx.x, peer), epoch, args);
    }
}

// An item is what one load moves: a 16-byte vector (uint4), or a single element (`Bits`). Each
// element type unpacks an item into floats and packs floats back into one.

// f32 elements, summed as they are.
struct F32 {
    typedef unsigned int Bits;
    static __device__ __forceinline__ void unpack(uint4 item, float *values) {
        values[0] = __uint_as_float(item.x);
        values[1] = __uint_as_float(item.y);
        values[2] = __uint_as_float(item.z);
        values[3] = __uint_as_float(item.w);
    }
    static __device__ __forceinline__ void unpack(Bits item, float *values) {
        values[0] = __uint_as_float(item);
    }
    static __device__ __forceinline__ void pack(const float *values, uint4 *item) {
        item->x = __float_as_uint(values[0]);
        item->y = __float_as_uint(values[1]);
        item->z = __float_as_uint(values[2]);
        item->w = __float_as_uint(values[3]);
    }
    static __device__ __forceinline__ void pack(const float *values, Bits *item) {
        *item = __float_as_uint(values[0]);
    }
    // A 32-bit word (what one packet carries) holds one element.
    static constexpr unsigned int PER_WORD = 1;
    static __device__ __forceinline__ void unpack_word(unsigned int word, float *values) {
        unpack(word, values);
    }
    static __device__ __forceinline__ unsigned int pack_word(const float *values) {
        return __float_as_uint(values[0]);
    }
};

// 16-bit elements, two to a 32-bit word (the first in its low half: little-endian memory order),
// each widened to f32 and rounded back by `Half`. Sums are kept in f32 and rounded once.
template <typename Half>
struct Halves {
    typedef unsigned short Bits;
    static constexpr unsigned int PER_WORD = 2;
    static __device__ __forceinline__ void unpack_word(unsigned int word, float *values) {
        values[0] = Half::widen(word & 0xffffu);
        values[1] = Half::widen(word >> 16);
    }
    static __device__ __forceinline__ unsigned int pack_word(const float *values) {
        return Half::round(values[0]) | (Half::round(values[1]) << 16);
    }
    static __device__ __forceinline__ void unpack(uint4 item, float *values) {
        unpack_word(item.x, values);
        unpack_word(item.y, values + 2);
        unpack_word(item.z, values + 4);
        unpack_word(item.w, values + 6);
    }
    static __device__ __forceinline__ void unpack(Bits item, float *values) {
        values[0] = Half::widen(item);
    }
    static __device__ __forceinline__ void pack(const float *values, uint4 *item) {
        item->x = pack_word(values);
        item->y = pack_word(values + 2);
        item->z = pack_word(values + 4);
        item->w = pack_word(values + 6);
    }
    static __device__ __forceinline__ void pack(const float *values, Bits *item) {
        *item = (Bits)Half::round(values[0]);
    }
};

// bf16: the upper half of an f32, rounded to nearest even.
struct Bf16Half {
    static __device__ __forceinline__ float widen(unsigned int half) {
        return __uint_as_float(half << 16);
    }
    static __device__ __forceinline__ unsigned int round(float value) {
        const unsigned int bits = __float_as_uint(value);
        if ((bits & 0x7fffffffu) > 0x7f800000u) {
            return (bits >> 16) | 0x0040u; // a NaN stays a (quiet) NaN
        }
        return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    }
};

// f16 (IEEE binary16), by hand as bf16 is (no cuda_fp16.h to include under NVRTC): rounded to
// nearest even, subnormals kept, a magnitude of 65520 or more to infinity, a NaN stays a NaN.
struct F16Half {
    static __device__ __forceinline__ float widen(unsigned int half) {
        const unsigned int sign = (half & 0x8000u) << 16;
        const unsigned int exponent = (half >> 10) & 0x1fu;
        const unsigned int mantissa = half & 0x3ffu;
        if (exponent == 0x1fu) {
            return __uint_as_float(sign | 0x7f800000u | (mantissa << 13)); // infinity, NaN
        }
        if (exponent == 0) {
            // Zero or subnormal: mantissa × 2^-24, exact in f32.
            const float magnitude = (float)mantissa * 5.9604644775390625e-8f;
            return __uint_as_float(sign | __float_as_uint(magnitude));
        }
        return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    }
    static __device__ __forceinline__ unsigned int round(float value) {
        const unsigned int bits = __float_as_uint(value);
        const unsigned int sign = (bits >> 16) & 0x8000u;
        const unsigned int magnitude = bits & 0x7fffffffu;
        if (magnitude > 0x7f800000u) {
            return sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu); // a NaN stays a (quiet) NaN
        }
        if (magnitude >= 0x477ff000u) {
            return sign | 0x7c00u; // 65520 and up (ties to the even infinity), infinity
        }
        if (magnitude >= 0x38800000u) {
            // Normal (2^-14 and up): rebias the exponent, round the 13 dropped bits to even.
            return sign | ((magnitude - 0x38000000u + 0xfffu + ((magnitude >> 13) & 1u)) >> 13);
        }
        const unsigned int exponent = magnitude >> 23;
        if (exponent < 102u) {
            return sign; // below 2^-25, half the smallest subnormal: zero
        }
        // Subnormal: the 24-bit significand in units of 2^-24, rounded to even.
        const unsigned int significand = (magnitude & 0x7fffffu) | 0x800000u;
        const unsigned int shift = 126u - exponent; // 14 to 24
        return sign | ((significand + (1u << (shift - 1)) - 1u + ((significand >> shift) & 1u)) >>
                       shift);
    }
};

typedef Halves<Bf16Half> Bf16;
typedef Halves<F16Half> F16;

// Multiplies each lane of a sum by the call's scale, once, before the rounding.
template <unsigned int LANES>
__device__ __forceinline__ void apply_scale(float *sum, float scale) {
#pragma unroll
    for (unsigned int lane = 0; lane < LANES; ++lane) {
        sum[lane] *= scale;
    }
}

// The sum of `in[0..ranks)` added in rank order, times `scale`: every rank, and every kernel, get
// the same bits.
template <typename Element, typename Item>
__device__ __forceinline__ Item add_in_rank_order(const Item *in, unsigned int ranks,
                                                  float scale) {
    constexpr unsigned int LANES = sizeof(Item) / sizeof(typename Element::Bits);
    float sum[LANES];
    Element::unpack(in[0], sum);
#pragma unroll
    for (unsigned int r = 1; r < MAX_RANKS; ++r) {
        if (r < ranks) {
            float values[LANES];
            Element::unpack(in[r], values);
#pragma unroll
            for (unsigned int lane = 0; lane < LANES; ++lane) {
                sum[lane] += values[lane];
            }
        }
    }
    apply_scale<LANES>(sum, scale);
    Item out;
    Element::pack(sum, &out);
    return out;
}

// The sum of item `index` of every rank's input. All loads are issued before the first add.
template <typename Element, typename Item>
__device__ __forceinline__ Item sum_item(const AllReduceArgs &args, unsigned long long index) {
    Item in[MAX_RANKS];
#pragma unroll
    for (unsigned int r = 0; r < MAX_RANKS; ++r) {
        if (r < args.ranks) {
            in[r] = ((const Item *)args.inputs[r])[index];
        }
    }
    return add_in_rank_order<Element, Item>(in, args.ranks, args.scale);
}

// Stores item `index`'s sum into this rank's output (one-shot) or into every rank's output,
// starting with its own (two-shot).
template <typename Item, bool TWO_SHOT>
__device__ __forceinline__ void store_sum(const AllReduceArgs &args, unsigned long long index,
                                          Item sum) {
    if (TWO_SHOT) {
#pragma unroll
        for (unsigned int r = 0; r < MAX_RANKS; ++r) {
            if (r < args.ranks) {
                unsigned int to = args.rank + r;
                to = to < args.ranks ? to : to - args.ranks;
                ((Item *)args.outputs[to])[index] = sum;
            }
        }
    } else {
        ((Item *)args.outputs[args.rank])[index] = sum;
    }
}

// Items [begin, end), spread over the grid, one at a time per thread.
template <typename Element, typename Item, bool TWO_SHOT>
__device__ __forceinline__ void reduce_items(const AllReduceArgs &args, unsigned long long begin,
                                             unsigned long long end) {
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = begin + (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < end; i += threads) {
        store_sum<Item, TWO_SHOT>(args, i, sum_item<Element, Item>(args, i));
    }
}

// Vectors [begin, end) over exactly RANKS ranks: each thread loads BATCH vectors of every rank
// before it adds the first, so that more reads cross the links at once (one 16-byte read per
// thread in flight held the two-shot kernel to 72% of the H200 pair's NVLink rate). BATCH × RANKS
// vectors must fit the registers the launch bounds leave (64 a thread): 8 vectors at most.
template <typename Element, unsigned int RANKS, bool TWO_SHOT>
__device__ __forceinline__ void reduce_vectors(const AllReduceArgs &args, unsigned long long begin,
                                               unsigned long long end) {
    constexpr unsigned int BATCH = 8 / RANKS;
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = begin + (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (BATCH - 1) * threads < end; i += BATCH * threads) {
        uint4 in[BATCH][RANKS];
#pragma unroll
        for (unsigned int b = 0; b < BATCH; ++b) {
#pragma unroll
            for (unsigned int r = 0; r < RANKS; ++r) {
                in[b][r] = ((const uint4 *)args.inputs[r])[i + b * threads];
            }
        }
#pragma unroll
        for (unsigned int b = 0; b < BATCH; ++b) {
            store_sum<uint4, TWO_SHOT>(args, i + b * threads,
                                       add_in_rank_order<Element, uint4>(in[b], RANKS,
                                                                         args.scale));
        }
    }
    for (; i < end; i += threads) {
        store_sum<uint4, TWO_SHOT>(args, i, sum_item<Element, uint4>(args, i));
    }
}

// Vectors [begin, end): batched where the ranks are few enough for a batch, else one at a time.
template <typename Element, bool TWO_SHOT>
__device__ __forceinline__ void reduce_all_vectors(const AllReduceArgs &args,
                                                   unsigned long long begin,
                                                   unsigned long long end) {
    switch (args.ranks) {
    case 2:
        reduce_vectors<Element, 2, TWO_SHOT>(args, begin, end);
        break;
    case 3:
        reduce_vectors<Element, 3, TWO_SHOT>(args, begin, end);
        break;
    case 4:
        reduce_vectors<Element, 4, TWO_SHOT>(args, begin, end);
        break;
    default:
        reduce_items<Element, uint4, TWO_SHOT>(args, begin, end);
    }
}

struct Span {
    unsigned long long begin;
    unsigned long long end;
};

// Rank `rank`'s part of [begin, end) cut into `ranks` consecutive parts of nearly equal size.
__device__ __forceinline__ Span share(unsigned long long begin, unsigned long long end,
                                      unsigned int rank, unsigned int ranks) {
    const unsigned long long part = (end - begin + ranks - 1) / ranks;
    const unsigned long long first = begin + rank * part;
    Span span;
    span.begin = first < end ? first : end;
    span.end = first + part < end ? first + part : end;
    return span;
}

// Whether every buffer starts on a 16-byte boundary, so elements can move as vectors.
__device__ __forceinline__ bool vectors_allowed(const AllReduceArgs &args) {
    unsigned long long addresses = 0;
    for (unsigned int r = 0; r < args.ranks; ++r) {
        addresses |= args.inputs[r] | args.outputs[r];
    }
    return (addresses & 15) == 0;
}

template <typename Element, bool TWO_SHOT>
__device__ __forceinline__ void all_reduce(const AllReduceArgs &args) {
    unsigned int *counter = (unsigned int *)args.flags[args.rank] + blockIdx.x;
    const unsigned int epoch = *counter + 1;
    meet_peers(args, START_PHASE, epoch);
    __syncthreads(); // no thread touches a peer's buffers before every peer has started

    // 16-byte vectors where every buffer allows them, then single elements for the rest.
    constexpr unsigned long long PER_VECTOR = 16 / sizeof(typename Element::Bits);
    const unsigned long long vectors = vectors_allowed(args) ? args.elements / PER_VECTOR : 0;
    const unsigned long long scalars_from = vectors * PER_VECTOR;
    if (TWO_SHOT) {
        const Span mine = share(0, vectors, args.rank, args.ranks);
        reduce_all_vectors<Element, true>(args, mine.begin, mine.end);
        const Span rest = share(scalars_from, args.elements, args.rank, args.ranks);
        reduce_items<Element, typename Element::Bits, true>(args, rest.begin, rest.end);
        __threadfence_system(); // my stores into the peers' outputs land before I say I am done
    } else {
        reduce_all_vectors<Element, false>(args, 0, vectors);
        reduce_items<Element, typename Element::Bits, false>(args, scalars_from, args.elements);
    }

    __syncthreads(); // every thread of this block is done with the peers' buffers
    meet_peers(args, END_PHASE, epoch);
    // Every thread read the counter before the barrier above.
    if (threadIdx.x == 0) {
        *counter = epoch;
    }
}

extern "C" __global__ void __launch_bounds__(ALL_REDUCE_THREADS, ALL_REDUCE_BLOCKS_PER_SM)
    all_reduce_one_shot_f32(const __grid_constant__ AllReduceArgs args) {
    all_reduce<F32, false>(args);
}

extern "C" __global__ void __launch_bounds__(ALL_REDUCE_THREADS, ALL_REDUCE_BLOCKS_PER_SM)
    all_reduce_one_shot_bf16(const __grid_constant__ AllReduceArgs args) {
    all_reduce<Bf16, false>(args);
}

extern "C" __global__ void __launch_bounds__(ALL_REDUCE_THREADS, ALL_REDUCE_BLOCKS_PER_SM)
    all_reduce_one_shot_f16(const __grid_constant__ AllReduceArgs args) {
    all_reduce<F16, false>(args);
}

extern "C" __global__ void __launch_bounds__(ALL_REDUCE_THREADS, ALL_REDUCE_BLOCKS_PER_SM)
    all_reduce_two_shot_f32(const __grid_constant__ AllReduceArgs args) {
    all_reduce<F32, true>(args);
}

extern "C" __global__ void __launch_bounds__(ALL_REDUCE_THREADS, ALL_REDUCE_BLOCKS_PER_SM)
    all_reduce_two_shot_bf16(const __grid_constant__ AllReduceArgs args) {
    all_reduce<Bf16, true>(args);
}

extern "C" __global__ void __launch_bounds__(ALL_REDUCE_THREADS, ALL_REDUCE_BLOCKS_PER_SM)
    all_reduce_two_shot_f16(const __grid_constant__ AllReduceArgs args) {
    all_reduce<F16, true>(args);
}

// ---------------------------------------------------------------------------------------------
// One-shot with packets (NCCL's "LL" protocol): no barrier.
//
// Every rank PUSHES its input to every peer as 8-byte packets {u32 data word, u32 epoch}, each
// written with one naturally aligned 64-bit relaxed system-scope store: an 8-byte store arrives
// whole over NVLink and PCIe (what NCCL's LL protocol relies on), so a packet that carries the
// current epoch carries its data too, and no fence or flag is needed. The packets land in the
// peer's receive area, after the flags in its flag block:
//
//   packet[parity][from][word], parity = epoch & 1, from = the sending rank, word < PACKET_WORDS
//
// Then every rank, for each word, spins until every peer's packet for that word in its OWN receive
// area carries the current epoch, and sums the peers' data words with its own input word (read
// locally) in rank order, as the other kernels do (f32 accumulation, times the scale, 16-bit types
// rounded once; a word holds one f32 or two 16-bit elements; an odd 16-bit count ends with a half
// word, loaded and stored as 16 bits).
//
// Nobody reads a peer's input and nobody writes a peer's output, so no barrier is needed at either
// end: the caller may change its input or read its output as soon as its own kernel is done.
//
// Epochs: thread t of block b handles word b * ALL_REDUCE_THREADS + t, one word per thread, on
// every rank and in every call (the grid is as large as the payload needs, never capped), so a
// word's packets always carry the epoch of the same block index: its counter + 1, kept with the
// other kernels' counters and raised by them too. A block's epochs only rise, so a slot never holds
// the current epoch before the current packet lands (no reset; graph replays work). Two parities
// suffice: a peer writes packets of a later call into the parity I am reading only after finishing
// the call in between, which needs my packets of that call, which I send only after reading; and
// a barrier kernel in between cannot be left by a peer before I arrive at it.
//
// Every block of the grid (at most PACKET_MAX_BYTES / 4 / ALL_REDUCE_THREADS = 128) must be
// resident at once on every GPU, which any GPU of 64 SMs or more allows (the host refuses the
// launch on a smaller one).

constexpr unsigned int PACKET_MAX_BYTES = 256 * 1024;
constexpr unsigned int PACKET_WORDS = PACKET_MAX_BYTES / 4;
// Where the receive area starts in a flag block: after the 64 KiB of counters and flags.
constexpr unsigned long long PACKET_AREA_OFFSET = 64 * 1024;
constexpr unsigned int PACKET_PARITIES = 2;

__device__ __forceinline__ unsigned long long *packet_slot(unsigned long long flags,
                                                           unsigned int parity, unsigned int from,
                                                           unsigned int word) {
    return (unsigned long long *)(flags + PACKET_AREA_OFFSET) +
           (parity * MAX_RANKS + from) * PACKET_WORDS + word;
}

__device__ __forceinline__ void store_packet(unsigned long long *slot, unsigned long long packet) {
    asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(slot), "l"(packet) : "memory");
}

__device__ __forceinline__ unsigned long long load_packet(const unsigned long long *slot) {
    unsigned long long packet;
    asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(packet) : "l"(slot) : "memory");
    return packet;
}

// Spins until `slot` holds a packet of `epoch`; answers its data word.
__device__ __forceinline__ unsigned int wait_for_packet(const unsigned long long *slot,
                                                        unsigned int epoch,
                                                        const AllReduceArgs &args) {
    unsigned long long packet = 0;
    spin_until(
        [&] {
            packet = load_packet(slot);
            return (unsigned int)(packet >> 32) == epoch;
        },
        args);
    return (unsigned int)packet;
}

template <typename Element>
__device__ __forceinline__ void all_reduce_packets(const AllReduceArgs &args) {
    unsigned int *counter = (unsigned int *)args.flags[args.rank] + blockIdx.x;
    const unsigned int epoch = *counter + 1;
    const unsigned int parity = epoch % PACKET_PARITIES;
    const unsigned long long bytes = args.elements * sizeof(typename Element::Bits);
    const unsigned int word = blockIdx.x * ALL_REDUCE_THREADS + threadIdx.x;
    if ((unsigned long long)word * 4 < bytes) {
        // The last word of an odd 16-bit count holds one element: its upper half is not the
        // buffer's.
        const bool whole = (unsigned long long)word * 4 + 4 <= bytes;
        const unsigned int mine =
            whole ? ((const unsigned int *)args.inputs[args.rank])[word]
                  : (unsigned int)((const unsigned short *)args.inputs[args.rank])[2 * word];
        const unsigned long long packet = ((unsigned long long)epoch << 32) | mine;
#pragma unroll
        for (unsigned int r = 1; r < MAX_RANKS; ++r) {
            if (r < args.ranks) {
                unsigned int to = args.rank + r;
                to = to < args.ranks ? to : to - args.ranks;
                store_packet(packet_slot(args.flags[to], parity, args.rank, word), packet);
            }
        }
        unsigned int words[MAX_RANKS];
#pragma unroll
        for (unsigned int r = 0; r < MAX_RANKS; ++r) {
            if (r < args.ranks) {
                words[r] = r == args.rank ? mine
                                          : wait_for_packet(packet_slot(args.flags[args.rank],
                                                                        parity, r, word),
                                                            epoch, args);
            }
        }
        float sum[Element::PER_WORD];
        Element::unpack_word(words[0], sum);
#pragma unroll
        for (unsigned int r = 1; r < MAX_RANKS; ++r) {
            if (r < args.ranks) {
                float values[Element::PER_WORD];
                Element::unpack_word(words[r], values);
#pragma unroll
                for (unsigned int lane = 0; lane < Element::PER_WORD; ++lane) {
                    sum[lane] += values[lane];
                }
            }
        }
        apply_scale<Element::PER_WORD>(sum, args.scale);
        const unsigned int out = Element::pack_word(sum);
        if (whole) {
            ((unsigned int *)args.outputs[args.rank])[word] = out;
        } else {
            ((unsigned short *)args.outputs[args.rank])[2 * word] = (unsigned short)out;
        }
    }
    __syncthreads(); // every thread read the counter before it rises
    if (threadIdx.x == 0) {
        *counter = epoch;
    }
}

extern "C" __global__ void __launch_bounds__(ALL_REDUCE_THREADS, ALL_REDUCE_BLOCKS_PER_SM)
    all_reduce_one_shot_packets_f32(const __grid_constant__ AllReduceArgs args) {
    all_reduce_packets<F32>(args);
}

extern "C" __global__ void __launch_bounds__(ALL_REDUCE_THREADS, ALL_REDUCE_BLOCKS_PER_SM)
    all_reduce_one_shot_packets_bf16(const __grid_constant__ AllReduceArgs args) {
    all_reduce_packets<Bf16>(args);
}

extern "C" __global__ void __launch_bounds__(ALL_REDUCE_THREADS, ALL_REDUCE_BLOCKS_PER_SM)
    all_reduce_one_shot_packets_f16(const __grid_constant__ AllReduceArgs args) {
    all_reduce_packets<F16>(args);
}

// Keeps its SM's warp scheduler busy for `duration_ns` of GPU time. Launched as one block of one
// warp per SM, so other kernels still find room beside it, as beside a model's compute.
extern "C" __global__ void busy(unsigned long long duration_ns) {
    const unsigned long long start = global_timer_ns();
    while (global_timer_ns() - start < duration_ns) {
    }
}
