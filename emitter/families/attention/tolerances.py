"""Tolerances of the attention check, by Q/K/V/O dtype.

O: max |o - ref| over the case, relative to max |ref| (the output's scale; an output is a convex combination
of V rows). The kernel rounds P (the probabilities) to the dtype before P.V and O to the dtype at the end:
about 2-6 ulp of the dtype relative to max |O| on the problems verify runs (f16 ulp 9.8e-4, bf16 7.8e-3,
e4m3 0.125). LSE (f32): absolute |lse - ref| <= LSE_ATOL + LSE_RTOL * |ref|: inputs are exact in the dtype and
scores accumulate in f32, so LSE is good to f32 rounding of the scaled scores (large-magnitude data reach
|LSE| of several hundred).
"""

from __future__ import annotations

from emitter.dtypes import DType

O_REL = {DType.f16: 5e-3, DType.bf16: 4e-2, DType.e4m3: 2.5e-1}
LSE_ATOL = 2e-3
LSE_RTOL = 1e-5


def o_tolerance(dtype: DType) -> float:
    return O_REL[dtype]


def lse_tolerance(ref_abs):
    return LSE_ATOL + LSE_RTOL * ref_abs


__all__ = ["O_REL", "LSE_ATOL", "LSE_RTOL", "o_tolerance", "lse_tolerance"]
