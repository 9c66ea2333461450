// Issue 14: does a kernel on another stream run while a persistent kernel spins? Without a tool it
// must; the question is whether compute-sanitizer lets it (the resident worker's doorbell check
// holds a stream behind a spinning gate kernel while the worker's kernel runs, and did not finish
// under memcheck). A one-thread kernel spins until a flag is set or 5 s pass; a second kernel, on
// another non-blocking stream, sets the flag: first at its first launch (loaded beforehand, as
// peerlink loads its kernels), then at a later launch. Build and run on the GPU host, plain and
// under a tool:
//   nvcc -O2 -arch=sm_90 -o /tmp/concurrent scripts/experiments/concurrent.cu
//   /tmp/concurrent; compute-sanitizer --tool memcheck /tmp/concurrent
#include <cstdio>
#include <cuda_runtime.h>
#include <time.h>

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void spin(volatile unsigned int *flag, unsigned long long *waited) {
    const unsigned long long start = now_ns();
    while (*flag == 0 && now_ns() - start < 5000000000ull) {
    }
    *waited = now_ns() - start;
}

__global__ void release(volatile unsigned int *flag) { *flag = 1; }

// Spins until the host sets `flag` (mapped pinned memory) or 5 s pass.
__global__ void spin_for_host(volatile unsigned int *flag) {
    const unsigned long long start = now_ns();
    while (*flag == 0 && now_ns() - start < 5000000000ull) {
    }
}

int main() {
    unsigned int *flag;
    unsigned long long *waited;
    cudaMalloc(&flag, 4);
    cudaMemset(flag, 0, 4);
    cudaHostAlloc(&waited, 8, cudaHostAllocMapped);
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    // Both kernels loaded before either runs: loading a kernel (CUDA loads lazily, at first
    // launch) waits for the running ones, which would hold the second back by itself.
    cudaFuncAttributes attributes;
    cudaFuncGetAttributes(&attributes, spin);
    cudaFuncGetAttributes(&attributes, release);
    for (const char *launch : {"first", "second"}) {
        *waited = 0;
        spin<<<1, 1, 0, a>>>(flag, waited);
        release<<<1, 1, 0, b>>>(flag);
        cudaDeviceSynchronize();
        printf("the release's %s launch: spin waited %.3f ms: %s (%s)\n", launch, *waited / 1e6,
               *waited < 4000000000ull ? "it ran beside the spinning kernel" : "it waited for the spinning kernel",
               cudaGetErrorString(cudaGetLastError()));
        cudaMemset(flag, 0, 4);
        cudaDeviceSynchronize();
    }
    // Can a kernel *end*, as the host sees it, while another still runs? The spinning kernel now
    // waits for the host, which waits up to 2 s for the second kernel's stream to finish first:
    // the spinning kernel launched plainly, then as a cooperative launch (as the resident worker
    // is).
    unsigned int *host_flag;
    cudaHostAlloc(&host_flag, 4, cudaHostAllocMapped);
    cudaFuncGetAttributes(&attributes, spin_for_host);
    for (bool cooperative : {false, true}) {
        *(volatile unsigned int *)host_flag = 0;
        if (cooperative) {
            void *args[] = {&host_flag};
            cudaLaunchCooperativeKernel((void *)spin_for_host, dim3(1), dim3(1), args, 0, a);
        } else {
            spin_for_host<<<1, 1, 0, a>>>(host_flag);
        }
        release<<<1, 1, 0, b>>>(flag);
        bool ended = false;
        for (int i = 0; i < 2000 && !ended; ++i) {
            ended = cudaStreamQuery(b) == cudaSuccess;
            if (!ended) {
                struct timespec ms = {0, 1000000};
                nanosleep(&ms, nullptr);
            }
        }
        *(volatile unsigned int *)host_flag = 1;
        cudaDeviceSynchronize();
        printf("a kernel beside a spinning one launched %s %s (%s)\n",
               cooperative ? "cooperatively" : "plainly",
               ended ? "ended while the other still spun" : "had not ended after 2 s, while the other spun",
               cudaGetErrorString(cudaGetLastError()));
    }
    return 0;
}
