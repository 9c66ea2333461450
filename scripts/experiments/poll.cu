// Issue 14: why does the resident dispatcher's poll take 2.6 µs where a dependent load through
// pinned host memory takes 1.1? One warp polls as the dispatcher does, one variant at a time, each
// round waiting for its loads; the GPU's clock times the rounds. Build and run on the GPU host:
//   nvcc -O2 -arch=sm_90 -o /tmp/poll scripts/experiments/poll.cu && /tmp/poll
#include <cstdio>
#include <cuda_runtime.h>

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ ulonglong2 ld_volatile_pair(const unsigned long long *p) {
    ulonglong2 v;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ ulonglong2 ld_relaxed_pair(const unsigned long long *p) {
    ulonglong2 v;
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long ld_acquire_gpu(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed_gpu(const unsigned long long *p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// variant: 0 one 16-B volatile load (lane 0); 1 lane 0 two 16-B loads of one slot; 2 as 1 plus
// lane 31 the control line (the dispatcher's poll); 3 as 2 plus 16 lanes' acquire loads of device
// progress words; 4 as 3 with relaxed device loads; 5 as 2 with ld.relaxed.sys; 6 all 32 lanes one
// 16-B load each of 32 slots.
__global__ void poll(const unsigned long long *host, const unsigned long long *device, int variant,
                     int rounds, unsigned long long *out) {
    const unsigned lane = threadIdx.x;
    unsigned long long sum = 0;
    const unsigned long long start = now_ns();
    for (int r = 0; r < rounds; ++r) {
        ulonglong2 a = {0, 0}, b = {0, 0};
        unsigned long long progress = 0;
        const unsigned long long *slot = host + 64 * (r % 8);  // lines apart, as a ring's slots
        const unsigned long long *control = host + 1024;
        switch (variant) {
        case 0:
            if (lane == 0) a = ld_volatile_pair(slot);
            break;
        case 1:
            if (lane == 0) { a = ld_volatile_pair(slot); b = ld_volatile_pair(slot + 2); }
            break;
        case 2: case 3: case 4: {
            const unsigned long long *w = lane == 0 ? slot : control;
            if (lane == 0 || lane == 31) { a = ld_volatile_pair(w); b = ld_volatile_pair(lane == 0 ? slot + 2 : w); }
            if (variant == 3 && lane < 16) progress = ld_acquire_gpu(device + lane);
            if (variant == 4 && lane < 16) progress = ld_relaxed_gpu(device + lane);
            break;
        }
        case 5: {
            const unsigned long long *w = lane == 0 ? slot : control;
            if (lane == 0 || lane == 31) { a = ld_relaxed_pair(w); b = ld_relaxed_pair(lane == 0 ? slot + 2 : w); }
            break;
        }
        case 6:
            a = ld_volatile_pair(host + 4 * lane);
            break;
        }
        // The round ends when every lane has its values (the ballot needs them).
        const unsigned long long v = a.x + a.y + b.x + b.y + progress;
        if (__ballot_sync(0xffffffffu, v == 12345678) != 0) sum += 1;
    }
    const unsigned long long took = now_ns() - start;
    if (lane == 0) { out[0] = took; out[1] = sum; }
}

int main() {
    unsigned long long *host, *host_dev, *device, *out;
    cudaSetDevice(0);
    cudaHostAlloc(&host, 1 << 20, cudaHostAllocMapped | cudaHostAllocPortable);
    cudaHostGetDevicePointer(&host_dev, host, 0);
    cudaMalloc(&device, 4096);
    cudaMemset(device, 0, 4096);
    cudaMallocHost(&out, 64);
    const char *names[] = {"one 16-B load", "a slot (two 16-B loads)", "slot + control line",
                           "+ 16 acquire device loads", "+ 16 relaxed device loads",
                           "slot + control, ld.relaxed.sys", "32 lanes, 32 slots"};
    const int rounds = 20000;
    for (int variant = 0; variant < 7; ++variant) {
        for (int rep = 0; rep < 2; ++rep) {
            poll<<<1, 32>>>(host_dev, device, variant, rounds, out);
            cudaDeviceSynchronize();
        }
        printf("%-34s %.3f µs per round\n", names[variant], out[0] / 1000.0 / rounds);
    }
    printf("%s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
}
