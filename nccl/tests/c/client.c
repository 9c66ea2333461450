/* Calls NCCL's API with distinctive arguments and prints each call's result code, one line each:
 * linked against libnccl.so.2 (preloaded or LD_LIBRARY_PATH), or, built with -DBY_PATH, through
 * dlopen of the library named by argv[1] (as vLLM loads NCCL). */
#include <stdio.h>
#include <stddef.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
#define S (void *)0x5e00
#define R (void *)0x4e00
#define STREAM (void *)0x57

#ifdef BY_PATH
#include <dlfcn.h>
#define API(ret, name, params) static ret(*name) params;
#else
#define API(ret, name, params) ret name params;
#endif
API(int, ncclGetVersion, (int *))
API(int, ncclGetUniqueId, (ncclUniqueId *))
API(int, ncclCommInitRank, (ncclComm_t *, int, ncclUniqueId, int))
API(int, ncclCommInitAll, (ncclComm_t *, int, const int *))
API(int, ncclAllReduce, (const void *, void *, size_t, int, int, ncclComm_t, void *))
API(int, ncclBroadcast, (const void *, void *, size_t, int, int, ncclComm_t, void *))
API(int, ncclReduce, (const void *, void *, size_t, int, int, int, ncclComm_t, void *))
API(int, ncclSend, (const void *, size_t, int, int, ncclComm_t, void *))
API(int, ncclRecv, (void *, size_t, int, int, ncclComm_t, void *))
API(int, ncclGroupStart, (void))
API(int, ncclGroupEnd, (void))
API(int, ncclCommRegister, (ncclComm_t, void *, size_t, void **))
API(int, ncclRedOpCreatePreMulSum, (int *, void *, int, int, ncclComm_t))
API(int, ncclMemAlloc, (void **, size_t))
API(int, ncclCommShrink, (ncclComm_t, int *, int, ncclComm_t *, void *, int))
API(int, ncclCommDestroy, (ncclComm_t))
API(const char *, ncclGetErrorString, (int))
API(const char *, ncclGetLastError, (ncclComm_t))

int main(int argc, char **argv) {
#ifdef BY_PATH
    void *nccl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!nccl) { printf("dlopen failed: %s\n", dlerror()); return 1; }
#define LOAD(name) *(void **)&name = dlsym(nccl, #name); if (!name) { printf("no %s\n", #name); return 1; }
    LOAD(ncclGetVersion) LOAD(ncclGetUniqueId) LOAD(ncclCommInitRank) LOAD(ncclCommInitAll)
    LOAD(ncclAllReduce) LOAD(ncclBroadcast) LOAD(ncclReduce) LOAD(ncclSend) LOAD(ncclRecv)
    LOAD(ncclGroupStart) LOAD(ncclGroupEnd) LOAD(ncclCommRegister) LOAD(ncclRedOpCreatePreMulSum)
    LOAD(ncclMemAlloc) LOAD(ncclCommShrink) LOAD(ncclCommDestroy) LOAD(ncclGetErrorString)
    LOAD(ncclGetLastError)
#else
    (void)argc; (void)argv;
#endif
    int version = 0, op = 0, devs[2] = {4, 6};
    ncclUniqueId id; memset(&id, 0, sizeof id);
    ncclComm_t comm = 0, comms[2] = {0, 0}, shrunk = 0;
    void *handle = 0, *memory = 0;
    { int result = ncclGetVersion(&version); printf("ncclGetVersion %d %d\n", result, version); }
    { int result = ncclGetUniqueId(&id); printf("ncclGetUniqueId %d %d %d\n", result, id.internal[0], id.internal[127]); }
    { int result = ncclCommInitRank(&comm, 2, id, 1); printf("ncclCommInitRank %d %p\n", result, comm); }
    { int result = ncclCommInitAll(comms, 2, devs); printf("ncclCommInitAll %d %p %p\n", result, comms[0], comms[1]); }
    { int result = ncclGroupStart(); printf("ncclGroupStart %d\n", result); }
    { int result = ncclAllReduce(S, R, 1000003, 9, 4, comm, STREAM); printf("ncclAllReduce %d\n", result); }
    { int result = ncclBroadcast(S, R, 17, 7, 1, comm, STREAM); printf("ncclBroadcast %d\n", result); }
    { int result = ncclReduce(S, R, (size_t)1 << 33, 8, 2, 1, comm, STREAM); printf("ncclReduce %d\n", result); }
    { int result = ncclSend(S, 5, 0, 1, comm, STREAM); printf("ncclSend %d\n", result); }
    { int result = ncclRecv(R, 6, 1, 0, comm, STREAM); printf("ncclRecv %d\n", result); }
    { int result = ncclGroupEnd(); printf("ncclGroupEnd %d\n", result); }
    { int result = ncclCommRegister(comm, R, 4096, &handle); printf("ncclCommRegister %d %p\n", result, handle); }
    { int result = ncclRedOpCreatePreMulSum(&op, S, 7, 1, comm); printf("ncclRedOpCreatePreMulSum %d %d\n", result, op); }
    { int result = ncclMemAlloc(&memory, 1 << 20); printf("ncclMemAlloc %d %p\n", result, memory); }
    { int result = ncclCommShrink(comm, 0, 0, &shrunk, 0, 0); printf("ncclCommShrink %d\n", result); }
    printf("ncclGetErrorString %s\n", ncclGetErrorString(3));
    printf("ncclGetLastError %s\n", ncclGetLastError(comm));
    { int result = ncclCommDestroy(comm); printf("ncclCommDestroy %d\n", result); }
    return 0;
}
