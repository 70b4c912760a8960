"""One convolution launch (its forward geometry) and what an instance can run.

ConvProblem is always written in forward terms: x N x D x H x W x C, w K x T x R x S x C, y N x Z x P x Q x K with
Z/P/Q = (D/H/W + pad_front + pad_back - dilation * (T/R/S - 1) - 1) // stride + 1. The instance's op decides which
tensor is written (fprop y, dgrad x, wgrad w). 2D problems have d = t = 1 and depth pad/stride/dilation 0/1/1.

Text form (parse_problem): `n=128,h=56,w=56,c=64,k=64,r=3,s=3,pad=1,stride=1` plus optional d, t, dilation,
pad_h, pad_w, pad_d, pad_top, pad_bottom, pad_left, pad_right, pad_front_d, pad_back_d, stride_h, stride_w,
stride_d, dilation_h, dilation_w, dilation_d, alpha, beta, split_k, bias (0/1), groups.

Grouped convolution (groups = g > 1, F.conv2d's `groups`): c and k are the whole tensors' channel counts, both
multiples of g; w is K x T x R x S x C/g and output channel k reads input channels [(k // (K/g)) * C/g, ... + C/g).
Depthwise is groups = c (= k for a multiplier of 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, Mapping

from emitter.errors import SpecError

PROBLEM_KEYS = (
    "n", "d", "h", "w", "c", "k", "t", "r", "s", "pad", "pad_d", "pad_h", "pad_w", "pad_top", "pad_bottom",
    "pad_left", "pad_right", "pad_front_d", "pad_back_d", "stride", "stride_d", "stride_h", "stride_w",
    "dilation", "dilation_d", "dilation_h", "dilation_w", "alpha", "beta", "split_k", "bias", "groups", "data",
    "label",
)
MAX_EXTENT = 1 << 20


@dataclass(frozen=True)
class ConvProblem:
    FAMILY: ClassVar[str] = "conv"

    n: int
    h: int
    w: int
    c: int
    k: int
    r: int = 1
    s: int = 1
    d: int = 1
    t: int = 1
    pad_front: tuple[int, int, int] = (0, 0, 0)   # depth, height (top), width (left)
    pad_back: tuple[int, int, int] = (0, 0, 0)    # depth, height (bottom), width (right)
    stride: tuple[int, int, int] = (1, 1, 1)
    dilation: tuple[int, int, int] = (1, 1, 1)
    alpha: float = 1.0
    beta: float = 0.0
    split_k: int = 1
    bias: bool = False
    groups: int = 1

    # ---- geometry
    def output_extents(self) -> tuple[int, int, int]:
        out = []
        for ext, flt, i in ((self.d, self.t, 0), (self.h, self.r, 1), (self.w, self.s, 2)):
            span = ext + self.pad_front[i] + self.pad_back[i] - self.dilation[i] * (flt - 1) - 1
            out.append(span // self.stride[i] + 1 if span >= 0 else 0)
        return out[0], out[1], out[2]

    @property
    def dims(self) -> int:
        flat = (self.d == 1 and self.t == 1 and self.pad_front[0] == 0 and self.pad_back[0] == 0
                and self.stride[0] == 1 and self.dilation[0] == 1)
        return 2 if flat else 3

    def shape(self, tensor: str) -> tuple[int, int, int, int, int]:
        z, p, q = self.output_extents()
        return {"x": (self.n, self.d, self.h, self.w, self.c),
                "w": (self.k, self.t, self.r, self.s, self.c // max(self.groups, 1)),
                "y": (self.n, z, p, q, self.k)}[tensor]

    def gemm(self, op: str) -> tuple[int, int, int]:
        """(M, N, K) of the implicit GEMM of operation op (grouped: N and K of the whole problem, the reduction
        K of one group, which is what each output element sums)."""
        z, p, q = self.output_extents()
        trs = self.t * self.r * self.s
        g = max(self.groups, 1)
        if op == "fprop":
            return self.n * z * p * q, self.k, trs * self.c // g
        if op == "dgrad":
            return self.n * self.d * self.h * self.w, self.c, trs * self.k // g
        return self.k, trs * self.c // g, self.n * z * p * q

    def problem_errors(self) -> list[str]:
        """Why these numbers are no convolution at all (independent of any kernel)."""
        errs = []
        for name in ("n", "d", "h", "w", "c", "k", "t", "r", "s"):
            v = getattr(self, name)
            if not 1 <= v <= MAX_EXTENT:
                errs.append(f"{name}={v} must be in 1..{MAX_EXTENT}")
        for i, axis in enumerate("dhw"):
            if self.pad_front[i] < 0 or self.pad_back[i] < 0:
                errs.append(f"padding along {axis} must be >= 0")
            if self.stride[i] < 1 or self.dilation[i] < 1:
                errs.append(f"stride and dilation along {axis} must be >= 1")
        if not errs and min(self.output_extents()) < 1:
            errs.append(f"the filter (t, r, s = {self.t}, {self.r}, {self.s}, dilation {list(self.dilation)}) is larger "
                        f"than the padded input: no output")
        if self.split_k < 1:
            errs.append("split_k must be >= 1")
        if self.groups < 1:
            errs.append(f"groups={self.groups} must be >= 1")
        elif self.c % self.groups or self.k % self.groups:
            errs.append(f"groups={self.groups} must divide both c={self.c} and k={self.k} (each group convolves "
                        f"c/groups input channels into k/groups output channels)")
        return errs

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("pad_front", "pad_back", "stride", "dilation"):
            d[key] = list(d[key])
        if d["groups"] == 1:        # ungrouped problems keep the records they always had
            del d["groups"]
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "ConvProblem":
        from dataclasses import fields
        names = {f.name for f in fields(ConvProblem)}
        kw = {k: v for k, v in d.items() if k in names}      # labels, data kinds: not part of the problem
        for key in ("pad_front", "pad_back", "stride", "dilation"):
            if key in kw:
                kw[key] = tuple(int(v) for v in kw[key])
        return ConvProblem(**kw)

    def label(self, data: str = "normal") -> str:
        z, p, q = self.output_extents()
        geo = f"n{self.n}_" + (f"d{self.d}_" if self.dims == 3 else "") + f"h{self.h}_w{self.w}_c{self.c}_k{self.k}_"
        geo += (f"t{self.t}" if self.dims == 3 else "") + f"r{self.r}s{self.s}"
        pads = "pad" + "x".join(map(str, self.pad_front)) + "_" + "x".join(map(str, self.pad_back))
        geo += f"_{pads}_str{'x'.join(map(str, self.stride))}_dil{'x'.join(map(str, self.dilation))}"
        geo += f"_a{self.alpha:g}_b{self.beta:g}" + (f"_splitk{self.split_k}" if self.split_k > 1 else "")
        geo += "_bias" if self.bias else ""
        geo += f"_g{self.groups}" if self.groups > 1 else ""
        return (geo + f"_{data}").replace("-", "m")


def _symmetric(v: int) -> tuple[int, int, int]:
    return (0, v, v)


def problem_from_mapping(item: Mapping[str, Any], where: str = "<problem>", line: int | None = None,
                         key_path: str = "") -> ConvProblem:
    """A checked ConvProblem from a mapping of PROBLEM_KEYS (SpecError names the key)."""
    def err(key: str, msg: str, value: Any = None, allowed: Any = None, fix: str | None = None) -> SpecError:
        return SpecError(msg, file=where, line=line, key_path=f"{key_path}.{key}" if key_path else key, value=value,
                         allowed=allowed, fix=fix)

    for key in item:
        if key not in PROBLEM_KEYS:
            raise err(key, f"unknown conv problem key '{key}'", value=key, allowed=list(PROBLEM_KEYS))

    def num(key: str, default: Any, kind: type = int, lo: float = 0) -> Any:
        v = item.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
            raise err(key, f"{key} must be {'an integer' if kind is int else 'a number'}", value=v)
        if v != v or v in (float("inf"), float("-inf")) or v < lo:
            raise err(key, f"{key}={v} is out of range", value=v, allowed=f">= {lo}")
        return kind(v)

    for key in ("n", "h", "w", "c", "k"):
        if key not in item:
            raise err(key, f"missing conv problem key '{key}'", allowed=list(PROBLEM_KEYS),
                      fix="e.g. n=128,h=56,w=56,c=64,k=64,r=3,s=3,pad=1,stride=1")
    pad = num("pad", 0)
    pf = [num("pad_d", 0), num("pad_h", pad), num("pad_w", pad)]
    pb = list(pf)
    pf[0] = num("pad_front_d", pf[0]); pb[0] = num("pad_back_d", pb[0])
    pf[1] = num("pad_top", pf[1]); pb[1] = num("pad_bottom", pb[1])
    pf[2] = num("pad_left", pf[2]); pb[2] = num("pad_right", pb[2])
    st = num("stride", 1, lo=1)
    dl = num("dilation", 1, lo=1)
    stride = (num("stride_d", 1, lo=1), num("stride_h", st, lo=1), num("stride_w", st, lo=1))
    dilation = (num("dilation_d", 1, lo=1), num("dilation_h", dl, lo=1), num("dilation_w", dl, lo=1))
    bias = item.get("bias", False)
    if bias not in (0, 1, True, False):
        raise err("bias", "bias must be 0/1 or true/false", value=bias)
    p = ConvProblem(n=num("n", 1, lo=1), h=num("h", 1, lo=1), w=num("w", 1, lo=1), c=num("c", 1, lo=1),
                    k=num("k", 1, lo=1), r=num("r", 1, lo=1), s=num("s", 1, lo=1), d=num("d", 1, lo=1),
                    t=num("t", 1, lo=1), pad_front=tuple(pf), pad_back=tuple(pb), stride=stride, dilation=dilation,
                    alpha=num("alpha", 1.0, float, lo=float("-inf")), beta=num("beta", 0.0, float, lo=float("-inf")),
                    split_k=num("split_k", 1, lo=1), bias=bool(bias), groups=num("groups", 1, lo=1))
    errs = p.problem_errors()
    if errs:
        raise err("", "not a convolution: " + "; ".join(errs), value=dict(item))
    return p


def parse_problem(text: str, where: str = "<command line>") -> list[dict[str, Any]]:
    """`n=128,h=56,w=56,c=64,k=64,r=3,s=3,pad=1,stride=1` -> [mapping] (checked by problem_from_mapping)."""
    if not isinstance(text, str) or "=" not in text:
        raise SpecError("a conv problem is key=value pairs separated by commas", file=where, value=text,
                        fix="e.g. n=128,h=56,w=56,c=64,k=64,r=3,s=3,pad=1,stride=1")
    out: dict[str, Any] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in PROBLEM_KEYS:
            raise SpecError(f"unknown or malformed conv problem term '{part}'", file=where, value=part,
                            allowed=list(PROBLEM_KEYS))
        if key in out:
            raise SpecError(f"conv problem key '{key}' given twice", file=where, value=text)
        value = value.strip()
        try:
            out[key] = float(value) if key in ("alpha", "beta") else (value if key in ("data", "label") else int(value))
        except ValueError:
            raise SpecError(f"conv problem key '{key}' needs a number", file=where, key_path=key, value=value) from None
    problem_from_mapping(out, where)
    return [out]


def not_supported_reasons(cfg: Mapping[str, Any], p: ConvProblem) -> list[str]:
    """Why the instance with manifest config `cfg` cannot run problem p ([] when it can): the same rules its host
    shim and CUTLASS's can_implement apply, said in words before anything is launched."""
    reasons = list(p.problem_errors())
    if reasons:
        return reasons
    if cfg.get("kernel", "implicit") == "depthwise_direct":
        return depthwise_direct_reasons(cfg, p)
    if cfg.get("kernel", "implicit") == "depthwise_simt":
        return depthwise_simt_reasons(cfg, p)
    op, arch, dims = cfg["op"], cfg["arch"], int(cfg.get("dims", 2))
    al_a, al_b, al_c = int(cfg["alignment_a"]), int(cfg["alignment_b"]), int(cfg["alignment_c"])
    a_tensor, b_tensor = {"fprop": ("x", "w"), "dgrad": ("y", "w"), "wgrad": ("y", "x")}[op]
    out = {"fprop": "y", "dgrad": "x", "wgrad": "w"}[op]
    # a grouped kernel reads each group's C/g channels of a row in vector accesses: the per-group count aligns
    chan = {"x": p.c // p.groups, "w": p.c // p.groups, "y": p.k}
    reasons += group_reasons(cfg, p)
    if dims == 2 and p.dims == 3:
        reasons.append("a 2D instance cannot run a problem with depth (d, t, depth padding/stride/dilation)")
    for tensor, al, role in ((a_tensor, al_a, "A"), (b_tensor, al_b, "B"), (out, al_c, "C/D")):
        if chan[tensor] % al:
            reasons.append(f"{'C' if tensor != 'y' else 'K'}{'/groups' if tensor != 'y' and p.groups > 1 else ''}"
                           f"={chan[tensor]} is not a multiple of operand {role}'s "
                           f"alignment {al} ({tensor} rows are read {al} elements at a time)")
    stream_k = cfg.get("kernel", "implicit") == "gemm_1x1" and cfg.get("scheduler") == "stream_k"
    if p.split_k > 1 and cfg.get("split_k", "none") not in ("serial", "parallel") and not stream_k:
        reasons.append(f"split_k={p.split_k}: this is not a split-K instance")
    if p.bias and not cfg.get("epilogue", {}).get("bias", False):
        reasons.append("the problem has a bias, this instance has no bias epilogue")
    if not p.bias and cfg.get("epilogue", {}).get("bias", False):
        reasons.append("this instance adds a bias: give the problem bias=1")
    it = cfg.get("iterator", "optimized")
    if cfg.get("kernel", "implicit") == "gemm_1x1":
        reasons += gemm_1x1_reasons(p)
    if cfg.get("stride_support") == "unity" and max(p.stride) > 1:
        reasons.append(f"stride {list(p.stride)}: this is a unity-stride instance (stride_support: unity)")
    if arch == "sm90a":
        limit = 256 if dims == 2 else 16
        if max(p.pad_front + p.pad_back) > limit:
            reasons.append(f"padding above {limit} (im2col TMA limit in {dims}D)")
        corner = 1 << (16 // dims - 1)
        if max(p.pad_front) > corner:
            reasons.append(f"padding above {corner}: the im2col TMA corner offset is a signed {16 // dims}-bit value")
        if op == "dgrad" and cfg.get("stride_support") == "strided" and max(p.stride) > 1:
            from emitter.families.conv.sm90a import STRIDED_DGRAD_MAX_PHASES
            if any(st > 1 and dl > 1 for st, dl in zip(p.stride, p.dilation)):
                reasons.append("dilation > 1 in a strided dim: sm90a strided dgrad's stride phases take dilation 1")
            if p.stride[0] * p.stride[1] * p.stride[2] > STRIDED_DGRAD_MAX_PHASES:
                reasons.append(f"stride {list(p.stride)}: {p.stride[0] * p.stride[1] * p.stride[2]} stride phases, "
                               f"one launch of sm90a strided dgrad holds {STRIDED_DGRAD_MAX_PHASES}")
        offset = (1 << (16 // dims)) - 1
        for i, f in enumerate((p.t, p.r, p.s)):
            if (f - 1) * p.dilation[i] >= offset:
                reasons.append(f"dilated filter extent {(f - 1) * p.dilation[i] + 1} too large for the im2col TMA offsets")
    else:
        if it == "fixed_channels" and p.c != al_a:
            reasons.append(f"iterator fixed_channels needs C == alignment a = {al_a} (C = {p.c})")
        if op == "dgrad" and it == "optimized" and dims == 2 and max(p.r, p.s) > 32:
            reasons.append(f"filter {p.r}x{p.s}: the optimized 2.x dgrad iterators take R and S up to 32 (use iterator: "
                           f"analytic)")
        if op == "dgrad" and cfg.get("stride_support") == "strided" and max(p.dilation[1:]) > 1:
            # CUTLASS's can_implement refuses it for every strided-dgrad kernel, whatever the problem's stride
            reasons.append("dilation > 1: CUTLASS 2.x strided dgrad kernels do not run dilated filters (a "
                           "unity-stride dgrad instance does, at stride 1)")
        if p.split_k > 1 and op == "dgrad" and max(p.stride) > 1:
            reasons.append("split-K strided dgrad is not supported")
    return reasons


def group_reasons(cfg: Mapping[str, Any], p: ConvProblem) -> list[str]:
    """What a problem's `groups` asks of an instance (CUTLASS 2.x ImplicitGemmConvolution::can_implement's group
    rules, said before a launch): an ungrouped instance (group_mode none, every instance before grouped ones
    existed) runs groups = 1 only; a grouped one (sm80 DefaultConv2dGroupFprop) runs groups > 1 only, with
    single: K/groups a multiple of tile n (a CTA's output channels lie in one group), multiple: tile n a
    multiple of K/groups (a CTA covers whole groups)."""
    mode = cfg.get("group_mode", "none")
    if mode == "none":
        if p.groups > 1:
            return [f"groups={p.groups}: this instance computes ungrouped convolutions only (group_mode none); a "
                    f"grouped problem runs on a group_mode: single or multiple instance"]
        return []
    if p.groups == 1:
        return [f"groups=1: this is a grouped instance (group_mode {mode}); an ungrouped problem runs on a "
                f"group_mode: none instance"]
    k_group = p.k // p.groups
    tile_n = int(cfg["tile"][1]) if cfg.get("tile") else 0
    if mode == "single" and tile_n and k_group % tile_n:
        return [f"K/groups={k_group} is not a multiple of tile n {tile_n}: group_mode single computes one group a "
                f"CTA (use a group_mode: multiple instance, whose tile n is a multiple of K/groups)"]
    if mode == "multiple" and tile_n and tile_n % k_group:
        return [f"tile n {tile_n} is not a multiple of K/groups={k_group}: group_mode multiple computes whole groups "
                f"a CTA (use a group_mode: single instance when K/groups is a multiple of its tile n)"]
    return []


def _depthwise_reasons(kernel: str, cfg: Mapping[str, Any], p: ConvProblem) -> list[str]:
    """What every depthwise kernel refuses: a problem that is not depthwise (groups = C = K), depth, another filter
    size than the compiled one."""
    out = []
    if not p.groups == p.c == p.k:
        out.append(f"groups={p.groups}, C={p.c}, K={p.k}: kernel {kernel} runs depthwise convolutions only "
                   f"(groups = C = K)")
    if p.dims == 3:
        out.append("a 2D instance cannot run a problem with depth (d, t, depth padding/stride/dilation)")
    flt = tuple(cfg.get("filter") or ())
    if flt and (p.r, p.s) != flt:
        out.append(f"filter {p.r}x{p.s}: this {kernel} instance is compiled for {flt[0]}x{flt[1]}")
    return out


def depthwise_direct_reasons(cfg: Mapping[str, Any], p: ConvProblem) -> list[str]:
    """What a `kernel: depthwise_direct` instance (sm80 depthwise direct convolution) refuses -- its shim's
    EMITTER_CANNOT_IMPLEMENT rules, said before a launch: depthwise problems only (groups = C = K), 2D, the compiled
    filter size, stride and dilation (unless compiled as `any`), C a multiple of the 128-bit channel vector, no bias,
    no split_k (a CTA computes one output tile: templates/conv/sm80/depthwise_device.cu.j2 says why), at most 65535
    output tiles (the grid's z)."""
    out = _depthwise_reasons("depthwise_direct", cfg, p)
    for what, key, have in (("stride", "conv_stride", p.stride[1:]), ("dilation", "conv_dilation", p.dilation[1:])):
        fixed = tuple(cfg.get(key) or ())
        if fixed and fixed != (0, 0) and tuple(have) != fixed:
            out.append(f"{what} {list(have)}: this depthwise_direct instance is compiled for {what} "
                       f"{fixed[0]}x{fixed[1]}")
    smem = depthwise_direct_smem(cfg, p)
    if smem is not None and smem[0] > smem[1]:
        out.append(f"stride {list(p.stride[1:])}, dilation {list(p.dilation[1:])}: the input window of an output tile "
                   f"and the filter need about {smem[0]} bytes of shared memory, more than the {smem[1]} of "
                   f"{cfg.get('arch')} (a run-time stride sizes the window at launch)")
    al = int(cfg["alignment_a"])
    if p.c % al:
        out.append(f"C={p.c} is not a multiple of the alignment {al} (the direct kernel reads and writes {al} "
                   f"channels at a time)")
    if p.bias:
        out.append("the problem has a bias, this instance has no bias epilogue")
    if p.split_k > 1:
        out.append(f"split_k={p.split_k}: the direct kernel has no reduction to split; it runs a CTA an output tile")
    tile = cfg.get("tile")
    if tile and not p.dims == 3:
        _, pp, qq = p.output_extents()
        tiles = p.n * -(-max(pp, 1) // int(tile[0])) * -(-max(qq, 1) // int(tile[1]))
        if tiles > 65535:
            out.append(f"{tiles} output tiles of {tile[0]}x{tile[1]} (N * P * Q): the direct kernel runs a CTA a tile, at "
                       f"most 65535 along the grid's z")
    return out


def depthwise_simt_reasons(cfg: Mapping[str, Any], p: ConvProblem) -> list[str]:
    """What a `kernel: depthwise_simt` instance (emitter's SIMT depthwise kernel, sm80_depthwise_simt.py) refuses --
    its shim's EMITTER_CANNOT_IMPLEMENT rules, said before a launch: depthwise problems only (groups = C = K), 2D, the
    compiled filter size, C a multiple of the 8-channel vector, no bias, no split_k (wgrad splits its reduction
    itself). Stride, dilation and padding are anything (read at run time)."""
    out = _depthwise_reasons("depthwise_simt", cfg, p)
    al = int(cfg["alignment_a"])
    if p.c % al:
        out.append(f"C={p.c} is not a multiple of the alignment {al} (the kernel reads and writes {al} channels at "
                   f"a time)")
    if p.bias:
        out.append("the problem has a bias, this instance has no bias epilogue")
    if p.split_k > 1:
        out.append(f"split_k={p.split_k}: kernel depthwise_simt splits its reduction itself (give split_k 1)")
    return out


def _depthwise_simt_problems(cfg: Mapping[str, Any], quick: bool) -> list[ConvProblem]:
    """For a depthwise_simt instance: its filter at stride 1 and 2, dilation 1 and 2; C below, at and past a CTA's
    channel block (no multiple of 64), odd H and W, asymmetric padding, alpha and beta != 0; (not quick) a layer
    long enough that the wgrad reduction runs both levels (more than 16 slices a channel block) and the fprop grid
    holds thousands of CTAs."""
    r, s = (list(cfg.get("filter") or [3, 3]) + [3, 3])[:2]
    ch = int(cfg["tile"][2])

    def dw(c: int, st: int, dl: int, h: int, w: int, pad_f: tuple[int, int], pad_b: tuple[int, int],
           **kw: Any) -> ConvProblem:
        return ConvProblem(n=kw.pop("n", 2), h=dl * (r - 1) + h, w=dl * (s - 1) + w, c=c, k=c, groups=c, r=r, s=s,
                           pad_front=(0,) + pad_f, pad_back=(0,) + pad_b, stride=(1, st, st), dilation=(1, dl, dl), **kw)

    half = (r // 2, s // 2)
    out = [
        dw(ch + 8, 1, 1, 10, 7, half, half),                                     # a block + a partial one
        dw(8, 2, 1, 5, 14, (0, 0), (0, 0), n=3, alpha=1.5, beta=0.5),            # under one block, unpadded
        dw(2 * ch + 24, 2, 2, 17, 5, (2, 1), (3, 2), n=1, beta=-1.0),            # asymmetric padding, dilation 2
        dw(ch, 1, 2, 9, 9, (3, 3), (3, 3), beta=1.0),                            # padding 3
        dw(24, 1, 1, 0, 0, (1, 0), (0, 1), n=5),                                 # the smallest input
    ]
    if not quick:
        out.append(dw(96 + 8 * 5, 1, 1, 31, 29, half, half, n=8, beta=0.25))    # C 136: both reduction levels
        out.append(dw(ch * 3, 2, 1, 40, 37, half, half, n=4))
    return out


_SMEM_LIMIT = {"sm80": 166912, "sm86": 101376, "sm89": 101376}   # sm80.SMEM_LIMIT: what the shim compiles in
_BYTES = {"f16": 2, "bf16": 2, "f32": 4}


def depthwise_direct_smem(cfg: Mapping[str, Any], p: ConvProblem) -> tuple[int, int] | None:
    """(bytes, limit) of shared memory a `stride: any` depthwise_direct instance launches p with
    (sm80_depthwise.smem_bytes at p's stride and dilation); None for compiled strides (the spec's smem rule checked
    them) or a config without the fields."""
    from emitter.families.conv.sm80_depthwise import smem_bytes

    if tuple(cfg.get("conv_stride") or ()) != (0, 0) or not cfg.get("stages") or not cfg.get("tile") or not cfg.get("warp"):
        return None
    need = smem_bytes(tuple(int(v) for v in cfg["tile"]), (p.r, p.s), int(cfg["warp"][0]), p.stride[1:], p.dilation[1:],
                      int(cfg["stages"]), _BYTES.get(str(cfg.get("a")), 2), _BYTES.get(str(cfg.get("accumulator")), 4))
    return need, _SMEM_LIMIT.get(str(cfg.get("arch")), 101376)


def _depthwise_direct_problems(cfg: Mapping[str, Any], quick: bool) -> list[ConvProblem]:
    """For a depthwise_direct instance: its filter at its stride and dilation (1 and 2 each where compiled as any),
    C = K = groups below one CTA's channel block, a whole block and a partial one, H and W no multiples of the output
    tile, padding 0..3 (asymmetric too), alpha and beta != 0, and (not quick) MobileNet's 56 x 56 x 144 at batch 8:
    hundreds of CTAs on every SM at once, where a CTA walking several output tiles raced (the shim now runs a CTA a
    tile; small problems passed either way)."""
    r, s = (list(cfg.get("filter") or [3, 3]) + [3, 3])[:2]
    al = max(int(cfg["alignment_a"]), 8)
    ch = int(cfg["tile"][2])
    fixed_st = tuple(cfg.get("conv_stride") or (1, 1))
    fixed_dl = tuple(cfg.get("conv_dilation") or (1, 1))
    steps = [(fixed_st if fixed_st != (0, 0) else st, fixed_dl if fixed_dl != (0, 0) else dl)
             for st, dl in (((1, 1), (1, 1)), ((2, 2), (1, 1)), ((1, 1), (2, 2)), ((2, 2), (2, 2)))]
    steps = list(dict.fromkeys(steps))

    def dw(c: int, st: tuple[int, int], dl: tuple[int, int], h: int, w: int, pad_f: tuple[int, int],
           pad_b: tuple[int, int], **kw: Any) -> ConvProblem:
        ext_h, ext_w = dl[0] * (r - 1) + 1, dl[1] * (s - 1) + 1
        return ConvProblem(n=kw.pop("n", 2), h=ext_h + h, w=ext_w + w, c=c, k=c, groups=c, r=r, s=s,
                           pad_front=(0,) + pad_f, pad_back=(0,) + pad_b, stride=(1,) + st, dilation=(1,) + dl, **kw)

    out = []
    for i, (st, dl) in enumerate(steps):
        half = (r // 2, s // 2)
        out += [
            dw(2 * ch + al, st, dl, 10, 8, half, half),                                    # 2 blocks + a partial one
            dw(al, st, dl, 4, 14, (0, 0), (0, 0), n=3, alpha=1.5, beta=0.5),               # under one block, unpadded
            dw(ch + al, st, dl, 17, 5, (2, 1), (3, 2), n=1, beta=-1.0),                    # asymmetric padding
        ]
        if i == 0:
            out += [dw(ch, st, dl, 9, 9, (3, 3), (3, 3), beta=1.0),                        # padding 3
                    dw(al * 3, st, dl, 0, 0, (1, 0), (0, 1), n=5)]                         # the smallest input
            if not quick:
                out.append(dw(3 * ch, st, dl, 26, 25, half, half, n=4, beta=0.25))
                # a large layer: N * P * Q / 64 CTAs along the tiles, a partial channel block for 64-channel tiles
                out.append(dw(144, st, dl, 55 - dl[0] * (r - 1), 55 - dl[1] * (s - 1), half, half, n=8))   # 56 x 56
    return out


def gemm_1x1_reasons(p: ConvProblem) -> list[str]:
    """What a `kernel: gemm_1x1` instance refuses beyond the conv rules (its shim: EMITTER_CANNOT_IMPLEMENT): the
    problem must be a GEMM -- a 1x1(x1) filter, stride 1, no padding (dilation then changes nothing). Its tensors
    must also be dense rows (every outer stride the product of the inner ones); problems here are packed."""
    out = []
    if (p.t, p.r, p.s) != (1, 1, 1):
        out.append(f"filter {p.t}x{p.r}x{p.s}: kernel gemm_1x1 runs 1x1 filters only (use a kernel: implicit instance)")
    if max(p.stride) > 1:
        out.append(f"stride {list(p.stride)}: kernel gemm_1x1 runs stride 1 only")
    if max(p.pad_front + p.pad_back) > 0:
        out.append("padding: kernel gemm_1x1 runs unpadded convolutions only")
    return out


def _gemm_1x1_problems(cfg: Mapping[str, Any], quick: bool) -> list[ConvProblem]:
    """1x1 problems for a gemm_1x1 instance: odd N*P*Q (GEMM M of fprop, K-dim of wgrad), C and K multiples of the
    alignment but not of any tile, beta 0 and != 0, alpha != 1, a long wgrad reduction (stream-K splits it), 3D."""
    al = max(int(cfg["alignment_a"]), int(cfg["alignment_b"]), int(cfg["alignment_c"]), 8)
    base = [
        ConvProblem(n=3, h=7, w=9, c=al * 5, k=al * 9, r=1, s=1),                                  # NPQ = 189
        ConvProblem(n=5, h=13, w=11, c=al * 17, k=al * 3, r=1, s=1, beta=0.5, alpha=1.5),          # NPQ = 715
        ConvProblem(n=1, h=1, w=1, c=al, k=al, r=1, s=1, beta=-1.0),                               # one row
        ConvProblem(n=2, h=15, w=17, c=al * 33, k=al * 25, r=1, s=1, beta=1.0),                    # NPQ = 510
        ConvProblem(n=1, h=3, w=5, c=al * 3, k=al * 7, r=1, s=1, dilation=(1, 2, 3)),              # dilation moot
    ]
    if not quick:
        base.append(ConvProblem(n=9, h=27, w=29, c=al * 8, k=al * 8, r=1, s=1, beta=0.25))         # NPQ = 7047
    if cfg.get("scheduler") == "stream_k":     # the run-time split count: the scheduler's split-K mode
        base.append(ConvProblem(n=7, h=13, w=15, c=al * 9, k=al * 5, r=1, s=1, beta=0.5, split_k=3))
    if int(cfg.get("dims", 2)) == 3:
        base = [replace(p, d=3, t=1) for p in base[:3]] + [replace(base[3], d=1)]
    return base


def _strided_dgrad_problems(c: int, k: int) -> list[ConvProblem]:
    """What a strided dgrad kernel gets wrong first: stride 3 (taps a phase skips), a 1x1 filter at stride 2 (three
    of four phases have no tap: their dx is beta * source, still written), a stride larger than the filter with
    padding per side, strides that differ by axis, H and W not multiples of the stride."""
    return [
        ConvProblem(n=2, h=17, w=19, c=c, k=k, r=3, s=3, pad_front=(0, 1, 2), pad_back=(0, 2, 0),
                    stride=(1, 3, 3), beta=0.5),
        ConvProblem(n=3, h=13, w=11, c=c, k=k, r=1, s=1, stride=(1, 2, 2), beta=1.0, alpha=-0.75),
        ConvProblem(n=2, h=15, w=14, c=c, k=k, r=2, s=2, pad_front=(0, 0, 1), pad_back=(0, 1, 0),
                    stride=(1, 3, 3)),
        ConvProblem(n=2, h=21, w=12, c=c, k=k, r=5, s=3, pad_front=(0, 2, 1), pad_back=(0, 1, 1),
                    stride=(1, 2, 3), beta=-1.0),
    ]


def _grouped_problems(cfg: Mapping[str, Any]) -> list[ConvProblem]:
    """For a grouped instance: groups 2, 3 and 4 (and groups = C, depthwise, where one channel a group is an
    access), C/groups an odd multiple of the alignment, K/groups as the group mode needs it (single: tile n and
    twice it; multiple: tile n, its half and quarter), stride 2, dilation 2, 1x1 and 7x7 filters, asymmetric
    padding, beta 0 and != 0: a wrong group offset (a group reading its neighbour's channels) shows everywhere
    but in group 0."""
    al = max(int(cfg["alignment_a"]), int(cfg["alignment_b"]))
    tn = int(cfg["tile"][1])
    kgs = [tn, 2 * tn] if cfg.get("group_mode") == "single" else [tn, max(tn // 2, 1), max(tn // 4, 1)]

    def grouped(g: int, cg: int, kg: int, **geo: Any) -> ConvProblem:
        return ConvProblem(c=g * cg, k=g * kg, groups=g, **geo)

    out = [
        grouped(2, al * 3, kgs[0], n=2, h=9, w=11, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1)),
        grouped(4, al * 5, kgs[1], n=3, h=13, w=10, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1),
                stride=(1, 2, 2), beta=0.5, alpha=1.5),
        grouped(3, al, kgs[-1], n=2, h=12, w=12, r=3, s=3, pad_front=(0, 2, 2), pad_back=(0, 2, 2),
                dilation=(1, 2, 2)),
        grouped(4, al * 2, kgs[0], n=4, h=7, w=9, r=1, s=1),
        grouped(2, al * 3, kgs[1], n=2, h=23, w=21, r=7, s=7, pad_front=(0, 3, 3), pad_back=(0, 3, 3),
                stride=(1, 2, 2), beta=-1.0),
        grouped(3, al * 3, kgs[0], n=2, h=10, w=9, r=3, s=3, pad_front=(0, 1, 2), pad_back=(0, 0, 1), beta=1.0),
    ]
    if al == 1:      # depthwise (groups = C = K): a group's one channel is one access
        c = max(int(cfg["alignment_c"]), 8) * 5
        out.append(ConvProblem(n=2, h=11, w=13, c=c, k=c, groups=c, r=3, s=3, pad_front=(0, 1, 1),
                               pad_back=(0, 1, 1), stride=(1, 2, 2), beta=0.5))
        out.append(ConvProblem(n=3, h=9, w=8, c=c, k=c, groups=c, r=5, s=5, pad_front=(0, 2, 2), pad_back=(0, 2, 2)))
    return out


def default_problems(cfg: Mapping[str, Any], quick: bool = False) -> list[tuple[ConvProblem, str]]:
    """Odd sizes (C, K not tile multiples, stride 2, dilation 2, 1x1, 7x7, asymmetric padding), beta 0 and != 0;
    the cases the instance cannot run are left out (their reason is what not_supported_reasons says)."""
    al = max(int(cfg["alignment_a"]), int(cfg["alignment_b"]), int(cfg["alignment_c"]))
    it = cfg.get("iterator", "optimized")
    c_odd = al * 5                                                                          # e.g. 40 = 5 * 8
    if it == "fixed_channels":
        c_odd = int(cfg["alignment_a"])                  # C == the access width (a first layer padded to 4 / 8)
    elif it == "few_channels":
        c_odd = 3 * int(cfg["alignment_a"])              # C = 3 at alignment 1 (f32/tf32), 6 at 2, ...
    k_odd = max(int(cfg["alignment_c"]), 8) * 9                                            # e.g. 72
    dims = int(cfg.get("dims", 2))
    base: list[ConvProblem] = [
        ConvProblem(n=2, h=9, w=11, c=c_odd, k=k_odd, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1)),
        ConvProblem(n=3, h=13, w=10, c=c_odd, k=k_odd, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1),
                    stride=(1, 2, 2), beta=0.5, alpha=1.5),
        ConvProblem(n=2, h=12, w=12, c=c_odd, k=k_odd, r=3, s=3, pad_front=(0, 2, 2), pad_back=(0, 2, 2),
                    dilation=(1, 2, 2)),
        ConvProblem(n=4, h=7, w=9, c=c_odd if it in ("fixed_channels",) else c_odd * 2, k=k_odd, r=1, s=1),
        ConvProblem(n=2, h=23, w=21, c=c_odd, k=k_odd, r=7, s=7, pad_front=(0, 3, 3), pad_back=(0, 3, 3),
                    stride=(1, 2, 2), beta=-1.0),
        ConvProblem(n=2, h=10, w=9, c=c_odd, k=k_odd, r=3, s=3, pad_front=(0, 1, 2), pad_back=(0, 0, 1), beta=1.0),
    ]
    if not quick:
        base.append(ConvProblem(n=8, h=28, w=28, c=al * 16, k=al * 16, r=3, s=3, pad_front=(0, 1, 1),
                                pad_back=(0, 1, 1), beta=0.25))
    if cfg["op"] == "dgrad" and cfg.get("stride_support") == "strided" and dims == 2:
        base += _strided_dgrad_problems(c_odd, k_odd)
    if dims == 3:
        base = [replace(p, d=5, t=3, pad_front=(1,) + p.pad_front[1:], pad_back=(1,) + p.pad_back[1:])
                for p in base if p.r == 3 and p.dilation == (1, 1, 1)][:3]
    if cfg.get("kernel", "implicit") == "gemm_1x1":
        base = _gemm_1x1_problems(cfg, quick)
    if cfg.get("group_mode", "none") != "none":
        base = _grouped_problems(cfg)
    if cfg.get("kernel", "implicit") == "depthwise_direct":
        base = _depthwise_direct_problems(cfg, quick)
    if cfg.get("kernel", "implicit") == "depthwise_simt":
        base = _depthwise_simt_problems(cfg, quick)
    if cfg.get("split_k") == "serial":
        base = [replace(p, split_k=3) for p in base]
    elif cfg.get("split_k") == "parallel":   # sm90a: 3 slices (split-K mode) and 1 (the stream-K heuristic) in turn
        base = [replace(p, split_k=3 if i % 2 == 0 else 1) for i, p in enumerate(base)]
        # a long reduction over few tiles (100 k-tiles of 64 a tile), split 13 ways, and beta != 0
        base.append(ConvProblem(n=16, h=20, w=20, c=al * 8, k=al * 8, r=3, s=3, pad_front=(0, 1, 1),
                                pad_back=(0, 1, 1), beta=0.5, split_k=13))
    if cfg.get("epilogue", {}).get("bias"):
        base = [replace(p, bias=True) for p in base]
    out = [(p, "normal") for p in base if not not_supported_reasons(cfg, p)]
    out += [(p, "int") for p, _ in out[:2]]
    return out
