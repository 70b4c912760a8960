"""Run-time hooks of attention backward instances (manifest entries whose config says `op: backward`): the
attention family's runtime module (runtime.py) hands a backward config's hooks to the functions here.

Problems are the forward's AttentionProblem (the same sizes, varlen lengths, scale, layout, pad). Storage:
  inputs   q, k, v, o, d_o (laid out like o), lse: the problem's strides (`pad` elements of poison after each
           row), o and lse the float64 forward's output rounded to the dtype / f32 (what a forward kernel gives)
  outputs  dq, dk, dv: packed in the instance's layout (attention_backward_abi.h's gradient row-stride rule),
           each followed by GUARD elements of poison that must survive (a write past the tensor is caught)
The reference differentiates the float64 forward (torch autograd where torch is importable, numpy's closed
form otherwise); the fake backend (backward_fake.py) recomputes the way the kernel does, without either.
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from emitter.errors import ManifestError
from emitter.families.attention.abi import fill_shape
from emitter.families.attention.backward_abi import EmitterAttentionBackwardProblem
from emitter.families.attention.backward_model import AttentionBackwardInstance, is_backward
from emitter.families.attention.flops import visible_pairs
from emitter.families.attention.inputs import storage_index
from emitter.families.attention.problem import AttentionProblem, make_problem, mask_mismatch
from emitter.families.attention.reference import reference_sequence
from emitter.families.base import Footprint, Inputs
from emitter.kit import hostdata

GUARD = 64                    # poisoned elements after each gradient tensor
GRADS = ("dq", "dk", "dv")
_LIKE = {"dq": "q", "dk": "k", "dv": "v"}
# max |got - ref| / max |ref| per gradient: P and dS are rounded to the dtype before their matmuls, and the
# GQA partial dK / dV of each query head are rounded before the group sum (as FlashAttention-2 does)
GRAD_REL = {"f16": 5e-3, "bf16": 4e-2}
BACKWARD_FAULTS = ("bwd_wrong_kv_head", "bwd_no_scale_ds", "bwd_mask_off_by_one", "bwd_drop_dq_partial")


@dataclass(frozen=True)
class BackwardConfig:
    """A manifest attention backward entry: name, arch and the AttentionBackwardInstance; other attributes
    (dtype, mask, tile_kv, ...) read through to the instance."""

    FAMILY = "attention"
    name: str
    arch: str
    instance: AttentionBackwardInstance = field(repr=False)
    op: str = "backward"

    def __getattr__(self, key: str) -> Any:
        if key == "instance":
            raise AttributeError(key)
        return getattr(self.instance, key)


def config_from_entry(entry: Mapping[str, Any], root: Any = None) -> BackwardConfig:
    name = str(entry.get("name", "?"))
    try:
        inst = AttentionBackwardInstance.from_config(dict(entry["config"]))
    except (KeyError, ValueError, TypeError) as e:
        raise ManifestError(f"instance {name}: unreadable attention backward config ({type(e).__name__}: {e}); "
                            f"re-run `emitter emit`") from None
    return BackwardConfig(name=name, arch=inst.arch.yaml, instance=inst)


def grad_problem(p: AttentionProblem) -> AttentionProblem:
    """The layout of the gradients: the problem's, packed (no row padding)."""
    return dataclasses.replace(p, pad=0)


