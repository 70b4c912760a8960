"""What running a built kernel can fail with, for every family and backend: the runtime backends raise these,
the families' launch objects (emitter.kit.prepare, their profile launches and fake runs) raise them too, and
verify and profile turn them into results (SKIPPED, FAILED, a worker that exits after a context fault)."""

from __future__ import annotations

from emitter.errors import EmitterError


class RuntimeBackendError(EmitterError):
    """Something a backend could not do; `fatal` means the CUDA context is unusable afterwards."""

    fatal = False


class NotBuilt(RuntimeBackendError):
    """No usable build record/artifacts for the instance (never built, or its build failed)."""

    def __init__(self, message: str, build_failed: bool = False) -> None:
        super().__init__(message)
        self.build_failed = build_failed


class CannotImplement(RuntimeBackendError):
    """The instance cannot run this problem (alignment, mode, can_implement): a SKIP, not a failure."""


class LaunchFailed(RuntimeBackendError):
    """The shim or the launch returned an error; the context is still usable."""


class CudaFault(RuntimeBackendError):
    """A CUDA error that poisons the context (illegal address, launch failure, trap): the worker must exit."""

    fatal = True


class BackendUnavailable(RuntimeBackendError):
    """The backend cannot be used here (no PyCUDA, no GPU)."""

    exit_code = 2


class FakeFaultError(BackendUnavailable, ValueError):
    """A fault plan the fake backend does not know, or one a family's fake cannot plant on this problem (bad input:
    exit code 2)."""
