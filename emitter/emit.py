"""emit: spec files -> resolved instances -> one .cu per instance + manifest.json.

Pure stages: load (spec.loader) -> expand (families.gemm.spec) -> resolve/validate (arch module)
-> name -> render -> atomic write. A failure while rendering one instance is recorded and the batch
goes on; the manifest is written last, atomically, and only lists files that were written.

The output directory is touched only once every spec is valid and the sweep is under the cap
(emitter.spec.sweep). Files are written into a staging directory inside it and renamed into place
only when all of them and the manifest are written, so a failure (full disk, permissions) leaves the
directory as it was (and removes it again if emit created it). Stale instance files — listed by the
previous manifest in the same directory, not by the new one — are removed after the new manifest is
in place (`keep_stale=True` / `--keep-stale` lists them instead). Nothing else is ever deleted: only a
`<name>.cu` of a C-identifier name that the old manifest lists and that is a regular file.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from emitter.version import __version__
from emitter.errors import SpecError
from emitter.families.base import Rejection
from emitter.families.registry import DEFAULT_FAMILY, FAMILIES, family_module
from emitter.fsutil import OutputError, atomic_write_bytes, check_output_dir, os_error_text
from emitter.manifest import MANIFEST_NAME, SCHEMA_VERSION, dumps as manifest_dumps
from emitter.render import banner
from emitter.spec import notices
from emitter.spec.loader import Document, KeyPath, content_hash, display_path, load_file
from emitter.spec.sweep import check_total, sweep_limit


Instance = Any  # a family's frozen instance record (emitter.families.base)


@dataclass
class Resolved:
    name: str
    instance: Instance


@dataclass
class EmitResult:
    out: Path
    manifest: dict[str, Any]
    instances: list[Resolved] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)   # render errors (bugs), batch went on
    duplicates: int = 0
    written: int = 0
    stale: list[str] = field(default_factory=list)       # files of the previous emit the new manifest drops
    stale_removed: bool = False
    warnings: list[notices.SpecWarning] = field(default_factory=list)   # printed on stderr; the emit went on


def spec_entries(doc: Document) -> Iterable[tuple[KeyPath, dict[str, Any], dict[str, KeyPath]]]:
    """The kernel entries of a spec file, with `defaults:` merged in.

    A file is one spec mapping, a list of specs, or {defaults: {...}, kernels: [...]}."""
    data = doc.data
    if data is None:
        raise doc.error((), "the spec file is empty", fix=f"add a spec: see configs/{DEFAULT_FAMILY}/*.yaml")
    if isinstance(data, list):
        for i, entry in enumerate(data):
            yield (i,), entry, {}
        return
    if not isinstance(data, dict):
        raise doc.error((), "a spec file holds a mapping or a list of specs", value=data)
    if "kernels" not in data:
        # `defaults:` only means something beside `kernels:`; read as one spec, the file would be blamed for
        # the keys its misspelled kernel list holds (a conv spec has a `kernel:` key of its own, so only a list of
        # mappings under a key like `kernels` is taken for the list)
        for key, value in data.items():
            if key != "defaults" and difflib.get_close_matches(key, ["kernels"], n=1, cutoff=0.75) and \
                    ("defaults" in data or (isinstance(value, list) and value and all(isinstance(v, dict) for v in value))):
                raise doc.error((key,), f"unknown top-level key '{key}'" + (" beside `defaults:`" if "defaults" in data else ""),
                                value=key, allowed=["kernels", "defaults", "description"],
                                fix="did you mean 'kernels'? (a spec file is one spec, a list of specs, or "
                                    "{defaults: {...}, kernels: [...]})")
        if "defaults" in data:
            raise doc.error(("defaults",), "`defaults:` is given but there is no `kernels:` list for it to apply to",
                            value="defaults", allowed=["kernels", "defaults", "description"],
                            fix="put the kernel specs under `kernels:` (a list), next to `defaults:`")
        yield (), data, {}
        return
    extra = set(data) - {"kernels", "defaults", "description"}
    if extra:
        key = sorted(extra)[0]
        raise doc.error((key,), f"unknown top-level key '{key}'", value=key,
                        allowed=["kernels", "defaults", "description"],
                        fix="put kernel settings under `kernels:` entries or `defaults:`")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise doc.error(("defaults",), "defaults must be a mapping of spec keys", value=defaults)
    kernels = data["kernels"]
    if not isinstance(kernels, list) or not kernels:
        raise doc.error(("kernels",), "kernels must be a non-empty list of specs", value=kernels)
    for i, entry in enumerate(kernels):
        if not isinstance(entry, dict):
            raise doc.error(("kernels", i), "a kernel spec must be a mapping", value=entry)
        merged = dict(defaults)
        merged.update(entry)
        key_paths = {k: ("defaults", k) for k in defaults if k not in entry}
        key_paths.update({k: ("kernels", i, k) for k in entry})
        yield ("kernels", i), merged, key_paths


def expand_specs(paths: Iterable[str | Path | Document]) -> tuple[list[Instance], list[dict[str, Any]]]:
    """Load and expand every spec into candidates (in spec order). Raises SpecError for malformed specs."""
    candidates: list[Instance] = []
    specs: list[dict[str, Any]] = []
    for path in paths:   # a spec file, or an already parsed Document (emitter.api: YAML text, Python dicts)
        doc = path if isinstance(path, Document) else load_file(path)
        # printable UTF-8 (a file name may hold any bytes): it goes into .cu banners and the manifest
        file_key = display_path(doc.file if isinstance(path, Document) else Path(path).as_posix())
        specs.append({"path": file_key, "hash": content_hash(doc.text)})
        for index, (entry_path, entry, key_paths) in enumerate(spec_entries(doc)):
            spec_hash = content_hash(entry)
            fam = entry.get("family", DEFAULT_FAMILY) if isinstance(entry, dict) else DEFAULT_FAMILY
            if not isinstance(fam, str) or fam not in FAMILIES:
                raise doc.error(key_paths.get("family", entry_path + ("family",)), f"unknown kernel family {fam!r}",
                                value=fam, allowed=sorted(FAMILIES), fix="set `family:` to one of the allowed names")
            for cand, _point in family_module(fam).expand_entry(doc, entry_path, entry, key_paths):
                candidates.append(cand.replace(spec_file=file_key, spec_index=index, spec_hash=spec_hash))
                if len(candidates) % 1024 == 0:
                    check_total(doc, entry_path, len(candidates))
            check_total(doc, entry_path, len(candidates))
    return candidates, specs


def resolve_candidate(cand: Instance) -> Resolved | Rejection:
    fam = family_module(cand.family)
    result = fam.resolve(cand)
    if isinstance(result, Rejection):
        return result
    return Resolved(fam.instance_name(result), result)


def _merge(results: Iterable[Resolved | Rejection]) -> tuple[list[Resolved], list[Rejection], int]:
    """Keep spec order; the same resolved instance reached twice is kept once."""
    resolved: list[Resolved] = []
    rejected: list[Rejection] = []
    seen: dict[str, Instance] = {}
    duplicates = 0
    for r in results:
        if isinstance(r, Rejection):
            rejected.append(r)
        elif r.name in seen:
            if seen[r.name] != r.instance:  # two different configs, one name: a naming bug
                raise RuntimeError(f"instance name collision: {r.name}")
            duplicates += 1
        else:
            seen[r.name] = r.instance
            resolved.append(r)
    return resolved, rejected, duplicates


def resolve_specs(paths: Iterable[str | Path | Document]) -> tuple[list[Resolved], list[Rejection], list[dict[str, Any]], int]:
    """Load, expand and resolve every spec (in this process). Raises SpecError for malformed specs."""
    candidates, specs = expand_specs(paths)
    resolved, rejected, duplicates = _merge(resolve_candidate(c) for c in candidates)
    return resolved, rejected, specs, duplicates


def render_instance(r: Resolved) -> str:
    inst = r.instance
    return family_module(inst.family).render_instance(inst, r.name, banner(inst.spec_file, inst.spec_hash))


def _render_and_write(out: Path, r: Resolved) -> tuple[bool, dict[str, Any] | None]:
    """(written?, failure or None) for one instance; a template bug is a result, not an exception.

    `out` is the staging directory; its parent is the output directory. A file whose bytes are already
    there is not staged (and not rewritten)."""
    try:
        text = render_instance(r)
    except Exception as e:
        return False, {"name": r.name, "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc(limit=3)}
    data = text.encode("utf-8")
    try:
        if (out.parent / f"{r.name}.cu").read_bytes() == data:
            return False, None
    except OSError:
        pass
    atomic_write_bytes(out / f"{r.name}.cu", data)
    return True, None


Outcome = tuple  # (Resolved | Rejection, written?, render failure or None)


def _process(out: Path, cand: Instance) -> Outcome:
    r = resolve_candidate(cand)
    if isinstance(r, Rejection):
        return r, False, None
    written, failure = _render_and_write(out, r)
    return r, written, failure


def _process_chunk(out: Path, chunk: list[Instance]) -> list[Outcome]:
    return [_process(out, c) for c in chunk]


# Below this many candidates a process pool costs more than it saves.
PARALLEL_THRESHOLD = 256


def _process_all(out: Path, candidates: list[Instance], jobs: int) -> list[Outcome]:
    """Resolve, render and write every candidate; in `jobs` forked processes for large sweeps.

    Two candidates that resolve to the same instance may both write its file: same name, same
    bytes, each write atomic, so that is harmless; _merge keeps one."""
    if jobs <= 1 or len(candidates) < PARALLEL_THRESHOLD or render_instance is not _RENDER_INSTANCE:
        return [_process(out, c) for c in candidates]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    size = max(64, len(candidates) // (jobs * 4))
    chunks = [candidates[i:i + size] for i in range(0, len(candidates), size)]
    ctx = multiprocessing.get_context("fork")  # workers inherit the loaded modules and templates
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        parts = pool.map(_process_chunk, [out] * len(chunks), chunks)
        return [x for part in parts for x in part]


def _first_writes_last(out: Path, candidates: list[Instance], outcomes: list[Outcome]) -> None:
    """Where several candidates resolved to one instance, parallel workers raced to write its file, whose banner
    names the spec that wrote it: the first candidate in spec order writes it once more, so the same specs give
    the same bytes every run."""
    from collections import Counter

    counts = Counter(o[0].name for o in outcomes if isinstance(o[0], Resolved))
    again = {n for n, c in counts.items() if c > 1}
    for cand, o in zip(candidates, outcomes):
        if again and isinstance(o[0], Resolved) and o[0].name in again:
            again.discard(o[0].name)
            _process(out, cand)


_STAGE_PREFIX = ".emitter-stage-"
_STALE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,239}")


def _previous_sources(out: Path) -> set[str] | None:
    """The `<name>.cu` files the manifest already in `out` lists (None: no readable manifest there)."""
    try:
        with open(out / MANIFEST_NAME, "rb") as f:
            raw = f.read(256 << 20)
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    found: set[str] = set()
    for e in (data.get("instances") if isinstance(data, dict) else None) or []:
        if isinstance(e, dict) and isinstance(e.get("name"), str) and _STALE_NAME.fullmatch(e["name"]) \
                and e.get("source") == e["name"] + ".cu":
            found.add(e["source"])
    return found


def _stale_files(out: Path, previous: set[str] | None, current: set[str]) -> list[str]:
    found = []
    for src in sorted((previous or set()) - current):
        p = out / src
        try:
            if p.is_file() and not p.is_symlink():
                found.append(src)
        except OSError:
            continue
    return found


def _make_dirs(out: Path) -> list[Path]:
    """mkdir -p, returning the directories it created (outermost first)."""
    missing = []
    p = out
    while not p.exists() and not p.is_symlink() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir()
    return list(reversed(missing))


def _prune_stages(out: Path) -> None:
    """Staging directories of emits that were killed (their pid is gone) are removed."""
    try:
        names = [n for n in os.listdir(out) if n.startswith(_STAGE_PREFIX)]
    except OSError:
        return
    for n in names:
        pid = n[len(_STAGE_PREFIX):].split(".")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue                         # alive (or not ours to judge)
        except ProcessLookupError:
            shutil.rmtree(out / n, ignore_errors=True)
        except OSError:
            continue


def _undo(stage: Path | None, created: list[Path]) -> None:
    if stage is not None:
        shutil.rmtree(stage, ignore_errors=True)
    for d in reversed(created):              # a directory emit made for nothing goes again
        try:
            d.rmdir()
        except OSError:
            break


def emit(paths: Iterable[str | Path | Document], out: str | Path, *, jobs: int | None = None,
         max_instances: int | None = None, keep_stale: bool = False) -> EmitResult:
    """Emit every instance of the spec files into `out`. `jobs`: render processes (default: CPU count).

    `max_instances` raises the sweep cap (emitter.spec.sweep.DEFAULT_MAX_INSTANCES). Raises SpecError for
    malformed specs (before `out` is touched) and OutputError when `out` cannot take the files (`out` is
    then as it was). Stale instance files of an earlier emit into `out` are removed unless `keep_stale`."""
    out = Path(out)
    with sweep_limit(max_instances), notices.collecting() as warned:
        candidates, specs = expand_specs(list(paths))
    for w in warned:
        sys.stderr.write(w.render() + "\n")
    check_output_dir(out, (MANIFEST_NAME,))
    jobs = jobs if jobs is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    created: list[Path] = []
    stage: Path | None = None
    try:
        created = _make_dirs(out)
        _prune_stages(out)
        previous = _previous_sources(out)
        stage = Path(tempfile.mkdtemp(prefix=f"{_STAGE_PREFIX}{os.getpid()}.", dir=out))
        outcomes = _process_all(stage, candidates, jobs)
        _first_writes_last(stage, candidates, outcomes)
        resolved, rejected, duplicates = _merge(o[0] for o in outcomes)
        written = {o[0].name for o in outcomes if isinstance(o[0], Resolved) and o[1]}
        failures = {f["name"]: f for _, _, f in outcomes if f is not None}
        result = EmitResult(out=out, manifest={}, rejected=rejected, duplicates=duplicates, warnings=warned)
        entries = []
        for r in resolved:
            if r.name in failures:  # a template bug must not stop the batch
                result.failed.append(failures[r.name])
                continue
            source = f"{r.name}.cu"
            result.written += r.name in written
            result.instances.append(r)
            entries.append({
                "name": r.name, "family": r.instance.family, "arch": r.instance.arch.yaml, "source": source,
                "spec": r.instance.spec_file, "spec_hash": r.instance.spec_hash, "config": r.instance.config(),
            })
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "emitter_version": __version__,
            "specs": specs,
            "instances": entries,
            "rejected": [
                {"family": j.instance.family, "arch": j.instance.arch.yaml, "spec": j.instance.spec_file,
                 "spec_hash": j.instance.spec_hash, "config": j.instance.config(), "rule": j.rule, "reason": j.reason}
                for j in rejected
            ],
            "failed": result.failed and [{"name": f["name"], "error": f["error"]} for f in result.failed],
        }
        if not manifest["failed"]:
            del manifest["failed"]
        atomic_write_bytes(stage / MANIFEST_NAME, manifest_dumps(manifest).encode("utf-8"), durable=True)
        # commit: every file is written; renames within one directory need no new space
        for name in sorted(written - set(failures)):
            os.replace(stage / f"{name}.cu", out / f"{name}.cu")
        os.replace(stage / MANIFEST_NAME, out / MANIFEST_NAME)
    except OSError as e:
        _undo(stage, created)
        stage = None
        what, fix = os_error_text(e)
        where = display_path(e.filename) if isinstance(e.filename, (str, bytes)) else display_path(out)
        raise OutputError(out, f"cannot write the output ({what}: {where}); the directory is as it was", fix) from None
    except BaseException:
        _undo(stage, created)
        stage = None
        raise
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
    result.manifest = manifest
    result.stale = _stale_files(out, previous, {e["source"] for e in entries})
    if result.stale and not keep_stale:
        for src in result.stale:
            try:
                (out / src).unlink()
            except OSError:
                pass
        result.stale_removed = True
    return result


_RENDER_INSTANCE = render_instance  # the pool is bypassed when a test replaces render_instance

__all__ = ["emit", "EmitResult", "resolve_specs", "render_instance", "spec_entries", "SpecError"]
