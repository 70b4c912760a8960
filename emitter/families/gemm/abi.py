"""GEMM's problem struct of the host shim ABI (templates/common/emitter_abi.h `emitter_gemm_problem`,
EMITTER_ABI_VERSION 3) and the runtime hook that fills it (c_problem)."""

from __future__ import annotations

import ctypes
from typing import Any, Mapping


class EmitterGemmProblem(ctypes.Structure):
    _fields_ = [
        ("m", ctypes.c_int),
        ("n", ctypes.c_int),
        ("k", ctypes.c_int),
        ("batch_count", ctypes.c_int),
        ("split_k_slices", ctypes.c_int),
        ("options", ctypes.c_int),       # run-time scheduler options (emitter.kit.scheduler), 0 = compiled-in
        ("A", ctypes.c_void_p),
        ("B", ctypes.c_void_p),
        ("C", ctypes.c_void_p),
        ("D", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("lda", ctypes.c_longlong),
        ("ldb", ctypes.c_longlong),
        ("ldc", ctypes.c_longlong),
        ("ldd", ctypes.c_longlong),
        ("batch_stride_A", ctypes.c_longlong),
        ("batch_stride_B", ctypes.c_longlong),
        ("batch_stride_C", ctypes.c_longlong),
        ("batch_stride_D", ctypes.c_longlong),
        ("alpha", ctypes.c_float),
        ("beta", ctypes.c_float),
    ]


def c_problem(cfg: Any, p: Any, pointers: Mapping[str, int]) -> EmitterGemmProblem:
    """The struct for resolved problem p with device pointers by buffer name (0 / absent = null)."""
    ptr = {k: (int(v) or None) if v else None for k, v in pointers.items()}
    return EmitterGemmProblem(
        m=p.m, n=p.n, k=p.k, batch_count=p.batch, split_k_slices=p.split_k, options=p.options,
        A=ptr.get("A"), B=ptr.get("B"), C=ptr.get("C"), D=ptr.get("D"), bias=ptr.get("bias"),
        lda=p.lda, ldb=p.ldb, ldc=p.ldc, ldd=p.ldd,
        batch_stride_A=p.batch_stride_a, batch_stride_B=p.batch_stride_b,
        batch_stride_C=p.batch_stride_c, batch_stride_D=p.batch_stride_d,
        alpha=p.alpha, beta=p.beta,
    )
