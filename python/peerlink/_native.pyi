"""The Rust side of peerlink's Python package (see ``peerlink``); not a public interface."""

from collections.abc import Sequence

from typing import final

from typing_extensions import Buffer

__all__ = [
    "DEFAULT_COPY_BLOCKS",
    "DeviceBuffer",
    "Fabric",
    "Host",
    "bench_json",
    "explain_json",
    "topology_json",
]

DEFAULT_COPY_BLOCKS: int

# Another library's device memory: (address, GPU, CUDA stream handle).
_DeviceRef = tuple[int, int, int]
# A host buffer of bytes and the GPU it stands for.
_HostRef = tuple[Buffer, int]

@final
class Host:
    def __new__(cls, sim: str | None = None, gpu: bool = False) -> Host: ...
    @property
    def notice(self) -> str | None: ...
    @property
    def notices(self) -> list[str]: ...
    @property
    def source(self) -> str: ...
    @property
    def simulated(self) -> bool: ...
    @property
    def device_count(self) -> int: ...

@final
class Fabric:
    def __new__(
        cls, host: Host, devices: list[int] | None = None, resident: int | None = None
    ) -> Fabric: ...
    @property
    def devices(self) -> list[int]: ...
    def copy_host(self, copies: Sequence[tuple[_HostRef, _HostRef]]) -> None: ...
    def all_reduce_host(self, buffers: Sequence[_HostRef], dtype: str) -> None: ...
    def copy_device(self, copies: Sequence[tuple[_DeviceRef, _DeviceRef, int]]) -> None: ...
    def all_reduce_device(self, ranks: Sequence[_DeviceRef], bytes: int, dtype: str) -> None: ...
    def time_copy_device(
        self, copies: Sequence[tuple[_DeviceRef, _DeviceRef, int]], calls: int
    ) -> float: ...
    def time_all_reduce_device(
        self, ranks: Sequence[_DeviceRef], bytes: int, dtype: str, calls: int
    ) -> float: ...
    def synchronize(self) -> None: ...

@final
class DeviceBuffer:
    def __new__(cls, host: Host, device: int, nbytes: int) -> DeviceBuffer: ...
    @property
    def device(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def address(self) -> int: ...
    def write(self, data: Buffer) -> None: ...
    def read(self) -> bytes: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, object]: ...

def topology_json(host: Host, devices: list[int] | None = None) -> str: ...
def bench_json(
    host: Host,
    tests: list[str] | None = None,
    devices: list[int] | None = None,
    size: str | None = None,
    sizes: str | None = None,
    samples: int | None = None,
    iterations: int | None = None,
    warmup: int | None = None,
    rotation: str | None = None,
) -> str: ...
def explain_json(host: Host, src: int, dst: int, size: str, memory: str = "device") -> str: ...
