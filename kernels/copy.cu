// Copy kernel for peerlink's SM copies (compiled at run time by NVRTC).
//
// Moves `len` bytes from `src` to `dst`; either side may be a peer GPU's memory (peer access enabled)
// or mapped pinned host memory. When both pointers share their alignment modulo 16, the aligned middle
// moves as 16-byte (uint4) loads and stores and only the head and tail move byte by byte; otherwise
// every byte moves on its own. Grid-stride loops, so any grid size covers any length.

extern "C" __global__ void copy_bytes(unsigned char *dst, const unsigned char *src,
                                      unsigned long long len) {
    const unsigned long long thread = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long threads = gridDim.x * (unsigned long long)blockDim.x;
    const unsigned long long dst_misalign = (unsigned long long)dst & 15;
    const unsigned long long src_misalign = (unsigned long long)src & 15;

    if (dst_misalign != src_misalign) {
        for (unsigned long long i = thread; i < len; i += threads) {
            dst[i] = src[i];
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
        dst[thread] = src[thread];
    }
    uint4 *dst16 = (uint4 *)(dst + head);
    const uint4 *src16 = (const uint4 *)(src + head);
    for (unsigned long long i = thread; i < vectors; i += threads) {
        dst16[i] = src16[i];
    }
    if (tail + thread < len) {
        dst[tail + thread] = src[tail + thread];
    }
}
