"""Value parsers the kernel families' spec parsers share (GEMM's and conv's: one vocabulary for every family):
the parsing context, data types, target arches, activations, split-K modes, integers in a range, (m, n, k) shapes,
clamp bounds that must fit a C++ float, and sub-key groups (`dtype: {a: .., c: ..}`) with a scalar shorthand.
Each raises a SpecError naming the file, line, key path, value, what is allowed and how to fix it."""

from __future__ import annotations

import itertools
from typing import Any, Callable

from emitter.dtypes import DTYPE_ALIASES, DType
from emitter.errors import SpecError
from emitter.kit.enums import Activation, Arch, Shape3, SplitK
from emitter.spec import numbers, points, values
from emitter.spec.loader import Document, KeyPath, format_path
from emitter.spec.points import Assign
from emitter.spec.sweep import check_sweep


class Ctx:
    def __init__(self, doc: Document):
        self.doc = doc

    def err(self, path: KeyPath, msg: str, **kw: Any) -> SpecError:
        return self.doc.error(path, msg, **kw)

    error = err   # the name emitter.spec.points (and check_sweep) raise through


def dtype(ctx: Ctx, path: KeyPath, v: Any) -> DType:
    if not isinstance(v, str):
        raise ctx.err(path, "a data type name is expected", value=v, allowed=DType.names())
    text = DTYPE_ALIASES.get(v.strip().lower(), v.strip().lower())
    try:
        return DType.parse(text)
    except KeyError:
        raise ctx.err(path, f"unknown data type '{v}'", value=v, allowed=DType.names(),
                      fix="use one of the allowed names (aliases like fp16, bfloat16, int8 also work)") from None


arch = values.enum_parser(Arch, {"sm_80": "sm80", "sm_90a": "sm90a", "sm90": "sm90a", "sm_90": "sm90a",
                                 "sm_75": "sm75", "sm_86": "sm86", "sm_89": "sm89"})
activation = values.enum_parser(Activation, {"none": "identity", "linear": "identity", "swish": "silu"})
split_k = values.enum_parser(SplitK, {"no": "none", "off": "none"})
integer = numbers.integer      # integer(lo, hi, auto=False, choices=None) -> a value parser


FLT_MAX = 3.4028234663852886e38   # the epilogue's bounds are C++ float literals: they must fit a float


def finite_float(ctx: Ctx, path: KeyPath, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        raise ctx.err(path, "a finite number is expected", value=v, allowed=f"a number from -{FLT_MAX:.7g} to {FLT_MAX:.7g}")
    if abs(v) > FLT_MAX:
        shown = v if isinstance(v, float) else f"an integer of {len(str(abs(v))) if abs(v) < 10 ** 400 else 'over 400'} digits"
        raise ctx.err(path, "out of the range of a C++ float (the kernel's epilogue holds it as float)", value=shown,
                      allowed=f"a number from -{FLT_MAX:.7g} to {FLT_MAX:.7g}", fix="use a smaller bound")
    return float(v)


def as_f32(v: float) -> float:
    import struct
    return struct.unpack("f", struct.pack("f", v))[0]


_shape3 = numbers.shape("MNK", lo=1, hi=4096, example="128x256x64",
                        range_message="shape dimensions must be positive and at most 4096",
                        range_fix="use a CUTLASS tile size such as 64, 128 or 256")
# three numbers (any of them possibly wrong, e.g. 32.5) are one shape; a sweep lists shapes (strings or lists)
is_single_shape = numbers.is_single_shape


def shape(ctx: Ctx, path: KeyPath, v: Any) -> Shape3:
    return Shape3(*_shape3(ctx, path, v))


def mapping(subkeys: dict[str, Callable], shorthand: Callable[[Ctx, KeyPath, Any], list[Assign]] | None,
             what: str, required: tuple[str, ...] = (), example: str = ""):
    """A key whose value is a mapping of sub-keys (each may sweep) or a shorthand scalar; `required` sub-keys
    must be in the mapping form."""
    def group(ctx: Ctx, path: KeyPath, v: Any) -> list[Assign]:
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
                                  fix=points.did_you_mean(k, subkeys))
            missing = [k for k in required if k not in v]
            if missing:
                raise ctx.err(path, f"{what} mapping needs '{missing[0]}'", value=v, allowed=sorted(subkeys),
                              fix=f"add `{missing[0]}:` ({example})" if example else f"add `{missing[0]}:`")
            axes = [subkeys[k](ctx, path + (k,), sub) for k, sub in v.items()]
            check_sweep(ctx.doc, path, [(format_path(path + (k,)), len(a)) for k, a in zip(v, axes)],
                        what=f"{what}")
            return [points.merge(combo) for combo in itertools.product(*axes)] if axes else [{}]
        if shorthand is None:
            raise ctx.err(path, f"{what} must be a mapping", value=v, allowed=sorted(subkeys))
        return shorthand(ctx, path, v)
    return group


def clamp(ctx: Ctx, path: KeyPath, v: Any) -> list[Assign]:
    if isinstance(v, list) and len(v) == 2:
        lo, hi = finite_float(ctx, path + (0,), v[0]), finite_float(ctx, path + (1,), v[1])
    elif isinstance(v, dict) and set(v) <= {"min", "max"}:
        lo = finite_float(ctx, path + ("min",), v.get("min", 0.0))
        hi = finite_float(ctx, path + ("max",), v.get("max", 6.0))
    else:
        raise ctx.err(path, "clamp bounds must be [min, max] or {min: .., max: ..}", value=v)
    if lo >= hi:
        raise ctx.err(path, f"clamp min {lo} must be below max {hi}", value=v)
    if as_f32(lo) >= as_f32(hi):
        raise ctx.err(path, f"clamp bounds {lo!r} and {hi!r} are the same number as C++ floats "
                            f"({as_f32(lo)!r}): the clamp would be a constant", value=v,
                      fix="make the bounds differ within float precision (about 7 significant digits)")
    return [{"clamp_min": lo, "clamp_max": hi}]