# ---------------------------------------------------------------------------------------------- problems
def default_problems(cfg: BackwardConfig, quick: bool = False) -> list[tuple[AttentionProblem, str]]:
    """Odd lengths, seq_q != seq_k both ways (both causal alignments meet rows with few or no keys), GQA and
    MQA groups, a run-time scale, the three data kinds (large magnitudes included), padded input rows;
    varlen: ragged lengths with an empty key sequence and an empty query sequence."""
    d, dv, lay = cfg.head_dim, cfg.head_dim_v, cfg.layout.value
    hq, hkv = (8, 2) if cfg.gqa else (4, 4)
    out: list[tuple[AttentionProblem, str]] = []

    def P(data: str, **kw: Any) -> None:
        kw.setdefault("heads_q", hq)
        kw.setdefault("heads_kv", hkv)
        out.append((make_problem(head_dim=d, head_dim_v=dv, layout=lay, **kw), data))

    if cfg.varlen:
        P("normal", seqlens_q=(1, 77, 130, 64), seqlens_k=(5, 77, 97, 0))
        P("int", seqlens_q=(33, 0, 3), seqlens_k=(65, 20, 200), scale=0.25)
        P("large", seqlens_q=(100, 64), seqlens_k=(100, 129))
        if cfg.gqa:
            P("normal", heads_kv=1, seqlens_q=(17, 50), seqlens_k=(70, 3))
        P("normal", seqlens_q=(20, 45), seqlens_k=(33, 7), pad=8)
        if not quick:
            P("normal", seqlens_q=(1000, 513, 2), seqlens_k=(1000, 1024, 700))
        return out
    P("normal", batch=2, seq_q=77, seq_k=77)
    P("normal", batch=1, seq_q=100, seq_k=130, scale=0.3)
    P("normal", batch=2, seq_q=130, seq_k=65)
    P("int", batch=2, seq_q=64, seq_k=129)
    P("large", batch=1, seq_q=96, seq_k=200)
    if cfg.gqa:
        P("normal", batch=1, heads_q=4, heads_kv=1, seq_q=33, seq_k=47)
    P("normal", batch=2, seq_q=50, seq_k=70, scale=0.2, pad=8)
    P("normal", batch=1, seq_q=3 * cfg.tile_q + 5, seq_k=2 * cfg.tile_kv + 3)
    if not quick:
        P("normal", batch=2, seq_q=1000, seq_k=1000)
        P("normal", batch=1, seq_q=513, seq_k=2048, scale=0.1)
    return out


def not_supported_reasons(cfg: BackwardConfig, p: AttentionProblem) -> list[str]:
    out = []
    if p.head_dim != cfg.head_dim or p.head_dim_v != cfg.head_dim_v:
        out.append(f"head dims {p.head_dim}/{p.head_dim_v}: the instance is compiled for {cfg.head_dim}/{cfg.head_dim_v}")
    if p.heads_kv != p.heads_q and not cfg.gqa:
        out.append(f"heads_kv={p.heads_kv} != heads_q={p.heads_q}: the instance is not a GQA instance (gqa: false)")
    if p.varlen != cfg.varlen:
        out.append("variable lengths (cu_seqlens) need a varlen instance" if p.varlen
                   else "a varlen instance runs only cu_seqlens problems")
    why = mask_mismatch(cfg.mask.value, p)
    if why:
        out.append(why)
    s = p.strides()
    for name, rows in (("q", p.rows("q")), ("k", p.rows("k")), ("v", p.rows("k")), ("o", p.rows("q"))):
        if s[name][1] * rows >= 2 ** 31:
            out.append(f"{name}: {rows} rows x row stride {s[name][1]} do not fit the kernel's 32-bit offsets")
    if p.heads_q > 65535 or p.batch > 65535:
        out.append("heads_q and batch must be <= 65535 (grid y/z)")
    return out


def footprint(cfg: BackwardConfig, p: AttentionProblem) -> Footprint:
    e = p.elements()
    g = grad_problem(p).elements()
    size = cfg.dtype.bytes
    rows_q = p.rows("q") if p.varlen else p.batch * p.seq_q
    ws = (2 * p.heads_q * (rows_q + 32 * p.batch) * 4                           # delta, LSE
          + rows_q * p.heads_q * p.head_dim * 4 * 2                              # dQ accumulators (upper bound)
          + (2 * p.heads_q * p.rows("k") * (1 if p.varlen else p.batch) * p.head_dim * size if cfg.gqa else 0))
    dev = (e["q"] + e["k"] + e["v"] + 2 * e["o"] + g["q"] + g["k"] + g["v"]) * size + e["lse"] * 4 + ws
    pairs = sum(sq * sk for sq, sk in p.lengths()) * p.heads_q
    host = dev + 8 * 4 * (e["q"] + e["k"] + e["v"] + 2 * e["o"]) + 8 * 6 * pairs
    return Footprint(device=dev, host=host)


