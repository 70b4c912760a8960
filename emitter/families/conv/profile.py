"""The conv family's profile hooks (emitter.families.base.PROFILE_HOOKS): what `emitter profile` needs to time conv
instances against cuDNN on the GPU (PyCUDA buffers, torch views of them) and to run its fake engine in CI.

    ConvOp             what kernels are compared under apart from the size: op (fprop/dgrad/wgrad), dims, dtypes,
                       epilogue (FAMILY "conv", key, to_json)
    ConvProfileProblem the geometry (n, d, h, w, c, k, t, r, s, padding, stride, dilation); alpha / beta come from
                       the profile config, split-K from the kernels (runtime.split_k_choices)
    ConvProfileData    rotated operand sets x, w, y (+ source when beta != 0, bias when the op has one) in one
                       DeviceArena, random from a seed of (op, problem): every kernel and cuDNN read the same bytes
    ConvLaunch         one loaded kernel prepared on every set (one Params block and workspace per set)
    cudnn baseline     torch with cudnn.benchmark on channels_last views of the same x / w / y: F.conv2d (conv3d),
                       aten.convolution_backward on the real tensors (what autograd runs; baseline.py says why
                       not torch.nn.grad's helpers); its output is torch's own
    check              set 0's output against torch in float32 without TF32 on the GPU (every element), with verify's
                       conv tolerance; poison = unwritten; NaN never passes
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np

from emitter.dtypes import DType
from emitter.families.base import BaselineLaunch, BaselineUnavailable
from emitter.families.conv.problem import ConvProblem

BASELINES = ("cudnn",)
BASELINE_PROVIDERS = {"cudnn": "cuDNN via torch (cudnn.benchmark, channels_last)"}
_OUT = {"fprop": "y", "dgrad": "x", "wgrad": "w"}


# ------------------------------------------------------------------------------------------------ op, problem
@dataclass(frozen=True)
class ConvOp:
    FAMILY: ClassVar[str] = "conv"

    op: str                 # fprop | dgrad | wgrad
    dims: int
    a: str                  # input type (x, w, y read)
    c: str                  # output type
    accumulator: str = "f32"
    activation: str = "identity"
    bias: bool = False
    layout: str = "nhwc"

    @property
    def b(self) -> str:
        return self.a

    @property
    def d(self) -> str:
        return self.c

    @property
    def key(self) -> str:
        parts = [f"conv{self.dims}d_{self.op}", f"{self.a}{self.c}", f"acc{self.accumulator}", self.layout]
        if self.activation != "identity":
            parts.append(self.activation)
        if self.bias:
            parts.append("bias")
        return "_".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"family": "conv", "op": self.op, "dims": self.dims, "a": self.a, "c": self.c,
                "accumulator": self.accumulator, "activation": self.activation, "bias": self.bias,
                "layout": self.layout, "key": self.key}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ConvOp":
        return cls(op=str(d["op"]), dims=int(d["dims"]), a=str(d["a"]), c=str(d["c"]),
                   accumulator=str(d.get("accumulator", "f32")), activation=str(d.get("activation", "identity")),
                   bias=bool(d.get("bias", False)), layout=str(d.get("layout", "nhwc")))


def profile_op(cfg: Any) -> ConvOp:
    return ConvOp(op=cfg.op, dims=int(cfg.dims), a=cfg.a.yaml, c=cfg.c.yaml, accumulator=cfg.accumulator.yaml,
                  activation=cfg.activation, bias=bool(cfg.bias))


_GEOMETRY = ("n", "d", "h", "w", "c", "k", "t", "r", "s", "pad_front", "pad_back", "stride", "dilation", "groups")


@dataclass(frozen=True, order=True)
class ConvProfileProblem:
    """The profile's unit for conv: a convolution's geometry (forward terms, as ConvProblem)."""

    FAMILY: ClassVar[str] = "conv"

    n: int
    d: int
    h: int
    w: int
    c: int
    k: int
    t: int
    r: int
    s: int
    pad_front: tuple[int, int, int] = (0, 0, 0)
    pad_back: tuple[int, int, int] = (0, 0, 0)
    stride: tuple[int, int, int] = (1, 1, 1)
    dilation: tuple[int, int, int] = (1, 1, 1)
    groups: int = 1

    @property
    def conv(self) -> ConvProblem:
        return ConvProblem(**{f: getattr(self, f) for f in _GEOMETRY})

    @property
    def key(self) -> str:
        """verify's label of the geometry, without the epilogue terms (alpha/beta are the profile config's)."""
        text = self.conv.label("x")
        return text[:-len("_a1_b0_x")] if text.endswith("_a1_b0_x") else text

    @property
    def flops(self) -> int:
        from emitter.families.conv.flops import conv_flops

        return int(conv_flops(self.conv))

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"family": "conv"}
        for f in _GEOMETRY:
            v = getattr(self, f)
            d[f] = list(v) if isinstance(v, tuple) else v
        if d["groups"] == 1:        # ungrouped problems keep the records they always had
            del d["groups"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ConvProfileProblem":
        kw = {}
        for f in _GEOMETRY:
            if f in d:
                v = d[f]
                kw[f] = tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else int(v)
        return cls(**kw)

    def __str__(self) -> str:
        return self.key


def profile_problem(p: ConvProblem) -> ConvProfileProblem | str:
    if p.alpha != 1.0 or p.beta != 0.0 or p.split_k != 1 or p.bias:
        return ("conv profile problems are geometry only (n, h, w, c, k, r, s, padding, stride, dilation, groups): alpha and "
                "beta come from the profile config, split-K from the kernels (split_k_choices), the bias from the "
                "instance")
    return ConvProfileProblem(**{f: getattr(p, f) for f in _GEOMETRY})


def profile_problem_from_dict(d: Mapping[str, Any]) -> ConvProfileProblem:
    return ConvProfileProblem.from_dict(d)


def profile_op_from_json(d: Mapping[str, Any]) -> ConvOp:
    return ConvOp.from_json(d)


def _dt(name: str) -> DType:
    return DType.parse(name)


def _elements(p: ConvProblem) -> dict[str, int]:
    return {t: int(np.prod(p.shape(t))) for t in ("x", "w", "y")}


def profile_min_bytes(op: ConvOp, problem: ConvProfileProblem, beta: float) -> int:
    """x, w, y each moved once (the output written, and read again as the source when beta != 0)."""
    el = _elements(problem.conv)
    a, c = _dt(op.a).bytes, _dt(op.c).bytes
    out = _OUT[op.op]
    n = sum(el[t] * (c if t == out else a) for t in el)
    if beta != 0:
        n += el[out] * c
    if op.bias:
        n += problem.k * c
    return int(n)


def profile_set_bytes(op: ConvOp, problem: ConvProfileProblem, settings: Any) -> int:
    return profile_min_bytes(op, problem, float(getattr(settings, "beta", 0.0)))


def launch_problem(op: ConvOp, problem: ConvProfileProblem, alpha: float, beta: float, split_k: int = 1) -> ConvProblem:
    from dataclasses import replace

    return replace(problem.conv, alpha=float(alpha), beta=float(beta), split_k=max(int(split_k), 1), bias=op.bias)


# ------------------------------------------------------------------------------------------------ device data
@dataclass
class ConvSet:
    x: int
    w: int
    y: int
    source: int = 0
    bias: int = 0


@dataclass
class ConvProfileData:
    op: ConvOp
    problem: ConvProfileProblem
    alpha: float
    beta: float
    sets: list[ConvSet]
    arena: Any
    cfg: Any = None                      # no instance config of its own (the baseline's check reads `op`)
    reference: Any = None
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def conv(self) -> ConvProblem:
        return launch_problem(self.op, self.problem, self.alpha, self.beta)

    @property
    def working_set_bytes(self) -> int:
        return len(self.sets) * profile_min_bytes(self.op, self.problem, self.beta)

    def pointers(self, i: int) -> dict[str, int]:
        s = self.sets[i]
        return {"x": s.x, "w": s.w, "y": s.y, "source": s.source, "bias": s.bias}

    def free(self) -> None:
        self.arena.free()
        self.cache.clear()
        if self.reference is not None:
            self.reference = None
            import torch

            torch.cuda.empty_cache()


def _seed(op: ConvOp, problem: ConvProfileProblem) -> int:
    return int.from_bytes(hashlib.sha256(f"{op.a}{op.c}|{problem.key}".encode()).digest()[:8], "little")


def profile_allocate(op: ConvOp, problem: ConvProfileProblem, settings: Any, sets: int) -> ConvProfileData:
    from emitter.kit.arena import DeviceArena

    alpha, beta = float(getattr(settings, "alpha", 1.0)), float(getattr(settings, "beta", 0.0))
    p = problem.conv
    el = _elements(p)
    a, c = _dt(op.a), _dt(op.c)
    in_dt = DType.f32 if a is DType.tf32 else a
    out = _OUT[op.op]
    arena = DeviceArena(seed=_seed(op, problem))       # the same bytes for every op of these types
    made = []
    try:
        for _ in range(max(int(sets), 1)):
            ptr = {}
            for t in ("x", "w", "y"):
                dt = c if t == out else in_dt
                ptr[t] = arena.alloc(el[t] * dt.bytes)
                arena.fill_random(ptr[t], dt, el[t])
            src = bias = 0
            if beta != 0:
                src = arena.alloc(el[out] * c.bytes)
                arena.fill_random(src, c, el[out])
            if op.bias:
                bias = arena.alloc(p.k * c.bytes)
                arena.fill_random(bias, c, p.k)
            made.append(ConvSet(ptr["x"], ptr["w"], ptr["y"], src, bias))
    except Exception:
        arena.free()
        raise
    return ConvProfileData(op, problem, alpha, beta, made, arena)


def profile_poison(data: ConvProfileData, set_index: int = 0) -> None:
    from emitter.kit.hostdata import poison_value

    out = _OUT[data.op.op]
    c = _dt(data.op.c)
    ptr = getattr(data.sets[set_index], out)
    data.arena.fill_bytes(ptr, np.asarray(poison_value(c)), _elements(data.problem.conv)[out])
    data.cache.pop("baseline_out", None)


# ------------------------------------------------------------------------------------------------ kernel launch
class ConvLaunch:
    """One loaded conv kernel (PyCUDA backend: handle shim + fn) prepared on every operand set."""

    def __init__(self, kernel: Any, data: ConvProfileData, stream: Any, split_k: int = 1, options: int = 0,
                 workspace_reset: str = "library") -> None:
        import pycuda.driver as drv

        from emitter.families.conv.abi import c_problem_from
        from emitter.kit import workspace as wsr   # timing.workspace_reset: the shim's memset, as the library
        from emitter.kit.failures import CannotImplement, LaunchFailed
        from emitter.kit.launcher import PackedParams
        from emitter.kit.shim import EMITTER_BUFFER_TOO_SMALL, EMITTER_CANNOT_IMPLEMENT, EMITTER_OK, status_name

        if options:
            raise CannotImplement("conv instances have no run-time scheduler options")
        h = kernel.handle or {}
        if "shim" not in h or "fn" not in h:
            raise LaunchFailed(f"{kernel.name}: the backend's kernel handle has no host shim / function "
                               "(profiling needs the PyCUDA backend)")
        from emitter.families.conv.problem import not_supported_reasons

        p = launch_problem(data.op, data.problem, data.alpha, data.beta, split_k)
        why = not_supported_reasons(kernel.config.cfg, p)
        if why:
            raise CannotImplement(f"{kernel.name}: {why[0]}")
        self.fn, self.stream, self._handle = h["fn"], stream, int(stream.handle)
        self.launches: list[tuple[Any, Any, Any, int]] = []
        self._allocs: list[Any] = []
        self.resets: list[Any] = []
        self.info: dict[str, Any] = {}
        self.drv = drv
        self.mode = wsr.check_mode(workspace_reset)
        shim = h["shim"]
        try:
            for i in range(len(data.sets)):
                prob = c_problem_from(p, data.pointers(i))
                status, q = shim.query(prob)
                if status == EMITTER_CANNOT_IMPLEMENT:
                    raise CannotImplement(f"{kernel.name}: can_implement is false for {data.problem.key}")
                if status != EMITTER_OK:
                    raise LaunchFailed(f"emitter_{kernel.name}_query returned {status_name(status)}")
                ws, ws_bytes = 0, int(q.workspace_bytes)
                if ws_bytes > 0:        # one workspace per set (serial split-K semaphores: each launch leaves them 0)
                    buf = drv.mem_alloc(ws_bytes)
                    self._allocs.append(buf)
                    ws = int(buf)
                    wsr.mark(drv, ws, ws_bytes)     # what initialize() zeroes is then read back (zeroed_range)
                cap = max(int(q.params_bytes), 64)
                status, params, launch = shim.initialize(prob, ws, stream.handle, cap)
                if status == EMITTER_BUFFER_TOO_SMALL and launch.params_bytes > cap:
                    status, params, launch = shim.initialize(prob, ws, stream.handle, int(launch.params_bytes))
                if status == EMITTER_CANNOT_IMPLEMENT:
                    raise CannotImplement(f"{kernel.name}: initialize: can_implement is false for {data.problem.key}")
                if status != EMITTER_OK or not params:
                    raise LaunchFailed(f"emitter_{kernel.name}_initialize returned {status_name(status)}")
                grid, block, shared = tuple(launch.grid), tuple(launch.block), int(launch.shared_bytes)
                if min(grid) < 1 or min(block) < 1:
                    raise LaunchFailed(f"shim returned an empty launch: grid={grid} block={block}")
                self.fn.allow_shared(shared)
                self.launches.append((grid, block, PackedParams(params), shared))
                self.resets.append(wsr.zeroed_range(drv, stream, ws, ws_bytes))
                self.info = {**launch.as_dict(), "split_k": p.split_k}
            stream.synchronize()       # the shim's workspace memset on the stream
            zeroed = any(r is not None for r in self.resets)
            if self.mode == "settled":  # the kernel alone: no memset where a launch leaves the semaphores zeroed
                wsr.settle(drv, self.fn, stream, self._handle, self.launches, self.resets)
            self.info.update(wsr.describe(self.mode, zeroed, self.resets, len(self._allocs)))
        except Exception:
            self.free()
            raise

    def __call__(self, i: int) -> None:
        j = i % len(self.launches)
        grid, block, packed, shared = self.launches[j]
        if self.resets[j] is not None:     # library mode: initialize()'s memset, as each library call issues it
            self.drv.memset_d8_async(self.resets[j][0], 0, self.resets[j][1], self.stream)
        self.fn.launch(grid, block, shared, self._handle, packed)

    def free(self) -> None:
        for a in self._allocs:
            try:
                a.free()
            except Exception:  # noqa: BLE001
                pass
        self._allocs.clear()


def kernel_launch(kernel: Any, data: ConvProfileData, stream: Any, **run_options: Any) -> ConvLaunch:
    return ConvLaunch(kernel, data, stream, int(run_options.get("split_k", 1)), int(run_options.get("options", 0)),
                      str(run_options.get("workspace_reset", "library")))


# ------------------------------------------------------------------------------------------------ torch views
def _views(torch: Any, data: ConvProfileData, i: int) -> dict[str, Any]:
    """Logical NC(D)HW torch views (channels_last memory) of set i's x, w, y, source."""
    from emitter.kit.torch_interop import CudaArray, torch_dtype

    p = data.problem.conv
    a, c = _dt(data.op.a), _dt(data.op.c)
    out = _OUT[data.op.op]
    s = data.sets[i]
    res = {}
    for t, ptr in (("x", s.x), ("w", s.w), ("y", s.y), ("source", s.source)):
        if not ptr:
            continue
        shape = p.shape(out if t == "source" else t)
        dt = c if t in (out, "source") else (DType.f32 if a is DType.tf32 else a)
        count = int(np.prod(shape))
        raw = {DType.f16: "<f2"}.get(dt)
        flat = torch.as_tensor(CudaArray(ptr, count, dt.bytes, raw), device="cuda")
        want = torch_dtype(torch, dt)
        if flat.dtype != want:
            flat = flat.view(want)
        t5 = flat.view(*shape).permute(0, 4, 1, 2, 3)          # (N, C, D, H, W), NDHWC memory
        res[t] = t5[:, :, 0] if data.op.dims == 2 else t5
    return res


