"""ctypes mirror of templates/attention/common/attention_abi.h (EMITTER_ATTENTION_ABI_VERSION 1).

The launch record and status codes are the GEMM ABI's (emitter.kit.shim: EmitterLaunch, EMITTER_*);
only the problem struct differs. tests/attention/test_attention_render.py compiles a C program that prints the C
sizes and offsets and compares them with these.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Mapping

from emitter.kit.shim import HostShim

if TYPE_CHECKING:
    from emitter.families.attention.problem import AttentionProblem

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


class AttentionShim(HostShim):
    """One attention instance's host shared library (emitter_<name>_query / _initialize / _name): the runtime's
    HostShim, its argtypes bound to the attention problem struct."""


def fill_shape(c: Any, p: AttentionProblem) -> Any:
    """The scalar fields the forward and backward problem structs share (sizes, scale, flags 0), set from p."""
    c.batch, c.heads_q, c.heads_kv = p.batch, p.heads_q, p.heads_kv
    c.seq_q, c.seq_k = p.seq_q, p.seq_k
    c.head_dim, c.head_dim_v = p.head_dim, p.head_dim_v
    c.scale = float(p.scale)
    c.flags = 0
    c.total_q, c.total_k = p.total_q, p.total_k
    return c


def c_problem(cfg: Any, p: AttentionProblem, pointers: Mapping[str, int]) -> EmitterAttentionProblem:
    """emitter_attention_problem for device pointers by buffer name (q, k, v, o, lse, cu_seqlens_q/k)."""
    s = p.strides()
    c = fill_shape(EmitterAttentionProblem(), p)
    for name in ("q", "k", "v", "o"):
        arr = getattr(c, f"stride_{name}")
        for i, v in enumerate(s[name]):
            arr[i] = int(v)
    c.stride_lse[0], c.stride_lse[1] = (int(x) for x in s["lse"])
    for name in ("q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k"):
        setattr(c, name, int(pointers.get(name) or 0) or None)
    return c


__all__ = ["ATTENTION_ABI_VERSION", "EmitterAttentionProblem", "AttentionShim", "c_problem"]
