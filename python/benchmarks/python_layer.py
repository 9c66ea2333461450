#!/usr/bin/env python3
"""What peerlink's Python layer adds to a Fabric call, against the same operation from Rust (issue 18).

Per operation and size, the host time per call over --calls calls, three ways:

- python: the public call (``Fabric.copy_(dst, src)``, ``copy_many_``, ``all_reduce_``), what a
  user pays;
- fast: the extension's fast path itself (``Fabric._native.copy_(dst, src)``, ...), without the
  public method's Python frame;
- native: the extension's call on a description made once beforehand (``copy_device(refs)``,
  ``all_reduce_device(refs, ...)``): the crossing into Rust (argument conversion, the GIL released
  and taken back) and the Rust side;
- rust: the same operation queued from Rust in a loop (``time_copy_device``,
  ``time_all_reduce_device``): the Rust side alone.

The four take turns, --chunk calls each, over --calls calls; each figure is its fastest chunk's
time per call (a busy spell of the host then spoils no figure, and none more than another).

``python - rust`` is what the Python layer adds (goal: at most 1 µs): ``python - fast`` is the public
method's Python frame, ``fast - native`` the description of the arguments (attribute reads of the
tensors, in Rust), ``native - rust`` the crossing.

Objects: peerlink's own device memory (``_native.DeviceBuffer``, through
``__cuda_array_interface__``), and PyTorch CUDA tensors where PyTorch and a GPU are there (--gpu).
On the simulator (the default, ``--sim PRESET``) the figures are this host CPU's time including
the simulator's own work: they are labelled simulated and tell only where the Python layer's time
goes, not what a GPU host pays. The fabric is synchronised between chunks (not timed), so that
queued work does not pile up. Every result is byte-checked once.

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


CLOCKS = {"wall": time.perf_counter_ns, "thread": time.thread_time_ns}


def chunk_us(op: Callable[[], object], calls: int, clock: Callable[[], int]) -> float:
    """Host µs per call of `op` over `calls` calls back to back, by `clock`."""
    started = clock()
    for _ in range(calls):
        op()
    return (clock() - started) / 1e3 / calls


def fastest_chunks(
    ways: dict[str, Callable[[int], float]], calls: int, chunk: int, sync: Callable[[], None]
) -> dict[str, float]:
    """Per way, the fastest chunk's µs per call: the ways take turns chunk by chunk (so that a
    busy spell of the host falls on all of them), `sync` between chunks, not timed."""
    for way in ways.values():
        way(1)
        sync()
    best = {name: float("inf") for name in ways}
    for _ in range(max(1, calls // chunk)):
        for name, way in ways.items():
            best[name] = min(best[name], way(chunk))
            sync()
    return best


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
    ap.add_argument("--calls", type=int, default=10000, help="calls of each way in all")
    # Small enough that a GPU's queue never fills within a chunk (the host would then wait for
    # the GPU, and the figure be the GPU's time, not the host's).
    ap.add_argument("--chunk", type=int, default=200, help="calls of one way back to back")
    ap.add_argument("--pairs", type=int, default=4, help="pairs of copy_many_")
    ap.add_argument("--ranks", type=int, default=2, help="GPUs of the all-reduce")
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: what a caller waits; thread: this thread's CPU time (steadier on a shared host)",
    )
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

    def measure(
        operation: str,
        kind: str,
        size: int,
        call: Callable[[], object],
        fast_call: Callable[[], object],
        native_call: Callable[[], object],
        rust_loop: Callable[[int], float],
    ) -> None:
        clock = CLOCKS[args.clock]
        ways = {
            "python_us": lambda c: chunk_us(call, c, clock),
            "fast_us": lambda c: chunk_us(fast_call, c, clock),
            "native_us": lambda c: chunk_us(native_call, c, clock),
            # The Rust loop times itself by the wall clock; by this thread's CPU time, from here.
            "rust_us": rust_loop if args.clock == "wall" else lambda c: chunk_us(lambda: rust_loop(c), 1, clock) / c,
        }
        row: dict[str, Any] = {"operation": operation, "objects": kind, "bytes": size}
        row.update(fastest_chunks(ways, args.calls, args.chunk, fabric.synchronize))
        rows.append(row)
        fabric.synchronize()

    for kind in kinds:
        for size in [int(s) for s in args.sizes.split(",")]:
            pattern = bytes((i * 7 + 3) % 256 for i in range(size))

            # copy_ (GPU 0 to GPU 1) and copy_many_ (pair i from GPU i to GPU i + 1).
            pairs = max(1, min(args.pairs, n))
            for operation, count in (("copy_", 1), (f"copy_many_ ({pairs} pairs)", pairs)):
                srcs = buffers(fabric, kind, [i % n for i in range(count)], size)
                dsts = buffers(fabric, kind, [(i + 1) % n for i in range(count)], size)
                for s in srcs:
                    fill(s, pattern)
                refs = [
                    (peerlink._describe(d, "destination").ref, peerlink._describe(s, "source").ref, size)
                    for d, s in zip(dsts, srcs)
                ]
                if count == 1:
                    call: Callable[[], object] = lambda: fabric.copy_(dsts[0], srcs[0])  # noqa: E731
                else:
                    call = lambda: fabric.copy_many_(dsts, srcs)  # noqa: E731
                if count == 1:
                    fast: Callable[[], object] = lambda: native.copy_(dsts[0], srcs[0])  # noqa: E731
                else:
                    fast = lambda: native.copy_many_(dsts, srcs)  # noqa: E731
                measure(
                    operation,
                    kind,
                    size,
                    call,
                    fast,
                    lambda: native.copy_device(refs),
                    lambda c: native.time_copy_device(refs, c),
                )
                if any(contents(d) != pattern for d in dsts):
                    failed.append(f"{operation} {kind} {size} B")
                del srcs, dsts

            # all_reduce_ of f32: zeros stay zeros over any number of sums; checked with ones after.
            if size % 4 == 0 and args.ranks >= 2:
                memory = buffers(fabric, kind, list(range(min(args.ranks, n))), size)
                tensors = memory
                if kind == "torch":
                    tensors = [t.view(sys.modules["torch"].float32) for t in memory]
                ranks = [peerlink._describe(t, f"tensor {i}").ref for i, t in enumerate(tensors)]
                measure(
                    f"all_reduce_ ({len(tensors)} ranks)",
                    kind,
                    size,
                    lambda: fabric.all_reduce_(tensors, dtype="f32"),
                    lambda: native.all_reduce_(tensors, "f32"),
                    lambda: native.all_reduce_device(ranks, size, "f32"),
                    lambda c: native.time_all_reduce_device(ranks, size, "f32", c),
                )
                ones = struct.pack(f"<{size // 4}f", *([1.0] * (size // 4)))
                for m in memory:
                    fill(m, ones)
                fabric.all_reduce_(tensors, dtype="f32")
                fabric.synchronize()
                expected = struct.pack(f"<{size // 4}f", *([float(len(tensors))] * (size // 4)))
                if any(contents(m) != expected for m in memory):
                    failed.append(f"all_reduce_ {kind} {size} B")
                del memory, tensors

    for row in rows:
        row["python_layer_us"] = row["python_us"] - row["rust_us"]
    doc = {
        "schema": "peerlink.python-layer/1",
        "tool": "python/benchmarks/python_layer.py",
        "peerlink_source": fabric.source,
        "simulated": fabric.simulated,
        "calls": args.calls,
        "clock": args.clock,
        "method": f"host time per call (perf_counter): the four ways take turns, {args.chunk} "
        "calls each, over `calls` calls; each figure is its fastest chunk's; the fabric "
        "synchronised between chunks (not timed); rust: the same operation queued from Rust in "
        "a loop timed by Rust",
        "rows": rows,
        "verification_failed": failed,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    label = " (SIMULATED host: host-CPU time incl. the simulator's work)" if fabric.simulated else ""
    print(
        f"peerlink Python layer, {fabric.source}{label}: µs per call ({args.clock} clock), fastest "
        f"chunk of {args.chunk}"
    )
    print(
        f"{'operation':<26} {'objects':<14} {'bytes':>8} {'python':>8} {'fast':>8} {'native':>8} {'rust':>8} "
        f"{'layer':>8}"
    )
    for r in rows:
        print(
            f"{r['operation']:<26} {r['objects']:<14} {r['bytes']:>8} {r['python_us']:8.2f} {r['fast_us']:8.2f} {r['native_us']:8.2f} "
            f"{r['rust_us']:8.2f} {r['python_layer_us']:+8.2f}"
        )
    fabric.close()
    if failed:
        print(f"VERIFICATION FAILED: {failed}")
        sys.exit(1)


if __name__ == "__main__":
    main()
