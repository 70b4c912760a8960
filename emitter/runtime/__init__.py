"""Runtime: run built instances. Backends (PyCUDA on the GPU, numpy fake for CI), the host shim's ctypes
ABI, and host-side storage codecs. PyCUDA is imported lazily (only by the pycuda backend)."""

from emitter.runtime.backend import (  # noqa: F401
    Backend, BackendUnavailable, CannotImplement, CudaFault, GemmBuffers, GemmProblem, Kernel, LaunchFailed,
    NotBuilt, RunResult, RuntimeBackendError, build_record, create_backend,
)
from emitter.runtime.config import GemmConfig  # noqa: F401
