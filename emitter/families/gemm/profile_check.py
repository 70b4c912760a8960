"""GEMM's profile check: the correctness check every profiled kernel passes on a problem before its time counts.

D is poisoned first (a NaN bit pattern kernels never produce), the kernel runs once on input set 0, and
the result is compared with a reference in higher precision by relative Frobenius error, with the
tolerance emitter.verify uses for the data type; NaN never passes and every element must be written.
The criteria are emitter.verify's (emitter.families.gemm.reference: tolerance, element-wise bound, compare).
The reference is computed once per (op, problem) and shared by every kernel of that op:
  * with torch (the GPU machine): on the GPU, in float32 without TF32 (float64 for f32 SIMT kernels),
    every element, on zero-copy views of the very buffers the kernel read (__cuda_array_interface__);
  * without torch: on the host in float64, on a sample of rows and columns.
A second check after the timed launches catches kernels whose workspace state goes wrong on reuse.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from emitter.dtypes import DType
from emitter.families.gemm.layout import MatrixLayout
from emitter.families.gemm.workload import ProblemData
from emitter.kit.torch_interop import CudaArray, torch_dtype
from emitter.kit.hostdata import bits_of, decode, poison_value, storage_dtype

SAMPLE_ROWS = 48
SAMPLE_COLS = 256


def tolerance(cfg: Any) -> float:
    """Relative Frobenius error allowed for an instance's types: emitter.verify's, the one source of truth."""
    from emitter.families.gemm.reference import tolerance as verify_tolerance

    return float(verify_tolerance(cfg))


# -------------------------------------------------------------------------------------------- torch views
def torch_view(torch: Any, ptr: int, lay: MatrixLayout, dt: DType) -> Any:
    """Logical (batch, rows, cols) torch view of a device buffer with `lay`'s strides, dtype `dt`."""
    n = lay.elements()
    raw = {DType.s8: "|i1", DType.s32: "<i4", DType.f16: "<f2", DType.f64: "<f8"}.get(dt)
    flat = torch.as_tensor(CudaArray(ptr, n, dt.bytes, raw), device="cuda")
    want = torch_dtype(torch, dt)
    if flat.dtype != want:
        flat = flat.view(want)
    stride = (lay.batch_stride, lay.ld, 1) if lay.row_major else (lay.batch_stride, 1, lay.ld)
    return torch.as_strided(flat, (lay.batch, lay.rows, lay.cols), stride)


# -------------------------------------------------------------------------------------------- checks
def _result(passed: bool, reason: str | None, rel: float | None, tol: float, unwritten: int, nonfinite: int,
            mismatches: int, reference: str) -> dict[str, Any]:
    return {"passed": passed, "reason": reason, "rel_err": rel, "tolerance": tol, "unwritten": unwritten,
            "nonfinite": nonfinite, "mismatches": mismatches, "reference": reference}


def poison_d(data: ProblemData, set_index: int = 0) -> None:
    s = data.sets[set_index]
    data.arena.fill_bytes(s.D, poison_value(data.cfg.d), data.lay.D.elements())


def _signed_bits(dt: DType) -> int:
    v = int(bits_of(np.asarray(poison_value(dt)).reshape(1)).astype(np.int64)[0])
    width = 8 * dt.bytes
    return v - (1 << width) if v >= 1 << (width - 1) else v