def flops(cfg: BackwardConfig, p: AttentionProblem) -> int:
    """2.5x the forward's useful FLOPs (the convention of FlashAttention's and cuDNN's backward figures)."""
    pairs = sum(visible_pairs(cfg.mask.value, sq, sk) for sq, sk in p.lengths())
    return int(2.5 * 2 * pairs * (p.head_dim + p.head_dim_v) * p.heads_q)


# ---------------------------------------------------------------------------------------------- inputs
def _draw(rng: np.random.Generator, data: str, shape: tuple[int, ...], which: str) -> np.ndarray:
    if data == "normal":
        return rng.standard_normal(shape)
    if data == "int":
        hi = {"v": 4, "do": 2}.get(which, 2)
        return rng.integers(-hi, hi + 1, size=shape).astype(np.float64)
    if data == "large":
        return rng.standard_normal(shape) * (16.0 if which in ("q", "k") else 1.0)
    raise ValueError(f"unknown attention data kind {data!r}: use normal, int or large")


def make_inputs(cfg: BackwardConfig, p: AttentionProblem, data: str, seed: int) -> Inputs:
    """Fresh Q, K, V, dO (seeded); O and LSE from the float64 forward, stored as a forward kernel stores them;
    gradients poisoned. values: per sequence q, k, v, do (float64 of the stored values), o, lse."""
    rng = np.random.default_rng(seed)
    dt = cfg.dtype
    sdt = hostdata.storage_dtype(dt)
    poison = hostdata.poison_value(dt)
    n = p.elements()
    buffers: dict[str, Any] = {}
    values: dict[str, list[np.ndarray]] = {"q": [], "k": [], "v": [], "do": [], "o": [], "lse": []}
    flat = {name: np.full(n[name], poison, dtype=sdt) for name in ("q", "k", "v")}
    flat["o"] = np.full(n["o"], poison, dtype=sdt)
    flat["d_o"] = np.full(n["o"], poison, dtype=sdt)
    lse_flat = np.full(n["lse"], hostdata.poison_value(_f32()), dtype=np.float32)
    for b, (sq, sk) in enumerate(p.lengths()):
        shapes = {"q": (p.heads_q, sq, p.head_dim), "k": (p.heads_kv, sk, p.head_dim),
                  "v": (p.heads_kv, sk, p.head_dim_v), "do": (p.heads_q, sq, p.head_dim_v)}
        for name in ("q", "k", "v", "do"):
            enc = hostdata.encode(_draw(rng, data, shapes[name], name), dt)
            flat["d_o" if name == "do" else name][storage_index(p, "o" if name == "do" else name, b)] = enc
            values[name].append(hostdata.decode(enc, dt))
        o, lse = reference_sequence(values["q"][b], values["k"][b], values["v"][b], p.softmax_scale, cfg.mask.value)
        o_enc = hostdata.encode(o, dt)
        flat["o"][storage_index(p, "o", b)] = o_enc
        values["o"].append(hostdata.decode(o_enc, dt))
        lse32 = lse.astype(np.float32)
        lse_flat[storage_index(p, "lse", b)] = lse32
        values["lse"].append(lse32.astype(np.float64))
    buffers.update(q=flat["q"], k=flat["k"], v=flat["v"], o=flat["o"], d_o=flat["d_o"], lse=lse_flat)
    g = grad_problem(p).elements()
    for grad in GRADS:
        buffers[grad] = np.full(g[_LIKE[grad]] + GUARD, poison, dtype=sdt)
    if p.varlen:
        cq, ck = p.cu_seqlens()
        buffers["cu_seqlens_q"] = np.asarray(cq, dtype=np.int32)
        buffers["cu_seqlens_k"] = np.asarray(ck, dtype=np.int32)
    else:
        buffers["cu_seqlens_q"] = None
        buffers["cu_seqlens_k"] = None
    return Inputs(buffers=buffers, outputs=GRADS, values=values, exact=False, info={"input_kind": data})


def _f32():
    from emitter.dtypes import DType
    return DType.f32


