#!/usr/bin/env python3
"""What peerlink's Python layer adds to a Fabric call, against the same operation from Rust (issue 18).

Per operation and size, the host time per call over --calls calls, three ways:

- python: the public call (``Fabric.copy_(dst, src)``, ``copy_many_``, ``all_reduce_``), what a
  user pays;
- native: the extension's call on a description made once beforehand (``copy_device(refs)``,
  ``all_reduce_device(refs, ...)``): the crossing into Rust (argument conversion, the GIL released
  and taken back) and the Rust side;
- rust: the same operation queued from Rust in a loop (``time_copy_device``,
  ``time_all_reduce_device``): the Rust side alone.

``python - rust`` is what the Python layer adds (goal: at most 1 µs); ``python - native`` is the
description of the arguments in Python and Rust, ``native - rust`` the crossing.

Objects: peerlink's own device memory (``_native.DeviceBuffer``, through
``__cuda_array_interface__``), and PyTorch CUDA tensors where PyTorch and a GPU are there (--gpu).
On the simulator (the default, ``--sim PRESET``) the figures are this host CPU's time including
the simulator's own work: they are labelled simulated and tell only where the Python layer's time
goes, not what a GPU host pays. Calls run in chunks of --chunk, the fabric synchronised between
chunks (not timed), so that queued work does not pile up. Every result is byte-checked once.

Writes one JSON document to --out (when given) and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from typing import Any, Callable

import peerlink
from peerlink import _native


def per_call_us(op: Callable[[], object], calls: int, chunk: int, sync: Callable[[], None]) -> float:
    """Host µs per call of `op`, timed in chunks with `sync` between them."""
    op()
    sync()
    elapsed = 0.0
    done = 0
    while done < calls:
        n = min(chunk, calls - done)
        started = time.perf_counter()
        for _ in range(n):
            op()
        elapsed += time.perf_counter() - started
        sync()
        done += n
    return elapsed * 1e6 / calls


def rust_us(timed: Callable[[int], float], calls: int, chunk: int, sync: Callable[[], None]) -> float:
    """µs per call of a Rust loop that times itself, run in chunks with `sync` between them."""
    timed(1)
    sync()
    total = 0.0
    done = 0
    while done < calls:
        n = min(chunk, calls - done)
        total += timed(n) * n
        sync()
        done += n
    return total / calls


def buffers(fabric: peerlink.Fabric, kind: str, devices: list[int], nbytes: int) -> list[Any]:
    if kind == "torch":
        import torch

        return [torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{d}") for d in devices]
    return [_native.DeviceBuffer(fabric._host, d, nbytes) for d in devices]


def fill(obj: Any, data: bytes) -> None:
    if hasattr(obj, "write"):
        obj.write(data)
    else:
        import torch

        obj.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def contents(obj: Any) -> bytes:
    if hasattr(obj, "read"):
        data: bytes = obj.read()
        return data
    return bytes(obj.cpu().numpy().tobytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sim", default="dgx-h100", help="simulator preset (without --gpu)")
    ap.add_argument("--gpu", action="store_true", help="real GPUs, and PyTorch tensors where PyTorch is there")
    ap.add_argument("--sizes", default="4,4096,65536,1048576", help="comma-separated byte counts")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--chunk", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=4, help="pairs of copy_many_")
    ap.add_argument("--ranks", type=int, default=2, help="GPUs of the all-reduce")
    ap.add_argument("--out", help="where to write the JSON")
    args = ap.parse_args()

    fabric = peerlink.Fabric(gpu=True) if args.gpu else peerlink.Fabric(sim=args.sim)
    native = fabric._open()
    kinds = ["device-buffer"]
    if args.gpu:
        try:
            import torch  # noqa: F401

            kinds.append("torch")
        except ImportError:
            pass
    n = len(fabric.devices)
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for kind in kinds:
        for size in [int(s) for s in args.sizes.split(",")]:
            pattern = bytes((i * 7 + 3) % 256 for i in range(size))

            # copy_: GPU 0 to GPU 1.
            src, dst = buffers(fabric, kind, [0, 1 % n], size)
            fill(src, pattern)
            refs = [(peerlink._describe(dst, "destination").ref, peerlink._describe(src, "source").ref, size)]
            row = {
                "operation": "copy_",
                "objects": kind,
                "bytes": size,
                "python_us": per_call_us(lambda: fabric.copy_(dst, src), args.calls, args.chunk, fabric.synchronize),
                "native_us": per_call_us(lambda: native.copy_device(refs), args.calls, args.chunk, fabric.synchronize),
                "rust_us": rust_us(lambda c: native.time_copy_device(refs, c), args.calls, args.chunk, fabric.synchronize),
            }
            fabric.synchronize()
            if contents(dst) != pattern:
                failed.append(f"copy_ {kind} {size} B")
            rows.append(row)
            del src, dst

            # copy_many_: pair i from GPU i to GPU i + 1.
            pairs = min(args.pairs, n)
            srcs = buffers(fabric, kind, [i % n for i in range(pairs)], size)
            dsts = buffers(fabric, kind, [(i + 1) % n for i in range(pairs)], size)
            for s in srcs:
                fill(s, pattern)
            many = [
                (peerlink._describe(d, "destination").ref, peerlink._describe(s, "source").ref, size)
                for d, s in zip(dsts, srcs)
            ]
            rows.append(
                {
                    "operation": f"copy_many_ ({pairs} pairs)",
                    "objects": kind,
                    "bytes": size,
                    "python_us": per_call_us(lambda: fabric.copy_many_(dsts, srcs), args.calls, args.chunk, fabric.synchronize),
                    "native_us": per_call_us(lambda: native.copy_device(many), args.calls, args.chunk, fabric.synchronize),
                    "rust_us": rust_us(lambda c: native.time_copy_device(many, c), args.calls, args.chunk, fabric.synchronize),
                }
            )
            fabric.synchronize()
            if any(contents(d) != pattern for d in dsts):
                failed.append(f"copy_many_ {kind} {size} B")
            del srcs, dsts

            # all_reduce_ of f32 (zeros stay zeros over any number of sums; checked with 1s after).
            if size % 4 == 0 and args.ranks >= 2:
                tensors = buffers(fabric, kind, list(range(min(args.ranks, n))), size)
                if kind == "torch":
                    tensors = [t.view(sys.modules["torch"].float32) for t in tensors]
                ranks = [peerlink._describe(t, f"tensor {i}").ref for i, t in enumerate(tensors)]
                rows.append(
                    {
                        "operation": f"all_reduce_ ({len(tensors)} ranks)",
                        "objects": kind,
                        "bytes": size,
                        "python_us": per_call_us(
                            lambda: fabric.all_reduce_(tensors, dtype="f32"), args.calls, args.chunk, fabric.synchronize
                        ),
                        "native_us": per_call_us(
                            lambda: native.all_reduce_device(ranks, size, "f32"), args.calls, args.chunk, fabric.synchronize
                        ),
                        "rust_us": rust_us(
                            lambda c: native.time_all_reduce_device(ranks, size, "f32", c), args.calls, args.chunk,
                            fabric.synchronize,
                        ),
                    }
                )
                for t in tensors:
                    fill(t, struct.pack(f"<{size // 4}f", *([1.0] * (size // 4))))
                fabric.all_reduce_(tensors, dtype="f32")
                fabric.synchronize()
                expected = struct.pack(f"<{size // 4}f", *([float(len(tensors))] * (size // 4)))
                if any(contents(t) != expected for t in tensors):
                    failed.append(f"all_reduce_ {kind} {size} B")
                del tensors

    for row in rows:
        row["python_layer_us"] = row["python_us"] - row["rust_us"]
    doc = {
        "schema": "peerlink.python-layer/1",
        "tool": "python/benchmarks/python_layer.py",
        "source": fabric.source,
        "simulated": fabric.simulated,
        "calls": args.calls,
        "method": "host time per call (perf_counter) over `calls` calls in chunks of "
        f"{args.chunk}, the fabric synchronised between chunks (not timed); rust: the same "
        "operation queued from Rust in a loop timed by Rust",
        "rows": rows,
        "verification_failed": failed,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    label = " (SIMULATED host: host-CPU time incl. the simulator's work)" if fabric.simulated else ""
    print(f"peerlink Python layer, {fabric.source}{label}, µs per call over {args.calls} calls")
    print(f"{'operation':<26} {'objects':<14} {'bytes':>8} {'python':>8} {'native':>8} {'rust':>8} {'layer':>8}")
    for r in rows:
        print(
            f"{r['operation']:<26} {r['objects']:<14} {r['bytes']:>8} {r['python_us']:8.2f} {r['native_us']:8.2f} "
            f"{r['rust_us']:8.2f} {r['python_layer_us']:+8.2f}"
        )
    fabric.close()
    if failed:
        print(f"VERIFICATION FAILED: {failed}")
        sys.exit(1)


if __name__ == "__main__":
    main()
