"""Where ``libpeerlink_nccl.so`` is: the library with NCCL's C API that stands in front of the real
NCCL (docs/nccl-library.md). Pure Python: it needs neither the extension nor a GPU."""

from __future__ import annotations

import os
import shutil

from ._errors import FileError

LIBRARY = "libpeerlink_nccl.so"


def nccl_library() -> str:
    """The path of ``libpeerlink_nccl.so``, to preload or to load in place of NCCL::

        LD_PRELOAD=$(python3 -c 'import peerlink; print(peerlink.nccl_library())') torchrun ...
        VLLM_NCCL_SO_PATH=$(python3 -c 'import peerlink; print(peerlink.nccl_library())') vllm ...

    Looked for beside this package (where a wheel built with it ships it), then beside the
    ``peerlink`` command on ``PATH`` (``cargo build --release`` puts both in ``target/release``).
    Raises :class:`FileError` saying how to build it where neither has it.
    """
    beside_package = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY)
    candidates = [beside_package]
    command = shutil.which("peerlink")
    if command is not None:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(command)), LIBRARY))
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise FileError(
        f"{LIBRARY} was found neither beside the peerlink package ({beside_package}) nor beside a "
        "peerlink command on PATH: build it in a clone of peerlink with "
        "`cargo build --release -p peerlink-nccl` (it lands in target/release/) and copy it into "
        "the package's directory, or put target/release on PATH"
    )
