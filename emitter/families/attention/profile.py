"""The attention family's profile hooks: the profile problem and op, device-resident operand sets, kernel
launches on them, the torch SDPA baselines (cuDNN, flash, efficient) on the same buffers, and the check.

Profile problem: sizes and the mask (`--problem b=16,hq=16,sq=1024,sk=1024,d=128[,causal]`); the FLOPs
count only the visible pairs (causal: top-left, about half). Profile op: what kernels are compared under
apart from the sizes -- dtype, head dims, the instance's mask and the tensors' layout. A kernel whose mask
does not compute the problem's (a causal kernel on a full problem) is NOT_APPLICABLE, and the baselines of
such an (op, problem) pair are recorded as unavailable, so each problem is timed only where it means what
it says. The kernels run without an LSE pointer (the SDPA calls return no LSE either) at the default scale.

Operand sets: Q, K, V and O of the problem in the op's layout (packed), `sets` of them rotated past the L2,
filled with uniform random values in (-1, 1); O poisoned before each check. The SDPA baselines read the very
Q/K/V buffers through zero-copy torch views ([B, H, S, D] views of BSHD storage), write their own output
and are timed by the same EventTimer with the same warm-up as the kernels.

The check (kernels and, as a record, baselines): every element of O written (the poison count over the whole
output), then a float64 numpy reference of sampled rows of sampled (batch, head) pairs -- the first and last
batch, the first and last query head (the last KV head under GQA) -- compared by verify's attention metric
(max |o - ref| / max |ref| <= the dtype's tolerance).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Mapping

import numpy as np

from emitter.dtypes import DType
from emitter.families.attention.flops import visible_pairs
from emitter.families.attention.problem import AttentionProblem, make_problem, mask_mismatch
from emitter.families.base import BaselineLaunch, BaselineUnavailable
from emitter.kit.torch_interop import CudaArray

BASELINES = ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient")
BASELINE_PROVIDERS = {"sdpa_cudnn": "torch SDPA, cuDNN backend", "sdpa_flash": "torch SDPA, flash backend (FA2)",
                      "sdpa_efficient": "torch SDPA, efficient backend (xFormers/CUTLASS)"}
SAMPLE_ROWS = 96


# ---------------------------------------------------------------------------------------------- problem
@dataclass(frozen=True, order=True)
class AttentionProfileProblem:
    FAMILY: ClassVar[str] = "attention"

    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_k: int
    head_dim: int
    head_dim_v: int
    causal: bool = False

    @property
    def key(self) -> str:
        heads = f"h{self.heads_q}" if self.heads_kv == self.heads_q else f"h{self.heads_q}x{self.heads_kv}"
        dims = f"d{self.head_dim}" + (f"v{self.head_dim_v}" if self.head_dim_v != self.head_dim else "")
        return f"b{self.batch}_{heads}_s{self.seq_q}x{self.seq_k}_{dims}" + ("_causal" if self.causal else "")

    @property
    def flops(self) -> int:
        pairs = visible_pairs("causal_top_left" if self.causal else "none", self.seq_q, self.seq_k)
        return 2 * pairs * (self.head_dim + self.head_dim_v) * self.heads_q * self.batch

    def verify_problem(self, layout: str = "bshd") -> AttentionProblem:
        return make_problem(batch=self.batch, heads_q=self.heads_q, heads_kv=self.heads_kv, seq_q=self.seq_q,
                            seq_k=self.seq_k, head_dim=self.head_dim, head_dim_v=self.head_dim_v, layout=layout,
                            causal=self.causal)

    def as_dict(self) -> dict[str, Any]:
        return {"family": "attention", "batch": self.batch, "heads_q": self.heads_q, "heads_kv": self.heads_kv,
                "seq_q": self.seq_q, "seq_k": self.seq_k, "head_dim": self.head_dim, "head_dim_v": self.head_dim_v,
                "causal": self.causal}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "AttentionProfileProblem":
        return cls(int(d["batch"]), int(d["heads_q"]), int(d["heads_kv"]), int(d["seq_q"]), int(d["seq_k"]),
                   int(d["head_dim"]), int(d.get("head_dim_v", d["head_dim"])), bool(d.get("causal", False)))

    def __str__(self) -> str:
        return self.key


def profile_problem(p: AttentionProblem) -> AttentionProfileProblem | str:
    """The profile problem of a parsed attention problem, or why it cannot be one."""
    if p.varlen:
        return "attention profile problems have fixed lengths (b, sq, sk): variable lengths are verify's"
    if p.scale:
        return "attention profile problems run at the default scale 1/sqrt(d): leave scale out"
    if p.pad:
        return "attention profile problems use packed tensors: leave pad out"
    if p.layout != "bshd":
        return "the layout of a profile problem is each kernel's own (its op): leave layout out"
    return AttentionProfileProblem(p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v,
                                   bool(p.causal))


def profile_problem_from_dict(d: Mapping[str, Any]) -> AttentionProfileProblem:
    return AttentionProfileProblem.from_dict(d)


# ---------------------------------------------------------------------------------------------- op
@dataclass(frozen=True)
class AttentionOp:
    FAMILY: ClassVar[str] = "attention"

    dtype: str
    head_dim: int
    head_dim_v: int
    mask: str
    layout: str = "bshd"

    @property
    def a(self) -> str:              # the input dtype (% of peak)
        return self.dtype

    @property
    def key(self) -> str:
        dims = f"d{self.head_dim}" + (f"v{self.head_dim_v}" if self.head_dim_v != self.head_dim else "")
        mask = {"none": "full", "causal_top_left": "causal", "causal_bottom_right": "causalbr"}.get(self.mask, self.mask)
        return f"attn_{self.dtype}_{dims}_{mask}_{self.layout}"

    def to_json(self) -> dict[str, Any]:
        return {"family": "attention", "dtype": self.dtype, "head_dim": self.head_dim, "head_dim_v": self.head_dim_v,
                "mask": self.mask, "layout": self.layout, "key": self.key}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "AttentionOp":
        return cls(str(d["dtype"]), int(d["head_dim"]), int(d.get("head_dim_v", d["head_dim"])), str(d["mask"]),
                   str(d.get("layout", "bshd")))


def profile_op(cfg: Any) -> AttentionOp:
    return AttentionOp(cfg.dtype.yaml, int(cfg.head_dim), int(cfg.head_dim_v), cfg.mask.value, cfg.layout.value)


def profile_op_from_json(d: Mapping[str, Any]) -> AttentionOp:
    return AttentionOp.from_json(d)


def op_mismatch(op: AttentionOp, problem: AttentionProfileProblem) -> str | None:
    """Why the op's kernels do not compute `problem` (head dims, mask), or None."""
    if (op.head_dim, op.head_dim_v) != (problem.head_dim, problem.head_dim_v):
        return f"head dims {problem.head_dim}/{problem.head_dim_v}: the op's are {op.head_dim}/{op.head_dim_v}"
    return mask_mismatch(op.mask, problem.verify_problem(op.layout))


