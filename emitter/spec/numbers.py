"""Integers and shapes in specs: the one parser every family uses, with the range check.

A number reaches a parser as a YAML integer (the loader caps those at MAX_INT_DIGITS digits), as digits inside
a string (`tile: "128x64"`) or as a Python int handed to the API (no cap at all). Python refuses to convert
more than 4,300 digits between text and int, so a parser that calls int() on a match, or formats a huge int
into a message, ends in a ValueError instead of a SpecError: the digit count is checked before either.

    from emitter.spec import numbers
    stages = numbers.integer(2, 16, auto=True)                       # parser(src, path, value) -> int
    tile = numbers.shape("MNK", lo=1, hi=4096, noun="shape", example="128x256x64")
    SPEC_KEYS = {"tile": points.leaf("tile", tile, single=numbers.is_single_shape), ...}

`src` raises the errors (a loader Document, or a family's context object with the same `error` method), as for
every parser in emitter.spec.points and emitter.spec.values.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from emitter.spec.loader import MAX_INT_DIGITS, KeyPath

AUTO = 0                      # every family's model spells `auto` (a stage count, an alignment) as 0
Parser = Callable[[Any, KeyPath, Any], Any]


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def digits(v: int) -> int:
    """The number of decimal digits of |v|, without converting it to text (which fails past 4,300 digits)."""
    n = abs(v)
    if n < 10 ** 18:
        return len(str(n))
    guess = int(n.bit_length() * 0.30102999566398120)   # log10(2); off by at most one
    return guess + 1 if n >= 10 ** guess else guess


def shown(v: Any) -> Any:
    """A value fit for a message: an integer of more than MAX_INT_DIGITS digits is described, not printed."""
    if is_int(v) and digits(v) > MAX_INT_DIGITS:
        return f"an integer of {digits(v):,} digits"
    if isinstance(v, list):
        return [shown(x) for x in v]
    if isinstance(v, str) and len(v) > 80:
        return v[:40] + f"... ({len(v):,} characters)"
    return v


def integer(lo: int, hi: int, *, auto: bool = False, choices: Sequence[int] | None = None,
            what: str = "") -> Parser:
    """A parser for an integer lo..hi (one of `choices` when given; `auto` also takes the word auto -> AUTO).

    `what` names the value in messages ("head dim 48 is not allowed"); without it: "48 is not allowed here"."""
    choice_list = list(choices) if choices else None
    allowed: Any = (choice_list + (["auto"] if auto else [])) if choice_list else \
        f"an integer {lo}..{hi}" + (" or auto" if auto else "")

    def parse(src: Any, path: KeyPath, v: Any) -> int:
        if auto and isinstance(v, str) and v.strip().lower() == "auto":
            return AUTO
        if not is_int(v):
            raise src.error(path, f"an integer {what + ' ' if what else ''}is expected", value=shown(v), allowed=allowed)
        if digits(v) > MAX_INT_DIGITS:
            raise src.error(path, f"integer of {digits(v):,} digits is out of range", value=shown(v), allowed=allowed,
                            fix="use a value in the range the key allows")
        label = f"{what} {v}" if what else f"{v}"
        if choice_list and v not in choice_list:
            raise src.error(path, f"{label} is not allowed{'' if what else ' here'}", value=v, allowed=allowed,
                            fix=f"use one of: {', '.join(map(str, allowed))}")
        if not lo <= v <= hi:
            raise src.error(path, f"{label} is out of range", value=v, allowed=allowed)
        return v
    return parse


def _dims_re(n: int) -> re.Pattern[str]:
    # ASCII digits only: \d would take other scripts' digits, which int() reads as numbers
    return re.compile(r"^\s*([0-9]+)" + r"\s*[xX,]\s*([0-9]+)" * (n - 1) + r"\s*$")


_SHAPE_TEXT = re.compile(r"^\s*[0-9]+\s*[xX,]")


def is_single_shape(v: Any) -> bool:
    """Whether a value is one shape (some of its dimensions possibly wrong: 32.5, "64", three where two belong)
    rather than a list of shapes: a list holding a number and no element that is a shape itself (a list, or text
    such as "64x64"). A sweep lists shapes; a list of plain numbers is one shape, so the parser blames the
    element (or the count) that is wrong instead of the sweep's first item."""
    return (isinstance(v, list) and any(isinstance(d, (int, float)) and not isinstance(d, bool) for d in v)
            and not any(isinstance(d, (list, dict)) or (isinstance(d, str) and _SHAPE_TEXT.match(d)) for d in v))


