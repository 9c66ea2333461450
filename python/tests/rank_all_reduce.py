"""One rank of the all-reduce across processes, on the simulator: started by
test_all_reduce_across_processes with a launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK, …).

Each call sums small whole numbers, so every sum is exact: the rank checks every element of its
result, through host buffers (written back), through its simulated device memory lent by address
(the CUDA-tensor path, queued on a stream) and in symmetric memory (allocated by every rank
together, reduced without copies); and that closing the fabric while symmetric memory is still
referenced warns. Prints one line per call it checked.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

import peerlink
from peerlink import _native


# Where the range reduced in symmetric memory starts.
OFFSET = 16


class View:
    """`nbytes` of device memory from `offset` into `base`, lent as PyTorch's tensor views are."""

    def __init__(self, base: _native.SymmetricBuffer, offset: int, nbytes: int) -> None:
        self.device = base.device
        self.__cuda_array_interface__ = {
            "data": (base.address + offset, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
            "stream": None,
        }


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
            # A range of symmetric memory past its first bytes: the simulator lends memory only
            # from an allocation's first byte, so only the symmetric path (no borrow) takes it.
            expected = np.sum([values(r, call, count) for r in range(world)], axis=0).astype(np.float32)
            symmetric = fabric.alloc_symmetric(OFFSET + 4 * count)
            assert (symmetric.device, symmetric.nbytes) == (rank, OFFSET + 4 * count)
            whole = _native.DeviceBuffer(fabric._host, rank, OFFSET + 4 * count)
            before = bytes(range(OFFSET))
            whole.write(before + values(rank, call, count).tobytes())
            fabric.copy_(symmetric, whole)
            fabric.all_reduce_(View(symmetric, OFFSET, 4 * count), dtype="f32")
            fabric.copy_(whole, symmetric)
            fabric.synchronize()
            result = whole.read()
            assert result[OFFSET:] == expected.tobytes(), f"rank {rank}: symmetric memory of {count} f32"
            assert result[:OFFSET] == before, f"rank {rank}: bytes before the range changed"
            print(f"rank {rank} call {call}: {count} f32 in symmetric memory", flush=True)
            call += 1
            del symmetric
        # Closing while symmetric memory is still referenced says so (every rank, together).
        kept = fabric.alloc_symmetric(64)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fabric.close()
        assert [str(w.message) for w in caught if "still referenced" in str(w.message)], caught
        print(f"rank {rank}: closing with {kept.nbytes} bytes of symmetric memory referenced warned", flush=True)


if __name__ == "__main__":
    main()
