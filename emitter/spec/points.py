"""Sweep points: the family-agnostic half of a family's spec parser (beside sweep.py, which caps the product).

A family's `expand_entry` turns one spec entry into sweep axes (one list of partial assignments per key),
parses `exclude:` into partial assignments written with the same keys, and yields every merged point of the
cartesian product that no exclude entry matches. Only the vocabulary (which keys, which value parsers, the
defaults of `build`) is the family's; the steps are the same for every family and live here:

    from emitter.spec import points
    SPEC_KEYS = {"arch": points.leaf("arch", _arch), "tile": points.leaf("tile", _tile, single=_is_one_tile), ...}
    points.check_required(doc, path, entry, REQUIRED, SPEC_KEYS, META_KEYS, spec_name="an attention spec")
    axes = points.axes(doc, path, entry, SPEC_KEYS, META_KEYS, spec_name="an attention spec", key_paths=key_paths)
    excl = points.exclude_entries(doc, excl_path, entry.get("exclude"), SPEC_KEYS, META_KEYS,
                                  spec_name="an attention spec", what="an exclude entry",
                                  example="exclude: [{dtype: bf16, head_dim: 256}]")
    for point in points.expand_checked(doc, path, axes, excl, excl_path):
        yield build(point), point

`expand_checked` refuses matching work past EXCLUDE_WORK before it starts, warns about an exclude entry that names
a key the spec never sets (it can match nothing), and raises a SpecError when the exclude list leaves nothing:
a spec entry never expands to zero candidates without a word.

`src` below is what raises the errors: a loader Document, or a family's own context object with the same
`error(path, message, value=..., allowed=..., fix=...) -> SpecError` method. Value parsers (and key groups) are
called as parser(src, path, value).
"""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from emitter.spec import notices
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


def check_required(src: Any, path: KeyPath, entry: dict[str, Any], required: Sequence[str],
                   spec_keys: dict[str, Any], meta_keys: set[str], *, spec_name: str,
                   key_paths: dict[str, KeyPath] | None = None, alternatives: dict[str, Sequence[str]] | None = None,
                   see: str | None = None) -> None:
    """A SpecError for the first required key `entry` lacks (`alternatives`: other keys that stand for it, an
    alias; `see`: where examples are). A misspelling of it (`head_dims:` for `head_dim:`) is named as such, at its own line, with the
    did-you-mean of the unknown-key check, instead of a bare "missing required key"."""
    known = set(spec_keys) | meta_keys
    for key in required:
        if key in entry or any(alt in entry for alt in (alternatives or {}).get(key, ())):
            continue
        for written in entry:
            if written not in known and difflib.get_close_matches(written, [key], n=1):
                kp = (key_paths or {}).get(written, path + (written,))
                raise src.error(kp, f"unknown key '{written}' in {spec_name} (the required key '{key}' is missing)",
                                value=written, allowed=sorted(known), fix=f"did you mean '{key}'?")
        raise src.error(path, f"missing required key '{key}' in {spec_name}", allowed=list(required),
                        fix=f"add `{key}:` to this spec" + (f" ({see})" if see else ""))


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


@dataclass(frozen=True)
class Exclusion:
    """One point of an exclude entry: the partial assignment it drops and where it was written; `sets` holds, per
    spec key it gives, (spec key, value as written, its key path, the canonical keys it sets) — `dtype: f16` sets
    a, b, c and d, which is what a warning about keys the spec never sets has to explain."""

    point: Assign
    path: KeyPath
    sets: tuple[tuple[str, Any, KeyPath, tuple[str, ...]], ...]


