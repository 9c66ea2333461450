// Issue 11.3: why does e2e-latency (host clock from cuMemcpyAsync of 4 B GPU 0 -> 1 until
// cuEventSynchronize returns) agree within a process but differ by 10-16% from process to process?
// Three suspects, told apart here in one process:
//   time   - the host's state drifts over seconds (a process sees one slice of it);
//   CPU    - some vCPUs are slower than others (a process's thread stays on one);
//   state  - something the process or its context set up once (streams, events, mappings).
// Each round pins the thread to every CPU in turn and measures a block of transfers there, then one
// block unpinned on a stream made for that round; rounds are 300 ms apart. At the end a second
// context (cuCtxCreate) on GPU 0 measures again. Output: one line per block (round, cpu, medians),
// then per-CPU and per-round medians. Run several processes one after another and compare.
//   nvcc -O2 -o /tmp/e2e scripts/experiments/e2e.cu -lcuda && for i in 1 2 3 4; do /tmp/e2e; done
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        CUresult r = (call);                                                                   \
        if (r != CUDA_SUCCESS) {                                                               \
            const char *s = nullptr;                                                           \
            cuGetErrorString(r, &s);                                                           \
            fprintf(stderr, "%s failed: %s (line %d)\n", #call, s ? s : "?", __LINE__);        \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static double now_us() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

struct Block {
    double e2e, issue, record, sync;
};

// `n` transfers one at a time: the call, an event record, a wait for the event.
static Block measure(CUstream stream, CUdeviceptr dst, CUdeviceptr src, CUevent ev, int n) {
    std::vector<double> e2e, issue, record, sync;
    for (int i = 0; i < n + 5; i++) {
        double t0 = now_us();
        CHECK(cuMemcpyAsync(dst, src, 4, stream));
        double t1 = now_us();
        CHECK(cuEventRecord(ev, stream));
        double t2 = now_us();
        CHECK(cuEventSynchronize(ev));
        double t3 = now_us();
        if (i >= 5) {
            e2e.push_back(t3 - t0);
            issue.push_back(t1 - t0);
            record.push_back(t2 - t1);
            sync.push_back(t3 - t2);
        }
    }
    return {median(e2e), median(issue), median(record), median(sync)};
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

int main() {
    CHECK(cuInit(0));
    CUdevice d0, d1;
    CHECK(cuDeviceGet(&d0, 0));
    CHECK(cuDeviceGet(&d1, 1));
    CUcontext c0, c1;
    CHECK(cuDevicePrimaryCtxRetain(&c0, d0));
    CHECK(cuDevicePrimaryCtxRetain(&c1, d1));
    CHECK(cuCtxSetCurrent(c1));
    CUdeviceptr dst;
    CHECK(cuMemAlloc(&dst, 4096));
    CHECK(cuCtxSetCurrent(c0));
    CHECK(cuCtxEnablePeerAccess(c1, 0));
    CUdeviceptr src;
    CHECK(cuMemAlloc(&src, 4096));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUevent ev;
    CHECK(cuEventCreate(&ev, CU_EVENT_DEFAULT));

    cpu_set_t all;
    sched_getaffinity(0, sizeof all, &all);
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) cpus.push_back(c);

    const int rounds = 10, n = 200;
    std::vector<std::vector<double>> per_cpu(cpus.size());
    std::vector<double> per_round, fresh_stream;
    measure(stream, dst, src, ev, n); // first use
    for (int r = 0; r < rounds; r++) {
        std::vector<double> here;
        for (size_t k = 0; k < cpus.size(); k++) {
            pin(cpus[k]);
            Block b = measure(stream, dst, src, ev, n);
            per_cpu[k].push_back(b.e2e);
            here.push_back(b.e2e);
            printf("round %d cpu %2d e2e %6.2f issue %5.2f record %5.2f sync %5.2f\n", r, cpus[k],
                   b.e2e, b.issue, b.record, b.sync);
        }
        sched_setaffinity(0, sizeof all, &all);
        CUstream s2;
        CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
        Block b = measure(s2, dst, src, ev, n);
        CHECK(cuStreamDestroy(s2));
        fresh_stream.push_back(b.e2e);
        printf("round %d unpinned fresh-stream e2e %6.2f issue %5.2f record %5.2f sync %5.2f\n", r,
               b.e2e, b.issue, b.record, b.sync);
        per_round.push_back(median(here));
        usleep(300000);
    }
    // A second context on GPU 0 (not the primary one), its own stream and event.
    CUcontext extra;
    CHECK(cuCtxCreate(&extra, nullptr, 0, d0));
    CHECK(cuCtxEnablePeerAccess(c1, 0));
    CUstream s3;
    CHECK(cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING));
    CUevent ev3;
    CHECK(cuEventCreate(&ev3, CU_EVENT_DEFAULT));
    CUdeviceptr src3;
    CHECK(cuMemAlloc(&src3, 4096));
    measure(s3, dst, src3, ev3, n);
    Block b = measure(s3, dst, src3, ev3, n);
    printf("second-context e2e %6.2f issue %5.2f record %5.2f sync %5.2f\n", b.e2e, b.issue,
           b.record, b.sync);
    CHECK(cuCtxSetCurrent(c0));
    Block again = measure(stream, dst, src, ev, n);
    printf("primary-again e2e %6.2f issue %5.2f\n", again.e2e, again.issue);

    printf("summary per-cpu:");
    for (size_t k = 0; k < cpus.size(); k++) printf(" %d:%.2f", cpus[k], median(per_cpu[k]));
    printf("\nsummary per-round:");
    for (double v : per_round) printf(" %.2f", v);
    printf("\nsummary fresh-stream:");
    for (double v : fresh_stream) printf(" %.2f", v);
    printf("\n");
    return 0;
}
