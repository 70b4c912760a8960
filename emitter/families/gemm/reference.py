"""Reference GEMM in higher precision, the epilogue as CUTLASS defines it, tolerances and the comparison.

D = act(alpha * A @ B + beta * C + bias) in float64: numpy on the host for small problems; torch float64
on the GPU for large ones when torch is there (it shares PyCUDA's primary context). Activations follow
cutlass/epilogue/thread/activation.h: ReLu = max(x, 0); GELU = 0.5 x (1 + erf(x / sqrt 2)) (what
LinearCombinationGELU and the 3.x fusion use; GELU_taylor is the tanh form, selected by `gelu="tanh"`);
SiLu = x * sigmoid(x); Sigmoid = 1 / (1 + exp(-x)); Clamp = min(max(x, lo), hi). Integer outputs round to
nearest even and saturate (NumericConverterClamp).

Comparison: every element must have been written (poison gone) and be finite; then either bit for bit
against the reference rounded to D's type (`exact`: small-integer inputs whose every partial sum is exact),
or the relative Frobenius error ||D - ref|| / ||ref|| under the dtype's tolerance plus an element-wise bound
(so one badly wrong element in a large matrix cannot hide in the norm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from emitter.dtypes import DType
from emitter.families.gemm.config import GemmConfig
from emitter.kit.hostdata import bits_of, decode, encode, poison_value

# Problems with more multiply-adds than this use the GPU reference when one is available.
DEVICE_REFERENCE_MIN_MACS = 1 << 27

_SQRT1_2 = 1.0 / math.sqrt(2.0)


# ---------------------------------------------------------------------------------------------- activations
def _erf_numpy(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf  # type: ignore

        return erf(x)
    except ImportError:
        return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


def apply_activation(z: Any, activation: str, clamp_min: float = 0.0, clamp_max: float = 6.0,
                     gelu: str = "erf") -> Any:
    """The epilogue activation on a float64 numpy array or torch tensor (NaN propagates, as in CUTLASS)."""
    torch_mode = type(z).__module__.startswith("torch")
    if activation == "identity":
        return z
    if torch_mode:
        import torch

        if activation == "relu":
            return torch.where(torch.isnan(z), z, torch.clamp(z, min=0.0))
        if activation == "clamp":
            return torch.where(torch.isnan(z), z, torch.clamp(z, min=clamp_min, max=clamp_max))
        if activation == "sigmoid":
            return torch.sigmoid(z)
        if activation == "silu":
            return z * torch.sigmoid(z)
        if activation == "gelu":
            if gelu == "tanh":
                return 0.5 * z * (1.0 + torch.tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))
            return 0.5 * z * (1.0 + torch.special.erf(z * _SQRT1_2))
    else:
        z = np.asarray(z, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            if activation == "relu":
                return np.where(np.isnan(z), z, np.maximum(z, 0.0))
            if activation == "clamp":
                return np.where(np.isnan(z), z, np.minimum(np.maximum(z, clamp_min), clamp_max))
            if activation == "sigmoid":
                return 1.0 / (1.0 + np.exp(-z))
            if activation == "silu":
                return z / (1.0 + np.exp(-z))
            if activation == "gelu":
                if gelu == "tanh":
                    return 0.5 * z * (1.0 + np.tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))
                return 0.5 * z * (1.0 + _erf_numpy(z * _SQRT1_2))
    raise ValueError(f"unknown activation {activation!r}")


# ---------------------------------------------------------------------------------------------- reference
def reference_gemm(cfg: GemmConfig, alpha: float, beta: float, A: np.ndarray, B: np.ndarray,
                   C: np.ndarray | None, bias: np.ndarray | None, device: str | None = None) -> np.ndarray:
    """float64 (batch, M, N) reference of D (before rounding to D's type, except integer outputs, which are
    rounded and saturated as the kernel's converter does). A: (batch, M, K), B: (batch, K, N) float64."""
    batch, m, k = A.shape
    n = B.shape[2]
    if device and batch * m * n * max(k, 1) >= DEVICE_REFERENCE_MIN_MACS:
        try:
            return _reference_torch(cfg, alpha, beta, A, B, C, bias, device)
        except ImportError:
            pass
    z = alpha * np.matmul(A, B)
    if C is not None and beta != 0.0:
        z = z + beta * C
    if bias is not None and cfg.bias != "none":
        z = z + (bias[None, :, None] if cfg.bias == "row" else bias[None, None, :])
    z = apply_activation(z, cfg.activation, cfg.clamp_min, cfg.clamp_max, cfg.gelu)
    return _to_output_semantics(z, cfg.d)


def _reference_torch(cfg: GemmConfig, alpha: float, beta: float, A: np.ndarray, B: np.ndarray,
                     C: np.ndarray | None, bias: np.ndarray | None, device: str) -> np.ndarray:
    import torch

    dev = torch.device(device)
    tA = torch.from_numpy(np.ascontiguousarray(A)).to(dev)
    tB = torch.from_numpy(np.ascontiguousarray(B)).to(dev)
    z = alpha * torch.matmul(tA, tB)
    del tA, tB
    if C is not None and beta != 0.0:
        z += beta * torch.from_numpy(np.ascontiguousarray(C)).to(dev)
    if bias is not None and cfg.bias != "none":
        tb = torch.from_numpy(np.ascontiguousarray(bias)).to(dev)
        z += tb[None, :, None] if cfg.bias == "row" else tb[None, None, :]
    z = apply_activation(z, cfg.activation, cfg.clamp_min, cfg.clamp_max, cfg.gelu)
    out = z.cpu().numpy()
    del z
    torch.cuda.synchronize()
    return _to_output_semantics(out, cfg.d)


def _to_output_semantics(z: np.ndarray, d: DType) -> np.ndarray:
    if d in (DType.s8, DType.s32):
        info = np.iinfo(np.int8 if d is DType.s8 else np.int32)
        return np.clip(np.rint(z), info.min, info.max)
    return z


# ---------------------------------------------------------------------------------------------- tolerances
# fp8 fast accumulation (sm90a KernelTmaWarpSpecialized*FP8FastAccum, cuBLASLt use_fast_accum=True).
# The Hopper fp8 wgmma adds its products to the accumulator with a reduced-precision adder: the terms
# are aligned to the largest exponent and about 13-14 mantissa bits are kept (truncated), once per wgmma
# k-block (K = 32 for 8-bit inputs). The default CUTLASS fp8 mainloop promotes: every 4 k-blocks it adds
# the tensor-core partial into separate f32 registers, so truncation only touches short partial sums.
# Fast accumulation skips that: every k-block truncates relative to the whole running sum, so the error
# grows with K. The per-K error figures below were NOT measured in a recorded run of this project: they
# are estimates of max |D - ref| / (|ref| + rms) (e4m3 N(0,1) operands, against float64) without -> with
# fast accumulation, for a model that truncates to 13 fraction bits per 32-deep block; calibrate them on
# a GPU before relying on the exact numbers:
#     K = 256: 9.2e-4 -> 9.9e-4,  4096: 5.2e-4 -> 5.4e-3,  16384: 5.1e-4 -> 1.2e-2,  65536: 4.6e-4 -> 3.0e-2
#   (estimated relative Frobenius error 1.3e-4 -> 1.3e-3 / 3.1e-3 / 7.0e-3 at K = 4096 / 16384 / 65536).
# What was measured (H200, 2026-11-22, benchmarks/profile_sm90a.py): all 132 checks of the four emitted
# fast-accumulation kernels on the issue-6 shapes passed with this bound, relative Frobenius error (bf16
# output) at most 3.3e-3 at K = 16384; `emitter verify --quick` passed them too.
# The growth is about the square root of the number of k-blocks (truncation of products of either sign mostly cancels; only the
# running sum's own truncation is biased). So:
#   * the element-wise bound (fp8 allows 2e-2 of |ref| + rms) gets FAST_ACCUM_FACTOR * sqrt(ceil(K/32))
#     * 2^-13 more: 1.4e-2 at K = 4096, 5.5e-2 at 65536 -- 2.5x or more over the estimated error with the
#     2e-2 base, while a dropped k-block (typically sqrt(32 / K) of rms) still stands out up to K of
#     about 8k; at K = 65536 a correct kernel would fail the fixed fp8 bound (3.0e-2 > 2e-2), so the
#     loosening is needed for long reductions;
#   * the relative Frobenius tolerance (5e-2 for fp8) stays: 7e-3 estimated at K = 65536.
# Small integers stay exact: a sum of integers whose every partial sum is at most 2^13 in magnitude
# loses nothing at 13 kept bits (inputs.py limits fp8 `int` problems to that, with or without it).
FAST_ACCUM_BITS = 13
FAST_ACCUM_BLOCK_K = 32          # wgmma K for 8-bit inputs: one reduced-precision add per block
FAST_ACCUM_FACTOR = 10.0
FAST_ACCUM_DEFAULT_K = 16384     # when a caller does not say K: a generous LLM-sized reduction


def fast_accum(cfg: GemmConfig) -> bool:
    """Whether the instance accumulates fp8 with fast accumulation (GemmConfig.fast_accum)."""
    return bool(getattr(cfg, "fast_accum", False)) and (cfg.a.is_fp8 or cfg.b.is_fp8)


def fast_accum_tolerance(cfg: GemmConfig, k: int | None = None) -> float:
    """Extra element-wise relative error fast accumulation may add for a K-long reduction (0 without it)."""
    if not fast_accum(cfg):
        return 0.0
    blocks = math.ceil(max(1, int(k) if k else FAST_ACCUM_DEFAULT_K) / FAST_ACCUM_BLOCK_K)
    return FAST_ACCUM_FACTOR * math.sqrt(blocks) * 2.0 ** -FAST_ACCUM_BITS


def input_tolerance(cfg: GemmConfig) -> float:
    """Relative Frobenius tolerance from the math precision (operand types, op class, accumulator)."""
    ins = {cfg.a, cfg.b}
    if any(d.is_fp8 for d in ins):
        t = 5e-2
    elif ins & {DType.f16, DType.bf16}:
        t = 1e-2
    elif DType.tf32 in ins or (DType.f32 in ins and cfg.op_class == "tensorop"):
        t = 5e-3   # f32 operands on tensor cores run as tf32 (CUTLASS 2.x OpMultiplyAdd / 3.x GMMA)
    elif DType.f32 in ins:
        t = 1e-5
    elif DType.f64 in ins:
        t = 1e-12
    else:      # integer operands: exact products and s32 sums; error only from a float epilogue
        t = 1e-5
    if cfg.accumulator is DType.f16:
        t = max(t, 2e-2)
    if cfg.epilogue_compute in (DType.f16, DType.bf16):
        t = max(t, 1e-2)
    if cfg.activation == "gelu" and cfg.gelu == "tanh":
        t = max(t, 2e-3)   # GELU_taylor uses tanh.approx (about 2^-11 relative)
    return t


def output_tolerance(d: DType) -> float:
    """What rounding to D's type alone costs (relative Frobenius, with margin)."""
    return {DType.f16: 1e-3, DType.bf16: 8e-3, DType.e4m3: 5e-2, DType.e5m2: 1e-1,
            DType.f32: 1e-6, DType.tf32: 5e-3, DType.f64: 1e-12, DType.s8: 1e-2, DType.s32: 1e-6}[d]


def tolerance(cfg: GemmConfig) -> float:
    return max(input_tolerance(cfg), output_tolerance(cfg.d))


ELEMENT_FACTOR = 5.0    # legacy loose bound (|D - ref| <= ELEMENT_FACTOR * tol * (|ref| + rms)); see element_bound


def element_tolerances(cfg: GemmConfig, k: int | None = None) -> tuple[float, float]:
    """(rel_out, math) for the element-wise bound |D - ref| <= rel_out * |ref| + math * (|ref| + rms(ref)).

    rel_out: twice the half-ulp of D's type (rounding to D). math: what the operand precision and the
    accumulation can add, relative to the element and to the matrix's typical magnitude; about ten times
    what correct kernels show, far under what one wrong element (an off-by-one, a dropped term) costs.
    fp8 fast accumulation adds its K-dependent allowance (fast_accum_tolerance, see above)."""
    rel_out = {DType.f16: 1e-3, DType.bf16: 8e-3, DType.tf32: 1e-3, DType.f32: 2.4e-7, DType.f64: 1e-15,
               DType.e4m3: 0.125, DType.e5m2: 0.25, DType.s8: 0.0, DType.s32: 0.0}[cfg.d]
    ins = {cfg.a, cfg.b}
    if any(d.is_fp8 for d in ins):
        math_tol = 2e-2
    elif ins & {DType.f16, DType.bf16}:
        math_tol = 2e-3
    elif DType.tf32 in ins or (DType.f32 in ins and cfg.op_class == "tensorop"):
        math_tol = 5e-3
    elif DType.f32 in ins:
        math_tol = 2e-5
    elif DType.f64 in ins:
        math_tol = 1e-12
    else:
        math_tol = 1e-5
    if cfg.accumulator is DType.f16:
        math_tol = max(math_tol, 0.2)
    if cfg.epilogue_compute in (DType.f16, DType.bf16):
        math_tol = max(math_tol, 2e-2)
    if cfg.activation == "gelu" and cfg.gelu == "tanh":
        math_tol = max(math_tol, 4e-3)
    return rel_out, math_tol + fast_accum_tolerance(cfg, k)


def element_bound(cfg: GemmConfig, ref_abs: Any, rms: float, split_k: int = 1, k: int | None = None) -> Any:
    """The element-wise bound for |D - ref| (numpy array or torch tensor of |ref|).

    Serial split-K (CUTLASS 2.x) passes each slice's partial sum through D's type, so a correct kernel
    rounds split_k - 1 partials, each up to a few times the matrix's typical magnitude (seen on an H200:
    bf16, 129x136x4096 in 4 slices, max |error| 1.43 at rms 64, rel err 2.6e-3): that much more is allowed."""
    rel_out, math_tol = element_tolerances(cfg, k)
    partials = rel_out * 4.0 * rms * (split_k - 1) if split_k > 1 else 0.0
    return rel_out * ref_abs + math_tol * (ref_abs + rms) + partials + 1e-30


# ---------------------------------------------------------------------------------------------- comparison
@dataclass
class Comparison:
    status: str                 # PASSED | FAILED
    check: str                  # exact | tolerance
    reason: str = ""
    max_abs_err: float | None = None
    rel_err: float | None = None
    tol: float | None = None
    worst: dict[str, Any] | None = None      # {"batch", "row", "col", "got", "want"}
    unwritten: int = 0
    nonfinite: int = 0
    mismatches: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status, "check": self.check, "reason": self.reason, "max_abs_err": self.max_abs_err,
            "rel_err": self.rel_err, "tol": self.tol, "worst": self.worst, "unwritten": self.unwritten,
            "nonfinite": self.nonfinite, "mismatches": self.mismatches,
        }