def check_torch(data: ProblemData, cfg: Any, split_k: int = 1) -> dict[str, Any]:
    """Full-output check on the GPU: verify's tolerance and element-wise bound, on torch views of set 0."""
    import torch

    from emitter.families.gemm.reference import apply_activation, element_bound

    lay, s = data.lay, data.sets[0]
    precise = data.cfg.a in (DType.f32, DType.f64) and cfg.op_class != "tensorop"
    ftype = torch.float64 if precise else torch.float32
    if data.reference is None:
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            A = torch_view(torch, s.A, lay.A, data.cfg.a).to(ftype)
            B = torch_view(torch, s.B, lay.B, data.cfg.b).to(ftype)
            z = data.alpha * torch.matmul(A, B)
            del A, B
            if data.beta != 0:
                z += data.beta * torch_view(torch, s.C, lay.C, data.cfg.c).to(ftype)
            if data.cfg.bias != "none":
                nb = data.problem.m if data.cfg.bias == "row" else data.problem.n
                vec = torch_view(torch, s.bias, MatrixLayout(1, nb, True, nb), data.cfg.c).to(ftype).reshape(-1)
                z += vec[None, :, None] if data.cfg.bias == "row" else vec[None, None, :]
            z = apply_activation(z, cfg.activation, cfg.clamp_min, cfg.clamp_max, cfg.gelu)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        data.reference = z
    ref = data.reference
    D = torch_view(torch, s.D, lay.D, cfg.d)
    int_view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[cfg.d.bytes]
    unwritten_mask = D.view(int_view) == _signed_bits(cfg.d) if cfg.d.is_float else torch.zeros_like(D, dtype=torch.bool)
    unwritten = int(unwritten_mask.sum().item())
    got = D.to(ftype)
    nonfinite = int((~torch.isfinite(got) & ~unwritten_mask).sum().item())
    tol = tolerance(cfg)
    how = f"torch {str(ftype).replace('torch.', '')} (no TF32) on the GPU, every element"
    if unwritten:
        return _result(False, f"{unwritten} of {D.numel()} elements never written (still poison)", None, tol,
                       unwritten, nonfinite, 0, how)
    if nonfinite:
        return _result(False, f"{nonfinite} NaN/Inf elements", None, tol, unwritten, nonfinite, 0, how)
    diff = (got - ref).abs()
    err = torch.linalg.vector_norm(diff.reshape(-1), dtype=torch.float64).item()
    norm = torch.linalg.vector_norm(ref.reshape(-1), dtype=torch.float64).item()
    rel = err / norm if norm > 0 else (0.0 if err == 0 else math.inf)
    rms = norm / math.sqrt(max(ref.numel(), 1))
    split_k = max(1, int(split_k))
    mismatches = int((diff > element_bound(cfg, ref.abs(), rms, split_k, data.problem.k)).sum().item())
    del diff, got
    if rel > tol or mismatches:
        why = f"rel err {rel:.3g} > tol {tol:g}" if rel > tol else f"rel err {rel:.3g} <= tol {tol:g} but"
        return _result(False, f"{why}; {mismatches} elements outside the element-wise bound", rel, tol, 0, 0,
                       mismatches, how)
    return _result(True, None, rel, tol, 0, 0, 0, how)


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


def check_host(data: ProblemData, cfg: Any, split_k: int = 1) -> dict[str, Any]:
    """float64 reference on sampled rows x columns (every batch), compared by emitter.verify's compare();
    the poison count covers the whole output."""
    from emitter.families.gemm.reference import compare, reference_gemm

    lay, s, dc = data.lay, data.sets[0], data.cfg
    arena = data.arena
    rng = np.random.default_rng(1234)
    rows = _sample(data.problem.m, SAMPLE_ROWS, rng)
    cols = _sample(data.problem.n, SAMPLE_COLS, rng)

    def host(ptr: int, layout: MatrixLayout, dt: DType) -> np.ndarray:
        return arena.to_host(ptr, storage_dtype(dt), layout.elements())

    all_k = np.arange(data.problem.k)
    A = decode(_gather(host(s.A, lay.A, dc.a), lay.A, rows, all_k), dc.a)
    B = decode(_gather(host(s.B, lay.B, dc.b), lay.B, all_k, cols), dc.b)
    C = decode(_gather(host(s.C, lay.C, dc.c), lay.C, rows, cols), dc.c) if data.beta != 0 else None
    bias = None
    if dc.bias != "none":
        nb = data.problem.m if dc.bias == "row" else data.problem.n
        vec = decode(arena.to_host(s.bias, storage_dtype(dc.c), nb), dc.c)
        bias = vec[rows] if dc.bias == "row" else vec[cols]
    ref = reference_gemm(cfg, data.alpha, data.beta, A, B, C, bias, device=None)
    dstore = host(s.D, lay.D, cfg.d)
    how = f"numpy float64 on the host, {len(rows)} rows x {len(cols)} columns sampled"
    tol = tolerance(cfg)
    if cfg.d.is_float:   # every element written: the poison count over the whole (packed) output
        unwritten = int(np.count_nonzero(bits_of(dstore) == bits_of(np.asarray(poison_value(cfg.d)).reshape(1))[0]))
        if unwritten:
            return _result(False, f"{unwritten} of {dstore.size} elements never written (still poison)", None, tol,
                           unwritten, 0, 0, how)
    cmp = compare(cfg, _gather(dstore, lay.D, rows, cols), ref, exact=False,
                  split_k=max(1, int(split_k)), k=data.problem.k)
    return _result(cmp.status == "PASSED", cmp.reason or None, cmp.rel_err, tol, cmp.unwritten, cmp.nonfinite,
                   cmp.mismatches, how)


def check(data: ProblemData, cfg: Any, use_torch: bool, split_k: int = 1) -> dict[str, Any]:
    """Compare D of operand set 0 with the reference; split_k: the slices the kernel ran with (serial split-K
    rounds each partial to D's type, which the element-wise bound allows for)."""
    return check_torch(data, cfg, split_k) if use_torch else check_host(data, cfg, split_k)

