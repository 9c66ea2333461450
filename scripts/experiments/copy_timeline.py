# Issue 18 experiment: where does Fabric.copy_'s GPU time go against dst.copy_(src) between GPUs
# (late call 6 and latenight call 5: 18.9 against 13.5 µs per op at 256 KiB, on the default
# streams)? The CUDA activities of 50 back-to-back ops of each, from torch.profiler (CUPTI sees
# every copy and kernel of the process, peerlink's driver calls too): per activity name its count
# and GPU time, then the first ops' activities with start times. On the GPU host:
#   pip install --no-index gpu-carry/peerlink-*.whl; python3 scripts/experiments/copy_timeline.py
import sys
import torch
import peerlink
from torch.profiler import profile, ProfilerActivity

size = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 10
fab = peerlink.Fabric([0, 1], gpu=True)
src = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda:0")
dst = torch.zeros(size, dtype=torch.uint8, device="cuda:1")
for name, op in (("torch", lambda: dst.copy_(src, non_blocking=True)), ("peerlink", lambda: fab.copy_(dst, src))):
    for _ in range(20):
        op()
    torch.cuda.synchronize(0); torch.cuda.synchronize(1)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            op()
        torch.cuda.synchronize(0); torch.cuda.synchronize(1)
    print(f"== {name}, {size} B")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    gpu = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    t0 = gpu[0].time_range.start if gpu else 0
    for e in gpu[:16]:
        print(f"  {e.time_range.start - t0:9.2f} us  +{e.time_range.elapsed_us():7.2f}  dev {e.device_index}  {e.name}")
    assert torch.equal(dst.cpu(), src.cpu())
fab.close()
