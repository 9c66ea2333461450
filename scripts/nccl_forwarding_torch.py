"""torch.distributed through libpeerlink_nccl.so, world size 1: dist.all_reduce eager and captured in
a CUDA graph (replayed, and replayed again after a larger call), and one DDP step; each result
checked. Run it with the library preloaded:

    LD_PRELOAD=$(python3 -c 'import peerlink; print(peerlink.nccl_library())') \\
        PEERLINK_NCCL_DEBUG=INFO python3 scripts/nccl_forwarding_torch.py

PEERLINK_NCCL_DEBUG=INFO makes the library print, at exit, how many calls it forwarded.
"""

import os

import torch
import torch.distributed as dist


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))

    eager = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    dist.all_reduce(eager)
    torch.cuda.synchronize()
    assert torch.equal(eager, torch.arange(1 << 20, device="cuda", dtype=torch.float32))
    print("eager all_reduce: right")

    # 512 KiB: larger than the packet kernel takes, so the served call goes through the library's
    # shared buffer.
    captured = torch.ones(1 << 18, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dist.all_reduce(captured)  # warm-up on the capture stream, outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        dist.all_reduce(captured)
        captured.mul_(2)
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.all(captured == 2**10).item(), captured[:4]
    print("all_reduce captured in a CUDA graph, 10 replays: right")

    # A larger eager call (16 MiB, beyond the 4 MiB above) grows the library's shared buffer; the
    # graph, captured on the old one, must still replay right (vLLM's order: decode steps
    # captured, then a larger prefill, then replays).
    large = torch.ones(1 << 22, device="cuda", dtype=torch.float32)
    dist.all_reduce(large)
    torch.cuda.synchronize()
    assert torch.all(large == 1).item()
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.all(captured == 2**12).item(), captured[:4]
    print("the graph replayed after a larger call grew the buffers: right")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8)).cuda()
    reference = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8)).cuda()
    reference.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    batch = torch.randn(64, 256, device="cuda")
    for net in (ddp, reference):
        net(batch).square().mean().backward()
    for ours, theirs in zip(ddp.module.parameters(), reference.parameters()):
        assert ours.grad is not None and theirs.grad is not None
        assert torch.allclose(ours.grad, theirs.grad), "DDP's gradients differ from one process's"
    print("DDP step: gradients equal one process's")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
