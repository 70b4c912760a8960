"""--select / --exclude: which manifest instances a command works on (shared by build, verify, profile).

A pattern is one or more space-separated terms; all terms must match (AND):
  * a name term: a glob on the instance name (`*bf16*128x256*`); a word with no glob characters
    matches as a substring (`pingpong`);
  * an attribute term `key=value[,value...]`: one of the values must match (OR). Keys are the
    manifest's `config` keys (`a`, `tile`, `kernel_schedule`, `stages`, ...), `arch`, `family`, `name`,
    nested keys by dotted path or by their own name (`epilogue.activation=relu`, `activation=relu`), and
    the aliases `dtype` (any of a/b/c/d), `schedule` (kernel_schedule) and `layout` (`tn`, `tnt`).
    Values compare case-insensitively as text; shapes as `128x256x64`; values may be globs (`tile=128x*`).
--select given several times ORs its patterns; an instance is dropped if any --exclude pattern matches.

  --select 'arch=sm90a dtype=bf16'                     sm90a AND bf16
  --select 'tile=128x128x64,128x256x64'                either tile (a value list is an OR)
  --select pingpong --select 'schedule=cooperative tile=128x*'   pingpong, OR cooperative with a 128-row tile
  --select 'arch=sm90a' --exclude '*fp8*' --exclude 'split_k=serial'

This is the reverse of dbt's spelling, where a space is a union and a comma an intersection
(`dbt run --select "tag:a tag:b"` is a OR b; `tag:a,tag:b` is a AND b). Kept on purpose: a pattern here
is one slice of a kernel configuration space, narrowed facet by facet (`arch=sm90a dtype=bf16 tile=128x*`:
intersection is what one writes most), and the comma is taken by value lists inside a facet
(`tile=128x128x64,128x256x64`), where it can only mean "either". Union is spelled by repeating --select.
`emitter list OUT --select ...` previews what a pattern picks (README: Selecting instances).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import click

from emitter.errors import EmitterError

__all__ = ["SelectionError", "Pattern", "parse", "matches", "select", "selection_options", "attributes"]

_GLOB_CHARS = set("*?[")
_ALIASES = {"schedule": "kernel_schedule"}
_LAYOUT_LETTER = {"row": "t", "col": "n"}


class SelectionError(EmitterError):
    exit_code = 2


@dataclass(frozen=True)
class Term:
    key: str | None              # None: a name glob
    values: tuple[str, ...]      # lower-case; globs allowed

    def __str__(self) -> str:
        return self.values[0] if self.key is None else f"{self.key}={','.join(self.values)}"


@dataclass(frozen=True)
class Pattern:
    text: str
    terms: tuple[Term, ...]


def parse(text: str) -> Pattern:
    terms = []
    for word in text.split():
        if "=" in word:
            key, _, rhs = word.partition("=")
            values = tuple(v.strip().lower() for v in rhs.split(",") if v.strip())
            if not key or not values:
                raise SelectionError(f"selection pattern {text!r}: term {word!r} needs the form key=value[,value]")
            terms.append(Term(key.strip().lower(), values))
        else:
            terms.append(Term(None, (word.lower(),)))
    if not terms:
        raise SelectionError(f"selection pattern {text!r} is empty")
    return Pattern(text, tuple(terms))


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "x".join(_text(v) for v in value)
    return str(value).lower()


def attributes(entry: Mapping[str, Any]) -> dict[str, list[str]]:
    """The attribute values an instance entry can be selected by: key -> candidate texts."""
    attrs: dict[str, list[str]] = {}

    def put(key: str, value: Any) -> None:
        attrs.setdefault(key.lower(), []).append(_text(value))

    def walk(prefix: str, data: Mapping[str, Any]) -> None:
        for k, v in data.items():
            if isinstance(v, Mapping):
                walk(f"{prefix}{k}.", v)
                continue
            put(prefix + k, v)
            if v == 0 and not isinstance(v, bool) and (k == "stages" or k.startswith("alignment")):
                put(prefix + k, "auto")         # 0 is how the config spells "derive"
            if prefix:                # nested keys also answer to their own name (activation=relu)
                put(k, v)

    walk("", entry.get("config") or {})
    for k in ("name", "arch", "family"):
        if k in entry:
            attrs[k] = [_text(entry[k])]
    cfg = entry.get("config") or {}
    dtypes = [_text(cfg[k]) for k in ("a", "b", "c", "d") if k in cfg]
    if dtypes:
        attrs.setdefault("dtype", dtypes)
    letters = [_LAYOUT_LETTER.get(str(cfg.get(k))) for k in ("layout_a", "layout_b", "layout_c")]
    if all(letters):
        attrs.setdefault("layout", ["".join(letters[:2]), "".join(letters)])
    return attrs


def _value_matches(want: str, have: str) -> bool:
    if _GLOB_CHARS & set(want):
        return fnmatch.fnmatchcase(have, want)
    return have == want


def _term_matches(term: Term, name: str, attrs: Mapping[str, list[str]]) -> bool:
    if term.key is None:
        want = term.values[0]
        return fnmatch.fnmatchcase(name.lower(), want) if _GLOB_CHARS & set(want) else want in name.lower()
    have = attrs.get(_ALIASES.get(term.key, term.key), [])
    return any(_value_matches(w, h) for w in term.values for h in have)


def matches(entry: Mapping[str, Any], pattern: Pattern | str) -> bool:
    pat = parse(pattern) if isinstance(pattern, str) else pattern
    attrs = attributes(entry)
    return all(_term_matches(t, str(entry.get("name", "")), attrs) for t in pat.terms)


E = TypeVar("E", bound=Mapping[str, Any])


def select(entries: Iterable[E], select: Sequence[str] = (), exclude: Sequence[str] = ()) -> list[E]:
    """The entries that match any --select pattern (all, when none is given) and no --exclude pattern.

    Raises SelectionError for a key that no entry has (a typo would otherwise select nothing silently)."""
    entries = list(entries)
    sel = [parse(s) for s in select]
    exc = [parse(s) for s in exclude]
    known: set[str] = set()
    for e in entries:
        known.update(attributes(e))
    if entries:
        for p in sel + exc:
            for t in p.terms:
                if t.key is not None and _ALIASES.get(t.key, t.key) not in known:
                    raise SelectionError(
                        f"selection pattern {p.text!r}: no instance has the attribute {t.key!r}\n"
                        f"  known: {', '.join(sorted(known | set(_ALIASES)))}")
    out = []
    for e in entries:
        attrs = attributes(e)
        name = str(e.get("name", ""))
        if sel and not any(all(_term_matches(t, name, attrs) for t in p.terms) for p in sel):
            continue
        if any(all(_term_matches(t, name, attrs) for t in p.terms) for p in exc):
            continue
        out.append(e)
    return out


F = TypeVar("F", bound=Callable[..., Any])


def selection_options(f: F) -> F:
    """Adds `--select` and `--exclude` (each repeatable) to a click command: kwargs `select`, `exclude`."""
    f = click.option("--exclude", "exclude", multiple=True, metavar="PATTERN",
                     help="drop instances matching PATTERN (repeatable); same syntax as --select")(f)
    f = click.option("--select", "select", multiple=True, metavar="PATTERN",
                     help="only instances matching PATTERN: a name glob (`*bf16*128x256*`) or "
                          "`key=value[,value]` terms (`arch=sm90a tile=128x256x64`); space-separated "
                          "terms must all match; repeat --select to OR patterns")(f)
    return f
