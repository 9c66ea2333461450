"""One rank of the all-reduce across processes, on the simulator: started by
test_all_reduce_across_processes with a launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK, …).

Each call sums small whole numbers, so every sum is exact: the rank checks every element of its
result, through host buffers (written back) and through its simulated device memory lent by
address (the CUDA-tensor path, queued on a stream). Prints one line per call it checked.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

import peerlink
from peerlink import _native


def values(rank: int, call: int, elements: int) -> np.ndarray:
    return ((np.arange(elements) * 7 + rank * 13 + call * 3) % 101).astype(np.float32)


def main() -> None:
    warnings.simplefilter("error")
    elements = [int(e) for e in sys.argv[1:]]
    with peerlink.Fabric(processes=True, sim="dgx-h100") as fabric:
        rank, world = fabric.rank, fabric.world
        assert rank is not None and world is not None
        call = 0
        for count in elements:
            expected = np.sum([values(r, call, count) for r in range(world)], axis=0).astype(np.float32)
            mine = values(rank, call, count)
            fabric.all_reduce_(peerlink.on(rank, mine))
            assert np.array_equal(mine, expected), f"rank {rank}: host buffer of {count} f32"
            print(f"rank {rank} call {call}: {count} f32 through host memory", flush=True)
            call += 1
            expected = np.sum([values(r, call, count) for r in range(world)], axis=0).astype(np.float32)
            device = _native.DeviceBuffer(fabric._host, rank, 4 * count)
            device.write(values(rank, call, count).tobytes())
            fabric.all_reduce_([device], dtype="f32")
            fabric.synchronize()
            assert device.read() == expected.tobytes(), f"rank {rank}: device memory of {count} f32"
            print(f"rank {rank} call {call}: {count} f32 in device memory", flush=True)
            call += 1


if __name__ == "__main__":
    main()