def _geometry(p: ConvProblem, dims: int) -> dict[str, Any]:
    if p.pad_front != p.pad_back:
        raise BaselineUnavailable("asymmetric padding: torch's convolution takes symmetric padding only")
    sl = slice(1, 3) if dims == 2 else slice(0, 3)
    return {"stride": tuple(p.stride[sl]), "padding": tuple(p.pad_front[sl]), "dilation": tuple(p.dilation[sl]),
            "groups": p.groups}


def _torch_conv(torch: Any, op: str, dims: int, v: dict[str, Any], p: ConvProblem, geo: dict[str, Any]) -> Any:
    """The op's result as torch computes it (cuDNN on the GPU for half types), from the real x / w / y views:
    F.conv{2,3}d or aten.convolution_backward, as autograd runs them (families/conv/baseline.py)."""
    from emitter.families.conv.baseline import torch_conv

    return torch_conv(torch, op, v["x"], v["w"], v["y"], **geo)


def baseline(name: str, data: ConvProfileData, stream: Any) -> BaselineLaunch:
    from emitter.kit.torch_interop import torch_available

    if name != "cudnn":
        raise BaselineUnavailable(f"no conv baseline named {name!r} (known: {', '.join(BASELINES)})")
    if not torch_available():
        raise BaselineUnavailable("torch is not installed: no cuDNN baseline (pip install torch)")
    import torch

    op = data.op
    if _dt(op.a) not in (DType.f16, DType.bf16, DType.f32, DType.tf32) or op.a != op.c:
        raise BaselineUnavailable(f"{op.a} -> {op.c} convolution has no cuDNN call through torch here")
    if data.beta != 0 or data.alpha != 1.0 or op.bias or op.activation != "identity":
        raise BaselineUnavailable("the cuDNN baseline computes the plain convolution (alpha 1, beta 0, no epilogue)")
    p = data.problem.conv
    geo = _geometry(p, op.dims)
    torch.backends.cudnn.benchmark = True
    tf32 = _dt(op.a) is DType.tf32
    views = [_views(torch, data, i) for i in range(len(data.sets))]
    tstream = torch.cuda.ExternalStream(int(stream.handle)) if getattr(stream, "handle", 0) else None

    def run(i: int) -> None:
        j = i % len(views)
        if not tf32 and _dt(op.a) is not DType.f32:     # half types: the TF32 switch does not apply, leave it be
            data.cache["baseline_out"] = (j, _torch_conv(torch, op.op, op.dims, views[j], p, geo))
            return
        prev = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = tf32
        try:
            data.cache["baseline_out"] = (j, _torch_conv(torch, op.op, op.dims, views[j], p, geo))
        finally:
            torch.backends.cudnn.allow_tf32 = prev

    def launch(i: int) -> None:
        if tstream is not None:
            with torch.cuda.stream(tstream):
                run(i)
        else:
            run(i)

    from emitter.families.conv.baseline import call_name

    call = call_name(op.op, op.dims)
    provider = (f"{call} (cuDNN {torch.backends.cudnn.version()}, benchmark, channels_last)"
                f"{', TF32' if tf32 else ''}, torch {torch.__version__}")
    try:
        launch(0)
        stream.synchronize()
    except RuntimeError as e:
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "illegal" in text.lower():
            raise
        raise BaselineUnavailable(f"{call} refused this problem: {text}") from None
    return BaselineLaunch("cudnn", provider, launch, tstream)


