"""The correctness check every profiled kernel passes on a problem before its time counts.

D is poisoned first (a NaN bit pattern kernels never produce), the kernel runs once on input set 0, and
the result is compared with a reference in higher precision by relative Frobenius error, with the
tolerance emitter.verify uses for the data type; NaN never passes and every element must be written.
The reference is computed once per (op, problem) and shared by every kernel of that op:
  * with torch (the GPU machine): on the GPU, in float32 without TF32, on zero-copy views of the
    very buffers the kernel read (through __cuda_array_interface__);
  * without torch: on the host in float64, on a sample of rows and columns.
A second check after the timed launches catches kernels whose workspace state goes wrong on reuse.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from emitter.dtypes import DType
from emitter.profile.workload import ProblemData
from emitter.runtime.hostdata import MatrixLayout, bits_of, decode, poison_value, storage_dtype

SAMPLE_ROWS = 48
SAMPLE_COLS = 256


def tolerance(cfg: Any) -> float:
    """Relative Frobenius error allowed for an instance's types (emitter.verify's when it has one)."""
    try:  # one source of truth when the verifier exposes it
        from emitter.verify import tolerances as vt  # type: ignore[attr-defined]

        fn = getattr(vt, "tolerance_for", None) or getattr(vt, "tolerance", None)
        if fn is not None:
            tol = fn(cfg)
            return float(getattr(tol, "rel_fro", tol))
    except Exception:
        pass
    a, d, acc = cfg.a, cfg.d, cfg.accumulator
    if a.is_fp8 or d.is_fp8:
        return 2e-2
    if d in (DType.f16, DType.bf16) or a in (DType.f16, DType.bf16) or acc in (DType.f16,):
        return 1e-2
    if a is DType.tf32:
        return 2e-3
    if a in (DType.f32,):
        return 2e-3 if cfg.op_class == "tensorop" else 1e-5
    if a in (DType.s8, DType.s32):
        return 1e-6
    return 1e-5


# -------------------------------------------------------------------------------------------- activations
def _np_activation(z: np.ndarray, act: str, lo: float, hi: float, gelu: str) -> np.ndarray:
    try:
        from emitter.verify.reference import apply_activation

        return apply_activation(z, act, lo, hi, gelu)
    except ImportError:
        pass
    if act == "identity":
        return z
    if act == "relu":
        return np.maximum(z, 0)
    if act == "sigmoid":
        return 1 / (1 + np.exp(-z))
    if act == "silu":
        return z / (1 + np.exp(-z))
    if act == "clamp":
        return np.clip(z, lo, hi)
    if act == "gelu":
        if gelu == "tanh":
            return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))
        from math import erf

        return 0.5 * z * (1 + np.vectorize(erf)(z / math.sqrt(2)))
    raise ValueError(act)


def _torch_activation(torch: Any, z: Any, act: str, lo: float, hi: float, gelu: str) -> Any:
    if act == "identity":
        return z
    if act == "relu":
        return torch.relu(z)
    if act == "sigmoid":
        return torch.sigmoid(z)
    if act == "silu":
        return torch.nn.functional.silu(z)
    if act == "clamp":
        return torch.clamp(z, lo, hi)
    if act == "gelu":
        return torch.nn.functional.gelu(z, approximate="tanh" if gelu == "tanh" else "none")
    raise ValueError(act)


# -------------------------------------------------------------------------------------------- torch views
_TYPESTR = {1: "|u1", 2: "<i2", 4: "<f4", 8: "<f8"}


class _CudaArray:
    """A device pointer dressed as a 1-D array, so torch.as_tensor can view it without a copy."""

    def __init__(self, ptr: int, count: int, itemsize: int, typestr: str | None = None) -> None:
        self.__cuda_array_interface__ = {"shape": (int(count),), "typestr": typestr or _TYPESTR[itemsize],
                                         "data": (int(ptr), False), "version": 3, "strides": None}


def torch_dtype(torch: Any, dt: DType) -> Any:
    return {DType.f16: torch.float16, DType.bf16: torch.bfloat16, DType.f32: torch.float32,
            DType.tf32: torch.float32, DType.f64: torch.float64, DType.s8: torch.int8, DType.s32: torch.int32,
            DType.e4m3: torch.float8_e4m3fn, DType.e5m2: torch.float8_e5m2}[dt]


def torch_view(torch: Any, ptr: int, lay: MatrixLayout, dt: DType) -> Any:
    """Logical (batch, rows, cols) torch view of a device buffer with `lay`'s strides, dtype `dt`."""
    n = lay.elements()
    raw = {DType.s8: "|i1", DType.s32: "<i4", DType.f16: "<f2", DType.f64: "<f8"}.get(dt)
    flat = torch.as_tensor(_CudaArray(ptr, n, dt.bytes, raw), device="cuda")
    want = torch_dtype(torch, dt)
    if flat.dtype != want:
        flat = flat.view(want)
    stride = (lay.batch_stride, lay.ld, 1) if lay.row_major else (lay.batch_stride, 1, lay.ld)
    return torch.as_strided(flat, (lay.batch, lay.rows, lay.cols), stride)


# -------------------------------------------------------------------------------------------- checks
def _verdict(rel: float, nan: int, unwritten: int, tol: float) -> tuple[bool, str | None]:
    if unwritten:
        return False, f"{unwritten} output elements never written (still poison)"
    if nan:
        return False, f"{nan} output elements are NaN"
    if not math.isfinite(rel) or rel > tol:
        return False, f"relative Frobenius error {rel:.3e} over the tolerance {tol:.1e}"
    return True, None


def poison_d(data: ProblemData, set_index: int = 0) -> None:
    s = data.sets[set_index]
    data.arena.fill_bytes(s.D, poison_value(data.cfg.d), data.lay.D.elements())


