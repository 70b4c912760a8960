"""Tuning tables (`emitter profile` -> tuning.json) as every family reads them: the table's checks (schema, kind, a
real GPU), its GPU's compute capability and the family an entry belongs to. Each family turns its own entries into
its dispatch records (GEMM: emitter/families/gemm/library_tuning.py); the library stage routes the entries by family.

Format (emitter/profile/selection.py `tuning_table`, schema_version 1):
    {"schema_version": 1, "kind": "emitter.tuning_table", "gpu": {...}, "entries": [{"problem": {...}, "kernel": ..}]}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from emitter.errors import EmitterError

TUNING_SCHEMA_VERSION = 1


class TuningError(EmitterError):
    exit_code = 2


def table_cc(gpu: Any) -> int:
    """The table's GPU compute capability ("9.0", "90", 90, [9, 0]) as 90; 0 when absent or unreadable."""
    cc = gpu.get("cc") if isinstance(gpu, dict) else None
    try:
        if isinstance(cc, (list, tuple)) and len(cc) == 2:
            return int(cc[0]) * 10 + int(cc[1])
        if isinstance(cc, str) and "." in cc:
            major, minor = cc.split(".", 1)
            return int(major) * 10 + int(minor)
        if cc is not None:
            return int(cc)
    except (TypeError, ValueError):
        pass
    return 0


def unmeasured(data: dict[str, Any]) -> str | None:
    """Why a tuning table was not measured on a real GPU (None when nothing says so): `emitter profile
    --backend fake` writes gpu.name "fake GPU (numpy backend)" (and gpu.cc 9.0, which would otherwise pass for an
    H100's); a table may also say backend: fake (top level or under gpu)."""
    gpu = data.get("gpu")
    backend = data.get("backend") or (gpu.get("backend") if isinstance(gpu, dict) else None)
    if isinstance(backend, str) and backend.lower() == "fake":
        return "its backend is 'fake'"
    name = gpu.get("name") if isinstance(gpu, dict) else None
    if isinstance(name, str) and name.lower().startswith("fake"):
        return f"its gpu.name is {name!r} (`emitter profile --backend fake`: modelled times, not measurements)"
    return None


def entry_family(e: Any) -> str | None:
    """The family a tuning entry belongs to: `problem.family` (or `op.family`), as `emitter profile` writes for
    every family but the registry's default (whose entries carry none); None when the entry names no family."""
    if not isinstance(e, dict):
        return None
    for part in ("problem", "op"):
        fam = e.get(part).get("family") if isinstance(e.get(part), dict) else None
        if isinstance(fam, str):
            return fam
    return None


def read_table(p: Path, allow_unmeasured: bool) -> dict[str, Any]:
    """A tuning table's JSON, checked (TuningError naming the file and what to do)."""
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TuningError(f"{p}: no tuning table here; `emitter profile` writes one (tuning.json)") from None
    except json.JSONDecodeError as e:
        raise TuningError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise TuningError(f"{p}: not a tuning table (expected an object with an 'entries' list)")
    if data.get("schema_version") != TUNING_SCHEMA_VERSION:
        raise TuningError(f"{p}: schema_version {data.get('schema_version')!r} is not supported (this emitter reads "
                          f"{TUNING_SCHEMA_VERSION})")
    kind = data.get("kind")
    if kind is not None and kind != "emitter.tuning_table":
        raise TuningError(f"{p}: kind {kind!r} is not a tuning table (expected 'emitter.tuning_table')")
    why = unmeasured(data)
    if why and not allow_unmeasured:
        raise TuningError(f"{p}: this tuning table was not measured on a real GPU: {why}. Its choices would be "
                          f"dispatched as if timed on a cc {table_cc(data.get('gpu')) / 10:.1f} GPU. Profile on the GPU "
                          f"(emitter profile without --backend fake), or pass --allow-unmeasured-tuning to export it "
                          f"anyway (tests, demos)")
    return data
