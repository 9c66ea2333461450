// Issue 14: do a persistent kernel's "fresh" loads (__ldcv, which the resident worker's copies use
// so that L1 never serves an earlier transfer's bytes) keep several loads in flight per lane, or
// does each wait for the one before, as two volatile loads of pinned host memory did
// (scripts/experiments/poll.cu)? One warp, each lane K independent 16-byte loads of lines 4 KiB
// apart, then their sum; the GPU's clock times the rounds. Kinds: plain (ld.global), cv (__ldcv),
// cg (__ldcg, L2 only), volatile, relaxed.gpu; memory: this GPU's, the peer's (GPU 1, over
// NVLink), pinned host. Build and run on the GPU host:
//   nvcc -O2 -arch=sm_90 -o /tmp/loads scripts/experiments/loads.cu && /tmp/loads
#include <cstdio>
#include <cuda_runtime.h>

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ uint4 ld_volatile(const uint4 *p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ uint4 ld_relaxed_gpu(const uint4 *p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

template <int Kind> __device__ __forceinline__ uint4 load(const uint4 *p) {
    if (Kind == 0) return *p;
    if (Kind == 1) return __ldcv(p);
    if (Kind == 2) return __ldcg(p);
    if (Kind == 3) return ld_volatile(p);
    return ld_relaxed_gpu(p);
}

// Rounds of K loads per lane, a warp's load 512 contiguous bytes; a round's K loads 4 KiB apart,
// each round 32 KiB further on (so a 2 MiB page serves 64 rounds: translation stays cached, and
// the data does not, the walk covering far more than L2 before it wraps).
template <int Kind, int K>
__global__ void rounds(const uint4 *mem, unsigned long long lines, int n, unsigned long long *out) {
    const unsigned lane = threadIdx.x;
    unsigned int sum = 0;
    const unsigned long long start = now_ns();
    for (int r = 0; r < n; ++r) {
        uint4 v[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const unsigned long long line = ((unsigned long long)r * 2048 + k * 256 + lane) % lines;
            v[k] = load<Kind>(mem + line);
        }
#pragma unroll
        for (int k = 0; k < K; ++k) sum += v[k].x;
        __syncwarp();
    }
    const unsigned long long took = now_ns() - start;
    if (lane == 0) { out[0] = took; out[1] = sum; }
}

template <int Kind, int K> double time_ns(const uint4 *mem, unsigned long long lines, unsigned long long *out) {
    const int n = 2000;
    rounds<Kind, K><<<1, 32>>>(mem, lines, 50, out);
    cudaDeviceSynchronize();
    rounds<Kind, K><<<1, 32>>>(mem, lines, n, out);
    cudaDeviceSynchronize();
    return (double)out[0] / n;
}

template <int Kind> void row(const char *kind, const char *where, const uint4 *mem, unsigned long long lines, unsigned long long *out) {
    const double one = time_ns<Kind, 1>(mem, lines, out);
    const double eight = time_ns<Kind, 8>(mem, lines, out);
    printf("%-12s %-6s K=1 %7.1f ns  K=8 %7.1f ns  ratio %.2f (1: all in flight, 8: one after another)\n",
           kind, where, one, eight, eight / one);
}

// Eight warps of one block, lane 0 of each polling pinned host memory with volatile 16-byte loads,
// n rounds each: every warp the same line, or each its own line (128 bytes apart). If a line's
// reads are served one at a time, the first takes eight round trips a round, the second one.
__global__ void pollers(const unsigned long long *host, bool same_line, int n, unsigned long long *out) {
    const unsigned warp = threadIdx.x / 32;
    const unsigned long long *line = host + (same_line ? 0 : 16 * warp);
    unsigned long long sum = 0;
    const unsigned long long start = now_ns();
    for (int r = 0; r < n && threadIdx.x % 32 == 0; ++r) {
        ulonglong2 v;
        asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(line) : "memory");
        sum += v.x;
    }
    __syncthreads();
    if (threadIdx.x == 0) { out[0] = now_ns() - start; out[1] = sum; }
}

int main() {
    int gpus = 0;
    cudaGetDeviceCount(&gpus);
    const size_t bytes = 1ull << 30;
    unsigned long long *out;
    cudaSetDevice(0);
    cudaHostAlloc(&out, 64, cudaHostAllocMapped);
    uint4 *local, *peer = nullptr, *host;
    cudaMalloc(&local, bytes);
    cudaMemset(local, 1, bytes);
    cudaHostAlloc(&host, 64 << 20, cudaHostAllocMapped);
    if (gpus > 1) {
        cudaSetDevice(1);
        cudaMalloc(&peer, bytes);
        cudaMemset(peer, 1, bytes);
        cudaSetDevice(0);
        cudaDeviceEnablePeerAccess(1, 0);
    }
    struct Where { const char *name; const uint4 *mem; unsigned long long lines; };
    Where places[3] = {{"local", local, bytes / 16}, {"peer", peer, bytes / 16}, {"host", host, (64ull << 20) / 16}};
    for (const Where &w : places) {
        if (!w.mem) continue;
        row<0>("plain", w.name, w.mem, w.lines, out);
        row<1>("ldcv", w.name, w.mem, w.lines, out);
        row<2>("ldcg", w.name, w.mem, w.lines, out);
        row<3>("volatile", w.name, w.mem, w.lines, out);
        row<4>("relaxed.gpu", w.name, w.mem, w.lines, out);
    }
    for (int same = 1; same >= 0; --same) {
        pollers<<<1, 256>>>((const unsigned long long *)host, same, 100, out);
        cudaDeviceSynchronize();
        pollers<<<1, 256>>>((const unsigned long long *)host, same, 2000, out);
        cudaDeviceSynchronize();
        printf("eight warps polling %s: %.1f ns a round\n", same ? "one host line" : "a host line each", out[0] / 2000.0);
    }
    printf("%s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
}
