// Latency probes: a dependent-load pointer chase and a two-kernel ping-pong.
// Relies on global_timer_ns() from spin.cu (the kernels are compiled as one program).

// Follows `steps` dependent loads through `chain` (u64 element indices, `elements` of them) starting at
// element 0, and stores the last index reached in `result`. __ldcv ("cache as volatile") keeps the
// load out of L1 and, for peer and host memory, fetches it again over the link, so each step costs one
// real round trip over the path to `chain`. In the GPU's own memory it acts like ld.cg: a chain that
// fits in L2 measures L2 (about 185 ns on an H200), not HBM. An index
// outside the chain stops the walk (it is stored, so the host can see the chain was bad) instead of
// faulting the context.
extern "C" __global__ void pointer_chase(const unsigned long long *chain,
                                         unsigned long long elements, unsigned int steps,
                                         unsigned long long *result) {
    unsigned long long index = 0;
    for (unsigned int step = 0; step < steps && index < elements; ++step) {
        index = __ldcv(chain + index);
    }
    *result = index;
}

// Waits until the local `flag` holds `round`; false if `timeout_ns` passed first.
__device__ bool wait_for_round(volatile unsigned int *flag, unsigned int round,
                               unsigned long long timeout_ns) {
    const unsigned long long start = global_timer_ns();
    while (*flag != round) {
        if (global_timer_ns() - start > timeout_ns) {
            return false;
        }
    }
    return true;
}

// Ping side: sends round r to the peer's flag, then waits for the answer in the local flag.
extern "C" __global__ void ping(volatile unsigned int *local_flag, volatile unsigned int *peer_flag,
                                unsigned int rounds, unsigned long long timeout_ns) {
    for (unsigned int round = 1; round <= rounds; ++round) {
        *peer_flag = round;
        __threadfence_system();
        if (!wait_for_round(local_flag, round, timeout_ns)) {
            return;
        }
    }
}

// Pong side: waits for round r in the local flag, then answers it into the peer's flag.
extern "C" __global__ void pong(volatile unsigned int *local_flag, volatile unsigned int *peer_flag,
                                unsigned int rounds, unsigned long long timeout_ns) {
    for (unsigned int round = 1; round <= rounds; ++round) {
        if (!wait_for_round(local_flag, round, timeout_ns)) {
            return;
        }
        *peer_flag = round;
        __threadfence_system();
    }
}
