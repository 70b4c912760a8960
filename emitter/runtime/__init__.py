"""Runtime: run built instances of any family. Backends (PyCUDA on the GPU, numpy fake for CI), the host
shim's ctypes ABI, launching a cubin with Params by value, and host-side storage codecs. Family code (problem
types, configs, inputs, references) lives in emitter/families/<family>/runtime.py. PyCUDA is imported
lazily (only by the pycuda backend)."""

from emitter.runtime.backend import (  # noqa: F401
    Backend, BackendUnavailable, CannotImplement, CudaFault, Kernel, LaunchFailed, NotBuilt, RunResult,
    RuntimeBackendError, build_record, create_backend, family_config,
)