# ------------------------------------------------------------------------------------------------ check
def profile_check(data: ConvProfileData, cfg: Any, use_torch: bool, **run_options: Any) -> dict[str, Any]:
    """Set 0's output (the kernel's, or with cfg None the baseline's last result on set 0) against torch in
    float32 without TF32 on the GPU, every element; verify's conv tolerance for the reduction length."""
    from emitter.families.conv import reference as _reference
    from emitter.kit.hostdata import bits_of, poison_value

    if not use_torch:
        return {"passed": False, "reason": "the conv profile check needs torch on the GPU machine", "rel_err": None,
                "tolerance": None, "unwritten": None, "nonfinite": None, "mismatches": None, "reference": None}
    import torch

    op = data.op
    p = data.conv
    c = _dt(op.c)
    v = _views(torch, data, 0)
    out = _OUT[op.op]
    if data.reference is None:
        prev = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        try:
            f = {k: t.float() for k, t in v.items() if k in ("x", "w", "y")}
            z = data.alpha * _torch_conv(torch, op.op, op.dims, f, p, _geometry_any(p, op.dims))
            if data.beta != 0:
                z = z + data.beta * v["source"].float()
            if op.bias:
                from emitter.kit.torch_interop import CudaArray, torch_dtype
                flat = torch.as_tensor(CudaArray(data.sets[0].bias, p.k, c.bytes, {DType.f16: "<f2"}.get(c)), device="cuda")
                flat = flat.view(torch_dtype(torch, c)) if flat.dtype != torch_dtype(torch, c) else flat
                z = z + flat.float().view(1, -1, *([1] * op.dims))
            if op.activation == "relu":
                z = torch.relu(z)
            if not c.is_float:     # integer outputs: rounded to nearest even and saturated, as the kernel converts
                info = torch.iinfo(torch.int8 if c is DType.s8 else torch.int32)
                z = torch.clamp(torch.round(z.double()), info.min, info.max)
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = prev
        data.reference = z
    ref = data.reference
    if cfg is None:
        got_t = data.cache.get("baseline_out")
        if got_t is None or got_t[0] != 0:
            return {"passed": None, "reason": "no baseline result of set 0 to check", "rel_err": None,
                    "tolerance": None, "unwritten": 0, "nonfinite": None, "mismatches": None, "reference": None}
        got, unwritten, mask = got_t[1].float(), 0, None
    else:
        o = v[out]
        int_view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[c.bytes]
        pbits = int(bits_of(np.asarray(poison_value(c)).reshape(1)).astype(np.int64)[0])
        pbits = pbits - (1 << (8 * c.bytes)) if pbits >= 1 << (8 * c.bytes - 1) else pbits
        mask = o.contiguous().view(int_view) == pbits if c.is_float else torch.zeros_like(o, dtype=torch.bool)
        unwritten = int(mask.sum().item())
        got = o.float()
    m, n, k = p.gemm(op.op)
    tol = float(_reference.tolerance(op.c if op.a != "tf32" else "tf32", k))
    if op.a == "bf16":
        tol = max(tol, float(_reference.tolerance("bf16", k)))
    bad = ~torch.isfinite(got)
    nonfinite = int((bad & ~mask).sum().item() if mask is not None else bad.sum().item())
    diff = (got - ref).double()
    finite = torch.isfinite(diff)
    rel = float(diff[finite].norm() / max(float(ref.double().norm()), 1e-30)) if bool(finite.any()) else float("inf")
    mism = int(((diff.abs() > 1e-2 * (1 + ref.double().abs())) & finite).sum().item())
    passed = unwritten == 0 and nonfinite == 0 and rel <= tol
    reason = None
    if unwritten:
        reason = f"{unwritten} output elements never written (poison left)"
    elif nonfinite > 0:
        reason = f"{nonfinite} non-finite outputs"
    elif rel > tol:
        reason = f"relative error {rel:.3g} above tolerance {tol:.3g}"
    return {"passed": passed, "reason": reason, "rel_err": rel, "tolerance": tol, "unwritten": unwritten,
            "nonfinite": nonfinite, "mismatches": mism,
            "reference": "torch float32 (no TF32) on the GPU, every element"}


