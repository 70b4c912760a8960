"""The library's family plug: what a kernel family adds to an exported library without editing
templates/library/*.

GEMM is the library's own family (its C API, dispatch and Python functions are templates/library/*). Another
family (attention, conv, ...) whose package `emitter.families.<f>` defines

    library_pieces(entries, roots, ctx) -> LibraryPieces

gets its manifest entries (those with `family: <f>`, after --select/--exclude/--arch and build-failure
filtering), the manifest directory of each (`roots[name]`), and the library's template context `ctx` (lib,
LIB, version, abi_version, dtype_codes, ...; a copy), and returns the pieces below: C/C++/Python TEXT, which
the family renders from its own templates (templates/<f>/library/*.j2, through emitter.render.environment()
with ctx). The library templates paste each piece at a fixed place (docs/architecture.md "Library pieces a
family provides"):

    header       include/<lib>/<lib>.h, before the closing extern "C": the family's problem struct(s) and
                 `<LIB>_API <lib>_status <lib>_<family>(const <lib>_<family>_problem*, void* workspace,
                 size_t workspace_bytes, <lib>_stream_t stream);` declarations
    api          src/<lib>_api.cpp, at the end (inside no namespace): definitions; they may use the file's
                 helpers (fail, succeed, device_cc, log_enabled: anonymous namespace, same translation unit)
    table        src/<lib>_table.cpp, at the end: the family's kernel table (columns are the family's own)
    python       python/<lib>.py, at the end: the family's Python functions (e.g. attention(q, k, v, *,
                 causal, scale, lse, cu_seqlens_q, cu_seqlens_k)); they may use the loader's helpers
                 (_view, _layout, OperandError, load, _check, _call, _stream_handle, _empty, _init_torch, ...)
    c_functions  (name without the `<lib>_` prefix, ctypes restype, [ctypes argtypes]) of each new C function:
                 exported by the linker map and declared by the loader's load()
    python_names names added to the loader's __all__
    files        extra files of the tree (relative path -> text): the family's instances and their
                 translation units
    sources      (relative path, arch) of the .cu translation units among `files` that CMake compiles with
                 the kernels of that arch (sm80, sm90a, ...)
    context      more template context, visible to the family's pieces as ctx[<family>]

`context` is also visible to the library's own templates as ctx[<family>]. A family without `library_pieces`
cannot be exported (LibraryError naming it, with the --exclude that leaves its instances out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from emitter.kit.library import SLOTS, LibraryPieces


def collect(entries: Sequence[dict[str, Any]], roots: dict[str, Path], ctx: dict[str, Any],
            error: type[Exception]) -> list[LibraryPieces]:
    """The pieces of every non-GEMM family among `entries` (grouped by entry["family"]), in registry order."""
    from emitter.families.registry import DEFAULT_FAMILY, FAMILIES, family_module

    by_family: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        fam = e.get("family", DEFAULT_FAMILY)
        if fam != DEFAULT_FAMILY:
            by_family.setdefault(fam, []).append(e)
    out = []
    for fam in sorted(by_family, key=lambda f: (list(FAMILIES).index(f) if f in FAMILIES else len(FAMILIES), f)):
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
        out.append(pieces)
    return out


def context(pieces: Sequence[LibraryPieces]) -> dict[str, Any]:
    """The template context keys the library templates read (empty lists for a GEMM-only library)."""
    ctx: dict[str, Any] = {f"library_{slot}_pieces": [t for p in pieces for t in getattr(p, slot)] for slot in SLOTS}
    ctx["library_c_functions"] = [f for p in pieces for f in p.c_functions]
    ctx["library_python_names"] = [n for p in pieces for n in p.python_names]
    ctx["library_sources"] = [s for p in pieces for s in p.sources]
    ctx["library_family_kernels"] = [(p.family, p.kernels) for p in pieces]   # (family, kernel count)
    for p in pieces:
        ctx[p.family] = p.context
    return ctx
