"""One rank's all-reduce sweep, as nccl-tests and `peerlink workload all-reduce` time it: shared by
scripts/torch-allreduce.py (PyTorch's all-reduces, processes of its own) and
python/benchmarks/torch_processes.py (peerlink's beside them, under a launcher).

For each size and contender, every rank runs warm-up operations, then ITERS operations issued from
Python back to back between two CUDA events on its current stream; the time per operation is the
slowest rank's (end - start) / ITERS. Each result is checked afterwards: every rank's input holds
rank + 1 in every element (small integers, exact in bf16 as in f32), so every element of the result
must equal n (n + 1) / 2.

Contenders, in place on one tensor per rank:
- peerlink: ``fabric.all_reduce_(tensor)`` on a ``peerlink.Fabric(processes=True)``, of an
  ordinary tensor (copied into and out of the memory the ranks shared, by the kernels that need it);
- peerlink-symm: the same, of a tensor in peerlink's symmetric memory (``fabric.empty``, one of the
  largest size made once, a view of its start per size): no copies;
- nccl: ``dist.all_reduce(tensor)`` (NCCL through the process group);
- nccl-graph: the same loop captured into one CUDA graph and replayed (no launch per operation);
- symm-one-shot / symm-two-shot: SymmetricMemory's ``one_shot_all_reduce`` and
  ``two_shot_all_reduce_`` over P2P, on tensors allocated in symmetric memory (``symm_mem.empty``),
  what they need. A size an op refuses is recorded with its reason, not dropped silently.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1), as the lending
workplace requires: import this module before torch.
"""

from __future__ import annotations

import os
from typing import Any, Callable

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402  (after the environment above)
import torch.distributed as dist  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

# What a rank measures beside a point, given the contender, the size and its tensor (or None).
Extra = Callable[[str, int, torch.Tensor], "dict[str, Any] | None"]


def default_sizes() -> list[int]:
    return [4 << (2 * i) for i in range(15)]  # 4 B .. 1 GiB


def parse_sizes(text: str | None) -> list[int]:
    """--sizes: comma-separated byte counts, or the default sweep."""
    return [int(s) for s in text.split(",")] if text else default_sizes()


def iterations(size: int, base: int) -> int:
    """Fewer operations at large sizes, so that the whole sweep stays within minutes."""
    if size >= 256 << 20:
        return max(2, base // 8)
    if size >= 16 << 20:
        return max(4, base // 4)
    return base


def make_op(contender: str, buf: torch.Tensor, group_name: str, fabric: Any = None) -> Callable[[], Any]:
    """A callable that runs one all-reduce of `buf` (its result may be a new tensor)."""
    if contender in ("peerlink", "peerlink-symm"):
        if fabric is None:
            raise ValueError("the peerlink contender needs a peerlink.Fabric(processes=True)")
        return lambda: fabric.all_reduce_(buf)
    if contender in ("nccl", "nccl-graph"):
        return lambda: dist.all_reduce(buf)
    if contender == "symm-one-shot":
        return lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name)
    if contender == "symm-two-shot":
        return lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group_name)
    raise ValueError(contender)


def time_loop(op: Callable[[], Any], iters: int, graph: bool) -> float:
    """GPU time per operation of `iters` back-to-back operations on this rank, µs."""
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                op()
        run = g.replay
    else:

        def run() -> None:
            for _ in range(iters):
                op()

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    dist.barrier()
    torch.cuda.current_stream().synchronize()
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def across_ranks(value: float, op: Any, device: torch.device) -> float:
    t = torch.tensor([value], device=device, dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return float(t.item())


def sweep(
    rank: int,
    world: int,
    device: torch.device,
    sizes: list[int],
    contenders: list[str],
    dtype_name: str,
    iters: int,
    warmup: int,
    fabric: Any = None,
    extra: Extra | None = None,
) -> list[dict[str, Any]]:
    """This rank's points (every rank runs the same sweep; the figures are the slowest rank's)."""
    import torch.distributed._symmetric_memory as symm_mem

    group_name = dist.group.WORLD.group_name
    dtype = DTYPES[dtype_name]
    element = torch.tensor([], dtype=dtype).element_size()
    expected = world * (world + 1) // 2
    points: list[dict[str, Any]] = []
    symmetric = None
    if "peerlink-symm" in contenders and fabric is not None:
        symmetric = fabric.empty(max(max(1, s // element) for s in sizes), dtype=dtype)
    for size in sizes:
        numel = max(1, size // element)
        for contender in contenders:
            point: dict[str, Any] = {"bytes": numel * element, "contender": contender}
            try:
                if contender.startswith("symm"):
                    buf = symm_mem.empty(numel, dtype=dtype, device=device)
                    symm_mem.rendezvous(buf, group=dist.group.WORLD)
                elif contender == "peerlink-symm" and symmetric is not None:
                    buf = symmetric[:numel]
                else:
                    buf = torch.empty(numel, dtype=dtype, device=device)
                op = make_op(contender, buf, group_name, fabric)
                timed = iterations(size, iters)
                buf.fill_(rank + 1)
                for _ in range(warmup):
                    op()
                buf.fill_(1.0)  # sums of ones stay small over any number of in-place operations
                us = time_loop(op, timed, contender == "nccl-graph")
                us = across_ranks(us, dist.ReduceOp.MAX, device)
                # The check: one more operation on known inputs.
                buf.fill_(rank + 1)
                out = op()
                torch.cuda.current_stream().synchronize()
                result = out if isinstance(out, torch.Tensor) else buf
                ok = bool((result.float() == expected).all())
                algbw = point["bytes"] / us / 1e3
                point.update(
                    us=us,
                    iters=timed,
                    algbw_gbps=algbw,
                    busbw_gbps=algbw * 2 * (world - 1) / world,
                    verified=across_ranks(1.0 if ok else 0.0, dist.ReduceOp.MIN, device) == 1.0,
                )
                more = extra(contender, size, buf) if extra else None
                if more:
                    point.update(more)
                del buf, result, out
            except Exception as e:  # a size or a dtype the op refuses: say so
                point["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                torch.cuda.current_stream().synchronize()
                dist.barrier()
            points.append(point)
        torch.cuda.empty_cache()
    return points


def print_table(points: list[dict[str, Any]]) -> None:
    """The points as a table; a point's host cost (``host``: µs per call from Python and from Rust)
    in a last column where it has one."""
    hosts = any("host" in p for p in points)
    print(f"{'bytes':>12} {'contender':>14} {'us/op':>10} {'busbw GB/s':>11}  verified" + ("  host py/rust us" if hosts else ""))
    for p in points:
        if "error" in p:
            print(f"{p['bytes']:>12} {p['contender']:>14}  refused: {p['error']}")
            continue
        host = p.get("host")
        cost = f"  {host['python_us']:.2f}/{host['rust_us']:.2f}" if host else ""
        print(f"{p['bytes']:>12} {p['contender']:>14} {p['us']:>10.2f} {p['busbw_gbps']:>11.1f}  {str(p['verified']):>8}{cost}")
