#!/usr/bin/env python3
"""peerlink's Python package against PyTorch on a GPU host, operation by operation (issue 18).

Runs with the PyTorch the GPU image has and the wheel scripts/gpu-build.sh builds
(``pip install --no-index gpu-carry/peerlink-*.whl``). At each size (4 B to 1 GiB, x4):

- copy: ``Fabric.copy_(dst, src)`` against ``dst.copy_(src, non_blocking=True)``, cuda:SRC to
  cuda:DST;
- all-reduce (f32, sum, one tensor per GPU on --gpus GPUs): ``Fabric.all_reduce_`` in this one
  process against torch.distributed's NCCL all-reduce (plain and CUDA-graph) and SymmetricMemory's
  one-shot and two-shot all-reduce, one process per GPU, as scripts/torch-allreduce.py runs them
  (it is run as a subprocess and its figures taken as they are);
- the Python layer's cost: the host time per call of ``Fabric.copy_`` / ``Fabric.all_reduce_``
  from Python against the same copies queued from Rust in the same process
  (``time_copy_device``), at sizes up to 1 MiB; the difference is what the Python layer adds.

Timing as scripts/torch-allreduce.py: ITERS operations back to back between two CUDA events on the
current stream of every GPU taking part; time per operation = the slowest GPU's span / ITERS;
the median of --runs such loops (the copies' two ways taking turns loop by loop). Every byte of every result is checked once per size and
contender (copy: the source's random bytes; all-reduce: rank r holds r + 1 everywhere, so every
element must be n (n + 1) / 2). Writes one JSON document to --out, a table to stdout, and exits 1
if any check failed.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402  (after the environment above)

import peerlink  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]


def default_sizes():
    return [4 << (2 * i) for i in range(15)]  # 4 B .. 1 GiB


def iterations(size, base):
    """Fewer operations at large sizes, so that the sweep stays within minutes (as
    scripts/torch-allreduce.py)."""
    if size >= 256 << 20:
        return max(2, base // 8)
    if size >= 16 << 20:
        return max(4, base // 4)
    return base


def time_per_op(op, devices, iters, runs, warmup):
    """Median over `runs` loops of the slowest device's GPU time per operation, µs."""
    return times_per_op({"op": op}, devices, iters, runs, warmup)["op"]


