// Issue 11.6: how much one way between two GPUs can NVLink carry, by which engines? One copy
// engine pushing (GPU 0's, what `direct-ce` does) reaches ~396 GB/s of NV18's 450; do several
// streams (other copy engines), GPU 1's copy engine pulling part of it at the same time, or an SM
// kernel beside the copy engine carry more? Each variant moves N bytes GPU 0 -> GPU 1 in parts
// that start together (every stream waits for one event) and are timed from that event to the
// last part's end (GPU 0's stream waits for them all). Median of 9 runs after 2; every byte
// checked once per variant.
//   nvcc -O2 -arch=sm_90 -o /tmp/one_way scripts/experiments/one_way.cu && /tmp/one_way
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <string>
#include <vector>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        cudaError_t err_ = (call);                                                                \
        if (err_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s: %s (line %d)\n", #call, cudaGetErrorString(err_), __LINE__);     \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

// Grid-stride copy in 16-byte words; the kernel runs on the GPU whose stream it is launched on
// and reads or writes the other GPU's memory through peer access.
__global__ void sm_copy(int4 *dst, const int4 *src, size_t words) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

__global__ void fill(unsigned *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (unsigned)(i * 2654435761u) ^ seed;
}

__global__ void compare(const unsigned *a, const unsigned *b, size_t n, unsigned *bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (a[i] != b[i]) atomicAdd(bad, 1u);
}

enum Engine { PushCE, PullCE, PushSM, PullSM };

struct Part {
    Engine engine;
    double share;
};

struct Variant {
    std::string name;
    std::vector<Part> parts;
};

int main(int argc, char **argv) {
    const size_t sizes[] = {256ull << 20, 1ull << 30};
    CHECK(cudaSetDevice(1));
    CHECK(cudaDeviceEnablePeerAccess(0, 0));
    CHECK(cudaSetDevice(0));
    CHECK(cudaDeviceEnablePeerAccess(1, 0));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int streams_per_gpu = 4;
    cudaStream_t st[2][streams_per_gpu];
    cudaEvent_t ends[2][streams_per_gpu];
    for (int g = 0; g < 2; g++) {
        CHECK(cudaSetDevice(g));
        for (int k = 0; k < streams_per_gpu; k++) {
            CHECK(cudaStreamCreateWithFlags(&st[g][k], cudaStreamNonBlocking));
            CHECK(cudaEventCreateWithFlags(&ends[g][k], cudaEventDisableTiming));
        }
    }
    CHECK(cudaSetDevice(0));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));

    std::vector<Variant> variants = {
        {"push-ce x1", {{PushCE, 1}}},
        {"push-ce x2", {{PushCE, .5}, {PushCE, .5}}},
        {"push-ce x4", {{PushCE, .25}, {PushCE, .25}, {PushCE, .25}, {PushCE, .25}}},
        {"pull-ce x1", {{PullCE, 1}}},
        {"push-ce + pull-ce 50/50", {{PushCE, .5}, {PullCE, .5}}},
        {"push-ce + pull-ce 70/30", {{PushCE, .7}, {PullCE, .3}}},
        {"push-sm", {{PushSM, 1}}},
        {"pull-sm", {{PullSM, 1}}},
        {"push-ce + push-sm 70/30", {{PushCE, .7}, {PushSM, .3}}},
        {"push-ce + pull-sm 70/30", {{PushCE, .7}, {PullSM, .3}}},
        {"push-ce + pull-sm 85/15", {{PushCE, .85}, {PullSM, .15}}},
        {"push-ce + pull-ce + pull-sm 60/25/15", {{PushCE, .6}, {PullCE, .25}, {PullSM, .15}}},
    };
    for (size_t bytes : sizes) {
        void *src, *dst, *ref;
        unsigned *bad;
        CHECK(cudaSetDevice(0));
        CHECK(cudaMalloc(&src, bytes));
        fill<<<sms * 4, 512>>>((unsigned *)src, bytes / 4, 7);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaSetDevice(1));
        CHECK(cudaMalloc(&dst, bytes));
        CHECK(cudaMalloc(&ref, bytes));
        CHECK(cudaMalloc(&bad, 4));
        fill<<<sms * 4, 512>>>((unsigned *)ref, bytes / 4, 7);
        CHECK(cudaDeviceSynchronize());
        for (const Variant &v : variants) {
            std::vector<double> ms;
            for (int run = 0; run < 11; run++) {
                CHECK(cudaSetDevice(1));
                CHECK(cudaMemsetAsync(dst, 0, bytes, st[1][0]));
                CHECK(cudaStreamSynchronize(st[1][0]));
                CHECK(cudaSetDevice(0));
                CHECK(cudaEventRecord(start, st[0][0]));
                size_t offset = 0;
                int used[2] = {0, 0};
                std::vector<cudaEvent_t> waits;
                for (size_t p = 0; p < v.parts.size(); p++) {
                    const Part &part = v.parts[p];
                    size_t len = p + 1 == v.parts.size()
                                     ? bytes - offset
                                     : ((size_t)(bytes * part.share) & ~(size_t)0xFFFF);
                    int g = (part.engine == PushCE || part.engine == PushSM) ? 0 : 1;
                    int k = used[g]++;
                    cudaStream_t s = st[g][k];
                    CHECK(cudaSetDevice(g));
                    if (!(g == 0 && k == 0)) CHECK(cudaStreamWaitEvent(s, start, 0));
                    char *d = (char *)dst + offset;
                    const char *sp = (const char *)src + offset;
                    if (part.engine == PushCE || part.engine == PullCE)
                        CHECK(cudaMemcpyAsync(d, sp, len, cudaMemcpyDeviceToDevice, s));
                    else
                        sm_copy<<<sms * 2, 512, 0, s>>>((int4 *)d, (const int4 *)sp, len / 16);
                    if (!(g == 0 && k == 0)) {
                        CHECK(cudaEventRecord(ends[g][k], s));
                        waits.push_back(ends[g][k]);
                    }
                    offset += len;
                }
                CHECK(cudaSetDevice(0));
                for (cudaEvent_t e : waits) CHECK(cudaStreamWaitEvent(st[0][0], e, 0));
                CHECK(cudaEventRecord(stop, st[0][0]));
                CHECK(cudaEventSynchronize(stop));
                float t;
                CHECK(cudaEventElapsedTime(&t, start, stop));
                if (run >= 2) ms.push_back(t);
            }
            CHECK(cudaSetDevice(1));
            CHECK(cudaMemset(bad, 0, 4));
            compare<<<sms * 4, 512>>>((const unsigned *)dst, (const unsigned *)ref, bytes / 4, bad);
            unsigned nbad = 0;
            CHECK(cudaMemcpy(&nbad, bad, 4, cudaMemcpyDeviceToHost));
            std::sort(ms.begin(), ms.end());
            double med = ms[ms.size() / 2];
            printf("%5zu MiB  %-40s %8.1f us  %6.1f GB/s  (min %.1f max %.1f)  %s\n", bytes >> 20,
                   v.name.c_str(), med * 1e3, bytes / (med * 1e-3) / 1e9, ms.front() * 1e3,
                   ms.back() * 1e3, nbad ? "BYTES WRONG" : "every byte");
        }
        CHECK(cudaSetDevice(0));
        CHECK(cudaFree(src));
        CHECK(cudaSetDevice(1));
        CHECK(cudaFree(dst));
        CHECK(cudaFree(ref));
        CHECK(cudaFree(bad));
    }
    return 0;
}
