"""The attention reference in float64: numpy (CI, fake backend), torch float64 on a device when given.

O[h, i] = sum_j softmax_j(scale * q[h, i] . k[g(h), j] over visible j) v[g(h), j], g(h) = h // (Hq / Hkv);
LSE[h, i] = log sum_j exp(scale * q . k) over visible j (natural log); a row that sees no key has O = 0 and
LSE = -inf. Visible keys of row i (sequence lengths sq, sk): none -> all; causal_top_left -> j <= i;
causal_bottom_right -> j <= i + sk - sq.
"""

from __future__ import annotations

import numpy as np

from emitter.families.attention.problem import AttentionProblem


def _mask_np(mask: str, sq: int, sk: int) -> np.ndarray:
    """[sq, sk] True where key j is visible from query row i."""
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    if mask == "none":
        return np.ones((sq, sk), dtype=bool)
    if mask == "causal_top_left":
        return j <= i
    if mask == "causal_bottom_right":
        return j <= i + (sk - sq)
    raise ValueError(f"unknown mask {mask!r}")


def reference_sequence(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: str):
    """One sequence: q [Hq, sq, D], k [Hkv, sk, D], v [Hkv, sk, Dv] (float64) -> (o [Hq, sq, Dv], lse [Hq, sq])."""
    hq, sq, _ = q.shape
    hkv, sk, dv = v.shape
    group = hq // hkv
    kk = np.repeat(k, group, axis=0)          # [Hq, sk, D]: query head h reads KV head h // group
    vv = np.repeat(v, group, axis=0)
    s = np.einsum("hid,hjd->hij", q, kk) * scale
    visible = _mask_np(mask, sq, sk)[None, :, :]
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=2, keepdims=True) if sk else np.full((hq, sq, 1), -np.inf)
    empty = ~np.isfinite(m)
    m_safe = np.where(empty, 0.0, m)
    e = np.where(visible, np.exp(s - m_safe), 0.0)
    total = e.sum(axis=2, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(empty, 0.0, np.einsum("hij,hjd->hid", e, vv) / np.where(empty, 1.0, total))
        lse = np.where(empty[..., 0], -np.inf, m_safe[..., 0] + np.log(np.where(empty[..., 0], 1.0, total[..., 0])))
    return o, lse


def _reference_torch(q, k, v, scale: float, mask: str, device: str):
    import torch

    tq = torch.as_tensor(q, dtype=torch.float64, device=device)
    tk = torch.as_tensor(k, dtype=torch.float64, device=device)
    tv = torch.as_tensor(v, dtype=torch.float64, device=device)
    hq, sq, _ = tq.shape
    hkv, sk, _ = tv.shape
    group = hq // hkv
    tk = tk.repeat_interleave(group, dim=0)
    tv = tv.repeat_interleave(group, dim=0)
    s = torch.einsum("hid,hjd->hij", tq, tk) * scale
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    if mask == "none":
        visible = torch.ones(sq, sk, dtype=torch.bool, device=device)
    elif mask == "causal_top_left":
        visible = j <= i
    else:
        visible = j <= i + (sk - sq)
    s = s.masked_fill(~visible[None], float("-inf"))
    if sk:
        m = s.amax(dim=2, keepdim=True)
    else:
        m = torch.full((hq, sq, 1), float("-inf"), dtype=torch.float64, device=device)
    empty = ~torch.isfinite(m)
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    e = torch.exp(s - m_safe).masked_fill(~visible[None], 0.0)
    total = e.sum(dim=2, keepdim=True)
    o = torch.einsum("hij,hjd->hid", e, tv) / torch.where(empty, torch.ones_like(total), total)
    o = torch.where(empty, torch.zeros_like(o), o)
    lse = torch.where(empty[..., 0], torch.full_like(m_safe[..., 0], float("-inf")),
                      m_safe[..., 0] + torch.log(torch.where(empty[..., 0], torch.ones_like(total[..., 0]), total[..., 0])))
    return o.cpu().numpy(), lse.cpu().numpy()


def reference(inst, p: AttentionProblem, inputs, device: str | None = None) -> dict[str, list[np.ndarray]]:
    """Expected outputs per sequence: {"o": [o_b [Hq, sq_b, Dv]], "lse": [lse_b [Hq, sq_b]]} in float64."""
    mask = inst.mask.value
    out: dict[str, list[np.ndarray]] = {"o": [], "lse": []}
    for b in range(p.batch):
        q, k, v = inputs.values["q"][b], inputs.values["k"][b], inputs.values["v"][b]
        if device is not None:
            o, lse = _reference_torch(q, k, v, p.softmax_scale, mask, device)
        else:
            o, lse = reference_sequence(q, k, v, p.softmax_scale, mask)
        out["o"].append(o)
        out["lse"].append(lse)
    return out


__all__ = ["reference", "reference_sequence"]
