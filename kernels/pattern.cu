// The crate's data pattern (src/bench/pattern.rs), made and checked on the GPU that holds the bytes.
//
// Word i of a message (its bytes 8i to 8i + 7, little-endian) is (i + base) * multiplier modulo
// 2^64; the host passes base and multiplier, so the pattern is defined on the host only. A message
// placed at an 8-byte-aligned address moves as whole words, the tail byte by byte; elsewhere every
// byte is made on its own (each byte depends on its index alone).

__device__ __forceinline__ unsigned long long pattern_word(unsigned long long base,
                                                           unsigned long long multiplier,
                                                           unsigned long long index) {
    return (index + base) * multiplier;
}

__device__ __forceinline__ unsigned char pattern_byte(unsigned long long base,
                                                      unsigned long long multiplier,
                                                      unsigned long long index) {
    return (unsigned char)(pattern_word(base, multiplier, index >> 3) >> (8 * (index & 7)));
}

// Whole words the aligned path covers: all of them when `bytes` is 8-byte aligned, else none.
__device__ __forceinline__ unsigned long long aligned_words(const void *bytes,
                                                            unsigned long long len) {
    return ((unsigned long long)bytes & 7) == 0 ? len / 8 : 0;
}

// Writes bytes [0, len) of the message at `dst` (grid-stride: any grid covers any length).
extern "C" __global__ void fill_pattern(unsigned char *dst, unsigned long long len,
                                        unsigned long long base, unsigned long long multiplier) {
    const unsigned long long thread = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long threads = gridDim.x * (unsigned long long)blockDim.x;
    const unsigned long long words = aligned_words(dst, len);
    unsigned long long *dst8 = (unsigned long long *)dst;
    for (unsigned long long i = thread; i < words; i += threads) {
        dst8[i] = pattern_word(base, multiplier, i);
    }
    for (unsigned long long b = words * 8 + thread; b < len; b += threads) {
        dst[b] = pattern_byte(base, multiplier, b);
    }
}

// Checks bytes [0, len) at `data` against the message. The first wrong byte, as (offset << 8) | the
// byte found, goes to *first by atomicMin (the host sets it to all ones first, meaning none): each
// thread stops at its own first wrong byte, which is its lowest, so one atomic per thread at most.
extern "C" __global__ void find_mismatch(const unsigned char *data, unsigned long long len,
                                         unsigned long long base, unsigned long long multiplier,
                                         unsigned long long *first) {
    const unsigned long long thread = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long threads = gridDim.x * (unsigned long long)blockDim.x;
    const unsigned long long words = aligned_words(data, len);
    const unsigned long long *data8 = (const unsigned long long *)data;
    unsigned long long found = ~0ull;
    for (unsigned long long i = thread; i < words; i += threads) {
        const unsigned long long word = data8[i];
        const unsigned long long wrong = word ^ pattern_word(base, multiplier, i);
        if (wrong != 0) {
            // The lowest differing byte of a little-endian word is the first in memory.
            const unsigned long long at = (unsigned long long)((__ffsll((long long)wrong) - 1) / 8);
            found = ((i * 8 + at) << 8) | ((word >> (8 * at)) & 0xff);
            break;
        }
    }
    if (found == ~0ull) {
        for (unsigned long long b = words * 8 + thread; b < len; b += threads) {
            if (data[b] != pattern_byte(base, multiplier, b)) {
                found = (b << 8) | data[b];
                break;
            }
        }
    }
    if (found != ~0ull) {
        atomicMin(first, found);
    }
}
