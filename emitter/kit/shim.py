"""ctypes bindings of the host shim ABI every family shares (templates/common/emitter_abi.h, EMITTER_ABI_VERSION 3).

Each instance's host library exports emitter_<name>_query(const P*, emitter_launch*),
emitter_<name>_initialize(const P*, workspace, stream, params, capacity, emitter_launch*) and
emitter_<name>_name(), where P is the family's problem struct (a ctypes.Structure the family's runtime
hook `c_problem` builds; GEMM's is emitter.families.gemm.abi.EmitterGemmProblem). The launch record and
the status codes here are common. The structs must match emitter_abi.h field for field;
tests/stages/test_verify_fake.py compiles a C program that prints the C sizes and offsets and compares them.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from emitter.errors import EmitterError

ABI_VERSION = 3

EMITTER_OK = 0
EMITTER_CANNOT_IMPLEMENT = 1
EMITTER_INVALID_ARGUMENT = 2
EMITTER_BUFFER_TOO_SMALL = 3
EMITTER_CUDA_ERROR = 4
EMITTER_INTERNAL_ERROR = 5

STATUS_NAMES = {
    EMITTER_OK: "EMITTER_OK",
    EMITTER_CANNOT_IMPLEMENT: "EMITTER_CANNOT_IMPLEMENT",
    EMITTER_INVALID_ARGUMENT: "EMITTER_INVALID_ARGUMENT",
    EMITTER_BUFFER_TOO_SMALL: "EMITTER_BUFFER_TOO_SMALL",
    EMITTER_CUDA_ERROR: "EMITTER_CUDA_ERROR",
    EMITTER_INTERNAL_ERROR: "EMITTER_INTERNAL_ERROR",
}


class EmitterLaunch(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_int * 3),
        ("block", ctypes.c_int * 3),
        ("cluster", ctypes.c_int * 3),
        ("shared_bytes", ctypes.c_int),
        ("params_bytes", ctypes.c_int),
        ("params_align", ctypes.c_int),
        ("workspace_bytes", ctypes.c_longlong),
    ]

    def as_dict(self) -> dict:
        return {
            "grid": list(self.grid), "block": list(self.block), "cluster": list(self.cluster),
            "shared_bytes": int(self.shared_bytes), "params_bytes": int(self.params_bytes),
            "params_align": int(self.params_align), "workspace_bytes": int(self.workspace_bytes),
        }


class ShimError(EmitterError):
    """The host shim returned an error status (other than CANNOT_IMPLEMENT) or could not be loaded."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class HostShim:
    """One instance's host shared library: emitter_<name>_query / _initialize / _name."""

    def __init__(self, path: str | Path, name: str) -> None:
        self.path = Path(path)
        self.name = name
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise ShimError(f"cannot load host shim {self.path}: {e}") from None
        try:
            self._query = getattr(self.lib, f"emitter_{name}_query")
            self._initialize = getattr(self.lib, f"emitter_{name}_initialize")
            self._name = getattr(self.lib, f"emitter_{name}_name")
        except AttributeError as e:
            raise ShimError(f"host shim {self.path} lacks an ABI symbol: {e}") from None
        self._problem_type: type | None = None
        self._query.restype = ctypes.c_int
        self._initialize.restype = ctypes.c_int
        self._name.argtypes = []
        self._name.restype = ctypes.c_char_p

    def kernel_name(self) -> str:
        raw = self._name()
        return raw.decode() if raw else ""

    def _bind(self, problem: ctypes.Structure) -> None:
        """argtypes for the family's problem struct (set on first use, checked on every call)."""
        t = type(problem)
        if self._problem_type is t:
            return
        P, L = ctypes.POINTER(t), ctypes.POINTER(EmitterLaunch)
        self._query.argtypes = [P, L]
        self._initialize.argtypes = [P, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, L]
        self._problem_type = t

    def query(self, problem: ctypes.Structure) -> tuple[int, EmitterLaunch]:
        self._bind(problem)
        out = EmitterLaunch()
        status = int(self._query(ctypes.byref(problem), ctypes.byref(out)))
        return status, out

    def initialize(self, problem: ctypes.Structure, workspace: int | None, stream: int | None,
                   capacity: int) -> tuple[int, bytes, EmitterLaunch]:
        self._bind(problem)
        out = EmitterLaunch()
        buf = ctypes.create_string_buffer(max(int(capacity), 1))
        status = int(self._initialize(ctypes.byref(problem), ctypes.c_void_p(workspace or None),
                                      ctypes.c_void_p(stream or None), buf, int(capacity), ctypes.byref(out)))
        n = int(out.params_bytes) if status == EMITTER_OK else 0
        return status, buf.raw[:n], out


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status, f"status {status}")
