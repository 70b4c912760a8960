"""GEMM inputs for one verify case: fresh random operands from a seed, in storage with the problem's
leading dimensions and batch strides, D poisoned.

Inputs are small integers (`int` problems: every partial sum exact, so the result is checked bit for bit)
or normal values (`normal`: checked with the dtype's tolerance), never zeros. Storage outside the logical
matrices (padded leading dimensions, batch strides) holds NaN (or large integers): a kernel reading there
poisons its result. D is poisoned everywhere first; afterwards every element must be written and nothing
outside D's matrices touched (reference.compare_case).
"""

from __future__ import annotations

import numpy as np

from emitter.dtypes import DType
from emitter.families.base import Inputs
from emitter.families.gemm.config import GemmConfig
from emitter.families.gemm.layout import MatrixLayout
from emitter.families.gemm.problem import GemmProblem
from emitter.kit.hostdata import decode, encode, exact_int_limit, poison_value, quantize, storage_dtype

EXACT_ACTIVATIONS = ("identity", "relu", "clamp")


# ---------------------------------------------------------------------------------------------- inputs
class GemmInputs(Inputs):
    """Inputs with GEMM's names: buffers A, B, C, D, bias (storage; D poisoned); values A (batch, M, K),
    B (batch, K, N), C (batch, M, N), bias (float64 logical) and the storage layouts."""

    @property
    def A(self) -> np.ndarray:
        return self.values["A"]

    @property
    def B(self) -> np.ndarray:
        return self.values["B"]

    @property
    def C(self) -> np.ndarray:
        return self.values["C"]

    @property
    def bias(self) -> np.ndarray | None:
        return self.values.get("bias")

    @property
    def layouts(self) -> dict[str, MatrixLayout]:
        return self.values["layouts"]

    @property
    def int_range(self) -> tuple[int, int] | None:
        r = self.info.get("int_range")
        return tuple(r) if r else None  # type: ignore[return-value]


def gemm_buffers(A: np.ndarray, B: np.ndarray, C: np.ndarray | None, D: np.ndarray,
                 bias: np.ndarray | None = None) -> Inputs:
    """Inputs of given storage arrays only (scripts that draw their own operands; no reference values)."""
    return GemmInputs(buffers={"A": A, "B": B, "C": C, "D": D, "bias": bias}, outputs=("D",))


def _acc_limit(cfg: GemmConfig, p: GemmProblem) -> int:
    limit = {DType.f32: 1 << 24, DType.tf32: 1 << 24, DType.f16: 2048, DType.bf16: 256, DType.f64: 1 << 53,
             DType.s32: (1 << 31) - 1}.get(cfg.accumulator, 2048)
    if cfg.a.is_fp8 or cfg.b.is_fp8:
        # Hopper fp8 MMA accumulates with reduced internal precision (about 13-14 kept bits); sums of
        # integers up to 2^13 stay exact with or without fast accumulation (reference.py)
        limit = min(limit, 1 << 13)
    limit = min(limit, exact_int_limit(cfg.epilogue_compute) if cfg.epilogue_compute.is_float else limit)
    if p.split_k > 1:
        limit = min(limit, exact_int_limit(cfg.d))   # serial split-K passes partial sums through D's type
    return limit


def int_plan(cfg: GemmConfig, p: GemmProblem) -> tuple[int, int, bool]:
    """(operand range r, C/bias range rc, exact): operands in [-r, r], C and bias in [-rc, rc]."""
    exact = (cfg.activation in EXACT_ACTIVATIONS and float(p.alpha).is_integer() and float(p.beta).is_integer()
             and (cfg.activation != "clamp" or (float(cfg.clamp_min).is_integer() and float(cfg.clamp_max).is_integer())))
    limit = _acc_limit(cfg, p)
    in_limit = min(exact_int_limit(cfg.a), exact_int_limit(cfg.b))
    rc = min(4, exact_int_limit(cfg.c))
    choices = (8, 4, 2, 1) if not (cfg.a.is_float or cfg.b.is_float) else (2, 1)
    for r in choices:
        if r > in_limit:
            continue
        bound = abs(p.alpha) * p.k * r * r + abs(p.beta) * rc + (rc if cfg.bias != "none" else 0)
        if bound <= limit:
            return r, rc, exact
    return 1, rc, False


def _fill_value(dt: DType) -> float:
    """What storage outside the logical matrix holds: NaN for floats, a large value for integers."""
    return float("nan") if dt.is_float else (100.0 if dt is DType.s8 else 1e6)


def _draw(rng: np.random.Generator, shape: tuple[int, ...], dt: DType, data: str, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values exactly representable in dt, their storage encoding)."""
    if data == "int":
        x = rng.integers(-r, r + 1, size=shape, dtype=np.int8 if r < 100 else np.int64).astype(np.float64)
    elif dt.is_float:
        x = rng.standard_normal(size=shape, dtype=np.float64 if dt is DType.f64 else np.float32).astype(np.float64)
    else:
        x = rng.integers(-64, 65, size=shape).astype(np.float64)
    if dt is DType.tf32:
        x = quantize(x, dt)
    stored = encode(x, dt)
    return decode(stored, dt), stored


def _storage(layout: MatrixLayout, stored_logical: np.ndarray, dt: DType) -> np.ndarray:
    n = layout.elements()
    if layout.packed:
        store = np.empty(n, dtype=stored_logical.dtype)
    else:
        store = np.full(n, encode(np.array([_fill_value(dt)]), dt)[0], dtype=stored_logical.dtype)
    layout.scatter(store, stored_logical)
    return store


def make_inputs(cfg: GemmConfig, p: GemmProblem, data: str, seed: int) -> GemmInputs:
    """Fresh inputs for resolved problem p (explicit lds / strides) drawn from seed."""
    rng = np.random.default_rng(seed)
    r, rc, exact = int_plan(cfg, p) if data == "int" else (0, 0, False)
    la = MatrixLayout(p.m, p.k, cfg.row_major_a, p.lda, p.batch, p.batch_stride_a)
    lb = MatrixLayout(p.k, p.n, cfg.row_major_b, p.ldb, p.batch, p.batch_stride_b)
    lc = MatrixLayout(p.m, p.n, cfg.row_major_c, p.ldc, p.batch, p.batch_stride_c)
    ld = MatrixLayout(p.m, p.n, cfg.row_major_c, p.ldd, p.batch, p.batch_stride_d)
    A, sA = _draw(rng, (p.batch, p.m, p.k), cfg.a, data, r)
    B, sB = _draw(rng, (p.batch, p.k, p.n), cfg.b, data, r)
    C, sC = _draw(rng, (p.batch, p.m, p.n), cfg.c, data, rc)
    bias = sbias = None
    if cfg.bias != "none":
        bias, sbias = _draw(rng, (p.m if cfg.bias == "row" else p.n,), cfg.c, data, rc)
    D = np.empty(ld.elements(), dtype=storage_dtype(cfg.d))
    D[...] = poison_value(cfg.d)
    buffers = {"A": _storage(la, sA, cfg.a), "B": _storage(lb, sB, cfg.b), "C": _storage(lc, sC, cfg.c), "D": D,
               "bias": sbias}
    values = {"A": A, "B": B, "C": C, "bias": bias, "layouts": {"A": la, "B": lb, "C": lc, "D": ld}}
    return GemmInputs(buffers=buffers, outputs=("D",), values=values, exact=exact,
                      info={"int_range": [r, rc] if data == "int" else None})
