"""ctypes mirror of templates/attention/common/attention_backward_abi.h (EMITTER_ATTENTION_BACKWARD_ABI_VERSION 1).

The launch record and status codes are the shared ABI's; only the problem struct differs.
tests/attention/test_attention_backward.py compiles a C program printing the C sizes and offsets and compares them.
"""

from __future__ import annotations

import ctypes

ATTENTION_BACKWARD_ABI_VERSION = 1

_i32, _i64, _p = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p


class EmitterAttentionBackwardProblem(ctypes.Structure):
    _fields_ = [
        ("batch", _i32), ("heads_q", _i32), ("heads_kv", _i32), ("seq_q", _i32), ("seq_k", _i32),
        ("head_dim", _i32), ("head_dim_v", _i32), ("scale", ctypes.c_float), ("flags", _i32),
        ("total_q", _i32), ("total_k", _i32), ("reserved0", _i32),
        ("stride_q", _i64 * 3), ("stride_k", _i64 * 3), ("stride_v", _i64 * 3), ("stride_o", _i64 * 3),
        ("stride_do", _i64 * 3), ("stride_dq", _i64 * 3), ("stride_dk", _i64 * 3), ("stride_dv", _i64 * 3),
        ("stride_lse", _i64 * 2),
        ("q", _p), ("k", _p), ("v", _p), ("o", _p), ("d_o", _p), ("lse", _p),
        ("dq", _p), ("dk", _p), ("dv", _p), ("cu_seqlens_q", _p), ("cu_seqlens_k", _p),
    ]


__all__ = ["ATTENTION_BACKWARD_ABI_VERSION", "EmitterAttentionBackwardProblem"]