def _coords(flat: int, shape: tuple[int, ...]) -> tuple[int, int, int]:
    b, i, j = np.unravel_index(int(flat), shape)
    return int(b), int(i), int(j)


def _f(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def compare(cfg: GemmConfig, d_storage: np.ndarray, ref: np.ndarray, exact: bool, split_k: int = 1,
            k: int | None = None) -> Comparison:
    """Check kernel output D (storage, logical shape (batch, M, N)) against the reference (float64).
    `k` (the problem's K) sizes the fp8 fast-accumulation allowance; without it a large K is assumed."""
    d = cfg.d
    shape = ref.shape
    tol = None if exact else tolerance(cfg)
    check = "exact" if exact else "tolerance"
    got = decode(d_storage, d)
    poison_bits = bits_of(np.asarray(poison_value(d)).reshape(1))[0]
    dbits = bits_of(np.ascontiguousarray(d_storage))
    want_stored = encode(ref, d)

    # 1. unwritten elements (still the poison pattern; for integers only where the reference differs)
    unwritten_mask = dbits == poison_bits
    if not d.is_float:
        unwritten_mask &= bits_of(want_stored) != poison_bits
    unwritten = int(unwritten_mask.sum())
    # 2. NaN / Inf
    nonfinite_mask = ~np.isfinite(got) & ~unwritten_mask
    nonfinite = int(nonfinite_mask.sum())

    diff = np.abs(np.where(np.isfinite(got), got, 0.0) - ref)
    ref_norm = float(np.linalg.norm(ref.ravel()))
    err_norm = float(np.linalg.norm(np.where(unwritten_mask | nonfinite_mask, 0.0, diff).ravel()))
    rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    max_abs = float(diff.max()) if diff.size else 0.0

    def worst_at(flat: int) -> dict[str, Any]:
        b, i, j = _coords(flat, shape)
        g = float(got[b, i, j])
        return {"batch": b, "row": i, "col": j, "got": g if math.isfinite(g) else str(g),
                "want": float(ref[b, i, j]), "got_bits": hex(int(dbits[b, i, j]))}

    cmp = Comparison("PASSED", check, max_abs_err=_f(max_abs), rel_err=_f(rel), tol=tol,
                     unwritten=unwritten, nonfinite=nonfinite)
    if diff.size:
        cmp.worst = worst_at(int(np.argmax(diff)))
    if unwritten:
        flat = int(np.flatnonzero(unwritten_mask)[0])
        cmp.worst = worst_at(flat)
        b, i, j = _coords(flat, shape)
        cmp.status = "FAILED"
        cmp.reason = (f"{unwritten} of {ref.size} elements never written (still poison), first at "
                      f"batch={b} row={i} col={j}")
        return cmp
    if nonfinite:
        flat = int(np.flatnonzero(nonfinite_mask)[0])
        cmp.worst = worst_at(flat)
        b, i, j = _coords(flat, shape)
        cmp.status = "FAILED"
        cmp.reason = f"{nonfinite} NaN/Inf elements, first at batch={b} row={i} col={j} ({got[b, i, j]})"
        return cmp

    if exact:
        mism = bits_of(want_stored) != dbits
        n = int(mism.sum())
        cmp.mismatches = n
        if n:
            flat = int(np.argmax(np.where(mism, diff, -1.0)))
            cmp.worst = worst_at(flat)
            w = cmp.worst
            cmp.status = "FAILED"
            cmp.reason = (f"exact check: {n} of {ref.size} elements differ bit for bit; worst at batch={w['batch']} "
                          f"row={w['row']} col={w['col']}: got {w['got']} want {w['want']}")
        return cmp

    # tolerance check
    if not d.is_float:
        bad = diff > 1.0
        n = int(bad.sum())
        cmp.mismatches = n
        if n or rel > tol:
            cmp.status = "FAILED"
            w = cmp.worst or {}
            cmp.reason = (f"integer output: {n} elements off by more than 1, rel err {rel:.3g} (tol {tol:g}); "
                          f"worst at batch={w.get('batch')} row={w.get('row')} col={w.get('col')}: "
                          f"got {w.get('got')} want {w.get('want')}")
        return cmp
    rms = ref_norm / math.sqrt(max(ref.size, 1))
    bound = element_bound(cfg, np.abs(ref), rms, split_k, k)
    bad = diff > bound
    n = int(bad.sum())
    cmp.mismatches = n
    if rel > tol or n:
        cmp.status = "FAILED"
        if n:
            flat = int(np.argmax(np.where(bad, diff / bound, -1.0)))
            cmp.worst = worst_at(flat)
        w = cmp.worst or {}
        why = f"rel err {rel:.3g} > tol {tol:g}" if rel > tol else f"rel err {rel:.3g} <= tol {tol:g}, but"
        cmp.reason = (f"{why}; {n} elements outside the element-wise bound; worst at batch={w.get('batch')} "
                      f"row={w.get('row')} col={w.get('col')}: got {w.get('got')} want {w.get('want')}")
    return cmp


# ---------------------------------------------------------------------------------------------- the hooks
def reference_case(cfg: GemmConfig, p: Any, inputs: Any, device: str | None = None) -> np.ndarray:
    """RuntimeFamily.reference: D's float64 reference for a verify case's inputs (GemmInputs)."""
    v = inputs.values
    return reference_gemm(cfg, p.alpha, p.beta, v["A"], v["B"], v["C"], v.get("bias"), device=device)


def compare_case(cfg: GemmConfig, p: Any, inputs: Any, outputs: Any, ref: np.ndarray) -> dict[str, Any]:
    """RuntimeFamily.compare: D (storage after the launch) against the reference, and no write outside D's
    matrices (padding between rows / batches keeps its poison)."""
    d_storage = outputs["D"]
    ld = inputs.values["layouts"]["D"]
    d_logical = ld.gather(d_storage)
    outside = ld.outside_mask(d_storage.shape[0])
    poison_bits = bits_of(np.asarray(poison_value(cfg.d)).reshape(1))[0]
    stray = 0 if outside is None else int((bits_of(d_storage)[outside] != poison_bits).sum())
    cmp = compare(cfg, d_logical, ref, inputs.exact, split_k=p.split_k, k=p.k)
    out = cmp.as_dict()
    if stray and out["status"] == "PASSED" and outside is not None:
        first = int(np.flatnonzero(outside & (bits_of(d_storage) != poison_bits))[0])
        out["status"] = "FAILED"
        out["reason"] = f"{stray} elements written outside D's matrices (first at storage index {first})"
    out["stray_writes"] = stray
    return out