def profile_applies(op: AttentionOp, problem: AttentionProfileProblem) -> bool:
    """Whether the op's kernels compute `problem` at all (the profile pairs only those: no baselines timed for
    a full problem under a causal op)."""
    return op_mismatch(op, problem) is None


def profile_min_bytes(op: AttentionOp, problem: AttentionProfileProblem, beta: float = 0.0) -> int:
    """Q, K, V read once and O written once (no LSE: the profile does not ask for it)."""
    e = problem.verify_problem(op.layout).elements()
    return (e["q"] + e["k"] + e["v"] + e["o"]) * _dtype(op).bytes


def _dtype(op: AttentionOp) -> DType:
    return {"f16": DType.f16, "bf16": DType.bf16, "e4m3": DType.e4m3}[op.dtype]


# ---------------------------------------------------------------------------------------------- operands
def profile_set_bytes(op: AttentionOp, problem: AttentionProfileProblem, settings: Any = None) -> int:
    return profile_min_bytes(op, problem)


def data_seed(op: AttentionOp, problem: AttentionProfileProblem) -> int:
    text = f"{op.dtype}|{op.layout}|{problem.key}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


@dataclass
class AttentionData:
    """Device-resident operand sets of one (op, problem): sets[i] = {"q", "k", "v", "o": device pointer}."""

    op: AttentionOp
    problem: AttentionProfileProblem
    vp: AttentionProblem                     # the problem in the op's layout (strides, element counts)
    sets: list[dict[str, int]]
    arena: Any
    mismatch: str | None = None              # the op's kernels do not compute this problem: nothing allocated
    cfg: Any = None                          # baselines' check: the op's own facts
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def working_set_bytes(self) -> int:
        return len(self.sets) * profile_set_bytes(self.op, self.problem)

    def free(self) -> None:
        if self.arena is not None:
            self.arena.free()
        self.cache.clear()


