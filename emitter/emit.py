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
from emitter.families.gemm import arch_module, template_dir
from emitter.families.gemm.model import GemmInstance, Rejection
from emitter.families.gemm.naming import instance_name
from emitter.families.gemm.spec import expand_entry
from emitter.fsutil import write_if_changed
from emitter.manifest import SCHEMA_VERSION, write as write_manifest
from emitter.render import banner, render_template
from emitter.spec.loader import Document, KeyPath, content_hash, load_file


@dataclass
class Resolved:
    name: str
    instance: GemmInstance


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


def resolve_specs(paths: Iterable[str | Path]) -> tuple[list[Resolved], list[Rejection], list[dict[str, Any]], int]:
    """Load, expand and resolve every spec. Raises SpecError for malformed specs."""
    resolved: list[Resolved] = []
    rejected: list[Rejection] = []
    specs: list[dict[str, Any]] = []
    seen: dict[str, GemmInstance] = {}
    duplicates = 0
    for path in paths:
        doc = load_file(path)
        file_key = Path(path).as_posix()
        specs.append({"path": file_key, "hash": content_hash(doc.text)})
        for index, (entry_path, entry, key_paths) in enumerate(spec_entries(doc)):
            spec_hash = content_hash(entry)
            for cand, _point in expand_entry(doc, entry_path, entry, key_paths):
                cand = cand.replace(spec_file=file_key, spec_index=index, spec_hash=spec_hash)
                result = arch_module(cand.arch).resolve(cand)
                if isinstance(result, Rejection):
                    rejected.append(result)
                    continue
                name = instance_name(result)
                if name in seen:
                    if seen[name] != result:  # two different configs, one name: a naming bug
                        raise RuntimeError(f"instance name collision: {name}")
                    duplicates += 1
                    continue
                seen[name] = result
                resolved.append(Resolved(name, result))
    return resolved, rejected, specs, duplicates


def render_instance(r: Resolved) -> str:
    inst = r.instance
    module = arch_module(inst.arch)
    return render_template(f"{template_dir(inst.arch)}/instance.cu.j2", inst=inst, name=r.name,
                           ctx=module.template_context(inst), banner=banner(inst.spec_file, inst.spec_hash))


def emit(paths: Iterable[str | Path], out: str | Path) -> EmitResult:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    resolved, rejected, specs, duplicates = resolve_specs(list(paths))
    result = EmitResult(out=out, manifest={}, rejected=rejected, duplicates=duplicates)
    entries = []
    for r in resolved:
        try:
            text = render_instance(r)
        except Exception as e:  # a template bug must not stop the batch
            result.failed.append({"name": r.name, "error": f"{type(e).__name__}: {e}",
                                  "traceback": traceback.format_exc(limit=3)})
            continue
        source = f"{r.name}.cu"
        if write_if_changed(out / source, text):
            result.written += 1
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


__all__ = ["emit", "EmitResult", "resolve_specs", "render_instance", "spec_entries", "SpecError"]