def exclude_entries(src: Any, path: KeyPath, value: Any, spec_keys: dict[str, Group], meta_keys: set[str], *,
                    spec_name: str, what: str, example: str) -> list[Exclusion]:
    """The `exclude:` list as partial assignments (an entry that sweeps stands for each of its points).

    Each entry is parsed with the spec's own keys (`what` names it in the sweep cap's message: "this exclude
    entry"); `example` is the fix line's example. The running number of exclude points is capped like a sweep.
    An entry that would drop every combination because it names no spec value (only `name:` / `description:`,
    or an empty mapping such as `dtype: {}`) is an error, as is an `exclude:` inside an entry."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise src.error(path, "exclude must be a list of partial configurations", value=value,
                        fix=f"e.g. {example}")
    out: list[Exclusion] = []
    for i, item in enumerate(value):
        ipath = path + (i,)
        if not isinstance(item, dict) or not item:
            raise src.error(ipath, "each exclude entry must be a non-empty mapping of spec keys", value=item)
        if "exclude" in item:
            raise src.error(ipath + ("exclude",), "an exclude entry cannot hold an `exclude:` of its own",
                            value=item["exclude"], fix=f"list every entry directly under the spec's exclude, e.g. {example}")
        written = [k for k in item if k not in meta_keys]
        if not written:
            labels = ", ".join(f"`{k}`" for k in item)
            raise src.error(ipath, f"this exclude entry holds only {labels} ({'a label' if len(item) == 1 else 'labels'}"
                                   f", not spec values to match): it would drop every combination", value=item,
                            allowed=sorted(spec_keys), fix=f"name the spec values to drop, e.g. {example}")
        entry_axes = axes(src, ipath, item, spec_keys, meta_keys, spec_name=spec_name, what=what)
        sets = tuple((k, item[k], ipath + (k,), tuple(dict.fromkeys(c for a in ax for c in a)))
                     for k, ax in zip(written, entry_axes))
        for combo in itertools.product(*entry_axes):
            point = merge(combo)
            if not point:        # e.g. `dtype: {}`: a partial assignment of nothing matches everything
                raise src.error(ipath, "this exclude entry names no value to match, so it would drop every "
                                       "combination", value=item, fix=f"name the spec values to drop, e.g. {example}")
            out.append(Exclusion(point, ipath, sets))
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


def _warn_unset(src: Any, axes: Sequence[Sequence[Assign]], excl: Sequence[Exclusion]) -> None:
    """A warning for each exclude key naming a canonical key no point of the spec has: it can match nothing
    (matching compares what the spec writes, not the defaults the instance builder fills in)."""
    spec_sets = {k for a in axes for p in a for k in p}
    seen: set[KeyPath] = set()
    for e in excl:
        for key, value, kp, canon in e.sets:
            unset = [c for c in canon if c not in spec_sets]
            if not unset or kp in seen:
                continue
            seen.add(kp)
            if len(unset) < len(canon):       # a shorthand that stands for keys the spec sets only some of
                notices.warn(src, kp, f"this exclude entry matches nothing: `{key}` here stands for "
                                      f"{', '.join(canon)}, but the spec sets only "
                                      f"{', '.join(c for c in canon if c not in unset)} (not {', '.join(unset)})",
                             value=value, fix=f"give `{key}` as a mapping of only what the spec sets (as the spec's "
                                              f"own `{key}:` does), or set {', '.join(unset)} in the spec")
            else:
                names = f"`{key}`" if list(canon) == [key] else f"`{key}` (which sets {', '.join(canon)})"
                notices.warn(src, kp, f"this exclude entry matches nothing: it names {names}, which the spec never "
                                      f"sets (an exclude matches the values the spec gives, not defaults)",
                             value=value, fix=f"set `{key}` in the spec, or remove it from this exclude entry")


def expand_checked(src: Any, path: KeyPath, axes: Sequence[Sequence[Assign]], excl: Sequence[Exclusion],
                   excl_path: KeyPath) -> Iterator[Assign]:
    """`expand` with the guards every family's spec needs: the matching work is capped before anything is
    matched, exclude keys the spec never sets are warned about, and an exclude list that drops every
    combination is a SpecError at `excl_path` naming the entries that did (a spec entry never yields nothing
    without a word)."""
    check_exclude_work(src, excl_path, axes, excl)
    if excl:
        _warn_unset(src, axes, excl)
    hits = [0] * len(excl)
    total = kept = 0
    for combo in itertools.product(*axes):
        point = merge(combo)
        total += 1
        for j, e in enumerate(excl):
            if matches(point, e.point):
                hits[j] += 1
                break
        else:
            kept += 1
            yield point
    if not kept:
        dropping = {e.path: {k: v for k, v, _, _ in e.sets} for j, e in enumerate(excl) if hits[j]}
        what = "the one combination this spec gives" if total == 1 else \
            f"every one of the {total:,} combinations this spec sweeps"
        if len(dropping) == 1:
            [(where, item)] = dropping.items()
            raise src.error(where, f"this exclude entry drops {what}: nothing would be emitted", value=item,
                            fix="remove or narrow the entry (it drops every combination that has all of its values), "
                                "or widen the sweep")
        raise src.error(excl_path, f"the exclude list drops {what} (entries {', '.join(map(format_path, dropping))} "
                                   f"between them): nothing would be emitted", value=total,
                        fix="remove or narrow those entries (each drops every combination that has all of its "
                            "values), or widen the sweep")
