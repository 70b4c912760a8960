"""The float64 convolution reference (numpy; torch float64 on a GPU for large problems) and the comparison.

Tensors are 5-D NDHWC / KTRSC / NZPQK float64 arrays (2D problems have D = T = Z = 1). The epilogue is
out = act(alpha * conv + beta * source + bias). The fake backend (fake.py) computes the same function its own way.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from emitter.families.conv.problem import ConvProblem


def _padded(x: np.ndarray, p: ConvProblem) -> np.ndarray:
    (fd, fh, fw), (bd, bh, bw) = p.pad_front, p.pad_back
    return np.pad(x, ((0, 0), (fd, bd), (fh, bh), (fw, bw), (0, 0)))


def _window(p: ConvProblem, t: int, r: int, s: int) -> tuple[slice, slice, slice]:
    z, pp, q = p.output_extents()
    sd, sh, sw = p.stride
    dd, dh, dw = p.dilation
    return (slice(t * dd, t * dd + (z - 1) * sd + 1, sd), slice(r * dh, r * dh + (pp - 1) * sh + 1, sh),
            slice(s * dw, s * dw + (q - 1) * sw + 1, sw))


def conv_numpy(op: str, p: ConvProblem, x: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The raw convolution (no epilogue) of op: fprop -> y, dgrad -> dx from dy=y, wgrad -> dw from dy=y and x.
    Grouped (p.groups > 1): group g's slice of each tensor's channels (x: C/groups, y and w's K: K/groups) is
    an ungrouped convolution of its own."""
    g = getattr(p, "groups", 1)
    if g > 1:
        cg, kg = p.c // g, p.k // g
        one = replace(p, c=cg, k=kg, groups=1)
        parts = [conv_numpy(op, one, x[..., i * cg:(i + 1) * cg], w[i * kg:(i + 1) * kg], y[..., i * kg:(i + 1) * kg])
                 for i in range(g)]
        return np.concatenate(parts, axis=0 if op == "wgrad" else 4)
    if op == "fprop":
        xp = _padded(x, p)
        out = np.zeros(p.shape("y"))
        for t in range(p.t):
            for r in range(p.r):
                for s in range(p.s):
                    wd, wh, ww = _window(p, t, r, s)
                    out += np.einsum("nzpqc,kc->nzpqk", xp[:, wd, wh, ww, :], w[:, t, r, s, :], optimize=True)
        return out
    if op == "dgrad":
        xp = np.zeros(_padded(np.zeros(p.shape("x")), p).shape)
        for t in range(p.t):
            for r in range(p.r):
                for s in range(p.s):
                    wd, wh, ww = _window(p, t, r, s)
                    xp[:, wd, wh, ww, :] += np.einsum("nzpqk,kc->nzpqc", y, w[:, t, r, s, :], optimize=True)
        (fd, fh, fw) = p.pad_front
        return xp[:, fd:fd + p.d, fh:fh + p.h, fw:fw + p.w, :]
    xp = _padded(x, p)
    out = np.zeros(p.shape("w"))
    for t in range(p.t):
        for r in range(p.r):
            for s in range(p.s):
                wd, wh, ww = _window(p, t, r, s)
                out[:, t, r, s, :] = np.einsum("nzpqk,nzpqc->kc", y, xp[:, wd, wh, ww, :], optimize=True)
    return out


def conv_torch(op: str, p: ConvProblem, x: Any, w: Any, y: Any) -> Any:
    """The same in torch float64 on the tensors' device (5-D NDHWC arrays or tensors in, a tensor out)."""
    import torch
    import torch.nn.functional as F

    def cl(a: Any) -> Any:   # NDHWC -> NCDHW
        return a.permute(0, 4, 1, 2, 3)

    (fd, fh, fw), (bd, bh, bw) = p.pad_front, p.pad_back
    xs = cl(x).requires_grad_(op == "dgrad")
    ws = cl(w).requires_grad_(op == "wgrad")
    xp = F.pad(xs, (fw, bw, fh, bh, fd, bd))
    out = F.conv3d(xp, ws, stride=p.stride, dilation=p.dilation, groups=getattr(p, "groups", 1))
    if op == "fprop":
        return out.permute(0, 2, 3, 4, 1).detach()
    (g,) = torch.autograd.grad(out, xs if op == "dgrad" else ws, grad_outputs=cl(y))
    return g.permute(0, 2, 3, 4, 1).detach()


_ACT = {
    "identity": lambda v: v,
    "relu": lambda v: np.maximum(v, 0.0),
    "gelu": lambda v: 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0))),
    "silu": lambda v: v / (1.0 + np.exp(-v)),
    "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
}


def epilogue(cfg: dict, p: ConvProblem, acc: np.ndarray, source: np.ndarray | None, bias: np.ndarray | None) -> np.ndarray:
    out = p.alpha * acc
    if p.beta != 0.0 and source is not None:
        out = out + p.beta * source
    if bias is not None:
        out = out + bias.reshape(1, 1, 1, 1, -1)
    ep = cfg.get("epilogue", {})
    act = ep.get("activation", "identity")
    if act == "clamp":
        return np.clip(out, ep.get("clamp_min", 0.0), ep.get("clamp_max", 6.0))
    return _ACT[act](out)


def reference(cfg: dict, p: ConvProblem, values: dict[str, np.ndarray], device: str | None = None) -> np.ndarray:
    """The expected output (float64, the written tensor's 5-D shape)."""
    op = cfg["op"]
    if device is not None:
        import torch
        t = {k: torch.as_tensor(values[k], dtype=torch.float64, device=device) for k in ("x", "w", "y")}
        acc = conv_torch(op, p, t["x"], t["w"], t["y"]).cpu().numpy()
    else:
        acc = conv_numpy(op, p, values["x"], values["w"], values["y"])
    return epilogue(cfg, p, acc, values.get("source"), values.get("bias"))


