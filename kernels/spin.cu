// Gate kernel: one thread that holds its stream until the host opens the gate.
//
// The host opens a gate by storing a ticket >= `ticket` into `flag` (pinned host memory, mapped). Tickets
// only grow, so a flag slot can be reused for a later gate without waking a kernel early. After
// `timeout_ns` of GPU time (%globaltimer) the kernel gives up, stores its ticket in `timed_out` so the
// host can tell, and lets the stream run on: a forgotten release cannot hang the GPU.

__device__ __forceinline__ unsigned long long global_timer_ns() {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    return now;
}

extern "C" __global__ void spin_until_released(volatile unsigned long long *flag,
                                               unsigned long long ticket,
                                               volatile unsigned long long *timed_out,
                                               unsigned long long timeout_ns) {
    const unsigned long long start = global_timer_ns();
    while (*flag < ticket) {
        if (global_timer_ns() - start > timeout_ns) {
            *timed_out = ticket;
            __threadfence_system();
            return;
        }
    }
}
