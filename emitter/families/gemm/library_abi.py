"""GEMM's C structs of the exported library as field lists: one source for the Python loader's ctypes mirror
(templates/library/loader.py.j2 renders them) and for the sizes the generated C++ static_asserts, so a
drift between the C header and the loader fails the library's own compile."""

from __future__ import annotations

import ctypes
from typing import Sequence

from emitter.kit.library import ABI_VERSION  # noqa: F401 (the library's, every family's)

PROBLEM_FIELDS: tuple[tuple[str, str], ...] = (
    ("struct_size", "c_uint32"), ("flags", "c_uint32"),
    ("m", "c_int32"), ("n", "c_int32"), ("k", "c_int32"),
    ("batch_count", "c_int32"), ("split_k_slices", "c_int32"),
    ("a_type", "c_int32"), ("b_type", "c_int32"), ("c_type", "c_int32"), ("d_type", "c_int32"),
    ("accumulator_type", "c_int32"),
    ("a_layout", "c_int32"), ("b_layout", "c_int32"), ("c_layout", "c_int32"),
    ("activation", "c_int32"), ("bias_kind", "c_int32"),
    ("clamp_min", "c_float"), ("clamp_max", "c_float"), ("alpha", "c_float"), ("beta", "c_float"),
    ("fast_accum", "c_int32"),   # was `reserved` (always 0) before fp8 fast accumulation: same layout
    ("A", "c_void_p"), ("B", "c_void_p"), ("C", "c_void_p"), ("D", "c_void_p"), ("bias", "c_void_p"),
    ("lda", "c_int64"), ("ldb", "c_int64"), ("ldc", "c_int64"), ("ldd", "c_int64"),
    ("batch_stride_a", "c_int64"), ("batch_stride_b", "c_int64"), ("batch_stride_c", "c_int64"),
    ("batch_stride_d", "c_int64"),
    ("kernel", "c_char_p"),
)

SELECTION_FIELDS: tuple[tuple[str, str], ...] = (
    ("struct_size", "c_uint32"), ("kernel", "c_int32"), ("transposed", "c_int32"), ("tuned", "c_int32"),
    ("tuned_m", "c_int32"), ("tuned_n", "c_int32"), ("tuned_k", "c_int32"), ("tuned_batch", "c_int32"),
    ("tried", "c_int32"), ("split_k_slices", "c_int32"),   # was `reserved` (always 0) before tuned split-K
    ("workspace_bytes", "c_int64"),
)

KERNEL_INFO_FIELDS: tuple[tuple[str, str], ...] = (
    ("struct_size", "c_uint32"), ("available", "c_int32"), ("name", "c_char_p"),
    ("arch", "c_int32"), ("arch_specific", "c_int32"),
    ("a_type", "c_int32"), ("b_type", "c_int32"), ("c_type", "c_int32"), ("d_type", "c_int32"),
    ("accumulator_type", "c_int32"),
    ("a_layout", "c_int32"), ("b_layout", "c_int32"), ("c_layout", "c_int32"),
    ("activation", "c_int32"), ("bias_kind", "c_int32"),
    ("alignment_a", "c_int32"), ("alignment_b", "c_int32"), ("alignment_c", "c_int32"),
    ("tile_m", "c_int32"), ("tile_n", "c_int32"), ("tile_k", "c_int32"),
    ("cluster_m", "c_int32"), ("cluster_n", "c_int32"), ("cluster_k", "c_int32"),
    ("batched", "c_int32"), ("split_k", "c_int32"), ("tuned_shapes", "c_int32"),
    ("fast_accum", "c_int32"),   # appended (the struct grows at the end; older callers' struct_size stops before it)
)


def structure(name: str, fields: Sequence[tuple[str, str]]) -> type[ctypes.Structure]:
    return type(name, (ctypes.Structure,), {"_fields_": [(f, getattr(ctypes, t)) for f, t in fields]})


def sizes() -> dict[str, int]:
    """Sizes and offsets the generated C++ checks with static_assert (x86-64 / aarch64 LP64)."""
    p = structure("P", PROBLEM_FIELDS)
    return {"problem": ctypes.sizeof(p), "problem_A": p.A.offset, "problem_kernel": p.kernel.offset,  # type: ignore[attr-defined]
            "selection": ctypes.sizeof(structure("S", SELECTION_FIELDS)),
            "kernel_info": ctypes.sizeof(structure("K", KERNEL_INFO_FIELDS))}