# ---------------------------------------------------------------------------------------------- reference
def _visible(mask: str, sq: int, sk: int) -> np.ndarray:
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    if mask == "none":
        return np.ones((sq, sk), dtype=bool)
    return j <= i + (0 if mask == "causal_top_left" else sk - sq)


def _grads_torch(q, k, v, do, scale: float, mask: str, device: str | None):
    """Autograd through the float64 forward (GQA: K / V repeated per query head, so the group sum is autograd's)."""
    import torch

    dev = device or "cpu"
    tq, tk, tv = (torch.tensor(x, dtype=torch.float64, device=dev, requires_grad=True) for x in (q, k, v))
    tdo = torch.tensor(do, dtype=torch.float64, device=dev)
    hq, sq, _ = q.shape
    hkv, sk, _ = v.shape
    group = hq // hkv
    vis = torch.tensor(_visible(mask, sq, sk), device=dev)
    any_key = vis.any(dim=1)                                       # rows that see no key: O = 0, no gradient
    s = torch.einsum("hid,hjd->hij", tq, tk.repeat_interleave(group, dim=0)) * scale
    s = s.masked_fill(~vis[None], float("-inf")).masked_fill(~any_key[None, :, None], 0.0)
    o = torch.einsum("hij,hjd->hid", torch.softmax(s, dim=-1), tv.repeat_interleave(group, dim=0))
    o = o * any_key[None, :, None]
    o.backward(tdo)
    return tuple(x.grad.detach().cpu().numpy() for x in (tq, tk, tv))


def _grads_numpy(q, k, v, do, scale: float, mask: str):
    """The closed form of the same derivative (where torch is not importable)."""
    hq, sq, _ = q.shape
    hkv, sk, _ = v.shape
    group = hq // hkv
    kk, vv = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
    vis = _visible(mask, sq, sk)[None]
    s = np.where(vis, np.einsum("hid,hjd->hij", q, kk) * scale, -np.inf)
    m = np.where(vis.any(axis=2, keepdims=True), s.max(axis=2, keepdims=True) if sk else 0.0, 0.0)
    e = np.where(vis, np.exp(s - m), 0.0)
    tot = e.sum(axis=2, keepdims=True)
    pr = np.where(tot > 0, e / np.where(tot > 0, tot, 1.0), 0.0)
    dv = np.einsum("hij,hid->hjd", pr, do)
    dp = np.einsum("hid,hjd->hij", do, vv)
    ds = pr * (dp - (dp * pr).sum(axis=2, keepdims=True))
    dq = np.einsum("hij,hjd->hid", ds, kk) * scale
    dk = np.einsum("hij,hid->hjd", ds, q) * scale
    fold = lambda x: x.reshape(hkv, group, *x.shape[1:]).sum(axis=1)   # noqa: E731
    return dq, fold(dk), fold(dv)


def reference(cfg: BackwardConfig, p: AttentionProblem, inputs: Inputs, device: str | None = None):
    """{"dq": [dq_b [Hq, sq_b, D]], "dk": [dk_b [Hkv, sk_b, D]], "dv": [dv_b [Hkv, sk_b, Dv]]} in float64."""
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    out: dict[str, list[np.ndarray]] = {g: [] for g in GRADS}
    val = inputs.values
    for b in range(p.batch):
        args = (val["q"][b], val["k"][b], val["v"][b], val["do"][b], p.softmax_scale, cfg.mask.value)
        dq, dk, dv = _grads_torch(*args, device) if have_torch else _grads_numpy(*args)
        out["dq"].append(dq)
        out["dk"].append(dk)
        out["dv"].append(dv)
    return out


