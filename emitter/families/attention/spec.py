"""Attention spec (`family: attention`) -> candidate AttentionInstance records.

    kernels:
      - family: attention
        arch: sm80                       # sm80 | sm90a
        dtype: [f16, bf16]               # f16, bf16; e4m3 on sm90a
        head_dim: [64, 128]              # 32, 64, 96, 128, 256 (as the arch allows)
        head_dim_v: 64                   # optional: V/O head dim where it differs from head_dim
        tile: [64x64, [128, 64]]         # BlockQ x BlockKV ("64x64" or [64, 64]); a list of tiles sweeps
        schedule: auto                   # auto | multistage (sm80) | tma, cooperative, pingpong (sm90a)
        persistent: false                # sm90a persistent tile scheduler
        stages: auto                     # K/V pipeline stages
        mask: [none, causal_bottom_right]  # none | causal_top_left | causal_bottom_right (aliases: causal = top-left)
        key_tail: true                   # mask keys past seq_k inside the last KV tile
        layout: bshd                     # bshd | bhsd (packed strides when a problem gives none)
        lse: [false, true]
        gqa: true                        # heads_kv may divide heads_q (MQA included)
        varlen: false                    # cu_seqlens
        warp_groups: 3                   # sm90a consumer warp groups (2, 3, 4; default 2), tile_q = 64 x this
        exclude:
          - {dtype: bf16, head_dim: 256}

Every value may be a list: the entry sweeps the cartesian product; `exclude:` drops combinations written with
the same keys. Values are parsed into enums and ints here; anything else is a SpecError naming the file, line,
key path, value, the allowed values and a fix (emitter.spec.loader.Document.error). Rules that depend on the
combination (head dims an arch allows, tiles, shared memory) are the arch module's (resolve -> Rejection).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from emitter.dtypes import DTYPE_ALIASES, DType
from emitter.errors import SpecError
from emitter.families.attention.model import (
    AUTO, HEAD_DIMS, Arch, AttentionInstance, Layout, Mask, Schedule,
)
from emitter.spec import numbers, points, values
from emitter.spec.loader import Document, KeyPath
from emitter.spec.points import Assign
Parser = Callable[[Document, KeyPath, Any], Any]

TILE_SIZES = (16, 32, 64, 96, 128, 160, 176, 192, 224, 256)   # the spec's vocabulary; arch modules narrow it
DTYPES = (DType.f16, DType.bf16, DType.e4m3)
WARP_GROUPS = (2, 3, 4)      # sm90a FmhaKernelTmaWarpSpecialized: Consumer0..Consumer3; one leaves it 488 registers


def _enum(enum: type, aliases: dict[str, str] | None = None) -> Parser:
    return values.enum_parser(enum, aliases, fix_on_type=True)


def _dtype(doc: Document, path: KeyPath, v: Any) -> DType:
    names = [d.yaml for d in DTYPES]
    if not isinstance(v, str):
        raise doc.error(path, "a data type name is expected", value=v, allowed=names)
    text = DTYPE_ALIASES.get(v.strip().lower(), v.strip().lower())
    for d in DTYPES:
        if d.yaml == text:
            return d
    raise doc.error(path, f"data type '{v}' is not an attention data type", value=v, allowed=names,
                    fix="attention Q/K/V/O are f16 or bf16 (e4m3 on sm90a); accumulation and LSE are always f32")


def _int_choice(choices: tuple[int, ...], *, auto: bool = False, what: str = "value") -> Parser:
    return numbers.integer(min(choices), max(choices), auto=auto, choices=choices, what=what)


def _int_range(lo: int, hi: int, *, auto: bool = False, what: str = "value") -> Parser:
    return numbers.integer(lo, hi, auto=auto, what=what)


_bool = values.boolean


_tile = numbers.shape(("BlockQ", "BlockKV"), lo=min(TILE_SIZES), hi=max(TILE_SIZES), sizes=TILE_SIZES,
                      noun="tile", example="64x64",
                      range_fix="use tile dimensions from the allowed list, e.g. 64x64 or 128x128")
# two numbers (one possibly wrong, e.g. 64.5) are one tile, so the wrong one is blamed; a sweep lists tiles
_is_single_tile = numbers.is_single_shape


_arch = _enum(Arch, {"sm_80": "sm80", "sm_90a": "sm90a", "sm90": "sm90a", "sm_90": "sm90a"})
_schedule = _enum(Schedule, {"coop": "cooperative", "ping_pong": "pingpong", "tma_warpspecialized": "cooperative"})
_mask = _enum(Mask, {"causal": "causal_top_left", "top_left": "causal_top_left",
                     "bottom_right": "causal_bottom_right", "causal_tl": "causal_top_left",
                     "causal_br": "causal_bottom_right", "no": "none", "off": "none"})
_layout = _enum(Layout, {"thd": "bshd", "bsnd": "bshd", "bnsd": "bhsd"})


def _leaf(canon: str, parser: Parser, *, tile: bool = False):
    return points.leaf(canon, parser, single=_is_single_tile if tile else None)


SPEC_KEYS: dict[str, Callable[[Document, KeyPath, Any], list[Assign]]] = {
    "arch": _leaf("arch", _arch),
    "dtype": _leaf("dtype", _dtype),
    "head_dim": _leaf("head_dim", _int_choice(HEAD_DIMS, what="head dim")),
    "head_dim_v": _leaf("head_dim_v", _int_choice(HEAD_DIMS, what="V head dim")),
    "tile": _leaf("tile", _tile, tile=True),
    "schedule": _leaf("schedule", _schedule),
    "persistent": _leaf("persistent", _bool),
    "stages": _leaf("stages", _int_range(1, 8, auto=True, what="stage count")),
    "mask": _leaf("mask", _mask),
    "key_tail": _leaf("key_tail", _bool),
    "layout": _leaf("layout", _layout),
    "lse": _leaf("lse", _bool),
    "gqa": _leaf("gqa", _bool),
    "varlen": _leaf("varlen", _bool),
    "warp_groups": _leaf("warp_groups", _int_choice(WARP_GROUPS, what="consumer warp group count")),
}
META_KEYS = {"family", "name", "description", "exclude"}
REQUIRED = ("arch", "dtype", "head_dim", "tile")


def _axes(doc: Document, path: KeyPath, entry: dict[str, Any],
          key_paths: dict[str, KeyPath] | None = None, what: str = "this spec") -> list[list[Assign]]:
    return points.axes(doc, path, entry, SPEC_KEYS, META_KEYS, spec_name="an attention spec",
                       key_paths=key_paths, what=what)


def _exclusions(doc: Document, path: KeyPath, value: Any) -> list[points.Exclusion]:
    return points.exclude_entries(doc, path, value, SPEC_KEYS, META_KEYS, spec_name="an attention spec",
                                  what="an exclude entry", example="exclude: [{dtype: bf16, head_dim: 256}]")


def build(point: Assign) -> AttentionInstance:
    """A candidate from one sweep point (defaults for the keys the spec left out)."""
    tq, tkv = point["tile"]
    return AttentionInstance(
        arch=point["arch"], dtype=point["dtype"],
        head_dim=point["head_dim"], head_dim_v=point.get("head_dim_v", point["head_dim"]),
        tile_q=tq, tile_kv=tkv,
        schedule=point.get("schedule", Schedule.auto),
        persistent=point.get("persistent", False),
        stages=point.get("stages", AUTO),
        mask=point.get("mask", Mask.none),
        key_tail=point.get("key_tail", True),
        layout=point.get("layout", Layout.bshd),
        lse=point.get("lse", False),
        gqa=point.get("gqa", False),
        varlen=point.get("varlen", False),
        warp_groups=point.get("warp_groups", 2),
    )


def expand_entry(doc: Document, path: KeyPath, entry: Any,
                 key_paths: dict[str, KeyPath] | None = None) -> Iterator[tuple[AttentionInstance, Assign]]:
    """Yield (candidate instance, the sweep point it came from) for one `family: attention` spec entry."""
    if not isinstance(entry, dict):
        raise doc.error(path, "a kernel spec must be a mapping of keys", value=entry,
                        fix="see configs/attention/*.yaml for examples")
    family = entry.get("family")
    if family != "attention":
        raise doc.error((key_paths or {}).get("family", path + ("family",)),
                        f"an attention spec entry must say `family: attention`, got {family!r}", value=family,
                        allowed=["attention"])
    if "op" in entry:   # the family's expand_entry (emitter/families/attention/__init__.py) sends these on
        raise doc.error((key_paths or {}).get("op", path + ("op",)),
                        "an entry with an `op` axis is expanded by the attention family's expand_entry "
                        "(backward_spec.expand_op_entry), not by spec.expand_entry", value=entry["op"],
                        fix="call emitter.families.attention.expand_entry")
    points.check_required(doc, path, entry, REQUIRED, SPEC_KEYS, META_KEYS, spec_name="an attention spec",
                          key_paths=key_paths)
    axes = _axes(doc, path, entry, key_paths)
    excl_path = (key_paths or {}).get("exclude", path + ("exclude",))
    exclusions = _exclusions(doc, excl_path, entry.get("exclude"))
    # the same guards as every family: bounded matching work, no silent empty result
    for point in points.expand_checked(doc, path, axes, exclusions, excl_path):
        yield build(point), point


__all__ = ["SPEC_KEYS", "META_KEYS", "REQUIRED", "TILE_SIZES", "expand_entry", "build", "SpecError"]
