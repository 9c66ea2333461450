# Issue 18 experiment: why was Fabric.copy_ slower than dst.copy_(src) from 16 KiB to 16 MiB (late call 6)?
# GPU time per op (200 back to back between events), host time per call, and one call then both GPUs
# synchronised, on the default streams and on side streams, torch and peerlink. On the GPU host:
#   pip install --no-index gpu-carry/peerlink-*.whl; python3 scripts/experiments/copy_streams.py
import statistics, sys, time, torch, peerlink

def gpu_per_op(op, devs, iters=200, runs=5):
    for _ in range(10): op()
    for d in devs: torch.cuda.synchronize(d)
    out = []
    for _ in range(runs):
        s = []; e = []
        for d in devs:
            with torch.cuda.device(d):
                s.append(torch.cuda.Event(enable_timing=True)); s[-1].record()
        for _ in range(iters): op()
        for d in devs:
            with torch.cuda.device(d):
                e.append(torch.cuda.Event(enable_timing=True)); e[-1].record()
        for x in e: x.synchronize()
        out.append(max(a.elapsed_time(b) for a, b in zip(s, e)) * 1000 / iters)
    return statistics.median(out)

def cpu_per_call(op, devs, calls=200):
    op()
    for d in devs: torch.cuda.synchronize(d)
    t = time.perf_counter()
    for _ in range(calls): op()
    el = time.perf_counter() - t
    for d in devs: torch.cuda.synchronize(d)
    return el * 1e6 / calls

def one_latency(op, devs, n=100):
    xs = []
    for _ in range(n):
        for d in devs: torch.cuda.synchronize(d)
        t = time.perf_counter(); op()
        for d in devs: torch.cuda.synchronize(d)
        xs.append((time.perf_counter() - t) * 1e6)
    return statistics.median(xs)

fab = peerlink.Fabric([0, 1], gpu=True)
devs = [0, 1]
print("size mode contender gpu_us cpu_us sync_latency_us")
for size in [4096, 65536, 262144, 1 << 20, 4 << 20]:
    src = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda:0")
    dst = torch.zeros(size, dtype=torch.uint8, device="cuda:1")
    for mode in ["default", "side"]:
        if mode == "side":
            s0 = torch.cuda.Stream(0); s1 = torch.cuda.Stream(1)
            torch.cuda.set_stream(s0); torch.cuda.set_stream(s1)
        for name, op in [("torch", lambda: dst.copy_(src, non_blocking=True)), ("peerlink", lambda: fab.copy_(dst, src))]:
            g = gpu_per_op(op, devs); c = cpu_per_call(op, devs); l = one_latency(op, devs)
            print(f"{size} {mode} {name} {g:.2f} {c:.2f} {l:.2f}", flush=True)
        if mode == "side":
            torch.cuda.set_stream(torch.cuda.default_stream(0)); torch.cuda.set_stream(torch.cuda.default_stream(1))
    assert torch.equal(dst.cpu(), src.cpu())
fab.close()