def profile_allocate(op: AttentionOp, problem: AttentionProfileProblem, settings: Any, sets: int) -> AttentionData:
    from emitter.kit.arena import DeviceArena
    from emitter.kit.hostdata import poison_value

    vp = problem.verify_problem(op.layout)
    why = op_mismatch(op, problem)
    if why:
        return AttentionData(op, problem, vp, [], None, mismatch=why)
    dt = _dtype(op)
    n = vp.elements()
    arena = DeviceArena(seed=data_seed(op, problem))
    out = []
    try:
        for _ in range(max(1, sets)):
            s = {}
            for name in ("q", "k", "v"):
                s[name] = arena.alloc(n[name] * dt.bytes)
                arena.fill_random(s[name], dt, n[name])
            s["o"] = arena.alloc(n["o"] * dt.bytes)
            arena.fill_bytes(s["o"], np.asarray(poison_value(dt)), n["o"])
            out.append(s)
    except Exception:
        arena.free()
        raise
    return AttentionData(op, problem, vp, out, arena, cfg=op)


def profile_poison(data: AttentionData, set_index: int = 0) -> None:
    from emitter.kit.hostdata import poison_value

    if data.mismatch or not data.sets:
        return
    dt = _dtype(data.op)
    data.arena.fill_bytes(data.sets[set_index]["o"], np.asarray(poison_value(dt)), data.vp.elements()["o"])
    data.cache.pop("baseline_out", None)


# ---------------------------------------------------------------------------------------------- kernel launch
class KernelLaunch:
    """A loaded attention kernel prepared on every operand set: one Params block per set (the shim fills the
    TMA descriptors once); launch(i) is one cuLaunchKernel on set i % sets."""

    def __init__(self, kernel: Any, data: AttentionData, stream: Any, **run_options: Any) -> None:
        from emitter.families.attention.problem import not_supported_reasons
        from emitter.families.attention.abi import c_problem
        from emitter.kit import prepare
        from emitter.kit.failures import CannotImplement, LaunchFailed

        self.launches: list[tuple[tuple[int, int, int], tuple[int, int, int], Any, int]] = []
        self.info: dict[str, Any] = {}
        self._allocs: list[Any] = []
        if data.mismatch:
            raise CannotImplement(data.mismatch)
        cfg = kernel.config
        reasons = not_supported_reasons(cfg, data.vp)
        if reasons:
            raise CannotImplement("; ".join(reasons))
        if int(run_options.get("split_k", 1)) != 1 or int(run_options.get("options", 0)) != 0:
            raise CannotImplement("attention kernels have no split-K and no run-time scheduler options")
        h = kernel.handle or {}
        if "shim" not in h or "fn" not in h:
            raise LaunchFailed(f"{kernel.name}: the backend's kernel handle has no host shim / function "
                               "(profiling needs the PyCUDA backend)")
        shim, self.fn = h["shim"], h["fn"]
        self._handle = int(stream.handle)
        try:
            for s in data.sets:
                prob = c_problem(cfg, data.vp, s)          # no "lse" pointer: the LSE is not written
                q = prepare.query(shim, prob, kernel.name,
                                  refusal=f"{kernel.name}_query: can_implement is false for {data.problem.key}")
                ws = 0
                if int(q.workspace_bytes) > 0:
                    import pycuda.driver as drv

                    buf = drv.mem_alloc(int(q.workspace_bytes))
                    self._allocs.append(buf)
                    ws = int(buf)
                entry, launch = prepare.initialize(
                    shim, self.fn, prob, ws, stream.handle, q, kernel.name,
                    refusal=f"{kernel.name}_initialize: can_implement is false for {data.problem.key}")
                self.launches.append(entry)
                self.info = launch.as_dict()
            stream.synchronize()
        except Exception:
            self.free()
            raise

    def __call__(self, i: int) -> None:
        grid, block, packed, shared = self.launches[i % len(self.launches)]
        self.fn.launch(grid, block, shared, self._handle, packed)

    def free(self) -> None:
        for a in self._allocs:
            try:
                a.free()
            except Exception:
                pass
        self._allocs.clear()