# ---------------------------------------------------------------------------------------------- compare
def compare(cfg: BackwardConfig, p: AttentionProblem, inputs: Inputs, outputs: Mapping[str, np.ndarray],
            ref: Mapping[str, list[np.ndarray]]) -> dict[str, Any]:
    """Every gradient element written (poison gone) and finite, the guard tails untouched, and
    max |got - ref| / max |ref| per gradient within GRAD_REL. Where it failed: `failed_tensors`,
    `failed_heads` per tensor, `failed_batches`, dQ rows the causal mask partly hides vs rows that see every
    key (`failed_masked_rows` / `failed_full_rows`), and `unseen_key_rows`: dK / dV rows of keys no query may
    see that are not zero (a mask that lets one key too many through)."""
    gp = grad_problem(p)
    tol = GRAD_REL[cfg.dtype.yaml]
    poison_bits = hostdata.bits_of(np.asarray(hostdata.poison_value(cfg.dtype)).reshape(1))[0]
    mask = cfg.mask.value
    verdict: dict[str, Any] = {"check": "tolerance", "tol": tol}
    reasons: list[str] = []
    failed_tensors, heads, batches = [], {}, set()
    unwritten = nonfinite = mismatches = stray = unseen = 0
    masked_rows = full_rows = 0
    rel_all = 0.0
    errors: dict[str, float] = {}
    worst: dict[str, Any] = {}
    for grad in GRADS:
        store = np.asarray(outputs[grad])
        bits = hostdata.bits_of(store)
        body = g_elems = gp.elements()[_LIKE[grad]]
        tail = int((bits[g_elems:] != poison_bits).sum())
        stray += tail
        scale = max((float(np.max(np.abs(r))) for r in ref[grad] if r.size), default=0.0) or 1.0
        bad_heads: set[int] = set()
        n_unw = n_nf = n_bad = 0
        max_err = 0.0
        for b, (sq, sk) in enumerate(p.lengths()):
            idx = storage_index(gp, _LIKE[grad], b)
            got = hostdata.decode(store[:body][idx], cfg.dtype)
            want = ref[grad][b]
            uw = bits[:body][idx] == poison_bits
            n_unw += int(uw.sum())
            n_nf += int((~np.isfinite(got) & ~uw).sum())
            err = np.where(np.isfinite(got) & ~uw, np.abs(got - want), np.inf)
            bad = err > tol * scale
            n_bad += int(bad.sum())
            if err.size:
                max_err = max(max_err, float(err.max()))
            if bad.any():
                batches.add(b)
                bad_heads.update(int(h) for h in np.nonzero(bad.any(axis=(1, 2)))[0])
                h, i, c = np.unravel_index(int(np.argmax(np.where(np.isinf(err), np.finfo(np.float64).max, err))), err.shape)
                if not worst or err[h, i, c] > worst["_err"]:
                    worst = {"tensor": grad, "batch": b, "head": int(h), "row": int(i), "col": int(c),
                             "got": float(got[h, i, c]), "want": float(want[h, i, c]), "_err": float(err[h, i, c])}
                if grad == "dq":
                    for i in np.nonzero(bad.any(axis=(0, 2)))[0]:
                        vis = int(_visible(mask, sq, sk)[i].sum()) if sk else 0
                        if vis < sk:
                            masked_rows += 1
                        else:
                            full_rows += 1
            if grad in ("dk", "dv") and sk and mask != "none":
                seen = _visible(mask, sq, sk).any(axis=0)            # keys some query sees
                unseen += int((np.abs(np.where(np.isfinite(got), got, 1.0))[:, ~seen, :] > 0).any(axis=2).sum())
        rel = max_err / scale
        errors[grad] = rel
        rel_all = max(rel_all, rel)
        unwritten += n_unw
        nonfinite += n_nf
        mismatches += n_bad
        if n_unw or n_nf or n_bad or tail:
            failed_tensors.append(grad)
            heads[grad] = sorted(bad_heads)
            parts = []
            if n_unw:
                parts.append(f"{n_unw} never written")
            if n_nf:
                parts.append(f"{n_nf} NaN/inf")
            if n_bad:
                parts.append(f"{n_bad} off by more than {tol:g} x max|{grad}| ({scale:.3g}), max {rel:.3g}")
            if tail:
                parts.append(f"{tail} written past the tensor")
            reasons.append(f"{grad}: " + ", ".join(parts))
    if unseen:
        reasons.append(f"{unseen} dK/dV rows of keys no query sees are not zero")
    worst.pop("_err", None)
    failed = bool(reasons)
    verdict.update({
        "status": "FAILED" if failed else "PASSED", "reason": "; ".join(reasons),
        "rel_err": rel_all, "errors": errors, "max_abs_err": None, "worst": worst, "unwritten": unwritten,
        "nonfinite": nonfinite, "mismatches": mismatches, "stray_writes": stray, "failed_tensors": failed_tensors,
        "failed_heads": heads, "failed_batches": sorted(batches), "failed_masked_rows": masked_rows,
        "failed_full_rows": full_rows, "unseen_key_rows": unseen, "lse_max_abs_err": None,
    })
    return verdict


