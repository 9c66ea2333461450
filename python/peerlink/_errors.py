"""The exceptions peerlink raises, each carrying the library's one-sentence message.

Errors of the caller's input are also ``ValueError`` (as the command line exits 2 for them); errors
while running are also ``RuntimeError``, ``MemoryError`` or ``OSError``, by kind.
"""


class Error(Exception):
    """Any error of peerlink."""


class UsageError(Error, ValueError):
    """Bad input: a value out of range, an unknown name, a buffer peerlink cannot take."""


class NoGpuError(Error, RuntimeError):
    """Real GPUs were required (``gpu=True``) but none can be used."""


class CudaError(Error, RuntimeError):
    """A CUDA driver, NVRTC or NVML call failed."""


class PeerAccessError(Error, RuntimeError):
    """Peer access between two GPUs could not be enabled."""


class VerificationError(Error, RuntimeError):
    """A transfer delivered wrong bytes."""


class OutOfMemoryError(Error, MemoryError):
    """An allocation found too little memory free, on a GPU or on the host."""


class InvalidHandleError(Error, RuntimeError):
    """A released or foreign handle reached the backend."""


class FileError(Error, OSError):
    """A file could not be read or written."""


class GroupError(Error, RuntimeError):
    """A process of a multi-process run failed, hung or never arrived."""
