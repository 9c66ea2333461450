#!/usr/bin/env python3
"""peerlink's all-reduce with one tensor per process, beside PyTorch's, as a training job runs it.

Run one process per GPU under a launcher, e.g. on a GPU host:

    python3 -m torch.distributed.run --nproc-per-node 2 python/benchmarks/torch_processes.py \\
        --out processes.json

Each rank opens ``peerlink.Fabric(processes=True)`` (peerlink's rendezvous on MASTER_PORT + 1,
beside torchrun's store) and torch.distributed's NCCL process group. For each size (4 B to 1 GiB
in steps of 4x by default) and contender, every rank runs warm-up operations, then ITERS
operations issued from Python back to back between two CUDA events on its current stream; the
time per operation is the slowest rank's (end - start) / ITERS. Each result is checked afterwards:
every rank's input holds rank + 1 in every element, so every element must equal n (n + 1) / 2.

Contenders, all in place on one tensor per rank:
- peerlink: ``fabric.all_reduce_(tensor)`` (the cost model's kernel; the packet kernel reads the
  tensor itself, the larger ones copy it into the buffer the ranks shared at the start);
- nccl: ``dist.all_reduce(tensor)``;
- symm-one-shot / symm-two-shot: SymmetricMemory's ``one_shot_all_reduce`` and
  ``two_shot_all_reduce_``, on tensors allocated in symmetric memory (``symm_mem.empty``) — what
  they need, and no copy in — with multicast off.

It also times, on rank 0, the host cost of one ``all_reduce_`` from Python and of the same call from
Rust (``time_all_reduce_rank_device``), to show what the Python layer adds.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1), as the lending
workplace requires. Writes one JSON document to --out (rank 0) and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402  (after the environment above)
import torch.distributed as dist  # noqa: E402

import peerlink  # noqa: E402

CONTENDERS = ("peerlink", "nccl", "symm-one-shot", "symm-two-shot")
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def default_sizes() -> list[int]:
    return [4 << (2 * i) for i in range(15)]  # 4 B .. 1 GiB


def iterations(size: int, base: int) -> int:
    """Fewer operations at large sizes, so that the whole sweep stays within minutes."""
    if size >= 256 << 20:
        return max(2, base // 8)
    if size >= 16 << 20:
        return max(4, base // 4)
    return base


def make_op(contender, fabric, buf, group_name):
    if contender == "peerlink":
        return lambda: fabric.all_reduce_(buf)
    if contender == "nccl":
        return lambda: dist.all_reduce(buf)
    if contender == "symm-one-shot":
        return lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name)
    if contender == "symm-two-shot":
        return lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group_name)
    raise ValueError(contender)


def time_loop(op, iters: int) -> float:
    """GPU time per operation of `iters` back-to-back operations on this rank, µs."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    dist.barrier()
    torch.cuda.current_stream().synchronize()
    start.record()
    for _ in range(iters):
        op()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def slowest(value: float, device) -> float:
    t = torch.tensor([value], device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def host_cost(fabric, buf, calls: int, rounds: int = 5) -> dict:
    """Host µs per all_reduce_ issued from Python and per the same call issued from Rust, on this
    rank: the median of `rounds` rounds of `calls` calls each, the two ways taking turns (every
    rank runs the same rounds: each call's kernel meets the peers'). `calls` stays below what the
    GPU's launch queue holds, so the host never waits for the GPU within a round."""
    ref = (buf.data_ptr(), buf.get_device(), torch.cuda.current_stream().cuda_stream)
    dtype = "f32" if buf.dtype == torch.float32 else "bf16"
    python, rust = [], []
    for _ in range(rounds):
        dist.barrier()
        began = time.perf_counter()
        for _ in range(calls):
            fabric.all_reduce_(buf)
        python.append((time.perf_counter() - began) * 1e6 / calls)
        torch.cuda.current_stream().synchronize()
        dist.barrier()
        rust.append(fabric._native.time_all_reduce_rank_device(ref, buf.nbytes, dtype, calls))
        torch.cuda.current_stream().synchronize()
    return {"python_us": sorted(python)[rounds // 2], "rust_us": sorted(rust)[rounds // 2], "calls": calls}


def main() -> None:
    import torch.distributed._symmetric_memory as symm_mem

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where rank 0 writes the JSON")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--sizes", help="comma-separated byte counts (default 4 B .. 1 GiB, x4)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--host-calls", type=int, default=200)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else default_sizes()
    contenders = args.contenders.split(",")

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device(f"cuda:{local}")
    dist.init_process_group("nccl", device_id=device)
    group_name = dist.group.WORLD.group_name
    fabric = peerlink.Fabric(processes=True, gpu=True)
    assert fabric.rank == rank, (fabric.rank, rank)
    dtype = DTYPES[args.dtype]
    element = torch.tensor([], dtype=dtype).element_size()
    expected = world * (world + 1) // 2
    points = []
    for size in sizes:
        numel = max(1, size // element)
        for contender in contenders:
            point = {"bytes": numel * element, "contender": contender}
            try:
                if contender.startswith("symm"):
                    buf = symm_mem.empty(numel, dtype=dtype, device=device)
                    symm_mem.rendezvous(buf, group=dist.group.WORLD)
                else:
                    buf = torch.empty(numel, dtype=dtype, device=device)
                op = make_op(contender, fabric, buf, group_name)
                iters = iterations(size, args.iters)
                buf.fill_(rank + 1)
                for _ in range(args.warmup):
                    op()
                buf.fill_(1.0)
                us = slowest(time_loop(op, iters), device)
                buf.fill_(rank + 1)
                out = op()
                torch.cuda.current_stream().synchronize()
                result = out if isinstance(out, torch.Tensor) else buf
                ok = bool((result.float() == expected).all())
                verified = torch.tensor([1 if ok else 0], device=device)
                dist.all_reduce(verified, op=dist.ReduceOp.MIN)
                algbw = point["bytes"] / us / 1e3
                point.update(
                    us=us,
                    iters=iters,
                    algbw_gbps=algbw,
                    busbw_gbps=algbw * 2 * (world - 1) / world,
                    verified=bool(verified.item()),
                )
                if contender == "peerlink" and size <= 4 << 20:
                    point["host"] = host_cost(fabric, buf, args.host_calls)
                del buf, result, out
            except Exception as e:  # a size the op refuses: say so
                point["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                torch.cuda.current_stream().synchronize()
                dist.barrier()
            points.append(point)
        torch.cuda.empty_cache()
    fabric.close()
    if rank == 0:
        doc = {
            "schema": "peerlink-python-processes/1",
            "tool": "python/benchmarks/torch_processes.py",
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "world": world,
            "dtype": args.dtype,
            "timing": "iters back-to-back operations issued from Python between CUDA events per "
            "rank; the slowest rank's time / iters; host: rank 0's host µs per call, from Python "
            "and from Rust",
            "points": points,
        }
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"{'bytes':>12} {'contender':>14} {'us/op':>10} {'busbw GB/s':>11}  verified  host py/rust us")
        for p in points:
            if "error" in p:
                print(f"{p['bytes']:>12} {p['contender']:>14}  refused: {p['error']}")
                continue
            host = p.get("host")
            cost = f"{host['python_us']:.2f}/{host['rust_us']:.2f}" if host else ""
            print(f"{p['bytes']:>12} {p['contender']:>14} {p['us']:>10.2f} {p['busbw_gbps']:>11.1f}  {str(p['verified']):>8}  {cost}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
