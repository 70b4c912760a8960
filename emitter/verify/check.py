"""One verification case: instance x problem x seed -> inputs, poisoned output, launch, reference, verdict.

Runs inside a worker process (emitter.verify.worker) or inline. Inputs are fresh random values from
`seed` (reported, so a failure replays): small integers (`int` problems: every partial sum exact, so the
result is checked bit for bit) or normal values (`normal`: checked with the dtype's tolerance), never
zeros. Storage outside the logical matrices (padded leading dimensions, batch strides) holds NaN (or
large integers): a kernel reading there poisons its result. D is poisoned everywhere first; afterwards
every element must be written and nothing outside D's matrices touched.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from emitter.dtypes import DType
from emitter.runtime.backend import (
    Backend, CannotImplement, CudaFault, GemmBuffers, GemmProblem, Kernel, LaunchFailed, RuntimeBackendError,
)
from emitter.runtime.config import GemmConfig
from emitter.runtime.hostdata import (
    MatrixLayout, bits_of, decode, encode, exact_int_limit, poison_value, quantize, storage_dtype,
)
from emitter.verify.problems import VerifyProblem
from emitter.verify.reference import compare, reference_gemm

EXACT_ACTIVATIONS = ("identity", "relu", "clamp")


def case_seed(base_seed: int, instance: str, label: str) -> int:
    """Deterministic per-case seed from the run's seed (so `--seed` replays every case)."""
    return (int(base_seed) * 1_000_003 + zlib.crc32(f"{instance}|{label}".encode())) % (1 << 63)


# ---------------------------------------------------------------------------------------------- inputs
@dataclass
class Inputs:
    A: np.ndarray           # logical float64 (batch, M, K)
    B: np.ndarray           # (batch, K, N)
    C: np.ndarray           # (batch, M, N)
    bias: np.ndarray | None
    buffers: GemmBuffers
    layouts: dict[str, MatrixLayout]
    exact: bool
    int_range: tuple[int, int] | None = None


def _acc_limit(cfg: GemmConfig, p: GemmProblem) -> int:
    limit = {DType.f32: 1 << 24, DType.tf32: 1 << 24, DType.f16: 2048, DType.bf16: 256, DType.f64: 1 << 53,
             DType.s32: (1 << 31) - 1}.get(cfg.accumulator, 2048)
    if cfg.a.is_fp8 or cfg.b.is_fp8:
        # Hopper fp8 MMA accumulates with reduced internal precision (about 13-14 kept bits); sums of
        # integers up to 2^13 stay exact with or without fast accumulation (verify.reference)
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


def make_inputs(cfg: GemmConfig, p: GemmProblem, data: str, seed: int) -> Inputs:
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
    buffers = GemmBuffers(A=_storage(la, sA, cfg.a), B=_storage(lb, sB, cfg.b), C=_storage(lc, sC, cfg.c), D=D,
                          bias=sbias)
    return Inputs(A, B, C, bias, buffers, {"A": la, "B": lb, "C": lc, "D": ld}, exact,
                  (r, rc) if data == "int" else None)


# ---------------------------------------------------------------------------------------------- one case
def _result(kernel_name: str, vp: VerifyProblem, seed: int, status: str, reason: str = "", **kw: Any) -> dict[str, Any]:
    out = {"instance": kernel_name, "problem": vp.label, "problem_spec": vp.as_dict(), "seed": seed,
           "status": status, "reason": reason}
    out.update(kw)
    return out


def run_case(backend: Backend, kernel: Kernel, vp: VerifyProblem, seed: int,
             on_launch: Callable[[], None] | None = None, on_launched: Callable[[], None] | None = None) -> dict[str, Any]:
    """Verify `kernel` on `vp`; returns a result dict (status PASSED / FAILED / SKIPPED, errors, worst element).

    A CudaFault is returned as FAILED with `fatal: True` (the caller must drop the CUDA context)."""
    t0 = time.perf_counter()
    cfg = kernel.config
    p = vp.gemm.resolved(cfg)
    inp = make_inputs(cfg, p, vp.data, seed)
    if hasattr(backend, "problem_label"):
        backend.problem_label = vp.label
    if on_launch:
        on_launch()
    try:
        res = backend.run(kernel, p, inp.buffers)
    except CannotImplement as e:
        return _result(kernel.name, vp, seed, "SKIPPED", str(e), wall_s=time.perf_counter() - t0)
    except CudaFault as e:
        return _result(kernel.name, vp, seed, "FAILED", f"CUDA fault: {e}", fatal=True, wall_s=time.perf_counter() - t0)
    except LaunchFailed as e:
        return _result(kernel.name, vp, seed, "FAILED", f"launch failed: {e}", wall_s=time.perf_counter() - t0)
    except RuntimeBackendError as e:
        return _result(kernel.name, vp, seed, "FAILED", f"{type(e).__name__}: {e}", wall_s=time.perf_counter() - t0)
    if on_launched:
        on_launched()

    ld = inp.layouts["D"]
    d_logical = ld.gather(res.D)
    # writes outside D's matrices (padding between rows / batches)
    outside = ld.outside_mask(res.D.shape[0])
    poison_bits = bits_of(np.asarray(poison_value(cfg.d)).reshape(1))[0]
    stray = 0 if outside is None else int((bits_of(res.D)[outside] != poison_bits).sum())

    ref = reference_gemm(cfg, p.alpha, p.beta, inp.A, inp.B, inp.C, inp.bias, device=backend.reference_device)
    cmp = compare(cfg, d_logical, ref, inp.exact, split_k=p.split_k, k=p.k)
    status, reason = cmp.status, cmp.reason
    if stray and status == "PASSED" and outside is not None:
        first = int(np.flatnonzero(outside & (bits_of(res.D) != poison_bits))[0])
        status, reason = "FAILED", f"{stray} elements written outside D's matrices (first at storage index {first})"
    macs = p.batch * p.m * p.n * p.k
    time_ms = res.time_ms
    return _result(
        kernel.name, vp, seed, status, reason,
        **{k: v for k, v in cmp.as_dict().items() if k not in ("status", "reason")},
        stray_writes=stray, int_range=list(inp.int_range) if inp.int_range else None,
        time_ms=time_ms, tflops=(2 * macs / (time_ms * 1e-3) / 1e12) if time_ms else None,
        launch=res.launch, wall_s=time.perf_counter() - t0,
    )


