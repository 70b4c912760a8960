"""GEMM spec -> candidate GemmInstance records.

Every field may be a list: the spec sweeps the cartesian product. `exclude:` drops combinations,
written with the same keys as the spec. Values are parsed into enums and ints here; anything not
in the vocabulary is a SpecError naming the file, line, key path, value and the allowed values.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator

from emitter.dtypes import DType
from emitter.families.gemm.model import (
    AUTO, Activation, Arch, Bias, Epilogue, EpilogueSchedule, GemmInstance, KernelSchedule, Layout,
    OpClass, Promotion, Raster, Reduction, Shape3, SplitK, TileScheduler,
)
from emitter.spec import points, values
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
from emitter.spec.points import Assign  # canonical key -> parsed value (one point of one sweep axis)


# ---------------------------------------------------------------- scalar parsers (value -> enum/int)

def _enum(enum: type, aliases: dict[str, str] | None = None) -> Callable[[_Ctx, KeyPath, Any], Any]:
    return values.enum_parser(enum, aliases)


_layout = _enum(Layout, {"rowmajor": "row", "row_major": "row", "r": "row", "t": "row",
                         "colmajor": "col", "column": "col", "col_major": "col", "column_major": "col",
                         "c": "col", "n": "col"})
_op_class = _enum(OpClass, {"tensor_op": "tensorop", "tensor": "tensorop", "wgmma": "tensorop"})
_kernel_schedule = _enum(KernelSchedule, {"coop": "cooperative", "ping_pong": "pingpong"})
_epilogue_schedule = _enum(EpilogueSchedule, {"nosmem": "no_smem"})
_tile_scheduler = _enum(TileScheduler, {"streamk": "stream_k", "stream-k": "stream_k"})
_bias = _enum(Bias, {"per_row": "row", "per_column": "column", "col": "column", "per_col": "column"})
_raster = _enum(Raster, {"auto": "heuristic", "m": "along_m", "n": "along_n", "alongm": "along_m",
                         "alongn": "along_n"})
_promotion = _enum(Promotion, {"overlapped": "overlap", "default": "serial"})
_reduction = _enum(Reduction, {"nondet": "nondeterministic", "non_deterministic": "nondeterministic",
                               "det": "deterministic"})


_bool = values.boolean


# ---------------------------------------------------------------- spec keys -> canonical keys

def _leaf(canon: str, parser: Callable[[_Ctx, KeyPath, Any], Any], *, shape: bool = False):
    """A key with one canonical target; a list sweeps (for shapes, a list of shapes)."""
    return points.leaf(canon, parser, single=_is_single_shape if shape else None)


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
