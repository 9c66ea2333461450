/* A stand-in for NCCL, built by the tests: each function writes its name and arguments as one line
 * to the file $STANDIN_LOG and returns $STANDIN_RESULT (0 when unset). It has no ncclCommShrink, so
 * that the forwarding library's answer to a missing symbol can be seen; built with -DLINK_ONLY it
 * has one, for linking the client against (the client then runs with the other). */
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
typedef void *cudaStream_t;

static int answer(void) {
    const char *value = getenv("STANDIN_RESULT");
    return value ? atoi(value) : 0;
}

#define RECORD(...)                                              \
    do {                                                         \
        FILE *log = fopen(getenv("STANDIN_LOG"), "a");           \
        if (log) { fprintf(log, __VA_ARGS__); fputc('\n', log); fclose(log); } \
    } while (0)

int ncclGetVersion(int *version) { *version = 22809; RECORD("ncclGetVersion"); return 0; }
const char *ncclGetErrorString(int result) { RECORD("ncclGetErrorString %d", result); return "stand-in error string"; }
const char *ncclGetLastError(ncclComm_t comm) { RECORD("ncclGetLastError %p", comm); return "stand-in last error"; }
int ncclGetUniqueId(ncclUniqueId *id) { id->internal[0] = 42; id->internal[127] = 7; RECORD("ncclGetUniqueId"); return answer(); }
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    *comm = (ncclComm_t)0xc0; RECORD("ncclCommInitRank %d id[0]=%d id[127]=%d rank=%d", nranks, id.internal[0], id.internal[127], rank);
    return answer();
}
int ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
    for (int i = 0; i < ndev; i++) comm[i] = (ncclComm_t)(0xd0 + (size_t)i);
    RECORD("ncclCommInitAll %d devlist[1]=%d", ndev, devlist ? devlist[1] : -1);
    return answer();
}
int ncclCommCount(ncclComm_t comm, int *count) { *count = 2; RECORD("ncclCommCount %p", comm); return 0; }
int ncclCommUserRank(ncclComm_t comm, int *rank) { *rank = 1; RECORD("ncclCommUserRank %p", comm); return 0; }
int ncclCommCuDevice(ncclComm_t comm, int *device) { *device = 3; RECORD("ncclCommCuDevice %p", comm); return 0; }
int ncclCommDestroy(ncclComm_t comm) { RECORD("ncclCommDestroy %p", comm); return answer(); }
int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, ncclComm_t comm, cudaStream_t stream) {
    RECORD("ncclAllReduce %p %p %zu %d %d %p %p", send, recv, count, type, op, comm, stream); return answer();
}
int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, ncclComm_t comm, cudaStream_t stream) {
    RECORD("ncclBroadcast %p %p %zu %d %d %p %p", send, recv, count, type, root, comm, stream); return answer();
}
int ncclReduce(const void *send, void *recv, size_t count, int type, int op, int root, ncclComm_t comm, cudaStream_t stream) {
    RECORD("ncclReduce %p %p %zu %d %d %d %p %p", send, recv, count, type, op, root, comm, stream); return answer();
}
int ncclSend(const void *send, size_t count, int type, int peer, ncclComm_t comm, cudaStream_t stream) {
    RECORD("ncclSend %p %zu %d %d %p %p", send, count, type, peer, comm, stream); return answer();
}
int ncclRecv(void *recv, size_t count, int type, int peer, ncclComm_t comm, cudaStream_t stream) {
    RECORD("ncclRecv %p %zu %d %d %p %p", recv, count, type, peer, comm, stream); return answer();
}
int ncclGroupStart(void) { RECORD("ncclGroupStart"); return answer(); }
int ncclGroupEnd(void) { RECORD("ncclGroupEnd"); return answer(); }
/* A trampoline's call with eight arguments, two on the stack: ncclCommRegister takes four; this
 * one, ncclRedOpCreatePreMulSum, five; ncclMemAlloc two. */
int ncclCommRegister(ncclComm_t comm, void *buff, size_t size, void **handle) {
    *handle = (void *)0xfeed; RECORD("ncclCommRegister %p %p %zu", comm, buff, size); return answer();
}
int ncclRedOpCreatePreMulSum(int *op, void *scalar, int type, int residence, ncclComm_t comm) {
    *op = 5; RECORD("ncclRedOpCreatePreMulSum %p %d %d %p", scalar, type, residence, comm); return answer();
}
int ncclMemAlloc(void **ptr, size_t size) { *ptr = (void *)0xa110c; RECORD("ncclMemAlloc %zu", size); return answer(); }
#ifdef LINK_ONLY
int ncclCommShrink(void) { return 0; }
#endif
