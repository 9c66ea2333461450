// Copy kernels for peerlink's SM copies (compiled at run time by NVRTC).
//
// Either side of a copy may be a peer GPU's memory (peer access enabled) or mapped pinned host
// memory. When source and destination share their alignment modulo 16, the aligned middle moves as
// 16-byte (uint4) loads and stores and only the head and tail move byte by byte; otherwise every byte
// moves on its own.

// One load of a copy. A kernel starts with L1 clean, so its copies load plainly; a persistent
// kernel (the resident worker) loads `Fresh`: __ldcv skips L1, which would still hold what an
// earlier transfer read there, and fetches host and peer memory again.
template <bool Fresh, typename T> __device__ __forceinline__ T copy_load(const T *p) {
    if (Fresh) {
        return __ldcv(p);
    }
    return *p;
}

// Copies `len` bytes with `threads` cooperating threads, this one being `thread` (needs threads >= 16).
template <bool Fresh>
__device__ void copy_range_loading(unsigned char *dst, const unsigned char *src,
                                   unsigned long long len, unsigned long long thread,
                                   unsigned long long threads) {
    const unsigned long long dst_misalign = (unsigned long long)dst & 15;
    const unsigned long long src_misalign = (unsigned long long)src & 15;

    if (dst_misalign != src_misalign) {
        for (unsigned long long i = thread; i < len; i += threads) {
            dst[i] = copy_load<Fresh>(src + i);
        }
        return;
    }

    unsigned long long head = (16 - dst_misalign) & 15;
    if (head > len) {
        head = len;
    }
    const unsigned long long vectors = (len - head) / 16;
    const unsigned long long tail = head + vectors * 16;

    if (thread < head) {
        dst[thread] = copy_load<Fresh>(src + thread);
    }
    uint4 *dst16 = (uint4 *)(dst + head);
    const uint4 *src16 = (const uint4 *)(src + head);
    // A persistent kernel's copies are a few threads wide (a warp, a worker's share of blocks),
    // so each thread keeps several loads in flight before it stores; a launched copy's grid is
    // wide enough with one.
    constexpr unsigned int in_flight = Fresh ? 8 : 1;
    for (unsigned long long base = thread; base < vectors; base += in_flight * threads) {
        uint4 loaded[in_flight];
#pragma unroll
        for (unsigned int k = 0; k < in_flight; ++k) {
            if (base + k * threads < vectors) {
                loaded[k] = copy_load<Fresh>(src16 + base + k * threads);
            }
        }
#pragma unroll
        for (unsigned int k = 0; k < in_flight; ++k) {
            if (base + k * threads < vectors) {
                dst16[base + k * threads] = loaded[k];
            }
        }
    }
    if (tail + thread < len) {
        dst[tail + thread] = copy_load<Fresh>(src + tail + thread);
    }
}

__device__ void copy_range(unsigned char *dst, const unsigned char *src, unsigned long long len,
                           unsigned long long thread, unsigned long long threads) {
    copy_range_loading<false>(dst, src, len, thread, threads);
}

// One copy spread over the whole grid (grid-stride, so any grid size covers any length).
extern "C" __global__ void copy_bytes(unsigned char *dst, const unsigned char *src,
                                      unsigned long long len) {
    copy_range(dst, src, len, blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x,
               gridDim.x * (unsigned long long)blockDim.x);
}

// One copy of a batch, as the host lays it out: three little-endian u64.
struct CopyDescriptor {
    unsigned long long dst;
    unsigned long long src;
    unsigned long long len;
};

// Many copies in one launch: a block per copy, blocks striding over the list if it is longer.
// The list may sit in mapped host memory: one thread reads each descriptor (one PCIe read per
// block, not one per warp) and shares it through shared memory.
extern "C" __global__ void copy_batch(const CopyDescriptor *copies, unsigned int count) {
    __shared__ CopyDescriptor copy;
    for (unsigned int i = blockIdx.x; i < count; i += gridDim.x) {
        if (threadIdx.x == 0) {
            copy = copies[i];
        }
        __syncthreads();
        copy_range((unsigned char *)copy.dst, (const unsigned char *)copy.src, copy.len,
                   threadIdx.x, blockDim.x);
        // Every thread is done with this descriptor before thread 0 loads the next.
        __syncthreads();
    }
}
