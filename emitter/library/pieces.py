"""The library's family plug, stage side: collect() asks each family of the selected instances for its
LibraryPieces (emitter/kit/library.py says what each slot holds and where it lands) and context() turns them into
the library templates' context. A family without `library_pieces` cannot be exported (the error names the
--exclude that leaves its instances out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from emitter.kit.library import SLOTS, LibraryPieces


def collect(entries: Sequence[dict[str, Any]], roots: dict[str, Path], ctx: dict[str, Any],
            error: type[Exception]) -> list[LibraryPieces]:
    """The pieces of every family among `entries` (grouped by entry["family"]), in registry order; the default
    family's always, first (its C API is in every library, with or without its kernels), and its `globals` join
    `ctx` (in place) before the other families' hooks see a copy of it."""
    from emitter.families.registry import DEFAULT_FAMILY, FAMILIES, entry_family, family_module

    by_family: dict[str, list[dict[str, Any]]] = {DEFAULT_FAMILY: []}
    for e in entries:
        by_family.setdefault(entry_family(e), []).append(e)
    out = []
    for fam in sorted(by_family, key=lambda f: (f != DEFAULT_FAMILY, list(FAMILIES).index(f) if f in FAMILIES
                                                else len(FAMILIES), f)):
        module = family_module(fam, need=())
        hook = getattr(module, "library_pieces", None)
        if hook is None:
            raise error(f"{len(by_family[fam])} {fam} instance(s) selected, but the {fam} family provides no "
                        f"library pieces yet (emitter.families.{fam}.library_pieces): leave them out with "
                        f"--exclude 'family={fam}' or --select")
        pieces = hook(by_family[fam], roots, dict(ctx))
        if not isinstance(pieces, LibraryPieces) or pieces.family != fam:
            raise error(f"emitter.families.{fam}.library_pieces returned {type(pieces).__name__}, not "
                        f"LibraryPieces(family={fam!r}, ...) (a bug in the family)")
        ctx.update(pieces.globals)
        out.append(pieces)
    places: dict[str, list[str]] = {}
    for p in out:
        for place, text in p.places.items():
            places.setdefault(place, []).append(text)
    ctx["library_places"] = places
    return out


def context(pieces: Sequence[LibraryPieces]) -> dict[str, Any]:
    """The template context keys the library templates read for the other families' pieces (the default family's
    are its `globals`; empty lists for a library of the default family alone)."""
    ctx: dict[str, Any] = {f"library_{slot}_pieces": [t for p in pieces for t in getattr(p, slot)] for slot in SLOTS}
    ctx["library_c_functions"] = [f for p in pieces for f in p.c_functions]
    ctx["library_python_names"] = [n for p in pieces for n in p.python_names]
    ctx["library_sources"] = [s for p in pieces for s in p.sources]
    ctx["library_family_kernels"] = [(p.family, p.kernels) for p in pieces]   # (family, kernel count)
    for p in pieces:
        ctx[p.family] = p.context
    return ctx
