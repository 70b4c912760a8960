"""The fake backend's attention: what a kernel computes, written independently of reference.py.

No code is shared with the reference or with inputs.py's addressing: tensors are read through reshaped
views of the flat storage (the reference side gathers with index arithmetic), dtypes are decoded and encoded
here with bit operations (not emitter.kit.hostdata), and the computation is a blocked online softmax in
float32 over key tiles of the instance's tile_kv, with P rounded to the dtype before P.V, the way the kernels
do it (the reference is a one-shot float64 softmax). A bug in one cannot cancel in the other.

Faults (FAKE_FAULTS), the planted bugs verify must catch for the right reason:
  wrong_scale          ignores the problem's scale, uses 1/sqrt(head_dim)
  no_mask              skips the causal mask
  key_tail_off_by_one  masks the key tail one key late: with a partial last key tile, one more key takes part,
                       the K/V row that follows the sequence's last one in memory (bshd: the next sequence's
                       first row of the same head; bhsd: the next head's first row; varlen: the next
                       sequence's), as the real bug reads it; a sequence whose next row would be past the buffer
                       is left alone (the GPU test's plant spares it too)
  wrong_kv_head        query head h reads KV head h % heads_kv instead of h // (heads_q / heads_kv)
  skip_lse             leaves the LSE unwritten
  lse_overrun          pads each LSE row with +inf up to a multiple of 32 (what CUTLASS's kernel_forward.h does
                       for its backward pass): a stray write past the row, caught where rows are padded
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

FAKE_FAULTS = ("wrong_scale", "no_mask", "key_tail_off_by_one", "wrong_kv_head", "skip_lse", "lse_overrun")


# ---------------------------------------------------------------------------------------- dtype codecs
def _e4m3_values() -> np.ndarray:
    out = np.zeros(256, dtype=np.float64)
    for bits in range(256):
        sign = -1.0 if bits & 0x80 else 1.0
        e, m = (bits >> 3) & 0xF, bits & 0x7
        if e == 0xF and m == 0x7:
            out[bits] = np.nan
        elif e == 0:
            out[bits] = sign * (m / 8.0) * 2.0 ** -6
        else:
            out[bits] = sign * (1 + m / 8.0) * 2.0 ** (e - 7)
    return out


def _decode(storage: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f16":
        return storage.astype(np.float32)
    if dtype == "bf16":
        return (storage.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if dtype == "e4m3":
        return _e4m3_values()[storage.astype(np.int64)].astype(np.float32)
    raise ValueError(f"fake attention: no codec for {dtype}")


def _encode(x: np.ndarray, dtype: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if dtype == "f16":
        return x.astype(np.float16)
    if dtype == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16          # round to nearest even
        out = rounded.astype(np.uint16)
        return np.where(np.isnan(x), np.uint16(0x7FC0), out)
    if dtype == "e4m3":
        table = _e4m3_values()
        finite = np.where(np.isnan(table), np.inf, table)
        idx = np.abs(x.astype(np.float64)[..., None] - finite).argmin(axis=-1)
        return idx.astype(np.uint8)
    raise ValueError(f"fake attention: no codec for {dtype}")


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    return _decode(_encode(x, dtype), dtype)


# ---------------------------------------------------------------------------------------- views
def _sequences(p, cu: np.ndarray | None, which: str) -> list[tuple[int, int]]:
    """(start row, length) of each sequence along the seq axis of tensor `which` ('q' or 'k')."""
    if cu is not None:
        return [(int(cu[b]), int(cu[b + 1] - cu[b])) for b in range(p.batch)]
    n = p.seq_q if which == "q" else p.seq_k
    return [(0, n)] * p.batch


def _view(flat: np.ndarray, p, heads: int, dim: int, rows: int) -> np.ndarray:
    """[batch_entries, heads, rows, dim] strided view of a tensor (batch_entries = 1 when varlen); rows are
    `pad` elements longer than packed ones."""
    nb = 1 if p.varlen else p.batch
    e = flat.itemsize
    if p.layout == "bshd":
        row = heads * dim + p.pad
        shape, strides = (nb, heads, rows, dim), (rows * row * e, dim * e, row * e, e)
    else:
        row = dim + p.pad
        shape, strides = (nb, heads, rows, dim), (heads * rows * row * e, rows * row * e, row * e, e)
    return np.lib.stride_tricks.as_strided(flat, shape=shape, strides=strides, writeable=flat.flags.writeable)


def _row_after(flat: np.ndarray, p, dim: int, rows: int, entry: int, head: int, row: int) -> np.ndarray | None:
    """Row `row` of `head` in batch entry `entry` read from the flat storage by this file's own offsets, where
    `row` may be one past the entry's rows (what a kernel reading one key too many gets); None past the buffer."""
    heads = p.heads_kv
    if p.layout == "bshd":
        stride = heads * dim + p.pad
        start = entry * rows * stride + row * stride + head * dim
    else:
        stride = dim + p.pad
        start = (entry * heads + head) * rows * stride + row * stride
    return flat[start:start + dim] if start + dim <= flat.size else None


