"""The GEMM family's fake-backend computation (RuntimeFamily.fake_run): what a correct kernel would write to
D, from the storage buffers, in numpy -- with planted faults.

Written independently of the verifier's side on purpose (issue 27.4): nothing here is shared with
reference.py, inputs.py or layout.py -- not the strided-matrix code (operands are read through
numpy.lib.stride_tricks views built from the problem's leading dimensions and batch strides, with their
own bounds check), not the dtype codecs (own bf16 / fp8 decoding and round-to-nearest-even encoding), not
the epilogue activations. A bug on either side therefore shows up as a disagreement instead of cancelling
out (tests/stages/test_family_seam.py plants one in the reference and sees verify fail).

It computes in the accumulator's precision (float32 for f32/tf32/f16/bf16 accumulators, so tolerances
are exercised), applies the instance's epilogue, rounds to D's type and writes D's storage.

Faults (FAKE_FAULTS; each {kind, select?, problem?, ...}, see emitter.runtime.fake_backend):
  wrong        one element off by `delta` (default 1.0) at `at` = [b, i, j] (default the last element)
  nan          one element NaN (at `at`)
  unwritten    one element left as poison (at `at`); `row: true` leaves the whole last row
  noise        relative Gaussian noise of size `eps` on every element
  wrong_ld     ignore the given leading dimensions (packed instead)
  swap_layout  read A with the other layout
  drop_beta    compute as if beta were 0
  wrong_activation   apply `activation` (default relu, or identity when the instance uses relu)
  skip_last_k  accumulate only k-1 terms (an off-by-one in the K loop bound)
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import numpy as np
from numpy.lib.stride_tricks import as_strided

from emitter.dtypes import DType
from emitter.kit.failures import CannotImplement, CudaFault
from emitter.kit.hostdata import poison_value
from emitter.families.gemm.options import unsupported

FAKE_FAULTS = ("wrong", "nan", "unwritten", "noise", "wrong_ld", "swap_layout", "drop_beta", "wrong_activation",
               "skip_last_k")


# ---------------------------------------------------------------------------------------------- own codecs
@functools.lru_cache(maxsize=None)
def _fp8_values(dt: DType) -> np.ndarray:
    """Value of each of the 256 codes, computed arithmetically (vectorised; NaN codes NaN, e5m2 inf)."""
    code = np.arange(256, dtype=np.int64)
    man_bits, bias, emax = (3, 7, 15) if dt is DType.e4m3 else (2, 15, 31)
    sign = np.where(code >= 128, -1.0, 1.0)
    e = (code >> man_bits) & emax
    f = (code & ((1 << man_bits) - 1)).astype(np.float64) / (1 << man_bits)
    v = sign * np.where(e == 0, f * 2.0 ** (1 - bias), (1.0 + f) * np.exp2(e - bias))
    if dt is DType.e4m3:
        v[(code & 0x7F) == 0x7F] = np.nan
    else:
        top = e == emax
        v[top] = np.where(f[top] == 0, sign[top] * np.inf, np.nan)
    return v


def _read(storage: np.ndarray, dt: DType) -> np.ndarray:
    """Storage -> float64."""
    storage = np.asarray(storage)
    if dt is DType.bf16:
        return (storage.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    if dt.is_fp8:
        return _fp8_values(dt)[storage.astype(np.int64)]
    return storage.astype(np.float64)


def _write(x: np.ndarray, dt: DType, like: np.dtype) -> np.ndarray:
    """float64 -> storage of dt (round to nearest, ties to even; fp8 saturating; integers saturating)."""
    x = np.asarray(x, dtype=np.float64)
    if dt is DType.bf16:
        bits = np.asarray(x.astype(np.float32)).view(np.uint32)
        upper, lower = bits >> np.uint32(16), bits & np.uint32(0xFFFF)
        up = (lower > 0x8000) | ((lower == 0x8000) & ((upper & 1) == 1))
        return np.asarray(np.where(np.isnan(x), 0x7FC0, upper + up.astype(np.uint32)).astype(np.uint16))
    if dt.is_fp8:
        table = _fp8_values(dt)
        codes = np.array([c for c in range(128) if math.isfinite(table[c])], dtype=np.int64)
        vals = table[codes]                                  # ascending with the code
        a = np.minimum(np.abs(x), vals[-1])                  # satfinite
        hi = np.clip(np.searchsorted(vals, a), 0, len(vals) - 1)
        lo = np.maximum(hi - 1, 0)
        dlo, dhi = a - vals[lo], vals[hi] - a
        take_lo = (dlo < dhi) | ((dlo == dhi) & (codes[lo] % 2 == 0))
        c = np.where(take_lo, codes[lo], codes[hi]) | np.where(np.signbit(x), 0x80, 0)
        c = np.where(np.isnan(x), 0x7F if dt is DType.e4m3 else 0x7E, c)
        return c.astype(np.uint8)
    if dt in (DType.s8, DType.s32):
        lo, hi = (-128, 127) if dt is DType.s8 else (-(2 ** 31), 2 ** 31 - 1)
        return np.clip(np.round(np.nan_to_num(x)), lo, hi).astype(like)
    return x.astype(like)


# ---------------------------------------------------------------------------------------------- own layouts
def _strided(storage: np.ndarray, rows: int, cols: int, row_major: bool, ld: int, batch: int, bstride: int,
             what: str) -> np.ndarray:
    """A (batch, rows, cols) view of flat storage; CudaFault when an element lies past the buffer."""
    if rows == 0 or cols == 0 or batch == 0:
        return np.zeros((batch, rows, cols), dtype=storage.dtype)
    r_step, c_step = (ld, 1) if row_major else (1, ld)
    last = (batch - 1) * bstride + (rows - 1) * r_step + (cols - 1) * c_step
    if last >= storage.shape[0] or min(ld, bstride if batch > 1 else 0) < 0:
        raise CudaFault(f"an illegal memory access was encountered (fake: {what} element {last} of a "
                        f"{storage.shape[0]}-element buffer)")
    isz = storage.itemsize
    return as_strided(storage, shape=(batch, rows, cols), strides=(bstride * isz, r_step * isz, c_step * isz))


# ---------------------------------------------------------------------------------------------- own epilogue
def _activation(z: np.ndarray, name: str, lo: float, hi: float, gelu: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "identity":
            return z
        if name == "relu":
            return np.where(z < 0.0, 0.0, z)                  # NaN stays NaN
        if name == "clamp":
            return np.where(z < lo, lo, np.where(z > hi, hi, z))
        if name == "sigmoid":
            return np.exp(-np.logaddexp(0.0, -z))
        if name == "silu":
            return z * np.exp(-np.logaddexp(0.0, -z))
        if name == "gelu":
            if gelu == "tanh":
                c = math.sqrt(2.0 / math.pi)
                return z * 0.5 * (1.0 + np.tanh(c * z * (1.0 + 0.044715 * z * z)))
            erf = np.vectorize(math.erf, otypes=[np.float64])
            return z * 0.5 * (1.0 + erf(z / math.sqrt(2.0)))
    raise ValueError(f"fake backend: unknown activation {name!r}")


# ---------------------------------------------------------------------------------------------- the hook
def _refuse(name: str, cfg: Any, p: Any) -> None:
    """The shim's can_implement, modelled (split-K, batch, no C operand, options, alignments)."""
    if p.split_k > 1 and cfg.split_k == "none":
        raise CannotImplement(f"{name}: split-K is not enabled for this instance")
    if p.batch > 1 and not cfg.batched:
        raise CannotImplement(f"{name}: batched problems are not enabled for this instance")
    if not cfg.source and p.beta != 0.0:
        raise CannotImplement(f"{name}: no C operand (epilogue source: false), so beta must be 0, not {p.beta}")
    why = unsupported(cfg, p.options)
    if why:
        raise CannotImplement(f"{name}: {why}")
    checks = [(p.k if cfg.row_major_a else p.m, cfg.alignment_a, "A's contiguous extent"),
              (p.n if cfg.row_major_b else p.k, cfg.alignment_b, "B's contiguous extent"),
              (p.n if cfg.row_major_c else p.m, cfg.alignment_c, "C's contiguous extent")]
    checks += [(v, al, what) for v, al, what in ((p.lda, cfg.alignment_a, "lda"), (p.ldb, cfg.alignment_b, "ldb"),
                                                 (p.ldc, cfg.alignment_c, "ldc"), (p.ldd, cfg.alignment_c, "ldd")) if v]
    for v, al, what in checks:
        if v % al:
            raise CannotImplement(f"{name}: {what}={v} is not a multiple of the alignment {al}")


