"""The fake backend's attention backward: what the kernel computes, written independently of the reference.

The reference (backward_runtime.reference) differentiates a one-shot float64 softmax (torch autograd, or its
closed form). This recomputes the way the sm80 kernel does, in float32, from the buffers alone: P = exp(scale *
q.k - LSE) from the stored LSE (no softmax), delta = rowsum(dO * O) from the stored O, key tiles of the
instance's tile_kv, P and scale * dS rounded to the dtype before their matmuls, GQA partial dK / dV of each query
head rounded before the group sum, rows that see no key left out. Tensors are read through strided views of
the flat storage and decoded with the forward fake's bit-level codecs (fake.py), never emitter's hostdata or
the verify side's index arithmetic.

Planted faults (BACKWARD_FAULTS), each one a bug verify must catch for its reason:
  bwd_wrong_kv_head     dK of KV head g is written to KV head (g + 1) % heads_kv (dV and dQ stay right)
  bwd_no_scale_ds       dS without the softmax scale before dQ = dS K and dK = dS^T Q (dV stays right)
  bwd_mask_off_by_one   the backward's causal mask lets one more key through than the forward's did
  bwd_drop_dq_partial   the last key tile's dQ partial is lost (dK and dV stay right)
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from emitter.families.attention.fake import _decode, _encode, _round, _sequences, _view

FAULTS = ("bwd_wrong_kv_head", "bwd_no_scale_ds", "bwd_mask_off_by_one", "bwd_drop_dq_partial")


def _packed(p):
    """The gradients' problem: the same sizes and layout without row padding."""
    import dataclasses
    return dataclasses.replace(p, pad=0)


def fake_run(inst, p, buffers: Mapping[str, Any], faults: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, np.ndarray]:
    faults = dict(faults or {})
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown attention backward fake faults {sorted(unknown)}: use {', '.join(FAULTS)}")
    dt = inst.dtype.yaml
    cu_q, cu_k = buffers.get("cu_seqlens_q"), buffers.get("cu_seqlens_k")
    rows_q = int(cu_q[-1]) if cu_q is not None else p.seq_q
    rows_k = int(cu_k[-1]) if cu_k is not None else p.seq_k
    Q = _view(_decode(np.asarray(buffers["q"]), dt), p, p.heads_q, p.head_dim, rows_q)
    K = _view(_decode(np.asarray(buffers["k"]), dt), p, p.heads_kv, p.head_dim, rows_k)
    V = _view(_decode(np.asarray(buffers["v"]), dt), p, p.heads_kv, p.head_dim_v, rows_k)
    O = _view(_decode(np.asarray(buffers["o"]), dt), p, p.heads_q, p.head_dim_v, rows_q)
    dO = _view(_decode(np.asarray(buffers["d_o"]), dt), p, p.heads_q, p.head_dim_v, rows_q)
    lse_flat = np.asarray(buffers["lse"], dtype=np.float32)
    L = lse_flat.reshape(p.heads_q, rows_q + p.pad) if p.varlen else lse_flat.reshape(p.batch, p.heads_q, p.seq_q + p.pad)
    gp = _packed(p)
    out = {g: np.array(buffers[g], copy=True) for g in ("dq", "dk", "dv")}
    n_q = gp.elements()["q"]
    n_k = gp.elements()["k"]
    n_v = gp.elements()["v"]
    dQ = _view(out["dq"][:n_q], gp, p.heads_q, p.head_dim, rows_q)
    dK = _view(out["dk"][:n_k], gp, p.heads_kv, p.head_dim, rows_k)
    dV = _view(out["dv"][:n_v], gp, p.heads_kv, p.head_dim_v, rows_k)

    scale = np.float32(p.scale if p.scale != 0 else 1.0 / math.sqrt(p.head_dim))
    group = p.heads_q // p.heads_kv
    tile = inst.tile_kv
    mask = inst.mask.value
    extra = 1 if "bwd_mask_off_by_one" in faults else 0
    for b, ((q0, sq), (k0, sk)) in enumerate(zip(_sequences(p, cu_q, "q"), _sequences(p, cu_k, "k"))):
        e = 0 if p.varlen else b
        if sk <= 0:
            empty = sq
        elif mask == "causal_bottom_right" and sq > sk:
            empty = sq - sk
        else:
            empty = 0
        offset = 0 if mask == "causal_top_left" else sk - sq
        part_k = np.zeros((p.heads_q, max(sk, 0), p.head_dim), np.float32)
        part_v = np.zeros((p.heads_q, max(sk, 0), p.head_dim_v), np.float32)
        for h in range(p.heads_q):
            g = h // group
            dq = np.zeros((sq, p.head_dim), np.float32)
            rows = np.arange(empty, sq)
            q = Q[e, h, q0 + empty:q0 + sq].astype(np.float32)
            o = O[e, h, q0 + empty:q0 + sq].astype(np.float32)
            do = dO[e, h, q0 + empty:q0 + sq].astype(np.float32)
            lse = (L[h, q0 + empty:q0 + sq] if p.varlen else L[b, h, empty:sq]).astype(np.float32)
            delta = (do * o).sum(axis=1, dtype=np.float32)
            starts = list(range(0, sk, tile))
            for t, start in enumerate(starts):
                kt = K[e, g, k0 + start:k0 + min(start + tile, sk)].astype(np.float32)
                vt = V[e, g, k0 + start:k0 + min(start + tile, sk)].astype(np.float32)
                cols = np.arange(start, start + kt.shape[0])[None, :]
                s = (q @ kt.T) * scale
                ok = np.ones(s.shape, bool)
                if mask != "none":
                    ok = cols <= rows[:, None] + offset + extra
                with np.errstate(over="ignore"):
                    pr = np.where(ok, np.exp(np.where(ok, s, 0.0) - lse[:, None]), 0.0).astype(np.float32)
                dp = do @ vt.T
                ds = pr * (dp - delta[:, None])
                if "bwd_no_scale_ds" not in faults:
                    ds = ds * scale
                ds_r = _round(ds, dt)
                part_v[h, start:start + kt.shape[0]] += _round(pr, dt).T @ do
                part_k[h, start:start + kt.shape[0]] += ds_r.T @ q
                if not ("bwd_drop_dq_partial" in faults and t == len(starts) - 1 and len(starts) > 1):
                    dq[empty:] += ds_r @ kt
            dQ[e, h, q0:q0 + sq] = _encode(dq, dt)
        if sk <= 0:
            continue
        for g in range(p.heads_kv):
            heads = range(g * group, (g + 1) * group)
            if group > 1:     # each query head's partial stored in the dtype, then summed in f32
                sk_sum = sum(_round(part_k[h], dt) for h in heads)
                sv_sum = sum(_round(part_v[h], dt) for h in heads)
            else:
                sk_sum, sv_sum = part_k[g], part_v[g]
            target = (g + 1) % p.heads_kv if "bwd_wrong_kv_head" in faults else g
            dK[e, target, k0:k0 + sk] = _encode(sk_sum, dt)
            dV[e, g, k0:k0 + sk] = _encode(sv_sum, dt)
    return out


__all__ = ["FAULTS", "fake_run"]
