"""What only PyTorch tensors on real GPUs show; skipped without PyTorch or two GPUs (in CI too).

Run on a GPU host, after installing the wheel: ``python3 -m pytest python/tests/test_torch_gpu.py``.
"""

from __future__ import annotations

import gc

import pytest

import peerlink
from ranks import launch_ranks

torch = pytest.importorskip("torch")

two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs PyTorch with two GPUs",
)


@two_gpus
@pytest.mark.parametrize("current", [0, 1])
def test_peerlink_leaves_pytorchs_current_device_as_it_was(current: int) -> None:
    # peerlink makes each GPU's context current as it works; PyTorch's current device (the CUDA
    # context current on this thread) must be the one it was after every call.
    torch.cuda.set_device(current)
    with peerlink.Fabric(gpu=True) as fabric:
        assert torch.cuda.current_device() == current
        src = torch.arange(4096, dtype=torch.float32, device="cuda:1")
        dst = torch.zeros(4096, dtype=torch.float32, device="cuda:0")
        fabric.copy_(dst, src)
        assert torch.cuda.current_device() == current
        back = torch.zeros(4096, dtype=torch.float32, device="cuda:1")
        fabric.copy_many_([back], [dst])
        assert torch.cuda.current_device() == current
        tensors = [torch.full((1024,), float(d + 1), device=f"cuda:{d}") for d in (0, 1)]
        fabric.all_reduce_(tensors)
        assert torch.cuda.current_device() == current
        fabric.synchronize()
        assert torch.cuda.current_device() == current
        assert torch.equal(back.cpu(), src.cpu())
        assert all(bool((t == 3.0).all()) for t in tensors)
    assert torch.cuda.current_device() == current
    # The last holder of the backend releases its GPUs' contexts: that too leaves it as it was.
    del fabric
    gc.collect()
    assert torch.cuda.current_device() == current


@two_gpus
def test_tensors_of_empty_are_summed_across_processes_in_place() -> None:
    # Two processes, one GPU each: Fabric.empty's tensors, whole and a view, summed without copies.
    for rank, done in enumerate(launch_ranks("rank_torch_empty.py", 2, [])):
        assert done.returncode == 0, f"rank {rank}: {done.stderr}"
        assert done.stdout.count(f"rank {rank}:") == 3, done.stdout
