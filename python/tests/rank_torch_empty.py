"""One rank of test_torch_gpu's symmetric-memory test, started with a launcher's variables on a host
with two GPUs: tensors of ``Fabric.empty`` (f32 and bf16, whole and a view into them) summed across
the processes, every element checked and the rest of the memory checked untouched. Prints one line
per check."""

from __future__ import annotations

import importlib
from typing import Any

import peerlink

# Run only where PyTorch is (the GPU host); typed loosely so that mypy passes without it.
torch: Any = importlib.import_module("torch")


def main() -> None:
    with peerlink.Fabric(processes=True, gpu=True) as fabric:
        rank = fabric.rank
        world = fabric.world
        assert rank is not None and world is not None
        torch.cuda.set_device(rank)
        ranks_sum = world * (world - 1) // 2
        # 64 MiB of f32 (two-shot in place); a row 16 MiB in (a view at an offset).
        grads = fabric.empty(4, 1 << 22)
        assert grads.shape == (4, 1 << 22) and grads.dtype == torch.float32
        assert grads.device == torch.device("cuda", rank) and bool((grads == 0).all())
        base = torch.arange(grads.numel(), device=grads.device, dtype=torch.float32).view(grads.shape) % 251
        grads.copy_(base + rank)
        fabric.all_reduce_(grads[1])
        torch.cuda.current_stream().synchronize()
        assert torch.equal(grads[1], world * base[1] + ranks_sum), f"rank {rank}: row 1"
        for row in (0, 2, 3):
            assert torch.equal(grads[row], base[row] + rank), f"rank {rank}: row {row} changed"
        print(f"rank {rank}: f32 view checked", flush=True)
        fabric.all_reduce_(grads)
        torch.cuda.current_stream().synchronize()
        whole = world * base + ranks_sum
        whole[1] = world * whole[1]
        assert torch.equal(grads, whole), f"rank {rank}: the whole tensor"
        print(f"rank {rank}: f32 whole checked", flush=True)
        # Small bf16 (the packet kernel, which reads the tensor itself).
        small = fabric.empty((3, 5), dtype=torch.bfloat16)
        small.fill_(rank + 1)
        fabric.all_reduce_(small)
        torch.cuda.current_stream().synchronize()
        assert bool((small == world * (world + 1) // 2).all()), f"rank {rank}: bf16"
        print(f"rank {rank}: bf16 checked", flush=True)
        del grads, small  # their memory goes with the fabric


if __name__ == "__main__":
    main()
