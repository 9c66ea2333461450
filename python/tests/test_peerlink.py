"""peerlink's Python package on the simulator: documents as dicts, the fabric over host buffers
(every byte checked), errors as exceptions with the library's sentences, the GIL released."""

from __future__ import annotations

import collections
import json
import pathlib
import subprocess
import sys
import threading
import time
import types
import warnings
from typing import Any

import numpy as np
import pytest

import peerlink
from peerlink import _native
from ranks import launch_ranks

REPO = pathlib.Path(__file__).resolve().parents[2]
SIM = "dgx-h100"


def schema_of(name: str) -> dict[str, Any]:
    text = (REPO / "docs" / "schemas" / f"peerlink.{name}-1.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def assert_fits(document: dict[str, Any], name: str) -> None:
    """The document names its schema and holds every field the published schema requires, and
    none it does not know."""
    schema = schema_of(name)
    assert document["schema"] == f"peerlink.{name}/1"
    missing = set(schema.get("required", [])) - set(document)
    assert not missing, f"fields the schema requires are missing: {missing}"
    unknown = set(document) - set(schema["properties"])
    assert not unknown, f"fields the schema does not know: {unknown}"


def cli() -> pathlib.Path:
    for profile in ("release", "debug"):
        binary = REPO / "target" / profile / "peerlink"
        if binary.exists():
            return binary
    pytest.skip("the peerlink binary is not built (cargo build --release)")


def pattern(length: int, seed: int) -> bytes:
    return bytes((i * 7 + seed * 13 + i // 251) % 256 for i in range(length))


# ---- documents -------------------------------------------------------------------------------


def test_topology_is_the_topo_document_with_the_clis_fields() -> None:
    document = peerlink.topology(sim=SIM)
    assert_fits(document, "topo")
    assert document["source"] == f"sim:{SIM}"
    assert document["simulated"] is True
    assert len(document["devices"]) == 8
    shown = subprocess.run(
        [cli(), "--sim", SIM, "topo", "--json"], check=True, capture_output=True, text=True
    ).stdout
    from_cli = json.loads(shown)
    assert set(document) == set(from_cli)
    for volatile in ("time", "commit"):
        document.pop(volatile), from_cli.pop(volatile)
    assert document == from_cli


def test_topology_restricted_to_devices() -> None:
    document = peerlink.topology([0, 3], sim=SIM)
    assert [d["index"] for d in document["devices"]] == [0, 3]


def test_bench_returns_the_bench_document() -> None:
    document = peerlink.bench(["ce-write"], size="1MiB", devices=[0, 1], sim=SIM)
    assert_fits(document, "bench")
    assert document["simulated"] is True
    assert [t["name"] for t in document["tests"]] == ["ce-write"]
    assert any("SIMULATED" in note for note in document["notes"])


def test_bench_sweep_takes_a_list_of_sizes() -> None:
    document = peerlink.bench(["ce-write"], sizes=[4096, "64K"], devices=[0, 1], sim=SIM)
    assert_fits(document, "bench")
    sizes = {p["bytes"] for sweep in document["sweeps"] for p in sweep["points"]}
    assert sizes == {4096, 65536}


def test_explain_returns_the_explain_document() -> None:
    document = peerlink.explain(0, 1, "64K", sim=SIM)
    assert_fits(document, "explain")


def test_no_gpu_falls_back_to_the_simulator_and_warns() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        document = peerlink.topology()
    if not document["simulated"]:
        pytest.skip("this host has a GPU")
    assert [w.category for w in caught] == [peerlink.SimulatedHostWarning]
    assert "SIMULATED" in str(caught[0].message)


def test_gpu_required_without_one_is_a_no_gpu_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", peerlink.SimulatedHostWarning)
        if not peerlink.topology()["simulated"]:
            pytest.skip("this host has a GPU")
    with pytest.raises(peerlink.NoGpuError, match=r"^no NVIDIA GPU can be used: ") as raised:
        peerlink.topology(gpu=True)
    assert isinstance(raised.value, RuntimeError)


# ---- the fabric over host buffers ----------------------------------------------------------


@pytest.fixture(scope="module")
def fabric() -> peerlink.Fabric:
    return peerlink.Fabric(sim=SIM)


@pytest.mark.parametrize("length", [1, 4, 4097, 1 << 20])
def test_copy_from_bytes_into_a_bytearray(fabric: peerlink.Fabric, length: int) -> None:
    src = pattern(length, 1)
    dst = bytearray(length)
    fabric.copy_(peerlink.on(5, dst), peerlink.on(2, src))
    assert bytes(dst) == src


def test_copy_between_numpy_arrays_of_any_shape(fabric: peerlink.Fabric) -> None:
    src = np.arange(3 * 1000, dtype=np.float32).reshape(3, 1000)
    dst = np.zeros_like(src)
    fabric.copy_(peerlink.on(1, dst), peerlink.on(0, src))
    assert dst.tobytes() == src.tobytes()


def test_copy_within_one_gpu(fabric: peerlink.Fabric) -> None:
    src = pattern(10_000, 2)
    dst = bytearray(len(src))
    fabric.copy_(peerlink.on(3, dst), peerlink.on(3, src))
    assert bytes(dst) == src


def test_copy_many_moves_every_pair(fabric: peerlink.Fabric) -> None:
    srcs = [pattern(65536 + i, i) for i in range(8)]
    dsts = [np.zeros(len(s), dtype=np.uint8) for s in srcs]
    fabric.copy_many_(
        [peerlink.on((i + 1) % 8, d) for i, d in enumerate(dsts)],
        [peerlink.on(i, s) for i, s in enumerate(srcs)],
    )
    for src, dst in zip(srcs, dsts):
        assert dst.tobytes() == src


def test_resident_fabric_copies(fabric: peerlink.Fabric) -> None:
    with peerlink.Fabric([0, 1], resident=True, sim=SIM) as resident:
        src = pattern(4096, 3)
        dst = bytearray(len(src))
        resident.copy_(peerlink.on(1, dst), peerlink.on(0, src))
        assert bytes(dst) == src


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_all_reduce_sums_float32_arrays_in_place(fabric: peerlink.Fabric, ranks: int) -> None:
    # Small integers: their sums are exact whatever the order of the additions.
    inputs = [((np.arange(3000) * 5 + r * 3) % 17 - 8).astype(np.float32) for r in range(ranks)]
    tensors = [x.copy() for x in inputs]
    fabric.all_reduce_([peerlink.on(r, t) for r, t in enumerate(tensors)])
    expected = np.sum(inputs, axis=0)
    for tensor in tensors:
        assert tensor.tobytes() == expected.tobytes()


def test_all_reduce_of_bf16_bytes_names_its_dtype(fabric: peerlink.Fabric) -> None:
    values = [np.arange(-8, 8, dtype=np.float32), np.full(16, 2.0, dtype=np.float32)]
    # bfloat16 is the upper half of a float32: exact for these small integers.
    as_bf16 = [(v.view(np.uint32) >> 16).astype(np.uint16) for v in values]
    fabric.all_reduce_([peerlink.on(i, b) for i, b in enumerate(as_bf16)], dtype="bf16")
    expected = ((values[0] + values[1]).view(np.uint32) >> 16).astype(np.uint16)
    for b in as_bf16:
        assert b.tobytes() == expected.tobytes()


# ---- borrowed device memory: peerlink's own simulated buffers, lent by address ------------


@pytest.fixture
def fast_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Device memory must take the fast path (described in Rust): the slow path's description
    fails the test."""

    def slow_path(obj: Any, what: str) -> Any:
        raise AssertionError(f"the {what} took the slow path")

    monkeypatch.setattr(peerlink, "_describe", slow_path)


def device_buffer(fabric: peerlink.Fabric, device: int, data: bytes) -> _native.DeviceBuffer:
    buffer = _native.DeviceBuffer(fabric._host, device, len(data))
    buffer.write(data)
    return buffer


@pytest.mark.parametrize("length", [1, 4097, 1 << 20])
def test_copy_between_cuda_array_objects_moves_every_byte(
    fabric: peerlink.Fabric, length: int, fast_path_only: None
) -> None:
    src = device_buffer(fabric, 2, pattern(length, 4))
    dst = device_buffer(fabric, 5, bytes(length))
    fabric.copy_(dst, src)
    fabric.synchronize()
    assert dst.read() == pattern(length, 4)


def test_copy_many_between_cuda_array_objects_moves_every_pair(fabric: peerlink.Fabric, fast_path_only: None) -> None:
    srcs = [device_buffer(fabric, i, pattern(4096 + i, i)) for i in range(8)]
    dsts = [device_buffer(fabric, (i + 3) % 8, bytes(4096 + i)) for i in range(8)]
    fabric.copy_many_(dsts, srcs)
    fabric.synchronize()
    for i, dst in enumerate(dsts):
        assert dst.read() == pattern(4096 + i, i)


class OnStream:
    """A __cuda_array_interface__ object ordered on a stream of its own, whose memory can be
    swapped for another buffer between calls (as a tensor's storage can be)."""

    def __init__(self, buffer: _native.DeviceBuffer, stream: int | None) -> None:
        self.buffer, self.stream = buffer, stream

    @property
    def device(self) -> int:
        return self.buffer.device

    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        interface = dict(self.buffer.__cuda_array_interface__)
        interface["stream"] = self.stream
        return interface


def test_a_stream_borrowed_once_orders_every_later_call(fabric: peerlink.Fabric, fast_path_only: None) -> None:
    # Each call after the first finds the stream borrowed at the first; the copies run in order
    # on it, so the destination ends with the last source's bytes.
    dst = OnStream(device_buffer(fabric, 1, bytes(8192)), 0x5EED)
    for step in range(6):
        src = OnStream(device_buffer(fabric, step % 3, pattern(8192, step)), 0x5EED + step % 2)
        fabric.copy_(dst, src)
        fabric.synchronize()
        assert dst.buffer.read() == pattern(8192, step)


def test_an_object_whose_memory_changes_between_calls_is_read_anew(
    fabric: peerlink.Fabric, fast_path_only: None
) -> None:
    src = device_buffer(fabric, 0, pattern(4096, 5))
    targets = [device_buffer(fabric, 1, bytes(4096)), device_buffer(fabric, 2, bytes(4096))]
    dst = OnStream(targets[0], None)
    fabric.copy_(dst, src)
    dst.buffer = targets[1]  # now another GPU's memory, at another address
    fabric.copy_(dst, device_buffer(fabric, 3, pattern(4096, 6)))
    fabric.synchronize()
    assert targets[0].read() == pattern(4096, 5)
    assert targets[1].read() == pattern(4096, 6)


def test_the_per_thread_default_stream_is_refused(fabric: peerlink.Fabric) -> None:
    src = OnStream(device_buffer(fabric, 0, bytes(16)), 2)
    with pytest.raises(peerlink.UsageError, match="^the source is ordered on the per-thread"):
        fabric.copy_(device_buffer(fabric, 1, bytes(16)), src)


def test_device_memory_and_host_buffers_cannot_be_mixed(fabric: peerlink.Fabric) -> None:
    with pytest.raises(peerlink.UsageError, match="^device memory and host buffers cannot be mixed"):
        fabric.copy_(device_buffer(fabric, 1, bytes(2)), peerlink.on(0, b"ab"))
    with pytest.raises(peerlink.UsageError, match="^device memory and host buffers cannot be mixed"):
        fabric.copy_many_(
            [device_buffer(fabric, 1, bytes(2)), peerlink.on(1, bytearray(2))],
            [device_buffer(fabric, 0, b"ab"), peerlink.on(0, b"ab")],
        )


def test_device_lengths_that_differ_are_a_usage_error(fabric: peerlink.Fabric) -> None:
    with pytest.raises(peerlink.UsageError, match="^the source holds 2 bytes but the destination 3"):
        fabric.copy_(device_buffer(fabric, 1, bytes(3)), device_buffer(fabric, 0, b"ab"))


@pytest.mark.parametrize("ranks", [2, 4, 8])
@pytest.mark.parametrize("length", [4, 64 << 10, 1 << 20])
def test_all_reduce_sums_cuda_array_objects_in_place(
    fabric: peerlink.Fabric, ranks: int, length: int, fast_path_only: None
) -> None:
    inputs = [((np.arange(length // 4) * 5 + r * 3) % 17 - 8).astype(np.float32) for r in range(ranks)]
    tensors = [device_buffer(fabric, r, x.tobytes()) for r, x in enumerate(inputs)]
    fabric.all_reduce_(tensors, dtype="f32")
    fabric.synchronize()
    expected = np.sum(inputs, axis=0).astype(np.float32).tobytes()
    for tensor in tensors:
        assert tensor.read() == expected
    # Again on the same memory: each now holds ranks times the sum.
    fabric.all_reduce_(tensors, dtype="f32")
    fabric.synchronize()
    again = (np.sum(inputs, axis=0) * ranks).astype(np.float32).tobytes()
    for tensor in tensors:
        assert tensor.read() == again


def test_all_reduce_sizes_in_turn_on_one_fabric_each_take_their_own_kernel(
    fabric: peerlink.Fabric, fast_path_only: None
) -> None:
    # The kernel picked per GPUs and size is kept: a size after another must not take the other's
    # (the packet kernel, picked for a few bytes, refuses more than 256 KiB).
    for step, length in enumerate([4, 1 << 20, 64 << 10, 4, 1 << 20]):
        inputs = [np.full(length // 4, r + step, dtype=np.float32) for r in range(2)]
        tensors = [device_buffer(fabric, r, x.tobytes()) for r, x in enumerate(inputs)]
        fabric.all_reduce_(tensors, dtype="f32")
        fabric.synchronize()
        for tensor in tensors:
            assert tensor.read() == np.full(length // 4, 1 + 2 * step, dtype=np.float32).tobytes()


def test_all_reduce_of_cuda_array_objects_needs_a_dtype(fabric: peerlink.Fabric) -> None:
    tensors = [device_buffer(fabric, r, bytes(16)) for r in range(2)]
    with pytest.raises(peerlink.UsageError, match="dtype='f32'"):
        fabric.all_reduce_(tensors)
    with pytest.raises(peerlink.UsageError, match="sums f32 or bf16, not `f16`"):
        fabric.all_reduce_(tensors, dtype="f16")


# ---- errors ----------------------------------------------------------------------------------


def test_lengths_that_differ_are_a_usage_error(fabric: peerlink.Fabric) -> None:
    with pytest.raises(peerlink.UsageError, match="^the source holds 2 bytes but the destination 3"):
        fabric.copy_(peerlink.on(1, bytearray(3)), peerlink.on(0, b"ab"))


def test_usage_errors_are_value_errors(fabric: peerlink.Fabric) -> None:
    with pytest.raises(ValueError):
        fabric.copy_(peerlink.on(1, b"xy"), peerlink.on(0, b"ab"))


def test_a_read_only_destination_is_refused(fabric: peerlink.Fabric) -> None:
    with pytest.raises(peerlink.UsageError, match="^the destination is read-only"):
        fabric.copy_(peerlink.on(1, b"xy"), peerlink.on(0, b"ab"))


def test_a_non_contiguous_array_is_refused(fabric: peerlink.Fabric) -> None:
    strided = np.zeros(100, dtype=np.uint8)[::2]
    with pytest.raises(peerlink.UsageError, match="not C-contiguous"):
        fabric.copy_(peerlink.on(1, bytearray(50)), peerlink.on(0, strided))


def test_a_buffer_without_a_gpu_is_refused(fabric: peerlink.Fabric) -> None:
    with pytest.raises(peerlink.UsageError, match=r"names no GPU.*peerlink\.on"):
        fabric.copy_(bytearray(2), peerlink.on(0, b"ab"))


def test_a_gpu_outside_the_fabric_is_the_engines_sentence() -> None:
    with peerlink.Fabric([0, 1], sim=SIM) as pair:
        with pytest.raises(peerlink.UsageError, match=r"^GPU 4 is not part of this fabric"):
            pair.copy_(peerlink.on(4, bytearray(2)), peerlink.on(0, b"ab"))


def test_an_unknown_gpu_is_the_librarys_sentence() -> None:
    with pytest.raises(peerlink.UsageError, match=r"GPU 9 does not exist; this host has 8 GPUs"):
        peerlink.Fabric([9], sim=SIM)


def test_an_unknown_preset_is_a_usage_error() -> None:
    with pytest.raises(peerlink.UsageError, match="no-such-preset"):
        peerlink.topology(sim="no-such-preset")


def test_a_bad_size_is_the_librarys_sentence() -> None:
    with pytest.raises(peerlink.UsageError, match=r"^bad size `12XB`"):
        peerlink.bench(["ce-write"], size="12XB", sim=SIM)


def test_all_reduce_on_one_gpu_is_refused(fabric: peerlink.Fabric) -> None:
    with pytest.raises(peerlink.UsageError, match="at least 2 GPUs; 1 given"):
        fabric.all_reduce_([peerlink.on(0, np.zeros(4, dtype=np.float32))])


def test_all_reduce_without_a_dtype_is_refused(fabric: peerlink.Fabric) -> None:
    with pytest.raises(peerlink.UsageError, match="dtype='f32'"):
        fabric.all_reduce_([peerlink.on(0, bytearray(8)), peerlink.on(1, bytearray(8))])


def test_memory_the_simulator_did_not_lend_is_refused(fabric: peerlink.Fabric) -> None:
    class FakeCudaArray:
        __cuda_array_interface__ = {
            "data": (0x7F0000000000, False),
            "shape": (16,),
            "typestr": "|u1",
            "version": 3,
        }

    with pytest.raises(peerlink.UsageError, match="^no simulated buffer starts at 0x7f0000000000"):
        fabric.copy_(peerlink.on(1, FakeCudaArray()), peerlink.on(0, FakeCudaArray()))


def test_a_closed_fabric_is_refused() -> None:
    closed = peerlink.Fabric([0, 1], sim=SIM)
    closed.close()
    with pytest.raises(peerlink.UsageError, match="closed"):
        closed.copy_(peerlink.on(1, bytearray(2)), peerlink.on(0, b"ab"))


# ---- the GIL ---------------------------------------------------------------------------------


def test_other_threads_run_while_a_bench_measures() -> None:
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    started = time.monotonic()
    try:
        peerlink.bench(["ce-write", "sm-write"], size="64MiB", sim=SIM)
    finally:
        done.set()
        counter.join()
    elapsed = time.monotonic() - started
    # With the GIL held for the whole bench the counter could not have run during it at all.
    assert elapsed > 0.05, f"the bench took only {elapsed:.3f} s: too short to tell"
    assert ticks >= 10, f"the other thread ran {ticks} times in {elapsed:.2f} s"


# ---- PyTorch's tensors, as far as the simulator goes ---------------------------------------------
# Without PyTorch in CI, a stand-in with the attributes peerlink reads: its checks run, and a CUDA
# tensor reaches the backend, which on the simulator refuses to borrow device memory.


class FakeDtype:
    """A stand-in `torch.dtype`: one object per element type, as PyTorch's are."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name


FLOAT32, BFLOAT16, UINT8 = FakeDtype("torch.float32"), FakeDtype("torch.bfloat16"), FakeDtype("torch.uint8")


class FakeTensor:
    def __init__(self, device: int, nbytes: int, *, cuda: bool = True, contiguous: bool = True,
                 dtype: FakeDtype = UINT8, address: int | None = None) -> None:
        self.device_index, self.nbytes = device, nbytes
        self.is_cuda, self.contiguous, self.dtype = cuda, contiguous, dtype
        self.address = address

    def get_device(self) -> int:
        return self.device_index if self.is_cuda else -1

    def is_contiguous(self) -> bool:
        return self.contiguous

    def data_ptr(self) -> int:
        if self.address is not None:
            return self.address
        return 0x7F00_0000_0000 + self.device_index * (1 << 30)


FakeTensor.__module__ = "torch"


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A stand-in `torch` module; the list collects the GPUs whose current stream was asked."""
    asked: list[int] = []

    def current_raw_stream(device: int) -> int:
        asked.append(device)
        return 0

    module = types.ModuleType("torch")
    module._C = types.SimpleNamespace(_cuda_getCurrentRawStream=current_raw_stream)  # type: ignore[attr-defined]
    module.float32, module.bfloat16 = FLOAT32, BFLOAT16  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", module)
    return asked


def test_a_host_tensor_is_refused(fabric: peerlink.Fabric, fake_torch: list[int]) -> None:
    with pytest.raises(peerlink.UsageError, match="^the source is a tensor in host memory"):
        fabric.copy_(FakeTensor(1, 16), FakeTensor(0, 16, cuda=False))


def test_a_non_contiguous_tensor_is_refused(fabric: peerlink.Fabric, fake_torch: list[int]) -> None:
    with pytest.raises(peerlink.UsageError, match=r"^the destination is not contiguous; pass tensor\.contiguous\(\)"):
        fabric.copy_(FakeTensor(1, 16, contiguous=False), FakeTensor(0, 16))


def test_cuda_tensors_reach_the_backend_on_their_streams(
    fabric: peerlink.Fabric, fake_torch: list[int]
) -> None:
    with pytest.raises(peerlink.UsageError, match="^no simulated buffer starts at"):
        fabric.copy_(FakeTensor(1, 16), FakeTensor(0, 16))
    assert sorted(fake_torch) == [0, 1]


def test_a_gpus_current_stream_is_read_once_per_call(
    fabric: peerlink.Fabric, fake_torch: list[int]
) -> None:
    # Both tensors of one GPU: one read serves the call; the next call reads it again (the user
    # may change the current stream between calls).
    base = 0x7F00_0000_0000 + 2 * (1 << 30)
    for calls in (1, 2):
        with pytest.raises(peerlink.UsageError, match="^no simulated buffer starts at"):
            fabric.copy_(FakeTensor(2, 16, address=base), FakeTensor(2, 16, address=base + 64))
        assert fake_torch == [2] * calls


def test_tensors_overlapping_on_one_gpu_are_refused(
    fabric: peerlink.Fabric, fake_torch: list[int]
) -> None:
    with pytest.raises(peerlink.UsageError, match="overlap in one GPU's memory"):
        fabric.copy_(FakeTensor(2, 16), FakeTensor(2, 16))


def test_all_reduce_takes_the_tensors_dtype(fabric: peerlink.Fabric, fake_torch: list[int]) -> None:
    tensors = [FakeTensor(g, 64, dtype=BFLOAT16) for g in (0, 1)]
    # The element type is found (else the refusal would ask for dtype=), the ranks pass the
    # checks, and the simulator refuses memory it did not lend.
    with pytest.raises(peerlink.UsageError, match="^no simulated buffer starts at"):
        fabric.all_reduce_(tensors)
    with pytest.raises(peerlink.UsageError, match="whole number of 4-byte elements"):
        fabric.all_reduce_([FakeTensor(g, 6, dtype=FLOAT32) for g in (0, 1)])


def test_tensors_move_every_byte_on_the_fast_path(
    fabric: peerlink.Fabric, fake_torch: list[int], fast_path_only: None
) -> None:
    src = device_buffer(fabric, 0, pattern(4096, 8))
    targets = [device_buffer(fabric, 1, bytes(4096)), device_buffer(fabric, 1, bytes(4096))]
    dst = FakeTensor(1, 4096, address=targets[0].address)
    fabric.copy_(dst, FakeTensor(0, 4096, address=src.address))
    # The tensor's storage moves between calls: the next copy lands in the new memory.
    dst.address = targets[1].address
    fabric.copy_(dst, FakeTensor(0, 4096, address=src.address))
    fabric.synchronize()
    assert [t.read() for t in targets] == [pattern(4096, 8)] * 2
    # The current stream is asked at every call, for each tensor.
    assert sorted(fake_torch) == [0, 0, 1, 1]


def test_all_reduce_of_tensors_takes_their_dtype_on_the_fast_path(
    fabric: peerlink.Fabric, fake_torch: list[int], fast_path_only: None
) -> None:
    inputs = [np.full(256, r + 1, dtype=np.float32) for r in range(3)]
    buffers = [device_buffer(fabric, r, x.tobytes()) for r, x in enumerate(inputs)]
    tensors = [FakeTensor(r, 1024, dtype=FLOAT32, address=b.address) for r, b in enumerate(buffers)]
    fabric.all_reduce_(tensors)
    fabric.synchronize()
    for b in buffers:
        assert b.read() == np.full(256, 6, dtype=np.float32).tobytes()


def test_all_reduce_of_a_tuple_takes_the_fast_path(
    fabric: peerlink.Fabric, fake_torch: list[int], fast_path_only: None
) -> None:
    inputs = [np.full(64, r + 1, dtype=np.float32) for r in range(2)]
    buffers = [device_buffer(fabric, r, x.tobytes()) for r, x in enumerate(inputs)]
    fabric.all_reduce_(tuple(FakeTensor(r, 256, dtype=FLOAT32, address=b.address) for r, b in enumerate(buffers)))
    fabric.synchronize()
    for b in buffers:
        assert b.read() == np.full(64, 3, dtype=np.float32).tobytes()


def test_all_reduce_of_another_sequence_takes_the_slow_path(fabric: peerlink.Fabric) -> None:
    # The fast path takes lists and tuples only (iterating anything else could consume what the
    # slow path then reads); the slow path takes any sequence.
    inputs = [np.full(64, r + 1, dtype=np.float32) for r in range(2)]
    buffers = [device_buffer(fabric, r, x.tobytes()) for r, x in enumerate(inputs)]
    fabric.all_reduce_(collections.deque(buffers), dtype="f32")
    fabric.synchronize()
    for b in buffers:
        assert b.read() == np.full(64, 3, dtype=np.float32).tobytes()


def test_a_tensor_of_another_dtype_object_does_not_say_its_type(
    fabric: peerlink.Fabric, fake_torch: list[int]
) -> None:
    # The fast path tells torch.float32 by the object itself, as PyTorch's dtypes are singletons.
    tensors = [FakeTensor(g, 64, dtype=FakeDtype("torch.float64")) for g in (0, 1)]
    with pytest.raises(peerlink.UsageError, match="do not say their element type"):
        fabric.all_reduce_(tensors)


# ---- one tensor per process: ranks started as a launcher starts them -------------------------


@pytest.mark.parametrize("world", [2, 3])
def test_all_reduce_across_processes_sums_every_element_by_every_kernel(world: int) -> None:
    # 1 Ki and 64 Ki elements (4 KiB, 256 KiB: the packet kernel), 1 Mi (4 MiB: a kernel that
    # copies into the shared buffers, which grow past their first 1 MiB).
    ranks = launch_ranks("rank_all_reduce.py", world, ["1024", "65536", str(1 << 20)])
    for rank, done in enumerate(ranks):
        assert done.returncode == 0, f"rank {rank}: {done.stderr}"
        assert done.stdout.count(f"rank {rank} call") == 9, done.stdout
        assert f"rank {rank}: closing with 64 bytes of symmetric memory referenced warned" in done.stdout


def test_processes_without_a_launcher_is_a_usage_error() -> None:
    with pytest.raises(peerlink.UsageError, match="no launcher's variables are set"):
        peerlink.Fabric(processes=True, sim="dgx-h100")


def test_one_process_fabric_has_no_rank(fabric: peerlink.Fabric) -> None:
    assert fabric.rank is None and fabric.world is None


def test_symmetric_memory_needs_a_fabric_of_processes(fabric: peerlink.Fabric) -> None:
    with pytest.raises(peerlink.UsageError, match="open it with processes=True"):
        fabric.alloc_symmetric(64)


def test_empty_needs_pytorch_imported(fabric: peerlink.Fabric, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with pytest.raises(peerlink.UsageError, match="import torch first"):
        fabric.empty(4, 1024)


def test_nccl_library_is_found_beside_the_package_or_the_peerlink_command(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packaged = pathlib.Path(peerlink.__file__).parent / "libpeerlink_nccl.so"
    if packaged.is_file():
        assert peerlink.nccl_library() == str(packaged)
        return
    command = tmp_path / "peerlink"
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    (tmp_path / "libpeerlink_nccl.so").write_bytes(b"")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert peerlink.nccl_library() == str(tmp_path / "libpeerlink_nccl.so")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(peerlink.FileError, match="cargo build --release -p peerlink-nccl"):
        peerlink.nccl_library()
