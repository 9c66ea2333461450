"""peerlink for Python: see, measure and speed up GPU-to-GPU traffic from PyTorch or NumPy.

- :func:`topology`, :func:`bench` and :func:`explain` return the documents ``peerlink topo``,
  ``bench`` and ``explain`` print with ``--json``, as dicts (the same fields, the same ``schema``).
- :class:`Fabric` moves tensors between the GPUs of this host by the fastest way peerlink's cost
  model predicts: :meth:`Fabric.copy_`, :meth:`Fabric.copy_many_` and :meth:`Fabric.all_reduce_`.
- :func:`nccl_library` gives the path of ``libpeerlink_nccl.so``, the library with NCCL's C API that
  stands in front of the real NCCL (``LD_PRELOAD`` it under torchrun; docs/nccl-library.md).

Without a usable NVIDIA GPU, peerlink opens its simulated host (the ``dgx-h100`` preset) as the
command line does, and says so with a :class:`SimulatedHostWarning`; every figure it then reports is
simulated (its documents carry ``"simulated": true``). ``sim="<preset>"`` asks for the simulator,
``gpu=True`` for real GPUs only (:class:`NoGpuError` without them).

Tensors: CUDA tensors of PyTorch (contiguous), objects with ``__cuda_array_interface__``, and on the
simulator host buffers (anything with the buffer protocol: ``bytes``, ``bytearray``, NumPy arrays)
placed on a simulated GPU with :func:`on`. PyTorch is optional: peerlink never imports it.

Errors are :class:`Error` and its subclasses, each carrying the library's one-sentence message;
bad input is a :class:`UsageError`, which is also a ``ValueError``.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
import weakref
from typing import Any, NamedTuple, Sequence

from . import _native
from ._nccl import nccl_library
from ._errors import (
    CudaError,
    Error,
    FileError,
    GroupError,
    InvalidHandleError,
    NoGpuError,
    OutOfMemoryError,
    PeerAccessError,
    UsageError,
    VerificationError,
)

__all__ = [
    "CudaError",
    "Error",
    "Fabric",
    "FileError",
    "GroupError",
    "InvalidHandleError",
    "NoGpuError",
    "OutOfMemoryError",
    "PeerAccessError",
    "Placed",
    "SimulatedHostWarning",
    "UsageError",
    "VerificationError",
    "bench",
    "explain",
    "nccl_library",
    "on",
    "topology",
]


class SimulatedHostWarning(UserWarning):
    """No usable NVIDIA GPU was found, so peerlink opened its simulated host: every figure is
    simulated."""


def _open(sim: str | None, gpu: bool) -> _native.Host:
    host = _native.Host(sim, gpu)
    if host.notice is not None:
        warnings.warn(host.notice, SimulatedHostWarning, stacklevel=3)
    return host


def _size(size: int | str) -> str:
    """A size as the command line reads it: bytes as a number, or text such as ``64MiB``."""
    return str(size)


def topology(
    devices: Sequence[int] | None = None, *, sim: str | None = None, gpu: bool = False
) -> dict[str, Any]:
    """The host's GPUs and pairs: the document of ``peerlink topo --json`` (``peerlink.topo/…``).

    ``devices`` restricts it to those GPUs, as ``--devices`` does.
    """
    host = _open(sim, gpu)
    chosen = None if devices is None else list(devices)
    document: dict[str, Any] = json.loads(_native.topology_json(host, chosen))
    return document


def bench(
    tests: Sequence[str] | None = None,
    *,
    size: int | str | None = None,
    sizes: str | Sequence[int | str] | None = None,
    samples: int | None = None,
    iterations: int | None = None,
    warmup: int | None = None,
    rotation: int | str | None = None,
    devices: Sequence[int] | None = None,
    sim: str | None = None,
    gpu: bool = False,
) -> dict[str, Any]:
    """Measures P2P bandwidth and latency: the document of ``peerlink bench --json``.

    The keywords are ``bench``'s options: ``tests`` (names, as ``--tests``), ``size`` (bytes per
    message, or ``"plateau"``), ``sizes`` (a sweep: ``"4B..1GiB"``, ``"4K,64K"`` or a list of
    sizes), ``samples``, ``iterations``, ``warmup``, ``rotation`` and ``devices``. Sizes are bytes
    as numbers, or text as the command line reads it (``"64MiB"``). The GIL is released while it
    measures, so other Python threads run.
    """
    host = _open(sim, gpu)
    sweep: str | None
    if sizes is None or isinstance(sizes, str):
        sweep = sizes
    else:
        sweep = ",".join(_size(s) for s in sizes)
    document: dict[str, Any] = json.loads(
        _native.bench_json(
            host,
            tests=None if tests is None else list(tests),
            devices=None if devices is None else list(devices),
            size=None if size is None else _size(size),
            sizes=sweep,
            samples=samples,
            iterations=iterations,
            warmup=warmup,
            rotation=None if rotation is None else _size(rotation),
        )
    )
    return document


def explain(
    src: int,
    dst: int,
    size: int | str,
    *,
    memory: str = "device",
    sim: str | None = None,
    gpu: bool = False,
) -> dict[str, Any]:
    """One transfer's latency taken apart: the document of ``peerlink explain --json``.

    ``memory`` is ``"device"`` or ``"managed"``, as ``--memory``.
    """
    host = _open(sim, gpu)
    document: dict[str, Any] = json.loads(
        _native.explain_json(host, src, dst, _size(size), memory)
    )
    return document


class Placed(NamedTuple):
    """A host buffer (or a ``__cuda_array_interface__`` object) and the GPU it stands for."""

    device: int
    buffer: Any


def on(device: int, buffer: Any) -> Placed:
    """Places ``buffer`` on GPU ``device`` for a :class:`Fabric`.

    On the simulator, a host buffer (``bytes``, ``bytearray``, a NumPy array: anything with the
    buffer protocol) stands for memory of that simulated GPU: its bytes are copied into the
    simulated GPU, moved by the engine, and written back into the destination. An object with
    ``__cuda_array_interface__`` that does not say its GPU is named this way too.
    """
    return Placed(device, buffer)


# What the Python layer finds in an argument: borrowed device memory (address, GPU, stream) or a
# host buffer's bytes (a memoryview of bytes, GPU), with its length and element type where known.
class _Device(NamedTuple):
    ref: tuple[int, int, int]
    nbytes: int
    dtype: str | None


class _Host(NamedTuple):
    ref: tuple[memoryview, int]
    nbytes: int
    dtype: str | None


_TORCH_DTYPES = {"torch.float32": "f32", "torch.bfloat16": "bf16"}
_HOST_FORMATS = {"f": "f32", "<f": "f32", "=f": "f32"}


def _is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _torch(tensor: Any, what: str) -> _Device:
    if not tensor.is_cuda:
        raise UsageError(
            f"the {what} is a tensor in host memory; give a CUDA tensor, or on the simulator "
            f"peerlink.on(gpu, tensor.numpy())"
        )
    if not tensor.is_contiguous():
        raise UsageError(
            f"the {what} is not contiguous; pass tensor.contiguous() (peerlink moves one range "
            f"of bytes)"
        )
    torch = sys.modules["torch"]  # imported: the tensor is one of its own
    device = tensor.get_device()
    # What torch.cuda.current_stream(device).cuda_stream says, without making a Stream object
    # (PyTorch's compiler reads it so for the same reason: a call's cost).
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw_stream is not None:
        stream = raw_stream(device)
    else:
        stream = torch.cuda.current_stream(device).cuda_stream
    dtype = _TORCH_DTYPES.get(str(tensor.dtype))
    return _Device((tensor.data_ptr(), device, stream), tensor.nbytes, dtype)


def _cuda_array(obj: Any, device: int | None, what: str) -> _Device:
    interface = obj.__cuda_array_interface__
    if device is None:
        found = getattr(obj, "device", None)
        device = getattr(found, "id", getattr(found, "index", found))
    if not isinstance(device, int):
        raise UsageError(
            f"the {what} does not say which GPU it is on; name it with peerlink.on(gpu, array)"
        )
    shape = tuple(interface["shape"])
    typestr = interface["typestr"]
    itemsize = int(typestr[2:])
    count = 1
    for extent in shape:
        count *= extent
    strides = interface.get("strides")
    if strides is not None:
        expected: list[int] = []
        step = itemsize
        for extent in reversed(shape):
            expected.insert(0, step)
            step *= extent
        if tuple(strides) != tuple(expected) and count > 1:
            raise UsageError(
                f"the {what} is not C-contiguous; copy it into a contiguous array first"
            )
    # Version 3 of the interface: None or absent, no stream to follow; 1 the legacy default
    # stream; 2 the per-thread default stream, which peerlink cannot order work on.
    stream = interface.get("stream")
    if stream == 2:
        raise UsageError(
            f"the {what} is ordered on the per-thread default stream, which peerlink cannot "
            f"borrow; use a stream of your own or the legacy default stream"
        )
    handle = 0 if stream in (None, 1) else int(stream)
    dtype = "f32" if typestr[1:] == "f4" else None
    return _Device((int(interface["data"][0]), device, handle), count * itemsize, dtype)


def _host(buffer: Any, device: int, what: str) -> _Host:
    try:
        view = memoryview(buffer)
    except TypeError:
        raise UsageError(
            f"the {what} is neither a CUDA tensor nor a buffer (bytes, bytearray, an array); "
            f"give one of those"
        ) from None
    if not view.c_contiguous:
        raise UsageError(
            f"the {what} is not C-contiguous; copy it into a contiguous array first"
        )
    dtype = _HOST_FORMATS.get(view.format)
    raw = view if view.format == "B" and view.ndim == 1 else view.cast("B")
    return _Host((raw, device), raw.nbytes, dtype)


def _describe(obj: Any, what: str) -> _Device | _Host:
    if isinstance(obj, Placed):
        if hasattr(obj.buffer, "__cuda_array_interface__"):
            return _cuda_array(obj.buffer, obj.device, what)
        return _host(obj.buffer, obj.device, what)
    if _is_torch_tensor(obj):
        return _torch(obj, what)
    if hasattr(obj, "__cuda_array_interface__"):
        return _cuda_array(obj, None, what)
    raise UsageError(
        f"the {what} names no GPU: give a CUDA tensor, or place a host buffer on a GPU with "
        f"peerlink.on(gpu, buffer)"
    )


def _same_kind(found: Sequence[_Device | _Host]) -> bool:
    return all(isinstance(f, _Device) for f in found) or all(
        isinstance(f, _Host) for f in found
    )


_MIXED = (
    "device memory and host buffers cannot be mixed in one call; give CUDA tensors, or host "
    "buffers placed with peerlink.on"
)


class Fabric:
    """Moves tensors between the GPUs of this host by the fastest way peerlink's cost model
    predicts (a direct copy, a copy kernel, through host memory or another GPU, or several routes
    at once).

    ``devices`` are the GPUs it uses (all of them when None). ``sim`` and ``gpu`` choose the host
    as for :func:`topology`.

    ``processes=True`` makes this process one rank of a job started one process per GPU by a
    launcher (torchrun, ``peerlink launch``, Slurm's ``srun``, ``mpirun``; read from their
    variables), on the GPU of its ``LOCAL_RANK``: every rank opens its fabric so, together, and
    :meth:`all_reduce_` then sums one tensor per process. The ranks meet at a rendezvous of
    peerlink's own (under torchrun on ``MASTER_PORT`` + 1, beside torchrun's store; or
    ``PEERLINK_PORT``) and share a flag block and a buffer each, once. Every rank must see every
    GPU of the job (no per-rank ``CUDA_VISIBLE_DEVICES``); each makes a CUDA context on its own
    GPU alone. Tensors made by :meth:`empty` live in memory every rank's kernels reach, and their
    all-reduce copies nothing (as PyTorch's SymmetricMemory).

    ``resident=True`` (or a number of copy blocks) runs a resident worker on each GPU that sends:
    a persistent kernel the host rings with transfers, without a launch or a copy call per transfer
    (the µs-scale path for small and medium copies; the planner takes it where it wins). **While a
    worker runs, device-wide synchronisation never returns**: ``torch.cuda.synchronize()``,
    ``cudaDeviceSynchronize`` and ``cuCtxSynchronize`` wait for every kernel of the device, and the
    worker's kernel ends only when the fabric is closed. Synchronise streams or events instead
    (``torch.cuda.current_stream().synchronize()``), and :meth:`close` the fabric (or leave the
    ``with`` block) before a device-wide synchronisation.

    On CUDA tensors the calls are asynchronous, like ``dst.copy_(src, non_blocking=True)``: the
    work starts after the work queued so far on the tensors' current streams
    (``torch.cuda.current_stream(device)``) and later work on those streams waits for it. On host
    buffers (the simulator) each call returns once the destination holds the bytes.

    The GIL is released while peerlink works, and the thread's CUDA context (PyTorch's current
    device) is as it was after every call. CUDA graph capture of these calls is not supported.
    """

    def __init__(
        self,
        devices: Sequence[int] | None = None,
        *,
        resident: bool | int = False,
        processes: bool = False,
        sim: str | None = None,
        gpu: bool = False,
    ) -> None:
        self._host = _open(sim, gpu)
        blocks: int | None
        if resident is True:
            blocks = _native.DEFAULT_COPY_BLOCKS
        elif resident is False:
            blocks = None
        else:
            blocks = int(resident)
        chosen = None if devices is None else list(devices)
        self._native: _native.Fabric | None = _native.Fabric(
            self._host, chosen, blocks, processes
        )
        self._processes = processes
        # This fabric's symmetric memory, weakly: close() frees it and warns about what still
        # refers to it.
        self._symmetric: list[weakref.ref[_native.SymmetricBuffer]] = []

    @property
    def devices(self) -> list[int]:
        """The GPUs this fabric uses."""
        return self._open().devices

    @property
    def rank(self) -> int | None:
        """This process's rank with ``processes=True`` (its GPU is its ``LOCAL_RANK``); None in
        one process."""
        return self._open().rank

    @property
    def world(self) -> int | None:
        """How many processes the job has with ``processes=True``; None in one process."""
        return self._open().world

    @property
    def simulated(self) -> bool:
        """Whether the host is peerlink's simulator."""
        return self._host.simulated

    @property
    def source(self) -> str:
        """``cuda``, or ``sim:<preset>``: as the documents' ``source``."""
        return self._host.source

    def _open(self) -> _native.Fabric:
        if self._native is None:
            raise UsageError("this fabric was closed; open a new one")
        return self._native

    def copy_(self, dst: Any, src: Any) -> None:
        """Copies ``src`` into ``dst`` (of the same number of bytes), GPU to GPU, by the
        planner's pick.

        On CUDA tensors it is queued as PyTorch queues ``dst.copy_(src)`` between GPUs: on the
        source's current stream itself, after a wait for the work queued so far on the
        destination's, whose later work then waits for the copy."""
        # CUDA tensors and __cuda_array_interface__ objects are described and queued in Rust; the
        # rest (host buffers, peerlink.on placements) below, which also refuses a closed fabric.
        native = self._native
        if native is None or not native.copy_(dst, src):
            self._copy_described([dst], [src])

    def copy_many_(self, dsts: Sequence[Any], srcs: Sequence[Any]) -> None:
        """Copies each ``srcs[i]`` into ``dsts[i]``, all queued together so that none waits for
        the host to queue another (every GPU sending at once). No destination may overlap another
        copy's source or destination."""
        if len(dsts) != len(srcs):
            raise UsageError(
                f"{len(dsts)} destinations and {len(srcs)} sources; give one source per destination"
            )
        native = self._native
        if native is None or not native.copy_many_(dsts, srcs):
            self._copy_described(dsts, srcs)

    def _copy_described(self, dsts: Sequence[Any], srcs: Sequence[Any]) -> None:
        """The slow path of the copies: every object described here, in Python."""
        fabric = self._open()
        found = [
            (_describe(d, "destination"), _describe(s, "source")) for d, s in zip(dsts, srcs)
        ]
        if not _same_kind([f for pair in found for f in pair]):
            raise UsageError(_MIXED)
        device_copies = []
        host_copies = []
        for dst, src in found:
            if dst.nbytes != src.nbytes:
                raise UsageError(
                    f"the source holds {src.nbytes} bytes but the destination {dst.nbytes}; "
                    f"they must be equal"
                )
            if isinstance(dst, _Device) and isinstance(src, _Device):
                (to, to_gpu, _), (at, at_gpu, _) = dst.ref, src.ref
                if to_gpu == at_gpu and to < at + src.nbytes and at < to + dst.nbytes:
                    raise UsageError(
                        "the source and destination overlap in one GPU's memory; bytes would be "
                        "overwritten while they are read"
                    )
                device_copies.append((dst.ref, src.ref, dst.nbytes))
            elif isinstance(dst, _Host) and isinstance(src, _Host):
                host_copies.append((dst.ref, src.ref))
        if device_copies:
            fabric.copy_device(device_copies)
        if host_copies:
            fabric.copy_host(host_copies)

    def all_reduce_(self, tensors: Any, *, dtype: str | None = None) -> None:
        """Sums the tensors element-wise, in place: afterwards each holds the sum of all of them.

        In one process: a sequence of one tensor per GPU, on at least two GPUs that all have P2P
        between them (peerlink's one-shot, two-shot or packet kernel, as its cost model picks for
        the size). With ``processes=True``: this process's one tensor (or a sequence of one), on
        its GPU, summed with the tensors the other ranks pass in the same call — every rank calls
        with the same length and element type, in the same order, as with ``torch.distributed``;
        a rank that does not (or has died) leaves the others' kernels waiting for it, and after
        10 s they stop with an error that every later CUDA call of their process then reports
        (rather than hang). The packet kernel (up to 256 KiB) reads the tensor itself; the larger kernels copy it into
        the buffer the ranks shared when they joined (grown, by every rank at the same call, when
        a call needs more), priced by the cost model with the kernels — except for tensors of
        :meth:`empty`, which every rank's kernels reach as they are (only one-shot copies its
        input aside; two-shot sums in place).

        Elements are float32 or bfloat16: taken from the tensors' dtype, or ``dtype="f32"`` /
        ``"bf16"`` for buffers that do not say.
        """
        native = self._native
        if native is not None and self._processes:
            if not native.all_reduce_rank_(tensors, dtype):
                self._all_reduce_rank(native, tensors, dtype)
            return
        # Lists and tuples of CUDA tensors and __cuda_array_interface__ objects are described and
        # queued in Rust; the rest below, which also refuses a closed fabric.
        native = self._native
        if native is not None and native.all_reduce_(tensors, dtype):
            return
        fabric = self._open()
        tensors = list(tensors)
        found = [_describe(t, f"tensor {i}") for i, t in enumerate(tensors)]
        if not found:
            raise UsageError("an all-reduce takes one tensor per GPU on at least 2 GPUs; none given")
        if not _same_kind(found):
            raise UsageError(_MIXED)
        kinds = {f.dtype for f in found}
        chosen = dtype if dtype is not None else (kinds.pop() if len(kinds) == 1 else None)
        if chosen is None:
            raise UsageError(
                "the tensors do not say their element type (or say different ones); pass "
                "dtype='f32' or dtype='bf16'"
            )
        devices = [f for f in found if isinstance(f, _Device)]
        if devices:
            lengths = {f.nbytes for f in devices}
            if len(lengths) != 1:
                raise UsageError("the tensors of an all-reduce must all hold the same number of bytes")
            fabric.all_reduce_device([f.ref for f in devices], devices[0].nbytes, chosen)
        else:
            fabric.all_reduce_host([f.ref for f in found if isinstance(f, _Host)], chosen)

    def _all_reduce_rank(self, native: _native.Fabric, tensor: Any, dtype: str | None) -> None:
        """The slow path of this process's part of the all-reduce across processes: host
        buffers, placements, and what the fast path does not take."""
        if isinstance(tensor, (list, tuple)) and not isinstance(tensor, Placed):
            if len(tensor) != 1:
                raise UsageError(
                    f"with processes=True an all-reduce takes this process's one tensor; "
                    f"{len(tensor)} given"
                )
            tensor = tensor[0]
        found = _describe(tensor, "tensor")
        chosen = dtype if dtype is not None else found.dtype
        if chosen is None:
            raise UsageError(
                "the tensor does not say its element type; pass dtype='f32' or dtype='bf16'"
            )
        if isinstance(found, _Device):
            native.all_reduce_rank_device(found.ref, found.nbytes, chosen)
        else:
            native.all_reduce_rank_host(found.ref, chosen)

    def empty(self, *size: Any, dtype: Any = None) -> Any:
        """A PyTorch tensor of ``size`` (``empty(4, 1024)`` or ``empty((4, 1024))``) and ``dtype``
        (default ``torch.float32``) on this rank's GPU, zero-filled, in symmetric memory: with
        ``processes=True``, every rank calls it together, with the same size and dtype, in the same
        order, as for ``torch.distributed._symmetric_memory.empty``. An :meth:`all_reduce_` of such
        a tensor (or of a contiguous view of it, every rank passing the same view) copies nothing:
        the two-shot kernel sums in place in every rank's memory, where an ordinary tensor is first
        copied into the buffer the ranks shared and the sum copied back.

        The memory is freed when the fabric closes: do not use the tensor afterwards. Needs
        PyTorch imported; :meth:`alloc_symmetric` gives the same memory to any library."""
        torch = sys.modules.get("torch")
        if torch is None:
            raise UsageError(
                "Fabric.empty makes PyTorch tensors: import torch first, or take the memory "
                "from Fabric.alloc_symmetric"
            )
        if len(size) == 1 and isinstance(size[0], (tuple, list)):
            size = tuple(size[0])
        dtype = torch.float32 if dtype is None else dtype
        element = torch.empty((), dtype=dtype).element_size()
        buffer = self.alloc_symmetric(math.prod(size) * element)
        raw = torch.as_tensor(buffer, device=f"cuda:{buffer.device}")
        return raw.view(dtype).view(size)

    def alloc_symmetric(self, nbytes: int) -> _native.SymmetricBuffer:
        """``nbytes`` zero-filled bytes of this rank's GPU in symmetric memory (see :meth:`empty`),
        lent through ``__cuda_array_interface__`` (its ``address``, ``device`` and ``nbytes`` too):
        every rank calls it together, with the same ``nbytes``, in the same order. Freed when the
        fabric closes."""
        buffer = self._open().alloc_symmetric(nbytes)
        self._symmetric.append(weakref.ref(buffer))
        return buffer

    def synchronize(self) -> None:
        """Blocks until every copy and all-reduce this fabric queued has finished. It
        synchronises the tensors' streams they were queued on, so work queued there after them
        is waited for too."""
        self._open().synchronize()

    def close(self) -> None:
        """Waits for this fabric's work, stops its resident workers and frees what it holds,
        symmetric memory too: a ``RuntimeWarning`` says so where tensors of :meth:`empty` (or
        buffers of :meth:`alloc_symmetric`) still refer to it, as using them afterwards would
        touch freed GPU memory."""
        referenced = sum(1 for ref in self._symmetric if ref() is not None)
        self._symmetric.clear()
        self._native = None
        if referenced:
            warnings.warn(
                f"the fabric closed while {referenced} of its symmetric memory allocations "
                f"(Fabric.empty, Fabric.alloc_symmetric) were still referenced; that memory is "
                f"freed now: do not use those tensors",
                RuntimeWarning,
                stacklevel=2,
            )

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
