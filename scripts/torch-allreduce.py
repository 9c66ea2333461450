#!/usr/bin/env python3
"""All-reduce through PyTorch, timed as nccl-tests and `peerlink workload all-reduce` time it.

Runs on a GPU host with the PyTorch its image already has (nothing is installed), one process per
GPU, as PyTorch's collectives need. For each size (4 B to 1 GiB in steps of 4x by default) and each
contender, every rank runs warm-up operations, then ITERS operations back to back between two CUDA
events on its current stream; the time per operation is the slowest rank's (end - start) / ITERS.
Every result is checked afterwards: each rank's input holds rank + 1 in every element (small
integers, exact in bf16 as in f32), so every element of the result must equal n (n + 1) / 2.

Contenders:
- nccl: `dist.all_reduce` (NCCL through the process group), its kernels queued one after another.
- nccl-graph: the same loop captured into one CUDA graph and replayed (no per-operation launch).
- symm-one-shot / symm-two-shot: PyTorch SymmetricMemory's `one_shot_all_reduce` and
  `two_shot_all_reduce_` over P2P (multicast off). A size the op refuses is recorded with its
  reason, not dropped silently.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1), as the lending
workplace requires. Writes one JSON document to --out and a table to stdout.
"""

import argparse
import json
import os
import sys

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402  (after the environment above)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

CONTENDERS = ("nccl", "nccl-graph", "symm-one-shot", "symm-two-shot")
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def default_sizes():
    return [4 << (2 * i) for i in range(15)]  # 4 B .. 1 GiB


def iterations(size, base):
    """Fewer operations at large sizes, so that the whole sweep stays within minutes."""
    if size >= 256 << 20:
        return max(2, base // 8)
    if size >= 16 << 20:
        return max(4, base // 4)
    return base


def make_op(contender, buf, group_name):
    """A callable that runs one all-reduce of `buf` (its result may be a new tensor)."""
    if contender in ("nccl", "nccl-graph"):
        return lambda: dist.all_reduce(buf)
    if contender == "symm-one-shot":
        return lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name)
    if contender == "symm-two-shot":
        return lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group_name)
    raise ValueError(contender)


def time_loop(op, iters, graph):
    """GPU time per operation of `iters` back-to-back operations on this rank, in microseconds."""
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                op()
        run = g.replay
    else:

        def run():
            for _ in range(iters):
                op()

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    dist.barrier()
    torch.cuda.synchronize()
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def rank_main(rank, world, args, port, queue):
    import torch.distributed._symmetric_memory as symm_mem

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    device = torch.device(f"cuda:{rank}")
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    group_name = dist.group.WORLD.group_name
    dtype = DTYPES[args.dtype]
    element = torch.tensor([], dtype=dtype).element_size()
    expected = world * (world + 1) // 2
    points = []
    for size in args.sizes:
        numel = max(1, size // element)
        for contender in args.contenders:
            point = {"bytes": numel * element, "contender": contender}
            try:
                if contender.startswith("symm"):
                    buf = symm_mem.empty(numel, dtype=dtype, device=device)
                    symm_mem.rendezvous(buf, group=dist.group.WORLD)
                else:
                    buf = torch.empty(numel, dtype=dtype, device=device)
                op = make_op(contender, buf, group_name)
                iters = iterations(size, args.iters)
                buf.fill_(rank + 1)
                for _ in range(args.warmup):
                    op()
                buf.fill_(1.0)  # sums of ones stay small over any number of in-place operations
                us = time_loop(op, iters, contender == "nccl-graph")
                slowest = torch.tensor([us], device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                # The check: one more operation on known inputs.
                buf.fill_(rank + 1)
                out = op()
                torch.cuda.synchronize()
                result = out if isinstance(out, torch.Tensor) else buf
                ok = bool((result.float() == expected).all())
                verified = torch.tensor([1 if ok else 0], device=device)
                dist.all_reduce(verified, op=dist.ReduceOp.MIN)
                us = float(slowest.item())
                algbw = point["bytes"] / us / 1e3
                point.update(
                    us=us,
                    iters=iters,
                    algbw_gbps=algbw,
                    busbw_gbps=algbw * 2 * (world - 1) / world,
                    verified=bool(verified.item()),
                )
                del buf, result, out
            except Exception as e:  # a size or a dtype the op refuses: say so
                point["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                torch.cuda.synchronize()
                dist.barrier()
            points.append(point)
        torch.cuda.empty_cache()
    if rank == 0:
        queue.put(points)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where to write the JSON")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--sizes", help="comma-separated byte counts (default 4 B .. 1 GiB, x4)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--port", type=int, default=29531)
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else default_sizes()
    args.contenders = args.contenders.split(",")
    if args.gpus < 2:
        sys.exit("torch-allreduce: needs two GPUs at least")

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args.gpus, args, args.port, queue)) for r in range(args.gpus)]
    for p in procs:
        p.start()
    points = queue.get()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"torch-allreduce: a rank exited with {p.exitcode}")

    doc = {
        "schema": "torch-allreduce/1",
        "tool": "scripts/torch-allreduce.py",
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "gpus": args.gpus,
        "dtype": args.dtype,
        "timing": "iters back-to-back operations between CUDA events per rank; the slowest rank's time / iters",
        "points": points,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{'bytes':>12} {'contender':>14} {'us/op':>10} {'busbw GB/s':>11}  verified")
    for p in points:
        if "error" in p:
            print(f"{p['bytes']:>12} {p['contender']:>14}  refused: {p['error']}")
        else:
            print(f"{p['bytes']:>12} {p['contender']:>14} {p['us']:>10.2f} {p['busbw_gbps']:>11.1f}  {p['verified']}")


if __name__ == "__main__":
    main()
