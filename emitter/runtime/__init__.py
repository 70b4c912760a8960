"""Runtime: run built instances of any family through a backend (PyCUDA on the GPU, numpy fake for CI). The
pieces a launch is made of (the host shim's ctypes ABI, launching a cubin with Params by value, host-side
storage codecs, the errors a launch can end in) are the kit's (emitter/kit/), which the families use too; family
code (problem types, configs, inputs, references) lives in emitter/families/<family>/runtime.py. PyCUDA is
imported lazily (only by the pycuda backend)."""

from __future__ import annotations

from typing import Any, Mapping

from emitter.runtime.backend import (  # noqa: F401
    Backend, BackendUnavailable, CannotImplement, CudaFault, Kernel, LaunchFailed, NotBuilt, RunResult,
    RuntimeBackendError, build_record, family_config,
)


def create_backend(name: str, options: Mapping[str, Any] | None = None) -> Backend:
    """Backend by name: 'pycuda' or 'fake' (options: the fake backend's fault plan)."""
    options = dict(options or {})
    if name == "pycuda":
        from emitter.runtime.pycuda_backend import PycudaBackend

        return PycudaBackend(**options)
    if name == "fake":
        from emitter.runtime.fake_backend import FakeBackend

        return FakeBackend(**options)
    raise BackendUnavailable(f"unknown backend {name!r} (pycuda, fake)")