def times_per_op(ops, devices, iters, runs, warmup):
    """`time_per_op` of each of `ops` (name -> callable), their loops taking turns: the host's
    CPUs change speed from second to second (BENCHMARKS.md, 2026-11-30 latenight), so that a
    contender timed after another could meet another speed."""
    for op in ops.values():
        for _ in range(warmup):
            op()
    for d in devices:
        torch.cuda.synchronize(d)
    samples = {name: [] for name in ops}
    for _ in range(runs):
        for name, op in ops.items():
            starts, ends = [], []
            for d in devices:
                with torch.cuda.device(d):
                    starts.append(torch.cuda.Event(enable_timing=True))
                    starts[-1].record()
            for _ in range(iters):
                op()
            for d in devices:
                with torch.cuda.device(d):
                    ends.append(torch.cuda.Event(enable_timing=True))
                    ends[-1].record()
            for e in ends:
                e.synchronize()
            samples[name].append(max(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1000.0 / iters)
    return {name: statistics.median(values) for name, values in samples.items()}


def host_time_per_call(op, calls, devices):
    """Host time per call of `op`, µs, over `calls` calls queued back to back."""
    op()
    for d in devices:
        torch.cuda.synchronize(d)
    started = time.perf_counter()
    for _ in range(calls):
        op()
    elapsed = time.perf_counter() - started
    for d in devices:
        torch.cuda.synchronize(d)
    return elapsed * 1e6 / calls


def copies(fabric, src_gpu, dst_gpu, sizes, args):
    points, overhead = [], []
    for size in sizes:
        src = torch.randint(0, 256, (size,), dtype=torch.uint8, device=f"cuda:{src_gpu}")
        dst = torch.zeros(size, dtype=torch.uint8, device=f"cuda:{dst_gpu}")
        iters = iterations(size, args.iters)
        devices = sorted({src_gpu, dst_gpu})
        point = {"bytes": size, "iters": iters}
        ops = {
            "torch_us": lambda: dst.copy_(src, non_blocking=True),
            "peerlink_us": lambda: fabric.copy_(dst, src),
        }
        point.update(times_per_op(ops, devices, iters, args.runs, args.warmup))
        # Each way's bytes checked on their own, after a run of it alone into a cleared destination.
        for name, op in ops.items():
            dst.zero_()
            torch.cuda.synchronize(dst_gpu)
            op()
            for d in devices:
                torch.cuda.synchronize(d)
            point[name.replace("_us", "_verified")] = bool(torch.equal(dst, src.to(dst.device)))
        points.append(point)
        if size <= 1 << 20:
            found = [peerlink._describe(dst, "destination"), peerlink._describe(src, "source")]
            refs = [(found[0].ref, found[1].ref, size)]
            python_us = host_time_per_call(lambda: fabric.copy_(dst, src), args.calls, devices)
            rust_us = fabric._open().time_copy_device(refs, args.calls)
            for d in devices:
                torch.cuda.synchronize(d)
            overhead.append(
                {
                    "operation": "copy_",
                    "bytes": size,
                    "python_us_per_call": python_us,
                    "rust_us_per_call": rust_us,
                    "python_layer_us": python_us - rust_us,
                }
            )
        del src, dst
        torch.cuda.empty_cache()
    return points, overhead


def all_reduces(fabric, gpus, sizes, args):
    points, overhead = [], []
    world = len(gpus)
    expected = world * (world + 1) // 2
    for size in sizes:
        numel = max(1, size // 4)
        tensors = [torch.empty(numel, dtype=torch.float32, device=f"cuda:{g}") for g in gpus]
        iters = iterations(size, args.iters)

        def op():
            fabric.all_reduce_(tensors)

        for t in tensors:
            t.zero_()  # zeros stay zeros over any number of in-place sums
        point = {"bytes": numel * 4, "iters": iters}
        try:
            point["peerlink_us"] = time_per_op(op, gpus, iters, args.runs, args.warmup)
            for r, t in enumerate(tensors):
                t.fill_(r + 1)
            op()
            for g in gpus:
                torch.cuda.synchronize(g)
            point["peerlink_verified"] = all(bool((t == expected).all()) for t in tensors)
            if size <= 1 << 20:
                refs = [peerlink._describe(t, f"tensor {i}").ref for i, t in enumerate(tensors)]
                python_us = host_time_per_call(op, args.calls, gpus)
                rust_us = fabric._open().time_all_reduce_device(refs, numel * 4, "f32", args.calls)
                for g in gpus:
                    torch.cuda.synchronize(g)
                overhead.append(
                    {
                        "operation": "all_reduce_",
                        "bytes": numel * 4,
                        "python_us_per_call": python_us,
                        "rust_us_per_call": rust_us,
                        "python_layer_us": python_us - rust_us,
                    }
                )
        except peerlink.Error as e:
            point["error"] = str(e)
        points.append(point)
        del tensors
        torch.cuda.empty_cache()
    return points, overhead


def torch_all_reduces(gpus, sizes, args):
    """scripts/torch-allreduce.py's points at the same sizes (one process per GPU), and what went
    wrong. The graph-captured NCCL loop runs in processes of its own, as scripts/gpu-run.sh runs it,
    so that a capture that fails cannot leave the others' NCCL in a bad state."""
    points, errors = [], []
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)))
    for contenders, port in (("nccl,symm-one-shot,symm-two-shot", 29541), ("nccl-graph", 29543)):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "torch-allreduce.json")
            command = [
                sys.executable,
                str(REPO / "scripts" / "torch-allreduce.py"),
                "--out", out,
                "--gpus", str(len(gpus)),
                "--dtype", "f32",
                "--sizes", ",".join(map(str, sizes)),
                "--contenders", contenders,
                "--iters", str(args.iters),
                "--warmup", str(args.warmup),
                "--port", str(port),
            ]
            try:
                finished = subprocess.run(command, env=env, timeout=args.torch_timeout)
            except subprocess.TimeoutExpired:
                errors.append(f"{contenders}: scripts/torch-allreduce.py ran past {args.torch_timeout} s")
                continue
            if finished.returncode != 0:
                errors.append(f"{contenders}: scripts/torch-allreduce.py exited with {finished.returncode}")
                continue
            with open(out) as f:
                points.extend(json.load(f)["points"])
    return points, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where to write the JSON")
    ap.add_argument("--src", type=int, default=0)
    ap.add_argument("--dst", type=int, default=1)
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count(), help="GPUs of the all-reduce")
    ap.add_argument("--sizes", help="comma-separated byte counts (default 4 B .. 1 GiB, x4)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200, help="calls timed for the Python layer's cost")
    ap.add_argument("--resident", action="store_true", help="a fabric with resident workers")
    ap.add_argument("--skip-torch-allreduce", action="store_true")
    ap.add_argument("--torch-timeout", type=int, default=240, help="seconds for each torch-allreduce.py run")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else default_sizes()
    gpus = list(range(args.gpus))

    fabric = peerlink.Fabric(sorted(set(gpus) | {args.src, args.dst}), gpu=True, resident=args.resident)
    copy_points, copy_overhead = copies(fabric, args.src, args.dst, sizes, args)
    reduce_points, reduce_overhead = all_reduces(fabric, gpus, sizes, args) if len(gpus) >= 2 else ([], [])
    fabric.close()

    if args.skip_torch_allreduce or len(gpus) < 2:
        torch_points, torch_errors = [], ["not run"]
    else:
        torch_points, torch_errors = torch_all_reduces(gpus, sizes, args)
    by_size = {}
    for p in torch_points:
        by_size.setdefault(p["bytes"], {})[p["contender"]] = p
    for point in reduce_points:
        for contender, p in by_size.get(point["bytes"], {}).items():
            key = contender.replace("-", "_")
            point[f"{key}_us"] = p.get("us", p.get("error"))
            point[f"{key}_verified"] = p.get("verified")

    def slower(points, ours, others):
        found = []
        for p in points:
            theirs = [p[o] for o in others if isinstance(p.get(o), float)]
            if ours in p and theirs and p[ours] > min(theirs):
                found.append({"bytes": p["bytes"], "peerlink_us": p[ours], "best_other_us": min(theirs)})
        return found

    failed = [p for p in copy_points + reduce_points if any(k.endswith("verified") and v is False for k, v in p.items())]
    doc = {
        "schema": "peerlink.python-side-by-side/1",
        "tool": "python/benchmarks/torch_side_by_side.py",
        "device": torch.cuda.get_device_name(args.src),
        "torch": torch.__version__,
        "peerlink_source": fabric.source,
        "resident": args.resident,
        "src": args.src,
        "dst": args.dst,
        "gpus": gpus,
        "method": "iters operations back to back between CUDA events on every GPU taking part; the "
        f"slowest GPU's span / iters; median of {args.runs} loops after {args.warmup} warm-ups. "
        f"Python layer: host time per call over {args.calls} calls, Python against the same copies "
        "queued from Rust in this process",
        "copy": copy_points,
        "all_reduce": reduce_points,
        "torch_allreduce_errors": torch_errors,
        "python_layer": copy_overhead + reduce_overhead,
        "copy_slower_at": slower(copy_points, "peerlink_us", ["torch_us"]),
        "all_reduce_slower_at": slower(
            reduce_points, "peerlink_us", ["nccl_us", "nccl_graph_us", "symm_one_shot_us", "symm_two_shot_us"]
        ),
        "verification_failed": failed,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)

    print(f"{'bytes':>11} {'copy_ torch':>12} {'peerlink':>9}   {'all_reduce_ peerlink':>20} {'nccl':>8} {'symm 1s':>8} {'symm 2s':>8}")
    reduce_at = {p["bytes"]: p for p in reduce_points}
    for p in copy_points:
        r = reduce_at.get(p["bytes"], {})

        def us(v):
            return f"{v:8.2f}" if isinstance(v, float) else f"{'-':>8}"

        print(
            f"{p['bytes']:>11} {us(p['torch_us']):>12} {us(p['peerlink_us']):>9}   {us(r.get('peerlink_us')):>20} "
            f"{us(r.get('nccl_us'))} {us(r.get('symm_one_shot_us'))} {us(r.get('symm_two_shot_us'))}"
        )
    for o in doc["python_layer"]:
        print(f"python layer {o['operation']:<12} {o['bytes']:>8} B: {o['python_layer_us']:+.2f} µs per call "
              f"(Python {o['python_us_per_call']:.2f}, Rust {o['rust_us_per_call']:.2f})")
    if failed:
        print(f"VERIFICATION FAILED at {len(failed)} point(s): see verification_failed in {args.out}")
        sys.exit(1)


if __name__ == "__main__":
    main()
