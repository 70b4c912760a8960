"""Conv spec (`family: conv`) -> candidate ConvInstance records.

Same rules as the GEMM spec (emitter/families/gemm/spec.py, whose value parsers are reused; the sweep steps are
emitter.spec.points', as for every family): every field may be a list, the spec sweeps the cartesian product,
`exclude:` drops combinations written with the same keys, and anything outside the vocabulary is a SpecError
naming the file, line, key path, value, allowed values and a fix.

    family: conv
    arch: sm80 | sm90a
    op: fprop | dgrad | wgrad            (alias: operation)
    dims: 2 | 3                          (or layout: nhwc | ndhwc)
    dtype: f16 | {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64      warp: 64x64x64 (2.x)      cluster: 1x1x1 (3.x)      instruction: 16x8x16 (2.x)
    stages: auto | 2..16
    iterator: analytic | optimized | few_channels | fixed_channels      (2.x)
    stride_support: unity | strided
    alignment: auto | 1..16 | {a: 8, b: 8, c: 8}
    swizzle: 1 | 2 | 4 | 8                (2.x)
    epilogue: relu | {activation: relu, bias: true, clamp: [0, 6]}
    split_k: none | serial | parallel
    kernel: implicit | gemm_1x1           (default implicit; gemm_1x1: sm90a fprop/dgrad/wgrad of 1x1 stride-1 unpadded
                                           convs as a persistent CUTLASS 3.x GEMM, other problems refused at run time)
    schedule: auto | cooperative | pingpong          (gemm_1x1 only; auto = cooperative)
    scheduler: auto | persistent | stream_k          (gemm_1x1 only; auto = persistent for fprop/dgrad, stream_k for wgrad)
    swap_ab: false | true                            (gemm_1x1 wgrad only: dw^T = x^T . dy, M = C, N = K: a K = 64
                                                      layer fills a 128x64 tile instead of half a 128x128 one)
    group_mode: none | single | multiple             (sm80 2D fprop: grouped convolution, groups > 1 at run time)
    kernel: depthwise_direct                         (sm80 2D fprop, groups = C = K: CUTLASS's depthwise direct conv;
                                                      tile: PxQxchannels, the output tile of a CTA)
    filter: 3x3 | 3        stride: 1 | 2x2 | any     dilation: 1 | any        (depthwise_direct only: compiled in)
    kernel: depthwise_simt                           (sm80 2D wgrad / fprop, groups = C = K: emitter's SIMT depthwise
                                                      kernel; tile: rows x pixels a thread x channels, filter compiled in)
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from emitter.dtypes import DType
from emitter.errors import SpecError
from emitter.families.conv.model import (
    AUTO, Activation, Arch, ConvEpilogue, ConvGroupMode, ConvInstance, ConvKernelKind, ConvOp, ConvSchedule, ConvTileScheduler,
    IteratorAlgorithm, Layout, Shape3, SplitK, StrideSupport,
)
from emitter.spec import notices, numbers, points, values
# the value parsers every family shares (emitter/spec/fields.py), under this module's names
from emitter.spec.fields import Ctx as _Ctx
from emitter.spec.fields import activation as _activation
from emitter.spec.fields import arch as _arch
from emitter.spec.fields import clamp as _clamp
from emitter.spec.fields import dtype as _dtype
from emitter.spec.fields import integer as _int
from emitter.spec.fields import is_single_shape as _is_single_shape
from emitter.spec.fields import mapping as _mapping
from emitter.spec.fields import shape as _shape
from emitter.spec.fields import split_k as _split_k
from emitter.spec.loader import Document, KeyPath
from emitter.spec.points import Assign

_op = values.enum_parser(ConvOp, {"forward": "fprop", "fwd": "fprop", "data_grad": "dgrad", "input_grad": "dgrad",
                                  "weight_grad": "wgrad", "filter_grad": "wgrad"})
_layout = values.enum_parser(Layout, {"ndhwc": "ndhwc", "tensornhwc": "nhwc", "tensorndhwc": "ndhwc",
                                      "channels_last": "nhwc"})
_iterator = values.enum_parser(IteratorAlgorithm, {"opt": "optimized", "few": "few_channels",
                                                   "fixed": "fixed_channels", "fewchannels": "few_channels",
                                                   "fixedchannels": "fixed_channels"})
_stride_support = values.enum_parser(StrideSupport, {"stride1": "unity", "unit": "unity", "any": "strided"})
_kernel = values.enum_parser(ConvKernelKind, {"implicit_gemm": "implicit", "gemm": "gemm_1x1", "gemm1x1": "gemm_1x1",
                                              "1x1": "gemm_1x1", "depthwise": "depthwise_direct",
                                              "direct": "depthwise_direct", "dwdirect": "depthwise_direct",
                                              "dwsimt": "depthwise_simt", "simt_depthwise": "depthwise_simt",
                                              "depthwise_emitter": "depthwise_simt"})
_schedule = values.enum_parser(ConvSchedule, {"coop": "cooperative", "ping_pong": "pingpong"})
_scheduler = values.enum_parser(ConvTileScheduler, {"streamk": "stream_k", "stream-k": "stream_k"})
_HW = numbers.shape("RS", lo=1, hi=32, example="3x3", noun="filter shape",
                    range_message="filter height and width must be 1..32", range_fix="e.g. filter: 3x3, 5x5 or 7x7")
_STEP = numbers.shape("HW", lo=1, hi=8, example="2x2", noun="step",
                      range_message="a compiled stride or dilation must be 1..8 per axis",
                      range_fix="write 1, 2 or 2x2, or `any` to read it at run time")


def _square(ctx: _Ctx, path: KeyPath, v: Any, parse: Callable, lo: int, hi: int) -> tuple[int, int]:
    """An integer (the same for height and width) or an HxW shape."""
    if numbers.is_int(v):
        if not lo <= v <= hi:
            raise ctx.err(path, f"{v} is out of range", value=v, allowed=f"an integer {lo}..{hi} or HxW",
                          fix=f"use a value in {lo}..{hi}")
        return (v, v)
    return tuple(parse(ctx, path, v))   # type: ignore[return-value]


def _filter_hw(ctx: _Ctx, path: KeyPath, v: Any) -> tuple[int, int]:
    return _square(ctx, path, v, _HW, 1, 32)


def _step(ctx: _Ctx, path: KeyPath, v: Any) -> tuple[int, int]:
    if isinstance(v, str) and v.strip().lower() in ("any", "runtime", "run_time"):
        return (0, 0)
    return _square(ctx, path, v, _STEP, 1, 8)


_group_mode = values.enum_parser(ConvGroupMode, {"single_group": "single", "multiple_groups": "multiple",
                                                 "multiple_group": "multiple", "ungrouped": "none"})


def _dims(ctx: _Ctx, path: KeyPath, v: Any) -> Layout:
    d = _int(2, 3, choices=(2, 3))(ctx, path, v)
    return Layout.nhwc if d == 2 else Layout.ndhwc


def _dtype_shorthand(ctx: _Ctx, path: KeyPath, v: Any) -> list[Assign]:
    d = _dtype(ctx, path, v)
    return [{"a": d, "c": d}]


def _alignment_shorthand(ctx: _Ctx, path: KeyPath, v: Any) -> list[Assign]:
    a = _ALIGN(ctx, path, v)
    return [{"alignment_a": a, "alignment_b": a, "alignment_c": a}]


def _activation_shorthand(ctx: _Ctx, path: KeyPath, v: Any) -> list[Assign]:
    return [{"activation": _activation(ctx, path, v)}]


_ALIGN = _int(1, 16, auto=True, choices=(1, 2, 4, 8, 16))
_DTYPE_KEYS = {"a": points.leaf("a", _dtype), "c": points.leaf("c", _dtype),
               "accumulator": points.leaf("accumulator", _dtype), "epilogue": points.leaf("epilogue_compute", _dtype)}
_ALIGNMENT_KEYS = {"a": points.leaf("alignment_a", _ALIGN), "b": points.leaf("alignment_b", _ALIGN),
                   "c": points.leaf("alignment_c", _ALIGN)}
_EPILOGUE_KEYS = {"activation": points.leaf("activation", _activation), "bias": points.leaf("bias", values.boolean),
                  "clamp": _clamp}

SPEC_KEYS: dict[str, Callable[[_Ctx, KeyPath, Any], list[Assign]]] = {
    "arch": points.leaf("arch", _arch),
    "op": points.leaf("op", _op),
    "operation": points.leaf("op", _op),
    "dims": points.leaf("layout", _dims),
    "layout": points.leaf("layout", _layout),
    "dtype": _mapping(_DTYPE_KEYS, _dtype_shorthand, "dtype"),
    "tile": points.leaf("tile", _shape, single=_is_single_shape),
    "warp": points.leaf("warp", _shape, single=_is_single_shape),
    "cluster": points.leaf("cluster", _shape, single=_is_single_shape),
    "instruction": points.leaf("instruction", _shape, single=_is_single_shape),
    "stages": points.leaf("stages", _int(2, 16, auto=True)),
    "iterator": points.leaf("iterator", _iterator),
    "stride_support": points.leaf("stride_support", _stride_support),
    "alignment": _mapping(_ALIGNMENT_KEYS, _alignment_shorthand, "alignment"),
    "swizzle": points.leaf("swizzle", _int(1, 8, choices=(1, 2, 4, 8))),
    "epilogue": _mapping(_EPILOGUE_KEYS, _activation_shorthand, "epilogue"),
    "split_k": points.leaf("split_k", _split_k),
    "kernel": points.leaf("kernel", _kernel),
    "schedule": points.leaf("schedule", _schedule),
    "scheduler": points.leaf("scheduler", _scheduler),
    "swap_ab": points.leaf("swap_ab", values.boolean),
    "group_mode": points.leaf("group_mode", _group_mode),
    "filter": points.leaf("filter", _filter_hw, single=_is_single_shape),
    "stride": points.leaf("conv_stride", _step, single=_is_single_shape),
    "dilation": points.leaf("conv_dilation", _step, single=_is_single_shape),
}
META_KEYS = {"family", "name", "description", "exclude"}
REQUIRED = ("arch", "op", "dtype", "tile")


def _one_op_key(ctx: _Ctx, path: KeyPath, entry: dict[str, Any],
                key_paths: dict[str, KeyPath] | None) -> dict[str, Any]:
    """`entry` with one of `op` / `operation` (its alias) where both are given. A kernel entry's own key wins
    over `defaults:` (an override, silent); both at one level: the later one wins, with a warning if the two
    name different operations."""
    if "op" not in entry or "operation" not in entry:
        return entry
    where = {k: (key_paths or {}).get(k, path + (k,)) for k in ("op", "operation")}
    levels = {k: where[k][0] == "defaults" for k in where}
    if levels["op"] != levels["operation"]:
        ignored = "op" if levels["op"] else "operation"
    else:
        ignored = next(k for k in entry if k in where)     # the earlier of the two in the spec
        kept = "operation" if ignored == "op" else "op"
        parsed = {k: SPEC_KEYS[k](ctx, where[k], entry[k]) for k in where}
        if parsed["op"] != parsed["operation"]:
            notices.warn(ctx, where[kept], f"both `op` and its alias `operation` are given with different values: "
                                           f"`{kept}: {entry[kept]}` is used, `{ignored}: {entry[ignored]}` "
                                           f"(line {ctx.doc.line(where[ignored])}) is ignored",
                         value=entry[kept], fix="give only one of them")
    return {k: v for k, v in entry.items() if k != ignored}


def _axes(ctx: _Ctx, path: KeyPath, entry: dict[str, Any], key_paths: dict[str, KeyPath] | None = None
          ) -> list[list[Assign]]:
    # before anything is expanded: a sweep over the instance cap is an error naming the multiplying fields
    entry = _one_op_key(ctx, path, entry, key_paths)
    axes = points.axes(ctx, path, entry, SPEC_KEYS, META_KEYS, spec_name="a conv spec", key_paths=key_paths)
    if "dims" in entry and "layout" in entry:
        raise ctx.err((key_paths or {}).get("layout", path + ("layout",)), "give either dims or layout, not both",
                      value=entry["layout"], fix="dims: 2 means layout nhwc, dims: 3 means ndhwc; remove one")
    return axes


def _exclusions(ctx: _Ctx, path: KeyPath, value: Any) -> list[points.Exclusion]:
    return points.exclude_entries(ctx, path, value, SPEC_KEYS, META_KEYS, spec_name="a conv spec",
                                  what="the exclude list", example="exclude: [{op: wgrad, tile: 256x128x64}]")


def _default_accumulator(a: DType) -> DType:
    return DType.s32 if a is DType.s8 else DType.f32


def _build(point: Assign) -> ConvInstance:
    arch: Arch = point["arch"]
    a: DType = point["a"]
    c: DType = point.get("c", DType.f32 if a is DType.tf32 else a)
    if c is DType.tf32:            # tf32 is a math mode: its outputs are f32
        c = DType.f32
    acc: DType = point.get("accumulator", _default_accumulator(a))
    compute: DType = point.get("epilogue_compute", DType.f32 if acc is DType.s32 else acc)
    three = arch.cutlass_major == 3
    tile: Shape3 = point["tile"]
    warp = point.get("warp")
    kernel = point.get("kernel", ConvKernelKind.implicit)
    direct = kernel is ConvKernelKind.depthwise_direct
    simt = kernel is ConvKernelKind.depthwise_simt   # no warp tile: a thread owns 8 channels of a position
    if warp is None and not three and not direct and not simt:   # depthwise_direct: its warp is derived from tile and filter
        warp = Shape3(min(64, max(tile.m // 2, 16)), min(64, max(tile.n // 2, 8)), tile.k)
    op: ConvOp = point["op"]
    # dgrad defaults to unit stride: CUTLASS's strided 2.x dgrad is another kernel (sm80: stride_support: strided),
    # and the sm90 dgrad collective computes unit-stride dgrad only
    default_stride = StrideSupport.unity if op is ConvOp.dgrad else StrideSupport.strided
    activation = point.get("activation", Activation.identity)
    clamped = activation is Activation.clamp   # bounds belong to clamp only (as in the GEMM spec)
    return ConvInstance(
        arch=arch, op=op, layout=point.get("layout", Layout.nhwc), a=a, c=c, accumulator=acc,
        epilogue_compute=compute, tile=tile, warp=warp,
        cluster=point.get("cluster", Shape3(1, 1, 1)) if three else point.get("cluster"),
        instruction=point.get("instruction"), stages=point.get("stages", AUTO),
        iterator=point.get("iterator", IteratorAlgorithm.optimized),
        stride_support=point.get("stride_support", default_stride),
        alignment_a=point.get("alignment_a", AUTO), alignment_b=point.get("alignment_b", AUTO),
        alignment_c=point.get("alignment_c", AUTO), swizzle=point.get("swizzle", 1),
        epilogue=ConvEpilogue(activation=activation, bias=point.get("bias", False),
                              clamp_min=point.get("clamp_min", 0.0) if clamped else 0.0,
                              clamp_max=point.get("clamp_max", 6.0) if clamped else 6.0),
        split_k=point.get("split_k", SplitK.none),
        kernel=kernel,
        schedule=point.get("schedule", ConvSchedule.auto),
        scheduler=point.get("scheduler", ConvTileScheduler.auto),
        swap_ab=point.get("swap_ab", False),
        group_mode=point.get("group_mode", ConvGroupMode.none),
        filter=point.get("filter"),
        conv_stride=point.get("conv_stride", (1, 1) if direct else None),
        conv_dilation=point.get("conv_dilation", (1, 1) if direct else None),
    )


def expand_entry(doc: Document, path: KeyPath, entry: Any,
                 key_paths: dict[str, KeyPath] | None = None) -> Iterator[tuple[ConvInstance, Assign]]:
    """Yield (candidate instance, the sweep point it came from) for one `family: conv` spec entry."""
    ctx = _Ctx(doc)
    if not isinstance(entry, dict):
        raise ctx.err(path, "a kernel spec must be a mapping of keys", value=entry,
                      fix="see configs/conv/*.yaml for examples")
    family = entry.get("family")
    if family != "conv":
        raise ctx.err((key_paths or {}).get("family", path + ("family",)), f"not a conv spec entry: family {family!r}",
                      value=family, allowed=["conv"])
    points.check_required(ctx, path, entry, REQUIRED, SPEC_KEYS, META_KEYS, spec_name="a conv spec",
                          key_paths=key_paths, alternatives={"op": ("operation",)}, see="see configs/conv/*.yaml")
    axes = _axes(ctx, path, entry, key_paths)
    excl_path = (key_paths or {}).get("exclude", path + ("exclude",))
    exclusions = _exclusions(ctx, excl_path, entry.get("exclude"))
    for point in points.expand_checked(ctx, path, axes, exclusions, excl_path):
        if "a" not in point:     # a dtype mapping without its input type (`dtype: {}`, `dtype: {c: f16}`)
            raise ctx.err((key_paths or {}).get("dtype", path + ("dtype",)), "dtype names no input type `a`",
                          value=entry.get("dtype"), allowed=sorted(_DTYPE_KEYS),
                          fix="e.g. dtype: f16, or dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}")
        yield _build(point), point


__all__ = ["expand_entry", "SPEC_KEYS", "SpecError"]