def _geometry_any(p: ConvProblem, dims: int) -> dict[str, Any]:
    """The reference's geometry: symmetric padding through torch's arguments, asymmetric by padding x first."""
    sl = slice(1, 3) if dims == 2 else slice(0, 3)
    if p.pad_front != p.pad_back:
        raise RuntimeError("the conv profile check takes symmetric padding (profile problems with asymmetric padding: "
                           "use emitter verify)")
    return {"stride": tuple(p.stride[sl]), "padding": tuple(p.pad_front[sl]), "dilation": tuple(p.dilation[sl]),
            "groups": p.groups}


# ------------------------------------------------------------------------------------------------ fake engine
def profile_fake_problem(cfg: Any, problem: ConvProfileProblem, settings: Any, limit: int = 64,
                         **run_options: Any) -> ConvProblem:
    """The profile problem shrunk for the numpy fake backend: n <= 2, spatial <= 12 (at least the dilated filter),
    channels <= limit (multiples of the alignment kept), the same filter, padding, stride, dilation."""
    from dataclasses import replace

    p = problem.conv
    dims = []
    for i, (ext, flt) in enumerate(((p.d, p.t), (p.h, p.r), (p.w, p.s))):
        need = p.dilation[i] * (flt - 1) + 1
        dims.append(max(min(ext, 12), need))
    c, k = min(p.c, limit), min(p.k, limit)
    if p.groups > 1:        # fewer groups of the same width (a grouped instance's rules are per group)
        cg, kg = p.c // p.groups, p.k // p.groups
        g = min(p.groups, max(2, limit // max(cg, kg)))
        c, k = g * cg, g * kg
        p = replace(p, groups=g)
    return replace(p, n=min(p.n, 2), d=dims[0], h=dims[1], w=dims[2], c=c, k=k,
                   alpha=float(getattr(settings, "alpha", 1.0)), beta=float(getattr(settings, "beta", 0.0)),
                   split_k=max(int(run_options.get("split_k", 1)), 1), bias=bool(cfg.bias))