def shape(names: Sequence[str], *, lo: int = 1, hi: int = 4096, sizes: Sequence[int] | None = None,
          noun: str = "shape", example: str, range_message: str | None = None,
          range_fix: str | None = None) -> Parser:
    """A parser for a shape of len(names) dimensions, written "128x64x32" (also "128,64,32") or [128, 64, 32].

    Each dimension is an integer lo..hi, one of `sizes` when given. An element that is not a whole number is
    blamed at its own index (`tile[1]`); a dimension out of range at the shape, naming the dimension.
    `example` is one shape written with x ("128x256x64"); `range_message` replaces the out-of-range message."""
    n = len(names)
    pattern = _dims_re(n)
    written = " x ".join(names)
    as_list = "[" + ", ".join(example.split("x")) + "]"
    forms = f"'{example}' or {as_list} (a list of {noun}s sweeps)"
    allowed_dims: Any = list(sizes) if sizes else f"integers {lo}..{hi}"
    dims_text = f"one of {', '.join(map(str, sizes))}" if sizes else allowed_dims

    def parse(src: Any, path: KeyPath, v: Any) -> tuple[int, ...]:
        dims: list[Any] | None = None
        if isinstance(v, str):
            m = pattern.match(v)
            if m:
                for i, text in enumerate(m.groups()):
                    if len(text) > MAX_INT_DIGITS:   # int() refuses past 4,300 characters
                        raise src.error(path, f"{noun} dimension {names[i]} of {len(text):,} digits is out of range",
                                        value=shown(v), allowed=allowed_dims,
                                        fix=range_fix or f"use {noun} dimensions such as {example}")
                dims = [int(text) for text in m.groups()]
        elif isinstance(v, list) and len(v) == n:
            for i, d in enumerate(v):   # blame the element that is wrong, not the shape
                if not is_int(d):
                    raise src.error(path + (i,), f"{noun} dimension {names[i]} must be a whole number", value=shown(d),
                                    allowed=f"{dims_text}, e.g. {as_list}", fix=f"write {names[i]} as an integer")
            dims = list(v)
        if dims is None:
            raise src.error(path, f"a {noun} {written} is expected", value=shown(v), allowed=forms,
                            fix=f"give all {n} dimensions, {written} (e.g. {example})")
        for i, d in enumerate(dims):
            if digits(d) > MAX_INT_DIGITS:
                raise src.error(path, f"{noun} dimension {names[i]} of {digits(d):,} digits is out of range",
                                value=shown(v), allowed=allowed_dims,
                                fix=range_fix or f"use {noun} dimensions such as {example}")
            if sizes is not None and d not in sizes:
                raise src.error(path, range_message or f"{noun} dimension {d} is not allowed", value=shown(v),
                                allowed=allowed_dims, fix=range_fix or f"use {noun} dimensions from the allowed list")
            if not lo <= d <= hi:
                raise src.error(path, range_message or f"{noun} dimension {names[i]} = {d} is out of range",
                                value=shown(v), allowed=allowed_dims, fix=range_fix)
        return tuple(dims)
    return parse


def name_token(v: float) -> str:
    """A float in an instance name (a clamp bound), unique per value: `%g` where it reads back as exactly `v` (the
    names emitted so far), else the shortest text that does (repr), so bounds differing past the 6th digit get
    distinct names. The replacements are one-to-one on these texts ('-' and '.' never occur otherwise; '+' only
    after 'e')."""
    text = f"{v:g}"
    if float(text) != v:
        text = repr(float(v))
    return text.replace("-", "m").replace(".", "p").replace("+", "")
