"""The attention backward's profile hooks: `emitter profile` times backward instances on the same profile problems
as forward ones (`b=..,hq=..,hkv=..,sq=..,sk=..,d=..[,causal]`), under their own op (BackwardProfileOp, key
`attnbwd_...`), so forward and backward winners never share a tuning record.

Problem: a backward op's measurements carry AttentionBackwardProfileProblem, the forward problem with the same key
and FLOPs = 2.5 x the forward's (the convention of FlashAttention's and cuDNN's backward figures and of the
issue's anchor table: two matmuls forward, five backward); its JSON says `"pass": "backward"`. The stage asks
for it through the family's profile_op_problem hook.

Operand sets (rotated past the L2 like the forward's): Q, K, V, dO uniform in (-1, 1); O and the LSE the forward's
outputs of those Q, K, V (torch on the GPU in float32, O rounded to the dtype: what a forward kernel saves, so the
gradients mean what they say); dQ, dK, dV packed in the op's layout, poisoned before each check; each kernel its
own workspace per set (the host shim's initialize() zeroes what its kernel needs zeroed: with timing.workspace_reset
`library` that memset is paid before every timed launch, as the exported library's call pays it).

Baselines (the same names as the forward's): torch SDPA with one backend forced; the forward runs once per set,
untimed, and the timed call is the backward alone, `torch.autograd.grad(out, (q, k, v), dO, retain_graph=True)`
(what tests/attention/test_attention_backward*_gpu.py's speed tables time), on zero-copy views of the same buffers.

The check (kernels, and as a record the baselines' own gradients): every element of dQ, dK, dV written (the poison
count over each whole tensor), then float64 gradients (backward_runtime's reference: torch autograd through the
float64 forward, on the GPU where torch is; numpy's closed form otherwise) of sampled (batch, KV head) pairs -- the
first and last batch, the first and last KV head, with every query head of its group -- compared as verify
compares them (max |got - ref| / max |ref| per gradient <= GRAD_REL of the dtype).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import numpy as np

from emitter.families.attention import backward_runtime
from emitter.families.attention.backward_runtime import GRAD_REL, BackwardProfileOp
from emitter.families.attention.problem import AttentionProblem, make_problem
from emitter.families.attention.profile import (
    BASELINE_PROVIDERS, BASELINES, AttentionProfileProblem, _dtype, data_seed, op_mismatch,
)
from emitter.families.base import BaselineLaunch, BaselineUnavailable

PASS = "backward"
FLOP_FACTOR = 2.5              # backward FLOPs / forward FLOPs
GRADS = ("dq", "dk", "dv")
_LIKE = {"dq": "q", "dk": "k", "dv": "v"}
CHUNK_ELEMENTS = 1 << 28       # score elements per torch step of the forward outputs (f32: 1 GiB)


# ---------------------------------------------------------------------------------------------- problem
@dataclass(frozen=True, order=True)
class AttentionBackwardProfileProblem(AttentionProfileProblem):
    """The profile problem as a backward op times it: the forward problem's sizes and key, 2.5x its FLOPs."""

    @property
    def flops(self) -> int:
        return 5 * AttentionProfileProblem.flops.fget(self) // 2     # forward FLOPs are even: exact

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "pass": PASS}

    def forward(self) -> AttentionProfileProblem:
        return AttentionProfileProblem(*(getattr(self, f.name) for f in fields(self)))

    @classmethod
    def of(cls, p: AttentionProfileProblem) -> "AttentionBackwardProfileProblem":
        return cls(*(getattr(p, f.name) for f in fields(p)))


def is_backward_op(op: Any) -> bool:
    return isinstance(op, BackwardProfileOp)


def op_problem(op: Any, problem: Any) -> Any:
    """The problem a measurement of `op` carries: the backward one for a backward op, else `problem` itself."""
    if is_backward_op(op) and isinstance(problem, AttentionProfileProblem) \
            and not isinstance(problem, AttentionBackwardProfileProblem):
        return AttentionBackwardProfileProblem.of(problem)
    return problem


