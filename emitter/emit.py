"""emit: spec files -> resolved instances -> one .cu per instance + manifest.json.

Pure stages: load (spec.loader) -> expand (families.gemm.spec) -> resolve/validate (arch module)
-> name -> render -> atomic write. A failure while rendering one instance is recorded and the batch
goes on; the manifest is written last, atomically, and only lists files that were written.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from emitter import __version__
from emitter.errors import SpecError
from emitter.families.base import Rejection
from emitter.families.registry import DEFAULT_FAMILY, FAMILIES, family_module
from emitter.fsutil import write_if_changed
from emitter.manifest import SCHEMA_VERSION, write as write_manifest
from emitter.render import banner
from emitter.spec.loader import Document, KeyPath, content_hash, load_file


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


def spec_entries(doc: Document) -> Iterable[tuple[KeyPath, dict[str, Any], dict[str, KeyPath]]]:
    """The kernel entries of a spec file, with `defaults:` merged in.

    A file is one spec mapping, a list of specs, or {defaults: {...}, kernels: [...]}."""
    data = doc.data
    if data is None:
        raise doc.error((), "the spec file is empty", fix="add a spec: see configs/gemm/*.yaml")
    if isinstance(data, list):
        for i, entry in enumerate(data):
            yield (i,), entry, {}
        return
    if not isinstance(data, dict):
        raise doc.error((), "a spec file holds a mapping or a list of specs", value=data)
    if "kernels" not in data:
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


def expand_specs(paths: Iterable[str | Path]) -> tuple[list[Instance], list[dict[str, Any]]]:
    """Load and expand every spec into candidates (in spec order). Raises SpecError for malformed specs."""
    candidates: list[Instance] = []
    specs: list[dict[str, Any]] = []
    for path in paths:
        doc = load_file(path)
        file_key = Path(path).as_posix()
        specs.append({"path": file_key, "hash": content_hash(doc.text)})
        for index, (entry_path, entry, key_paths) in enumerate(spec_entries(doc)):
            spec_hash = content_hash(entry)
            fam = entry.get("family", DEFAULT_FAMILY) if isinstance(entry, dict) else DEFAULT_FAMILY
            if not isinstance(fam, str) or fam not in FAMILIES:
                raise doc.error(key_paths.get("family", entry_path + ("family",)), f"unknown kernel family {fam!r}",
                                value=fam, allowed=sorted(FAMILIES), fix="set `family:` to one of the allowed names")
            for cand, _point in family_module(fam).expand_entry(doc, entry_path, entry, key_paths):
                candidates.append(cand.replace(spec_file=file_key, spec_index=index, spec_hash=spec_hash))
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


def resolve_specs(paths: Iterable[str | Path]) -> tuple[list[Resolved], list[Rejection], list[dict[str, Any]], int]:
    """Load, expand and resolve every spec (in this process). Raises SpecError for malformed specs."""
    candidates, specs = expand_specs(paths)
    resolved, rejected, duplicates = _merge(resolve_candidate(c) for c in candidates)
    return resolved, rejected, specs, duplicates


def render_instance(r: Resolved) -> str:
    inst = r.instance
    return family_module(inst.family).render_instance(inst, r.name, banner(inst.spec_file, inst.spec_hash))


def _render_and_write(out: Path, r: Resolved) -> tuple[bool, dict[str, Any] | None]:
    """(written?, failure or None) for one instance; a template bug is a result, not an exception."""
    try:
        text = render_instance(r)
    except Exception as e:
        return False, {"name": r.name, "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc(limit=3)}
    return write_if_changed(out / f"{r.name}.cu", text), None


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


def emit(paths: Iterable[str | Path], out: str | Path, *, jobs: int | None = None) -> EmitResult:
    """Emit every instance of the spec files into `out`. `jobs`: render processes (default: CPU count)."""
    import os

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    candidates, specs = expand_specs(list(paths))
    jobs = jobs if jobs is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    outcomes = _process_all(out, candidates, jobs)
    resolved, rejected, duplicates = _merge(o[0] for o in outcomes)
    written = {o[0].name for o in outcomes if isinstance(o[0], Resolved) and o[1]}
    failures = {f["name"]: f for _, _, f in outcomes if f is not None}
    result = EmitResult(out=out, manifest={}, rejected=rejected, duplicates=duplicates)
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
    write_manifest(out, manifest)
    result.manifest = manifest
    return result


_RENDER_INSTANCE = render_instance  # the pool is bypassed when a test replaces render_instance

__all__ = ["emit", "EmitResult", "resolve_specs", "render_instance", "spec_entries", "SpecError"]
