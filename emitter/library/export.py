"""`emitter library`: export chosen instances + tuning tables as a self-contained CMake project.

The shared files (templates/library/) hold what every family uses; each family's part (its C API, tables, launch
units, loader functions) comes from its `library_pieces` hook (emitter.library.pieces), the default family's
(GEMM: emitter/families/gemm/library.py) in every library. With GEMM's part:

    <out>/CMakeLists.txt                 project(<lib> LANGUAGES CXX CUDA), install(EXPORT), options
    <out>/cmake/<lib>Config.cmake.in     find_package(<lib>) after `cmake --install`
    <out>/include/<lib>/<lib>.h          the stable C API
    <out>/src/<lib>_api.cpp              validation, dispatch walk, launch, errors
    <out>/src/<lib>_dispatch.h           GEMM's selection code (host-only; mirrored in its library_dispatch.py)
    <out>/src/<lib>_table.cpp            generated dispatch DATA: kernel records + tuning records
    <out>/src/<lib>_kernels.{h,cpp}      per-kernel entry points (null for archs CMake leaves out)
    <out>/src/instances/<name>.cu        the emitted instance, byte for byte
    <out>/src/instances/<name>.launch.cu its translation unit: shim + by-value kernel entry + launcher
    <out>/src/emitter_abi.h, <lib>.map   the shim ABI; the shared library's export list
    <out>/tools/<lib>_dispatch_probe.cpp host-only dispatch order printer
    <out>/python/<lib>.py                ctypes loader
    <out>/manifest.json                  what is inside (kernels, tuning, files with hashes)

Output is deterministic and written with write_if_changed, so re-exporting with a new tuning table
rewrites only src/<lib>_table.cpp (and the manifest) and an incremental build recompiles one file.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from emitter.fsutil import atomic_write_json, write_if_changed
from emitter.kit.library import (ABI_VERSION, ACTIVATIONS, ARCHES, DEFAULT_CUDA_ARCHITECTURES, DTYPES, LibraryError,
                                 tuning_problem_label)
from emitter.library.tuning import family_entries as family_tuning_entries
from emitter.manifest import load as load_manifest, manifest_path
from emitter.render import templates_root
from emitter.version import __version__

LIBRARY_KIND = "emitter.library"
LIBRARY_SCHEMA_VERSION = 1
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
_INSTANCE_RE = re.compile(r"^[a-z0-9_]+$")
_RESERVED = {"emitter", "cuda", "cutlass", "cute", "std", "int", "float", "double", "char", "void", "long", "short",
             "auto", "const", "static", "struct", "class", "namespace", "template", "return", "new", "delete",
             "default", "switch", "case", "for", "while", "do", "if", "else", "union", "enum", "typedef"}
# the C functions every library has; each family's follow (the default family's `exports`, the others'
# `c_functions`)
SHARED_FUNCTIONS = ("status_string", "last_error", "version")


@dataclass
class ExportResult:
    out: Path
    name: str
    kernels: list[Any]                  # the default family's kernel records (its library part's globals)
    tuning: list[Any]                   # and its tuning records
    skipped: list[dict[str, str]] = field(default_factory=list)        # instances left out, with the reason
    dropped_tuning: list[dict[str, Any]] = field(default_factory=list)  # tuning entries not used, with the reason
    notes: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    families: dict[str, int] = field(default_factory=dict)              # other families exported: kernel counts
    family_tuned: dict[str, int] = field(default_factory=dict)          # their tuning records (profiled problems)


def check_name(name: str) -> str:
    if not _NAME_RE.match(name) or name in _RESERVED or name.endswith("_"):
        raise LibraryError(f"library name {name!r} is not usable: it prefixes C symbols, a CMake target and a Python "
                           f"module, so it must match [a-z][a-z0-9_]* (at most 40 characters), not end with '_', and "
                           f"not be a C keyword or one of emitter, cuda, cutlass, cute, std (e.g. --name mykernels)")
    return name


def _instances(manifest_dirs: Sequence[Path]) -> tuple[list[dict[str, Any]], dict[str, Path]]:
    """Instance entries of every manifest (a name in two manifests must have one config)."""
    entries: dict[str, dict[str, Any]] = {}
    root_of: dict[str, Path] = {}
    for d in manifest_dirs:
        path = manifest_path(d)
        data = load_manifest(path)
        for e in data["instances"]:
            name = e["name"]
            if not _INSTANCE_RE.match(name):
                raise LibraryError(f"{path}: instance name {name!r} is not [a-z0-9_]+ (was the manifest edited?)")
            if name in entries:
                if entries[name]["config"] != e["config"]:
                    raise LibraryError(f"instance {name} is in {root_of[name]} and {path.parent} with different "
                                       f"configurations; export one of them")
                continue
            entries[name] = e
            root_of[name] = path.parent
    return list(entries.values()), root_of


def _build_failed(root: Path, name: str) -> str | None:
    from emitter.fsutil import PathEscape, resolve_inside

    try:   # a record is read only from inside the manifest's directory (no symlink leading out)
        rec = resolve_inside(root, f"build/{name}/record.json", "build record")
        data = json.loads(rec.read_text())
    except PathEscape as e:
        return str(e)
    except (OSError, ValueError, RecursionError):
        return None
    if isinstance(data, dict) and data.get("status") == "failed":
        err = str(data.get("error") or "").strip().splitlines()
        return f"`emitter build` failed on it ({err[0][:160] if err else 'see ' + str(rec)})"
    return None


def _cmake_safe(path: str) -> bool:
    return not any(ch in path for ch in '"\\$;\n\r') and "${" not in path


def _render(template: str, **ctx: Any) -> str:
    from emitter.render import environment

    return environment().get_template(f"library/{template}").render(**ctx)


def _is_rows_table(path: str | Path) -> bool:
    """A conv bench table (conv.json: {"rows": [...]}, no GEMM 'entries'): the conv library hook reads it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False            # load_all reports it
    return isinstance(data, dict) and isinstance(data.get("rows"), list) and "entries" not in data


