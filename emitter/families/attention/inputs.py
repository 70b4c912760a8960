"""Input generation and the storage layout of one verify case.

Data kinds (DATA_KINDS):
  normal  Q, K, V ~ N(0, 1), rounded to the dtype
  int     small integers (Q, K in -2..2, V in -4..4): exact in every dtype, so the reference sees the very
          values the kernel reads and the scores are exact in f32
  large   Q, K ~ N(0, 16^2): scaled scores reach hundreds, so a softmax that does not subtract the row max
          overflows (exp(>88) = inf in f32); V ~ N(0, 1)

Storage (what the device buffers hold) follows attention_abi.h: flat arrays addressed as
base + b*stride_b + (cu[b] + s)*stride_s + h*stride_h + d with the problem's packed strides. `storage_index`
is the verify side's address computation (inputs and compare); the fake backend (fake.py) has its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from emitter.dtypes import DType
from emitter.families.attention.problem import AttentionProblem
from emitter.families.base import Inputs
from emitter.kit import hostdata

DATA_KINDS = ("normal", "int", "large")
LSE_DTYPE = DType.f32


def storage_index(p: AttentionProblem, name: str, b: int) -> np.ndarray:
    """Flat storage indices of sequence b of tensor `name` (q, k, v, o: shape [heads, seq_b, dim]; lse:
    [heads_q, seq_b])."""
    strides = p.strides()[name]
    cq, ck = p.cu_seqlens()
    sq, sk = p.lengths()[b]
    if name == "lse":
        sb, sh = strides
        start = cq[b] if p.varlen else 0
        base = (0 if p.varlen else b * sb) + start
        return base + np.arange(p.heads_q)[:, None] * sh + np.arange(sq)[None, :]
    sb, ss, sh = strides
    heads = p.heads_q if name in ("q", "o") else p.heads_kv
    rows = sq if name in ("q", "o") else sk
    start = (cq if name in ("q", "o") else ck)[b] if p.varlen else 0
    dim = p.head_dim if name in ("q", "k") else p.head_dim_v
    base = (0 if p.varlen else b * sb) + start * ss
    return (base + np.arange(heads)[:, None, None] * sh + np.arange(rows)[None, :, None] * ss
            + np.arange(dim)[None, None, :])


def _draw(rng: np.random.Generator, data: str, shape: tuple[int, ...], which: str) -> np.ndarray:
    if data == "normal":
        return rng.standard_normal(shape)
    if data == "int":
        hi = 4 if which == "v" else 2
        return rng.integers(-hi, hi + 1, size=shape).astype(np.float64)
    if data == "large":
        return rng.standard_normal(shape) * (16.0 if which in ("q", "k") else 1.0)
    raise ValueError(f"unknown attention data kind {data!r}: use one of {', '.join(DATA_KINDS)}")


def make_inputs(inst, p: AttentionProblem, data: str, seed: int) -> Inputs:
    """Fresh inputs (seeded), outputs poisoned. values: logical float64 per sequence:
    q [Hq, sq_b, D], k [Hkv, sk_b, D], v [Hkv, sk_b, Dv] (already rounded to the dtype)."""
    rng = np.random.default_rng(seed)
    dt: DType = inst.dtype
    n = p.elements()
    sdt = hostdata.storage_dtype(dt)
    buffers: dict[str, np.ndarray | None] = {}
    values: dict[str, list[np.ndarray]] = {"q": [], "k": [], "v": []}
    for name in ("q", "k", "v"):
        flat = np.full(n[name], hostdata.poison_value(dt), dtype=sdt)   # padding (pad > 0) holds NaN poison
        for b, (sq, sk) in enumerate(p.lengths()):
            heads = p.heads_q if name == "q" else p.heads_kv
            rows = sq if name == "q" else sk
            dim = p.head_dim_v if name == "v" else p.head_dim
            x = _draw(rng, data, (heads, rows, dim), name)
            enc = hostdata.encode(x, dt)
            flat[storage_index(p, name, b)] = enc
            values[name].append(hostdata.decode(enc, dt))
        buffers[name] = flat
    buffers["o"] = np.full(n["o"], hostdata.poison_value(dt), dtype=sdt)
    buffers["lse"] = np.full(n["lse"], hostdata.poison_value(LSE_DTYPE), dtype=np.float32) if inst.lse else None
    if p.varlen:
        cq, ck = p.cu_seqlens()
        buffers["cu_seqlens_q"] = np.asarray(cq, dtype=np.int32)
        buffers["cu_seqlens_k"] = np.asarray(ck, dtype=np.int32)
    else:
        buffers["cu_seqlens_q"] = None
        buffers["cu_seqlens_k"] = None
    outputs = ("o", "lse") if inst.lse else ("o",)
    return Inputs(buffers=buffers, outputs=outputs, values=values, exact=False,
                  info={"input_kind": data})


def gather_outputs(inst, p: AttentionProblem, outputs: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    """Device output storage -> per-sequence float64 arrays (o [Hq, sq_b, Dv], lse [Hq, sq_b]) and the
    per-sequence poison masks (True = never written)."""
    out: dict[str, Any] = {"o": [], "o_unwritten": [], "lse": [], "lse_unwritten": []}
    o_bits = hostdata.bits_of(outputs["o"])
    poison_o = hostdata.bits_of(np.asarray(hostdata.poison_value(inst.dtype)).reshape(1))[0]
    o_inside = np.zeros(o_bits.shape, dtype=bool)
    has_lse = inst.lse and outputs.get("lse") is not None
    if has_lse:
        lse = np.asarray(outputs["lse"], dtype=np.float32)
        l_bits = hostdata.bits_of(lse)
        poison_l = hostdata.bits_of(np.asarray(hostdata.poison_value(LSE_DTYPE)).reshape(1))[0]
        l_inside = np.zeros(l_bits.shape, dtype=bool)
    for b in range(p.batch):
        idx = storage_index(p, "o", b)
        o_inside[idx] = True
        out["o"].append(hostdata.decode(outputs["o"][idx], inst.dtype))
        out["o_unwritten"].append(o_bits[idx] == poison_o)
        if has_lse:
            li = storage_index(p, "lse", b)
            l_inside[li] = True
            with np.errstate(invalid="ignore"):
                out["lse"].append(lse[li].astype(np.float64))
            out["lse_unwritten"].append(l_bits[li] == poison_l)
    # elements outside every sequence's rows (padding, gaps) must still hold the poison
    out["o_stray"] = int((o_bits[~o_inside] != poison_o).sum())
    out["lse_stray"] = int((l_bits[~l_inside] != poison_l).sum()) if has_lse else 0
    return out


__all__ = ["DATA_KINDS", "make_inputs", "storage_index", "gather_outputs"]
