"""GEMM spec -> candidate GemmInstance records.

Every field may be a list: the spec sweeps the cartesian product. `exclude:` drops combinations,
written with the same keys as the spec. Values are parsed into enums and ints here; anything not
in the vocabulary is a SpecError naming the file, line, key path, value and the allowed values.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Callable, Iterator

from emitter.dtypes import DTYPE_ALIASES, DType
from emitter.errors import SpecError
from emitter.families.gemm.model import (
    AUTO, Activation, Arch, Bias, Epilogue, EpilogueSchedule, GemmInstance, KernelSchedule, Layout,
    OpClass, Promotion, Raster, Reduction, Shape3, SplitK, TileScheduler,
)
from emitter.spec import numbers, points, values
from emitter.spec.loader import Document, KeyPath, format_path
from emitter.spec.points import Assign  # canonical key -> parsed value (one point of one sweep axis)
from emitter.spec.sweep import check_sweep

class _Ctx:
    def __init__(self, doc: Document):
        self.doc = doc

    def err(self, path: KeyPath, msg: str, **kw: Any) -> SpecError:
        return self.doc.error(path, msg, **kw)

    error = err   # the name emitter.spec.points (and check_sweep) raise through


# ---------------------------------------------------------------- scalar parsers (value -> enum/int)

def _enum(enum: type, aliases: dict[str, str] | None = None) -> Callable[[_Ctx, KeyPath, Any], Any]:
    return values.enum_parser(enum, aliases)


def _dtype(ctx: _Ctx, path: KeyPath, v: Any) -> DType:
    if not isinstance(v, str):
        raise ctx.err(path, "a data type name is expected", value=v, allowed=DType.names())
    text = DTYPE_ALIASES.get(v.strip().lower(), v.strip().lower())
    try:
        return DType.parse(text)
    except KeyError:
        raise ctx.err(path, f"unknown data type '{v}'", value=v, allowed=DType.names(),
                      fix="use one of the allowed names (aliases like fp16, bfloat16, int8 also work)") from None


_arch = _enum(Arch, {"sm_80": "sm80", "sm_90a": "sm90a", "sm90": "sm90a", "sm_90": "sm90a", "sm_75": "sm75",
                     "sm_86": "sm86", "sm_89": "sm89"})
_layout = _enum(Layout, {"rowmajor": "row", "row_major": "row", "r": "row", "t": "row",
                         "colmajor": "col", "column": "col", "col_major": "col", "column_major": "col",
                         "c": "col", "n": "col"})
_op_class = _enum(OpClass, {"tensor_op": "tensorop", "tensor": "tensorop", "wgmma": "tensorop"})
_kernel_schedule = _enum(KernelSchedule, {"coop": "cooperative", "ping_pong": "pingpong"})
_epilogue_schedule = _enum(EpilogueSchedule, {"nosmem": "no_smem"})
_tile_scheduler = _enum(TileScheduler, {"streamk": "stream_k", "stream-k": "stream_k"})
_activation = _enum(Activation, {"none": "identity", "linear": "identity", "swish": "silu"})
_bias = _enum(Bias, {"per_row": "row", "per_column": "column", "col": "column", "per_col": "column"})
_split_k = _enum(SplitK, {"no": "none", "off": "none"})
_raster = _enum(Raster, {"auto": "heuristic", "m": "along_m", "n": "along_n", "alongm": "along_m",
                         "alongn": "along_n"})
_promotion = _enum(Promotion, {"overlapped": "overlap", "default": "serial"})
_reduction = _enum(Reduction, {"nondet": "nondeterministic", "non_deterministic": "nondeterministic",
                               "det": "deterministic"})


def _int(lo: int, hi: int, *, auto: bool = False, choices: tuple[int, ...] | None = None):
    return numbers.integer(lo, hi, auto=auto, choices=choices)


_bool = values.boolean


FLT_MAX = 3.4028234663852886e38   # the epilogue's bounds are C++ float literals: they must fit a float


def _float(ctx: _Ctx, path: KeyPath, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        raise ctx.err(path, "a finite number is expected", value=v, allowed=f"a number from -{FLT_MAX:.7g} to {FLT_MAX:.7g}")
    if abs(v) > FLT_MAX:
        shown = v if isinstance(v, float) else f"an integer of {len(str(abs(v))) if abs(v) < 10 ** 400 else 'over 400'} digits"
        raise ctx.err(path, "out of the range of a C++ float (the kernel's epilogue holds it as float)", value=shown,
                      allowed=f"a number from -{FLT_MAX:.7g} to {FLT_MAX:.7g}", fix="use a smaller bound")
    return float(v)


def _as_f32(v: float) -> float:
    import struct
    return struct.unpack("f", struct.pack("f", v))[0]


_shape3 = numbers.shape("MNK", lo=1, hi=4096, example="128x256x64",
                        range_message="shape dimensions must be positive and at most 4096",
                        range_fix="use a CUTLASS tile size such as 64, 128 or 256")
# three numbers (any of them possibly wrong, e.g. 32.5) are one shape; a sweep lists shapes (strings or lists)
_is_single_shape = numbers.is_single_shape


def _shape(ctx: _Ctx, path: KeyPath, v: Any) -> Shape3:
    return Shape3(*_shape3(ctx, path, v))


# ---------------------------------------------------------------- spec keys -> canonical keys

def _leaf(canon: str, parser: Callable[[_Ctx, KeyPath, Any], Any], *, shape: bool = False):
    """A key with one canonical target; a list sweeps (for shapes, a list of shapes)."""
    return points.leaf(canon, parser, single=_is_single_shape if shape else None)


def _mapping(subkeys: dict[str, Callable], shorthand: Callable[[_Ctx, KeyPath, Any], list[Assign]] | None,
             what: str, required: tuple[str, ...] = (), example: str = ""):
    """A key whose value is a mapping of sub-keys (each may sweep) or a shorthand scalar; `required` sub-keys
    must be in the mapping form."""
    def group(ctx: _Ctx, path: KeyPath, v: Any) -> list[Assign]:
        if isinstance(v, list):
            if not v:
                raise ctx.err(path, "an empty list sweeps nothing", value=v)
            out: list[Assign] = []
            for i, item in enumerate(v):
                out += group(ctx, path + (i,), item)
                check_sweep(ctx.doc, path, [(format_path(path), len(out))], what=f"the list of {what} settings")
            return out
        if isinstance(v, dict):
            for k in v:      # a misspelt sub-key first: `{aa: f16}` is a typo of `a`, not a mapping without it
                if k not in subkeys:
                    raise ctx.err(path + (k,), f"unknown key '{k}' in {what}", value=k, allowed=sorted(subkeys),
                                  fix=_did_you_mean(k, subkeys))
            missing = [k for k in required if k not in v]
            if missing:
                raise ctx.err(path, f"{what} mapping needs '{missing[0]}'", value=v, allowed=sorted(subkeys),
                              fix=f"add `{missing[0]}:` ({example})" if example else f"add `{missing[0]}:`")
            axes = [subkeys[k](ctx, path + (k,), sub) for k, sub in v.items()]
            check_sweep(ctx.doc, path, [(format_path(path + (k,)), len(a)) for k, a in zip(v, axes)],
                        what=f"{what}")
            return [_merge(combo) for combo in itertools.product(*axes)] if axes else [{}]
        if shorthand is None:
            raise ctx.err(path, f"{what} must be a mapping", value=v, allowed=sorted(subkeys))
        return shorthand(ctx, path, v)
    return group


_merge = points.merge
_did_you_mean = points.did_you_mean


def _dtype_shorthand(ctx: _Ctx, path: KeyPath, v: Any) -> list[Assign]:
    d = _dtype(ctx, path, v)
    return [{"a": d, "b": d, "c": d, "d": d}]


def _layout_shorthand(ctx: _Ctx, path: KeyPath, v: Any) -> list[Assign]:
    # BLAS letters as in CUTLASS names: t = row-major, n = column-major; "tn" = A row, B col; 3rd letter = C/D
    if isinstance(v, str) and re.fullmatch(r"[tnTN]{2,3}", v.strip()):
        letters = v.strip().lower()
        lay = {"t": Layout.row, "n": Layout.col}
        out: Assign = {"layout_a": lay[letters[0]], "layout_b": lay[letters[1]]}
        if len(letters) == 3:
            out["layout_c"] = lay[letters[2]]
        return [out]
    raise ctx.err(path, "layout must be two or three BLAS letters or a mapping", value=v,
                  allowed="tn, nt, nn, tt (t = row-major, n = column-major; a 3rd letter sets C/D), "
                          "or {a: row, b: col, c: row}")


def _alignment_shorthand(ctx: _Ctx, path: KeyPath, v: Any) -> list[Assign]:
    a = _int(1, 16, auto=True, choices=(1, 2, 4, 8, 16))(ctx, path, v)
    return [{"alignment_a": a, "alignment_b": a, "alignment_c": a}]


def _schedule_shorthand(ctx: _Ctx, path: KeyPath, v: Any) -> list[Assign]:
    return [{"kernel_schedule": _kernel_schedule(ctx, path, v)}]


def _clamp(ctx: _Ctx, path: KeyPath, v: Any) -> list[Assign]:
    if isinstance(v, list) and len(v) == 2:
        lo, hi = _float(ctx, path + (0,), v[0]), _float(ctx, path + (1,), v[1])
    elif isinstance(v, dict) and set(v) <= {"min", "max"}:
        lo = _float(ctx, path + ("min",), v.get("min", 0.0))
        hi = _float(ctx, path + ("max",), v.get("max", 6.0))
    else:
        raise ctx.err(path, "clamp bounds must be [min, max] or {min: .., max: ..}", value=v)
    if lo >= hi:
        raise ctx.err(path, f"clamp min {lo} must be below max {hi}", value=v)
    if _as_f32(lo) >= _as_f32(hi):
        raise ctx.err(path, f"clamp bounds {lo!r} and {hi!r} are the same number as C++ floats "
                            f"({_as_f32(lo)!r}): the clamp would be a constant", value=v,
                      fix="make the bounds differ within float precision (about 7 significant digits)")
    return [{"clamp_min": lo, "clamp_max": hi}]


def _activation_shorthand(ctx: _Ctx, path: KeyPath, v: Any) -> list[Assign]:
    return [{"activation": _activation(ctx, path, v)}]


_DTYPE_KEYS = {
    "a": _leaf("a", _dtype), "b": _leaf("b", _dtype), "c": _leaf("c", _dtype), "d": _leaf("d", _dtype),
    "accumulator": _leaf("accumulator", _dtype), "epilogue": _leaf("epilogue_compute", _dtype),
}
_LAYOUT_KEYS = {"a": _leaf("layout_a", _layout), "b": _leaf("layout_b", _layout), "c": _leaf("layout_c", _layout)}
_SCHEDULE_KEYS = {
    "kernel": _leaf("kernel_schedule", _kernel_schedule),
    "epilogue": _leaf("epilogue_schedule", _epilogue_schedule),
    "tile_scheduler": _leaf("tile_scheduler", _tile_scheduler),
    "fp8_fast_accum": _leaf("fp8_fast_accum", _bool),
    "reduction": _leaf("reduction", _reduction),
    "promotion_interval": _leaf("promotion_interval", _int(1, 64, auto=True)),
    "promotion": _leaf("promotion", _promotion),
}
_ALIGN = _int(1, 16, auto=True, choices=(1, 2, 4, 8, 16))
_ALIGNMENT_KEYS = {"a": _leaf("alignment_a", _ALIGN), "b": _leaf("alignment_b", _ALIGN), "c": _leaf("alignment_c", _ALIGN)}
_EPILOGUE_KEYS = {
    "activation": _leaf("activation", _activation),
    "bias": _leaf("bias", _bias),
    "clamp": _clamp,
    "source": _leaf("source", _bool),
}

SPEC_KEYS: dict[str, Callable[[_Ctx, KeyPath, Any], list[Assign]]] = {
    "arch": _leaf("arch", _arch),
    "dtype": _mapping(_DTYPE_KEYS, _dtype_shorthand, "dtype", required=("a",),
                      example="e.g. dtype: {a: bf16, accumulator: f32}, or the shorthand dtype: bf16"),
    "layout": _mapping(_LAYOUT_KEYS, _layout_shorthand, "layout"),
    "op_class": _leaf("op_class", _op_class),
    "tile": _leaf("tile", _shape, shape=True),
    "warp": _leaf("warp", _shape, shape=True),
    "cluster": _leaf("cluster", _shape, shape=True),
    "instruction": _leaf("instruction", _shape, shape=True),
    "stages": _leaf("stages", _int(2, 16, auto=True)),
    "schedule": _mapping(_SCHEDULE_KEYS, _schedule_shorthand, "schedule"),
    "swizzle": _leaf("swizzle", _int(1, 8, choices=(1, 2, 4, 8))),
    "raster": _leaf("raster", _raster),
    "alignment": _mapping(_ALIGNMENT_KEYS, _alignment_shorthand, "alignment"),
    "epilogue": _mapping(_EPILOGUE_KEYS, _activation_shorthand, "epilogue"),
    "split_k": _leaf("split_k", _split_k),
    "batched": _leaf("batched", _bool),
    "swap_ab": _leaf("swap_ab", _bool),
}
META_KEYS = {"family", "name", "description", "exclude"}
REQUIRED = ("arch", "dtype", "tile")


# ---------------------------------------------------------------- expansion

def _axes(ctx: _Ctx, path: KeyPath, entry: dict[str, Any],
          key_paths: dict[str, KeyPath] | None = None, *, what: str = "this spec") -> list[list[Assign]]:
    return points.axes(ctx, path, entry, SPEC_KEYS, META_KEYS, spec_name="a gemm spec", key_paths=key_paths,
                       what=what)


def _exclusions(ctx: _Ctx, path: KeyPath, value: Any) -> list[points.Exclusion]:
    return points.exclude_entries(ctx, path, value, SPEC_KEYS, META_KEYS, spec_name="a gemm spec",
                                  what="this exclude entry",
                                  example="exclude: [{tile: 256x128x64, schedule: {kernel: pingpong}}]")


def _default_accumulator(a: DType) -> DType:
    if a is DType.f64:
        return DType.f64
    if a is DType.s8:
        return DType.s32
    return DType.f32


def _build(point: Assign) -> GemmInstance:
    arch: Arch = point["arch"]
    a: DType = point["a"]
    b: DType = point.get("b", a)
    d: DType = point.get("d", point.get("c", a))
    c: DType = point.get("c", d)
    acc: DType = point.get("accumulator", _default_accumulator(a))
    compute: DType = point.get("epilogue_compute", DType.f32 if acc is DType.s32 else acc)
    three = arch.cutlass_major == 3
    tile: Shape3 = point["tile"]
    warp = point.get("warp")
    if warp is None and not three:
        warp = Shape3(min(64, max(tile.m // 2, 16)), min(64, max(tile.n // 2, 8)), tile.k)
    cluster = point.get("cluster", Shape3(1, 1, 1) if three else None)
    activation = point.get("activation", Activation.identity)
    # bounds belong to the clamp activation only: relu given bounds is plain relu (same name, same kernel), so
    # two such entries are one instance instead of two configs under one name
    clamped = activation is Activation.clamp
    return GemmInstance(
        arch=arch, a=a, b=b, c=c, d=d,
        layout_a=point.get("layout_a", Layout.row),
        layout_b=point.get("layout_b", Layout.col),
        layout_c=point.get("layout_c", Layout.row),
        accumulator=acc, epilogue_compute=compute,
        op_class=point.get("op_class", OpClass.tensorop),
        tile=tile, warp=warp, cluster=cluster,
        instruction=point.get("instruction"),
        stages=point.get("stages", AUTO),
        kernel_schedule=point.get("kernel_schedule", KernelSchedule.auto),
        epilogue_schedule=point.get("epilogue_schedule", EpilogueSchedule.auto),
        tile_scheduler=point.get("tile_scheduler", TileScheduler.persistent),
        swizzle=point.get("swizzle", 1),
        alignment_a=point.get("alignment_a", AUTO),
        alignment_b=point.get("alignment_b", AUTO),
        alignment_c=point.get("alignment_c", AUTO),
        epilogue=Epilogue(
            activation=activation,
            bias=point.get("bias", Bias.none),
            clamp_min=point.get("clamp_min", 0.0) if clamped else 0.0,
            clamp_max=point.get("clamp_max", 6.0) if clamped else 6.0,
            source=point.get("source", True),
        ),
        split_k=point.get("split_k", SplitK.none),
        batched=point.get("batched", False),
        fp8_fast_accum=point.get("fp8_fast_accum", False),
        swap_ab=point.get("swap_ab", False),
        raster=point.get("raster", Raster.heuristic),
        reduction=point.get("reduction", Reduction.deterministic),
        promotion_interval=point.get("promotion_interval", AUTO),
        promotion=point.get("promotion", Promotion.serial),
    )


def expand_entry(doc: Document, path: KeyPath, entry: Any,
                 key_paths: dict[str, KeyPath] | None = None) -> Iterator[tuple[GemmInstance, Assign]]:
    """Yield (candidate instance, the sweep point it came from) for one spec entry.

    `key_paths` maps a top-level key to where it was written when it came from a `defaults:` section."""
    ctx = _Ctx(doc)
    if not isinstance(entry, dict):
        raise ctx.err(path, "a kernel spec must be a mapping of keys", value=entry,
                      fix="see configs/gemm/*.yaml for examples")
    family = entry.get("family", "gemm")
    if family != "gemm":
        raise ctx.err((key_paths or {}).get("family", path + ("family",)), f"unknown kernel family '{family}'", value=family, allowed=["gemm"])
    points.check_required(ctx, path, entry, REQUIRED, SPEC_KEYS, META_KEYS, spec_name="a gemm spec",
                          key_paths=key_paths)
    axes = _axes(ctx, path, entry, key_paths)
    excl_path = (key_paths or {}).get("exclude", path + ("exclude",))
    exclusions = _exclusions(ctx, excl_path, entry.get("exclude"))
    for point in points.expand_checked(ctx, path, axes, exclusions, excl_path):
        yield _build(point), point