def kernel_launch(kernel: Any, data: AttentionData, stream: Any, **run_options: Any) -> KernelLaunch:
    return KernelLaunch(kernel, data, stream, **run_options)


# ---------------------------------------------------------------------------------------------- baselines
def torch_views(torch: Any, data: AttentionData, s: Mapping[str, int]) -> dict[str, Any]:
    """[B, H, S, D] torch views of set `s`'s q, k, v, o (zero-copy, the op's layout's strides)."""
    p, vp = data.problem, data.vp
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}.get(data.op.dtype)
    if dt is None:
        raise BaselineUnavailable(f"no torch SDPA for {data.op.dtype}")
    n = vp.elements()
    strides = vp.strides()
    out = {}
    for name, heads, rows, dim in (("q", p.heads_q, p.seq_q, p.head_dim), ("k", p.heads_kv, p.seq_k, p.head_dim),
                                   ("v", p.heads_kv, p.seq_k, p.head_dim_v), ("o", p.heads_q, p.seq_q, p.head_dim_v)):
        flat = torch.as_tensor(CudaArray(s[name], n[name], 2, "<i2"), device="cuda").view(dt)
        sb, ss, sh = strides[name]
        out[name] = torch.as_strided(flat, (p.batch, heads, rows, dim), (sb, sh, ss, 1))
    return out


def baseline(name: str, data: AttentionData, stream: Any) -> BaselineLaunch:
    """torch SDPA with one backend forced (sdpa_kernel), on the operand sets' Q/K/V; its output is its own."""
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
    views = [torch_views(torch, data, s) for s in data.sets]
    gqa = p.heads_kv != p.heads_q
    tstream = torch.cuda.ExternalStream(int(stream.handle)) if getattr(stream, "handle", 0) else None
    kw: dict[str, Any] = {"is_causal": bool(p.causal)}
    if gqa:
        kw["enable_gqa"] = True

    def run(i: int) -> None:
        v = views[i % len(views)]
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(v["q"], v["k"], v["v"], **kw)
        if i % len(views) == 0:
            data.cache["baseline_out"] = out

    def launch(i: int) -> None:
        if tstream is not None:
            with torch.cuda.stream(tstream):
                run(i)
        else:
            run(i)

    provider = f"torch.nn.functional.scaled_dot_product_attention ({BASELINE_PROVIDERS[name].split(', ')[1]}), " \
               f"torch {torch.__version__}"
    if name == "sdpa_cudnn":
        provider += f", cuDNN {torch.backends.cudnn.version()}"
    def first_call() -> str | None:
        try:       # one call now: a backend that refuses this case is "unavailable", not a fault
            launch(0)
            stream.synchronize()
            return None
        except (RuntimeError, TypeError) as e:
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if "illegal" in text.lower():
                raise
            return text

    refused = first_call()
    if refused and gqa:
        # a backend without enable_gqa gets what a model that uses it passes: K/V expanded to the query heads
        # (repeat_interleave, as transformers' repeat_kv does), made once per operand set and not timed -- the
        # figure most favourable to the baseline
        group = p.heads_q // p.heads_kv
        for v in views:
            v["k"] = v["k"].repeat_interleave(group, dim=1)
            v["v"] = v["v"].repeat_interleave(group, dim=1)
        kw.pop("enable_gqa", None)
        torch.cuda.synchronize()
        again = first_call()
        if again is None:
            provider += f"; GQA as K/V expanded to {p.heads_q} heads before the call (untimed; enable_gqa refused: " \
                        f"{refused[:80]})"
            return BaselineLaunch(name, provider, launch, tstream)
        refused = again
    if refused:
        raise BaselineUnavailable(f"{BASELINE_PROVIDERS[name]} refused this problem: {refused[:200]}")
    if gqa:
        provider += "; GQA through enable_gqa=True"
    return BaselineLaunch(name, provider, launch, tstream)


