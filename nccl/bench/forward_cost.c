/* The host time a call costs through libpeerlink_nccl.so against calling NCCL directly, on one GPU.
 *
 *   forward_cost REAL_LIBNCCL OUR_LIBRARY [ROUNDS]
 *
 * Both libraries are loaded by path in one process (ours then forwards to that same NCCL, found
 * loaded), so both paths share one communicator. Each round times a batch of calls through each
 * path, in alternating order (direct first on even rounds, ours first on odd rounds); the figures
 * are per call: median, 10th and 90th percentile over the rounds, per path and per order.
 * Calls: ncclAllReduce of 4 bytes (GPU work; the stream is synchronised between batches, untimed),
 * ncclAllReduce of 0 elements (NCCL returns at once: no GPU work), and ncclCommCount (a call that
 * only answers). */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void *ncclComm_t;
typedef int (*InitAll)(ncclComm_t *, int, const int *);
typedef int (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
typedef int (*CommCount)(ncclComm_t, int *);

#define BATCH 100
enum { KINDS = 3, PATHS = 2, ORDERS = 2 };
static const char *KIND[KINDS] = {"ncclAllReduce 4 B", "ncclAllReduce 0 B (no GPU work)", "ncclCommCount"};
static const char *PATH[PATHS] = {"direct", "through libpeerlink_nccl"};

struct Api { AllReduce all_reduce; CommCount count; };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *symbol(void *library, const char *name) {
    void *address = dlsym(library, name);
    if (!address) { fprintf(stderr, "no %s: %s\n", name, dlerror()); exit(1); }
    return address;
}

/* One batch: nanoseconds per call. */
static double batch(struct Api *api, int kind, ncclComm_t comm, float *buffer, cudaStream_t stream) {
    int ranks = 0, failed = 0;
    double start = now();
    for (int i = 0; i < BATCH; i++) {
        if (kind == 0) failed |= api->all_reduce(buffer, buffer, 1, 7, 0, comm, stream);
        else if (kind == 1) failed |= api->all_reduce(buffer, buffer, 0, 7, 0, comm, stream);
        else failed |= api->count(comm, &ranks);
    }
    double per_call = (now() - start) / BATCH;
    if (failed) { fprintf(stderr, "a call failed\n"); exit(1); }
    cudaStreamSynchronize(stream);
    return per_call;
}

static int ascending(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: forward_cost REAL_LIBNCCL OUR_LIBRARY [ROUNDS]\n"); return 2; }
    int rounds = argc > 3 ? atoi(argv[3]) : 2000;
    void *real = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL), *ours = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!real || !ours) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    struct Api api[PATHS];
    void *libraries[PATHS] = {real, ours};
    for (int p = 0; p < PATHS; p++) {
        api[p].all_reduce = (AllReduce)symbol(libraries[p], "ncclAllReduce");
        api[p].count = (CommCount)symbol(libraries[p], "ncclCommCount");
    }
    ncclComm_t comm;
    int device = 0;
    if (((InitAll)symbol(real, "ncclCommInitAll"))(&comm, 1, &device)) { fprintf(stderr, "ncclCommInitAll failed\n"); return 1; }
    float *buffer;
    cudaStream_t stream;
    cudaMalloc((void **)&buffer, 4096);
    cudaStreamCreate(&stream);
    double *times = malloc(sizeof(double) * KINDS * PATHS * ORDERS * rounds);
#define AT(k, p, o, r) times[(((k) * PATHS + (p)) * ORDERS + (o)) * rounds + (r)]
    for (int kind = 0; kind < KINDS; kind++) {
        for (int warm = 0; warm < 50; warm++) { batch(&api[0], kind, comm, buffer, stream); batch(&api[1], kind, comm, buffer, stream); }
        for (int r = 0; r < rounds; r++) {
            int order = r % 2, first = order;  /* order 0: direct first; order 1: ours first */
            AT(kind, first, order, r / 2) = batch(&api[first], kind, comm, buffer, stream);
            AT(kind, 1 - first, order, r / 2) = batch(&api[1 - first], kind, comm, buffer, stream);
        }
    }
    int n = rounds / 2;
    printf("# forward_cost: host ns per call, %d batches of %d calls per path and order\n", n, BATCH);
    printf("%-32s %-26s %-12s %9s %9s %9s\n", "call", "path", "order", "median", "p10", "p90");
    for (int kind = 0; kind < KINDS; kind++) {
        double median[PATHS][ORDERS];
        for (int p = 0; p < PATHS; p++)
            for (int o = 0; o < ORDERS; o++) {
                double *x = &AT(kind, p, o, 0);
                qsort(x, n, sizeof(double), ascending);
                median[p][o] = x[n / 2];
                printf("%-32s %-26s %-12s %9.1f %9.1f %9.1f\n", KIND[kind], PATH[p],
                       o == 0 ? "direct-first" : "ours-first", x[n / 2], x[n / 10], x[n * 9 / 10]);
            }
        for (int o = 0; o < ORDERS; o++)
            printf("%-32s %-26s %-12s %+9.1f\n", KIND[kind], "cost of forwarding", o == 0 ? "direct-first" : "ours-first",
                   median[1][o] - median[0][o]);
    }
    return 0;
}