def problem_from_dict(d: Mapping[str, Any]) -> AttentionProfileProblem:
    cls = AttentionBackwardProfileProblem if d.get("pass") == PASS else AttentionProfileProblem
    return cls.from_dict(d)


profile_applies = backward_runtime.profile_applies


def profile_min_bytes(op: BackwardProfileOp, problem: AttentionProfileProblem, beta: float = 0.0) -> int:
    """Q, K, V, O, dO and the LSE read once; dQ, dK, dV written once."""
    e = problem.verify_problem(op.layout).elements()
    return (2 * (e["q"] + e["k"] + e["v"]) + 2 * e["o"]) * _dtype(op).bytes + e["lse"] * 4


def profile_set_bytes(op: BackwardProfileOp, problem: AttentionProfileProblem, settings: Any = None) -> int:
    return profile_min_bytes(op, problem)


# ---------------------------------------------------------------------------------------------- operands
@dataclass
class BackwardData:
    """Device-resident operand sets of one (backward op, problem): sets[i] = {q, k, v, o, d_o, lse, dq, dk, dv:
    device pointer}."""

    op: BackwardProfileOp
    problem: AttentionProfileProblem
    vp: AttentionProblem
    sets: list[dict[str, int]]
    arena: Any
    mismatch: str | None = None
    cfg: Any = None
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def working_set_bytes(self) -> int:
        return len(self.sets) * profile_set_bytes(self.op, self.problem)

    def free(self) -> None:
        if self.arena is not None:
            self.arena.free()
        self.cache.clear()


def _views(torch: Any, data: BackwardData, s: Mapping[str, int]) -> dict[str, Any]:
    """[B, H, S, D] torch views of set `s`'s tensors (zero-copy, the op's layout) and the LSE [B, Hq, Sq] (f32)."""
    from emitter.kit.torch_interop import CudaArray

    p, vp = data.problem, data.vp
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}.get(data.op.dtype)
    if dt is None:
        raise BaselineUnavailable(f"no torch attention for {data.op.dtype}")
    n, st = vp.elements(), vp.strides()
    out = {}
    for name, like, heads, rows, dim in (("q", "q", p.heads_q, p.seq_q, p.head_dim),
                                         ("k", "k", p.heads_kv, p.seq_k, p.head_dim),
                                         ("v", "v", p.heads_kv, p.seq_k, p.head_dim_v),
                                         ("o", "o", p.heads_q, p.seq_q, p.head_dim_v),
                                         ("d_o", "o", p.heads_q, p.seq_q, p.head_dim_v),
                                         ("dq", "q", p.heads_q, p.seq_q, p.head_dim),
                                         ("dk", "k", p.heads_kv, p.seq_k, p.head_dim),
                                         ("dv", "v", p.heads_kv, p.seq_k, p.head_dim_v)):
        flat = torch.as_tensor(CudaArray(s[name], n[like], 2, "<i2"), device="cuda").view(dt)
        sb, ss, sh = st[like]
        out[name] = torch.as_strided(flat, (p.batch, heads, rows, dim), (sb, sh, ss, 1))
    lse = torch.as_tensor(CudaArray(s["lse"], n["lse"], 4, "<f4"), device="cuda")
    lb, lh = st["lse"]
    out["lse"] = torch.as_strided(lse, (p.batch, p.heads_q, p.seq_q), (lb, lh, 1))
    return out


