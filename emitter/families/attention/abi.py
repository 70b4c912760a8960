"""ctypes mirror of templates/attention/common/attention_abi.h (EMITTER_ATTENTION_ABI_VERSION 1).

The launch record and status codes are the GEMM ABI's (emitter.runtime.shim: EmitterLaunch, EMITTER_*);
only the problem struct differs. tests/test_attention_render.py compiles a C program that prints the C
sizes and offsets and compares them with these.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from emitter.runtime.shim import EmitterLaunch, ShimError

ATTENTION_ABI_VERSION = 1

_i32, _i64, _p = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p


class EmitterAttentionProblem(ctypes.Structure):
    _fields_ = [
        ("batch", _i32),
        ("heads_q", _i32),
        ("heads_kv", _i32),
        ("seq_q", _i32),
        ("seq_k", _i32),
        ("head_dim", _i32),
        ("head_dim_v", _i32),
        ("scale", ctypes.c_float),
        ("flags", _i32),
        ("total_q", _i32),
        ("total_k", _i32),
        ("reserved0", _i32),
        ("stride_q", _i64 * 3),
        ("stride_k", _i64 * 3),
        ("stride_v", _i64 * 3),
        ("stride_o", _i64 * 3),
        ("stride_lse", _i64 * 2),
        ("q", _p),
        ("k", _p),
        ("v", _p),
        ("o", _p),
        ("lse", _p),
        ("cu_seqlens_q", _p),
        ("cu_seqlens_k", _p),
    ]


class AttentionShim:
    """One attention instance's host shared library: emitter_<name>_query / _initialize / _name."""

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
        P, L = ctypes.POINTER(EmitterAttentionProblem), ctypes.POINTER(EmitterLaunch)
        self._query.argtypes = [P, L]
        self._query.restype = ctypes.c_int
        self._initialize.argtypes = [P, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, L]
        self._initialize.restype = ctypes.c_int
        self._name.argtypes = []
        self._name.restype = ctypes.c_char_p

    def kernel_name(self) -> str:
        raw = self._name()
        return raw.decode() if raw else ""

    def query(self, problem: EmitterAttentionProblem) -> tuple[int, EmitterLaunch]:
        out = EmitterLaunch()
        status = int(self._query(ctypes.byref(problem), ctypes.byref(out)))
        return status, out

    def initialize(self, problem: EmitterAttentionProblem, workspace: int | None, stream: int | None,
                   capacity: int) -> tuple[int, bytes, EmitterLaunch]:
        out = EmitterLaunch()
        buf = ctypes.create_string_buffer(max(int(capacity), 1))
        status = int(self._initialize(ctypes.byref(problem), ctypes.c_void_p(workspace or None),
                                      ctypes.c_void_p(stream or None), buf, int(capacity), ctypes.byref(out)))
        n = int(out.params_bytes) if status == 0 else 0
        return status, buf.raw[:n], out


__all__ = ["ATTENTION_ABI_VERSION", "EmitterAttentionProblem", "AttentionShim"]