def tolerance(dtype: str, reduction: int) -> float:
    """Relative Frobenius tolerance for an output of `dtype` from a reduction of `reduction` products."""
    # integer outputs are compared after rounding and saturating the reference like the kernel's conversion
    base = {"f16": 2e-3, "bf16": 1.6e-2, "f32": 2e-3, "tf32": 2e-3, "s8": 1e-6, "s32": 1e-6}.get(dtype, 1e-2)
    return base * max(1.0, math.log2(max(reduction, 2)) / 8)


MAP_LIMIT = 4096            # positions of the per-position count maps kept in a verdict (planted problems: ~60)


def element_mismatches(got: np.ndarray, want: np.ndarray, written: np.ndarray, tol: float) -> np.ndarray:
    """Elements off by more than the tolerance allows one element: tol x (|want| + 8 x rms(want)).

    The relative Frobenius check bounds the rms error by tol x rms(want), so a right kernel's worst element
    stays well under 8 x that; a fault confined to a few border rows of a large image moves the norm little
    but its elements by a sizeable part of rms(want). tol 0 (exact checks): any difference."""
    with np.errstate(invalid="ignore"):
        diff = np.abs(got - want)
    if tol == 0.0:
        bad = diff != 0
    else:
        rms = float(np.sqrt(np.mean(np.square(want)))) if want.size else 0.0
        bad = diff > tol * (np.abs(want) + 8.0 * rms)
    bad |= ~np.isfinite(got)
    return bad & written


def locate(bad: np.ndarray, unwritten: np.ndarray) -> dict[str, Any]:
    """Where the wrong and the unwritten elements of a 5-D output are: indices along axis 0 (N of x/y, K of w),
    axis 2 and axis 3 (H/W of x, P/Q of y, R/S of w), axis 4 (channels), and a count per (axis 2, axis 3) position
    when small."""
    out: dict[str, Any] = {}
    for name, mask in (("bad", bad), ("unwritten", unwritten)):
        out[f"{name}_outer"] = [int(i) for i in np.nonzero(mask.any(axis=(1, 2, 3, 4)))[0]]
        out[f"{name}_rows"] = [int(i) for i in np.nonzero(mask.any(axis=(0, 1, 3, 4)))[0]]
        out[f"{name}_cols"] = [int(i) for i in np.nonzero(mask.any(axis=(0, 1, 2, 4)))[0]]
        out[f"{name}_channels"] = [int(i) for i in np.nonzero(mask.any(axis=(0, 1, 2, 3)))[0]]
        if mask.shape[2] * mask.shape[3] <= MAP_LIMIT:
            out[f"{name}_map"] = mask.sum(axis=(0, 1, 4)).astype(int).tolist()
    return out


def compare(got: np.ndarray, want: np.ndarray, poisoned: np.ndarray, tol: float) -> dict[str, Any]:
    """Verdict for decoded output `got` against `want`; `poisoned` marks elements still holding the poison.
    It fails on unwritten elements, on NaN/Inf, on the relative Frobenius error and on single elements off by
    more than element_mismatches allows (a fault confined to a few rows barely moves the norm), and says where
    the wrong and the unwritten elements are (locate)."""
    unwritten = int(poisoned.sum())
    nonfinite = int((~np.isfinite(got) & ~poisoned).sum())
    with np.errstate(invalid="ignore"):
        diff = np.where(poisoned, 0.0, got - want)
    denom = float(np.linalg.norm(want)) or 1.0
    rel = float(np.linalg.norm(np.nan_to_num(diff, nan=np.inf))) / denom if nonfinite == 0 else float("inf")
    worst_idx = np.unravel_index(int(np.argmax(np.abs(np.nan_to_num(diff, nan=np.inf)))), got.shape) if got.size else ()
    out: dict[str, Any] = {
        "rel_err": rel, "tol": tol, "unwritten": unwritten, "nonfinite": nonfinite,
        "max_abs_err": float(np.nanmax(np.abs(diff))) if got.size else 0.0,
        "check": "exact" if tol == 0.0 else "tolerance",
        "worst": {"index": [int(i) for i in worst_idx], "got": float(got[worst_idx]) if got.size else None,
                  "want": float(want[worst_idx]) if got.size else None},
    }
    bad = element_mismatches(got, want, ~poisoned, tol) if got.ndim == 5 else np.zeros(got.shape, bool)
    out["mismatches"] = int(bad.sum())
    if got.ndim == 5:
        out.update(locate(bad, poisoned))
    where = f"(worst at {out['worst']['index']}: got {out['worst']['got']}, want {out['worst']['want']})"
    if unwritten:
        out.update(status="FAILED", reason=f"{unwritten} output elements never written (still the poison)")
    elif nonfinite:
        out.update(status="FAILED", reason=f"{nonfinite} output elements are NaN/Inf")
    elif rel > tol or (tol == 0.0 and out["max_abs_err"] != 0.0):
        out.update(status="FAILED", reason=f"relative error {rel:.3g} above tolerance {tol:.3g} {where}")
    elif out["mismatches"]:
        out.update(status="FAILED", reason=f"{out['mismatches']} elements off by more than tol x (|want| + 8 rms) "
                                           f"although the relative error {rel:.3g} is within {tol:.3g} {where}")
    else:
        out.update(status="PASSED", reason="")
    if out["status"] == "FAILED" and out["mismatches"] and "relative error" in out["reason"]:
        out["reason"] += f"; {out['mismatches']} elements off"
    return out