def fake_run(inst, p, buffers: Mapping[str, Any], faults: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, np.ndarray]:
    faults = dict(faults or {})
    unknown = set(faults) - set(FAKE_FAULTS)
    if unknown:
        raise ValueError(f"unknown attention fake faults {sorted(unknown)}: use {', '.join(FAKE_FAULTS)}")
    dt = inst.dtype.yaml
    cu_q = buffers.get("cu_seqlens_q")
    cu_k = buffers.get("cu_seqlens_k")
    rows_q = int(cu_q[-1]) if cu_q is not None else p.seq_q
    rows_k = int(cu_k[-1]) if cu_k is not None else p.seq_k
    q_flat = _decode(np.asarray(buffers["q"]), dt)
    k_flat = _decode(np.asarray(buffers["k"]), dt)
    v_flat = _decode(np.asarray(buffers["v"]), dt)
    Q = _view(q_flat, p, p.heads_q, p.head_dim, rows_q)
    K = _view(k_flat, p, p.heads_kv, p.head_dim, rows_k)
    V = _view(v_flat, p, p.heads_kv, p.head_dim_v, rows_k)
    o_flat = np.array(buffers["o"], copy=True)
    O = _view(o_flat, p, p.heads_q, p.head_dim_v, rows_q)     # a view: writes land in o_flat
    lse_buf = buffers.get("lse")
    lse_flat = None if lse_buf is None else np.array(lse_buf, copy=True)
    if lse_flat is not None:
        if p.varlen:
            L = lse_flat.reshape(p.heads_q, rows_q + p.pad)
        else:
            L = lse_flat.reshape(p.batch, p.heads_q, p.seq_q + p.pad)

    scale = (1.0 / math.sqrt(p.head_dim)) if ("wrong_scale" in faults or p.scale == 0) else p.scale
    group = p.heads_q // p.heads_kv
    tile = inst.tile_kv
    causal = inst.mask.value
    seq_q = _sequences(p, cu_q, "q")
    seq_k = _sequences(p, cu_k, "k")
    for b in range(p.batch):
        e = 0 if p.varlen else b
        (q0, sq), (k0, sk) = seq_q[b], seq_k[b]
        nkeys = sk + 1 if ("key_tail_off_by_one" in faults and sk % tile) else sk
        for h in range(p.heads_q):
            g = (h % p.heads_kv) if "wrong_kv_head" in faults else (h // group)
            qh = Q[e, h, q0:q0 + sq].astype(np.float32)
            kh = K[e, g]
            vh = V[e, g]
            kx = _row_after(k_flat, p, p.head_dim, rows_k, e, g, k0 + sk) if nkeys > sk else None
            vx = _row_after(v_flat, p, p.head_dim_v, rows_k, e, g, k0 + sk) if nkeys > sk else None
            if kx is not None and vx is not None:
                kh = np.concatenate([kh[k0:k0 + sk], kx[None]])
                vh = np.concatenate([vh[k0:k0 + sk], vx[None]])
            else:
                kh, vh = kh[k0:k0 + sk], vh[k0:k0 + sk]
            nk = kh.shape[0]
            m = np.full(sq, -np.inf, np.float32)
            lsum = np.zeros(sq, np.float32)
            acc = np.zeros((sq, p.head_dim_v), np.float32)
            rows = np.arange(sq)[:, None]
            for start in range(0, nk, tile):
                cols = np.arange(start, min(start + tile, nk))[None, :]
                s = (qh @ kh[start:start + tile].T).astype(np.float32) * np.float32(scale)
                ok = np.ones(s.shape, bool)
                if causal != "none" and "no_mask" not in faults:
                    off = 0 if causal == "causal_top_left" else sk - sq
                    ok &= cols <= rows + off
                s = np.where(ok, s, -np.inf)
                m_new = np.maximum(m, s.max(axis=1))
                alive = np.isfinite(m_new)
                base = np.where(alive, m_new, 0.0).astype(np.float32)
                pr = np.where(ok, np.exp(s - base[:, None]), 0.0).astype(np.float32)
                corr = np.where(np.isfinite(m), np.exp(m - base), 0.0).astype(np.float32)
                lsum = lsum * corr + pr.sum(axis=1)
                acc = acc * corr[:, None] + _round(pr, dt) @ vh[start:start + tile]
                m = np.where(alive, m_new, m)
            empty = lsum == 0
            out = np.where(empty[:, None], 0.0, acc / np.where(empty, 1.0, lsum)[:, None])
            O[e, h, q0:q0 + sq] = _encode(out, dt)
            if lse_flat is not None and "skip_lse" not in faults:
                with np.errstate(divide="ignore"):
                    val = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, lsum))).astype(np.float32)
                if p.varlen:
                    L[h, q0:q0 + sq] = val
                else:
                    L[b, h, :sq] = val
                if "lse_overrun" in faults:
                    end = -(-sq // 32) * 32
                    flat_start = (h * (rows_q + p.pad) + q0) if p.varlen else ((b * p.heads_q + h) * (p.seq_q + p.pad))
                    stop = min(flat_start + end, lse_flat.size)
                    lse_flat[flat_start + sq:stop] = np.inf
    out = {"o": o_flat}
    if lse_flat is not None:
        out["lse"] = lse_flat
    return out


__all__ = ["FAKE_FAULTS", "fake_run"]
