"""Sweep points: the family-agnostic half of a family's spec parser (beside sweep.py, which caps the product).

A family's `expand_entry` turns one spec entry into sweep axes (one list of partial assignments per key),
parses `exclude:` into partial assignments written with the same keys, and yields every merged point of the
cartesian product that no exclude entry matches. Only the vocabulary (which keys, which value parsers, the
defaults of `build`) is the family's; the steps are the same for every family and live here:

    from emitter.spec import points
    SPEC_KEYS = {"arch": points.leaf("arch", _arch), "tile": points.leaf("tile", _tile, single=_is_one_tile), ...}
    axes = points.axes(doc, path, entry, SPEC_KEYS, META_KEYS, spec_name="an attention spec", key_paths=key_paths)
    excl = points.exclusions(doc, excl_path, entry.get("exclude"),
                             lambda p, item: points.axes(doc, p, item, SPEC_KEYS, META_KEYS, ...,
                                                         what="an exclude entry"),
                             example="exclude: [{dtype: bf16, head_dim: 256}]")
    for point in points.expand(axes, excl):
        yield build(point), point

`src` below is what raises the errors: a loader Document, or a family's own context object with the same
`error(path, message, value=..., allowed=..., fix=...) -> SpecError` method. Value parsers (and key groups) are
called as parser(src, path, value).
"""

from __future__ import annotations

import difflib
import itertools
from typing import Any, Callable, Iterable, Iterator, Sequence

from emitter.spec.loader import KeyPath, format_path
from emitter.spec.sweep import check_sweep

Assign = dict[str, Any]   # canonical key -> parsed value (one point of one sweep axis, or a merged point)
Group = Callable[[Any, KeyPath, Any], list[Assign]]   # a spec key's value -> its sweep axis

MISSING = object()
EXCLUDE_WORK = 5_000_000   # combinations x exclude entries: about 5 s of matching at most


def merge(parts: Iterable[Assign]) -> Assign:
    """One point from one partial assignment per axis (a later axis wins a shared key)."""
    out: Assign = {}
    for p in parts:
        out.update(p)
    return out


def matches(point: Assign, excl: Assign) -> bool:
    """Whether an exclude entry (a partial assignment) drops this point: every key it names has its value."""
    return all(point.get(k, MISSING) == v for k, v in excl.items())


def did_you_mean(key: str, options: Any) -> str:
    """The fix line for an unknown key: the closest known one, or a plain hint."""
    close = difflib.get_close_matches(key, list(options), n=1)
    return f"did you mean '{close[0]}'?" if close else "remove it or check the spelling"


def leaf(canon: str, parser: Callable[[Any, KeyPath, Any], Any], *,
         single: Callable[[Any], bool] | None = None) -> Group:
    """A key with one canonical target; a list sweeps.

    `single`: for values that are themselves lists (a shape [128, 64, 32]), tells one value from a list of
    values; with it, the items of a sweep may be lists too."""
    def group(src: Any, path: KeyPath, v: Any) -> list[Assign]:
        if isinstance(v, list) and not (single is not None and single(v)):
            if not v:
                raise src.error(path, "an empty list sweeps nothing", value=v, fix="give at least one value")
            out: list[Assign] = []
            for i, item in enumerate(v):
                if isinstance(item, list) and single is None:
                    raise src.error(path + (i,), "nested lists are not allowed here", value=item)
                out.append({canon: parser(src, path + (i,), item)})
            return out
        return [{canon: parser(src, path, v)}]
    return group


def axes(src: Any, path: KeyPath, entry: dict[str, Any], spec_keys: dict[str, Group], meta_keys: set[str], *,
         spec_name: str, key_paths: dict[str, KeyPath] | None = None, what: str = "this spec") -> list[list[Assign]]:
    """One sweep axis per spec key of `entry` (meta keys skipped), checked against the sweep cap before
    anything is expanded. An unknown key is an error naming `spec_name` ("a gemm spec")."""
    out = []
    names = []
    for key, value in entry.items():
        if key in meta_keys:
            continue
        kp = (key_paths or {}).get(key, path + (key,))
        if key not in spec_keys:
            known = set(spec_keys) | meta_keys
            raise src.error(kp, f"unknown key '{key}' in {spec_name}", value=key, allowed=sorted(known),
                            fix=did_you_mean(key, known))
        out.append(spec_keys[key](src, kp, value))
        names.append(format_path(kp))
    check_sweep(src, path, list(zip(names, map(len, out))), what=what)   # before anything is expanded
    return out


def exclusions(src: Any, path: KeyPath, value: Any, entry_axes: Callable[[KeyPath, dict[str, Any]], list[list[Assign]]],
               *, example: str) -> list[Assign]:
    """The `exclude:` list as partial assignments (an entry that sweeps stands for each of its points).

    `entry_axes(path, item)` parses one exclude entry into axes (the family's `axes`); `example` is the fix
    line's example. The running number of exclude points is capped like a sweep."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise src.error(path, "exclude must be a list of partial configurations", value=value,
                        fix=f"e.g. {example}")
    out: list[Assign] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not item:
            raise src.error(path + (i,), "each exclude entry must be a non-empty mapping of spec keys", value=item)
        for combo in itertools.product(*entry_axes(path + (i,), item)):
            out.append(merge(combo))
        check_sweep(src, path, [(format_path(path), len(out))], what="the exclude list")
    return out


def check_exclude_work(src: Any, path: KeyPath, axes: Sequence[Sequence[Assign]], excl: Sequence[Assign]) -> None:
    """A SpecError when matching every combination against every exclude entry is too much work."""
    combos = 1
    for a in axes:
        combos *= len(a)
    if combos * len(excl) > EXCLUDE_WORK:   # each combination is matched against each exclude entry
        raise src.error(path, f"{len(excl):,} exclude entries against {combos:,} combinations is too much "
                              f"matching ({combos * len(excl):,} comparisons)", value=len(excl),
                        allowed=f"combinations x exclude entries up to {EXCLUDE_WORK:,}",
                        fix="narrow the sweep or write fewer, broader exclude entries (an entry may leave keys out)")


def expand(axes: Sequence[Sequence[Assign]], excl: Sequence[Assign]) -> Iterator[Assign]:
    """Every merged point of the axes' cartesian product that no exclude entry matches, in spec order."""
    for combo in itertools.product(*axes):
        point = merge(combo)
        if any(matches(point, e) for e in excl):
            continue
        yield point
