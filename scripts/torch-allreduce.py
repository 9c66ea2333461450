#!/usr/bin/env python3
"""All-reduce through PyTorch alone, timed as nccl-tests and `peerlink workload all-reduce` time it.

Runs on a GPU host with the PyTorch its image already has (nothing is installed; peerlink is not
needed), one process per GPU of its own (spawned), as PyTorch's collectives need. Each rank runs
python/benchmarks/allreduce_sweep.py's sweep (4 B to 1 GiB in steps of 4x by default; its timing,
its check of every element and the contenders nccl, nccl-graph, symm-one-shot and symm-two-shot are
described there). NVLink multicast stays off. Writes one JSON document to --out and a table to
stdout. (python/benchmarks/torch_processes.py runs the same sweep with peerlink's all-reduce
beside these, under a launcher.)
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python" / "benchmarks"))
import allreduce_sweep as sweep  # noqa: E402  (before torch: it keeps NVLink multicast off)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

CONTENDERS = ("nccl", "nccl-graph", "symm-one-shot", "symm-two-shot")


def rank_main(rank, world, args, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    device = torch.device(f"cuda:{rank}")
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    points = sweep.sweep(rank, world, device, args.sizes, args.contenders, args.dtype, args.iters, args.warmup)
    if rank == 0:
        queue.put(points)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where to write the JSON")
    ap.add_argument("--dtype", choices=sorted(sweep.DTYPES), default="f32")
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--sizes", help="comma-separated byte counts (default 4 B .. 1 GiB, x4)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--port", type=int, default=29531)
    args = ap.parse_args()
    args.sizes = sweep.parse_sizes(args.sizes)
    args.contenders = args.contenders.split(",")
    if any(c.startswith("peerlink") for c in args.contenders):
        sys.exit("torch-allreduce: PyTorch's all-reduces only; peerlink's beside them: python/benchmarks/torch_processes.py")
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
    sweep.print_table(points)


if __name__ == "__main__":
    main()
