"""The runtime Backend interface: load a built instance, run one GEMM problem on host storage buffers.

Two backends implement it: PycudaBackend (the GPU: cubin through PyCUDA, params from the ctypes host
shim) and FakeBackend (pure numpy, for CI, with hooks to plant faults). The verifier only talks to this
interface, so everything above it (problems, references, runner, reports) is tested without a GPU.

Data crosses the interface as *storage* numpy arrays (emitter.runtime.hostdata): the bytes the device
buffers hold. The backend copies A, B, C, bias and the poisoned D to the device, launches, and returns
D's storage after the launch.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from emitter.errors import EmitterError
from emitter.fsutil import PathEscape, resolve_inside
from emitter.runtime.config import GemmConfig


# ---------------------------------------------------------------------------------------------- errors
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


# ---------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class GemmProblem:
    """One GEMM launch: D = act(alpha * A @ B + beta * C + bias). Leading dims / strides in elements, 0 = packed."""

    m: int
    n: int
    k: int
    batch: int = 1
    split_k: int = 1
    alpha: float = 1.0
    beta: float = 0.0
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    ldd: int = 0
    batch_stride_a: int = 0
    batch_stride_b: int = 0
    batch_stride_c: int = 0
    batch_stride_d: int = 0
    options: int = 0      # run-time scheduler options (emitter.runtime.options.SchedulerOptions.encode()), 0 = none

    def resolved(self, cfg: GemmConfig) -> "GemmProblem":
        """Packed (0) leading dimensions and batch strides replaced by their values for cfg's layouts."""
        lda = self.lda or (self.k if cfg.row_major_a else self.m)
        ldb = self.ldb or (self.n if cfg.row_major_b else self.k)
        ldc = self.ldc or (self.n if cfg.row_major_c else self.m)
        ldd = self.ldd or (self.n if cfg.row_major_c else self.m)
        rows_a = self.m if cfg.row_major_a else self.k
        rows_b = self.k if cfg.row_major_b else self.n
        rows_c = self.m if cfg.row_major_c else self.n
        return GemmProblem(
            self.m, self.n, self.k, self.batch, self.split_k, self.alpha, self.beta, lda, ldb, ldc, ldd,
            self.batch_stride_a or lda * rows_a, self.batch_stride_b or ldb * rows_b,
            self.batch_stride_c or ldc * rows_c, self.batch_stride_d or ldd * rows_c, self.options,
        )

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GemmProblem":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class GemmBuffers:
    """Host storage for one problem. D holds the poison on the way in and the result on the way out."""

    A: np.ndarray
    B: np.ndarray
    C: np.ndarray | None
    D: np.ndarray
    bias: np.ndarray | None = None


@dataclass
class RunResult:
    D: np.ndarray                       # storage after the launch
    time_ms: float | None = None        # the launch alone (device events), when the backend times it
    launch: dict[str, Any] = field(default_factory=dict)   # grid/block/cluster/shared/params/workspace


@dataclass
class Kernel:
    """A loaded instance: what the backend needs to run it (backend-specific handles in `handle`)."""

    name: str
    config: GemmConfig
    entry: dict[str, Any]
    root: Path
    handle: Any = None


# ---------------------------------------------------------------------------------------------- build records
def build_record(root: Path, name: str) -> dict[str, Any]:
    """<root>/build/<name>/record.json; NotBuilt when it is missing, unreadable or its build failed."""
    path = Path(root) / "build" / name / "record.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotBuilt(f"not built: {path} is missing (run `emitter build {root}`)") from None
    except (OSError, ValueError, RecursionError) as e:
        raise NotBuilt(f"unreadable build record {path}: {e}") from None
    if not isinstance(record, dict) or not isinstance(record.get("artifacts") or {}, dict):
        raise NotBuilt(f"build record {path} is not a build record (re-run `emitter build {root}`)")
    status = record.get("status")
    if status not in ("ok", "cached"):
        err = record.get("error") or f"status {status!r}"
        first = str(err).strip().splitlines()[:3]
        raise NotBuilt(f"build {status}: " + " | ".join(first), build_failed=True)
    arts = record.get("artifacts") or {}
    for key in ("cubin", "host"):
        if not arts.get(key):
            raise NotBuilt(f"build record {path} names no existing {key} artifact ({arts.get(key)!r})")
        try:   # a record may be edited or written by another tool: load nothing from outside the directory
            art = resolve_inside(root, arts[key], f"build record {path}: {key} artifact")
        except PathEscape as e:
            raise NotBuilt(str(e)) from None
        if not art.is_file():
            raise NotBuilt(f"build record {path} names no existing {key} artifact ({arts.get(key)!r})")
    return record


# ---------------------------------------------------------------------------------------------- interface
class Backend(abc.ABC):
    """Runs GEMM instances. One backend object lives in one (worker) process."""

    name: str = "?"
    #: torch device string for GPU-side references (None: compute references on the host)
    reference_device: str | None = None

    @abc.abstractmethod
    def device_name(self) -> str:
        """The device in words (GPU name, or 'numpy (fake)')."""

    @abc.abstractmethod
    def load(self, root: Path, entry: Mapping[str, Any]) -> Kernel:
        """Load instance `entry` of the manifest in `root`. Raises NotBuilt."""

    @abc.abstractmethod
    def run(self, kernel: Kernel, problem: GemmProblem, buffers: GemmBuffers) -> RunResult:
        """Copy in, launch once, copy D back. Raises CannotImplement, LaunchFailed or CudaFault."""

    def close(self) -> None:  # pragma: no cover - default no-op
        pass


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