def forward_outputs(torch: Any, data: BackwardData, s: Mapping[str, int]) -> None:
    """O (rounded to the dtype) and the natural-log LSE of set s's Q, K, V, computed in float32 on the GPU a few
    heads at a time, written into the set's o and lse buffers."""
    p = data.problem
    t = _views(torch, data, s)
    scale = 1.0 / math.sqrt(p.head_dim)
    group = p.heads_q // p.heads_kv
    chunk = max(1, min(p.heads_q, CHUNK_ELEMENTS // max(1, p.seq_q * p.seq_k)))
    hidden = (torch.ones(p.seq_q, p.seq_k, device="cuda", dtype=torch.bool).triu(1) if p.causal else None)
    with torch.no_grad():
        for b in range(p.batch):
            for h0 in range(0, p.heads_q, chunk):
                heads = torch.arange(h0, min(p.heads_q, h0 + chunk), device="cuda")
                sc = torch.einsum("hid,hjd->hij", t["q"][b, heads].float(), t["k"][b, heads // group].float()) * scale
                if hidden is not None:
                    sc.masked_fill_(hidden, float("-inf"))
                lse = torch.logsumexp(sc, dim=-1)
                t["lse"][b, heads] = lse
                probs = torch.exp(sc - lse[..., None])
                t["o"][b, heads] = torch.einsum("hij,hjd->hid", probs, t["v"][b, heads // group].float()).to(t["o"].dtype)
                del sc, probs
    torch.cuda.synchronize()


def profile_allocate(op: BackwardProfileOp, problem: AttentionProfileProblem, settings: Any, sets: int) -> BackwardData:
    from emitter.kit.arena import DeviceArena
    from emitter.kit.hostdata import poison_value
    from emitter.kit.torch_interop import torch_available

    problem = op_problem(op, problem)
    vp = problem.verify_problem(op.layout)
    why = op_mismatch(op, problem)
    if why:
        return BackwardData(op, problem, vp, [], None, mismatch=why)
    if not torch_available():
        raise RuntimeError("the backward profile computes the O and LSE its kernels read with torch on the GPU, and "
                           "torch is not importable here")
    import torch

    dt = _dtype(op)
    n = vp.elements()
    arena = DeviceArena(seed=data_seed(op, problem) ^ 0xB4C6)
    data = BackwardData(op, problem, vp, [], arena, cfg=op)
    try:
        for _ in range(max(1, sets)):
            s: dict[str, int] = {}
            for name, like in (("q", "q"), ("k", "k"), ("v", "v"), ("d_o", "o")):
                s[name] = arena.alloc(n[like] * dt.bytes)
                arena.fill_random(s[name], dt, n[like])
            s["o"] = arena.alloc(n["o"] * dt.bytes)
            s["lse"] = arena.alloc(n["lse"] * 4)
            for grad in GRADS:
                s[grad] = arena.alloc(n[_LIKE[grad]] * dt.bytes)
                arena.fill_bytes(s[grad], np.asarray(poison_value(dt)), n[_LIKE[grad]])
            forward_outputs(torch, data, s)
            data.sets.append(s)
    except Exception:
        arena.free()
        raise
    return data


def profile_poison(data: BackwardData, set_index: int = 0) -> None:
    from emitter.kit.hostdata import poison_value

    if data.mismatch or not data.sets:
        return
    dt = _dtype(data.op)
    n = data.vp.elements()
    for grad in GRADS:
        data.arena.fill_bytes(data.sets[set_index][grad], np.asarray(poison_value(dt)), n[_LIKE[grad]])
    data.cache.pop("baseline_grads", None)


# ---------------------------------------------------------------------------------------------- kernel launch
class BackwardLaunch:
    """A loaded backward kernel prepared on every operand set: one Params block and one workspace per set; the
    bytes its shim's initialize() zeroes are zeroed again before each timed launch in `library` mode (the sm80
    kernel's dQ accumulators, GQA buffers and counters; the sm90a kernel's phase counters, which each launch
    leaves at zero, drop their reset in `settled` mode)."""

    def __init__(self, kernel: Any, data: BackwardData, stream: Any, split_k: int = 1, options: int = 0,
                 workspace_reset: str = "library") -> None:
        from emitter.families.attention.backward_runtime import c_problem, not_supported_reasons
        from emitter.kit import prepare
        from emitter.kit import workspace as wsr
        from emitter.kit.failures import CannotImplement, LaunchFailed

        self.launches: list[Any] = []
        self.resets: list[Any] = []
        self.info: dict[str, Any] = {}
        self._allocs: list[Any] = []
        if data.mismatch:
            raise CannotImplement(data.mismatch)
        cfg = kernel.config
        reasons = not_supported_reasons(cfg, data.vp)
        if reasons:
            raise CannotImplement("; ".join(reasons))
        if int(split_k) != 1 or int(options) != 0:
            raise CannotImplement("attention backward kernels have no split-K and no run-time scheduler options")
        h = kernel.handle or {}
        if "shim" not in h or "fn" not in h:
            raise LaunchFailed(f"{kernel.name}: the backend's kernel handle has no host shim / function "
                               "(profiling needs the PyCUDA backend)")
        shim, self.fn = h["shim"], h["fn"]
        drv = None                   # PyCUDA, once a kernel needs a workspace
        self.drv, self.stream, self._handle = drv, stream, int(stream.handle)
        self.mode = wsr.check_mode(workspace_reset)
        try:
            for s in data.sets:
                prob = c_problem(cfg, data.vp, s)
                q = prepare.query(shim, prob, kernel.name,
                                  refusal=f"{kernel.name}_query: can_implement is false for {data.problem.key}")
                ws, ws_bytes = 0, int(q.workspace_bytes)
                if ws_bytes > 0:
                    if drv is None:
                        import pycuda.driver as drv
                        self.drv = drv
                    buf = drv.mem_alloc(ws_bytes)
                    self._allocs.append(buf)
                    ws = int(buf)
                    wsr.mark(drv, ws, ws_bytes)
                entry, launch = prepare.initialize(
                    shim, self.fn, prob, ws, stream.handle, q, kernel.name,
                    refusal=f"{kernel.name}_initialize: can_implement is false for {data.problem.key}")
                self.launches.append(entry)
                self.resets.append(wsr.zeroed_range(drv, stream, ws, ws_bytes))
                self.info = launch.as_dict()
            stream.synchronize()
            zeroed = any(r is not None for r in self.resets)
            if self.mode == "settled" and zeroed:
                wsr.settle(drv, self.fn, stream, self._handle, self.launches, self.resets)
            self.info.update(wsr.describe(self.mode, zeroed, self.resets, len(self._allocs)))
        except Exception:
            self.free()
            raise

    def __call__(self, i: int) -> None:
        j = i % len(self.launches)
        grid, block, packed, shared = self.launches[j]
        if self.resets[j] is not None:
            self.drv.memset_d8_async(self.resets[j][0], 0, self.resets[j][1], self.stream)
        self.fn.launch(grid, block, shared, self._handle, packed)

    def free(self) -> None:
        for a in self._allocs:
            try:
                a.free()
            except Exception:  # noqa: BLE001
                pass
        self._allocs.clear()


def kernel_launch(kernel: Any, data: BackwardData, stream: Any, **run_options: Any) -> BackwardLaunch:
    return BackwardLaunch(kernel, data, stream, int(run_options.get("split_k", 1)), int(run_options.get("options", 0)),
                          str(run_options.get("workspace_reset", "library")))


# ---------------------------------------------------------------------------------------------- baselines
def baseline(name: str, data: BackwardData, stream: Any) -> BaselineLaunch:
    """SDPA's backward with one backend forced: its forward once per set (untimed, on the set's Q, K, V), then
    the timed torch.autograd.grad(out, (q, k, v), dO, retain_graph=True)."""
    if name not in BASELINES:
        raise BaselineUnavailable(f"no attention baseline named {name!r} (known: {', '.join(BASELINES)})")
    if data.mismatch:
        raise BaselineUnavailable(f"not this op's problem: {data.mismatch}")
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # noqa: BLE001 - no torch (or an old one): recorded as unavailable
        raise BaselineUnavailable(f"torch SDPA is not available here ({type(e).__name__}: {e})") from None
    backend = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION,
               "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[name]
    p = data.problem
    if data.op.mask == "causal_bottom_right" and p.seq_q != p.seq_k:
        raise BaselineUnavailable("SDPA's is_causal is top-left; this op is causal from the bottom-right")
    tstream = torch.cuda.ExternalStream(int(stream.handle)) if getattr(stream, "handle", 0) else None
    gqa = p.heads_kv != p.heads_q
    group = p.heads_q // p.heads_kv

    def graphs(expand: bool) -> list[dict[str, Any]]:
        """Per set: leaf q, k, v (views of the set's buffers; expand: K/V repeated to the query heads, untimed),
        SDPA's output with its graph, and dO."""
        out = []
        for s in data.sets:
            t = _views(torch, data, s)
            q = t["q"].detach().requires_grad_()
            k, v = t["k"].detach(), t["v"].detach()
            if expand:
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            k, v = k.requires_grad_(), v.requires_grad_()
            kw: dict[str, Any] = {"is_causal": bool(p.causal)}
            if gqa and not expand:
                kw["enable_gqa"] = True
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, **kw)
            out.append({"q": q, "k": k, "v": v, "o": o, "do": t["d_o"]})
        return out

    def build(expand: bool) -> tuple[list[dict[str, Any]] | None, str | None]:
        try:       # a backend that refuses this case is "unavailable", not a fault
            if tstream is not None:
                with torch.cuda.stream(tstream):
                    g = graphs(expand)
            else:
                g = graphs(expand)
            torch.cuda.synchronize()
            return g, None
        except (RuntimeError, TypeError) as e:
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if "illegal" in text.lower():
                raise
            return None, text

    sets, refused = build(False)
    expanded = False
    if sets is None and gqa:
        sets, again = build(True)
        if sets is None:
            refused = again
        else:
            expanded = True
    if sets is None:
        raise BaselineUnavailable(f"{BASELINE_PROVIDERS[name]} refused this problem: {str(refused)[:200]}")

    def run(i: int) -> None:
        g = sets[i % len(sets)]
        grads = torch.autograd.grad(g["o"], (g["q"], g["k"], g["v"]), g["do"], retain_graph=True)
        if i % len(sets) == 0:
            data.cache["baseline_grads"] = (grads, group if expanded else 1)

    def launch(i: int) -> None:
        if tstream is not None:
            with torch.cuda.stream(tstream):
                run(i)
        else:
            run(i)

    def first_call() -> str | None:
        try:
            launch(0)
            stream.synchronize()
            return None
        except (RuntimeError, TypeError) as e:
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if "illegal" in text.lower():
                raise
            return text

    refused = first_call()
    if refused:
        raise BaselineUnavailable(f"{BASELINE_PROVIDERS[name]} backward refused this problem: {refused[:200]}")
    provider = (f"torch.autograd.grad of torch.nn.functional.scaled_dot_product_attention "
                f"({BASELINE_PROVIDERS[name].split(', ')[1]}; the backward only, its forward untimed), "
                f"torch {torch.__version__}")
    if name == "sdpa_cudnn":
        provider += f", cuDNN {torch.backends.cudnn.version()}"
    if expanded:
        provider += (f"; GQA as K/V expanded to {p.heads_q} heads before the forward (untimed; dK/dV summed over the "
                     f"group for the check only; enable_gqa refused: {str(refused)[:80]})")
    elif gqa:
        provider += "; GQA through enable_gqa=True"
    return BaselineLaunch(name, provider, launch, tstream)


# ---------------------------------------------------------------------------------------------- check
def sample_pairs(p: AttentionProfileProblem) -> list[tuple[int, int]]:
    """(batch, KV head) pairs the check compares: first and last batch, first and last KV head."""
    return sorted({(b, g) for b in {0, p.batch - 1} for g in {0, p.heads_kv - 1}})


def _host(data: BackwardData, name: str, like: str) -> np.ndarray:
    from emitter.kit.hostdata import storage_dtype

    return data.arena.to_host(data.sets[0][name], storage_dtype(_dtype(data.op)), data.vp.elements()[like])


def _heads(data: BackwardData, flat: np.ndarray, like: str, b: int, heads: range) -> np.ndarray:
    """[len(heads), rows, dim] of batch b of a tensor stored like `like` (q / k / v / o) in set 0's layout."""
    p, st = data.problem, data.vp.strides()
    rows, dim = {"q": (p.seq_q, p.head_dim), "k": (p.seq_k, p.head_dim), "v": (p.seq_k, p.head_dim_v),
                 "o": (p.seq_q, p.head_dim_v)}[like]
    sb, ss, sh = st[like]
    idx = (b * sb + np.asarray(list(heads))[:, None, None] * sh + np.arange(rows)[None, :, None] * ss
           + np.arange(dim)[None, None, :])
    return flat[idx]


def _reference(data: BackwardData, use_torch: bool) -> dict[tuple[int, int], dict[str, np.ndarray]]:
    """{(b, g): {"dq": [group, sq, D], "dk": [1, sk, D], "dv": [1, sk, Dv]}} of set 0 in float64: each query head
    of the group differentiated alone (torch on the GPU when use_torch, numpy otherwise), dK / dV summed."""
    from emitter.families.attention.backward_runtime import _grads_numpy, _grads_torch
    from emitter.kit.hostdata import decode

    if "reference" in data.cache:
        return data.cache["reference"]
    p, dt = data.problem, _dtype(data.op)
    raw = {name: decode(_host(data, name, like), dt) for name, like in (("q", "q"), ("k", "k"), ("v", "v"),
                                                                         ("d_o", "o"))}
    scale = 1.0 / math.sqrt(p.head_dim)
    mask = "causal_top_left" if p.causal else "none"
    group = p.heads_q // p.heads_kv
    out = {}
    for b, g in sample_pairs(p):
        heads = range(g * group, (g + 1) * group)
        q = _heads(data, raw["q"], "q", b, heads)
        do = _heads(data, raw["d_o"], "o", b, heads)
        k = _heads(data, raw["k"], "k", b, range(g, g + 1))
        v = _heads(data, raw["v"], "v", b, range(g, g + 1))
        dq, dk, dv = [], np.zeros_like(k), np.zeros_like(v)
        for i in range(group):
            args = (q[i:i + 1], k, v, do[i:i + 1], scale, mask)
            gq, gk, gv = _grads_torch(*args, "cuda") if use_torch else _grads_numpy(*args)
            dq.append(gq[0])
            dk += gk
            dv += gv
        out[(b, g)] = {"dq": np.stack(dq), "dk": dk, "dv": dv}
    data.cache["reference"] = out
    return out


def _result(passed: bool, reason: str | None, errors: dict[str, float], tol: float, unwritten: int, nonfinite: int,
            how: str) -> dict[str, Any]:
    return {"passed": passed, "reason": reason, "rel_err": max(errors.values()) if errors else None, "errors": errors,
            "tolerance": tol, "unwritten": unwritten, "nonfinite": nonfinite, "mismatches": 0, "reference": how}


def profile_check(data: BackwardData, cfg: Any, use_torch: bool, **run_options: Any) -> dict[str, Any]:
    """Set 0's dQ, dK, dV (a kernel's; cfg None or the op: the last baseline call's own gradients) against the
    float64 reference of the sampled (batch, KV head) pairs; every element of a kernel's gradients must be
    written."""
    from emitter.kit.hostdata import bits_of, decode, poison_value

    p, dt = data.problem, _dtype(data.op)
    tol = GRAD_REL[data.op.dtype]
    pairs = sample_pairs(p)
    how = (f"float64 autograd ({'torch on the GPU' if use_torch else 'numpy on the host'}) of {len(pairs)} (batch, KV "
           f"head) pairs with their {p.heads_q // p.heads_kv} query heads each; every element checked written")
    if data.mismatch:
        return _result(False, data.mismatch, {}, tol, 0, 0, how)
    group = p.heads_q // p.heads_kv
    is_kernel = cfg is not None and not isinstance(cfg, BackwardProfileOp)
    got: dict[str, Any] = {}
    if is_kernel:
        poison = bits_of(np.asarray(poison_value(dt)).reshape(1))[0]
        unwritten, parts = 0, []
        for grad in GRADS:
            store = _host(data, grad, _LIKE[grad])
            miss = int(np.count_nonzero(bits_of(store) == poison))
            if miss:
                parts.append(f"{miss} of {store.size} elements of {grad} never written (still poison)")
            unwritten += miss
            got[grad] = decode(store, dt)
        if unwritten:
            return _result(False, "; ".join(parts), {}, tol, unwritten, 0, how)

        def rows_of(grad: str, b: int, g: int) -> np.ndarray:
            heads = range(g * group, (g + 1) * group) if grad == "dq" else range(g, g + 1)
            return _heads(data, got[grad], _LIKE[grad], b, heads)
    else:
        cached = data.cache.get("baseline_grads")
        if cached is None:
            return _result(False, "the baseline left no gradients to check", {}, tol, 0, 0, how)
        (tq, tk, tv), expanded = cached
        how = how.replace("; every element checked written", " of the baseline's own gradients")

        def rows_of(grad: str, b: int, g: int) -> np.ndarray:
            if grad == "dq":
                return tq[b, g * group:(g + 1) * group].double().cpu().numpy()
            t = tk if grad == "dk" else tv
            if expanded > 1:       # K/V expanded to the query heads: the group's sum is the KV head's gradient
                return t[b, g * expanded:(g + 1) * expanded].double().sum(dim=0, keepdim=True).cpu().numpy()
            return t[b, g:g + 1].double().cpu().numpy()
    ref = _reference(data, use_torch)
    errors: dict[str, float] = {}
    nonfinite = 0
    for grad in GRADS:
        err, scale = 0.0, 0.0
        for (b, g), want in ref.items():
            have = rows_of(grad, b, g)
            nonfinite += int(np.count_nonzero(~np.isfinite(have)))
            if have.size:
                err = max(err, float(np.max(np.abs(np.nan_to_num(have, nan=np.inf) - want[grad]))))
                scale = max(scale, float(np.abs(want[grad]).max()))
        errors[grad] = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
    if nonfinite:
        return _result(False, f"{nonfinite} NaN/Inf elements in the sampled gradients", errors, tol, 0, nonfinite, how)
    bad = [f"{g} {e:.3g}" for g, e in errors.items() if e > tol]
    if bad:
        return _result(False, f"max |got - ref| / max |ref| > tol {tol:g}: {', '.join(bad)}", errors, tol, 0, 0, how)
    return _result(True, None, errors, tol, 0, 0, how)


# ---------------------------------------------------------------------------------------------- fake engine
def profile_fake_problem(cfg: Any, problem: AttentionProfileProblem, settings: Any, limit: int = 64,
                         **run_options: Any) -> AttentionProblem:
    """The fake profile engine's check problem of a backward instance: the profile problem shrunk (at most 2
    batches, 2 KV heads with up to 2 query heads each, `limit` rows); CannotImplement where the instance does
    not compute the problem."""
    from emitter.families.attention.backward_runtime import not_supported_reasons, profile_op
    from emitter.kit.failures import CannotImplement

    why = op_mismatch(profile_op(cfg), problem)
    if why:
        raise CannotImplement(why)
    reasons = not_supported_reasons(cfg, problem.verify_problem(cfg.layout.value))
    if reasons:
        raise CannotImplement("; ".join(reasons))
    if int(run_options.get("split_k", 1)) != 1 or int(run_options.get("options", 0)) != 0:
        raise CannotImplement("attention backward kernels have no split-K and no run-time scheduler options")
    group = problem.heads_q // problem.heads_kv
    hkv = min(problem.heads_kv, 2)
    sq, sk = min(problem.seq_q, limit), min(problem.seq_k, limit)
    if problem.causal and problem.seq_q == problem.seq_k:
        sq = sk = min(sq, sk)
    small = make_problem(batch=min(problem.batch, 2), heads_q=hkv * min(group, 2), heads_kv=hkv, seq_q=sq, seq_k=sk,
                         head_dim=problem.head_dim, head_dim_v=problem.head_dim_v, layout=cfg.layout.value,
                         causal=problem.causal)
    reasons = not_supported_reasons(cfg, small)
    if reasons:
        raise CannotImplement("; ".join(reasons))
    return small


__all__ = ["PASS", "FLOP_FACTOR", "AttentionBackwardProfileProblem", "BackwardData", "BackwardLaunch", "op_problem",
           "problem_from_dict", "profile_applies", "profile_min_bytes", "profile_set_bytes", "profile_allocate",
           "profile_poison", "kernel_launch", "baseline", "profile_check", "profile_fake_problem", "sample_pairs",
           "forward_outputs", "is_backward_op"]