# ---------------------------------------------------------------------------------------------- check
def _host(data: AttentionData, name: str, ptr: int) -> np.ndarray:
    from emitter.kit.hostdata import storage_dtype

    return data.arena.to_host(ptr, storage_dtype(_dtype(data.op)), data.vp.elements()[name])


def _sample_heads(p: AttentionProfileProblem) -> list[tuple[int, int]]:
    return sorted({(b, h) for b in {0, p.batch - 1} for h in {0, p.heads_q - 1}})


def _sample_rows(n: int) -> np.ndarray:
    if n <= SAMPLE_ROWS:
        return np.arange(n)
    rng = np.random.default_rng(n)
    idx = rng.choice(np.arange(1, n - 1), size=SAMPLE_ROWS - 2, replace=False)
    return np.sort(np.concatenate([[0, n - 1], idx]))


def _reference(data: AttentionData) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """{(b, h): (rows, O rows float64)} of set 0, from the inputs copied to the host."""
    from emitter.kit.hostdata import decode

    if "reference" in data.cache:
        return data.cache["reference"]
    p, vp, dt = data.problem, data.vp, _dtype(data.op)
    s = data.sets[0]
    st = vp.strides()
    raw = {name: decode(_host(data, name, s[name]), dt) for name in ("q", "k", "v")}
    scale = 1.0 / math.sqrt(p.head_dim)
    group = p.heads_q // p.heads_kv
    out = {}
    for b, h in _sample_heads(p):
        def rows_of(name: str, head: int, count: int, dim: int) -> np.ndarray:
            sb, ss, sh = st[name]
            idx = b * sb + head * sh + np.arange(count)[:, None] * ss + np.arange(dim)[None, :]
            return raw[name][idx]

        rows = _sample_rows(p.seq_q)
        q = rows_of("q", h, p.seq_q, p.head_dim)[rows]
        k = rows_of("k", h // group, p.seq_k, p.head_dim)
        v = rows_of("v", h // group, p.seq_k, p.head_dim_v)
        scores = (q @ k.T) * scale
        if p.causal:
            scores = np.where(np.arange(p.seq_k)[None, :] > rows[:, None], -np.inf, scores)
        top = scores.max(axis=1, keepdims=True)
        w = np.exp(scores - top)
        out[(b, h)] = (rows, (w @ v) / w.sum(axis=1, keepdims=True))
    data.cache["reference"] = out
    return out


def _result(passed: bool, reason: str | None, rel: float | None, tol: float, unwritten: int, nonfinite: int,
            how: str) -> dict[str, Any]:
    return {"passed": passed, "reason": reason, "rel_err": rel, "tolerance": tol, "unwritten": unwritten,
            "nonfinite": nonfinite, "mismatches": 0, "reference": how}


def profile_check(data: AttentionData, cfg: Any, use_torch: bool, **run_options: Any) -> dict[str, Any]:
    """Set 0's O (a kernel's; cfg None or the op: the last baseline call's own output) against the float64
    reference of sampled rows; every element of a kernel's O must be written."""
    from emitter.families.attention.tolerances import o_tolerance
    from emitter.kit.hostdata import bits_of, decode, poison_value

    p, dt = data.problem, _dtype(data.op)
    tol = o_tolerance(dt)
    heads = _sample_heads(p)
    how = (f"numpy float64 on the host: {min(p.seq_q, SAMPLE_ROWS)} query rows of {len(heads)} (batch, head) "
           f"pairs; every element checked written")
    if data.mismatch:
        return _result(False, data.mismatch, None, tol, 0, 0, how)
    is_kernel = cfg is not None and not isinstance(cfg, AttentionOp)
    if is_kernel:
        store = _host(data, "o", data.sets[0]["o"])
        unwritten = int(np.count_nonzero(bits_of(store) == bits_of(np.asarray(poison_value(dt)).reshape(1))[0]))
        if unwritten:
            return _result(False, f"{unwritten} of {store.size} elements of O never written (still poison)", None,
                           tol, unwritten, 0, how)
        o = decode(store, dt)
        sb, ss, sh = data.vp.strides()["o"]

        def got_rows(b: int, h: int, rows: np.ndarray) -> np.ndarray:
            return o[b * sb + h * sh + rows[:, None] * ss + np.arange(p.head_dim_v)[None, :]]
    else:
        out = data.cache.get("baseline_out")
        if out is None:
            return _result(False, "the baseline left no output to check", None, tol, 0, 0, how)
        host = out.float().cpu().numpy().astype(np.float64)       # [B, H, S, Dv]

        def got_rows(b: int, h: int, rows: np.ndarray) -> np.ndarray:
            return host[b, h][rows]
        how = how.replace("; every element checked written", " of the baseline's own output")
    ref = _reference(data)
    err, scale, nonfinite = 0.0, 0.0, 0
    for (b, h), (rows, want) in ref.items():
        got = got_rows(b, h, rows)
        nonfinite += int(np.count_nonzero(~np.isfinite(got)))
        err = max(err, float(np.nanmax(np.abs(np.nan_to_num(got, nan=np.inf) - want))) if got.size else 0.0)
        scale = max(scale, float(np.abs(want).max()) if want.size else 0.0)
    rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
    if nonfinite:
        return _result(False, f"{nonfinite} NaN/Inf elements in the sampled rows", None, tol, 0, nonfinite, how)
    if rel > tol:
        return _result(False, f"max |o - ref| / max |ref| = {rel:.3g} > tol {tol:g}", rel, tol, 0, 0, how)
    return _result(True, None, rel, tol, 0, 0, how)


# ---------------------------------------------------------------------------------------------- fake engine
def profile_fake_problem(cfg: Any, problem: AttentionProfileProblem, settings: Any, limit: int = 64,
                         **run_options: Any) -> AttentionProblem:
    """The fake profile engine's check problem: the profile problem shrunk (at most 2 batches, 2 KV heads with
    up to 2 query heads each, `limit` rows), with the problem's mask request; CannotImplement for a kernel
    whose mask or head dims do not compute the problem."""
    from emitter.kit.failures import CannotImplement

    from emitter.families.attention.problem import not_supported_reasons

    why = op_mismatch(profile_op(cfg), problem)
    if why:
        raise CannotImplement(why)
    reasons = not_supported_reasons(cfg, problem.verify_problem(cfg.layout.value))   # as the GPU's KernelLaunch
    if reasons:
        raise CannotImplement("; ".join(reasons))
    group = problem.heads_q // problem.heads_kv
    hkv = min(problem.heads_kv, 2)
    sq = min(problem.seq_q, limit)
    sk = min(problem.seq_k, limit)
    if not getattr(cfg, "key_tail", True) and sk % cfg.tile_kv:
        sk = min(problem.seq_k, cfg.tile_kv)
    if problem.causal and problem.seq_q == problem.seq_k:
        sk = sq = min(sq, sk)       # keep both causal alignments the same, as in the full problem
    small = make_problem(batch=min(problem.batch, 2), heads_q=hkv * min(group, 2), heads_kv=hkv, seq_q=sq, seq_k=sk,
                         head_dim=problem.head_dim, head_dim_v=problem.head_dim_v, causal=problem.causal)
    reasons = not_supported_reasons(cfg, small)
    if reasons:
        raise CannotImplement("; ".join(reasons))
    return small


__all__ = ["BASELINES", "BASELINE_PROVIDERS", "AttentionProfileProblem", "AttentionOp", "AttentionData",
           "profile_problem", "profile_problem_from_dict", "profile_op", "profile_op_from_json", "profile_min_bytes",
           "profile_set_bytes", "profile_allocate", "profile_poison", "kernel_launch", "baseline", "profile_check",
           "profile_fake_problem", "op_mismatch", "profile_applies"]