def fake_run(cfg: Any, p: Any, buffers: Mapping[str, Any], faults: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """D's storage after a fake launch of resolved problem p (explicit leading dims and batch strides)."""
    _refuse(cfg.name, cfg, p)
    m, n, k, batch = p.m, p.n, p.k, p.batch
    lda, ldb, ldc, ldd = p.lda, p.ldb, p.ldc, p.ldd
    if "wrong_ld" in faults:      # a kernel that assumes packed operands
        lda = k if cfg.row_major_a else m
        ldb = n if cfg.row_major_b else k
        ldc = ldd = n if cfg.row_major_c else m
    row_a = cfg.row_major_a
    if "swap_layout" in faults:
        row_a = not row_a
        lda = k if row_a else m
    A = _read(_strided(buffers["A"], m, k, row_a, lda, batch, p.batch_stride_a, "A"), cfg.a)
    B = _read(_strided(buffers["B"], k, n, cfg.row_major_b, ldb, batch, p.batch_stride_b, "B"), cfg.b)
    kk = k - 1 if "skip_last_k" in faults else k
    acc_t = np.float32 if cfg.accumulator in (DType.f32, DType.tf32, DType.f16, DType.bf16) else np.float64
    acc = np.einsum("bik,bkj->bij", A[:, :, :kk].astype(acc_t), B[:, :kk, :].astype(acc_t)).astype(np.float64)
    z = p.alpha * acc
    beta = 0.0 if "drop_beta" in faults else p.beta
    if beta != 0.0 and buffers.get("C") is not None:
        z = z + beta * _read(_strided(buffers["C"], m, n, cfg.row_major_c, ldc, batch, p.batch_stride_c, "C"), cfg.c)
    if cfg.bias != "none" and buffers.get("bias") is not None:
        vec = _read(np.asarray(buffers["bias"]), cfg.c)
        z = z + (vec.reshape(1, m, 1) if cfg.bias == "row" else vec.reshape(1, 1, n))
    act = cfg.activation
    if "wrong_activation" in faults:
        act = faults["wrong_activation"].get("activation") or ("identity" if act == "relu" else "relu")
    z = _activation(z, act, cfg.clamp_min, cfg.clamp_max, cfg.gelu)
    if "noise" in faults:
        rng = np.random.default_rng(0)
        z = z * (1.0 + float(faults["noise"].get("eps", 1e-3)) * rng.standard_normal(z.shape))
    out = np.array(buffers["D"], copy=True)
    vals = _write(z, cfg.d, out.dtype)
    if "wrong" in faults:
        b, i, j = faults["wrong"].get("at", [-1, -1, -1])
        vals[b, i, j] = _write(np.array(_read(vals[b, i, j], cfg.d) + float(faults["wrong"].get("delta", 1.0))),
                               cfg.d, out.dtype)
    if "nan" in faults and cfg.d.is_float:
        b, i, j = faults["nan"].get("at", [-1, -1, -1])
        vals[b, i, j] = _write(np.array(np.nan), cfg.d, out.dtype)
    if "unwritten" in faults:
        poison = poison_value(cfg.d)
        if faults["unwritten"].get("row"):
            vals[:, -1, :] = poison
        else:
            b, i, j = faults["unwritten"].get("at", [-1, -1, -1])
            vals[b, i, j] = poison
    view = _strided(out, m, n, cfg.row_major_c, ldd, batch, p.batch_stride_d, "D")
    view[...] = vals
    return {"D": out}
