#!/usr/bin/env python3
"""peerlink's all-reduce with one tensor per process, beside PyTorch's, as a training job runs it.

Run one process per GPU under a launcher, e.g. on a GPU host:

    python3 -m torch.distributed.run --nproc-per-node 2 python/benchmarks/torch_processes.py \\
        --out processes.json

Each rank opens ``peerlink.Fabric(processes=True)`` (peerlink's rendezvous on MASTER_PORT + 1,
beside torchrun's store) and torch.distributed's NCCL process group, and runs allreduce_sweep.py's
sweep (4 B to 1 GiB in steps of 4x by default; its timing, check and contenders are described
there): peerlink's ``fabric.all_reduce_(tensor)`` (the cost model's kernel) of an ordinary tensor
(the packet kernel reads it itself, the larger ones copy it into the buffer the ranks shared at the
start) and of a tensor in peerlink's symmetric memory (``fabric.empty``: no copies), beside
``dist.all_reduce`` and SymmetricMemory's one-shot and two-shot all-reduces.

It also times, on rank 0, the host cost of one ``all_reduce_`` from Python and of the same call from
Rust (``time_all_reduce_rank_device``), to show what the Python layer adds.

Writes one JSON document to --out (rank 0) and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import allreduce_sweep as sweep  # before torch: it keeps NVLink multicast off

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import peerlink  # noqa: E402

CONTENDERS = ("peerlink", "peerlink-symm", "nccl", "symm-one-shot", "symm-two-shot")


def host_cost(fabric: peerlink.Fabric, buf: torch.Tensor, calls: int, rounds: int = 5) -> dict[str, Any]:
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where rank 0 writes the JSON")
    ap.add_argument("--dtype", choices=sorted(sweep.DTYPES), default="f32")
    ap.add_argument("--sizes", help="comma-separated byte counts (default 4 B .. 1 GiB, x4)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--host-calls", type=int, default=200)
    args = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device(f"cuda:{local}")
    dist.init_process_group("nccl", device_id=device)
    contenders = args.contenders.split(",")
    ours = any(c.startswith("peerlink") for c in contenders)
    fabric = peerlink.Fabric(processes=True, gpu=True) if ours else None
    assert fabric is None or fabric.rank == rank, (fabric.rank, rank)

    def peerlink_host_cost(contender: str, size: int, buf: torch.Tensor) -> dict[str, Any] | None:
        if fabric is not None and contender.startswith("peerlink") and size <= 4 << 20:
            return {"host": host_cost(fabric, buf, args.host_calls)}
        return None

    points = sweep.sweep(
        rank,
        world,
        device,
        sweep.parse_sizes(args.sizes),
        contenders,
        args.dtype,
        args.iters,
        args.warmup,
        fabric=fabric,
        extra=peerlink_host_cost,
    )
    if fabric is not None:
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
        sweep.print_table(points)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
