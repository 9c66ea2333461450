#!/usr/bin/env python3
"""PyTorch peer copies and NCCL send/recv at the sizes of a peerlink engine sweep, side by side.

Runs on a GPU host with the PyTorch its image already has (nothing is installed). For each size:

- torch copy: `dst.copy_(src, non_blocking=True)` from cuda:SRC to cuda:DST, timed as peerlink times
  a transfer: an event recorded just before the call and one after it, on the source's current stream
  (so the CPU's cost of issuing the copy counts, as it does for peerlink); median of the runs.
- nccl send/recv: two processes (one per GPU) through torch.distributed; rank 0 sends, rank 1 sends
  back, and rank 0 times the round trip with events; one way = half of it; median of the runs. Needs two
  GPUs (skipped, and said so, on one).

With --peerlink FILE (the JSON of `peerlink --gpu plan --src SRC --dst DST --sizes ... --json`), prints a
table of the three and says at which sizes peerlink's pick is not at least as fast. Writes everything to
--out as JSON. NVLink multicast stays off (NCCL_NVLS_ENABLE=0, as the lending workplace requires).
"""

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402  (after the environment above)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def sizes_from(peerlink):
    return [p["bytes"] for p in peerlink["points"]]


def default_sizes():
    return [4 << (2 * i) for i in range(15)]  # 4 B .. 1 GiB, every factor of 4


def torch_copy(src_gpu, dst_gpu, sizes, warmup, runs):
    points = []
    for size in sizes:
        src = torch.randint(0, 256, (size,), dtype=torch.uint8, device=f"cuda:{src_gpu}")
        dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{dst_gpu}")
        with torch.cuda.device(src_gpu):
            times = []
            for run in range(warmup + runs):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                dst.copy_(src, non_blocking=True)
                end.record()
                end.synchronize()
                if run >= warmup:
                    times.append(start.elapsed_time(end) * 1000.0)
        if not torch.equal(dst.cpu(), src.cpu()):
            raise SystemExit(f"torch copy of {size} B delivered wrong bytes")
        points.append({"bytes": size, "us": statistics.median(times)})
        del src, dst
        torch.cuda.empty_cache()
    return points


def nccl_rank(rank, gpus, sizes, warmup, runs, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(gpus[rank])
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device(f"cuda:{gpus[rank]}"))
    peer = 1 - rank
    points = []
    for size in sizes:
        buf = torch.full((size,), rank + 1, dtype=torch.uint8, device="cuda")
        times = []
        for run in range(warmup + runs):
            dist.barrier()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if rank == 0:
                start.record()
                dist.send(buf, peer)
                dist.recv(buf, peer)
                end.record()
                end.synchronize()
                if run >= warmup:
                    times.append(start.elapsed_time(end) * 1000.0 / 2.0)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
                torch.cuda.synchronize()
        if rank == 0:
            if not bool((buf == 1).all()):
                raise SystemExit(f"nccl round trip of {size} B delivered wrong bytes")
            points.append({"bytes": size, "us": statistics.median(times)})
        del buf
    if rank == 0:
        queue.put(points)
    dist.destroy_process_group()


def nccl_sendrecv(gpus, sizes, warmup, runs, port):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=nccl_rank, args=(r, gpus, sizes, warmup, runs, port, queue))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    points = queue.get()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"an NCCL rank exited with {p.exitcode}")
    return points


def peerlink_pick_us(point):
    for t in point["measured"]:
        if t["strategy"] == point["pick"]:
            return t["measured_us"]
    raise SystemExit(f"peerlink JSON: no timing for the pick at {point['bytes']} B")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=int, default=0)
    ap.add_argument("--dst", type=int, default=1)
    ap.add_argument("--peerlink", help="JSON of `peerlink --gpu plan --src S --dst D --sizes ... --json`")
    ap.add_argument("--out", required=True, help="where to write the side-by-side JSON")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument(
        "--tolerance",
        type=float,
        default=0.01,
        help="peerlink counts as slower only beyond this fraction of the faster time (default 0.01: "
        "medians of the same copy differ by about that much from run to run)",
    )
    args = ap.parse_args()

    peerlink = None
    if args.peerlink:
        with open(args.peerlink) as f:
            peerlink = json.load(f)
        if (peerlink["src"], peerlink["dst"]) != (args.src, args.dst):
            raise SystemExit("the peerlink JSON is for another pair; pass the same --src and --dst")
    sizes = sizes_from(peerlink) if peerlink else default_sizes()
    count = torch.cuda.device_count()
    if max(args.src, args.dst) >= count:
        raise SystemExit(f"GPU {max(args.src, args.dst)} does not exist; this host has {count}")

    result = {
        "schema": "peerlink.side-by-side/1",
        "device": torch.cuda.get_device_name(args.src),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "src": args.src,
        "dst": args.dst,
        "method": "median GPU time between events recorded just before and after the call on the "
        f"issuing GPU, {args.runs} runs after {args.warmup} warm-ups; nccl: half a send/recv round trip",
        "torch_copy": torch_copy(args.src, args.dst, sizes, args.warmup, args.runs),
        "nccl_sendrecv": None,
        "nccl_note": None,
    }
    if args.src == args.dst:
        result["nccl_note"] = "not run: NCCL needs two GPUs (one rank each), and --src equals --dst"
    else:
        result["nccl_sendrecv"] = nccl_sendrecv([args.src, args.dst], sizes, args.warmup, args.runs, args.port)

    slower, ties = [], []
    if peerlink:
        print(f"{'size':>12} {'peerlink pick':>16} {'µs':>9} {'torch copy µs':>14} {'nccl µs':>9} {'ratio':>7}")
        for i, p in enumerate(peerlink["points"]):
            ours = peerlink_pick_us(p)
            theirs = [result["torch_copy"][i]["us"]]
            nccl = result["nccl_sendrecv"][i]["us"] if result["nccl_sendrecv"] else None
            if nccl is not None:
                theirs.append(nccl)
            ratio = ours / min(theirs)
            print(
                f"{p['bytes']:>12} {p['pick']:>16} {ours:>9.2f} {theirs[0]:>14.2f} "
                f"{'-' if nccl is None else format(nccl, '9.2f'):>9} {ratio:>7.3f}"
            )
            entry = {"bytes": p["bytes"], "peerlink_us": ours, "best_other_us": min(theirs)}
            if ratio > 1 + args.tolerance:
                slower.append(entry)
            elif ratio > 1:
                ties.append(entry)
        result["peerlink"] = {
            "source": args.peerlink,
            "tolerance": args.tolerance,
            "slower_at": slower,
            "within_tolerance_at": ties,
        }
        print(
            f"peerlink is slower beyond {args.tolerance:.0%} at {len(slower)} size(s): "
            f"{[s['bytes'] for s in slower]}; slower within it at {len(ties)}: {[t['bytes'] for t in ties]}"
        )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