def export_library(manifest_dirs: Sequence[str | Path], name: str, out: str | Path, *,
                   tuning: Sequence[str | Path] = (), select: Sequence[str] = (), exclude: Sequence[str] = (),
                   archs: Sequence[str] = (), vendor_cutlass: bool = False, force: bool = False,
                   lib_version: str = "1.0.0", allow_unmeasured_tuning: bool = False) -> ExportResult:
    from emitter.selection import select as select_entries

    name = check_name(name)
    out = Path(out)
    if not re.match(r"^\d+(\.\d+){0,3}$", lib_version):
        raise LibraryError(f"--lib-version {lib_version!r} must be a CMake version: 1.2.3")
    for a in archs:
        if a not in ARCHES:
            raise LibraryError(f"--arch {a!r} is not one of {', '.join(ARCHES)}")
    if not manifest_dirs:
        raise LibraryError("give at least one manifest directory (what `emitter emit -o DIR` wrote)")

    # ---- the kernels ----
    entries, root_of = _instances([Path(d) for d in manifest_dirs])
    skipped: list[dict[str, str]] = []
    chosen = select_entries(entries, select, exclude)
    if archs:
        for e in chosen:
            if e["arch"] not in archs:
                skipped.append({"name": e["name"], "reason": f"arch {e['arch']} not in --arch {','.join(archs)}"})
        chosen = [e for e in chosen if e["arch"] in archs]
    kept = []
    for e in chosen:
        why = _build_failed(root_of[e["name"]], e["name"])
        if why:
            skipped.append({"name": e["name"], "reason": why})
        elif e["arch"] not in ARCHES:
            skipped.append({"name": e["name"], "reason": f"arch {e['arch']} cannot be exported"})
        else:
            kept.append(e)
    if not kept:
        raise LibraryError(f"no instance to export: the manifests hold {len(entries)}, the selection kept "
                           f"{len(chosen)}" + (f", and {len(skipped)} were left out ({skipped[0]['reason']})" if skipped else ""))
    # every family's part comes from its library hook (emitter.library.pieces): the default family's always (its C
    # API is in every library; with none of its kernels it answers NOT_SUPPORTED), the others' when selected

    # ---- tuning ----
    # a family's own table (e.g. benchmarks/conv_bench.py's conv.json: a 'rows' list) goes to the families' library
    # hooks (ctx["family_tuning"]; each hook keeps the rows it recognises); the tables of tuning.json's format go to
    # the default family's hook (ctx["tuning_tables"]) and their other families' entries to those families' hooks
    family_tuning = [str(t) for t in tuning if _is_rows_table(t)]
    tuning = [t for t in tuning if str(t) not in family_tuning]
    # the other families' entries of the same tables (`emitter profile` writes one table for every family it
    # timed) go to their library hooks (ctx["tuning_entries"][family])
    fam_entries = family_tuning_entries(tuning, allow_unmeasured=allow_unmeasured_tuning)

    # ---- CUTLASS ----
    from emitter.cutlass_path import find_cutlass
    from emitter.errors import CutlassNotFound

    cutlass_notes: list[str] = []
    cutlass_root, cutlass_version = "", "4.2.0.0"
    try:
        headers = find_cutlass()
        cutlass_root = str(headers.root)
        cutlass_version = headers.version or "checkout"
    except CutlassNotFound as e:
        if vendor_cutlass:
            raise
        cutlass_notes.append(f"CUTLASS headers not found at export time ({str(e).splitlines()[0]}): pass -DCUTLASS_DIR=... to cmake")
    if cutlass_root and not _cmake_safe(cutlass_root):
        cutlass_notes.append(f"the CUTLASS path {cutlass_root!r} holds characters CMake strings cannot take: pass -DCUTLASS_DIR=...")
        cutlass_root = ""

    # ---- the families' parts ----
    LIB = name.upper()
    # every arch of the exported kernels gets a CMake group (the other families' sources build with it)
    arch_list = sorted({e["arch"] for e in kept}, key=lambda a: (ARCHES[a][0], a))
    ctx: dict[str, Any] = dict(
        lib=name, LIB=LIB, version=__version__, abi_version=ABI_VERSION, project_version=lib_version,
        archs=arch_list,
        arch_cc={a: ARCHES[a][0] for a in arch_list}, default_cuda_archs=DEFAULT_CUDA_ARCHITECTURES,
        default_arch_list=";".join(DEFAULT_CUDA_ARCHITECTURES[a] for a in arch_list),
        dtype_codes=sorted(DTYPES.items(), key=lambda kv: kv[1]), dtype_min=min(DTYPES.values()), dtype_max=max(DTYPES.values()),
        activation_codes=sorted(ACTIVATIONS.items(), key=lambda kv: kv[1]), activation_max=max(ACTIVATIONS.values()),
        cutlass_default=cutlass_root, cutlass_version=cutlass_version,
        vendored_cutlass=vendor_cutlass, tuning_tables=[Path(t) for t in tuning],
        allow_unmeasured_tuning=allow_unmeasured_tuning,
    )
    if family_tuning:
        ctx["family_tuning"] = family_tuning
    if fam_entries:
        ctx["tuning_entries"] = fam_entries
    from emitter.library import pieces as library_pieces

    base, *family_pieces = library_pieces.collect(kept, root_of, ctx, LibraryError)
    for p in family_pieces:
        for src, arch in p.sources:
            if arch not in arch_list:
                raise LibraryError(f"the {p.family} family's translation unit {src} is for {arch}, which none of its "
                                   f"kernels is (a bug in the family's library_pieces)")
    ctx.update(library_pieces.context(family_pieces))
    ctx["base_family"] = base.family       # the family whose C API every library has (its kernels CMake links first)
    kernels = list(base.globals.get("kernels", ()))
    tuning_recs = list(base.globals.get("tuning", ()))
    notes = list(base.notes)
    if not tuning:
        notes.append("no --tuning table: every problem dispatches in the fixed fallback order")
    elif not tuning_recs and not fam_entries:
        notes.append("the tuning tables name none of the exported kernels: dispatch uses the fallback order only")
    notes.extend(cutlass_notes)
    # tuning entries a family's hook could not use (a kernel not exported, ...), the default family's first
    dropped: list[dict[str, Any]] = []
    for p in (base, *family_pieces):
        dropped.extend(p.context.get("dropped_tuning", ()))
    exported = {p.family for p in family_pieces}
    for fam, ents in sorted(fam_entries.items()):
        if fam not in exported:
            dropped.extend({"kernel": str(e.get("kernel")), "problem": [tuning_problem_label(e.get("problem"))],
                            "source": e["source"], "position": e["position"], "missing_kernel": True,
                            "reason": f"kernel not in this library (the export holds no {fam} kernel)"} for e in ents)
    ctx["api_functions"] = SHARED_FUNCTIONS + base.exports + tuple(f[0] for p in family_pieces for f in p.c_functions)

    # ---- render ----
    files: dict[str, str] = {
        "CMakeLists.txt": _render("CMakeLists.txt.j2", **ctx),
        f"cmake/{name}Config.cmake.in": _render("Config.cmake.in.j2", **ctx),
        f"include/{name}/{name}.h": _render("header.h.j2", **ctx),
        f"src/{name}_api.cpp": _render("api.cpp.j2", **ctx),
        f"src/{name}_table.cpp": _render("table.cpp.j2", **ctx),
        f"src/{name}.map": _render("exports.map.j2", **ctx),
        "src/emitter_abi.h": (templates_root() / "common" / "emitter_abi.h").read_text(encoding="utf-8"),
        f"python/{name}.py": _render("loader.py.j2", **ctx),
        "README.md": _render("README.md.j2", **ctx),
    }
    for p in (base, *family_pieces):
        for rel, text in p.files.items():
            if rel in files or rel.startswith("/") or ".." in Path(rel).parts:
                raise LibraryError(f"the {p.family} family's library pieces write {rel!r}, which is not a new "
                                   f"relative path inside the library (a bug in the family)")
            files[rel] = text

    # ---- the output directory ----
    old_manifest = out / "manifest.json"
    old_files: list[str] = []
    if out.exists() and any(out.iterdir()):
        try:
            old = json.loads(old_manifest.read_text())
            if old.get("kind") != LIBRARY_KIND:
                raise ValueError
            old_files = list(old.get("files", {}))
        except (OSError, ValueError):
            if not force:
                raise LibraryError(f"{out} exists and is not an exported library (no {LIBRARY_KIND} manifest.json); "
                                   f"choose another -o or pass --force to write into it") from None
    result = ExportResult(out=out, name=name, kernels=kernels, tuning=tuning_recs, skipped=skipped,
                          dropped_tuning=dropped, notes=notes, families={p.family: p.kernels for p in family_pieces},
                          family_tuned={p.family: int(p.context.get("tuning") or 0) for p in family_pieces})
    for rel, text in files.items():
        if write_if_changed(out / rel, text):
            result.written.append(rel)
        else:
            result.unchanged += 1
    for rel in old_files:
        if rel not in files and rel != "manifest.json":
            p = out / rel
            if p.is_file():
                p.unlink()
                result.removed.append(rel)
    vendored: dict[str, str] = {}
    if vendor_cutlass:
        for sub in ("include", "tools/util/include"):
            dst = out / "third_party" / "cutlass" / sub
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(Path(cutlass_root) / sub, dst)
        vendored = {"path": "third_party/cutlass", "from": cutlass_root, "version": cutlass_version}

    # ---- manifest (last, atomically) ----
    # the families' sections (the default family's kernels, tuning and dispatch) follow `sources`; a list section
    # lists kernels with their name and arch, which `archs` and `sources` count
    sections: dict[str, Any] = {}
    for p in (base, *family_pieces):
        for key, value in p.manifest.items():
            if key in sections and not (isinstance(value, list) and isinstance(sections[key], list)):
                raise LibraryError(f"the {p.family} family's manifest section {key!r} is another family's too "
                                   f"(a bug in the family)")
            sections[key] = sections.get(key, []) + value if isinstance(value, list) else value
    listed = [k for v in sections.values() if isinstance(v, list) for k in v
              if isinstance(k, dict) and "arch" in k and "name" in k]
    manifest = {
        "schema_version": LIBRARY_SCHEMA_VERSION,
        "kind": LIBRARY_KIND,
        "name": name,
        "version": lib_version,
        "abi_version": ABI_VERSION,
        "emitter_version": __version__,
        "cutlass": {"version": cutlass_version, "path_at_export": cutlass_root or None, "vendored": vendored or None},
        "archs": {a: {"default_cuda_architectures": DEFAULT_CUDA_ARCHITECTURES[a],
                      "kernels": sum(1 for k in listed if k["arch"] == a)} for a in arch_list},
        "sources": {"manifests": sorted({str(root_of[k["name"]]) for k in listed}), "tuning": [str(t) for t in tuning]},
        **sections,
        "left_out": {"instances": skipped, "tuning_entries": dropped},
        "notes": notes,
        "files": {rel: hashlib.sha256(text.encode("utf-8")).hexdigest() for rel, text in sorted(files.items())},
    }
    atomic_write_json(out / "manifest.json", manifest)
    result.manifest = manifest
    return result