# ---------------------------------------------------------------------------------------------- the shim
def c_problem(cfg: BackwardConfig, p: AttentionProblem, pointers: Mapping[str, int]) -> ctypes.Structure:
    s = p.strides()
    g = grad_problem(p).strides()
    c = fill_shape(EmitterAttentionBackwardProblem(), p)
    for field_name, strides in (("stride_q", s["q"]), ("stride_k", s["k"]), ("stride_v", s["v"]), ("stride_o", s["o"]),
                                ("stride_do", s["o"]), ("stride_dq", g["q"]), ("stride_dk", g["k"]),
                                ("stride_dv", g["v"])):
        arr = getattr(c, field_name)
        for i, v in enumerate(strides):
            arr[i] = int(v)
    c.stride_lse[0], c.stride_lse[1] = (int(x) for x in s["lse"])
    for name in ("q", "k", "v", "o", "d_o", "lse", "dq", "dk", "dv", "cu_seqlens_q", "cu_seqlens_k"):
        setattr(c, name, int(pointers.get(name) or 0) or None)
    return c


# ---------------------------------------------------------------------------------------------- profile
@dataclass(frozen=True)
class BackwardProfileOp:
    """What `emitter profile` files a backward instance under: its own op key (attnbwd_...), so forward and
    backward winners never share a tuning record. The profile hooks of the op are backward_profile.py's."""

    FAMILY = "attention"
    dtype: str
    head_dim: int
    head_dim_v: int
    mask: str
    layout: str = "bshd"

    @property
    def a(self) -> str:
        return self.dtype

    @property
    def key(self) -> str:
        mask = {"none": "full", "causal_top_left": "causal", "causal_bottom_right": "causalbr"}.get(self.mask, self.mask)
        return f"attnbwd_{self.dtype}_d{self.head_dim}_{mask}_{self.layout}"

    def to_json(self) -> dict[str, Any]:
        return {"family": "attention", "op": "backward", "dtype": self.dtype, "head_dim": self.head_dim,
                "head_dim_v": self.head_dim_v, "mask": self.mask, "layout": self.layout, "key": self.key}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "BackwardProfileOp":
        return cls(str(d["dtype"]), int(d["head_dim"]), int(d.get("head_dim_v", d["head_dim"])), str(d["mask"]),
                   str(d.get("layout", "bshd")))


def profile_op(cfg: BackwardConfig) -> BackwardProfileOp:
    return BackwardProfileOp(cfg.dtype.yaml, int(cfg.head_dim), int(cfg.head_dim_v), cfg.mask.value, cfg.layout.value)


def profile_applies(op: Any, problem: Any) -> bool:
    """The backward op's kernels compute the problem's gradients (head dims and mask: the forward's rule)."""
    from emitter.families.attention.profile import op_mismatch
    return op_mismatch(op, problem) is None


def fake_run(cfg: BackwardConfig, p: AttentionProblem, buffers: Mapping[str, Any],
             faults: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    from emitter.families.attention.backward_fake import fake_run as run
    return run(cfg, p, buffers, faults)


__all__ = ["BackwardConfig", "BackwardProfileOp", "profile_op", "profile_applies", "BACKWARD_FAULTS", "GRAD_REL", "GUARD", "config_from_entry", "default_problems",
           "not_supported_reasons", "footprint", "flops", "make_inputs", "reference", "compare", "c_problem",
           "fake_run", "grad_problem", "is_backward"]