def check_torch(data: ProblemData, cfg: Any, set_index: int = 0) -> dict[str, Any]:
    import torch

    lay, s = data.lay, data.sets[set_index]
    if set_index != 0:
        raise ValueError("the reference is computed on input set 0")
    if data.reference is None:
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            A = torch_view(torch, s.A, lay.A, data.cfg.a).float()
            B = torch_view(torch, s.B, lay.B, data.cfg.b).float()
            z = data.alpha * torch.matmul(A, B)
            del A, B
            if data.beta != 0:
                z += data.beta * torch_view(torch, s.C, lay.C, data.cfg.c).float()
            if data.cfg.bias != "none":
                nb = data.problem.m if data.cfg.bias == "row" else data.problem.n
                vec = torch_view(torch, s.bias, MatrixLayout(1, nb, True, nb), data.cfg.c).float().reshape(-1)
                z += vec[None, :, None] if data.cfg.bias == "row" else vec[None, None, :]
            z = _torch_activation(torch, z, cfg.activation, cfg.clamp_min, cfg.clamp_max, cfg.gelu)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        data.reference = z
    ref = data.reference
    D = torch_view(torch, s.D, lay.D, cfg.d)
    poison = poison_value(cfg.d)
    int_view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[cfg.d.bytes]
    pbits = int(bits_of(np.asarray(poison).reshape(1)).astype(np.int64)[0])
    if cfg.d.bytes == 2 and pbits >= 1 << 15:
        pbits -= 1 << 16
    if cfg.d.bytes == 4 and pbits >= 1 << 31:
        pbits -= 1 << 32
    unwritten = int((D.view(int_view) == pbits).sum().item()) if cfg.d.is_float else 0
    Df = D.float()
    nan = int(torch.isnan(Df).sum().item())
    diff = torch.linalg.vector_norm((Df - ref).reshape(-1), dtype=torch.float64).item()
    norm = torch.linalg.vector_norm(ref.reshape(-1), dtype=torch.float64).item()
    rel = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
    tol = tolerance(cfg)
    ok, why = _verdict(rel, nan, unwritten, tol)
    return {"passed": ok, "rel_err": rel, "tolerance": tol, "nan": nan, "unwritten": unwritten,
            "reference": "torch float32 (no TF32) on the GPU, full output", "reason": why}


def _sample(n: int, count: int, rng: np.random.Generator) -> np.ndarray:
    if n <= count:
        return np.arange(n)
    idx = rng.choice(n - 1, size=count - 1, replace=False)
    return np.sort(np.append(idx, n - 1))       # always the last row/column (tile edges)


def _gather(storage: np.ndarray, lay: MatrixLayout, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """storage[(batch, rows, cols)] for index subsets, without building the full index."""
    b = np.arange(lay.batch, dtype=np.int64)[:, None, None] * lay.batch_stride
    r = rows.astype(np.int64)[None, :, None]
    c = cols.astype(np.int64)[None, None, :]
    return storage[b + (r * lay.ld + c if lay.row_major else r + c * lay.ld)]


def check_host(data: ProblemData, cfg: Any, set_index: int = 0) -> dict[str, Any]:
    """float64 reference on sampled rows x columns (every batch), from host copies of the operands."""
    lay, s, dc = data.lay, data.sets[set_index], data.cfg
    arena = data.arena
    rng = np.random.default_rng(1234)
    rows = _sample(data.problem.m, SAMPLE_ROWS, rng)
    cols = _sample(data.problem.n, SAMPLE_COLS, rng)

    def host(ptr: int, layout: MatrixLayout, dt: DType) -> np.ndarray:
        return arena.to_host(ptr, storage_dtype(dt), layout.elements())

    all_k = np.arange(data.problem.k)
    A = decode(_gather(host(s.A, lay.A, dc.a), lay.A, rows, all_k), dc.a)
    B = decode(_gather(host(s.B, lay.B, dc.b), lay.B, all_k, cols), dc.b)
    z = data.alpha * np.matmul(A, B)
    if data.beta != 0:
        z = z + data.beta * decode(_gather(host(s.C, lay.C, dc.c), lay.C, rows, cols), dc.c)
    if dc.bias != "none":
        nb = data.problem.m if dc.bias == "row" else data.problem.n
        vec = decode(arena.to_host(s.bias, storage_dtype(dc.c), nb), dc.c)
        z = z + (vec[rows][None, :, None] if dc.bias == "row" else vec[cols][None, None, :])
    ref = _np_activation(z, cfg.activation, cfg.clamp_min, cfg.clamp_max, cfg.gelu)
    dstore = host(s.D, lay.D, cfg.d)
    got_store = _gather(dstore, lay.D, rows, cols)
    unwritten = 0
    if cfg.d.is_float:   # every element written: the poison count over the whole (packed) output
        unwritten = int(np.count_nonzero(bits_of(dstore) == bits_of(np.asarray(poison_value(cfg.d)).reshape(1))[0]))
    got = decode(got_store, cfg.d)
    nan = int(np.count_nonzero(np.isnan(got)))
    norm = float(np.linalg.norm(ref))
    diff = float(np.linalg.norm(np.nan_to_num(got, nan=0.0) - ref))
    rel = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
    tol = tolerance(cfg)
    ok, why = _verdict(rel, nan, unwritten, tol)
    return {"passed": ok, "rel_err": rel, "tolerance": tol, "nan": nan, "unwritten": unwritten,
            "reference": f"numpy float64 on the host, {len(rows)} rows x {len(cols)} columns sampled", "reason": why}


def check(data: ProblemData, cfg: Any, use_torch: bool) -> dict[str, Any]:
    return check_torch(data, cfg) if use_torch else check_host(data, cfg)
